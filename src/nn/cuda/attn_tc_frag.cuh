/*
 * What the 32-rows-a-warp forward (attn_tc_fwd.cu) and the hd-64 backward (attn_tc_bwd2.cu)
 * share: bf16 WMMA fragments filled by the lane's own 32-bit shared loads at fixed offsets
 * (the sm_80+ layout of attn_tc.cuh, which accel__nn_cu_attn_f2_layout probes once a
 * process), 8-element row chunks as uint4, and 2^x by one MUFU op.
 * Invariant: every tile these read is [row][F2_LD] bf16 in shared memory.
 */
#ifndef ACCEL_NN_ATTN_TC_FRAG_CUH
#define ACCEL_NN_ATTN_TC_FRAG_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <mma.h>
#endif

#include "attn_tc.cuh"

/* nvcc's #pragma unroll; g++'s in the emulator build (which rewrites it in .cu files only). */
#ifdef __CUDACC__
#define F2_UNROLL _Pragma("unroll")
#else
#define F2_UNROLL _Pragma("GCC unroll 16")
#endif

typedef __nv_bfloat16 bf16;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, bf16, nvcuda::wmma::row_major>
    f2_a;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, bf16, nvcuda::wmma::col_major>
    f2_b;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f2_c;

/* Head 64 (F2_NF fragments of 16). Shared rows padded by 8 bf16 (16 bytes): a fragment's 8
 * rows g start 4 banks apart, so the 32 lanes' 32-bit reads (rows g, words q) hit 32 banks. */
#define F2_HD 64
#define F2_NF 4
#define F2_LD 72 /* F2_HD + 8 = 64 + 8: tiles [row][F2_LD] */

/* A 16 x 16 bf16 fragment whose lane pairs start at p (the tile + g LD + 2 q): a row-major
 * matrix_a (element pair j at row g + 8 (j & 1), column 2 q + 8 (j >> 1)) or a col-major
 * matrix_b stored [n][k] (pair j at n g + 8 (j >> 1), k 2 q + 8 (j & 1)): the sm_80+ layout
 * (attn_tc.cuh), which k_f2_probe checks. Four 32-bit shared loads at constant offsets. */
template <bool B, typename F> __device__ __forceinline__ void f2_frag(F &f, const bf16 *p)
{
    F2_UNROLL
    for (int j = 0; j < 4; j++) {
        int off = B ? 8 * (j >> 1) * F2_LD + 8 * (j & 1) : 8 * (j & 1) * F2_LD + 8 * (j >> 1);
        uint32_t w = *reinterpret_cast<const uint32_t *>(p + off);
        memcpy(static_cast<void *>(&f.x[2 * j]), &w, sizeof w);
    }
}

/* 8 consecutive elements of a source row (fp32 or bf16) as 8 bf16 in a uint4, or zeros. */
__device__ __forceinline__ uint4 f2_get8(const float *p, bool ok)
{
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    if (ok) {
        float4 a = reinterpret_cast<const float4 *>(p)[0],
               b = reinterpret_cast<const float4 *>(p)[1];
        __nv_bfloat162 h[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                               __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
        memcpy(&r, h, sizeof r);
    }
    return r;
}
__device__ __forceinline__ uint4 f2_get8(const bf16 *p, bool ok)
{
    return ok ? *reinterpret_cast<const uint4 *>(p) : make_uint4(0u, 0u, 0u, 0u);
}

/* 2^x, results below 2^-126 flushed to zero: ex2.approx.ftz, one MUFU op, where exp2f adds
 * a range test and two predicated multiplies to keep such results as denormals (which P,
 * rounded to bf16 next to values near 1, and l need not). The emulator has no PTX: exp2f. */
__device__ __forceinline__ float f2_exp2(float x)
{
#ifdef __CUDA_ARCH__
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);
#endif
}

#endif
