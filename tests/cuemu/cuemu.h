/*
 * The CUDA emulator build (cmake -DACCEL_CUDA=ON -DACCEL_CUDA_EMU=ON; docs/testing.md): a
 * testing aid that runs accel's own CUDA code, host code and kernels, on a machine without a
 * GPU. The NVIDIA libraries below it are replaced by this folder: cudart.c (the runtime),
 * kernel.cc (kernel launches, threads as fibers; launch_check.cc checks them), cublas.c
 * (cuBLAS / cuBLASLt), nccl.c (NCCL with one rank). Everything runs synchronously on the calling
 * thread when it is issued, one call at a time across threads (cuemu_lock); stream-ordering
 * mistakes are the simulated GPU's to find (src/device/sim.h), not this build's.
 *
 * This header is the pieces' interface to each other (C and C++).
 */
#ifndef ACCEL_CUEMU_H
#define ACCEL_CUEMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a pointer points into. */
typedef enum { CUEMU_UNKNOWN, CUEMU_DEVICE, CUEMU_PINNED } cuemu_kind;

/* The allocation p points into: CUEMU_DEVICE (cudaMalloc), CUEMU_PINNED (cudaHostAlloc), or
 * CUEMU_UNKNOWN (any other host memory). For a known one, its start, size and device when the
 * out-pointers are not NULL. */
cuemu_kind cuemu_lookup(const void *p, const void **base, size_t *nbytes, int *device);

/* 1 when [p, p + nbytes) lies inside one device allocation. */
int cuemu_is_device(const void *p, size_t nbytes);

/* Registers [p, p + nbytes) as device memory of `device` without allocating it (a reserved
 * address range of vmm.c); 0, or -1 out of memory. Unregistered by its start. */
int cuemu_register_device(void *p, size_t nbytes, int device);
void cuemu_unregister_device(void *p);
/* vmm.c: -1 when [p, p + nbytes) is not in a reserved range, else 1 when it is wholly mapped
 * and accessible (cuMemSetAccess), 0 when not; the bytes mapped into reserved ranges now. */
int cuemu_vmm_accessible(const void *p, size_t nbytes);
size_t cuemu_vmm_mapped_bytes(void);
/* vmm.c: the calls so far of driver entry point `entry` ("cuMemCreate", "cuMemMap",
 * "cuMemSetAccess", "cuMemUnmap" or "cuMemRelease"; 0 for any other name). */
size_t cuemu_vmm_calls(const char *entry);
/* vmm.c, a test hook: the n-th cuMemCreate from now fails with CUDA_ERROR_OUT_OF_MEMORY (0:
 * none does). */
void cuemu_vmm_fail_create(int n);

/* The dynamic shared memory a block may opt into (cudaFuncSetAttribute), as on sm_90. */
#define CUEMU_SMEM_OPTIN (227 << 10)

/* Records err (a cudaError_t) as the runtime's last error, which cudaGetLastError returns and
 * clears, and prints "cuemu: <message>" on stderr. */
void cuemu_set_error(int err, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* One emulated operation at a time across host threads (recursive: a piece may call another). */
void cuemu_lock(void);
void cuemu_unlock(void);

/* fp32 to bf16 (bf16 = 1) or fp16 bits, rounded to nearest even; and back, exactly (half.c). */
uint16_t cuemu_to_half(float f, int bf16);
float cuemu_from_half(uint16_t h, int bf16);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_CUEMU_H */
