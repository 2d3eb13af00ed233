/*
 * The nn toolkit's sums over rows (launchers in nn_kernels.h): bias gradients, LayerNorm's
 * parameter gradients where nn_kernels.cu's register-row kernel does not make them, and the
 * fused MLP's hidden gradient with its bias gradient. They split the rows into chunks of
 * CS_ROWS so the grid fills the GPU: a first kernel sums each chunk (32 lanes, each every 32nd
 * row, then the lanes in order; a thread takes 16 bytes of columns a row where the rows are
 * 16-byte aligned) into a partial row of scratch, a second adds the partial rows in chunk
 * order; the fused MLP's hidden gradient (k_dgelu_bgrad_half) makes its bias gradient in the
 * same pass and order. The order of every sum depends only on the shapes, and no kernel uses
 * atomics: results are deterministic.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "nn_kernels.h"
#include "nn_kernels_dev.cuh"

/* Column sums: a block is CS_COLS columns x CS_LANES lanes over at most CS_ROWS rows. */
#define CS_COLS 32
#define CS_LANES 32
#define CS_ROWS 512
/* The most chunks a column sum splits its rows into (the grid's y extent). */
#define CS_MAX_CHUNKS 65535
/* Rows a lane of k_col_sum_vec loads before adding them. */
#define CS_UNROLL 4

/* ---- sums over rows ---- */

template <typename T> __device__ __forceinline__ float load_f(const T *p);
template <> __device__ __forceinline__ float load_f<float>(const float *p)
{
    return *p;
}
template <> __device__ __forceinline__ float load_f<__nv_bfloat16>(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}
template <> __device__ __forceinline__ float load_f<__half>(const __half *p)
{
    return __half2float(*p);
}

/* dst = v (write) or dst + v, v rounded first (rnd). */
__device__ __forceinline__ void put_sum(float *dst, float v, int write, int rnd)
{
    v = rnd_dt(v, rnd);
    *dst = write ? v : *dst + v;
}

/* Chunk blockIdx.y of rows [chunk y, chunk (y + 1)): lane threadIdx.y of column c sums rows
 * r0 + lane, r0 + lane + CS_LANES, ..., then lane 0 adds the lanes in order: into dst when the
 * grid has one chunk, else into part[y * cols + c] for k_sum_parts. */
template <typename T>
__global__ void __launch_bounds__(CS_COLS *CS_LANES)
    k_col_sum(const T *src, int64_t rows, int64_t cols, int64_t chunk, float *part, float *dst,
              int write, int rnd)
{
    __shared__ float sh[CS_LANES][CS_COLS + 1];
    int64_t c = (int64_t)blockIdx.x * CS_COLS + threadIdx.x, r0 = (int64_t)blockIdx.y * chunk;
    int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (int64_t r = r0 + threadIdx.y; r < r1; r += CS_LANES) {
            s += load_f(src + r * cols + c);
        }
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
        for (int k = 0; k < CS_LANES; k++) {
            t += sh[k][threadIdx.x];
        }
        if (gridDim.y == 1) {
            put_sum(dst + c, t, write, rnd);
        } else {
            part[(int64_t)blockIdx.y * cols + c] = t;
        }
    }
}

/* 32-bit word i of a 16-byte vector (i a constant once unrolled). */
__device__ __forceinline__ unsigned vec_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Element k of a 16-byte vector of T (little-endian: element 0 in the low bits) as a float. */
template <typename T> __device__ __forceinline__ float vec_elem(const uint4 &v, int k);
template <> __device__ __forceinline__ float vec_elem<float>(const uint4 &v, int k)
{
    return __uint_as_float(vec_word(v, k));
}
template <> __device__ __forceinline__ float vec_elem<__nv_bfloat16>(const uint4 &v, int k)
{
    unsigned w = vec_word(v, k / 2);
    return half_f((uint16_t)(k % 2 ? w >> 16 : w & 0xFFFFu), 1);
}
template <> __device__ __forceinline__ float vec_elem<__half>(const uint4 &v, int k)
{
    unsigned w = vec_word(v, k / 2);
    return half_f((uint16_t)(k % 2 ? w >> 16 : w & 0xFFFFu), 2);
}

/* The end of a vector column-sum block: each thread's VEC lane sums s go to shared memory,
 * column-major within a thread's vector (sh[lane][k * CS_COLS + x] for column x * VEC + k:
 * consecutive threads store and read consecutive words, no bank conflicts), then one thread
 * per column adds the CS_LANES lanes in order (k_col_sum's order). Returns that thread's
 * column with its total in *tot, or -1 for a thread with none. */
template <int VEC>
__device__ __forceinline__ int64_t lanes_total(float (*sh)[CS_COLS * VEC], const float *s,
                                               int64_t cols, float *tot)
{
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        sh[threadIdx.y][k * CS_COLS + threadIdx.x] = s[k];
    }
    __syncthreads();
    int t = threadIdx.y * CS_COLS + threadIdx.x;
    int64_t c = (int64_t)blockIdx.x * CS_COLS * VEC + (t % CS_COLS) * VEC + t / CS_COLS;
    if (t >= CS_COLS * VEC || c >= cols) {
        return -1;
    }
    float sum = 0.0f;
    for (int l = 0; l < CS_LANES; l++) {
        sum += sh[l][t];
    }
    *tot = sum;
    return c;
}

/* k_col_sum with VEC consecutive columns a thread (VEC * sizeof(T) = 16: one 16-byte load a
 * row), CS_UNROLL of the lane's rows loaded before any is added: the same lanes, rows and
 * order per column as k_col_sum, so the same bits, from a quarter (fp32) or an eighth (2-byte)
 * of the load instructions and with 64 bytes in flight a thread instead of 8 (2-byte) or 16.
 * The partial sums sit in shared memory column-major within a thread's vector (sh[lane][k *
 * CS_COLS + x] for column x * VEC + k), as in k_dgelu_bgrad_half: consecutive threads store
 * and read consecutive words, no bank conflicts. The caller checks that src is 16-byte aligned
 * and cols a multiple of VEC (every row's vectors aligned). */
template <typename T, int VEC>
__global__ void __launch_bounds__(CS_COLS *CS_LANES)
    k_col_sum_vec(const T *src, int64_t rows, int64_t cols, int64_t chunk, float *part, float *dst,
                  int write, int rnd)
{
    static_assert(VEC * sizeof(T) == 16, "one 16-byte vector a row");
    __shared__ float sh[CS_LANES][CS_COLS * VEC];
    int64_t c0 = ((int64_t)blockIdx.x * CS_COLS + threadIdx.x) * VEC;
    int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        s[k] = 0.0f;
    }
    if (c0 < cols) { /* cols is a multiple of VEC: the whole vector is in range */
        for (int64_t r = r0 + threadIdx.y; r < r1; r += CS_UNROLL * CS_LANES) {
            uint4 v[CS_UNROLL];
#pragma unroll
            for (int u = 0; u < CS_UNROLL; u++) {
                int64_t ru = r + (int64_t)u * CS_LANES;
                v[u] = ru < r1 ? *(const uint4 *)(src + ru * cols + c0) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < CS_UNROLL; u++) {
                if (r + (int64_t)u * CS_LANES < r1) {
#pragma unroll
                    for (int k = 0; k < VEC; k++) {
                        s[k] += vec_elem<T>(v[u], k);
                    }
                }
            }
        }
    }
    float tot;
    int64_t c = lanes_total<VEC>(sh, s, cols, &tot);
    if (c < 0) {
        return;
    }
    if (gridDim.y == 1) {
        put_sum(dst + c, tot, write, rnd);
    } else {
        part[(int64_t)blockIdx.y * cols + c] = tot;
    }
}

/* The partial-row pass: a block of SP_WARPS warps takes SP_COLS columns. Per tile of SP_TILE
 * partial rows, warp w loads the tile's rows w, w + SP_WARPS, ... into registers, all of them
 * before any is stored (a 128-byte load a row, none waiting on another: the tile's 32 KiB in
 * flight at once), then into shared memory; then warp 0, lane x for column x, adds the tile's
 * rows in row order. The order is the one-thread-a-column loop's (rows 0 to nparts - 1), so
 * the bits are too, while the block waits on one round trip to L2 a tile instead of one every
 * 16 rows (a thread a column with 16 loads in flight: 16 round trips for LayerNorm's 256
 * partial rows). Shared rows are 32 words: lane x reads and writes bank x, no conflicts. */
#define SP_COLS 32
#define SP_WARPS 8
#define SP_TILE 256

/* Column blockIdx.x * SP_COLS + lane's sum over the nparts partial rows, in row order (for
 * warp 0; the other warps return 0). Every thread of the block must call it. */
__device__ __forceinline__ float sum_parts_col(const float *part, int64_t nparts, int64_t cols,
                                               float (*sh)[SP_COLS])
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t c = (int64_t)blockIdx.x * SP_COLS + lane;
    float t = 0.0f;
    for (int64_t k0 = 0; k0 < nparts; k0 += SP_TILE) {
        int n = nparts - k0 < SP_TILE ? (int)(nparts - k0) : SP_TILE;
        float v[SP_TILE / SP_WARPS];
#pragma unroll
        for (int i = 0; i < SP_TILE / SP_WARPS; i++) {
            int k = warp + i * SP_WARPS;
            v[i] = k < n && c < cols ? part[(k0 + k) * cols + c] : 0.0f;
        }
        if (k0 > 0) {
            __syncthreads(); /* warp 0 has added the last tile */
        }
#pragma unroll
        for (int i = 0; i < SP_TILE / SP_WARPS; i++) {
            sh[warp + i * SP_WARPS][lane] = v[i];
        }
        __syncthreads();
        if (warp == 0) { /* unrolled: 16 shared loads issued ahead of their adds */
#pragma unroll 16
            for (int k = 0; k < n; k++) {
                t += sh[k][lane];
            }
        }
    }
    return t;
}

/* dst[c] (+)= rnd(the nparts partial rows' column c, added in row order). A second row of
 * blocks (gridDim.y 2) sums the nparts rows after those into dst1: two such sums, one launch. */
__global__ void __launch_bounds__(SP_COLS *SP_WARPS)
    k_sum_parts(const float *part, int64_t nparts, int64_t cols, float *dst, float *dst1, int write,
                int rnd)
{
    __shared__ float sh[SP_TILE][SP_COLS];
    float t = sum_parts_col(part + (int64_t)blockIdx.y * nparts * cols, nparts, cols, sh);
    int64_t c = (int64_t)blockIdx.x * SP_COLS + threadIdx.x;
    if (threadIdx.x < 32 && c < cols) {
        put_sum((blockIdx.y != 0 ? dst1 : dst) + c, t, write, rnd);
    }
}

static inline unsigned sum_parts_grid(int64_t cols)
{
    return (unsigned)((cols + SP_COLS - 1) / SP_COLS);
}

/* As k_col_sum, LayerNorm's weight and bias gradients at once (both accumulate): part holds
 * the weight's partial rows, then the bias's. Two blocks per SM (32 registers a thread), as
 * k_col_sum, for the loads in flight. */
__global__ void __launch_bounds__(CS_COLS *CS_LANES, 2)
    k_layernorm_bwd_params(const float *x, const float *gy, const float *mean, const float *rstd,
                           int64_t rows, int64_t C, int64_t chunk, float *part, float *gw,
                           float *gb)
{
    __shared__ float shw[CS_LANES][CS_COLS + 1], shb[CS_LANES][CS_COLS + 1];
    int64_t c = (int64_t)blockIdx.x * CS_COLS + threadIdx.x, r0 = (int64_t)blockIdx.y * chunk;
    int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
#pragma unroll 4
        for (int64_t r = r0 + threadIdx.y; r < r1; r += CS_LANES) {
            float g = gy[r * C + c];
            sw += g * (x[r * C + c] - mean[r]) * rstd[r];
            sb += g;
        }
    }
    shw[threadIdx.y][threadIdx.x] = sw;
    shb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < CS_LANES; k++) {
            tw += shw[k][threadIdx.x];
            tb += shb[k][threadIdx.x];
        }
        if (gridDim.y > 1) {
            part[(int64_t)blockIdx.y * C + c] = tw;
            part[((int64_t)gridDim.y + blockIdx.y) * C + c] = tb;
            return;
        }
        if (gw) {
            gw[c] += tw;
        }
        if (gb) {
            gb[c] += tb;
        }
    }
}

/* ---- launchers ---- */

/* Rows per chunk of a column sum: CS_ROWS, or more where the chunks would overflow the grid
 * (a multiple of CS_LANES, so every lane walks whole strides). */
static int64_t cs_chunk(int64_t rows)
{
    int64_t chunk = CS_ROWS;
    if ((rows + chunk - 1) / chunk > CS_MAX_CHUNKS) {
        chunk = (rows + CS_MAX_CHUNKS - 1) / CS_MAX_CHUNKS;
        chunk = (chunk + CS_LANES - 1) / CS_LANES * CS_LANES;
    }
    return chunk;
}

static int64_t cs_chunks(int64_t rows)
{
    int64_t chunk = cs_chunk(rows), n = (rows + chunk - 1) / chunk;
    return n < 1 ? 1 : n;
}

/* k_col_sum over src of element type T (chunks: the grid's y extent): 16-byte vectors of
 * columns where src is 16-byte aligned and cols a multiple of a vector, else a column a
 * thread. */
template <typename T>
static void col_sum_first(cudaStream_t s, unsigned chunks, const void *src, int64_t rows,
                          int64_t cols, int64_t chunk, float *part, float *dst, int write, int rnd)
{
    constexpr int V = (int)(16 / sizeof(T));
    const T *p = (const T *)src;
    dim3 block(CS_COLS, CS_LANES);
    if (cols % V == 0 && ((uintptr_t)src & 15) == 0) {
        dim3 grid((unsigned)((cols + CS_COLS * V - 1) / (CS_COLS * V)), chunks);
        k_col_sum_vec<T, V><<<grid, block, 0, s>>>(p, rows, cols, chunk, part, dst, write, rnd);
    } else {
        dim3 grid((unsigned)((cols + CS_COLS - 1) / CS_COLS), chunks);
        k_col_sum<T><<<grid, block, 0, s>>>(p, rows, cols, chunk, part, dst, write, rnd);
    }
}

extern "C" {

int64_t nn_cu_col_sum_part_count(int64_t rows, int64_t cols)
{
    int64_t n = cs_chunks(rows);
    return n > 1 ? n * cols : 0;
}

cudaError_t nn_cu_col_sum(cudaStream_t s, const void *src, int src_dt, int64_t rows, int64_t cols,
                          float *dst, int write, int rnd, float *part)
{
    if (cols == 0) {
        return cudaSuccess;
    }
    int64_t chunk = cs_chunk(rows), chunks = cs_chunks(rows);
    unsigned gy = (unsigned)chunks;
    if (src_dt == 1) {
        col_sum_first<__nv_bfloat16>(s, gy, src, rows, cols, chunk, part, dst, write, rnd);
    } else if (src_dt == 2) {
        col_sum_first<__half>(s, gy, src, rows, cols, chunk, part, dst, write, rnd);
    } else {
        col_sum_first<float>(s, gy, src, rows, cols, chunk, part, dst, write, rnd);
    }
    if (chunks > 1) {
        k_sum_parts<<<sum_parts_grid(cols), SP_COLS * SP_WARPS, 0, s>>>(part, chunks, cols, dst,
                                                                        nullptr, write, rnd);
    }
    return cudaGetLastError();
}

cudaError_t nn_cu_sum_parts(cudaStream_t s, const float *part, int64_t nparts, int64_t cols,
                            float *dst, int write, int rnd)
{
    k_sum_parts<<<sum_parts_grid(cols), SP_COLS * SP_WARPS, 0, s>>>(part, nparts, cols, dst,
                                                                    nullptr, write, rnd);
    return cudaGetLastError();
}

cudaError_t nn_cu_sum_parts_pair(cudaStream_t s, const float *part, int64_t nparts, int64_t cols,
                                 float *dst0, float *dst1, int write, int rnd)
{
    if (dst0 == NULL && dst1 == NULL) {
        return cudaSuccess;
    }
    if (dst0 == NULL) { /* the second sum alone */
        part += nparts * cols;
        dst0 = dst1;
        dst1 = NULL;
    }
    dim3 grid(sum_parts_grid(cols), dst1 != NULL ? 2 : 1);
    k_sum_parts<<<grid, SP_COLS * SP_WARPS, 0, s>>>(part, nparts, cols, dst0, dst1, write, rnd);
    return cudaGetLastError();
}

cudaError_t nn_cu_layernorm_bwd_params(cudaStream_t s, const float *x, const float *gy,
                                       const float *mean, const float *rstd, int64_t rows,
                                       int64_t C, float *gw, float *gb, float *part)
{
    if (C == 0 || (gw == NULL && gb == NULL)) {
        return cudaSuccess;
    }
    int64_t chunk = cs_chunk(rows), chunks = cs_chunks(rows);
    dim3 grid((unsigned)((C + CS_COLS - 1) / CS_COLS), (unsigned)chunks);
    k_layernorm_bwd_params<<<grid, dim3(CS_COLS, CS_LANES), 0, s>>>(x, gy, mean, rstd, rows, C,
                                                                    chunk, part, gw, gb);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || chunks <= 1) {
        return e;
    }
    return nn_cu_sum_parts_pair(s, part, chunks, C, gw, gb, 0, 0);
}

} /* extern "C" */

/* ---- the fused MLP's hidden gradient from a plain 2-byte product (nn_cu_dgelu_bgrad_half) ---- */

/* VEC consecutive 2-byte values at p (VEC 8: one 16-byte access, else one value). */
template <int VEC> struct half_vec {
    uint16_t h[VEC];
};

template <int VEC> __device__ __forceinline__ half_vec<VEC> load_vec(const uint16_t *p)
{
    half_vec<VEC> v;
    if (VEC == 8) {
        uint4 u = *(const uint4 *)p;
        memcpy(v.h, &u, 16);
    } else {
        v.h[0] = *p;
    }
    return v;
}

template <int VEC> __device__ __forceinline__ void store_vec(uint16_t *p, const half_vec<VEC> &v)
{
    if (VEC == 8) {
        uint4 u;
        memcpy(&u, v.h, 16);
        *(uint4 *)p = u;
    } else {
        *p = v.h[0];
    }
}

/* p = rnd(p * gelu_tanh'(a)), and the rounded values added to the column sums s. */
template <int VEC, int DT>
__device__ __forceinline__ void dgelu_vec(half_vec<VEC> &p, const half_vec<VEC> &a, float *s)
{
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        p.h[k] = half_bits(half_f(p.h[k], DT) * gelu_grad(half_f(a.h[k], DT), 1), DT);
        s[k] += half_f(p.h[k], DT);
    }
}

/* Block (blockIdx.x, blockIdx.y): CS_COLS threads of VEC columns each (columns c0 .. c0 + VEC
 * - 1) over chunk blockIdx.y of the rows, in k_col_sum's lanes. Each element of d becomes
 * rnd(d * gelu_tanh'(aux)) in place, and with dbias each thread adds its rounded values to
 * its VEC column sums, lane threadIdx.y taking rows r0 + lane, r0 + lane + CS_LANES, ... in
 * order; then one thread per column adds the CS_LANES lanes in order: k_col_sum's order, so
 * the sums are nn_cu_col_sum's of the rounded dZ, bit for bit. The shared partial sums are
 * stored column-major within a thread's vector (sh[lane][k * CS_COLS + x] for column
 * x * VEC + k), so both the stores and the reads of consecutive threads are consecutive words:
 * no bank conflicts. */
template <int VEC, int DT>
__global__ void __launch_bounds__(CS_COLS *CS_LANES)
    k_dgelu_bgrad_half(uint16_t *d, const uint16_t *aux, int64_t rows, int64_t cols, int64_t chunk,
                       float *part, uint16_t *dbias)
{
    __shared__ float sh[CS_LANES][CS_COLS * VEC];
    int64_t c0 = ((int64_t)blockIdx.x * CS_COLS + threadIdx.x) * VEC;
    int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        s[k] = 0.0f;
    }
    /* Two of the lane's rows a step, both loaded before either is stored: the compiler may
     * not move a load above a store to d it cannot prove elsewhere, and two rows in flight
     * keep 64 KiB of loads pending per SM (one 1024-thread block), about twice what HBM's
     * latency needs. The lane still takes its rows in order. */
    if (c0 < cols) { /* VEC 8: cols is a multiple of 8, so the whole vector is in range */
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 2 * CS_LANES) {
            int two = r + CS_LANES < r1;
            half_vec<VEC> p0 = load_vec<VEC>(d + r * cols + c0), p1 = p0;
            half_vec<VEC> a0 = load_vec<VEC>(aux + r * cols + c0), a1 = a0;
            if (two) {
                p1 = load_vec<VEC>(d + (r + CS_LANES) * cols + c0);
                a1 = load_vec<VEC>(aux + (r + CS_LANES) * cols + c0);
            }
            dgelu_vec<VEC, DT>(p0, a0, s);
            store_vec<VEC>(d + r * cols + c0, p0);
            if (two) {
                dgelu_vec<VEC, DT>(p1, a1, s);
                store_vec<VEC>(d + (r + CS_LANES) * cols + c0, p1);
            }
        }
    }
    if (dbias == NULL) { /* the same for the whole block */
        return;
    }
    float tot;
    int64_t c = lanes_total<VEC>(sh, s, cols, &tot);
    if (c < 0) {
        return;
    }
    if (gridDim.y == 1) {
        dbias[c] = half_bits(tot, DT);
    } else {
        part[(int64_t)blockIdx.y * cols + c] = tot;
    }
}

/* dst[c] = the nparts partial rows' column c, added in row order (as k_sum_parts), rounded to
 * 2 bytes. */
__global__ void __launch_bounds__(SP_COLS *SP_WARPS)
    k_sum_parts_half(const float *part, int64_t nparts, int64_t cols, uint16_t *dst, int dt)
{
    __shared__ float sh[SP_TILE][SP_COLS];
    float t = sum_parts_col(part, nparts, cols, sh);
    int64_t c = (int64_t)blockIdx.x * SP_COLS + threadIdx.x;
    if (threadIdx.x < 32 && c < cols) {
        dst[c] = half_bits(t, dt);
    }
}

/* The kernel for VEC and the 2-byte type, both constants of its loop. */
template <int VEC>
static void dgelu_bgrad_first(cudaStream_t s, dim3 grid, void *d, const void *aux, int64_t rows,
                              int64_t cols, int64_t chunk, float *part, void *dbias, int dt)
{
    uint16_t *dd = (uint16_t *)d, *db = (uint16_t *)dbias;
    const uint16_t *a = (const uint16_t *)aux;
    dim3 block(CS_COLS, CS_LANES);
    if (dt == 1) {
        k_dgelu_bgrad_half<VEC, 1><<<grid, block, 0, s>>>(dd, a, rows, cols, chunk, part, db);
    } else {
        k_dgelu_bgrad_half<VEC, 2><<<grid, block, 0, s>>>(dd, a, rows, cols, chunk, part, db);
    }
}

extern "C" {

cudaError_t nn_cu_dgelu_bgrad_half(cudaStream_t s, void *d, const void *aux, int64_t rows,
                                   int64_t cols, void *dbias, float *part, int dt)
{
    if (cols == 0 || (rows == 0 && dbias == NULL)) {
        return cudaSuccess;
    }
    /* The column sum's chunks of rows, with or without a bias gradient: they fill the GPU. */
    int64_t chunk = cs_chunk(rows), chunks = cs_chunks(rows);
    int vec = cols % 8 == 0 && (((uintptr_t)d | (uintptr_t)aux) & 15) == 0;
    int64_t per_block = (int64_t)CS_COLS * (vec ? 8 : 1);
    dim3 grid((unsigned)((cols + per_block - 1) / per_block), (unsigned)chunks);
    if (vec) {
        dgelu_bgrad_first<8>(s, grid, d, aux, rows, cols, chunk, part, dbias, dt);
    } else {
        dgelu_bgrad_first<1>(s, grid, d, aux, rows, cols, chunk, part, dbias, dt);
    }
    if (chunks > 1 && dbias != NULL) {
        k_sum_parts_half<<<sum_parts_grid(cols), SP_COLS * SP_WARPS, 0, s>>>(part, chunks, cols,
                                                                             (uint16_t *)dbias, dt);
    }
    return cudaGetLastError();
}

} /* extern "C" */
