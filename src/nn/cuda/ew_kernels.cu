/*
 * The nn toolkit's element-wise kernels (launchers in nn_kernels.h). They move 16-byte vectors
 * (four floats; four 2-byte values in one 8-byte store) where the launcher found every pointer
 * aligned, then finish the scalar tail, so each one is a single pass at memory speed. The sums
 * over rows (bias gradients, LayerNorm's parameter-gradient fallback, the fused MLP's hidden
 * gradient with its bias gradient) are in sum_kernels.cu.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "nn_kernels.h"
#include "nn_kernels_dev.cuh"

/* ---- vectors ---- */

/* n4 = n / 4 when every pointer is 16-byte aligned (a kernel then moves float4s), else 0. */
static inline int64_t vec4_count(int64_t n, const void *a, const void *b, const void *c)
{
    uintptr_t any = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return (any & 15) == 0 ? n / 4 : 0;
}

/* Blocks for n elements of which n4 vectors. */
static inline unsigned vec_grid(int64_t n4, int64_t n)
{
    return grid_for(n4 > 0 ? n4 : n);
}

/* The scalar elements after the vectors: [4 n4, n), grid-strided. */
#define TAIL_LOOP(i, n4, n)                                                                        \
    for (int64_t i = 4 * (n4) + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float4 rnd4(float4 v, int rnd)
{
    return make_float4(rnd_dt(v.x, rnd), rnd_dt(v.y, rnd), rnd_dt(v.z, rnd), rnd_dt(v.w, rnd));
}

/* *d = v (write) or *d + v, one 16-byte load and store. */
__device__ __forceinline__ void store4(float4 *d, float4 v, int write)
{
    if (!write) {
        float4 o = *d;
        v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
    }
    *d = v;
}

/* ---- element-wise ---- */

/* a4 / b4: the operands' vector counts (both multiples of 4 floats when n4 > 0). */
__global__ void k_add(const float *a, int64_t na, const float *b, int64_t nb, float *y, int64_t n4,
                      int64_t n)
{
    /* No 64-bit remainder (tens of instructions) for the operand as large as y. */
    int64_t a4 = na / 4, b4 = nb / 4;
    GRID_LOOP(i, n4)
    {
        float4 u = ((const float4 *)a)[a4 == n4 ? i : i % a4];
        float4 v = ((const float4 *)b)[b4 == n4 ? i : i % b4];
        ((float4 *)y)[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
    }
    TAIL_LOOP(i, n4, n)
    {
        y[i] = a[na == n ? i : i % na] + b[nb == n ? i : i % nb];
    }
}

__global__ void k_acc(float *dst, const float *src, int64_t n4, int64_t n, int rnd, int write)
{
    GRID_LOOP(i, n4)
    {
        store4((float4 *)dst + i, rnd4(((const float4 *)src)[i], rnd), write);
    }
    TAIL_LOOP(i, n4, n)
    {
        float v = rnd_dt(src[i], rnd);
        dst[i] = write ? v : dst[i] + v;
    }
}

/* k_acc without rounding, also writing the result rounded to dt into the 2-byte h (a half
 * shadow of dst): one more 8-byte store a vector instead of a rounding pass over dst. */
__global__ void k_acc_shadow(float *dst, const float *src, int64_t n4, int64_t n, int write,
                             void *h, int dt)
{
    GRID_LOOP(i, n4)
    {
        float4 v = ((const float4 *)src)[i];
        if (!write) {
            float4 o = ((const float4 *)dst)[i];
            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
        }
        ((float4 *)dst)[i] = v;
        ((uint2 *)h)[i] = pack_half4(v, dt);
    }
    TAIL_LOOP(i, n4, n)
    {
        float v = write ? src[i] : dst[i] + src[i];
        dst[i] = v;
        ((uint16_t *)h)[i] = half_bits(v, dt);
    }
}

/* Four vectors a thread, a grid stride apart, all loaded (and dst's too when adding) before
 * any is stored: the compiler may not move a load above a store it cannot prove elsewhere, so
 * a vector at a time kept 8 bytes a thread in flight when writing (16 KiB an SM, about half
 * what HBM's latency needs); four keep 32 (80 when adding). The launcher sizes the grid for
 * four vectors a thread. The same arithmetic per element: the same bits. */
__global__ void k_acc_half(float *dst, const void *src, int64_t n4, int64_t n, int dt, int write)
{
    const uint16_t *h = (const uint16_t *)src;
    const uint2 *s2 = (const uint2 *)src;
    float4 *d4 = (float4 *)dst;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        uint2 u[4];
        float4 o[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u[k] = s2[i + k * stride];
            o[k] = write ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : d4[i + k * stride];
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 v = widen4(u[k], dt);
            if (!write) {
                v = make_float4(o[k].x + v.x, o[k].y + v.y, o[k].z + v.z, o[k].w + v.w);
            }
            d4[i + k * stride] = v;
        }
    }
    for (; i < n4; i += stride) {
        store4(d4 + i, widen4(s2[i], dt), write);
    }
    TAIL_LOOP(i, n4, n)
    {
        float v = half_f(h[i], dt);
        dst[i] = write ? v : dst[i] + v;
    }
}

__global__ void k_scale_acc(float *dst, const float *src, int64_t n4, int64_t n, const float *seed,
                            int rnd, int write)
{
    float f = *seed;
    GRID_LOOP(i, n4)
    {
        float4 v = ((const float4 *)src)[i];
        store4((float4 *)dst + i, rnd4(make_float4(f * v.x, f * v.y, f * v.z, f * v.w), rnd),
               write);
    }
    TAIL_LOOP(i, n4, n)
    {
        float v = rnd_dt(f * src[i], rnd);
        dst[i] = write ? v : dst[i] + v;
    }
}

/* k_scale_acc's written values (rnd = dt) as their 2-byte bits. */
__global__ void k_scale_half(void *dst, const float *src, int64_t n4, int64_t n, const float *seed,
                             int dt)
{
    float f = *seed;
    GRID_LOOP(i, n4)
    {
        float4 v = ((const float4 *)src)[i];
        ((uint2 *)dst)[i] = pack_half4(make_float4(f * v.x, f * v.y, f * v.z, f * v.w), dt);
    }
    TAIL_LOOP(i, n4, n)
    {
        ((uint16_t *)dst)[i] = half_bits(f * src[i], dt);
    }
}

__global__ void k_to_half(const float *src, void *dst, int64_t n4, int64_t n, int dt)
{
    GRID_LOOP(i, n4)
    {
        ((uint2 *)dst)[i] = pack_half4(((const float4 *)src)[i], dt);
    }
    TAIL_LOOP(i, n4, n)
    {
        ((uint16_t *)dst)[i] = half_bits(src[i], dt);
    }
}

__global__ void k_gelu(const float *x, float *y, int64_t n4, int64_t n, int approximate)
{
    GRID_LOOP(i, n4)
    {
        float4 v = ((const float4 *)x)[i];
        ((float4 *)y)[i] = make_float4(gelu_f(v.x, approximate), gelu_f(v.y, approximate),
                                       gelu_f(v.z, approximate), gelu_f(v.w, approximate));
    }
    TAIL_LOOP(i, n4, n)
    {
        y[i] = gelu_f(x[i], approximate);
    }
}

__global__ void k_gelu_bwd(const float *x, const float *gy, float *gx, int64_t n4, int64_t n,
                           int approximate, int write)
{
    GRID_LOOP(i, n4)
    {
        float4 v = ((const float4 *)x)[i], g = ((const float4 *)gy)[i];
        float4 d =
            make_float4(g.x * gelu_grad(v.x, approximate), g.y * gelu_grad(v.y, approximate),
                        g.z * gelu_grad(v.z, approximate), g.w * gelu_grad(v.w, approximate));
        store4((float4 *)gx + i, d, write);
    }
    TAIL_LOOP(i, n4, n)
    {
        float v = gy[i] * gelu_grad(x[i], approximate);
        gx[i] = write ? v : gx[i] + v;
    }
}

/* ---- launchers ---- */

extern "C" {

cudaError_t nn_cu_add(cudaStream_t s, const float *a, int64_t na, const float *b, int64_t nb,
                      float *y)
{
    int64_t n = na > nb ? na : nb;
    int64_t n4 = na > 0 && nb > 0 && na % 4 == 0 && nb % 4 == 0 ? vec4_count(n, a, b, y) : 0;
    k_add<<<vec_grid(n4, n), THREADS, 0, s>>>(a, na, b, nb, y, n4, n);
    return cudaGetLastError();
}

cudaError_t nn_cu_acc(cudaStream_t s, float *dst, const float *src, int64_t n, int rnd, int write)
{
    int64_t n4 = vec4_count(n, dst, src, NULL);
    k_acc<<<vec_grid(n4, n), THREADS, 0, s>>>(dst, src, n4, n, rnd, write);
    return cudaGetLastError();
}

cudaError_t nn_cu_acc_shadow(cudaStream_t s, float *dst, const float *src, int64_t n, int write,
                             void *h, int dt)
{
    /* The 2-byte shadow takes 8-byte stores. */
    int64_t n4 = ((uintptr_t)h & 7) == 0 ? vec4_count(n, dst, src, NULL) : 0;
    k_acc_shadow<<<vec_grid(n4, n), THREADS, 0, s>>>(dst, src, n4, n, write, h, dt);
    return cudaGetLastError();
}

cudaError_t nn_cu_acc_half(cudaStream_t s, float *dst, const void *src, int64_t n, int dt,
                           int write)
{
    /* The 2-byte source takes 8-byte loads. */
    int64_t n4 = ((uintptr_t)src & 7) == 0 ? vec4_count(n, dst, NULL, NULL) : 0;
    k_acc_half<<<vec_grid((n4 + 3) / 4, n), THREADS, 0, s>>>(dst, src, n4, n, dt, write);
    return cudaGetLastError();
}

cudaError_t nn_cu_scale_acc(cudaStream_t s, float *dst, const float *src, int64_t n,
                            const float *seed, int rnd, int write)
{
    int64_t n4 = vec4_count(n, dst, src, NULL);
    k_scale_acc<<<vec_grid(n4, n), THREADS, 0, s>>>(dst, src, n4, n, seed, rnd, write);
    return cudaGetLastError();
}

cudaError_t nn_cu_scale_half(cudaStream_t s, void *dst, const float *src, int64_t n,
                             const float *seed, int dt)
{
    /* The 2-byte destination takes 8-byte stores. */
    int64_t n4 = ((uintptr_t)dst & 7) == 0 ? vec4_count(n, src, NULL, NULL) : 0;
    k_scale_half<<<vec_grid(n4, n), THREADS, 0, s>>>(dst, src, n4, n, seed, dt);
    return cudaGetLastError();
}

cudaError_t nn_cu_to_half(cudaStream_t s, const float *src, void *dst, int64_t n, int dt)
{
    /* The 2-byte destination takes 8-byte stores. */
    int64_t n4 = ((uintptr_t)dst & 7) == 0 ? vec4_count(n, src, NULL, NULL) : 0;
    k_to_half<<<vec_grid(n4, n), THREADS, 0, s>>>(src, dst, n4, n, dt);
    return cudaGetLastError();
}

cudaError_t nn_cu_gelu(cudaStream_t s, const float *x, float *y, int64_t n, int approximate)
{
    int64_t n4 = vec4_count(n, x, y, NULL);
    k_gelu<<<vec_grid(n4, n), THREADS, 0, s>>>(x, y, n4, n, approximate);
    return cudaGetLastError();
}

cudaError_t nn_cu_gelu_bwd(cudaStream_t s, const float *x, const float *gy, float *gx, int64_t n,
                           int approximate, int write)
{
    int64_t n4 = vec4_count(n, x, gy, gx);
    k_gelu_bwd<<<vec_grid(n4, n), THREADS, 0, s>>>(x, gy, gx, n4, n, approximate, write);
    return cudaGetLastError();
}

} /* extern "C" */

/* ---- the fused MLP's 2-byte fallback (lt_gpu.c's epilogue_kernels_half) ---- */

__global__ void k_bias_gelu_half(const float *t, const void *bias, int64_t m, int64_t n, void *aux,
                                 void *h, int dt)
{
    GRID_LOOP(i, n)
    {
        float z = t[i] + (bias != NULL ? half_f(((const uint16_t *)bias)[i % m], dt) : 0.0f);
        ((uint16_t *)aux)[i] = half_bits(z, dt);
        ((uint16_t *)h)[i] = half_bits(gelu_f(z, 1), dt);
    }
}

__global__ void k_dgelu_half(float *t, const void *aux, int64_t n, int dt)
{
    GRID_LOOP(i, n)
    {
        t[i] *= gelu_grad(half_f(((const uint16_t *)aux)[i], dt), 1);
    }
}

extern "C" {

cudaError_t nn_cu_bias_gelu_half(cudaStream_t s, const float *t, const void *bias, int64_t m,
                                 int64_t n, void *aux, void *h, int dt)
{
    k_bias_gelu_half<<<grid_for(n), THREADS, 0, s>>>(t, bias, m, n, aux, h, dt);
    return cudaGetLastError();
}

cudaError_t nn_cu_dgelu_half(cudaStream_t s, float *t, const void *aux, int64_t n, int dt)
{
    k_dgelu_half<<<grid_for(n), THREADS, 0, s>>>(t, aux, n, dt);
    return cudaGetLastError();
}

} /* extern "C" */
