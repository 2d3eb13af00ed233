/*
 * Dtype conversions (accel_convert, the per-ISA kernels, stochastic bf16 rounding) against an
 * independent reference built here: every format's finite values are decoded with ldexp into a
 * sorted table, and rounding picks the nearest table entry in double arithmetic (ties to the
 * even code). Nothing in the reference shares code with src/base/half.h.
 *
 * NaN rule checked: every NaN converts to a quiet NaN of the same sign whose payload is the
 * source payload's top bits (a quiet f16/bf16 NaN therefore round-trips through f32 unchanged);
 * FP8 NaNs carry no payload (E4M3: S.1111.111, E5M2: S.11111.10).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "base/convert.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the independent reference: a format = (exponent bits, mantissa bits, bias) ---- */

typedef struct fmt {
    const char *name;
    int ebits, mbits, bias;
    uint32_t max_code; /* largest finite magnitude code */
    int saturate;      /* 1: overflow -> max finite, else -> inf (code max_code + 1) */
    double *vals;      /* vals[c] for c in [0, max_code + 1]; the last is the overflow point */
} fmt;

/* Value of magnitude code c, by the textbook formula. */
static double decode_mag(const fmt *f, uint32_t c)
{
    uint32_t e = c >> f->mbits, m = c & ((1u << f->mbits) - 1u);
    if (e == 0) {
        return ldexp((double)m, 1 - f->bias - f->mbits);
    }
    return ldexp((double)(m + (1u << f->mbits)), (int)e - f->bias - f->mbits);
}

static void fmt_init(fmt *f)
{
    f->vals = malloc(sizeof(double) * (f->max_code + 2));
    CHECK(f->vals);
    for (uint32_t c = 0; c <= f->max_code + 1; c++) {
        /* code max_code + 1 continues the sequence with an unbounded exponent: the value past
         * which RNE overflows (2^16 for f16, 2^128 for bf16, 480 for E4M3, 2^16 for E5M2). */
        f->vals[c] = decode_mag(f, c);
    }
}

/* RNE of x (finite or inf, not NaN) into f: a magnitude code plus the sign bit at `signbit`. */
static uint32_t ref_round(const fmt *f, double x, uint32_t signbit)
{
    uint32_t sign = signbit ? (1u << (f->ebits + f->mbits)) : 0;
    double ax = fabs(x);
    uint32_t top = f->max_code + 1;
    uint32_t code;
    if (ax >= f->vals[top]) {
        code = top;
    } else {
        uint32_t lo = 0, hi = top; /* vals[lo] <= ax < vals[hi] */
        while (hi - lo > 1) {
            uint32_t mid = (lo + hi) / 2;
            if (f->vals[mid] <= ax) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        double dlo = ax - f->vals[lo], dhi = f->vals[hi] - ax;
        code = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1u) ? hi : lo);
    }
    if (code == top && f->saturate) {
        code = f->max_code;
    }
    return sign | code;
}

static fmt F16 = {"f16", 5, 10, 15, 0x7bff, 0, NULL};
static fmt BF16 = {"bf16", 8, 7, 127, 0x7f7f, 0, NULL};
static fmt E4M3 = {"e4m3", 4, 3, 7, 0x7e, 1, NULL};
static fmt E5M2 = {"e5m2", 5, 2, 15, 0x7b, 1, NULL};
static fmt E4M3FNUZ = {"e4m3fnuz", 4, 3, 8, 0x7f, 1, NULL};
static fmt E5M2FNUZ = {"e5m2fnuz", 5, 2, 16, 0x7f, 1, NULL};

/* Expected narrow bits for x, including the NaN and inf rules. */
static uint32_t expect(const fmt *f, float x)
{
    uint32_t u = fbits(x), signbit = u >> 31;
    uint32_t sign = signbit << (f->ebits + f->mbits);
    if (isnan(x)) {
        if (f == &E4M3) {
            return sign | 0x7f; /* the one NaN code */
        }
        if (f == &E5M2) {
            return sign | 0x7e; /* quiet, payload dropped (1 bit could not carry it anyway) */
        }
        /* quiet bit + the payload's top bits */
        uint32_t payload_bits = (uint32_t)f->mbits - 1;
        uint32_t top = (u & 0x3fffffu) >> (22 - payload_bits);
        uint32_t inf = ((1u << f->ebits) - 1u) << f->mbits;
        return sign | inf | (1u << (f->mbits - 1)) | top;
    }
    if (isinf(x) && f->saturate) {
        return sign | f->max_code;
    }
    return ref_round(f, (double)x, signbit);
}

/* Expected f32 for narrow bits v (exact widening; NaN quietened keeping the payload). */
static uint32_t expect_widen(const fmt *f, uint32_t v)
{
    uint32_t nb = (uint32_t)(f->ebits + f->mbits);
    uint32_t sign = (v >> nb) & 1u, mag = v & ((1u << nb) - 1u);
    uint32_t s32 = sign << 31;
    uint32_t einf = ((1u << f->ebits) - 1u) << f->mbits;
    if (f == &E4M3) {
        if (mag == 0x7f) {
            return s32 | 0x7fc00000u;
        }
    } else if (mag >= einf) {
        uint32_t m = mag & ((1u << f->mbits) - 1u);
        if (m == 0) {
            return s32 | 0x7f800000u;
        }
        return s32 | 0x7f800000u | 0x400000u | (m << (23 - f->mbits));
    }
    return s32 | fbits((float)decode_mag(f, mag));
}

/* ---- exhaustive 16-bit and 8-bit patterns ---- */

static void test_patterns16(void)
{
    static uint16_t all[65536], back[65536];
    static float wide[65536];
    for (uint32_t i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
    }
    for (int which = 0; which < 2; which++) {
        fmt *f = which ? &BF16 : &F16;
        accel_dtype dt = which ? ACCEL_BF16 : ACCEL_F16;
        CHECK_OK(NULL, accel_convert(wide, ACCEL_F32, all, dt, 65536));
        for (uint32_t i = 0; i < 65536; i++) {
            CHECK_MSG(fbits(wide[i]) == expect_widen(f, i), "%s %04x -> %08x", f->name, i,
                      fbits(wide[i]));
        }
        CHECK_OK(NULL, accel_convert(back, dt, wide, ACCEL_F32, 65536));
        uint32_t quiet = which ? 0x40 : 0x200;
        for (uint32_t i = 0; i < 65536; i++) {
            uint32_t want = isnan(wide[i]) ? (i | quiet) : i; /* NaN comes back quiet */
            CHECK_MSG(back[i] == want, "%s %04x round trip gave %04x", f->name, i, back[i]);
        }
    }
}

static void test_patterns8(void)
{
    uint8_t all[256], back[256];
    float wide[256];
    for (int i = 0; i < 256; i++) {
        all[i] = (uint8_t)i;
    }
    for (int which = 0; which < 2; which++) {
        fmt *f = which ? &E5M2 : &E4M3;
        accel_dtype dt = which ? ACCEL_F8_E5M2 : ACCEL_F8_E4M3;
        CHECK_OK(NULL, accel_convert(wide, ACCEL_F32, all, dt, 256));
        CHECK_OK(NULL, accel_convert(back, dt, wide, ACCEL_F32, 256));
        for (uint32_t i = 0; i < 256; i++) {
            CHECK_MSG(fbits(wide[i]) == expect_widen(f, i), "%s %02x -> %08x", f->name, i,
                      fbits(wide[i]));
            uint32_t want = i;
            if (isnan(wide[i])) {
                want = which ? ((i & 0x80) | 0x7e) : i; /* E5M2 NaN comes back as the quiet one */
            } else if (isinf(wide[i])) {
                want = (i & 0x80) | 0x7b; /* saturating: E5M2 inf -> max finite */
            }
            CHECK_MSG(back[i] == want, "%s %02x round trip gave %02x", f->name, i, back[i]);
        }
    }
    /* The documented saturation points. */
    float in[] = {448.0f,    464.0f, 479.9f,   480.0f,   1e9f,     INFINITY,
                  -INFINITY, -1e30f, 57344.0f, 61439.0f, 61440.0f, 1e6f};
    uint8_t e4[12], e5[12];
    CHECK_OK(NULL, accel_convert(e4, ACCEL_F8_E4M3, in, ACCEL_F32, 12));
    CHECK_OK(NULL, accel_convert(e5, ACCEL_F8_E5M2, in, ACCEL_F32, 12));
    for (int i = 0; i < 8; i++) {
        CHECK_MSG(e4[i] == (in[i] < 0 ? 0xfe : 0x7e), "e4m3(%g) = %02x", in[i], e4[i]);
    }
    CHECK(e5[5] == 0x7b && e5[6] == 0xfb && e5[7] == 0xfb && e5[8] == 0x7b && e5[9] == 0x7b &&
          e5[10] == 0x7b && e5[11] == 0x7b);
    CHECK(e5[0] == 0x5f); /* 448 = 1.75 * 2^8 */
}

/* ---- random and edge-case floats against the reference, through every kernel ---- */

#define NRAND (1u << 21)

static void fill_inputs(float *x, size_t n)
{
    static const float edges[] = {
        0.0f,         -0.0f,       1.0f,     -1.0f,     65504.0f,        65519.0f,    65520.0f,
        65536.0f,     -65520.0f,   0x1p-24f, 0x1p-25f,  0x1.000002p-25f, 0x1.8p-24f,  0x1p-14f,
        0x1.ff8p-15f, FLT_MAX,     -FLT_MAX, FLT_MIN,   0x1p-149f,       -0x1p-149f,  0x1p-133f,
        0x1p-134f,    0x1.8p-133f, INFINITY, -INFINITY, 3.0e38f,         0x1.fep127f, 0x1.ff8p127f};
    size_t ne = sizeof edges / sizeof edges[0], i = 0;
    for (; i < ne; i++) {
        x[i] = edges[i];
    }
    /* NaNs: quiet, signalling, with high and low payloads, both signs. */
    uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu,
                       0x7fffffffu, 0x7f802000u, 0x7fa00000u, 0xffb12345u};
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; i++, k++) {
        x[i] = bitsf(nans[k]);
    }
    for (; i < n; i++) {
        uint64_t r = next_u64();
        switch (r & 3) {
        case 0: /* any bit pattern */
            x[i] = bitsf((uint32_t)(r >> 32));
            break;
        case 1: /* around the f16 range, subnormals included */
            x[i] =
                bitsf(((uint32_t)(r >> 32) & 0x807fffffu) | (uint32_t)(96 + (r >> 8) % 50) << 23);
            break;
        case 2: { /* exact f16 ties: the midpoint of two neighbours */
            uint32_t h = (uint32_t)(r >> 40) % 0x7bff;
            double mid = (F16.vals[h] + F16.vals[h + 1]) / 2;
            x[i] = (float)((r & 4) ? -mid : mid);
            break;
        }
        default: { /* exact bf16 ties and their neighbours */
            uint32_t b = (uint32_t)(r >> 40) % 0x7f7f;
            uint32_t u = ((b << 16) | 0x8000u) + (uint32_t)((r >> 4) % 3) - 1u;
            x[i] = bitsf(u | ((r & 8) ? 0x80000000u : 0));
            break;
        }
        }
    }
}

static void test_random(void)
{
    float *x = malloc(NRAND * sizeof *x), *w = malloc(NRAND * sizeof *w);
    uint16_t *h = malloc(NRAND * sizeof *h), *h2 = malloc(NRAND * sizeof *h2);
    uint8_t *q = malloc(NRAND);
    CHECK(x && w && h && h2 && q);
    fill_inputs(x, NRAND);

    /* accel_convert (best kernel) against the reference. */
    for (int which = 0; which < 2; which++) {
        fmt *f = which ? &BF16 : &F16;
        CHECK_OK(NULL, accel_convert(h, which ? ACCEL_BF16 : ACCEL_F16, x, ACCEL_F32, NRAND));
        for (size_t i = 0; i < NRAND; i++) {
            CHECK_MSG(h[i] == expect(f, x[i]), "%s(%a = %08x) = %04x, want %04x", f->name, x[i],
                      fbits(x[i]), h[i], expect(f, x[i]));
        }
    }
    for (int which = 0; which < 2; which++) {
        fmt *f = which ? &E5M2 : &E4M3;
        CHECK_OK(NULL,
                 accel_convert(q, which ? ACCEL_F8_E5M2 : ACCEL_F8_E4M3, x, ACCEL_F32, NRAND));
        for (size_t i = 0; i < NRAND; i++) {
            CHECK_MSG(q[i] == expect(f, x[i]), "%s(%a) = %02x, want %02x", f->name, x[i], q[i],
                      expect(f, x[i]));
        }
    }

    /* Every kernel table against the scalar one, at many lengths (vector tails) and offsets. */
    const accel__cvt_kernels *ref = accel__cvt_kernels_for(ACCEL__CVT_SCALAR);
    CHECK(ref != NULL && accel__cvt_best() != NULL);
    int tested = 0;
    for (int isa = 0; isa < ACCEL__CVT_ISA_COUNT; isa++) {
        const accel__cvt_kernels *k = accel__cvt_kernels_for((accel__cvt_isa)isa);
        if (k == NULL) {
            fprintf(stderr, "test_convert: kernel set %d not available here\n", isa);
            continue;
        }
        tested++;
        for (size_t len = 0; len < 80; len++) {
            size_t off = len % 7;
            ref->f32_to_bf16(h, x + off, len);
            memset(h2, 0xa5, 100 * sizeof *h2);
            k->f32_to_bf16(h2, x + off, len);
            CHECK(memcmp(h, h2, len * 2) == 0 && h2[len] == 0xa5a5);
            ref->f32_to_f16(h, x + off, len);
            memset(h2, 0xa5, 100 * sizeof *h2);
            k->f32_to_f16(h2, x + off, len);
            CHECK(memcmp(h, h2, len * 2) == 0 && h2[len] == 0xa5a5);
        }
        for (int which = 0; which < 2; which++) {
            void (*narrow)(uint16_t *, const float *, size_t) =
                which ? k->f32_to_bf16 : k->f32_to_f16;
            void (*ref_narrow)(uint16_t *, const float *, size_t) =
                which ? ref->f32_to_bf16 : ref->f32_to_f16;
            ref_narrow(h, x, NRAND);
            narrow(h2, x, NRAND);
            for (size_t i = 0; i < NRAND; i++) {
                CHECK_MSG(h[i] == h2[i], "%s %s(%08x): %04x vs scalar %04x", k->name,
                          which ? "bf16" : "f16", fbits(x[i]), h2[i], h[i]);
            }
            /* widening: all 65536 patterns, at an odd length and offset */
            for (uint32_t i = 0; i < 65536; i++) {
                h[i] = (uint16_t)i;
            }
            void (*widen)(float *, const uint16_t *, size_t) =
                which ? k->bf16_to_f32 : k->f16_to_f32;
            void (*ref_widen)(float *, const uint16_t *, size_t) =
                which ? ref->bf16_to_f32 : ref->f16_to_f32;
            ref_widen(x + 65600, h + 3, 65533);
            widen(w, h + 3, 65533);
            CHECK_MSG(memcmp(w, x + 65600, 65533 * sizeof *w) == 0, "%s widen %s", k->name,
                      which ? "bf16" : "f16");
            fill_inputs(x, NRAND); /* restore what the widening overwrote */
        }
        /* forced dispatch goes through the public entry point too */
        CHECK(accel__cvt_force((accel__cvt_isa)isa) == 1);
        CHECK_OK(NULL, accel_convert(h2, ACCEL_BF16, x, ACCEL_F32, 1000));
        ref->f32_to_bf16(h, x, 1000);
        CHECK(memcmp(h, h2, 2000) == 0);
    }
    CHECK(accel__cvt_force(ACCEL__CVT_ISA_COUNT) == 1);
    fprintf(stderr, "test_convert: %d kernel sets checked, best is %s\n", tested,
            accel__cvt_best()->name);
    free(x);
    free(w);
    free(h);
    free(h2);
    free(q);
}

/* ---- stochastic rounding ---- */

static void test_stochastic(void)
{
    enum { DRAWS = 200000 };
    static float src[DRAWS];
    static uint16_t dst[DRAWS];
    const float values[] = {1.0f + 0x1p-9f, 1.0f + 0x1p-12f, -3.14159265f, 0.1f,
                            1e-40f,         123456.789f,     2.0f,         -0.0f};
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        float x = values[v];
        for (int i = 0; i < DRAWS; i++) {
            src[i] = x;
        }
        uint64_t state = 42 + v;
        CHECK_OK(NULL, accel_f32_to_bf16_stochastic(dst, src, DRAWS, &state));
        CHECK(state != 42 + v);
        uint32_t lo = fbits(x) >> 16, hi = lo + 1; /* truncation and the next value away */
        double sum = 0;
        int n_hi = 0;
        for (int i = 0; i < DRAWS; i++) {
            CHECK_MSG(dst[i] == lo || (dst[i] == hi && (fbits(x) & 0xffffu) != 0),
                      "%a -> %04x (neighbours %04x %04x)", x, dst[i], lo, hi);
            n_hi += dst[i] == hi;
            sum += (double)bitsf((uint32_t)dst[i] << 16);
        }
        /* Unbiased: the mean is within 5 standard errors of x. A draw is lo or hi, so the
         * standard deviation is at most half the gap. */
        double gap = fabs((double)bitsf(hi << 16) - (double)bitsf(lo << 16));
        double se = gap / 2 / sqrt((double)DRAWS);
        CHECK_MSG(fabs(sum / DRAWS - (double)x) <= 5 * se + 1e-300, "%a: mean %a, se %g", x,
                  sum / DRAWS, se);
        (void)n_hi;
    }
    /* Deterministic for a given state; NaN and inf handled. */
    float sp[4] = {NAN, INFINITY, -INFINITY, 1.5f};
    uint16_t a[4], b[4];
    uint64_t s1 = 7, s2 = 7;
    CHECK_OK(NULL, accel_f32_to_bf16_stochastic(a, sp, 4, &s1));
    CHECK_OK(NULL, accel_f32_to_bf16_stochastic(b, sp, 4, &s2));
    CHECK(memcmp(a, b, sizeof a) == 0 && s1 == s2);
    CHECK((a[0] & 0x7fc0) == 0x7fc0 && a[1] == 0x7f80 && a[2] == 0xff80 && a[3] == 0x3fc0);
    CHECK(accel_f32_to_bf16_stochastic(a, sp, 4, NULL) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "rng_state") != NULL);
}

/* ---- the rest of accel_convert ---- */

static void test_misc(void)
{
    /* f64 -> f16 must not double-round: 1 + 2^-11 + 2^-40 is just above the tie between 1 and
     * 1 + 2^-10, but rounds to the tie itself in f32. */
    double d[3] = {1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-11, -1e300};
    uint16_t h[3];
    CHECK_OK(NULL, accel_convert(h, ACCEL_F16, d, ACCEL_F64, 3));
    CHECK(h[0] == 0x3c01 && h[1] == 0x3c00 && h[2] == 0xfc00);
    CHECK_OK(NULL, accel_convert(h, ACCEL_BF16, d, ACCEL_F64, 3));
    CHECK(h[0] == 0x3f80 && h[2] == 0xff80);
    double back[3];
    uint16_t hv[3] = {0x3c01, 0x0001, 0xfc00};
    CHECK_OK(NULL, accel_convert(back, ACCEL_F64, hv, ACCEL_F16, 3));
    CHECK(back[0] == 1.0 + 0x1p-10 && back[1] == 0x1p-24 && back[2] == -INFINITY);

    /* float -> integer: truncate, saturate, NaN -> 0; bool */
    float f[6] = {-3.7f, 3.7f, 1e10f, -1e10f, NAN, 0.0f};
    int8_t i8[6];
    CHECK_OK(NULL, accel_convert(i8, ACCEL_I8, f, ACCEL_F32, 6));
    CHECK(i8[0] == -3 && i8[1] == 3 && i8[2] == 127 && i8[3] == -128 && i8[4] == 0 && i8[5] == 0);
    int64_t i64[6];
    CHECK_OK(NULL, accel_convert(i64, ACCEL_I64, f, ACCEL_F32, 6));
    CHECK(i64[2] == 10000000000ll && i64[3] == -10000000000ll);
    uint8_t bl[6];
    CHECK_OK(NULL, accel_convert(bl, ACCEL_BOOL, f, ACCEL_F32, 6));
    CHECK(bl[0] == 1 && bl[4] == 1 && bl[5] == 0);
    /* integer -> float and integer -> integer */
    int32_t iv[4] = {65520, -7, 300, 16777217};
    uint16_t hh[4];
    CHECK_OK(NULL, accel_convert(hh, ACCEL_F16, iv, ACCEL_I32, 4));
    CHECK(hh[0] == 0x7c00 && hh[1] == 0xc700);
    float fv[4];
    CHECK_OK(NULL, accel_convert(fv, ACCEL_F32, iv, ACCEL_I32, 4));
    CHECK(fv[3] == 16777216.0f && fv[2] == 300.0f);
    uint8_t u8[4];
    CHECK_OK(NULL, accel_convert(u8, ACCEL_U8, iv, ACCEL_I32, 4));
    CHECK(u8[0] == 255 && u8[1] == 0 && u8[2] == 255);
    /* narrow -> narrow through f32 */
    uint16_t b16[2] = {0x3f81, 0x7f80}; /* 1.0078125, inf */
    uint16_t f16[2];
    CHECK_OK(NULL, accel_convert(f16, ACCEL_F16, b16, ACCEL_BF16, 2));
    CHECK(f16[0] == 0x3c08 && f16[1] == 0x7c00);
    /* same dtype: a byte copy, NaN payload untouched */
    uint16_t sn = 0x7c01, sn2 = 0;
    CHECK_OK(NULL, accel_convert(&sn2, ACCEL_F16, &sn, ACCEL_F16, 1));
    CHECK(sn2 == 0x7c01);

    /* errors */
    CHECK(accel_convert(h, (accel_dtype)99, d, ACCEL_F64, 1) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "dst_dt") != NULL);
    CHECK(accel_convert(h, ACCEL_F16, NULL, ACCEL_F64, 1) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "src") != NULL);
    float ov[4] = {1, 2, 3, 4};
    CHECK(accel_convert(ov, ACCEL_BF16, ov, ACCEL_F32, 4) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "overlap") != NULL);
    CHECK_OK(NULL, accel_convert(NULL, ACCEL_BF16, NULL, ACCEL_F32, 0));
}

/* The FNUZ FP8s (no inf, no -0, NaN 0x80) exhaustively and on random floats against the
 * reference; E8M0 (powers of two); U32/U64 with saturation; integers that need one rounding;
 * the dtypes without conversions (C64, packed sub-byte). */
static void test_file_dtypes(void)
{
    for (int which = 0; which < 2; which++) {
        fmt *f = which ? &E5M2FNUZ : &E4M3FNUZ;
        accel_dtype dt = which ? ACCEL_F8_E5M2FNUZ : ACCEL_F8_E4M3FNUZ;
        uint8_t all[256], back[256];
        float wide[256];
        for (int i = 0; i < 256; i++) {
            all[i] = (uint8_t)i;
        }
        CHECK_OK(NULL, accel_convert(wide, ACCEL_F32, all, dt, 256));
        CHECK_OK(NULL, accel_convert(back, dt, wide, ACCEL_F32, 256));
        for (uint32_t i = 0; i < 256; i++) {
            double want = (i & 0x80 ? -1.0 : 1.0) * decode_mag(f, i & 0x7f);
            CHECK_MSG(i == 0x80 ? isnan(wide[i]) : (double)wide[i] == want, "%s %02x -> %g",
                      f->name, i, wide[i]);
            CHECK_MSG(back[i] == i, "%s %02x round trip gave %02x", f->name, i, back[i]);
        }
        enum { N = 4096 };
        float x[N];
        uint8_t got[N];
        for (int i = 0; i < N; i++) { /* magnitudes around the format's range, both signs */
            x[i] = (float)ldexp((double)(next_u64() % 100000) / 100000.0 + 0.5,
                                (int)(next_u64() % 40) - (which ? 22 : 14));
            x[i] = next_u64() & 1 ? -x[i] : x[i];
        }
        x[0] = -0.0f, x[1] = INFINITY, x[2] = -INFINITY, x[3] = NAN, x[4] = 1e-30f;
        CHECK_OK(NULL, accel_convert(got, dt, x, ACCEL_F32, N));
        for (int i = 0; i < N; i++) {
            uint32_t want = ref_round(f, (double)x[i], fbits(x[i]) >> 31);
            want = isnan(x[i]) ? 0x80 : (want & 0x7f) == 0 ? 0 : want; /* 0x80 is NaN, not -0 */
            CHECK_MSG(got[i] == want, "%s(%a) = %02x, want %02x", f->name, x[i], got[i], want);
        }
    }
    /* E8M0: 2^(v - 127), 0xff NaN; encoding rounds the magnitude to the nearest power of two. */
    uint8_t e8[256];
    float e8f[256];
    for (int i = 0; i < 256; i++) {
        e8[i] = (uint8_t)i;
    }
    CHECK_OK(NULL, accel_convert(e8f, ACCEL_F32, e8, ACCEL_F8_E8M0, 256));
    for (int i = 0; i < 255; i++) {
        CHECK(e8f[i] == (float)ldexp(1.0, i - 127));
    }
    CHECK(isnan(e8f[255]));
    float e8in[] = {
        1.0f,  2.9f,  3.0f,     -4.0f, 0.0f,     0x1p-127f, 1.4f * 0x1p-127f, 1.5f * 0x1p-127f,
        1e38f, 3e38f, INFINITY, NAN,   0x1p-149f};
    uint8_t e8want[] = {127, 128, 129, 129, 0, 0, 0, 1, 253, 254, 255, 255, 0};
    uint8_t e8got[13];
    CHECK_OK(NULL, accel_convert(e8got, ACCEL_F8_E8M0, e8in, ACCEL_F32, 13));
    for (int i = 0; i < 13; i++) {
        CHECK_MSG(e8got[i] == e8want[i], "e8m0(%a) = %u, want %u", e8in[i], e8got[i], e8want[i]);
    }

    /* U32 / U64: saturating both ways, exact where they fit. */
    uint64_t u64[3] = {UINT64_MAX, 1ull << 63, 7};
    double d64[3];
    int64_t i64[3];
    uint32_t u32[3];
    CHECK_OK(NULL, accel_convert(d64, ACCEL_F64, u64, ACCEL_U64, 3));
    CHECK(d64[0] == 0x1p64 && d64[1] == 0x1p63 && d64[2] == 7.0);
    CHECK_OK(NULL, accel_convert(i64, ACCEL_I64, u64, ACCEL_U64, 3));
    CHECK(i64[0] == INT64_MAX && i64[1] == INT64_MAX && i64[2] == 7);
    CHECK_OK(NULL, accel_convert(u32, ACCEL_U32, u64, ACCEL_U64, 3));
    CHECK(u32[0] == UINT32_MAX && u32[2] == 7);
    int64_t neg[2] = {-1, INT64_MIN};
    CHECK_OK(NULL, accel_convert(u64, ACCEL_U64, neg, ACCEL_I64, 2));
    CHECK(u64[0] == 0 && u64[1] == 0);
    double big[4] = {1e30, 3e9, -2.5, 0x1p63};
    CHECK_OK(NULL, accel_convert(u64, ACCEL_U64, big, ACCEL_F64, 3));
    CHECK(u64[0] == UINT64_MAX && u64[1] == 3000000000ull && u64[2] == 0);
    CHECK_OK(NULL, accel_convert(u32, ACCEL_U32, big, ACCEL_F64, 3));
    CHECK(u32[0] == UINT32_MAX && u32[1] == 3000000000u && u32[2] == 0);
    CHECK_OK(NULL, accel_convert(u64, ACCEL_U64, big + 3, ACCEL_F64, 1));
    CHECK(u64[0] == 1ull << 63);
    /* One rounding: 2^60 + 2^36 + 1 is just past the f32 tie at 2^60 + 2^36; through a plain
     * double it would land on the tie and round down to 2^60. Same for U64 -> BF16. */
    int64_t over = (1ll << 60) + (1ll << 36) + 1;
    float fo;
    CHECK_OK(NULL, accel_convert(&fo, ACCEL_F32, &over, ACCEL_I64, 1));
    CHECK_MSG(fo == 0x1p60f + 0x1p37f, "%a", fo);
    uint64_t uo = (1ull << 63) + (1ull << 55) + 1; /* bf16 ulp at 2^63 is 2^56 */
    uint16_t bo;
    CHECK_OK(NULL, accel_convert(&bo, ACCEL_BF16, &uo, ACCEL_U64, 1));
    CHECK_MSG(bo == 0x5f01, "%04x", bo);

    /* No conversions for C64 and the packed sub-byte formats; copies are fine. */
    float cplx[4] = {1, 2, 3, 4}, cout[4];
    CHECK(accel_convert(cout, ACCEL_F32, cplx, ACCEL_C64, 2) == ACCEL_EUNSUPPORTED);
    CHECK(strstr(accel_last_error(NULL), "C64") != NULL);
    CHECK(accel_convert(cout, ACCEL_C64, cplx, ACCEL_F32, 2) == ACCEL_EUNSUPPORTED);
    CHECK(accel_convert(NULL, ACCEL_F32, NULL, ACCEL_C64, 0) == ACCEL_EUNSUPPORTED);
    CHECK_OK(NULL, accel_convert(cout, ACCEL_C64, cplx, ACCEL_C64, 2));
    CHECK(memcmp(cout, cplx, sizeof cplx) == 0);
    uint8_t packed[3] = {0x12, 0x34, 0x56}, pout[3] = {0};
    CHECK(accel_convert(cout, ACCEL_F32, packed, ACCEL_F4, 2) == ACCEL_EUNSUPPORTED);
    CHECK(strstr(accel_last_error(NULL), "packed") != NULL);
    CHECK(accel_convert(pout, ACCEL_F6_E2M3, cplx, ACCEL_F32, 4) == ACCEL_EUNSUPPORTED);
    CHECK_OK(NULL, accel_convert(pout, ACCEL_F6_E3M2, packed, ACCEL_F6_E3M2, 4)); /* 3 bytes */
    CHECK(memcmp(pout, packed, 3) == 0);
    CHECK(accel_convert(pout, ACCEL_F4, packed, ACCEL_F4, 3) == ACCEL_EINVAL); /* 1.5 bytes */
}

int main(void)
{
    fmt_init(&F16);
    fmt_init(&BF16);
    fmt_init(&E4M3);
    fmt_init(&E5M2);
    test_patterns16();
    test_patterns8();
    test_random();
    test_stochastic();
    test_misc();
    fmt_init(&E4M3FNUZ);
    fmt_init(&E5M2FNUZ);
    test_file_dtypes();
    free(E4M3FNUZ.vals);
    free(E5M2FNUZ.vals);
    free(F16.vals);
    free(BF16.vals);
    free(E4M3.vals);
    free(E5M2.vals);
    printf("test_convert: ok\n");
    return 0;
}
