/* ACCEL_TEST_NPROCS: 1 2
 *
 * The fp16 loss scaler (GradScaler semantics) on a scripted run with injected infinities:
 *  - the backward seed is the scale (x 1/accumulation), the scale sequence follows
 *    backoff 0.5 on every overflow and growth x2 after growth_interval (3 here) clean steps;
 *  - an inf (or NaN) on ONE process only makes every process skip the same step;
 *  - a skipped step leaves the weights untouched, sets accel_optimizer_step_was_skipped and
 *    does not advance the scheduler; clean steps apply the unscaled gradient exactly (the scale
 *    is a power of two), also when clipping unscaled first (unscale happens once per step);
 *  - options validation, the checkpoint getters/setters, and bf16: no scaler, nothing skipped;
 *  - a resumed run takes the saved growth factor, backoff factor and interval with the scale
 *    and the tracker (torch's GradScaler.load_state_dict), whatever its own options say.
 */
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/internal.h"
#include "train/train_internal.h"

#define N 8
#define STEPS 12
#define LR 0.125

/* The model's working copy (stored in the compute dtype) widened to fp32. */
static void compute_f32(const accel_model *m, float *out, size_t n)
{
    accel_tensor c;
    CHECK_OK(NULL, accel_model_compute_view(m, &c));
    CHECK(c.ndim == 1 && (size_t)c.shape[0] >= n);
    CHECK_OK(NULL, accel_convert(out, ACCEL_F32, c.data, c.dtype, n));
}

static double base_grad(int j)
{
    return 0.25 * (j + 1) - 1.0; /* exactly representable */
}

/* Steps with an overflow, and which process sees it (-1: all). */
static int inject_rank(int step, int n_ranks)
{
    switch (step) {
    case 1:
        return n_ranks - 1; /* only the last process */
    case 5:
        return 0;
    case 6:
        return -1;
    default:
        return -2; /* clean */
    }
}

static void run_fp16(int accum)
{
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_FP16;
    o.init_scale = 1024;
    o.growth_interval = 3;
    o.gradient_accumulation_steps = accum;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    CHECK(accel_loss_scale(acc) == 1.0); /* no scaler before a model is prepared */

    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){N}, NULL));
    const accel_param *w = accel_model_param(m, 0);
    for (int j = 0; j < N; j++) {
        w->data[j] = 1.0f + (float)j;
    }
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    accel_optimizer *opt;
    CHECK_OK(acc, accel_sgd_new(acc, m, &so, &opt));
    accel_scheduler *sch = accel_constant_schedule(acc, opt, 0);
    CHECK(sch != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt, sch));
    CHECK(accel_loss_scale(acc) == 1024.0);
    CHECK(accel_model_compute_dtype(m) == ACCEL_F16);

    double scale = 1024, expect_w[N];
    int tracker = 0;
    long long ticks = 0;
    for (int j = 0; j < N; j++) {
        expect_w[j] = 1.0 + j;
    }
    const double expect_scales[STEPS] = {1024, 1024, 512, 512, 512, 1024,
                                         512,  256,  256, 256, 512, 512};
    for (int step = 0; step < STEPS; step++) {
        CHECK_NEAR(accel_loss_scale(acc), expect_scales[step], 0);
        CHECK_NEAR(scale, expect_scales[step], 0);
        int who = inject_rank(step, n);
        for (int micro = 0; micro < accum; micro++) {
            CHECK_OK(acc, accel_accumulate(acc, m));
            /* Step 1 keeps its gradients local, so only the flag all-reduce can tell the
             * other processes about the overflow. */
            if (step == 1) {
                CHECK_OK(acc, accel_no_sync_begin(acc, m));
            }
            double seed = accel_backward_begin(acc);
            CHECK_NEAR(seed, scale / accum, 0);
            for (int j = 0; j < N; j++) {
                w->grad[j] += (float)(seed * base_grad(j));
            }
            if (micro == accum - 1 && (who == -1 || who == rank)) {
                w->grad[3] = (step == 5) ? NAN : INFINITY;
            }
            CHECK_OK(acc, accel_grad_ready(m, 0));
            CHECK_OK(acc, accel_backward_end(acc));
            if (step == 1) {
                CHECK_OK(acc, accel_no_sync_end(acc, m));
            }
            if (micro < accum - 1) {
                CHECK(!accel_sync_gradients(acc));
                CHECK_OK(acc, accel_optimizer_step(opt)); /* no-op while accumulating */
                CHECK_OK(acc, accel_scheduler_step(sch));
                CHECK_OK(acc, accel_optimizer_zero_grad(opt));
            }
        }
        CHECK(accel_sync_gradients(acc));
        int overflow = who != -2;
        if (step % 2 == 0) {
            double norm = 0;
            CHECK_OK(acc, accel_clip_grad_norm(acc, m, 1e9, 2.0, &norm));
            if (!overflow) {
                double ref = 0;
                for (int j = 0; j < N; j++) {
                    ref += base_grad(j) * base_grad(j);
                }
                CHECK_NEAR(norm, sqrt(ref), 1e-6); /* unscaled before the norm */
            }
        }
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_scheduler_step(sch));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        CHECK_MSG(accel_optimizer_step_was_skipped(acc) == overflow, "step %d rank %d", step, rank);
        if (overflow) {
            scale *= 0.5;
            tracker = 0;
        } else {
            for (int j = 0; j < N; j++) {
                expect_w[j] -= LR * base_grad(j);
            }
            ticks += n;
            if (++tracker == 3) {
                scale *= 2;
                tracker = 0;
            }
        }
        for (int j = 0; j < N; j++) {
            CHECK_MSG(w->data[j] == (float)expect_w[j], "step %d w[%d] = %.9g, expected %.9g", step,
                      j, w->data[j], expect_w[j]);
        }
        /* The working copy follows the master (these values are exact in f16). */
        float cw[N];
        compute_f32(m, cw, N);
        CHECK(memcmp(cw, w->data, N * sizeof(float)) == 0);
        CHECK(accel_scheduler_last_step(sch) == ticks);
    }
    CHECK_NEAR(accel_loss_scale(acc), 512, 0);

    /* Checkpoint getters / setters. */
    double s;
    long long t;
    CHECK(accel__scaler_get(acc, &s, &t) == 1);
    CHECK(s == 512 && t == 2);
    CHECK_OK(acc, accel__scaler_set(acc, 4096, 2));
    CHECK(accel_loss_scale(acc) == 4096);
    CHECK(accel__scaler_set(acc, -1, 0) == ACCEL_EINVAL);
    CHECK(accel__scaler_set(acc, INFINITY, 0) == ACCEL_EINVAL);
    /* One more clean step completes the interval from the restored tracker: 4096 -> 8192. */
    CHECK_OK(acc, accel_accumulate(acc, NULL));
    for (int micro = 0; micro < accum; micro++) {
        if (micro > 0) {
            CHECK_OK(acc, accel_accumulate(acc, NULL));
        }
        double seed = accel_backward_begin(acc);
        w->grad[0] += (float)seed;
        CHECK_OK(acc, accel_backward_end(acc));
    }
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK(!accel_optimizer_step_was_skipped(acc));
    CHECK(accel_loss_scale(acc) == 8192);
    if (rank == 0) {
        printf("fp16 scaler, accumulation %d, %d processes: scales and skips as scripted\n", accum,
               n);
    }
    accel_free(acc);
}

static void run_bf16(void)
{
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_BF16;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){N}, NULL));
    const accel_param *w = accel_model_param(m, 0);
    for (int j = 0; j < N; j++) {
        w->data[j] = 1.0f + 1.0f / 1024 * (float)j; /* not all exact in bf16 */
    }
    accel_tensor cv;
    CHECK(accel_model_compute_view(m, &cv) == ACCEL_ESTATE); /* not valid before prepare */
    CHECK(w->compute_view.data == NULL && w->compute_view.dtype == ACCEL_BF16);
    accel_optimizer *opt = accel_sgd(acc, m, NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    CHECK(accel_model_compute_dtype(m) == ACCEL_BF16);
    /* Stored in bf16: 2 bytes per parameter, no fp32 pointer to it. */
    CHECK(accel_model_compute(m) == NULL && accel_last_status(acc) == ACCEL_ESTATE);
    CHECK_OK(acc, accel_model_compute_view(m, &cv));
    CHECK(cv.dtype == ACCEL_BF16 && cv.data != NULL && cv.data == w->compute_view.data);
    const uint16_t *c = cv.data;
    for (int j = 0; j < N; j++) {
        uint16_t h;
        CHECK_OK(NULL, accel_convert(&h, ACCEL_BF16, &w->data[j], ACCEL_F32, 1));
        CHECK(c[j] == h);
    }
    CHECK(accel_loss_scale(acc) == 1.0);
    CHECK(accel_backward_begin(acc) == 1.0);
    w->grad[0] = INFINITY;
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK(!accel_optimizer_step_was_skipped(acc)); /* bf16 never skips */
    accel_free(acc);
}

static void bad_options(void)
{
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_FP16;
    o.backoff_factor = 2.0;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){N}, NULL));
    CHECK(accel_prepare(acc, m) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "backoff_factor") != NULL);
    accel_free(acc);

    o = accel_options_default();
    o.comm_dtype = ACCEL_I8;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){N}, NULL));
    CHECK(accel_prepare(acc, m) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "comm_dtype") != NULL);
    accel_free(acc);
}

/* One fp16 run of a model of one parameter "w" (SGD), prepared with the scaler's options. */
static accel *scaler_run(double init_scale, double growth, double backoff, int interval,
                         accel_model **m, accel_optimizer **opt)
{
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_FP16;
    o.init_scale = init_scale;
    o.growth_factor = growth;
    o.backoff_factor = backoff;
    o.growth_interval = interval;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK_OK(acc, accel_model_new(acc, m));
    CHECK_OK(acc, accel_model_add_param(*m, "w", 1, (int64_t[]){N}, NULL));
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    CHECK_OK(acc, accel_sgd_new(acc, *m, &so, opt));
    CHECK_OK(acc, accel_prepare(acc, *m, *opt));
    return acc;
}

/* A step with finite gradients: the scaler's tracker advances. */
static void clean_step(accel *acc, accel_model *m, accel_optimizer *opt)
{
    const accel_param *w = accel_model_param(m, 0);
    CHECK_OK(acc, accel_accumulate(acc, m));
    double seed = accel_backward_begin(acc);
    for (int j = 0; j < N; j++) {
        w->grad[j] += (float)(seed * base_grad(j));
    }
    CHECK_OK(acc, accel_grad_ready(m, 0));
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));
}

static void resume_factors(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/accel_test_scaler_%d", (int)getppid());
    accel_model *m;
    accel_optimizer *opt;
    /* Saved after two clean steps of an interval of 3: the next clean step grows the scale. */
    accel *acc = scaler_run(1024, 2.0, 0.5, 3, &m, &opt);
    clean_step(acc, m, opt);
    clean_step(acc, m, opt);
    CHECK(accel_loss_scale(acc) == 1024.0);
    CHECK_OK(acc, accel_save_state(acc, dir));
    accel_free(acc);

    acc = scaler_run(8, 4.0, 0.25, 1000, &m, &opt);
    CHECK_OK(acc, accel_load_state(acc, dir));
    CHECK(accel_loss_scale(acc) == 1024.0);
    clean_step(acc, m, opt);
    CHECK_MSG(accel_loss_scale(acc) == 2048.0,
              "after the resumed run's first clean step the scale is %g, expected 2048 (the "
              "saved interval 3 and factor 2, not this run's 1000 and 4)",
              accel_loss_scale(acc));
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (accel_process_index(acc) == 0) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    accel_free(acc);
}

int main(void)
{
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    unsetenv("ACCELERATE_MIXED_PRECISION");
    run_fp16(1);
    run_fp16(2);
    run_bf16();
    bad_options();
    resume_factors();
    return 0;
}
