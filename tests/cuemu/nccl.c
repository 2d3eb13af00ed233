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
 * config NULL inherits it): every call on one returns ncclInProgress at once and runs on the
 * communicator's own worker thread (init, a collective, a group's calls at ncclGroupEnd, a
 * split, finalize); ncclCommGetAsyncError says ncclInProgress until it is done, then its
 * result. A call issued while the previous one is still in progress is refused
 * (ncclInvalidUsage), as NCCL requires polling first; a group may hold the calls of one
 * non-blocking communicator only. ncclCommAbort stops the worker's call and joins it.
 */
#include <fcntl.h>
#include <pthread.h>
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

#define SLOT_NBYTES ((size_t)4 << 20)
#define MAX_RANKS 64

typedef struct seg_hdr {
    _Atomic unsigned count, gen; /* the barrier */
    _Atomic int aborted;         /* a member aborted */
    _Atomic int more[MAX_RANKS]; /* point-to-point rounds: member r has messages left */
} seg_hdr;

struct ncclComm {
    int rank, n;
    int dead;            /* destroyed: every later call is ncclInvalidArgument */
    _Atomic int aborted; /* this process aborted it */
    ncclResult_t failed; /* the first failure: later calls report it */
    seg_hdr *h;          /* the segment (n > 1) or private memory (n = 1) */
    char *slots;         /* n slots of SLOT_NBYTES after the header */
    size_t map_nbytes;
    unsigned n_splits; /* children made, for their segments' names */
    char name[96];
    char last[256];
    struct worker *w; /* non-blocking: the thread that runs its calls; NULL: blocking */
};

static _Thread_local char t_last[256];

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fn, const char *fmt, ...)
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

static char *slot(ncclComm_t c, int r)
{
    return c->slots + (size_t)r * SLOT_NBYTES;
}

/* ---- the segment ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ncclResult_t barrier(ncclComm_t c, const char *fn)
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
            return fail(c, ncclInvalidUsage, fn, "the communicator was aborted");
        }
        if (atomic_load(&h->aborted)) {
            return fail(c, ncclRemoteError, fn, "a peer aborted the communicator");
        }
        if (spins < 200) {
            sched_yield();
            continue;
        }
        if (now_s() - t0 > limit) {
            return fail(c, ncclRemoteError, fn, "a peer did not make the call within %.0f s",
                        limit);
        }
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    return ncclSuccess;
}

/* Maps (n > 1: creates or joins, by name) the memory of a communicator of n ranks. */
static ncclResult_t attach(ncclComm_t c, const char *fn)
{
    c->map_nbytes = sizeof(seg_hdr) + 64 + (size_t)c->n * SLOT_NBYTES;
    if (c->n == 1) {
        c->h = calloc(1, c->map_nbytes);
        if (c->h == NULL) {
            return fail(c, ncclSystemError, fn, "out of memory");
        }
    } else {
        int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)c->map_nbytes) != 0) {
            if (fd >= 0) {
                close(fd);
            }
            return fail(c, ncclSystemError, fn, "cannot make the segment %s", c->name);
        }
        void *p = mmap(NULL, c->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            return fail(c, ncclSystemError, fn, "cannot map the segment %s", c->name);
        }
        c->h = p;
    }
    c->slots = (char *)c->h + ((sizeof(seg_hdr) + 63) / 64) * 64;
    ncclResult_t r = barrier(c, fn); /* everyone has mapped it: the name can go */
    if (c->n > 1 && c->rank == 0) {
        shm_unlink(c->name);
    }
    return r;
}

static ncclResult_t new_comm(ncclComm_t *out, int n, int rank, const char *name, const char *fn)
{
    ncclComm_t c = calloc(1, sizeof *c);
    if (c == NULL) {
        return fail(NULL, ncclSystemError, fn, "out of memory");
    }
    c->n = n;
    c->rank = rank;
    snprintf(c->name, sizeof c->name, "%s", name);
    ncclResult_t r = attach(c, fn);
    if (r != ncclSuccess) {
        snprintf(t_last, sizeof t_last, "%s", c->last);
        free(c);
        return r;
    }
    *out = c;
    return ncclSuccess;
}

/* ---- checks ---- */

static size_t type_nbytes(ncclDataType_t t)
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

static ncclResult_t idle(ncclComm_t c, const char *fn);

static ncclResult_t usable(ncclComm_t c, const char *fn)
{
    if (c == NULL || c->dead) {
        return fail(NULL, ncclInvalidArgument, fn, "the communicator is NULL or destroyed");
    }
    if (c->failed != ncclSuccess) {
        return fail(c, c->failed, fn, "the communicator failed before: %s", c->last);
    }
    return idle(c, fn);
}

/* Checks a call's communicator, dtype, root and buffers (of send_n and recv_n elements). */
static ncclResult_t check(ncclComm_t c, const char *fn, ncclDataType_t t, int root,
                          const void *send, size_t send_n, const void *recv, size_t recv_n)
{
    ncclResult_t r = usable(c, fn);
    if (r != ncclSuccess) {
        return r;
    }
    size_t es = type_nbytes(t);
    if (es == 0) {
        return fail(c, ncclInvalidArgument, fn, "unsupported datatype %d", (int)t);
    }
    if (root < 0 || root >= c->n) {
        return fail(c, ncclInvalidArgument, fn, "root %d is not a rank of %d", root, c->n);
    }
    if ((send_n > 0 && !cuemu_is_device(send, send_n * es)) ||
        (recv_n > 0 && !cuemu_is_device(recv, recv_n * es))) {
        return fail(c, ncclInvalidArgument, fn,
                    "a buffer is not device memory of the size the call needs");
    }
    return ncclSuccess;
}

/* ---- reductions, in rank order, in the dtype's arithmetic ---- */

#define COMBINE(acc, v, op)                                                                        \
    ((op) == ncclProd  ? (acc) * (v)                                                               \
     : (op) == ncclMax ? ((v) > (acc) ? (v) : (acc))                                               \
     : (op) == ncclMin ? ((v) < (acc) ? (v) : (acc))                                               \
                       : (acc) + (v))

#define REDUCE_AS(T)                                                                               \
    do {                                                                                           \
        T *d = dst;                                                                                \
        for (size_t i = 0; i < len; i++) {                                                         \
            T acc = ((const T *)(void *)slot(c, 0))[at + i];                                       \
            for (int r = 1; r < c->n; r++) {                                                       \
                T v = ((const T *)(void *)slot(c, r))[at + i];                                     \
                acc = (T)COMBINE(acc, v, op);                                                      \
            }                                                                                      \
            d[i] = op == ncclAvg ? (T)(acc / (T)c->n) : acc;                                       \
        }                                                                                          \
    } while (0)

/* dst[0, len) = the reduction of the slots' elements [at, at + len). */
static void reduce_slots(ncclComm_t c, void *dst, size_t at, size_t len, ncclDataType_t t,
                         ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8:
        REDUCE_AS(int8_t);
        break;
    case ncclUint8:
        REDUCE_AS(uint8_t);
        break;
    case ncclInt32:
        REDUCE_AS(int32_t);
        break;
    case ncclUint32:
        REDUCE_AS(uint32_t);
        break;
    case ncclInt64:
        REDUCE_AS(int64_t);
        break;
    case ncclUint64:
        REDUCE_AS(uint64_t);
        break;
    case ncclFloat32:
        REDUCE_AS(float);
        break;
    case ncclFloat64:
        REDUCE_AS(double);
        break;
    default: { /* fp16 / bf16: each combine rounded to the format */
        int bf16 = t == ncclBfloat16;
        uint16_t *d = dst;
        for (size_t i = 0; i < len; i++) {
            float acc = cuemu_from_half(((const uint16_t *)(void *)slot(c, 0))[at + i], bf16);
            for (int r = 1; r < c->n; r++) {
                float v = cuemu_from_half(((const uint16_t *)(void *)slot(c, r))[at + i], bf16);
                acc = cuemu_from_half(cuemu_to_half(COMBINE(acc, v, op), bf16), bf16);
            }
            d[i] = cuemu_to_half(op == ncclAvg ? acc / (float)c->n : acc, bf16);
        }
    }
    }
}

/* ---- the collectives, each in chunks of a slot ---- */

typedef enum { K_ALLREDUCE, K_REDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST } coll_kind;

typedef struct coll {
    coll_kind kind;
    const char *fn;
    const char *send;
    char *recv;
    size_t count; /* elements: per rank for reduce_scatter's output and allgather's input */
    ncclDataType_t t;
    ncclRedOp_t op;
    int root;
    ncclComm_t c;
} coll;

static ncclResult_t run_coll(const coll *k)
{
    ncclComm_t c = k->c;
    const size_t es = type_nbytes(k->t), per = SLOT_NBYTES / es, me = (size_t)c->rank;
    /* The elements every rank writes to its slot: the input (reduce_scatter: all of it). */
    const size_t total = k->kind == K_REDUCE_SCATTER ? k->count * (size_t)c->n : k->count;
    ncclResult_t r = ncclSuccess;
    for (size_t off = 0; r == ncclSuccess && off < total; off += per) {
        size_t len = total - off < per ? total - off : per;
        if (k->kind != K_BROADCAST || c->rank == k->root) {
            memcpy(slot(c, c->rank), k->send + off * es, len * es);
        }
        if ((r = barrier(c, k->fn)) != ncclSuccess) {
            break;
        }
        switch (k->kind) {
        case K_ALLREDUCE:
            reduce_slots(c, k->recv + off * es, 0, len, k->t, k->op);
            break;
        case K_REDUCE:
            if (c->rank == k->root) {
                reduce_slots(c, k->recv + off * es, 0, len, k->t, k->op);
            }
            break;
        case K_REDUCE_SCATTER: { /* the part of [off, off + len) that is this rank's */
            size_t lo = me * k->count, hi = lo + k->count;
            size_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
            if (a < b) {
                reduce_slots(c, k->recv + (a - lo) * es, a - off, b - a, k->t, k->op);
            }
            break;
        }
        case K_ALLGATHER:
            for (int q = 0; q < c->n; q++) {
                memcpy(k->recv + ((size_t)q * k->count + off) * es, slot(c, q), len * es);
            }
            break;
        case K_BROADCAST:
            memcpy(k->recv + off * es, slot(c, k->root), len * es);
            break;
        }
        r = barrier(c, k->fn); /* the slots are free again */
    }
    return r;
}

/* ---- groups: calls queued until the outermost ncclGroupEnd ---- */

typedef struct p2p {
    ncclComm_t c;
    int is_send, peer;
    char *buf;
    size_t nbytes, done;
    int complete;
} p2p;

#define MAX_QUEUED 256

static _Thread_local int t_group;
static _Thread_local coll t_colls[MAX_QUEUED];
static _Thread_local p2p t_p2p[MAX_QUEUED];
static _Thread_local int t_n_colls, t_n_p2p;

static ncclResult_t submit_coll(const coll *k);

static ncclResult_t issue(const coll *k)
{
    if (t_group == 0) {
        return k->c->w != NULL ? submit_coll(k) : run_coll(k);
    }
    if (t_n_colls == MAX_QUEUED) {
        return fail(k->c, ncclInvalidUsage, k->fn, "more than %d calls in one group", MAX_QUEUED);
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
        if ((r = barrier(c, fn)) != ncclSuccess) {
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
                        return fail(c, ncclInvalidUsage, fn,
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
        if ((r = barrier(c, fn)) != ncclSuccess || !any) {
            break;
        }
    }
    for (int i = 0; r == ncclSuccess && i < t_n_p2p; i++) {
        const p2p *m = &t_p2p[i];
        if (m->c == c && !m->is_send && !m->complete) {
            r = fail(c, ncclInvalidUsage, fn, "a receive from rank %d got %zu of %zu bytes",
                     m->peer, m->done, m->nbytes);
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
        return fail(c, ncclInvalidUsage, fn, "the emulator runs messages in groups only");
    }
    if (t_n_p2p == MAX_QUEUED) {
        return fail(c, ncclInvalidUsage, fn, "more than %d messages in one group", MAX_QUEUED);
    }
    t_p2p[t_n_p2p++] = (p2p){c, is_send, peer, buf, count * type_nbytes(t), 0, 0};
    return ncclSuccess;
}

static ncclResult_t submit_group(ncclComm_t c);
static ncclResult_t run_group(void);

ncclResult_t ncclGroupStart(void)
{
    t_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group == 0) {
        return fail(NULL, ncclInvalidUsage, "ncclGroupEnd", "no group is open");
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
        ncclResult_t r = mixed ? fail(nb, ncclInvalidUsage, "ncclGroupEnd",
                                      "the emulator runs a group with a non-blocking "
                                      "communicator only when all its calls are on that one")
                               : submit_group(nb);
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
        r = run_coll(&t_colls[i]);
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

/* ---- non-blocking communicators: a worker thread per communicator ---- */

typedef enum { J_INIT, J_COLL, J_GROUP, J_SPLIT, J_NOP } job_kind;

typedef struct job {
    job_kind kind;
    coll k;                 /* J_COLL */
    coll colls[MAX_QUEUED]; /* J_GROUP: the caller's queued calls */
    p2p msgs[MAX_QUEUED];
    int n_colls, n_msgs;
    int color, key;   /* J_SPLIT */
    ncclComm_t child; /* J_SPLIT: made by the call, attached here (or NULL) */
} job;

static _Thread_local job t_job; /* a call being handed over (large: not on the stack) */

typedef struct worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int has_job, quit;
    job j;
    _Atomic ncclResult_t state; /* ncclInProgress while a call runs, then its result */
} worker;

static ncclResult_t run_group(void);
static ncclResult_t split_exchange(ncclComm_t comm, int color, int key, int *n, int *rank,
                                   unsigned *k);

static ncclResult_t run_job(ncclComm_t c, job *j)
{
    switch (j->kind) {
    case J_INIT:
        return attach(c, "ncclCommInitRankConfig");
    case J_COLL:
        return run_coll(&j->k);
    case J_GROUP: /* the caller's queue, as this thread's own */
        memcpy(t_colls, j->colls, (size_t)j->n_colls * sizeof(coll));
        memcpy(t_p2p, j->msgs, (size_t)j->n_msgs * sizeof(p2p));
        t_n_colls = j->n_colls;
        t_n_p2p = j->n_msgs;
        return run_group();
    case J_SPLIT: {
        int n = 0, rank = 0;
        unsigned k = 0;
        ncclResult_t r = split_exchange(c, j->color, j->key, &n, &rank, &k);
        if (j->child == NULL) {
            return r;
        }
        ncclComm_t ch = j->child;
        ncclResult_t rc = r;
        if (r == ncclSuccess) {
            ch->n = n;
            ch->rank = rank;
            snprintf(ch->name, sizeof ch->name, "%.80s_s%u_c%d", c->name, k, j->color);
            rc = attach(ch, "ncclCommSplit");
        }
        atomic_store(&ch->w->state, rc); /* the child's own call: its setup */
        return r;
    }
    case J_NOP:
        break;
    }
    return ncclSuccess;
}

static void *worker_main(void *arg)
{
    ncclComm_t c = arg;
    worker *w = c->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->has_job && !w->quit) {
            pthread_cond_wait(&w->cv, &w->mu);
        }
        if (w->quit) {
            break;
        }
        pthread_mutex_unlock(&w->mu);
        ncclResult_t r = run_job(c, &w->j);
        pthread_mutex_lock(&w->mu);
        w->has_job = 0;
        atomic_store(&w->state, r);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Makes c non-blocking: its worker, in progress (its setup is the first job). */
static ncclResult_t worker_start(ncclComm_t c, const char *fn)
{
    c->w = calloc(1, sizeof *c->w);
    if (c->w == NULL) {
        return fail(NULL, ncclSystemError, fn, "out of memory");
    }
    pthread_mutex_init(&c->w->mu, NULL);
    pthread_cond_init(&c->w->cv, NULL);
    atomic_store(&c->w->state, ncclInProgress);
    if (pthread_create(&c->w->thread, NULL, worker_main, c) != 0) {
        free(c->w);
        c->w = NULL;
        return fail(NULL, ncclSystemError, fn, "cannot start a worker thread");
    }
    return ncclSuccess;
}

/* Hands j to c's worker: ncclInProgress (c's state until it is done). */
static ncclResult_t submit(ncclComm_t c, const job *j)
{
    pthread_mutex_lock(&c->w->mu);
    c->w->j = *j;
    c->w->has_job = 1;
    atomic_store(&c->w->state, ncclInProgress);
    pthread_cond_signal(&c->w->cv);
    pthread_mutex_unlock(&c->w->mu);
    return ncclInProgress;
}

/* A non-blocking communicator takes a call only once its previous one is done. */
static ncclResult_t idle(ncclComm_t c, const char *fn)
{
    if (c != NULL && c->w != NULL && !c->dead && atomic_load(&c->w->state) == ncclInProgress) {
        return fail(c, ncclInvalidUsage, fn,
                    "called on a non-blocking communicator whose previous call is still in "
                    "progress (poll ncclCommGetAsyncError until it is not ncclInProgress)");
    }
    return ncclSuccess;
}

static ncclResult_t submit_coll(const coll *k)
{
    t_job.kind = J_COLL;
    t_job.k = *k;
    return submit(k->c, &t_job);
}

static ncclResult_t submit_group(ncclComm_t c)
{
    ncclResult_t r = idle(c, "ncclGroupEnd");
    if (r != ncclSuccess) {
        return r;
    }
    t_job.kind = J_GROUP;
    memcpy(t_job.colls, t_colls, (size_t)t_n_colls * sizeof(coll));
    memcpy(t_job.msgs, t_p2p, (size_t)t_n_p2p * sizeof(p2p));
    t_job.n_colls = t_n_colls;
    t_job.n_msgs = t_n_p2p;
    return submit(c, &t_job);
}

static void worker_stop(ncclComm_t c)
{
    if (c->w == NULL) {
        return;
    }
    pthread_mutex_lock(&c->w->mu);
    c->w->quit = 1;
    pthread_cond_signal(&c->w->cv);
    pthread_mutex_unlock(&c->w->mu);
    pthread_join(c->w->thread, NULL); /* an aborted call returns at its next barrier spin */
    pthread_mutex_destroy(&c->w->mu);
    pthread_cond_destroy(&c->w->cv);
    free(c->w);
    c->w = NULL;
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
        return fail(NULL, ncclInvalidArgument, "ncclCommInitRank",
                    "rank %d of %d, or an id not made by ncclGetUniqueId (at most %d ranks)", rank,
                    nranks, MAX_RANKS);
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
        return fail(NULL, ncclInvalidArgument, fn, "config not from NCCL_CONFIG_INITIALIZER");
    }
    if (!nonblocking(config, NULL)) {
        return ncclCommInitRank(comm, nranks, id, rank);
    }
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks ||
        strncmp(id.internal, "/accel_cuemu_nccl_", 18) != 0) {
        return fail(NULL, ncclInvalidArgument, fn, "rank %d of %d, or a bad id", rank, nranks);
    }
    ncclComm_t c = calloc(1, sizeof *c);
    if (c == NULL) {
        return fail(NULL, ncclSystemError, fn, "out of memory");
    }
    c->n = nranks;
    c->rank = rank;
    snprintf(c->name, sizeof c->name, "%.95s", id.internal);
    ncclResult_t r = worker_start(c, fn);
    if (r != ncclSuccess) {
        free(c);
        return r;
    }
    *comm = c; /* usable for ncclCommGetAsyncError (and ncclCommAbort) at once, as NCCL's */
    t_job.kind = J_INIT;
    return submit(c, &t_job);
}

/* A split's exchange through the parent: the child's size and this rank in it, and the
 * split's number (for the child's segment name). */
static ncclResult_t split_exchange(ncclComm_t comm, int color, int key, int *n, int *rank,
                                   unsigned *k)
{
    const char *fn = "ncclCommSplit";
    int mine[2] = {color, key};
    memcpy(slot(comm, comm->rank), mine, sizeof mine);
    ncclResult_t r = barrier(comm, fn);
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
    return barrier(comm, fn);
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
        return fail(comm, ncclInvalidArgument, fn,
                    "the emulator splits a communicator only into one of the same blocking mode");
    }
    if (comm->w != NULL) {
        t_job.kind = J_SPLIT;
        t_job.color = color;
        t_job.key = key;
        t_job.child = NULL;
        if (color != NCCL_SPLIT_NOCOLOR) {
            ncclComm_t c = calloc(1, sizeof *c);
            if (c == NULL || worker_start(c, fn) != ncclSuccess) {
                free(c);
                return fail(comm, ncclSystemError, fn, "out of memory");
            }
            t_job.child = c;
            *newcomm = c; /* in progress until the parent's worker has attached it */
        }
        return submit(comm, &t_job);
    }
    int n = 0, rank = 0;
    unsigned k = 0;
    if ((r = split_exchange(comm, color, key, &n, &rank, &k)) != ncclSuccess ||
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
    t_job.kind = J_NOP; /* every call already ran: quiescent once the worker says so */
    return submit(comm, &t_job);
}

static ncclResult_t release(ncclComm_t comm, const char *fn, int abort)
{
    if (comm == NULL || comm->dead) {
        return fail(NULL, ncclInvalidArgument, fn, "the communicator is NULL or destroyed");
    }
    if (abort) {
        /* Another thread (or the worker) may wait in this communicator's barrier: the memory
         * stays mapped and the struct allocated (a later call is reported, not undefined). A
         * non-blocking one still being set up may have no memory yet (its worker is joined
         * first: it sets the memory up). */
        atomic_store(&comm->aborted, 1);
        worker_stop(comm);
        if (comm->n > 1 && comm->h != NULL) {
            atomic_store(&comm->h->aborted, 1);
        }
    } else if (comm->w != NULL && atomic_load(&comm->w->state) == ncclInProgress) {
        return fail(comm, ncclInvalidUsage, fn,
                    "a call is still in progress on this non-blocking communicator");
    } else if ((worker_stop(comm), comm->n > 1)) {
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
        return fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError", "NULL comm");
    }
    *async_error = comm->w != NULL && !comm->dead ? atomic_load(&comm->w->state) : comm->failed;
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
        r = fail(k.c, ncclInvalidArgument, k.fn, "unknown reduction op %d", (int)k.op);
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
