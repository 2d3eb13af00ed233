/*
 * The CUDA language for the emulator build (tests/cuemu/cuemu.h), force-included into every
 * *.cu after scripts/cuemu-launch.sed rewrote its launches: the .cu is then plain C++17 that g++
 * compiles and runs on the CPU (kernel.cc schedules it).
 *
 * What a kernel sees: threadIdx, blockIdx, blockDim, gridDim, warpSize; __shared__ is a
 * function-static variable (blocks run one after another, so one copy is right), dynamic shared
 * memory a buffer of the launch's smem bytes (0xFF, a NaN, at the start of each block; over 48 KiB
 * only up to what cudaFuncSetAttribute's MaxDynamicSharedMemorySize allowed the kernel, at most
 * sm_90's 227 KiB less its static shared memory, which the emulator does not count);
 * barriers (__syncthreads*, __syncwarp), warp shuffles (__shfl*_sync) and votes (__ballot_sync,
 * __any_sync, __all_sync) switch between the block's threads, which are fibers; atomics are
 * plain read-modify-writes (threads never switch inside one); device math is the host's, exact
 * where the GPU's fast intrinsics approximate (-ffp-contract=off stands for nvcc's -fmad=false).
 *
 * A launch `k<<<grid, block, smem, stream>>>(args)` arrives here as
 * `CUEMU_LAUNCH((k), grid, block, smem, stream)(args)`: the parameters are converted to the
 * kernel's parameter types once (as CUDA copies them at launch), pointers among them are checked
 * to be device memory, and kernel.cc runs the grid before the launch returns.
 *
 * Environment: ACCEL_CUEMU_ORDER=reverse runs threads and blocks last to first (a kernel whose
 * result changes has a race); ACCEL_CUEMU_STACK_KIB (64) is each thread's stack.
 * Not provided (a kernel using them does not compile): cooperative groups, __activemask,
 * __match_*_sync / __reduce_*_sync, textures and surfaces, __CUDA_ARCH__ device paths, dynamic
 * parallelism; __constant__ is an ordinary global.
 */
#ifndef ACCEL_CUEMU_KERNEL_H
#define ACCEL_CUEMU_KERNEL_H

#ifndef __cplusplus
#error "cuemu/kernel.h is for the rewritten .cu files (C++17)"
#endif

/* The toolkit's headers first: they declare the qualifiers as empty for a host compiler, and
 * cudaDeviceProp::warpSize must be parsed before warpSize below exists. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cuemu/cuemu.h"

/* ---- qualifiers ---- */

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__

namespace cuemu
{

/* What a thread waits at (kernel.cc's scheduler and its messages). */
enum op_kind {
    OP_SYNCTHREADS,
    OP_SYNCTHREADS_COUNT,
    OP_SYNCTHREADS_AND,
    OP_SYNCTHREADS_OR,
    OP_SYNCWARP,
    OP_SHFL,
    OP_SHFL_UP,
    OP_SHFL_DOWN,
    OP_SHFL_XOR,
    OP_BALLOT,
    OP_ANY,
    OP_ALL,
};

/* The running thread's index and its block's geometry; outside a kernel all zero. */
extern const uint3 *g_thread_idx;
extern uint3 g_block_idx;
extern dim3 g_block_dim, g_grid_dim;
/* The launch's dynamic shared memory (its smem bytes, 0xFF at the start of each block): what
 * the launch rewrite makes of `extern __shared__ T name[];`. */
extern char *g_dynamic_shared;

/* A block-wide barrier; the __syncthreads_* reductions' result (OP_SYNCTHREADS: 0). */
int block_barrier(op_kind op, int pred, const char *file, int line);
/* __syncwarp, __ballot_sync / __any_sync / __all_sync (the ballot's mask, or 0/1). */
unsigned warp_vote(op_kind op, unsigned mask, int pred, const char *file, int line);
/* A shuffle of nbytes (<= 16): *out = the source lane's *in (0xFF bytes when the source lane
 * takes no part, as its value is undefined on a GPU). */
void warp_shfl(op_kind op, unsigned mask, const void *in, void *out, size_t nbytes, int arg,
               int width, const char *file, int line);

/* One launch: launch_check.cc checks the configuration, kernel.cc runs every block, calling
 * body(ctx) as each thread, and holds cuemu_lock for the whole launch. */
struct launch_site {
    const char *kernel; /* as the launch spelled it */
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const void *func; /* the kernel, as cudaFuncSetAttribute names it */
};
/* launch_check.cc: 0 when the launch may run; otherwise it recorded the error
 * (cuemu_set_error). */
int launch_check(const launch_site &site);
/* launch_check.cc, the arguments: pointer i (nullptr or device memory, else an error naming it
 * and the kernel). */
int check_pointer_arg(const launch_site &site, int index, const void *p);
void launch_run(const launch_site &site, void (*body)(void *), void *ctx);
/* The kernel's name in messages: launch_site::kernel without the parentheses the launch
 * rewrite adds (kernel.cc). */
struct kernel_name {
    char s[256];
    explicit kernel_name(const char *k);
};

template <class T> int check_arg(const launch_site &site, int index, const T &v)
{
    if constexpr (std::is_pointer<T>::value && std::is_object<std::remove_pointer_t<T>>::value) {
        return check_pointer_arg(site, index, (const void *)v);
    } else {
        (void)site;
        (void)index;
        (void)v;
        return 0;
    }
}

template <class... P> class launcher
{
  public:
    launcher(void (*kernel)(P...), const launch_site &site) : kernel_(kernel), site_(site)
    {
    }

    /* The launch proper: CUDA copies the arguments, converted to the parameters' types. */
    template <class... A> void operator()(A &&...args) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with a wrong argument count");
        if (launch_check(site_) != 0) {
            return;
        }
        call c{kernel_, std::tuple<P...>(std::forward<A>(args)...)};
        if (check_all(c.args, std::index_sequence_for<P...>{}) != 0) {
            return;
        }
        launch_run(site_, &run_thread, &c);
    }

  private:
    struct call {
        void (*kernel)(P...);
        std::tuple<P...> args;
    };

    template <size_t... I> int check_all(const std::tuple<P...> &a, std::index_sequence<I...>) const
    {
        int bad = 0;
        /* Every argument in order; the first bad one stops the launch. */
        ((bad = bad != 0 ? bad : check_arg(site_, (int)I, std::get<I>(a))), ...);
        return bad;
    }

    /* Each thread gets its own copy of the parameters (std::apply passes them by value). */
    static void run_thread(void *ctx)
    {
        call *c = static_cast<call *>(ctx);
        std::apply(c->kernel, c->args);
    }

    void (*kernel_)(P...);
    launch_site site_;
};

template <class... P>
launcher<P...> make_launcher(void (*kernel)(P...), const char *name, const char *file, int line,
                             dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0)
{
    return launcher<P...>(kernel, launch_site{name, file, line, grid, block, smem, stream,
                                              reinterpret_cast<const void *>(kernel)});
}

} // namespace cuemu

/* scripts/cuemu-launch.sed writes k<<<cfg>>>(args) as CUEMU_LAUNCH((k), cfg)(args). */
#define CUEMU_LAUNCH(kernel, ...)                                                                  \
    ::cuemu::make_launcher(kernel, #kernel, __FILE__, __LINE__, __VA_ARGS__)

/* ---- built-in variables ---- */

#define threadIdx (*::cuemu::g_thread_idx)
#define blockIdx (static_cast<const uint3 &>(::cuemu::g_block_idx))
#define blockDim (static_cast<const dim3 &>(::cuemu::g_block_dim))
#define gridDim (static_cast<const dim3 &>(::cuemu::g_grid_dim))
constexpr int warpSize = 32;

/* ---- barriers, votes, shuffles (file and line name the call in deadlock messages) ---- */

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    ::cuemu::block_barrier(::cuemu::OP_SYNCTHREADS, 0, file, line);
}

inline int __syncthreads_count(int pred, const char *file = __builtin_FILE(),
                               int line = __builtin_LINE())
{
    return ::cuemu::block_barrier(::cuemu::OP_SYNCTHREADS_COUNT, pred, file, line);
}

inline int __syncthreads_and(int pred, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE())
{
    return ::cuemu::block_barrier(::cuemu::OP_SYNCTHREADS_AND, pred, file, line);
}

inline int __syncthreads_or(int pred, const char *file = __builtin_FILE(),
                            int line = __builtin_LINE())
{
    return ::cuemu::block_barrier(::cuemu::OP_SYNCTHREADS_OR, pred, file, line);
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE())
{
    ::cuemu::warp_vote(::cuemu::OP_SYNCWARP, mask, 0, file, line);
}

inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE())
{
    return ::cuemu::warp_vote(::cuemu::OP_BALLOT, mask, pred, file, line);
}

inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE())
{
    return (int)::cuemu::warp_vote(::cuemu::OP_ANY, mask, pred, file, line);
}

inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE())
{
    return (int)::cuemu::warp_vote(::cuemu::OP_ALL, mask, pred, file, line);
}

namespace cuemu
{
template <class T>
T shfl(op_kind op, unsigned mask, T var, int arg, int width, const char *file, int line)
{
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 16,
                  "cuemu: a shuffled type must be trivially copyable, 16 bytes at most");
    T out = var;
    warp_shfl(op, mask, &var, &out, sizeof(T), arg, width, file, line);
    return out;
}
} // namespace cuemu

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return ::cuemu::shfl(::cuemu::OP_SHFL, mask, var, src_lane, width, file, line);
}

template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return ::cuemu::shfl(::cuemu::OP_SHFL_UP, mask, var, (int)delta, width, file, line);
}

template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return ::cuemu::shfl(::cuemu::OP_SHFL_DOWN, mask, var, (int)delta, width, file, line);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return ::cuemu::shfl(::cuemu::OP_SHFL_XOR, mask, var, lane_mask, width, file, line);
}

/* Memory fences order nothing here: one thread runs at a time. */
inline void __threadfence(void)
{
}
inline void __threadfence_block(void)
{
}
template <class T> T __ldg(const T *p)
{
    return *p;
}

/* ---- atomics: no thread switch can fall inside a read-modify-write ---- */

template <class T, class U> T atomicAdd(T *p, U v)
{
    T old = *p;
    *p = (T)(old + (T)v);
    return old;
}
template <class T, class U> T atomicSub(T *p, U v)
{
    T old = *p;
    *p = (T)(old - (T)v);
    return old;
}
template <class T, class U> T atomicExch(T *p, U v)
{
    T old = *p;
    *p = (T)v;
    return old;
}
template <class T, class U> T atomicMax(T *p, U v)
{
    T old = *p;
    *p = (T)v > old ? (T)v : old;
    return old;
}
template <class T, class U> T atomicMin(T *p, U v)
{
    T old = *p;
    *p = (T)v < old ? (T)v : old;
    return old;
}
template <class T, class U> T atomicAnd(T *p, U v)
{
    T old = *p;
    *p = old & (T)v;
    return old;
}
template <class T, class U> T atomicOr(T *p, U v)
{
    T old = *p;
    *p = old | (T)v;
    return old;
}
template <class T, class U> T atomicXor(T *p, U v)
{
    T old = *p;
    *p = old ^ (T)v;
    return old;
}
template <class T, class U, class V> T atomicCAS(T *p, U compare, V v)
{
    T old = *p;
    if (old == (T)compare) {
        *p = (T)v;
    }
    return old;
}
inline unsigned atomicInc(unsigned *p, unsigned limit)
{
    unsigned old = *p;
    *p = old >= limit ? 0u : old + 1u;
    return old;
}
inline unsigned atomicDec(unsigned *p, unsigned limit)
{
    unsigned old = *p;
    *p = (old == 0u || old > limit) ? limit : old - 1u;
    return old;
}

/* ---- device math: each is IEEE on the CPU, round-to-nearest as the _rn forms ---- */

inline float __uint_as_float(unsigned x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
inline unsigned __float_as_uint(float f)
{
    unsigned x;
    memcpy(&x, &f, sizeof x);
    return x;
}
inline float __int_as_float(int x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
inline int __float_as_int(float f)
{
    int x;
    memcpy(&x, &f, sizeof x);
    return x;
}
inline double __longlong_as_double(long long x)
{
    double d;
    memcpy(&d, &x, sizeof d);
    return d;
}
inline long long __double_as_longlong(double d)
{
    long long x;
    memcpy(&x, &d, sizeof x);
    return x;
}
/* Integer to float conversions round to nearest under the default rounding mode. */
inline float __uint2float_rn(unsigned x)
{
    return (float)x;
}
inline float __int2float_rn(int x)
{
    return (float)x;
}
inline float __double2float_rn(double x)
{
    return (float)x;
}
inline int __float2int_rn(float x)
{
    return (int)lrintf(x);
}
inline int __float2int_rz(float x)
{
    return (int)x;
}
inline float __fadd_rn(float a, float b)
{
    return a + b;
}
inline float __fsub_rn(float a, float b)
{
    return a - b;
}
inline float __fmul_rn(float a, float b)
{
    return a * b;
}
inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}
inline float __frcp_rn(float a)
{
    return 1.0f / a;
}
inline float __fmaf_rn(float a, float b, float c)
{
    return fmaf(a, b, c);
}
inline double __dadd_rn(double a, double b)
{
    return a + b;
}
inline double __dsub_rn(double a, double b)
{
    return a - b;
}
inline double __dmul_rn(double a, double b)
{
    return a * b;
}
inline double __ddiv_rn(double a, double b)
{
    return a / b;
}
inline double __dsqrt_rn(double a)
{
    return sqrt(a);
}
inline double __fma_rn(double a, double b, double c)
{
    return fma(a, b, c);
}
/* The fast intrinsics are approximations on a GPU; here they are the exact functions. */
inline float __fdividef(float a, float b)
{
    return a / b;
}
inline float __expf(float x)
{
    return expf(x);
}
inline float __logf(float x)
{
    return logf(x);
}
inline float __sinf(float x)
{
    return sinf(x);
}
inline float __cosf(float x)
{
    return cosf(x);
}
inline float __powf(float a, float b)
{
    return powf(a, b);
}
inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}
inline double rsqrt(double x)
{
    return 1.0 / sqrt(x);
}
inline float __saturatef(float x)
{
    return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x != x ? 0.0f : x));
}
/* CUDA's min / max overloads: the usual arithmetic conversions, fmin / fmax for floats. */
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
std::common_type_t<A, B> min(A a, B b)
{
    using T = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point<T>::value) {
        return (T)fmin((double)a, (double)b);
    } else {
        return (T)a < (T)b ? (T)a : (T)b;
    }
}
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
std::common_type_t<A, B> max(A a, B b)
{
    using T = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point<T>::value) {
        return (T)fmax((double)a, (double)b);
    } else {
        return (T)a > (T)b ? (T)a : (T)b;
    }
}
inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x)
{
    return __builtin_popcountll(x);
}
inline int __clz(int x)
{
    return x == 0 ? 32 : __builtin_clz((unsigned)x);
}
inline int __ffs(int x)
{
    return __builtin_ffs(x);
}

#include "cuemu/wmma.h"

#endif /* ACCEL_CUEMU_KERNEL_H */
