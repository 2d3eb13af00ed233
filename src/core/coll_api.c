/*
 * The public buffer collectives (include/accel/collectives.h): thin wrappers that build an
 * accel__coll, hand it to the communicator (which validates, orders and runs it) and copy the
 * thread's error onto the handle, so accel_last_error(acc) names the cause after a failure.
 *
 * reduce_scatter and allgather accept any count, while the communicator takes equal per-rank
 * counts (NCCL's shape): a count that splits evenly goes straight through (zero-copy on
 * symmetric buffers); any other is padded to n_ranks blocks of ceil(count / n_ranks) elements
 * in a scratch buffer, copied in when the call is posted and out by the collective's post hook,
 * so the asynchronous form keeps working. The declared call carries the user's count (`total`),
 * so mismatch messages show the call as written.
 *
 * Buffers in GPU memory are staged through pinned host memory around the call (coll_stage.c).
 */
#include <string.h>

#include "accel/collectives.h"
#include "coll_stage.h"

static accel_status run(accel *acc, const char *fn, const accel__coll *op, accel_work **work)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: accelerator is NULL", fn);
    }
    if (work != NULL) {
        return accel__adopt_thread_error(acc, accel__comm_post(acc->comm, op, NULL, work));
    }
    return accel__adopt_thread_error(acc, accel__comm_run(acc->comm, op));
}

/* ---- uneven reduce_scatter / allgather ---- */

/* The scratch of one padded call, owned by its work (or freed after a blocking call). */
typedef struct padded {
    size_t es, count, block; /* element size, the user's count, per-rank block */
    int n_ranks, rank;
    void *recv;  /* the user's */
    char data[]; /* n_ranks blocks */
} padded;

/* reduce_scatter's post hook: my block's real elements to the user's recv. */
static void rs_copy_out(void *arg)
{
    padded *p = arg;
    size_t off, cnt;
    accel__chunk_range(p->count, p->n_ranks, p->rank, &off, &cnt);
    memcpy(p->recv, p->data + (size_t)p->rank * p->block * p->es, cnt * p->es);
}

/* allgather's post hook: every block's real elements to their place in the user's recv. */
static void ag_copy_out(void *arg)
{
    padded *p = arg;
    for (int q = 0; q < p->n_ranks; q++) {
        size_t off, cnt;
        accel__chunk_range(p->count, p->n_ranks, q, &off, &cnt);
        memcpy((char *)p->recv + off * p->es, p->data + (size_t)q * p->block * p->es, cnt * p->es);
    }
}

/* The user's buffers of an uneven call: present when they hold bytes, overlapping only in the
 * in-place form. */
static accel_status check_uneven(accel *acc, const char *fn, int gather, const void *send,
                                 void *recv, size_t count, accel_dtype dt)
{
    size_t es = (unsigned)dt < ACCEL_DTYPE_COUNT ? accel_dtype_nbytes(dt) : 0;
    if (es == 0) {
        return accel__seterr(acc,
                             (unsigned)dt < ACCEL_DTYPE_COUNT ? ACCEL_EUNSUPPORTED : ACCEL_EINVAL,
                             "%s: dtype %d is not a whole-byte accel_dtype", fn, (int)dt);
    }
    size_t off, cnt;
    accel__chunk_range(count, acc->n_ranks, acc->rank, &off, &cnt);
    if (count > SIZE_MAX / es - (size_t)acc->n_ranks) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: count %zu overflows the address space", fn,
                             count);
    }
    const size_t send_n = (gather ? cnt : count) * es, recv_n = (gather ? count : cnt) * es;
    if ((send_n > 0 && send == NULL) || (recv_n > 0 && recv == NULL)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: %s buffer is NULL with %zu elements", fn,
                             send_n > 0 && send == NULL ? "send" : "recv", count);
    }
    const char *s = send, *r = recv;
    const char *in_place = gather ? r + off * es : s + off * es;
    if (send_n > 0 && recv_n > 0 && s < r + recv_n && r < s + send_n &&
        (gather ? s != in_place : r != in_place)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: send and recv buffers overlap but are not the in-place form", fn);
    }
    return ACCEL_OK;
}

static accel_status uneven(accel *acc, const char *fn, accel__coll_kind kind, const void *send,
                           void *recv, size_t count, accel_dtype dt, accel_reduce_op op,
                           accel_work **work)
{
    const int gather = kind == ACCEL__COLL_ALLGATHER;
    const size_t n = (size_t)acc->n_ranks;
    if (count % n == 0) {
        accel__coll o = ACCEL__COLL(kind, send, recv, count / n, dt, op, 0);
        return run(acc, fn, &o, work);
    }
    ACCEL_TRY(check_uneven(acc, fn, gather, send, recv, count, dt));
    const size_t es = accel_dtype_nbytes(dt), block = count / n + 1;
    padded *p = accel__malloc(sizeof(*p) + block * n * es);
    if (p == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "%s: out of memory for the padded %zu elements", fn,
                             block * n);
    }
    *p = (padded){es, count, block, acc->n_ranks, acc->rank, recv};
    /* Copy in now (the caller's send must be valid when it posts anyway); padding is zero. */
    for (int q = 0; q < acc->n_ranks; q++) {
        size_t off, cnt;
        accel__chunk_range(count, acc->n_ranks, q, &off, &cnt);
        char *b = p->data + (size_t)q * block * es;
        if (!gather || q == acc->rank) {
            memcpy(b, (const char *)send + (gather ? 0 : off * es), cnt * es);
            memset(b + cnt * es, 0, (block - cnt) * es);
        }
    }
    char *mine = p->data + (size_t)acc->rank * block * es;
    accel__coll o =
        ACCEL__COLL(kind, gather ? mine : p->data, gather ? p->data : mine, block, dt, op, 0);
    o.total = count;
    o.post = gather ? ag_copy_out : rs_copy_out;
    o.hook_arg = p;
    accel_status st = run(acc, fn, &o, work);
    if (st == ACCEL_OK && work != NULL) {
        accel__work_own(*work, p);
    } else {
        accel__free(p);
    }
    return st;
}

void accel_chunk_range(size_t count, int n_ranks, int rank, size_t *off, size_t *chunk_count)
{
    size_t o = 0, c = 0;
    if (n_ranks >= 1 && rank >= 0 && rank < n_ranks) {
        accel__chunk_range(count, n_ranks, rank, &o, &c);
    }
    if (off != NULL) {
        *off = o;
    }
    if (chunk_count != NULL) {
        *chunk_count = c;
    }
}

/* Every public buffer collective but the barrier: device buffers staged around the call. */
static accel_status staged(accel *acc, const char *fn, accel__coll_kind kind, const void *send,
                           void *recv, size_t count, accel_dtype dt, accel_reduce_op op, int root,
                           accel_work **work)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: accelerator is NULL", fn);
    }
    accel__coll_staging sg;
    ACCEL_TRY(accel__coll_stage_begin(acc, fn, kind, count, dt, root, work != NULL, &send, &recv,
                                      &sg));
    accel_status st;
    if (kind == ACCEL__COLL_REDUCE_SCATTER || kind == ACCEL__COLL_ALLGATHER) {
        st = uneven(acc, fn, kind, send, recv, count, dt, op, work);
    } else {
        accel__coll o = ACCEL__COLL(kind, send, recv, count, dt, op, root);
        st = run(acc, fn, &o, work);
    }
    return accel__coll_stage_end(acc, fn, &sg, st);
}

accel_status accel_allreduce(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             accel_reduce_op op, accel_work **work)
{
    return staged(acc, "accel_allreduce", ACCEL__COLL_ALLREDUCE, send, recv, count, dt, op, 0,
                  work);
}

accel_status accel_reduce_scatter(accel *acc, const void *send, void *recv, size_t count,
                                  accel_dtype dt, accel_reduce_op op, accel_work **work)
{
    return staged(acc, "accel_reduce_scatter", ACCEL__COLL_REDUCE_SCATTER, send, recv, count, dt,
                  op, 0, work);
}

accel_status accel_allgather(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             accel_work **work)
{
    return staged(acc, "accel_allgather", ACCEL__COLL_ALLGATHER, send, recv, count, dt, ACCEL_SUM,
                  0, work);
}

accel_status accel_broadcast(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             int root, accel_work **work)
{
    return staged(acc, "accel_broadcast", ACCEL__COLL_BROADCAST, send, recv, count, dt, ACCEL_SUM,
                  root, work);
}

accel_status accel_reduce_to(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             accel_reduce_op op, int root, accel_work **work)
{
    return staged(acc, "accel_reduce_to", ACCEL__COLL_REDUCE, send, recv, count, dt, op, root,
                  work);
}

accel_status accel_gather_to(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             int root, accel_work **work)
{
    return staged(acc, "accel_gather_to", ACCEL__COLL_GATHER, send, recv, count, dt, ACCEL_SUM,
                  root, work);
}

accel_status accel_barrier(accel *acc, accel_work **work)
{
    accel__coll o = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
    return run(acc, "accel_barrier", &o, work);
}
