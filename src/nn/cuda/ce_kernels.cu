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

#include <atomic>

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

/* Threads of a k_lce_rows block (a row of V logits at a time): 1024 give each thread a dozen
 * 16-byte loads of a 50304-wide row, and the launch one block per SM (the grid walks the rows),
 * so the rows being read at once (132 x 201 KB = 26.5 MB on an H200) stay in L2 between the
 * two passes: the second pass, over the row backwards (what the first read last first), reads
 * L2 rather than memory. (256-thread blocks, one per row, kept 1056 rows in flight: 212 MB.) */
#define LCE_THREADS 1024

/* The online softmax's running max m and sum s (of exp(v - m)) after a value whose max is mx:
 * the sum rescaled where the max grows. */
__device__ __forceinline__ void online_max(float &m, float &s, float mx)
{
    if (mx > m) {
        s *= expf(m - mx); /* 0 while m is -inf: s is still 0 then */
        m = mx;
    }
}

/* exp(v - m), 0 while m is -inf (-inf values add nothing; -inf - -inf would be NaN). */
__device__ __forceinline__ float exp_from(float v, float m)
{
    return m != -INFINITY ? expf(v - m) : 0.0f;
}

/* The logits' gradient of element c: scale * (softmax - eps / C - (1 - eps) onehot). */
__device__ __forceinline__ float lce_grad(float v, int64_t c, int64_t tr, int ignored, float l,
                                          float uni, float scale, float eps)
{
    if (ignored) {
        return 0.0f;
    }
    float gv = scale * (expf(v - l) - uni);
    return c == tr ? gv - scale * (1.0f - eps) : gv;
}

/* k_ce_fwd and k_ce_bwd in two passes over the row: one read for the max, the sum of
 * exponentials (online softmax: the sum is rescaled when the max grows) and the plain sum,
 * then (grad) a read and a write of the logits' gradient, zero for an ignored row, over the
 * logits (rnd 0) or rounded into the 2-byte gh (the product's operand). n4: the row's leading
 * 16-byte vectors (0 where the launcher found a row or gh unaligned), the rest scalars. */
__device__ __forceinline__ void lce_row(int64_t r, float *sh, float *x, const int32_t *t, int64_t C,
                                        int64_t n4, int64_t ignore, float eps, float scale,
                                        int grad, int rnd, void *gh, float *row_loss)
{
    float *xr = x + r * C;
    float4 *x4 = (float4 *)xr;
    int64_t tr = t[r];
    int ignored = tr == ignore;
    /* Read before the first barrier, so before any thread overwrites the row. */
    float xt = threadIdx.x == 0 && !ignored ? xr[tr] : 0.0f;
    float m = -INFINITY, s = 0.0f, sx = 0.0f;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < n4; j += blockDim.x) {
        float4 v = x4[j];
        sx += (v.x + v.y) + (v.z + v.w);
        online_max(m, s, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        s += (exp_from(v.x, m) + exp_from(v.y, m)) + (exp_from(v.z, m) + exp_from(v.w, m));
    }
    for (int64_t c = 4 * n4 + threadIdx.x; c < C; c += blockDim.x) {
        float v = xr[c];
        sx += v;
        online_max(m, s, v);
        s += exp_from(v, m);
    }
    float mb = block_reduce(m, sh, 1);
    s = block_reduce(m == -INFINITY ? 0.0f : s * expf(m - mb), sh, 0);
    sx = block_reduce(sx, sh, 0);
    float l = mb + logf(s), uni = eps / (float)C;
    if (threadIdx.x == 0) {
        row_loss[r] = ignored ? 0.0f : l - (1.0f - eps) * xt - uni * sx;
    }
    if (!grad) {
        return;
    }
#pragma unroll 4
    for (int64_t j = n4 - 1 - threadIdx.x; j >= 0; j -= blockDim.x) {
        float4 v = x4[j];
        int64_t c = 4 * j;
        float4 g = make_float4(lce_grad(v.x, c, tr, ignored, l, uni, scale, eps),
                               lce_grad(v.y, c + 1, tr, ignored, l, uni, scale, eps),
                               lce_grad(v.z, c + 2, tr, ignored, l, uni, scale, eps),
                               lce_grad(v.w, c + 3, tr, ignored, l, uni, scale, eps));
        if (rnd == 0) {
            x4[j] = g;
        } else {
            ((uint2 *)gh)[r * (C / 4) + j] = pack_half4(g, rnd);
        }
    }
    for (int64_t c = 4 * n4 + threadIdx.x; c < C; c += blockDim.x) {
        float v = lce_grad(xr[c], c, tr, ignored, l, uni, scale, eps);
        if (rnd == 0) {
            xr[c] = v;
        } else {
            ((uint16_t *)gh)[r * C + c] = half_bits(v, rnd);
        }
    }
}

__global__ void __launch_bounds__(LCE_THREADS)
    k_lce_rows(float *x, const int32_t *t, int64_t rows, int64_t C, int64_t n4, int64_t ignore,
               float eps, float scale, int grad, int rnd, void *gh, float *row_loss)
{
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        lce_row(r, sh, x, t, C, n4, ignore, eps, scale, grad, rnd, gh, row_loss);
    }
}

/* The device's SMs (k_lce_rows' blocks), looked up once. */
static unsigned lce_blocks(void)
{
    static std::atomic<int> sms(0);
    int n = sms.load(std::memory_order_relaxed);
    if (n == 0) {
        int dev = 0;
        cudaDeviceProp p;
        n = cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess
                ? p.multiProcessorCount
                : 0;
        n = n > 0 ? n : 132;
        sms.store(n, std::memory_order_relaxed);
    }
    return (unsigned)n;
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
    /* Rows (and gh's rows) start 16-byte (8-byte) aligned when C is a multiple of 4. */
    uintptr_t al = (uintptr_t)x & 15, alh = (uintptr_t)gh & 7;
    int64_t n4 = C % 4 == 0 && al == 0 && (rnd == 0 || !grad || alh == 0) ? C / 4 : 0;
    if (rows == 0) {
        return cudaSuccess;
    }
    unsigned grid = rows < (int64_t)lce_blocks() ? (unsigned)rows : lce_blocks();
    k_lce_rows<<<grid, LCE_THREADS, 0, s>>>(x, t, rows, C, n4, ignore, eps, scale, grad, rnd, gh,
                                            row_loss);
    return cudaGetLastError();
}

} /* extern "C" */
