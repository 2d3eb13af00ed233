/*
 * What the nn toolkit's CUDA kernel files (nn_kernels.cu, ce_kernels.cu, ew_kernels.cu,
 * sum_kernels.cu) share: the launch sizes, the grid-stride loop, the autocast rounding, the
 * warp and block reductions, 2-byte values to and from floats (with the packing of four for one
 * 8-byte store), and GELU with its derivative. Device code only: include it from .cu files,
 * never from C.
 */
#ifndef ACCEL_NN_CUDA_KERNELS_DEV_CUH
#define ACCEL_NN_CUDA_KERNELS_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Threads of an element-wise block and of a row kernel's block (one block per row). */
#define THREADS 256
#define ROW_THREADS 256

/* Blocks for n elements of grid-stride work (at least 1, at most 65536). */
static inline unsigned grid_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) {
        b = 1;
    }
    return (unsigned)(b > 65536 ? 65536 : b);
}

#define GRID_LOOP(i, n)                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float rnd_dt(float v, int rnd)
{
    if (rnd == 1) {
        return __bfloat162float(__float2bfloat16_rn(v));
    }
    if (rnd == 2) {
        return __half2float(__float2half_rn(v));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* Sum (or max) over the block; every thread gets the result. sh: 32 floats of shared memory. */
__device__ inline float block_reduce(float v, float *sh, int is_max)
{
    v = is_max ? warp_max(v) : warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* sh may still be read by the previous reduction */
    if (lane == 0) {
        sh[w] = v;
    }
    __syncthreads();
    v = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

/* A 2-byte value of dt (1 bf16, 2 fp16) as a float. */
__device__ __forceinline__ float half_f(uint16_t h, int dt)
{
    if (dt == 1) {
        return __uint_as_float((unsigned)h << 16);
    }
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_f(float x, int approximate)
{
    if (approximate) {
        float u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ float gelu_grad(float x, int approximate)
{
    if (approximate) {
        float x2 = x * x;
        float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x2 * x));
        float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x2);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    return cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
}

/* The 2-byte bits of v rounded to dt (1 bf16, 2 fp16), nearest even. */
__device__ __forceinline__ uint16_t half_bits(float v, int dt)
{
    uint16_t u;
    if (dt == 1) {
        __nv_bfloat16 b = __float2bfloat16_rn(v);
        memcpy(&u, &b, 2);
    } else {
        __half h = __float2half_rn(v);
        memcpy(&u, &h, 2);
    }
    return u;
}

/* Four 2-byte values of dt (one 8-byte load) as floats (exact). */
__device__ __forceinline__ float4 widen4(uint2 u, int dt)
{
    return make_float4(half_f((uint16_t)(u.x & 0xFFFFu), dt), half_f((uint16_t)(u.x >> 16), dt),
                       half_f((uint16_t)(u.y & 0xFFFFu), dt), half_f((uint16_t)(u.y >> 16), dt));
}

/* Four values rounded (dt 1 bf16, 2 fp16) and packed for one 8-byte store. */
__device__ __forceinline__ uint2 pack_half4(float4 v, int dt)
{
    uint2 u;
    if (dt == 1) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        memcpy(&u.x, &lo, 4);
        memcpy(&u.y, &hi, 4);
    } else {
        __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
        memcpy(&u.x, &lo, 4);
        memcpy(&u.y, &hi, 4);
    }
    return u;
}

#endif /* ACCEL_NN_CUDA_KERNELS_DEV_CUH */
