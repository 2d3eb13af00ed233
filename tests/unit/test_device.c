/*
 * The CPU device (src/device): every kernel against a plain scalar reference written here, at
 * odd counts and past the size where kernels fan out to threads, on the default stream and on
 * a stream (single-threaded), for every dtype each kernel supports. Element-wise kernels,
 * optimizer steps and conversions must match bit for bit; the norms too, because both sides
 * sum in double in element order. Also memory, copies, streams, events and bad input.
 */
#include <string.h>

#include "base/half.h"
#include "check.h"
#include "device/device.h"

/* Odd counts, and one past two OpenMP chunks of the parallel kernels. */
static const size_t counts[] = {1, 7, 33, 1001, 3 * 65536 + 17};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))
#define NMAX (3 * 65536 + 17)

static unsigned long long rng = 99;
static float frand(void) /* in [-2, 2) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng >> 11) / (double)(1ULL << 53) * 4.0 - 2.0);
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = frand();
    }
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static accel__device *dev;
static accel__stream *stream;
/* The two orders every kernel is run in: the default (threads allowed) and a stream. */
#define FOR_STREAMS(s)                                                                             \
    for (int s##_o = 0; s##_o < 2; s##_o++)                                                        \
        for (accel__stream *s = s##_o ? stream : NULL, **s##_p = &s; s##_p != NULL; s##_p = NULL)

static void test_handles_and_memory(void)
{
    accel__device *d2;
    CHECK_OK(NULL, accel__device_open(&d2, (accel_device){ACCEL_DEVICE_CPU, 0}));
    CHECK(d2 == dev && strcmp(accel__device_name(dev), "cpu") == 0);
    CHECK(accel__device_which(dev).type == ACCEL_DEVICE_CPU);
    accel__device_close(d2);
    CHECK(accel__device_open(&d2, (accel_device){ACCEL_DEVICE_CPU, 1}) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "cpu:1") != NULL);
    int n_gpus = 0;
    if (accel__device_count(ACCEL_DEVICE_CUDA, &n_gpus) != ACCEL_OK) { /* no GPU: named */
        CHECK(n_gpus == 0);
        CHECK(accel__device_open(&d2, (accel_device){ACCEL_DEVICE_CUDA, 0}) == ACCEL_EUNSUPPORTED);
        CHECK(strstr(accel_last_error(NULL), "cuda:0") != NULL);
    }
    CHECK(accel__device_open(&d2, (accel_device){ACCEL_DEVICE_CUDA, -1}) == ACCEL_EINVAL);
    int n_cpu = 0;
    CHECK_OK(NULL, accel__device_count(ACCEL_DEVICE_CPU, &n_cpu));
    CHECK(n_cpu == 1);
    char about[64];
    accel__device_describe(dev, about, sizeof(about));
    CHECK(strcmp(about, "cpu") == 0);
    CHECK(accel__stream_native(dev, NULL) == NULL && accel__stream_native(dev, stream) == NULL);

    void *a, *b, *h;
    CHECK_OK(NULL, accel__dev_alloc(dev, 1000, 1, &a));
    CHECK(((uintptr_t)a & 63) == 0);
    for (int i = 0; i < 1000; i++) {
        CHECK(((unsigned char *)a)[i] == 0);
    }
    CHECK_OK(NULL, accel__dev_alloc(dev, 1000, 0, &b));
    CHECK_OK(NULL, accel__dev_host_alloc(dev, 1000, &h));
    CHECK_OK(NULL, accel__dev_memset(dev, a, 0x5a, 999, NULL));
    CHECK(((unsigned char *)a)[998] == 0x5a && ((unsigned char *)a)[999] == 0);
    accel__copy_kind kinds[4] = {ACCEL__COPY_H2H, ACCEL__COPY_H2D, ACCEL__COPY_D2H,
                                 ACCEL__COPY_D2D};
    for (int k = 0; k < 4; k++) {
        memset(b, 0, 1000);
        CHECK_OK(NULL, accel__dev_copy(dev, b, a, 1000, kinds[k], stream));
        CHECK(memcmp(a, b, 1000) == 0);
    }
    CHECK(accel__dev_copy(dev, NULL, a, 4, ACCEL__COPY_D2D, NULL) == ACCEL_EINVAL);
    CHECK_OK(NULL, accel__dev_copy(dev, NULL, NULL, 0, ACCEL__COPY_D2D, NULL)); /* empty */
    CHECK(accel__dev_memset(dev, NULL, 0, 4, NULL) == ACCEL_EINVAL);
    accel__dev_free(dev, a);
    accel__dev_free(dev, b);
    accel__dev_host_free(dev, h);
    accel__dev_free(dev, NULL);

    /* Streams and events are trivially complete on the CPU. */
    accel__stream *s2;
    accel__event *e;
    CHECK_OK(NULL, accel__stream_new(dev, &s2));
    CHECK_OK(NULL, accel__event_new(dev, &e));
    CHECK(accel__event_query(dev, e) == 1); /* never recorded */
    CHECK_OK(NULL, accel__event_record(dev, e, s2));
    CHECK_OK(NULL, accel__stream_wait_event(dev, stream, e));
    CHECK(accel__event_query(dev, e) == 1);
    CHECK_OK(NULL, accel__event_sync(dev, e));
    CHECK_OK(NULL, accel__stream_sync(dev, s2));
    CHECK_OK(NULL, accel__stream_sync(dev, NULL));
    accel__event_free(dev, e);
    accel__stream_free(dev, s2);
    accel__stream_free(dev, NULL);
}

/* torch.optim.SGD, one element, as torch's single-tensor loop in fp32. */
static void sgd_ref(const accel__sgd_args *a, float *p, const float *g, float *buf)
{
    for (size_t i = 0; i < a->count; i++) {
        float d = (a->maximize ? -g[i] : g[i]) + a->weight_decay * p[i];
        if (a->momentum != 0.0f) {
            float b = a->first_step ? d : a->momentum * buf[i] + (1.0f - a->dampening) * d;
            buf[i] = b;
            d = a->nesterov ? d + a->momentum * b : b;
        }
        p[i] = p[i] - a->lr * d;
    }
}

static void test_sgd(void)
{
    float *p = malloc(NMAX * 4), *g = malloc(NMAX * 4), *b = malloc(NMAX * 4);
    float *rp = malloc(NMAX * 4), *rb = malloc(NMAX * 4);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        for (int variant = 0; variant < 4; variant++) {
            FOR_STREAMS(s)
            {
                fill(p, n);
                fill(g, n);
                fill(b, n);
                memcpy(rp, p, n * 4);
                memcpy(rb, b, n * 4);
                accel__sgd_args a = {p,
                                     g,
                                     variant ? b : NULL,
                                     n,
                                     0.1f,
                                     variant == 3 ? 0.01f : 0,
                                     variant ? 0.9f : 0,
                                     variant == 2 ? 0.25f : 0,
                                     variant == 1,
                                     variant == 3,
                                     variant == 2};
                CHECK_OK(NULL, accel__dev_sgd_step(dev, &a, s));
                sgd_ref(&a, rp, g, rb);
                CHECK_MSG(same_bits(p, rp, n), "sgd variant %d n %zu", variant, n);
                CHECK(variant == 0 || same_bits(b, rb, n));
            }
        }
    }
    accel__sgd_args bad = {p, g, NULL, 4, 0.1f, 0, 0.9f, 0, 0, 0, 0}; /* momentum, no buffer */
    CHECK(accel__dev_sgd_step(dev, &bad, NULL) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "momentum_buf") != NULL);
    free(p), free(g), free(b), free(rp), free(rb);
}

/* torch.optim.Adam / AdamW, as torch's single-tensor loop in fp32 (lerp for exp_avg). */
static void adam_ref(const accel__adam_args *a, float *p, const float *g, float *m, float *v,
                     float *vmax)
{
    float l2 = a->decoupled ? 0.0f : a->weight_decay;
    float decay = a->decoupled ? 1.0f - a->lr * a->weight_decay : 1.0f;
    float step = a->lr / a->bias_correction1, w1 = 1.0f - a->beta1, w2 = 1.0f - a->beta2;
    for (size_t i = 0; i < a->count; i++) {
        float grad = (a->maximize ? -1.0f : 1.0f) * g[i] + l2 * p[i];
        float param = p[i] * decay;
        m[i] = m[i] + w1 * (grad - m[i]);
        v[i] = v[i] * a->beta2 + w2 * grad * grad;
        float sv = v[i];
        if (vmax != NULL) {
            sv = vmax[i] > v[i] ? vmax[i] : v[i];
            vmax[i] = sv;
        }
        float denom = sqrtf(sv) / a->bias_correction2_sqrt + a->eps;
        p[i] = param - step * (m[i] / denom);
    }
}

static void test_adam(void)
{
    size_t nb = NMAX * 4;
    float *p = malloc(nb), *g = malloc(nb), *m = malloc(nb), *v = malloc(nb), *x = malloc(nb);
    float *rp = malloc(nb), *rm = malloc(nb), *rv = malloc(nb), *rx = malloc(nb);
    uint16_t *cc = malloc(NMAX * 2), *rc = malloc(NMAX * 2);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        for (int variant = 0; variant < 3; variant++) { /* Adam, AdamW, AdamW + amsgrad */
            FOR_STREAMS(s)
            {
                fill(p, n);
                fill(g, n);
                fill(m, n);
                fill(v, n);
                fill(x, n);
                for (size_t i = 0; i < n; i++) {
                    v[i] = fabsf(v[i]);
                    x[i] = fabsf(x[i]);
                }
                memcpy(rp, p, n * 4);
                memcpy(rm, m, n * 4);
                memcpy(rv, v, n * 4);
                memcpy(rx, x, n * 4);
                accel__adam_args a = {p,
                                      g,
                                      m,
                                      v,
                                      variant == 2 ? x : NULL,
                                      n,
                                      1e-3f,
                                      0.01f,
                                      variant > 0,
                                      0.9f,
                                      0.999f,
                                      1e-8f,
                                      1.0f - 0.9f * 0.9f,
                                      sqrtf(1.0f - 0.999f * 0.999f),
                                      variant == 1,
                                      variant > 0 ? cc : NULL, /* with a compute copy */
                                      variant == 2 ? ACCEL_F16 : ACCEL_BF16};
                CHECK_OK(NULL, accel__dev_adam_step(dev, &a, s));
                adam_ref(&a, rp, g, rm, rv, variant == 2 ? rx : NULL);
                CHECK_MSG(same_bits(p, rp, n) && same_bits(m, rm, n) && same_bits(v, rv, n),
                          "adam variant %d n %zu", variant, n);
                CHECK(variant != 2 || same_bits(x, rx, n));
                if (a.compute != NULL) { /* the updated params rounded */
                    CHECK_OK(NULL, accel_convert(rc, a.compute_dtype, rp, ACCEL_F32, n));
                    CHECK_MSG(memcmp(cc, rc, n * 2) == 0, "adam compute copy n %zu", n);
                }
            }
        }
    }
    /* A compute copy in a dtype other than BF16 / F16 is refused. */
    accel__adam_args bad = {p,    g,      m,     v,    NULL, 4, 1e-3f, 0.0f,     1,
                            0.9f, 0.999f, 1e-8f, 0.1f, 0.1f, 0, p,     ACCEL_F32};
    CHECK(accel__dev_adam_step(dev, &bad, NULL) == ACCEL_EINVAL);
    free(p), free(g), free(m), free(v), free(x), free(rp), free(rm), free(rv), free(rx);
    free(cc), free(rc);
}

/* The scalar reference conversions of base/half.h, element by element. */
static void convert_ref(void *dst, accel_dtype dd, const void *src, accel_dtype sd, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f = sd == ACCEL_F32    ? ((const float *)src)[i]
                  : sd == ACCEL_BF16 ? accel__bf16_to_f32(((const uint16_t *)src)[i])
                                     : accel__f16_to_f32(((const uint16_t *)src)[i]);
        if (dd == ACCEL_F32) {
            ((float *)dst)[i] = f;
        } else if (dd == ACCEL_BF16) {
            ((uint16_t *)dst)[i] = accel__f32_to_bf16(f);
        } else {
            ((uint16_t *)dst)[i] = accel__f32_to_f16(f);
        }
    }
}

static void test_convert(void)
{
    const accel_dtype dts[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    float *src32 = malloc(NMAX * 4);
    void *src = malloc(NMAX * 4), *dst = malloc(NMAX * 4), *ref = malloc(NMAX * 4);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        fill(src32, n);
        src32[0] = INFINITY;
        if (n > 2) {
            src32[1] = NAN;
            src32[2] = 1e-40f; /* subnormal */
        }
        for (int si = 0; si < 3; si++) {
            convert_ref(src, dts[si], src32, ACCEL_F32, n);
            for (int di = 0; di < 3; di++) {
                FOR_STREAMS(s)
                {
                    memset(dst, 0xee, n * 4);
                    CHECK_OK(NULL, accel__dev_convert(dev, accel__dspan_of(dst, dts[di], n),
                                                      accel__dspan_of(src, dts[si], n), s));
                    /* bf16 <-> f16 goes through f32 exactly once, as accel_convert. */
                    convert_ref(ref, dts[di], src, dts[si], n);
                    CHECK_MSG(memcmp(dst, ref, n * accel_dtype_nbytes(dts[di])) == 0,
                              "convert %s -> %s, n %zu", accel_dtype_name(dts[si]),
                              accel_dtype_name(dts[di]), n);
                }
            }
        }
    }
    CHECK(accel__dev_convert(dev, accel__dspan_of(dst, ACCEL_F32, 3),
                             accel__dspan_of(src, ACCEL_F32, 4), NULL) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "3 elements, src 4") != NULL);
    CHECK(accel__dev_convert(dev, accel__dspan_of(dst, ACCEL_F32, 4),
                             accel__dspan_of(src, ACCEL_I32, 4), NULL) == ACCEL_EUNSUPPORTED);
    CHECK(strstr(accel_last_error(NULL), "I32") != NULL);
    CHECK_OK(NULL, accel__dev_convert(dev, accel__dspan_of(NULL, ACCEL_F32, 0),
                                      accel__dspan_of(NULL, ACCEL_BF16, 0), NULL));
    free(src32), free(src), free(dst), free(ref);
}

static void test_elementwise(void)
{
    float *x = malloc(NMAX * 4), *r = malloc(NMAX * 4);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        FOR_STREAMS(s)
        {
            fill(x, n);
            x[n / 2] = NAN;
            memcpy(r, x, n * 4);
            CHECK_OK(NULL, accel__dev_scale(dev, accel__dspan_f32(x, n), 0.3f, s));
            for (size_t i = 0; i < n; i++) {
                r[i] *= 0.3f;
            }
            CHECK(same_bits(x, r, n));
            CHECK_OK(NULL, accel__dev_clamp(dev, accel__dspan_f32(x, n), -0.25f, 0.5f, s));
            for (size_t i = 0; i < n; i++) {
                r[i] = r[i] < -0.25f ? -0.25f : (r[i] > 0.5f ? 0.5f : r[i]);
            }
            CHECK(same_bits(x, r, n) && isnan(x[n / 2])); /* NaN stays NaN */
        }
        /* zero: any dtype of whole bytes, exactly count elements. */
        for (int dt = 0; dt < ACCEL_DTYPE_COUNT; dt++) {
            size_t es = accel_dtype_nbytes((accel_dtype)dt);
            if (es == 0) {
                CHECK(accel__dev_zero(dev, accel__dspan_of(x, (accel_dtype)dt, 4), NULL) ==
                      ACCEL_EUNSUPPORTED); /* packed sub-byte */
                CHECK(strstr(accel_last_error(NULL), "sub-byte") != NULL);
                continue;
            }
            size_t k = n * 4 / es;
            k = k > 0 ? k - 1 : 0;
            memset(x, 0x7f, n * 4);
            CHECK_OK(NULL, accel__dev_zero(dev, accel__dspan_of(x, (accel_dtype)dt, k), NULL));
            const unsigned char *bytes = (const unsigned char *)x;
            for (size_t i = 0; i < k * es; i++) {
                CHECK(bytes[i] == 0);
            }
            CHECK(bytes[k * es] == 0x7f);
        }
    }
    CHECK(accel__dev_scale(dev, accel__dspan_of(x, ACCEL_BF16, 4), 2.0f, NULL) ==
          ACCEL_EUNSUPPORTED);
    CHECK(strstr(accel_last_error(NULL), "scale does not support dtype BF16") != NULL);
    CHECK(accel__dev_clamp(dev, accel__dspan_f32(x, 4), 1.0f, -1.0f, NULL) == ACCEL_EINVAL);
    CHECK(accel__dev_scale(dev, accel__dspan_f32(NULL, 4), 2.0f, NULL) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "scale: x is NULL (4 elements)") != NULL);
    CHECK_OK(NULL, accel__dev_scale(dev, accel__dspan_f32(NULL, 0), 2.0f, NULL));
    CHECK(accel__dev_zero(dev, accel__dspan_of(x, (accel_dtype)99, 4), NULL) == ACCEL_EINVAL);
    free(x), free(r);
}

/* The reductions read x as fp32 (widened exactly from bf16 / f16). */
static void widen(float *out, const void *x, accel_dtype dt, size_t n)
{
    convert_ref(out, ACCEL_F32, x, dt, n);
}

static void test_reductions(void)
{
    const accel_dtype dts[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    float *x32 = malloc(NMAX * 4), *w = malloc(NMAX * 4);
    void *x = malloc(NMAX * 4);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        fill(x32, n);
        for (int di = 0; di < 3; di++) {
            accel_dtype dt = dts[di];
            convert_ref(x, dt, x32, ACCEL_F32, n);
            widen(w, x, dt, n);
            accel__dspan sp = accel__dspan_of(x, dt, n);
            const double ps[3] = {2.0, 1.0, 3.0};
            for (int k = 0; k < 3; k++) {
                double sum = 0;
                for (size_t i = 0; i < n; i++) {
                    double a = fabs((double)w[i]);
                    sum += ps[k] == 2.0   ? (double)w[i] * (double)w[i]
                           : ps[k] == 1.0 ? a
                                          : pow(a, ps[k]);
                }
                double acc = 5.0; /* accumulates */
                CHECK_OK(NULL, accel__dev_pow_sum(dev, sp, ps[k], &acc, stream));
                CHECK_MSG(acc == 5.0 + sum, "pow_sum p=%g %s n=%zu: %.17g vs %.17g", ps[k],
                          accel_dtype_name(dt), n, acc, 5.0 + sum);
            }
            double mx = 0;
            for (size_t i = 0; i < n; i++) {
                mx = fabs((double)w[i]) > mx ? fabs((double)w[i]) : mx;
            }
            double acc = 0;
            CHECK_OK(NULL, accel__dev_abs_max(dev, sp, &acc, NULL));
            CHECK(acc == mx);
            acc = 100.0; /* a larger running max stays */
            CHECK_OK(NULL, accel__dev_abs_max(dev, sp, &acc, NULL));
            CHECK(acc == 100.0);
            int32_t flag = 0;
            CHECK_OK(NULL, accel__dev_nonfinite(dev, sp, &flag, NULL));
            CHECK(flag == 0);
            /* inf / NaN at the first, a middle and the last element. */
            size_t where[3] = {0, n / 2, n - 1};
            for (int k = 0; k < 3; k++) {
                for (int kind = 0; kind < 2; kind++) {
                    float bad = kind ? NAN : -INFINITY;
                    convert_ref((char *)x + where[k] * accel_dtype_nbytes(dt), dt, &bad, ACCEL_F32,
                                1);
                    FOR_STREAMS(s)
                    {
                        flag = 0;
                        CHECK_OK(NULL, accel__dev_nonfinite(dev, sp, &flag, s));
                        CHECK_MSG(flag == 1, "nonfinite %s n %zu at %zu", accel_dtype_name(dt), n,
                                  where[k]);
                    }
                    acc = 0;
                    CHECK_OK(NULL, accel__dev_abs_max(dev, sp, &acc, NULL));
                    CHECK(kind ? isnan(acc) : isinf(acc));
                    if (kind) {
                        CHECK_OK(NULL, accel__dev_abs_max(dev, sp, &acc, NULL));
                        CHECK(isnan(acc)); /* a NaN sticks */
                    }
                    convert_ref((char *)x + where[k] * accel_dtype_nbytes(dt), dt, &x32[where[k]],
                                ACCEL_F32, 1);
                }
            }
        }
    }
    /* The largest finite values are finite; the flag is only ever set. */
    float big[3] = {3.4028235e38f, -65504.0f, 1e-45f};
    int32_t flag = 1;
    CHECK_OK(NULL, accel__dev_nonfinite(dev, accel__dspan_f32(big, 3), &flag, NULL));
    CHECK(flag == 1);
    flag = 0;
    CHECK_OK(NULL, accel__dev_nonfinite(dev, accel__dspan_f32(big, 3), &flag, NULL));
    CHECK(flag == 0);
    uint16_t h[2] = {0x7bff, 0xfbff}; /* +-65504 in f16 */
    CHECK_OK(NULL, accel__dev_nonfinite(dev, accel__dspan_of(h, ACCEL_F16, 2), &flag, NULL));
    CHECK(flag == 0);
    double acc = 0;
    CHECK(accel__dev_pow_sum(dev, accel__dspan_f32(big, 3), 0.0, &acc, NULL) == ACCEL_EINVAL);
    CHECK(accel__dev_pow_sum(dev, accel__dspan_of(big, ACCEL_I32, 3), 2.0, &acc, NULL) ==
          ACCEL_EUNSUPPORTED);
    CHECK(accel__dev_abs_max(dev, accel__dspan_f32(big, 3), NULL, NULL) == ACCEL_EINVAL);
    CHECK(accel__dev_nonfinite(dev, accel__dspan_of(big, ACCEL_F64, 1), &flag, NULL) ==
          ACCEL_EUNSUPPORTED);
    free(x32), free(w), free(x);
}

static void test_unscale_check(void)
{
    float *x = malloc(NMAX * 4), *r = malloc(NMAX * 4);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        FOR_STREAMS(s)
        {
            fill(x, n);
            memcpy(r, x, n * 4);
            int32_t flag = 0;
            CHECK_OK(NULL,
                     accel__dev_unscale_check(dev, accel__dspan_f32(x, n), 1.0f / 1024, &flag, s));
            for (size_t i = 0; i < n; i++) {
                r[i] *= 1.0f / 1024;
            }
            CHECK(same_bits(x, r, n) && flag == 0);
            /* A product that overflows is caught, and the others are still scaled. */
            x[n - 1] = 3e38f;
            CHECK_OK(NULL, accel__dev_unscale_check(dev, accel__dspan_f32(x, n), 4.0f, &flag, s));
            CHECK(flag == 1 && isinf(x[n - 1]));
            CHECK(n == 1 || x[0] == r[0] * 4.0f);
        }
    }
    int32_t flag = 0;
    CHECK(accel__dev_unscale_check(dev, accel__dspan_f32(x, 4), 2.0f, NULL, NULL) == ACCEL_EINVAL);
    CHECK(accel__dev_unscale_check(dev, accel__dspan_of(x, ACCEL_F16, 4), 2.0f, &flag, NULL) ==
          ACCEL_EUNSUPPORTED);
    free(x), free(r);
}

int main(void)
{
    CHECK_OK(NULL, accel__device_open(&dev, (accel_device){ACCEL_DEVICE_CPU, 0}));
    CHECK_OK(NULL, accel__stream_new(dev, &stream));
    test_handles_and_memory();
    test_sgd();
    test_adam();
    test_convert();
    test_elementwise();
    test_reductions();
    test_unscale_check();
    accel__stream_free(dev, stream);
    accel__device_close(dev);
    return 0;
}
