/*
 * Shared by the nn toolkit's CUDA files: the per-ctx GPU state and the checks every GPU op
 * makes. Temporaries of GPU ops (targets, ids, low-precision copies, row statistics) come from
 * the ctx's device arena and live for the step, like the CPU ops' arena scratch.
 */
#ifndef ACCEL_NN_CUDA_GPU_INTERNAL_H
#define ACCEL_NN_CUDA_GPU_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "nn/nn_gpu.h"
#include "nn_kernels.h"

/* g->gpu of a CUDA ctx. */
typedef struct nn_gpu_state {
    int ordinal;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's */
    size_t workspace_nbytes;
} nn_gpu_state;

/* 1 when e is cudaSuccess; else records "op: CUDA: <error>" as the ctx's error and returns 0. */
int accel__nn_cu_ok(nn_ctx *g, cudaError_t e, const char *op);
/* 1 when g computes on a GPU and each non-NULL tensor of ts is on it and contiguous; else
 * records an error naming op and the input and returns 0. */
int accel__nn_cu_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n);
/* A device copy of n host ints in the device arena, or NULL (ctx error set). */
int32_t *accel__nn_cu_ints(nn_ctx *g, const int32_t *h, int64_t n, const char *op);
/* The kernels' rounding mode for an autocast dtype (0 none, 1 bf16, 2 fp16). */
int accel__nn_cu_rnd(accel_dtype dt);

/* The op entry points of the table (ops_gpu.c, linear_gpu.c). */
nn_tensor *accel__nn_cu_add(nn_ctx *g, nn_tensor *a, nn_tensor *b);
nn_tensor *accel__nn_cu_gelu(nn_ctx *g, nn_tensor *x, int approximate);
nn_tensor *accel__nn_cu_dropout(nn_ctx *g, nn_tensor *x, float p);
nn_tensor *accel__nn_cu_embedding(nn_ctx *g, nn_tensor *weight, const int32_t *ids, int ndim,
                                  const int64_t *shape);
nn_tensor *accel__nn_cu_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b, float eps);
nn_tensor *accel__nn_cu_cross_entropy(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                                      const nn_cross_entropy_options *opts);
nn_tensor *accel__nn_cu_attention(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout);
nn_tensor *accel__nn_cu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b,
                               nn_layout layout);

#endif /* ACCEL_NN_CUDA_GPU_INTERNAL_H */
