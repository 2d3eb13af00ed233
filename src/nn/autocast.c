/*
 * Autocast for the CPU kernels: the ctx's autocast mode, the rounding helpers the matmul-class
 * ops use to emulate bf16 / fp16 kernels (inputs rounded, fp32 accumulation, gradient
 * contributions rounded before they are added), and the parameter working-copy lookup (the
 * bf16 / fp16 copy widened into per-op scratch, exactly the values rounding would give).
 *
 * Invariant: rounding is round-to-nearest-even through the library's converters (accel_convert
 * semantics: f16 overflow gives inf, NaN stays NaN), so an emulated fp16 gradient overflows
 * exactly where a real fp16 kernel's result would.
 */
#include "nn_internal.h"

int nn_ctx_set_autocast(nn_ctx *g, int mode)
{
    if (g == NULL) {
        return ACCEL_F32;
    }
    int prev = g->autocast_mode;
    if (mode == NN_AUTOCAST_AUTO || mode == ACCEL_F32 || mode == ACCEL_BF16 || mode == ACCEL_F16) {
        g->autocast_mode = mode;
    }
    return prev;
}

accel_dtype nn_ctx_autocast_dtype(const nn_ctx *g)
{
    return g != NULL ? nn__autocast(g) : ACCEL_F32;
}

void accel__nn_autocast_note(nn_ctx *g, const nn_tensor *t)
{
    if (g->autocast_auto != ACCEL_F32 || t->sink_compute == NULL) {
        return;
    }
    accel_tensor view;
    t->sink_compute(t->sink_ctx, t->param_index, &view);
    if (view.dtype == ACCEL_BF16 || view.dtype == ACCEL_F16) {
        g->autocast_auto = view.dtype;
    }
}

#define CHUNK 2048

/* One chunk: src -> 16-bit -> dst through a stack buffer (accel_convert cannot fail here:
 * valid dtypes, non-NULL, non-overlapping buffers). */
static void round_chunk(accel_dtype dt, float *dst, const float *src, int64_t n)
{
    uint16_t tmp[CHUNK];
    (void)accel_convert(tmp, dt, src, ACCEL_F32, (size_t)n);
    (void)accel_convert(dst, ACCEL_F32, tmp, dt, (size_t)n);
}

void accel__nn_round(accel_dtype dt, float *dst, const float *src, int64_t n)
{
    int64_t n_chunks = (n + CHUNK - 1) / CHUNK;
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t o = c * CHUNK, k = n - o < CHUNK ? n - o : CHUNK;
        round_chunk(dt, dst + o, src + o, k);
    }
}

void accel__nn_add_rounded(accel_dtype dt, float *dst, const float *src, int64_t n)
{
    int64_t n_chunks = (n + CHUNK - 1) / CHUNK;
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t o = c * CHUNK, k = n - o < CHUNK ? n - o : CHUNK;
        float r[CHUNK];
        round_chunk(dt, r, src + o, k);
        float *d = dst + o;
        NN_SIMD
        for (int64_t i = 0; i < k; i++) {
            d[i] += r[i];
        }
    }
}

float *accel__nn_scratch(nn_ctx *g, int64_t n, int zero)
{
    size_t nbytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
    float *p = zero ? accel__nn_zalloc(g, nbytes) : accel__nn_alloc(g, nbytes);
    if (p == NULL) {
        accel__nn_fail(g, ACCEL_ENOMEM, "autocast: out of memory for a %lld-element buffer",
                       (long long)n);
    }
    return p;
}

float *accel__nn_tmp_scratch(nn_ctx *g, int64_t n, int zero)
{
    size_t nbytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
    float *p = accel__nn_tmp_alloc(g, nbytes);
    if (p == NULL) {
        accel__nn_fail(g, ACCEL_ENOMEM, "autocast: out of memory for a %lld-element buffer",
                       (long long)n);
    } else if (zero) {
        memset(p, 0, nbytes);
    }
    return p;
}

/* dst[i] = src[i] widened from dt (exact), over threads for large n. */
static void widen(accel_dtype dt, float *dst, const void *src, int64_t n)
{
    int64_t n_chunks = (n + CHUNK - 1) / CHUNK;
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t o = c * CHUNK, k = n - o < CHUNK ? n - o : CHUNK;
        (void)accel_convert(dst + o, ACCEL_F32, (const uint16_t *)src + o, dt, (size_t)k);
    }
}

const float *accel__nn_cast(nn_ctx *g, const nn_tensor *t, accel_dtype dt, int *per_op)
{
    int64_t n = nn_numel(t);
    if (per_op != NULL) {
        *per_op = 0;
    }
    if (t->sink_compute != NULL && t->base == NULL && t->param_index >= 0) {
        accel_tensor c;
        t->sink_compute(t->sink_ctx, t->param_index, &c);
        if (c.data != NULL && c.dtype == dt && c.device.type == ACCEL_DEVICE_CPU) {
            float *r = accel__nn_tmp_scratch(g, n, 0);
            if (r != NULL) {
                widen(dt, r, c.data, n);
                if (per_op != NULL) {
                    *per_op = 1;
                }
            }
            return r;
        }
    }
    float *r = accel__nn_scratch(g, n, 0);
    if (r != NULL) {
        accel__nn_round(dt, r, t->data, n);
    }
    return r;
}
