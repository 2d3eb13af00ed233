/*
 * Causal attention on tensor cores (FlashAttention-2's schedules) for bf16 / fp16 autocast.
 * Forward: one block per (batch, head, tile of 128 query rows, 64 for heads over 64), a warp
 * per 16 rows. The Q tile and each key / value tile are rounded once into shared memory; per
 * 32 keys a warp computes S = Q K^T by WMMA (fp32 sums), the scale, the causal mask and the
 * online softmax per row in fp32 (running max m, sum l), P rounded to the autocast dtype, and
 * O += P V by WMMA with O kept in accumulator fragments (rescaled per row in registers when a
 * row's max grows). It writes y = O / l and lse = m + log(l) exactly where k_attn_fwd does: either
 * backward takes its output. Where the GPU's WMMA fragments have the sm_80+ layout (each warp
 * checks at start; bf16, not fp16, whose matrix_a has 16 elements a lane), S and P never leave
 * registers (tc_fwd_chunk_fast); ACCEL_NN_ATTN_FAST=0 (NN_CU_ATTN_TC_SLOW) keeps the path
 * through shared memory, bit for bit the first tensor-core forward. In bf16 at head size 64
 * where a one-time probe finds that layout, attn_tc_fwd.cu's kernel of 32 query rows a warp
 * runs instead (nn_cu_attn_fwd_mode 2). Backward: a dQ kernel per query
 * tile, then a dK/dV kernel per key tile (attn_tc_bwd.cu), writing gqkv exactly where k_attn_bwd_*
 * do, rounded as they round; in bf16 at head size 64 from the 2-byte copies of qkv and dy,
 * attn_tc_bwd2.cu's kernels (the forward's way, nn_cu_attn_bwd_kernel 2) instead.
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

#include "attn_tc.cuh"
#include "nn_kernels.h"

using namespace nvcuda;

/* ---- forward ----
 *
 * One block per (batch, head, tile of 16 NW query rows), NW warps of 16 rows each. Shared
 * memory: the K and V tiles [KT][LDH] (LDH = 16 HDF + 8, so that the 8 rows of each WMMA load
 * phase start on different banks; the Q tile is staged there once, its fragments then stay in
 * registers), and per warp one fp32 scratch [16][KS + 8] that holds S of KS keys, then P (T,
 * [16][KS + 8]) over the start of it: a key tile is taken KS keys at a time, which keeps the
 * scratch small enough for 8 warps to share one K / V tile (half the tile loads per query row
 * of 4 warps). A lane pair owns row r of the warp's 16 and lane `half` takes the columns
 * 8c + 4 half .. + 3, so its float4 reads of S (8 lanes a phase: banks 8r + 4 half) and its
 * 8-byte writes of P (16 lanes a phase: 2 banks at 20r + 2 half + 4c) are conflict-free, as are
 * the WMMA store of S (row starts 8 banks apart) and the loads of P (rows 20 banks apart). */

/* This thread's share of M tiles of KT x hd (tile m at src + m C; row i at + i stride; rows from
 * `valid` on read as zero) rounded to T into dst + m (dst2 - dst) [KT][16 HDF + 8]. A row's 16
 * HDF / 4 float4s are shared by NT / KT threads: lane pairs take adjacent float4s (a 32-byte
 * sector) of 8 consecutive rows a half warp, so the 8-byte stores of a half warp cover the 32
 * banks once. One row pointer a thread with immediate offsets, and every 128-bit load issued
 * before the first store, so the tiles cost one memory latency, not one per load. */
template <typename T, int HDF, int KT, int NT, int M>
__device__ __forceinline__ void tc_fwd_load(const float *src, int64_t stride, int64_t C,
                                            int64_t valid, int hd, T *dst, T *dst2)
{
    const int TPR = NT / KT, N = 4 * HDF / TPR, LDH = 16 * HDF + 8;
    static_assert(NT % (2 * KT) == 0 && 4 * HDF % TPR == 0, "lane pairs, whole float4s");
    int r = (threadIdx.x >> 1) % KT, q = 2 * (threadIdx.x / (2 * KT)) + (threadIdx.x & 1);
    const float4 *p = reinterpret_cast<const float4 *>(src + r * stride) + q;
    float4 v[M][N];
#pragma unroll
    for (int m = 0; m < M; m++) {
#pragma unroll
        for (int k = 0; k < N; k++) {
            v[m][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < valid && 4 * (k * TPR + q) < hd) {
                v[m][k] = p[m * (C / 4) + k * TPR];
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        tc_quad<T> *d = reinterpret_cast<tc_quad<T> *>((m ? dst2 : dst) + r * LDH) + q;
#pragma unroll
        for (int k = 0; k < N; k++) {
            if (4 * (k * TPR + q) < hd) {
                float4 x = v[m][k];
                tc_quad<T> o = {{tc_cvt<T>(x.x), tc_cvt<T>(x.y), tc_cvt<T>(x.z), tc_cvt<T>(x.w)}};
                d[k * TPR] = o;
            }
        }
    }
}

template <typename T>
using tc_frag_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_frag_c;

/* The register fast path of one chunk of KS keys (rows of sk and sv; the first is key c0) for
 * a warp whose rows start at wt0, on the sm_80+ fragment layout (attn_tc.cuh, tc_lay_*, checked
 * at kernel start): S = Q K^T stays in accumulator fragments, masked (only where `mask`: some
 * key of the nb 16-key blocks is after the warp's first row), and P = exp2(S sl2 - m) (sl2:
 * scale log2(e), > 0, so the max is taken before scaling; one FMA and one MUFU op a score)
 * where it lies. A lane holds 4 columns of rows g and g + 8 of
 * each block, so a row's max is its lane's and 2 quad shuffles; its sum l stays per lane (the
 * factors are the quad's alike) until the end. P's fragment for block k is S's element for
 * element (the matrix_a layout is the accumulator's), rounded to T: no shared memory between
 * the two products. m, l: rows g and g + 8 (m in the log2 domain). */
template <typename T, int HDF, int KS, int LDH>
__device__ __forceinline__ void
tc_fwd_chunk_fast(tc_frag_c (&o)[HDF], const tc_frag_a<T> (&qa)[HDF], const T *sk, const T *sv,
                  int nf, int nb, bool mask, int64_t c0, int64_t wt0, float sl2, float (&m)[2],
                  float (&l)[2], int lane)
{
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> frag_b_row;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> frag_b_col;
    tc_frag_c s[KS / 16];
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < KS / 16; n++) {
        if (n < nb) {
            wmma::fill_fragment(s[n], 0.0f);
#pragma unroll
            for (int k = 0; k < HDF; k++) {
                if (k < nf) {
                    frag_b_col kb;
                    wmma::load_matrix_sync(kb, sk + 16 * n * LDH + 16 * k, LDH);
                    wmma::mma_sync(s[n], qa[k], kb, s[n]);
                }
            }
            if (mask) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (c0 + 16 * n + tc_lay_col(lane, i) > wt0 + tc_lay_row(lane, i)) {
                        s[n].x[i] = -INFINITY;
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[n].x[i]);
            }
        }
    }
    float base[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        float mn = fmaxf(m[r], mx[r] * sl2);   /* sl2 > 0: the max of the scaled scores */
        base[r] = mn == -INFINITY ? 0.0f : mn; /* a row masked whole so far: P = 0, not NaN */
        corr[r] = exp2f(m[r] - base[r]);       /* 0 on the row's first keys (m = -inf) */
        l[r] *= corr[r];
        m[r] = mn;
    }
    /* O *= corr per row where any row's max grew (the first chunk's O is zero). */
    if (c0 > 0 && __any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
        for (int f = 0; f < HDF; f++) {
            if (f < nf) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    o[f].x[i] *= corr[(i >> 1) & 1];
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < KS / 16; k++) {
        if (k < nb) {
            tc_frag_a<T> pa;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float e = exp2f(fmaf(s[k].x[i], sl2, -base[(i >> 1) & 1]));
                l[(i >> 1) & 1] += e;
                pa.x[i] = tc_cvt<T>(e);
            }
#pragma unroll
            for (int f = 0; f < HDF; f++) {
                if (f < nf) {
                    frag_b_row vb;
                    wmma::load_matrix_sync(vb, sv + 16 * k * LDH + 16 * f, LDH);
                    wmma::mma_sync(o[f], pa, vb, o[f]);
                }
            }
        }
    }
}

/* HDF: head size / 16 at most; KT: keys per tile; NW: warps (16 NW query rows); KV: K and V
 * loaded in one batch (else one after the other, fewer registers). Heads up to 64 (NW 8) fit
 * 128 registers, 2 blocks and 16 warps an SM; heads up to 128 (NW 4) 168, 3 blocks. */
template <typename T, int HDF, int KT, int NW, bool KV>
__global__ void __launch_bounds__(32 * NW, NW == 8 ? 2 : 3)
    k_attn_fwd_tc(nn_cu_attn a, const float *qkv, float *y, float *lse, bool fast_ok)
{
    typedef tc_frag_a<T> frag_a;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> frag_b_row;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> frag_b_col;
    typedef tc_frag_c frag_c;
    const int LDH = 16 * HDF + 8, QT = 16 * NW, KS = KT < 32 ? KT : 32, LDS = KS + 8;
    static_assert(2 * KT >= QT && QT % KT == 0, "the Q tile is staged where K and V go");
    __shared__ __align__(32) T skv[2 * KT * LDH];
    __shared__ __align__(32) float ss[NW * 16 * LDS];
    T *sk = skv, *sv = skv + KT * LDH;

    int64_t nqt = (a.T + QT - 1) / QT, C3 = 3 * a.C;
    /* The longest query tiles (most keys) first, so the last wave is short ones. */
    int64_t qt = nqt - 1 - (int64_t)blockIdx.x % nqt, bh = (int64_t)blockIdx.x / nqt;
    int64_t h = bh % a.H, b = bh / a.H, t0 = qt * QT;
    int hd = (int)a.hd, nf = hd / 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = lane >> 1, half = lane & 1;
    int64_t wt0 = t0 + 16 * warp, t = wt0 + r;
    float *scr = ss + warp * 16 * LDS; /* the warp's S rows, then its P rows */
    T *sp = reinterpret_cast<T *>(scr);
    const float *qkv_bh = qkv + b * a.T * C3 + h * a.hd;

    /* Where in a 16 x 16 tile each of the lane's accumulator and matrix_a elements lies: the
     * layout is the architecture's, and loading a tile of element numbers 16 row + column (in
     * fp32, and in T, exact to 256 in bf16 and fp16) shows it. The register fast path runs
     * where both match the sm_80+ layout exactly (tc_lay_*) in every lane; otherwise (an
     * fp16 matrix_a has 16 elements a lane; the emulator's whole-tile fragments,
     * ACCEL_CUEMU_WMMA=whole, hold 256) the path through the scratch, which scales O per row
     * in registers (the row's factor from the lane that owns the row) from the learnt rows
     * alone. */
    T *sidx = reinterpret_cast<T *>(scr + 256);
    for (int i = lane; i < 256; i += 32) {
        scr[i] = (float)i;
        sidx[i] = tc_cvt<T>((float)i);
    }
    __syncwarp();
    frag_c rows;
    wmma::load_matrix_sync(rows, scr, 16, wmma::mem_row_major);
    bool fast = fast_ok && rows.num_elements == 8;
    if (fast) {
        frag_a at;
        wmma::load_matrix_sync(at, sidx, 16);
        fast = at.num_elements == 8;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float want = (float)(16 * tc_lay_row(lane, i) + tc_lay_col(lane, i));
            fast = fast && rows.x[i] == want && tc_f<T>(at.x[i]) == want;
        }
    }
    fast = __all_sync(0xffffffffu, fast);
    float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.0f, 0.0f}; /* the fast path's rows */
    const float sl2 = a.scale * 1.4426950408889634f;            /* scale log2(e) */

    /* The Q tile, KT rows a batch of loads. */
#pragma unroll
    for (int q0 = 0; q0 < QT; q0 += KT) {
        tc_fwd_load<T, HDF, KT, 32 * NW, 1>(qkv_bh + (t0 + q0) * C3, C3, 0, a.T - t0 - q0, hd,
                                            skv + q0 * LDH, nullptr);
    }
    __syncthreads();
    frag_a qa[HDF]; /* the warp's 16 query rows, for every key tile */
#pragma unroll
    for (int f = 0; f < HDF; f++) {
        if (f < nf) {
            wmma::load_matrix_sync(qa[f], skv + 16 * warp * LDH + 16 * f, LDH);
        }
    }
    frag_c o[HDF];
#pragma unroll
    for (int f = 0; f < HDF; f++) {
        wmma::fill_fragment(o[f], 0.0f);
    }
    float m = -INFINITY, l = 0.0f;
    int64_t last = (t0 + QT < a.T ? t0 + QT : a.T) - 1; /* the tile's last query row */
    for (int64_t j0 = 0; j0 <= last; j0 += KT) {
        __syncthreads(); /* every warp is done with the previous K, V (and with Q's staging) */
        const float *kr = qkv_bh + j0 * C3 + a.C;
        if (KV) {
            tc_fwd_load<T, HDF, KT, 32 * NW, 2>(kr, C3, a.C, a.T - j0, hd, sk, sv);
        } else {
            tc_fwd_load<T, HDF, KT, 32 * NW, 1>(kr, C3, 0, a.T - j0, hd, sk, nullptr);
            tc_fwd_load<T, HDF, KT, 32 * NW, 1>(kr + a.C, C3, 0, a.T - j0, hd, sv, nullptr);
        }
        __syncthreads();
#pragma unroll
        for (int s0 = 0; s0 < KT; s0 += KS) {
            int64_t c0 = j0 + s0; /* the chunk's first key */
            if (c0 > wt0 + 15 || wt0 >= a.T) {
                break; /* every key from here on is after this warp's rows */
            }
            /* The 16-key column blocks that reach this warp's rows: those after its last row
             * are masked whole (P = 0), so neither product needs them. */
            int64_t reach = (wt0 + 15 - c0) / 16 + 1;
            int nb = reach < KS / 16 ? (int)reach : KS / 16;
            if (fast) {
                /* No mask where every key of the nb blocks is at or before the warp's first
                 * row (and so before T). */
                bool mask = c0 + 16 * nb - 1 > wt0;
                tc_fwd_chunk_fast<T, HDF, KS, LDH>(o, qa, sk + s0 * LDH, sv + s0 * LDH, nf, nb,
                                                   mask, c0, wt0, sl2, m2, l2, lane);
                continue;
            }
            /* S = Q K^T, one 16-key block at a time (fewer live registers): K's rows are B's
             * columns, so K [KT][hd] is B col-major. */
#pragma unroll
            for (int n = 0; n < KS / 16; n++) {
                if (n < nb) {
                    frag_c s;
                    wmma::fill_fragment(s, 0.0f);
#pragma unroll
                    for (int k = 0; k < HDF; k++) {
                        if (k < nf) {
                            frag_b_col kb;
                            wmma::load_matrix_sync(kb, sk + (s0 + 16 * n) * LDH + 16 * k, LDH);
                            wmma::mma_sync(s, qa[k], kb, s);
                        }
                    }
                    wmma::store_matrix_sync(scr + 16 * n, s, LDS, wmma::mem_row_major);
                }
            }
            __syncwarp();
            /* Online softmax of row r over this lane's columns (unstored blocks are masked). */
            int64_t see = t < a.T ? t - c0 : -1; /* the last column row t sees */
            int lim = see < KS ? (int)see : KS;
            float srow[KS / 2], mx = -INFINITY;
            const float4 *sr = reinterpret_cast<const float4 *>(scr + r * LDS + 4 * half);
#pragma unroll
            for (int c = 0; c < KS / 8; c++) {
                float4 v = sr[2 * c];
                int col = 8 * c + 4 * half;
                srow[4 * c] = col <= lim ? v.x * a.scale : -INFINITY;
                srow[4 * c + 1] = col + 1 <= lim ? v.y * a.scale : -INFINITY;
                srow[4 * c + 2] = col + 2 <= lim ? v.z * a.scale : -INFINITY;
                srow[4 * c + 3] = col + 3 <= lim ? v.w * a.scale : -INFINITY;
                mx = fmaxf(fmaxf(mx, fmaxf(srow[4 * c], srow[4 * c + 1])),
                           fmaxf(srow[4 * c + 2], srow[4 * c + 3]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float mn = fmaxf(m, mx), corr = 1.0f, sum = 0.0f;
            if (mn != -INFINITY) {
                corr = expf(m - mn);
            }
            __syncwarp(); /* every lane has read its S before P overwrites it */
            T *pr = sp + r * LDS + 4 * half;
#pragma unroll
            for (int c = 0; c < KS / 8; c++) {
                float e[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    e[u] = srow[4 * c + u] == -INFINITY ? 0.0f : expf(srow[4 * c + u] - mn);
                    sum += e[u];
                }
                tc_quad<T> q = {
                    {tc_cvt<T>(e[0]), tc_cvt<T>(e[1]), tc_cvt<T>(e[2]), tc_cvt<T>(e[3])}};
                *reinterpret_cast<tc_quad<T> *>(pr + 8 * c) = q;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            l = l * corr + sum;
            m = mn;
            /* O *= corr per row where any row's max grew (the first chunk's O is zero). */
            if (c0 > 0 && __any_sync(0xffffffffu, corr != 1.0f)) {
#pragma unroll
                for (int i = 0; i < rows.num_elements; i++) {
                    float ci = __shfl_sync(0xffffffffu, corr, 2 * ((int)rows.x[i] >> 4));
#pragma unroll
                    for (int f = 0; f < HDF; f++) {
                        if (f < nf) {
                            o[f].x[i] *= ci;
                        }
                    }
                }
            }
            /* O += P V once every lane wrote its P; V [KT][hd] is B row-major. */
            __syncwarp();
#pragma unroll
            for (int k = 0; k < KS / 16; k++) {
                if (k < nb) {
                    frag_a pa;
                    wmma::load_matrix_sync(pa, sp + 16 * k, LDS);
#pragma unroll
                    for (int f = 0; f < HDF; f++) {
                        if (f < nf) {
                            frag_b_row vb;
                            wmma::load_matrix_sync(vb, sv + (s0 + 16 * k) * LDH + 16 * f, LDH);
                            wmma::mma_sync(o[f], pa, vb, o[f]);
                        }
                    }
                }
            }
            __syncwarp(); /* every lane has read P before the next chunk's S overwrites it */
        }
    }
    if (wt0 >= a.T) {
        return; /* no real rows (after the last __syncthreads) */
    }
    if (fast) {
        /* Rows g and g + 8 from the fragments: a lane's 2 consecutive columns of a row as one
         * 8-byte store, a quad's 32 consecutive bytes (a whole sector) per 8 columns. */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            float lt = l2[u] + __shfl_xor_sync(0xffffffffu, l2[u], 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            int64_t tr = wt0 + tc_lay_row(lane, 2 * u);
            if (tr >= a.T) {
                continue;
            }
            float inv = 1.0f / lt;
            float *yr = y + (b * a.T + tr) * a.C + h * a.hd + tc_lay_col(lane, 0);
#pragma unroll
            for (int f = 0; f < HDF; f++) {
                if (f < nf) {
                    *reinterpret_cast<float2 *>(yr + 16 * f) =
                        make_float2(o[f].x[2 * u] * inv, o[f].x[2 * u + 1] * inv);
                    *reinterpret_cast<float2 *>(yr + 16 * f + 8) =
                        make_float2(o[f].x[2 * u + 4] * inv, o[f].x[2 * u + 5] * inv);
                }
            }
            if ((lane & 3) == 0) {
                lse[bh * a.T + tr] = m2[u] * 0.6931471805599453f + logf(lt); /* natural log */
            }
        }
        return;
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
static std::atomic<int> g_fwd_last(-1); /* nn_cu_attn_fwd_mode */
static std::atomic<int> g_bwd_kernel(-1); /* nn_cu_attn_bwd_kernel */

/* The tensor-core kernels apply (forward and backward alike): autocast bf16 / fp16, no
 * dropout, hd a multiple of 16 up to 128, the tensors 16-byte aligned (128-bit accesses). */
static bool tc_applies(const nn_cu_attn *a, const void *p1, const void *p2, const void *p3,
                       const void *p4)
{
    uintptr_t any = (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3 | (uintptr_t)p4;
    return nn_cu_attn_tc_takes_half(a) && (any & 15) == 0;
}

extern "C" {

int nn_cu_attn_tc_takes_half(const nn_cu_attn *a)
{
    return g_attn_kind != NN_CU_ATTN_WARP && (a->rnd == 1 || a->rnd == 2) && a->p <= 0.0f &&
           a->hd % 16 == 0 && a->hd <= 128;
}

void nn_cu_attn_set_kernel(int kind)
{
    g_attn_kind = kind;
    nn_cu_attn_bwd_set_fast(kind != NN_CU_ATTN_TC_SLOW);
}

int nn_cu_attn_fwd_mode(void)
{
    return g_fwd_last.load();
}

int nn_cu_attn_bwd_kernel(void)
{
    return g_bwd_kernel.load();
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
    /* Heads up to 64: 8 warps (128 query rows) share key tiles of 64, K and V loaded together;
     * up to 128: 4 warps and tiles of 32, K then V (registers). */
    typedef __nv_bfloat16 bf16; /* one launch a line: scripts/cuemu-launch.sed */
    unsigned bh = (unsigned)(a->B * a->H);
    bool fast = g_attn_kind != NN_CU_ATTN_TC_SLOW && a->scale > 0.0f; /* tc_fwd_chunk_fast */
    if (fast && accel__nn_cu_attn_fwd_tc2(s, a, qkv, y, lse, NULL)) { /* attn_tc_fwd.cu */
        g_fwd_last.store(2);
        g_tc_fwd++;
        *err = cudaGetLastError();
        return 1;
    }
    g_fwd_last.store(fast ? 1 : 0);
    if (a->hd <= 64) {
        unsigned blocks = bh * (unsigned)((a->T + 127) / 128);
        if (a->rnd == 1) {
            k_attn_fwd_tc<bf16, 4, 64, 8, true><<<blocks, 256, 0, s>>>(*a, qkv, y, lse, fast);
        } else {
            k_attn_fwd_tc<__half, 4, 64, 8, true><<<blocks, 256, 0, s>>>(*a, qkv, y, lse, fast);
        }
    } else {
        unsigned blocks = bh * (unsigned)((a->T + 63) / 64);
        if (a->rnd == 1) {
            k_attn_fwd_tc<bf16, 8, 32, 4, false><<<blocks, 128, 0, s>>>(*a, qkv, y, lse, fast);
        } else {
            k_attn_fwd_tc<__half, 8, 32, 4, false><<<blocks, 128, 0, s>>>(*a, qkv, y, lse, fast);
        }
    }
    g_tc_fwd++;
    *err = cudaGetLastError();
    if (*err == cudaSuccess && a->y_h != NULL) { /* this kernel writes no copy of y */
        *err = nn_cu_to_half(s, y, a->y_h, a->B * a->T * a->C, a->rnd);
    }
    return 1;
}

int nn_cu_attn_fwd_tc_half(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y,
                           float *lse, void *qkv_h, cudaError_t *err)
{
    if (!tc_applies(a, qkv, y, qkv_h, y) || a->qkv_h != NULL || g_attn_kind == NN_CU_ATTN_TC_SLOW ||
        !accel__nn_cu_attn_fwd_tc2(s, a, qkv, y, lse, qkv_h)) {
        return 0;
    }
    g_fwd_last.store(2);
    g_tc_fwd++;
    *err = cudaGetLastError();
    return 1;
}

int nn_cu_attn_half_only(cudaStream_t s, const nn_cu_attn *a, float *scratch)
{
    /* The conditions of accel__nn_cu_attn_fwd_tc2 and accel__nn_cu_attn_bwd_tc2 that do not
     * depend on pointers (the arena's are 256-byte aligned), with the grids' bounds taken at
     * their smallest tile (16 rows). */
    return g_attn_kind == NN_CU_ATTN_AUTO && a->rnd == 1 && a->hd == 64 && a->p <= 0.0f &&
           a->scale > 0.0f && a->T < INT32_MAX / 2 &&
           a->B * a->H * ((a->T + 15) / 16) < INT32_MAX && accel__nn_cu_attn_f2_layout(s, scratch);
}

int nn_cu_attn_fwd_tc_read_half(cudaStream_t s, const nn_cu_attn *a, float *y, float *lse,
                                cudaError_t *err)
{
    if (a->qkv_h == NULL || g_attn_kind != NN_CU_ATTN_AUTO ||
        !tc_applies(a, a->qkv_h, y, a->qkv_h, y) ||
        !accel__nn_cu_attn_fwd_tc2(s, a, NULL, y, lse, NULL)) {
        return 0;
    }
    g_fwd_last.store(2);
    g_tc_fwd++;
    *err = cudaGetLastError();
    return 1;
}

int nn_cu_attn_bwd_tc(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                      const float *lse, const float *gy, float *D, float *gqkv, int write,
                      cudaError_t *err)
{
    if (qkv == NULL && a->B * a->T > 0) {
        /* qkv held only as its 2-byte copy (nn_cu_attn_half_only said so in forward): only
         * attn_tc_bwd2.cu's kernels can run; a test hook that turned them off since then
         * gets an error, not a read of NULL. */
        if (g_attn_kind == NN_CU_ATTN_AUTO &&
            accel__nn_cu_attn_bwd_tc2(s, a, y, lse, D, gqkv, write)) {
            g_bwd_kernel.store(2);
            g_tc_bwd++;
            *err = cudaGetLastError();
        } else {
            *err = cudaErrorNotSupported;
        }
        return 1;
    }
    if (!tc_applies(a, qkv, y, gy, gqkv)) {
        return 0;
    }
    /* Head 64 in bf16 from the 2-byte copies: attn_tc_bwd2.cu, unless ACCEL_NN_ATTN_FAST=0. */
    bool fast = g_attn_kind != NN_CU_ATTN_TC_SLOW;
    bool k2 = fast && accel__nn_cu_attn_bwd_tc2(s, a, y, lse, D, gqkv, write);
    if (k2) {
        g_bwd_kernel.store(2);
    } else {
        accel__nn_cu_attn_bwd_tc_queue(s, a, qkv, y, lse, gy, D, gqkv, write);
        g_bwd_kernel.store(1);
    }
    g_tc_bwd++;
    *err = cudaGetLastError();
    /* attn_tc_bwd2.cu's kernels write the gradient's copy when they write the gradient */
    if (*err == cudaSuccess && a->gqkv_h != NULL && (!k2 || !write)) {
        *err = nn_cu_to_half(s, gqkv, a->gqkv_h, a->B * a->T * 3 * a->C, a->rnd);
    }
    return 1;
}

} /* extern "C" */
