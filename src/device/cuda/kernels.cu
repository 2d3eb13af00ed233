/*
 * The CUDA device's kernels behind kernels.h: casts, scale, clamp, the inf/NaN checks, the
 * norms' reductions and the SGD / Adam updates over flat device arrays.
 *
 * Invariants: element-wise results are those of the CPU device bit for bit, NaN payloads made
 * by arithmetic aside (each float operation is an explicitly rounded __f*_rn intrinsic, the
 * build also passes -fmad=false, and the narrow-float conversions are the integer routines of
 * src/base/half.h, written again for the device); reductions use a grid whose shape depends only on
 * the element count, a fixed per-thread order and a fixed tree, so the same input gives the same
 * bits on every run and every GPU; no floating-point atomics anywhere.
 */
#include <math.h>

#include "kernels.h"

namespace
{

constexpr int kThreads = 256;       /* element-wise and reduction blocks */
constexpr unsigned kMaxGrid = 4096; /* grid-stride loops beyond this */
constexpr size_t kRedPerThread = 4; /* elements per thread before a reduction adds a block */

unsigned grid_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < kMaxGrid ? b : kMaxGrid);
}

/* Reduction blocks: a function of n alone (the determinism of the sums rests on it). */
unsigned red_grid_for(size_t n)
{
    size_t b = (n + kThreads * kRedPerThread - 1) / (kThreads * kRedPerThread);
    return (unsigned)(b < ACCEL__CU_SCRATCH_DOUBLES ? (b > 0 ? b : 1) : ACCEL__CU_SCRATCH_DOUBLES);
}

/* ---- narrow floats, as src/base/half.h ---- */

__device__ __forceinline__ float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        x |= 0x400000u;
    }
    return __uint_as_float(x);
}

__device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) {
        return __uint_as_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    }
    if (e == 0) {
        float mag = __fmul_rn(__uint2float_rn(m), 0x1p-24f); /* exact */
        return __uint_as_float(sign | __float_as_uint(mag));
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* accel__round_f32_bits for f16 (10 mantissa bits, bias 15). */
__device__ __forceinline__ uint32_t round_f16_code(uint32_t ax)
{
    const int mbits = 10, bias = 15;
    int e32 = (int)(ax >> 23);
    uint32_t m32 = ax & 0x7fffffu;
    if (e32 == 0) {
        return 0;
    }
    int te = e32 - 127 + bias;
    uint32_t code;
    int shift;
    if (te >= 1) {
        shift = 23 - mbits;
        code = ((uint32_t)te << mbits) | (m32 >> shift);
    } else {
        shift = 24 - mbits - te;
        m32 |= 0x800000u;
        if (shift > 24) {
            return 0;
        }
        code = m32 >> shift;
    }
    uint32_t rem = m32 & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) {
        code++;
    }
    return code;
}

__device__ __forceinline__ uint16_t f32_to_f16(float f)
{
    uint32_t x = __float_as_uint(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));
    }
    uint32_t code = round_f16_code(ax);
    if (code >= 0x7c00u) {
        code = 0x7c00u;
    }
    return (uint16_t)(sign | code);
}

template <accel_dtype DT> __device__ __forceinline__ float load(const void *x, size_t i)
{
    if (DT == ACCEL_F32) {
        return ((const float *)x)[i];
    } else if (DT == ACCEL_BF16) {
        return bf16_to_f32(((const uint16_t *)x)[i]);
    } else {
        return f16_to_f32(((const uint16_t *)x)[i]);
    }
}

template <accel_dtype DT> __device__ __forceinline__ void store(void *x, size_t i, float v)
{
    if (DT == ACCEL_F32) {
        ((float *)x)[i] = v;
    } else if (DT == ACCEL_BF16) {
        ((uint16_t *)x)[i] = f32_to_bf16(v);
    } else {
        ((uint16_t *)x)[i] = f32_to_f16(v);
    }
}

/* inf or NaN: every exponent bit set (an integer test, as the CPU device). */
template <accel_dtype DT> __device__ __forceinline__ bool nonfinite_at(const void *x, size_t i)
{
    if (DT == ACCEL_F32) {
        return (((const uint32_t *)x)[i] & 0x7f800000u) == 0x7f800000u;
    }
    uint16_t mask = DT == ACCEL_BF16 ? 0x7f80u : 0x7c00u;
    return (((const uint16_t *)x)[i] & mask) == mask;
}

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- element-wise kernels ---- */

template <accel_dtype D, accel_dtype S>
__global__ void convert_kernel(void *dst, const void *src, size_t n)
{
    GRID_STRIDE(i, n)
    {
        store<D>(dst, i, load<S>(src, i));
    }
}

/* Four loads of a thread in flight before its stores (a whole flat gradient buffer goes
 * through here at once: with one load at a time the resident threads keep too few bytes in
 * flight to stream HBM); the same products as one element at a time. */
__global__ void scale_kernel(float *x, size_t n, float f)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        float a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
        x[i] = __fmul_rn(a, f);
        x[i + stride] = __fmul_rn(b, f);
        x[i + 2 * stride] = __fmul_rn(c, f);
        x[i + 3 * stride] = __fmul_rn(d, f);
    }
    for (; i < n; i += stride) {
        x[i] = __fmul_rn(x[i], f);
    }
}

__global__ void clamp_kernel(float *x, size_t n, float lo, float hi)
{
    GRID_STRIDE(i, n)
    {
        float v = x[i];
        x[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}

template <accel_dtype DT> __global__ void nonfinite_kernel(const void *x, size_t n, int32_t *flag)
{
    int bad = 0;
    GRID_STRIDE(i, n)
    {
        bad |= nonfinite_at<DT>(x, i);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) {
        atomicExch(flag, 1); /* "*flag = 1" (device.h), whichever block is first */
    }
}

__global__ void unscale_check_kernel(float *x, size_t n, float f, int32_t *flag)
{
    int bad = 0;
    GRID_STRIDE(i, n)
    {
        float v = __fmul_rn(x[i], f);
        x[i] = v;
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) {
        atomicExch(flag, 1);
    }
}

__global__ void sgd_kernel(accel__cu_sgd a)
{
    GRID_STRIDE(i, a.count)
    {
        float p = a.param[i];
        float d = __fadd_rn(__fmul_rn(a.sign, a.grad[i]), __fmul_rn(a.wd, p));
        float u = d;
        if (a.momentum != 0.0f) {
            float b =
                a.first_step ? d : __fadd_rn(__fmul_rn(a.momentum, a.buf[i]), __fmul_rn(a.keep, d));
            a.buf[i] = b;
            u = a.nesterov ? __fadd_rn(d, __fmul_rn(a.momentum, b)) : b;
        }
        a.param[i] = __fsub_rn(p, __fmul_rn(a.lr, u));
    }
}

/* One element of AdamW from its loaded p, grad, exp_avg and exp_avg_sq (vmax, amsgrad's, is
 * read here). CT: the dtype of the compute copy written from the new param in the same pass
 * (BF16, F16: convert_kernel's rounding, without a second kernel reading the master again), or
 * F32 for none. */
template <accel_dtype CT>
__device__ __forceinline__ void adam_one(const accel__adam_coef &c, float p, float gr, float mo,
                                         float vo, float *param, float *m, float *v, float *vmax,
                                         void *compute, size_t i)
{
    float g = __fadd_rn(__fmul_rn(c.sign, gr), __fmul_rn(c.l2, p));
    float decayed = __fmul_rn(p, c.decay);
    /* exp_avg.lerp_(grad, 1 - beta1) */
    float mi = __fadd_rn(mo, __fmul_rn(c.w1, __fsub_rn(g, mo)));
    float vi = __fadd_rn(__fmul_rn(vo, c.beta2), __fmul_rn(__fmul_rn(c.w2, g), g));
    m[i] = mi;
    v[i] = vi;
    float s = vi;
    if (vmax != nullptr) {
        s = vmax[i] > vi ? vmax[i] : vi;
        vmax[i] = s;
    }
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(s), c.bc2_sqrt), c.eps);
    float np = __fsub_rn(decayed, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    param[i] = np;
    if (CT != ACCEL_F32) {
        store<CT>(compute, i, np);
    }
}

/* Four elements of a thread (a grid stride apart) loaded before any is stored, as
 * scale_kernel: the compiler may not move the next element's loads above this one's stores,
 * so one at a time kept 16 bytes a thread in flight (32 KiB an SM at 2048 threads, under what
 * HBM's latency needs); four keep 64. At most 64 registers (ptxas: 63 with the bf16 copy, no
 * spill) for 4 blocks an SM: 64 KiB in flight. The launcher sizes the grid for four elements a
 * thread. The same arithmetic per element: the same bits. */
template <accel_dtype CT>
__global__ void __launch_bounds__(kThreads, 4)
    adam_kernel(accel__adam_coef c, float *param, const float *grad, float *m, float *v,
                float *vmax, void *compute, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        float p[4], g[4], mo[4], vo[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            size_t j = i + u * stride;
            p[u] = param[j];
            g[u] = grad[j];
            mo[u] = m[j];
            vo[u] = v[j];
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            adam_one<CT>(c, p[u], g[u], mo[u], vo[u], param, m, v, vmax, compute, i + u * stride);
        }
    }
    for (; i < n; i += stride) {
        adam_one<CT>(c, param[i], grad[i], m[i], v[i], param, m, v, vmax, compute, i);
    }
}

/* ---- reductions: per-thread sequential, block tree into scratch, one block finishes ---- */

/* Sum of |x|^p; NaN-propagating max of |x|. */
struct PowSum {
    double p;
    __device__ double init() const
    {
        return 0.0;
    }
    __device__ double term(float x) const
    {
        double a = fabs((double)x);
        if (p == 2.0) {
            return __dmul_rn(a, a);
        }
        return p == 1.0 ? a : pow(a, p);
    }
    __device__ double combine(double a, double b) const
    {
        return __dadd_rn(a, b);
    }
    __device__ void finish(double *acc, double r) const
    {
        *acc = __dadd_rn(*acc, r);
    }
};

struct AbsMax {
    __device__ double init() const
    {
        return 0.0;
    }
    __device__ double term(float x) const
    {
        return fabs((double)x);
    }
    __device__ double combine(double a, double b) const
    {
        if (a != a) {
            return a;
        }
        if (b != b) {
            return b;
        }
        return b > a ? b : a;
    }
    __device__ void finish(double *acc, double r) const
    {
        if (r > *acc || r != r) {
            *acc = r; /* a NaN sticks, as torch's inf-norm */
        }
    }
};

/* The fixed tree over one block's values; the result is in sh[0]. */
template <class Op> __device__ void block_tree(const Op &op, double *sh)
{
    for (int w = kThreads / 2; w > 0; w /= 2) {
        __syncthreads();
        if ((int)threadIdx.x < w) {
            sh[threadIdx.x] = op.combine(sh[threadIdx.x], sh[threadIdx.x + w]);
        }
    }
    __syncthreads();
}

template <class Op, accel_dtype DT>
__global__ void reduce_blocks(Op op, const void *x, size_t n, double *partial)
{
    __shared__ double sh[kThreads];
    double r = op.init();
    /* The thread's elements in grid-stride order, four loads in flight at a time (as the
     * scale); combined one by one in that order, so the same bits as a plain loop. */
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        float a = load<DT>(x, i), b = load<DT>(x, i + stride);
        float c = load<DT>(x, i + 2 * stride), d = load<DT>(x, i + 3 * stride);
        r = op.combine(r, op.term(a));
        r = op.combine(r, op.term(b));
        r = op.combine(r, op.term(c));
        r = op.combine(r, op.term(d));
    }
    for (; i < n; i += stride) {
        r = op.combine(r, op.term(load<DT>(x, i)));
    }
    sh[threadIdx.x] = r;
    block_tree(op, sh);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sh[0];
    }
}

template <class Op>
__global__ void reduce_finish(Op op, const double *partial, unsigned n, double *acc)
{
    __shared__ double sh[kThreads];
    double r = op.init();
    for (unsigned i = threadIdx.x; i < n; i += kThreads) {
        r = op.combine(r, partial[i]);
    }
    sh[threadIdx.x] = r;
    block_tree(op, sh);
    if (threadIdx.x == 0) {
        op.finish(acc, sh[0]);
    }
}

template <class Op>
cudaError_t reduce(const Op &op, const void *x, accel_dtype dt, size_t n, double *acc,
                   double *scratch, cudaStream_t s)
{
    unsigned g = red_grid_for(n);
    switch (dt) {
    case ACCEL_F32:
        reduce_blocks<Op, ACCEL_F32><<<g, kThreads, 0, s>>>(op, x, n, scratch);
        break;
    case ACCEL_BF16:
        reduce_blocks<Op, ACCEL_BF16><<<g, kThreads, 0, s>>>(op, x, n, scratch);
        break;
    default:
        reduce_blocks<Op, ACCEL_F16><<<g, kThreads, 0, s>>>(op, x, n, scratch);
        break;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        return e;
    }
    reduce_finish<Op><<<1, kThreads, 0, s>>>(op, scratch, g, acc);
    return cudaGetLastError();
}

template <accel_dtype D>
cudaError_t convert_from(void *dst, const void *src, accel_dtype src_dt, size_t n, cudaStream_t s)
{
    switch (src_dt) {
    case ACCEL_F32:
        convert_kernel<D, ACCEL_F32><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
        break;
    case ACCEL_BF16:
        convert_kernel<D, ACCEL_BF16><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
        break;
    default:
        convert_kernel<D, ACCEL_F16><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
        break;
    }
    return cudaGetLastError();
}

} /* namespace */

extern "C" {

cudaError_t accel__cu_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt,
                              size_t n, cudaStream_t s)
{
    if (dst_dt == src_dt) { /* the bytes, NaN payloads untouched (accel_convert's copy) */
        return cudaMemcpyAsync(dst, src, n * (dst_dt == ACCEL_F32 ? 4 : 2),
                               cudaMemcpyDeviceToDevice, s);
    }
    switch (dst_dt) {
    case ACCEL_F32:
        return convert_from<ACCEL_F32>(dst, src, src_dt, n, s);
    case ACCEL_BF16:
        return convert_from<ACCEL_BF16>(dst, src, src_dt, n, s);
    default:
        return convert_from<ACCEL_F16>(dst, src, src_dt, n, s);
    }
}

cudaError_t accel__cu_scale(float *x, size_t n, float f, cudaStream_t s)
{
    scale_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, f);
    return cudaGetLastError();
}

cudaError_t accel__cu_clamp(float *x, size_t n, float lo, float hi, cudaStream_t s)
{
    clamp_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, lo, hi);
    return cudaGetLastError();
}

cudaError_t accel__cu_pow_sum(const void *x, accel_dtype dt, size_t n, double p, double *acc,
                              double *scratch, cudaStream_t s)
{
    PowSum op;
    op.p = p;
    return reduce(op, x, dt, n, acc, scratch, s);
}

cudaError_t accel__cu_abs_max(const void *x, accel_dtype dt, size_t n, double *acc, double *scratch,
                              cudaStream_t s)
{
    return reduce(AbsMax(), x, dt, n, acc, scratch, s);
}

cudaError_t accel__cu_nonfinite(const void *x, accel_dtype dt, size_t n, int32_t *flag,
                                cudaStream_t s)
{
    switch (dt) {
    case ACCEL_F32:
        nonfinite_kernel<ACCEL_F32><<<grid_for(n), kThreads, 0, s>>>(x, n, flag);
        break;
    case ACCEL_BF16:
        nonfinite_kernel<ACCEL_BF16><<<grid_for(n), kThreads, 0, s>>>(x, n, flag);
        break;
    default:
        nonfinite_kernel<ACCEL_F16><<<grid_for(n), kThreads, 0, s>>>(x, n, flag);
        break;
    }
    return cudaGetLastError();
}

cudaError_t accel__cu_unscale_check(float *x, size_t n, float f, int32_t *flag, cudaStream_t s)
{
    unscale_check_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, f, flag);
    return cudaGetLastError();
}

cudaError_t accel__cu_sgd_step(const accel__cu_sgd *a, cudaStream_t s)
{
    sgd_kernel<<<grid_for(a->count), kThreads, 0, s>>>(*a);
    return cudaGetLastError();
}

cudaError_t accel__cu_adam_step(const accel__adam_coef *c, float *param, const float *grad,
                                float *m, float *v, float *vmax, void *compute,
                                accel_dtype compute_dt, size_t n, cudaStream_t s)
{
    /* Blocks for four elements a thread, so that segments of a few million take the
     * four-at-once loop too (grid_for's one a thread would leave them in the tail). */
    unsigned g = grid_for((n + 3) / 4);
    if (compute == nullptr) {
        adam_kernel<ACCEL_F32><<<g, kThreads, 0, s>>>(*c, param, grad, m, v, vmax, nullptr, n);
    } else if (compute_dt == ACCEL_BF16) {
        adam_kernel<ACCEL_BF16><<<g, kThreads, 0, s>>>(*c, param, grad, m, v, vmax, compute, n);
    } else {
        adam_kernel<ACCEL_F16><<<g, kThreads, 0, s>>>(*c, param, grad, m, v, vmax, compute, n);
    }
    return cudaGetLastError();
}

} /* extern "C" */
