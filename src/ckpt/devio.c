/*
 * Checkpoint bytes to and from device memory through two pinned buffers (devio.h).
 *
 * Invariant: buffer b is refilled only after the copy recorded on done[b] completed, and the
 * staging stream starts each transfer behind the device's default order, so a save sees the
 * last step's weights and a load does not overtake kernels still reading the old ones.
 */
#include <string.h>

#include "ckpt/devio.h"
#include "device/device.h"

static size_t forced_chunk; /* tests (accel__devio_force_staging); 0: off */

struct accel__devio {
    accel__device *dev;
    accel_device which;
    size_t chunk;
    accel__stream *stream;
    accel__event *ready; /* the default order's work before the transfer */
    accel__event *done[2];
    void *buf[2];
};

void accel__devio_force_staging(size_t chunk_nbytes)
{
    forced_chunk = chunk_nbytes;
}

int accel__devio_staged(accel_device where)
{
    return where.type != ACCEL_DEVICE_CPU || forced_chunk > 0;
}

accel_status accel__devio_check(accel_device where)
{
    accel__device *d;
    return accel__device_open(&d, where);
}

void accel__devio_free(accel__devio *io)
{
    if (io == NULL) {
        return;
    }
    accel__stream_free(io->dev, io->stream); /* waits for its copies */
    for (int b = 0; b < 2; b++) {
        accel__event_free(io->dev, io->done[b]);
        accel__dev_host_free(io->dev, io->buf[b]);
    }
    accel__event_free(io->dev, io->ready);
    accel__device_close(io->dev);
    accel__free(io);
}

/* *io ready for device `where` (kept when it already is). */
static accel_status devio_open(accel__devio **io, accel_device where)
{
    size_t chunk = forced_chunk ? forced_chunk : ACCEL__DEVIO_CHUNK;
    accel__devio *x = *io;
    if (x != NULL && x->which.type == where.type && x->which.index == where.index &&
        x->chunk == chunk) {
        return ACCEL_OK;
    }
    accel__devio_free(x);
    *io = NULL;
    x = accel__calloc(1, sizeof(*x));
    if (x == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    x->which = where;
    x->chunk = chunk;
    accel_status st = accel__device_open(&x->dev, where);
    if (st != ACCEL_OK) {
        accel__free(x);
        return st;
    }
    st = accel__stream_new(x->dev, &x->stream);
    st = st == ACCEL_OK ? accel__event_new(x->dev, &x->ready) : st;
    for (int b = 0; st == ACCEL_OK && b < 2; b++) {
        st = accel__event_new(x->dev, &x->done[b]);
        st = st == ACCEL_OK ? accel__dev_host_alloc(x->dev, chunk, &x->buf[b]) : st;
    }
    if (st != ACCEL_OK) {
        accel__devio_free(x);
        return st;
    }
    *io = x;
    return ACCEL_OK;
}

/* The staging stream waits for the work queued so far in the device's default order. */
static accel_status behind_default(accel__devio *x)
{
    ACCEL_TRY(accel__event_record(x->dev, x->ready, NULL));
    return accel__stream_wait_event(x->dev, x->stream, x->ready);
}

/* Queues the copy of chunk i (of `chunk` bytes, the last one shorter) into its buffer. */
static accel_status queue_out(accel__devio *x, const char *src, size_t nbytes, size_t chunk,
                              size_t i)
{
    size_t off = i * chunk, n = nbytes - off < chunk ? nbytes - off : chunk;
    ACCEL_TRY(accel__dev_copy(x->dev, x->buf[i % 2], src + off, n, ACCEL__COPY_D2H, x->stream));
    return accel__event_record(x->dev, x->done[i % 2], x->stream);
}

accel_status accel__devio_to_host(accel__devio **io, accel_device where, const void *src,
                                  size_t nbytes, accel__devio_sink sink, void *ctx)
{
    if (!accel__devio_staged(where)) {
        return nbytes > 0 ? sink(ctx, src, nbytes) : ACCEL_OK;
    }
    if (nbytes == 0) {
        return ACCEL_OK;
    }
    ACCEL_TRY(devio_open(io, where));
    accel__devio *x = *io;
    size_t chunk = x->chunk, n_chunks = (nbytes + chunk - 1) / chunk;
    accel_status st = behind_default(x);
    st = st == ACCEL_OK ? queue_out(x, src, nbytes, chunk, 0) : st;
    for (size_t i = 0; st == ACCEL_OK && i < n_chunks; i++) {
        if (i + 1 < n_chunks) {
            st = queue_out(x, src, nbytes, chunk, i + 1); /* its buffer held chunk i - 1 */
        }
        st = st == ACCEL_OK ? accel__event_sync(x->dev, x->done[i % 2]) : st;
        size_t off = i * chunk, n = nbytes - off < chunk ? nbytes - off : chunk;
        st = st == ACCEL_OK ? sink(ctx, x->buf[i % 2], n) : st;
    }
    if (st != ACCEL_OK) {
        (void)accel__stream_sync(x->dev, x->stream); /* nothing left writing the buffers */
    }
    return st;
}

accel_status accel__devio_from_host(accel__devio **io, accel_device where, void *dst, size_t nbytes,
                                    size_t align, accel__devio_fill fill, void *ctx)
{
    if (!accel__devio_staged(where)) {
        return nbytes > 0 ? fill(ctx, dst, 0, nbytes) : ACCEL_OK;
    }
    if (nbytes == 0) {
        return ACCEL_OK;
    }
    ACCEL_TRY(devio_open(io, where));
    accel__devio *x = *io;
    align = align > 0 ? align : 1;
    size_t chunk = x->chunk - x->chunk % align;
    if (chunk == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel__devio_from_host: elements of %zu bytes do not fit the "
                             "%zu-byte staging buffers",
                             align, x->chunk);
    }
    accel_status st = behind_default(x);
    for (size_t i = 0, off = 0; st == ACCEL_OK && off < nbytes; i++, off += chunk) {
        size_t n = nbytes - off < chunk ? nbytes - off : chunk;
        int b = (int)(i % 2);
        /* Buffer b's previous chunk (i - 2) must have reached the device. */
        st = i >= 2 ? accel__event_sync(x->dev, x->done[b]) : ACCEL_OK;
        st = st == ACCEL_OK ? fill(ctx, x->buf[b], off, n) : st;
        st = st == ACCEL_OK ? accel__dev_copy(x->dev, (char *)dst + off, x->buf[b], n,
                                              ACCEL__COPY_H2D, x->stream)
                            : st;
        st = st == ACCEL_OK ? accel__event_record(x->dev, x->done[b], x->stream) : st;
    }
    accel_status sst = accel__stream_sync(x->dev, x->stream);
    return st != ACCEL_OK ? st : sst;
}
