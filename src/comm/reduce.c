/*
 * Reduction kernels for every dtype x op, built three times (scalar, AVX2, AVX-512) from the same
 * C source with __attribute__((target)), the ISA picked once at run time. Each kernel walks the
 * inputs in blocks of BLK elements kept in a local accumulator: a fixed trip count lets the
 * compiler vectorise the loops at -O2, and the accumulator means every output element is
 * combined in rank order and written once, so every ISA gives bit-identical results.
 * Narrow floats (F16, BF16, F8) decode into an f32 block, combine there and round once; the
 * scalar conversions come from core/half.h. F32/F16/BF16, the gradient formats, have
 * register-level AVX2/AVX-512 kernels in reduce_x86.c instead.
 */
#include <stdint.h>
#include <string.h>

#include "comm/reduce.h"
#include "base/cpu.h"
#include "base/half.h"
#include "base/base.h"
#include "reduce_x86.h"

#define HAVE_X86 ACCEL__HAVE_X86
#if HAVE_X86
#define ATTR_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

#define BLK 256
#define INLINE static inline __attribute__((always_inline))

typedef void (*reduce_fn)(void *out, void *out2, const void *const *in, int n_in, size_t count,
                          accel_reduce_op op, int avg_div);

/* ---- element-wise combines over one block (inlined into each ISA's driver) ---- */

/* Floats combine in their own type. MAX/MIN are written as the x86 max/min instructions
 * behave (the accumulator wins ties and unordered compares) so vector and scalar code agree. */
#define DEF_FLOAT_BLOCK(tn, T)                                                                     \
    INLINE void tn##_block(T *acc, const void *const *in, int n_in, size_t i, size_t m,            \
                           accel_reduce_op op, int avg_div)                                        \
    {                                                                                              \
        memcpy(acc, (const T *)in[0] + i, m * sizeof(T));                                          \
        for (int k = 1; k < n_in; k++) {                                                           \
            const T *p = (const T *)in[k] + i;                                                     \
            switch (op) {                                                                          \
            case ACCEL_SUM:                                                                        \
            case ACCEL_AVG:                                                                        \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = acc[j] + p[j];                                                        \
                }                                                                                  \
                break;                                                                             \
            case ACCEL_PROD:                                                                       \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = acc[j] * p[j];                                                        \
                }                                                                                  \
                break;                                                                             \
            case ACCEL_MAX:                                                                        \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = p[j] > acc[j] ? p[j] : acc[j];                                        \
                }                                                                                  \
                break;                                                                             \
            case ACCEL_MIN:                                                                        \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = p[j] < acc[j] ? p[j] : acc[j];                                        \
                }                                                                                  \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
        if (op == ACCEL_AVG) {                                                                     \
            const T d = (T)avg_div;                                                                \
            for (size_t j = 0; j < m; j++) {                                                       \
                acc[j] = acc[j] / d;                                                               \
            }                                                                                      \
        }                                                                                          \
    }

/* Integers: SUM/PROD in the unsigned type W (wraps, no signed-overflow UB), AVG sums in 64
 * bits so that the mean of in-range values is exact, then truncates toward zero. */
#define DEF_INT_BLOCK(tn, T, W)                                                                    \
    INLINE void tn##_block(T *acc, const void *const *in, int n_in, size_t i, size_t m,            \
                           accel_reduce_op op, int avg_div)                                        \
    {                                                                                              \
        if (op == ACCEL_AVG) {                                                                     \
            int64_t wide[BLK];                                                                     \
            const T *p0 = (const T *)in[0] + i;                                                    \
            for (size_t j = 0; j < m; j++) {                                                       \
                wide[j] = (int64_t)p0[j];                                                          \
            }                                                                                      \
            for (int k = 1; k < n_in; k++) {                                                       \
                const T *p = (const T *)in[k] + i;                                                 \
                for (size_t j = 0; j < m; j++) {                                                   \
                    wide[j] = (int64_t)((uint64_t)wide[j] + (uint64_t)(int64_t)p[j]);              \
                }                                                                                  \
            }                                                                                      \
            for (size_t j = 0; j < m; j++) {                                                       \
                acc[j] = (T)(wide[j] / avg_div);                                                   \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        memcpy(acc, (const T *)in[0] + i, m * sizeof(T));                                          \
        for (int k = 1; k < n_in; k++) {                                                           \
            const T *p = (const T *)in[k] + i;                                                     \
            switch (op) {                                                                          \
            case ACCEL_SUM:                                                                        \
            case ACCEL_AVG:                                                                        \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = (T)((W)acc[j] + (W)p[j]);                                             \
                }                                                                                  \
                break;                                                                             \
            case ACCEL_PROD:                                                                       \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = (T)((W)acc[j] * (W)p[j]);                                             \
                }                                                                                  \
                break;                                                                             \
            case ACCEL_MAX:                                                                        \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = p[j] > acc[j] ? p[j] : acc[j];                                        \
                }                                                                                  \
                break;                                                                             \
            case ACCEL_MIN:                                                                        \
                for (size_t j = 0; j < m; j++) {                                                   \
                    acc[j] = p[j] < acc[j] ? p[j] : acc[j];                                        \
                }                                                                                  \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    }

DEF_FLOAT_BLOCK(f32, float)
DEF_FLOAT_BLOCK(f64, double)
DEF_INT_BLOCK(i8, int8_t, uint32_t)
DEF_INT_BLOCK(u8, uint8_t, uint32_t)
DEF_INT_BLOCK(i16, int16_t, uint32_t)
DEF_INT_BLOCK(u16, uint16_t, uint32_t)
DEF_INT_BLOCK(i32, int32_t, uint32_t)
DEF_INT_BLOCK(i64, int64_t, uint64_t)

/* BOOL is logic on 0/1 (any non-zero byte reads as true): OR for SUM/MAX, AND for MIN/PROD. */
INLINE void bool_block(uint8_t *acc, const void *const *in, int n_in, size_t i, size_t m,
                       accel_reduce_op op, int avg_div)
{
    (void)avg_div;
    const uint8_t *p0 = (const uint8_t *)in[0] + i;
    for (size_t j = 0; j < m; j++) {
        acc[j] = (uint8_t)(p0[j] != 0);
    }
    int is_or = op == ACCEL_SUM || op == ACCEL_MAX;
    for (int k = 1; k < n_in; k++) {
        const uint8_t *p = (const uint8_t *)in[k] + i;
        if (is_or) {
            for (size_t j = 0; j < m; j++) {
                acc[j] = (uint8_t)(acc[j] | (p[j] != 0));
            }
        } else {
            for (size_t j = 0; j < m; j++) {
                acc[j] = (uint8_t)(acc[j] & (p[j] != 0));
            }
        }
    }
}

/* A driver for a type whose accumulator is the type itself: full blocks take the branch with
 * the constant BLK (vectorised), the tail the generic one. */
#define DEF_PLAIN_DRIVER(tn, T, isa, ATTR)                                                         \
    static ATTR void reduce_##tn##_##isa(void *out, void *out2, const void *const *in, int n_in,   \
                                         size_t count, accel_reduce_op op, int avg_div)            \
    {                                                                                              \
        T acc[BLK];                                                                                \
        for (size_t i = 0; i < count; i += BLK) {                                                  \
            size_t m = count - i < BLK ? count - i : BLK;                                          \
            if (m == BLK) {                                                                        \
                tn##_block(acc, in, n_in, i, BLK, op, avg_div);                                    \
            } else {                                                                               \
                tn##_block(acc, in, n_in, i, m, op, avg_div);                                      \
            }                                                                                      \
            memcpy((T *)out + i, acc, m * sizeof(T));                                              \
            if (out2 != NULL) {                                                                    \
                memcpy((T *)out2 + i, acc, m * sizeof(T));                                         \
            }                                                                                      \
        }                                                                                          \
    }

/* ---- narrow floats: decode to f32, combine, round once ---- */

/* Combines an already-decoded block `tmp` into `acc` (the f32 rules of DEF_FLOAT_BLOCK). */
INLINE void f32_combine(float *acc, const float *p, size_t m, accel_reduce_op op)
{
    switch (op) {
    case ACCEL_SUM:
    case ACCEL_AVG:
        for (size_t j = 0; j < m; j++) {
            acc[j] = acc[j] + p[j];
        }
        break;
    case ACCEL_PROD:
        for (size_t j = 0; j < m; j++) {
            acc[j] = acc[j] * p[j];
        }
        break;
    case ACCEL_MAX:
        for (size_t j = 0; j < m; j++) {
            acc[j] = p[j] > acc[j] ? p[j] : acc[j];
        }
        break;
    case ACCEL_MIN:
        for (size_t j = 0; j < m; j++) {
            acc[j] = p[j] < acc[j] ? p[j] : acc[j];
        }
        break;
    }
}

INLINE void f32_divide(float *acc, size_t m, int avg_div)
{
    const float d = (float)avg_div;
    for (size_t j = 0; j < m; j++) {
        acc[j] = acc[j] / d;
    }
}

/* Scalar converters (the reference path; also the tails of the vector ones). */
#define DEF_SCALAR_CVT(tn, S, to_f32, from_f32)                                                    \
    INLINE void dec_##tn##_scalar(float *dst, const S *src, size_t n)                              \
    {                                                                                              \
        for (size_t j = 0; j < n; j++) {                                                           \
            dst[j] = to_f32(src[j]);                                                               \
        }                                                                                          \
    }                                                                                              \
    INLINE void enc_##tn##_scalar(S *dst, const float *src, size_t n)                              \
    {                                                                                              \
        for (size_t j = 0; j < n; j++) {                                                           \
            dst[j] = from_f32(src[j]);                                                             \
        }                                                                                          \
    }
DEF_SCALAR_CVT(f16, uint16_t, accel__f16_to_f32, accel__f32_to_f16)
DEF_SCALAR_CVT(bf16, uint16_t, accel__bf16_to_f32, accel__f32_to_bf16)
DEF_SCALAR_CVT(e4m3, uint8_t, accel__f8e4m3_to_f32, accel__f32_to_f8e4m3)
DEF_SCALAR_CVT(e5m2, uint8_t, accel__f8e5m2_to_f32, accel__f32_to_f8e5m2)

/* Wire formats over f32 data (accel__reduce_wire): a "decode" rounds each element through the
 * 16-bit format, and so does the "encode" of the result, both staying f32. */
#define DEF_WIRE_CVT(tn, to_f32, from_f32)                                                         \
    INLINE void dec_##tn##_scalar(float *dst, const float *src, size_t n)                          \
    {                                                                                              \
        for (size_t j = 0; j < n; j++) {                                                           \
            dst[j] = to_f32(from_f32(src[j]));                                                     \
        }                                                                                          \
    }                                                                                              \
    INLINE void enc_##tn##_scalar(float *dst, const float *src, size_t n)                          \
    {                                                                                              \
        dec_##tn##_scalar(dst, src, n);                                                            \
    }
DEF_WIRE_CVT(wbf16, accel__bf16_to_f32, accel__f32_to_bf16)
DEF_WIRE_CVT(wf16, accel__f16_to_f32, accel__f32_to_f16)

/* FP8 has no vector converter: every ISA decodes it with the scalar one (the f32 combine
 * itself is still vectorised). */
#define dec_e4m3_avx2 dec_e4m3_scalar
#define enc_e4m3_avx2 enc_e4m3_scalar
#define dec_e5m2_avx2 dec_e5m2_scalar
#define enc_e5m2_avx2 enc_e5m2_scalar
#define dec_e4m3_avx512 dec_e4m3_scalar
#define enc_e4m3_avx512 enc_e4m3_scalar
#define dec_e5m2_avx512 dec_e5m2_scalar
#define enc_e5m2_avx512 enc_e5m2_scalar

#define HALF_BLOCK(tn, S, isa, M)                                                                  \
    do {                                                                                           \
        dec_##tn##_##isa(acc, (const S *)in[0] + i, (M));                                          \
        for (int k = 1; k < n_in; k++) {                                                           \
            dec_##tn##_##isa(tmp, (const S *)in[k] + i, (M));                                      \
            f32_combine(acc, tmp, (M), op);                                                        \
        }                                                                                          \
        if (op == ACCEL_AVG) {                                                                     \
            f32_divide(acc, (M), avg_div);                                                         \
        }                                                                                          \
        enc_##tn##_##isa((S *)out + i, acc, (M));                                                  \
    } while (0)

#define DEF_HALF_DRIVER(tn, S, isa, ATTR)                                                          \
    static ATTR void reduce_##tn##_##isa(void *out, void *out2, const void *const *in, int n_in,   \
                                         size_t count, accel_reduce_op op, int avg_div)            \
    {                                                                                              \
        float acc[BLK], tmp[BLK];                                                                  \
        for (size_t i = 0; i < count; i += BLK) {                                                  \
            size_t m = count - i < BLK ? count - i : BLK;                                          \
            if (m == BLK) {                                                                        \
                HALF_BLOCK(tn, S, isa, BLK);                                                       \
            } else {                                                                               \
                HALF_BLOCK(tn, S, isa, m);                                                         \
            }                                                                                      \
            if (out2 != NULL) {                                                                    \
                memcpy((S *)out2 + i, (S *)out + i, m * sizeof(S));                                \
            }                                                                                      \
        }                                                                                          \
    }

/* ---- instantiate every driver for every ISA ---- */

/* Every ISA instantiates the generic drivers; F32/F16/BF16 have hand-written x86 kernels
 * (reduce_x86.c), so only the scalar build of those three comes from here. */
#define DEF_COMMON_DRIVERS(isa, ATTR)                                                              \
    DEF_PLAIN_DRIVER(f64, double, isa, ATTR)                                                       \
    DEF_PLAIN_DRIVER(i8, int8_t, isa, ATTR)                                                        \
    DEF_PLAIN_DRIVER(u8, uint8_t, isa, ATTR)                                                       \
    DEF_PLAIN_DRIVER(i16, int16_t, isa, ATTR)                                                      \
    DEF_PLAIN_DRIVER(u16, uint16_t, isa, ATTR)                                                     \
    DEF_PLAIN_DRIVER(i32, int32_t, isa, ATTR)                                                      \
    DEF_PLAIN_DRIVER(i64, int64_t, isa, ATTR)                                                      \
    DEF_PLAIN_DRIVER(bool, uint8_t, isa, ATTR)                                                     \
    DEF_HALF_DRIVER(e4m3, uint8_t, isa, ATTR)                                                      \
    DEF_HALF_DRIVER(e5m2, uint8_t, isa, ATTR)

#define ATTR_NONE
DEF_COMMON_DRIVERS(scalar, ATTR_NONE)
DEF_PLAIN_DRIVER(f32, float, scalar, ATTR_NONE)
DEF_HALF_DRIVER(f16, uint16_t, scalar, ATTR_NONE)
DEF_HALF_DRIVER(bf16, uint16_t, scalar, ATTR_NONE)
DEF_HALF_DRIVER(wbf16, float, scalar, ATTR_NONE)
DEF_HALF_DRIVER(wf16, float, scalar, ATTR_NONE)
#if HAVE_X86
DEF_COMMON_DRIVERS(avx2, ATTR_AVX2)
DEF_COMMON_DRIVERS(avx512, ATTR_AVX512)
#define reduce_f32_avx2 accel__reduce_f32_avx2
#define reduce_f16_avx2 accel__reduce_f16_avx2
#define reduce_bf16_avx2 accel__reduce_bf16_avx2
#define reduce_f32_avx512 accel__reduce_f32_avx512
#define reduce_f16_avx512 accel__reduce_f16_avx512
#define reduce_bf16_avx512 accel__reduce_bf16_avx512
#endif

#define DRIVER_TABLE(isa)                                                                          \
    {                                                                                              \
        [ACCEL_F32] = reduce_f32_##isa, [ACCEL_F64] = reduce_f64_##isa,                            \
        [ACCEL_F16] = reduce_f16_##isa, [ACCEL_BF16] = reduce_bf16_##isa,                          \
        [ACCEL_F8_E4M3] = reduce_e4m3_##isa, [ACCEL_F8_E5M2] = reduce_e5m2_##isa,                  \
        [ACCEL_I8] = reduce_i8_##isa, [ACCEL_U8] = reduce_u8_##isa,                                \
        [ACCEL_I16] = reduce_i16_##isa, [ACCEL_U16] = reduce_u16_##isa,                            \
        [ACCEL_I32] = reduce_i32_##isa, [ACCEL_I64] = reduce_i64_##isa,                            \
        [ACCEL_BOOL] = reduce_bool_##isa,                                                          \
    }

static const reduce_fn drivers[ACCEL__ISA_COUNT][ACCEL_DTYPE_COUNT] = {
    DRIVER_TABLE(scalar),
#if HAVE_X86
    DRIVER_TABLE(avx2),
    DRIVER_TABLE(avx512),
#else
    DRIVER_TABLE(scalar),
    DRIVER_TABLE(scalar),
#endif
};

/* Wire drivers: [isa][0] through BF16, [isa][1] through F16. */
static const reduce_fn wire_drivers[ACCEL__ISA_COUNT][2] = {
    {reduce_wbf16_scalar, reduce_wf16_scalar},
#if HAVE_X86
    {accel__reduce_wbf16_avx2, accel__reduce_wf16_avx2},
    {accel__reduce_wbf16_avx512, accel__reduce_wf16_avx512},
#else
    {reduce_wbf16_scalar, reduce_wf16_scalar},
    {reduce_wbf16_scalar, reduce_wf16_scalar},
#endif
};

/* ---- run-time selection ---- */

int accel__isa_available(accel__isa isa)
{
    switch (isa) {
    case ACCEL__ISA_SCALAR:
        return 1;
#if HAVE_X86
    case ACCEL__ISA_AVX2:
        return accel__cpu_has(ACCEL__CPU_AVX2) && accel__cpu_has(ACCEL__CPU_FMA) &&
               accel__cpu_has(ACCEL__CPU_F16C);
    case ACCEL__ISA_AVX512:
        return accel__isa_available(ACCEL__ISA_AVX2) && accel__cpu_has(ACCEL__CPU_AVX512F) &&
               accel__cpu_has(ACCEL__CPU_AVX512BW) && accel__cpu_has(ACCEL__CPU_AVX512VL) &&
               accel__cpu_has(ACCEL__CPU_AVX512DQ);
#endif
    default:
        return 0;
    }
}

/* Resolved on first use; a race between threads computes the same value twice, harmlessly. */
static _Atomic int best_isa = -1;

accel__isa accel__isa_best(void)
{
    int b = best_isa;
    if (b < 0) {
        b = ACCEL__ISA_SCALAR;
        for (int i = ACCEL__ISA_COUNT - 1; i > 0; i--) {
            if (accel__isa_available((accel__isa)i)) {
                b = i;
                break;
            }
        }
        best_isa = b;
    }
    return (accel__isa)b;
}

const char *accel__isa_name(accel__isa isa)
{
    static const char *names[ACCEL__ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < ACCEL__ISA_COUNT ? names[isa] : "unknown";
}

int accel__reduce_supported(accel_dtype dt)
{
    return (unsigned)dt < ACCEL_DTYPE_COUNT && drivers[ACCEL__ISA_SCALAR][dt] != NULL;
}

void accel__reduce_isa(accel__isa isa, accel_dtype dt, accel_reduce_op op, void *out, void *out2,
                       const void *const *in, int n_in, size_t count, int avg_div)
{
    ACCEL_ASSERT((unsigned)isa < ACCEL__ISA_COUNT && accel__reduce_supported(dt));
    ACCEL_ASSERT(n_in >= 1 && avg_div >= 1);
    if (count == 0) {
        return;
    }
    drivers[isa][dt](out, out2, in, n_in, count, op, avg_div);
}

void accel__reduce(accel_dtype dt, accel_reduce_op op, void *out, void *out2, const void *const *in,
                   int n_in, size_t count, int avg_div)
{
    accel__reduce_isa(accel__isa_best(), dt, op, out, out2, in, n_in, count, avg_div);
}

void accel__reduce_wire_isa(accel__isa isa, accel_dtype wire, accel_reduce_op op, void *out,
                            void *out2, const void *const *in, int n_in, size_t count, int avg_div)
{
    ACCEL_ASSERT((unsigned)isa < ACCEL__ISA_COUNT && (wire == ACCEL_BF16 || wire == ACCEL_F16));
    ACCEL_ASSERT(n_in >= 1 && avg_div >= 1);
    if (count == 0) {
        return;
    }
    wire_drivers[isa][wire == ACCEL_F16](out, out2, in, n_in, count, op, avg_div);
}

void accel__reduce_wire(accel_dtype wire, accel_reduce_op op, void *out, void *out2,
                        const void *const *in, int n_in, size_t count, int avg_div)
{
    accel__reduce_wire_isa(accel__isa_best(), wire, op, out, out2, in, n_in, count, avg_div);
}

void accel__copy_nt(void *dst, const void *src, size_t nbytes)
{
#if HAVE_X86
    if (accel__isa_best() >= ACCEL__ISA_AVX2) {
        accel__copy_nt_avx2(dst, src, nbytes);
        return;
    }
#endif
    memcpy(dst, src, nbytes);
}
