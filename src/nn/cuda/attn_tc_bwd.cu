/*
 * The tensor-core causal attention backward (FlashAttention-2's two-kernel, atomic-free
 * schedule) for bf16 / fp16 autocast; attn_tc.cu decides where it applies and queues it.
 *
 * Both kernels own 16 R rows per warp (queries in the dQ kernel, keys in the dK/dV kernel; R 2
 * on the register path with A operands in registers at head sizes up to 64, else 1) and
 * stream tiles of ST rows of the other side through shared memory. Per streamed tile a warp
 * recomputes the scores of its rows against the tile (S = Q K^T, or its transpose) and
 * dP = dO V^T by WMMA with fp32 sums, forms P = exp(S * scale - lse) under the causal mask and
 * dS = P dP - P D element-wise in fp32 (rounded as k_attn_bwd_* and the CPU round them), and
 * accumulates dQ += dS K, or dV += P^T dO and dK += dS^T Q, in accumulator fragments. Each
 * output row is written by one warp once, so no atomics and the sums run in a fixed order.
 * Invariant: the results do not depend on the lane mapping or the load schedule below, only
 * on the tile shapes (the WMMA sums' order), which are those of the first version.
 *
 * Two element-wise paths: the register path (the default; attn_tc_bwd.cuh) forms P and dS in
 * the accumulator fragments with exp2f on base-2 scores; the scratch path (ACCEL_NN_ATTN_FAST=0,
 * nn_cu_attn_bwd_set_fast; attn_tc_bwd_scratch.cuh) stores S and dP to an fp32 shared scratch
 * and forms them with expf, as the first version did (bit-identical to it). This file holds the
 * two kernels and their launch.
 *
 * Cost (hd <= 64, 64 own rows a block, streamed tiles of 32): a tile's rows arrive in one
 * round of loads all in flight (bw_load2; bw_load2h from the caller's 2-byte copies, qkv_h and
 * dy_h: a quarter of the instructions), one L2 latency where a load-then-store loop waited ~9;
 * with R = 2 (2 warps of 32 rows) each streamed WMMA fragment loaded serves two products and
 * each warp has twice the independent accumulators (ptxas, bf16: dK/dV 234 registers, 4 blocks
 * of 2 warps an SM; dQ 168, 6 blocks; no spills). The element-wise passes use 128-bit shared
 * accesses without conflicting reads and skip the causal test on tiles wholly below the
 * diagonal. Registers bound the blocks per SM: at R = 1 the dQ kernel fits 5 (96 registers,
 * 41 KB shared), the dK/dV kernel 4 (capped at 128 registers without spills, 41.3 KB; the
 * register path: 8 and 12 bytes spilled, 47.4 KB and 41.5 KB).
 * Static shared memory stays within 48 KiB.
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
#include "attn_tc_bwd.cuh"
#include "attn_tc_bwd_scratch.cuh"
#include "nn_kernels.h"

using namespace nvcuda;

/* dQ and D: one block per (batch, head, tile of 16 R NW queries), over the key tiles up to the
 * causal limit. D[bh, t] = rnd(dO[t]) . O[t] is computed here (the dK/dV kernel, which runs
 * next, reads it). MODE (bw_mode): 0 the scratch path, 1 the register path, 2 with its A
 * operands built in registers. R (MODE 2 only): 16-row blocks a warp owns; with 2, each
 * streamed fragment loaded serves two products and P waits for dS in registers. */
template <typename T, int HDF, int NW, int ST, int MODE, int R>
__global__ void __launch_bounds__(32 * NW, R == 1 ? 5 : 12 / NW) /* R 1: as shared memory allows */
    k_attn_bwd_dq_tc(nn_cu_attn a, const float *qkv, const float *y, const float *lse,
                     const float *gy, float *D, float *gqkv, int write)
{
    const int LDH = bw_ldh<HDF>::v, LDS = ST + 4, LDP = ST + 8, QT = 16 * NW * R, NS = ST / 16;
    constexpr bool FAST = MODE > 0;
    static_assert(ST % 16 == 0, "a lane's HC columns are 16-byte stores");
    static_assert(R == 1 || MODE == 2, "two row blocks a warp: the register path's A operands");
    static_assert(16 * LDP * sizeof(T) <= 16 * LDS * sizeof(float), "a T tile in the scratch");
    __shared__ __align__(32) T sq[QT * LDH];
    __shared__ __align__(32) T sdo[QT * LDH];
    __shared__ __align__(32) T sk[ST * LDH];
    __shared__ __align__(32) T sv[ST * LDH];
    __shared__ __align__(32) T sds[MODE == 2 ? 16 : NW * 16 * LDP];
    __shared__ __align__(32) float ss[R == 1 ? NW * 16 * LDS : 16]; /* R 2: in sk */
    __shared__ float sl2[FAST ? QT : 1], sdr[FAST ? QT : 1];        /* lse2, D of the own rows */
    static_assert(R == 1 || sizeof(sk) >= NW * 256 * sizeof(float), "R 2: the scratch in sk");
    static_assert(sizeof(sq) + sizeof(sdo) + sizeof(sk) + sizeof(sv) + sizeof(sds) + sizeof(ss) +
                          sizeof(sl2) + sizeof(sdr) <=
                      48 * 1024,
                  "static shared memory");

    int64_t nqt = (a.T + QT - 1) / QT, C3 = 3 * a.C;
    /* Head-major (the blocks in flight share one head's K and V in L2), the longest query
     * tiles (most keys) first. */
    int64_t qt = nqt - 1 - (int64_t)blockIdx.x % nqt, bh = (int64_t)blockIdx.x / nqt;
    int64_t h = bh % a.H, b = bh / a.H, t0 = qt * QT;
    int hd = (int)a.hd, nf = hd / 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = lane >> 1, half = lane & 1;
    int64_t wt0 = t0 + 16 * R * warp, t = wt0 + r;
    /* The warp's 16 x 16 float scratch (bw_learn, bw_store_rows): at R = 2 in sk, which holds
     * no tile before the loop's first load and after its last barrier (below), so that 128
     * own rows fit in 48 KiB. */
    float *scr = R == 1 ? ss + warp * 16 * LDS : reinterpret_cast<float *>(sk) + warp * 256;
    T *xds = sds + (MODE == 2 ? 0 : warp * 16 * LDP);
    const float *qkv_b = qkv + b * a.T * C3 + h * a.hd, *gy_b = gy + b * a.T * a.C + h * a.hd;
    const float *k_b = qkv_b + a.C, *v_b = qkv_b + 2 * a.C;
    int own_valid = (int)(a.T - t0 < QT ? a.T - t0 : QT);

    /* The 2-byte copies where the caller has both (the same values). */
    const T *qh_b = nullptr, *gh_b = nullptr;
    if (a.qkv_h != nullptr && a.dy_h != nullptr) {
        qh_b = static_cast<const T *>(a.qkv_h) + b * a.T * C3 + h * a.hd;
        gh_b = static_cast<const T *>(a.dy_h) + b * a.T * a.C + h * a.hd;
    }
    if (qh_b != nullptr) {
        bw_load2h<T, 2, 32 * NW, HDF>(qh_b + t0 * C3, C3, gh_b + t0 * a.C, a.C, own_valid, QT, hd,
                                      sq, sdo, LDH);
    } else {
        bw_load2<T, 4>(qkv_b + t0 * C3, C3, gy_b + t0 * a.C, a.C, own_valid, QT, hd, sq, sdo, LDH);
    }
    __syncthreads();
    /* D over this lane's half of row t (dO as rounded into shared memory), then the pair's; for
     * each of the warp's R row blocks (rows t + 16 u). */
    float D_t = 0.0f, lse_t = 0.0f;
#pragma unroll
    for (int u = 0; u < R; u++) {
        int64_t tu = t + 16 * u;
        float Du = 0.0f, lu = 0.0f;
        if (tu < a.T) {
            const float4 *yr = reinterpret_cast<const float4 *>(y + (b * a.T + tu) * a.C +
                                                                h * a.hd + half * (hd / 2));
            const T *dr = sdo + (16 * R * warp + 16 * u + r) * LDH + half * (hd / 2);
            for (int d = 0; d < hd / 8; d++) {
                float4 v = yr[d];
                Du += tc_f<T>(dr[4 * d]) * v.x + tc_f<T>(dr[4 * d + 1]) * v.y +
                      tc_f<T>(dr[4 * d + 2]) * v.z + tc_f<T>(dr[4 * d + 3]) * v.w;
            }
            lu = lse[bh * a.T + tu];
        }
        Du += __shfl_xor_sync(0xffffffffu, Du, 1);
        if (half == 0 && tu < a.T) {
            D[bh * a.T + tu] = Du;
        }
        /* The register path: the rows' lse2 (+inf past T: P = 0) and D, for the lanes whose
         * element pairs are on them (bw_learn's __syncwarp orders these stores before the
         * reads). */
        if (FAST && half == 0) {
            sl2[16 * R * warp + 16 * u + r] = tu < a.T ? lu * 1.44269504088896341f : INFINITY;
            sdr[16 * R * warp + 16 * u + r] = Du;
        }
        if (u == 0) {
            D_t = Du; /* the scratch path's (R is 1 there) */
            lse_t = lu;
        }
    }
    /* bw_mode checked that this device's layouts suit MODE. */
    const bool fast = FAST, direct = MODE == 2;
    bw_map map;
    if (FAST) {
        bw_learn(map, scr);
    }
    float s2 = a.scale * 1.44269504088896341f;

    bw_acc dq[R * HDF];
#pragma unroll
    for (int f = 0; f < R * HDF; f++) {
        wmma::fill_fragment(dq[f], 0.0f);
    }
    int64_t last = (t0 + QT < a.T ? t0 + QT : a.T) - 1; /* the tile's last query */
    for (int64_t j0 = 0; j0 <= last; j0 += ST) {
        __syncthreads(); /* every warp is done with the previous K, V */
        int valid = (int)(a.T - j0 < ST ? a.T - j0 : ST);
        /* From the copies: one round of all loads on path 2; two on paths 0 and 1, at their
         * 96-register cap (ptxas, one round: 16 bytes spilled, two: 8). */
        if (qh_b != nullptr) {
            bw_load2h<T, MODE == 2 ? 2 : 1, 32 * NW, HDF>(
                qh_b + a.C + j0 * C3, C3, qh_b + 2 * a.C + j0 * C3, C3, valid, ST, hd, sk, sv, LDH);
        } else {
            bw_load2<T, 4>(k_b + j0 * C3, C3, v_b + j0 * C3, C3, valid, ST, hd, sk, sv, LDH);
        }
        __syncthreads();
        if (j0 > wt0 + 16 * R - 1 || wt0 >= a.T) {
            continue; /* every key of the tile is after this warp's queries */
        }
        if (R > 1) {
            /* P waits for dS in dQ's A operands (registers to spare at R = 2, not at R = 1),
             * and dS replaces it there. */
            bw_acc s[R * NS];
            bw_fa<T> fa[R * NS];
            bw_scores_frag<T, HDF, ST, R>(s, sq + 16 * R * warp * LDH, sk, nf);
#pragma unroll
            for (int u = 0; u < R; u++) {
                int64_t ut0 = wt0 + 16 * u; /* the row block's first query */
                const float *l2 = sl2 + 16 * R * warp + 16 * u;
                if (j0 + ST - 1 <= ut0) {
                    bw_probs_rf<T, ST, LDP, false, false, true>(s + u * NS, map, s2, l2, 0, nullptr,
                                                                fa + u * NS);
                } else {
                    bw_probs_rf<T, ST, LDP, false, true, true>(
                        s + u * NS, map, s2, l2, (int)(ut0 - j0), nullptr, fa + u * NS);
                }
            }
            bw_scores_frag<T, HDF, ST, R>(s, sdo + 16 * R * warp * LDH, sv, nf); /* dP */
#pragma unroll
            for (int u = 0; u < R; u++) {
                bw_dscores_rf<T, ST, LDP, false, true, true>(
                    s + u * NS, map, sdr + 16 * R * warp + 16 * u, nullptr, nullptr, fa + u * NS);
            }
            bw_accumulate_a<T, HDF, ST, R>(dq, fa, sk, nf);
            continue;
        }
        if (fast) {
            /* P goes to the scratch (as a T tile; the fp32 scratch is unused here) and comes
             * back for dS, which goes to xds (MODE 1) or into dQ's A operands (MODE 2). */
            bw_acc s[ST / 16];
            T *xp = reinterpret_cast<T *>(scr);
            bw_scores_frag<T, HDF, ST>(s, sq + 16 * warp * LDH, sk, nf);
            /* Unmasked where every key of the tile is at or before the warp's first query
             * (queries past T have P = 0 from their lse2). */
            const float *l2 = sl2 + 16 * warp, *dw = sdr + 16 * warp;
            if (j0 + ST - 1 <= wt0) {
                bw_probs_rf<T, ST, LDP, false, false, false>(s, map, s2, l2, 0, xp, nullptr);
            } else {
                bw_probs_rf<T, ST, LDP, false, true, false>(s, map, s2, l2, (int)(wt0 - j0), xp,
                                                            nullptr);
            }
            bw_scores_frag<T, HDF, ST>(s, sdo + 16 * warp * LDH, sv, nf); /* dP */
            if (direct) {
                bw_fa<T> fa[ST / 16];
                bw_dscores_rf<T, ST, LDP, false, false, true>(s, map, dw, xp, nullptr, fa);
                bw_accumulate_a<T, HDF, ST>(dq, fa, sk, nf);
            } else {
                bw_dscores_rf<T, ST, LDP, false, false, false>(s, map, dw, xp, xds, nullptr);
                __syncwarp();
                bw_accumulate<T, HDF, ST>(dq, xds, sk, nf);
            }
            continue;
        }
        float p[ST / 2];
        bw_scores<T, HDF, ST, LDS>(scr, sq + 16 * warp * LDH, sk, nf);
        __syncwarp();
        /* Unmasked where every key of the tile is at or before the warp's first query and
         * all 16 queries are real rows. */
        if (j0 + ST - 1 <= wt0 && wt0 + 15 < a.T) {
            bw_probs<T, ST, LDS, false, false>(a.scale, a.T, scr, wt0, j0, nullptr, lse_t, p);
        } else {
            bw_probs<T, ST, LDS, false, true>(a.scale, a.T, scr, wt0, j0, nullptr, lse_t, p);
        }
        __syncwarp(); /* S is read before dP overwrites it */
        bw_scores<T, HDF, ST, LDS>(scr, sdo + 16 * warp * LDH, sv, nf);
        __syncwarp();
        bw_dscores<T, ST, LDS, false>(scr, nullptr, D_t, p);
        bw_put<T, ST>(xds, p);
        __syncwarp();
        bw_accumulate<T, HDF, ST>(dq, xds, sk, nf);
    }
    if (R > 1) {
        __syncthreads(); /* every warp is done with sk, the scratch from here on */
    }
    if (wt0 >= a.T) {
        return; /* no real rows (after the last __syncthreads) */
    }
#pragma unroll
    for (int u = 0; u < R; u++) {
        int64_t tu = t + 16 * u;
        bw_store_rows<T, HDF>(scr, dq + u * HDF, nf, gqkv + (b * a.T + tu) * C3 + h * a.hd, a.scale,
                              write, tu < a.T);
    }
}

/* dK and dV: one block per (batch, head, tile of 16 R NW keys), over the query tiles at or
 * after it. MODE and R as for the dQ kernel (slse holds lse2 where MODE > 0). */
template <typename T, int HDF, int NW, int ST, int MODE, int R>
__global__ void __launch_bounds__(32 * NW, R == 1 ? 4 : 8 / NW) /* R 1: 128 registers (5 spill) */
    k_attn_bwd_dkv_tc(nn_cu_attn a, const float *qkv, const float *lse, const float *gy,
                      const float *D, float *gqkv, int write)
{
    const int LDH = bw_ldh<HDF>::v, LDS = ST + 4, LDP = ST + 8, KT = 16 * NW * R, NS = ST / 16;
    constexpr bool FAST = MODE > 0;
    static_assert(ST % 16 == 0 && ST <= 32 * NW, "16-byte stores; one lse, D a thread");
    static_assert(R == 1 || MODE == 2, "two row blocks a warp: the register path's A operands");
    __shared__ __align__(32) T sk[KT * LDH];
    __shared__ __align__(32) T sv[KT * LDH];
    __shared__ __align__(32) T sq[ST * LDH];
    __shared__ __align__(32) T sdo[ST * LDH];
    __shared__ __align__(32) T sx[MODE == 2 ? 16 : NW * 16 * LDP];  /* P (MODE 0, 1) */
    __shared__ __align__(32) T sx2[MODE == 1 ? NW * 16 * LDP : 16]; /* dS, MODE 1 */
    __shared__ __align__(32) float ss[R == 1 ? NW * 16 * LDS : 16]; /* R 2: in sq */
    __shared__ __align__(16) float slse[ST], sD[ST];
    static_assert(R == 1 || sizeof(sq) >= NW * 256 * sizeof(float), "R 2: the scratch in sq");
    static_assert(sizeof(sk) + sizeof(sv) + sizeof(sq) + sizeof(sdo) + sizeof(sx) + sizeof(sx2) +
                          sizeof(ss) + sizeof(slse) + sizeof(sD) <=
                      48 * 1024,
                  "static shared memory");

    int64_t nkt = (a.T + KT - 1) / KT, C3 = 3 * a.C;
    /* Head-major (the blocks in flight share one head's Q and dO in L2), the first key tiles
     * (most queries) first. */
    int64_t kt = (int64_t)blockIdx.x % nkt, bh = (int64_t)blockIdx.x / nkt;
    int64_t h = bh % a.H, b = bh / a.H, j0 = kt * KT;
    int hd = (int)a.hd, nf = hd / 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = lane >> 1;
    int64_t wj0 = j0 + 16 * R * warp, j = wj0 + r;
    /* The warp's 16 x 16 float scratch: at R = 2 in sq (as the dQ kernel's in sk). */
    float *scr = R == 1 ? ss + warp * 16 * LDS : reinterpret_cast<float *>(sq) + warp * 256;
    T *xs = sx + (MODE == 2 ? 0 : warp * 16 * LDP);
    const float *qkv_b = qkv + b * a.T * C3 + h * a.hd, *gy_b = gy + b * a.T * a.C + h * a.hd;
    const float *lse_h = lse + bh * a.T, *D_h = D + bh * a.T;
    int own_valid = (int)(a.T - j0 < KT ? a.T - j0 : KT);

    /* The 2-byte copies where the caller has both (the same values). */
    const T *qh_b = nullptr, *gh_b = nullptr;
    if (a.qkv_h != nullptr && a.dy_h != nullptr) {
        qh_b = static_cast<const T *>(a.qkv_h) + b * a.T * C3 + h * a.hd;
        gh_b = static_cast<const T *>(a.dy_h) + b * a.T * a.C + h * a.hd;
    }
    if (qh_b != nullptr) {
        bw_load2h<T, 2, 32 * NW, HDF>(qh_b + j0 * C3 + a.C, C3, qh_b + j0 * C3 + 2 * a.C, C3,
                                      own_valid, KT, hd, sk, sv, LDH);
    } else {
        bw_load2<T, 4>(qkv_b + j0 * C3 + a.C, C3, qkv_b + j0 * C3 + 2 * a.C, C3, own_valid, KT, hd,
                       sk, sv, LDH);
    }
    bw_acc dk[R * HDF], dv[R * HDF];
#pragma unroll
    for (int f = 0; f < R * HDF; f++) {
        wmma::fill_fragment(dk[f], 0.0f);
        wmma::fill_fragment(dv[f], 0.0f);
    }
    /* bw_mode checked that this device's layouts suit MODE. */
    const bool fast = FAST, direct = MODE == 2;
    bw_map map;
    if (FAST) {
        bw_learn(map, scr);
    }
    float s2 = a.scale * 1.44269504088896341f;
    for (int64_t i0 = j0; i0 < a.T; i0 += ST) {
        __syncthreads(); /* every warp is done with the previous Q, dO (and K, V are loaded) */
        /* The tile's lse and D (a thread each): their loads fly with the rows'. */
        int64_t it = i0 + threadIdx.x;
        float lse_i = 0.0f, D_i = 0.0f;
        if (threadIdx.x < ST && it < a.T) {
            lse_i = lse_h[it];
            D_i = D_h[it];
        }
        int valid = (int)(a.T - i0 < ST ? a.T - i0 : ST);
        /* From the copies: one round of all loads on path 2; two on paths 0 and 1, at their
         * 128-register cap (ptxas, one round: 40 bytes spilled, two: 28). */
        if (qh_b != nullptr) {
            bw_load2h<T, MODE == 2 ? 2 : 1, 32 * NW, HDF>(qh_b + i0 * C3, C3, gh_b + i0 * a.C, a.C,
                                                          valid, ST, hd, sq, sdo, LDH);
        } else {
            bw_load2<T, 4>(qkv_b + i0 * C3, C3, gy_b + i0 * a.C, a.C, valid, ST, hd, sq, sdo, LDH);
        }
        if (threadIdx.x < ST) {
            /* The register path: base 2, and +inf past T (P = 0 there without a test). */
            slse[threadIdx.x] = !fast ? lse_i : it < a.T ? lse_i * 1.44269504088896341f : INFINITY;
            sD[threadIdx.x] = D_i;
        }
        __syncthreads();
        if (i0 + ST - 1 < wj0 || wj0 >= a.T) {
            continue; /* every query of the tile is before this warp's keys */
        }
        if (R > 1) {
            /* MODE 2 with R row blocks: as below, each streamed fragment serving R products. */
            bw_acc s[R * NS];
            bw_fa<T> fa[R * NS];
            bw_scores_frag<T, HDF, ST, R>(s, sk + 16 * R * warp * LDH, sq, nf); /* S^T */
#pragma unroll
            for (int u = 0; u < R; u++) {
                /* Unmasked where every query of the tile is at or after the block's last key. */
                int64_t uj0 = wj0 + 16 * u;
                if (uj0 + 15 <= i0) {
                    bw_probs_rf<T, ST, LDP, true, false, true>(s + u * NS, map, s2, slse, 0,
                                                               nullptr, fa + u * NS);
                } else {
                    bw_probs_rf<T, ST, LDP, true, true, true>(
                        s + u * NS, map, s2, slse, (int)(i0 - uj0), nullptr, fa + u * NS);
                }
            }
            bw_accumulate_a<T, HDF, ST, R>(dv, fa, sdo, nf);
            bw_scores_frag<T, HDF, ST, R>(s, sv + 16 * R * warp * LDH, sdo, nf); /* dP^T */
#pragma unroll
            for (int u = 0; u < R; u++) {
                bw_dscores_rf<T, ST, LDP, true, true, true>(s + u * NS, map, sD, nullptr, nullptr,
                                                            fa + u * NS);
            }
            bw_accumulate_a<T, HDF, ST, R>(dk, fa, sq, nf);
            continue;
        }
        if (fast) {
            /* MODE 2: P goes into dV's A operands and stays there for dS, which replaces it
             * as dK's (no shared memory; ptxas spills no more than with P in xs). MODE 1: P
             * goes to xs (dV's operand) and stays there for dS, which goes to sx2. */
            bw_acc s[ST / 16];
            T *xds = sx2 + warp * 16 * LDP;
            bw_scores_frag<T, HDF, ST>(s, sk + 16 * warp * LDH, sq, nf); /* S^T */
            /* Unmasked where every query of the tile is at or after the warp's last key. */
            int lim = (int)(i0 - wj0);
            bool unmasked = wj0 + 15 <= i0;
            bw_fa<T> fa[ST / 16];
            if (direct) {
                if (unmasked) {
                    bw_probs_rf<T, ST, LDP, true, false, true>(s, map, s2, slse, 0, nullptr, fa);
                } else {
                    bw_probs_rf<T, ST, LDP, true, true, true>(s, map, s2, slse, lim, nullptr, fa);
                }
                bw_accumulate_a<T, HDF, ST>(dv, fa, sdo, nf);
            } else {
                if (unmasked) {
                    bw_probs_rf<T, ST, LDP, true, false, false>(s, map, s2, slse, 0, xs, nullptr);
                } else {
                    bw_probs_rf<T, ST, LDP, true, true, false>(s, map, s2, slse, lim, xs, nullptr);
                }
                __syncwarp(); /* P is in place */
                bw_accumulate<T, HDF, ST>(dv, xs, sdo, nf);
            }
            bw_scores_frag<T, HDF, ST>(s, sv + 16 * warp * LDH, sdo, nf); /* dP^T */
            if (direct) {
                bw_dscores_rf<T, ST, LDP, true, true, true>(s, map, sD, nullptr, nullptr, fa);
                bw_accumulate_a<T, HDF, ST>(dk, fa, sq, nf);
            } else {
                bw_dscores_rf<T, ST, LDP, true, false, false>(s, map, sD, xs, xds, nullptr);
                __syncwarp();
                bw_accumulate<T, HDF, ST>(dk, xds, sq, nf);
            }
            continue;
        }
        float p[ST / 2];
        bw_scores<T, HDF, ST, LDS>(scr, sk + 16 * warp * LDH, sq, nf); /* S^T */
        __syncwarp();
        /* Unmasked where every query of the tile is at or after the warp's last key and
         * before T. */
        if (wj0 + 15 <= i0 && i0 + ST <= a.T) {
            bw_probs<T, ST, LDS, true, false>(a.scale, a.T, scr, wj0, i0, slse, 0.0f, p);
        } else {
            bw_probs<T, ST, LDS, true, true>(a.scale, a.T, scr, wj0, i0, slse, 0.0f, p);
        }
        bw_put<T, ST>(xs, p);
        __syncwarp(); /* P is in place, and S^T read before dP^T overwrites it */
        bw_accumulate<T, HDF, ST>(dv, xs, sdo, nf);
        bw_scores<T, HDF, ST, LDS>(scr, sv + 16 * warp * LDH, sdo, nf); /* dP^T */
        __syncwarp(); /* dP^T is in place, and every lane's P read before dS overwrites it */
        bw_dscores<T, ST, LDS, true>(scr, sD, 0.0f, p);
        bw_put<T, ST>(xs, p);
        __syncwarp();
        bw_accumulate<T, HDF, ST>(dk, xs, sq, nf);
    }
    if (R > 1) {
        __syncthreads(); /* every warp is done with sq, the scratch from here on */
    }
    if (wj0 >= a.T) {
        return; /* no real rows (after the last __syncthreads) */
    }
#pragma unroll
    for (int u = 0; u < R; u++) {
        int64_t ju = j + 16 * u;
        float *dst = gqkv + (b * a.T + ju) * C3 + h * a.hd;
        bw_store_rows<T, HDF>(scr, dk + u * HDF, nf, dst + a.C, a.scale, write, ju < a.T);
        bw_store_rows<T, HDF>(scr, dv + u * HDF, nf, dst + 2 * a.C, 1.0f, write, ju < a.T);
    }
}

static int g_bw_fast = 1;                   /* nn_cu_attn_bwd_set_fast */
static int g_bw_rows = 32;                  /* nn_cu_attn_bwd_set_rows: rows a warp */
static int g_bw_block = 128;                /* and a block */
static std::atomic<int> g_bw_layout(-1);    /* bw_mode's probe: bit 0 pairs, bit 1 direct */
static std::atomic<int> g_bw_last(-1);      /* nn_cu_attn_bwd_mode */
static std::atomic<int> g_bw_last_rows(0);  /* nn_cu_attn_bwd_rows */
static std::atomic<int> g_bw_last_block(0); /* nn_cu_attn_bwd_rows */

/* This device's layouts, as the kernels would learn them (bit 0: bw_learn's column pairs, bit
 * 1: bw_learn_a's A operands), written as a float to out. */
__global__ void k_bw_probe(float *out)
{
    __shared__ __align__(32) float scr[256];
    bw_map m;
    bool pairs = bw_learn(m, scr), direct = pairs && bw_learn_a<__nv_bfloat16>(m, scr);
    if (threadIdx.x == 0) {
        *out = (float)((pairs ? 1 : 0) + (direct ? 2 : 0));
    }
}

/* The kernels' MODE: 0 where ACCEL_NN_ATTN_FAST=0 or the accumulator layout lacks column
 * pairs (no GPU so far), 2 for bf16 where the A operand's layout matches the accumulator's
 * (sm_80 and later, and the emulator), else 1. The layouts are probed once a process, at the
 * first backward, into D (the caller's scratch, which the dQ kernel then overwrites): one
 * stream synchronisation, once. */
static int bw_mode(cudaStream_t s, float *D, bool bf16)
{
    if (!g_bw_fast) {
        return 0;
    }
    int layout = g_bw_layout.load();
    if (layout < 0) {
        float v = 0.0f;
        k_bw_probe<<<1, 32, 0, s>>>(D);
        if (cudaMemcpyAsync(&v, D, sizeof v, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess) {
            return 0; /* the error stays for the caller's cudaGetLastError */
        }
        layout = (int)v;
        g_bw_layout.store(layout);
    }
    return (layout & 1) == 0 ? 0 : bf16 && (layout & 2) ? 2 : 1;
}

/* The dQ kernel (which writes D) then the dK/dV kernel, each tile of 16 R NW own rows a
 * block. */
template <typename T, int HDF, int NW, int ST, int MODE, int R = 1>
static void bw_launch_as(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                         const float *lse, const float *gy, float *D, float *gqkv, int write)
{
    /* Short names: the emulator's translator wants a launch on one line. */
    const int64_t rows = 16 * NW * R;
    unsigned nb = (unsigned)(a->B * a->H * ((a->T + rows - 1) / rows)), th = 32 * NW;
    const nn_cu_attn &q = *a;
    k_attn_bwd_dq_tc<T, HDF, NW, ST, MODE, R><<<nb, th, 0, s>>>(q, qkv, y, lse, gy, D, gqkv, write);
    k_attn_bwd_dkv_tc<T, HDF, NW, ST, MODE, R><<<nb, th, 0, s>>>(q, qkv, lse, gy, D, gqkv, write);
}

template <typename T, int HDF, int NW, int ST>
static void bw_launch(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                      const float *lse, const float *gy, float *D, float *gqkv, int write)
{
    const int M2 = bw_direct<T>::v ? 2 : 1; /* no MODE 2 kernels for fp16 */
    int mode = bw_mode(s, D, bw_direct<T>::v);
    g_bw_last.store(mode);
    g_bw_last_rows.store(16);
    g_bw_last_block.store(16 * NW);
    /* MODE 2 at head sizes up to 64: 32 rows a warp, NW warps (128 own rows a block) or
     * NW / 2 (64, as at 16 rows a warp), as nn_cu_attn_bwd_set_rows says. */
    const int R2 = M2 == 2 && HDF <= 4 && NW % 2 == 0 ? 2 : 1;
    if (mode == 2 && R2 == 2 && g_bw_rows == 32) {
        if (g_bw_block == 32 * NW) {
            bw_launch_as<T, HDF, NW, ST, M2, R2>(s, a, qkv, y, lse, gy, D, gqkv, write);
        } else {
            bw_launch_as<T, HDF, NW / R2, ST, M2, R2>(s, a, qkv, y, lse, gy, D, gqkv, write);
        }
        g_bw_last_rows.store(32);
        g_bw_last_block.store(g_bw_block == 32 * NW ? 32 * NW : 16 * NW);
        return;
    }
    switch (mode) {
    case 2:
        bw_launch_as<T, HDF, NW, ST, M2>(s, a, qkv, y, lse, gy, D, gqkv, write);
        break;
    case 1:
        bw_launch_as<T, HDF, NW, ST, 1>(s, a, qkv, y, lse, gy, D, gqkv, write);
        break;
    default:
        bw_launch_as<T, HDF, NW, ST, 0>(s, a, qkv, y, lse, gy, D, gqkv, write);
    }
}

extern "C" void nn_cu_attn_bwd_set_fast(int on)
{
    g_bw_fast = on != 0;
}

extern "C" void nn_cu_attn_bwd_set_rows(int warp_rows, int block_rows)
{
    g_bw_rows = warp_rows == 16 ? 16 : 32;
    g_bw_block = block_rows == 64 ? 64 : 128;
}

extern "C" void nn_cu_attn_bwd_rows(int *warp_rows, int *block_rows)
{
    *warp_rows = g_bw_last_rows.load();
    *block_rows = g_bw_last_block.load();
}

extern "C" int nn_cu_attn_bwd_mode(void)
{
    return g_bw_last.load();
}

extern "C" void accel__nn_cu_attn_bwd_tc_queue(cudaStream_t s, const nn_cu_attn *a,
                                               const float *qkv, const float *y, const float *lse,
                                               const float *gy, float *D, float *gqkv, int write)
{
    /* The 2-byte copies are read 16 bytes at a time: without that alignment the kernels
     * round the fp32 tiles themselves (the same values). */
    nn_cu_attn ac = *a;
    if ((uintptr_t)ac.qkv_h % 16 != 0 || (uintptr_t)ac.dy_h % 16 != 0) {
        ac.qkv_h = ac.dy_h = nullptr;
    }
    a = &ac;
    /* Head sizes up to 64: 4 warps (64 own rows) and streamed tiles of 32; up to 128: 2 warps,
     * so that each kernel's static shared memory stays within 48 KiB. */
    if (a->hd <= 64) {
        if (a->rnd == 1) {
            bw_launch<__nv_bfloat16, 4, 4, 32>(s, a, qkv, y, lse, gy, D, gqkv, write);
        } else {
            bw_launch<__half, 4, 4, 32>(s, a, qkv, y, lse, gy, D, gqkv, write);
        }
    } else if (a->rnd == 1) {
        bw_launch<__nv_bfloat16, 8, 2, 32>(s, a, qkv, y, lse, gy, D, gqkv, write);
    } else {
        bw_launch<__half, 8, 2, 32>(s, a, qkv, y, lse, gy, D, gqkv, write);
    }
}
