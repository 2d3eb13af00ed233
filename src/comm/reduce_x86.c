/*
 * Register-level AVX2 / AVX-512 reduction kernels for the float formats that carry gradients
 * (F32, BF16, F16, and F32 through a BF16 / F16 wire format): each step loads four vectors from
 * every input, combines them in registers (converting narrow formats to f32 on load and rounding
 * once on store) and stores once, so the kernel runs at memory speed. The generic block kernels in
 * reduce.c cover every other type. Results are bit-identical to the scalar kernels: same combine
 * order, same min/max operand order, RNE conversions that match core/half.h (checked by
 * tests/unit/test_reduce.c).
 */
#include "reduce_x86.h"

#if ACCEL__HAVE_X86
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/half.h"

#define ATTR_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* ---- scalar element access (tails), the reference semantics ---- */

INLINE float sld_f32(const void *p, size_t i)
{
    return ((const float *)p)[i];
}
INLINE void sst_f32(void *p, size_t i, float v)
{
    ((float *)p)[i] = v;
}
INLINE float sld_bf16(const void *p, size_t i)
{
    return accel__bf16_to_f32(((const uint16_t *)p)[i]);
}
INLINE void sst_bf16(void *p, size_t i, float v)
{
    ((uint16_t *)p)[i] = accel__f32_to_bf16(v);
}
INLINE float sld_f16(const void *p, size_t i)
{
    return accel__f16_to_f32(((const uint16_t *)p)[i]);
}
INLINE void sst_f16(void *p, size_t i, float v)
{
    ((uint16_t *)p)[i] = accel__f32_to_f16(v);
}

/* Wire formats (accel__reduce_wire): f32 in memory, rounded through bf16 / f16 on every load
 * and every store. */
INLINE float sld_wbf16(const void *p, size_t i)
{
    return accel__bf16_to_f32(accel__f32_to_bf16(((const float *)p)[i]));
}
INLINE void sst_wbf16(void *p, size_t i, float v)
{
    ((float *)p)[i] = accel__bf16_to_f32(accel__f32_to_bf16(v));
}
INLINE float sld_wf16(const void *p, size_t i)
{
    return accel__f16_to_f32(accel__f32_to_f16(((const float *)p)[i]));
}
INLINE void sst_wf16(void *p, size_t i, float v)
{
    ((float *)p)[i] = accel__f16_to_f32(accel__f32_to_f16(v));
}

INLINE float scomb(float acc, float p, accel_reduce_op op)
{
    switch (op) {
    case ACCEL_PROD:
        return acc * p;
    case ACCEL_MAX:
        return p > acc ? p : acc;
    case ACCEL_MIN:
        return p < acc ? p : acc;
    default:
        return acc + p;
    }
}

/* ---- AVX2: 8 lanes ---- */

INLINE ATTR_AVX2 __m256 ld_f32_avx2(const void *p, size_t i)
{
    return _mm256_loadu_ps((const float *)p + i);
}
INLINE ATTR_AVX2 void st_f32_avx2(void *p, size_t i, __m256 v)
{
    _mm256_storeu_ps((float *)p + i, v);
}
INLINE ATTR_AVX2 __m256 ld_bf16_avx2(const void *p, size_t i)
{
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
/* RNE in integers; NaN keeps its top bits with the quiet bit set, as accel__f32_to_bf16. */
INLINE ATTR_AVX2 void st_bf16_avx2(void *p, size_t i, __m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i r = _mm256_add_epi32(
        x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    /* packus packs within 128-bit lanes; gather the two low quadwords. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_castsi256_si128(packed));
}
INLINE ATTR_AVX2 __m256 ld_f16_avx2(const void *p, size_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
INLINE ATTR_AVX2 void st_f16_avx2(void *p, size_t i, __m256 v)
{
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}
/* v rounded to bf16 (RNE; NaN quietened as accel__f32_to_bf16) and widened back, in
 * registers: x + 0x7fff + (bit 16 of x), low half cleared. NaNs (rare) take a branch, so the
 * common path is five integer operations and a compare. */
INLINE ATTR_AVX2 __m256 rt_bf16_avx2(__m256 v)
{
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256i x = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), hi_mask);
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
        __m256i q = _mm256_or_si256(_mm256_and_si256(x, hi_mask), _mm256_set1_epi32(0x400000));
        r = _mm256_blendv_epi8(r, q, _mm256_castps_si256(nan));
    }
    return _mm256_castsi256_ps(r);
}
INLINE ATTR_AVX2 __m256 rt_f16_avx2(__m256 v)
{
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
INLINE ATTR_AVX2 __m256 ld_wbf16_avx2(const void *p, size_t i)
{
    return rt_bf16_avx2(_mm256_loadu_ps((const float *)p + i));
}
INLINE ATTR_AVX2 void st_wbf16_avx2(void *p, size_t i, __m256 v)
{
    _mm256_storeu_ps((float *)p + i, rt_bf16_avx2(v));
}
INLINE ATTR_AVX2 __m256 ld_wf16_avx2(const void *p, size_t i)
{
    return rt_f16_avx2(_mm256_loadu_ps((const float *)p + i));
}
INLINE ATTR_AVX2 void st_wf16_avx2(void *p, size_t i, __m256 v)
{
    _mm256_storeu_ps((float *)p + i, rt_f16_avx2(v));
}
INLINE ATTR_AVX2 __m256 comb_avx2(__m256 acc, __m256 p, accel_reduce_op op)
{
    switch (op) {
    case ACCEL_PROD:
        return _mm256_mul_ps(acc, p);
    case ACCEL_MAX:
        return _mm256_max_ps(p, acc); /* p > acc ? p : acc */
    case ACCEL_MIN:
        return _mm256_min_ps(p, acc); /* p < acc ? p : acc */
    default:
        return _mm256_add_ps(acc, p);
    }
}
#define set1_avx2 _mm256_set1_ps
#define div_avx2 _mm256_div_ps

/* ---- AVX-512: 16 lanes ---- */

INLINE ATTR_AVX512 __m512 ld_f32_avx512(const void *p, size_t i)
{
    return _mm512_loadu_ps((const float *)p + i);
}
INLINE ATTR_AVX512 void st_f32_avx512(void *p, size_t i, __m512 v)
{
    _mm512_storeu_ps((float *)p + i, v);
}
INLINE ATTR_AVX512 __m512 ld_bf16_avx512(const void *p, size_t i)
{
    __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}
INLINE ATTR_AVX512 void st_bf16_avx512(void *p, size_t i, __m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(x, 16);
    __m512i r = _mm512_add_epi32(
        x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtepi32_epi16(r));
}
INLINE ATTR_AVX512 __m512 ld_f16_avx512(const void *p, size_t i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}
INLINE ATTR_AVX512 void st_f16_avx512(void *p, size_t i, __m512 v)
{
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), h);
}
INLINE ATTR_AVX512 __m512 rt_bf16_avx512(__m512 v)
{
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    __m512i x = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), hi_mask);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0)) {
        /* (x & hi_mask) | 0x400000: the top half with the quiet bit */
        r = _mm512_mask_mov_epi32(
            r, nan, _mm512_ternarylogic_epi32(x, hi_mask, _mm512_set1_epi32(0x400000), 0xea));
    }
    return _mm512_castsi512_ps(r);
}
INLINE ATTR_AVX512 __m512 rt_f16_avx512(__m512 v)
{
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
INLINE ATTR_AVX512 __m512 ld_wbf16_avx512(const void *p, size_t i)
{
    return rt_bf16_avx512(_mm512_loadu_ps((const float *)p + i));
}
INLINE ATTR_AVX512 void st_wbf16_avx512(void *p, size_t i, __m512 v)
{
    _mm512_storeu_ps((float *)p + i, rt_bf16_avx512(v));
}
INLINE ATTR_AVX512 __m512 ld_wf16_avx512(const void *p, size_t i)
{
    return rt_f16_avx512(_mm512_loadu_ps((const float *)p + i));
}
INLINE ATTR_AVX512 void st_wf16_avx512(void *p, size_t i, __m512 v)
{
    _mm512_storeu_ps((float *)p + i, rt_f16_avx512(v));
}
INLINE ATTR_AVX512 __m512 comb_avx512(__m512 acc, __m512 p, accel_reduce_op op)
{
    switch (op) {
    case ACCEL_PROD:
        return _mm512_mul_ps(acc, p);
    case ACCEL_MAX:
        return _mm512_max_ps(p, acc);
    case ACCEL_MIN:
        return _mm512_min_ps(p, acc);
    default:
        return _mm512_add_ps(acc, p);
    }
}
#define set1_avx512 _mm512_set1_ps
#define div_avx512 _mm512_div_ps

/*
 * The kernel: 4 vectors per step from every input, then single vectors, then scalar. `op` is a
 * constant in each instantiation (the switch below), so the combine folds to one instruction.
 */
#define DEF_FAST(fmt, isa, ATTR, VEC, W)                                                           \
    INLINE ATTR void fast_##fmt##_##isa##_op(void *out, void *out2, const void *const *in,         \
                                             int n_in, size_t count, accel_reduce_op op,           \
                                             int avg_div)                                          \
    {                                                                                              \
        const VEC d = set1_##isa((float)avg_div);                                                  \
        size_t i = 0;                                                                              \
        for (; i + 4 * (W) <= count; i += 4 * (W)) {                                               \
            VEC a0 = ld_##fmt##_##isa(in[0], i), a1 = ld_##fmt##_##isa(in[0], i + (W));            \
            VEC a2 = ld_##fmt##_##isa(in[0], i + 2 * (W)),                                         \
                a3 = ld_##fmt##_##isa(in[0], i + 3 * (W));                                         \
            for (int k = 1; k < n_in; k++) {                                                       \
                const void *p = in[k];                                                             \
                a0 = comb_##isa(a0, ld_##fmt##_##isa(p, i), op);                                   \
                a1 = comb_##isa(a1, ld_##fmt##_##isa(p, i + (W)), op);                             \
                a2 = comb_##isa(a2, ld_##fmt##_##isa(p, i + 2 * (W)), op);                         \
                a3 = comb_##isa(a3, ld_##fmt##_##isa(p, i + 3 * (W)), op);                         \
            }                                                                                      \
            if (op == ACCEL_AVG) {                                                                 \
                a0 = div_##isa(a0, d);                                                             \
                a1 = div_##isa(a1, d);                                                             \
                a2 = div_##isa(a2, d);                                                             \
                a3 = div_##isa(a3, d);                                                             \
            }                                                                                      \
            st_##fmt##_##isa(out, i, a0);                                                          \
            st_##fmt##_##isa(out, i + (W), a1);                                                    \
            st_##fmt##_##isa(out, i + 2 * (W), a2);                                                \
            st_##fmt##_##isa(out, i + 3 * (W), a3);                                                \
            if (out2 != NULL) {                                                                    \
                st_##fmt##_##isa(out2, i, a0);                                                     \
                st_##fmt##_##isa(out2, i + (W), a1);                                               \
                st_##fmt##_##isa(out2, i + 2 * (W), a2);                                           \
                st_##fmt##_##isa(out2, i + 3 * (W), a3);                                           \
            }                                                                                      \
        }                                                                                          \
        for (; i + (W) <= count; i += (W)) {                                                       \
            VEC a = ld_##fmt##_##isa(in[0], i);                                                    \
            for (int k = 1; k < n_in; k++) {                                                       \
                a = comb_##isa(a, ld_##fmt##_##isa(in[k], i), op);                                 \
            }                                                                                      \
            if (op == ACCEL_AVG) {                                                                 \
                a = div_##isa(a, d);                                                               \
            }                                                                                      \
            st_##fmt##_##isa(out, i, a);                                                           \
            if (out2 != NULL) {                                                                    \
                st_##fmt##_##isa(out2, i, a);                                                      \
            }                                                                                      \
        }                                                                                          \
        for (; i < count; i++) {                                                                   \
            float a = sld_##fmt(in[0], i);                                                         \
            for (int k = 1; k < n_in; k++) {                                                       \
                a = scomb(a, sld_##fmt(in[k], i), op);                                             \
            }                                                                                      \
            if (op == ACCEL_AVG) {                                                                 \
                a = a / (float)avg_div;                                                            \
            }                                                                                      \
            sst_##fmt(out, i, a);                                                                  \
            if (out2 != NULL) {                                                                    \
                sst_##fmt(out2, i, a);                                                             \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    ATTR void accel__reduce_##fmt##_##isa(void *out, void *out2, const void *const *in, int n_in,  \
                                          size_t count, accel_reduce_op op, int avg_div)           \
    {                                                                                              \
        switch (op) {                                                                              \
        case ACCEL_SUM:                                                                            \
            fast_##fmt##_##isa##_op(out, out2, in, n_in, count, ACCEL_SUM, avg_div);               \
            break;                                                                                 \
        case ACCEL_AVG:                                                                            \
            fast_##fmt##_##isa##_op(out, out2, in, n_in, count, ACCEL_AVG, avg_div);               \
            break;                                                                                 \
        case ACCEL_PROD:                                                                           \
            fast_##fmt##_##isa##_op(out, out2, in, n_in, count, ACCEL_PROD, avg_div);              \
            break;                                                                                 \
        case ACCEL_MAX:                                                                            \
            fast_##fmt##_##isa##_op(out, out2, in, n_in, count, ACCEL_MAX, avg_div);               \
            break;                                                                                 \
        case ACCEL_MIN:                                                                            \
            fast_##fmt##_##isa##_op(out, out2, in, n_in, count, ACCEL_MIN, avg_div);               \
            break;                                                                                 \
        }                                                                                          \
    }

DEF_FAST(f32, avx2, ATTR_AVX2, __m256, 8)
DEF_FAST(bf16, avx2, ATTR_AVX2, __m256, 8)
DEF_FAST(f16, avx2, ATTR_AVX2, __m256, 8)
DEF_FAST(f32, avx512, ATTR_AVX512, __m512, 16)
DEF_FAST(bf16, avx512, ATTR_AVX512, __m512, 16)
DEF_FAST(f16, avx512, ATTR_AVX512, __m512, 16)
DEF_FAST(wbf16, avx2, ATTR_AVX2, __m256, 8)
DEF_FAST(wf16, avx2, ATTR_AVX2, __m256, 8)
DEF_FAST(wbf16, avx512, ATTR_AVX512, __m512, 16)
DEF_FAST(wf16, avx512, ATTR_AVX512, __m512, 16)

#endif /* ACCEL__HAVE_X86 */

#if ACCEL__HAVE_X86
/* Streaming copy: the destination lines are written without being read first (no RFO) and do
 * not displace the cache, which pays for outputs larger than the last-level cache. */
__attribute__((target("avx2"))) void accel__copy_nt_avx2(void *dst, const void *src, size_t nbytes)
{
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 31u);
    if (head > nbytes) {
        head = nbytes;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    nbytes -= head;
    for (; nbytes >= 128; nbytes -= 128, d += 128, s += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), c);
        _mm256_stream_si256((__m256i *)(d + 96), e);
    }
    memcpy(d, s, nbytes);
    _mm_sfence();
}
#endif
