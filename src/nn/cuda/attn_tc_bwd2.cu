/*
 * The tensor-core causal attention backward at head size 64 in bf16 (GPT-2), written as the
 * 32-rows-a-warp forward (attn_tc_fwd.cu) is: fragments filled by the lane's own 32-bit shared
 * loads (f2_frag, attn_tc_frag.cuh), the operands read as B stored transposed as their tiles are
 * loaded, no masks below the diagonal, exponentials by one MUFU.EX2. nn_cu_attn_bwd_tc
 * (attn_tc.cu) tries it first; attn_tc_bwd.cu's kernels run everything else.
 *
 * Two kernels, FlashAttention-2's atomic-free schedule:
 *  - k_b2_dkv: one block per (batch, head, 64 keys), a warp's 16 keys; K and V of the warp's
 *    keys stay in registers as A fragments, dK and dV in accumulators; tiles of 64 queries
 *    stream through shared memory as Q [query][dim], Q^T [dim][query], dO, dO^T, in chunks of
 *    32 queries: S^T = K Q^T, P^T = rnd(exp2(S^T scale log2 e - lse log2 e)) formed in the
 *    accumulator's registers (an A operand's layout is the accumulator's), dV += P^T dO,
 *    dP^T = V dO^T, dS^T = rnd(P^T dP^T - P^T D), dK += dS^T Q.
 *  - k_b2_dq (queued first): one block per (batch, head, 64 queries), a warp's 16 queries; it forms
 *    D[bh, t] = rnd(dO[t]) . O[t] of its rows (summed as attn_tc_bwd.cu's dQ kernel sums it,
 *    written for the dK/dV kernel); Q and dO in registers, tiles of 64 keys as K, K^T and V:
 *    S = Q K^T, P, dP = dO V^T, dS, dQ += dS K.
 * Same values as attn_tc_bwd.cu's register path: P and dS rounded to bf16 before the products
 * that read them, fp32 sums, each output row written by one warp once (no atomics); every sum
 * over queries (dK, dV) or keys (dQ) runs in ascending 16-row steps as there (a tile that is
 * wholly masked adds nothing and is skipped), so in the emulator (exp2f) the gradients are the
 * same bit for bit; on the GPU ex2.approx rounds P differently in the last bits.
 * Reads only the 2-byte copies (nn_cu_attn.qkv_h, dy_h), lse, and y for D.
 *
 * Invariant: a chunk of 32 (queries or keys) starts on a multiple of 16 of the warp's first
 * row, so each of its two 16-column tiles is wholly visible, wholly masked (skipped), or the
 * diagonal tile with the fixed per-lane mask.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#ifdef __CUDACC__
#include <mma.h>
#endif

#include "attn_tc.cuh"
#include "attn_tc_frag.cuh"
#include "nn_kernels.h"

using namespace nvcuda;

#define B2_T 64     /* rows a block owns (4 warps of 16) and rows of a streamed tile */
#define B2_GROUP 32 /* (batch, head) pairs a group of blocks, as the forward's F2_GROUP */

/* A chunk's 16-column tile: skipped (wholly masked), the diagonal tile, or wholly visible. */
#define B2_SKIP 0
#define B2_DIAG 1
#define B2_FULL 2

/* Rows [0, 64) of a bf16 tile (row i at src + i stride; rows from `valid` read as zero) into
 * dst [row][F2_LD] and, where TR, transposed into dst_t [dim][F2_LD]: lane p takes rows 2 p and
 * 2 p + 1, warp w the 16 dims from 16 w (the forward's f2_vt); all 4 loads in flight before
 * the first store. The transposed store writes one dim's row pair as one 32-bit word, a store
 * instruction's 32 lanes one dim's 32 consecutive words (no bank conflict); the plain 16-byte
 * stores are 2-way (rows 2 p are 8 banks apart). */
template <bool TR>
__device__ __forceinline__ void b2_tile(const bf16 *src, int64_t stride, int valid, bf16 *dst,
                                        bf16 *dst_t)
{
    int p = threadIdx.x & 31, d0 = 16 * (threadIdx.x >> 5);
    uint4 v[2][2];
    F2_UNROLL
    for (int k = 0; k < 2; k++) {
        F2_UNROLL
        for (int h = 0; h < 2; h++) {
            v[k][h] = f2_get8(src + (int64_t)(2 * p + k) * stride + d0 + 8 * h, 2 * p + k < valid);
        }
    }
    F2_UNROLL
    for (int k = 0; k < 2; k++) {
        F2_UNROLL
        for (int h = 0; h < 2; h++) {
            *reinterpret_cast<uint4 *>(dst + (2 * p + k) * F2_LD + d0 + 8 * h) = v[k][h];
        }
    }
    if (TR) {
        F2_UNROLL
        for (int h = 0; h < 2; h++) {
            bf16 e0[8], e1[8];
            memcpy(static_cast<void *>(e0), &v[0][h], sizeof e0);
            memcpy(static_cast<void *>(e1), &v[1][h], sizeof e1);
            F2_UNROLL
            for (int d = 0; d < 8; d++) {
                *reinterpret_cast<__nv_bfloat162 *>(dst_t + (d0 + 8 * h + d) * F2_LD + 2 * p) =
                    __halves2bfloat162(e0[d], e1[d]);
            }
        }
    }
}

/* Bit i set where the lane's accumulator element i of a diagonal 16 x 16 tile is masked: its
 * column (a query) before its row (a key) when KEY_ROWS, else its column (a key) after its
 * row (a query). */
template <bool KEY_ROWS> __device__ __forceinline__ unsigned b2_dmask(int lane)
{
    unsigned m = 0;
    F2_UNROLL
    for (int i = 0; i < 8; i++) {
        int r = tc_lay_row(lane, i), c = tc_lay_col(lane, i);
        m |= (KEY_ROWS ? c < r : c > r) ? 1u << i : 0u;
    }
    return m;
}

/* P = rnd(2^(s sl2 - l2)) into the A fragment pa, 0 where masked (DIAG and dmask), from
 * accumulator s; l2 (base-2 lse) per element: lcol (KEY_ROWS: per column, element i's at
 * (i >> 2) * 2 + (i & 1)) or lrow (per row, element i's at (i >> 1) & 1). */
template <bool DIAG, bool KEY_ROWS>
__device__ __forceinline__ void b2_probs(f2_a &pa, const f2_c &s, float sl2, const float (&l)[4],
                                         unsigned dmask)
{
    F2_UNROLL
    for (int i = 0; i < 8; i++) {
        float li = KEY_ROWS ? l[2 * (i >> 2) + (i & 1)] : l[(i >> 1) & 1];
        bf16 e = tc_cvt<bf16>(f2_exp2(fmaf(s.x[i], sl2, -li)));
        if (DIAG && ((dmask >> i) & 1u)) {
            e = tc_cvt<bf16>(0.0f);
        }
        pa.x[i] = e;
    }
}

/* dS = rnd(P dP - P D) in place of P in pa, dP from accumulator dp; D per element as l in
 * b2_probs. */
template <bool KEY_ROWS>
__device__ __forceinline__ void b2_dscores(f2_a &pa, const f2_c &dp, const float (&d)[4])
{
    F2_UNROLL
    for (int i = 0; i < 8; i++) {
        float di = KEY_ROWS ? d[2 * (i >> 2) + (i & 1)] : d[(i >> 1) & 1];
        float p = tc_f<bf16>(pa.x[i]), g = dp.x[i];
        pa.x[i] = tc_cvt<bf16>(p * g - p * di);
    }
}

/* The lane's columns 2 q, 2 q + 1, 2 q + 8, 2 q + 9 of a tile's per-column values (p: the
 * tile's + 2 q, 8-byte aligned). */
__device__ __forceinline__ void b2_cols(float (&v)[4], const float *p)
{
    float2 a = *reinterpret_cast<const float2 *>(p), b = *reinterpret_cast<const float2 *>(p + 8);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

/* s[n] = a times B for each of the chunk's two 16-column tiles n that L0, L1 do not skip, B
 * (dim, column) being src [column][dim] (src: the lane's pointer at the chunk's first column):
 * summed per 16-dim block f in ascending order, both tiles' products per block. */
template <int L0, int L1>
__device__ __forceinline__ void b2_tiles(f2_c (&s)[2], const f2_a (&a)[F2_NF], const bf16 *src)
{
    const int L[2] = {L0, L1};
    F2_UNROLL
    for (int n = 0; n < 2; n++) {
        if (L[n] != B2_SKIP) {
            wmma::fill_fragment(s[n], 0.0f);
        }
    }
    F2_UNROLL
    for (int f = 0; f < F2_NF; f++) {
        F2_UNROLL
        for (int n = 0; n < 2; n++) {
            if (L[n] != B2_SKIP) {
                f2_b b;
                f2_frag<true>(b, src + 16 * n * F2_LD + 16 * f);
                wmma::mma_sync(s[n], a[f], b, s[n]);
            }
        }
    }
}

/* acc[f] += pa times B for every 16-dim block f in ascending order, B (column, dim) being
 * srct [dim][column] (srct: the lane's pointer at the tile's first column). */
__device__ __forceinline__ void b2_acc(f2_c (&acc)[F2_NF], const f2_a &pa, const bf16 *srct)
{
    F2_UNROLL
    for (int f = 0; f < F2_NF; f++) {
        f2_b b;
        f2_frag<true>(b, srct + 16 * f * F2_LD);
        wmma::mma_sync(acc[f], pa, b, acc[f]);
    }
}

/* One chunk of 32 queries for the warp's 16 keys (k_b2_dkv): L0, L1 what its two 16-query
 * tiles are (B2_SKIP, B2_DIAG, B2_FULL). q, od: the lane's pointers into Q and dO [query][dim]
 * at the chunk's first query; qt, odt: into Q^T and dO^T [dim][query] there; sl, sd: base-2 lse
 * and D of the chunk's queries (shared). */
template <int L0, int L1>
__device__ __forceinline__ void b2_dkv_chunk(f2_c (&dk)[F2_NF], f2_c (&dv)[F2_NF],
                                             const f2_a (&ka)[F2_NF], const f2_a (&va)[F2_NF],
                                             const bf16 *q, const bf16 *qt, const bf16 *od,
                                             const bf16 *odt, const float *sl, const float *sd,
                                             int lq, unsigned dmask, float sl2)
{
    const int L[2] = {L0, L1};
    f2_c s[2];
    f2_a pa[2];
    /* S^T = K Q^T: B (dim, query) is Q [query][dim]. */
    b2_tiles<L0, L1>(s, ka, q);
    F2_UNROLL
    for (int n = 0; n < 2; n++) {
        float l[4];
        b2_cols(l, sl + 16 * n + lq);
        if (L[n] == B2_DIAG) {
            b2_probs<true, true>(pa[n], s[n], sl2, l, dmask);
        } else if (L[n] == B2_FULL) {
            b2_probs<false, true>(pa[n], s[n], sl2, l, dmask);
        }
    }
    /* dV += P^T dO: B (query, dim) is dO^T [dim][query]. */
    F2_UNROLL
    for (int n = 0; n < 2; n++) {
        if (L[n] != B2_SKIP) {
            b2_acc(dv, pa[n], odt + 16 * n);
        }
    }
    /* dP^T = V dO^T: B (dim, query) is dO [query][dim]. */
    b2_tiles<L0, L1>(s, va, od);
    /* dK += dS^T Q: B (query, dim) is Q^T [dim][query]. */
    F2_UNROLL
    for (int n = 0; n < 2; n++) {
        if (L[n] != B2_SKIP) {
            float d[4];
            b2_cols(d, sd + 16 * n + lq);
            b2_dscores<true>(pa[n], s[n], d);
            b2_acc(dk, pa[n], qt + 16 * n);
        }
    }
}

/* One chunk of 32 keys for the warp's 16 queries (k_b2_dq): L0, L1 as in b2_dkv_chunk (keys
 * now). k, v: the lane's pointers into K and V [key][dim] at the chunk's first key; kt: into
 * K^T [dim][key] there; l, d: base-2 lse and D of the lane's rows g and g + 8. */
template <int L0, int L1>
__device__ __forceinline__ void b2_dq_chunk(f2_c (&dq)[F2_NF], const f2_a (&qa)[F2_NF],
                                            const f2_a (&oa)[F2_NF], const bf16 *k, const bf16 *kt,
                                            const bf16 *v, const float (&l)[4],
                                            const float (&d)[4], unsigned dmask, float sl2)
{
    const int L[2] = {L0, L1};
    f2_c s[2];
    f2_a pa[2];
    /* S = Q K^T: B (dim, key) is K [key][dim]. */
    b2_tiles<L0, L1>(s, qa, k);
    F2_UNROLL
    for (int n = 0; n < 2; n++) {
        if (L[n] == B2_DIAG) {
            b2_probs<true, false>(pa[n], s[n], sl2, l, dmask);
        } else if (L[n] == B2_FULL) {
            b2_probs<false, false>(pa[n], s[n], sl2, l, dmask);
        }
    }
    /* dP = dO V^T: B (dim, key) is V [key][dim]. */
    b2_tiles<L0, L1>(s, oa, v);
    /* dQ += dS K: B (key, dim) is K^T [dim][key]. */
    F2_UNROLL
    for (int n = 0; n < 2; n++) {
        if (L[n] != B2_SKIP) {
            b2_dscores<false>(pa[n], s[n], d);
            b2_acc(dq, pa[n], kt + 16 * n);
        }
    }
}

/* Rows g and g + 8 of the warp's 16 x 64 accumulators (first row r0) times f, rounded to bf16,
 * written (write) or added into dst (row i at dst + i stride), rows before nt only: a lane's 2
 * consecutive columns as one 8-byte access. hdst (non-NULL, only with write): the same values
 * as bf16 at the same offsets (the gradient's 2-byte copy, nn_cu_to_half's bits: exact, the
 * values are bf16 already), one 4-byte store per 2. */
__device__ __forceinline__ void b2_store(const f2_c (&acc)[F2_NF], float f, float *dst,
                                         int64_t stride, int r0, int nt, int write, bf16 *hdst)
{
    int lane = threadIdx.x & 31;
    F2_UNROLL
    for (int r = 0; r < 2; r++) {
        int row = r0 + tc_lay_row(lane, 2 * r);
        if (row >= nt) {
            continue;
        }
        int64_t po = (int64_t)row * stride + tc_lay_col(lane, 0);
        float *p = dst + po;
        F2_UNROLL
        for (int c = 0; c < F2_NF; c++) {
            F2_UNROLL
            for (int h = 0; h < 2; h++) {
                int i = 2 * r + 4 * h;
                float2 x = make_float2(tc_round<bf16>(acc[c].x[i] * f),
                                       tc_round<bf16>(acc[c].x[i + 1] * f));
                float2 *o = reinterpret_cast<float2 *>(p + 16 * c + 8 * h);
                if (!write) {
                    float2 w = *o;
                    x = make_float2(w.x + x.x, w.y + x.y);
                }
                *o = x;
                if (hdst != nullptr) {
                    *reinterpret_cast<__nv_bfloat162 *>(hdst + po + 16 * c + 8 * h) =
                        __floats2bfloat162_rn(x.x, x.y);
                }
            }
        }
    }
}

/* The block's (batch, head) pair and tile: pairs in groups of B2_GROUP, a group's tiles in the
 * order `rev` (0: tile 0 first, 1: the last first), so that the blocks in flight share few
 * pairs' tensors in L2 and the grid ends on the short tiles. */
__device__ __forceinline__ void b2_block(int nbh, int ntile, bool rev, int &bh, int &tile)
{
    int g = (int)blockIdx.x / (B2_GROUP * ntile), w = (int)blockIdx.x % (B2_GROUP * ntile);
    int gn = nbh - g * B2_GROUP < B2_GROUP ? nbh - g * B2_GROUP : B2_GROUP;
    tile = rev ? ntile - 1 - w / gn : w / gn;
    bh = g * B2_GROUP + w % gn;
}

/* dK and dV: one block per (batch, head, 64 keys), 4 warps of 16 keys, over the query tiles
 * from its first key on (the key tiles with the most queries first). Shared: Q, Q^T, dO, dO^T
 * (the first two also stage K and V), base-2 lse and D of the tile: 36.5 KiB. */
__global__ void __launch_bounds__(128, 3)
    k_b2_dkv(nn_cu_attn a, const bf16 *qh, const bf16 *gh, const float *lse, const float *D,
             float *gqkv, int write)
{
    __shared__ __align__(16) bf16 sq[B2_T * F2_LD], sqt[F2_HD * F2_LD];
    __shared__ __align__(16) bf16 sdo[B2_T * F2_LD], sdot[F2_HD * F2_LD];
    __shared__ __align__(16) float sl[B2_T], sd[B2_T];

    int nt = (int)a.T, nbh = (int)(a.B * a.H), bh, kt;
    b2_block(nbh, (nt + B2_T - 1) / B2_T, false, bh, kt);
    int h = bh % (int)a.H, b = bh / (int)a.H, j0 = kt * B2_T;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wj0 = j0 + 16 * warp;
    int64_t C3 = 3 * a.C;
    const bf16 *q_bh = qh + (int64_t)b * nt * C3 + (int64_t)h * F2_HD;
    const bf16 *g_bh = gh + (int64_t)b * nt * a.C + (int64_t)h * F2_HD;
    const float *lse_h = lse + (int64_t)bh * nt, *D_h = D + (int64_t)bh * nt;
    const float sl2 = a.scale * 1.44269504088896341f;

    /* The block's K and V rows, staged in sq and sdo, into the warps' A fragments. */
    b2_tile<false>(q_bh + (int64_t)j0 * C3 + a.C, C3, nt - j0, sq, nullptr);
    b2_tile<false>(q_bh + (int64_t)j0 * C3 + 2 * a.C, C3, nt - j0, sdo, nullptr);
    __syncthreads();
    int lo = (lane >> 2) * F2_LD + 2 * (lane & 3), lq = 2 * (lane & 3);
    f2_a ka[F2_NF], va[F2_NF];
    f2_c dk[F2_NF], dv[F2_NF];
    F2_UNROLL
    for (int f = 0; f < F2_NF; f++) {
        f2_frag<false>(ka[f], sq + 16 * warp * F2_LD + lo + 16 * f);
        f2_frag<false>(va[f], sdo + 16 * warp * F2_LD + lo + 16 * f);
        wmma::fill_fragment(dk[f], 0.0f);
        wmma::fill_fragment(dv[f], 0.0f);
    }
    unsigned dmask = b2_dmask<true>(lane);
    for (int i0 = j0; i0 < nt; i0 += B2_T) {
        __syncthreads(); /* every warp is done with the previous tile (and the staging) */
        /* The tile's lse (threads 0-63) and D (64-127): base 2, +inf past T (P = 0 there). */
        int it = i0 + (threadIdx.x & (B2_T - 1));
        float x = 0.0f;
        if (it < nt) {
            x = threadIdx.x < B2_T ? lse_h[it] : D_h[it];
        }
        b2_tile<true>(q_bh + (int64_t)i0 * C3, C3, nt - i0, sq, sqt);
        b2_tile<true>(g_bh + (int64_t)i0 * a.C, a.C, nt - i0, sdo, sdot);
        if (threadIdx.x < B2_T) {
            sl[threadIdx.x] = it < nt ? x * 1.44269504088896341f : INFINITY;
        } else {
            sd[threadIdx.x - B2_T] = x;
        }
        __syncthreads();
        if (wj0 >= nt) {
            continue; /* no real keys: only the tile loads */
        }
        F2_UNROLL
        for (int s0 = 0; s0 < B2_T; s0 += 32) {
            int c0 = i0 + s0; /* the chunk's first query */
            const bf16 *q = sq + lo + s0 * F2_LD, *qt = sqt + lo + s0;
            const bf16 *o = sdo + lo + s0 * F2_LD, *ot = sdot + lo + s0;
            if (c0 >= wj0 + 16) {
                b2_dkv_chunk<B2_FULL, B2_FULL>(dk, dv, ka, va, q, qt, o, ot, sl + s0, sd + s0, lq,
                                               dmask, sl2);
            } else if (c0 == wj0) {
                b2_dkv_chunk<B2_DIAG, B2_FULL>(dk, dv, ka, va, q, qt, o, ot, sl + s0, sd + s0, lq,
                                               dmask, sl2);
            } else if (c0 + 16 == wj0) {
                b2_dkv_chunk<B2_SKIP, B2_DIAG>(dk, dv, ka, va, q, qt, o, ot, sl + s0, sd + s0, lq,
                                               dmask, sl2);
            } /* else every query of the chunk is before the warp's keys */
        }
    }
    if (wj0 >= nt) {
        return;
    }
    int64_t off = (int64_t)b * nt * C3 + (int64_t)h * F2_HD;
    bf16 *hd = write && a.gqkv_h != nullptr ? static_cast<bf16 *>(a.gqkv_h) + off : nullptr;
    b2_store(dk, a.scale, gqkv + off + a.C, C3, wj0, nt, write, hd ? hd + a.C : nullptr);
    b2_store(dv, 1.0f, gqkv + off + 2 * a.C, C3, wj0, nt, write, hd ? hd + 2 * a.C : nullptr);
}

/* dQ: one block per (batch, head, 64 queries), 4 warps of 16 queries, over the key tiles up to
 * its last query (the longest query tiles first). Shared: K, K^T, V (K and V also stage Q and
 * dO): 27 KiB. */
__global__ void __launch_bounds__(128, 4)
    k_b2_dq(nn_cu_attn a, const bf16 *qh, const bf16 *gh, const float *y, const float *lse,
            float *D, float *gqkv, int write)
{
    __shared__ __align__(16) bf16 sk[B2_T * F2_LD], skt[F2_HD * F2_LD], sv[B2_T * F2_LD];
    __shared__ float sdr[B2_T]; /* D of the block's rows */

    int nt = (int)a.T, nbh = (int)(a.B * a.H), bh, qt;
    b2_block(nbh, (nt + B2_T - 1) / B2_T, true, bh, qt);
    int h = bh % (int)a.H, b = bh / (int)a.H, t0 = qt * B2_T;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wt0 = t0 + 16 * warp;
    int64_t C3 = 3 * a.C;
    const bf16 *q_bh = qh + (int64_t)b * nt * C3 + (int64_t)h * F2_HD;
    const bf16 *g_bh = gh + (int64_t)b * nt * a.C + (int64_t)h * F2_HD;
    const float sl2 = a.scale * 1.44269504088896341f;

    /* D of the block's rows: a thread pair a row (dt), each half of the dims summed as
     * attn_tc_bwd.cu's dQ kernel sums it (dO as staged in sv), then the pair's; into sdr and
     * D (which the dK/dV kernel, queued next, reads). O's loads fly with the staging's. */
    int dt = threadIdx.x >> 1, half = threadIdx.x & 1;
    float4 yv[F2_HD / 8];
    F2_UNROLL
    for (int i = 0; i < F2_HD / 8; i++) {
        yv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t0 + dt < nt) {
            yv[i] = reinterpret_cast<const float4 *>(
                y + ((int64_t)b * nt + t0 + dt) * a.C + (int64_t)h * F2_HD + half * (F2_HD / 2))[i];
        }
    }
    b2_tile<false>(q_bh + (int64_t)t0 * C3, C3, nt - t0, sk, nullptr);
    b2_tile<false>(g_bh + (int64_t)t0 * a.C, a.C, nt - t0, sv, nullptr);
    __syncthreads();
    float Du = 0.0f;
    const bf16 *dr = sv + dt * F2_LD + half * (F2_HD / 2);
    F2_UNROLL
    for (int i = 0; i < F2_HD / 8; i++) {
        float4 v = yv[i];
        Du += tc_f<bf16>(dr[4 * i]) * v.x + tc_f<bf16>(dr[4 * i + 1]) * v.y +
              tc_f<bf16>(dr[4 * i + 2]) * v.z + tc_f<bf16>(dr[4 * i + 3]) * v.w;
    }
    Du += __shfl_xor_sync(0xffffffffu, Du, 1);
    if (half == 0) {
        sdr[dt] = Du;
        if (t0 + dt < nt) {
            D[(int64_t)bh * nt + t0 + dt] = Du;
        }
    }
    __syncthreads();
    /* The lane's rows g and g + 8: base-2 lse (+inf past T: P = 0) and D. */
    float l[4], d[4];
    F2_UNROLL
    for (int r = 0; r < 2; r++) {
        int t = wt0 + tc_lay_row(lane, 2 * r);
        l[r] = t < nt ? lse[(int64_t)bh * nt + t] * 1.44269504088896341f : INFINITY;
        d[r] = sdr[t - t0];
        l[r + 2] = l[r];
        d[r + 2] = d[r];
    }
    int lo = (lane >> 2) * F2_LD + 2 * (lane & 3);
    f2_a qa[F2_NF], oa[F2_NF];
    f2_c dq[F2_NF];
    F2_UNROLL
    for (int f = 0; f < F2_NF; f++) {
        f2_frag<false>(qa[f], sk + 16 * warp * F2_LD + lo + 16 * f);
        f2_frag<false>(oa[f], sv + 16 * warp * F2_LD + lo + 16 * f);
        wmma::fill_fragment(dq[f], 0.0f);
    }
    unsigned dmask = b2_dmask<false>(lane);
    int last = (t0 + B2_T < nt ? t0 + B2_T : nt) - 1; /* the block's last query */
    for (int j0 = 0; j0 <= last; j0 += B2_T) {
        __syncthreads(); /* every warp is done with the previous tile (and the staging) */
        b2_tile<true>(q_bh + (int64_t)j0 * C3 + a.C, C3, nt - j0, sk, skt);
        b2_tile<false>(q_bh + (int64_t)j0 * C3 + 2 * a.C, C3, nt - j0, sv, nullptr);
        __syncthreads();
        if (wt0 >= nt) {
            continue; /* no real queries: only the tile loads */
        }
        F2_UNROLL
        for (int s0 = 0; s0 < B2_T; s0 += 32) {
            int c0 = j0 + s0; /* the chunk's first key */
            const bf16 *k = sk + lo + s0 * F2_LD, *kt = skt + lo + s0, *v = sv + lo + s0 * F2_LD;
            if (c0 + 32 <= wt0) {
                b2_dq_chunk<B2_FULL, B2_FULL>(dq, qa, oa, k, kt, v, l, d, dmask, sl2);
            } else if (c0 + 16 == wt0) {
                b2_dq_chunk<B2_FULL, B2_DIAG>(dq, qa, oa, k, kt, v, l, d, dmask, sl2);
            } else if (c0 == wt0) {
                b2_dq_chunk<B2_DIAG, B2_SKIP>(dq, qa, oa, k, kt, v, l, d, dmask, sl2);
            } /* else every key of the chunk is after the warp's queries */
        }
    }
    if (wt0 >= nt) {
        return;
    }
    int64_t off = (int64_t)b * nt * C3 + (int64_t)h * F2_HD;
    bf16 *hd = write && a.gqkv_h != nullptr ? static_cast<bf16 *>(a.gqkv_h) + off : nullptr;
    b2_store(dq, a.scale, gqkv + off, C3, wt0, nt, write, hd);
}

static std::atomic<int> g_b2_allow(1); /* nn_cu_attn_bwd2_allow */

extern "C" void nn_cu_attn_bwd2_allow(int on)
{
    g_b2_allow.store(on != 0);
}

/* Queues k_b2_dq (which writes D), then k_b2_dkv, where they apply (see nn_kernels.h) and returns 1. */
extern "C" int accel__nn_cu_attn_bwd_tc2(cudaStream_t s, const nn_cu_attn *a, const float *y,
                                         const float *lse, float *D, float *gqkv, int write)
{
    uintptr_t al = (uintptr_t)a->qkv_h | (uintptr_t)a->dy_h | (uintptr_t)y |
                   ((uintptr_t)a->gqkv_h & 3) * 16;
    int64_t ntile = (a->T + B2_T - 1) / B2_T;
    if (!g_b2_allow.load() || a->rnd != 1 || a->hd != F2_HD || a->scale <= 0.0f ||
        a->qkv_h == NULL || a->dy_h == NULL || (al & 15) != 0 || ((uintptr_t)gqkv & 7) != 0 ||
        a->T >= INT32_MAX / 2 || a->B * a->H * ntile >= INT32_MAX ||
        !accel__nn_cu_attn_f2_layout(s, D)) {
        return 0;
    }
    const bf16 *qh = static_cast<const bf16 *>(a->qkv_h), *gh = static_cast<const bf16 *>(a->dy_h);
    unsigned nb = (unsigned)(a->B * a->H * ntile);
    k_b2_dq<<<nb, 128, 0, s>>>(*a, qh, gh, y, lse, D, gqkv, write);
    k_b2_dkv<<<nb, 128, 0, s>>>(*a, qh, gh, lse, D, gqkv, write);
    return 1;
}
