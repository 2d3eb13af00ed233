/*
 * Buffer collectives on device memory (used by coll_api.c). The host backends (shm, gloo, mpi)
 * read host memory only, so on a process that computes on a GPU a send or recv buffer in that
 * GPU's memory is staged through pinned host memory (a communicator that reads GPU memory,
 * nccl, gets the buffers as they are): the bytes the call reads are copied to the
 * host on the compute stream (after the kernels queued there, so a buffer the user's kernels
 * write on accel_cuda_stream needs no synchronisation), the collective runs on the host copy,
 * and the bytes it writes are copied back before the call returns. Blocking calls only: a work
 * handle with a device buffer is ACCEL_EUNSUPPORTED.
 *
 * In-place forms stay in place: two device buffers that overlap map onto one host region at
 * the same distance, so the host call sees the same relation (send == recv, or the chunk inside
 * the full buffer). A buffer of which this process reads and writes nothing (broadcast's send
 * off the root, reduce_to's recv off the root) passes through untouched.
 *
 * The pinned buffer is cached on the accelerator (grown on demand, freed by accel_free); a call
 * made while another thread holds it allocates its own.
 */
#include <string.h>

#include "coll_stage.h"
#include "device/device.h"

static int force_staging;

void accel__coll_force_staging(int on)
{
    force_staging = on;
}

/* *out = 1 when p is memory of acc's device that the host cannot read. */
static accel_status on_device(accel *acc, const void *p, int *out)
{
    *out = 0;
    if (p == NULL) {
        return ACCEL_OK;
    }
    if (force_staging) {
        *out = 1;
        return ACCEL_OK;
    }
    if (acc->device.type != ACCEL_DEVICE_CUDA ||
        (accel__comm_caps(acc->comm) & ACCEL__COMM_DEVICE_MEM)) {
        return ACCEL_OK; /* a CPU process, or a communicator that reads GPU memory (nccl) */
    }
    return accel__dev_holds(acc->dev, p, out);
}

/* The bytes this process reads from send and writes to recv in the call; 0 when the dtype or
 * count is invalid. */
static int byte_counts(const accel *acc, accel__coll_kind kind, size_t count, accel_dtype dt,
                       int root, size_t *send_n, size_t *recv_n)
{
    const size_t es = (unsigned)dt < ACCEL_DTYPE_COUNT ? accel_dtype_nbytes(dt) : 0;
    const size_t n = (size_t)acc->n_ranks;
    if (es == 0 || count > SIZE_MAX / es / n) {
        return 0;
    }
    size_t all = count * es, off, cnt;
    accel__chunk_range(count, acc->n_ranks, acc->rank, &off, &cnt);
    const int me_root = acc->rank == root;
    switch (kind) {
    case ACCEL__COLL_ALLREDUCE:
        *send_n = all, *recv_n = all;
        return 1;
    case ACCEL__COLL_BROADCAST:
        *send_n = me_root ? all : 0, *recv_n = all;
        return 1;
    case ACCEL__COLL_REDUCE:
        *send_n = all, *recv_n = me_root ? all : 0;
        return 1;
    case ACCEL__COLL_GATHER:
        *send_n = all, *recv_n = me_root ? all * n : 0;
        return 1;
    case ACCEL__COLL_ALLGATHER:
        *send_n = cnt * es, *recv_n = all;
        return 1;
    case ACCEL__COLL_REDUCE_SCATTER:
        *send_n = all, *recv_n = cnt * es;
        return 1;
    default:
        return 0;
    }
}

/* sg->host: acc's cached pinned buffer if free (grown to nbytes), else one of its own. */
static accel_status acquire(accel *acc, size_t nbytes, accel__coll_staging *sg)
{
    if (__atomic_exchange_n(&acc->stage_busy, 1, __ATOMIC_ACQUIRE) != 0) {
        sg->pooled = 0;
        return accel__dev_host_alloc(acc->dev, nbytes, &sg->host);
    }
    if (acc->stage_nbytes < nbytes) {
        accel__dev_host_free(acc->dev, acc->stage_buf);
        acc->stage_buf = NULL;
        acc->stage_nbytes = 0;
        const size_t want = (nbytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        accel_status st = accel__dev_host_alloc(acc->dev, want, &acc->stage_buf);
        if (st != ACCEL_OK) {
            __atomic_store_n(&acc->stage_busy, 0, __ATOMIC_RELEASE);
            return st;
        }
        acc->stage_nbytes = want;
    }
    sg->host = acc->stage_buf;
    sg->pooled = 1;
    return ACCEL_OK;
}

static void release(accel *acc, accel__coll_staging *sg)
{
    if (sg->host == NULL) {
        return;
    }
    if (sg->pooled) {
        __atomic_store_n(&acc->stage_busy, 0, __ATOMIC_RELEASE);
    } else {
        accel__dev_host_free(acc->dev, sg->host);
    }
    sg->host = NULL;
}

accel_status accel__coll_stage_begin(accel *acc, const char *fn, accel__coll_kind kind,
                                     size_t count, accel_dtype dt, int root, int async,
                                     const void **send, void **recv, accel__coll_staging *sg)
{
    memset(sg, 0, sizeof(*sg));
    int sd = 0, rd = 0;
    accel_status st = on_device(acc, *send, &sd);
    st = st == ACCEL_OK ? on_device(acc, *recv, &rd) : st;
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "%s: %s", fn, accel_last_error(NULL));
    }
    if (!sd && !rd) {
        return ACCEL_OK;
    }
    const char *which = sd ? "send" : "recv";
    if (async) {
        return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                             "%s: the %s buffer is in %s memory and a work handle was asked for: "
                             "collectives on device memory are staged through host memory and "
                             "run blocking only (pass work = NULL)",
                             fn, which, acc->device_name);
    }
    size_t send_n = 0, recv_n = 0;
    if (!byte_counts(acc, kind, count, dt, root, &send_n, &recv_n)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: count %zu of dtype %d is not a valid %s buffer in %s memory", fn,
                             count, (int)dt, which, acc->device_name);
    }
    const uintptr_t s = (uintptr_t)*send, r = (uintptr_t)*recv;
    /* Both on the device and overlapping (the in-place forms): one region covering both. */
    const int joint = sd && rd && (s == r || (s < r + recv_n && r < s + send_n));
    const size_t s_len = sd ? send_n : 0, r_len = rd ? recv_n : 0;
    size_t s_at = 0, r_at = 0, total;
    if (joint) {
        const uintptr_t lo = s < r ? s : r;
        const uintptr_t hi = s + send_n > r + recv_n ? s + send_n : r + recv_n;
        s_at = s - lo, r_at = r - lo, total = hi - lo;
    } else {
        r_at = (s_len + 63) & ~(size_t)63;
        total = r_at + r_len;
    }
    if (total == 0) {
        return ACCEL_OK; /* nothing is read or written: the pointers are never touched */
    }
    st = acquire(acc, total, sg);
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "%s: staging %zu bytes of %s memory: %s", fn, total,
                             acc->device_name, accel_last_error(NULL));
    }
    char *h = sg->host;
    if (sd && (joint || s_len > 0)) {
        st = accel__dev_copy(acc->dev, h + s_at, *send, send_n, ACCEL__COPY_D2H, NULL);
        if (st != ACCEL_OK) {
            release(acc, sg);
            return accel__seterr(acc, st, "%s: copying the send buffer to the host: %s", fn,
                                 accel_last_error(NULL));
        }
        *send = h + s_at;
    }
    if (rd && (joint || r_len > 0)) {
        sg->recv_dev = *recv;
        sg->recv_host = h + r_at;
        sg->recv_n = recv_n;
        *recv = h + r_at;
    }
    return ACCEL_OK;
}

accel_status accel__coll_stage_end(accel *acc, const char *fn, accel__coll_staging *sg,
                                   accel_status st)
{
    if (st == ACCEL_OK && sg->recv_dev != NULL && sg->recv_n > 0) {
        st = accel__dev_copy(acc->dev, sg->recv_dev, sg->recv_host, sg->recv_n, ACCEL__COPY_H2D,
                             NULL);
        if (st != ACCEL_OK) {
            st = accel__seterr(acc, st, "%s: copying the result back to %s memory: %s", fn,
                               acc->device_name, accel_last_error(NULL));
        }
    }
    release(acc, sg);
    return st;
}

void accel__coll_stage_free(accel *acc)
{
    accel__dev_host_free(acc->dev, acc->stage_buf);
    acc->stage_buf = NULL;
    acc->stage_nbytes = 0;
}
