/*
 * Learning-rate schedulers (the transformers schedule functions and torch's StepLR,
 * MultiStepLR, OneCycleLR, LambdaLR) and Accelerate's AcceleratedScheduler stepping rules.
 * Invariant: after every tick each group's lr is a closed-form function of the tick count
 * (last_epoch) and the group's lr at creation, so a schedule is reproducible from its count.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "train_internal.h"

struct accel_scheduler {
    accel__object obj;
    accel *acc;
    accel_optimizer *opt;
    accel_scheduler_options o;
    int n_groups;
    double base_lr[ACCEL_OPTIM_MAX_GROUPS];
    double last_lr[ACCEL_OPTIM_MAX_GROUPS];
    long long last_epoch; /* ticks taken (torch last_epoch) */
    long long step_count; /* torch _step_count: ticks + 1, plus adjust_scheduler's bumps */
};

accel_scheduler_options accel_scheduler_options_default(accel_schedule_kind kind)
{
    accel_scheduler_options o;
    memset(&o, 0, sizeof(o));
    o.size = sizeof(o);
    o.version = ACCEL_SCHEDULER_OPTIONS_VERSION;
    o.kind = kind;
    o.num_cycles = (kind == ACCEL_SCHED_COSINE_RESTARTS) ? 1.0 : 0.5;
    o.power = 1.0;
    o.lr_end = 1e-7;
    o.step_size = 1;
    o.gamma = 0.1;
    o.pct_start = 0.3;
    o.div_factor = 25.0;
    o.final_div_factor = 1e4;
    return o;
}

static double warmup(long long step, long long w)
{
    return (double)step / (double)(w > 1 ? w : 1);
}

/* The multiplier of base_lr at tick `step` (every kind but one-cycle). */
static double factor(const accel_scheduler *s, long long step)
{
    const accel_scheduler_options *o = &s->o;
    long long w = o->warmup_steps, t = o->total_steps;
    switch (o->kind) {
    case ACCEL_SCHED_CONSTANT:
        return 1.0;
    case ACCEL_SCHED_CONSTANT_WARMUP:
        return step < w ? warmup(step, w) : 1.0;
    case ACCEL_SCHED_LINEAR: {
        if (step < w) {
            return warmup(step, w);
        }
        double f = (double)(t - step) / (double)(t - w > 1 ? t - w : 1);
        return f > 0 ? f : 0.0;
    }
    case ACCEL_SCHED_COSINE: {
        if (step < w) {
            return warmup(step, w);
        }
        double progress = (double)(step - w) / (double)(t - w > 1 ? t - w : 1);
        double f = 0.5 * (1.0 + cos(M_PI * o->num_cycles * 2.0 * progress));
        return f > 0 ? f : 0.0;
    }
    case ACCEL_SCHED_COSINE_RESTARTS: {
        if (step < w) {
            return warmup(step, w);
        }
        double progress = (double)(step - w) / (double)(t - w > 1 ? t - w : 1);
        if (progress >= 1.0) {
            return 0.0;
        }
        double f = 0.5 * (1.0 + cos(M_PI * fmod(o->num_cycles * progress, 1.0)));
        return f > 0 ? f : 0.0;
    }
    case ACCEL_SCHED_POLYNOMIAL: {
        double lr_init = s->base_lr[0];
        if (step < w) {
            return warmup(step, w);
        }
        if (step > t) {
            return o->lr_end / lr_init;
        }
        double range = lr_init - o->lr_end;
        double pct_remaining = 1.0 - (double)(step - w) / (double)(t - w);
        return (range * pow(pct_remaining, o->power) + o->lr_end) / lr_init;
    }
    case ACCEL_SCHED_STEP:
        return pow(o->gamma, (double)(step / o->step_size));
    case ACCEL_SCHED_MULTISTEP: {
        int k = 0;
        for (int i = 0; i < o->n_milestones; i++) {
            k += o->milestones[i] <= step;
        }
        return pow(o->gamma, (double)k);
    }
    case ACCEL_SCHED_LAMBDA:
        return o->lambda(step, o->lambda_ctx);
    case ACCEL_SCHED_ONE_CYCLE:
        break;
    }
    return 1.0;
}

/* torch OneCycleLR.get_lr for one group (the same for every group: max_lr is a scalar). */
static double one_cycle_lr(const accel_scheduler *s, long long step)
{
    const accel_scheduler_options *o = &s->o;
    double initial = o->max_lr / o->div_factor;
    double min_lr = initial / o->final_div_factor;
    double total = (double)o->total_steps;
    struct {
        double end_step, start, end;
    } ph[3];
    int n;
    if (o->three_phase) {
        ph[0].end_step = o->pct_start * total - 1;
        ph[0].start = initial;
        ph[0].end = o->max_lr;
        ph[1].end_step = 2 * o->pct_start * total - 2;
        ph[1].start = o->max_lr;
        ph[1].end = initial;
        ph[2].end_step = total - 1;
        ph[2].start = initial;
        ph[2].end = min_lr;
        n = 3;
    } else {
        ph[0].end_step = o->pct_start * total - 1;
        ph[0].start = initial;
        ph[0].end = o->max_lr;
        ph[1].end_step = total - 1;
        ph[1].start = o->max_lr;
        ph[1].end = min_lr;
        n = 2;
    }
    double start_step = 0;
    for (int i = 0; i < n; i++) {
        if ((double)step <= ph[i].end_step || i == n - 1) {
            double pct = ((double)step - start_step) / (ph[i].end_step - start_step);
            if (o->anneal_linear) {
                return (ph[i].end - ph[i].start) * pct + ph[i].start;
            }
            return ph[i].end + (ph[i].start - ph[i].end) / 2.0 * (cos(M_PI * pct) + 1.0);
        }
        start_step = ph[i].end_step;
    }
    return initial;
}

/* Sets every group's lr for tick `step`. */
static void apply(accel_scheduler *s, long long step)
{
    for (int g = 0; g < s->n_groups; g++) {
        double lr = (s->o.kind == ACCEL_SCHED_ONE_CYCLE) ? one_cycle_lr(s, step)
                                                         : s->base_lr[g] * factor(s, step);
        s->last_lr[g] = lr;
        s->opt->groups[g].lr = lr;
    }
}

static accel_status sched_prepare(accel__object *self)
{
    (void)self;
    return ACCEL_OK;
}

static void sched_destroy(accel__object *self)
{
    accel_scheduler_free((accel_scheduler *)self);
}

static accel_status sched_state_save(accel__object *self, accel__state_writer *w);
static accel_status sched_state_load(accel__object *self, accel__state_reader *r);

/* Checkpoints: scheduler[_<i>].json (the end of this file). */
static const accel__object_class sched_class = {
    .prepare = sched_prepare,
    .destroy = sched_destroy,
    .state_save = sched_state_save,
    .state_load = sched_state_load,
    .name = "scheduler",
    .store = ACCEL__STORE_JSON,
};

static accel_status validate(accel *acc, const accel_optimizer *opt,
                             const accel_scheduler_options *o)
{
    const char *who = "accel_scheduler_new";
    if ((int)o->kind < 0 || o->kind > ACCEL_SCHED_LAMBDA) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: unknown kind %d", who, (int)o->kind);
    }
    if (o->warmup_steps < 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: warmup_steps=%lld is negative", who,
                             o->warmup_steps);
    }
    int needs_total = o->kind == ACCEL_SCHED_LINEAR || o->kind == ACCEL_SCHED_COSINE ||
                      o->kind == ACCEL_SCHED_COSINE_RESTARTS || o->kind == ACCEL_SCHED_POLYNOMIAL ||
                      o->kind == ACCEL_SCHED_ONE_CYCLE;
    if (needs_total && o->total_steps <= 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: total_steps=%lld must be positive", who,
                             o->total_steps);
    }
    switch (o->kind) {
    case ACCEL_SCHED_POLYNOMIAL:
        if (!(o->lr_end < opt->groups[0].lr)) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "%s: lr_end (%g) must be smaller than the initial lr (%g)", who,
                                 o->lr_end, opt->groups[0].lr);
        }
        if (o->total_steps <= o->warmup_steps) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "%s: total_steps (%lld) must exceed warmup_steps (%lld)", who,
                                 o->total_steps, o->warmup_steps);
        }
        break;
    case ACCEL_SCHED_STEP:
        if (o->step_size <= 0) {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: step_size=%lld must be positive", who,
                                 o->step_size);
        }
        break;
    case ACCEL_SCHED_MULTISTEP:
        if (o->n_milestones < 0 || o->n_milestones > ACCEL_SCHED_MAX_MILESTONES) {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: n_milestones=%d is not in 0..%d", who,
                                 o->n_milestones, ACCEL_SCHED_MAX_MILESTONES);
        }
        for (int i = 1; i < o->n_milestones; i++) {
            if (o->milestones[i] < o->milestones[i - 1]) {
                return accel__seterr(acc, ACCEL_EINVAL, "%s: milestones are not sorted (at %d)",
                                     who, i);
            }
        }
        break;
    case ACCEL_SCHED_ONE_CYCLE:
        if (!(o->max_lr > 0) || !(o->pct_start > 0 && o->pct_start < 1) || !(o->div_factor > 0) ||
            !(o->final_div_factor > 0)) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "%s: one-cycle needs max_lr > 0, pct_start in (0, 1), "
                                 "div_factor > 0, final_div_factor > 0 (got %g, %g, %g, %g)",
                                 who, o->max_lr, o->pct_start, o->div_factor, o->final_div_factor);
        }
        break;
    case ACCEL_SCHED_LAMBDA:
        if (o->lambda == NULL) {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: lambda kind without a lambda", who);
        }
        break;
    default:
        break;
    }
    if (!(o->gamma >= 0)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: gamma=%g is negative", who, o->gamma);
    }
    return ACCEL_OK;
}

accel_status accel_scheduler_new(accel *acc, accel_optimizer *opt,
                                 const accel_scheduler_options *opts, accel_scheduler **out)
{
    if (acc == NULL || opt == NULL || opts == NULL || out == NULL || opt->acc != acc) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_scheduler_new: acc, optimizer (of this accelerator), options "
                             "and out must be given");
    }
    accel_scheduler_options d = accel_scheduler_options_default(ACCEL_SCHED_CONSTANT);
    ACCEL_TRY(ACCEL__OPTIONS_COPY(acc, "accel_scheduler_new", accel_scheduler_options, &d, opts,
                                  lambda_ctx));
    const accel_scheduler_options *o = &d;
    ACCEL_TRY(validate(acc, opt, o));
    accel_scheduler *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_scheduler_new: out of memory");
    }
    s->acc = acc;
    s->opt = opt;
    s->o = *o;
    s->n_groups = opt->n_groups;
    for (int g = 0; g < s->n_groups; g++) {
        s->base_lr[g] = opt->groups[g].lr;
    }
    /* torch's constructor takes the first tick: last_epoch 0, _step_count 1. */
    s->last_epoch = 0;
    s->step_count = 1;
    apply(s, 0);
    accel__object_register(acc, &s->obj, ACCEL__OBJ_SCHEDULER, &sched_class);
    *out = s;
    return ACCEL_OK;
}

static accel_scheduler *make(accel *acc, accel_optimizer *opt, accel_schedule_kind kind,
                             long long warmup_steps, long long total)
{
    accel_scheduler_options o = accel_scheduler_options_default(kind);
    o.warmup_steps = warmup_steps;
    o.total_steps = total;
    accel_scheduler *s = NULL;
    return accel_scheduler_new(acc, opt, &o, &s) == ACCEL_OK ? s : NULL;
}

accel_scheduler *accel_constant_schedule(accel *acc, accel_optimizer *opt, long long warmup_steps)
{
    return make(acc, opt, warmup_steps > 0 ? ACCEL_SCHED_CONSTANT_WARMUP : ACCEL_SCHED_CONSTANT,
                warmup_steps, 0);
}

accel_scheduler *accel_linear_schedule(accel *acc, accel_optimizer *opt, long long warmup_steps,
                                       long long total_steps)
{
    return make(acc, opt, ACCEL_SCHED_LINEAR, warmup_steps, total_steps);
}

accel_scheduler *accel_cosine_schedule(accel *acc, accel_optimizer *opt, long long warmup_steps,
                                       long long total_steps)
{
    return make(acc, opt, ACCEL_SCHED_COSINE, warmup_steps, total_steps);
}

void accel_scheduler_free(accel_scheduler *s)
{
    if (s == NULL) {
        return;
    }
    accel__object_unregister(&s->obj);
    accel__free(s);
}

/* One torch scheduler.step(). */
static accel_status tick(accel_scheduler *s)
{
    if (s->o.kind == ACCEL_SCHED_ONE_CYCLE && s->last_epoch + 1 > s->o.total_steps) {
        return accel__seterr(s->acc, ACCEL_EINVAL,
                             "accel_scheduler_step: tried to step %lld times; the one-cycle "
                             "schedule has total_steps=%lld",
                             s->last_epoch + 1, s->o.total_steps);
    }
    s->last_epoch++;
    s->step_count++;
    apply(s, s->last_epoch);
    return ACCEL_OK;
}

accel_status accel_scheduler_step(accel_scheduler *s)
{
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_scheduler_step: scheduler is NULL");
    }
    accel *acc = s->acc;
    if (!s->obj.prepared || acc->settings->train.step_scheduler_with_optimizer == 0) {
        return tick(s);
    }
    if (!accel__grad_state_sync(acc)) {
        if (acc->settings->train.adjust_scheduler == 1) {
            s->step_count++;
        }
        return ACCEL_OK;
    }
    if (s->opt->step_was_skipped) {
        return ACCEL_OK;
    }
    if (acc->settings->train.split_batches == 1) {
        return tick(s);
    }
    for (int i = 0; i < acc->n_ranks; i++) {
        /* OneCycle without drop_last: Accelerate stops at total_steps instead of raising. */
        if (s->o.kind == ACCEL_SCHED_ONE_CYCLE && s->step_count > s->o.total_steps) {
            continue;
        }
        ACCEL_TRY(tick(s));
    }
    return ACCEL_OK;
}

double accel_scheduler_get_last_lr(const accel_scheduler *s, int group)
{
    if (s == NULL || group < 0 || group >= s->n_groups) {
        return NAN;
    }
    return s->last_lr[group];
}

long long accel_scheduler_last_step(const accel_scheduler *s)
{
    return s ? s->last_epoch : 0;
}

/* ---- the state protocol: scheduler[_<i>].json, torch's state_dict fields ---- */

static accel_status sched_state_save(accel__object *self, accel__state_writer *w)
{
    accel_scheduler *s = (accel_scheduler *)self;
    ACCEL_TRY(accel__state_put_i64(w, "kind", (int64_t)s->o.kind));
    ACCEL_TRY(accel__state_put_i64(w, "last_epoch", s->last_epoch));
    ACCEL_TRY(accel__state_put_i64(w, "_step_count", s->step_count));
    ACCEL_TRY(accel__state_put_f64s(w, "base_lrs", s->base_lr, (size_t)s->n_groups));
    return accel__state_put_f64s(w, "_last_lr", s->last_lr, (size_t)s->n_groups);
}

typedef struct sched_staged {
    int64_t last_epoch, step_count;
    double base_lr[ACCEL_OPTIM_MAX_GROUPS], last_lr[ACCEL_OPTIM_MAX_GROUPS];
} sched_staged;

/* Restores the counters and lrs, and writes last_lr into the optimizer's groups (after the
 * optimizer's own load: kinds apply in order). */
static void sched_apply(accel__object *self, void *data)
{
    accel_scheduler *s = (accel_scheduler *)self;
    const sched_staged *in = data;
    s->last_epoch = in->last_epoch;
    s->step_count = in->step_count;
    for (int g = 0; g < s->n_groups; g++) {
        s->base_lr[g] = in->base_lr[g];
        s->last_lr[g] = in->last_lr[g];
        s->opt->groups[g].lr = in->last_lr[g];
    }
}

static accel_status sched_state_load(accel__object *self, accel__state_reader *r)
{
    accel_scheduler *s = (accel_scheduler *)self;
    sched_staged *in = accel__state_stage(r, sizeof(*in), sched_apply);
    if (in == NULL) {
        return ACCEL_ENOMEM;
    }
    int64_t kind;
    size_t n_groups;
    ACCEL_TRY(accel__state_get_i64(r, "kind", INT32_MIN, INT32_MAX, &kind));
    ACCEL_TRY(accel__state_get_i64(r, "last_epoch", 0, ACCEL__STATE_COUNT_MAX, &in->last_epoch));
    ACCEL_TRY(accel__state_get_i64(r, "_step_count", 0, ACCEL__STATE_COUNT_MAX, &in->step_count));
    ACCEL_TRY(accel__state_get_len(r, "base_lrs", &n_groups));
    if (kind != (int64_t)s->o.kind || n_groups != (size_t)s->n_groups) {
        return accel__state_fail(r, ACCEL_EINVAL,
                                 "scheduler kind %lld with %zu groups; the live scheduler is kind "
                                 "%d with %d groups",
                                 (long long)kind, n_groups, (int)s->o.kind, s->n_groups);
    }
    ACCEL_TRY(accel__state_get_f64s(r, "base_lrs", 0, DBL_MAX, in->base_lr, n_groups));
    return accel__state_get_f64s(r, "_last_lr", 0, DBL_MAX, in->last_lr, n_groups);
}
