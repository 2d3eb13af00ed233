/*
 * ZeRO sharding (DeepSpeed stages 1-3, FSDP SHARD_GRAD_OP and FULL_SHARD): which elements of
 * the flat buffers this process owns, the optimizer segments cut down to them, and the
 * allgather that rebuilds every process's full master after each process stepped its own
 * pieces (stages 1-2; stage 3 keeps only the shard and gathers units on demand, zero3.c).
 *
 * Under mixed precision with several processes, stages 1-2 keep only the shard of the fp32
 * master too (master_shard): after the step each process rounds its updated pieces into its
 * pieces of the full compute copy (bf16 / fp16) and the compute copy is all-gathered, half the
 * bytes of an fp32 master allgather (DeepSpeed's bf16 model with fp32 master partitions).
 *
 * Invariant: from stage 1 on, process r owns piece r of every bucket of the geometry
 * (flat.h); the optimizer state holds exactly those pieces, concatenated in bucket order (the
 * shard), and only they are updated by a step; at stages 1-2, after the step's allgather the
 * full master (or, with a sharded master, the compute copy) is identical on every process.
 */
#include <string.h>

#include "core/profile.h"
#include "train_internal.h"

/* ---- hybrid sharding: the shard groups ---- */

int accel__zero_group_size(const accel *acc)
{
    int size = acc->settings->train.zero_shard_size;
    int n = size == ACCEL_SHARD_MACHINE ? acc->local_n_ranks : size;
    /* accel_init checked that n divides the processes. */
    return n > 0 && n < acc->n_ranks ? n : acc->n_ranks;
}

accel_status accel__zero_groups_new(accel_model *m)
{
    accel *acc = m->acc;
    int size = m->flat.n_ranks;
    if (m->shard_comm != NULL || m->zero_stage == 0 || size == acc->n_ranks) {
        m->shard_comm = m->shard_comm != NULL ? m->shard_comm : acc->comm;
        return ACCEL_OK;
    }
    /* Processes of a machine are numbered consecutively (accel launch, mpirun by slot), so the
     * groups of `size` consecutive ranks are the machines under HYBRID_SHARD. Ranked by the
     * parent rank, a group's rank r is piece r and a replica's rank is its group. */
    accel__comm *shard = NULL, *replica = NULL;
    accel_status st = accel__comm_split(acc->comm, acc->rank / size, acc->rank, &shard);
    if (st == ACCEL_OK) {
        st = accel__comm_split(acc->comm, acc->rank % size, acc->rank, &replica);
    }
    if (st != ACCEL_OK) {
        accel__comm_free(shard);
        return accel__seterr(acc, st,
                             "accel_prepare: hybrid sharding (groups of %d processes): splitting "
                             "the communicator: %s",
                             size, accel_last_error(NULL));
    }
    m->shard_comm = shard;
    m->replica_comm = replica;
    accel__log(&acc->log, ACCEL__LOG_INFO,
               "ZeRO stage %d sharded over %d processes (group %d), replicated %d times",
               m->zero_stage, size, m->replica, acc->n_ranks / size);
    return ACCEL_OK;
}

void accel__zero_groups_free(accel_model *m)
{
    if (m->shard_comm != m->acc->comm) {
        accel__comm_free(m->shard_comm);
    }
    accel__comm_free(m->replica_comm);
    m->shard_comm = m->replica_comm = NULL;
}

/* ---- which elements a process owns ---- */

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
    if (rank < 0) {
        *flat_off = *shard_off = *count = 0;
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
    return m->master + (m->master_shard ? shard_off : flat_off);
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

static accel_status gather_host(accel_model *m, const void *shard, void *full, accel_dtype dt,
                                int all_buckets);

/* Per-bucket allgathers of every process's pieces into `full` (flat-indexed, elements of
 * dtype dt): from `shard` (shard-indexed) or, when shard is NULL, in place from each process's
 * pieces of `full`. Only buckets with a trainable parameter unless all_buckets. Buffers in
 * device memory that the communicator cannot read go through the reducer's pinned mirror of
 * the gradients (free between backwards, and at least as large: dt is at most 4 bytes): this
 * process's pieces out, the gather in place there, the buckets back. Collective. */
static accel_status gather_pieces(accel_model *m, const void *shard, void *full, accel_dtype dt,
                                  int all_buckets)
{
    if (!accel__model_staged(m)) {
        return gather_host(m, shard, full, dt, all_buckets);
    }
    size_t es = accel_dtype_nbytes(dt);
    char *host = m->red.host_buf;
    ACCEL_ASSERT(host != NULL); /* staged with several processes: made by reducer_prepare */
    accel_status st = ACCEL_OK;
    /* A local failure still joins the collective (with poison), so no peer waits in vain. */
    for (int b = 0; b < m->flat.n_buckets && st == ACCEL_OK; b++) {
        if (!all_buckets && m->red.buckets[b].n_params == 0) {
            continue;
        }
        size_t po, pc;
        accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
        const char *src = shard ? (const char *)shard + m->flat.buckets[b].shard_offset * es
                                : (const char *)full + po * es;
        st = accel__dev_copy(m->dev, host + po * es, src, pc * es, ACCEL__COPY_D2H, NULL);
    }
    accel_status gst = gather_host(m, NULL, host, dt, all_buckets);
    for (int b = 0; b < m->flat.n_buckets && st == ACCEL_OK && gst == ACCEL_OK; b++) {
        const accel__flat_bucket *fb = &m->flat.buckets[b];
        if (all_buckets || m->red.buckets[b].n_params > 0) {
            st = accel__dev_copy(m->dev, (char *)full + fb->offset * es, host + fb->offset * es,
                                 fb->padded * es, ACCEL__COPY_H2D, NULL);
        }
    }
    return gst != ACCEL_OK ? gst : st;
}

/* gather_pieces on buffers the communicator reads. All are posted before the first wait so
 * the progress thread pipelines them. */
static accel_status gather_host(accel_model *m, const void *shard, void *full, accel_dtype dt,
                                int all_buckets)
{
    size_t es = accel_dtype_nbytes(dt);
    accel_work *work[64];
    int n_work = 0;
    accel_status st = ACCEL_OK;
    for (int b = 0; b < m->flat.n_buckets && st == ACCEL_OK; b++) {
        if (!all_buckets && m->red.buckets[b].n_params == 0) {
            continue; /* every parameter frozen: never changes */
        }
        size_t po, pc;
        accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
        const char *send = shard ? (const char *)shard + m->flat.buckets[b].shard_offset * es
                                 : (const char *)full + po * es;
        accel__coll op =
            ACCEL__COLL(ACCEL__COLL_ALLGATHER, send, (char *)full + m->flat.buckets[b].offset * es,
                        pc, dt, ACCEL_SUM, 0);
        if (n_work == (int)(sizeof(work) / sizeof(work[0]))) { /* bounded: wait the oldest */
            st = accel__work_wait(work[0], accel__comm_deadline(accel__zero_comm(m)));
            accel__work_free(work[0]);
            memmove(work, work + 1, (size_t)(n_work - 1) * sizeof(work[0]));
            n_work--;
            if (st != ACCEL_OK) {
                break;
            }
        }
        st = accel__comm_post(accel__zero_comm(m), &op, NULL, &work[n_work]);
        n_work += st == ACCEL_OK;
    }
    for (int k = 0; k < n_work; k++) {
        accel_status wst = accel__work_wait(work[k], accel__comm_deadline(accel__zero_comm(m)));
        accel__work_free(work[k]);
        st = st != ACCEL_OK ? st : wst;
    }
    return st;
}

accel_status accel__zero_gather_compute(accel_model *m, int all_buckets)
{
    accel *acc = m->acc;
    size_t es = accel_dtype_nbytes(m->compute_dtype);
    accel_status st = ACCEL_OK;
    for (int b = 0; b < m->flat.n_buckets && st == ACCEL_OK; b++) {
        size_t po, pc;
        accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
        st = accel__dev_convert(
            m->dev, accel__dspan_of((char *)m->compute + po * es, m->compute_dtype, pc),
            accel__dspan_f32(m->master + m->flat.buckets[b].shard_offset, pc), NULL);
    }
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(acc, st); /* local: before any collective */
    }
    double t0 = accel__now();
    st = gather_pieces(m, NULL, m->compute, m->compute_dtype, all_buckets);
    accel__prof_span(acc, "compute allgather", ACCEL__PROF_COMM, t0, accel__now(), "buckets",
                     m->flat.n_buckets);
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "ZeRO stage %d: gathering the updated %s weights: %s",
                             m->zero_stage, accel_dtype_name(m->compute_dtype),
                             accel_last_error(NULL));
    }
    m->compute_stale = 0;
    return accel__zero3_release_all(m); /* widened units hold the old values */
}

accel_status accel__zero_gather_master(accel_model *m)
{
    accel *acc = m->acc;
    if (m->zero_stage == 3) {
        return accel__zero3_release_all(m); /* gathered again, updated, where next used */
    }
    if (m->master_shard) {
        return accel__zero_gather_compute(m, m->compute_stale);
    }
    if (m->zero_stage == 0 || m->flat.n_ranks == 1) {
        return accel__model_refresh_compute(m);
    }
    double t0 = accel__now();
    accel_status st = gather_pieces(m, NULL, m->master, ACCEL_F32, 0);
    accel__prof_span(acc, "master allgather", ACCEL__PROF_COMM, t0, accel__now(), "buckets",
                     m->flat.n_buckets);
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "ZeRO stage %d: gathering the updated weights: %s",
                             m->zero_stage, accel_last_error(NULL));
    }
    return accel__model_refresh_compute(m);
}

/* ---- join_uneven_inputs: the region runs as DDP ---- */

/* The optimizers of model m, one after the other (NULL: the first). */
static accel_optimizer *next_optimizer(accel_model *m, accel_optimizer *opt)
{
    accel__object *o = opt == NULL ? m->acc->objects : opt->obj.next;
    for (; o != NULL; o = o->next) {
        if (o->kind == ACCEL__OBJ_OPTIMIZER && ((accel_optimizer *)o)->model == m) {
            return (accel_optimizer *)o;
        }
    }
    return NULL;
}

accel_status accel__zero_unshard(accel_model *m)
{
    if (m->zero_stage == 0) {
        return ACCEL_OK;
    }
    accel *acc = m->acc;
    /* With the model in device memory the same steps run there: the pieces gather in place
     * on a device communicator, through the reducer's pinned mirror on a host one
     * (gather_pieces), and stage 3 maps every unit (zero3.c) for the region. */
    size_t nbytes = m->flat.padded_numel * sizeof(float);
    if (m->zero_stage == 3) {
        ACCEL_TRY(accel_model_gather_all(m)); /* the full weights serve as the master */
    } else if (m->master_shard) {
        /* The fp32 master (not the widened compute copy) serves the region's DDP; the
         * compute copy follows it (it may be stale after a checkpoint load). */
        accel_status st = gather_pieces(m, m->master, m->weights, ACCEL_F32, 1);
        if (st != ACCEL_OK) {
            return accel__seterr(acc, st,
                                 "accel_join_begin: gathering the master (ZeRO stage %d): %s",
                                 m->zero_stage, accel_last_error(NULL));
        }
        ACCEL_TRY(accel__model_refresh_compute(m));
        m->compute_stale = 0;
    }
    for (accel_optimizer *opt = next_optimizer(m, NULL); opt != NULL;
         opt = next_optimizer(m, opt)) {
        float **bufs[3] = {&opt->state_a, &opt->state_b, &opt->state_c};
        for (int k = 0; k < 3; k++) {
            void *full = NULL;
            if (*bufs[k] == NULL) {
                continue;
            }
            accel_status st = accel__dev_alloc(m->dev, nbytes, 1, &full);
            if (st == ACCEL_OK) {
                st = gather_pieces(m, *bufs[k], full, ACCEL_F32, 1);
            }
            if (st != ACCEL_OK) {
                accel__dev_free(m->dev, full);
                return accel__seterr(acc, st,
                                     "accel_join_begin: gathering the optimizer state (ZeRO stage "
                                     "%d): %s",
                                     m->zero_stage, accel_last_error(NULL));
            }
            opt->shard_state[k] = *bufs[k];
            *bufs[k] = full;
        }
        opt->segments_dirty = 1;
    }
    m->join_saved_stage = m->zero_stage;
    if (m->master_shard) {
        m->join_master_shard = m->master;
        m->master = m->weights;
        m->master_shard = 0;
    }
    m->zero_stage = m->red.zero_stage = 0;
    return ACCEL_OK;
}

accel_status accel__zero_reshard(accel_model *m, int root)
{
    int stage = m->join_saved_stage;
    if (stage == 0) {
        return ACCEL_OK;
    }
    accel *acc = m->acc;
    accel_status st = ACCEL_OK;
    /* The authoritative optimizer state is root's, as the weights (the caller broadcast
     * them); every process then keeps its pieces again. */
    for (accel_optimizer *opt = next_optimizer(m, NULL); opt != NULL;
         opt = next_optimizer(m, opt)) {
        float **bufs[3] = {&opt->state_a, &opt->state_b, &opt->state_c};
        int64_t n_steps = opt->n_steps;
        if (acc->n_ranks > 1 && st == ACCEL_OK) {
            st = accel__broadcast(acc->comm, &n_steps, 1, ACCEL_I64, root);
        }
        opt->n_steps = n_steps;
        for (int k = 0; k < 3; k++) {
            if (opt->shard_state[k] == NULL) {
                continue;
            }
            if (acc->n_ranks > 1 && st == ACCEL_OK) {
                st = accel__model_broadcast_flat(m, *bufs[k], root, "the optimizer state");
            }
            for (int b = 0; b < m->flat.n_buckets && st == ACCEL_OK; b++) {
                size_t po, pc;
                accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
                st = accel__dev_copy(m->dev, opt->shard_state[k] + m->flat.buckets[b].shard_offset,
                                     *bufs[k] + po, pc * sizeof(float), ACCEL__COPY_D2D, NULL);
            }
            accel__dev_free(m->dev, *bufs[k]);
            *bufs[k] = opt->shard_state[k];
            opt->shard_state[k] = NULL;
        }
        opt->segments_dirty = 1;
    }
    m->zero_stage = m->red.zero_stage = stage;
    m->join_saved_stage = 0;
    if (m->join_master_shard != NULL) {
        m->master = m->join_master_shard;
        m->join_master_shard = NULL;
        m->master_shard = 1;
        accel_status tst = accel__zero3_take_shard(m); /* root's weights, now everyone's */
        st = st != ACCEL_OK ? st : tst;
    }
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "accel_join_end: resharding (ZeRO stage %d): %s", stage,
                             accel_last_error(NULL));
    }
    return ACCEL_OK;
}
