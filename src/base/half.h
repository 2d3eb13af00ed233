/*
 * Private scalar conversions between f32 and the narrow float formats (IEEE f16, bfloat16,
 * OCP FP8 E4M3 "fn" and E5M2, the FNUZ FP8 variants and the MX scale E8M0). These are the reference
 * path: the vectorised bulk converters in src/base/convert*.c must produce bit-identical results,
 * and the tests check them against an independent double-precision reference.
 *
 * Rules shared by every function here:
 *   - Narrowing rounds to nearest, ties to even (RNE), computed in integer arithmetic, so the
 *     result does not depend on the FPU rounding mode or on FTZ/DAZ flags.
 *   - Subnormals are produced and consumed exactly (never flushed), signed zeros keep the sign.
 *   - NaN always yields a quiet NaN with the same sign: the quiet bit is set and the payload
 *     keeps its top bits (truncated when narrowing). A quiet NaN therefore round-trips through
 *     f32 unchanged; a signalling NaN comes back quietened.
 *   - Bit casts go through memcpy (no type-punning UB); compilers turn them into moves.
 */
#ifndef ACCEL_BASE_HALF_H
#define ACCEL_BASE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t accel__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float accel__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * Rounds the finite, non-negative f32 with bits `ax` to a binary format with `mbits` stored
 * mantissa bits and exponent bias `bias` (biased exponent 0 = subnormals), RNE. Returns the
 * magnitude code (exponent << mbits | mantissa) WITHOUT any range clamp: a code past the
 * format's largest finite value means "overflowed", and each caller decides (inf or saturate).
 * A mantissa carry correctly bumps the exponent, and a subnormal rounding up to the smallest
 * normal yields exactly its code.
 */
static inline uint32_t accel__round_f32_bits(uint32_t ax, int mbits, int bias)
{
    int e32 = (int)(ax >> 23);
    uint32_t m32 = ax & 0x7fffffu;
    if (e32 == 0) {
        /* f32 subnormals (< 2^-126) are far below half the smallest subnormal of every target
         * routed here (f16 2^-24, E5M2 2^-16, E4M3 2^-9), so they round to zero. */
        return 0;
    }
    int te = e32 - 127 + bias; /* biased target exponent */
    uint32_t code, rem, half;
    int shift;
    if (te >= 1) {
        shift = 23 - mbits;
        code = ((uint32_t)te << mbits) | (m32 >> shift);
    } else {
        /* Target subnormal: value = (1.m32) * 2^(e32-127); the unit of the last place is
         * 2^(1-bias-mbits), so the code is the full significand shifted right by this much. */
        shift = 24 - mbits - te;
        m32 |= 0x800000u;
        if (shift > 24) {
            return 0; /* below half of the smallest subnormal (significand < 2^24) */
        }
        code = m32 >> shift;
    }
    rem = m32 & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) {
        code++;
    }
    return code;
}

/* ---------------------------------------------------------------- IEEE binary16 (f16) ---- */

/* f16 -> f32 is exact. NaN: quiet bit set, 10-bit payload kept in the top payload bits. */
static inline float accel__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) {
        return accel__bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    }
    if (e == 0) {
        /* Zero or subnormal m * 2^-24: both factors and the product are exact in f32. */
        float mag = (float)m * 0x1p-24f;
        return accel__bits_f32(sign | accel__f32_bits(mag));
    }
    return accel__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* f32 -> f16, RNE. Magnitudes >= 65520 (halfway between 65504 and 2^16, a tie that goes to the
 * even neighbour 2^16) become +-inf; inf stays inf; NaN -> quiet NaN (top 9 payload bits). */
static inline uint16_t accel__f32_to_f16(float f)
{
    uint32_t x = accel__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));
    }
    uint32_t code = accel__round_f32_bits(ax, 10, 15); /* inf input gives a huge code */
    if (code >= 0x7c00u) {
        code = 0x7c00u;
    }
    return (uint16_t)(sign | code);
}

/* ---------------------------------------------------------------- bfloat16 --------------- */

/* bf16 -> f32 is exact (bf16 is the top half of an f32). NaN: quiet bit set. */
static inline float accel__bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        x |= 0x400000u;
    }
    return accel__bits_f32(x);
}

/* f32 -> bf16, RNE on the dropped 16 bits (same exponent range, so subnormals and overflow to
 * inf fall out of the integer add). NaN -> quiet NaN with the payload's top 6 bits. */
static inline uint16_t accel__f32_to_bf16(float f)
{
    uint32_t x = accel__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---------------------------------------------------------------- OCP FP8 E4M3 (fn) ------ */

/* E4M3: bias 7, no infinities, S.1111.111 is NaN, max finite S.1111.110 = 448, smallest
 * subnormal 2^-9. Decoding is exact; both NaN codes map to a quiet f32 NaN of that sign. */
static inline float accel__f8e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t e = (v >> 3) & 0xfu;
    uint32_t m = v & 0x7u;
    if (e == 0xf && m == 0x7) {
        return accel__bits_f32(sign | 0x7fc00000u);
    }
    if (e == 0) {
        float mag = (float)m * 0x1p-9f;
        return accel__bits_f32(sign | accel__f32_bits(mag));
    }
    return accel__bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* f32 -> E4M3, RNE, saturating (the OCP "SAT" conversion, which is also the only sensible one
 * for a format without inf): any finite value that would round past 448, and +-inf, become
 * +-448 (0x7e / 0xfe). NaN -> 0x7f / 0xff (the format has one NaN per sign; payload lost). */
static inline uint8_t accel__f32_to_f8e4m3(float f)
{
    uint32_t x = accel__f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (uint8_t)(sign | 0x7fu);
    }
    uint32_t code = accel__round_f32_bits(ax, 3, 7);
    if (code > 0x7eu) {
        code = 0x7eu;
    }
    return (uint8_t)(sign | code);
}

/* ---------------------------------------------------------------- OCP FP8 E5M2 ----------- */

/* E5M2: IEEE-like (bias 15, inf = S.11111.00, NaN = S.11111.{01,10,11}), max finite 57344.
 * It is the top byte of an f16, so decoding reuses the f16 path (NaN comes back quiet). */
static inline float accel__f8e5m2_to_f32(uint8_t v)
{
    return accel__f16_to_f32((uint16_t)((uint16_t)v << 8));
}

/* f32 -> E5M2, RNE, saturating per the OCP spec's SAT mode: finite values that would round past
 * 57344 AND +-inf become +-57344 (0x7b / 0xfb); the format's inf is never produced. This is
 * the mode ML frameworks use for training casts (an inf there poisons the whole step); callers
 * that need inf-preserving casts go through f16. NaN -> quiet NaN 0x7e / 0xfe. */
static inline uint8_t accel__f32_to_f8e5m2(float f)
{
    uint32_t x = accel__f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (uint8_t)(sign | 0x7eu);
    }
    uint32_t code = accel__round_f32_bits(ax, 2, 15);
    if (code > 0x7bu) {
        code = 0x7bu;
    }
    return (uint8_t)(sign | code);
}

/* ------------------------------------------------- FP8 E4M3FNUZ / E5M2FNUZ (PyTorch) ---- */

/* The FNUZ formats: no infinities, no negative zero, one NaN (0x80); bias 8 (E4M3FNUZ, max
 * finite 240, smallest subnormal 2^-10) or 16 (E5M2FNUZ, max 57344, smallest 2^-17). */
static inline float accel__f8fnuz_to_f32(uint8_t v, int mbits, int bias)
{
    if (v == 0x80u) {
        return accel__bits_f32(0x7fc00000u);
    }
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t e = (uint32_t)(v & 0x7fu) >> mbits, m = v & ((1u << mbits) - 1u);
    if (e == 0) { /* subnormal: m * 2^(1 - bias - mbits), exact in f32 */
        float mag = (float)m * accel__bits_f32((uint32_t)(127 + 1 - bias - mbits) << 23);
        return accel__bits_f32(sign | accel__f32_bits(mag));
    }
    return accel__bits_f32(sign | ((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mbits)));
}

/* f32 -> FNUZ, RNE, saturating like E4M3 (finite overflow and +-inf give +-max, 0x7f / 0xff);
 * NaN -> 0x80; a result of zero is +0 whatever the sign (the format has no -0). */
static inline uint8_t accel__f32_to_f8fnuz(float f, int mbits, int bias)
{
    uint32_t x = accel__f32_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return 0x80u;
    }
    uint32_t code = accel__round_f32_bits(ax, mbits, bias);
    if (code > 0x7fu) {
        code = 0x7fu;
    }
    return code == 0 ? 0 : (uint8_t)(((x >> 24) & 0x80u) | code);
}

/* -------------------------------------------------------------- OCP MX scale E8M0 -------- */

/* E8M0: the value 2^(v - 127) (v = 0: 2^-127, an f32 subnormal), 0xff is NaN; no sign, no
 * zero. */
static inline float accel__f8e8m0_to_f32(uint8_t v)
{
    if (v == 0xffu) {
        return accel__bits_f32(0x7fc00000u);
    }
    return v == 0 ? accel__bits_f32(0x00400000u) : accel__bits_f32((uint32_t)v << 23);
}

/* f32 -> E8M0: the magnitude to the nearest power of two (linear distance; the tie 1.5 x 2^k
 * rounds up), clamped to [2^-127, 2^127]; NaN and +-inf -> NaN (0xff). */
static inline uint8_t accel__f32_to_f8e8m0(float f)
{
    uint32_t ax = accel__f32_bits(f) & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        return 0xffu;
    }
    uint32_t e = ax >> 23, m = ax & 0x7fffffu;
    /* Normal: 1.m x 2^(e-127) rounds up from m = 0.5. Subnormal (e = 0): m x 2^-149 against
     * 1.5 x 2^-127, i.e. m against 0x600000, between 2^-127 (code 0) and 2^-126 (code 1). */
    uint32_t code = e == 0 ? (m >= 0x600000u) : e + (m >= 0x400000u);
    return (uint8_t)(code > 254u ? 254u : code);
}

#endif /* ACCEL_BASE_HALF_H */
