/*
 * ZeRO sharding (DeepSpeed stages 1 and 2, FSDP SHARD_GRAD_OP): which elements of the flat
 * buffers this process owns, the optimizer segments cut down to them, and the allgather that
 * rebuilds every process's full master after each process stepped its own pieces.
 *
 * Invariant: from stage 1 on, process r owns piece r of every bucket of the geometry
 * (flat.h); the optimizer state holds exactly those pieces, concatenated in bucket order (the
 * shard), and only they are updated by a step; after the step's allgather the master is
 * identical on every process again.
 */
#include <string.h>

#include "core/profile.h"
#include "train_internal.h"

int accel__model_zero_stage(const accel_model *m)
{
    return m->zero_stage;
}

size_t accel__zero_state_numel(const accel_model *m)
{
    return m->zero_stage >= 1 ? accel__flat_shard_numel(&m->flat) : m->flat.padded_numel;
}

void accel__zero_param_part(const accel_model *m, int i, int rank, size_t *flat_off,
                            size_t *shard_off, size_t *count)
{
    const accel_param *p = &m->params[i];
    if (m->zero_stage == 0) {
        *flat_off = *shard_off = p->offset;
        *count = rank == 0 ? p->numel : 0;
        return;
    }
    int b = m->flat_bucket[i];
    size_t po, pc;
    accel__flat_piece(&m->flat, b, rank, &po, &pc);
    size_t lo = p->offset > po ? p->offset : po;
    size_t hi = p->offset + p->numel < po + pc ? p->offset + p->numel : po + pc;
    *flat_off = lo;
    *count = hi > lo ? hi - lo : 0;
    *shard_off = m->flat.buckets[b].shard_offset + (lo - po);
    if (*count == 0) {
        *flat_off = *shard_off = 0;
    }
}

float *accel__zero_master_at(const accel_model *m, size_t flat_off, size_t shard_off)
{
    return m->master + (m->zero_stage == 3 ? shard_off : flat_off);
}

float *accel__zero_state_at(const accel_model *m, float *buf, size_t flat_off, size_t shard_off)
{
    return buf + (m->zero_stage >= 1 ? shard_off : flat_off);
}

accel__dspan accel__zero_grad_part(const accel_model *m, int i)
{
    size_t off, soff, count;
    accel__zero_param_part(m, i, m->rank, &off, &soff, &count);
    return accel__grad_span(m, off, count);
}

accel_status accel__zero_shard_segments(accel_optimizer *opt)
{
    accel_model *m = opt->model;
    if (m->zero_stage == 0) {
        for (int s = 0; s < opt->n_segments; s++) {
            opt->segments[s].state_offset = opt->segments[s].offset;
        }
        return ACCEL_OK;
    }
    /* A segment crosses at most every bucket once: n_segments + n_buckets bounds the cut. */
    size_t cap = (size_t)opt->n_segments + (size_t)m->flat.n_buckets;
    accel__optim_segment *out = accel__calloc(cap, sizeof(*out));
    if (out == NULL) {
        return accel__seterr(opt->acc, ACCEL_ENOMEM, "optimizer: out of memory for segments");
    }
    int n = 0;
    for (int s = 0; s < opt->n_segments; s++) {
        const accel__optim_segment *sg = &opt->segments[s];
        size_t end = sg->offset + sg->count;
        for (int b = accel__flat_bucket_of(&m->flat, sg->offset);
             b < m->flat.n_buckets && m->flat.buckets[b].offset < end; b++) {
            size_t po, pc;
            accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
            size_t lo = sg->offset > po ? sg->offset : po;
            size_t hi = end < po + pc ? end : po + pc;
            if (hi > lo) {
                out[n].offset = lo;
                out[n].count = hi - lo;
                out[n].state_offset = m->flat.buckets[b].shard_offset + (lo - po);
                out[n].group = sg->group;
                n++;
            }
        }
    }
    accel__free(opt->segments);
    opt->segments = out;
    opt->n_segments = n;
    return ACCEL_OK;
}

accel_status accel__zero_gather_master(accel_model *m)
{
    accel *acc = m->acc;
    if (m->zero_stage == 3) {
        return accel__zero3_release_all(m); /* gathered again, updated, where next used */
    }
    if (m->zero_stage == 0 || acc->n_ranks == 1) {
        return accel__model_refresh_compute(m);
    }
    /* Every bucket with a trainable parameter (the others never change), all posted before
     * the first wait so the progress thread pipelines them. */
    double t0 = accel__now();
    accel_work *work[64];
    int n_work = 0;
    accel_status st = ACCEL_OK;
    for (int b = 0; b < m->flat.n_buckets && st == ACCEL_OK; b++) {
        if (m->red.buckets[b].n_params == 0) {
            continue;
        }
        size_t po, pc;
        accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
        accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLGATHER, m->master + po,
                                     m->master + m->flat.buckets[b].offset, pc, ACCEL_F32,
                                     ACCEL_SUM, 0);
        if (n_work == (int)(sizeof(work) / sizeof(work[0]))) {
            st = accel__work_wait(work[0], accel__comm_deadline(acc->comm));
            accel__work_free(work[0]);
            memmove(work, work + 1, (size_t)(n_work - 1) * sizeof(work[0]));
            n_work--;
            if (st != ACCEL_OK) {
                break;
            }
        }
        st = accel__comm_post(acc->comm, &op, NULL, &work[n_work]);
        n_work += st == ACCEL_OK;
    }
    for (int k = 0; k < n_work; k++) {
        accel_status wst = accel__work_wait(work[k], accel__comm_deadline(acc->comm));
        accel__work_free(work[k]);
        st = st != ACCEL_OK ? st : wst;
    }
    accel__prof_span(acc, "master allgather", ACCEL__PROF_COMM, t0, accel__now(), "buckets",
                     m->flat.n_buckets);
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "ZeRO stage %d: gathering the updated weights: %s",
                             m->zero_stage, accel_last_error(NULL));
    }
    return accel__model_refresh_compute(m);
}
