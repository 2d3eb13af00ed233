/*
 * What the processes' loaders must agree on when prepared. accel_prepare shards one dataset
 * over the processes, so a process that built another loader (another dataset length, batch
 * size or sampler) silently got other or duplicated samples, or desynchronised its collectives
 * steps later. One all-reduce (MAX of each value and of its negation) gives every process the
 * same verdict. Lengths may differ for uneven inputs only (even_batches off, a join region);
 * iterable lengths are not compared.
 */
#include "comm/comm.h"
#include "data_internal.h"

accel_status accel__loader_agree(accel_loader *l)
{
    enum { K = 9 };
    static const char *const what[K] = {
        "dataset length", "batch_size",       "shuffle",          "drop_last",
        "split_batches",  "even_batches",     "dispatch_batches", "use_seedable_sampler",
        "map-style (1) or iterable (0) dataset"};
    int64_t len = l->map_style && l->even ? accel__dataset_len(l) : 0;
    int64_t v[K] = {len,     l->o.batch_size, l->o.shuffle != 0, l->o.drop_last != 0, l->split,
                    l->even, l->dispatch,     l->seedable,       l->map_style};
    int64_t send[2 * K], recv[2 * K];
    for (int k = 0; k < K; k++) {
        send[2 * k] = v[k];
        send[2 * k + 1] = -v[k];
    }
    accel_status st = accel__allreduce(l->acc->comm, send, recv, 2 * K, ACCEL_I64, ACCEL_MAX);
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(l->acc, st);
    }
    for (int k = 0; k < K; k++) {
        if (recv[2 * k] != -recv[2 * k + 1]) {
            return accel__seterr(l->acc, ACCEL_EINVAL,
                                 "accel_prepare: the processes built different loaders: %s is "
                                 "%lld on some processes and %lld on others (every process must "
                                 "build the same loader over the same dataset; uneven lengths "
                                 "need even_batches = 0)",
                                 what[k], (long long)-recv[2 * k + 1], (long long)recv[2 * k]);
        }
    }
    return ACCEL_OK;
}
