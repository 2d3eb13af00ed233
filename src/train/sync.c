/*
 * Gradient accumulation (Accelerate's GradientState._do_sync), the backward protocol around the
 * reducer (which micro-steps communicate: accumulation, no_sync, trigger_sync), and
 * join_uneven_inputs (DDP's Join). Invariants: a backward that communicates ends with every
 * bucket launched and waited for (reducer.c), so no all-reduce outlives accel_backward_end; a
 * process in a join region issues, per communicating backward, one "active count" all-reduce
 * followed by the buckets, which the joined processes mirror with zeros.
 */
#include "train_internal.h"

/* The next prepared model of acc after `m` (NULL: the first). */
static accel_model *next_model(accel *acc, accel_model *m)
{
    accel__object *o = (m == NULL) ? acc->objects : m->obj.next;
    for (; o != NULL; o = o->next) {
        if (o->kind == ACCEL__OBJ_MODEL && o->prepared) {
            return (accel_model *)o;
        }
    }
    return NULL;
}

accel_status accel_accumulate(accel *acc, accel_model *model)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_accumulate: acc is NULL");
    }
    ACCEL_TRY(accel__grad_state_advance(acc));
    int allow = accel__grad_state_sync(acc) ||
                (accel_use_distributed(acc) && acc->settings->train.sync_each_batch == 1);
    if (model != NULL) {
        model->accum_allows = allow;
    } else {
        for (accel_model *m = next_model(acc, NULL); m != NULL; m = next_model(acc, m)) {
            m->accum_allows = allow;
        }
    }
    return ACCEL_OK;
}

int accel_sync_gradients(const accel *acc)
{
    return accel__grad_state_sync(acc);
}

long long accel_accumulation_step(const accel *acc)
{
    return accel__grad_state_step(acc);
}

/* The collective of an active process in a join region: how many processes still train. */
static accel_status join_count(accel_model *m, float mine, float *total)
{
    *total = mine;
    accel_status st = accel__allreduce(m->acc->comm, total, total, 1, ACCEL_F32, ACCEL_SUM);
    return st == ACCEL_OK ? ACCEL_OK : accel__adopt_thread_error(m->acc, st);
}

/* ZeRO-2/3, a backward on gradients a previous backward reduced (sync_each_batch, two
 * synchronising backwards per step): each process holds the average R only in its own
 * pieces, zeros elsewhere. Stage 0 would add local gradients to R everywhere and average
 * again, giving R + avg(local); scaling the owned pieces to N * R gives the same sum through
 * the next average, (N * R + sum(local)) / N (up to rounding). With hybrid sharding each of
 * the replicas' owners holds R: N is the group's size, so the owners add up to N * R. */
accel_status accel__model_rescale_reduced(accel_model *m)
{
    for (int b = 0; b < m->red.n_buckets; b++) {
        if (m->red.buckets[b].n_params == 0) {
            continue; /* never sent: still local */
        }
        size_t po, pc;
        accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
        accel_status st =
            accel__dev_scale(m->dev, accel__grad_span(m, po, pc), (float)m->flat.n_ranks, NULL);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
    }
    m->grad_reduced = 0;
    return ACCEL_OK;
}

static accel_status model_backward_begin(accel_model *m)
{
    accel *acc = m->acc;
    if (m->in_backward) {
        /* A backward that was never ended: finish it so its buckets do not leak. */
        accel__log(&acc->log, ACCEL__LOG_WARN,
                   "accel_backward_begin: the previous backward was not ended");
        ACCEL_TRY(accel_backward_end(acc));
    }
    int allowed = (m->accum_allows && m->no_sync_depth == 0) || m->trigger_sync;
    m->comm_now = acc->n_ranks > 1 && allowed && m->red.n_sent > 0;
    accel__reducer_begin(m);
    m->comm_err = ACCEL_OK;
    m->in_backward = 1;
    if (m->master_shard && !accel__zero3_used(m)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_backward: under ZeRO stage %d%s no parameter was gathered "
                             "since the last step, so the forward read released weights (zeros): "
                             "a forward that reads accel_param.data itself must call "
                             "accel_model_materialize (or accel_model_gather_all) first; nn "
                             "models do it through nn_model_sink",
                             m->zero_stage, m->zero_stage == 3 ? "" : " with mixed precision");
    }
    if (m->grad_reduced) {
        ACCEL_TRY(accel__model_rescale_reduced(m));
    }

    if (m->comm_now && m->join_active) {
        float n = 0;
        ACCEL_TRY(join_count(m, 1.0f, &n));
        m->join_n_active = (int)(n + 0.5f);
    }
    return ACCEL_OK;
}

double accel_backward_begin(accel *acc)
{
    if (acc == NULL) {
        return 1.0;
    }
    double factor = 1.0 / accel__grad_state_accum_steps(acc);
    const accel__precision_hooks *ph = accel__precision(acc);
    if (ph != NULL && ph->loss_scale != NULL) {
        factor *= ph->loss_scale(acc, accel__module(acc, ACCEL__MOD_PRECISION));
    }
    for (accel_model *m = next_model(acc, NULL); m != NULL; m = next_model(acc, m)) {
        if (model_backward_begin(m) != ACCEL_OK) {
            /* Reported again by accel_backward_end, which the caller checks. */
            m->comm_err = acc->err.status;
        }
    }
    return factor;
}

accel_status accel_grad_ready(accel_model *m, int index)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_grad_ready: model is NULL");
    }
    if (index < 0 || index >= m->n_params) {
        return accel__seterr(m->acc, ACCEL_EINVAL,
                             "accel_grad_ready: parameter index %d out of range (%d parameters)",
                             index, m->n_params);
    }
    if (!m->in_backward) {
        return accel__seterr(m->acc, ACCEL_ESTATE,
                             "accel_grad_ready: parameter \"%s\" marked outside "
                             "accel_backward_begin/accel_backward_end (is the model prepared?)",
                             m->params[index].name);
    }
    return accel__reducer_ready(m, index);
}

static accel_status model_backward_end(accel_model *m)
{
    accel_status st = accel__reducer_finish(m);
    if (m->master_shard) {
        /* FSDP reshards after backward: the next forward gathers what it uses (stages 1-2:
         * the widened fp32 units go, the compute copy stays). */
        accel_status rst = accel__zero3_release_all(m);
        st = st != ACCEL_OK ? st : rst;
    }
    m->grad_reduced |= m->comm_now && m->zero_stage >= 2;
    if (st == ACCEL_OK && m->comm_now && m->join_active && !m->join_divide_initial &&
        m->join_n_active > 0) {
        st = accel__reducer_scale(m, 1.0f / (float)m->join_n_active);
    }
    m->in_backward = 0;
    m->trigger_sync = 0;
    return st;
}

accel_status accel_backward_end(accel *acc)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_backward_end: acc is NULL");
    }
    accel_status first = ACCEL_OK;
    for (accel_model *m = next_model(acc, NULL); m != NULL; m = next_model(acc, m)) {
        if (!m->in_backward) {
            continue;
        }
        accel_status st = model_backward_end(m);
        if (st != ACCEL_OK && first == ACCEL_OK) {
            first = st;
        }
    }
    if (first != ACCEL_OK) {
        return accel__seterr(acc, first, "accel_backward_end: gradient all-reduce failed: %s",
                             accel_last_error(NULL));
    }
    return ACCEL_OK;
}

accel_status accel_no_sync_begin(accel *acc, accel_model *m)
{
    if (m == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_no_sync_begin: model is NULL");
    }
    m->no_sync_depth++;
    return ACCEL_OK;
}

accel_status accel_no_sync_end(accel *acc, accel_model *m)
{
    if (m == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_no_sync_end: model is NULL");
    }
    if (m->no_sync_depth == 0) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_no_sync_end without accel_no_sync_begin");
    }
    m->no_sync_depth--;
    return ACCEL_OK;
}

accel_status accel_trigger_sync_in_backward(accel *acc, accel_model *m)
{
    if (m == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_trigger_sync_in_backward: model is NULL");
    }
    m->trigger_sync = 1;
    return ACCEL_OK;
}

/* ---- join_uneven_inputs ---- */

accel_status accel_join_begin(accel *acc, accel_model *m, int divide_by_initial_world_size)
{
    if (acc == NULL || m == NULL || m->acc != acc) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_join_begin: model is NULL or belongs to another accelerator");
    }
    if (m->join_active) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_join_begin: already in a join region");
    }
    if (!m->obj.prepared) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_join_begin: the model is not prepared");
    }
    if (m->zero_stage >= 1 && acc->n_ranks > 1) {
        /* ZeRO: the region runs as DDP (a joined process then needs no shard of its own to
         * step, and mirrors only buckets); the shards come back at accel_join_end. */
        ACCEL_TRY(accel__zero_unshard(m));
    }
    m->join_active = 1;
    m->join_divide_initial = divide_by_initial_world_size != 0;
    m->join_n_active = acc->n_ranks;
    return ACCEL_OK;
}

accel_status accel_join_end(accel *acc, accel_model *m)
{
    if (acc == NULL || m == NULL || m->acc != acc) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_join_end: model is NULL or belongs to another accelerator");
    }
    if (!m->join_active) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_join_end without accel_join_begin");
    }
    if (m->in_backward) {
        ACCEL_TRY(accel_backward_end(acc));
    }
    accel_status st = ACCEL_OK;
    if (acc->n_ranks > 1) {
        /* Shadow the backward passes of the processes still training until none is left. */
        int is_last_joiner = 1;
        for (;;) {
            float n = 0;
            ACCEL_TRY_GOTO(join_count(m, 0.0f, &n), st, out);
            if (n < 0.5f) {
                break;
            }
            is_last_joiner = 0;
            /* Mirror the active processes' messages exactly (zeros, same buckets and dtype). */
            ACCEL_TRY_GOTO(accel__reducer_mirror(m), st, out);
        }
        /* The authoritative copy: the last process to join (ties: the highest rank). */
        int32_t cand = is_last_joiner ? acc->rank : -1;
        accel_status cst = accel__allreduce(acc->comm, &cand, &cand, 1, ACCEL_I32, ACCEL_MAX);
        if (cst != ACCEL_OK) {
            st = accel__adopt_thread_error(acc, cst);
            goto out;
        }
        ACCEL_TRY_GOTO(accel__model_broadcast_master(m, (int)cand), st, out);
        ACCEL_TRY_GOTO(accel__zero_reshard(m, (int)cand), st, out);
    }
out:
    m->join_active = 0;
    accel_status zst = accel__model_zero_grad(m);
    /* A sharded master: stage 3 refreshes a unit's copy when it is gathered, stages 1-2 took
     * it from the full weights when resharding. */
    accel_status rst = m->master_shard ? ACCEL_OK : accel__model_refresh_compute(m);
    return st != ACCEL_OK ? st : zst != ACCEL_OK ? zst : rst;
}
