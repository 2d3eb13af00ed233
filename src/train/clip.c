/*
 * Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_) over a model's flat
 * gradient buffer, through the model's device kernels, and the unscale entry point of the
 * fp16 loss scaler. Invariants: frozen parameters are neither counted in the norm nor
 * modified; the norm is summed run by run (clip_run: trainable gradients contiguous in memory,
 * the whole flat buffer when nothing is frozen), each run from 0 in double and the runs in
 * registration order of their first parameter, so the order depends only on the geometry,
 * the frozen flags and the rank: the same bits on every run of a device kind and process.
 */
#include <math.h>

#include "core/profile.h"
#include "train_internal.h"

accel_status accel_unscale_gradients(accel *acc, accel_optimizer *opt)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_unscale_gradients: acc is NULL");
    }
    const accel__precision_hooks *ph = accel__precision(acc);
    if (ph == NULL || ph->unscale == NULL) {
        return ACCEL_OK; /* no fp16 scaler: gradients are not scaled */
    }
    void *state = accel__module(acc, ACCEL__MOD_PRECISION);
    for (accel__object *o = acc->objects; o != NULL; o = o->next) {
        accel_optimizer *x = (accel_optimizer *)o;
        if (o->kind != ACCEL__OBJ_OPTIMIZER || (opt != NULL && x != opt) || x->unscaled) {
            continue;
        }
        ACCEL_TRY(ph->unscale(acc, state, x));
        x->unscaled = 1;
    }
    return ACCEL_OK;
}

static accel_status check_model(accel *acc, accel_model *m, const char *who)
{
    if (acc == NULL || m == NULL || m->acc != acc) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: model is NULL or belongs to another accelerator", who);
    }
    if (!m->allocated) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: the model has no gradients yet (not allocated)", who);
    }
    return ACCEL_OK;
}

/* The gradient of trainable parameter i that clipping reads and scales: all of it, or under
 * ZeRO the part this process owns (the only part that holds reduced values at stage 2). */
static accel__dspan clip_span(const accel_model *m, int i)
{
    const accel_param *p = &m->params[i];
    return m->zero_stage >= 1 ? accel__zero_grad_part(m, i)
                              : accel__grad_span(m, p->offset, p->numel);
}

/* The run of clip spans from parameter *i on (registration order), advancing *i past it: the
 * spans of consecutive trainable parameters as long as each touches the run so far in memory
 * (the layout is reverse registration order, so usually at its start), as one span; count 0
 * after the last. A frozen parameter lies between its neighbours' spans and so ends a run;
 * under ZeRO a run ends at the edge of this process's piece of a bucket. One kernel (norm,
 * scale) per run instead of one per parameter: a single run for a model without frozen
 * parameters at stage 0, where the per-parameter loop cost 3 launches for each parameter. */
static accel__dspan clip_run(const accel_model *m, int *i)
{
    float *lo = NULL, *hi = NULL;
    for (; *i < m->n_params; (*i)++) {
        accel__dspan g = clip_span(m, *i);
        if (m->params[*i].frozen || g.count == 0) {
            continue;
        }
        float *a = g.data, *b = a + g.count;
        if (lo == NULL) {
            lo = a, hi = b;
        } else if (a == hi) {
            hi = b;
        } else if (b == lo) {
            lo = a;
        } else {
            break; /* parameter *i starts the next run */
        }
    }
    return accel__dspan_f32(lo, lo != NULL ? (size_t)(hi - lo) : 0);
}

/* The norm (one device result, read once; under ZeRO each process's shard sum combined over
 * the processes), then the scaling when it exceeds max_norm. */
static accel_status clip_norm(accel_model *m, double max_norm, double norm_type, double *total_norm)
{
    int inf_norm = isinf(norm_type);
    accel_status st = accel__dev_memset(m->dev, m->dev_sum, 0, sizeof(double), NULL);
    int i = 0;
    for (accel__dspan g = clip_run(m, &i); g.count > 0 && st == ACCEL_OK; g = clip_run(m, &i)) {
        st = inf_norm ? accel__dev_abs_max(m->dev, g, m->dev_sum, NULL)
                      : accel__dev_pow_sum(m->dev, g, norm_type, m->dev_sum, NULL);
    }
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(m->acc, st);
    }
    double acc_norm;
    ACCEL_TRY(accel__model_read_sum(m, &acc_norm));
    if (m->zero_stage >= 1 && m->flat.n_ranks > 1) {
        /* Shard sums add up (in rank order: the same bits on every process); a NaN anywhere
         * stays NaN through either reduction. Over the shard group: the other replicas hold
         * the same shards. */
        st = accel__allreduce(accel__zero_comm(m), &acc_norm, &acc_norm, 1, ACCEL_F64,
                              inf_norm ? ACCEL_MAX : ACCEL_SUM);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
    }
    double total = inf_norm ? acc_norm : pow(acc_norm, 1.0 / norm_type);
    if (total_norm != NULL) {
        *total_norm = total;
    }
    double coef = max_norm / (total + 1e-6);
    /* torch multiplies by min(coef, 1); a NaN norm turns the gradients into NaN as there. */
    if (coef < 1.0 || isnan(coef)) {
        i = 0;
        for (accel__dspan g = clip_run(m, &i); g.count > 0 && st == ACCEL_OK; g = clip_run(m, &i)) {
            st = accel__dev_scale(m->dev, g, (float)coef, NULL);
        }
    }
    return st == ACCEL_OK ? st : accel__adopt_thread_error(m->acc, st);
}

accel_status accel_clip_grad_norm(accel *acc, accel_model *m, double max_norm, double norm_type,
                                  double *total_norm)
{
    const char *who = "accel_clip_grad_norm";
    ACCEL_TRY(check_model(acc, m, who));
    if (!(max_norm >= 0)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: max_norm=%g must be >= 0", who, max_norm);
    }
    if (!(norm_type > 0)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: norm_type=%g must be > 0 or INFINITY", who,
                             norm_type);
    }
    ACCEL_TRY(accel_unscale_gradients(acc, NULL));
    accel__prof_begin(acc, "clip_grad_norm", ACCEL__PROF_OPTIM);
    accel_status st = clip_norm(m, max_norm, norm_type, total_norm);
    accel__prof_end(acc);
    return st;
}

accel_status accel_clip_grad_value(accel *acc, accel_model *m, double clip)
{
    const char *who = "accel_clip_grad_value";
    ACCEL_TRY(check_model(acc, m, who));
    if (!(clip >= 0)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: clip=%g must be >= 0", who, clip);
    }
    ACCEL_TRY(accel_unscale_gradients(acc, NULL));
    float c = (float)clip;
    for (int i = 0; i < m->n_params; i++) {
        const accel_param *p = &m->params[i];
        if (p->frozen) {
            continue;
        }
        accel_status st =
            accel__dev_clamp(m->dev, accel__grad_span(m, p->offset, p->numel), -c, c, NULL);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
    }
    return ACCEL_OK;
}
