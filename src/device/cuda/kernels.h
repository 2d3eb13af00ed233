/*
 * The CUDA device's kernels (kernels.cu), as plain C launchers that cuda.c calls: each checks
 * nothing (the front end and cuda.c have validated dtypes, pointers and counts), enqueues its
 * kernels on `s` and returns the launch's status (cudaGetLastError): faults inside a kernel
 * surface at the next synchronisation, as CUDA reports them.
 *
 * Every element-wise kernel computes, element for element, the arithmetic of the CPU device
 * with explicitly rounded single operations (no fused multiply-add), so results are
 * bit-identical to the CPU's, except the payload of a NaN that arithmetic produces (the GPU's
 * is canonical, x86 keeps an operand's; conversions keep payloads exactly as the CPU does).
 * Reductions sum in double in a fixed order that depends only on the element count (never on timing
 * or on the GPU model), so they are deterministic; the order differs from the CPU's sequential one,
 * so sums agree with it to rounding, not to the bit.
 */
#ifndef ACCEL_DEVICE_CUDA_KERNELS_H
#define ACCEL_DEVICE_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "accel/tensor.h"
#include "device/optim_coef.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Doubles of scratch a reduction needs (its per-block partial sums), per stream. */
#define ACCEL__CU_SCRATCH_DOUBLES 1024

/* dst = src converted (F32, BF16, F16 in any pair; same dtype: a copy), accel_convert's bits. */
cudaError_t accel__cu_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt,
                              size_t n, cudaStream_t s);
/* x *= f (F32). */
cudaError_t accel__cu_scale(float *x, size_t n, float f, cudaStream_t s);
/* x = x < lo ? lo : x > hi ? hi : x (F32; NaN stays). */
cudaError_t accel__cu_clamp(float *x, size_t n, float lo, float hi, cudaStream_t s);
/* *acc += sum |x|^p in double (F32, BF16, F16); scratch: ACCEL__CU_SCRATCH_DOUBLES doubles of
 * device memory no other work uses until this completes. */
cudaError_t accel__cu_pow_sum(const void *x, accel_dtype dt, size_t n, double p, double *acc,
                              double *scratch, cudaStream_t s);
/* a = max |x| (NaN if some x is NaN); *acc = a when a > *acc or a is NaN. */
cudaError_t accel__cu_abs_max(const void *x, accel_dtype dt, size_t n, double *acc, double *scratch,
                              cudaStream_t s);
/* *flag = 1 when some x is inf or NaN (else untouched). */
cudaError_t accel__cu_nonfinite(const void *x, accel_dtype dt, size_t n, int32_t *flag,
                                cudaStream_t s);
/* x *= f, and *flag = 1 when a product is inf or NaN (F32). */
cudaError_t accel__cu_unscale_check(float *x, size_t n, float f, int32_t *flag, cudaStream_t s);

/* torch.optim.SGD; keep = 1 - dampening and sign = +-1 computed by the caller; buf NULL when
 * momentum is 0. */
typedef struct accel__cu_sgd {
    float *param;
    const float *grad;
    float *buf;
    size_t count;
    float lr, wd, momentum, keep, sign;
    int nesterov, first_step;
} accel__cu_sgd;
cudaError_t accel__cu_sgd_step(const accel__cu_sgd *a, cudaStream_t s);
/* Adam / AdamW with the constants of accel__adam_coef_make; vmax NULL unless amsgrad; compute
 * NULL, or n elements of compute_dt (BF16, F16) that receive the new param rounded as
 * accel__cu_convert would (one pass: the master is not read again). */
cudaError_t accel__cu_adam_step(const accel__adam_coef *c, float *param, const float *grad,
                                float *m, float *v, float *vmax, void *compute,
                                accel_dtype compute_dt, size_t n, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_DEVICE_CUDA_KERNELS_H */
