/*
 * The nn toolkit's GPU backend as a table of functions (src/nn/cuda/ in CUDA builds): device
 * memory for a ctx's arena, copies, and the ops that run on the GPU. A build without CUDA has
 * no table (accel__nn_gpu is NULL) and refuses nn_ctx_set_device(CUDA), so no tensor can be on
 * a GPU there and the ops never reach this table.
 *
 * Invariants: every tensor of a CUDA ctx has its data and gradient in that GPU's memory (the
 * tensor structs, tape nodes and anything the host reads stay in host memory); GPU ops run on
 * the GPU's compute stream (the one accel_cuda_stream gives) in issue order, so nothing here
 * synchronises except the copies to the host and those of user memory to the GPU.
 */
#ifndef ACCEL_NN_GPU_H
#define ACCEL_NN_GPU_H

#include "nn_internal.h"

typedef struct nn_gpu_ops {
    /* Opens GPU `ordinal` for g (g->gpu: handles, workspace); close releases them. */
    accel_status (*open)(nn_ctx *g, int ordinal);
    void (*close)(nn_ctx *g);
    /* Device memory (NULL and the thread error on failure) and its release. */
    void *(*alloc)(size_t nbytes);
    void (*free)(void *p);
    /* On the compute stream of g, or with g NULL of the GPU that holds the device pointer:
     * zeroing (queued); a copy to the device (src reusable on return: with g staged through
     * pinned memory and queued, without g finished); a copy to the host (finished). */
    accel_status (*zero)(nn_ctx *g, void *p, size_t nbytes);
    accel_status (*to_device)(nn_ctx *g, void *dst, const void *src, size_t nbytes);
    accel_status (*to_host)(nn_ctx *g, void *dst, const void *src, size_t nbytes);
    /* Queued copy between two non-overlapping device buffers, on g's compute stream. */
    accel_status (*copy)(nn_ctx *g, void *dst, const void *src, size_t nbytes);
    /* d[i] += h[i] for n floats (h in host memory, staged: queued, h reusable at once):
     * seeds backward. */
    accel_status (*add_host)(nn_ctx *g, float *d, const float *h, int64_t n);
    /* The ops: same contracts as the public ones, on tensors of a CUDA ctx. */
    nn_tensor *(*add)(nn_ctx *g, nn_tensor *a, nn_tensor *b);
    nn_tensor *(*gelu)(nn_ctx *g, nn_tensor *x, int approximate);
    nn_tensor *(*dropout)(nn_ctx *g, nn_tensor *x, float p);
    nn_tensor *(*embedding)(nn_ctx *g, nn_tensor *weight, const int32_t *ids, int ndim,
                            const int64_t *shape);
    nn_tensor *(*layernorm)(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b, float eps);
    /* nn_add_layernorm (r may be NULL only with operand_only: nn_layernorm);
     * operand_only: accel__nn_norm_operand. */
    nn_tensor *(*add_layernorm)(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *w, nn_tensor *b,
                                float eps, nn_tensor **sum, int operand_only);
    nn_tensor *(*linear)(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b, nn_layout layout);
    /* accel__nn_linear_qkv. */
    nn_tensor *(*linear_qkv)(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b, nn_layout layout,
                             int n_head, float attn_dropout);
    /* nn_linear_gelu_linear with the tanh GELU. */
    nn_tensor *(*linear_gelu_linear)(nn_ctx *g, nn_tensor *x, nn_tensor *w1, nn_tensor *b1,
                                     nn_tensor *w2, nn_tensor *b2, nn_layout layout);
    nn_tensor *(*cross_entropy)(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                                const nn_cross_entropy_options *opts);
    nn_tensor *(*attention)(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout);
    nn_tensor *(*linear_cross_entropy)(nn_ctx *g, nn_tensor *x, nn_tensor *w,
                                       const int32_t *targets, nn_layout layout,
                                       const nn_cross_entropy_options *opts);
} nn_gpu_ops;

/* The CUDA table, or NULL in a build without CUDA. */
extern const nn_gpu_ops *const accel__nn_gpu;

/* 1 when t's memory is on a GPU. */
static inline int nn__on_gpu(const nn_tensor *t)
{
    return t != NULL && t->device_type == ACCEL_DEVICE_CUDA;
}

/* 1 when an op must take its GPU path: the ctx computes on a GPU or an input is on one (the
 * GPU op then refuses whatever does not match, by name). */
static inline int nn__use_gpu(const nn_ctx *g, const nn_tensor *a, const nn_tensor *b,
                              const nn_tensor *c)
{
    return (g != NULL && g->device.type == ACCEL_DEVICE_CUDA) || nn__on_gpu(a) || nn__on_gpu(b) ||
           nn__on_gpu(c);
}

/* For the ops without a GPU implementation: fails with ACCEL_EUNSUPPORTED naming the op when
 * the ctx computes on a GPU or any of the n tensors is on one (returns 1), else 0. */
int accel__nn_gpu_refuse(nn_ctx *g, const char *op, nn_tensor *const *ts, int n);

/* Refuses, as the op's return, when one of the tensors is on a GPU. */
#define NN_CPU_ONLY(g, op, ...)                                                                    \
    do {                                                                                           \
        nn_tensor *const nn_ts_[] = {__VA_ARGS__};                                                 \
        if (accel__nn_gpu_refuse((g), (op), nn_ts_, (int)(sizeof(nn_ts_) / sizeof(nn_ts_[0])))) {  \
            return NULL;                                                                           \
        }                                                                                          \
    } while (0)

#endif /* ACCEL_NN_GPU_H */
