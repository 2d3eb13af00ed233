/*
 * The 16-bit float formats of the emulator build (cuemu.h): round-to-nearest-even narrowing
 * from fp32 (NaN stays NaN, overflow gives inf, fp16 subnormals kept) and exact widening, as
 * the GPU's conversion instructions do. The emulated cuBLASLt and NCCL share them.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuemu.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t to_bf16(float f)
{
    uint32_t u = bits_of(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        return (uint16_t)((u >> 16) | 0x40); /* a quiet NaN stays a NaN */
    }
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t to_f16(float f)
{
    uint32_t u = bits_of(f);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xFFu, man = u & 0x7FFFFFu;
    if (exp == 0xFF) {
        return (uint16_t)(sign | 0x7C00u | (man ? 0x200u : 0));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 31) {
        return (uint16_t)(sign | 0x7C00u);
    }
    if (e <= 0) { /* subnormal: units of 2^-24, from the 24-bit significand */
        if (e < -10) {
            return (uint16_t)sign;
        }
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        h += rem > half || (rem == half && (h & 1u));
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1FFFu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u)); /* a carry rounds up into inf */
    return (uint16_t)h;
}

static float from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    if (exp == 31) {
        return float_of(sign | 0x7F800000u | (man << 13));
    }
    return float_of(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t cuemu_to_half(float f, int bf16)
{
    return bf16 ? to_bf16(f) : to_f16(f);
}

float cuemu_from_half(uint16_t h, int bf16)
{
    return bf16 ? float_of((uint32_t)h << 16) : from_f16(h);
}
