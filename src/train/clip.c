/*
 * Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_) over a model's flat
 * gradient buffer, and the unscale entry point of the fp16 loss scaler. Invariant: frozen
 * parameters are neither counted in the norm nor modified.
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
    double acc_norm = 0;
    int inf_norm = isinf(norm_type);
    for (int i = 0; i < m->n_params; i++) {
        const accel_param *p = &m->params[i];
        if (p->frozen) {
            continue;
        }
        if (inf_norm) {
            double a = accel__abs_max(p->grad, p->numel);
            if (a > acc_norm || isnan(a)) {
                acc_norm = a;
            }
        } else {
            acc_norm += accel__pow_sum(p->grad, p->numel, norm_type);
        }
    }
    double total = inf_norm ? acc_norm : pow(acc_norm, 1.0 / norm_type);
    if (total_norm != NULL) {
        *total_norm = total;
    }
    double coef = max_norm / (total + 1e-6);
    /* torch multiplies by min(coef, 1); a NaN norm turns the gradients into NaN as there. */
    if (coef < 1.0 || isnan(coef)) {
        for (int i = 0; i < m->n_params; i++) {
            const accel_param *p = &m->params[i];
            if (!p->frozen) {
                accel__scale(p->grad, p->numel, (float)coef);
            }
        }
    }
    accel__prof_end(acc);
    return ACCEL_OK;
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
        for (size_t j = 0; j < p->numel; j++) {
            float g = p->grad[j];
            p->grad[j] = g < -c ? -c : (g > c ? c : g);
        }
    }
    return ACCEL_OK;
}
