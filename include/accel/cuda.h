/*
 * accel/cuda.h - CUDA interop for programs that write their own kernels (llm.c style). The
 * only accel header that includes CUDA headers; it exists in builds configured with
 * -DACCEL_CUDA=ON (ACCEL_HAVE_CUDA is then defined for programs linking libaccel).
 *
 * With a visible GPU each process computes on GPU LOCAL_RANK (docs/cuda.md); a model's master
 * weights, compute copy, gradients and optimizer state then live in that GPU's memory, and
 * every accel_param view (data_view, grad_view, compute_view) holds a device pointer with
 * device.type ACCEL_DEVICE_CUDA (the float * conveniences p->data / p->grad are NULL).
 *
 * The compute stream: accel queues its own work on the model's buffers (gradient zeroing,
 * unscaling, clipping, optimizer steps, the compute-copy refresh) on one stream per process,
 * accel_cuda_stream(acc). Launch forward and backward kernels on it too, and everything is
 * ordered without synchronising. accel waits for that stream itself wherever it reads a result
 * on the host (a clipping norm, the fp16 scaler's inf flag: one small read per step at most)
 * and, through an event, before a gradient bucket leaves the GPU.
 *
 *     cudaStream_t s = accel_cuda_stream(acc);
 *     const accel_param *w = accel_model_param(model, i);
 *     my_forward<<<grid, block, 0, s>>>((const __nv_bfloat16 *)w->compute_view.data, ...);
 *     double seed = accel_backward_begin(acc);
 *     my_backward<<<grid, block, 0, s>>>(seed, (float *)w->grad_view.data, ...);
 *     accel_grad_ready(model, i);       // after launching the last kernel writing its grad
 *     accel_backward_end(acc);
 */
#ifndef ACCEL_CUDA_H
#define ACCEL_CUDA_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "core.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA ordinal acc computes on, or -1 when it runs on the CPU. */
ACCEL_API int accel_cuda_device(const accel *acc);

/* The process's compute stream (created with the device, valid while the process runs), or
 * NULL with ACCEL_ESTATE in accel_last_error(acc) when acc runs on the CPU. */
ACCEL_API cudaStream_t accel_cuda_stream(accel *acc);

/* The compute stream of GPU `ordinal` (a CUDA ordinal of this process): the stream
 * accel_cuda_stream returns for an accelerator on that GPU, and the one the nn toolkit queues
 * the ops of a ctx on cuda:ordinal on (nn_ctx_set_device). For programs that use nn on a GPU
 * without an accelerator handle. Makes the GPU the calling thread's current device (opening
 * it through accel's device layer the first time, which makes the stream); the stream is
 * valid while the process runs. NULL with the thread's error (accel_last_error(NULL)) naming
 * the ordinal when the GPU cannot be opened. Thread-safe. */
ACCEL_API cudaStream_t accel_cuda_device_stream(int ordinal);

/* Device pointers to a model's whole flat buffers (the layout of accel/train.h: parameters in
 * reverse registration order, accel_param.offset elements in): the fp32 master weights and the
 * fp32 gradients. NULL with ACCEL_ESTATE when the model is not allocated or not on a GPU.
 * The compute copy is accel_model_compute_view (its data is a device pointer here). */
ACCEL_API float *accel_cuda_model_master(accel_model *m);
ACCEL_API float *accel_cuda_model_grad(accel_model *m);

/* GPU facts for bug reports (`accel env`): each visible GPU, the CUDA driver and runtime
 * versions, NCCL's version, CUDA_VISIBLE_DEVICES; or why no GPU is usable. One fact per line,
 * truncated to nbytes (always NUL-terminated when nbytes > 0). Returns buf. */
ACCEL_API char *accel_cuda_report(char *buf, size_t nbytes);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_CUDA_H */
