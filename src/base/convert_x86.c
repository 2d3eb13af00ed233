/*
 * x86-64 kernels for f32 <-> bf16 / f16: AVX2 + F16C and AVX-512 (F, BW, VL), compiled with
 * per-function target attributes and only called after convert.c's runtime check.
 *
 * Invariant: bit-identical to half.h. bf16 uses integer RNE (add 0x7fff + lsb) rather than the
 * AVX-512 BF16 instruction VCVTNEPS2BF16, because that one always flushes subnormal inputs and
 * outputs to zero; f16 uses VCVTPS2PH / VCVTPH2PS, which round to nearest even under the
 * immediate, ignore FTZ/DAZ, and quieten NaN keeping the top payload bits, exactly as half.h.
 * Loop tails go through the scalar code (AVX2) or masked loads and stores (AVX-512).
 */
#include "base/half.h"
#include "base/convert.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

const int accel__cvt_have_x86 = 1;

#define T_AVX2 __attribute__((target("avx2,f16c")))
#define T_AVX512 __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl")))

/* ---- AVX2 + F16C ---- */

/* 8 floats -> 8 bf16 codes in the low 16 bits of each 32-bit lane. */
T_AVX2 static inline __m256i bf16_round8(__m256i x)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i lsb = _mm256_and_si256(hi, one);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
    /* |x| > inf as signed int32 is exactly "NaN" (the masked value is non-negative). */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, absmask), inf);
    __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, quiet, nan);
}

T_AVX2 static void avx2_f32_to_bf16(uint16_t *dst, const float *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i + 8)));
        /* packus works per 128-bit lane: a0 b0 a1 b1, so restore the order with a permute. */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    for (; i < count; i++) {
        dst[i] = accel__f32_to_bf16(src[i]);
    }
}

T_AVX2 static void avx2_bf16_to_f32(float *dst, const uint16_t *src, size_t count)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i qbit = _mm256_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        __m256i x = _mm256_slli_epi32(h, 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, absmask), inf);
        x = _mm256_or_si256(x, _mm256_and_si256(nan, qbit));
        _mm256_storeu_si256((__m256i *)(dst + i), x);
    }
    for (; i < count; i++) {
        dst[i] = accel__bf16_to_f32(src[i]);
    }
}

T_AVX2 static void avx2_f32_to_f16(uint16_t *dst, const float *src, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < count; i++) {
        dst[i] = accel__f32_to_f16(src[i]);
    }
}

T_AVX2 static void avx2_f16_to_f32(float *dst, const uint16_t *src, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    }
    for (; i < count; i++) {
        dst[i] = accel__f16_to_f32(src[i]);
    }
}

const accel__cvt_kernels accel__cvt_avx2_kernels = {
    "avx2+f16c", avx2_f32_to_bf16, avx2_bf16_to_f32, avx2_f32_to_f16, avx2_f16_to_f32,
};

/* ---- AVX-512 ---- */

/* Lanes [0, n) of a 16-lane block, n <= 16. */
T_AVX512 static inline __mmask16 tail_mask(size_t n)
{
    return (__mmask16)((1u << n) - 1u);
}

T_AVX512 static inline __m512i bf16_round16(__m512i x)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    __m512i hi = _mm512_srli_epi32(x, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, absmask), inf);
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

T_AVX512 static void avx512_f32_to_bf16(uint16_t *dst, const float *src, size_t count)
{
    size_t i = 0;
    for (; i + 32 <= count; i += 32) {
        __m512i a = bf16_round16(_mm512_loadu_si512(src + i));
        __m512i b = bf16_round16(_mm512_loadu_si512(src + i + 16));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(a));
        _mm256_storeu_si256((__m256i *)(dst + i + 16), _mm512_cvtepi32_epi16(b));
    }
    for (; i < count; i += 16) { /* at most one full block, then the masked tail */
        size_t n = count - i < 16 ? count - i : 16;
        __mmask16 m = tail_mask(n);
        __m512i r = bf16_round16(_mm512_maskz_loadu_epi32(m, src + i));
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, r);
    }
}

/* 16 bf16 codes (zero-extended to 32-bit lanes) -> 16 f32 bit patterns, NaN quietened. */
T_AVX512 static inline __m512i bf16_widen16(__m512i h)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    __m512i x = _mm512_slli_epi32(h, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, absmask), inf);
    return _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x400000));
}

/* Full blocks use plain loads and stores; only the last partial block is masked. */
T_AVX512 static void avx512_bf16_to_f32(float *dst, const uint16_t *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, bf16_widen16(h));
    }
    if (i < count) {
        __mmask16 m = tail_mask(count - i);
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_epi32(dst + i, m, bf16_widen16(h));
    }
}

T_AVX512 static void avx512_f32_to_f16(uint16_t *dst, const float *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    if (i < count) {
        __mmask16 m = tail_mask(count - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

T_AVX512 static void avx512_f16_to_f32(float *dst, const uint16_t *src, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16) {
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    }
    if (i < count) {
        __mmask16 m = tail_mask(count - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

const accel__cvt_kernels accel__cvt_avx512_kernels = {
    "avx512", avx512_f32_to_bf16, avx512_bf16_to_f32, avx512_f32_to_f16, avx512_f16_to_f32,
};

#else /* not x86-64 */

const int accel__cvt_have_x86 = 0;
const accel__cvt_kernels accel__cvt_avx2_kernels = {"avx2+f16c", 0, 0, 0, 0};
const accel__cvt_kernels accel__cvt_avx512_kernels = {"avx512", 0, 0, 0, 0};

#endif
