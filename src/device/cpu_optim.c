/*
 * The CPU device's optimizer kernels (SGD, Adam / AdamW): plain loops over parallel flat
 * arrays, written so that the compiler vectorises them, compiled for AVX-512 / AVX2 / baseline
 * with runtime dispatch (target_clones), and split over OpenMP threads when the range is large
 * and the call is on the default stream. Each element's arithmetic follows torch.optim's
 * single-tensor implementation in fp32, in the same order, so results are bit-identical
 * whatever the vector width or thread count.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* -O2's "very cheap" cost model refuses any loop whose trip count is not a known multiple of
 * the vector width (all of these), which would leave them scalar in every clone. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#include <math.h>
#include <string.h>
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86_ADAM 1
#endif

#include "base/cpu.h"
#include "cpu_impl.h"
#include "optim_coef.h"

KERNEL static void sgd_range(float *restrict p, const float *restrict g, float *restrict buf,
                             size_t n, float lr, float wd, float momentum, float dampening,
                             int nesterov, int maximize, int first_step)
{
    float sign = maximize ? -1.0f : 1.0f;
    if (momentum == 0.0f) {
        for (size_t i = 0; i < n; i++) {
            float d = sign * g[i] + wd * p[i];
            p[i] = p[i] - lr * d;
        }
        return;
    }
    float keep = 1.0f - dampening;
    for (size_t i = 0; i < n; i++) {
        float d = sign * g[i] + wd * p[i];
        float b = first_step ? d : momentum * buf[i] + keep * d;
        buf[i] = b;
        float u = nesterov ? d + momentum * b : b;
        p[i] = p[i] - lr * u;
    }
}

void accel__cpu_sgd(const accel__sgd_args *a, int parallel)
{
    float *p = a->param, *buf = a->momentum_buf;
    const float *g = a->grad;
    size_t n = a->count;
#ifdef ACCEL_HAVE_OPENMP
    if (parallel && n >= ACCEL__CPU_PARALLEL_MIN) {
        const size_t chunk = 16384;
        long long nchunks = (long long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
        for (long long c = 0; c < nchunks; c++) {
            size_t lo = (size_t)c * chunk, len = (n - lo < chunk) ? n - lo : chunk;
            sgd_range(p + lo, g + lo, buf ? buf + lo : NULL, len, a->lr, a->weight_decay,
                      a->momentum, a->dampening, a->nesterov, a->maximize, a->first_step);
        }
        return;
    }
#endif
    (void)parallel;
    sgd_range(p, g, buf, n, a->lr, a->weight_decay, a->momentum, a->dampening, a->nesterov,
              a->maximize, a->first_step);
}

/* Elements [0, n) in plain C; vmax (amsgrad) may be NULL. */
static void adam_scalar(const accel__adam_coef *c, float *restrict p, const float *restrict g,
                        float *restrict m, float *restrict v, float *restrict vmax, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float grad = c->sign * g[i] + c->l2 * p[i];
        float param = p[i] * c->decay;
        /* exp_avg.lerp_(grad, 1 - beta1) */
        float mi = m[i] + c->w1 * (grad - m[i]);
        float vi = v[i] * c->beta2 + c->w2 * grad * grad;
        m[i] = mi;
        v[i] = vi;
        float s = vi;
        if (vmax != NULL) {
            s = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = s;
        }
        float denom = sqrtf(s) / c->bc2_sqrt + c->eps;
        p[i] = param - c->step_size * (mi / denom);
    }
}

/*
 * The same arithmetic, operation for operation (separate multiplies and adds, no FMA; IEEE
 * sqrt and division), 16 or 8 lanes at a time, so results are bit-identical to adam_scalar.
 * Written with intrinsics because the compiler will not vectorise the scalar loop: sqrtf may
 * set errno, and -fno-math-errno cannot be given per file. Each returns how many leading
 * elements it did (a multiple of its width); amsgrad stays scalar.
 */
#ifdef HAVE_X86_ADAM
#define ADAM_SIMD_BODY(W, VEC, LOAD, STORE, SET1, ADD, SUB, MUL, DIV, SQRT)                        \
    VEC sign = SET1(c->sign), l2 = SET1(c->l2), decay = SET1(c->decay), w1 = SET1(c->w1);          \
    VEC beta2 = SET1(c->beta2), w2 = SET1(c->w2), eps = SET1(c->eps);                              \
    VEC bc2 = SET1(c->bc2_sqrt), step = SET1(c->step_size);                                        \
    size_t i = 0;                                                                                  \
    for (; i + (W) <= n; i += (W)) {                                                               \
        VEC pi = LOAD(p + i), gi = LOAD(g + i), mo = LOAD(m + i), vo = LOAD(v + i);                \
        VEC grad = ADD(MUL(sign, gi), MUL(l2, pi));                                                \
        VEC param = MUL(pi, decay);                                                                \
        VEC mi = ADD(mo, MUL(w1, SUB(grad, mo)));                                                  \
        VEC vi = ADD(MUL(vo, beta2), MUL(MUL(w2, grad), grad));                                    \
        STORE(m + i, mi);                                                                          \
        STORE(v + i, vi);                                                                          \
        VEC denom = ADD(DIV(SQRT(vi), bc2), eps);                                                  \
        STORE(p + i, SUB(param, MUL(step, DIV(mi, denom))));                                       \
    }                                                                                              \
    return i

__attribute__((target("avx512f"))) static size_t
adam_avx512(const accel__adam_coef *c, float *p, const float *g, float *m, float *v, size_t n)
{
    ADAM_SIMD_BODY(16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_add_ps,
                   _mm512_sub_ps, _mm512_mul_ps, _mm512_div_ps, _mm512_sqrt_ps);
}

__attribute__((target("avx2"))) static size_t
adam_avx2(const accel__adam_coef *c, float *p, const float *g, float *m, float *v, size_t n)
{
    ADAM_SIMD_BODY(8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_add_ps,
                   _mm256_sub_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps);
}
#endif

static void adam_range(float *restrict p, const float *restrict g, float *restrict m,
                       float *restrict v, float *restrict vmax, size_t n, float lr, float wd,
                       int decoupled, float beta1, float beta2, float eps, float bc1,
                       float bc2_sqrt, int maximize)
{
    accel__adam_coef c =
        accel__adam_coef_make(lr, wd, decoupled, beta1, beta2, eps, bc1, bc2_sqrt, maximize);
    size_t done = 0;
#ifdef HAVE_X86_ADAM
    if (vmax == NULL) {
        if (accel__cpu_has(ACCEL__CPU_AVX512F)) {
            done = adam_avx512(&c, p, g, m, v, n);
        } else if (accel__cpu_has(ACCEL__CPU_AVX2)) {
            done = adam_avx2(&c, p, g, m, v, n);
        }
    }
#endif
    adam_scalar(&c, p + done, g + done, m + done, v + done, vmax ? vmax + done : NULL, n - done);
}

void accel__cpu_adam(const accel__adam_args *a, int parallel)
{
    float *p = a->param, *m = a->exp_avg, *v = a->exp_avg_sq, *vmax = a->max_exp_avg_sq;
    const float *g = a->grad;
    size_t n = a->count;
    float lr = a->lr, wd = a->weight_decay, beta1 = a->beta1, beta2 = a->beta2, eps = a->eps;
    float bias_correction1 = a->bias_correction1;
    float bias_correction2_sqrt = a->bias_correction2_sqrt;
    int decoupled = a->decoupled, maximize = a->maximize;
#ifdef ACCEL_HAVE_OPENMP
    if (parallel && n >= ACCEL__CPU_PARALLEL_MIN) {
        const size_t chunk = 16384;
        long long nchunks = (long long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
        for (long long c = 0; c < nchunks; c++) {
            size_t lo = (size_t)c * chunk, len = (n - lo < chunk) ? n - lo : chunk;
            adam_range(p + lo, g + lo, m + lo, v + lo, vmax ? vmax + lo : NULL, len, lr, wd,
                       decoupled, beta1, beta2, eps, bias_correction1, bias_correction2_sqrt,
                       maximize);
        }
        return;
    }
#endif
    (void)parallel;
    adam_range(p, g, m, v, vmax, n, lr, wd, decoupled, beta1, beta2, eps, bias_correction1,
               bias_correction2_sqrt, maximize);
}
