/*
 * The harness of the nn-on-CUDA op tests (tests/unit/test_nn_cuda*.c): one CPU and one GPU nn
 * ctx, and check_case, which runs an op on both devices over the same random inputs and output
 * gradient and compares the output and every input gradient as rel = ||gpu - cpu|| / ||cpu||
 * against the case's tolerances. Before each run the GPU ctx's arena is filled with NaN, so an
 * output or fresh gradient element a kernel forgot to write fails the comparison. Inputs are
 * fresh each run; the seed is printed (ACCEL_TEST_SEED=N repeats a run). A failed check prints
 * file:line and exits 1 (check.h).
 */
#ifndef ACCEL_TESTS_NN_CUDA_CHECK_H
#define ACCEL_TESTS_NN_CUDA_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "check.h"

#define POISON_N ((int64_t)4 << 20) /* floats of NaN laid in the GPU arena before each case */
#define MAX_IN 8

static nn_ctx *gcpu, *ggpu;
static uint64_t seed;
static float *poison_buf;

static uint64_t next(void) /* splitmix64 */
{
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline float frand(void) /* uniform in [-1, 1) */
{
    return (float)((double)(next() >> 11) * 0x1p-52 - 1.0);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL);
    return p;
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= shape[d];
    }
    return n;
}

/* ||out - ref|| / ||ref|| over the columns [c0, c0 + n) of rows x ld matrices. */
static inline double rel_err_cols(const float *out, const float *ref, int64_t rows, int64_t ld,
                                  int64_t c0, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = c0; c < c0 + n; c++) {
            double d = (double)out[r * ld + c] - (double)ref[r * ld + c];
            num += d * d;
            den += (double)ref[r * ld + c] * (double)ref[r * ld + c];
        }
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static inline double rel_err(const float *out, const float *ref, int64_t n)
{
    return rel_err_cols(out, ref, 1, n, 0, n);
}

/* Resets a ctx to the same state on both devices (step, seed, autocast); on the GPU, lays NaN
 * over the start of its arena first, where the case's tensors will be carved. */
static inline void prepare(nn_ctx *g, int is_gpu, int autocast)
{
    int64_t shape[1] = {POISON_N};
    nn_ctx_reset(g);
    if (is_gpu) {
        for (int k = 0; k < 2; k++) { /* twice: the first may grow the arena by a new block */
            CHECK_MSG(nn_tensor_from(g, poison_buf, 1, shape) != NULL, "%s",
                      accel_last_error(NULL));
            nn_ctx_reset(g);
        }
    }
    nn_ctx_set_step(g, 7);
    nn_ctx_set_seed(g, 1234);
    nn_ctx_set_autocast(g, autocast);
    nn_ctx_set_training(g, 1);
}

typedef struct in_spec {
    int ndim;
    int64_t shape[4];
    float scale, offset; /* values: offset + scale * U(-1, 1) */
    int grad;            /* requires grad */
} in_spec;

typedef nn_tensor *(*case_fn)(nn_ctx *g, nn_tensor **in, const void *arg);

typedef struct run_out {
    float *y;
    int64_t ny;
    float *grads[MAX_IN];
} run_out;

/* One forward (and, unless `forward_only`, backward: from gout, or d(y) = 1 when it is NULL)
 * on g; the output and input gradients come back in host memory. */
static inline run_out run_one(nn_ctx *g, int is_gpu, int autocast, const in_spec *spec, int n_in,
                              float *const *data, case_fn fn, const void *arg, const float *gout,
                              int forward_only)
{
    run_out r;
    memset(&r, 0, sizeof(r));
    prepare(g, is_gpu, autocast);
    nn_tensor *in[MAX_IN] = {NULL};
    for (int k = 0; k < n_in; k++) {
        in[k] = nn_tensor_from(g, data[k], spec[k].ndim, spec[k].shape);
        CHECK_MSG(in[k] != NULL, "%s", accel_last_error(NULL));
        nn_tensor_requires_grad(in[k], spec[k].grad);
    }
    nn_tensor *y = fn(g, in, arg);
    CHECK_MSG(y != NULL, "%s: %s", is_gpu ? "gpu" : "cpu", accel_last_error(NULL));
    r.ny = nn_numel(y);
    r.y = xmalloc((size_t)r.ny * sizeof(float));
    CHECK_OK(NULL, nn_tensor_to_host(y, r.y));
    if (forward_only) {
        return r;
    }
    if (gout == NULL) {
        CHECK_OK(NULL, nn_backward(y, 1.0f, NULL));
    } else {
        CHECK_OK(NULL, nn_backward_grad(y, gout, NULL));
    }
    for (int k = 0; k < n_in; k++) {
        if (spec[k].grad) {
            r.grads[k] = xmalloc((size_t)nn_numel(in[k]) * sizeof(float));
            CHECK_OK(NULL, nn_tensor_grad_to_host(in[k], r.grads[k]));
        }
    }
    return r;
}

static inline void free_run(run_out *r, int n_in)
{
    free(r->y);
    for (int k = 0; k < n_in; k++) {
        free(r->grads[k]);
    }
}

/* Two runs of the same case (same specs) gave the same bits: the output and every input's
 * gradient; a difference is reported as "<name>: the output differs <with>" or "the gradient
 * of input k differs <with>". */
static inline void check_same_bits_runs(const char *name, const char *with, const run_out *a,
                                        const run_out *b, const in_spec *spec, int n_in)
{
    CHECK_MSG(memcmp(a->y, b->y, (size_t)a->ny * sizeof(float)) == 0,
              "%s: the output differs %s", name, with);
    for (int k = 0; k < n_in; k++) {
        size_t nbytes = (size_t)numel(spec[k].ndim, spec[k].shape) * sizeof(float);
        CHECK_MSG(memcmp(a->grads[k], b->grads[k], nbytes) == 0,
                  "%s: the gradient of input %d differs %s", name, k, with);
    }
}

/* data[k] = numel(spec[k]) values of spec[k]'s offset + scale * frand(), inputs in order. */
static inline void random_inputs(const in_spec *spec, int n_in, float **data)
{
    for (int k = 0; k < n_in; k++) {
        int64_t n = numel(spec[k].ndim, spec[k].shape);
        data[k] = xmalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            data[k][i] = spec[k].offset + spec[k].scale * frand();
        }
    }
}

/* n values of frand() (an output gradient). */
static inline float *random_floats(int64_t n)
{
    float *v = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        v[i] = frand();
    }
    return v;
}

/* Runs fn on both devices over the same random inputs and output gradient and compares. */
static inline void check_case(const char *name, const in_spec *spec, int n_in, case_fn fn,
                              const void *arg, int autocast, int scalar, double tol_fwd,
                              double tol_grad)
{
    float *data[MAX_IN];
    random_inputs(spec, n_in, data);
    /* A forward on the CPU sizes the output gradient. */
    run_out c = run_one(gcpu, 0, autocast, spec, n_in, data, fn, arg, NULL, !scalar);
    float *gout = NULL;
    if (!scalar) {
        gout = random_floats(c.ny);
        free_run(&c, n_in);
        c = run_one(gcpu, 0, autocast, spec, n_in, data, fn, arg, gout, 0);
    }
    run_out gg = run_one(ggpu, 1, autocast, spec, n_in, data, fn, arg, gout, 0);
    CHECK_MSG(gg.ny == c.ny, "%s: %lld outputs on the GPU, %lld on the CPU", name, (long long)gg.ny,
              (long long)c.ny);
    double e = rel_err(gg.y, c.y, c.ny);
    printf("  %-34s forward %.3g", name, e);
    CHECK_MSG(e <= tol_fwd, "%s: forward rel err %g > %g", name, e, tol_fwd);
    for (int k = 0; k < n_in; k++) {
        if (spec[k].grad) {
            double eg = rel_err(gg.grads[k], c.grads[k], numel(spec[k].ndim, spec[k].shape));
            printf(", grad %d %.3g", k, eg);
            CHECK_MSG(eg <= tol_grad, "%s: gradient of input %d: rel err %g > %g", name, k, eg,
                      tol_grad);
        }
    }
    printf("\n");
    fflush(stdout);
    free_run(&c, n_in);
    free_run(&gg, n_in);
    free(gout);
    for (int k = 0; k < n_in; k++) {
        free(data[k]);
    }
}

/* Makes the CPU and GPU contexts and the NaN buffer, prints the seed (ACCEL_TEST_SEED or the
 * time); returns 77 (after a "skipped" line naming the reason) where no GPU can be used. */
static inline int nn_cuda_check_init(const char *prog)
{
    /* nn says at level info when cuBLASLt offers no algorithm with a fused epilogue (the op
     * then runs plain products and kernels): show it in the test's output. */
    if (getenv("ACCEL_LOG_LEVEL") == NULL) {
        setenv("ACCEL_LOG_LEVEL", "info", 1);
    }
    CHECK_OK(NULL, nn_ctx_new(&gcpu));
    CHECK_OK(NULL, nn_ctx_new(&ggpu));
    accel_status st = nn_ctx_set_device(ggpu, (accel_device){ACCEL_DEVICE_CUDA, 0});
    if (st != ACCEL_OK) {
        CHECK_MSG(st == ACCEL_EUNSUPPORTED, "%s: %s", accel_status_name(st),
                  accel_last_error(NULL));
        fprintf(stderr, "%s: skipped: %s\n", prog, accel_last_error(NULL));
        nn_ctx_free(ggpu);
        nn_ctx_free(gcpu);
        return 77;
    }
    CHECK(nn_ctx_device(ggpu).type == ACCEL_DEVICE_CUDA);
    const char *s = getenv("ACCEL_TEST_SEED");
    seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("%s: seed %llu (ACCEL_TEST_SEED=%llu repeats this run)\n", prog,
           (unsigned long long)seed, (unsigned long long)seed);
    fflush(stdout);
    poison_buf = xmalloc((size_t)POISON_N * sizeof(float));
    for (int64_t i = 0; i < POISON_N; i++) {
        poison_buf[i] = NAN;
    }
    return 0;
}

static inline void nn_cuda_check_done(const char *prog)
{
    free(poison_buf);
    nn_ctx_free(ggpu);
    nn_ctx_free(gcpu);
    printf("%s: ok\n", prog);
}

#endif
