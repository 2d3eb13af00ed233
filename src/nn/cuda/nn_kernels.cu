/*
 * The nn toolkit's CUDA kernels (launchers in nn_kernels.h) other than cross entropy
 * (ce_kernels.cu), tensor-core attention (attn_tc.cu), the element-wise kernels (ew_kernels.cu)
 * and the sums over rows (sum_kernels.cu). Correctness first: dropout uses a grid-stride loop,
 * row kernels one block per row with block reductions, the embedding scatter one thread per
 * (distinct id, column) adding that id's rows in row order, and attention one warp per query (or
 * key) row with an online softmax (under autocast both directions run on tensor cores instead:
 * attn_tc.cu), so no kernel keeps a T x T matrix, none uses atomics, and every result is
 * deterministic (the order of every sum depends only on the shapes and the ids).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "nn_kernels.h"
#include "nn_kernels_dev.cuh"

/* The embedding scatter: at most this many blocks along the distinct ids. */
#define EMB_BLOCKS 65536

/* The CPU's counter-based RNG (nn_internal.h: nn__mix64, nn__uniform), bit for bit. */
__device__ __forceinline__ unsigned long long mix64(unsigned long long z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform01(unsigned long long key, unsigned long long i)
{
    return (float)(mix64(key + i * 0xD1B54A32D192ED03ull) >> 40) * (1.0f / 16777216.0f);
}

/* ---- element-wise ---- */

__global__ void k_dropout(unsigned long long key, float p, const float *src, float *dst, int64_t n,
                          int write)
{
    float keep_scale = 1.0f / (1.0f - p);
    GRID_LOOP(i, n)
    {
        float m = uniform01(key, (unsigned long long)i) >= p ? keep_scale : 0.0f;
        float v = src[i] * m;
        dst[i] = write ? v : dst[i] + v;
    }
}

/* ---- embedding ---- */

__global__ void k_embedding(const float *w, const int32_t *ids, float *y, int64_t rows, int64_t C)
{
    GRID_LOOP(i, rows * C)
    {
        int64_t r = i / C, c = i % C;
        y[i] = w[(int64_t)ids[r] * C + c];
    }
}

/* Block (k, y), grid-strided over the distinct ids k, adds id gid[k]'s rows of gy, in row
 * order, to its row of gw: thread x column y * blockDim.x + x. */
__global__ void k_embedding_bwd(const int32_t *order, const int32_t *start, const int32_t *gid,
                                int64_t nd, const float *gy, int64_t C, float *gw)
{
    int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) {
        return;
    }
    for (int64_t k = blockIdx.x; k < nd; k += gridDim.x) {
        int64_t r0 = start[k], r1 = start[k + 1];
        float *dst = gw + (int64_t)gid[k] * C + c, acc = *dst;
#pragma unroll 4
        for (int64_t j = r0; j < r1; j++) {
            acc += gy[(int64_t)order[j] * C + c];
        }
        *dst = acc;
    }
}

/* ---- LayerNorm ---- */

/* x + res (the fused residual add) or x alone: the LayerNorm input, bit for bit k_add's sum. */
__device__ __forceinline__ float ln_in(const nn_cu_ln &a, int64_t i)
{
    return a.res ? a.x[i] + a.res[i] : a.x[i];
}

__global__ void k_layernorm(nn_cu_ln a)
{
    __shared__ float sh[32];
    int64_t r = blockIdx.x, C = a.C, o = r * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        s += ln_in(a, o + c);
    }
    float mu = block_reduce(s, sh, 0) / (float)C;
    float v = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float d = ln_in(a, o + c) - mu;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(block_reduce(v, sh, 0) / (float)C + a.eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float wc = a.w ? a.w[c] : 1.0f, bc = a.b ? a.b[c] : 0.0f, xv = ln_in(a, o + c);
        float y = (xv - mu) * rs * wc + bc;
        if (a.y) {
            a.y[o + c] = y;
        }
        if (a.res) {
            a.sum[o + c] = xv;
        }
        if (a.yh) {
            ((uint16_t *)a.yh)[o + c] = half_bits(y, a.dt);
        }
    }
    if (threadIdx.x == 0) {
        a.mean[r] = mu;
        a.rstd[r] = rs;
    }
}

__global__ void k_layernorm_bwd_x(const float *x, const float *gy, const float *w,
                                  const float *mean, const float *rstd, int64_t C, float *gx,
                                  int write, const float *gbase, void *gh, int dt)
{
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * C, *gr = gy + r * C;
    float mu = mean[r], rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float d = gr[c] * (w ? w[c] : 1.0f);
        s1 += d;
        s2 += d * (xr[c] - mu) * rs;
    }
    s1 = block_reduce(s1, sh, 0) / (float)C;
    s2 = block_reduce(s2, sh, 0) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = rs * (gr[c] * (w ? w[c] : 1.0f) - s1 - (xr[c] - mu) * rs * s2);
        float o = !write ? gx[r * C + c] + v : gbase ? gbase[r * C + c] + v : v;
        gx[r * C + c] = o;
        if (gh) {
            ((uint16_t *)gh)[r * C + c] = half_bits(o, dt);
        }
    }
}

/* LayerNorm with one warp per row held in registers (LN_VECS float4s a lane), where C is a
 * multiple of 4 up to 128 LN_VECS and every row pointer 16-byte aligned: one read of x (and
 * gy), warp reductions only, 16-byte loads and stores, LN_ROWS rows a block. The same formulas
 * as k_layernorm / k_layernorm_bwd_x (two-pass variance), summed in another fixed order. */
#define LN_ROWS 8

__device__ __forceinline__ float4 ld4_or(const float *p, int64_t j, float dflt)
{
    return p ? ((const float4 *)p)[j] : make_float4(dflt, dflt, dflt, dflt);
}

__device__ __forceinline__ float sum4(float4 v)
{
    return (v.x + v.y) + (v.z + v.w);
}

template <int LN_VECS>
__global__ void __launch_bounds__(32 * LN_ROWS) k_layernorm_warp(nn_cu_ln a)
{
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * LN_ROWS + (threadIdx.x >> 5), C = a.C, n4 = C / 4;
    if (r >= a.rows) {
        return; /* the whole warp */
    }
    const float4 *xr = (const float4 *)(a.x + r * C);
    const float4 *rr = a.res != NULL ? (const float4 *)(a.res + r * C) : NULL;
    float4 *sr = a.res != NULL ? (float4 *)(a.sum + r * C) : NULL;
    float4 v[LN_VECS];
    float s = 0.0f;
    /* Every load of the row is issued before the first store of the sum: the compiler may not
     * move a load above a store it cannot prove elsewhere, so loads and stores interleaved
     * would cost a round trip to memory per vector (LN_VECS a row) instead of one. */
#pragma unroll
    for (int i = 0; i < LN_VECS; i++) {
        int64_t j = lane + 32 * i;
        v[i] = j < n4 ? xr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (rr != NULL) {
        float4 u[LN_VECS];
#pragma unroll
        for (int i = 0; i < LN_VECS; i++) {
            int64_t j = lane + 32 * i;
            u[i] = j < n4 ? rr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < LN_VECS; i++) {
            int64_t j = lane + 32 * i;
            if (j < n4) { /* the residual add, stored as k_add would */
                v[i] = make_float4(v[i].x + u[i].x, v[i].y + u[i].y, v[i].z + u[i].z,
                                   v[i].w + u[i].w);
                sr[j] = v[i];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < LN_VECS; i++) {
        s += sum4(v[i]);
    }
    float mu = warp_sum(s) / (float)C, q = 0.0f;
#pragma unroll
    for (int i = 0; i < LN_VECS; i++) {
        if (lane + 32 * i < n4) {
            float4 d = make_float4(v[i].x - mu, v[i].y - mu, v[i].z - mu, v[i].w - mu);
            q += (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
        }
    }
    float rs = 1.0f / sqrtf(warp_sum(q) / (float)C + a.eps);
    float4 *yr = a.y != NULL ? (float4 *)(a.y + r * C) : NULL;
    uint2 *hr = a.yh != NULL ? (uint2 *)((uint16_t *)a.yh + r * C) : NULL;
    /* y over v, every weight and bias loaded before the first store (as above). */
#pragma unroll
    for (int i = 0; i < LN_VECS; i++) {
        int64_t j = lane + 32 * i;
        if (j < n4) {
            float4 wc = ld4_or(a.w, j, 1.0f), bc = ld4_or(a.b, j, 0.0f);
            v[i] = make_float4((v[i].x - mu) * rs * wc.x + bc.x, (v[i].y - mu) * rs * wc.y + bc.y,
                               (v[i].z - mu) * rs * wc.z + bc.z, (v[i].w - mu) * rs * wc.w + bc.w);
        }
    }
#pragma unroll
    for (int i = 0; i < LN_VECS; i++) {
        int64_t j = lane + 32 * i;
        if (j < n4) {
            if (yr != NULL) {
                yr[j] = v[i];
            }
            if (hr != NULL) { /* the half shadow: k_to_half's bits, 8 bytes a lane */
                hr[j] = pack_half4(v[i], a.dt);
            }
        }
    }
    if (lane == 0) {
        a.mean[r] = mu;
        a.rstd[r] = rs;
    }
}

/* One element of k_layernorm_bwd_x's sums: d = gy w, s1 += d, s2 += d xhat. */
__device__ __forceinline__ void ln_bwd_terms(float g, float wc, float xv, float mu, float rs,
                                             float &s1, float &s2)
{
    float d = g * wc;
    s1 += d;
    s2 += d * (xv - mu) * rs;
}

__device__ __forceinline__ float ln_bwd_out(float g, float wc, float xv, float mu, float rs,
                                            float s1, float s2)
{
    return rs * (g * wc - s1 - (xv - mu) * rs * s2);
}

/* With PARAMS, LayerNorm's weight and bias gradients too, from the x and gy already in
 * registers (the second read of both by k_layernorm_bwd_params saved): a block takes LNB_ROWS
 * rows, warp k of it rows k LNB_ROWS / LN_ROWS onwards in order, each lane summing its
 * columns; then the warps' sums are added in warp order through shared memory, into gw / gb
 * for a single block, else into part (the weight's rows, then the bias's) for
 * nn_cu_sum_parts_pair. */
#define LNB_ROWS 128

/* k_layernorm_bwd_x_warp's arguments. */
typedef struct ln_bwd_args {
    const float *x, *gy, *w, *mean, *rstd;
    int64_t rows, C;
    float *gx;
    int write;
    float *part, *gw, *gb;
    const float *gbase; /* write: gx = gbase + the gradient (NULL: gx = it) */
    void *gh;           /* or NULL: gx rounded to dt (1 bf16, 2 fp16), 2 bytes (its shadow) */
    int dt;
    const void *gyh; /* or NULL: gy as 2-byte values of gdt (read instead of gy, widened) */
    int gdt;
} ln_bwd_args;

template <int LN_VECS, bool PARAMS>
__device__ __forceinline__ void ln_bwd_rows(const ln_bwd_args &a)
{
    const float *x = a.x, *gy = a.gy, *w = a.w, *mean = a.mean, *rstd = a.rstd;
    int64_t rows = a.rows, C = a.C;
    float *gx = a.gx, *part = a.part, *gw = a.gw, *gb = a.gb;
    int write = a.write;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t n4 = C / 4, per = PARAMS ? LNB_ROWS / LN_ROWS : 1;
    int64_t r0 = ((int64_t)blockIdx.x * LN_ROWS + warp) * per;
    float4 aw[PARAMS ? LN_VECS : 1], ab[PARAMS ? LN_VECS : 1];
    for (int i = 0; PARAMS && i < LN_VECS; i++) {
        aw[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ab[i] = aw[i];
    }
    for (int64_t r = r0; r < r0 + per && r < rows; r++) {
        const float4 *xr = (const float4 *)(x + r * C), *gr = (const float4 *)(gy + r * C);
        const uint2 *ghr = a.gyh != NULL ? (const uint2 *)((const uint16_t *)a.gyh + r * C) : NULL;
        float4 *dst = (float4 *)(gx + r * C);
        /* What the gradient is added to: gx itself (accumulating) or gbase, else nothing. */
        const float4 *add = !write ? dst : a.gbase != NULL ? (const float4 *)(a.gbase + r * C)
                                                            : NULL;
        uint2 *hr = a.gh != NULL ? (uint2 *)((uint16_t *)a.gh + r * C) : NULL;
        float4 xv[LN_VECS], gv[LN_VECS], ov[LN_VECS];
        float mu = mean[r], rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
        /* Every load of the row (x, gy and what the gradient is added to) is issued before the
         * first store: the compiler may not move a load above a store it cannot prove
         * elsewhere, so a load of the addend between the stores cost a round trip to memory
         * per vector (LN_VECS a row), with a few hundred bytes a warp in flight. */
#pragma unroll
        for (int i = 0; i < LN_VECS; i++) {
            int64_t j = lane + 32 * i;
            xv[i] = j < n4 ? xr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            gv[i] = j >= n4       ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                    : ghr != NULL ? widen4(ghr[j], a.gdt)
                                  : gr[j];
            ov[i] = add != NULL && j < n4 ? add[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 wc = ld4_or(w, j < n4 ? j : 0, 1.0f);
            ln_bwd_terms(gv[i].x, wc.x, xv[i].x, mu, rs, s1, s2);
            ln_bwd_terms(gv[i].y, wc.y, xv[i].y, mu, rs, s1, s2);
            ln_bwd_terms(gv[i].z, wc.z, xv[i].z, mu, rs, s1, s2);
            ln_bwd_terms(gv[i].w, wc.w, xv[i].w, mu, rs, s1, s2);
        }
        /* Lanes past the row added gy = 0 terms: nothing. */
        s1 = warp_sum(s1) / (float)C;
        s2 = warp_sum(s2) / (float)C;
        /* The outputs into ov (the weight loaded before any store, as above), then stored. */
#pragma unroll
        for (int i = 0; i < LN_VECS; i++) {
            int64_t j = lane + 32 * i;
            if (j >= n4) {
                continue;
            }
            float4 wc = ld4_or(w, j, 1.0f);
            float4 o = make_float4(ln_bwd_out(gv[i].x, wc.x, xv[i].x, mu, rs, s1, s2),
                                   ln_bwd_out(gv[i].y, wc.y, xv[i].y, mu, rs, s1, s2),
                                   ln_bwd_out(gv[i].z, wc.z, xv[i].z, mu, rs, s1, s2),
                                   ln_bwd_out(gv[i].w, wc.w, xv[i].w, mu, rs, s1, s2));
            if (add != NULL) { /* the same sum as a copy of gbase, then added to */
                float4 p = ov[i];
                o = make_float4(p.x + o.x, p.y + o.y, p.z + o.z, p.w + o.w);
            }
            ov[i] = o;
            if constexpr (PARAMS) { /* as k_layernorm_bwd_params: g (x - mean) rstd, and g */
                aw[i].x += gv[i].x * (xv[i].x - mu) * rs;
                aw[i].y += gv[i].y * (xv[i].y - mu) * rs;
                aw[i].z += gv[i].z * (xv[i].z - mu) * rs;
                aw[i].w += gv[i].w * (xv[i].w - mu) * rs;
                ab[i] = make_float4(ab[i].x + gv[i].x, ab[i].y + gv[i].y, ab[i].z + gv[i].z,
                                    ab[i].w + gv[i].w);
            }
        }
#pragma unroll
        for (int i = 0; i < LN_VECS; i++) {
            int64_t j = lane + 32 * i;
            if (j < n4) {
                dst[j] = ov[i];
                if (hr != NULL) {
                    hr[j] = pack_half4(ov[i], a.dt);
                }
            }
        }
    }
    if constexpr (PARAMS) {
        __shared__ float4 shw[32 * LN_VECS], shb[32 * LN_VECS];
        for (int k = 0; k < LN_ROWS; k++) { /* the warps' sums in warp order */
            if (warp == k) {
                for (int i = 0; i < LN_VECS; i++) {
                    int j = lane + 32 * i;
                    float4 pw = k ? shw[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    float4 pb = k ? shb[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    shw[j] =
                        make_float4(pw.x + aw[i].x, pw.y + aw[i].y, pw.z + aw[i].z, pw.w + aw[i].w);
                    shb[j] =
                        make_float4(pb.x + ab[i].x, pb.y + ab[i].y, pb.z + ab[i].z, pb.w + ab[i].w);
                }
            }
            __syncthreads();
        }
        const float *tw = (const float *)shw, *tb = (const float *)shb;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            if (gridDim.x > 1) {
                part[(int64_t)blockIdx.x * C + c] = tw[c];
                part[((int64_t)gridDim.x + blockIdx.x) * C + c] = tb[c];
                continue;
            }
            if (gw) {
                gw[c] += tw[c];
            }
            if (gb) {
                gb[c] += tb[c];
            }
        }
    }
}

template <int LN_VECS>
__global__ void __launch_bounds__(32 * LN_ROWS) k_layernorm_bwd_x_warp(ln_bwd_args a)
{
    ln_bwd_rows<LN_VECS, false>(a);
}

template <int LN_VECS>
__global__ void __launch_bounds__(32 * LN_ROWS) k_layernorm_bwd_warp_params(ln_bwd_args a)
{
    ln_bwd_rows<LN_VECS, true>(a);
}

/* ---- causal attention: one warp per row, online softmax ---- */

#define PER_LANE (NN_CU_ATTN_MAX_HD / 32)
#define ATTN_WARPS 4

__device__ __forceinline__ float attn_keep(const nn_cu_attn &a, int64_t bh, int64_t t, int64_t s)
{
    if (a.p <= 0.0f) {
        return 1.0f;
    }
    unsigned long long i = (unsigned long long)((bh * a.T + t) * a.T + s);
    return uniform01(a.key, i) >= a.p ? 1.0f / (1.0f - a.p) : 0.0f;
}

/* Loads hd values of a row (rounded per a.rnd) into this lane's registers. */
__device__ __forceinline__ void load_row(const float *src, int64_t hd, int lane, int rnd, float *r)
{
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int64_t d = lane + 32 * i;
        r[i] = d < hd ? rnd_dt(src[d], rnd) : 0.0f;
    }
}

/* The score of rows held in registers against a row in memory: (q . k) * scale. */
__device__ __forceinline__ float dot_row(const float *q, const float *k, int64_t hd, int lane,
                                         int rnd)
{
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int64_t d = lane + 32 * i;
        if (d < hd) {
            s += q[i] * rnd_dt(k[d], rnd);
        }
    }
    return warp_sum(s);
}

__global__ void k_attn_fwd(nn_cu_attn a, const float *qkv, float *y, float *lse)
{
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= a.B * a.H * a.T) {
        return; /* the whole warp */
    }
    int64_t t = w % a.T, bh = w / a.T, h = bh % a.H, b = bh / a.H, C3 = 3 * a.C;
    const float *base = qkv + b * a.T * C3 + h * a.hd;
    float q[PER_LANE], acc[PER_LANE];
    load_row(base + t * C3, a.hd, lane, a.rnd, q);
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= t; j++) {
        const float *k = base + j * C3 + a.C, *v = k + a.C;
        float s = dot_row(q, k, a.hd, lane, a.rnd) * a.scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
        float pe = e * attn_keep(a, bh, t, j);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int64_t d = lane + 32 * i;
            acc[i] = acc[i] * corr + (d < a.hd ? pe * rnd_dt(v[d], a.rnd) : 0.0f);
        }
        m = mn;
    }
    float *yr = y + (b * a.T + t) * a.C + h * a.hd;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.hd) {
            yr[d] = acc[i] / l;
        }
    }
    if (lane == 0) {
        lse[bh * a.T + t] = m + logf(l);
    }
}

/* D[bh, t] = rnd(dO[t]) . O[t]. */
__global__ void k_attn_bwd_d(nn_cu_attn a, const float *y, const float *gy, float *D)
{
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= a.B * a.H * a.T) {
        return;
    }
    int64_t t = w % a.T, bh = w / a.T, h = bh % a.H, b = bh / a.H;
    int64_t off = (b * a.T + t) * a.C + h * a.hd;
    float s = 0.0f;
    for (int64_t d = lane; d < a.hd; d += 32) {
        s += rnd_dt(gy[off + d], a.rnd) * y[off + d];
    }
    s = warp_sum(s);
    if (lane == 0) {
        D[bh * a.T + t] = s;
    }
}

/* P, P' (dropped) and dS of score (t, j), rounded as the CPU's autocast rounds them. */
__device__ __forceinline__ void attn_grad_terms(const nn_cu_attn &a, int64_t bh, int64_t t,
                                                int64_t j, float s, float lse_t, float dp,
                                                float D_t, float *pd_out, float *ds_out)
{
    float p = expf(s - lse_t);
    float pd = rnd_dt(p * attn_keep(a, bh, t, j), a.rnd);
    p = rnd_dt(p, a.rnd);
    *pd_out = pd;
    *ds_out = rnd_dt(pd * dp - p * D_t, a.rnd);
}

__device__ __forceinline__ void store_row(float *dst, const float *v, float f, int64_t hd, int lane,
                                          int rnd, int write)
{
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int64_t d = lane + 32 * i;
        if (d < hd) {
            float x = rnd_dt(v[i] * f, rnd);
            dst[d] = write ? x : dst[d] + x;
        }
    }
}

/* dq[t] = scale * sum over j <= t of dS[t, j] k[j]: one warp per query row. */
__global__ void k_attn_bwd_q(nn_cu_attn a, const float *qkv, const float *lse, const float *gy,
                             const float *D, float *gqkv, int write)
{
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= a.B * a.H * a.T) {
        return;
    }
    int64_t t = w % a.T, bh = w / a.T, h = bh % a.H, b = bh / a.H, C3 = 3 * a.C;
    const float *base = qkv + b * a.T * C3 + h * a.hd;
    float q[PER_LANE], dO[PER_LANE], dq[PER_LANE];
    load_row(base + t * C3, a.hd, lane, a.rnd, q);
    load_row(gy + (b * a.T + t) * a.C + h * a.hd, a.hd, lane, a.rnd, dO);
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        dq[i] = 0.0f;
    }
    float lse_t = lse[bh * a.T + t], D_t = D[bh * a.T + t];
    for (int64_t j = 0; j <= t; j++) {
        const float *k = base + j * C3 + a.C, *v = k + a.C;
        float s = dot_row(q, k, a.hd, lane, a.rnd) * a.scale;
        float dp = dot_row(dO, v, a.hd, lane, a.rnd);
        float pd, ds;
        attn_grad_terms(a, bh, t, j, s, lse_t, dp, D_t, &pd, &ds);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int64_t d = lane + 32 * i;
            dq[i] += d < a.hd ? ds * rnd_dt(k[d], a.rnd) : 0.0f;
        }
    }
    store_row(gqkv + (b * a.T + t) * C3 + h * a.hd, dq, a.scale, a.hd, lane, a.rnd, write);
}

/* dk[j] = scale * sum over t >= j of dS[t, j] q[t]; dv[j] = sum of P'[t, j] dO[t]: one warp per
 * key row. */
__global__ void k_attn_bwd_kv(nn_cu_attn a, const float *qkv, const float *lse, const float *gy,
                              const float *D, float *gqkv, int write)
{
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= a.B * a.H * a.T) {
        return;
    }
    int64_t j = w % a.T, bh = w / a.T, h = bh % a.H, b = bh / a.H, C3 = 3 * a.C;
    const float *base = qkv + b * a.T * C3 + h * a.hd;
    float k[PER_LANE], v[PER_LANE], dk[PER_LANE], dv[PER_LANE];
    load_row(base + j * C3 + a.C, a.hd, lane, a.rnd, k);
    load_row(base + j * C3 + 2 * a.C, a.hd, lane, a.rnd, v);
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        dk[i] = 0.0f;
        dv[i] = 0.0f;
    }
    for (int64_t t = j; t < a.T; t++) {
        const float *q = base + t * C3, *dO = gy + (b * a.T + t) * a.C + h * a.hd;
        float s = dot_row(k, q, a.hd, lane, a.rnd) * a.scale;
        float dp = dot_row(v, dO, a.hd, lane, a.rnd);
        float pd, ds;
        attn_grad_terms(a, bh, t, j, s, lse[bh * a.T + t], dp, D[bh * a.T + t], &pd, &ds);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int64_t d = lane + 32 * i;
            if (d < a.hd) {
                dk[i] += ds * rnd_dt(q[d], a.rnd);
                dv[i] += pd * rnd_dt(dO[d], a.rnd);
            }
        }
    }
    float *dst = gqkv + (b * a.T + j) * C3 + h * a.hd;
    store_row(dst + a.C, dk, a.scale, a.hd, lane, a.rnd, write);
    store_row(dst + 2 * a.C, dv, 1.0f, a.hd, lane, a.rnd, write);
}

/* ---- launchers ---- */

/* The register-row kernels' float4s per lane for C (0: they do not apply, see above). */
static int ln_vecs(int64_t C, const void *a, const void *b, const void *c, const void *d)
{
    uintptr_t any = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    if (C % 4 != 0 || C > 128 * 8 || (any & 15) != 0) {
        return 0;
    }
    return C <= 128 * 2 ? 2 : C <= 128 * 4 ? 4 : C <= 128 * 6 ? 6 : 8;
}

template <int V> static void ln_fwd_warp(cudaStream_t s, const nn_cu_ln &a)
{
    unsigned grid = (unsigned)((a.rows + LN_ROWS - 1) / LN_ROWS);
    k_layernorm_warp<V><<<grid, 32 * LN_ROWS, 0, s>>>(a);
}

template <int V> static void ln_bwd_warp(cudaStream_t s, const ln_bwd_args &a)
{
    dim3 block(32 * LN_ROWS);
    if (a.gw == NULL && a.gb == NULL) {
        unsigned grid = (unsigned)((a.rows + LN_ROWS - 1) / LN_ROWS);
        k_layernorm_bwd_x_warp<V><<<grid, block, 0, s>>>(a);
        return;
    }
    unsigned grid = (unsigned)((a.rows + LNB_ROWS - 1) / LNB_ROWS);
    k_layernorm_bwd_warp_params<V><<<grid, block, 0, s>>>(a);
    if (grid > 1) { /* the weight's and the bias's partial rows summed in one launch */
        nn_cu_sum_parts_pair(s, a.part, grid, a.C, a.gw, a.gb, 0, 0);
    }
}

extern "C" {

cudaError_t nn_cu_dropout(cudaStream_t s, uint64_t key, float p, const float *src, float *dst,
                          int64_t n, int write)
{
    k_dropout<<<grid_for(n), THREADS, 0, s>>>(key, p, src, dst, n, write);
    return cudaGetLastError();
}

cudaError_t nn_cu_embedding(cudaStream_t s, const float *w, const int32_t *ids, float *y,
                            int64_t rows, int64_t C)
{
    k_embedding<<<grid_for(rows * C), THREADS, 0, s>>>(w, ids, y, rows, C);
    return cudaGetLastError();
}

cudaError_t nn_cu_embedding_bwd(cudaStream_t s, const int32_t *order, const int32_t *start,
                                const int32_t *gid, int64_t nd, const float *gy, int64_t C,
                                float *gw)
{
    if (nd == 0 || C == 0) {
        return cudaSuccess;
    }
    dim3 grid((unsigned)(nd < EMB_BLOCKS ? nd : EMB_BLOCKS),
              (unsigned)((C + THREADS - 1) / THREADS));
    k_embedding_bwd<<<grid, THREADS, 0, s>>>(order, start, gid, nd, gy, C, gw);
    return cudaGetLastError();
}

cudaError_t nn_cu_layernorm(cudaStream_t s, const nn_cu_ln *a)
{
    /* x and y: the rows' starts are aligned when the pointers are (C % 4 == 0); the residual,
     * the sum and the shadow (8-byte stores: 16-byte aligned rows too) likewise. */
    uintptr_t more = (uintptr_t)a->res | (uintptr_t)a->sum | (uintptr_t)a->yh;
    int nv = (more & 15) == 0 ? ln_vecs(a->C, a->x, a->w, a->b, a->y) : 0;
    if (nv == 2) {
        ln_fwd_warp<2>(s, *a);
    } else if (nv == 4) {
        ln_fwd_warp<4>(s, *a);
    } else if (nv == 6) {
        ln_fwd_warp<6>(s, *a);
    } else if (nv == 8) {
        ln_fwd_warp<8>(s, *a);
    } else {
        k_layernorm<<<(unsigned)a->rows, ROW_THREADS, 0, s>>>(*a);
    }
    return cudaGetLastError();
}

int64_t nn_cu_layernorm_bwd_part_count(int64_t rows, int64_t C)
{
    int64_t blocks = (rows + LNB_ROWS - 1) / LNB_ROWS, sums = nn_cu_col_sum_part_count(rows, C);
    return 2 * (blocks > 1 && blocks * C > sums ? blocks * C : sums);
}

/* The register-row kernel's vectors a lane (2 to 8), 0 for the row kernel, -1 without gx. */
static int ln_bwd_vecs(int64_t C, const float *x, const void *gy, const float *w, const float *gx,
                       const float *gbase, const void *gh)
{
    if (gx == NULL) {
        return -1;
    }
    return (((uintptr_t)gbase | (uintptr_t)gh) & 15) != 0 ? 0 : ln_vecs(C, x, gy, w, gx);
}

int nn_cu_layernorm_bwd_reads_half(int64_t C, const float *x, const void *gyh, const float *w,
                                   const float *gx, int write, const float *gbase, const void *gh)
{
    return gyh != NULL && ln_bwd_vecs(C, x, gyh, w, gx, write ? gbase : NULL, gh) > 0;
}

cudaError_t nn_cu_layernorm_bwd(cudaStream_t s, const float *x, const float *gy, const void *gyh,
                                int gdt, const float *w, const float *mean, const float *rstd,
                                int64_t rows, int64_t C, float *gx, int write, const float *gbase,
                                void *gh, int dt, float *gw, float *gb, float *part)
{
    /* The register-row kernel makes the parameter gradients too (from the same reads). */
    gbase = write ? gbase : NULL;
    int nv = ln_bwd_vecs(C, x, gyh != NULL ? gyh : (const void *)gy, w, gx, gbase, gh);
    if (gyh != NULL && nv <= 0) {
        return cudaErrorInvalidValue; /* only the register-row kernel reads 2-byte gy */
    }
    ln_bwd_args a = {x,    gy, w,  mean,  rstd, rows, C,   gx, write,
                     part, gw, gb, gbase, gh,   dt,   gyh, gdt};
    if (nv == 2) {
        ln_bwd_warp<2>(s, a);
    } else if (nv == 4) {
        ln_bwd_warp<4>(s, a);
    } else if (nv == 6) {
        ln_bwd_warp<6>(s, a);
    } else if (nv == 8) {
        ln_bwd_warp<8>(s, a);
    } else if (nv == 0) {
        k_layernorm_bwd_x<<<(unsigned)rows, ROW_THREADS, 0, s>>>(x, gy, w, mean, rstd, C, gx,
                                                                 write, gbase, gh, dt);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || nv > 0) {
        return e;
    }
    return nn_cu_layernorm_bwd_params(s, x, gy, mean, rstd, rows, C, gw, gb, part);
}

static unsigned attn_blocks(const nn_cu_attn *a)
{
    int64_t warps = a->B * a->H * a->T;
    return (unsigned)((warps + ATTN_WARPS - 1) / ATTN_WARPS);
}

cudaError_t nn_cu_attn_fwd(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y,
                           float *lse)
{
    cudaError_t e;
    if (nn_cu_attn_fwd_tc(s, a, qkv, y, lse, &e)) {
        return e;
    }
    k_attn_fwd<<<attn_blocks(a), 32 * ATTN_WARPS, 0, s>>>(*a, qkv, y, lse);
    e = cudaGetLastError();
    if (e == cudaSuccess && a->y_h != NULL) { /* y's 2-byte copy: a pass of its own here */
        e = nn_cu_to_half(s, y, a->y_h, a->B * a->T * a->C, a->rnd);
    }
    return e;
}

cudaError_t nn_cu_attn_bwd(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                           const float *lse, const float *gy, float *D, float *gqkv, int write)
{
    cudaError_t e;
    if (nn_cu_attn_bwd_tc(s, a, qkv, y, lse, gy, D, gqkv, write, &e)) {
        return e;
    }
    k_attn_bwd_d<<<attn_blocks(a), 32 * ATTN_WARPS, 0, s>>>(*a, y, gy, D);
    k_attn_bwd_q<<<attn_blocks(a), 32 * ATTN_WARPS, 0, s>>>(*a, qkv, lse, gy, D, gqkv, write);
    k_attn_bwd_kv<<<attn_blocks(a), 32 * ATTN_WARPS, 0, s>>>(*a, qkv, lse, gy, D, gqkv, write);
    e = cudaGetLastError();
    if (e == cudaSuccess && a->gqkv_h != NULL) { /* the gradient's copy: a pass of its own */
        e = nn_cu_to_half(s, gqkv, a->gqkv_h, a->B * a->T * 3 * a->C, a->rnd);
    }
    return e;
}

} /* extern "C" */
