/*
 * Bulk dtype conversion: accel_convert (any pair of dtypes), stochastic rounding to bf16, the
 * scalar f32 <-> f16 / bf16 kernels and the runtime choice between them and the x86 kernels of
 * convert_x86.c.
 *
 * Invariant: whatever kernel runs, the bits are those of the scalar RNE reference in half.h;
 * float -> float conversions never round twice (wider sources go through f32 with round-to-odd,
 * which makes the second rounding exact).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/cpu.h"
#include "base/half.h"
#include "base/base.h"
#include "base/convert.h"

/* ---- scalar kernels ---- */

static void scalar_f32_to_bf16(uint16_t *dst, const float *src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = accel__f32_to_bf16(src[i]);
    }
}

static void scalar_bf16_to_f32(float *dst, const uint16_t *src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = accel__bf16_to_f32(src[i]);
    }
}

static void scalar_f32_to_f16(uint16_t *dst, const float *src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = accel__f32_to_f16(src[i]);
    }
}

static void scalar_f16_to_f32(float *dst, const uint16_t *src, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        dst[i] = accel__f16_to_f32(src[i]);
    }
}

static const accel__cvt_kernels scalar_kernels = {
    "scalar", scalar_f32_to_bf16, scalar_bf16_to_f32, scalar_f32_to_f16, scalar_f16_to_f32,
};

/* ---- dispatch ---- */

static int isa_available(accel__cvt_isa isa)
{
    switch (isa) {
    case ACCEL__CVT_SCALAR:
        return 1;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case ACCEL__CVT_AVX2:
        return accel__cvt_have_x86 && accel__cpu_has(ACCEL__CPU_AVX2) &&
               accel__cpu_has(ACCEL__CPU_F16C);
    case ACCEL__CVT_AVX512:
        return accel__cvt_have_x86 && accel__cpu_has(ACCEL__CPU_AVX2) &&
               accel__cpu_has(ACCEL__CPU_F16C) && accel__cpu_has(ACCEL__CPU_AVX512F) &&
               accel__cpu_has(ACCEL__CPU_AVX512BW) && accel__cpu_has(ACCEL__CPU_AVX512VL);
#endif
    default:
        return 0;
    }
}

const accel__cvt_kernels *accel__cvt_kernels_for(accel__cvt_isa isa)
{
    if (!isa_available(isa)) {
        return NULL;
    }
    switch (isa) {
    case ACCEL__CVT_AVX2:
        return &accel__cvt_avx2_kernels;
    case ACCEL__CVT_AVX512:
        return &accel__cvt_avx512_kernels;
    default:
        return &scalar_kernels;
    }
}

/* The chosen table; NULL until first use. Racing first uses compute the same answer. */
static _Atomic(const accel__cvt_kernels *) chosen;

const accel__cvt_kernels *accel__cvt_best(void)
{
    const accel__cvt_kernels *k = atomic_load_explicit(&chosen, memory_order_acquire);
    if (k == NULL) {
        for (int isa = ACCEL__CVT_ISA_COUNT - 1; isa >= 0 && k == NULL; isa--) {
            k = accel__cvt_kernels_for((accel__cvt_isa)isa);
        }
        atomic_store_explicit(&chosen, k, memory_order_release);
    }
    return k;
}

int accel__cvt_force(accel__cvt_isa isa)
{
    if (isa == ACCEL__CVT_ISA_COUNT) {
        atomic_store_explicit(&chosen, NULL, memory_order_release);
        return 1;
    }
    const accel__cvt_kernels *k = accel__cvt_kernels_for(isa);
    if (k == NULL) {
        return 0;
    }
    atomic_store_explicit(&chosen, k, memory_order_release);
    return 1;
}

void accel__f32_to_bf16_n(uint16_t *dst, const float *src, size_t count)
{
    accel__cvt_best()->f32_to_bf16(dst, src, count);
}
void accel__bf16_to_f32_n(float *dst, const uint16_t *src, size_t count)
{
    accel__cvt_best()->bf16_to_f32(dst, src, count);
}
void accel__f32_to_f16_n(uint16_t *dst, const float *src, size_t count)
{
    accel__cvt_best()->f32_to_f16(dst, src, count);
}
void accel__f16_to_f32_n(float *dst, const uint16_t *src, size_t count)
{
    accel__cvt_best()->f16_to_f32(dst, src, count);
}

/* ---- accel_convert: the general path ---- */

/* The real floats other than F64 (and the sub-byte ones, which have no conversions). */
static int is_narrow_float(accel_dtype dt)
{
    return accel_dtype_is_float(dt) && dt != ACCEL_F64 && accel_dtype_nbytes(dt) > 0;
}

/* Dtypes with element-wise conversions: all but C64 and the packed sub-byte ones. */
static int convertible(accel_dtype dt)
{
    return dt != ACCEL_C64 && accel_dtype_nbytes(dt) > 0;
}

/* src[0, n) of a float dtype other than F64 -> f32 (exact). */
static void to_f32(float *dst, const void *src, accel_dtype dt, size_t n)
{
    const accel__cvt_kernels *k = accel__cvt_best();
    switch (dt) {
    case ACCEL_F32:
        memcpy(dst, src, n * sizeof *dst);
        break;
    case ACCEL_F16:
        k->f16_to_f32(dst, src, n);
        break;
    case ACCEL_BF16:
        k->bf16_to_f32(dst, src, n);
        break;
    default: /* the one-byte formats */
        for (size_t i = 0; i < n; i++) {
            uint8_t v = ((const uint8_t *)src)[i];
            dst[i] = dt == ACCEL_F8_E4M3       ? accel__f8e4m3_to_f32(v)
                     : dt == ACCEL_F8_E5M2     ? accel__f8e5m2_to_f32(v)
                     : dt == ACCEL_F8_E8M0     ? accel__f8e8m0_to_f32(v)
                     : dt == ACCEL_F8_E4M3FNUZ ? accel__f8fnuz_to_f32(v, 3, 8)
                                               : accel__f8fnuz_to_f32(v, 2, 16);
        }
        break;
    }
}

/* f32 src[0, n) -> a float dtype other than F64, RNE. */
static void from_f32(void *dst, accel_dtype dt, const float *src, size_t n)
{
    const accel__cvt_kernels *k = accel__cvt_best();
    switch (dt) {
    case ACCEL_F32:
        memcpy(dst, src, n * sizeof *src);
        break;
    case ACCEL_F16:
        k->f32_to_f16(dst, src, n);
        break;
    case ACCEL_BF16:
        k->f32_to_bf16(dst, src, n);
        break;
    default: /* the one-byte formats */
        for (size_t i = 0; i < n; i++) {
            float f = src[i];
            ((uint8_t *)dst)[i] = dt == ACCEL_F8_E4M3       ? accel__f32_to_f8e4m3(f)
                                  : dt == ACCEL_F8_E5M2     ? accel__f32_to_f8e5m2(f)
                                  : dt == ACCEL_F8_E8M0     ? accel__f32_to_f8e8m0(f)
                                  : dt == ACCEL_F8_E4M3FNUZ ? accel__f32_to_f8fnuz(f, 3, 8)
                                                            : accel__f32_to_f8fnuz(f, 2, 16);
        }
        break;
    }
}

/* f64 -> f32 rounded to odd: truncate toward zero and set the last bit when inexact. Rounding
 * that result once more to any format with at least two fewer significand bits gives the
 * correctly rounded (RNE) value of the original double, so f64 -> f16 is not double-rounded. */
static float round_to_odd_f32(double d)
{
    if (isnan(d)) {
        return (float)d;
    }
    float f = (float)d;
    if ((double)f == d || isinf(d)) {
        return f;
    }
    if (fabs((double)f) > fabs(d)) {
        f = nextafterf(f, 0.0f); /* now truncated toward zero (may be FLT_MAX for a huge d) */
    }
    return accel__bits_f32(accel__f32_bits(f) | 1u);
}

/* Integers pass through 128 bits, so U64 and I64 both fit with room for saturation. */
__extension__ typedef __int128 wide;

/* Element i of an integer or BOOL buffer. */
static wide load_int(const void *p, accel_dtype dt, size_t i)
{
    switch (dt) {
    case ACCEL_I8:
        return ((const int8_t *)p)[i];
    case ACCEL_U8:
        return ((const uint8_t *)p)[i];
    case ACCEL_I16:
        return ((const int16_t *)p)[i];
    case ACCEL_U16:
        return ((const uint16_t *)p)[i];
    case ACCEL_I32:
        return ((const int32_t *)p)[i];
    case ACCEL_U32:
        return ((const uint32_t *)p)[i];
    case ACCEL_I64:
        return ((const int64_t *)p)[i];
    case ACCEL_U64:
        return ((const uint64_t *)p)[i];
    default: /* ACCEL_BOOL */
        return ((const uint8_t *)p)[i] != 0;
    }
}

static void int_range(accel_dtype dt, wide *lo, wide *hi)
{
    switch (dt) {
    case ACCEL_I8:
        *lo = INT8_MIN, *hi = INT8_MAX;
        break;
    case ACCEL_U8:
        *lo = 0, *hi = UINT8_MAX;
        break;
    case ACCEL_I16:
        *lo = INT16_MIN, *hi = INT16_MAX;
        break;
    case ACCEL_U16:
        *lo = 0, *hi = UINT16_MAX;
        break;
    case ACCEL_I32:
        *lo = INT32_MIN, *hi = INT32_MAX;
        break;
    case ACCEL_U32:
        *lo = 0, *hi = UINT32_MAX;
        break;
    case ACCEL_U64:
        *lo = 0, *hi = UINT64_MAX;
        break;
    case ACCEL_BOOL:
        *lo = 0, *hi = 1;
        break;
    default:
        *lo = INT64_MIN, *hi = INT64_MAX;
        break;
    }
}

static void store_int(void *p, accel_dtype dt, size_t i, wide v)
{
    wide lo, hi;
    int_range(dt, &lo, &hi);
    if (dt == ACCEL_BOOL) {
        v = v != 0;
    }
    v = v < lo ? lo : v > hi ? hi : v;
    switch (dt) {
    case ACCEL_I8:
        ((int8_t *)p)[i] = (int8_t)v;
        break;
    case ACCEL_U8:
    case ACCEL_BOOL:
        ((uint8_t *)p)[i] = (uint8_t)v;
        break;
    case ACCEL_I16:
        ((int16_t *)p)[i] = (int16_t)v;
        break;
    case ACCEL_U16:
        ((uint16_t *)p)[i] = (uint16_t)v;
        break;
    case ACCEL_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    case ACCEL_U32:
        ((uint32_t *)p)[i] = (uint32_t)v;
        break;
    case ACCEL_U64:
        ((uint64_t *)p)[i] = (uint64_t)v;
        break;
    default:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    }
}

/* Float -> integer: truncate toward zero, saturate, NaN -> 0; BOOL: nonzero (NaN too) -> 1. */
static wide float_to_int(double d, accel_dtype dt)
{
    if (dt == ACCEL_BOOL) {
        return d != 0.0 || isnan(d);
    }
    if (isnan(d)) {
        return 0;
    }
    wide lo, hi;
    int_range(dt, &lo, &hi);
    d = trunc(d);
    if (d <= (double)lo) {
        return lo;
    }
    if (d >= (double)hi) { /* (double)INT64_MAX is 2^63: anything at or past it saturates */
        return hi;
    }
    return (wide)d;
}

/* An integer as a double rounded to odd (exact when it fits in 53 bits): rounding that once
 * more to any narrower float gives the correctly rounded value of the integer itself. */
static double int_to_odd_double(wide v)
{
    double d = (double)v;
    if ((wide)d == v) {
        return d;
    }
    if ((d > 0) == ((wide)d > v)) { /* rounded away from zero: step back toward it */
        d = nextafter(d, 0.0);
    }
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    u |= 1;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Element i of any float dtype as a double (exact). */
static double load_float(const void *p, accel_dtype dt, size_t i)
{
    if (dt == ACCEL_F64) {
        return ((const double *)p)[i];
    }
    float f;
    to_f32(&f, (const unsigned char *)p + i * accel_dtype_nbytes(dt), dt, 1);
    return f;
}

static void store_float(void *p, accel_dtype dt, size_t i, double d)
{
    if (dt == ACCEL_F64) {
        ((double *)p)[i] = d;
    } else if (dt == ACCEL_F32) {
        ((float *)p)[i] = (float)d;
    } else {
        float f = round_to_odd_f32(d);
        from_f32((unsigned char *)p + i * accel_dtype_nbytes(dt), dt, &f, 1);
    }
}

accel_status accel_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt,
                           size_t count)
{
    size_t dbits = accel_dtype_bits(dst_dt), sbits = accel_dtype_bits(src_dt);
    if (dbits == 0 || sbits == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_convert: %s %d is not a dtype",
                             dbits == 0 ? "dst_dt" : "src_dt",
                             dbits == 0 ? (int)dst_dt : (int)src_dt);
    }
    if (dst_dt != src_dt && (!convertible(src_dt) || !convertible(dst_dt))) {
        accel_dtype bad = convertible(src_dt) ? dst_dt : src_dt;
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "accel_convert: no conversion from %s to %s: %s",
                             accel_dtype_name(src_dt), accel_dtype_name(dst_dt),
                             bad == ACCEL_C64 ? "a complex value has no real counterpart"
                                              : "safetensors does not fix how sub-byte values are "
                                                "packed");
    }
    if (count == 0) {
        return ACCEL_OK;
    }
    if (dst == NULL || src == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_convert: %s is NULL",
                             dst == NULL ? "dst" : "src");
    }
    if (dst_dt == src_dt) {
        if (count * dbits % 8 != 0) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_convert: %zu elements of %s do not fill whole bytes", count,
                                 accel_dtype_name(dst_dt));
        }
        memmove(dst, src, count * dbits / 8); /* bit copy: NaN payloads stay as they are */
        return ACCEL_OK;
    }
    size_t dsize = dbits / 8, ssize = sbits / 8;
    const unsigned char *s = src;
    unsigned char *d = dst;
    if (d < s + count * ssize && s < d + count * dsize) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_convert: dst and src overlap");
    }
    int sf = accel_dtype_is_float(src_dt), df = accel_dtype_is_float(dst_dt);
    if (is_narrow_float(src_dt) && is_narrow_float(dst_dt)) {
        if (src_dt == ACCEL_F32) {
            from_f32(dst, dst_dt, src, count);
        } else if (dst_dt == ACCEL_F32) {
            to_f32(dst, src, src_dt, count);
        } else {
            /* Narrow -> narrow through an f32 block on the stack (exact widening first). */
            enum { BLOCK = 1024 };
            float buf[BLOCK];
            for (size_t i = 0; i < count; i += BLOCK) {
                size_t n = count - i < BLOCK ? count - i : BLOCK;
                to_f32(buf, s + i * ssize, src_dt, n);
                from_f32(d + i * dsize, dst_dt, buf, n);
            }
        }
    } else if (sf && df) { /* one side is F64 */
        for (size_t i = 0; i < count; i++) {
            store_float(dst, dst_dt, i, load_float(src, src_dt, i));
        }
    } else if (sf) { /* float -> integer */
        for (size_t i = 0; i < count; i++) {
            store_int(dst, dst_dt, i, float_to_int(load_float(src, src_dt, i), dst_dt));
        }
    } else if (df) { /* integer -> float, one rounding: F64 directly, others through odd */
        for (size_t i = 0; i < count; i++) {
            wide v = load_int(src, src_dt, i);
            store_float(dst, dst_dt, i, dst_dt == ACCEL_F64 ? (double)v : int_to_odd_double(v));
        }
    } else { /* integer -> integer: saturating */
        for (size_t i = 0; i < count; i++) {
            store_int(dst, dst_dt, i, load_int(src, src_dt, i));
        }
    }
    return ACCEL_OK;
}

/* ---- stochastic rounding ---- */

/* splitmix64: tiny, full-period over the 64-bit state, good enough for rounding noise. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

accel_status accel_f32_to_bf16_stochastic(uint16_t *dst, const float *src, size_t count,
                                          uint64_t *rng_state)
{
    if (count > 0 && (dst == NULL || src == NULL || rng_state == NULL)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_f32_to_bf16_stochastic: %s is NULL",
                             dst == NULL   ? "dst"
                             : src == NULL ? "src"
                                           : "rng_state");
    }
    uint64_t s = count > 0 ? *rng_state : 0, bits = 0;
    for (size_t i = 0; i < count; i++) {
        if ((i & 3) == 0) {
            bits = splitmix64(&s); /* four 16-bit draws per 64-bit number */
        }
        uint32_t x = accel__f32_bits(src[i]);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
            dst[i] = (uint16_t)((x >> 16) | 0x40u);
        } else if ((x & 0x7fffffffu) == 0x7f800000u) {
            dst[i] = (uint16_t)(x >> 16); /* inf stays inf (the noise would not change it) */
        } else {
            /* Adding uniform noise in [0, 2^16) to the dropped bits rounds up with probability
             * dropped / 2^16, so the result is unbiased. Rounding up past the largest finite
             * bf16 gives inf, as it must for values beyond it. */
            dst[i] = (uint16_t)((x + (uint32_t)(bits & 0xffffu)) >> 16);
        }
        bits >>= 16;
    }
    if (count > 0) {
        *rng_state = s;
    }
    return ACCEL_OK;
}
