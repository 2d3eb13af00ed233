/*
 * The nccl backend's collectives (nccl_impl.h): requests (an event and grow-only staging
 * buffers, one spare kept), host buffers staged through the GPU, the NCCL calls on the
 * caller's stream under comm_mu, a group's requests finished at its end (after NCCL launched
 * it), and the flight list through which the watch sees posted collectives complete before
 * anyone tests them. Invariant: a request is counted once in the watch's done (in_flight).
 */
#include <stdio.h>
#include <string.h>

#include "nccl_impl.h"
#include "nccl_wire.h"

/* ---- dtypes and ops ---- */

static int nccl_dtype(accel_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case ACCEL_F32: *out = ncclFloat32; return 1;
    case ACCEL_F64: *out = ncclFloat64; return 1;
    case ACCEL_F16: *out = ncclFloat16; return 1;
    case ACCEL_BF16: *out = ncclBfloat16; return 1;
    case ACCEL_I8: *out = ncclInt8; return 1;
    case ACCEL_U8: *out = ncclUint8; return 1;
    case ACCEL_I32: *out = ncclInt32; return 1;
    case ACCEL_U32: *out = ncclUint32; return 1;
    case ACCEL_I64: *out = ncclInt64; return 1;
    case ACCEL_U64: *out = ncclUint64; return 1;
    default: return 0;
    }
}

static ncclRedOp_t nccl_op(accel_reduce_op op)
{
    switch (op) {
    case ACCEL_AVG: return ncclAvg;
    case ACCEL_MAX: return ncclMax;
    case ACCEL_MIN: return ncclMin;
    case ACCEL_PROD: return ncclProd;
    default: return ncclSum;
    }
}

static int reduces(accel__coll_kind k)
{
    return k == ACCEL__COLL_ALLREDUCE || k == ACCEL__COLL_REDUCE_SCATTER || k == ACCEL__COLL_REDUCE;
}

/* Input and output bytes of op on this rank (see comm.h for the counts). */
static void io_bytes(const nccl_impl *e, const accel__coll *op, size_t *in, size_t *out)
{
    size_t nb = op->count * accel_dtype_nbytes(op->dtype), n = (size_t)e->n_ranks;
    int root = e->rank == op->root;
    switch (op->kind) {
    case ACCEL__COLL_REDUCE_SCATTER: *in = nb * n; *out = nb; break;
    case ACCEL__COLL_ALLGATHER: *in = nb; *out = nb * n; break;
    case ACCEL__COLL_REDUCE: *in = nb; *out = root ? nb : 0; break;
    case ACCEL__COLL_GATHER: *in = nb; *out = root ? nb * n : 0; break;
    case ACCEL__COLL_BARRIER: *in = *out = 0; break;
    default: *in = *out = nb; break; /* allreduce, broadcast */
    }
}

static int on_device(const void *p)
{
    if (p == NULL) {
        return 1; /* nothing to stage */
    }
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* ---- requests ---- */

static accel_status req_get(nccl_impl *e, size_t staging, size_t wire, nccl_req **out)
{
    *out = NULL;
    pthread_mutex_lock(&e->mu);
    nccl_req *q = e->spare;
    e->spare = NULL;
    pthread_mutex_unlock(&e->mu);
    if (q == NULL) {
        q = accel__calloc(1, sizeof(*q));
        if (q == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "nccl: out of memory");
        }
        cudaError_t ce = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
        if (ce != cudaSuccess) {
           accel__free(q);
            return accel__nccl_cuda_err(ce, "cudaEventCreate");
        }
    }
    q->recv = NULL;
    q->st = ACCEL_OK;
    if (staging > q->nbytes) {
        (void)cudaFree(q->dbuf);
        (void)cudaFreeHost(q->hbuf);
        q->dbuf = q->hbuf = NULL;
        q->nbytes = 0;
        cudaError_t ce = cudaMalloc(&q->dbuf, staging);
        if (ce == cudaSuccess) {
            ce = cudaHostAlloc(&q->hbuf, staging, cudaHostAllocDefault);
        }
        if (ce != cudaSuccess) {
            (void)cudaFree(q->dbuf);
            q->dbuf = NULL;
            *out = q; /* released by the caller with req_put */
            return accel__nccl_cuda_err(ce, "allocating the staging buffers of a host collective");
        }
        q->nbytes = staging;
    }
    if (wire > q->wnbytes) {
        (void)cudaFree(q->wbuf);
        q->wbuf = NULL;
        q->wnbytes = 0;
        cudaError_t ce = cudaMalloc((void **)&q->wbuf, wire);
        if (ce != cudaSuccess) {
            q->wbuf = NULL;
            *out = q;
            return accel__nccl_cuda_err(ce, "allocating the wire buffer of a compressed allreduce");
        }
        q->wnbytes = wire;
    }
    *out = q;
    return ACCEL_OK;
}

void accel__nccl_req_destroy(nccl_req *q)
{
    if (q != NULL) {
        (void)cudaEventDestroy(q->ev);
        (void)cudaFree(q->dbuf);
        (void)cudaFreeHost(q->hbuf);
        (void)cudaFree(q->wbuf);
       accel__free(q);
    }
}

/* q's operation is over (complete, failed or given up): the watch stops counting it. Either
 * thread (the owner's test, the watch's progress): counted once. */
static void req_over(nccl_impl *e, nccl_req *q)
{
    if (q != NULL && atomic_exchange(&q->in_flight, 0)) {
        atomic_fetch_add_explicit(&e->wm.done, 1, memory_order_relaxed);
    }
}

static void flight_unlink(nccl_impl *e, nccl_req *q)
{
    for (nccl_req **p = &e->flight; *p != NULL; p = &(*p)->next) {
        if (*p == q) {
            *p = q->next;
            break;
        }
    }
}

/* The watch's progress (its thread, before it judges a stall): a posted collective that is
 * complete on the GPU is done even if nobody tested it yet (work posted and waited for much
 * later is no stall). */
void accel__nccl_progress(void *arg)
{
    nccl_impl *e = arg;
    pthread_mutex_lock(&e->mu);
    if (e->flight != NULL) {
        (void)cudaSetDevice(e->device); /* else this thread would make a context on GPU 0 */
    }
    for (nccl_req **p = &e->flight; *p != NULL;) {
        nccl_req *q = *p;
        if (cudaEventQuery(q->ev) == cudaSuccess) {
            *p = q->next;
            req_over(e, q);
        } else {
            p = &q->next;
        }
    }
    (void)cudaGetLastError(); /* a query's "not ready" is not the owner's error */
    pthread_mutex_unlock(&e->mu);
}

static void req_put(nccl_impl *e, nccl_req *q)
{
    req_over(e, q);
    pthread_mutex_lock(&e->mu);
    flight_unlink(e, q);
    nccl_req *old = e->spare;
    if (old == NULL || (q != NULL && q->nbytes >= old->nbytes)) {
        e->spare = q;
        q = old;
    }
    pthread_mutex_unlock(&e->mu);
   accel__nccl_req_destroy(q);
}

/* ---- collectives ---- */

/* Enqueues op on s with device pointers send / recv. */
static ncclResult_t enqueue(nccl_impl *e, const accel__coll *op, const void *send, void *recv,
                            ncclDataType_t dt, cudaStream_t s)
{
    size_t nb = op->count * accel_dtype_nbytes(op->dtype);
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return ncclAllReduce(send, recv, op->count, dt, nccl_op(op->op), e->comm, s);
    case ACCEL__COLL_REDUCE_SCATTER:
        return ncclReduceScatter(send, recv, op->count, dt, nccl_op(op->op), e->comm, s);
    case ACCEL__COLL_REDUCE:
        return ncclReduce(send, recv, op->count, dt, nccl_op(op->op), op->root, e->comm, s);
    case ACCEL__COLL_ALLGATHER:
        return ncclAllGather(send, recv, nb, ncclUint8, e->comm, s);
    case ACCEL__COLL_BROADCAST:
        return ncclBroadcast(send, recv, nb, ncclUint8, op->root, e->comm, s);
    case ACCEL__COLL_GATHER: {
        ncclResult_t r = ncclGroupStart();
        for (int q = 0; q < e->n_ranks && (r == ncclSuccess || r == ncclInProgress); q++) {
            if (e->rank != op->root) {
                r = q == op->root ? ncclSend(send, nb, ncclUint8, q, e->comm, s) : r;
            } else if (q == e->rank) {
                char *mine = (char *)recv + (size_t)q * nb;
                if (mine != send && cudaMemcpyAsync(mine, send, nb, cudaMemcpyDeviceToDevice,
                                                    s) != cudaSuccess) {
                    r = ncclUnhandledCudaError;
                }
            } else {
                r = ncclRecv((char *)recv + (size_t)q * nb, nb, ncclUint8, q, e->comm, s);
            }
        }
        ncclResult_t end = ncclGroupEnd();
        return r == ncclSuccess || r == ncclInProgress ? end : r;
    }
    case ACCEL__COLL_BARRIER:
        /* An allreduce of one byte of the staging buffer (post gives it one). */
        return ncclAllReduce(send, recv, 1, ncclUint8, ncclMax, e->comm, s);
    }
    return ncclInvalidArgument;
}

/* enqueue under comm_mu; ncclInvalidUsage once aborted (the comm is gone). */
static ncclResult_t enqueue_locked(nccl_impl *e, const accel__coll *op, const void *send,
                                   void *recv, ncclDataType_t dt, cudaStream_t s)
{
    pthread_mutex_lock(&e->comm_mu);
    ncclResult_t r =
        atomic_load(&e->aborted) ? ncclInvalidUsage : enqueue(e, op, send, recv, dt, s);
    pthread_mutex_unlock(&e->comm_mu);
    return r;
}

/* An allreduce through a wire dtype: send rounded into the 16-bit buffer, reduced there in
 * that format, widened into recv, all on s. */
static accel_status enqueue_wire(nccl_impl *e, const accel__coll *op, const float *send,
                                 float *recv, uint16_t *wbuf, cudaStream_t s)
{
    int bf16 = op->wire == ACCEL_BF16;
    cudaError_t ce = accel__nccl_wire_pack(wbuf, send, op->count, bf16, s);
    if (ce != cudaSuccess) {
        return accel__nccl_cuda_err(ce, "rounding an allreduce's input to its wire dtype");
    }
   accel__coll half = *op;
    half.dtype = bf16 ? ACCEL_BF16 : ACCEL_F16;
    accel_status st = accel__nccl_settle(
        e, enqueue_locked(e, &half, wbuf, wbuf, bf16 ? ncclBfloat16 : ncclFloat16, s), "allreduce");
    if (st != ACCEL_OK) {
        return st;
    }
    ce = accel__nccl_wire_unpack(recv, wbuf, op->count, bf16, s);
    return ce == cudaSuccess ? ACCEL_OK
                             : accel__nccl_cuda_err(ce, "widening an allreduce's wire result");
}

static accel_status req_finish(nccl_impl *e, nccl_req *q, cudaStream_t s);

accel_status accel__nccl_post(void *impl, const accel__coll *op, accel__stream *stream,
                              void **out)
{
    nccl_impl *e = impl;
    *out = NULL;
    const char *what = accel__coll_name(op->kind);
    if (atomic_load_explicit(&e->aborted, memory_order_acquire)) {
        return accel__nccl_aborted_err(e);
    }
    ncclDataType_t dt = ncclUint8;
    if (reduces(op->kind) && !nccl_dtype(op->dtype, &dt)) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "nccl: %s: NCCL cannot reduce dtype %s",
                             what, accel_dtype_name(op->dtype));
    }
    cudaError_t ce = cudaSetDevice(e->device);
    if (ce != cudaSuccess) {
        return accel__nccl_cuda_err(ce, "cudaSetDevice");
    }
    cudaStream_t s = e->stream_native(e->stream_arg, stream);
    size_t in, outb;
    io_bytes(e, op, &in, &outb);
    int direct = op->kind != ACCEL__COLL_BARRIER && on_device(op->send) && on_device(op->recv);
    size_t staging = direct ? 0 : (op->kind == ACCEL__COLL_BARRIER ? 64 : in + outb);
    /* The front end admits a wire dtype only on an F32 allreduce, as BF16 or F16. */
    int wire = op->wire == ACCEL_BF16 || op->wire == ACCEL_F16;
    if (wire && e->group_open > 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "nccl: a compressed (%s wire) allreduce inside a group: its widening "
                             "would run before the group's launch; post it outside the group",
                             accel_dtype_name(op->wire));
    }
    nccl_req *q;
    accel_status st = req_get(e, staging, wire ? op->count * sizeof(uint16_t) : 0, &q);
    if (st != ACCEL_OK) {
        req_put(e, q);
        return st;
    }
    const void *send = op->send;
    void *recv = op->recv;
    if (!direct) {
        /* Host buffers: inputs now to pinned memory and on to the device; the result comes
         * back to pinned memory on the stream and to recv when test sees the event. */
        char *dbuf = q->dbuf, *hbuf = q->hbuf;
        if (in > 0) {
            memcpy(hbuf, op->send, in);
            ce = cudaMemcpyAsync(dbuf, hbuf, in, cudaMemcpyHostToDevice, s);
        } else if (op->kind == ACCEL__COLL_BARRIER) {
            ce = cudaMemsetAsync(dbuf, 0, 1, s);
        }
        if (ce != cudaSuccess) {
            req_put(e, q);
            return accel__nccl_cuda_err(ce, "copying a host collective's input to the GPU");
        }
        send = dbuf;
        recv = op->kind == ACCEL__COLL_BARRIER ? dbuf : dbuf + in;
        if (op->kind == ACCEL__COLL_BROADCAST && e->rank == op->root) {
            recv = dbuf; /* in place at the root */
        }
        q->recv = outb > 0 ? op->recv : NULL;
        q->out_off = (size_t)((char *)recv - dbuf);
        q->out_nbytes = outb;
    }
    atomic_store(&q->in_flight, 1); /* from here until it is seen complete */
    atomic_fetch_add_explicit(&e->wm.posted, 1, memory_order_relaxed);
    st = wire ? enqueue_wire(e, op, send, recv, q->wbuf, s)
              : accel__nccl_settle(e, enqueue_locked(e, op, send, recv, dt, s), what);
    if (st == ACCEL_OK && e->group_open > 0) {
        q->stream = s; /* NCCL launches the group at its end: the rest waits until then */
        q->next = e->grouped;
        e->grouped = q;
    } else if (st == ACCEL_OK) {
        st = req_finish(e, q, s);
    }
    if (st != ACCEL_OK) {
        req_put(e, q);
        return st;
    }
    *out = q;
    return ACCEL_OK;
}

/* After q's NCCL call is launched on s: a staged result's copy back, the event test waits
 * for, and the watch's flight list. */
static accel_status req_finish(nccl_impl *e, nccl_req *q, cudaStream_t s)
{
    cudaError_t ce = cudaSuccess;
    if (q->recv != NULL) {
        ce = cudaMemcpyAsync((char *)q->hbuf + q->out_off, (char *)q->dbuf + q->out_off,
                             q->out_nbytes, cudaMemcpyDeviceToHost, s);
        if (ce != cudaSuccess) {
            return accel__nccl_cuda_err(ce, "copying a host collective's result");
        }
    }
    ce = cudaEventRecord(q->ev, s);
    if (ce != cudaSuccess) {
        return accel__nccl_cuda_err(ce, "cudaEventRecord");
    }
    pthread_mutex_lock(&e->mu);
    q->next = e->flight; /* the watch may see it complete before anyone tests it */
    e->flight = q;
    pthread_mutex_unlock(&e->mu);
    return ACCEL_OK;
}

/* The group's end (launched or failed with st): its requests get their copies and events, in
 * the order posted, or st. */
static accel_status group_finish(nccl_impl *e, accel_status st)
{
    nccl_req *rev = NULL;
    while (e->grouped != NULL) { /* newest first: reverse */
        nccl_req *q = e->grouped;
        e->grouped = q->next;
        q->next = rev;
        rev = q;
    }
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "%s", st != ACCEL_OK ? accel_last_error(NULL) : "");
    while (rev != NULL) {
        nccl_req *q = rev;
        rev = q->next;
        q->st = st == ACCEL_OK ? req_finish(e, q, q->stream) : st;
        st = q->st;
        if (st != ACCEL_OK && msg[0] == '\0') {
            snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
        }
        if (q->st != ACCEL_OK) {
            req_over(e, q); /* over: the watch no longer counts it */
        }
    }
    return st == ACCEL_OK ? ACCEL_OK : accel__seterr(NULL, st, "%s", msg);
}

int accel__nccl_test(void *impl, void *req, accel_status *st)
{
    nccl_impl *e = impl;
    nccl_req *q = req;
    if (atomic_load_explicit(&e->aborted, memory_order_acquire)) {
        *st = accel__nccl_aborted_err(e);
        return 1;
    }
    if (q->st != ACCEL_OK) {
        *st = accel__seterr(NULL, q->st, "nccl: a collective of a group that failed to launch");
        return 1;
    }
    cudaError_t ce = cudaEventQuery(q->ev);
    if (ce == cudaSuccess) {
        pthread_mutex_lock(&e->mu);
        flight_unlink(e, q);
        pthread_mutex_unlock(&e->mu);
        req_over(e, q);
        if (q->recv != NULL) {
            memcpy(q->recv, (char *)q->hbuf + q->out_off, q->out_nbytes);
            q->recv = NULL;
        }
        *st = ACCEL_OK;
        return 1;
    }
    if (ce != cudaErrorNotReady) {
        *st = accel__nccl_cuda_err(ce, "waiting for a collective");
        return 1;
    }
    ncclResult_t r = accel__nccl_async_error(e);
    if (r != ncclSuccess && r != ncclInProgress) {
        *st = accel__nccl_err(e, r, "a collective");
        return 1;
    }
    return 0;
}

void accel__nccl_req_free(void *impl, void *req)
{
    req_put(impl, req);
}

accel_status accel__nccl_group(void *impl, int begin)
{
    nccl_impl *e = impl;
    pthread_mutex_lock(&e->comm_mu);
    ncclResult_t r = begin ? ncclGroupStart() : ncclGroupEnd();
    e->group_open += begin ? 1 : -1;
   accel__nccl_abort_deferred(e);
    pthread_mutex_unlock(&e->comm_mu);
    if (begin) {
        return r == ncclSuccess ? ACCEL_OK : accel__nccl_err(e, r, "ncclGroupStart");
    }
    return group_finish(e, accel__nccl_settle(e, r, "ncclGroupEnd"));
}
