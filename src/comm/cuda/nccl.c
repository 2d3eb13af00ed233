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
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/store.h"
#include "nccl_impl.h"

accel_status accel__nccl_cuda_err(cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* consumed: reported here */
    return accel__seterr(NULL, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                         "nccl: %s failed: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

/* The abort's status and message, as the thread's error. */
accel_status accel__nccl_aborted_err(nccl_impl *e)
{
    return accel__seterr(NULL, e->abort_st, "%s", e->abort_msg);
}

accel_status accel__nccl_err(nccl_impl *e, ncclResult_t r, const char *what)
{
    if (e != NULL && atomic_load_explicit(&e->aborted, memory_order_acquire)) {
        return accel__nccl_aborted_err(e); /* the failure is the abort's echo: report its cause */
    }
    /* NCCL's own reason: ncclGetErrorString only says "run with NCCL_DEBUG=WARN", while
     * ncclGetLastError holds the text of NCCL's last WARN whatever NCCL_DEBUG is (in NCCL 2.x
     * it is process-wide, so it may be an older warning: it is labelled as NCCL's last). The
     * comm may be NULL (an init or a split whose communicator never came): NCCL ignores the
     * argument. The runtime version is the library loaded, not the headers built against. */
    char detail[320] = "";
    if (e == NULL || e->comm == NULL) {
        const char *d = ncclGetLastError(NULL);
        snprintf(detail, sizeof(detail), "%s", d != NULL ? d : "");
    } else {
        pthread_mutex_lock(&e->comm_mu);
        if (!atomic_load(&e->aborted)) { /* the abort frees what it reads */
            const char *d = ncclGetLastError(e->comm);
            snprintf(detail, sizeof(detail), "%s", d != NULL ? d : "");
        }
        pthread_mutex_unlock(&e->comm_mu);
    }
    for (size_t n = strlen(detail); n > 0 && (detail[n - 1] == '\n' || detail[n - 1] == ' ');) {
        detail[--n] = '\0'; /* NCCL's warnings may end in a newline */
    }
    int v = 0;
    (void)ncclGetVersion(&v);
    accel_status st = r == ncclRemoteError || r == ncclSystemError ? ACCEL_EPEER
                      : r == ncclInvalidArgument || r == ncclInvalidUsage ? ACCEL_EINVAL
                                                                          : ACCEL_EIO;
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "nccl: %s on process %d of %d failed: %s [NCCL %d.%d.%d%s%s]",
             what, e != NULL ? e->rank : -1, e != NULL ? e->n_ranks : 0, ncclGetErrorString(r),
             v / 10000, v / 100 % 100, v % 100, *detail ? "; its last warning: " : "", detail);
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
void accel__nccl_abort_deferred(nccl_impl *e)
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
ncclResult_t accel__nccl_async_error(nccl_impl *e)
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
accel_status accel__nccl_settle(nccl_impl *e, ncclResult_t r, const char *what)
{
    double deadline = accel__now() + e->timeout_s;
    while (r == ncclInProgress) {
        if (atomic_load_explicit(&e->aborted, memory_order_acquire)) {
            return accel__nccl_aborted_err(e);
        }
        if (accel__now() > deadline) {
            char msg[ACCEL__ERRMSG_NBYTES];
            snprintf(msg, sizeof(msg),
                     "nccl: %s on process %d of %d not complete after %.3g s (a peer is dead, "
                     "stuck or at another call); the communicator was aborted",
                     what, e->rank, e->n_ranks, e->timeout_s);
            accel__watch_suspects(e->watch, msg, sizeof(msg)); /* who is stopped or silent */
            abort_comm(e, ACCEL_ETIMEDOUT, msg);
            return accel__nccl_aborted_err(e);
        }
        nap();
        r = accel__nccl_async_error(e);
    }
    return r == ncclSuccess ? ACCEL_OK : accel__nccl_err(e, r, what);
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
        (void)accel__nccl_settle(e, r, "ncclCommFinalize");
    }
    /* The watch may abort the communicator until it is left; the last to leave departs from
     * the store (process 0 first waits for the others). */
    accel__watch_leave(e->watch, &e->wm);
    if (e->comm != NULL && !atomic_load(&e->aborted)) {
        (void)ncclCommDestroy(e->comm);
    } else if (e->abort_deferred) {
        (void)ncclCommAbort(e->comm); /* a group left open */
    }
    accel__nccl_req_destroy(e->spare);
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
    e->wm.progress = accel__nccl_progress;
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
        return accel__nccl_cuda_err(ce, "cudaSetDevice");
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
                                  : accel__nccl_err(e, r, "ncclGetUniqueId");
        } else if (st == ACCEL_OK) {
            size_t n = 0;
            st = accel__store_get(store, key, &id, sizeof(id), &n, e->timeout_s);
            if (st == ACCEL_OK && n != sizeof(id)) {
                st = accel__seterr(NULL, ACCEL_EIO, "nccl: malformed unique id in the store");
            }
        }
    } else if (ncclGetUniqueId(&id) != ncclSuccess) {
        st = accel__nccl_err(e, ncclSystemError, "ncclGetUniqueId");
    }
    if (st == ACCEL_OK) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0; /* see the top: no call waits for peers */
        pthread_mutex_lock(&e->comm_mu);
        ncclResult_t r = ncclCommInitRankConfig(&e->comm, cfg->n_ranks, id, cfg->rank, &config);
        pthread_mutex_unlock(&e->comm_mu);
        st = (r == ncclSuccess || r == ncclInProgress) && e->comm != NULL
                 ? accel__nccl_settle(e, r, "ncclCommInitRankConfig")
                 : accel__nccl_err(e, r, "ncclCommInitRankConfig");
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
    /* NCCL (init.cc's ncclCommSplit, 2.27 to 2.30) returns ncclSuccess on a non-blocking
     * parent although it has only handed the split to its group thread: that thread writes
     * *newcomm (NULL until then) at its end, and only after that does the parent's async
     * error, ncclInProgress since before ncclCommSplit returned, change; polling it to
     * ncclSuccess also joins the thread. So the parent is polled whatever the call returned,
     * and *newcomm read only then. Read at once (as this did), it was NULL, whose
     * ncclCommGetAsyncError is ncclInvalidArgument: the H200's "ncclCommSplit ... invalid
     * argument". Any other call on the parent before then is refused with ncclInvalidArgument
     * too (ncclCommEnsureReady: "Attempt to use communicator before the previous operation
     * returned ncclSuccess"), and NCCL reports a failure of the child's setup on the parent.
     * *newcomm is the parent's split_out, not a local: a settle ended by an abort may return
     * before NCCL's thread has written it (the abort joins that thread holding comm_mu, taken
     * below). config NULL: the child copies the parent's configuration, non-blocking too. */
    atomic_fetch_add_explicit(&e->wm.posted, 1, memory_order_relaxed); /* collective: watched */
    pthread_mutex_lock(&e->comm_mu);
    e->split_out = NULL;
    ncclResult_t r = atomic_load(&e->aborted)
                         ? ncclInvalidUsage
                         : ncclCommSplit(e->comm, how->color < 0 ? NCCL_SPLIT_NOCOLOR : how->color,
                                         how->key, &e->split_out, NULL);
    pthread_mutex_unlock(&e->comm_mu);
    accel_status st = r == ncclSuccess || r == ncclInProgress
                          ? accel__nccl_settle(e, ncclInProgress, "ncclCommSplit")
                          : accel__nccl_err(e, r, "ncclCommSplit");
    atomic_fetch_add_explicit(&e->wm.done, 1, memory_order_relaxed);
    /* Settled: NCCL's thread is done, or joined by the parent's abort, which holds comm_mu. */
    pthread_mutex_lock(&e->comm_mu);
    ncclComm_t nc = e->split_out;
    e->split_out = NULL;
    pthread_mutex_unlock(&e->comm_mu);
    if (c != NULL) {
        c->comm = nc;
    } else if (nc != NULL) {
        (void)ncclCommAbort(nc); /* not in a child, yet NCCL made one: not ours to keep */
    }
    if (st == ACCEL_OK && c != NULL && nc == NULL) {
        st = accel__seterr(NULL, ACCEL_EIO,
                           "nccl: ncclCommSplit on process %d of %d completed without a "
                           "communicator for color %d",
                           e->rank, e->n_ranks, how->color);
    }
    if (st == ACCEL_OK && c != NULL) {
        /* The child's own state: NCCL reports its setup on the parent, so it is normally
         * ncclSuccess already; polled all the same (bounded, as every wait). */
        st = accel__nccl_settle(c, ncclInProgress, "ncclCommSplit (the child's setup)");
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
    .post = accel__nccl_post,
    .test = accel__nccl_test,
    .req_free = accel__nccl_req_free,
    .group = accel__nccl_group,
    .abort = nccl_abort,
    .mem_alloc = accel__comm_plain_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = nccl_destroy,
    .describe = nccl_describe,
    .suspects = nccl_suspects,
};
