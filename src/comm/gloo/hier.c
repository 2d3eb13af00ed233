/*
 * The hier composition: a job of several machines with several processes each. Inside a
 * machine the processes talk through shm (one segment per machine, named with the machine, so
 * two "machines" on one host never collide); across machines each process talks through gloo
 * with the processes of the same local rank on the other machines (one communicator per local
 * rank: every process carries its share of the traffic, and each machine's process l leads
 * shard l of every reduction).
 *
 * Allreduce: reduce-scatter inside (shard l of the machine's sum to local rank l), allreduce of
 * the shard across, allgather inside; messages larger than one chunk are pipelined: while the
 * cross-machine step of chunk i runs on a worker thread, this thread reduce-scatters chunk i + 1
 * and gathers chunk i - 1. Reductions combine the processes of a machine in rank order, then the
 * machines in order: deterministic on every rank and run, equal to the flat backends' rank-order
 * result for integers, BOOL, MIN and MAX, and for floats whenever the association agrees (one
 * process per machine, or two processes in all). F16 / BF16 / F8 and AVG keep the flat
 * semantics exactly where they matter: the data travel widened (fp32, or int64 for an integer
 * average) and are rounded (divided) once at the end.
 *
 * The processes of machine m must be ranks m * L .. m * L + L - 1 (accel launch's layout).
 * A failure at either level aborts the other, so every process of the job fails, naming the
 * process at fault.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "comm/comm.h"
#include "comm/reduce.h"
#include "comm/shm.h"
#include "comm/store.h"
#include "gloo.h"

#define CHUNK_NBYTES ((size_t)4 << 20) /* pipeline step: big enough to amortise a gloo call */

extern const accel__comm_ops accel__shm_ops;

typedef struct hier {
    int rank, n_ranks, l, L, node, n_nodes;
    void *shm;           /* the shm endpoint of this machine's L processes */
    accel__gloo *cross;  /* gloo over the n_nodes processes of local rank l */
    accel__store *store; /* the job's store, when this process serves it */
    void *work;          /* the padded, widened copy reductions run on (grow-only) */
    size_t work_nbytes;
    int *process;        /* n_ranks: the job-wide process index of each rank, for messages */
    char key[128];       /* the job's key: names this communicator's shm segment and gloo keys */

    /* The cross-machine worker of the pipeline. */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, stop, pending;
    accel__coll job;
    accel_status job_st;
    char job_msg[ACCEL__ERRMSG_NBYTES];
} hier;

/* ---- the two levels, each failure breaking the other ---- */

static accel_status inner(hier *h, const accel__coll *op)
{
    accel_status st = accel__shm_ops.run(h->shm, op);
    if (st != ACCEL_OK) {
        char msg[ACCEL__ERRMSG_NBYTES];
        snprintf(msg, sizeof(msg), "hier: machine %d: %s", h->node, accel_last_error(NULL));
        accel__gloo_abort(h->cross, st, msg);
        return accel__seterr(NULL, st, "%s", msg);
    }
    return ACCEL_OK;
}

/* A cross-machine failure (message set): the processes of this machine fail with it too. */
static accel_status cross_failed(hier *h, accel_status st)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
    accel__shm_ops.abort(h->shm, st, msg);
    return accel__seterr(NULL, st, "%s", msg);
}

static accel_status across(hier *h, const accel__coll *op)
{
    accel_status st = accel__gloo_run(h->cross, op);
    return st == ACCEL_OK ? ACCEL_OK : cross_failed(h, st);
}

static void *worker(void *arg)
{
    hier *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->pending && !h->stop) {
            pthread_cond_wait(&h->cv, &h->mu);
        }
        if (h->stop) {
            break;
        }
        accel__coll job = h->job;
        pthread_mutex_unlock(&h->mu);
        /* Gloo's own deadline bounds this call (every wait in it has the timeout). */
        accel_status st = accel__gloo_run(h->cross, &job);
        pthread_mutex_lock(&h->mu);
        h->job_st = st;
        snprintf(h->job_msg, sizeof(h->job_msg), "%s",
                 st != ACCEL_OK ? accel_last_error(NULL) : "");
        h->pending = 0;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static accel_status post_across(hier *h, const accel__coll *op)
{
    if (!h->started) {
        if (pthread_create(&h->thread, NULL, worker, h) != 0) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "hier: cannot start the cross-machine thread");
        }
        h->started = 1;
    }
    pthread_mutex_lock(&h->mu);
    h->job = *op;
    h->pending = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return ACCEL_OK;
}

static accel_status wait_across(hier *h)
{
    pthread_mutex_lock(&h->mu);
    while (h->pending) {
        pthread_cond_wait(&h->cv, &h->mu);
    }
    accel_status st = h->job_st;
    pthread_mutex_unlock(&h->mu);
    if (st != ACCEL_OK) {
        accel__seterr(NULL, st, "%s", h->job_msg);
        return cross_failed(h, st);
    }
    return ACCEL_OK;
}

/* ---- reductions ---- */

static accel_status work_buffer(hier *h, size_t nbytes, void **out)
{
    if (h->work_nbytes < nbytes) {
        void *p = accel__realloc(h->work, nbytes);
        if (p == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory for %zu bytes", nbytes);
        }
        h->work = p;
        h->work_nbytes = nbytes;
    }
    *out = h->work;
    return ACCEL_OK;
}

/* The dtype a reduction travels in: fp32 for the 16- and 8-bit floats (and any wire dtype),
 * int64 for an integer average, else the dtype itself. */
static accel_dtype wide_of(const accel__coll *op)
{
    switch (op->dtype) {
    case ACCEL_F16:
    case ACCEL_BF16:
    case ACCEL_F8_E4M3:
    case ACCEL_F8_E5M2:
        return ACCEL_F32;
    case ACCEL_I8:
    case ACCEL_U8:
    case ACCEL_I16:
    case ACCEL_U16:
    case ACCEL_I32:
        return op->op == ACCEL_AVG ? ACCEL_I64 : op->dtype;
    default:
        return op->dtype;
    }
}

/* Fills w (wide dtype) from the caller's input. */
static accel_status load(const accel__coll *op, accel_dtype wide, void *w, const void *in)
{
    if (op->wire != ACCEL_F32) {
        /* Each input rounded to the wire dtype (kept as f32): one input, so the "reduction" is
         * the rounding alone. */
        const void *one[1] = {in};
        accel__reduce_wire(op->wire, ACCEL_SUM, w, NULL, one, 1, op->count, 1);
        return ACCEL_OK;
    }
    if (wide != op->dtype) {
        return accel_convert(w, wide, in, op->dtype, op->count);
    }
    if (w != in) {
        memcpy(w, in, op->count * accel_dtype_nbytes(wide));
    }
    return ACCEL_OK;
}

/* Writes the result from w: the average's division, then the single rounding. */
static accel_status store_result(hier *h, const accel__coll *op, accel_dtype wide, void *w,
                                 void *out, size_t count)
{
    const void *one[1] = {w};
    if (op->op == ACCEL_AVG) {
        accel__reduce(wide, ACCEL_AVG, w, NULL, one, 1, count, h->n_ranks);
    }
    if (op->wire != ACCEL_F32) {
        accel__reduce_wire(op->wire, ACCEL_SUM, out, NULL, one, 1, count, 1);
        return ACCEL_OK;
    }
    if (wide != op->dtype) {
        return accel_convert(out, op->dtype, w, wide, count);
    }
    if (out != w) {
        memcpy(out, w, count * accel_dtype_nbytes(wide));
    }
    return ACCEL_OK;
}

/* One step of the pipeline below: chunk i's reduce-scatter, chunk i - 1's allgather (after its
 * cross-machine step), chunk i's cross-machine step (posted to the worker when pipelining). */
static accel_status pipeline_step(hier *h, accel_dtype wide, accel_reduce_op rop, char *w,
                                  size_t off, size_t s, size_t prev_off, size_t prev_s, int first,
                                  int piped)
{
    const size_t es = accel_dtype_nbytes(wide);
    char *shard = w + (off + (size_t)h->l * s) * es;
    if (s > 0) {
        accel__coll rs =
            ACCEL__COLL(ACCEL__COLL_REDUCE_SCATTER, w + off * es, shard, s, wide, rop, 0);
        ACCEL_TRY(inner(h, &rs));
    }
    if (!first) {
        if (piped) {
            ACCEL_TRY(wait_across(h));
        }
        char *pshard = w + (prev_off + (size_t)h->l * prev_s) * es;
        accel__coll ag = ACCEL__COLL(ACCEL__COLL_ALLGATHER, pshard, w + prev_off * es, prev_s, wide,
                                     ACCEL_SUM, 0);
        ACCEL_TRY(inner(h, &ag));
    }
    if (s > 0) {
        accel__coll x = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, shard, shard, s, wide, rop, 0);
        return piped ? post_across(h, &x) : across(h, &x);
    }
    return ACCEL_OK;
}

/* Allreduce of w (padded to a multiple of L elements of `wide`) in place, pipelined by chunk.
 * A failure waits for the worker first: it may still be using w. */
static accel_status allreduce_work(hier *h, const accel__coll *op, accel_dtype wide, char *w,
                                   size_t padded)
{
    const size_t es = accel_dtype_nbytes(wide), L = (size_t)h->L;
    size_t chunk = CHUNK_NBYTES / es / L * L;
    chunk = chunk < L ? L : chunk;
    const accel_reduce_op rop = op->op == ACCEL_AVG ? ACCEL_SUM : op->op;
    const size_t n_chunks = (padded + chunk - 1) / chunk;
    const int piped = n_chunks > 1;
    size_t prev_off = 0, prev_s = 0;
    accel_status st = ACCEL_OK;
    for (size_t i = 0; i <= n_chunks && st == ACCEL_OK; i++) {
        const size_t off = i * chunk;
        const size_t k = i < n_chunks ? (padded - off < chunk ? padded - off : chunk) : 0;
        st = pipeline_step(h, wide, rop, w, off, k / L, prev_off, prev_s, i == 0, piped);
        prev_off = off;
        prev_s = k / L;
    }
    if (st != ACCEL_OK && piped) {
        char msg[ACCEL__ERRMSG_NBYTES];
        snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
        (void)wait_across(h);
        return accel__seterr(NULL, st, "%s", msg);
    }
    return st;
}

static accel_status allreduce(hier *h, const accel__coll *op, void *out)
{
    const accel_dtype wide = wide_of(op);
    const size_t es = accel_dtype_nbytes(wide);
    const size_t padded = (op->count + (size_t)h->L - 1) / (size_t)h->L * (size_t)h->L;
    void *w = out;
    /* The caller's output serves as the work buffer when nothing widens or pads. */
    if (wide != op->dtype || op->wire != ACCEL_F32 || padded != op->count) {
        ACCEL_TRY(work_buffer(h, padded * es + 1, &w));
        memset((char *)w + op->count * es, 0, (padded - op->count) * es);
    }
    ACCEL_TRY(load(op, wide, w, op->send));
    ACCEL_TRY(allreduce_work(h, op, wide, w, padded));
    return store_result(h, op, wide, w, out, op->count);
}

/* Reduce-scatter: blocks regrouped so that local rank l's shm block holds global blocks
 * m * L + l of every machine m; reduce-scatter inside, then across (block of machine m). */
static accel_status reduce_scatter(hier *h, const accel__coll *op)
{
    const accel_dtype wide = wide_of(op);
    const size_t es = accel_dtype_nbytes(wide), c = op->count, L = (size_t)h->L;
    const size_t M = (size_t)h->n_nodes, block = c * es;
    char *w = NULL;
    ACCEL_TRY(work_buffer(h, (size_t)h->n_ranks * block + 1, (void **)&w));
    accel__coll one = *op;
    one.count = c;
    for (size_t m = 0; m < M; m++) {
        for (size_t l = 0; l < L; l++) {
            const char *src =
                (const char *)op->send + (m * L + l) * c * accel_dtype_nbytes(op->dtype);
            ACCEL_TRY(load(&one, wide, w + (l * M + m) * block, src));
        }
    }
    const accel_reduce_op rop = op->op == ACCEL_AVG ? ACCEL_SUM : op->op;
    char *mine = w + (size_t)h->l * M * block;
    accel__coll rs = ACCEL__COLL(ACCEL__COLL_REDUCE_SCATTER, w, mine, M * c, wide, rop, 0);
    ACCEL_TRY(inner(h, &rs));
    char *result = mine + (size_t)h->node * block;
    accel__coll x = ACCEL__COLL(ACCEL__COLL_REDUCE_SCATTER, mine, result, c, wide, rop, 0);
    ACCEL_TRY(across(h, &x));
    return store_result(h, op, wide, result, op->recv, c);
}

/* ---- the other collectives ---- */

/* Allgather: inside into the machine's part, then the machines' parts across (in place). */
static accel_status allgather(hier *h, const accel__coll *op)
{
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype), L = (size_t)h->L;
    char *part = (char *)op->recv + (size_t)h->node * L * nb;
    accel__coll ag = ACCEL__COLL(ACCEL__COLL_ALLGATHER, op->send, part, nb, ACCEL_U8, ACCEL_SUM, 0);
    ACCEL_TRY(inner(h, &ag));
    accel__coll x =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, part, op->recv, L * nb, ACCEL_U8, ACCEL_SUM, 0);
    return across(h, &x);
}

/* Broadcast: across among the root's local rank, then inside every machine from it. */
static accel_status broadcast(hier *h, const accel__coll *op)
{
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype);
    const int rnode = op->root / h->L, rl = op->root % h->L;
    if (h->rank == op->root && op->send != op->recv && nb > 0) {
        memcpy(op->recv, op->send, nb);
    }
    if (h->l == rl) {
        accel__coll x =
            ACCEL__COLL(ACCEL__COLL_BROADCAST, op->recv, op->recv, nb, ACCEL_U8, ACCEL_SUM, rnode);
        ACCEL_TRY(across(h, &x));
    }
    accel__coll b =
        ACCEL__COLL(ACCEL__COLL_BROADCAST, op->recv, op->recv, nb, ACCEL_U8, ACCEL_SUM, rl);
    return inner(h, &b);
}

/* Gather: inside to the root's local rank, then across to the root's machine. */
static accel_status gather(hier *h, const accel__coll *op)
{
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype), L = (size_t)h->L;
    const int rnode = op->root / h->L, rl = op->root % h->L;
    char *part = NULL;
    if (h->l == rl) {
        ACCEL_TRY(work_buffer(h, L * nb + 1, (void **)&part));
    }
    accel__coll g = ACCEL__COLL(ACCEL__COLL_GATHER, op->send, part, nb, ACCEL_U8, ACCEL_SUM, rl);
    ACCEL_TRY(inner(h, &g));
    if (h->l == rl) {
        accel__coll x =
            ACCEL__COLL(ACCEL__COLL_GATHER, part, op->recv, L * nb, ACCEL_U8, ACCEL_SUM, rnode);
        ACCEL_TRY(across(h, &x));
    }
    if (h->L > 1 && h->n_nodes > 1) {
        /* The other local ranks are done before the step across: without this sync a failure
         * there (another machine's process at another call) would reach them only at their
         * next call, not in this one as everywhere else. */
        accel__coll b = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
        return inner(h, &b);
    }
    return ACCEL_OK;
}

/* Makes the first shm call and the first gloo call of the next user call declare that call, not
 * hier's own decomposition of it: the pieces of different user calls can agree (counts 1000
 * and 999 both pad to 1000 with 2 processes a machine) and the mismatch would pass unseen,
 * each process reducing what it alone declared. The fields are what shm and gloo declare for
 * a call of their own (zero where they do not apply), the count whole for reduce_scatter and
 * allgather. */
static void declare(hier *h, const accel__coll *op)
{
    const int reducing = op->kind == ACCEL__COLL_ALLREDUCE ||
                         op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_REDUCE;
    const int rooted = op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_REDUCE ||
                       op->kind == ACCEL__COLL_GATHER;
    const int barrier = op->kind == ACCEL__COLL_BARRIER;
    const int per_rank =
        op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_ALLGATHER;
    size_t count = op->count;
    if (per_rank) {
        count = op->total != 0 ? op->total : op->count * (size_t)h->n_ranks;
    }
    accel__shm_declare_next(h->shm, (int)op->kind, barrier ? 0 : count,
                            barrier ? 0 : (int)op->dtype, reducing ? (int)op->op : 0, (int)op->wire,
                            rooted ? op->root : 0);
    accel__gloo_declare_next(h->cross, op);
}

static void declare_clear(hier *h)
{
    accel__shm_declare_clear(h->shm);
    accel__gloo_declare_clear(h->cross);
}

/* A barrier of the job: inside, across, inside. */
static accel_status barrier(hier *h)
{
    accel__coll b = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
    ACCEL_TRY(inner(h, &b));
    ACCEL_TRY(across(h, &b));
    return inner(h, &b);
}

static accel_status run_op(hier *h, const accel__coll *op)
{
    if ((op->kind == ACCEL__COLL_ALLREDUCE || op->kind == ACCEL__COLL_REDUCE) && op->count == 0) {
        /* Nothing to move, but still a call that meets the others (and is checked). */
        return barrier(h);
    }
    if ((op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_GATHER) && h->L > 1) {
        /* Their first step depends on the root (only the root's local rank goes across), so
         * processes naming different roots would not meet in one first call: one sync inside
         * the machine checks the declarations first. (Machines whose processes all name
         * another root than the other machines' meet no one across: a timeout names them.) */
        accel__coll b = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
        ACCEL_TRY(inner(h, &b));
    }
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return allreduce(h, op, op->recv);
    case ACCEL__COLL_REDUCE: {
        /* The allreduce, kept at the root (a reduce is rare: the others' temporary result is
         * allocated per call). */
        if (h->rank == op->root) {
            return allreduce(h, op, op->recv);
        }
        accel__coll ar = *op;
        const size_t nb = op->count * accel_dtype_nbytes(op->dtype);
        void *tmp = accel__malloc(nb + 1);
        if (tmp == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory for %zu bytes", nb);
        }
        ar.recv = tmp;
        accel_status st = allreduce(h, &ar, tmp);
        accel__free(tmp);
        return st;
    }
    case ACCEL__COLL_REDUCE_SCATTER:
        return reduce_scatter(h, op);
    case ACCEL__COLL_ALLGATHER:
        return allgather(h, op);
    case ACCEL__COLL_BROADCAST:
        return broadcast(h, op);
    case ACCEL__COLL_GATHER:
        return gather(h, op);
    case ACCEL__COLL_BARRIER:
        return barrier(h);
    }
    return accel__seterr(NULL, ACCEL_EINTERNAL, "hier: unknown collective %d", (int)op->kind);
}

static accel_status hier_run(void *impl, const accel__coll *op)
{
    hier *h = impl;
    declare(h, op);
    accel_status st = run_op(h, op);
    declare_clear(h); /* a declaration no call of this one used must not stick to the next */
    return st;
}

/* Plain memory, but still the collective the contract makes it: an allgather of the sizes
 * whose calls declare the allocation, so a process allocating while the others call a
 * collective fails on every process, naming both calls (and breaks the communicator, as any
 * call mismatch). The levels match an allocation with any other whatever its size: sizes that
 * differ are compared here, on the whole table every process then holds, so every process
 * fails alike with ACCEL_EINVAL and the communicator stays usable, as on shm and gloo. The
 * closing barrier inside keeps barrier's semantics: a failure across reaches every process of
 * the machine in this call. */
static accel_status hier_mem_alloc(void *impl, size_t nbytes, void **out)
{
    hier *h = impl;
    uint64_t mine = nbytes, *sizes = NULL;
    ACCEL_TRY(work_buffer(h, (size_t)h->n_ranks * sizeof(uint64_t), (void **)&sizes));
    accel__coll alloc =
        ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, nbytes, ACCEL_U8, ACCEL_SUM, 0);
    alloc.kind = (accel__coll_kind)ACCEL__GLOO_CALL_ALLOC_ANY;
    accel__shm_declare_next(h->shm, ACCEL__SHM_CALL_ALLOC, nbytes, 0, 0, 0, 0);
    accel__gloo_declare_next(h->cross, &alloc);
    accel__coll ag = ACCEL__COLL(ACCEL__COLL_ALLGATHER, &mine, sizes, 1, ACCEL_U64, ACCEL_SUM, 0);
    accel_status st = allgather(h, &ag);
    declare_clear(h);
    ACCEL_TRY(st);
    accel__coll b = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
    ACCEL_TRY(inner(h, &b));
    for (int q = 1; q < h->n_ranks; q++) {
        if (sizes[q] != sizes[0]) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "hier: accel_alloc_shared: process %d asked for %llu bytes, "
                                 "process %d for %llu (every process must pass the same size)",
                                 h->process[0], (unsigned long long)sizes[0], h->process[q],
                                 (unsigned long long)sizes[q]);
        }
    }
    return accel__comm_plain_alloc(impl, nbytes, out);
}

/* ---- setup ---- */

static void hier_destroy(void *impl)
{
    hier *h = impl;
    if (h == NULL) {
        return;
    }
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    if (h->shm != NULL) {
        accel__shm_ops.destroy(h->shm);
    }
    accel__gloo_close(h->cross);
    accel__store_close(h->store);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    accel__free(h->work);
    accel__free(h->process);
    accel__free(h);
}

static _Atomic unsigned n_worlds; /* hier communicators made by this process */

/* The job's key: ACCEL_JOB_ID, else a nonce process 0 publishes in the store. */
static accel_status job_key(hier *h, const accel__comm_config *cfg, const char *id, char *key,
                            size_t key_nbytes)
{
    if (cfg->job_id != NULL && cfg->job_id[0] != '\0') {
        snprintf(key, key_nbytes, "%s", cfg->job_id);
        return ACCEL_OK;
    }
    char name[96];
    snprintf(name, sizeof(name), "hier/%d/%s/nonce", cfg->restart_count, id);
    accel__store *st = h->store;
    accel__store_config sc = {
        .addr = cfg->master_addr, .port = cfg->master_port, .timeout_s = cfg->timeout_s};
    if (st == NULL) {
        ACCEL_TRY(accel__store_open(&st, &sc));
    }
    accel_status r;
    if (cfg->rank == 0) {
        r = accel__shm_nonce(key, key_nbytes);
        r = r != ACCEL_OK ? r : accel__store_set(st, name, key, strlen(key));
    } else {
        size_t n = 0;
        r = accel__store_get(st, name, key, key_nbytes - 1, &n, cfg->timeout_s);
        key[r == ACCEL_OK ? n : 0] = '\0';
    }
    if (st != h->store) {
        accel__store_close(st);
    }
    return r;
}

/* A communicator of cfg's layout whose shm segment and gloo keys are named with the job's key
 * and `id` (unique in the job). serve: this process runs the store (a world's process 0 without
 * a launcher's store). */
static accel_status hier_new(const accel__comm_config *cfg, const char *id, int serve, hier **out)
{
    const int L = cfg->local_n_ranks, l = cfg->local_rank;
    if (L < 1 || cfg->n_ranks % L != 0 || cfg->rank % L != l) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "hier: process %d (local rank %d of %d, %d processes) is not laid out "
                             "as machine * LOCAL_WORLD_SIZE + LOCAL_RANK with the same "
                             "LOCAL_WORLD_SIZE on every machine",
                             cfg->rank, l, L, cfg->n_ranks);
    }
    hier *h = accel__calloc(1, sizeof(*h));
    if (h == NULL || pthread_mutex_init(&h->mu, NULL) != 0) {
        accel__free(h);
        return accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory");
    }
    pthread_cond_init(&h->cv, NULL);
    h->rank = cfg->rank;
    h->n_ranks = cfg->n_ranks;
    h->l = l;
    h->L = L;
    h->node = cfg->rank / L;
    h->n_nodes = cfg->n_ranks / L;
    h->process = accel__calloc((size_t)h->n_ranks, sizeof(int));
    int *across_process = accel__calloc((size_t)h->n_nodes, sizeof(int));
    accel_status st = ACCEL_OK;
    if (h->process == NULL || across_process == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory");
    }
    for (int r = 0; st == ACCEL_OK && r < h->n_ranks; r++) {
        h->process[r] = cfg->process_base + r;
    }
    /* Without a launcher's store, process 0 serves it for the life of the communicator. */
    if (st == ACCEL_OK && serve) {
        accel__store_config sc = {.addr = cfg->master_addr,
                                  .port = cfg->master_port,
                                  .serve = 1,
                                  .timeout_s = cfg->timeout_s};
        st = accel__store_open(&h->store, &sc);
    }
    if (st == ACCEL_OK) {
        st = job_key(h, cfg, id, h->key, sizeof(h->key));
    }
    if (st == ACCEL_OK) {
        /* Inside: this machine's processes, the segment named with the machine. */
        char inner_id[256];
        snprintf(inner_id, sizeof(inner_id), "%.100s-n%d-%s", h->key, h->node, id);
        accel__comm_config in = *cfg;
        in.rank = l;
        in.n_ranks = L;
        in.job_id = inner_id;
        in.process_base = h->process[h->node * L];
        st = accel__shm_ops.init(&in, &h->shm);
    }
    if (st == ACCEL_OK) {
        /* Across: local rank l of every machine. */
        char prefix[400];
        snprintf(prefix, sizeof(prefix), "%.200s/%d/hier/%s/l%d/", h->key, cfg->restart_count, id,
                 l);
        accel__comm_config x = *cfg;
        x.rank = h->node;
        x.n_ranks = h->n_nodes;
        x.local_rank = 0;
        x.local_n_ranks = 1;
        for (int m = 0; m < h->n_nodes; m++) {
            across_process[m] = h->process[m * L + l];
        }
        st = accel__gloo_open(&h->cross, &x, prefix, 0, across_process);
    }
    accel__free(across_process);
    if (st != ACCEL_OK) {
        if (h->shm != NULL) {
            accel__shm_ops.abort(h->shm, st, accel_last_error(NULL));
        }
        char msg[ACCEL__ERRMSG_NBYTES];
        snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
        if (h->store != NULL) {
            accel__store_abandon(h->store); /* the others read their failures there */
            h->store = NULL;
        }
        hier_destroy(h);
        return accel__seterr(NULL, st, "%s", msg);
    }
    accel__log(&cfg->log, ACCEL__LOG_INFO,
               "hier: machine %d of %d, local rank %d of %d: shm inside, gloo across", h->node,
               h->n_nodes, l, L);
    *out = h;
    return ACCEL_OK;
}

static accel_status hier_init(const accel__comm_config *cfg, void **impl)
{
    char id[32];
    snprintf(id, sizeof(id), "w%u", atomic_fetch_add(&n_worlds, 1));
    return hier_new(cfg, id, !cfg->store_served && cfg->rank == 0, (hier **)impl);
}

static void hier_abort(void *impl, accel_status st, const char *msg)
{
    hier *h = impl;
    accel__shm_ops.abort(h->shm, st, msg);
    accel__gloo_abort(h->cross, st, msg);
}

static void hier_describe(void *impl, char *buf, size_t nbytes)
{
    hier *h = impl;
    char across[160];
    accel__gloo_describe(h->cross, across, sizeof(across));
    snprintf(buf, nbytes,
             "shm within a machine (%d processes), %s (one per machine, local rank %d)", h->L,
             across, h->l);
}

/* ---- split ---- */

/* Whether a child's members (parent ranks in child rank order) form a grid of machines x local
 * ranks: the same local ranks, in the same order, on each of its machines, ranked machine by
 * machine (in any order of the machines), so that the child is itself laid out as machine * L'
 * + local rank. Its machines and local ranks (in child order) go to nodes / locals. A machine
 * cannot come twice: its members would repeat. */
static int grid_of(const hier *h, const int *members, int n, int *nodes, int *n_nodes, int *locals,
                   int *n_locals)
{
    int nn = 0, nl = 0;
    for (int i = 0; i < n && members[i] / h->L == members[0] / h->L; i++) {
        locals[nl++] = members[i] % h->L;
    }
    if (n % nl != 0) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (i % nl == 0) {
            nodes[nn++] = members[i] / h->L;
        }
        if (members[i] != nodes[nn - 1] * h->L + locals[i % nl]) {
            return 0;
        }
    }
    *n_nodes = nn;
    *n_locals = nl;
    return 1;
}

/*
 * A child that is a grid of machines x local ranks (a machine's processes, the processes of one
 * local rank on every machine, or any such product) is a hier communicator of its own: its shm
 * level split from this machine's segment, its gloo level from this local rank's. Every process
 * first agrees (over the parent) that every child is such a grid, so either all split or all
 * refuse.
 */
static accel_status hier_split(void *impl, const accel__comm_split_info *how, void **child)
{
    hier *h = impl, *c = NULL;
    *child = NULL;
    const int n = how->cfg != NULL ? how->cfg->n_ranks : 0;
    int *nodes = accel__calloc((size_t)h->n_nodes + 1, sizeof(int));
    int *locals = accel__calloc((size_t)h->L + 1, sizeof(int));
    int32_t ok = nodes != NULL && locals != NULL, all_ok = 0;
    int nn = 0, nl = 0;
    if (ok && n > 0) {
        ok = grid_of(h, how->members, n, nodes, &nn, locals, &nl);
    }
    accel__coll agree =
        ACCEL__COLL(ACCEL__COLL_ALLREDUCE, &ok, &all_ok, 1, ACCEL_I32, ACCEL_MIN, 0);
    accel_status st = hier_run(h, &agree);
    if (st == ACCEL_OK && !all_ok) {
        st = accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                           "backend hier splits only into grids of machines x local ranks (the "
                           "same local ranks on each of the child's machines, ranked machine by "
                           "machine); use ACCEL_BACKEND=gloo for other groups");
    }
    accel__comm_config in_cfg, x_cfg;
    void *in_child = NULL;
    accel__gloo *x_child = NULL;
    int me = -1;
    for (int i = 0; i < n; i++) {
        me = how->members[i] == h->rank ? i : me;
    }
    /* The shm level: this machine's members (local ranks = the parent segment's ranks). */
    if (st == ACCEL_OK) {
        accel__comm_split_info in = {how->color, me, NULL, NULL};
        if (n > 0) {
            in_cfg = *how->cfg;
            in_cfg.rank = me % nl;
            in_cfg.n_ranks = nl;
            in.cfg = &in_cfg;
            in.members = locals;
        }
        st = accel__shm_ops.split(h->shm, &in, &in_child);
    }
    /* The gloo level: this local rank's members (machines = the parent's gloo ranks). */
    if (st == ACCEL_OK) {
        accel__comm_split_info x = {how->color, me, NULL, NULL};
        if (n > 0) {
            x_cfg = *how->cfg;
            x_cfg.rank = me / nl;
            x_cfg.n_ranks = nn;
            x_cfg.local_rank = 0;
            x_cfg.local_n_ranks = 1;
            x.cfg = &x_cfg;
            x.members = nodes;
        }
        st = accel__gloo_split(h->cross, &x, &x_child);
    }
    if (st == ACCEL_OK && n > 0) {
        c = accel__calloc(1, sizeof(*c));
        int *process = accel__calloc((size_t)n, sizeof(int));
        if (c == NULL || process == NULL || pthread_mutex_init(&c->mu, NULL) != 0) {
            accel__free(c);
            accel__free(process);
            c = NULL;
            st = accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory");
        } else {
            for (int i = 0; i < n; i++) {
                process[i] = h->process[how->members[i]];
            }
            c->process = process;
            pthread_cond_init(&c->cv, NULL);
            c->rank = me;
            c->n_ranks = n;
            c->l = me % nl;
            c->L = nl;
            c->node = me / nl;
            c->n_nodes = nn;
            c->shm = in_child;
            c->cross = x_child;
            in_child = NULL;
            x_child = NULL;
        }
    }
    if (in_child != NULL) {
        accel__shm_ops.destroy(in_child);
    }
    accel__gloo_close(x_child);
    accel__free(nodes);
    accel__free(locals);
    if (st != ACCEL_OK) {
        return st;
    }
    *child = c;
    return ACCEL_OK;
}

const accel__comm_ops accel__hier_ops = {
    .init = hier_init,
    .split = hier_split,
    .run = hier_run,
    .abort = hier_abort,
    .mem_alloc = hier_mem_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = hier_destroy,
    .describe = hier_describe,
};
