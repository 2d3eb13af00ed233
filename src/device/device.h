/*
 * The device seam (DESIGN.md §2, §3): memory, copies, streams, events and the few kernels the
 * training core runs over its flat buffers (optimizer steps, casts, norms, scaling, inf/nan
 * checks). The training core never loops over raw floats itself: everything it does to a
 * buffer element by element goes through these functions, so the CUDA implementation
 * (src/device/cuda/) runs the same training code on device memory.
 *
 * Conventions shared by every backend:
 *   - Pointers passed to kernels and copies are device pointers (host pointers on the CPU
 *     device). Kernels take typed spans (accel__dspan: pointer, dtype, element count).
 *   - Every kernel and copy takes a stream. NULL is the device's default order: on the CPU
 *     the call has finished when it returns; on CUDA it is the device's compute stream (the
 *     one accel_cuda_stream gives users, so their kernels and accel's are ordered), kernels
 *     and device-to-device copies are queued on it, and a copy that touches host memory or a
 *     read of a result (accel__dev_copy D2H / H2D / H2H) has finished when it returns. A
 *     stream from accel__stream_new orders work on it; on the CPU a stream runs each call
 *     synchronously on the calling thread WITHOUT fanning out to the OpenMP pool, which is
 *     what a communication thread wants (it must not compete with the training thread's
 *     parallel kernels); on CUDA it is a stream of its own (not ordered with the compute
 *     stream: order the two with events), and a copy on it is queued like a kernel. Events
 *     complete when the work recorded before them on their stream has (on the CPU: at once).
 *   - Any thread may call any function (CUDA: each call selects the handle's GPU first).
 *   - Reductions (pow_sum, abs_max, nonfinite) accumulate into a small result in DEVICE
 *     memory, so a norm over many ranges costs one read (accel__dev_copy D2H) at the end.
 *   - Failures set the thread's error (accel__seterr(NULL, ...)) naming the function and the
 *     culprit (an unsupported dtype, a count mismatch) and return its status; nothing is
 *     written then.
 * Results are deterministic: the same inputs give the same bits whatever the thread count, and
 * every backend gives the CPU's bits for the element-wise kernels and abs_max (except the
 * payload of a NaN that arithmetic makes) and pow_sum's to rounding.
 */
#ifndef ACCEL_DEVICE_H
#define ACCEL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "accel/tensor.h"
#include "base/base.h"

typedef struct accel__device accel__device;

/* `count` elements of `dtype` at `data` (device memory). */
typedef struct accel__dspan {
    void *data;
    accel_dtype dtype;
    size_t count;
} accel__dspan;

static inline accel__dspan accel__dspan_of(void *data, accel_dtype dtype, size_t count)
{
    accel__dspan s = {data, dtype, count};
    return s;
}

static inline accel__dspan accel__dspan_f32(float *data, size_t count)
{
    return accel__dspan_of(data, ACCEL_F32, count);
}

typedef enum accel__copy_kind {
    ACCEL__COPY_H2H = 0,
    ACCEL__COPY_H2D,
    ACCEL__COPY_D2H,
    ACCEL__COPY_D2D
} accel__copy_kind;

/* ---- handles ---- */

/*
 * Opens the device `which`. ACCEL_DEVICE_CPU index 0 always exists; a CUDA GPU opens when
 * accel was built with CUDA and the GPU is visible (CUDA_VISIBLE_DEVICES applies), else
 * ACCEL_EUNSUPPORTED naming why (not built with CUDA, no such device, the CUDA error). *out
 * receives a handle valid until accel__device_close; opening the same device twice returns
 * the same handle. Thread-safe.
 */
accel_status accel__device_open(accel__device **out, accel_device which);
/*
 * How many devices of `type` this process can open: 1 for the CPU; the visible GPUs for CUDA.
 * CUDA without a usable GPU: ACCEL_EUNSUPPORTED naming why (built without CUDA, no device, no
 * driver: nothing is wrong, the process runs on the CPU); another CUDA failure: ACCEL_EIO with
 * its text. *n is 0 whenever the status is not ACCEL_OK.
 */
accel_status accel__device_count(accel_device_type type, int *n);
/* One line about the device for summaries: "cpu", or the GPU's name, compute capability,
 * memory and the CUDA driver and runtime versions. Always NUL-terminated. */
void accel__device_describe(const accel__device *d, char *buf, size_t nbytes);
/* Releases a handle from accel__device_open. Accepts NULL. */
void accel__device_close(accel__device *d);
/* The device a handle drives, and the backend's name ("cpu"). */
accel_device accel__device_which(const accel__device *d);
const char *accel__device_name(const accel__device *d);

/* ---- memory ---- */

/* nbytes of device memory, 64-byte aligned, zero-filled when `zero`. Free with
 * accel__dev_free (NULL is a no-op). ACCEL_ENOMEM names the size. */
accel_status accel__dev_alloc(accel__device *d, size_t nbytes, int zero, void **out);
void accel__dev_free(accel__device *d, void *p);
/* Host memory the device copies from / to fastest (pinned on CUDA; plain on the CPU). */
accel_status accel__dev_host_alloc(accel__device *d, size_t nbytes, void **out);
void accel__dev_host_free(accel__device *d, void *p);
/* *out = 1 when p points into d's own memory, which host code cannot read (CUDA device memory);
 * 0 for host memory of any kind (pageable, pinned, managed) and always on the CPU. Device memory
 * of another GPU is ACCEL_EINVAL naming both. Costs one driver query on CUDA. */
accel_status accel__dev_holds(accel__device *d, const void *p, int *out);
/* nbytes of p set to `byte`. */
accel_status accel__dev_memset(accel__device *d, void *p, int byte, size_t nbytes,
                               accel__stream *s);
/* nbytes from src to dst (no overlap), in the direction `kind`. */
accel_status accel__dev_copy(accel__device *d, void *dst, const void *src, size_t nbytes,
                             accel__copy_kind kind, accel__stream *s);

/* ---- reserved address ranges (ZeRO-3's gathered units: range.c) ---- */

/*
 * A range of device virtual addresses reserved once, into which physical memory is mapped
 * and unmapped piecewise: what stays at one address (parameters view it) while only a few
 * parts of it take memory (CUDA's virtual memory management: cuMemAddressReserve, cuMemCreate,
 * cuMemMap). Memory comes and goes in granules (accel__dev_range_granularity: 2 MiB on
 * current GPUs, a page on the CPU); map and unmap take any byte range and count, per granule,
 * how many mapped ranges cover it, so two neighbours sharing a granule at their edge keep it
 * while either is mapped. A map costs at most three physical allocations of the backend
 * (CUDA: cuMemCreate + cuMemMap + cuMemSetAccess each) whatever its length: one for the
 * granules the byte range covers whole, one for each granule at its ends it covers in part;
 * an allocation goes back whole (one cuMemUnmap) once no mapped range covers any of its
 * granules, so for disjoint byte ranges exactly when the one that mapped it is unmapped.
 * Freshly mapped memory holds garbage (the CPU's: zeros). A handle belongs to one thread.
 */
typedef struct accel__dev_range accel__dev_range;

/* The granule of d's reserved ranges in bytes. ACCEL_EUNSUPPORTED naming the device when it
 * cannot map memory into reserved ranges (a GPU without virtual memory management). */
accel_status accel__dev_range_granularity(accel__device *d, size_t *out);
/* Reserves nbytes (rounded up to the granule) of d's address space, nothing mapped. *out:
 * free with accel__dev_range_release. */
accel_status accel__dev_range_reserve(accel__device *d, size_t nbytes, accel__dev_range **out);
/* The first address of the range (device memory once mapped). */
void *accel__dev_range_base(const accel__dev_range *r);
/* Maps the granules covering [offset, offset + nbytes) (those not yet covered). ACCEL_ENOMEM
 * naming the size when the device is full; ACCEL_EINVAL past the end. On failure nothing
 * changes. */
accel_status accel__dev_range_map(accel__dev_range *r, size_t offset, size_t nbytes);
/* Undoes one accel__dev_range_map of the same byte range: allocations no other mapped range
 * covers go back to the device. The caller makes sure no queued work still touches them (an
 * event or stream sync): unmapping does not wait for the device. */
accel_status accel__dev_range_unmap(accel__dev_range *r, size_t offset, size_t nbytes);
/* Bytes of physical memory mapped into r now, and the most since it was reserved or since
 * accel__dev_range_reset_peak (which starts the peak again at what is mapped now). */
size_t accel__dev_range_mapped(const accel__dev_range *r);
size_t accel__dev_range_peak(const accel__dev_range *r);
void accel__dev_range_reset_peak(accel__dev_range *r);
/* 1 when the granule holding byte `offset` is mapped. */
int accel__dev_range_is_mapped(const accel__dev_range *r, size_t offset);
/* The backend's map and unmap calls on r so far (each a physical allocation made or given
 * back: on CUDA cuMemCreate + cuMemMap + cuMemSetAccess, and cuMemUnmap + cuMemRelease). NULL
 * counts none. */
void accel__dev_range_calls(const accel__dev_range *r, size_t *maps, size_t *unmaps);
/* Unmaps everything and gives the addresses back. Accepts NULL. */
void accel__dev_range_release(accel__dev_range *r);

/* ---- streams and events ---- */

accel_status accel__stream_new(accel__device *d, accel__stream **out);
/* Waits for the stream's work, then releases it. Accepts NULL. */
void accel__stream_free(accel__device *d, accel__stream *s);
/* Returns when every call issued on s (NULL: the default order) has finished. */
accel_status accel__stream_sync(accel__device *d, accel__stream *s);
accel_status accel__event_new(accel__device *d, accel__event **out);
void accel__event_free(accel__device *d, accel__event *e);
/* e completes when the work issued on s so far has. */
accel_status accel__event_record(accel__device *d, accel__event *e, accel__stream *s);
/* Work issued on s from now on starts after e completes (the host does not block). */
accel_status accel__stream_wait_event(accel__device *d, accel__stream *s, accel__event *e);
/* 1 when e has completed (or was never recorded), else 0. */
int accel__event_query(accel__device *d, accel__event *e);
/* Blocks the host until e completes. */
accel_status accel__event_sync(accel__device *d, accel__event *e);
/* The backend's own handle of stream s (NULL: the default order): the cudaStream_t on CUDA
 * (the compute stream for NULL), NULL on the CPU. */
void *accel__stream_native(accel__device *d, accel__stream *s);

/* ---- kernels ---- */

/* torch.optim.SGD over n elements of fp32 parallel arrays (momentum_buf NULL when momentum
 * is 0). first_step: the momentum buffer is initialised with the first update. */
typedef struct accel__sgd_args {
    float *param;
    const float *grad;
    float *momentum_buf;
    size_t count;
    float lr, weight_decay, momentum, dampening;
    int nesterov, maximize, first_step;
} accel__sgd_args;

/* torch.optim.Adam (decoupled = 0: L2 added to the gradient) / AdamW (decoupled = 1) over n
 * elements of fp32 parallel arrays. max_exp_avg_sq non-NULL selects amsgrad. The bias
 * corrections of this step are passed in: 1 - beta1^t and sqrt(1 - beta2^t). compute non-NULL:
 * count elements of compute_dtype (BF16 or F16) that receive the updated param rounded, in the
 * same pass (a mixed-precision model's compute copy: the bits accel__dev_convert would write,
 * without reading the param again). */
typedef struct accel__adam_args {
    float *param;
    const float *grad;
    float *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
    size_t count;
    float lr, weight_decay;
    int decoupled;
    float beta1, beta2, eps;
    float bias_correction1, bias_correction2_sqrt;
    int maximize;
    void *compute;
    accel_dtype compute_dtype;
} accel__adam_args;

/* One update, element for element the arithmetic of torch's single-tensor implementation in
 * fp32 (bit-identical whatever the vector width or thread count). */
accel_status accel__dev_sgd_step(accel__device *d, const accel__sgd_args *a, accel__stream *s);
accel_status accel__dev_adam_step(accel__device *d, const accel__adam_args *a, accel__stream *s);

/* dst = src converted (accel_convert semantics: RNE, NaN quietened). Counts must match; every
 * backend supports every pair of F32, BF16 and F16 (same dtype: a copy). */
accel_status accel__dev_convert(accel__device *d, accel__dspan dst, accel__dspan src,
                                accel__stream *s);
/* x = 0 (any dtype). */
accel_status accel__dev_zero(accel__device *d, accel__dspan x, accel__stream *s);
/* x *= factor (F32). */
accel_status accel__dev_scale(accel__device *d, accel__dspan x, float factor, accel__stream *s);
/* x = min(max(x, lo), hi) (F32; NaN stays NaN). */
accel_status accel__dev_clamp(accel__device *d, accel__dspan x, float lo, float hi,
                              accel__stream *s);
/* *acc += sum of |x|^p over x, summed in double from 0 (p > 0; p == 1 and p == 2 are fast
 * paths). acc: one double in device memory. F32, BF16, F16. The CPU sums in element order;
 * CUDA in a fixed tree that depends only on the count (deterministic; it equals the CPU's sum
 * to rounding: the two differ by at most count * 2^-52 relative, the sequential sum's bound
 * for terms of one sign; general p also differs by the last bits of each pow()). */
accel_status accel__dev_pow_sum(accel__device *d, accel__dspan x, double p, double *acc,
                                accel__stream *s);
/* a = max |x| (NaN if any x is NaN); *acc = a when a > *acc or a is NaN, so a NaN sticks
 * (torch's inf-norm). acc: one double in device memory, start it at 0. F32, BF16, F16. */
accel_status accel__dev_abs_max(accel__device *d, accel__dspan x, double *acc, accel__stream *s);
/* *flag = 1 when some x is inf or NaN (else *flag is left as it is). flag: one int32 in
 * device memory. F32, BF16, F16. */
accel_status accel__dev_nonfinite(accel__device *d, accel__dspan x, int32_t *flag,
                                  accel__stream *s);
/* The fp16 loss scaler's pass: x *= factor, and *flag = 1 when a product is inf or NaN
 * (torch's _amp_foreach_non_finite_check_and_unscale_). F32. */
accel_status accel__dev_unscale_check(accel__device *d, accel__dspan x, float factor, int32_t *flag,
                                      accel__stream *s);

#endif /* ACCEL_DEVICE_H */
