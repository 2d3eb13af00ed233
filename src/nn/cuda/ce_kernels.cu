/*
 * The nn toolkit's cross-entropy kernels (launchers in nn_kernels.h): the loss and gradient of
 * nn_cross_entropy over a logits matrix (one block per row, block reductions), the fixed-order
 * mean of the row losses, and nn_linear_cross_entropy's fused pass over a chunk of logits with
 * the scaled accumulation of its products. No atomics: every sum's order depends only on the
 * shapes, so results are deterministic.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "nn_kernels.h"
#include "nn_kernels_dev.cuh"

/* ---- cross entropy ---- */

__global__ void k_ce_fwd(const float *x, const int32_t *t, int64_t C, int64_t ignore, float eps,
                         float *lse, float *row_loss)
{
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * C;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        m = fmaxf(m, xr[c]);
    }
    m = block_reduce(m, sh, 1);
    float s = 0.0f, sx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        s += expf(xr[c] - m);
        sx += xr[c];
    }
    s = block_reduce(s, sh, 0);
    sx = block_reduce(sx, sh, 0);
    if (threadIdx.x == 0) {
        float l = m + logf(s);
        lse[r] = l;
        row_loss[r] = t[r] == ignore ? 0.0f : l - (1.0f - eps) * xr[t[r]] - eps / (float)C * sx;
    }
}

/* One block: a fixed-order sum in double (each thread a strided part, then a tree). */
__global__ void k_sum_div(const float *v, int64_t n, double divisor, float *y)
{
    __shared__ double sh[ROW_THREADS];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        s += v[i];
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) {
            sh[threadIdx.x] += sh[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *y = (float)(sh[0] / divisor);
    }
}

__global__ void k_ce_bwd(const float *x, const int32_t *t, const float *lse, const float *gy,
                         int64_t C, int64_t ignore, float eps, float scale, int per_row, float *gx,
                         int write)
{
    int64_t r = blockIdx.x;
    float *gxr = gx + r * C;
    if (t[r] == ignore) {
        for (int64_t c = threadIdx.x; write && c < C; c += blockDim.x) {
            gxr[c] = 0.0f;
        }
        return;
    }
    const float *xr = x + r * C;
    float gr = (per_row ? gy[r] : gy[0]) * scale, l = lse[r], uni = eps / (float)C;
    int64_t tr = t[r];
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = gr * (expf(xr[c] - l) - uni);
        if (c == tr) {
            v -= gr * (1.0f - eps);
        }
        gxr[c] = write ? v : gxr[c] + v;
    }
}

/* ---- nn_linear_cross_entropy: the fused classifier over a chunk of logits ---- */

/* k_ce_fwd and k_ce_bwd in one pass over the row: the loss, then (grad) the logits' gradient
 * scale * (softmax - eps / C - (1 - eps) onehot), zero for an ignored row, over the logits
 * (rnd 0) or rounded into the 2-byte gh (the product's operand). */
__global__ void k_lce_rows(float *x, const int32_t *t, int64_t C, int64_t ignore, float eps,
                           float scale, int grad, int rnd, void *gh, float *row_loss)
{
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    float *xr = x + r * C;
    int64_t tr = t[r];
    int ignored = tr == ignore;
    /* Read before the first barrier, so before any thread overwrites the row. */
    float xt = threadIdx.x == 0 && !ignored ? xr[tr] : 0.0f;
    /* One pass for the max and the sum of exponentials (online softmax: the sum is rescaled
     * when the max grows), so the row is read twice in all, not three times. */
    float m = -INFINITY, s = 0.0f, sx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = xr[c];
        sx += v;
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else if (v != -INFINITY) { /* (-inf adds nothing; -inf - -inf would be NaN) */
            s += expf(v - m);
        }
    }
    float mb = block_reduce(m, sh, 1);
    s = block_reduce(m == -INFINITY ? 0.0f : s * expf(m - mb), sh, 0);
    sx = block_reduce(sx, sh, 0);
    float l = mb + logf(s), uni = eps / (float)C;
    if (threadIdx.x == 0) {
        row_loss[r] = ignored ? 0.0f : l - (1.0f - eps) * xt - uni * sx;
    }
    for (int64_t c = threadIdx.x; grad && c < C; c += blockDim.x) {
        float v = ignored ? 0.0f : scale * (expf(xr[c] - l) - uni);
        if (c == tr && !ignored) {
            v -= scale * (1.0f - eps);
        }
        if (rnd == 0) {
            xr[c] = v;
        } else if (rnd == 1) {
            ((__nv_bfloat16 *)gh)[r * C + c] = __float2bfloat16_rn(v);
        } else {
            ((__half *)gh)[r * C + c] = __float2half_rn(v);
        }
    }
}

/* ---- launchers ---- */

extern "C" {

cudaError_t nn_cu_ce_fwd(cudaStream_t s, const float *x, const int32_t *t, int64_t rows, int64_t C,
                         int64_t ignore, float eps, float *lse, float *row_loss)
{
    k_ce_fwd<<<(unsigned)rows, ROW_THREADS, 0, s>>>(x, t, C, ignore, eps, lse, row_loss);
    return cudaGetLastError();
}

cudaError_t nn_cu_sum_div(cudaStream_t s, const float *row_loss, int64_t rows, double divisor,
                          float *y)
{
    k_sum_div<<<1, ROW_THREADS, 0, s>>>(row_loss, rows, divisor, y);
    return cudaGetLastError();
}

cudaError_t nn_cu_ce_bwd(cudaStream_t s, const float *x, const int32_t *t, const float *lse,
                         const float *gy, int64_t rows, int64_t C, int64_t ignore, float eps,
                         float scale, int per_row, float *gx, int write)
{
    k_ce_bwd<<<(unsigned)rows, ROW_THREADS, 0, s>>>(x, t, lse, gy, C, ignore, eps, scale, per_row,
                                                    gx, write);
    return cudaGetLastError();
}

cudaError_t nn_cu_lce_rows(cudaStream_t s, float *x, const int32_t *t, int64_t rows, int64_t C,
                           int64_t ignore, float eps, float scale, int grad, int rnd, void *gh,
                           float *row_loss)
{
    k_lce_rows<<<(unsigned)rows, ROW_THREADS, 0, s>>>(x, t, C, ignore, eps, scale, grad, rnd, gh,
                                                      row_loss);
    return cudaGetLastError();
}

} /* extern "C" */
