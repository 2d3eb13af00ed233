/*
 * The hier composition's collectives (hier.c sets it up): a job of several machines with
 * several processes each. Inside a machine the processes talk through shm (one segment per machine,
 * named with the machine, so two "machines" on one host never collide); across machines each
 * process talks through gloo with the processes of the same local rank on the other machines (one
 * communicator per local rank: every process carries its share of the traffic, and each machine's
 * process l leads shard l of every reduction).
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
#include <stdio.h>
#include <string.h>

#include "comm/reduce.h"
#include "comm/shm.h"
#include "hier.h"

#define CHUNK_NBYTES ((size_t)4 << 20) /* pipeline step: big enough to amortise a gloo call */

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

accel_status accel__hier_run(void *impl, const accel__coll *op)
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
accel_status accel__hier_mem_alloc(void *impl, size_t nbytes, void **out)
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
            const accel__coll_decl d0 = accel__coll_declare_alloc(sizes[0]),
                                   dq = accel__coll_declare_alloc(sizes[q]);
            char msg[ACCEL__ERRMSG_NBYTES];
            accel__coll_decl_mismatch("hier", &d0, h->process[0], &dq, h->process[q], h->n_ranks,
                                      msg, sizeof(msg));
            return accel__seterr(NULL, ACCEL_EINVAL, "%s", msg);
        }
    }
    return accel__comm_plain_alloc(impl, nbytes, out);
}
