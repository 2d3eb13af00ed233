/*
 * The tensor-core causal attention forward at 32 query rows a warp (bf16, head size 64), which
 * nn_cu_attn_fwd_tc (attn_tc.cu) runs where the device's WMMA fragments have the sm_80+
 * layout (probed once a process); attn_tc.cu's k_attn_fwd_tc runs everything else. Same
 * results as its register fast path up to the exponential's rounding: y = O / l and
 * lse = m + log(l) where k_attn_fwd writes them, P rounded to bf16 before P V, fp32 sums.
 *
 * Why a second kernel: k_attn_fwd_tc's warp owns 16 rows, so each K or V fragment it loads
 * serves one 16 x 16 x 16 product, and WMMA's loads are generic-address 32-bit loads with
 * their address computed anew each time (V's also transposed by MOVM): about 22 instructions
 * an HMMA on the H200. Here a warp owns two 16-row tiles and every fragment serves both;
 * fragments are read from shared memory by the lane's own 32-bit loads at fixed offsets from
 * one per-lane pointer (the layout is the probed one); V is stored transposed (V^T [dim][key])
 * when its tile is loaded, so both K and V^T are col-major B operands, read like K; the head
 * size is a compile-time 64 and the chunk of 32 keys is either wholly below the warp's
 * diagonal (no mask, no tests) or the diagonal chunk (a fixed pattern); exponentials by
 * one MUFU.EX2 each (f2_exp2, flush to zero, without exp2f's range fix-ups). qkv comes as
 * fp32 (rounded to bf16 as the tiles are loaded) or as its bf16 copy (nn_cu_attn.qkv_h); from
 * fp32 the kernel can also write that copy for the backward (nn_cu_attn_fwd_tc_half), each
 * element once, so that no separate pass over qkv makes it.
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

/* Shapes (head 64, F2_LD: attn_tc_frag.cuh): key tiles of KT 64, 4 warps of 32 rows (QT 128 a
 * block), chunks of 32 keys; K [key][F2_LD], V^T [dim][F2_LD] (F2_LD = F2_KT + 8). */
#define F2_KT 64
#define F2_QT 128

/* Rows [0, 16 NR) of a source tile (row i at src + i stride; rows from `valid` read as zero)
 * into dst [row][F2_LD]: thread t takes 8 elements (8 t % 64) of rows t / 8 + 16 i, so each
 * quarter warp stores one row's 128 bytes (no bank conflict) and the loads of all NR rows are
 * in flight before the first store. W and out: the valid rows rounded also to out (the same
 * layout as src: qkv's 2-byte copy). */
template <int NR, bool W, typename S>
__device__ __forceinline__ void f2_rows(const S *src, int64_t stride, int valid, bf16 *dst,
                                        bf16 *out)
{
    int c = 8 * (threadIdx.x & 7), r = threadIdx.x >> 3;
    uint4 v[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
        v[i] = f2_get8(src + (int64_t)(r + 16 * i) * stride + c, r + 16 * i < valid);
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
        *reinterpret_cast<uint4 *>(dst + (r + 16 * i) * F2_LD + c) = v[i];
        if (W && out != nullptr && r + 16 * i < valid) {
            *reinterpret_cast<uint4 *>(out + (int64_t)(r + 16 * i) * stride + c) = v[i];
        }
    }
}

/* The V tile of F2_KT keys (key i at src + i stride; keys from `valid` read as zero)
 * transposed into dst [dim][F2_LD]: lane p takes keys 2 p and 2 p + 1, warp w the 16 dims
 * from 16 w, and stores each dim's key pair as one 32-bit word; a store instruction's 32
 * lanes write one dim's 32 consecutive words (no bank conflict). W and out: as f2_rows. */
template <bool W, typename S>
__device__ __forceinline__ void f2_vt(const S *src, int64_t stride, int valid, bf16 *dst, bf16 *out)
{
    int p = threadIdx.x & 31, d0 = 16 * (threadIdx.x >> 5);
    uint4 v[2][2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            v[k][h] = f2_get8(src + (int64_t)(2 * p + k) * stride + d0 + 8 * h, 2 * p + k < valid);
        }
    }
    if (W && out != nullptr) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (2 * p + k < valid) {
                    *reinterpret_cast<uint4 *>(out + (int64_t)(2 * p + k) * stride + d0 + 8 * h) =
                        v[k][h];
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        bf16 e0[8], e1[8];
        memcpy(static_cast<void *>(e0), &v[0][h], sizeof e0);
        memcpy(static_cast<void *>(e1), &v[1][h], sizeof e1);
#pragma unroll
        for (int d = 0; d < 8; d++) {
            *reinterpret_cast<__nv_bfloat162 *>(dst + (d0 + 8 * h + d) * F2_LD + 2 * p) =
                __halves2bfloat162(e0[d], e1[d]);
        }
    }
}

/* One chunk of 32 keys for the warp's two tiles of 16 rows: S = Q K^T, the online softmax
 * (log2 domain: m the row's max score times sl2 = scale log2(e), l its lane's share of the
 * sum), O *= the
 * rows' factors where a max grew, O += P V with P rounded to bf16 in the accumulators' own
 * registers (matrix_a's layout is the accumulator's). kf, vf: the lane's pointers into K and
 * V^T at the chunk's first key. DIAG: the chunk that starts at the warp's first row: tile 0
 * takes its first 16-key block (masked on its diagonal), tile 1 both (the second masked);
 * otherwise every key is before every row: no mask. dmask: bit i where the lane's element i
 * of a diagonal block lies above the diagonal. */
template <bool DIAG>
__device__ __forceinline__ void f2_chunk(f2_c (&o)[2][F2_NF], const f2_a (&qa)[2][F2_NF],
                                         const bf16 *kf, const bf16 *vf, unsigned dmask, float sl2,
                                         bool first, float (&m)[2][2], float (&l)[2][2])
{
    f2_c s[2][2];
#pragma unroll
    for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            wmma::fill_fragment(s[u][n], 0.0f);
        }
#pragma unroll
        for (int f = 0; f < F2_NF; f++) {
            f2_b kb;
            f2_frag<true>(kb, kf + 16 * n * F2_LD + 16 * f);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (!DIAG || u >= n) {
                    wmma::mma_sync(s[u][n], qa[u][f], kb, s[u][n]);
                }
            }
        }
    }
    float corr[2][2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        if (DIAG) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if ((dmask >> i) & 1u) {
                    s[u][u].x[i] = -INFINITY;
                }
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; n++) {
            if (!DIAG || u >= n) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[u][n].x[i]);
                }
            }
        }
        /* Every row has an unmasked score here (its diagonal), so the max is finite. */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[u][r], mx[r] * sl2); /* sl2 > 0: the max of the scaled scores */
            corr[u][r] = f2_exp2(m[u][r] - mn);     /* 0 on the row's first keys (m = -inf) */
            l[u][r] *= corr[u][r];
            m[u][r] = mn;
        }
    }
    /* O *= corr per tile where any of its rows' max grew (the first chunk's O is zero). */
#pragma unroll
    for (int u = 0; u < 2; u++) {
        if (!first && __any_sync(0xffffffffu, corr[u][0] != 1.0f || corr[u][1] != 1.0f)) {
#pragma unroll
            for (int f = 0; f < F2_NF; f++) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    o[u][f].x[i] *= corr[u][(i >> 1) & 1];
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        f2_a pa[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (!DIAG || u >= k) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float e = f2_exp2(fmaf(s[u][k].x[i], sl2, -m[u][(i >> 1) & 1]));
                    l[u][(i >> 1) & 1] += e;
                    pa[u].x[i] = tc_cvt<bf16>(e);
                }
            }
        }
#pragma unroll
        for (int f = 0; f < F2_NF; f++) {
            f2_b vb;
            f2_frag<true>(vb, vf + 16 * f * F2_LD + 16 * k);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (!DIAG || u >= k) {
                    wmma::mma_sync(o[u][f], pa[u], vb, o[u][f]);
                }
            }
        }
    }
}

/* (batch, head) pairs a group of blocks: the grid runs a group's longest query tiles first,
 * so that the grid ends on short ones, while the blocks in flight read the q, k and v of few
 * pairs (32 pairs at T 1024: 24 MiB of fp32, within L2). */
#define F2_GROUP 32

/* One block per (batch, head, 128 query rows); S: float (qkv, rounded here) or bf16 (its
 * copy). W: qkv rounded also into hout (its 2-byte copy, for the backward), each row by one
 * block: Q's by the block of its query tile, K's and V's by the block whose query tile holds
 * them (its last two key tiles). a.y_h (non-NULL): y rounded to bf16 there too, as it is
 * stored (the projection's operand, no pass of its own). 168 registers (3 blocks, 12 warps an
 * SM), 18 KiB of shared memory. */
template <typename S, bool W>
__global__ void __launch_bounds__(128, 3)
    k_attn_fwd_tc2(nn_cu_attn a, const S *qkv, float *y, float *lse, bf16 *hout)
{
    __shared__ __align__(16) bf16 skv[2 * F2_KT * F2_LD]; /* K, V^T; first the Q tile */
    bf16 *sk = skv, *svt = skv + F2_KT * F2_LD;

    /* Rows and keys in int (the launcher checks T), offsets in int64_t. */
    int nt = (int)a.T, nqt = (nt + F2_QT - 1) / F2_QT, nbh = (int)(a.B * a.H);
    int g = (int)blockIdx.x / (F2_GROUP * nqt), w = (int)blockIdx.x % (F2_GROUP * nqt);
    int gn = nbh - g * F2_GROUP < F2_GROUP ? nbh - g * F2_GROUP : F2_GROUP; /* its pairs */
    int qt = nqt - 1 - w / gn, bh = g * F2_GROUP + w % gn;
    int h = bh % (int)a.H, b = bh / (int)a.H, t0 = qt * F2_QT;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wt0 = t0 + 32 * warp;
    int64_t C3 = 3 * a.C;
    int64_t off_bh = (int64_t)b * nt * C3 + (int64_t)h * F2_HD; /* also in hout */
    const S *qkv_bh = qkv + off_bh;
    const float sl2 = a.scale * 1.4426950408889634f; /* scale log2(e) */

    f2_rows<F2_QT / 16, W>(qkv_bh + t0 * C3, C3, nt - t0, skv,
                           W ? hout + off_bh + t0 * C3 : nullptr);
    __syncthreads();
    /* The lane's pair offset in every fragment: row (or n) g, column (or k) 2 q. */
    int lo = (lane >> 2) * F2_LD + 2 * (lane & 3);
    f2_a qa[2][F2_NF]; /* the warp's two tiles of 16 query rows */
    f2_c o[2][F2_NF];
#pragma unroll
    for (int u = 0; u < 2; u++) {
#pragma unroll
        for (int f = 0; f < F2_NF; f++) {
            f2_frag<false>(qa[u][f], skv + (32 * warp + 16 * u) * F2_LD + lo + 16 * f);
            wmma::fill_fragment(o[u][f], 0.0f);
        }
    }
    unsigned dmask = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        dmask |= (tc_lay_col(lane, i) > tc_lay_row(lane, i) ? 1u : 0u) << i;
    }
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    int last = (t0 + F2_QT < nt ? t0 + F2_QT : nt) - 1; /* the block's last query row */
    for (int j0 = 0; j0 <= last; j0 += F2_KT) {
        __syncthreads(); /* every warp is done with the previous K, V^T (and Q's staging) */
        const S *kr = qkv_bh + j0 * C3 + a.C;
        bf16 *ho = W && j0 >= t0 ? hout + off_bh + j0 * C3 + a.C : nullptr; /* its K rows */
        f2_rows<F2_KT / 16, W>(kr, C3, nt - j0, sk, ho);
        f2_vt<W>(kr + a.C, C3, nt - j0, svt, W && ho != nullptr ? ho + a.C : nullptr);
        __syncthreads();
        if (wt0 >= nt) {
            continue; /* no real rows: only the tile loads */
        }
#pragma unroll
        for (int s0 = 0; s0 < F2_KT; s0 += 32) {
            int c0 = j0 + s0; /* the chunk's first key: rows and chunks start on 32s */
            if (c0 < wt0) {
                f2_chunk<false>(o, qa, sk + lo + s0 * F2_LD, svt + lo + s0, dmask, sl2, c0 == 0, m,
                                l);
            } else if (c0 == wt0) {
                f2_chunk<true>(o, qa, sk + lo + s0 * F2_LD, svt + lo + s0, dmask, sl2, c0 == 0, m,
                               l);
            }
        }
    }
    if (wt0 >= nt) {
        return;
    }
    /* Rows g and g + 8 of each tile from the fragments: a lane's 2 consecutive columns of a
     * row as one 8-byte store, a quad's 32 consecutive bytes (a sector) per 8 columns. */
#pragma unroll
    for (int u = 0; u < 2; u++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[u][r] + __shfl_xor_sync(0xffffffffu, l[u][r], 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            int tr = wt0 + 16 * u + tc_lay_row(lane, 2 * r);
            if (tr >= nt) {
                continue;
            }
            float inv = 1.0f / lt;
            int64_t yo = ((int64_t)b * nt + tr) * a.C + (int64_t)h * F2_HD + tc_lay_col(lane, 0);
            float *yr = y + yo;
#pragma unroll
            for (int f = 0; f < F2_NF; f++) {
                float2 v0 = make_float2(o[u][f].x[2 * r] * inv, o[u][f].x[2 * r + 1] * inv);
                float2 v1 = make_float2(o[u][f].x[2 * r + 4] * inv, o[u][f].x[2 * r + 5] * inv);
                *reinterpret_cast<float2 *>(yr + 16 * f) = v0;
                *reinterpret_cast<float2 *>(yr + 16 * f + 8) = v1;
                if (a.y_h != nullptr) { /* y's 2-byte copy: nn_cu_to_half's bits */
                    bf16 *hr = static_cast<bf16 *>(a.y_h) + yo + 16 * f;
                    *reinterpret_cast<__nv_bfloat162 *>(hr) = __floats2bfloat162_rn(v0.x, v0.y);
                    *reinterpret_cast<__nv_bfloat162 *>(hr + 8) = __floats2bfloat162_rn(v1.x, v1.y);
                }
            }
            if ((lane & 3) == 0) {
                lse[(int64_t)bh * nt + tr] = m[u][r] * 0.6931471805599453f + logf(lt); /* ln */
            }
        }
    }
}

/* Whether the accumulator, bf16 matrix_a (row-major) and matrix_b (col-major) fragments all
 * have the sm_80+ layout in every lane: 1 or 0 to out. Tiles of element numbers 16 row +
 * column (exact in fp32 and bf16) loaded by WMMA show where each lane's elements lie. */
__global__ void k_f2_probe(float *out)
{
    __shared__ __align__(32) float sf[256];
    __shared__ __align__(32) bf16 sh[256];
    int lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
    for (int i = lane; i < 256; i += 32) {
        sf[i] = (float)i;
        sh[i] = tc_cvt<bf16>((float)i);
    }
    __syncwarp();
    f2_c c;
    f2_a fa;
    f2_b fb;
    wmma::load_matrix_sync(c, sf, 16, wmma::mem_row_major);
    wmma::load_matrix_sync(fa, sh, 16);
    wmma::load_matrix_sync(fb, sh, 16); /* B (k, n) at n 16 + k */
    bool ok = c.num_elements == 8 && fa.num_elements == 8 && fb.num_elements == 8;
    for (int i = 0; ok && i < 8; i++) {
        float want = (float)(16 * tc_lay_row(lane, i) + tc_lay_col(lane, i));
        float want_b = (float)(16 * (gq + 8 * (i >> 2)) + 2 * q + (i & 1) + 8 * ((i >> 1) & 1));
        ok = c.x[i] == want && tc_f<bf16>(fa.x[i]) == want && tc_f<bf16>(fb.x[i]) == want_b;
    }
    ok = __all_sync(0xffffffffu, ok);
    if (threadIdx.x == 0) {
        *out = ok ? 1.0f : 0.0f;
    }
}

static std::atomic<int> g_f2_layout(-1); /* k_f2_probe's answer, once a process */

/* Whether f2_frag's layouts are this device's: k_f2_probe at the first call, into scratch (a
 * float of device memory the caller overwrites next), one stream synchronisation once a
 * process; 0 where they are not, or where the probe failed (its error left for the caller's
 * cudaGetLastError). */
extern "C" int accel__nn_cu_attn_f2_layout(cudaStream_t s, float *scratch)
{
    int layout = g_f2_layout.load();
    if (layout < 0) {
        float v = 0.0f;
        k_f2_probe<<<1, 32, 0, s>>>(scratch);
        if (cudaMemcpyAsync(&v, scratch, sizeof v, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess) {
            return 0;
        }
        layout = v == 1.0f ? 1 : 0;
        g_f2_layout.store(layout);
    }
    return layout == 1;
}

/* Queues k_attn_fwd_tc2 where it applies (bf16, head 64, the sm_80+ layouts, scale > 0, T
 * and the grid within int) and returns 1, else 0. The layouts are probed at the first call,
 * into lse (which the kernel then overwrites): accel__nn_cu_attn_f2_layout. */
extern "C" int accel__nn_cu_attn_fwd_tc2(cudaStream_t s, const nn_cu_attn *a, const float *qkv,
                                         float *y, float *lse, void *qkv_h_out)
{
    uintptr_t al = (uintptr_t)a->qkv_h | (uintptr_t)qkv_h_out | ((uintptr_t)a->y_h & 3) * 16;
    if (a->rnd != 1 || a->hd != F2_HD || a->scale <= 0.0f || a->T >= INT32_MAX / 2 ||
        a->B * a->H * ((a->T + F2_QT - 1) / F2_QT) >= INT32_MAX || (al & 15) != 0 ||
        (a->qkv_h != NULL && qkv_h_out != NULL)) {
        return 0;
    }
    if (!accel__nn_cu_attn_f2_layout(s, lse)) {
        return 0;
    }
    unsigned blocks = (unsigned)(a->B * a->H * ((a->T + F2_QT - 1) / F2_QT));
    const bf16 *qh = static_cast<const bf16 *>(a->qkv_h);
    bf16 *ho = static_cast<bf16 *>(qkv_h_out);
    if (qh != NULL) {
        k_attn_fwd_tc2<bf16, false><<<blocks, 128, 0, s>>>(*a, qh, y, lse, nullptr);
    } else if (ho != NULL) {
        k_attn_fwd_tc2<float, true><<<blocks, 128, 0, s>>>(*a, qkv, y, lse, ho);
    } else {
        k_attn_fwd_tc2<float, false><<<blocks, 128, 0, s>>>(*a, qkv, y, lse, nullptr);
    }
    return 1;
}
