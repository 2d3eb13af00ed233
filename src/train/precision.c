/*
 * Mixed precision for the training core: the fp16 dynamic loss scaler (torch GradScaler
 * semantics, plugged into the core through accel__precision_hooks in the ACCEL__MOD_PRECISION
 * slot), the working copy of the weights in the compute dtype, and compressed gradient
 * communication (bucket -> bf16/f16 -> all-reduce -> fp32).
 *
 * Invariants: the scaler exists only under mixed_precision fp16 (bf16 never scales); the
 * skip decision of a step is identical on every process (the found-inf flag is all-reduced
 * with MAX); a model's working copy equals round(master) after prepare and after every real
 * optimizer step.
 */
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "core/profile.h"
#include "train_internal.h"

typedef struct scaler {
    accel__precision_hooks hooks; /* first: accel__precision() casts the slot to it */
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
 * note any inf/NaN. The flag is local here; should_skip makes it global.
 */
static accel_status scaler_unscale(accel *acc, void *state, accel_optimizer *opt)
{
    (void)acc;
    scaler *s = state;
    accel_model *m = opt->model;
    float inv = (float)(1.0 / s->scale);
    int found = 0;
    for (int i = 0; i < m->n_params; i++) {
        const accel_param *p = &m->params[i];
        if (p->frozen) {
            continue;
        }
        float *g = p->grad;
        float bad = 0.0f;
        for (size_t j = 0; j < p->numel; j++) {
            float v = g[j] * inv;
            /* v - v is 0 for finite v and NaN for inf/NaN: a branch-free finiteness test. */
            bad += v - v;
            g[j] = v;
        }
        found |= bad != 0.0f || isnan(bad);
    }
    opt->found_inf = found;
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
    accel__free(state);
}

accel_status accel__precision_install(accel *acc)
{
    if (acc->opt.mixed_precision != ACCEL_PRECISION_FP16 ||
        accel__module(acc, ACCEL__MOD_PRECISION) != NULL) {
        return ACCEL_OK;
    }
    const accel_options *o = &acc->opt;
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
                             accel_precision_name(acc->opt.mixed_precision));
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
    switch (acc->opt.mixed_precision) {
    case ACCEL_PRECISION_FP16:
        return ACCEL_F16;
    case ACCEL_PRECISION_BF16:
        return ACCEL_BF16;
    default:
        return ACCEL_F32;
    }
}

/* dst = src rounded to dt (bf16 or f16), both fp32; through a stack buffer so the vector
 * converters do the rounding. dst may equal src. */
static void round_f32(float *dst, const float *src, size_t n, accel_dtype dt)
{
    uint16_t tmp[2048];
    for (size_t i = 0; i < n; i += 2048) {
        size_t c = n - i < 2048 ? n - i : 2048;
        if (dt == ACCEL_BF16) {
            accel__f32_to_bf16_n(tmp, src + i, c);
            accel__bf16_to_f32_n(dst + i, tmp, c);
        } else {
            accel__f32_to_f16_n(tmp, src + i, c);
            accel__f16_to_f32_n(dst + i, tmp, c);
        }
    }
}

void accel__model_refresh_compute_range(accel_model *m, size_t offset, size_t count)
{
    if (m->compute == NULL || m->compute == m->master) {
        return;
    }
    float *dst = m->compute + offset;
    const float *src = m->master + offset;
    accel_dtype dt = m->compute_dtype;
    /* Chunks of 64 Ki elements spread over threads for large models. */
    const size_t chunk = (size_t)1 << 16;
    long long n_chunks = (long long)((count + chunk - 1) / chunk);
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (n_chunks > 2)
#endif
    for (long long c = 0; c < n_chunks; c++) {
        size_t o = (size_t)c * chunk;
        size_t k = count - o < chunk ? count - o : chunk;
        round_f32(dst + o, src + o, k, dt);
    }
    m->compute_valid = 1;
}

void accel__model_refresh_compute(accel_model *m)
{
    accel__model_refresh_compute_range(m, 0, m->numel);
}

accel_dtype accel_model_compute_dtype(const accel_model *m)
{
    return m ? m->compute_dtype : ACCEL_F32;
}

const float *accel_model_compute(const accel_model *m)
{
    if (m == NULL || !m->allocated) {
        return NULL;
    }
    if (m->compute == m->master) {
        return m->master;
    }
    return m->compute_valid ? m->compute : NULL;
}

/* ---- compressed gradient communication ---- */

accel_status accel__comm_dtype_check(accel *acc)
{
    int dt = acc->opt.comm_dtype;
    if (dt < 0 || dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16) {
        return ACCEL_OK;
    }
    const char *name = accel_dtype_name((accel_dtype)dt);
    return accel__seterr(acc, ACCEL_EINVAL,
                         "accel_prepare: comm_dtype=%s (%d) is not supported for gradient "
                         "communication; use ACCEL_BF16, ACCEL_F16 or ACCEL_F32",
                         name ? name : "?", dt);
}

int accel__comm_compressed(const accel_model *m)
{
    return m->comm_buf != NULL;
}

void accel__bucket_compress(accel_model *m, size_t offset, size_t count)
{
    if (m->acc->opt.comm_dtype == ACCEL_BF16) {
        accel__f32_to_bf16_n(m->comm_buf + offset, m->grad + offset, count);
    } else {
        accel__f32_to_f16_n(m->comm_buf + offset, m->grad + offset, count);
    }
}

void accel__bucket_decompress(accel_model *m, size_t offset, size_t count)
{
    if (m->acc->opt.comm_dtype == ACCEL_BF16) {
        accel__bf16_to_f32_n(m->grad + offset, m->comm_buf + offset, count);
    } else {
        accel__f16_to_f32_n(m->grad + offset, m->comm_buf + offset, count);
    }
}
