/*
 * What the tensor-core attention kernels (attn_tc.cu: forward, attn_tc_bwd.cu: backward) share:
 * rounding to the autocast dtype T (bf16 or fp16) and back, the sm_80+ fragment layout, and four
 * T packed for one 64-bit shared-memory store.
 */
#ifndef ACCEL_NN_ATTN_TC_CUH
#define ACCEL_NN_ATTN_TC_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <typename T> __device__ __forceinline__ T tc_cvt(float v);
template <> __device__ __forceinline__ __nv_bfloat16 tc_cvt<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half tc_cvt<__half>(float v)
{
    return __float2half_rn(v);
}

template <typename T> __device__ __forceinline__ float tc_f(T v);
template <> __device__ __forceinline__ float tc_f<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float tc_f<__half>(__half v)
{
    return __half2float(v);
}
/* v rounded to T and back: what a product reading v in T sees. */
template <typename T> __device__ __forceinline__ float tc_round(float v)
{
    return tc_f<T>(tc_cvt<T>(v));
}

/* The sm_80+ layout of a 16 x 16 WMMA accumulator (fp32) or bf16 matrix_a fragment (8 elements
 * a lane: mma.m16n8k16's, twice): lane l = 4 g + q holds element i at row g + 8 ((i >> 1) & 1),
 * column 2 q + (i & 1) + 8 (i >> 2). WMMA does not promise it: the forward checks it. */
__host__ __device__ __forceinline__ int tc_lay_row(int lane, int i)
{
    return (lane >> 2) + 8 * ((i >> 1) & 1);
}
__host__ __device__ __forceinline__ int tc_lay_col(int lane, int i)
{
    return 2 * (lane & 3) + (i & 1) + 8 * (i >> 2);
}

template <typename T> struct __align__(8) tc_quad
{
    T v[4];
};

#endif
