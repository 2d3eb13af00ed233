/*
 * The CPU device: host memory, trivially complete streams and events, and the element-wise
 * kernels (casts, zero, scale, clamp, norms, inf/nan checks) behind the operations table; the
 * optimizer kernels are in cpu_optim.c.
 *
 * Invariants: every kernel gives the same bits as a plain scalar loop over the elements in
 * order (sums are taken sequentially in double; element-wise results do not depend on how
 * the range is split), and only calls on the default (NULL) stream fan out to OpenMP threads:
 * work on a stream runs on the calling thread alone.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* As in cpu_optim.c: without it -O2 leaves loops of unknown trip count scalar. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/convert.h"
#include "cpu_impl.h"
#include "device_impl.h"

static void cpu_describe(const accel__device *d, char *buf, size_t nbytes)
{
    (void)d;
    snprintf(buf, nbytes, "cpu");
}

/* ---- memory ---- */

static accel_status cpu_alloc(accel__device *d, size_t nbytes, int zero, void **out)
{
    (void)d;
    void *p = accel__aligned_alloc(nbytes);
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "cpu device: out of memory allocating %zu bytes",
                             nbytes);
    }
    if (zero) {
        memset(p, 0, nbytes);
    }
    *out = p;
    return ACCEL_OK;
}

static void cpu_free(accel__device *d, void *p)
{
    (void)d;
    accel__aligned_free(p);
}

static accel_status cpu_host_alloc(accel__device *d, size_t nbytes, void **out)
{
    return cpu_alloc(d, nbytes, 0, out);
}

static accel_status cpu_holds(accel__device *d, const void *p, int *out)
{
    (void)d, (void)p;
    *out = 0; /* all of it is host memory */
    return ACCEL_OK;
}

static accel_status cpu_memset(accel__device *d, void *p, int byte, size_t nbytes, accel__stream *s)
{
    (void)d, (void)s;
    memset(p, byte, nbytes);
    return ACCEL_OK;
}

static accel_status cpu_copy(accel__device *d, void *dst, const void *src, size_t nbytes,
                             accel__copy_kind kind, accel__stream *s)
{
    (void)d, (void)kind, (void)s; /* every kind is host memory here */
    memcpy(dst, src, nbytes);
    return ACCEL_OK;
}

/* ---- streams and events: work is done when the call returns ---- */

static accel_status cpu_stream_new(accel__device *d, accel__stream *s)
{
    (void)d, (void)s;
    return ACCEL_OK;
}

static void cpu_stream_free(accel__device *d, accel__stream *s)
{
    (void)d, (void)s;
}

static accel_status cpu_stream_sync(accel__device *d, accel__stream *s)
{
    (void)d, (void)s;
    return ACCEL_OK;
}

static accel_status cpu_event_new(accel__device *d, accel__event *e)
{
    (void)d, (void)e;
    return ACCEL_OK;
}

static void cpu_event_free(accel__device *d, accel__event *e)
{
    (void)d, (void)e;
}

static accel_status cpu_event_record(accel__device *d, accel__event *e, accel__stream *s)
{
    (void)d, (void)e, (void)s;
    return ACCEL_OK;
}

static accel_status cpu_stream_wait_event(accel__device *d, accel__stream *s, accel__event *e)
{
    (void)d, (void)s, (void)e;
    return ACCEL_OK;
}

static int cpu_event_query(accel__device *d, accel__event *e)
{
    (void)d, (void)e;
    return 1;
}

static accel_status cpu_event_sync(accel__device *d, accel__event *e)
{
    (void)d, (void)e;
    return ACCEL_OK;
}

static void *cpu_native_stream(accel__device *d, accel__stream *s)
{
    (void)d, (void)s;
    return NULL;
}

/* ---- kernels ---- */

static accel_status unsupported(const char *who, accel_dtype dt)
{
    const char *name = accel_dtype_name(dt);
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "cpu device: %s does not support dtype %s", who,
                         name ? name : "?");
}

static int is_float16(accel_dtype dt)
{
    return dt == ACCEL_BF16 || dt == ACCEL_F16;
}

/* Element-wise work goes in chunks of this many elements, spread over threads when there
 * are more than two and the call is on the default stream. */
#define CHUNK ((size_t)1 << 16)

static void convert_range(accel__dspan dst, accel__dspan src, size_t off, size_t k)
{
    const accel__cvt_kernels *kt = accel__cvt_best();
    size_t ds = accel_dtype_nbytes(dst.dtype), ss = accel_dtype_nbytes(src.dtype);
    char *d = (char *)dst.data + off * ds;
    const char *s = (const char *)src.data + off * ss;
    if (dst.dtype == src.dtype) {
        memcpy(d, s, k * ds);
    } else if (src.dtype == ACCEL_F32) {
        (dst.dtype == ACCEL_BF16 ? kt->f32_to_bf16 : kt->f32_to_f16)((uint16_t *)d,
                                                                     (const float *)s, k);
    } else if (dst.dtype == ACCEL_F32) {
        (src.dtype == ACCEL_BF16 ? kt->bf16_to_f32 : kt->f16_to_f32)((float *)d,
                                                                     (const uint16_t *)s, k);
    } else {
        (void)accel_convert(d, dst.dtype, s, src.dtype, k); /* bf16 <-> f16: valid, disjoint */
    }
}

static accel_status cpu_convert(accel__device *d, accel__dspan dst, accel__dspan src,
                                accel__stream *s)
{
    (void)d;
    if (!(src.dtype == ACCEL_F32 || is_float16(src.dtype))) {
        return unsupported("convert (source)", src.dtype);
    }
    if (!(dst.dtype == ACCEL_F32 || is_float16(dst.dtype))) {
        return unsupported("convert (destination)", dst.dtype);
    }
    size_t n = src.count;
    long long n_chunks = (long long)((n + CHUNK - 1) / CHUNK);
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (s == NULL && n_chunks > 2)
#endif
    for (long long c = 0; c < n_chunks; c++) {
        size_t off = (size_t)c * CHUNK;
        convert_range(dst, src, off, n - off < CHUNK ? n - off : CHUNK);
    }
    (void)s;
    return ACCEL_OK;
}

static accel_status cpu_zero(accel__device *d, accel__dspan x, accel__stream *s)
{
    (void)d, (void)s;
    memset(x.data, 0, x.count * accel_dtype_nbytes(x.dtype));
    return ACCEL_OK;
}

KERNEL static void scale_range(float *x, size_t n, float f)
{
    for (size_t i = 0; i < n; i++) {
        x[i] *= f;
    }
}

KERNEL static void clamp_range(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}

static accel_status cpu_scale(accel__device *d, accel__dspan x, float factor, accel__stream *s)
{
    (void)d;
    if (x.dtype != ACCEL_F32) {
        return unsupported("scale", x.dtype);
    }
    float *p = x.data;
    size_t n = x.count;
    long long n_chunks = (long long)((n + CHUNK - 1) / CHUNK);
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (s == NULL && n_chunks > 2)
#endif
    for (long long c = 0; c < n_chunks; c++) {
        size_t off = (size_t)c * CHUNK;
        scale_range(p + off, n - off < CHUNK ? n - off : CHUNK, factor);
    }
    (void)s;
    return ACCEL_OK;
}

static accel_status cpu_clamp(accel__device *d, accel__dspan x, float lo, float hi,
                              accel__stream *s)
{
    (void)d, (void)s;
    if (x.dtype != ACCEL_F32) {
        return unsupported("clamp", x.dtype);
    }
    clamp_range(x.data, x.count, lo, hi);
    return ACCEL_OK;
}

/* Reductions read BF16 / F16 through f32 blocks on the stack (exact widening), so every
 * dtype shares the f32 loops and their summation order. */
#define BLOCK 1024

/* Calls fn(f32 block, count, ctx) over x in element order. */
static void for_f32_blocks(accel__dspan x, void (*fn)(const float *, size_t, void *), void *ctx)
{
    if (x.dtype == ACCEL_F32) {
        fn(x.data, x.count, ctx);
        return;
    }
    const accel__cvt_kernels *kt = accel__cvt_best();
    const uint16_t *h = x.data;
    float buf[BLOCK];
    for (size_t i = 0; i < x.count; i += BLOCK) {
        size_t k = x.count - i < BLOCK ? x.count - i : BLOCK;
        (x.dtype == ACCEL_BF16 ? kt->bf16_to_f32 : kt->f16_to_f32)(buf, h + i, k);
        fn(buf, k, ctx);
    }
}

KERNEL static double sq_sum(const float *restrict g, size_t n, double s)
{
    for (size_t i = 0; i < n; i++) {
        s += (double)g[i] * (double)g[i];
    }
    return s;
}

typedef struct pow_ctx {
    double p, sum;
} pow_ctx;

static void pow_block(const float *g, size_t n, void *arg)
{
    pow_ctx *c = arg;
    if (c->p == 2.0) {
        c->sum = sq_sum(g, n, c->sum);
    } else if (c->p == 1.0) {
        for (size_t i = 0; i < n; i++) {
            c->sum += fabs((double)g[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            c->sum += pow(fabs((double)g[i]), c->p);
        }
    }
}

static accel_status cpu_pow_sum(accel__device *d, accel__dspan x, double p, double *acc,
                                accel__stream *s)
{
    (void)d, (void)s;
    if (!(x.dtype == ACCEL_F32 || is_float16(x.dtype))) {
        return unsupported("pow_sum", x.dtype);
    }
    pow_ctx c = {p, 0.0};
    for_f32_blocks(x, pow_block, &c);
    *acc += c.sum;
    return ACCEL_OK;
}

typedef struct max_ctx {
    double mx;
    int nan;
} max_ctx;

static void max_block(const float *g, size_t n, void *arg)
{
    max_ctx *c = arg;
    for (size_t i = 0; i < n && !c->nan; i++) {
        double a = fabs((double)g[i]);
        if (a > c->mx) {
            c->mx = a;
        } else if (a != a) {
            c->mx = a; /* NaN propagates, as torch's norm */
            c->nan = 1;
        }
    }
}

static accel_status cpu_abs_max(accel__device *d, accel__dspan x, double *acc, accel__stream *s)
{
    (void)d, (void)s;
    if (!(x.dtype == ACCEL_F32 || is_float16(x.dtype))) {
        return unsupported("abs_max", x.dtype);
    }
    max_ctx c = {0.0, 0};
    for_f32_blocks(x, max_block, &c);
    if (c.mx > *acc || isnan(c.mx)) {
        *acc = c.mx;
    }
    return ACCEL_OK;
}

/* An IEEE value is inf or NaN exactly when its exponent bits are all ones: an integer test,
 * so these loops vectorise and need no floating-point compare. */
KERNEL static uint32_t nonfinite_f32(const float *restrict x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}

KERNEL static uint32_t nonfinite_16(const uint16_t *restrict x, size_t n, uint16_t exp_mask)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= (x[i] & exp_mask) == exp_mask;
    }
    return bad;
}

KERNEL static uint32_t unscale_range(float *restrict x, size_t n, float f)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float v = x[i] * f;
        x[i] = v;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}

static accel_status cpu_nonfinite(accel__device *d, accel__dspan x, int32_t *flag, accel__stream *s)
{
    (void)d;
    if (!(x.dtype == ACCEL_F32 || is_float16(x.dtype))) {
        return unsupported("nonfinite", x.dtype);
    }
    uint16_t mask = x.dtype == ACCEL_BF16 ? 0x7f80u : 0x7c00u;
    size_t n = x.count;
    long long n_chunks = (long long)((n + CHUNK - 1) / CHUNK);
    uint32_t bad = 0;
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) reduction(| : bad) if (s == NULL && n_chunks > 2)
#endif
    for (long long c = 0; c < n_chunks; c++) {
        size_t off = (size_t)c * CHUNK, k = n - off < CHUNK ? n - off : CHUNK;
        bad |= x.dtype == ACCEL_F32 ? nonfinite_f32((const float *)x.data + off, k)
                                    : nonfinite_16((const uint16_t *)x.data + off, k, mask);
    }
    (void)s;
    if (bad) {
        *flag = 1;
    }
    return ACCEL_OK;
}

static accel_status cpu_unscale_check(accel__device *d, accel__dspan x, float factor, int32_t *flag,
                                      accel__stream *s)
{
    (void)d;
    if (x.dtype != ACCEL_F32) {
        return unsupported("unscale_check", x.dtype);
    }
    float *p = x.data;
    size_t n = x.count;
    long long n_chunks = (long long)((n + CHUNK - 1) / CHUNK);
    uint32_t bad = 0;
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) reduction(| : bad) if (s == NULL && n_chunks > 2)
#endif
    for (long long c = 0; c < n_chunks; c++) {
        size_t off = (size_t)c * CHUNK;
        bad |= unscale_range(p + off, n - off < CHUNK ? n - off : CHUNK, factor);
    }
    (void)s;
    if (bad) {
        *flag = 1;
    }
    return ACCEL_OK;
}

static accel_status cpu_sgd_step(accel__device *d, const accel__sgd_args *a, accel__stream *s)
{
    (void)d;
    accel__cpu_sgd(a, s == NULL);
    return ACCEL_OK;
}

static accel_status cpu_adam_step(accel__device *d, const accel__adam_args *a, accel__stream *s)
{
    accel__cpu_adam(a, s == NULL);
    if (a->compute == NULL) {
        return ACCEL_OK;
    }
    /* The compute copy after the update: host memory gains nothing from fusing the two, and
     * cpu_convert's rounding is the reference the GPU's fused store matches. */
    return cpu_convert(d, accel__dspan_of(a->compute, a->compute_dtype, a->count),
                       accel__dspan_f32(a->param, a->count), s);
}

/* ---- reserved ranges: host pages (PROT_NONE while unmapped, so a stray read faults) ---- */

static accel_status cpu_range_granularity(accel__device *d, size_t *out)
{
    (void)d;
    long pg = sysconf(_SC_PAGESIZE);
    *out = pg > 0 ? (size_t)pg : 4096;
    return ACCEL_OK;
}

static accel_status cpu_range_reserve(accel__device *d, size_t nbytes, void **base)
{
    (void)d;
    void *p = mmap(NULL, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "cpu: cannot reserve %zu bytes of addresses",
                             nbytes);
    }
    *base = p;
    return ACCEL_OK;
}

static void cpu_range_release(accel__device *d, void *base, size_t nbytes)
{
    (void)d;
    (void)munmap(base, nbytes);
}

static accel_status cpu_range_map(accel__device *d, void *at, size_t nbytes, void **phys)
{
    (void)d;
    if (mprotect(at, nbytes, PROT_READ | PROT_WRITE) != 0) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "cpu: cannot map %zu bytes at %p", nbytes, at);
    }
    *phys = at; /* the pages themselves: anything non-NULL */
    return ACCEL_OK;
}

static accel_status cpu_range_unmap(accel__device *d, void *at, size_t nbytes, void *phys)
{
    (void)d, (void)phys;
    /* Given back (zeros when mapped again), then inaccessible. */
    (void)madvise(at, nbytes, MADV_DONTNEED);
    (void)mprotect(at, nbytes, PROT_NONE);
    return ACCEL_OK;
}

static const accel__device_ops cpu_ops = {
    .name = "cpu",
    .describe = cpu_describe,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .holds = cpu_holds,
    .memset = cpu_memset,
    .copy = cpu_copy,
    .stream_new = cpu_stream_new,
    .stream_free = cpu_stream_free,
    .stream_sync = cpu_stream_sync,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .native_stream = cpu_native_stream,
    .sgd_step = cpu_sgd_step,
    .adam_step = cpu_adam_step,
    .convert = cpu_convert,
    .zero = cpu_zero,
    .scale = cpu_scale,
    .clamp = cpu_clamp,
    .pow_sum = cpu_pow_sum,
    .abs_max = cpu_abs_max,
    .nonfinite = cpu_nonfinite,
    .unscale_check = cpu_unscale_check,
    .range_granularity = cpu_range_granularity,
    .range_reserve = cpu_range_reserve,
    .range_release = cpu_range_release,
    .range_map = cpu_range_map,
    .range_unmap = cpu_range_unmap,
};

static accel__device cpu_device = {&cpu_ops, {ACCEL_DEVICE_CPU, 0}, NULL};

accel__device *accel__device_cpu(void)
{
    return &cpu_device;
}
