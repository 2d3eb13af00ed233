/*
 * bench/mp: mixed precision costs and savings, each mode against fp32 measured in the same
 * run (machine load cancels out as far as possible).
 *
 *  1. GPT training step through accel (accel_prepare, accel_backward, AdamW step, working-copy
 *     refresh) with mixed_precision no / bf16 / fp16, bench/gpt_step's configuration (4
 *     layers, width 256, 4 heads, context 128, vocab 4096, batch 8): median step time and
 *     tokens/s, and the ratio to fp32. On CPU the products stay fp32 (OpenBLAS sgemm), so this
 *     measures the emulation's overhead (rounding inputs and gradient contributions), not a
 *     speed-up.
 *  2. With 2+ processes (accel launch -n 2 build/bench/mp): a gradient-sized bucketed backward
 *     (every bucket all-reduced, AVG) in fp32 vs comm_dtype bf16 (the all-reduce's wire dtype:
 *     the result of compress -> fp32 reduction -> decompress, rounded inside the reduction on
 *     shm): median time per backward and the ratio.
 *
 * Usage: mp [--steps N] [--mb GRADIENT_MIB] [--iters N] [--skip-gpt]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "accel/check.h"
#include "accel/nn.h"
#include "bench.h"
#include "core/internal.h"

/* Median step time of GPT training under mixed precision mp. */
static double gpt_step(accel_precision mp, int steps, int *skipped)
{
    accel_options o = accel_options_default();
    o.mixed_precision = mp;
    accel *acc;
    ACCEL_CHECK(accel_init(&acc, &o));
    nn_gpt_config cfg = bench_gpt_config();
    const int B = 8, T = cfg.block_size;
    accel_model *m;
    ACCEL_CHECK(accel_model_new(acc, &m));
    nn_params *p;
    nn_gpt *gpt;
    /* the CPU benchmark: the model stays in host memory in a CUDA build too */
    ACCEL_CHECK(accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 0}));
    ACCEL_CHECK(nn_params_for_model(&p, m));
    ACCEL_CHECK(nn_gpt_declare(&gpt, p, &cfg));
    ACCEL_CHECK(nn_params_bind(p));
    ACCEL_CHECK(nn_params_init(p, 1));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 3e-4;
    accel_optimizer *opt;
    ACCEL_CHECK(accel_adamw_new(acc, m, &ao, &opt));
    ACCEL_CHECK(accel_prepare(acc, m, opt));
    nn_ctx *g;
    ACCEL_CHECK(nn_ctx_new(&g));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * T));
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
    double *t = malloc(sizeof(double) * (size_t)steps);
    if (ids == NULL || tg == NULL || t == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    uint64_t s = 42;
    *skipped = 0;
    for (int step = -2; step < steps; step++) { /* two warm-up steps */
        for (int i = 0; i < B * T; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab_size);
            tg[i] = (int32_t)((s >> 13) % (uint64_t)cfg.vocab_size);
        }
        double t0 = accel__now();
        ACCEL_CHECK(accel_accumulate(acc, m));
        nn_tensor *loss;
        ACCEL_CHECK(nn_gpt_forward(g, gpt, ids, tg, B, T, NULL, &loss));
        ACCEL_CHECK(accel_backward(acc, loss));
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        if (step >= 0) {
            t[step] = accel__now() - t0;
            *skipped += accel_optimizer_step_was_skipped(acc);
        }
    }
    double med = bench_median(t, steps);
    free(ids);
    free(tg);
    free(t);
    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(p);
    accel_free(acc);
    return med;
}

/* Median time of one communicating backward over a gradient of `mib` MiB (fp32). */
static double allreduce_backward(int comm_dtype, double mib, int iters, int *n_ranks)
{
    accel_options o = accel_options_default();
    o.comm_dtype = comm_dtype;
    accel *acc;
    ACCEL_CHECK(accel_init(&acc, &o));
    *n_ranks = accel_num_processes(acc);
    accel_model *m;
    ACCEL_CHECK(accel_model_new(acc, &m));
    /* 16 parameters of equal size, so the default 1 / 25 MiB buckets form as in a model. */
    int64_t each = (int64_t)(mib * 1048576.0 / 4 / 16);
    for (int i = 0; i < 16; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        ACCEL_CHECK(accel_model_add_param(m, name, 1, &each, NULL));
    }
    ACCEL_CHECK(accel_prepare(acc, m));
    float *grad = accel_model_grad(m);
    size_t n = accel_model_numel(m);
    for (size_t j = 0; j < n; j++) {
        grad[j] = (float)(j % 1000) * 1e-3f;
    }
    double *t = malloc(sizeof(double) * (size_t)iters);
    if (t == NULL) {
        exit(1);
    }
    for (int it = -2; it < iters; it++) {
        ACCEL_CHECK(accel_wait_for_everyone(acc));
        double t0 = accel__now();
        (void)accel_backward_begin(acc);
        for (int i = 15; i >= 0; i--) {
            ACCEL_CHECK(accel_grad_ready(m, i));
        }
        ACCEL_CHECK(accel_backward_end(acc));
        if (it >= 0) {
            t[it] = accel__now() - t0;
        }
    }
    double med = bench_median(t, iters);
    free(t);
    accel_free(acc);
    return med;
}

int main(int argc, char **argv)
{
    int steps = 10, iters = 20, skip_gpt = 0;
    double mib = 32;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) {
            mib = atof(argv[++i]);
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--skip-gpt") == 0) {
            skip_gpt = 1;
        } else {
            fprintf(stderr, "usage: mp [--steps N] [--mb GRADIENT_MIB] [--iters N] [--skip-gpt]\n");
            return 2;
        }
    }
    if (steps < 1 || iters < 1 || !(mib > 0)) {
        fprintf(stderr, "mp: --steps, --iters and --mb must be positive\n");
        return 2;
    }
    const char *rank_env = getenv("RANK");
    int world = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 1;
    int main_proc = rank_env == NULL || atoi(rank_env) == 0;
    if (!skip_gpt && world == 1) {
        /* Two interleaved rounds, best of each mode: a load spike hits one round, not a mode. */
        int sk32 = 0, skbf = 0, sk16 = 0, sk;
        double t32 = 1e30, tbf = 1e30, t16 = 1e30, v;
        for (int round = 0; round < 2; round++) {
            v = gpt_step(ACCEL_PRECISION_NO, steps, &sk);
            t32 = v < t32 ? v : t32;
            v = gpt_step(ACCEL_PRECISION_BF16, steps, &sk);
            tbf = v < tbf ? v : tbf;
            skbf += sk;
            v = gpt_step(ACCEL_PRECISION_FP16, steps, &sk);
            t16 = v < t16 ? v : t16;
            sk16 += sk;
        }
        (void)sk32;
        (void)skbf;
        double tokens = 8.0 * 128.0;
        printf("gpt_step (4x256, T 128, vocab 4096, batch 8), best of 2 medians of %d steps:\n",
               steps);
        printf("  fp32  %8.1f ms  %8.0f tokens/s\n", 1e3 * t32, tokens / t32);
        printf("  bf16  %8.1f ms  %8.0f tokens/s  %.2f x fp32\n", 1e3 * tbf, tokens / tbf,
               t32 / tbf);
        printf("  fp16  %8.1f ms  %8.0f tokens/s  %.2f x fp32  (%d skipped steps)\n", 1e3 * t16,
               tokens / t16, t32 / t16, sk16);
    }
    if (world > 1) {
        int n = 1;
        double t32 = allreduce_backward(-1, mib, iters, &n);
        double tbf = allreduce_backward(ACCEL_BF16, mib, iters, &n);
        if (main_proc) {
            printf("bucketed gradient all-reduce, %.0f MiB fp32 gradient, %d processes, median of "
                   "%d:\n",
                   mib, n, iters);
            printf("  fp32              %8.2f ms  %6.2f GB/s (gradient bytes / time)\n", 1e3 * t32,
                   mib * 1048576.0 / t32 / 1e9);
            printf("  bf16 wire         %8.2f ms  %6.2f GB/s  %.2f x fp32\n", 1e3 * tbf,
                   mib * 1048576.0 / tbf / 1e9, t32 / tbf);
        }
    } else {
        printf("(run under `accel launch -n 2` for the compressed all-reduce comparison)\n");
    }
    return 0;
}
