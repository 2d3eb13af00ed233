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

/* Four values folded into a thread's running max m, sum s of exp(v - m) and plain sum sx. */
__device__ __forceinline__ void lce_fold4(float4 v, float &m, float &s, float &sx)
{
    sx += (v.x + v.y) + (v.z + v.w);
    online_max(m, s, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    s += (exp_from(v.x, m) + exp_from(v.y, m)) + (exp_from(v.z, m) + exp_from(v.w, m));
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
        lce_fold4(x4[j], m, s, sx);
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

/* ---- the row in shared memory: one read of the logits ---- */

/* Four gradients of lce_grad (elements c..c+3), the target's test once for the four. */
__device__ __forceinline__ float4 lce_grad4(float4 v, int64_t c, int64_t tr, int ignored, float l,
                                            float uni, float scale, float eps)
{
    if (ignored) {
        return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float4 g = make_float4(scale * (expf(v.x - l) - uni), scale * (expf(v.y - l) - uni),
                           scale * (expf(v.z - l) - uni), scale * (expf(v.w - l) - uni));
    if ((uint64_t)(tr - c) < 4) { /* the target is one of the four */
        float d = scale * (1.0f - eps);
        int k = (int)(tr - c);
        g.x = k == 0 ? g.x - d : g.x;
        g.y = k == 1 ? g.y - d : g.y;
        g.z = k == 2 ? g.z - d : g.z;
        g.w = k == 3 ? g.w - d : g.w;
    }
    return g;
}

/* The block's max m, sum s of exp(v - m) and plain sum sx from every thread's, behind one
 * barrier: each warp folds its lanes' (s rescaled to the warp's max), writes three values into
 * half `par` of sh (2 x 96 floats), and every warp folds the warps'. The halves alternate row
 * by row: a warp that has passed this barrier can only reach the next row's reduction (which
 * writes the other half) before the slowest warp has read this one, and cannot reach the one
 * after (this half again) before every warp has passed the next barrier. */
__device__ __forceinline__ void lce_block_stats(float &m, float &s, float &sx, float *sh, int par)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float mw = warp_max(m);
    s = warp_sum(m == -INFINITY ? 0.0f : s * expf(m - mw));
    sx = warp_sum(sx);
    float *h = sh + 96 * par;
    if (lane == 0) {
        h[w] = mw;
        h[32 + w] = s;
        h[64 + w] = sx;
    }
    __syncthreads();
    mw = lane < nw ? h[lane] : -INFINITY;
    float sw = lane < nw ? h[32 + lane] : 0.0f, sxw = lane < nw ? h[64 + lane] : 0.0f;
    m = warp_max(mw);
    s = warp_sum(mw == -INFINITY ? 0.0f : sw * expf(mw - m));
    sx = warp_sum(sxw);
}

/* Loads of the next row in flight per thread (x 16 bytes x LCE_THREADS: 80 KB per SM). A
 * 50304-wide row is 12576 slots, 12 or 13 a thread: 5 at a time makes every thread's sweep
 * three round trips to memory (4 at a time made threads 0-287 wait on a fourth, and the row's
 * barrier wait for them). 61 registers (ptxas, sm_90), under the 64 of 1024 threads. */
#define LCE_BATCH 5

/* One sweep over a thread's share of a row's 16-byte slots (j = threadIdx.x + k LCE_THREADS):
 * where cur_r >= 0 the gradient of row cur_r from its slots in row (written to x's row, rnd 0,
 * or rounded into gh), then, where nx is not NULL, the next row's slot loaded from nx into the
 * same place and folded into m, s, sx. A thread touches only its own slots, so a sweep needs no
 * barrier, and the next row's loads (LCE_BATCH at a time) overlap the gradient's arithmetic. */
__device__ __forceinline__ void lce_sweep(float4 *row, int64_t n4, int64_t cur_r, float4 *x4,
                                          int64_t tr, int ignored, float l, float uni, float scale,
                                          float eps, int rnd, void *gh, const float4 *nx, float &m,
                                          float &s, float &sx)
{
    for (int64_t j0 = threadIdx.x; j0 < n4; j0 += LCE_BATCH * LCE_THREADS) {
        float4 nv[LCE_BATCH];
#pragma unroll
        for (int u = 0; u < LCE_BATCH; u++) {
            int64_t j = j0 + (int64_t)u * LCE_THREADS;
            if (nx != NULL && j < n4) {
                nv[u] = nx[j];
            }
        }
#pragma unroll
        for (int u = 0; u < LCE_BATCH; u++) {
            int64_t j = j0 + (int64_t)u * LCE_THREADS;
            if (j >= n4) {
                break;
            }
            if (cur_r >= 0) {
                float4 g = lce_grad4(row[j], 4 * j, tr, ignored, l, uni, scale, eps);
                if (rnd == 0) {
                    x4[j] = g;
                } else {
                    ((uint2 *)gh)[cur_r * n4 + j] = pack_half4(g, rnd);
                }
            }
            if (nx != NULL) {
                row[j] = nv[u];
                lce_fold4(nv[u], m, s, sx);
            }
        }
    }
}

/* lce_row with the gradient, for rows of 16-byte vectors that fit shared memory (n4 x 16 bytes
 * of dynamic shared memory): the logits are read from memory once. Each block walks rows
 * blockIdx.x, + gridDim.x, ...; the sweep that writes one row's gradient from shared memory
 * loads the next row into the slots it frees, so the loads stay in flight through the
 * arithmetic, and the statistics need one barrier per row (lce_block_stats). */
__global__ void __launch_bounds__(LCE_THREADS)
    k_lce_rows_smem(float *x, const int32_t *t, int64_t rows, int64_t C, int64_t ignore, float eps,
                    float scale, int rnd, void *gh, float *row_loss)
{
    extern __shared__ float4 lce_smem_row[];
    __shared__ float sh[2 * 96];
    int64_t n4 = C / 4, r = blockIdx.x;
    float uni = eps / (float)C;
    float m = -INFINITY, s = 0.0f, sx = 0.0f;
    /* The target's logit, read by thread 0 before the row's gradient can overwrite it. */
    int64_t tr = t[r];
    float xt = threadIdx.x == 0 && tr != ignore ? x[r * C + tr] : 0.0f;
    lce_sweep(lce_smem_row, n4, -1, NULL, 0, 1, 0.0f, uni, scale, eps, rnd, gh,
              (const float4 *)(x + r * C), m, s, sx);
    for (int par = 0; r < rows; par ^= 1) {
        lce_block_stats(m, s, sx, sh, par);
        int ignored = tr == ignore;
        float l = m + logf(s);
        if (threadIdx.x == 0) {
            row_loss[r] = ignored ? 0.0f : l - (1.0f - eps) * xt - uni * sx;
        }
        int64_t rn = r + gridDim.x, trn = rn < rows ? t[rn] : ignore;
        float xtn = threadIdx.x == 0 && rn < rows && trn != ignore ? x[rn * C + trn] : 0.0f;
        m = -INFINITY;
        s = 0.0f;
        sx = 0.0f;
        lce_sweep(lce_smem_row, n4, r, (float4 *)(x + r * C), tr, ignored, l, uni, scale, eps, rnd,
                  gh, rn < rows ? (const float4 *)(x + rn * C) : NULL, m, s, sx);
        r = rn;
        tr = trn;
        xt = xtn;
    }
}

/* The device's SMs (k_lce_rows' blocks) and the dynamic shared memory a block may opt into,
 * looked up once: lce_optin is stored before lce_sms is published (release / acquire), so a
 * caller that saw the SM count reads the limit too. */
static std::atomic<int> lce_sms(0), lce_optin(0);

static unsigned lce_blocks(void)
{
    int n = lce_sms.load(std::memory_order_acquire);
    if (n == 0) {
        int dev = 0;
        cudaDeviceProp p;
        int ok =
            cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess;
        n = ok && p.multiProcessorCount > 0 ? p.multiProcessorCount : 132;
        lce_optin.store(ok ? (int)p.sharedMemPerBlockOptin : 48 << 10, std::memory_order_relaxed);
        lce_sms.store(n, std::memory_order_release);
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
    /* The row in shared memory (GPT-2's 50304 logits: 201 KB of the H200's 227 KB) beside the
     * reductions' 768 static bytes. */
    size_t smem = (size_t)n4 * 16;
    if (grad && n4 > 0 && 4 * n4 == C &&
        smem + 2 * 96 * sizeof(float) <= (size_t)lce_optin.load(std::memory_order_relaxed)) {
        /* Set on every launch that needs it: the attribute is per device, and this is cheap. */
        if (smem > (48 << 10)) {
            cudaError_t e =
                cudaFuncSetAttribute((const void *)k_lce_rows_smem,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) {
                return e;
            }
        }
        k_lce_rows_smem<<<grid, LCE_THREADS, smem, s>>>(x, t, rows, C, ignore, eps, scale, rnd, gh,
                                                        row_loss);
        return cudaGetLastError();
    }
    k_lce_rows<<<grid, LCE_THREADS, 0, s>>>(x, t, rows, C, n4, ignore, eps, scale, grad, rnd, gh,
                                            row_loss);
    return cudaGetLastError();
}

} /* extern "C" */
