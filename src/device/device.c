/*
 * The device front end: opening a device by kind, and the checks every backend shares before
 * an operation is dispatched through its table (handles and pointers present, span counts
 * consistent, empty spans skipped). In a build without CUDA the CUDA type opens the simulated
 * GPUs of sim.h once enabled (ACCEL_SIM_GPU, a testing aid). Invariant: a backend operation
 * never sees a NULL handle, a NULL pointer for a non-empty span, or an empty span.
 */
#include <string.h>

#include "device_impl.h"
#include "sim.h"

accel_status accel__device_open(accel__device **out, accel_device which)
{
    if (out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__device_open: out is NULL");
    }
    switch (which.type) {
    case ACCEL_DEVICE_CPU:
        if (which.index != 0) {
            return accel__seterr(NULL, ACCEL_EINVAL, "device cpu:%d does not exist (only cpu:0)",
                                 which.index);
        }
        *out = accel__device_cpu();
        return ACCEL_OK;
    case ACCEL_DEVICE_CUDA:
        if (which.index < 0) {
            return accel__seterr(NULL, ACCEL_EINVAL, "device cuda:%d: negative index", which.index);
        }
#ifdef ACCEL_HAVE_CUDA
        return accel__device_cuda_open(out, which.index);
#else
        if (accel__device_sim_count() > 0) {
            return accel__device_sim_open(out, which.index); /* a testing aid (sim.h) */
        }
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "device cuda:%d: accel was built without CUDA (configure with "
                             "-DACCEL_CUDA=ON)",
                             which.index);
#endif
    default:
        return accel__seterr(NULL, ACCEL_EINVAL, "device type %d is not a device type",
                             (int)which.type);
    }
}

accel_status accel__device_count(accel_device_type type, int *n)
{
    *n = 0;
    switch (type) {
    case ACCEL_DEVICE_CPU:
        *n = 1;
        return ACCEL_OK;
    case ACCEL_DEVICE_CUDA:
#ifdef ACCEL_HAVE_CUDA
        return accel__device_cuda_count(n);
#else
        if (accel__device_sim_count() > 0) {
            *n = accel__device_sim_count();
            return ACCEL_OK;
        }
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "accel was built without CUDA (configure with -DACCEL_CUDA=ON)");
#endif
    default:
        return accel__seterr(NULL, ACCEL_EINVAL, "device type %d is not a device type", (int)type);
    }
}

void accel__device_close(accel__device *d)
{
    (void)d; /* every handle (CPU, each GPU) lives as long as the process */
}

void accel__device_describe(const accel__device *d, char *buf, size_t nbytes)
{
    if (nbytes > 0) {
        buf[0] = '\0';
        d->ops->describe(d, buf, nbytes);
    }
}

accel_device accel__device_which(const accel__device *d)
{
    return d->which;
}

const char *accel__device_name(const accel__device *d)
{
    return d->ops->name;
}

/* ---- memory ---- */

accel_status accel__dev_alloc(accel__device *d, size_t nbytes, int zero, void **out)
{
    return d->ops->alloc(d, nbytes, zero, out);
}

void accel__dev_free(accel__device *d, void *p)
{
    if (p != NULL) {
        d->ops->free(d, p);
    }
}

accel_status accel__dev_host_alloc(accel__device *d, size_t nbytes, void **out)
{
    return d->ops->host_alloc(d, nbytes, out);
}

void accel__dev_host_free(accel__device *d, void *p)
{
    if (p != NULL) {
        d->ops->host_free(d, p);
    }
}

accel_status accel__dev_holds(accel__device *d, const void *p, int *out)
{
    *out = 0;
    return p != NULL ? d->ops->holds(d, p, out) : ACCEL_OK;
}

accel_status accel__dev_memset(accel__device *d, void *p, int byte, size_t nbytes, accel__stream *s)
{
    if (nbytes == 0) {
        return ACCEL_OK;
    }
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__dev_memset: pointer is NULL");
    }
    return d->ops->memset(d, p, byte, nbytes, s);
}

accel_status accel__dev_copy(accel__device *d, void *dst, const void *src, size_t nbytes,
                             accel__copy_kind kind, accel__stream *s)
{
    if (nbytes == 0) {
        return ACCEL_OK;
    }
    if (dst == NULL || src == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__dev_copy: %s is NULL",
                             dst == NULL ? "dst" : "src");
    }
    if ((unsigned)kind > ACCEL__COPY_D2D) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__dev_copy: copy kind %d", (int)kind);
    }
    return d->ops->copy(d, dst, src, nbytes, kind, s);
}

/* ---- streams and events ---- */

accel_status accel__stream_new(accel__device *d, accel__stream **out)
{
    accel__stream *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel__stream_new: out of memory");
    }
    s->dev = d;
    accel_status st = d->ops->stream_new(d, s);
    if (st != ACCEL_OK) {
        accel__free(s);
        return st;
    }
    *out = s;
    return ACCEL_OK;
}

void accel__stream_free(accel__device *d, accel__stream *s)
{
    if (s != NULL) {
        (void)d->ops->stream_sync(d, s);
        d->ops->stream_free(d, s);
        accel__free(s);
    }
}

accel_status accel__stream_sync(accel__device *d, accel__stream *s)
{
    return d->ops->stream_sync(d, s);
}

accel_status accel__event_new(accel__device *d, accel__event **out)
{
    accel__event *e = accel__calloc(1, sizeof(*e));
    if (e == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel__event_new: out of memory");
    }
    e->dev = d;
    accel_status st = d->ops->event_new(d, e);
    if (st != ACCEL_OK) {
        accel__free(e);
        return st;
    }
    *out = e;
    return ACCEL_OK;
}

void accel__event_free(accel__device *d, accel__event *e)
{
    if (e != NULL) {
        d->ops->event_free(d, e);
        accel__free(e);
    }
}

accel_status accel__event_record(accel__device *d, accel__event *e, accel__stream *s)
{
    return d->ops->event_record(d, e, s);
}

accel_status accel__stream_wait_event(accel__device *d, accel__stream *s, accel__event *e)
{
    return d->ops->stream_wait_event(d, s, e);
}

int accel__event_query(accel__device *d, accel__event *e)
{
    return d->ops->event_query(d, e);
}

accel_status accel__event_sync(accel__device *d, accel__event *e)
{
    return d->ops->event_sync(d, e);
}

void *accel__stream_native(accel__device *d, accel__stream *s)
{
    return d->ops->native_stream(d, s);
}

/* ---- kernels ---- */

/* A non-empty span must point somewhere and carry a dtype of whole bytes (kernels address
 * elements; packed sub-byte dtypes have none). */
static accel_status check_span(const char *who, const char *what, accel__dspan x)
{
    if (x.data == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: %s is NULL (%zu elements)", who, what,
                             x.count);
    }
    if (accel_dtype_bits(x.dtype) == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: %s has dtype %d, not a dtype", who, what,
                             (int)x.dtype);
    }
    if (accel_dtype_nbytes(x.dtype) == 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "%s: %s has the packed sub-byte dtype %s, which device kernels do not "
                             "address",
                             who, what, accel_dtype_name(x.dtype));
    }
    return ACCEL_OK;
}

/* An empty span is a successful no-op; a bad one fails before the backend sees it. */
#define SPAN_CHECKED(who, x, call)                                                                 \
    do {                                                                                           \
        if ((x).count == 0) {                                                                      \
            return ACCEL_OK;                                                                       \
        }                                                                                          \
        ACCEL_TRY(check_span(who, #x, x));                                                         \
        return call;                                                                               \
    } while (0)

accel_status accel__dev_sgd_step(accel__device *d, const accel__sgd_args *a, accel__stream *s)
{
    if (a->count == 0) {
        return ACCEL_OK;
    }
    if (a->param == NULL || a->grad == NULL || (a->momentum != 0 && a->momentum_buf == NULL)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "sgd_step: %s is NULL",
                             a->param == NULL  ? "param"
                             : a->grad == NULL ? "grad"
                                               : "momentum_buf (momentum != 0)");
    }
    return d->ops->sgd_step(d, a, s);
}

accel_status accel__dev_adam_step(accel__device *d, const accel__adam_args *a, accel__stream *s)
{
    if (a->count == 0) {
        return ACCEL_OK;
    }
    if (a->param == NULL || a->grad == NULL || a->exp_avg == NULL || a->exp_avg_sq == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "adam_step: %s is NULL",
                             a->param == NULL     ? "param"
                             : a->grad == NULL    ? "grad"
                             : a->exp_avg == NULL ? "exp_avg"
                                                  : "exp_avg_sq");
    }
    if (a->compute != NULL && a->compute_dtype != ACCEL_BF16 && a->compute_dtype != ACCEL_F16) {
        const char *name = accel_dtype_name(a->compute_dtype);
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "adam_step: the compute copy has dtype %s (BF16 or F16 only)",
                             name != NULL ? name : "?");
    }
    return d->ops->adam_step(d, a, s);
}

accel_status accel__dev_convert(accel__device *d, accel__dspan dst, accel__dspan src,
                                accel__stream *s)
{
    if (dst.count != src.count) {
        return accel__seterr(NULL, ACCEL_EINVAL, "convert: dst has %zu elements, src %zu",
                             dst.count, src.count);
    }
    if (src.count == 0) {
        return ACCEL_OK;
    }
    ACCEL_TRY(check_span("convert", "src", src));
    ACCEL_TRY(check_span("convert", "dst", dst));
    return d->ops->convert(d, dst, src, s);
}

accel_status accel__dev_zero(accel__device *d, accel__dspan x, accel__stream *s)
{
    SPAN_CHECKED("zero", x, d->ops->zero(d, x, s));
}

accel_status accel__dev_scale(accel__device *d, accel__dspan x, float factor, accel__stream *s)
{
    SPAN_CHECKED("scale", x, d->ops->scale(d, x, factor, s));
}

accel_status accel__dev_clamp(accel__device *d, accel__dspan x, float lo, float hi,
                              accel__stream *s)
{
    if (!(lo <= hi)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "clamp: lo %g > hi %g", (double)lo, (double)hi);
    }
    SPAN_CHECKED("clamp", x, d->ops->clamp(d, x, lo, hi, s));
}

accel_status accel__dev_pow_sum(accel__device *d, accel__dspan x, double p, double *acc,
                                accel__stream *s)
{
    if (!(p > 0) || acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "pow_sum: %s",
                             acc == NULL ? "acc is NULL" : "p must be > 0");
    }
    SPAN_CHECKED("pow_sum", x, d->ops->pow_sum(d, x, p, acc, s));
}

accel_status accel__dev_abs_max(accel__device *d, accel__dspan x, double *acc, accel__stream *s)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "abs_max: acc is NULL");
    }
    SPAN_CHECKED("abs_max", x, d->ops->abs_max(d, x, acc, s));
}

accel_status accel__dev_nonfinite(accel__device *d, accel__dspan x, int32_t *flag, accel__stream *s)
{
    if (flag == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nonfinite: flag is NULL");
    }
    SPAN_CHECKED("nonfinite", x, d->ops->nonfinite(d, x, flag, s));
}

accel_status accel__dev_unscale_check(accel__device *d, accel__dspan x, float factor, int32_t *flag,
                                      accel__stream *s)
{
    if (flag == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "unscale_check: flag is NULL");
    }
    SPAN_CHECKED("unscale_check", x, d->ops->unscale_check(d, x, factor, flag, s));
}
