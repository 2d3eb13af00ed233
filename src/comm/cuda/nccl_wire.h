/*
 * The nccl backend's wire dtype (DDP's bf16 / fp16 gradient compression): F32 data rounded to
 * the 16-bit format before NCCL reduces it in that format, and widened back after. Plain C
 * launchers for nccl.c; each enqueues one kernel on `s` and returns the launch's status.
 * Rounding is to nearest even (fp16 overflow gives inf), accel_convert's for every finite value.
 */
#ifndef ACCEL_COMM_CUDA_NCCL_WIRE_H
#define ACCEL_COMM_CUDA_NCCL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = round(src[i]) as bf16 (bf16 != 0) or fp16, i < n. */
cudaError_t accel__nccl_wire_pack(uint16_t *dst, const float *src, size_t n, int bf16,
                                  cudaStream_t s);
/* dst[i] = src[i] widened to f32. */
cudaError_t accel__nccl_wire_unpack(float *dst, const uint16_t *src, size_t n, int bf16,
                                    cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
