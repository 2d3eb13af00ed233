/*
 * The public buffer collectives (include/accel/collectives.h): thin wrappers that build an
 * accel__coll, hand it to the communicator (which validates, orders and runs it) and copy the
 * thread's error onto the handle, so accel_last_error(acc) names the cause after a failure.
 */
#include "accel/collectives.h"
#include "comm/comm.h"
#include "internal.h"

static accel_status run(accel *acc, const char *fn, const accel__coll *op, accel_work **work)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: accelerator is NULL", fn);
    }
    if (work != NULL) {
        *work = NULL;
    }
    return accel__adopt_thread_error(acc, accel__comm_run(acc->comm, op, work));
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

accel_status accel_allreduce(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             accel_reduce_op op, accel_work **work)
{
    accel__coll o = {ACCEL__COLL_ALLREDUCE, send, recv, count, dt, op, 0};
    return run(acc, "accel_allreduce", &o, work);
}

accel_status accel_reduce_scatter(accel *acc, const void *send, void *recv, size_t count,
                                  accel_dtype dt, accel_reduce_op op, accel_work **work)
{
    accel__coll o = {ACCEL__COLL_REDUCE_SCATTER, send, recv, count, dt, op, 0};
    return run(acc, "accel_reduce_scatter", &o, work);
}

accel_status accel_allgather(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             accel_work **work)
{
    accel__coll o = {ACCEL__COLL_ALLGATHER, send, recv, count, dt, ACCEL_SUM, 0};
    return run(acc, "accel_allgather", &o, work);
}

accel_status accel_broadcast(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             int root, accel_work **work)
{
    accel__coll o = {ACCEL__COLL_BROADCAST, send, recv, count, dt, ACCEL_SUM, root};
    return run(acc, "accel_broadcast", &o, work);
}

accel_status accel_reduce(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                          accel_reduce_op op, int root, accel_work **work)
{
    accel__coll o = {ACCEL__COLL_REDUCE, send, recv, count, dt, op, root};
    return run(acc, "accel_reduce", &o, work);
}

accel_status accel_gather_to(accel *acc, const void *send, void *recv, size_t count, accel_dtype dt,
                             int root, accel_work **work)
{
    accel__coll o = {ACCEL__COLL_GATHER, send, recv, count, dt, ACCEL_SUM, root};
    return run(acc, "accel_gather_to", &o, work);
}

accel_status accel_barrier(accel *acc, accel_work **work)
{
    accel__coll o = {ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0};
    return run(acc, "accel_barrier", &o, work);
}
