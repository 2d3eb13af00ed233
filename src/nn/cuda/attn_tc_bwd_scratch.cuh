/*
 * The tensor-core attention backward's (attn_tc_bwd.cu) helpers that go through shared memory:
 * the tile loads from the fp32 tensors, the products that read an operand from or store their
 * result to shared memory, the scratch path's element-wise passes (MODE 0, ACCEL_NN_ATTN_FAST=0:
 * S and dP in an fp32 scratch, P and dS formed with expf) and the epilogue every path stores its
 * rows through. attn_tc_bwd.cuh holds the loads from the 2-byte copies and the register path.
 * Invariant: as there, nothing here assumes a fragment layout (the scratch is written by
 * store_matrix_sync and read in row-major order).
 */
#ifndef ACCEL_NN_ATTN_TC_BWD_SCRATCH_CUH
#define ACCEL_NN_ATTN_TC_BWD_SCRATCH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#include <mma.h>
#endif

#include "attn_tc.cuh"
#include "attn_tc_bwd.cuh"

/* One thread's share of N float4 of each of two row sets (a tile of two tensors), held in
 * registers between the loads and the rounded stores into shared memory, so that all 2 N loads
 * are in flight at once (one L2 latency per round, not one per load). */
template <int N> struct bw_regs {
    float4 a[N], b[N];
};

/* Loads float4 number base + k * blockDim.x + threadIdx.x (k < N) of rows x hd of src_a and
 * src_b (row i at src + i * stride); rows from `valid` on, and indices past the tile, read as
 * zero. */
template <int N>
__device__ __forceinline__ void bw_fetch(bw_regs<N> &r, const float *src_a, int64_t stride_a,
                                         const float *src_b, int64_t stride_b, int valid, int rows,
                                         int hd, int base)
{
    int q4 = hd / 4;
    BW_UNROLL
    for (int k = 0; k < N; k++) {
        int i = base + k * (int)blockDim.x + (int)threadIdx.x, row = i / q4, c = (i % q4) * 4;
        float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        r.a[k] = z;
        r.b[k] = z;
        if (i < rows * q4 && row < valid) {
            r.a[k] = *reinterpret_cast<const float4 *>(src_a + row * stride_a + c);
            r.b[k] = *reinterpret_cast<const float4 *>(src_b + row * stride_b + c);
        }
    }
}

/* bw_fetch's values rounded to T into dst_a, dst_b [rows][ld] (one 64-bit store each). */
template <typename T, int N>
__device__ __forceinline__ void bw_stash(const bw_regs<N> &r, T *dst_a, T *dst_b, int ld, int rows,
                                         int hd, int base)
{
    int q4 = hd / 4;
    BW_UNROLL
    for (int k = 0; k < N; k++) {
        int i = base + k * (int)blockDim.x + (int)threadIdx.x, row = i / q4, c = (i % q4) * 4;
        if (i < rows * q4) {
            float4 a = r.a[k], b = r.b[k];
            tc_quad<T> qa = {{tc_cvt<T>(a.x), tc_cvt<T>(a.y), tc_cvt<T>(a.z), tc_cvt<T>(a.w)}};
            tc_quad<T> qb = {{tc_cvt<T>(b.x), tc_cvt<T>(b.y), tc_cvt<T>(b.z), tc_cvt<T>(b.w)}};
            *reinterpret_cast<tc_quad<T> *>(dst_a + row * ld + c) = qa;
            *reinterpret_cast<tc_quad<T> *>(dst_b + row * ld + c) = qb;
        }
    }
}

/* A whole tile of two tensors (rows x hd each), N float4 per thread and tensor per round. */
template <typename T, int N>
__device__ __forceinline__ void bw_load2(const float *src_a, int64_t stride_a, const float *src_b,
                                         int64_t stride_b, int valid, int rows, int hd, T *dst_a,
                                         T *dst_b, int ld)
{
    for (int base = 0; base < rows * (hd / 4); base += N * (int)blockDim.x) {
        bw_regs<N> r;
        bw_fetch<N>(r, src_a, stride_a, src_b, stride_b, valid, rows, hd, base);
        bw_stash<T, N>(r, dst_a, dst_b, ld, rows, hd, base);
    }
}

/* out [16][ST] (the warp's fp32 scratch, ldm LDS) = own [16][hd] times stream [ST][hd]^T. */
template <typename T, int HDF, int ST, int LDS>
__device__ __forceinline__ void bw_scores(float *out, const T *own, const T *stream, int nf)
{
    bw_acc s[ST / 16];
    bw_scores_frag<T, HDF, ST>(s, own, stream, nf);
    BW_UNROLL
    for (int n = 0; n < ST / 16; n++) {
        bw_wmma::store_matrix_sync(out + 16 * n, s[n], LDS, bw_wmma::mem_row_major);
    }
}

/* acc [16][hd] += x [16][ST] (shared, ldm ST + 8) times stream [ST][hd] (shared, ldm LDH). */
template <typename T, int HDF, int ST>
__device__ __forceinline__ void bw_accumulate(bw_acc *acc, const T *x, const T *stream, int nf)
{
    const int LDH = bw_ldh<HDF>::v;
    BW_UNROLL
    for (int k = 0; k < ST / 16; k++) {
        bw_wmma::fragment<bw_wmma::matrix_a, 16, 16, 16, T, bw_wmma::row_major> fa;
        bw_wmma::load_matrix_sync(fa, x + 16 * k, ST + 8);
        BW_UNROLL
        for (int f = 0; f < HDF; f++) {
            if (f < nf) {
                bw_wmma::fragment<bw_wmma::matrix_b, 16, 16, 16, T, bw_wmma::row_major> fb;
                bw_wmma::load_matrix_sync(fb, stream + 16 * k * LDH + 16 * f, LDH);
                bw_wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
    }
}

template <typename T> struct __align__(16) bw_oct
{
    T v[8];
};

/* The element-wise passes over the warp's 16 x ST tile: lanes 2r and 2r + 1 own row r, half
 * of its columns each (HC = ST / 2 consecutive ones), read and written with explicit 128-bit
 * shared accesses (the compiler left the scalar loads of a plain loop as 16 LDS.32 with 4-way
 * conflicts: banks 4r + 16 half + c). A 128-bit access is served by quarter warps, and 8
 * lanes on 4 rows of ST + 4 floats cover all 32 banks: the scratch reads are conflict-free,
 * 4 instructions where there were 16; the P / dS stores are 2-way (2 instructions). */

/* The lane's scratch values q (4 q to 4 q + 3 of its HC, as one 128-bit read) into v, and the
 * per-column (KEY_ROWS: col, in shared memory, 16-byte aligned) or per-row (row) values of the
 * same 4 elements into w. */
template <int ST, int LDS, bool KEY_ROWS>
__device__ __forceinline__ void bw_quad(const float *scr, const float *col, float row, int q,
                                        float (&v)[4], float (&w)[4])
{
    const int HC = ST / 2;
    int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float4 sv = reinterpret_cast<const float4 *>(scr + r * LDS + half * HC)[q];
    float4 wv = make_float4(row, row, row, row);
    if (KEY_ROWS) {
        wv = reinterpret_cast<const float4 *>(col + half * HC)[q];
    }
    v[0] = sv.x, v[1] = sv.y, v[2] = sv.z, v[3] = sv.w;
    w[0] = wv.x, w[1] = wv.y, w[2] = wv.z, w[3] = wv.w;
}

/* P = rnd(exp(S * scale - lse)) where query t sees key j (j <= t < T), else 0, the lane's HC
 * entries. KEY_ROWS: rows are keys and columns queries (lse per column, in shared memory,
 * 16-byte aligned), else rows are queries (lse_row). MASK false: every element is visible (the
 * caller checked), so no per-element test. row0 / col0: the tile's first row / column. */
template <typename T, int ST, int LDS, bool KEY_ROWS, bool MASK>
__device__ __forceinline__ void bw_probs(float scale, int64_t T_, const float *scr, int64_t row0,
                                         int64_t col0, const float *lse_col, float lse_row,
                                         float *p)
{
    const int HC = ST / 2;
    int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    BW_UNROLL
    for (int q = 0; q < HC / 4; q++) {
        float sx[4], lx[4];
        bw_quad<ST, LDS, KEY_ROWS>(scr, lse_col, lse_row, q, sx, lx);
        BW_UNROLL
        for (int e = 0; e < 4; e++) {
            int c = 4 * q + e;
            float v = tc_round<T>(expf(sx[e] * scale - lx[e]));
            if (MASK) {
                int64_t row = row0 + r, col = col0 + half * HC + c;
                int64_t t = KEY_ROWS ? col : row, j = KEY_ROWS ? row : col;
                v = (j <= t && t < T_) ? v : 0.0f;
            }
            p[c] = v;
        }
    }
}

/* In place of the lane's P entries: dS = rnd(P dP - P D), dP from the scratch, D per column
 * (KEY_ROWS, in shared memory, 16-byte aligned) or per row. */
template <typename T, int ST, int LDS, bool KEY_ROWS>
__device__ __forceinline__ void bw_dscores(const float *scr, const float *D_col, float D_row,
                                           float *p)
{
    const int HC = ST / 2;
    BW_UNROLL
    for (int q = 0; q < HC / 4; q++) {
        float dpx[4], dx[4];
        bw_quad<ST, LDS, KEY_ROWS>(scr, D_col, D_row, q, dpx, dx);
        BW_UNROLL
        for (int e = 0; e < 4; e++) {
            int c = 4 * q + e;
            p[c] = tc_round<T>(p[c] * dpx[e] - p[c] * dx[e]);
        }
    }
}

/* The lane's HC values into row r of x [16][ST + 8] (16-byte stores). */
template <typename T, int ST> __device__ __forceinline__ void bw_put(T *x, const float *v)
{
    const int HC = ST / 2;
    int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    bw_oct<T> *dst = reinterpret_cast<bw_oct<T> *>(x + r * (ST + 8) + half * HC);
    BW_UNROLL
    for (int c = 0; c < HC / 8; c++) {
        bw_oct<T> o;
        BW_UNROLL
        for (int e = 0; e < 8; e++) {
            o.v[e] = tc_cvt<T>(v[8 * c + e]);
        }
        dst[c] = o;
    }
}

/* Row r of the warp's [16][hd] accumulators, times f and rounded to T, stored into (write) or
 * added to dst (the lane's row, when `valid`), through the scratch (16 x 16 floats). */
template <typename T, int HDF>
__device__ __forceinline__ void bw_store_rows(float *scr, const bw_acc *acc, int nf, float *dst,
                                              float f, int write, bool valid)
{
    int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    const float4 *mine = reinterpret_cast<const float4 *>(scr + r * 16 + half * 8);
    float4 *out = reinterpret_cast<float4 *>(dst + half * 8);
    BW_UNROLL
    for (int k = 0; k < HDF; k++) {
        if (k < nf) {
            __syncwarp();
            bw_wmma::store_matrix_sync(scr, acc[k], 16, bw_wmma::mem_row_major);
            __syncwarp();
            BW_UNROLL
            for (int c = 0; c < 2; c++) {
                float4 v = mine[c];
                float4 x = make_float4(tc_round<T>(v.x * f), tc_round<T>(v.y * f),
                                       tc_round<T>(v.z * f), tc_round<T>(v.w * f));
                if (valid && !write) {
                    float4 o = out[4 * k + c];
                    x = make_float4(o.x + x.x, o.y + x.y, o.z + x.z, o.w + x.w);
                }
                if (valid) {
                    out[4 * k + c] = x;
                }
            }
        }
    }
}

#endif /* ACCEL_NN_ATTN_TC_BWD_SCRATCH_CUH */
