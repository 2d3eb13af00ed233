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
 * On a GPU (--device cuda, the default where accel runs on one; CUDA builds) it times the
 * training step of one process instead (process 0's, under a launcher): forward, accel_backward,
 * clipping at 1.0 and AdamW (lr 3e-4, weight decay 0.1) with the model, its gradients, AdamW's
 * state and nn's arenas in GPU memory, on synthetic uniform tokens. After --warmup untimed steps,
 * every step ends with cudaDeviceSynchronize (the clipping norm synchronises anyway), so the host
 * clock times the GPU's work, not the launches. Prints its text, then one machine-readable line
 * (bench/peers parses it):
 *
 *     tokens_per_s=<x> peak_mem_gib=<y> step_ms=<z>
 *
 * step_ms is the median step, tokens_per_s = batch x T / step_ms, and peak_mem_gib the most
 * GPU memory in use during the steps less what was in use before the model was made
 * (cudaMemGetInfo after each step: the model's buffers, AdamW's moments, nn's device arena,
 * which holds everything a step allocates until it ends, and cuBLASLt's workspace).
 *
 * Both modes also print the step's peak of nn's arena (nn_ctx_stats.peak_nbytes: activations,
 * their gradients and the tape), which --recompute 1 (activation recomputation per block,
 * nn_gpt_set_recompute) lowers; the GPU mode also the per-op scratch's peak (one chunk of the
 * head's logits: nn_linear_cross_entropy, ACCEL_NN_CE_CHUNK_ROWS). At ZeRO stage 3
 * (ACCEL_ZERO_STAGE=3) the GPU mode also prints, per step, the units' driver allocations
 * (cuMemCreate + cuMemMap + cuMemSetAccess each), those given back, and the unit changes at
 * which the host waited for the GPU before unmapping (docs/cuda.md, "ZeRO stage 3 on a GPU").
 *
 * Usage: [accel launch -n 2] gpt_step [--steps N] [--batch B] [--threads N] [--device cpu|cuda]
 *        [--preset gpt2-124m] [--layers N --width N --heads N --context N --vocab N]
 *        [--mixed_precision no|bf16|fp16] [--warmup N] [--recompute 0|1]
 *        (threads: BLAS/OpenMP threads when run as 1 process; the preset is GPT-2 124M: 12
 *        layers, width 768, 12 heads, T = 1024, vocabulary 50304, tied head, tanh GELU)
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
#include "train/train_internal.h"
#ifdef ACCEL_HAVE_OPENMP
#include <omp.h>
#endif
#ifdef ACCEL_HAVE_CUDA
#include "accel/cuda.h"
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

/* "fp32" for no mixed precision, else its name. */
static const char *mp_name(accel_precision p)
{
    return p == ACCEL_PRECISION_NO || p == ACCEL_PRECISION_UNSET ? "fp32" : accel_precision_name(p);
}

/* One step through accel: forward, accel_backward (all-reduce unless no_sync), AdamW. Writes
 * the forward, backward (with its communication) and optimizer seconds to t[0..2]. */
static void accel_step(accel *acc, nn_ctx *g, nn_gpt *m, accel_optimizer *opt, const int32_t *ids,
                       const int32_t *tg, int batch, int T, float *loss_out, double t[3],
                       size_t *arena_peak)
{
    double t0 = accel__now();
    nn_tensor *loss = NULL;
    ACCEL_CHECK(nn_gpt_forward(g, m, ids, tg, batch, T, NULL, &loss));
    double t1 = accel__now();
    ACCEL_CHECK(accel_backward(acc, loss));
    double t2 = accel__now();
    size_t peak = nn_ctx_get_stats(g).peak_nbytes;
    *arena_peak = peak > *arena_peak ? peak : *arena_peak;
    ACCEL_CHECK(accel_optimizer_step(opt));
    ACCEL_CHECK(accel_optimizer_zero_grad(opt));
    *loss_out = nn_item(loss);
    t[0] = t1 - t0;
    t[1] = t2 - t1;
    t[2] = accel__now() - t2;
}

/* The multi-process mode (see the top of the file). */
static int run_distributed(accel *acc, nn_gpt_config cfg, int steps, int batch, int recompute)
{
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
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
    nn_gpt_set_recompute(m, recompute);
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
    size_t arena_peak = 0;
    for (int r = -1; r < rounds; r++) { /* round -1 warms both phases up, untimed */
        int k_steps = r < 0 ? warmup : K;
        /* Phase 1: process 0 alone, no communication; the others wait in the barrier. */
        if (rank == 0) {
            ACCEL_CHECK(accel_no_sync_begin(acc, model));
            for (int k = 0; k < k_steps; k++) {
                double t[3];
                accel_step(acc, g, m, opt, ids, tg, batch, T, &loss, t, &arena_peak);
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
            accel_step(acc, g, m, opt, ids, tg, batch, T, &loss, t, &arena_peak);
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
        printf("gpt_step: L=%d C=%d H=%d T=%d V=%d %s, %s GELU, %s, batch %d per "
               "process, %d processes x 1 thread, %d gradient bucket(s)\n",
               cfg.n_layer, cfg.n_embd, cfg.n_head, T, cfg.vocab_size, cfg.tied ? "tied" : "untied",
               cfg.act == NN_ACT_GELU ? "exact" : "tanh", mp_name(accel_mixed_precision(acc)),
               batch, n, n_buckets);
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
        printf("  nn arena peak     %.3f GiB (%zu bytes, nn_ctx_stats.peak_nbytes, recompute %d)\n",
               (double)arena_peak / (double)(1ull << 30), arena_peak, recompute);
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

#ifdef ACCEL_HAVE_CUDA
/* Bytes of GPU memory in use now (on the whole device). */
static size_t gpu_used(void)
{
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        fprintf(stderr, "gpt_step: cudaMemGetInfo: %s\n", cudaGetErrorString(e));
        exit(1);
    }
    return total_b - free_b;
}

static void cuda_sync(void)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "gpt_step: cudaDeviceSynchronize: %s (%s)\n", cudaGetErrorString(e),
                cudaGetErrorName(e));
        exit(1);
    }
}

/* One process's step on its GPU (see the top of the file). */
static int run_cuda(accel *acc, nn_gpt_config cfg, int steps, int batch, int warmup,
                    int recompute)
{
    const int T = cfg.block_size;
    size_t used0 = gpu_used(), peak = used0;
    accel_model *model;
    nn_params *p;
    nn_gpt *m;
    ACCEL_CHECK(accel_model_new(acc, &model)); /* on the accelerator's GPU */
    ACCEL_CHECK(nn_params_for_model(&p, model));
    ACCEL_CHECK(nn_gpt_declare(&m, p, &cfg));
    ACCEL_CHECK(nn_params_bind(p));
    ACCEL_CHECK(nn_params_init(p, 1234));
    nn_gpt_set_recompute(m, recompute);
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 3e-4;
    ao.weight_decay = 0.1;
    accel_optimizer *opt = accel_adamw(acc, model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, model, opt));
    nn_ctx *g;
    ACCEL_CHECK(nn_ctx_new(&g));
    ACCEL_CHECK(nn_ctx_set_device(g, accel_device_of(acc)));

    long count = (long)batch * T;
    int32_t *ids = malloc((size_t)count * sizeof(int32_t));
    int32_t *tg = malloc((size_t)count * sizeof(int32_t));
    double *ts = malloc((size_t)steps * sizeof(double));
    ACCEL_CHECK(ids && tg && ts ? ACCEL_OK : ACCEL_ENOMEM);
    synthetic_tokens(ids, tg, count, cfg.vocab_size, accel_process_index(acc));
    float loss_first = 0.0f, loss_last = 0.0f;
    double norm = 0.0, total = 0.0;
    size_t arena_peak = 0;
    size_t maps0 = 0, unmaps0 = 0, maps1 = 0, unmaps1 = 0; /* ZeRO-3's driver allocations */
    uint64_t waits0 = 0, waits1 = 0;
    for (int s = -warmup; s < steps; s++) {
        if (s == 0 && model->zero_stage == 3) {
            accel__zero3_calls(model, &maps0, &unmaps0, &waits0);
        }
        double t0 = accel__now();
        nn_tensor *loss = NULL;
        ACCEL_CHECK(nn_gpt_forward(g, m, ids, tg, batch, T, NULL, &loss));
        ACCEL_CHECK(accel_backward(acc, loss));
        size_t step_peak = nn_ctx_get_stats(g).peak_nbytes;
        arena_peak = step_peak > arena_peak ? step_peak : arena_peak;
        ACCEL_CHECK(accel_clip_grad_norm(acc, model, 1.0, 2.0, &norm));
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        cuda_sync();
        double dt = accel__now() - t0;
        size_t used = gpu_used();
        peak = used > peak ? used : peak;
        if (s == -warmup) {
            loss_first = nn_item(loss);
        }
        if (s == steps - 1) {
            loss_last = nn_item(loss);
        }
        if (s >= 0) {
            ts[s] = dt;
            total += dt;
        }
    }
    if (model->zero_stage == 3) {
        accel__zero3_calls(model, &maps1, &unmaps1, &waits1);
    }
    double med = bench_median(ts, steps);
    double tok_s = (double)count / med, flops = nn_gpt_train_flops(&cfg, batch, T);
    double peak_gib = (double)(peak - used0) / (double)(1ull << 30);
    if (accel_is_main_process(acc)) { /* under a launcher: process 0's figures only */
        struct cudaDeviceProp prop;
        const char *name = cudaGetDeviceProperties(&prop, accel_cuda_device(acc)) == cudaSuccess
                               ? prop.name
                               : "(unknown GPU)";
        printf("gpt_step: L=%d C=%d H=%d T=%d V=%d %s, %s GELU, %s, batch %d, AdamW, clip 1.0, on "
               "%s\n",
               cfg.n_layer, cfg.n_embd, cfg.n_head, T, cfg.vocab_size, cfg.tied ? "tied" : "untied",
               cfg.act == NN_ACT_GELU ? "exact" : "tanh", mp_name(accel_mixed_precision(acc)),
               batch, accel_device_name(acc));
        printf("  device            %s\n", name);
        printf("  params            %lld\n", (long long)nn_params_numel(p));
        printf("  step              %.2f ms median, %.2f ms mean over %d steps (after %d warmup)\n",
               med * 1e3, total / steps * 1e3, steps, warmup);
        printf("  throughput        %.0f tokens/s, %.1f TFLOP/s (model FLOPs)\n", tok_s,
               flops / med * 1e-12);
        printf("  GPU memory        %.2f GiB peak beyond what was in use before the model "
               "(cudaMemGetInfo)\n",
               peak_gib);
        printf("  nn arena peak     %.3f GiB (%zu bytes, nn_ctx_stats.peak_nbytes, recompute %d)\n",
               (double)arena_peak / (double)(1ull << 30), arena_peak, recompute);
        /* The head's chunk of logits (nn_linear_cross_entropy) is the largest per-op need. */
        printf("  nn per-op scratch %.3f GiB peak (nn_ctx_stats.scratch_peak_nbytes)\n",
               (double)nn_ctx_get_stats(g).scratch_peak_nbytes / (double)(1ull << 30));
        printf("  loss              %.4f -> %.4f (last grad norm %.3f)\n", (double)loss_first,
               (double)loss_last, norm);
        if (model->zero_stage == 3) {
            /* Per step: units mapped (cuMemCreate + cuMemMap + cuMemSetAccess each) and given
             * back, and the unit changes at which the host waited for the GPU (docs/cuda.md). */
            printf("  ZeRO-3 units      %.1f driver allocations, %.1f given back, %.1f release "
                   "waits per step (%d units)\n",
                   (double)(maps1 - maps0) / steps, (double)(unmaps1 - unmaps0) / steps,
                   (double)(waits1 - waits0) / steps, accel_model_num_units(model));
        }
        printf("tokens_per_s=%.1f peak_mem_gib=%.3f step_ms=%.3f\n", tok_s, peak_gib, med * 1e3);
        fflush(stdout);
    }
    nn_ctx_free(g);
    nn_gpt_free(m);
    nn_params_free(p);
    free(ids);
    free(tg);
    free(ts);
    return 0;
}
#endif

static const char usage[] =
    "usage: gpt_step [--steps N] [--batch B] [--threads N] [--device cpu|cuda]\n"
    "                [--preset gpt2-124m] [--layers N] [--width N] [--heads N] [--context N]\n"
    "                [--vocab N] [--mixed_precision no|bf16|fp16] [--warmup N]\n"
    "                [--recompute 0|1]\n";

int main(int argc, char **argv)
{
    int steps = 10, batch = 8, threads = 1, warmup = 3, recompute = 0;
    const char *device = NULL, *mp = NULL;
    nn_gpt_config cfg = bench_gpt_config();
    struct {
        const char *flag;
        int *v;
    } ints[] = {{"--steps", &steps},         {"--batch", &batch},
                {"--threads", &threads},     {"--warmup", &warmup},
                {"--layers", &cfg.n_layer},  {"--width", &cfg.n_embd},
                {"--heads", &cfg.n_head},    {"--context", &cfg.block_size},
                {"--vocab", &cfg.vocab_size},  {"--recompute", &recompute}};
    for (int i = 1; i < argc; i += 2) {
        size_t k = 0, n = sizeof ints / sizeof ints[0];
        while (k < n && strcmp(argv[i], ints[k].flag) != 0) {
            k++;
        }
        if (i + 1 >= argc) {
            fputs(usage, stderr);
            return 2;
        }
        if (k < n) {
            *ints[k].v = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--device") == 0) {
            device = argv[i + 1];
        } else if (strcmp(argv[i], "--mixed_precision") == 0) {
            mp = argv[i + 1];
        } else if (strcmp(argv[i], "--preset") == 0 && strcmp(argv[i + 1], "gpt2-124m") == 0) {
            /* Flags after the preset still change it. */
            cfg.n_layer = 12;
            cfg.n_embd = 768;
            cfg.n_head = 12;
            cfg.block_size = 1024;
            cfg.vocab_size = 50304; /* 50257 padded to a multiple of 128 */
            cfg.tied = 1;
            cfg.act = NN_ACT_GELU_TANH;
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (steps < 1 || batch < 1 || threads < 1 || warmup < 0 || cfg.n_layer < 1 || cfg.n_embd < 1 ||
        cfg.n_head < 1 || cfg.n_embd % cfg.n_head != 0 || cfg.block_size < 1 ||
        cfg.vocab_size < 2 || (recompute != 0 && recompute != 1)) {
        fprintf(stderr, "gpt_step: steps, batch, threads and the model sizes must be >= 1 "
                        "(vocab >= 2, width a multiple of heads, warmup >= 0, recompute 0 or "
                        "1)\n");
        return 2;
    }
    if (device != NULL && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) {
        fprintf(stderr, "gpt_step: --device must be cpu or cuda, not %s\n", device);
        return 2;
    }
    accel_options o = accel_options_default();
    if (device != NULL && strcmp(device, "cpu") == 0) {
        o.cpu = 1; /* the accelerator, and with it the model, on the CPU */
    }
    for (int q = ACCEL_PRECISION_NO; mp != NULL && q <= ACCEL_PRECISION_BF16; q++) {
        if (strcmp(mp, accel_precision_name((accel_precision)q)) == 0) {
            o.mixed_precision = (accel_precision)q;
        }
    }
    if (mp != NULL && o.mixed_precision == ACCEL_PRECISION_UNSET) {
        fprintf(stderr, "gpt_step: --mixed_precision must be no, bf16 or fp16, not %s\n", mp);
        return 2;
    }
    accel *acc = NULL;
    ACCEL_CHECK(accel_init(&acc, &o));
    int on_gpu = accel_device_of(acc).type == ACCEL_DEVICE_CUDA;
    if (device != NULL && strcmp(device, "cuda") == 0 && !on_gpu) {
        fprintf(stderr,
                "gpt_step: --device cuda: accel runs on %s here (a build without CUDA, no usable "
                "GPU, or ACCELERATE_USE_CPU=1; ACCEL_LOG_LEVEL=debug says which)\n",
                accel_device_name(acc));
        accel_free(acc);
        return 1;
    }
    int rc;
    if (on_gpu) {
#ifdef ACCEL_HAVE_CUDA
        rc = run_cuda(acc, cfg, steps, batch, warmup, recompute);
#else
        rc = 1; /* accel runs on a GPU only in CUDA builds */
#endif
    } else {
        if (accel_num_processes(acc) > 1) {
            threads = 1; /* the configuration: N processes x 1 thread */
        }
        openblas_set_num_threads(threads);
#ifdef ACCEL_HAVE_OPENMP
        omp_set_num_threads(threads);
#endif
        rc = run_distributed(acc, cfg, steps, batch, recompute);
    }
    accel_free(acc);
    return rc;
}
