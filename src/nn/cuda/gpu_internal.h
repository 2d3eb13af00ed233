/*
 * Shared by the nn toolkit's CUDA files: the per-ctx GPU state and the checks every GPU op
 * makes. Temporaries of GPU ops (targets, ids, low-precision copies, row statistics) come from
 * the ctx's device arena and live for the step, like the CPU ops' arena scratch. Everything a
 * ctx queues goes on one stream, the GPU's compute stream (nn__cu_stream).
 */
#ifndef ACCEL_NN_CUDA_GPU_INTERNAL_H
#define ACCEL_NN_CUDA_GPU_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "nn/nn_gpu.h"
#include "nn_kernels.h"

/* Pinned host memory the step's host inputs (ids, targets, a host gradient seed) are copied
 * from: bytes [0, used) hold this step's, and `done` completes when the last copy queued from
 * it has. */
typedef struct nn_stage_bank {
    unsigned char *host;
    size_t cap, used;
    cudaEvent_t done;
    int pending; /* done was recorded after a copy */
} nn_stage_bank;

/* g->gpu of a CUDA ctx. */
typedef struct nn_gpu_state {
    int ordinal;
    cudaStream_t stream; /* the GPU's compute stream (accel_cuda_device_stream): every op's */
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's */
    size_t workspace_nbytes;
    /* Double-buffered staging: a step fills bank[cur] while the copies of the previous step
     * (the other bank) may still be in flight. stage_epoch: the ctx epoch bank[cur] serves;
     * stage_want: the most one step staged, the size a bank grows to when it is next taken. */
    nn_stage_bank bank[2];
    int cur;
    uint64_t stage_epoch;
    size_t stage_want;
} nn_gpu_state;

/* The compute stream of g (a CUDA ctx): every kernel, cuBLASLt call, memset and copy of the
 * ctx's ops is queued on it, so they run in issue order with each other, with accel's own work
 * on the model's buffers and with the reducer's events, which are recorded on it. */
static inline cudaStream_t nn__cu_stream(const nn_ctx *g)
{
    return ((const nn_gpu_state *)g->gpu)->stream;
}

/* 1 when e is cudaSuccess; else records "op: CUDA: <error>" as the ctx's error and returns 0. */
int accel__nn_cu_ok(nn_ctx *g, cudaError_t e, const char *op);
/* 1 when g computes on a GPU and each non-NULL tensor of ts (ts[k] is the op's input k, in the
 * order of its public arguments) passes the CPU ops' checks (accel__nn_input_ok: bound, of g,
 * of g's current step) and is on the GPU, contiguous and holds its fp32 values; else records
 * an error naming op, the input and the culprit and returns 0. Compares only: no launch, no
 * synchronisation. The _product_
 * form, for a product that reads ts[0] through accel__nn_cu_operand: ts[0] may hold only its
 * half shadow (accel__nn_norm_operand's output; the operand then checks the dtype). */
int accel__nn_cu_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n);
int accel__nn_cu_product_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n);
/* A device copy of nbytes of host memory in the device arena, or NULL (ctx error set naming
 * op): the bytes are copied into the ctx's pinned staging and from there to the GPU by an
 * asynchronous copy on the compute stream, so h may be reused as soon as this returns and
 * the host does not wait for the GPU. */
void *accel__nn_cu_stage(nn_ctx *g, const void *h, size_t nbytes, const char *op);
/* The same for n host ints. */
int32_t *accel__nn_cu_ints(nn_ctx *g, const int32_t *h, int64_t n, const char *op);
/* The kernels' rounding mode for an autocast dtype (0 none, 1 bf16, 2 fp16). */
int accel__nn_cu_rnd(accel_dtype dt);
/* *part = scratch for n sums over rows x cols (nn_cu_col_sum's partial rows; NULL where the
 * sums need none), in per-op scratch; 0 and the ctx error on failure. */
int accel__nn_cu_sum_parts(nn_ctx *g, int64_t rows, int64_t cols, int n, float **part);

/* shadow_gpu.c. The operand a product reads for t (t's data in fp32; under autocast rnd its
 * half shadow, or a parameter's working copy, or a 2-byte copy, in the arena or, with
 * `scratch`, per-op scratch); NULL and the ctx error on failure. accel__nn_cu_half_copy: n
 * values of src rounded into such a copy (a pass of its own). */
const void *accel__nn_cu_operand(nn_ctx *g, const nn_tensor *t, int rnd, int scratch,
                                 const char *what);
void *accel__nn_cu_half_copy(nn_ctx *g, const float *src, int64_t n, int rnd, int scratch,
                             const char *what);
/* Half shadows (nn_tensor.shadow / grad_shadow): the rounding a producer does for the
 * product that reads its output (or gradient) rounded, in the pass that writes the fp32 values,
 * instead of a separate pass. accel__nn_cu_shadow_rnd: the dtype (rnd) an op of g writes its
 * output's shadow in, 0 for none (no autocast, or shadows off). accel__nn_cu_shadow_alloc:
 * t's shadow (numel(t) 2-byte values in the arena), set on t (an owner) before its producer's
 * kernel fills it; NULL and the ctx error on OOM. accel__nn_cu_grad_shadow_alloc: for a
 * backward about to write all of owner t's gradient (fresh or added to), room for the shadow
 * t's consumer asked for (t->grad_shadow_rnd; the memory a segment set aside for it when there
 * is, recompute.c), or NULL when none is wanted (or on OOM, the ctx error set); the caller sets
 * t->grad_shadow once its kernel is queued (after taking the gradient, which drops an older
 * shadow). accel__nn_cu_shadows_on: 1 unless they are off (ACCEL_NN_SHADOW=0, which also makes the
 * residual add's backward copy dY into its inputs' gradients instead of lending it, and a GPT
 * block's LayerNorm outputs fp32). */
int accel__nn_cu_shadows_on(void);
int accel__nn_cu_shadow_rnd(const nn_ctx *g);
void *accel__nn_cu_shadow_alloc(nn_ctx *g, nn_tensor *t, int rnd);
void *accel__nn_cu_grad_shadow_alloc(nn_ctx *g, nn_tensor *t);
/* Test hooks: shadows on (1, the default; ACCEL_NN_SHADOW) or off (0: every operand rounded by
 * its own pass), process-wide, not thread-safe; and how many such rounding passes
 * (accel__nn_cu_operand's copies and linear backward's dY) were queued in this process. */
void accel__nn_cu_set_shadows(int on);
unsigned long accel__nn_cu_half_copies(void);
/* Column-major D (m x n, fp32, ldd) = op(A) op(B) + beta D through cuBLASLt, A and B fp32 or
 * (rnd) 2-byte, fp32 accumulation; 0 and the ctx error (naming `what`) on failure. */
int accel__nn_cu_matmul(nn_ctx *g, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                        int64_t lda, const void *B, int64_t ldb, float beta, float *D, int64_t ldd,
                        int rnd, const char *what);
/* Test hook: which cuBLASLt epilogues products ask for, as if cuBLASLt had no algorithm with
 * the others (so their fallbacks run): 2 all (the default), 1 all but DGELU_BGRAD, 0 none.
 * Process-wide; not thread-safe. */
void accel__nn_cu_lt_epilogues(int level);
/* Test hook: how the fused MLP makes its hidden gradient under autocast, overriding
 * ACCEL_NN_DGELU: 1 a plain 2-byte product and nn_cu_dgelu_bgrad_half (the default), 0
 * cuBLASLt's DGELU(_BGRAD) epilogue (and its fallbacks, accel__nn_cu_lt_epilogues).
 * Process-wide; not thread-safe. */
void accel__nn_cu_dgelu_kernel(int on);
/* Test hook: how a linear's bias gradient is summed, overriding ACCEL_NN_BGRAD: 0 the
 * column-sum kernel (the default), 1 cuBLASLt's BGRADA / BGRADB epilogue in the weight-gradient
 * product (and its fallback, accel__nn_cu_lt_epilogues). Process-wide; not thread-safe. */
void accel__nn_cu_bgrad_epilogue(int on);

/* The op entry points of the table (ops_gpu.c, linear_gpu.c, lce_gpu.c). */
nn_tensor *accel__nn_cu_add(nn_ctx *g, nn_tensor *a, nn_tensor *b);
nn_tensor *accel__nn_cu_gelu(nn_ctx *g, nn_tensor *x, int approximate);
nn_tensor *accel__nn_cu_dropout(nn_ctx *g, nn_tensor *x, float p);
nn_tensor *accel__nn_cu_embedding(nn_ctx *g, nn_tensor *weight, const int32_t *ids, int ndim,
                                  const int64_t *shape);
nn_tensor *accel__nn_cu_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b, float eps);
nn_tensor *accel__nn_cu_add_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *w,
                                      nn_tensor *b, float eps, nn_tensor **sum, int operand_only);
nn_tensor *accel__nn_cu_cross_entropy(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                                      const nn_cross_entropy_options *opts);
nn_tensor *accel__nn_cu_attention(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout);
nn_tensor *accel__nn_cu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b,
                               nn_layout layout);
/* ACCEL_NN_ATTN and ACCEL_NN_ATTN_FAST applied (once a process; ops_gpu.c). */
void accel__nn_cu_attn_env(void);
/* nn_causal_attention's kernel arguments for qkv [B, T, 3C] with n_head heads in ctx g
 * (autocast, training): the op's own arithmetic, so that accel__nn_cu_linear_qkv decides on
 * exactly what the attention will see; key and the copies left 0. */
nn_cu_attn accel__nn_cu_attn_of(const nn_ctx *g, int64_t B, int64_t T, int64_t C, int n_head,
                                float attn_dropout);
/* ops_gpu.c. For a backward (node n) about to write ALL of x's gradient as values of rnd's
 * dtype (rnd != 0, numel(x) > 0: a product stored rounded, or the head's rounded dx): when x's
 * gradient does not exist yet and x is the shell output of the LayerNorm recorded just before
 * n (so no other op reads x: n is its only consumer), that LayerNorm will read its dY as 2-byte
 * values of rnd, and the memory returned (*half = 1, *fresh = 1) holds numel(x) such values:
 * the caller must write exactly those there (their bits; no fp32 values are ever stored). The
 * memory is allocated at 2 bytes an element (the memory a recomputed segment set aside, 4
 * bytes an element, when there is). Otherwise *half = 0 and it is accel__nn_grad_w(g, x,
 * fresh). NULL and the ctx error on OOM. */
void *accel__nn_cu_ln_dy_grad(nn_ctx *g, nn_node *n, nn_tensor *x, int rnd, int *fresh, int *half);
/* Test hooks: how many times accel__nn_cu_ln_dy_grad has said *half = 1 (all ctxs); and the
 * bytes an element it allocates for such a gradient (2, the default; 4, the fp32 gradient's
 * size, as before these were sized, so a test can compare the arena's peak). Process-wide; not
 * thread-safe. */
unsigned long accel__nn_cu_ln_half_dys(void);
void accel__nn_cu_ln_dy_elem_nbytes(int nbytes);
/* accel__nn_linear_qkv on the GPU (shadow_gpu.c); accel__nn_cu_linear_shell: nn_linear with
 * an output that holds only its 2-byte shadow of rnd's dtype (linear_gpu.c). */
nn_tensor *accel__nn_cu_linear_qkv(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b,
                                   nn_layout layout, int n_head, float attn_dropout);
nn_tensor *accel__nn_cu_linear_shell(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b,
                                     nn_layout layout, int rnd);
nn_tensor *accel__nn_cu_linear_cross_entropy(nn_ctx *g, nn_tensor *x, nn_tensor *w,
                                             const int32_t *targets, nn_layout layout,
                                             const nn_cross_entropy_options *opts);
nn_tensor *accel__nn_cu_linear_gelu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w1, nn_tensor *b1,
                                           nn_tensor *w2, nn_tensor *b2, nn_layout layout);

#endif /* ACCEL_NN_CUDA_GPU_INTERNAL_H */
