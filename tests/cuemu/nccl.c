/*
 * NCCL in the emulator build (cuemu.h). The ranks of a communicator are processes of this
 * machine (each with its own emulated GPU: ACCEL_CUEMU_DEVICES); they meet in a POSIX
 * shared-memory segment named in the ncclUniqueId, with one slot per rank. Every call runs when
 * it is issued (cuemu.h): a collective moves its data through the slots in chunks of a slot,
 * each chunk between two barriers of the segment, and reduces in rank order in the dtype's own
 * arithmetic (16-bit floats rounded after each combine, as NCCL's reductions round at each
 * hop); calls inside ncclGroupStart / ncclGroupEnd run at the group's end in order, their
 * point-to-point messages in rounds through the slots. So a call blocks until the peers make
 * the same call, where NCCL would return and let its kernel wait on the stream: accel's nccl
 * backend issues calls in the same order on every rank, so this only changes when they wait.
 * Unlike NCCL, every member of a communicator must take part in a group's point-to-point
 * rounds (accel's gather and scatter give every member a message).
 *
 * A peer that aborts (ncclCommAbort) fails its peers' calls with ncclRemoteError; one that
 * never arrives (dead or stopped: the emulator does not look, NCCL does not either) fails them
 * after ACCEL_CUEMU_NCCL_TIMEOUT_S seconds (60), as NCCL's kernels would hang until a watchdog
 * aborts them. ncclCommAbort from another thread makes a call blocked in the communicator
 * return at once (ncclInvalidUsage), as NCCL's abort stops its kernels: that is how accel's
 * watch (src/comm/watch.h) gets a process out of a collective with a dead peer. After a
 * failure the communicator only reports it (ncclCommGetAsyncError), as NCCL's does. Buffers
 * must be device memory of the size the call implies (cuemu_is_device).
 *
 * Non-blocking communicators (ncclCommInitRankConfig with config->blocking = 0; a split with
 * config NULL inherits it): every call on one runs on the communicator's own worker thread
 * (init, a collective, a group's calls at ncclGroupEnd, a split, finalize) and returns
 * ncclInProgress at once, except ncclCommSplit, which returns ncclSuccess as NCCL's does while
 * *newcomm stays NULL until the parent's worker has set the child up (and not before the
 * parent is polled: NCCL's setup takes long enough on a GPU); ncclCommGetAsyncError says ncclInProgress until the call is done, then
 * its result (a split's includes the child's setup, as NCCL reports it on the parent). A call
 * issued while the previous one is still in progress is refused with ncclInvalidArgument, as
 * NCCL's ncclCommEnsureReady does; ncclCommGetAsyncError(NULL) is ncclInvalidArgument too. A
 * group may hold the calls of one non-blocking communicator only. ncclCommAbort stops the
 * worker's call and joins it (a split's *newcomm is written by then).
 */
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "cuemu.h"
#include "nccl_emu.h"

static _Thread_local char t_last[256];

ncclResult_t cuemu_nccl_fail(ncclComm_t c, ncclResult_t r, const char *fn, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char *dst = c != NULL ? c->last : t_last;
    snprintf(dst, 256, "%s: %s", fn, what);
    fprintf(stderr, "cuemu: %s\n", dst);
    if (c != NULL && c->failed == ncclSuccess && r != ncclInvalidArgument) {
        c->failed = r;
    }
    return r;
}

/* ---- the segment ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ncclResult_t cuemu_nccl_barrier(ncclComm_t c, const char *fn)
{
    if (c->n == 1) {
        return ncclSuccess;
    }
    seg_hdr *h = c->h;
    unsigned gen = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->count, 1) == (unsigned)c->n - 1) {
        atomic_store(&h->count, 0);
        atomic_fetch_add(&h->gen, 1);
        return ncclSuccess;
    }
    const char *s = getenv("ACCEL_CUEMU_NCCL_TIMEOUT_S");
    double limit = s != NULL && atof(s) > 0 ? atof(s) : 60.0, t0 = now_s();
    for (unsigned spins = 0; atomic_load(&h->gen) == gen; spins++) {
        if (atomic_load(&c->aborted)) {
            return cuemu_nccl_fail(c, ncclInvalidUsage, fn, "the communicator was aborted");
        }
        if (atomic_load(&h->aborted)) {
            return cuemu_nccl_fail(c, ncclRemoteError, fn, "a peer aborted the communicator");
        }
        if (spins < 200) {
            sched_yield();
            continue;
        }
        if (now_s() - t0 > limit) {
            return cuemu_nccl_fail(c, ncclRemoteError, fn,
                                   "a peer did not make the call within %.0f s", limit);
        }
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    return ncclSuccess;
}

/* Maps (n > 1: creates or joins, by name) the memory of a communicator of n ranks. */
ncclResult_t cuemu_nccl_attach(ncclComm_t c, const char *fn)
{
    c->map_nbytes = sizeof(seg_hdr) + 64 + (size_t)c->n * SLOT_NBYTES;
    if (c->n == 1) {
        c->h = calloc(1, c->map_nbytes);
        if (c->h == NULL) {
            return cuemu_nccl_fail(c, ncclSystemError, fn, "out of memory");
        }
    } else {
        int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)c->map_nbytes) != 0) {
            if (fd >= 0) {
                close(fd);
            }
            return cuemu_nccl_fail(c, ncclSystemError, fn, "cannot make the segment %s", c->name);
        }
        void *p = mmap(NULL, c->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            return cuemu_nccl_fail(c, ncclSystemError, fn, "cannot map the segment %s", c->name);
        }
        c->h = p;
    }
    c->slots = (char *)c->h + ((sizeof(seg_hdr) + 63) / 64) * 64;
    ncclResult_t r = cuemu_nccl_barrier(c, fn); /* everyone has mapped it: the name can go */
    if (c->n > 1 && c->rank == 0) {
        shm_unlink(c->name);
    }
    return r;
}

static ncclResult_t new_comm(ncclComm_t *out, int n, int rank, const char *name, const char *fn)
{
    ncclComm_t c = calloc(1, sizeof *c);
    if (c == NULL) {
        return cuemu_nccl_fail(NULL, ncclSystemError, fn, "out of memory");
    }
    c->n = n;
    c->rank = rank;
    snprintf(c->name, sizeof c->name, "%s", name);
    ncclResult_t r = cuemu_nccl_attach(c, fn);
    if (r != ncclSuccess) {
        snprintf(t_last, sizeof t_last, "%s", c->last);
        free(c);
        return r;
    }
    *out = c;
    return ncclSuccess;
}

/* ---- checks ---- */

size_t cuemu_nccl_type_nbytes(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0; /* fp8: accel moves those as bytes */
    }
}

static ncclResult_t usable(ncclComm_t c, const char *fn)
{
    if (c == NULL || c->dead) {
        return cuemu_nccl_fail(NULL, ncclInvalidArgument, fn,
                               "the communicator is NULL or destroyed");
    }
    if (c->failed != ncclSuccess) {
        return cuemu_nccl_fail(c, c->failed, fn, "the communicator failed before: %s", c->last);
    }
    return c->w != NULL ? cuemu_nccl_idle(c, fn) : ncclSuccess;
}

/* Checks a call's communicator, dtype, root and buffers (of send_n and recv_n elements). */
static ncclResult_t check(ncclComm_t c, const char *fn, ncclDataType_t t, int root,
                          const void *send, size_t send_n, const void *recv, size_t recv_n)
{
    ncclResult_t r = usable(c, fn);
    if (r != ncclSuccess) {
        return r;
    }
    size_t es = cuemu_nccl_type_nbytes(t);
    if (es == 0) {
        return cuemu_nccl_fail(c, ncclInvalidArgument, fn, "unsupported datatype %d", (int)t);
    }
    if (root < 0 || root >= c->n) {
        return cuemu_nccl_fail(c, ncclInvalidArgument, fn, "root %d is not a rank of %d", root,
                               c->n);
    }
    if ((send_n > 0 && !cuemu_is_device(send, send_n * es)) ||
        (recv_n > 0 && !cuemu_is_device(recv, recv_n * es))) {
        return cuemu_nccl_fail(c, ncclInvalidArgument, fn,
                               "a buffer is not device memory of the size the call needs");
    }
    return ncclSuccess;
}

/* ---- groups: calls queued until the outermost ncclGroupEnd ---- */

static _Thread_local int t_group;
static _Thread_local coll t_colls[MAX_QUEUED];
static _Thread_local p2p t_p2p[MAX_QUEUED];
static _Thread_local int t_n_colls, t_n_p2p;

static ncclResult_t issue(const coll *k)
{
    if (t_group == 0) {
        return k->c->w != NULL ? cuemu_nccl_submit_coll(k) : cuemu_nccl_run_coll(k);
    }
    if (t_n_colls == MAX_QUEUED) {
        return cuemu_nccl_fail(k->c, ncclInvalidUsage, k->fn, "more than %d calls in one group",
                               MAX_QUEUED);
    }
    t_colls[t_n_colls++] = *k;
    return ncclSuccess;
}

/* A message piece in a slot: to whom, how many bytes (the data follows, padded to 8). */
typedef struct piece {
    int32_t dst;
    uint32_t pad;
    uint64_t nbytes;
} piece;

/* The group's messages on communicator c, in rounds: each member packs what fits of its sends
 * into its slot (a message may take several rounds), then takes the pieces addressed to it,
 * from each source in order, into its receives from that source in order. */
static ncclResult_t exchange(ncclComm_t c)
{
    const char *fn = "ncclGroupEnd";
    ncclResult_t r = ncclSuccess;
    for (;;) {
        char *mine = slot(c, c->rank), *at = mine + 8;
        uint32_t n_pieces = 0;
        int left = 0;
        for (int i = 0; i < t_n_p2p; i++) {
            p2p *m = &t_p2p[i];
            if (m->c != c || !m->is_send || m->complete) {
                continue;
            }
            size_t room = (size_t)(mine + SLOT_NBYTES - at);
            if (room <= sizeof(piece)) {
                left = 1;
                break;
            }
            size_t len = m->nbytes - m->done;
            len = len < room - sizeof(piece) ? len : (room - sizeof(piece)) / 8 * 8;
            piece p = {m->peer, 0, len};
            memcpy(at, &p, sizeof p);
            memcpy(at + sizeof p, m->buf + m->done, len);
            at += sizeof p + (len + 7) / 8 * 8;
            n_pieces++;
            m->done += len;
            m->complete = m->done == m->nbytes;
            if (!m->complete) {
                left = 1;
                break;
            }
        }
        memcpy(mine, &n_pieces, sizeof n_pieces);
        atomic_store(&c->h->more[c->rank], left);
        if ((r = cuemu_nccl_barrier(c, fn)) != ncclSuccess) {
            return r;
        }
        for (int q = 0; q < c->n; q++) {
            const char *src = slot(c, q), *p = src + 8;
            uint32_t np;
            memcpy(&np, src, sizeof np);
            for (uint32_t k = 0; k < np; k++) {
                piece pc;
                memcpy(&pc, p, sizeof pc);
                if (pc.dst == c->rank) {
                    p2p *m = NULL;
                    for (int i = 0; i < t_n_p2p && m == NULL; i++) {
                        p2p *x = &t_p2p[i];
                        m = x->c == c && !x->is_send && x->peer == q && !x->complete ? x : NULL;
                    }
                    if (m == NULL || m->done + pc.nbytes > m->nbytes) {
                        return cuemu_nccl_fail(
                            c, ncclInvalidUsage, fn,
                            "rank %d sent %llu bytes that no receive posted here takes", q,
                            (unsigned long long)pc.nbytes);
                    }
                    memcpy(m->buf + m->done, p + sizeof pc, pc.nbytes);
                    m->done += pc.nbytes;
                    m->complete = m->done == m->nbytes;
                }
                p += sizeof pc + (pc.nbytes + 7) / 8 * 8;
            }
        }
        int any = 0;
        for (int q = 0; q < c->n; q++) {
            any |= atomic_load(&c->h->more[q]);
        }
        if ((r = cuemu_nccl_barrier(c, fn)) != ncclSuccess || !any) {
            break;
        }
    }
    for (int i = 0; r == ncclSuccess && i < t_n_p2p; i++) {
        const p2p *m = &t_p2p[i];
        if (m->c == c && !m->is_send && !m->complete) {
            r = cuemu_nccl_fail(c, ncclInvalidUsage, fn,
                                "a receive from rank %d got %zu of %zu bytes", m->peer, m->done,
                                m->nbytes);
        }
    }
    return r;
}

static ncclResult_t queue_p2p(ncclComm_t c, const char *fn, int is_send, void *buf, size_t count,
                              ncclDataType_t t, int peer)
{
    ncclResult_t r = check(c, fn, t, peer, buf, is_send ? count : 0, buf, is_send ? 0 : count);
    if (r != ncclSuccess) {
        return r;
    }
    if (t_group == 0) {
        return cuemu_nccl_fail(c, ncclInvalidUsage, fn,
                               "the emulator runs messages in groups only");
    }
    if (t_n_p2p == MAX_QUEUED) {
        return cuemu_nccl_fail(c, ncclInvalidUsage, fn, "more than %d messages in one group",
                               MAX_QUEUED);
    }
    t_p2p[t_n_p2p++] = (p2p){c, is_send, peer, buf, count * cuemu_nccl_type_nbytes(t), 0, 0};
    return ncclSuccess;
}

static ncclResult_t run_group(void);

ncclResult_t ncclGroupStart(void)
{
    t_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group == 0) {
        return cuemu_nccl_fail(NULL, ncclInvalidUsage, "ncclGroupEnd", "no group is open");
    }
    if (--t_group > 0) {
        return ncclSuccess;
    }
    ncclComm_t nb = NULL; /* the group's non-blocking communicator, if any */
    int mixed = 0;
    for (int i = 0; i < t_n_colls + t_n_p2p; i++) {
        ncclComm_t c = i < t_n_colls ? t_colls[i].c : t_p2p[i - t_n_colls].c;
        mixed |= (nb != NULL && c != nb) || (nb == NULL && i > 0 && c->w != NULL);
        nb = c->w != NULL ? c : nb;
    }
    if (nb != NULL) {
        ncclResult_t r =
            mixed ? cuemu_nccl_fail(nb, ncclInvalidUsage, "ncclGroupEnd",
                                    "the emulator runs a group with a non-blocking "
                                    "communicator only when all its calls are on that one")
                  : cuemu_nccl_submit_group(nb, t_colls, t_n_colls, t_p2p, t_n_p2p);
        t_n_colls = t_n_p2p = 0;
        return r;
    }
    return run_group();
}

/* The calls queued in this thread's group, in order: collectives, then each communicator's
 * messages. */
static ncclResult_t run_group(void)
{
    ncclResult_t r = ncclSuccess;
    for (int i = 0; r == ncclSuccess && i < t_n_colls; i++) {
        r = cuemu_nccl_run_coll(&t_colls[i]);
    }
    for (int i = 0; r == ncclSuccess && i < t_n_p2p; i++) {
        int first = 1; /* each communicator's messages once, at its first message */
        for (int j = 0; j < i; j++) {
            first &= t_p2p[j].c != t_p2p[i].c;
        }
        r = first ? exchange(t_p2p[i].c) : r;
    }
    t_n_colls = t_n_p2p = 0;
    return r;
}

ncclResult_t cuemu_nccl_run_queued(const coll *colls, int n_colls, const p2p *msgs, int n_msgs)
{
    memcpy(t_colls, colls, (size_t)n_colls * sizeof(coll));
    memcpy(t_p2p, msgs, (size_t)n_msgs * sizeof(p2p));
    t_n_colls = n_colls;
    t_n_p2p = n_msgs;
    return run_group();
}

/* ---- the API ---- */

ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static _Atomic unsigned seq;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/accel_cuemu_nccl_%ld_%u", (long)getpid(),
             atomic_fetch_add(&seq, 1));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks ||
        strncmp(id.internal, "/accel_cuemu_nccl_", 18) != 0) {
        return cuemu_nccl_fail(
            NULL, ncclInvalidArgument, "ncclCommInitRank",
            "rank %d of %d, or an id not made by ncclGetUniqueId (at most %d ranks)", rank, nranks,
            MAX_RANKS);
    }
    return new_comm(comm, nranks, rank, id.internal, "ncclCommInitRank");
}

/* The blocking config of a call: config's, else the parent's (a split), else blocking. */
static int nonblocking(const ncclConfig_t *config, ncclComm_t parent)
{
    if (config != NULL && config->blocking != NCCL_CONFIG_UNDEF_INT) {
        return config->blocking == 0;
    }
    return config == NULL && parent != NULL && parent->w != NULL;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    const char *fn = "ncclCommInitRankConfig";
    if (config != NULL && (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t))) {
        *comm = NULL;
        return cuemu_nccl_fail(NULL, ncclInvalidArgument, fn,
                               "config not from NCCL_CONFIG_INITIALIZER");
    }
    if (!nonblocking(config, NULL)) {
        return ncclCommInitRank(comm, nranks, id, rank);
    }
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks ||
        strncmp(id.internal, "/accel_cuemu_nccl_", 18) != 0) {
        return cuemu_nccl_fail(NULL, ncclInvalidArgument, fn, "rank %d of %d, or a bad id", rank,
                               nranks);
    }
    ncclComm_t c = calloc(1, sizeof *c);
    if (c == NULL) {
        return cuemu_nccl_fail(NULL, ncclSystemError, fn, "out of memory");
    }
    c->n = nranks;
    c->rank = rank;
    snprintf(c->name, sizeof c->name, "%.95s", id.internal);
    ncclResult_t r = cuemu_nccl_worker_start(c, fn);
    if (r != ncclSuccess) {
        free(c);
        return r;
    }
    *comm = c; /* usable for ncclCommGetAsyncError (and ncclCommAbort) at once, as NCCL's */
    return cuemu_nccl_submit_init(c);
}

ncclResult_t cuemu_nccl_split_exchange(ncclComm_t comm, int color, int key, int *n, int *rank,
                                       unsigned *k)
{
    const char *fn = "ncclCommSplit";
    int mine[2] = {color, key};
    memcpy(slot(comm, comm->rank), mine, sizeof mine);
    ncclResult_t r = cuemu_nccl_barrier(comm, fn);
    if (r != ncclSuccess) {
        return r;
    }
    *n = *rank = 0;
    for (int q = 0; q < comm->n; q++) {
        int other[2];
        memcpy(other, slot(comm, q), sizeof other);
        if (color != NCCL_SPLIT_NOCOLOR && other[0] == color) {
            (*n)++; /* ranks of the child: by key, then by parent rank */
            *rank += other[1] < key || (other[1] == key && q < comm->rank);
        }
    }
    *k = comm->n_splits++;
    return cuemu_nccl_barrier(comm, fn);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    const char *fn = "ncclCommSplit";
    *newcomm = NULL;
    ncclResult_t r = usable(comm, fn);
    if (r != ncclSuccess) {
        return r;
    }
    if (nonblocking(config, comm) != (comm->w != NULL)) {
        return cuemu_nccl_fail(
            comm, ncclInvalidArgument, fn,
            "the emulator splits a communicator only into one of the same blocking mode");
    }
    if (comm->w != NULL) {
        ncclComm_t c = NULL;
        if (color != NCCL_SPLIT_NOCOLOR) {
            c = calloc(1, sizeof *c);
            if (c == NULL || cuemu_nccl_worker_start(c, fn) != ncclSuccess) {
                free(c);
                return cuemu_nccl_fail(comm, ncclSystemError, fn, "out of memory");
            }
        }
        /* As NCCL's (init.cc, 2.27 to 2.30): ncclSuccess, not ncclInProgress, though the split
         * only runs now on the parent's worker, which writes *newcomm (NULL until then) when it
         * is done, before the parent leaves ncclInProgress. The caller polls the PARENT. */
        r = cuemu_nccl_submit_split(comm, color, key, c, newcomm);
        return r == ncclInProgress ? ncclSuccess : r;
    }
    int n = 0, rank = 0;
    unsigned k = 0;
    if ((r = cuemu_nccl_split_exchange(comm, color, key, &n, &rank, &k)) != ncclSuccess ||
        color == NCCL_SPLIT_NOCOLOR) {
        return r;
    }
    char name[128];
    snprintf(name, sizeof name, "%.80s_s%u_c%d", comm->name, k, color);
    return new_comm(newcomm, n, rank, name, fn);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r = usable(comm, "ncclCommFinalize");
    if (r != ncclSuccess || comm->w == NULL) {
        return r;
    }
    return cuemu_nccl_submit_nop(comm);
}

static ncclResult_t release(ncclComm_t comm, const char *fn, int abort)
{
    if (comm == NULL || comm->dead) {
        return cuemu_nccl_fail(NULL, ncclInvalidArgument, fn,
                               "the communicator is NULL or destroyed");
    }
    if (abort) {
        /* Another thread (or the worker) may wait in this communicator's barrier: the memory
         * stays mapped and the struct allocated (a later call is reported, not undefined). A
         * non-blocking one still being set up may have no memory yet (its worker is joined
         * first: it sets the memory up). */
        atomic_store(&comm->aborted, 1);
        cuemu_nccl_worker_stop(comm);
        if (comm->n > 1 && comm->h != NULL) {
            atomic_store(&comm->h->aborted, 1);
        }
    } else if (comm->w != NULL && cuemu_nccl_state(comm) == ncclInProgress) {
        return cuemu_nccl_fail(comm, ncclInvalidUsage, fn,
                               "a call is still in progress on this non-blocking communicator");
    } else if ((cuemu_nccl_worker_stop(comm), comm->n > 1)) {
        munmap(comm->h, comm->map_nbytes);
    } else {
        free(comm->h);
    }
    comm->dead = 1;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return release(comm, "ncclCommDestroy", 0);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return release(comm, "ncclCommAbort", 1);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    if (comm == NULL) {
        return cuemu_nccl_fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError", "NULL comm");
    }
    *async_error = comm->w != NULL && !comm->dead ? cuemu_nccl_state(comm) : comm->failed;
    atomic_store(&comm->polled, 1); /* after the read: a split still in progress says so */
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    static const char *const names[] = {"no error",
                                        "unhandled cuda error",
                                        "unhandled system error",
                                        "internal error",
                                        "invalid argument",
                                        "invalid usage",
                                        "remote process exited or there was a network error",
                                        "NCCL operation in progress"};
    return (int)r >= 0 && (int)r < (int)(sizeof names / sizeof names[0]) ? names[r]
                                                                         : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    return comm != NULL ? comm->last : t_last;
}

static int valid_op(ncclRedOp_t op)
{
    return (int)op >= (int)ncclSum && (int)op <= (int)ncclAvg;
}

/* Checks and issues one collective. */
static ncclResult_t collective(coll k, size_t send_n, size_t recv_n)
{
    ncclResult_t r = check(k.c, k.fn, k.t, k.root, k.send, send_n, k.recv, recv_n);
    if (r == ncclSuccess && !valid_op(k.op)) {
        r = cuemu_nccl_fail(k.c, ncclInvalidArgument, k.fn, "unknown reduction op %d", (int)k.op);
    }
    return r == ncclSuccess ? issue(&k) : r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return collective((coll){K_ALLREDUCE, "ncclAllReduce", send, recv, count, t, op, 0, comm},
                      count, count);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    int is_root = comm != NULL && comm->rank == root;
    return collective((coll){K_REDUCE, "ncclReduce", send, recv, count, t, op, root, comm}, count,
                      is_root ? count : 0);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    size_t n = comm != NULL ? (size_t)comm->n : 1;
    return collective(
        (coll){K_REDUCE_SCATTER, "ncclReduceScatter", send, recv, recvcount, t, op, 0, comm},
        recvcount * n, recvcount);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    size_t n = comm != NULL ? (size_t)comm->n : 1;
    return collective(
        (coll){K_ALLGATHER, "ncclAllGather", send, recv, sendcount, t, ncclSum, 0, comm}, sendcount,
        sendcount * n);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    int is_root = comm != NULL && comm->rank == root;
    return collective(
        (coll){K_BROADCAST, "ncclBroadcast", send, recv, count, t, ncclSum, root, comm},
        is_root ? count : 0, count);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    return queue_p2p(comm, "ncclSend", 1, (void *)send, count, t, peer);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    return queue_p2p(comm, "ncclRecv", 0, recv, count, t, peer);
}
