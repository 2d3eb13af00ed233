/*
 * Causal attention on tensor cores (FlashAttention-2's schedules) for bf16 / fp16 autocast.
 * Forward: one block per (batch, head, tile of 64 query rows), 4 warps of 16 rows each. The
 * Q tile and each key / value tile are rounded once into shared memory; per key tile a warp
 * computes S = Q K^T by WMMA (fp32 sums), the scale, the causal mask and the online softmax per
 * row in fp32 (running max m, sum l), P rounded to the autocast dtype, and O += P V by WMMA
 * with O kept in accumulator fragments (rescaled through shared memory when a row's max
 * grows). It writes y = O / l and lse = m + log(l) exactly where k_attn_fwd does, so either
 * backward takes its output. Backward: a dQ kernel per query tile, then a dK/dV kernel per key
 * tile (attn_tc_bwd.cu), writing gqkv exactly where k_attn_bwd_* do, rounded as they round.
 *
 * Shared memory is static and at most 48 KiB: head sizes up to 64 use key tiles of 64 (the
 * backward: 64 own rows, streamed tiles of 32), up to 128 key tiles of 32 (backward: 32 own
 * rows); larger heads, dropout and misaligned tensors run the warp kernels.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <atomic>
#ifdef __CUDACC__
#include <mma.h>
#endif

#include "nn_kernels.h"

using namespace nvcuda;

#define TC_QT 64 /* query rows per block */
#define TC_WARPS 4

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

/* rows x hd floats (row i at src + i * stride; rows from `valid` on read as zero) into dst
 * [rows][ld] rounded to T: 128-bit loads, consecutive threads along a row. */
template <typename T>
__device__ __forceinline__ void tc_load_rows(const float *src, int64_t stride, int64_t valid,
                                             int rows, int hd, T *dst, int ld)
{
    int q4 = hd / 4;
    for (int i = threadIdx.x; i < rows * q4; i += blockDim.x) {
        int r = i / q4, c = (i % q4) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < valid) {
            v = *reinterpret_cast<const float4 *>(src + r * stride + c);
        }
        tc_quad<T> q = {{tc_cvt<T>(v.x), tc_cvt<T>(v.y), tc_cvt<T>(v.z), tc_cvt<T>(v.w)}};
        *reinterpret_cast<tc_quad<T> *>(dst + r * ld + c) = q; /* one 64-bit store */
    }
}

/* rows x hd of head h from packed qkv rows [row0, row0 + rows) (part: 0 q, 1 k, 2 v) into
 * dst [rows][ld]. */
template <typename T>
__device__ __forceinline__ void tc_load_tile(const nn_cu_attn &a, const float *qkv, int64_t b,
                                             int64_t h, int part, int64_t row0, int rows, T *dst,
                                             int ld)
{
    const float *src = qkv + (b * a.T + row0) * 3 * a.C + part * a.C + h * a.hd;
    tc_load_rows<T>(src, 3 * a.C, a.T - row0, rows, (int)a.hd, dst, ld);
}

/* HDF: head size / 16 at most; KT: keys per tile. */
template <typename T, int HDF, int KT>
__global__ void __launch_bounds__(32 * TC_WARPS)
    k_attn_fwd_tc(nn_cu_attn a, const float *qkv, float *y, float *lse)
{
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> frag_a;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> frag_b_row;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> frag_b_col;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
    __shared__ __align__(32) T sq[TC_QT * 16 * HDF];
    __shared__ __align__(32) T sk[KT * 16 * HDF];
    __shared__ __align__(32) T sv[KT * 16 * HDF];
    __shared__ __align__(32) T sp[TC_QT * KT];
    __shared__ __align__(32) float ss[TC_QT * KT];

    int64_t nqt = (a.T + TC_QT - 1) / TC_QT;
    /* The longest query tiles (most keys) first, so the last wave is short ones. */
    int64_t qt = nqt - 1 - (int64_t)blockIdx.x % nqt, bh = (int64_t)blockIdx.x / nqt;
    int64_t h = bh % a.H, b = bh / a.H, t0 = qt * TC_QT;
    int hd = (int)a.hd, nf = hd / 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* Lanes 2r and 2r + 1 own row r of the warp's 16: half of its columns each. */
    int r = lane >> 1, half = lane & 1;
    int64_t wt0 = t0 + 16 * warp, t = wt0 + r;
    float *scr = ss + warp * 16 * KT; /* the warp's S rows, also its O scratch */

    tc_load_tile<T>(a, qkv, b, h, 0, t0, TC_QT, sq, hd);
    frag_c o[HDF];
#pragma unroll
    for (int f = 0; f < HDF; f++) {
        wmma::fill_fragment(o[f], 0.0f);
    }
    float m = -INFINITY, l = 0.0f;
    int64_t last = (t0 + TC_QT < a.T ? t0 + TC_QT : a.T) - 1; /* the tile's last query row */
    for (int64_t j0 = 0; j0 <= last; j0 += KT) {
        __syncthreads(); /* every warp is done with the previous K, V (and Q is loaded) */
        tc_load_tile<T>(a, qkv, b, h, 1, j0, KT, sk, hd);
        tc_load_tile<T>(a, qkv, b, h, 2, j0, KT, sv, hd);
        __syncthreads();
        if (j0 > wt0 + 15 || wt0 >= a.T) {
            continue; /* every key of the tile is after this warp's rows */
        }
        /* S = Q K^T: K's rows are B's columns, so K [KT][hd] is B col-major. */
#pragma unroll
        for (int n = 0; n < KT / 16; n++) {
            frag_c s;
            wmma::fill_fragment(s, 0.0f);
            for (int k = 0; k < nf; k++) {
                frag_a qa;
                frag_b_col kb;
                wmma::load_matrix_sync(qa, sq + 16 * warp * hd + 16 * k, hd);
                wmma::load_matrix_sync(kb, sk + 16 * n * hd + 16 * k, hd);
                wmma::mma_sync(s, qa, kb, s);
            }
            wmma::store_matrix_sync(scr + 16 * n, s, KT, wmma::mem_row_major);
        }
        __syncwarp();
        /* Online softmax of row r over this lane's half of the tile's columns. */
        const int HC = KT / 2;
        float srow[HC], mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < HC; c++) {
            int64_t j = j0 + half * HC + c;
            float v = scr[r * KT + half * HC + c] * a.scale;
            srow[c] = (j <= t && t < a.T) ? v : -INFINITY;
            mx = fmaxf(mx, srow[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float mn = fmaxf(m, mx), corr = 1.0f, sum = 0.0f;
        if (mn != -INFINITY) {
            corr = expf(m - mn);
        }
        T *pr = sp + (16 * warp + r) * KT + half * HC;
#pragma unroll
        for (int c = 0; c < HC; c++) {
            float e = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - mn);
            sum += e;
            pr[c] = tc_cvt<T>(e);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * corr + sum;
        m = mn;
        /* O *= corr per row, through the scratch (S is no longer needed), where any row's max
         * grew; the first tile's O is zero. */
        if (j0 > 0 && __any_sync(0xffffffffu, corr != 1.0f)) {
            float4 *mine = reinterpret_cast<float4 *>(scr + r * 16 + half * 8);
#pragma unroll
            for (int f = 0; f < HDF; f++) { /* unrolled, so that o stays in registers */
                if (f < nf) {
                    __syncwarp();
                    wmma::store_matrix_sync(scr, o[f], 16, wmma::mem_row_major);
                    __syncwarp();
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float4 v = mine[c];
                        mine[c] = make_float4(v.x * corr, v.y * corr, v.z * corr, v.w * corr);
                    }
                    __syncwarp();
                    wmma::load_matrix_sync(o[f], scr, 16, wmma::mem_row_major);
                }
            }
        }
        /* O += P V once every lane wrote its P; V [KT][hd] is B row-major. */
        __syncwarp();
#pragma unroll
        for (int k = 0; k < KT / 16; k++) {
            frag_a pa;
            wmma::load_matrix_sync(pa, sp + 16 * warp * KT + 16 * k, KT);
#pragma unroll
            for (int f = 0; f < HDF; f++) {
                if (f < nf) {
                    frag_b_row vb;
                    wmma::load_matrix_sync(vb, sv + 16 * k * hd + 16 * f, hd);
                    wmma::mma_sync(o[f], pa, vb, o[f]);
                }
            }
        }
    }
    if (wt0 >= a.T) {
        return; /* no real rows (after the last __syncthreads) */
    }
    /* y = O / l: each fragment through the scratch, 8 consecutive floats per lane. */
    float inv = 1.0f / l;
    float4 *yr = reinterpret_cast<float4 *>(y + (b * a.T + t) * a.C + h * a.hd + half * 8);
    const float4 *mine = reinterpret_cast<const float4 *>(scr + r * 16 + half * 8);
#pragma unroll
    for (int f = 0; f < HDF; f++) {
        if (f < nf) {
            __syncwarp();
            wmma::store_matrix_sync(scr, o[f], 16, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float4 v = mine[c];
                if (t < a.T) {
                    yr[4 * f + c] = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
                }
            }
        }
    }
    if (half == 0 && t < a.T) {
        lse[bh * a.T + t] = m + logf(l);
    }
}

static int g_attn_kind = NN_CU_ATTN_AUTO;
/* Tensor-core forwards and backwards queued (nn_cu_attn_tc_counts). */
static std::atomic<unsigned long> g_tc_fwd, g_tc_bwd;

/* The tensor-core kernels apply (forward and backward alike): autocast bf16 / fp16, no
 * dropout, hd a multiple of 16 up to 128, the tensors 16-byte aligned (128-bit accesses). */
static bool tc_applies(const nn_cu_attn *a, const void *p1, const void *p2, const void *p3,
                       const void *p4)
{
    uintptr_t any = (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3 | (uintptr_t)p4;
    return g_attn_kind != NN_CU_ATTN_WARP && (a->rnd == 1 || a->rnd == 2) && a->p <= 0.0f &&
           a->hd % 16 == 0 && a->hd <= 128 && (any & 15) == 0;
}

extern "C" {

void nn_cu_attn_set_kernel(int kind)
{
    g_attn_kind = kind;
}

void nn_cu_attn_tc_counts(unsigned long *fwd, unsigned long *bwd)
{
    *fwd = g_tc_fwd.load();
    *bwd = g_tc_bwd.load();
}

int nn_cu_attn_fwd_tc(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y, float *lse,
                      cudaError_t *err)
{
    if (!tc_applies(a, qkv, y, qkv, y)) {
        return 0;
    }
    unsigned blocks = (unsigned)(a->B * a->H * ((a->T + TC_QT - 1) / TC_QT));
    unsigned threads = 32 * TC_WARPS;
    if (a->hd <= 64) {
        if (a->rnd == 1) {
            k_attn_fwd_tc<__nv_bfloat16, 4, 64><<<blocks, threads, 0, s>>>(*a, qkv, y, lse);
        } else {
            k_attn_fwd_tc<__half, 4, 64><<<blocks, threads, 0, s>>>(*a, qkv, y, lse);
        }
    } else if (a->rnd == 1) {
        k_attn_fwd_tc<__nv_bfloat16, 8, 32><<<blocks, threads, 0, s>>>(*a, qkv, y, lse);
    } else {
        k_attn_fwd_tc<__half, 8, 32><<<blocks, threads, 0, s>>>(*a, qkv, y, lse);
    }
    g_tc_fwd++;
    *err = cudaGetLastError();
    return 1;
}

int nn_cu_attn_bwd_tc(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                      const float *lse, const float *gy, float *D, float *gqkv, int write,
                      cudaError_t *err)
{
    if (!tc_applies(a, qkv, y, gy, gqkv)) {
        return 0;
    }
    accel__nn_cu_attn_bwd_tc_queue(s, a, qkv, y, lse, gy, D, gqkv, write);
    g_tc_bwd++;
    *err = cudaGetLastError();
    return 1;
}

} /* extern "C" */
