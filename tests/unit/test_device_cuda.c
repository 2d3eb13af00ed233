/* ACCEL_TEST_LABELS: gpu sim
 *
 * The CUDA device (src/device/cuda/) against the CPU device on the same inputs, drawn fresh
 * each run (the seed is printed; ACCEL_TEST_SEED=N repeats a run), at odd counts and past the
 * kernels' grid caps, every dtype each kernel supports, outputs poisoned first:
 *  - bit for bit: convert (every F32 / BF16 / F16 pair; every 16-bit pattern as a source; f32
 *    specials: NaN payloads, inf, zeros, subnormals, f16 overflow and rounding ties), zero,
 *    clamp, nonfinite and the flags; and, except that the NaNs that float arithmetic makes may
 *    differ in payload (a GPU returns its canonical NaN), scale and unscale_check (specials in
 *    the inputs), SGD (momentum, dampening, nesterov, maximize, weight decay, first step) and
 *    Adam / AdamW (amsgrad, maximize, the bf16 / f16 compute copy written in the same pass)
 *    over several steps; abs_max exactly (NaN: NaN on both);
 *  - to rounding: pow_sum, whose GPU sum is a fixed tree (the CPU's is sequential): |gpu - cpu|
 *    <= count * 2^-52 * |cpu| for p = 1 and 2 (the sequential sum's error bound, terms of one
 *    sign), count * 2^-50 * |cpu| for other p (the pow()s differ in their last bits too); and
 *    deterministic: the same bits on every repetition and on two streams at once.
 * Also memory, pinned host memory, copies of every kind on the default order and on a stream,
 * streams, events, the description, and errors (unsupported dtypes, a GPU that does not exist,
 * an impossible allocation). Exits 77 (skipped) where no GPU can be opened, saying why.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/half.h"
#include "check.h"
#include "device/device.h"
#include "device/sim.h"

static accel__device *cpu, *gpu;
static accel__stream *gstream;
static uint64_t seed;

static uint64_t next(void) /* splitmix64 */
{
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(next() >> 11) * 0x1p-53);
}

/* Element-wise kernels stride over the grid beyond 4096 blocks of 256 threads (2^20 elements), and
 * reductions loop in their 1024 blocks beyond 2^20 too: the last count runs several strides and
 * a partial one. The CUDA emulator takes 2^20 + 1001 (set in main): one full stride and a partial
 * second, the same paths at a fifth of the work. So does the simulated GPU, whose kernels are the
 * CPU device's (no grid caps; their OpenMP chunks of 2^16 elements, several and a partial one,
 * the count before already has): the size bought nothing there but time, most of all under
 * ASan (27 s of make test's sanitizer pass). */
static size_t counts[] = {1, 7, 33, 1001, 3 * 65536 + 17, (1u << 20) * 5 + 3};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))

static void *dup_to_gpu(const void *h, size_t nbytes)
{
    void *d;
    CHECK_OK(NULL, accel__dev_alloc(gpu, nbytes, 0, &d));
    CHECK_OK(NULL, accel__dev_copy(gpu, d, h, nbytes, ACCEL__COPY_H2D, NULL));
    return d;
}

static void from_gpu(void *h, const void *d, size_t nbytes)
{
    CHECK_OK(NULL, accel__dev_copy(gpu, h, d, nbytes, ACCEL__COPY_D2H, NULL));
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    CHECK(p != NULL);
    return p;
}

/* Random floats mixed with the values that break conversions and checks. */
static void fill_f32(float *x, size_t n, int specials)
{
    static const uint32_t special[] = {
        0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa5a5a5u, /* quiet / signalling NaNs */
        0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, /* infinities, zeros */
        0x00000001u, 0x807fffffu, 0x33800000u, 0x33000000u, /* subnormals, f16 edges 2^-24/2^-25 */
        0x477fe000u, 0x477ff000u, 0x477fefffu, 0xc77ff000u, /* 65504, 65520 (tie), below */
        0x3f808000u, 0x3f818000u, 0x3f800fffu, 0x387fc000u, /* bf16 ties, f16 subnormal range */
    };
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next();
        if (specials && r % 16 == 0) {
            x[i] = accel__bits_f32(special[(r >> 8) % (sizeof(special) / sizeof(special[0]))]);
        } else if (specials && r % 16 == 1) {
            x[i] = accel__bits_f32((uint32_t)(r >> 20)); /* any bit pattern */
        } else {
            x[i] = frand(-3.0f, 3.0f) * (float)(1u << ((r >> 40) % 12));
        }
    }
}

static size_t dt_size(accel_dtype dt)
{
    return accel_dtype_nbytes(dt);
}

/* n elements of dt: every 16-bit pattern in turn for BF16 / F16, fill_f32 for F32. */
static void fill_dt(void *x, accel_dtype dt, size_t n)
{
    if (dt == ACCEL_F32) {
        fill_f32(x, n, 1);
        return;
    }
    uint16_t start = (uint16_t)next();
    for (size_t i = 0; i < n; i++) {
        ((uint16_t *)x)[i] = (uint16_t)(start + i);
    }
}

static void same_bytes(const char *what, const void *a, const void *b, size_t nbytes)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < nbytes; i++) {
        CHECK_MSG(x[i] == y[i], "%s: byte %zu differs (cpu %02x, gpu %02x)", what, i, x[i], y[i]);
    }
}

/* The results of float arithmetic: the same bits, except that a NaN matches any NaN (a GPU's
 * arithmetic returns its canonical NaN where x86 propagates an operand's payload). */
static void same_floats(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        CHECK_MSG(memcmp(&a[i], &b[i], 4) == 0 || (isnan(a[i]) && isnan(b[i])),
                  "%s: element %zu differs (cpu %.9g %08x, gpu %.9g %08x)", what, i, a[i],
                  accel__f32_bits(a[i]), b[i], accel__f32_bits(b[i]));
    }
}

/* ---- element-wise kernels, bit for bit ---- */

static void test_convert(void)
{
    static const accel_dtype dts[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        for (int si = 0; si < 3; si++) {
            for (int di = 0; di < 3; di++) {
                accel_dtype s = dts[si], d = dts[di];
                void *src = xmalloc(n * dt_size(s)), *want = xmalloc(n * dt_size(d));
                void *got = xmalloc(n * dt_size(d));
                fill_dt(src, s, n);
                memset(want, 0xA5, n * dt_size(d));
                CHECK_OK(NULL, accel__dev_convert(cpu, accel__dspan_of(want, d, n),
                                                  accel__dspan_of(src, s, n), NULL));
                void *gs = dup_to_gpu(src, n * dt_size(s)), *gd;
                CHECK_OK(NULL, accel__dev_alloc(gpu, n * dt_size(d), 0, &gd));
                CHECK_OK(NULL, accel__dev_memset(gpu, gd, 0x5A, n * dt_size(d), NULL));
                CHECK_OK(NULL, accel__stream_sync(gpu, NULL)); /* before gstream writes it */
                CHECK_OK(NULL,
                         accel__dev_convert(gpu, accel__dspan_of(gd, d, n),
                                            accel__dspan_of(gs, s, n), c % 2 ? gstream : NULL));
                CHECK_OK(NULL, accel__stream_sync(gpu, gstream));
                from_gpu(got, gd, n * dt_size(d));
                char what[64];
                snprintf(what, sizeof(what), "convert %s -> %s, %zu", accel_dtype_name(s),
                         accel_dtype_name(d), n);
                same_bytes(what, want, got, n * dt_size(d));
                accel__dev_free(gpu, gs);
                accel__dev_free(gpu, gd);
                free(src), free(want), free(got);
            }
        }
    }
    /* Every 16-bit pattern once, both ways through f32. */
    uint16_t all[65536];
    for (int i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
    }
    for (int k = 0; k < 2; k++) {
        accel_dtype h = k ? ACCEL_F16 : ACCEL_BF16;
        float want[65536], got[65536];
        CHECK_OK(NULL, accel__dev_convert(cpu, accel__dspan_f32(want, 65536),
                                          accel__dspan_of(all, h, 65536), NULL));
        void *g16 = dup_to_gpu(all, sizeof(all)), *g32;
        CHECK_OK(NULL, accel__dev_alloc(gpu, sizeof(got), 0, &g32));
        CHECK_OK(NULL, accel__dev_convert(gpu, accel__dspan_f32(g32, 65536),
                                          accel__dspan_of(g16, h, 65536), NULL));
        from_gpu(got, g32, sizeof(got));
        same_bytes(k ? "every f16 -> f32" : "every bf16 -> f32", want, got, sizeof(got));
        accel__dev_free(gpu, g16);
        accel__dev_free(gpu, g32);
    }
}

typedef enum { K_SCALE, K_CLAMP, K_ZERO, K_UNSCALE } ew_kind;

static void test_elementwise(ew_kind kind)
{
    static const float factors[] = {0.5f, -3.0f, 0.0f, 1e-30f, 65536.0f, 1.0f / 3.0f};
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        float *x = xmalloc(n * 4), *got = xmalloc(n * 4);
        fill_f32(x, n, 1);
        float f = factors[c % (sizeof(factors) / sizeof(factors[0]))];
        float *gx = dup_to_gpu(x, n * 4);
        int32_t want_flag = 7, got_flag = 7, *gflag = dup_to_gpu(&got_flag, 4);
        accel__stream *s = c % 2 ? gstream : NULL;
        accel__dspan hs = accel__dspan_f32(x, n), gs = accel__dspan_f32(gx, n);
        switch (kind) {
        case K_SCALE:
            CHECK_OK(NULL, accel__dev_scale(cpu, hs, f, NULL));
            CHECK_OK(NULL, accel__dev_scale(gpu, gs, f, s));
            break;
        case K_CLAMP:
            CHECK_OK(NULL, accel__dev_clamp(cpu, hs, -1.5f, 2.25f, NULL));
            CHECK_OK(NULL, accel__dev_clamp(gpu, gs, -1.5f, 2.25f, s));
            break;
        case K_ZERO:
            CHECK_OK(NULL, accel__dev_zero(cpu, hs, NULL));
            CHECK_OK(NULL, accel__dev_zero(gpu, gs, s));
            break;
        case K_UNSCALE:
            if (c % 3 == 0) { /* all finite: the flag must stay untouched */
                for (size_t i = 0; i < n; i++) {
                    if (!isfinite(x[i])) {
                        x[i] = 1.0f;
                    }
                }
                CHECK_OK(NULL, accel__dev_copy(gpu, gx, x, n * 4, ACCEL__COPY_H2D, NULL));
                f = 0.25f;
            }
            CHECK_OK(NULL, accel__dev_unscale_check(cpu, hs, f, &want_flag, NULL));
            CHECK_OK(NULL, accel__dev_unscale_check(gpu, gs, f, gflag, s));
            break;
        }
        CHECK_OK(NULL, accel__stream_sync(gpu, gstream));
        from_gpu(got, gx, n * 4);
        from_gpu(&got_flag, gflag, 4);
        char what[64];
        snprintf(what, sizeof(what), "element-wise kernel %d, %zu elements, factor %g", (int)kind,
                 n, (double)f);
        same_floats(what, x, got, n);
        CHECK_MSG(want_flag == got_flag, "%s: flag cpu %d gpu %d", what, want_flag, got_flag);
        accel__dev_free(gpu, gx);
        accel__dev_free(gpu, gflag);
        free(x), free(got);
    }
}

/* The scale kernel keeps four loads of a thread in flight while a whole stride of four fits
 * (4096 blocks of 256 threads: from 2^22 elements): once through that loop and the rest one at
 * a time, where the emulator's shortened last count takes only the latter. */
static void test_scale_wide(void)
{
    size_t n = (4u << 20) + 1001;
    float *x = xmalloc(n * 4), *got = xmalloc(n * 4);
    fill_f32(x, n, 1);
    float *gx = dup_to_gpu(x, n * 4);
    CHECK_OK(NULL, accel__dev_scale(cpu, accel__dspan_f32(x, n), -0.75f, NULL));
    CHECK_OK(NULL, accel__dev_scale(gpu, accel__dspan_f32(gx, n), -0.75f, gstream));
    CHECK_OK(NULL, accel__stream_sync(gpu, gstream));
    from_gpu(got, gx, n * 4);
    same_floats("scale, four loads in flight", x, got, n);
    accel__dev_free(gpu, gx);
    free(x), free(got);
}

static void test_nonfinite(void)
{
    static const accel_dtype dts[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    static const uint32_t bad32[] = {0x7f800000u, 0xff800001u, 0x7fc00000u};
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        for (int di = 0; di < 3; di++) {
            accel_dtype dt = dts[di];
            for (int plant = 0; plant < 3; plant++) { /* none, one at random, the last */
                float *f = xmalloc(n * 4);
                for (size_t i = 0; i < n; i++) {
                    f[i] = frand(-100.0f, 100.0f);
                }
                size_t at = plant == 1 ? (size_t)(next() % n) : n - 1;
                if (plant > 0) {
                    f[at] = accel__bits_f32(bad32[next() % 3]);
                }
                void *x = xmalloc(n * dt_size(dt));
                CHECK_OK(NULL, accel_convert(x, dt, f, ACCEL_F32, n));
                void *gx = dup_to_gpu(x, n * dt_size(dt));
                int32_t want = 7, got = 7, *gflag = dup_to_gpu(&got, 4);
                CHECK_OK(NULL, accel__dev_nonfinite(cpu, accel__dspan_of(x, dt, n), &want, NULL));
                CHECK_OK(NULL, accel__dev_nonfinite(gpu, accel__dspan_of(gx, dt, n), gflag, NULL));
                from_gpu(&got, gflag, 4);
                CHECK_MSG(want == (plant ? 1 : 7) && got == want,
                          "nonfinite %s n=%zu plant=%d: %d %d", accel_dtype_name(dt), n, plant,
                          want, got);
                accel__dev_free(gpu, gx);
                accel__dev_free(gpu, gflag);
                free(f), free(x);
            }
        }
    }
}

/* ---- reductions ---- */

static void test_reductions(void)
{
    static const accel_dtype dts[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    static const double ps[] = {2.0, 1.0, 3.0, 0.5};
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        for (int di = 0; di < 3; di++) {
            accel_dtype dt = dts[di];
            float *f = xmalloc(n * 4);
            for (size_t i = 0; i < n; i++) {
                f[i] = frand(-4.0f, 4.0f);
            }
            void *x = xmalloc(n * dt_size(dt));
            CHECK_OK(NULL, accel_convert(x, dt, f, ACCEL_F32, n));
            void *gx = dup_to_gpu(x, n * dt_size(dt));
            accel__dspan hs = accel__dspan_of(x, dt, n), gs = accel__dspan_of(gx, dt, n);
            double *gacc;
            CHECK_OK(NULL, accel__dev_alloc(gpu, 2 * sizeof(double), 0, (void **)&gacc));
            for (int pi = 0; pi < 4; pi++) {
                double p = ps[pi], want = 1.5, got[2] = {1.5, 1.5};
                CHECK_OK(NULL, accel__dev_pow_sum(cpu, hs, p, &want, NULL));
                /* twice, concurrently on the default order and a stream: same bits */
                CHECK_OK(NULL, accel__dev_copy(gpu, gacc, got, sizeof(got), ACCEL__COPY_H2D, NULL));
                CHECK_OK(NULL, accel__dev_pow_sum(gpu, gs, p, gacc, NULL));
                CHECK_OK(NULL, accel__dev_pow_sum(gpu, gs, p, gacc + 1, gstream));
                CHECK_OK(NULL, accel__stream_sync(gpu, gstream));
                from_gpu(got, gacc, sizeof(got));
                double tol = (double)n * (p == 1.0 || p == 2.0 ? 0x1p-52 : 0x1p-50) * fabs(want);
                CHECK_MSG(fabs(got[0] - want) <= tol, "pow_sum p=%g %s n=%zu: cpu %.17g gpu %.17g",
                          p, accel_dtype_name(dt), n, want, got[0]);
                CHECK_MSG(memcmp(&got[0], &got[1], 8) == 0, "pow_sum is not deterministic");
            }
            double want = 0.25, got = 0.25;
            CHECK_OK(NULL, accel__dev_copy(gpu, gacc, &got, 8, ACCEL__COPY_H2D, NULL));
            CHECK_OK(NULL, accel__dev_abs_max(cpu, hs, &want, NULL));
            CHECK_OK(NULL, accel__dev_abs_max(gpu, gs, gacc, NULL));
            from_gpu(&got, gacc, 8);
            CHECK_MSG(memcmp(&want, &got, 8) == 0, "abs_max %s n=%zu: %.17g %.17g",
                      accel_dtype_name(dt), n, want, got);
            /* A NaN anywhere makes both NaN, and a NaN result sticks in later calls. */
            f[next() % n] = NAN;
            CHECK_OK(NULL, accel_convert(x, dt, f, ACCEL_F32, n));
            CHECK_OK(NULL, accel__dev_copy(gpu, gx, x, n * dt_size(dt), ACCEL__COPY_H2D, NULL));
            CHECK_OK(NULL, accel__dev_abs_max(cpu, hs, &want, NULL));
            CHECK_OK(NULL, accel__dev_abs_max(gpu, gs, gacc, NULL));
            from_gpu(&got, gacc, 8);
            CHECK(isnan(want) && isnan(got));
            double sum[2] = {0, 0};
            CHECK_OK(NULL, accel__dev_pow_sum(cpu, hs, 2.0, &sum[0], NULL));
            CHECK_OK(NULL, accel__dev_copy(gpu, gacc + 1, &sum[1], 8, ACCEL__COPY_H2D, NULL));
            CHECK_OK(NULL, accel__dev_pow_sum(gpu, gs, 2.0, gacc + 1, NULL));
            from_gpu(&sum[1], gacc + 1, 8);
            CHECK(isnan(sum[0]) && isnan(sum[1]));
            float small = 0.5f; /* finite data now: the NaN in the accumulator stays */
            CHECK_OK(NULL, accel_convert(x, dt, &small, ACCEL_F32, 1));
            CHECK_OK(NULL, accel__dev_copy(gpu, gx, x, dt_size(dt), ACCEL__COPY_H2D, NULL));
            CHECK_OK(NULL, accel__dev_abs_max(gpu, accel__dspan_of(gx, dt, 1), gacc, NULL));
            from_gpu(&got, gacc, 8);
            CHECK(isnan(got));
            accel__dev_free(gpu, gx);
            accel__dev_free(gpu, gacc);
            free(f), free(x);
        }
    }
}

/* ---- optimizer steps, bit for bit over several steps ---- */

static void test_sgd(void)
{
    for (int variant = 0; variant < 6; variant++) {
        size_t n = counts[variant % N_COUNTS];
        float *p = xmalloc(n * 4), *g = xmalloc(n * 4), *b = xmalloc(n * 4), *got = xmalloc(n * 4);
        fill_f32(p, n, 0);
        float *gp = dup_to_gpu(p, n * 4), *gg, *gb;
        CHECK_OK(NULL, accel__dev_alloc(gpu, n * 4, 1, (void **)&gg));
        CHECK_OK(NULL, accel__dev_alloc(gpu, n * 4, 1, (void **)&gb));
        memset(b, 0, n * 4);
        for (int step = 0; step < 3; step++) {
            fill_f32(g, n, 0);
            CHECK_OK(NULL, accel__dev_copy(gpu, gg, g, n * 4, ACCEL__COPY_H2D, NULL));
            accel__sgd_args a = {p,
                                 g,
                                 variant > 0 ? b : NULL,
                                 n,
                                 0.01f,
                                 variant % 3 == 2 ? 0.0f : 1e-2f,
                                 variant > 0 ? 0.9f : 0.0f,
                                 variant == 3 ? 0.1f : 0.0f,
                                 variant == 4,
                                 variant == 5,
                                 step == 0};
            CHECK_OK(NULL, accel__dev_sgd_step(cpu, &a, NULL));
            a.param = gp, a.grad = gg, a.momentum_buf = variant > 0 ? gb : NULL;
            CHECK_OK(NULL, accel__dev_sgd_step(gpu, &a, step % 2 ? gstream : NULL));
            CHECK_OK(NULL, accel__stream_sync(gpu, gstream));
        }
        from_gpu(got, gp, n * 4);
        char what[48];
        snprintf(what, sizeof(what), "sgd variant %d, %zu", variant, n);
        same_floats(what, p, got, n);
        if (variant > 0) {
            from_gpu(got, gb, n * 4);
            same_floats(what, b, got, n);
        }
        accel__dev_free(gpu, gp), accel__dev_free(gpu, gg), accel__dev_free(gpu, gb);
        free(p), free(g), free(b), free(got);
    }
}

static void test_adam(void)
{
    for (int variant = 0; variant < 8; variant++) { /* bits: decoupled, amsgrad, maximize */
        size_t n = counts[(variant + 2) % N_COUNTS];
        int decoupled = variant & 1, amsgrad = (variant >> 1) & 1, maximize = (variant >> 2) & 1;
        float *h[4], *d[4], *got = xmalloc(n * 4); /* param, exp_avg, exp_avg_sq, max */
        for (int k = 0; k < 4; k++) {
            h[k] = xmalloc(n * 4);
            if (k == 0) {
                fill_f32(h[k], n, 0);
            } else {
                memset(h[k], 0, n * 4);
            }
            d[k] = dup_to_gpu(h[k], n * 4);
        }
        float *g = xmalloc(n * 4), *gg;
        CHECK_OK(NULL, accel__dev_alloc(gpu, n * 4, 0, (void **)&gg));
        /* The compute copy written in the same pass at the even steps (the odd ones leave it):
         * bf16 or f16 by variant, poisoned first on the GPU (the emulator's allocations). */
        accel_dtype cdt = (variant >> 1) & 1 ? ACCEL_F16 : ACCEL_BF16;
        uint16_t *hc = xmalloc(n * 2), *gc = xmalloc(n * 2), *dc;
        CHECK_OK(NULL, accel__dev_alloc(gpu, n * 2, 0, (void **)&dc));
        for (int t = 1; t <= 4; t++) {
            fill_f32(g, n, 0);
            CHECK_OK(NULL, accel__dev_copy(gpu, gg, g, n * 4, ACCEL__COPY_H2D, NULL));
            float bc1 = (float)(1.0 - pow(0.9, t)), bc2 = (float)sqrt(1.0 - pow(0.999, t));
            void *copy = t % 2 ? NULL : hc;
            accel__adam_args a = {h[0],   g,     h[1],  h[2],      amsgrad ? h[3] : NULL,
                                  n,      1e-3f, 0.01f, decoupled, 0.9f,
                                  0.999f, 1e-8f, bc1,   bc2,       maximize,
                                  copy,   cdt};
            CHECK_OK(NULL, accel__dev_adam_step(cpu, &a, NULL));
            a.param = d[0], a.grad = gg, a.exp_avg = d[1], a.exp_avg_sq = d[2];
            a.max_exp_avg_sq = amsgrad ? d[3] : NULL;
            a.compute = t % 2 ? NULL : dc;
            CHECK_OK(NULL, accel__dev_adam_step(gpu, &a, t % 2 ? gstream : NULL));
            CHECK_OK(NULL, accel__stream_sync(gpu, gstream));
        }
        for (int k = 0; k < (amsgrad ? 4 : 3); k++) {
            from_gpu(got, d[k], n * 4);
            char what[64];
            snprintf(what, sizeof(what), "adam variant %d buffer %d, %zu", variant, k, n);
            same_floats(what, h[k], got, n);
        }
        /* The copy is the final params rounded (the CPU's is its convert after the step). */
        from_gpu(gc, dc, n * 2);
        char what[64];
        snprintf(what, sizeof(what), "adam variant %d compute copy %s, %zu", variant,
                 accel_dtype_name(cdt), n);
        same_bytes(what, hc, gc, n * 2);
        uint16_t *want = (uint16_t *)got; /* n * 4 bytes: room for the reference */
        CHECK_OK(NULL, accel_convert(want, cdt, h[0], ACCEL_F32, n));
        same_bytes(what, want, hc, n * 2);
        for (int k = 0; k < 4; k++) {
            accel__dev_free(gpu, d[k]);
            free(h[k]);
        }
        accel__dev_free(gpu, gg), accel__dev_free(gpu, dc);
        free(g), free(got), free(hc), free(gc);
    }
}

/* ---- memory, copies, streams, events, errors ---- */

static void test_plumbing(void)
{
    char about[256];
    accel__device_describe(gpu, about, sizeof(about));
    CHECK_MSG(accel__device_is_sim(gpu) ? strstr(about, "simulated GPU") != NULL
                                        : strstr(about, "compute capability") &&
                                              strstr(about, "driver") && strstr(about, "runtime"),
              "%s", about);
    printf("test_device_cuda: %s: %s\n", accel__device_name(gpu), about);
    accel__device *again;
    CHECK_OK(NULL, accel__device_open(&again, (accel_device){ACCEL_DEVICE_CUDA, 0}));
    CHECK(again == gpu && accel__device_which(gpu).type == ACCEL_DEVICE_CUDA);
    CHECK(accel__stream_native(gpu, NULL) != NULL && accel__stream_native(gpu, gstream) != NULL);
    CHECK(accel__stream_native(gpu, NULL) != accel__stream_native(gpu, gstream));

    size_t n = 1 << 20;
    unsigned char *h, *back = xmalloc(n);
    void *a, *b;
    CHECK_OK(NULL, accel__dev_host_alloc(gpu, n, (void **)&h));
    CHECK_OK(NULL, accel__dev_alloc(gpu, n, 1, &a));
    CHECK_OK(NULL, accel__dev_alloc(gpu, n, 0, &b));
    from_gpu(back, a, n);
    for (size_t i = 0; i < n; i++) {
        CHECK(back[i] == 0); /* zero-filled */
    }
    for (size_t i = 0; i < n; i++) {
        h[i] = (unsigned char)next();
    }
    for (int on_stream = 0; on_stream < 2; on_stream++) {
        accel__stream *s = on_stream ? gstream : NULL;
        CHECK_OK(NULL, accel__dev_copy(gpu, a, h, n, ACCEL__COPY_H2D, s));
        CHECK_OK(NULL, accel__dev_copy(gpu, b, a, n, ACCEL__COPY_D2D, s));
        CHECK_OK(NULL, accel__dev_memset(gpu, a, 0x33, n / 2, s));
        memset(back, 0, n);
        CHECK_OK(NULL, accel__dev_copy(gpu, back, b, n, ACCEL__COPY_D2H, s));
        CHECK_OK(NULL, accel__stream_sync(gpu, s));
        CHECK(memcmp(back, h, n) == 0);
        CHECK_OK(NULL, accel__dev_copy(gpu, back, a, n, ACCEL__COPY_D2H, s));
        CHECK_OK(NULL, accel__stream_sync(gpu, s));
        CHECK(back[0] == 0x33 && back[n / 2 - 1] == 0x33 && back[n / 2] == h[n / 2]);
        unsigned char hh[64];
        CHECK_OK(NULL, accel__dev_copy(gpu, hh, h, 64, ACCEL__COPY_H2H, s));
        CHECK_OK(NULL, accel__stream_sync(gpu, s));
        CHECK(memcmp(hh, h, 64) == 0);
    }

    /* Events order a second stream after the first. */
    accel__stream *s2;
    accel__event *e;
    CHECK_OK(NULL, accel__stream_new(gpu, &s2));
    CHECK_OK(NULL, accel__event_new(gpu, &e));
    CHECK(accel__event_query(gpu, e) == 1); /* never recorded */
    float *x;
    /* (The CUDA emulator runs work when it is issued, the simulated GPU when something waits
     * for it: nothing to catch running, so less.) */
    size_t nx = getenv("ACCEL_CUEMU") != NULL || accel__device_is_sim(gpu) ? (size_t)1 << 20
                                                                           : (size_t)64 << 20;
    CHECK_OK(NULL, accel__dev_alloc(gpu, nx * 4, 1, (void **)&x));
    for (int k = 0; k < 8; k++) { /* work long enough to be caught running */
        CHECK_OK(NULL, accel__dev_scale(gpu, accel__dspan_f32(x, nx), 2.0f, gstream));
    }
    CHECK_OK(NULL, accel__dev_memset(gpu, x, 0, 4, gstream));
    CHECK_OK(NULL, accel__event_record(gpu, e, gstream));
    CHECK_OK(NULL, accel__stream_wait_event(gpu, s2, e));
    float one = 1.0f, got = 0;
    CHECK_OK(NULL, accel__dev_copy(gpu, x, &one, 4, ACCEL__COPY_H2D, s2)); /* after the memset */
    CHECK_OK(NULL, accel__event_sync(gpu, e));
    CHECK(accel__event_query(gpu, e) == 1);
    CHECK_OK(NULL, accel__stream_sync(gpu, s2));
    from_gpu(&got, x, 4);
    CHECK(got == 1.0f);
    accel__event_free(gpu, e);
    accel__stream_free(gpu, s2);
    accel__dev_free(gpu, x);
    accel__dev_free(gpu, a);
    accel__dev_free(gpu, b);
    accel__dev_host_free(gpu, h);
    free(back);

    /* Errors name the culprit. */
    int32_t *i32;
    CHECK_OK(NULL, accel__dev_alloc(gpu, 64, 1, (void **)&i32));
    CHECK_ERR(NULL, accel__dev_scale(gpu, accel__dspan_of(i32, ACCEL_I32, 4), 2.0f, NULL),
              ACCEL_EUNSUPPORTED, "cuda device: scale does not support dtype I32");
    CHECK_ERR(NULL,
              accel__dev_convert(gpu, accel__dspan_of(i32, ACCEL_I32, 4),
                                 accel__dspan_of(i32, ACCEL_F32, 4), NULL),
              ACCEL_EUNSUPPORTED, "cuda device: convert (destination) does not support dtype I32");
    accel__dev_free(gpu, i32);
    void *huge;
    CHECK(accel__dev_alloc(gpu, (size_t)1 << 60, 0, &huge) == ACCEL_ENOMEM);
    CHECK_MSG(strstr(accel_last_error(NULL), "1152921504606846976 bytes"), "%s",
              accel_last_error(NULL));
    int n_gpus = 0;
    CHECK_OK(NULL, accel__device_count(ACCEL_DEVICE_CUDA, &n_gpus));
    CHECK(n_gpus >= 1);
    CHECK(accel__device_open(&again, (accel_device){ACCEL_DEVICE_CUDA, n_gpus}) ==
          ACCEL_EUNSUPPORTED);
    CHECK_MSG(strstr(accel_last_error(NULL), "does not exist"), "%s", accel_last_error(NULL));
}

int main(void)
{
    const char *sim = getenv("ACCEL_SIM_GPU"); /* a build without CUDA: the simulated GPU */
    accel__device_sim_enable(sim ? atoi(sim) : 0);
    CHECK_OK(NULL, accel__device_open(&cpu, (accel_device){ACCEL_DEVICE_CPU, 0}));
    accel_status st = accel__device_open(&gpu, (accel_device){ACCEL_DEVICE_CUDA, 0});
    if (st != ACCEL_OK) {
        CHECK_MSG(st == ACCEL_EUNSUPPORTED && strstr(accel_last_error(NULL), "cuda:0"), "%s: %s",
                  accel_status_name(st), accel_last_error(NULL));
        fprintf(stderr, "test_device_cuda: skipped: %s\n", accel_last_error(NULL));
        return 77;
    }
    const char *s = getenv("ACCEL_TEST_SEED");
    seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("test_device_cuda: seed %llu (ACCEL_TEST_SEED=%llu repeats this run)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    fflush(stdout);
    if (getenv("ACCEL_CUEMU") != NULL || accel__device_is_sim(gpu)) {
        counts[N_COUNTS - 1] = (1u << 20) + 1001;
    }
    CHECK_OK(NULL, accel__stream_new(gpu, &gstream));
    test_plumbing();
    test_convert();
    test_elementwise(K_SCALE);
    test_elementwise(K_CLAMP);
    test_elementwise(K_ZERO);
    test_elementwise(K_UNSCALE);
    test_scale_wide();
    test_nonfinite();
    test_reductions();
    test_sgd();
    test_adam();
    accel__stream_free(gpu, gstream);
    printf("test_device_cuda: ok\n");
    return 0;
}
