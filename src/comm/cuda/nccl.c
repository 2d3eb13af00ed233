/*
 * The nccl backend: CUDA GPUs over NCCL, one GPU per process (NCCL refuses two ranks on one
 * GPU: processes sharing a GPU use a host backend and the reducer's staging instead).
 *
 * Rendezvous: process 0 makes the ncclUniqueId and publishes it in the job's store
 * (MASTER_ADDR:MASTER_PORT, served by the launcher under a multi-machine accel launch, else by
 * process 0, which keeps it open as long as the communicator or a split child lives, and until
 * the others have left: see the watch below); the others read it there.
 * Communicators are non-blocking (ncclConfig_t.blocking = 0; split children inherit it): no
 * NCCL call waits for peers, each returns at once, ncclInProgress while NCCL finishes it, and
 * is settled by polling ncclCommGetAsyncError up to the communicator's deadline, then
 * ncclCommAbort. So every call on a communicator is short, and all of them, the polls and the
 * abort hold comm_mu: the watch's ncclCommAbort (from its thread) never runs while another
 * thread is inside NCCL on that communicator (NCCL allows one thread at a time on a
 * communicator, and the abort frees it). While the owner has a group open on the communicator
 * (ncclGroupStart .. ncclGroupEnd, with calls queued on it), the abort is left to the owner's
 * ncclGroupEnd, which does it at once after launching the group.
 *
 * Dead and stuck peers: NCCL's kernels wait for a dead peer forever (within a machine NCCL
 * reports nothing), so every process runs a liveness watch (watch.h) over the job's store,
 * shared by the world communicator and its split children: a peer that dies is named within
 * about a second, a collective that makes no progress for the timeout fails naming the stopped
 * or dead processes of this machine and the silent ones of every machine (heartbeats). Either
 * aborts the communicator from the watch's thread (ncclCommAbort under comm_mu, above), and
 * every waiter (test, settle) then returns the watch's message. The collective path only
 * counts its operations for the watch (two relaxed atomic adds). ncclCommAbort frees what
 * ncclCommGetAsyncError and ncclGetLastError read: those calls and the abort hold comm_mu.
 *
 * Collectives are NATIVE_ASYNC: post enqueues the NCCL call on the caller's stream (NULL: the
 * process's compute stream, so device buffers written by its kernels are ready in order) and
 * records an event; test queries the event, then NCCL's asynchronous error. Host buffers are
 * staged (copied to a device buffer, reduced there, copied back when the event completes), so
 * the library's own small host collectives (broadcasts of RNG state, metrics, barriers) work on
 * this backend too. Reductions are NCCL's: ring / tree orders, not rank order, so sums of more
 * than two processes may differ from the host backends in the last bits (documented); NCCL
 * reduces F16 and BF16 natively in their own type.
 *
 * A wire dtype (DDP's bf16 / fp16 compression, caps WIRE) is what PyTorch's bf16 compress hook
 * does on NCCL: the F32 input is rounded to the 16-bit format on the stream, NCCL reduces in
 * that format, and the result is widened into recv. On 1 or 2 processes that is exactly the
 * front end's rule (inputs rounded, combined in fp32, the result rounded); on more, NCCL rounds
 * its partial sums at each hop, so the last bits may differ from the host backends.
 *
 * Not supported (ACCEL_EUNSUPPORTED naming it): reductions of dtypes NCCL lacks (I16, U16,
 * BOOL, C64, the 8/6/4-bit formats; they still move in allgather, broadcast and gather),
 * symmetric memory beyond plain host memory.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/base.h"
#include "comm/comm.h"
#include "comm/store.h"
#include "comm/watch.h"
#include "nccl_wire.h"

typedef struct nccl_req nccl_req;

typedef struct nccl_impl {
    ncclComm_t comm;
    int rank, n_ranks, device;
    double timeout_s;
    accel__log_ctx log;
    accel__watch *watch; /* shared with the split children; holds the store client */
    accel__watch_member wm;
    void *(*stream_native)(void *arg, accel__stream *s);
    void *stream_arg;
    pthread_mutex_t mu;      /* the request cache and the abort's claim */
    pthread_mutex_t comm_mu; /* every NCCL call on comm, and its abort (see the top) */
    int group_open;          /* under comm_mu: the owner's groups open on comm */
    int abort_deferred;      /* under comm_mu: an abort left to the owner's ncclGroupEnd */
    nccl_req *spare;         /* a finished request to reuse (its event and staging buffers) */
    nccl_req *flight;        /* posted requests whose event is recorded and not yet seen done */
    nccl_req *grouped;       /* the owner's: posted in the open group, newest first */
    int abort_claimed;       /* under mu: the first abort writes the status and message */
    _Atomic int aborted;     /* released after abort_st and abort_msg are written */
    accel_status abort_st;
    char abort_msg[ACCEL__ERRMSG_NBYTES];
    unsigned n_splits;
} nccl_impl;

struct nccl_req {
    cudaEvent_t ev;
    /* Staging of host buffers: device and pinned host scratch, grow-only. */
    void *dbuf, *hbuf;
    size_t nbytes;
    uint16_t *wbuf; /* a wire dtype's 16-bit copy of the data (device), grow-only */
    size_t wnbytes;
    void *recv; /* host destination of the result (NULL: none or not staged) */
    size_t out_off, out_nbytes;
    _Atomic int in_flight; /* counted in the watch's posted, not yet in its done */
    nccl_req *next;        /* in the flight list (under mu) or the group's (the owner's) */
    cudaStream_t stream;   /* posted inside a group: its copy and event wait for the group end */
    accel_status st;       /* the group end's failure, reported by test */
};

static accel_status cuda_err(cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* consumed: reported here */
    return accel__seterr(NULL, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                         "nccl: %s failed: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

/* The abort's status and message, as the thread's error. */
static accel_status aborted_err(nccl_impl *e)
{
    return accel__seterr(NULL, e->abort_st, "%s", e->abort_msg);
}

static accel_status nccl_err(nccl_impl *e, ncclResult_t r, const char *what)
{
    if (e != NULL && atomic_load_explicit(&e->aborted, memory_order_acquire)) {
        return aborted_err(e); /* the failure is the abort's echo: report its cause */
    }
    char detail[256] = "";
    if (e != NULL && e->comm != NULL) {
        pthread_mutex_lock(&e->comm_mu);
        if (!atomic_load(&e->aborted)) {
            const char *d = ncclGetLastError(e->comm);
            snprintf(detail, sizeof(detail), "%s", d != NULL ? d : "");
        }
        pthread_mutex_unlock(&e->comm_mu);
    }
    accel_status st = r == ncclRemoteError || r == ncclSystemError ? ACCEL_EPEER
                      : r == ncclInvalidArgument || r == ncclInvalidUsage ? ACCEL_EINVAL
                                                                          : ACCEL_EIO;
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "nccl: %s on process %d of %d failed: %s%s%s", what,
             e != NULL ? e->rank : -1, e != NULL ? e->n_ranks : 0, ncclGetErrorString(r),
             *detail ? ": " : "", detail);
    if (st == ACCEL_EPEER && e != NULL) {
        accel__watch_suspects(e->watch, msg, sizeof(msg)); /* a peer's abort: whose stall? */
    }
    return accel__seterr(NULL, st, "%s", msg);
}

/* Breaks the communicator with st and msg (the first abort wins): kernels and calls waiting on
 * peers stop, every later call reports it. Any thread. */
static void abort_comm(nccl_impl *e, accel_status st, const char *msg)
{
    pthread_mutex_lock(&e->mu);
    int first = !e->abort_claimed;
    if (first) {
        e->abort_claimed = 1;
        e->abort_st = st;
        snprintf(e->abort_msg, sizeof(e->abort_msg), "%s", msg);
    }
    pthread_mutex_unlock(&e->mu);
    if (!first) {
        return;
    }
    pthread_mutex_lock(&e->comm_mu);
    atomic_store_explicit(&e->aborted, 1, memory_order_release);
    if (e->comm != NULL && e->group_open > 0) {
        e->abort_deferred = 1; /* calls queued on comm: the owner's ncclGroupEnd aborts */
    } else if (e->comm != NULL) {
        (void)ncclCommAbort(e->comm); /* the comm is gone */
    }
    pthread_mutex_unlock(&e->comm_mu);
}

/* The abort left to the owner (comm_mu held). */
static void abort_deferred(nccl_impl *e)
{
    if (e->abort_deferred && e->group_open == 0) {
        e->abort_deferred = 0;
        (void)ncclCommAbort(e->comm);
    }
}

/* The watch's failure of this communicator (its thread). */
static void watch_fail(void *arg, accel_status st, const char *msg)
{
    abort_comm(arg, st, msg);
}

/* The async error of the communicator, ncclSuccess once it is aborted. */
static ncclResult_t async_error(nccl_impl *e)
{
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&e->comm_mu);
    if (!atomic_load(&e->aborted)) {
        ncclResult_t q = ncclCommGetAsyncError(e->comm, &r);
        r = q != ncclSuccess ? q : r;
    }
    pthread_mutex_unlock(&e->comm_mu);
    return r;
}

static void nap(void)
{
    struct timespec ts = {0, 100000}; /* 0.1 ms */
    nanosleep(&ts, NULL);
}

/* Waits until the non-blocking communicator has finished the call that returned `r` (NCCL's
 * ncclInProgress), at most the communicator's deadline; then aborts it (nothing hangs). */
static accel_status settle(nccl_impl *e, ncclResult_t r, const char *what)
{
    double deadline = accel__now() + e->timeout_s;
    while (r == ncclInProgress) {
        if (atomic_load_explicit(&e->aborted, memory_order_acquire)) {
            return aborted_err(e);
        }
        if (accel__now() > deadline) {
            char msg[ACCEL__ERRMSG_NBYTES];
            snprintf(msg, sizeof(msg),
                     "nccl: %s on process %d of %d not complete after %.3g s (a peer is dead, "
                     "stuck or at another call); the communicator was aborted",
                     what, e->rank, e->n_ranks, e->timeout_s);
            accel__watch_suspects(e->watch, msg, sizeof(msg)); /* who is stopped or silent */
            abort_comm(e, ACCEL_ETIMEDOUT, msg);
            return aborted_err(e);
        }
        nap();
        r = async_error(e);
    }
    return r == ncclSuccess ? ACCEL_OK : nccl_err(e, r, what);
}

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
            return cuda_err(ce, "cudaEventCreate");
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
            return cuda_err(ce, "allocating the staging buffers of a host collective");
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
            return cuda_err(ce, "allocating the wire buffer of a compressed allreduce");
        }
        q->wnbytes = wire;
    }
    *out = q;
    return ACCEL_OK;
}

static void req_destroy(nccl_req *q)
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
static void watch_progress(void *arg)
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
    req_destroy(q);
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
        return cuda_err(ce, "rounding an allreduce's input to its wire dtype");
    }
    accel__coll half = *op;
    half.dtype = bf16 ? ACCEL_BF16 : ACCEL_F16;
    accel_status st = settle(
        e, enqueue_locked(e, &half, wbuf, wbuf, bf16 ? ncclBfloat16 : ncclFloat16, s), "allreduce");
    if (st != ACCEL_OK) {
        return st;
    }
    ce = accel__nccl_wire_unpack(recv, wbuf, op->count, bf16, s);
    return ce == cudaSuccess ? ACCEL_OK : cuda_err(ce, "widening an allreduce's wire result");
}

static accel_status req_finish(nccl_impl *e, nccl_req *q, cudaStream_t s);

static accel_status nccl_post(void *impl, const accel__coll *op, accel__stream *stream,
                              void **out)
{
    nccl_impl *e = impl;
    *out = NULL;
    const char *what = accel__coll_name(op->kind);
    if (atomic_load_explicit(&e->aborted, memory_order_acquire)) {
        return aborted_err(e);
    }
    ncclDataType_t dt = ncclUint8;
    if (reduces(op->kind) && !nccl_dtype(op->dtype, &dt)) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "nccl: %s: NCCL cannot reduce dtype %s",
                             what, accel_dtype_name(op->dtype));
    }
    cudaError_t ce = cudaSetDevice(e->device);
    if (ce != cudaSuccess) {
        return cuda_err(ce, "cudaSetDevice");
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
            return cuda_err(ce, "copying a host collective's input to the GPU");
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
              : settle(e, enqueue_locked(e, op, send, recv, dt, s), what);
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
            return cuda_err(ce, "copying a host collective's result");
        }
    }
    ce = cudaEventRecord(q->ev, s);
    if (ce != cudaSuccess) {
        return cuda_err(ce, "cudaEventRecord");
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

static int nccl_test(void *impl, void *req, accel_status *st)
{
    nccl_impl *e = impl;
    nccl_req *q = req;
    if (atomic_load_explicit(&e->aborted, memory_order_acquire)) {
        *st = aborted_err(e);
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
        *st = cuda_err(ce, "waiting for a collective");
        return 1;
    }
    ncclResult_t r = async_error(e);
    if (r != ncclSuccess && r != ncclInProgress) {
        *st = nccl_err(e, r, "a collective");
        return 1;
    }
    return 0;
}

static void nccl_req_free(void *impl, void *req)
{
    req_put(impl, req);
}

static accel_status nccl_group(void *impl, int begin)
{
    nccl_impl *e = impl;
    pthread_mutex_lock(&e->comm_mu);
    ncclResult_t r = begin ? ncclGroupStart() : ncclGroupEnd();
    e->group_open += begin ? 1 : -1;
    abort_deferred(e);
    pthread_mutex_unlock(&e->comm_mu);
    if (begin) {
        return r == ncclSuccess ? ACCEL_OK : nccl_err(e, r, "ncclGroupStart");
    }
    return group_finish(e, settle(e, r, "ncclGroupEnd"));
}

static void nccl_abort(void *impl, accel_status st, const char *msg)
{
    nccl_impl *e = impl;
    char full[ACCEL__ERRMSG_NBYTES];
    snprintf(full, sizeof(full), "nccl: process %d of %d aborted: %s", e->rank, e->n_ranks, msg);
    abort_comm(e, st, full);
}

static void nccl_suspects(void *impl, char *buf, size_t nbytes)
{
    accel__watch_suspects(((nccl_impl *)impl)->watch, buf, nbytes);
}

static void nccl_destroy(void *impl)
{
    nccl_impl *e = impl;
    if (e == NULL) {
        return;
    }
    if (e->comm != NULL && !atomic_load(&e->aborted)) {
        (void)cudaSetDevice(e->device);
        pthread_mutex_lock(&e->comm_mu);
        ncclResult_t r = atomic_load(&e->aborted) ? ncclSuccess : ncclCommFinalize(e->comm);
        pthread_mutex_unlock(&e->comm_mu);
        (void)settle(e, r, "ncclCommFinalize");
    }
    /* The watch may abort the communicator until it is left; the last to leave departs from
     * the store (process 0 first waits for the others). */
    accel__watch_leave(e->watch, &e->wm);
    if (e->comm != NULL && !atomic_load(&e->aborted)) {
        (void)ncclCommDestroy(e->comm);
    } else if (e->abort_deferred) {
        (void)ncclCommAbort(e->comm); /* a group left open */
    }
    req_destroy(e->spare);
    pthread_mutex_destroy(&e->comm_mu);
    pthread_mutex_destroy(&e->mu);
    accel__free(e);
}

static void nccl_describe(void *impl, char *buf, size_t nbytes)
{
    nccl_impl *e = impl;
    int v = 0;
    (void)ncclGetVersion(&v);
    snprintf(buf, nbytes, "nccl %d.%d.%d on cuda:%d", v / 10000, v / 100 % 100, v % 100,
             e->device);
}

/* ---- creation ---- */

static nccl_impl *impl_new(const accel__comm_config *cfg)
{
    nccl_impl *e = accel__calloc(1, sizeof(*e));
    if (e == NULL) {
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->comm_mu, NULL);
    e->wm.fail = watch_fail;
    e->wm.progress = watch_progress;
    e->wm.arg = e;
    e->rank = cfg->rank;
    e->n_ranks = cfg->n_ranks;
    e->device = cfg->device_ordinal;
    e->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1800;
    e->wm.timeout_s = e->timeout_s;
    e->log = cfg->log;
    e->stream_native = cfg->stream_native;
    e->stream_arg = cfg->stream_arg;
    return e;
}

/* World communicators made by this process: each gets its own key in the store. */
static _Atomic unsigned n_worlds;

static accel_status nccl_init(const accel__comm_config *cfg, void **out)
{
    *out = NULL;
    if (cfg->device_ordinal < 0 || cfg->stream_native == NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "nccl: process %d runs on the CPU: the nccl backend needs a CUDA "
                             "GPU per process (use shm, gloo or mpi)",
                             cfg->rank);
    }
    nccl_impl *e = impl_new(cfg);
    if (e == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nccl: out of memory");
    }
    cudaError_t ce = cudaSetDevice(e->device);
    if (ce != cudaSuccess) {
        nccl_destroy(e);
        return cuda_err(ce, "cudaSetDevice");
    }
    ncclUniqueId id;
    accel_status st = ACCEL_OK;
    accel__store *store = NULL; /* kept open by the watch: process 0 may serve it */
    char prefix[360], key[400];
    snprintf(prefix, sizeof(prefix), "%.300s/%d/nccl/w%u", cfg->job_id != NULL ? cfg->job_id : "",
             cfg->restart_count, atomic_fetch_add(&n_worlds, 1));
    snprintf(key, sizeof(key), "%s/id", prefix);
    accel__store_config sc = {.addr = cfg->master_addr,
                              .port = cfg->master_port,
                              .serve = !cfg->store_served && cfg->rank == 0,
                              .timeout_s = e->timeout_s};
    if (cfg->n_ranks > 1) {
        st = accel__store_open(&store, &sc);
        if (st == ACCEL_OK && cfg->rank == 0) {
            ncclResult_t r = ncclGetUniqueId(&id);
            st = r == ncclSuccess ? accel__store_set(store, key, &id, sizeof(id))
                                  : nccl_err(e, r, "ncclGetUniqueId");
        } else if (st == ACCEL_OK) {
            size_t n = 0;
            st = accel__store_get(store, key, &id, sizeof(id), &n, e->timeout_s);
            if (st == ACCEL_OK && n != sizeof(id)) {
                st = accel__seterr(NULL, ACCEL_EIO, "nccl: malformed unique id in the store");
            }
        }
    } else if (ncclGetUniqueId(&id) != ncclSuccess) {
        st = nccl_err(e, ncclSystemError, "ncclGetUniqueId");
    }
    if (st == ACCEL_OK) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0; /* see the top: no call waits for peers */
        pthread_mutex_lock(&e->comm_mu);
        ncclResult_t r = ncclCommInitRankConfig(&e->comm, cfg->n_ranks, id, cfg->rank, &config);
        pthread_mutex_unlock(&e->comm_mu);
        st = (r == ncclSuccess || r == ncclInProgress) && e->comm != NULL
                 ? settle(e, r, "ncclCommInitRankConfig")
                 : nccl_err(e, r, "ncclCommInitRankConfig");
    }
    if (st != ACCEL_OK && store != NULL) {
        if (cfg->rank == 0) {
            accel__store_abandon(store); /* the others fail on their deadline, not at once */
        } else {
            accel__store_close(store);
        }
        store = NULL;
    }
    if (st == ACCEL_OK && store != NULL) {
        accel__watch_config wc = {.what = "nccl",
                                  .prefix = prefix,
                                  .addr = cfg->master_addr,
                                  .launcher_serves = cfg->store_served,
                                  .serves = sc.serve,
                                  .process = cfg->process_base + cfg->rank,
                                  .n_processes = cfg->n_ranks,
                                  .local_process = cfg->local_rank,
                                  .local_n_processes = cfg->local_n_ranks,
                                  .timeout_s = e->timeout_s,
                                  .log = cfg->log};
        st = accel__watch_start(&e->watch, store, &wc); /* takes store */
        if (st == ACCEL_OK) {
            accel__watch_join(e->watch, &e->wm);
        }
    }
    if (st != ACCEL_OK) {
        nccl_destroy(e);
        return accel__seterr(NULL, st,
                             "nccl: process %d of %d could not join the communicator on "
                             "cuda:%d: %s",
                             cfg->rank, cfg->n_ranks, cfg->device_ordinal, accel_last_error(NULL));
    }
    accel__log(&e->log, ACCEL__LOG_INFO, "nccl: %d processes connected, this one on cuda:%d",
               e->n_ranks, e->device);
    *out = e;
    return ACCEL_OK;
}

static accel_status nccl_split(void *impl, const accel__comm_split_info *how, void **child)
{
    nccl_impl *e = impl;
    *child = NULL;
    nccl_impl *c = how->cfg != NULL ? impl_new(how->cfg) : NULL;
    if (how->cfg != NULL && c == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nccl: out of memory in accel__comm_split");
    }
    if (c != NULL) {
        c->device = e->device;
        c->stream_native = e->stream_native;
        c->stream_arg = e->stream_arg;
    }
    ncclComm_t nc = NULL; /* the parent's configuration (config NULL) */
    atomic_fetch_add_explicit(&e->wm.posted, 1, memory_order_relaxed); /* collective: watched */
    pthread_mutex_lock(&e->comm_mu);
    ncclResult_t r = atomic_load(&e->aborted)
                         ? ncclInvalidUsage
                         : ncclCommSplit(e->comm, how->color < 0 ? NCCL_SPLIT_NOCOLOR : how->color,
                                         how->key, &nc, NULL);
    pthread_mutex_unlock(&e->comm_mu);
    accel_status st = settle(e, r, "ncclCommSplit");
    atomic_fetch_add_explicit(&e->wm.done, 1, memory_order_relaxed);
    if (c != NULL) {
        c->comm = nc; /* non-blocking: made at once, set up meanwhile */
    }
    if (st == ACCEL_OK && c != NULL) {
        st = settle(c, ncclInProgress, "ncclCommSplit"); /* the child's own setup */
    }
    if (st != ACCEL_OK) {
        if (c != NULL && c->comm != NULL) {
            abort_comm(c, st, accel_last_error(NULL)); /* its setup may be in progress */
        }
        nccl_destroy(c);
        return st;
    }
    if (c != NULL && e->watch != NULL) {
        c->watch = e->watch; /* the parent's watch: a death fails the children too */
        accel__watch_join(c->watch, &c->wm);
    }
    *child = c;
    return ACCEL_OK;
}

const accel__comm_ops accel__nccl_ops = {
    .init = nccl_init,
    .split = nccl_split,
    .post = nccl_post,
    .test = nccl_test,
    .req_free = nccl_req_free,
    .group = nccl_group,
    .abort = nccl_abort,
    .mem_alloc = accel__comm_plain_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = nccl_destroy,
    .describe = nccl_describe,
    .suspects = nccl_suspects,
};
