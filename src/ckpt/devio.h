/*
 * Checkpoint bytes to and from device memory (docs/checkpoint.md, "Checkpoints from GPU
 * memory"). Host memory is passed through as it is; device memory goes through two pinned
 * host buffers on a stream of its own, in chunks, so that the copy of one chunk overlaps the
 * file work (writing, reading, converting) on the other. Every device goes through the device
 * seam (src/device), so the CPU device runs the same code when staging is forced for tests.
 */
#ifndef ACCEL_CKPT_DEVIO_H
#define ACCEL_CKPT_DEVIO_H

#include <stddef.h>

#include "accel/tensor.h"
#include "base/base.h"

/* The staging state: device handle, stream, events and the two pinned buffers, made on first
 * need by the functions below (start from NULL) and reused by later calls on the same device.
 * Not thread-safe: one per thread of work. */
typedef struct accel__devio accel__devio;

/* Receives bytes in order (the file writer); its status stops the transfer. */
typedef accel_status (*accel__devio_sink)(void *ctx, const void *data, size_t n);
/* Writes bytes [off, off + n) of the source into buf (n a multiple of the call's align). */
typedef accel_status (*accel__devio_fill)(void *ctx, void *buf, size_t off, size_t n);

/* 1 when memory of `where` goes through staging (a device; the CPU when forced). */
int accel__devio_staged(accel_device where);
/* Whether `where` can be staged through: ACCEL_OK, or the device-open error naming why. */
accel_status accel__devio_check(accel_device where);

/*
 * Hands the nbytes at src (memory of device `where`) to sink, in order: host memory in one
 * call; device memory in chunks after the work queued so far on the device's default order
 * (its compute stream), the device-to-host copy of chunk i + 1 running while sink takes chunk i.
 */
accel_status accel__devio_to_host(accel__devio **io, accel_device where, const void *src,
                                  size_t nbytes, accel__devio_sink sink, void *ctx);
/*
 * Fills the nbytes at dst (memory of device `where`) from fill: host memory in one call with
 * buf = dst; device memory in chunks (multiples of align) after the work queued so far on the
 * device's default order, fill writing chunk i + 1 while chunk i is copied to the device.
 * Returns when dst holds the bytes. A failure may leave dst partly written.
 */
accel_status accel__devio_from_host(accel__devio **io, accel_device where, void *dst, size_t nbytes,
                                    size_t align, accel__devio_fill fill, void *ctx);
/* Waits for what is in flight and releases everything. Accepts NULL. */
void accel__devio_free(accel__devio *io);

/* Tests: host memory is staged too, in chunks of chunk_nbytes (0: not, the default; a device
 * then uses ACCEL__DEVIO_CHUNK). Set while no checkpoint is being written or loaded. */
void accel__devio_force_staging(size_t chunk_nbytes);

/* The chunk (each of the two pinned buffers) of a device. */
#define ACCEL__DEVIO_CHUNK ((size_t)8 << 20)

#endif /* ACCEL_CKPT_DEVIO_H */
