/*
 * The tensor-core attention backward's (attn_tc_bwd.cu) tile loads from 2-byte copies, its
 * products with R row blocks a warp, and its register path (MODE 1 and 2): which (row, column)
 * each WMMA accumulator element holds, learned at run time, and the element-wise passes that
 * form P and dS in the accumulators and write them as T pairs or A operands.
 * Invariant: nothing here assumes a fragment layout; what the passes need of it (column pairs,
 * A operands laid out as accumulators) is checked where it is learned.
 */
#ifndef ACCEL_NN_ATTN_TC_BWD_CUH
#define ACCEL_NN_ATTN_TC_BWD_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#include <mma.h>
#endif

#include "attn_tc.cuh"

/* nvcc's #pragma unroll; g++'s in the emulator build (which rewrites it in .cu files only). */
#ifdef __CUDACC__
#define BW_UNROLL _Pragma("unroll")
#else
#define BW_UNROLL _Pragma("GCC unroll 16")
#endif

namespace bw_wmma = nvcuda::wmma;
typedef bw_wmma::fragment<bw_wmma::accumulator, 16, 16, 16, float> bw_acc;
template <typename T>
using bw_fa = bw_wmma::fragment<bw_wmma::matrix_a, 16, 16, 16, T, bw_wmma::row_major>;

/* ---- loads from the 2-byte copies, and the products (both paths) ---- */

/* A whole tile of two tensors (rows x hd each) from their 2-byte copies (nn_cu_attn's qkv_h,
 * dy_h: the values bw_load2 would round to), N 16-byte chunks of 8 T per thread and tensor per
 * round, stored as they come: a quarter of bw_load2's instructions per element (one 16-byte
 * load and store per 8, no conversion) and half its bytes. Rows from `valid` on read as zero.
 * NT is blockDim.x; Q8 the chunks a row where known at compile time (hd 16 HDF; 0: q8), so
 * that the chunk's row and column are a shift and a mask, not a division by a runtime value,
 * and the loop's trip count is constant. */
template <typename T, int N, int NT, int Q8>
__device__ __forceinline__ void bw_load2h_q(const T *src_a, int64_t stride_a, const T *src_b,
                                            int64_t stride_b, int valid, int rows, int q8, T *dst_a,
                                            T *dst_b, int ld)
{
    if (Q8 > 0) {
        q8 = Q8;
    }
    for (int base = 0; base < rows * q8; base += N * NT) {
        uint4 ra[N], rb[N];
        BW_UNROLL
        for (int k = 0; k < N; k++) {
            int i = base + k * NT + (int)threadIdx.x, row = i / q8, c = (i % q8) * 8;
            ra[k] = make_uint4(0u, 0u, 0u, 0u);
            rb[k] = ra[k];
            if (i < rows * q8 && row < valid) {
                ra[k] = *reinterpret_cast<const uint4 *>(src_a + row * stride_a + c);
                rb[k] = *reinterpret_cast<const uint4 *>(src_b + row * stride_b + c);
            }
        }
        BW_UNROLL
        for (int k = 0; k < N; k++) {
            int i = base + k * NT + (int)threadIdx.x, row = i / q8, c = (i % q8) * 8;
            if (i < rows * q8) {
                *reinterpret_cast<uint4 *>(dst_a + row * ld + c) = ra[k];
                *reinterpret_cast<uint4 *>(dst_b + row * ld + c) = rb[k];
            }
        }
    }
}

template <typename T, int N, int NT, int HDF>
__device__ __forceinline__ void bw_load2h(const T *src_a, int64_t stride_a, const T *src_b,
                                          int64_t stride_b, int valid, int rows, int hd, T *dst_a,
                                          T *dst_b, int ld)
{
    if (hd == 16 * HDF) {
        bw_load2h_q<T, N, NT, 2 * HDF>(src_a, stride_a, src_b, stride_b, valid, rows, 2 * HDF,
                                       dst_a, dst_b, ld);
    } else {
        bw_load2h_q<T, N, NT, 0>(src_a, stride_a, src_b, stride_b, valid, rows, hd / 8, dst_a,
                                 dst_b, ld);
    }
}

/* The padded leading dimension of bf16 / fp16 tiles of head rows: 8 elements (16 bytes) of
 * padding put the 16 rows of a WMMA load on different banks. */
template <int HDF> struct bw_ldh {
    static const int v = 16 * HDF + 8;
};

/* s [R][ST / 16] (accumulator fragments) = own [16 R][hd] times stream [ST][hd]^T, both in
 * shared memory with leading dimension LDH. With R = 2 each streamed fragment loaded serves
 * two products (one per 16 own rows); every sum runs over k in the same order as with R = 1. */
template <typename T, int HDF, int ST, int R = 1>
__device__ __forceinline__ void bw_scores_frag(bw_acc *s, const T *own, const T *stream, int nf)
{
    const int LDH = bw_ldh<HDF>::v, NS = ST / 16;
    BW_UNROLL
    for (int n = 0; n < R * NS; n++) {
        bw_wmma::fill_fragment(s[n], 0.0f);
    }
    BW_UNROLL
    for (int k = 0; k < HDF; k++) {
        if (k < nf) {
            bw_wmma::fragment<bw_wmma::matrix_a, 16, 16, 16, T, bw_wmma::row_major> fa[R];
            BW_UNROLL
            for (int r = 0; r < R; r++) {
                bw_wmma::load_matrix_sync(fa[r], own + 16 * r * LDH + 16 * k, LDH);
            }
            BW_UNROLL
            for (int n = 0; n < NS; n++) {
                /* Stream rows are B's columns: [ST][hd] is B col-major. */
                bw_wmma::fragment<bw_wmma::matrix_b, 16, 16, 16, T, bw_wmma::col_major> fb;
                bw_wmma::load_matrix_sync(fb, stream + 16 * n * LDH + 16 * k, LDH);
                BW_UNROLL
                for (int r = 0; r < R; r++) {
                    bw_wmma::mma_sync(s[r * NS + n], fa[r], fb, s[r * NS + n]);
                }
            }
        }
    }
}

/* acc [R][hd / 16] += x [16 R][ST] (A fragments [R][ST / 16]) times stream [ST][hd]: each
 * fragment of the stream loaded serves R products, each sum in R = 1's order. */
template <typename T, int HDF, int ST, int R = 1>
__device__ __forceinline__ void bw_accumulate_a(bw_acc *acc, const bw_fa<T> *fa, const T *stream,
                                                int nf)
{
    const int LDH = bw_ldh<HDF>::v, NS = ST / 16;
    BW_UNROLL
    for (int k = 0; k < NS; k++) {
        BW_UNROLL
        for (int f = 0; f < HDF; f++) {
            if (f < nf) {
                bw_wmma::fragment<bw_wmma::matrix_b, 16, 16, 16, T, bw_wmma::row_major> fb;
                bw_wmma::load_matrix_sync(fb, stream + 16 * k * LDH + 16 * f, LDH);
                BW_UNROLL
                for (int r = 0; r < R; r++) {
                    bw_wmma::mma_sync(acc[r * HDF + f], fa[r * NS + k], fb, acc[r * HDF + f]);
                }
            }
        }
    }
}

/* ---- the register path (ACCEL_NN_ATTN_FAST, the default) ----
 *
 * S and dP are not stored to the fp32 scratch and read back: P = rnd(exp2(S scale log2(e) -
 * lse log2(e))) and dS = rnd(P dP - P D) are formed in the accumulator fragments themselves.
 * Which (row, column) an accumulator element holds is the architecture's business, so each
 * warp learns it once by loading tiles of row and column numbers (bw_learn); the path needs
 * elements 2q and 2q + 1 to be one row's columns c, c + 1 with c even (every GPU's layout and
 * the emulator's; bw_mode probes it), so that a pair is one 32-bit store of two T and shares one
 * 64-bit read of per-column lse / D. MODE 1 writes the T tiles the next products read (P in the
 * dK/dV kernel, dS in both) to shared memory; MODE 2 (bf16) builds those A operands in
 * registers (bw_learn_a). Per 16 x 32 tile, warp and pass this drops two fp32 fragment stores,
 * 8 LDS.128 of the scratch and lse / D, a __syncwarp, and in MODE 2 the A operands' store and
 * load. At 16 rows a warp both kernels run at their register caps (128, 96), so where P waits
 * for dS was chosen by ptxas -v (bf16, hd 64): MODE 2's dK/dV kernel keeps it in dV's A
 * operands (8 bytes spilled, as with P in shared memory); the dQ kernels' P goes to the idle
 * fp32 scratch (a new tile would cost the fifth block; 4 to 12 bytes spilled, 16 to 40 with P
 * in registers; at 32 rows a warp, 168 registers, it stays in dQ's A operands), and
 * MODE 1's dK/dV kernel keeps P in its P tile (dV's operand), so dS goes to a second tile
 * (sx2: 47.4 KB, still 4 blocks an SM). */

static const int BW_NE = bw_acc::num_elements;

template <typename T> struct __align__(4) bw_pair
{
    T v[2];
};

/* Where element pair q of an accumulator fragment lies: byte q % 4 of word q / 4 holds its
 * column (low 4 bits) and row (high 4): a GPU's 4 pairs in one register (the dK/dV kernel
 * has none to spare), unpacked with constant shifts once the loops are unrolled. */
struct bw_map {
    unsigned pk[(BW_NE / 2 + 3) / 4];
};

__device__ __forceinline__ int bw_col(const bw_map &m, int q)
{
    return (int)((m.pk[q / 4] >> (8 * (q % 4))) & 15u);
}
__device__ __forceinline__ int bw_row(const bw_map &m, int q)
{
    return (int)((m.pk[q / 4] >> (8 * (q % 4) + 4)) & 15u);
}

/* The warp's map, through its scratch (16 x 16 floats); true where the layout pairs columns
 * as the register path needs (the same answer in every lane and warp). */
__device__ __forceinline__ bool bw_learn(bw_map &m, float *scr)
{
    int lane = threadIdx.x & 31;
    bw_acc rows, cols;
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
        scr[i] = (float)(i >> 4);
    }
    __syncwarp();
    bw_wmma::load_matrix_sync(rows, scr, 16, bw_wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
        scr[i] = (float)(i & 15);
    }
    __syncwarp();
    bw_wmma::load_matrix_sync(cols, scr, 16, bw_wmma::mem_row_major);
    __syncwarp(); /* every lane has loaded before the scratch is reused */
    bool ok = true;
    BW_UNROLL
    for (int w = 0; w < (BW_NE / 2 + 3) / 4; w++) {
        m.pk[w] = 0;
    }
    BW_UNROLL
    for (int q = 0; q < BW_NE / 2; q++) {
        int r = (int)rows.x[2 * q], c = (int)cols.x[2 * q];
        ok = ok && (int)rows.x[2 * q + 1] == r && (int)cols.x[2 * q + 1] == c + 1 && c % 2 == 0;
        m.pk[q / 4] |= (unsigned)(c | r << 4) << (8 * (q % 4));
    }
    return __all_sync(0xffffffffu, ok) != 0;
}

/* Whether the next product's A operand can be built from an accumulator in registers: a
 * row-major matrix_a fragment of T whose element i lies where accumulator element i does
 * (true of the m16n8k16 layouts behind bf16 WMMA on sm_80 and later, as FlashAttention-2
 * uses; and of the emulator's). Compile time first: the element counts must match, which
 * rules out fp16, whose WMMA fragment keeps Volta's 16 elements a lane (so fp16 keeps the
 * shared-memory tiles, and the emulator tests both ways). Then the layout, learned by loading
 * T tiles of row and column numbers (exact in bf16) into A fragments through a warp's scratch
 * (bw_mode's probe; one kernel holding both ways spilled 40 more bytes). */
template <typename T> struct bw_direct {
    static const bool v = false;
};
template <> struct bw_direct<__nv_bfloat16> {
    static const bool v = bw_fa<__nv_bfloat16>::num_elements == BW_NE;
};

template <typename T> __device__ __forceinline__ bool bw_learn_a(const bw_map &m, float *scr)
{
    if (!bw_direct<T>::v) {
        return false;
    }
    int lane = threadIdx.x & 31;
    T *xt = reinterpret_cast<T *>(scr);
    bw_fa<T> rows, cols;
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
        xt[i] = tc_cvt<T>((float)(i >> 4));
    }
    __syncwarp();
    bw_wmma::load_matrix_sync(rows, xt, 16);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
        xt[i] = tc_cvt<T>((float)(i & 15));
    }
    __syncwarp();
    bw_wmma::load_matrix_sync(cols, xt, 16);
    __syncwarp(); /* every lane has loaded before the scratch is reused */
    bool ok = true;
    BW_UNROLL
    for (int q = 0; q < BW_NE / 2; q++) {
        int r = bw_row(m, q), c = bw_col(m, q);
        ok = ok && (int)tc_f<T>(rows.x[2 * q]) == r && (int)tc_f<T>(rows.x[2 * q + 1]) == r &&
             (int)tc_f<T>(cols.x[2 * q]) == c && (int)tc_f<T>(cols.x[2 * q + 1]) == c + 1;
    }
    return __all_sync(0xffffffffu, ok) != 0;
}

/* P of the warp's 16 x ST tile in s (fp32 sums of S) into x [16][LDP], or into the A
 * fragments fa when TO_A (bw_learn_a said the layouts agree). lse2 = lse log2(e),
 * +inf past T, in shared memory per column (KEY_ROWS, the dK/dV kernel: rows are keys,
 * columns queries) or per row (the warp's 16). MASK: the causal
 * test, query t sees key j where j <= t; lim: the first column's index minus the first row's
 * (rows and columns past T are zero already: their lse2 is +inf). s2 = scale log2(e). */
template <typename T, int ST, int LDP, bool KEY_ROWS, bool MASK, bool TO_A>
__device__ __forceinline__ void bw_probs_rf(const bw_acc *s, const bw_map &m, float s2,
                                            const float *lse2, int lim, T *x, bw_fa<T> *fa)
{
    BW_UNROLL
    for (int n = 0; n < ST / 16; n++) {
        BW_UNROLL
        for (int q = 0; q < BW_NE / 2; q++) {
            int c = bw_col(m, q), r = bw_row(m, q);
            float2 l;
            if (KEY_ROWS) {
                l = reinterpret_cast<const float2 *>(lse2 + 16 * n + c)[0];
            } else {
                l.x = l.y = lse2[r];
            }
            if (TO_A) {
                /* P rounded to T once and masked in T: the same bits as the float round trip
                 * below, two conversions fewer a pair (kept to this path: on the others, at
                 * their register caps, ptxas spilled 28 -> 72 bytes with it). */
                T o0 = tc_cvt<T>(exp2f(fmaf(s[n].x[2 * q], s2, -l.x)));
                T o1 = tc_cvt<T>(exp2f(fmaf(s[n].x[2 * q + 1], s2, -l.y)));
                if (MASK) {
                    int d = c - r, ln = KEY_ROWS ? lim + 16 * n : lim - 16 * n;
                    bool v0 = KEY_ROWS ? -d <= ln : d <= ln;
                    bool v1 = KEY_ROWS ? -d - 1 <= ln : d + 1 <= ln;
                    o0 = v0 ? o0 : tc_cvt<T>(0.0f);
                    o1 = v1 ? o1 : tc_cvt<T>(0.0f);
                }
                fa[n].x[2 * q] = o0;
                fa[n].x[2 * q + 1] = o1;
                continue;
            }
            float e0 = tc_round<T>(exp2f(fmaf(s[n].x[2 * q], s2, -l.x)));
            float e1 = tc_round<T>(exp2f(fmaf(s[n].x[2 * q + 1], s2, -l.y)));
            if (MASK) {
                /* Rows queries: column - row <= t0 - j0; rows keys: row - column <= i0 - j0
                 * (first query minus first key). */
                int d = c - r, ln = KEY_ROWS ? lim + 16 * n : lim - 16 * n;
                bool v0 = KEY_ROWS ? -d <= ln : d <= ln, v1 = KEY_ROWS ? -d - 1 <= ln : d + 1 <= ln;
                e0 = v0 ? e0 : 0.0f;
                e1 = v1 ? e1 : 0.0f;
            }
            bw_pair<T> o = {{tc_cvt<T>(e0), tc_cvt<T>(e1)}};
            *reinterpret_cast<bw_pair<T> *>(x + r * LDP + c + 16 * n) = o;
        }
    }
}

/* dS = rnd(P dP - P D) from the dP sums in dp into the A fragments fa (TO_A) or x [16][LDP],
 * P from fa (P_IN_A, where bw_probs_rf put it: dS replaces it pair by pair) or px [16][LDP]
 * (a lane reads back only its own pairs), D in shared memory per column (KEY_ROWS) or per
 * row. */
template <typename T, int ST, int LDP, bool KEY_ROWS, bool P_IN_A, bool TO_A>
__device__ __forceinline__ void bw_dscores_rf(const bw_acc *dp, const bw_map &m, const float *D,
                                              const T *px, T *x, bw_fa<T> *fa)
{
    BW_UNROLL
    for (int n = 0; n < ST / 16; n++) {
        BW_UNROLL
        for (int q = 0; q < BW_NE / 2; q++) {
            int c = bw_col(m, q), r = bw_row(m, q);
            float2 d;
            if (KEY_ROWS) {
                d = reinterpret_cast<const float2 *>(D + 16 * n + c)[0];
            } else {
                d.x = d.y = D[r];
            }
            bw_pair<T> pp;
            if (P_IN_A) {
                pp.v[0] = fa[n].x[2 * q];
                pp.v[1] = fa[n].x[2 * q + 1];
            } else {
                pp = *reinterpret_cast<const bw_pair<T> *>(px + r * LDP + c + 16 * n);
            }
            float p0 = tc_f<T>(pp.v[0]), p1 = tc_f<T>(pp.v[1]);
            float g0 = dp[n].x[2 * q], g1 = dp[n].x[2 * q + 1];
            bw_pair<T> o = {{tc_cvt<T>(p0 * g0 - p0 * d.x), tc_cvt<T>(p1 * g1 - p1 * d.y)}};
            if (TO_A) {
                fa[n].x[2 * q] = o.v[0];
                fa[n].x[2 * q + 1] = o.v[1];
            } else {
                *reinterpret_cast<bw_pair<T> *>(x + r * LDP + c + 16 * n) = o;
            }
        }
    }
}

#endif
