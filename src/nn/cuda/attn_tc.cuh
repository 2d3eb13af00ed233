/*
 * What the tensor-core attention kernels (attn_tc.cu: forward, attn_tc_bwd.cu: backward) share:
 * rounding to the autocast dtype T (bf16 or fp16) and back, and four T packed for one 64-bit
 * shared-memory store.
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

template <typename T> struct __align__(8) tc_quad
{
    T v[4];
};

#endif
