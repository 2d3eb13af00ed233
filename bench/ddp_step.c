/*
 * ddp_step: data-parallel training step of an MLP 784-1024-1024-10 (batch 64 per process,
 * fp32, SGD, hand-written forward/backward on single-threaded OpenBLAS).
 *
 *     accel launch --num_processes 1 build/bench/ddp_step
 *     accel launch --num_processes 2 build/bench/ddp_step
 *
 * Measures, in the same run, three configurations of the same step:
 *   local       no gradient communication (the per-process compute baseline),
 *   overlap on  buckets all-reduced by the communication thread while backward continues,
 *   overlap off every bucket all-reduced at accel_backward_end.
 * Prints samples/s over all processes and the scaling efficiency
 *   efficiency = N-process samples/s / (N x samples/s of one process without communication),
 * where the one-process figure is the "local" step of this run (same machine load). Compare it
 * with the samples/s of a separate --num_processes 1 run as well (see docs/performance.md).
 * The configurations alternate over --rounds R (default 5) rounds of --steps N (default 20)
 * timed steps after --warmup W (default 3); each reports its best round.
 *
 * --compute 0 skips the matrix products (about 99% of a step's instructions), leaving what the
 * library does per step: readiness, bucket all-reduces, the SGD update and zero_grad. Use it to
 * compare builds by instruction count, which a loaded machine does not disturb, e.g.
 *     valgrind --tool=callgrind build/bench/ddp_step --compute 0 --rounds 1 --steps 5
 * (docs/performance.md, "ddp_step against edb707f").
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef ACCEL_HAVE_OPENMP
#include <omp.h>
#endif

#include "accel/accel.h"
#include "accel/check.h"
#include "core/internal.h"
#include "core/settings.h"

#define BATCH 64
#define D0 784
#define D1 1024
#define D2 1024
#define D3 10

enum { W1, B1, W2, B2, W3, B3, NP };

static accel *acc;
static accel_model *model;
static const accel_param *P[NP];
static float *x, *h1, *h2, *y, *dy, *dh2, *dh1;
static int *labels;
static int compute = 1; /* --compute 0: no matrix products */

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

/* out[BATCH x n] = relu?(in[BATCH x k] W^T + b), W is [n x k]. */
static void linear(const float *in, const accel_param *w, const accel_param *b, float *out, int k,
                   int n, int relu)
{
    for (int i = 0; i < BATCH; i++) {
        memcpy(out + (size_t)i * n, b->data, (size_t)n * sizeof(float));
    }
    if (compute) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BATCH, n, k, 1.0f, in, k, w->data, k,
                    1.0f, out, n);
    }
    if (relu) {
        for (size_t i = 0; i < (size_t)BATCH * n; i++) {
            out[i] = out[i] > 0 ? out[i] : 0;
        }
    }
}

/* dW += dout^T in, db += sum dout; then marks both ready. */
static void weight_grads(const float *dout, const float *in, int pw, int pb, int k, int n)
{
    if (compute) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, BATCH, 1.0f, dout, n, in, k,
                    1.0f, P[pw]->grad, k);
    }
    for (int i = 0; i < BATCH; i++) {
        for (int j = 0; j < n; j++) {
            P[pb]->grad[j] += dout[(size_t)i * n + j];
        }
    }
    ACCEL_CHECK(accel_grad_ready(model, pb));
    ACCEL_CHECK(accel_grad_ready(model, pw));
}

/* din = (dout W) * relu'(in_act), W is [n x k]. */
static void input_grads(const float *dout, const accel_param *w, const float *act, float *din,
                        int k, int n)
{
    if (compute) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BATCH, k, n, 1.0f, dout, n, w->data,
                    k, 0.0f, din, k);
    }
    for (size_t i = 0; i < (size_t)BATCH * k; i++) {
        din[i] = act[i] > 0 ? din[i] : 0;
    }
}

static void step(accel_optimizer *opt)
{
    ACCEL_CHECK(accel_accumulate(acc, model));
    linear(x, P[W1], P[B1], h1, D0, D1, 1);
    linear(h1, P[W2], P[B2], h2, D1, D2, 1);
    linear(h2, P[W3], P[B3], y, D2, D3, 0);
    double seed = accel_backward_begin(acc);
    for (int i = 0; i < BATCH; i++) { /* softmax cross-entropy, mean over the batch */
        float *r = y + (size_t)i * D3, mx = r[0], s = 0;
        for (int j = 1; j < D3; j++) {
            mx = r[j] > mx ? r[j] : mx;
        }
        for (int j = 0; j < D3; j++) {
            s += expf(r[j] - mx);
        }
        for (int j = 0; j < D3; j++) {
            float p = expf(r[j] - mx) / s;
            dy[(size_t)i * D3 + j] = (float)seed * (p - (j == labels[i])) / BATCH;
        }
    }
    weight_grads(dy, h2, W3, B3, D2, D3);
    input_grads(dy, P[W3], h2, dh2, D2, D3);
    weight_grads(dh2, h1, W2, B2, D1, D2);
    input_grads(dh2, P[W2], h1, dh1, D1, D2);
    weight_grads(dh1, x, W1, B1, D0, D1);
    ACCEL_CHECK(accel_backward_end(acc));
    ACCEL_CHECK(accel_optimizer_step(opt));
    ACCEL_CHECK(accel_optimizer_zero_grad(opt));
}

/* Seconds per step, the slowest process's figure. */
static double time_steps(accel_optimizer *opt, int warmup, int steps)
{
    for (int i = 0; i < warmup; i++) {
        step(opt);
    }
    ACCEL_CHECK(accel_wait_for_everyone(acc));
    double t0 = accel__now();
    for (int i = 0; i < steps; i++) {
        step(opt);
    }
    double dt = (accel__now() - t0) / steps;
    ACCEL_CHECK(accel_allreduce(acc, &dt, &dt, 1, ACCEL_F64, ACCEL_MAX, NULL));
    return dt;
}

int main(int argc, char **argv)
{
    int steps = 20, warmup = 3, rounds = 5;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0) {
            steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--warmup") == 0) {
            warmup = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--rounds") == 0) {
            rounds = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--compute") == 0) {
            compute = atoi(argv[++i]) != 0;
        }
    }
    openblas_set_num_threads(1);
#ifdef ACCEL_HAVE_OPENMP
    omp_set_num_threads(1);
#endif
    if (accel_init(&acc, NULL) != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error(NULL));
        return 1;
    }
    int n = accel_num_processes(acc);
    ACCEL_CHECK(accel_model_new(acc, &model));
    const int64_t shapes[NP][2] = {{D1, D0}, {D1, 1}, {D2, D1}, {D2, 1}, {D3, D2}, {D3, 1}};
    const char *names[NP] = {"fc1.weight", "fc1.bias",   "fc2.weight",
                             "fc2.bias",   "fc3.weight", "fc3.bias"};
    for (int p = 0; p < NP; p++) {
        ACCEL_CHECK(accel_model_add_param(model, names[p], (p % 2) ? 1 : 2, shapes[p], NULL));
    }
    unsigned seed = 42;
    for (int p = 0; p < NP; p++) {
        P[p] = accel_model_param(model, p);
        float scale = (p % 2) ? 0.0f : 2.0f / sqrtf((float)P[p]->shape[1]);
        for (size_t i = 0; i < P[p]->numel; i++) {
            P[p]->data[i] = scale * frand(&seed);
        }
    }
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = 0.01;
    accel_optimizer *opt = accel_sgd(acc, model, &so);
    ACCEL_CHECK(accel_prepare(acc, model, opt));

    x = malloc(sizeof(float) * BATCH * D0);
    h1 = malloc(sizeof(float) * BATCH * D1);
    h2 = malloc(sizeof(float) * BATCH * D2);
    y = malloc(sizeof(float) * BATCH * D3);
    dy = malloc(sizeof(float) * BATCH * D3);
    dh2 = calloc((size_t)BATCH * D2, sizeof(float)); /* zeros stay under --compute 0 */
    dh1 = calloc((size_t)BATCH * D1, sizeof(float));
    labels = malloc(sizeof(int) * BATCH);
    seed = 7u + (unsigned)accel_process_index(acc);
    for (int i = 0; i < BATCH * D0; i++) {
        x[i] = frand(&seed) + 0.5f;
    }
    for (int i = 0; i < BATCH; i++) {
        labels[i] = (int)(seed >> 8) % D3;
        frand(&seed);
    }

    /* The three configurations are interleaved over several rounds and each keeps its best
     * round, so that load from elsewhere on the machine hits them alike. local is the same
     * step inside no_sync, i.e. without any communication. */
    double t_local = 1e30, t_on = 1e30, t_off = 1e30;
    for (int r = 0; r < rounds; r++) {
        ACCEL_CHECK(accel_no_sync_begin(acc, model));
        t_local = fmin(t_local, time_steps(opt, warmup, steps));
        ACCEL_CHECK(accel_no_sync_end(acc, model));
        acc->settings->train.overlap_comm = 1;
        t_on = fmin(t_on, time_steps(opt, warmup, steps));
        acc->settings->train.overlap_comm = 0;
        t_off = fmin(t_off, time_steps(opt, warmup, steps));
    }

    accel_print(acc,
                "ddp_step: MLP 784-1024-1024-10, batch %d/process, fp32 SGD, %d process%s, "
                "%d buckets, best of %d rounds x %d steps%s\n",
                BATCH, n, n > 1 ? "es" : "", accel_model_num_buckets(model), rounds, steps,
                compute ? "" : ", no matrix products (--compute 0)");
    accel_print(acc, "  local (no comm)  %8.2f ms/step  %9.0f samples/s per process\n",
                t_local * 1e3, BATCH / t_local);
    if (n == 1) {
        accel_print(acc, "  (one process: no communication; overlap on/off time the same step)\n");
    }
    accel_print(acc, "  overlap on       %8.2f ms/step  %9.0f samples/s total  efficiency %.3f\n",
                t_on * 1e3, n * BATCH / t_on, n > 1 ? t_local / t_on : 1.0);
    accel_print(acc, "  overlap off      %8.2f ms/step  %9.0f samples/s total  efficiency %.3f\n",
                t_off * 1e3, n * BATCH / t_off, n > 1 ? t_local / t_off : 1.0);
    free(x), free(h1), free(h2), free(y), free(dy), free(dh2), free(dh1), free(labels);
    accel_free(acc);
    return 0;
}
