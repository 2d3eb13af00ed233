/*
 * The optimizer and clipping kernels: plain loops over parallel flat arrays, written so that
 * the compiler vectorises them, compiled for AVX-512 / AVX2 / baseline with runtime dispatch
 * (target_clones), and split over OpenMP threads when the range is large. Each element's
 * arithmetic follows torch.optim's single-tensor implementation in fp32, in the same order.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* sqrtf must not set errno, or the Adam loop cannot be vectorised. */
#pragma GCC optimize("no-math-errno", "tree-vectorize")
#endif

#include <math.h>
#include <string.h>

#include "train_internal.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL
#endif

/* Below this many elements a kernel runs on the calling thread only. */
#define PARALLEL_MIN 65536

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

void accel__sgd_kernel(float *p, const float *g, float *buf, size_t n, float lr, float wd,
                       float momentum, float dampening, int nesterov, int maximize, int first_step)
{
#ifdef ACCEL_HAVE_OPENMP
    if (n >= PARALLEL_MIN) {
        const size_t chunk = 16384;
        long long nchunks = (long long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
        for (long long c = 0; c < nchunks; c++) {
            size_t lo = (size_t)c * chunk, len = (n - lo < chunk) ? n - lo : chunk;
            sgd_range(p + lo, g + lo, buf ? buf + lo : NULL, len, lr, wd, momentum, dampening,
                      nesterov, maximize, first_step);
        }
        return;
    }
#endif
    sgd_range(p, g, buf, n, lr, wd, momentum, dampening, nesterov, maximize, first_step);
}

KERNEL static void adam_range(float *restrict p, const float *restrict g, float *restrict m,
                              float *restrict v, float *restrict vmax, size_t n, float lr, float wd,
                              int decoupled, float beta1, float beta2, float eps, float bc1,
                              float bc2_sqrt, int maximize)
{
    float sign = maximize ? -1.0f : 1.0f;
    float l2 = decoupled ? 0.0f : wd;
    float decay = decoupled ? 1.0f - lr * wd : 1.0f;
    float step_size = lr / bc1;
    float w1 = 1.0f - beta1, w2 = 1.0f - beta2;
    for (size_t i = 0; i < n; i++) {
        float grad = sign * g[i] + l2 * p[i];
        float param = p[i] * decay;
        /* exp_avg.lerp_(grad, 1 - beta1) */
        float mi = m[i] + w1 * (grad - m[i]);
        float vi = v[i] * beta2 + w2 * grad * grad;
        m[i] = mi;
        v[i] = vi;
        float s = vi;
        if (vmax != NULL) {
            s = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = s;
        }
        float denom = sqrtf(s) / bc2_sqrt + eps;
        p[i] = param - step_size * (mi / denom);
    }
}

void accel__adam_kernel(float *p, const float *g, float *m, float *v, float *vmax, size_t n,
                        float lr, float wd, int decoupled, float beta1, float beta2, float eps,
                        float bias_correction1, float bias_correction2_sqrt, int maximize)
{
#ifdef ACCEL_HAVE_OPENMP
    if (n >= PARALLEL_MIN) {
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
    adam_range(p, g, m, v, vmax, n, lr, wd, decoupled, beta1, beta2, eps, bias_correction1,
               bias_correction2_sqrt, maximize);
}

KERNEL static double sq_sum(const float *restrict g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        s += (double)g[i] * (double)g[i];
    }
    return s;
}

double accel__pow_sum(const float *g, size_t n, double p)
{
    if (p == 2.0) {
        return sq_sum(g, n);
    }
    double s = 0;
    if (p == 1.0) {
        for (size_t i = 0; i < n; i++) {
            s += fabs((double)g[i]);
        }
        return s;
    }
    for (size_t i = 0; i < n; i++) {
        s += pow(fabs((double)g[i]), p);
    }
    return s;
}

double accel__abs_max(const float *g, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        double a = fabs((double)g[i]);
        if (a > mx || a != a) {
            mx = a;
            if (a != a) {
                return a; /* NaN propagates, as torch's norm */
            }
        }
    }
    return mx;
}

KERNEL void accel__scale(float *g, size_t n, float s)
{
    for (size_t i = 0; i < n; i++) {
        g[i] *= s;
    }
}
