/*
 * bench/gpt_step: one GPT training step (forward, backward, AdamW) on synthetic tokens, in
 * the configuration: 4 layers, width 256, 4 heads, context 128, vocab 4096, pre-LN,
 * exact GELU, MLP 4x, untied head, AdamW lr 3e-4, batch 8 sequences per process, fp32,
 * 1 thread per process.
 *
 * Prints the median step time, tokens/s and achieved FLOP/s, and that FLOP/s as a fraction
 * of OpenBLAS sgemm on 1024x1024x1024 measured in the same run (so machine load cancels
 * out as far as possible). FLOPs counted: 6 x matmul parameters per token + 12 x L x T x C
 * per token for attention (the usual model-FLOPs convention; the causal half is counted).
 *
 * The model lives in an accel_model, gradients go through accel_backward (bucketed all-reduce
 * overlapped with backward when there are several processes) and accel_adamw steps them, so
 * the numbers are those of a real training loop. The 1-process figure is measured in the same
 * run with the same code path: rounds alternate K steps of process 0 ALONE under no_sync (the
 * other processes sleep in a barrier, futex-waiting, so their cores are free) with K
 * synchronised steps of every process. Scaling efficiency = N-process tokens/s / (N x 1-process
 * tokens/s) = t(alone) / t(N processes). Run alone it reports the 1-process figures.
 *
 * Usage: [accel launch -n 2] gpt_step [--steps N] [--batch B] [--threads N]
 *        (threads: BLAS/OpenMP threads when run as 1 process)
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "accel/check.h"
#include "accel/nn.h"
#include "bench.h"
#include "core/internal.h"
#ifdef ACCEL_HAVE_OPENMP
#include <omp.h>
#endif

/* Seconds of one C = A B on 1024^3 (buffers allocated by the caller). */
static double sgemm_once(const float *a, const float *b, float *c)
{
    const int n = 1024;
    double t0 = accel__now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return accel__now() - t0;
}

/* Synthetic tokens (different per process) and next-token targets. */
static void synthetic_tokens(int32_t *ids, int32_t *tg, long count, int vocab, int rank)
{
    uint64_t s = 88172645463325252ull + 7919ull * (uint64_t)rank;
    for (long i = 0; i < count; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        ids[i] = (int32_t)(s % (uint64_t)vocab);
    }
    for (long i = 0; i < count; i++) {
        tg[i] = ids[(i + 1) % count];
    }
}

/* One step through accel: forward, accel_backward (all-reduce unless no_sync), AdamW. Writes
 * the forward, backward (with its communication) and optimizer seconds to t[0..2]. */
static void accel_step(accel *acc, nn_ctx *g, nn_gpt *m, accel_optimizer *opt, const int32_t *ids,
                       const int32_t *tg, int batch, int T, float *loss_out, double t[3])
{
    double t0 = accel__now();
    nn_tensor *loss = NULL;
    ACCEL_CHECK(nn_gpt_forward(g, m, ids, tg, batch, T, NULL, &loss));
    double t1 = accel__now();
    ACCEL_CHECK(accel_backward(acc, loss));
    double t2 = accel__now();
    ACCEL_CHECK(accel_optimizer_step(opt));
    ACCEL_CHECK(accel_optimizer_zero_grad(opt));
    *loss_out = nn_item(loss);
    t[0] = t1 - t0;
    t[1] = t2 - t1;
    t[2] = accel__now() - t2;
}

/* The multi-process mode (see the top of the file). */
static int run_distributed(accel *acc, int steps, int batch)
{
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    nn_gpt_config cfg = bench_gpt_config();
    const int T = cfg.block_size, K = 2, warmup = 2;
    int rounds = (steps + K - 1) / K;
    accel_model *model;
    nn_params *p;
    nn_gpt *m;
    ACCEL_CHECK(accel_model_new(acc, &model));
    ACCEL_CHECK(nn_params_for_model(&p, model));
    ACCEL_CHECK(nn_gpt_declare(&m, p, &cfg));
    ACCEL_CHECK(nn_params_bind(p));
    ACCEL_CHECK(nn_params_init(p, 1234));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 3e-4;
    accel_optimizer *opt = accel_adamw(acc, model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, model, opt));
    int n_buckets = accel_model_num_buckets(model);

    int32_t *ids = malloc((size_t)batch * T * sizeof(int32_t));
    int32_t *tg = malloc((size_t)batch * T * sizeof(int32_t));
    synthetic_tokens(ids, tg, (long)batch * T, cfg.vocab_size, rank);
    const int gn = 1024;
    float *ga = malloc((size_t)gn * gn * sizeof(float)),
          *gb = malloc((size_t)gn * gn * sizeof(float));
    float *gc = malloc((size_t)gn * gn * sizeof(float));
    for (long i = 0; i < (long)gn * gn; i++) {
        ga[i] = (float)(i % 7) * 0.1f;
        gb[i] = (float)(i % 5) * 0.1f;
    }
    nn_ctx *g;
    ACCEL_CHECK(nn_ctx_new(&g));
    int total = rounds * K;
    /* tm[q * total + i]: q = 0..2 forward, backward, optimizer and 3 the whole step of process 0
     * alone; q = 4..7 the same with every process. */
    double *tm = malloc((size_t)(8 * total) * sizeof(double));
    double *tgemm = malloc((size_t)total * sizeof(double));
    ACCEL_CHECK(tm && tgemm ? ACCEL_OK : ACCEL_ENOMEM);
    float loss = 0, loss_first = 0;
    int i1 = 0, in = 0;
    for (int r = -1; r < rounds; r++) { /* round -1 warms both phases up, untimed */
        int k_steps = r < 0 ? warmup : K;
        /* Phase 1: process 0 alone, no communication; the others wait in the barrier. */
        if (rank == 0) {
            ACCEL_CHECK(accel_no_sync_begin(acc, model));
            for (int k = 0; k < k_steps; k++) {
                double t[3];
                accel_step(acc, g, m, opt, ids, tg, batch, T, &loss, t);
                if (r < 0 && k == 0) {
                    loss_first = loss;
                }
                if (r >= 0) {
                    for (int part = 0; part < 3; part++) {
                        tm[part * total + i1] = t[part];
                    }
                    tm[3 * total + i1] = t[0] + t[1] + t[2];
                    tgemm[i1++] = sgemm_once(ga, gb, gc);
                }
            }
            ACCEL_CHECK(accel_no_sync_end(acc, model));
        }
        ACCEL_CHECK(accel_wait_for_everyone(acc));
        /* Phase 2: every process, gradients all-reduced in buckets during backward (with one
         * process there is nothing more to measure). */
        for (int k = 0; k < k_steps && n > 1; k++) {
            double t[3];
            accel_step(acc, g, m, opt, ids, tg, batch, T, &loss, t);
            if (r >= 0) {
                for (int part = 0; part < 3; part++) {
                    tm[(4 + part) * total + in] = t[part];
                }
                tm[7 * total + in++] = t[0] + t[1] + t[2];
            }
        }
        ACCEL_CHECK(accel_wait_for_everyone(acc));
    }
    if (rank == 0) {
        double med[8];
        for (int q = 0; q < 8; q++) {
            int count = q < 4 ? i1 : in;
            med[q] = count > 0 ? bench_median(tm + q * total, count) : 0.0;
        }
        double s1 = med[3], sn = med[7];
        double peak = 2.0 * gn * (double)gn * gn / bench_median(tgemm, i1);
        double flops = nn_gpt_train_flops(&cfg, batch, T);
        double tok1 = (double)batch * T / s1, tokn = (double)n * batch * T / sn;
        printf("gpt_step: L=%d C=%d H=%d T=%d V=%d untied, exact GELU, fp32, batch %d per "
               "process, %d processes x 1 thread, %d gradient bucket(s)\n",
               cfg.n_layer, cfg.n_embd, cfg.n_head, T, cfg.vocab_size, batch, n, n_buckets);
        printf("  params            %lld\n", (long long)nn_params_numel(p));
        printf("  sgemm 1024^3      %.2f GFLOP/s (process 0, alone)\n", peak * 1e-9);
        printf("  1 process         step %.2f ms (forward %.2f, backward %.2f, adamw %.2f), "
               "%.0f tokens/s, %.3f of sgemm (median of %d, process 0 alone, no_sync)\n",
               s1 * 1e3, med[0] * 1e3, med[1] * 1e3, med[2] * 1e3, tok1, flops / s1 / peak, i1);
        if (n > 1) {
            printf(
                "  %d processes       step %.2f ms (forward %.2f, backward+all-reduce %.2f, adamw "
                "%.2f), %.0f tokens/s in total, %.3f of sgemm per process (median of %d)\n",
                n, sn * 1e3, med[4] * 1e3, med[5] * 1e3, med[6] * 1e3, tokn, flops / sn / peak, in);
            printf(
                "  scaling efficiency %.3f  (= %d-process tokens/s / (%d x 1-process tokens/s))\n",
                tokn / (n * tok1), n, n);
        }
        printf("  loss              %.4f -> %.4f\n", (double)loss_first, (double)loss);
        fflush(stdout);
    }
    nn_ctx_free(g);
    nn_gpt_free(m);
    nn_params_free(p);
    free(ids);
    free(tg);
    free(tm);
    free(tgemm);
    free(ga);
    free(gb);
    free(gc);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 10, batch = 8, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--steps") == 0) {
            steps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--batch") == 0) {
            batch = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--threads") == 0) {
            threads = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "usage: gpt_step [--steps N] [--batch B] [--threads N]\n");
            return 2;
        }
    }
    if (steps < 1 || batch < 1 || threads < 1) {
        fprintf(stderr, "gpt_step: steps, batch and threads must be >= 1\n");
        return 2;
    }
    accel *acc = NULL;
    ACCEL_CHECK(accel_init(&acc, NULL));
    if (accel_num_processes(acc) > 1) {
        threads = 1; /* the configuration: N processes x 1 thread */
    }
    openblas_set_num_threads(threads);
#ifdef ACCEL_HAVE_OPENMP
    omp_set_num_threads(threads);
#endif
    int rc = run_distributed(acc, steps, batch);
    accel_free(acc);
    return rc;
}
