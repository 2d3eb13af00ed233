/*
 * Optimizers (torch.optim SGD, Adam, AdamW) over a model's flat buffers, with param groups and
 * Accelerate's AcceleratedOptimizer rules (step and zero_grad only on syncing micro-steps,
 * step_was_skipped from the fp16 scaler hook). Invariant: the state buffers are parallel to
 * the master buffer (same geometry, same device), and an update touches exactly the segments
 * of non-frozen parameters, through the model's device kernels.
 */
#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "train_internal.h"

static accel_status optim_prepare(accel__object *self);
static void optim_destroy(accel__object *self);

/* Checkpoints: optimizer[_<i>].safetensors (optim_state.c). */
static const accel__object_class optim_class = {
    .prepare = optim_prepare,
    .destroy = optim_destroy,
    .state_save = accel__optim_state_save,
    .state_load = accel__optim_state_load,
    .name = "optimizer",
    .store = ACCEL__STORE_TENSORS,
    .format = "accel-optimizer",
};

accel_sgd_options accel_sgd_options_default(void)
{
    accel_sgd_options o;
    memset(&o, 0, sizeof(o));
    o.size = sizeof(o);
    o.version = ACCEL_SGD_OPTIONS_VERSION;
    o.lr = 1e-3;
    return o;
}

accel_adam_options accel_adam_options_default(void)
{
    accel_adam_options o;
    memset(&o, 0, sizeof(o));
    o.size = sizeof(o);
    o.version = ACCEL_ADAM_OPTIONS_VERSION;
    o.lr = 1e-3;
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    return o;
}

accel_adam_options accel_adamw_options_default(void)
{
    accel_adam_options o = accel_adam_options_default();
    o.weight_decay = 1e-2;
    return o;
}

/* A negative or NaN hyper-parameter is refused naming it. */
static accel_status check_nonneg(accel *acc, const char *who, const char *what, double v)
{
    if (!(v >= 0) || isinf(v)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: %s=%g must be a finite value >= 0", who, what,
                             v);
    }
    return ACCEL_OK;
}

static accel_status optim_new(accel *acc, accel_model *m, accel__optim_kind kind, double lr,
                              double wd, accel_optimizer **out)
{
    accel_optimizer *opt = accel__calloc(1, sizeof(*opt));
    int *pg = accel__calloc((size_t)(m->n_params > 0 ? m->n_params : 1), sizeof(int));
    if (opt == NULL || pg == NULL) {
        accel__free(opt);
        accel__free(pg);
        return accel__seterr(acc, ACCEL_ENOMEM, "optimizer: out of memory");
    }
    opt->acc = acc;
    opt->model = m;
    opt->kind = kind;
    opt->n_groups = 1;
    opt->groups[0].lr = lr;
    opt->groups[0].weight_decay = wd;
    opt->param_group = pg;
    opt->segments_dirty = 1;
    accel__object_register(acc, &opt->obj, ACCEL__OBJ_OPTIMIZER, &optim_class);
    *out = opt;
    return ACCEL_OK;
}

static accel_status check_common(accel *acc, accel_model *m, const char *who, accel_optimizer **out)
{
    if (acc == NULL || out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: acc and out must not be NULL", who);
    }
    if (m == NULL || m->acc != acc) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: model is NULL or belongs to another accelerator", who);
    }
    if (m->n_params == 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: the model has no parameter", who);
    }
    return ACCEL_OK;
}

accel_status accel_sgd_new(accel *acc, accel_model *m, const accel_sgd_options *o,
                           accel_optimizer **out)
{
    const char *who = "accel_sgd";
    ACCEL_TRY(check_common(acc, m, who, out));
    accel_sgd_options d = accel_sgd_options_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(acc, who, accel_sgd_options, &d, o, maximize));
    ACCEL_TRY(check_nonneg(acc, who, "lr", d.lr));
    ACCEL_TRY(check_nonneg(acc, who, "momentum", d.momentum));
    ACCEL_TRY(check_nonneg(acc, who, "dampening", d.dampening));
    ACCEL_TRY(check_nonneg(acc, who, "weight_decay", d.weight_decay));
    if (d.nesterov && (d.momentum <= 0 || d.dampening != 0)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: nesterov requires momentum > 0 and dampening 0 (momentum=%g, "
                             "dampening=%g)",
                             who, d.momentum, d.dampening);
    }
    accel_optimizer *opt = NULL; /* set on success; for -O3's maybe-uninitialized */
    ACCEL_TRY(optim_new(acc, m, ACCEL__SGD, d.lr, d.weight_decay, &opt));
    opt->momentum = d.momentum;
    opt->dampening = d.dampening;
    opt->nesterov = d.nesterov != 0;
    opt->maximize = d.maximize != 0;
    *out = opt;
    return ACCEL_OK;
}

static accel_status adam_new(accel *acc, accel_model *m, const accel_adam_options *o,
                             accel_optimizer **out, int decoupled)
{
    const char *who = decoupled ? "accel_adamw" : "accel_adam";
    ACCEL_TRY(check_common(acc, m, who, out));
    accel_adam_options d = decoupled ? accel_adamw_options_default() : accel_adam_options_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(acc, who, accel_adam_options, &d, o, maximize));
    ACCEL_TRY(check_nonneg(acc, who, "lr", d.lr));
    ACCEL_TRY(check_nonneg(acc, who, "eps", d.eps));
    ACCEL_TRY(check_nonneg(acc, who, "weight_decay", d.weight_decay));
    if (!(d.beta1 >= 0 && d.beta1 < 1)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: beta1=%g is not in [0, 1)", who, d.beta1);
    }
    if (!(d.beta2 >= 0 && d.beta2 < 1)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: beta2=%g is not in [0, 1)", who, d.beta2);
    }
    accel_optimizer *opt = NULL; /* set on success; for -O3's maybe-uninitialized */
    ACCEL_TRY(
        optim_new(acc, m, decoupled ? ACCEL__ADAMW : ACCEL__ADAM, d.lr, d.weight_decay, &opt));
    opt->beta1 = d.beta1;
    opt->beta2 = d.beta2;
    opt->eps = d.eps;
    opt->amsgrad = d.amsgrad != 0;
    opt->maximize = d.maximize != 0;
    *out = opt;
    return ACCEL_OK;
}

accel_status accel_adam_new(accel *acc, accel_model *m, const accel_adam_options *o,
                            accel_optimizer **out)
{
    return adam_new(acc, m, o, out, 0);
}

accel_status accel_adamw_new(accel *acc, accel_model *m, const accel_adam_options *o,
                             accel_optimizer **out)
{
    return adam_new(acc, m, o, out, 1);
}

accel_optimizer *accel_sgd(accel *acc, accel_model *m, const accel_sgd_options *o)
{
    accel_optimizer *opt = NULL;
    return accel_sgd_new(acc, m, o, &opt) == ACCEL_OK ? opt : NULL;
}

accel_optimizer *accel_adam(accel *acc, accel_model *m, const accel_adam_options *o)
{
    accel_optimizer *opt = NULL;
    return accel_adam_new(acc, m, o, &opt) == ACCEL_OK ? opt : NULL;
}

accel_optimizer *accel_adamw(accel *acc, accel_model *m, const accel_adam_options *o)
{
    accel_optimizer *opt = NULL;
    return accel_adamw_new(acc, m, o, &opt) == ACCEL_OK ? opt : NULL;
}

void accel_optimizer_free(accel_optimizer *opt)
{
    if (opt == NULL) {
        return;
    }
    accel__device *dev = opt->model->dev;
    accel__dev_free(dev, opt->state_a);
    accel__dev_free(dev, opt->state_b);
    accel__dev_free(dev, opt->state_c);
    for (int k = 0; k < 3; k++) { /* freed inside a ZeRO join region */
        accel__dev_free(dev, opt->shard_state[k]);
    }
    accel__free(opt->segments);
    accel__free(opt->param_group);
    accel__object_unregister(&opt->obj);
    accel__free(opt);
}

static void optim_destroy(accel__object *self)
{
    accel_optimizer_free((accel_optimizer *)self);
}

static float *zeroed_state(accel_model *m, size_t n)
{
    void *p = NULL;
    return accel__dev_alloc(m->dev, n * sizeof(float), 1, &p) == ACCEL_OK ? p : NULL;
}

static accel_status optim_prepare(accel__object *self)
{
    accel_optimizer *opt = (accel_optimizer *)self;
    accel_model *m = opt->model;
    if (!m->obj.prepared) {
        return accel__seterr(opt->acc, ACCEL_EINVAL,
                             "accel_prepare: the optimizer's model was not prepared (pass the "
                             "model to accel_prepare too)");
    }
    size_t n = accel__zero_state_numel(m); /* the shard from ZeRO stage 1 on */
    int need_a = opt->kind != ACCEL__SGD || opt->momentum != 0;
    int need_b = opt->kind != ACCEL__SGD;
    int need_c = need_b && opt->amsgrad;
    if ((need_a && (opt->state_a = zeroed_state(m, n)) == NULL) ||
        (need_b && (opt->state_b = zeroed_state(m, n)) == NULL) ||
        (need_c && (opt->state_c = zeroed_state(m, n)) == NULL)) {
        return accel__seterr(opt->acc, ACCEL_ENOMEM,
                             "accel_prepare: out of memory for optimizer state (%zu elements)", n);
    }
    return accel__optim_build_segments(opt);
}

accel_status accel__optim_build_segments(accel_optimizer *opt)
{
    accel_model *m = opt->model;
    accel__free(opt->segments);
    opt->segments = accel__calloc((size_t)m->n_params, sizeof(*opt->segments));
    if (opt->segments == NULL) {
        return accel__seterr(opt->acc, ACCEL_ENOMEM, "optimizer: out of memory for segments");
    }
    int ns = 0;
    /* Memory order is reverse registration order: walk it so adjacent params merge. */
    for (int i = m->n_params - 1; i >= 0; i--) {
        const accel_param *p = &m->params[i];
        if (p->frozen) {
            continue;
        }
        int g = opt->param_group[i];
        accel__optim_segment *last = ns ? &opt->segments[ns - 1] : NULL;
        if (last != NULL && last->group == g && last->offset + last->count == p->offset) {
            last->count += p->numel;
        } else {
            opt->segments[ns].offset = p->offset;
            opt->segments[ns].count = p->numel;
            opt->segments[ns].group = g;
            ns++;
        }
    }
    opt->n_segments = ns;
    ACCEL_TRY(accel__zero_shard_segments(opt));
    opt->segments_dirty = 0;
    return ACCEL_OK;
}

/* The update itself, over every segment. */
static accel_status optim_update(accel_optimizer *opt)
{
    accel_model *m = opt->model;
    int first = opt->n_steps == 0;
    opt->n_steps++;
    double bc1 = 1.0, bc2s = 1.0;
    if (opt->kind != ACCEL__SGD) {
        bc1 = 1.0 - pow(opt->beta1, (double)opt->n_steps);
        bc2s = sqrt(1.0 - pow(opt->beta2, (double)opt->n_steps));
    }
    accel_status st = ACCEL_OK;
    for (int s = 0; s < opt->n_segments && st == ACCEL_OK; s++) {
        const accel__optim_segment *sg = &opt->segments[s];
        const accel__optim_group *g = &opt->groups[sg->group];
        size_t o = sg->offset, so = sg->state_offset;
        float *master = accel__zero_master_at(m, o, so);
        int refreshed = 0; /* the compute copy of the segment was written with the update */
        if (opt->kind == ACCEL__SGD) {
            accel__sgd_args a = {master,
                                 m->grad + o,
                                 opt->state_a ? opt->state_a + so : NULL,
                                 sg->count,
                                 (float)g->lr,
                                 (float)g->weight_decay,
                                 (float)opt->momentum,
                                 (float)opt->dampening,
                                 opt->nesterov,
                                 opt->maximize,
                                 first};
            st = accel__dev_sgd_step(m->dev, &a, NULL);
        } else {
            /* At stage 0 the kernel also writes the compute copy (one pass over the segment
             * instead of a second kernel reading the master again: 4 bytes an element less). */
            void *fused = m->zero_stage == 0 ? accel__model_compute_fused(m, master, o) : NULL;
            accel__adam_args a = {master,
                                  m->grad + o,
                                  opt->state_a + so,
                                  opt->state_b + so,
                                  opt->state_c ? opt->state_c + so : NULL,
                                  sg->count,
                                  (float)g->lr,
                                  (float)g->weight_decay,
                                  opt->kind == ACCEL__ADAMW,
                                  (float)opt->beta1,
                                  (float)opt->beta2,
                                  (float)opt->eps,
                                  (float)bc1,
                                  (float)bc2s,
                                  opt->maximize,
                                  fused,
                                  m->compute_dtype};
            st = accel__dev_adam_step(m->dev, &a, NULL);
            refreshed = fused != NULL;
        }
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(opt->acc, st);
        }
        /* The working copy follows the master after every real step (llm.c writes its bf16
         * params in the same pass, as Adam does above; SGD's second pass over a segment just
         * updated is cache-warm). Under ZeRO the gather below refreshes it once the other
         * processes' pieces are in. */
        if (m->zero_stage == 0 && !refreshed) {
            st = accel__model_refresh_compute_range(m, o, sg->count);
        }
    }
    if (st == ACCEL_OK && m->zero_stage >= 1) {
        st = accel__zero_gather_master(m);
    }
    return st;
}

accel_status accel_optimizer_step(accel_optimizer *opt)
{
    if (opt == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_optimizer_step: optimizer is NULL");
    }
    accel *acc = opt->acc;
    if (!opt->obj.prepared) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_optimizer_step: the optimizer was not prepared "
                             "(accel_prepare(acc, model, optimizer, ...))");
    }
    if (acc->partial_load[0] != '\0') {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_optimizer_step: refused: %s",
                             acc->partial_load);
    }
    if (!accel__grad_state_sync(acc)) {
        return ACCEL_OK;
    }
    if (opt->segments_dirty) {
        ACCEL_TRY(accel__optim_build_segments(opt));
    }
    const accel__precision_hooks *ph = accel__precision(acc);
    void *pstate = accel__module(acc, ACCEL__MOD_PRECISION);
    int skip = 0;
    accel__prof_begin(acc, "optimizer step", ACCEL__PROF_OPTIM);
    if (ph != NULL && ph->should_skip != NULL) {
        accel_status st = ACCEL_OK;
        if (!opt->unscaled && ph->unscale != NULL) {
            st = ph->unscale(acc, pstate, opt);
        }
        if (st == ACCEL_OK) {
            st = ph->should_skip(acc, pstate, opt, &skip);
        }
        if (st != ACCEL_OK) {
            accel__prof_end(acc);
            return st;
        }
    }
    accel_status st = skip ? ACCEL_OK : optim_update(opt);
    if (st != ACCEL_OK) {
        accel__prof_end(acc);
        return st;
    }
    opt->step_was_skipped = skip;
    opt->unscaled = 0;
    if (ph != NULL && ph->update != NULL) {
        ph->update(acc, pstate, skip);
    }
    accel__prof_end(acc);
    return ACCEL_OK;
}

accel_status accel_optimizer_zero_grad(accel_optimizer *opt)
{
    if (opt == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_optimizer_zero_grad: optimizer is NULL");
    }
    if (!accel__grad_state_sync(opt->acc) || !opt->model->allocated) {
        return ACCEL_OK;
    }
    return accel__model_zero_grad(opt->model);
}

int accel_optimizer_step_was_skipped_opt(const accel_optimizer *opt)
{
    return opt ? opt->step_was_skipped : 0;
}

int accel_optimizer_step_was_skipped(const accel *acc)
{
    if (acc == NULL) {
        return 0;
    }
    for (const accel__object *o = acc->objects; o != NULL; o = o->next) {
        if (o->kind == ACCEL__OBJ_OPTIMIZER && ((const accel_optimizer *)o)->step_was_skipped) {
            return 1;
        }
    }
    return 0;
}

long long accel_optimizer_num_steps(const accel_optimizer *opt)
{
    return opt ? opt->n_steps : 0;
}

/* ---- param groups ---- */

int accel_optimizer_num_groups(const accel_optimizer *opt)
{
    return opt ? opt->n_groups : 0;
}

accel_status accel_optimizer_add_group(accel_optimizer *opt, double lr, double weight_decay,
                                       int *group)
{
    if (opt == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_optimizer_add_group: optimizer is NULL");
    }
    ACCEL_TRY(check_nonneg(opt->acc, "accel_optimizer_add_group", "lr", lr));
    ACCEL_TRY(check_nonneg(opt->acc, "accel_optimizer_add_group", "weight_decay", weight_decay));
    if (opt->n_groups == ACCEL_OPTIM_MAX_GROUPS) {
        return accel__seterr(opt->acc, ACCEL_EINVAL,
                             "accel_optimizer_add_group: at most %d param groups",
                             ACCEL_OPTIM_MAX_GROUPS);
    }
    opt->groups[opt->n_groups].lr = lr;
    opt->groups[opt->n_groups].weight_decay = weight_decay;
    if (group != NULL) {
        *group = opt->n_groups;
    }
    opt->n_groups++;
    return ACCEL_OK;
}

accel_status accel_optimizer_set_param_group(accel_optimizer *opt, int param_index, int group)
{
    if (opt == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_optimizer_set_param_group: optimizer is NULL");
    }
    if (param_index < 0 || param_index >= opt->model->n_params) {
        return accel__seterr(opt->acc, ACCEL_EINVAL,
                             "accel_optimizer_set_param_group: parameter index %d out of range",
                             param_index);
    }
    if (group < 0 || group >= opt->n_groups) {
        return accel__seterr(opt->acc, ACCEL_EINVAL,
                             "accel_optimizer_set_param_group: group %d out of range (%d groups)",
                             group, opt->n_groups);
    }
    opt->param_group[param_index] = group;
    opt->segments_dirty = 1;
    return ACCEL_OK;
}

accel_status accel_optimizer_no_decay_group(accel_optimizer *opt, const char *const *patterns,
                                            int *group)
{
    static const char *const dflt[] = {"bias", "ln_", "norm", "LayerNorm", NULL};
    if (opt == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_optimizer_no_decay_group: optimizer is NULL");
    }
    if (patterns == NULL) {
        patterns = dflt;
    }
    int g;
    ACCEL_TRY(accel_optimizer_add_group(opt, opt->groups[0].lr, 0.0, &g));
    const accel_model *m = opt->model;
    for (int i = 0; i < m->n_params; i++) {
        for (int k = 0; patterns[k] != NULL; k++) {
            if (strstr(m->params[i].name, patterns[k]) != NULL) {
                opt->param_group[i] = g;
                break;
            }
        }
    }
    opt->segments_dirty = 1;
    if (group != NULL) {
        *group = g;
    }
    return ACCEL_OK;
}

double accel_optimizer_get_lr(const accel_optimizer *opt, int group)
{
    if (opt == NULL || group < 0 || group >= opt->n_groups) {
        return NAN;
    }
    return opt->groups[group].lr;
}

accel_status accel_optimizer_set_lr(accel_optimizer *opt, int group, double lr)
{
    if (opt == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_optimizer_set_lr: optimizer is NULL");
    }
    if (group < 0 || group >= opt->n_groups) {
        return accel__seterr(opt->acc, ACCEL_EINVAL,
                             "accel_optimizer_set_lr: group %d out of range (%d groups)", group,
                             opt->n_groups);
    }
    ACCEL_TRY(check_nonneg(opt->acc, "accel_optimizer_set_lr", "lr", lr));
    opt->groups[group].lr = lr;
    return ACCEL_OK;
}
