/*
 * For the ZeRO tests (tests/dist, tests/progs/zero_train): the fp32 master of a model in
 * registration order, read from the owners' pieces, whatever the stage (a sharded master has no
 * full copy anywhere: stage 3, and stages 1-2 under mixed precision, where the gathered weights are
 * the compute copy widened).
 */
#ifndef ACCEL_TESTS_ZERO_MASTER_H
#define ACCEL_TESTS_ZERO_MASTER_H

#include <string.h>

#include "check.h"
#include "train/train_internal.h"

/* out[accel_model_numel(m)]: each process's owned pieces (those it would checkpoint: the
 * first replica's; process 0's whole master when nothing is sharded), zeros elsewhere, summed
 * over the processes (collective; every process gets the whole master). */
static void zero_read_master(accel *acc, accel_model *m, float *out)
{
    size_t numel = accel_model_numel(m), at = 0;
    int rank = m->zero_stage > 0 || accel_process_index(acc) == 0 ? accel__zero_save_rank(m) : -1;
    memset(out, 0, numel * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        size_t flat_off, shard_off, count;
        accel__zero_param_part(m, i, rank, &flat_off, &shard_off, &count);
        if (count > 0) {
            memcpy(out + at + (flat_off - m->params[i].offset),
                   accel__zero_master_at(m, flat_off, shard_off), count * sizeof(float));
        }
        at += m->params[i].numel;
    }
    CHECK_OK(acc, accel_allreduce(acc, out, out, numel, ACCEL_F32, ACCEL_SUM, NULL));
}

#endif /* ACCEL_TESTS_ZERO_MASTER_H */
