/*
 * Mixed precision for the training core: the fp16 dynamic loss scaler (torch GradScaler
 * semantics, plugged into the core through accel__precision_hooks in the ACCEL__MOD_PRECISION
 * slot), the working copy of the weights stored in the compute dtype, and the validation of
 * compressed gradient communication (the compression itself is the reducer's hook).
 *
 * Invariants: the scaler exists only under mixed_precision fp16 (bf16 never scales); the
 * skip decision of a step is identical on every process (the found-inf flag is all-reduced
 * with MAX); a model's working copy equals round(master) after prepare and after every real
 * optimizer step.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>

#include "train_internal.h"

typedef struct scaler {
    accel__precision_hooks hooks; /* first: accel__precision() casts the slot to it */
    accel__object obj;            /* listed on the accelerator: its state is checkpointed */
    double scale;
    double growth_factor, backoff_factor;
    int growth_interval;
    long long growth_tracker; /* consecutive clean steps since the last change */
} scaler;

static double scaler_loss_scale(accel *acc, void *state)
{
    (void)acc;
    return ((scaler *)state)->scale;
}

/*
 * torch's _amp_foreach_non_finite_check_and_unscale_: multiply by the fp32 inverse scale and
 * note any inf/NaN, over the optimizer's segments (its trainable parameters) in one device
 * pass each. The flag is local here; should_skip makes it global.
 */
static accel_status scaler_unscale(accel *acc, void *state, accel_optimizer *opt)
{
    scaler *s = state;
    accel_model *m = opt->model;
    float inv = (float)(1.0 / s->scale);
    int32_t found = 0;
    accel_status st = accel__dev_memset(m->dev, m->dev_flag, 0, sizeof(int32_t), NULL);
    for (int k = 0; k < opt->n_segments && st == ACCEL_OK; k++) {
        const accel__optim_segment *sg = &opt->segments[k];
        st = accel__dev_unscale_check(m->dev, accel__grad_span(m, sg->offset, sg->count), inv,
                                      m->dev_flag, NULL);
    }
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(acc, st);
    }
    ACCEL_TRY(accel__model_read_flag(m, &found));
    opt->found_inf = found != 0;
    return ACCEL_OK;
}

static accel_status scaler_should_skip(accel *acc, void *state, accel_optimizer *opt, int *skip)
{
    (void)state;
    int32_t flag = opt->found_inf;
    /* One process seeing an overflow must make every process skip the same step. A join
     * region cannot take an extra collective (joined processes only mirror buckets), but
     * there the averaged gradients already carry the inf/NaN to every process. */
    if (acc->n_ranks > 1 && !opt->model->join_active) {
        accel_status st = accel__allreduce(acc->comm, &flag, &flag, 1, ACCEL_I32, ACCEL_MAX);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
    }
    *skip = flag != 0;
    opt->found_inf = 0;
    return ACCEL_OK;
}

static void scaler_update(accel *acc, void *state, int skipped)
{
    scaler *s = state;
    if (skipped) {
        s->scale *= s->backoff_factor;
        s->growth_tracker = 0;
        accel__log(&acc->log, ACCEL__LOG_DEBUG,
                   "fp16 loss scaler: inf/nan in gradients, step skipped, "
                   "scale -> %g",
                   s->scale);
        (void)acc;
        return;
    }
    if (++s->growth_tracker >= s->growth_interval) {
        s->scale *= s->growth_factor;
        s->growth_tracker = 0;
    }
}

static void scaler_free(accel *acc, void *state)
{
    (void)acc;
    accel__object_unregister(&((scaler *)state)->obj);
    accel__free(state);
}

/* ---- the state protocol: scaler.json, torch GradScaler's state_dict fields ---- */

static scaler *scaler_of(accel__object *self)
{
    return (scaler *)(void *)((char *)self - offsetof(scaler, obj));
}

static accel_status scaler_state_save(accel__object *self, accel__state_writer *w)
{
    const scaler *s = scaler_of(self);
    ACCEL_TRY(accel__state_put_f64(w, "scale", s->scale));
    ACCEL_TRY(accel__state_put_f64(w, "growth_factor", s->growth_factor));
    ACCEL_TRY(accel__state_put_f64(w, "backoff_factor", s->backoff_factor));
    ACCEL_TRY(accel__state_put_i64(w, "growth_interval", s->growth_interval));
    return accel__state_put_i64(w, "_growth_tracker", s->growth_tracker);
}

typedef struct scaler_staged {
    double scale, growth_factor, backoff_factor;
    int64_t growth_interval, growth_tracker;
} scaler_staged;

static void scaler_apply(accel__object *self, void *data)
{
    scaler *s = scaler_of(self);
    const scaler_staged *in = data;
    s->scale = in->scale;
    s->growth_factor = in->growth_factor;
    s->backoff_factor = in->backoff_factor;
    s->growth_interval = (int)in->growth_interval;
    s->growth_tracker = in->growth_tracker;
}

/* Every field, the factors and the interval too, as torch's GradScaler.load_state_dict takes
 * them (a resumed run keeps the saved run's schedule, whatever this run's options say), each
 * in the range accel__precision_install accepts. */
static accel_status scaler_state_load(accel__object *self, accel__state_reader *r)
{
    scaler_staged *in = accel__state_stage(r, sizeof(*in), scaler_apply);
    if (in == NULL) {
        return ACCEL_ENOMEM;
    }
    ACCEL_TRY(accel__state_get_f64(r, "scale", DBL_TRUE_MIN, DBL_MAX, &in->scale));
    ACCEL_TRY(accel__state_get_f64(r, "growth_factor", 1.0, DBL_MAX, &in->growth_factor));
    ACCEL_TRY(accel__state_get_f64(r, "backoff_factor", DBL_TRUE_MIN, 1.0, &in->backoff_factor));
    ACCEL_TRY(accel__state_get_i64(r, "growth_interval", 1, INT_MAX, &in->growth_interval));
    return accel__state_get_i64(r, "_growth_tracker", 0, ACCEL__STATE_COUNT_MAX,
                                &in->growth_tracker);
}

static const accel__object_class scaler_class = {
    .state_save = scaler_state_save, /* no destroy: the ACCEL__MOD_PRECISION slot owns it */
    .state_load = scaler_state_load,
    .name = "scaler",
    .store = ACCEL__STORE_JSON,
};

accel_status accel__precision_install(accel *acc)
{
    if (acc->settings->train.mixed_precision != ACCEL_PRECISION_FP16 ||
        accel__module(acc, ACCEL__MOD_PRECISION) != NULL) {
        return ACCEL_OK;
    }
    const accel__train_settings *o = &acc->settings->train;
    if (!(o->init_scale > 0) || isinf(o->init_scale) || !(o->growth_factor >= 1.0) ||
        !(o->backoff_factor > 0 && o->backoff_factor <= 1.0) || o->growth_interval < 1) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_prepare: fp16 loss scaler options init_scale=%g (> 0), "
                             "growth_factor=%g (>= 1), backoff_factor=%g (in (0, 1]), "
                             "growth_interval=%d (>= 1): one is out of range",
                             o->init_scale, o->growth_factor, o->backoff_factor,
                             o->growth_interval);
    }
    scaler *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_prepare: out of memory for the scaler");
    }
    s->hooks.loss_scale = scaler_loss_scale;
    s->hooks.unscale = scaler_unscale;
    s->hooks.should_skip = scaler_should_skip;
    s->hooks.update = scaler_update;
    s->scale = o->init_scale;
    s->growth_factor = o->growth_factor;
    s->backoff_factor = o->backoff_factor;
    s->growth_interval = o->growth_interval;
    accel__object_register(acc, &s->obj, ACCEL__OBJ_SCALER, &scaler_class);
    s->obj.prepared = 1;
    accel__module_set(acc, ACCEL__MOD_PRECISION, s, scaler_free);
    return ACCEL_OK;
}

int accel__scaler_get(const accel *acc, double *scale, long long *growth_tracker)
{
    const scaler *s = acc ? accel__module(acc, ACCEL__MOD_PRECISION) : NULL;
    if (s == NULL) {
        return 0;
    }
    *scale = s->scale;
    *growth_tracker = s->growth_tracker;
    return 1;
}

accel_status accel__scaler_set(accel *acc, double scale, long long growth_tracker)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "scaler state: acc is NULL");
    }
    ACCEL_TRY(accel__precision_install(acc));
    scaler *s = accel__module(acc, ACCEL__MOD_PRECISION);
    if (s == NULL) {
        return accel__seterr(acc, ACCEL_ESTATE,
                             "scaler state: no fp16 loss scaler (mixed_precision is %s)",
                             accel_precision_name(acc->settings->train.mixed_precision));
    }
    if (!(scale > 0) || isinf(scale) || growth_tracker < 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "scaler state: scale=%g must be finite and > 0, growth_tracker=%lld "
                             ">= 0",
                             scale, growth_tracker);
    }
    s->scale = scale;
    s->growth_tracker = growth_tracker;
    return ACCEL_OK;
}

double accel_loss_scale(const accel *acc)
{
    double scale = 1.0;
    long long tracker;
    if (acc != NULL) {
        (void)accel__scaler_get(acc, &scale, &tracker);
    }
    return scale;
}

/* ---- working copy in the compute dtype ---- */

accel_dtype accel__compute_dtype(const accel *acc)
{
    switch (acc->settings->train.mixed_precision) {
    case ACCEL_PRECISION_FP16:
        return ACCEL_F16;
    case ACCEL_PRECISION_BF16:
        return ACCEL_BF16;
    default:
        return ACCEL_F32;
    }
}

accel_status accel__model_refresh_compute_range(accel_model *m, size_t offset, size_t count)
{
    if (m->compute == NULL || m->compute == m->weights) {
        return ACCEL_OK;
    }
    accel_status st = accel__dev_convert(
        m->dev,
        accel__dspan_of((char *)m->compute + offset * sizeof(uint16_t), m->compute_dtype, count),
        accel__dspan_f32(m->weights + offset, count), NULL);
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(m->acc, st);
    }
    if (!m->compute_valid) {
        /* Valid from now on (a partial refresh only follows a full one): publish the views. */
        m->compute_valid = 1;
        for (int i = 0; i < m->n_params; i++) {
            accel_param *p = &m->params[i];
            p->compute_view.data = (char *)m->compute + p->offset * sizeof(uint16_t);
        }
    }
    return ACCEL_OK;
}

void *accel__model_compute_fused(const accel_model *m, const float *param, size_t offset)
{
    /* Only once valid (the first refresh publishes the views), and only when the update's
     * param is the weights the copy is rounded from (stage 0: master == weights). */
    if (m->compute == NULL || m->compute == m->weights || !m->compute_valid ||
        param != m->weights + offset ||
        (m->compute_dtype != ACCEL_BF16 && m->compute_dtype != ACCEL_F16)) {
        return NULL;
    }
    return (char *)m->compute + offset * sizeof(uint16_t);
}

accel_status accel__model_refresh_compute(accel_model *m)
{
    return accel__model_refresh_compute_range(m, 0, m->flat.padded_numel);
}

accel_dtype accel_model_compute_dtype(const accel_model *m)
{
    return m ? m->compute_dtype : ACCEL_F32;
}

accel_status accel_model_compute_view(const accel_model *m, accel_tensor *out)
{
    if (m == NULL || out == NULL) {
        return accel__seterr(m ? m->acc : NULL, ACCEL_EINVAL,
                             "accel_model_compute_view: model and out must not be NULL");
    }
    if (!m->allocated || !m->compute_valid) {
        return accel__seterr(m->acc, ACCEL_ESTATE,
                             "accel_model_compute_view: the %s working copy is not valid yet "
                             "(the model is not %s)",
                             accel_dtype_name(m->compute_dtype),
                             m->allocated ? "prepared" : "allocated");
    }
    if (m->compute_stale) {
        return accel__seterr(m->acc, ACCEL_ESTATE,
                             "accel_model_compute_view: a checkpoint load wrote the sharded "
                             "master; the %s working copy is gathered from it at the next "
                             "forward (accel_model_materialize) or accel_model_gather_all",
                             accel_dtype_name(m->compute_dtype));
    }
    int64_t n = (int64_t)m->flat.padded_numel;
    *out = accel_tensor_view(m->compute, m->compute_dtype, 1, &n);
    out->device = accel__device_which(m->dev);
    return ACCEL_OK;
}

const float *accel_model_compute(const accel_model *m)
{
    if (m == NULL || !m->allocated) {
        return NULL;
    }
    if (m->compute_dtype != ACCEL_F32) {
        accel__seterr(m->acc, ACCEL_ESTATE,
                      "accel_model_compute: the working copy is stored in %s, not fp32; read it "
                      "with accel_model_compute_view",
                      accel_dtype_name(m->compute_dtype));
        return NULL;
    }
    return accel_model_master((accel_model *)m);
}

/* ---- compressed gradient communication ---- */

accel_status accel__comm_dtype_check(accel *acc)
{
    int dt = acc->settings->train.comm_dtype;
    if (dt < 0 || dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16) {
        return ACCEL_OK;
    }
    const char *name = accel_dtype_name((accel_dtype)dt);
    return accel__seterr(acc, ACCEL_EINVAL,
                         "accel_prepare: comm_dtype=%s (%d) is not supported for gradient "
                         "communication; use ACCEL_BF16, ACCEL_F16 or ACCEL_F32",
                         name ? name : "?", dt);
}
