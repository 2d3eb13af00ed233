/*
 * The backend side of the device seam: the operations table each implementation (cpu.c,
 * cuda/cuda.c) fills in, and the handle, stream and event records the front end (device.c)
 * hands out. Only src/device/ includes this header.
 *
 * Invariant: the front end has validated handles and non-NULL pointers and skipped empty
 * spans before an operation is called; operations check what is backend-specific (dtypes).
 */
#ifndef ACCEL_DEVICE_IMPL_H
#define ACCEL_DEVICE_IMPL_H

#include "device.h"

typedef struct accel__device_ops {
    const char *name;
    /* one line about the device (accel__device_describe) */
    void (*describe)(const accel__device *d, char *buf, size_t nbytes);
    /* memory */
    accel_status (*alloc)(accel__device *d, size_t nbytes, int zero, void **out);
    void (*free)(accel__device *d, void *p);
    accel_status (*host_alloc)(accel__device *d, size_t nbytes, void **out);
    void (*host_free)(accel__device *d, void *p);
    accel_status (*holds)(accel__device *d, const void *p, int *out);
    accel_status (*memset)(accel__device *d, void *p, int byte, size_t nbytes, accel__stream *s);
    accel_status (*copy)(accel__device *d, void *dst, const void *src, size_t nbytes,
                         accel__copy_kind kind, accel__stream *s);
    /* streams and events: impl is the backend's own object */
    accel_status (*stream_new)(accel__device *d, accel__stream *s);
    void (*stream_free)(accel__device *d, accel__stream *s);
    accel_status (*stream_sync)(accel__device *d, accel__stream *s);
    accel_status (*event_new)(accel__device *d, accel__event *e);
    void (*event_free)(accel__device *d, accel__event *e);
    accel_status (*event_record)(accel__device *d, accel__event *e, accel__stream *s);
    accel_status (*stream_wait_event)(accel__device *d, accel__stream *s, accel__event *e);
    int (*event_query)(accel__device *d, accel__event *e);
    accel_status (*event_sync)(accel__device *d, accel__event *e);
    void *(*native_stream)(accel__device *d, accel__stream *s);
    /* reserved ranges (range.c keeps the per-granule counts): NULL when unsupported. Map
     * gets one granule-aligned run of granules, backs it with one physical allocation and
     * returns it (*phys, never NULL); unmap gets exactly a run that one map mapped, with its
     * allocation. */
    accel_status (*range_granularity)(accel__device *d, size_t *out);
    accel_status (*range_reserve)(accel__device *d, size_t nbytes, void **base);
    void (*range_release)(accel__device *d, void *base, size_t nbytes);
    accel_status (*range_map)(accel__device *d, void *at, size_t nbytes, void **phys);
    accel_status (*range_unmap)(accel__device *d, void *at, size_t nbytes, void *phys);
    /* kernels */
    accel_status (*sgd_step)(accel__device *d, const accel__sgd_args *a, accel__stream *s);
    accel_status (*adam_step)(accel__device *d, const accel__adam_args *a, accel__stream *s);
    accel_status (*convert)(accel__device *d, accel__dspan dst, accel__dspan src, accel__stream *s);
    accel_status (*zero)(accel__device *d, accel__dspan x, accel__stream *s);
    accel_status (*scale)(accel__device *d, accel__dspan x, float factor, accel__stream *s);
    accel_status (*clamp)(accel__device *d, accel__dspan x, float lo, float hi, accel__stream *s);
    accel_status (*pow_sum)(accel__device *d, accel__dspan x, double p, double *acc,
                            accel__stream *s);
    accel_status (*abs_max)(accel__device *d, accel__dspan x, double *acc, accel__stream *s);
    accel_status (*nonfinite)(accel__device *d, accel__dspan x, int32_t *flag, accel__stream *s);
    accel_status (*unscale_check)(accel__device *d, accel__dspan x, float factor, int32_t *flag,
                                  accel__stream *s);
} accel__device_ops;

struct accel__device {
    const accel__device_ops *ops;
    accel_device which;
    void *impl; /* the backend's state */
};

/* A stream or event of device `dev`; `impl` is the backend's handle (NULL on the CPU). */
struct accel__stream {
    accel__device *dev;
    void *impl;
};

struct accel__event {
    accel__device *dev;
    void *impl;
};

/* The CPU device (cpu.c): one process-wide handle, nothing to release. */
accel__device *accel__device_cpu(void);

#ifdef ACCEL_HAVE_CUDA
/* The CUDA device `index` (cuda/cuda.c): one process-wide handle per GPU, made on first open
 * (its compute stream with it) and kept until the process ends. ACCEL_EUNSUPPORTED naming why
 * when there is no such GPU. */
accel_status accel__device_cuda_open(accel__device **out, int index);
/* The visible GPUs (accel__device_count's CUDA case). */
accel_status accel__device_cuda_count(int *n);
#endif

#endif /* ACCEL_DEVICE_IMPL_H */
