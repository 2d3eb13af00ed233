/* Schedulers: every curve point by point against its closed form (transformers / torch), and
 * Accelerate's AcceleratedScheduler stepping rules (num_processes ticks per real step,
 * split_batches, accumulation, skipped steps, step_scheduler_with_optimizer, one-cycle cap). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "train/train_internal.h"

static accel *acc;
static accel_model *model;
static accel_optimizer *opt;

static void setup(int accum)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = accum;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK_OK(acc, accel_model_new(acc, &model));
    CHECK_OK(acc, accel_model_add_param(model, "w", 1, (int64_t[]){4}, NULL));
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = 0.5;
    opt = accel_sgd(acc, model, &so);
    CHECK(opt != NULL);
}

static double closed(const accel_scheduler_options *o, long long s, double base)
{
    double W = (double)o->warmup_steps, T = (double)o->total_steps, x = (double)s;
    double warm = x / (W > 1 ? W : 1);
    switch (o->kind) {
    case ACCEL_SCHED_CONSTANT:
        return base;
    case ACCEL_SCHED_CONSTANT_WARMUP:
        return base * (x < W ? warm : 1.0);
    case ACCEL_SCHED_LINEAR:
        return base * (x < W ? warm : fmax(0.0, (T - x) / fmax(1.0, T - W)));
    case ACCEL_SCHED_COSINE:
        return base * (x < W ? warm
                             : fmax(0.0, 0.5 * (1 + cos(M_PI * 2 * o->num_cycles * (x - W) /
                                                        fmax(1.0, T - W)))));
    case ACCEL_SCHED_COSINE_RESTARTS: {
        if (x < W) {
            return base * warm;
        }
        double pr = (x - W) / fmax(1.0, T - W);
        return pr >= 1 ? 0.0
                       : base * fmax(0.0, 0.5 * (1 + cos(M_PI * fmod(o->num_cycles * pr, 1))));
    }
    case ACCEL_SCHED_POLYNOMIAL:
        if (x < W) {
            return base * warm;
        }
        if (x > T) {
            return o->lr_end;
        }
        return (base - o->lr_end) * pow(1 - (x - W) / (T - W), o->power) + o->lr_end;
    case ACCEL_SCHED_STEP:
        return base * pow(o->gamma, floor(x / (double)o->step_size));
    case ACCEL_SCHED_MULTISTEP: {
        int k = 0;
        for (int i = 0; i < o->n_milestones; i++) {
            k += s >= o->milestones[i];
        }
        return base * pow(o->gamma, k);
    }
    case ACCEL_SCHED_ONE_CYCLE: {
        double init = o->max_lr / o->div_factor, mn = init / o->final_div_factor;
        double e1 = o->pct_start * T - 1;
        double a, b, pct;
        if (!o->three_phase) {
            if (x <= e1) {
                a = init, b = o->max_lr, pct = x / e1;
            } else {
                a = o->max_lr, b = mn, pct = (x - e1) / (T - 1 - e1);
            }
        } else {
            double e2 = 2 * o->pct_start * T - 2;
            if (x <= e1) {
                a = init, b = o->max_lr, pct = x / e1;
            } else if (x <= e2) {
                a = o->max_lr, b = init, pct = (x - e1) / (e2 - e1);
            } else {
                a = init, b = mn, pct = (x - e2) / (T - 1 - e2);
            }
        }
        return o->anneal_linear ? a + (b - a) * pct : b + (a - b) / 2 * (1 + cos(M_PI * pct));
    }
    case ACCEL_SCHED_LAMBDA:
        return base * 1.0 / (1.0 + (double)s);
    }
    return NAN;
}

static double inv(long long s, void *ctx)
{
    (void)ctx;
    return 1.0 / (1.0 + (double)s);
}

static void curve(accel_scheduler_options o, long long n)
{
    setup(1);
    accel_scheduler *s = NULL;
    CHECK_OK(acc, accel_scheduler_new(acc, opt, &o, &s));
    for (long long t = 0; t <= n; t++) {
        if (t > 0) {
            CHECK_OK(acc, accel_scheduler_step(s)); /* not prepared: one tick per call */
        }
        double want = closed(&o, t, 0.5);
        CHECK_MSG(fabs(accel_scheduler_get_last_lr(s, 0) - want) <= 1e-12 + 1e-9 * fabs(want),
                  "kind %d step %lld: %.17g vs %.17g", (int)o.kind, t,
                  accel_scheduler_get_last_lr(s, 0), want);
        CHECK(accel_optimizer_get_lr(opt, 0) == accel_scheduler_get_last_lr(s, 0));
    }
    CHECK(accel_scheduler_last_step(s) == n);
    accel_free(acc);
}

static void test_curves(void)
{
    accel_scheduler_options o;
    o = accel_scheduler_options_default(ACCEL_SCHED_CONSTANT);
    curve(o, 5);
    o = accel_scheduler_options_default(ACCEL_SCHED_CONSTANT_WARMUP);
    o.warmup_steps = 4;
    curve(o, 10);
    o = accel_scheduler_options_default(ACCEL_SCHED_LINEAR);
    o.warmup_steps = 3, o.total_steps = 10;
    curve(o, 14);
    o = accel_scheduler_options_default(ACCEL_SCHED_COSINE);
    o.warmup_steps = 2, o.total_steps = 12;
    curve(o, 15);
    o.num_cycles = 1.5;
    curve(o, 15);
    o = accel_scheduler_options_default(ACCEL_SCHED_COSINE_RESTARTS);
    o.warmup_steps = 2, o.total_steps = 20, o.num_cycles = 3;
    curve(o, 22);
    o = accel_scheduler_options_default(ACCEL_SCHED_POLYNOMIAL);
    o.warmup_steps = 2, o.total_steps = 10, o.power = 2.0, o.lr_end = 0.01;
    curve(o, 13);
    o = accel_scheduler_options_default(ACCEL_SCHED_STEP);
    o.step_size = 3, o.gamma = 0.5;
    curve(o, 10);
    o = accel_scheduler_options_default(ACCEL_SCHED_MULTISTEP);
    o.n_milestones = 3, o.milestones[0] = 2, o.milestones[1] = 5, o.milestones[2] = 5;
    o.gamma = 0.3;
    curve(o, 8);
    o = accel_scheduler_options_default(ACCEL_SCHED_ONE_CYCLE);
    o.max_lr = 2.0, o.total_steps = 20;
    curve(o, 20);
    o.anneal_linear = 1, o.three_phase = 1, o.pct_start = 0.25;
    curve(o, 20);
    o = accel_scheduler_options_default(ACCEL_SCHED_LAMBDA);
    o.lambda = inv;
    curve(o, 6);

    /* Bad input. */
    setup(1);
    accel_scheduler *s = NULL;
    o = accel_scheduler_options_default(ACCEL_SCHED_POLYNOMIAL);
    o.total_steps = 10, o.lr_end = 0.5; /* == lr */
    CHECK(accel_scheduler_new(acc, opt, &o, &s) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "lr_end") != NULL);
    o = accel_scheduler_options_default(ACCEL_SCHED_LINEAR);
    CHECK(accel_scheduler_new(acc, opt, &o, &s) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "total_steps") != NULL);
    o = accel_scheduler_options_default(ACCEL_SCHED_LAMBDA);
    CHECK(accel_scheduler_new(acc, opt, &o, &s) == ACCEL_EINVAL);
    o = accel_scheduler_options_default(ACCEL_SCHED_ONE_CYCLE);
    o.max_lr = 1, o.total_steps = 2;
    CHECK_OK(acc, accel_scheduler_new(acc, opt, &o, &s));
    CHECK_OK(acc, accel_scheduler_step(s));
    CHECK_OK(acc, accel_scheduler_step(s));
    CHECK(accel_scheduler_step(s) == ACCEL_EINVAL); /* torch: "Tried to step 3 times" */
    CHECK(s != NULL && accel_scheduler_last_step(s) == 2);
    accel_free(acc);
}

/* One training micro-step: accumulate, (empty) backward, optimizer and scheduler steps. */
static void micro_step(accel_scheduler *s)
{
    CHECK_OK(acc, accel_accumulate(acc, model));
    (void)accel_backward_begin(acc);
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_scheduler_step(s));
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));
}

static void test_stepping_rules(void)
{
    /* Accumulation 2, pretend 3 processes (the scheduler rules only read the count). */
    setup(2);
    accel_scheduler *s = accel_linear_schedule(acc, opt, 0, 100);
    CHECK(s != NULL);
    CHECK_OK(acc, accel_prepare(acc, model, opt, s));
    int saved = acc->n_ranks;
    acc->n_ranks = 3;
    for (int i = 0; i < 4; i++) {
        micro_step(s);
    }
    /* 2 real steps x 3 processes = 6 ticks. */
    CHECK_MSG(accel_scheduler_last_step(s) == 6, "%lld", accel_scheduler_last_step(s));
    CHECK_NEAR(accel_scheduler_get_last_lr(s, 0), 0.5 * (100 - 6) / 100.0, 1e-12);

    /* split_batches: one tick per real step. */
    acc->settings->train.split_batches = 1;
    micro_step(s);
    micro_step(s);
    CHECK(accel_scheduler_last_step(s) == 7);
    acc->settings->train.split_batches = 0;

    /* A skipped optimizer step (fp16 overflow) does not advance the schedule. */
    CHECK_OK(acc, accel_accumulate(acc, model));
    CHECK_OK(acc, accel_accumulate(acc, model));
    CHECK(accel_sync_gradients(acc));
    opt->step_was_skipped = 1;
    CHECK(accel_optimizer_step_was_skipped(acc));
    CHECK_OK(acc, accel_scheduler_step(s));
    CHECK(accel_scheduler_last_step(s) == 7);
    opt->step_was_skipped = 0;

    /* step_scheduler_with_optimizer off: one tick per call, accumulating or not. */
    acc->settings->train.step_scheduler_with_optimizer = 0;
    micro_step(s);
    micro_step(s);
    CHECK(accel_scheduler_last_step(s) == 9);
    acc->settings->train.step_scheduler_with_optimizer = 1;
    acc->n_ranks = saved;
    accel_free(acc);

    /* One-cycle under 4 "processes": stops at total_steps instead of failing. */
    setup(1);
    accel_scheduler_options o = accel_scheduler_options_default(ACCEL_SCHED_ONE_CYCLE);
    o.max_lr = 1.0, o.total_steps = 10;
    CHECK_OK(acc, accel_scheduler_new(acc, opt, &o, &s));
    CHECK_OK(acc, accel_prepare(acc, model, opt, s));
    saved = acc->n_ranks;
    acc->n_ranks = 4;
    for (int i = 0; i < 5; i++) {
        micro_step(s);
    }
    CHECK_MSG(accel_scheduler_last_step(s) == 10, "%lld", accel_scheduler_last_step(s));
    acc->n_ranks = saved;
    accel_free(acc);
}

int main(void)
{
    test_curves();
    test_stepping_rules();
    printf("test_sched: ok\n");
    return 0;
}
