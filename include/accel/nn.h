/*
 * accel/nn.h - the optional neural-network toolkit: fp32 tensors with reverse-mode autograd,
 * ops with backward, layers and a GPT-2 builder (CPU: OpenBLAS sgemm + OpenMP).
 *
 * Lifetimes in one paragraph. Intermediates (every tensor an op returns, and the tensors made
 * with nn_tensor_new / nn_tensor_from) live in an nn_ctx: a per-step arena plus the tape of
 * recorded ops. They stay valid until the ctx is reset, which happens explicitly with
 * nn_ctx_reset or implicitly by the first allocation after nn_backward (so the loss value can
 * still be read after backward). The arena grows during the first step and is then reused: a
 * steady-state step does no malloc. Parameters are persistent tensors owned by an nn_params
 * set; their data and gradient are views into memory supplied through an nn_param_sink (the
 * training module's flat buffers) or, standalone, into flat buffers nn_params allocates.
 *
 * Errors. Ops return NULL on failure and set accel_last_error(NULL) (and the ctx's first
 * error); an op given a NULL input returns NULL without a new message, so a forward chain can
 * be checked once at the end. An op refuses, naming itself and its input k (counted from 0 in
 * the order of its tensor arguments), a tensor of another ctx (ACCEL_EINVAL), one from before
 * the ctx's reset or from a step whose backward ran (ACCEL_ESTATE; best effort: it reads the
 * tensor's struct, which later tensors may have overwritten) and a parameter whose set is not
 * bound (ACCEL_ESTATE). Calls returning accel_status follow the library rules.
 *
 * Threads: an nn_ctx, an nn_params set and the layers built on it belong to one thread at a
 * time; kernels use OpenMP internally when built with it.
 *
 * Layering: this header depends on tensor.h only. The bridge to the training module
 * (nn_model_from_params, accel_backward) is declared at the end over opaque types.
 */
#ifndef ACCEL_NN_H
#define ACCEL_NN_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NN_MAX_DIMS 4

typedef struct nn_ctx nn_ctx;
typedef struct nn_params nn_params;

/*
 * A tensor: fp32, up to NN_MAX_DIMS dims, row-major with element strides. Tensors returned by
 * ops are contiguous; views (nn_reshape, nn_transpose, nn_slice, nn_split) share storage and
 * gradient with their base. Fields above the marker are public and read-only (write through
 * `data` only for leaves you created); use nn_tensor_grad for the gradient of a view.
 */
typedef struct nn_tensor {
    float *data; /* first element */
    int ndim;
    int64_t shape[NN_MAX_DIMS];
    int64_t stride[NN_MAX_DIMS]; /* in elements */
    int requires_grad;
    int param_index; /* index given by the sink for parameters, else -1 */
    /* ---- private to the toolkit ---- */
    float *grad;            /* storage owner's gradient (params: external) */
    struct nn_tensor *base; /* storage owner for views, else NULL */
    int64_t offset;         /* element offset of data from base->data */
    void *sink_ctx;         /* params: the sink that holds them (ctx and declare identify it) */
    int (*sink_declare)(void *ctx, const char *name, int ndim, const int64_t *shape);
    const void *use_ctx; /* params: ctx and epoch of the first use in a recorded step */
    uint64_t use_epoch;
    struct nn_tensor *next_ready; /* params: list of params completing at one tape node */
    /* params: the sink's working-copy callback (nn_param_sink.compute), or NULL */
    void (*sink_compute)(void *ctx, int index, accel_tensor *view);
    /* params: the sink's materialize callback (nn_param_sink.materialize), or NULL */
    accel_status (*sink_materialize)(void *ctx, int index);
    accel_device_type device_type; /* where data and grad are (the ctx's device) */
    /* gradient memory set aside by a segment's backward (nn_checkpoint's, or a GPT block's,
     * which gives back what it allocated) for an input whose gradient it writes first, so
     * that the gradient outlives the segment; grad_shadow_reserved: likewise for the
     * gradient's 2-byte shadow (below) */
    float *grad_reserved;
    void *grad_shadow_reserved;
    /* CUDA autocast "half shadows": the 2-byte values (rnd 1 bf16, 2 fp16) a low-precision
     * product reads, written by the op that produced the fp32 values in the same pass, so no
     * separate rounding pass is needed. shadow: data rounded (owners only; data never changes
     * after its op). grad_shadow: the gradient rounded, valid while the gradient is unchanged
     * (dropped whenever a backward adds to it); grad_shadow_rnd: set in forward by the product
     * that will read this tensor's gradient rounded, asking the gradient's writers for it.
     * data NULL with a shadow: the values exist only as the shadow (a GPT block's LayerNorm
     * output under autocast, read only by products; other ops refuse such a tensor). */
    void *shadow;
    int shadow_rnd;
    void *grad_shadow;
    int grad_shadow_rnd;
    /* grad borrowed: it points at another tensor's final gradient (a residual add's dY on
     * CUDA: both addends' gradients are dY itself), read-only; the first backward that writes
     * this gradient gives it memory of its own (starting from the borrowed values). */
    int grad_borrowed;
} nn_tensor;

/* ===================================================================== contexts and tape */

/* Creates an empty ctx (arena, tape), grad enabled, training mode on, dropout seed 0, step 0.
 * out: receives the ctx on success; free with nn_ctx_free. Returns ACCEL_OK or ACCEL_ENOMEM. */
ACCEL_API accel_status nn_ctx_new(nn_ctx **out);

/* Releases the ctx and every intermediate in it. Accepts NULL. */
ACCEL_API void nn_ctx_free(nn_ctx *g);

/* Drops every intermediate and the tape, keeping the arena memory (coalesced into one block if
 * it grew), and advances the step counter used by dropout. Tensors of this ctx become
 * invalid. Parameter gradients are untouched. */
ACCEL_API void nn_ctx_reset(nn_ctx *g);

/* No-grad mode (torch.no_grad): with enabled == 0 ops record nothing and outputs do not
 * require grad. Returns the previous setting. */
ACCEL_API int nn_ctx_set_grad_enabled(nn_ctx *g, int enabled);

/* Training mode (module.train()/eval()): dropout is the identity when training == 0.
 * Returns the previous setting. */
ACCEL_API int nn_ctx_set_training(nn_ctx *g, int training);

/* Dropout randomness is a counter-based function of (seed, step, op index, element), so it is
 * reproducible and independent of the thread count. The step counter advances at each reset;
 * set it to restore a run (checkpoint resume) or to pin randomness. */
ACCEL_API void nn_ctx_set_seed(nn_ctx *g, uint64_t seed);
ACCEL_API void nn_ctx_set_step(nn_ctx *g, uint64_t step);
ACCEL_API uint64_t nn_ctx_step(const nn_ctx *g);

/*
 * Flush denormals (torch.set_flush_denormal): while an nn op or nn_backward runs on this ctx,
 * the calling thread (and the OpenMP workers nn uses) compute with flush-to-zero and
 * denormals-are-zero set in the MXCSR, so subnormal operands and results (tiny attention
 * probabilities, vanishing gradients) read and write as 0 instead of taking the CPU's slow
 * microcode path (the fp32 GPT step was ~1.4x slower without it). The caller's MXCSR is saved
 * on entry and restored on return (also around backward hooks), so code outside nn, and
 * OpenBLAS threads nn does not drive, are unaffected. Results differ from IEEE only where a
 * value below 1.2e-38 in magnitude was involved. No effect off x86-64.
 *   enabled: 1 (the default) or 0 (IEEE subnormals). Returns the previous setting.
 */
ACCEL_API int nn_ctx_set_flush_denormal(nn_ctx *g, int enabled);

/*
 * Autocast (torch.autocast for CPU kernels). Under a compute dtype ACCEL_BF16 or ACCEL_F16 the
 * inputs of nn_linear, nn_matmul and nn_causal_attention (also the attention probabilities
 * before they multiply V) are rounded to that dtype and the products accumulate in fp32; in
 * backward the incoming gradient is rounded the same way and each gradient contribution
 * those ops produce is rounded to the dtype before it is added (in fp32) to its destination,
 * so a parameter's gradient per backward is what a bf16/fp16 kernel would produce (fp16 can
 * overflow to inf) while accumulation across micro-steps stays fp32. Everything else
 * (softmax, layernorm, activations, losses, reductions) runs in fp32 and every tensor handed
 * back is fp32 (Accelerate's convert_outputs_to_fp32). Parameters with a working copy (a
 * model prepared under mixed precision, which stores it in bf16 / fp16) are read from it:
 * each op widens the weights it uses to fp32 into per-op scratch released when the op (or
 * its backward) returns, instead of rounding the fp32 master per use.
 *   mode: NN_AUTOCAST_AUTO (the default): off until an op uses a parameter whose sink has a
 *         mixed-precision working copy (nn_model_sink of a model under bf16/fp16, i.e. the
 *         prepared model's forward is autocast as Accelerate wraps it), then that dtype for
 *         the rest of the ctx's life; ACCEL_F32: off; ACCEL_BF16 / ACCEL_F16: on.
 * Returns the previous mode; an invalid mode is ignored (returns the current one).
 */
#define NN_AUTOCAST_AUTO (-1)
ACCEL_API int nn_ctx_set_autocast(nn_ctx *g, int mode);
/* The dtype ops run in now: ACCEL_F32 (off), ACCEL_BF16 or ACCEL_F16. */
ACCEL_API accel_dtype nn_ctx_autocast_dtype(const nn_ctx *g);

/*
 * The device a ctx computes on (CUDA builds): with {ACCEL_DEVICE_CUDA, k} every tensor the ctx
 * makes (nn_tensor_new / nn_tensor_from, op results, gradients) has its data and gradient in
 * GPU k's memory, and the ops that have a CUDA implementation run there (docs/cuda.md lists
 * them; the others fail with ACCEL_EUNSUPPORTED naming the op). `data` and nn_tensor_grad are
 * then device pointers: read them with nn_tensor_to_host / nn_tensor_grad_to_host, or from
 * CUDA code. GPU ops are queued on GPU k's compute stream (accel_cuda_stream(acc) for an
 * accelerator on that GPU, accel_cuda_device_stream(k) in accel/cuda.h without one): launch
 * your own kernels reading or writing nn tensors on it. nn_item and the copies to the host
 * wait for it; nn_tensor_from's data and the host ints an op takes (ids, targets) are copied
 * into pinned staging and from there asynchronously (the caller's buffer is free on return).
 * Call on a new or freshly reset ctx (no live tensors). Parameters stay on the CPU for now:
 * a GPU op given a CPU tensor fails naming it.
 * Returns ACCEL_OK; ACCEL_EUNSUPPORTED (a build without CUDA, or no usable GPU: the message
 * says why); ACCEL_EINVAL (NULL ctx, unknown device type); ACCEL_ESTATE (the ctx holds
 * tensors).
 */
ACCEL_API accel_status nn_ctx_set_device(nn_ctx *g, accel_device device);
ACCEL_API accel_device nn_ctx_device(const nn_ctx *g);

/* Arena statistics: bytes reserved, bytes in use, blocks, and how many times the arena had to
 * allocate a new block since creation (constant from step 2 in a steady loop). Separately,
 * the per-op scratch: memory an op (or one op's backward) needs only while it runs, such as
 * parameters widened from a bf16 / fp16 working copy; it is reused by the next op, so what is
 * reserved is the largest single need, not a sum over the step. */
typedef struct nn_ctx_stats {
    size_t reserved_nbytes;
    size_t used_nbytes;
    int n_blocks;
    long long n_grows;
    int n_nodes;                /* ops on the tape now */
    size_t scratch_nbytes;      /* per-op scratch reserved now */
    size_t scratch_peak_nbytes; /* the most per-op scratch any op has needed */
    /* The most arena bytes (host and device arenas together) in use at once since the last
     * reset: a step's peak. Without recomputation it is what the step allocated; segments
     * run under nn_checkpoint give theirs back (see there). */
    size_t peak_nbytes;
} nn_ctx_stats;
ACCEL_API nn_ctx_stats nn_ctx_get_stats(const nn_ctx *g);

/* A zero-filled contiguous leaf tensor in the arena (ndim 0..4; shape borrowed). NULL on
 * failure. requires_grad 0: set it with nn_tensor_requires_grad. */
ACCEL_API nn_tensor *nn_tensor_new(nn_ctx *g, int ndim, const int64_t *shape);

/* A contiguous leaf in the arena holding a copy of `data` (numel floats, borrowed). */
ACCEL_API nn_tensor *nn_tensor_from(nn_ctx *g, const float *data, int ndim, const int64_t *shape);

/* Marks a leaf as requiring grad (its gradient is readable after backward). Returns t. */
ACCEL_API nn_tensor *nn_tensor_requires_grad(nn_tensor *t, int requires_grad);

/* Number of elements. */
ACCEL_API int64_t nn_numel(const nn_tensor *t);

/* 1 when the tensor is row-major contiguous. */
ACCEL_API int nn_is_contiguous(const nn_tensor *t);

/* The gradient of t laid out like t->data (same strides), or NULL when backward has not
 * reached it. Valid until the ctx is reset (parameters: the external gradient memory). An
 * intermediate's gradient is read-only and may share memory with another's (on a GPU the two
 * inputs of a same-shape nn_add borrow its output's gradient). */
ACCEL_API float *nn_tensor_grad(const nn_tensor *t);

/* The scalar value of a one-element tensor (the loss); waits for a GPU tensor's value. NaN,
 * with accel_last_error(NULL) set, for NULL, a tensor that is not one element, or one from
 * before its ctx's reset (best effort, as for ops). */
ACCEL_API float nn_item(const nn_tensor *t);

/* Copies t's values (numel floats, t contiguous) / its gradient (NULL gradient: ACCEL_ESTATE)
 * to host memory dst, from whichever device holds them; waits for the GPU's pending work.
 * ACCEL_EINVAL on NULL arguments or a non-contiguous t; ACCEL_ESTATE for a t from before its
 * ctx's reset (best effort, as for ops). */
ACCEL_API accel_status nn_tensor_to_host(const nn_tensor *t, float *dst);
ACCEL_API accel_status nn_tensor_grad_to_host(const nn_tensor *t, float *dst);

/* ===================================================================== backward */

/* grad_ready is called once per parameter, as soon as its gradient is complete (right after
 * the earliest op using it has been back-propagated), with the parameter tensor (borrowed;
 * param->param_index is the sink's index). A non-OK return stops backward and is returned. */
typedef struct nn_backward_hooks {
    void *ctx;
    accel_status (*grad_ready)(void *ctx, const nn_tensor *param);
} nn_backward_hooks;

/*
 * Reverse-mode pass over the tape of loss's ctx: seeds d(loss) = seed (loss must have one
 * element), accumulates (+=) into parameter gradients and into leaf gradients, calls
 * hooks->grad_ready (hooks may be NULL) per parameter used, and marks the ctx so that its next
 * allocation resets it. Parameters not used in the step get no callback. Returns ACCEL_OK,
 * ACCEL_EINVAL (NULL loss, with the ctx's first forward error in the message; not a scalar;
 * a leaf or a view, not an op result), ACCEL_ESTATE (backward already ran on this tape; a
 * loss from before the ctx's reset), or a hook's status.
 */
ACCEL_API accel_status nn_backward(nn_tensor *loss, float seed, const nn_backward_hooks *hooks);

/* As nn_backward with an explicit output gradient (torch's tensor.backward(gradient)):
 * grad_out has numel(out) floats in out's contiguous order (borrowed). */
ACCEL_API accel_status nn_backward_grad(nn_tensor *out, const float *grad_out,
                                        const nn_backward_hooks *hooks);

/* ===================================================================== recomputation */

/* A segment of the forward for nn_checkpoint: y from x (and from whatever fn_ctx leads to:
 * parameters, tensors made before the segment) by nn ops on g. NULL on failure. */
typedef nn_tensor *(*nn_segment_fn)(nn_ctx *g, void *fn_ctx, nn_tensor *x);

/*
 * Activation recomputation (torch.utils.checkpoint; transformers' gradient checkpointing):
 * returns fn(g, fn_ctx, x), keeping for backward only the segment's output and its inputs.
 * Everything fn made in between (its activations and tape nodes, in host and device memory)
 * goes back to the arena as soon as fn returns; nn_backward runs fn again when it reaches the
 * segment, back-propagates through that second run and gives its memory back too. A step's
 * peak arena memory (nn_ctx_stats.peak_nbytes) then holds one segment's activations at a
 * time instead of all of them, for one more forward of each segment.
 *
 * The second run sees the state of the first: its dropout draws (the ctx's op counter, seed
 * and step), training mode and autocast dtype, so the loss and every gradient are
 * bit-identical to those of the plain call fn(g, fn_ctx, x). Gradients reach x and the
 * tensors from outside fn reads as usual; parameters used in the segment are handed to the
 * grad_ready hooks once the whole segment is back-propagated. With grad disabled, or when
 * nothing fn reads requires grad, this is the plain call (nothing is recomputed).
 *
 * Rules for fn: compute the same thing on every run (same ops, shapes and inputs); return a
 * tensor one of its ops made (not x, nor a view: reshape after the checkpoint instead), else
 * ACCEL_EINVAL; tensors it makes are valid only inside it. fn_ctx (borrowed) and what it
 * leads to must stay valid and unchanged until backward has run. Segments may nest. On a GPU
 * ctx the same: the memory given back is the device arena's.
 * Returns a new tensor of the ctx; NULL (as the ops: accel_last_error) on failure, with
 * ACCEL_EINVAL for a NULL ctx or fn; a NULL x returns NULL without a new message.
 */
ACCEL_API nn_tensor *nn_checkpoint(nn_ctx *g, nn_segment_fn fn, void *fn_ctx, nn_tensor *x);

/* ===================================================================== views */
/* Views share data and gradient with their input; dims may be negative (from the end). */

/* New shape with the same numel; one entry may be -1. Copies first if x is not contiguous. */
ACCEL_API nn_tensor *nn_reshape(nn_ctx *g, nn_tensor *x, int ndim, const int64_t *shape);
/* Swaps two dims (a strided view). */
ACCEL_API nn_tensor *nn_transpose(nn_ctx *g, nn_tensor *x, int dim0, int dim1);
/* Elements [start, end) along dim. */
ACCEL_API nn_tensor *nn_slice(nn_ctx *g, nn_tensor *x, int dim, int64_t start, int64_t end);
/* Contiguous copy (x itself when already contiguous). */
ACCEL_API nn_tensor *nn_contiguous(nn_ctx *g, nn_tensor *x);
/* Splits along dim into n views of sizes[i] (summing to shape[dim]) written to outs[i]. */
ACCEL_API accel_status nn_split(nn_ctx *g, nn_tensor *x, int dim, int n, const int64_t *sizes,
                                nn_tensor **outs);
/* Concatenates n tensors along dim (other dims equal). */
ACCEL_API nn_tensor *nn_concat(nn_ctx *g, nn_tensor *const *xs, int n, int dim);

/* ===================================================================== ops */

/* Elementwise with broadcasting over leading dims: the operand with fewer elements must have
 * a shape equal to the trailing dims of the other (a one-element tensor broadcasts too). */
ACCEL_API nn_tensor *nn_add(nn_ctx *g, nn_tensor *a, nn_tensor *b);
ACCEL_API nn_tensor *nn_sub(nn_ctx *g, nn_tensor *a, nn_tensor *b);
ACCEL_API nn_tensor *nn_mul(nn_ctx *g, nn_tensor *a, nn_tensor *b);
ACCEL_API nn_tensor *nn_div(nn_ctx *g, nn_tensor *a, nn_tensor *b);
/* x * s. */
ACCEL_API nn_tensor *nn_scale(nn_ctx *g, nn_tensor *x, float s);

/* Sum / mean over one dim (keepdim as torch). */
ACCEL_API nn_tensor *nn_sum(nn_ctx *g, nn_tensor *x, int dim, int keepdim);
ACCEL_API nn_tensor *nn_mean(nn_ctx *g, nn_tensor *x, int dim, int keepdim);
/* Sum of all elements (a 0-dim tensor). */
ACCEL_API nn_tensor *nn_sum_all(nn_ctx *g, nn_tensor *x);

ACCEL_API nn_tensor *nn_relu(nn_ctx *g, nn_tensor *x);
/* GELU: approximate == 0 is the exact erf form (torch approximate='none'), 1 the tanh form
 * (approximate='tanh', GPT-2's gelu_new). */
ACCEL_API nn_tensor *nn_gelu(nn_ctx *g, nn_tensor *x, int approximate);
ACCEL_API nn_tensor *nn_tanh(nn_ctx *g, nn_tensor *x);
ACCEL_API nn_tensor *nn_sigmoid(nn_ctx *g, nn_tensor *x);
/* Softmax / log-softmax over dim. */
ACCEL_API nn_tensor *nn_softmax(nn_ctx *g, nn_tensor *x, int dim);
ACCEL_API nn_tensor *nn_log_softmax(nn_ctx *g, nn_tensor *x, int dim);

/* Matrix product: a [..., M, K] x b [K, N] or b [..., K, N] with the same leading dims
 * (one sgemm per batch entry). */
ACCEL_API nn_tensor *nn_matmul(nn_ctx *g, nn_tensor *a, nn_tensor *b);

/* Weight layouts: torch nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out]. */
typedef enum nn_layout { NN_LAYOUT_OUT_IN = 0, NN_LAYOUT_IN_OUT = 1 } nn_layout;

/* y = x W (+ bias) over the last dim of x [..., in]; w is 2-D in `layout`, bias [out] or
 * NULL. Parameters are used in place (no copy), so a tied head is nn_linear(x, wte, NULL,
 * NN_LAYOUT_OUT_IN). */
ACCEL_API nn_tensor *nn_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                               nn_layout layout);

/* linear(gelu(linear(x, w1, b1), approximate), w2, b2): a transformer's MLP as one op (both
 * weights in `layout`; b1 / b2 may be NULL). On the CPU it is exactly those three ops (the
 * same bits, forward and backward). On a GPU with the tanh form (approximate != 0, GPT-2's)
 * cuBLASLt fuses the first bias and GELU into the first product (GELU_AUX_BIAS, keeping the
 * GELU input for backward); in backward, in fp32, GELU's derivative and the first bias's
 * gradient go into the product that makes the hidden gradient (DGELU_BGRAD), and under bf16 /
 * fp16 autocast, by default, one kernel after that product (stored in 2 bytes) applies the
 * derivative and sums the bias gradient (ACCEL_NN_DGELU=epilogue: DGELU_BGRAD, which does not
 * round the hidden gradient before the derivative). Results agree with the three ops to
 * cuBLASLt's GELU (within bf16 tolerance). The erf form, a hidden width that is not a
 * multiple of 8 and empty products take the three ops on a GPU too. */
ACCEL_API nn_tensor *nn_linear_gelu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w1, nn_tensor *b1,
                                           nn_tensor *w2, nn_tensor *b2, nn_layout layout,
                                           int approximate);

typedef enum nn_reduction {
    NN_REDUCTION_MEAN = 0,
    NN_REDUCTION_SUM,
    NN_REDUCTION_NONE
} nn_reduction;

#define NN_CROSS_ENTROPY_OPTIONS_VERSION 2

/* Start from nn_cross_entropy_options_default(). */
typedef struct nn_cross_entropy_options {
    uint32_t size, version;
    int64_t ignore_index;   /* targets equal to it contribute nothing (default -100) */
    nn_reduction reduction; /* mean: divided by the number of non-ignored targets */
    float label_smoothing;  /* torch semantics: (1-e) one-hot + e/C uniform */
    /* Version 2. nn_linear_cross_entropy's rows of logits per chunk (nn_cross_entropy does not
     * use it); 0 (the default): ACCEL_NN_CE_CHUNK_ROWS when set, else as many rows as keep
     * one chunk's fp32 logits within 256 MiB. Negative: ACCEL_EINVAL (from both ops). */
    int64_t chunk_rows;
} nn_cross_entropy_options;
ACCEL_API nn_cross_entropy_options nn_cross_entropy_options_default(void);

/* Cross entropy of logits [..., C] against class indices (numel/C int32 values, borrowed
 * only during the call). Out-of-range non-ignored targets are ACCEL_EINVAL. Returns a scalar,
 * or [...] for NN_REDUCTION_NONE (0 where ignored). opts NULL = defaults. */
ACCEL_API nn_tensor *nn_cross_entropy(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                                      const nn_cross_entropy_options *opts);

/*
 * nn_cross_entropy(nn_linear(x, w, NULL, layout), targets, opts) without the logits in memory
 * (a language model's tied head and loss; Liger-Kernel's fused linear cross entropy): the rows
 * of x [..., C] are taken in chunks (opts->chunk_rows); per chunk the logits x_c W^T are made
 * (with nn_linear's autocast rounding), then one pass gives each row's log-sum-exp and loss
 * and, when a gradient is needed, overwrites the chunk's logits with d(loss)/d(logits)
 * (softmax minus the one-hot, times 1/count for the mean), which two products turn into
 * x_c's rows of dx = dlogits W and into dW += dlogits^T x_c right away. Backward only scales
 * the stored dx [rows, C] and dW (w's shape), both fp32, by the incoming gradient (a scalar)
 * and adds them (rounded to the autocast dtype, as nn_linear's backward rounds its
 * contributions) into x's and w's gradients. Memory: one chunk of logits (at most 256 MiB by
 * default) plus dx and dW instead of the [rows, V] logits and their gradient; a forward
 * without gradients (no-grad mode, or neither x nor w requiring grad: evaluation) keeps only
 * the loss. Results: the unfused ops' within fp32 summation order (with a chunk of all the
 * rows, a seed of 1 or a power of two and gradients that were zero before it, the CPU gives
 * the same bits); under autocast within bf16 / fp16 tolerance. Reduction NONE
 * is forward-only: with a gradient needed it fails with ACCEL_EUNSUPPORTED (use the two
 * ops). Targets as nn_cross_entropy's (rows int32 values, borrowed during the call; ignored
 * rows give zero loss and gradient); label smoothing is supported. w is 2-D in `layout`
 * ([V, C] for NN_LAYOUT_OUT_IN: GPT-2's tied wte). Returns the scalar loss ([...] for NONE);
 * NULL (accel_last_error) with ACCEL_EINVAL for mismatched shapes, bad targets or options.
 */
ACCEL_API nn_tensor *nn_linear_cross_entropy(nn_ctx *g, nn_tensor *x, nn_tensor *w,
                                             const int32_t *targets, nn_layout layout,
                                             const nn_cross_entropy_options *opts);

/* Mean squared error (torch mse_loss) of same-shape tensors. */
ACCEL_API nn_tensor *nn_mse_loss(nn_ctx *g, nn_tensor *input, nn_tensor *target,
                                 nn_reduction reduction);

/* Rows of weight [V, C] picked by ids (int32, shape [ndim dims], copied): [..., C]. */
ACCEL_API nn_tensor *nn_embedding(nn_ctx *g, nn_tensor *weight, const int32_t *ids, int ndim,
                                  const int64_t *shape);

/* LayerNorm over the last dim; weight / bias [C] or NULL. */
ACCEL_API nn_tensor *nn_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *weight, nn_tensor *bias,
                                  float eps);

/* A residual add and the LayerNorm after it (a transformer's x = x + branch, then LN(x)):
 * nn_layernorm(nn_add(x, r), weight, bias, eps), which it returns, and the sum, which *sum
 * receives (an op output like nn_add's; set only on success). The tape holds the same two
 * nodes as the two ops, so values and gradients are theirs bit for bit; on a GPU, where x and
 * r have the same shape, one pass computes both (llm.c's fused residual: the sum is written,
 * not read back), else it is the two ops. NULL on failure (ctx error set), as the ops. */
ACCEL_API nn_tensor *nn_add_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                                      nn_tensor *bias, float eps, nn_tensor **sum);

/* Inverted dropout with probability p while training (identity otherwise or when p == 0). */
ACCEL_API nn_tensor *nn_dropout(nn_ctx *g, nn_tensor *x, float p);

/* Fused causal self-attention over packed qkv [B, T, 3C] (q | k | v, heads of C/n_head
 * consecutive channels, GPT-2's c_attn output) -> [B, T, C]. Keeps only the per-row softmax
 * log-sum-exp for backward (scores are recomputed per head). attn_dropout applies to the
 * attention probabilities while training. */
ACCEL_API nn_tensor *nn_causal_attention(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout);

/* ===================================================================== parameters */

/*
 * Where parameters live. declare is called once per parameter in order (PyTorch/HF name,
 * shape) and returns the parameter's index (>= 0) or a negative accel_status; after every
 * declaration, bind gives the data (numel fp32 values) and gradient (same size, or NULL for a
 * frozen parameter) of each index. The memory must outlive the tensors. A sink of yours gives
 * host memory; nn_model_sink gives the model's memory wherever the model is (on a GPU: device
 * pointers, read by the ops of a ctx on that GPU).
 */
typedef struct nn_param_sink {
    void *ctx;
    int (*declare)(void *ctx, const char *name, int ndim, const int64_t *shape);
    accel_status (*bind)(void *ctx, int index, float **data, float **grad);
    /* Optional (may be NULL): the parameter's mixed-precision working copy as a typed view.
     * Fills view->dtype with the precision the model computes in (ACCEL_BF16 / ACCEL_F16, or
     * ACCEL_F32 for none) and view->data with the numel values stored in that dtype (the
     * master rounded to nearest even) in the memory view->device names (the parameters'
     * device), or NULL when there is none or it is not valid now. Consulted at every autocast use,
     * so it may change between steps. A sink whose view->dtype is not ACCEL_F32 also turns on
     * NN_AUTOCAST_AUTO (see nn_ctx_set_autocast). */
    void (*compute)(void *ctx, int index, accel_tensor *view);
    /* Optional (may be NULL): called before an op reads parameter `index`'s data (forward: as
     * the op takes its inputs; backward: before the backward of a node that read it), so a
     * sink whose parameters are not always present (ZeRO stage 3: gathered per unit) can
     * make its data and working copy valid. A non-OK return fails the op (forward) or stops
     * backward, with the sink's message. */
    accel_status (*materialize)(void *ctx, int index);
} nn_param_sink;

/* Weight initialisations applied by nn_params_init. */
typedef enum nn_init_kind {
    NN_INIT_NONE = 0, /* leave as bound */
    NN_INIT_ZEROS,
    NN_INIT_ONES,
    NN_INIT_NORMAL, /* N(0, a^2) */
    NN_INIT_UNIFORM /* U(-a, a) */
} nn_init_kind;
typedef struct nn_init {
    nn_init_kind kind;
    float a;
} nn_init;

/* Creates an empty parameter set over `sink` (borrowed; copied by value), or over built-in
 * flat buffers when sink is NULL. Free with nn_params_free. */
ACCEL_API accel_status nn_params_new(nn_params **out, const nn_param_sink *sink);

/* Releases the set, its parameter tensors and (standalone) its buffers. Accepts NULL. */
ACCEL_API void nn_params_free(nn_params *p);

/* Phase 1: declares a parameter (name copied, ndim 1..4). Returns the tensor, owned by p,
 * with data NULL until nn_params_bind; NULL on failure (duplicate name, sink error). */
ACCEL_API nn_tensor *nn_params_declare(nn_params *p, const char *name, int ndim,
                                       const int64_t *shape, nn_init init);

/* Phase 2: binds every declared parameter to its memory. Declaring after bind is ESTATE. */
ACCEL_API accel_status nn_params_bind(nn_params *p);

/* Phase 3: fills every parameter with its declared init from `seed` (counter-based per
 * parameter and element: independent of order and thread count; parameters on a GPU get the
 * same values, made on the host and copied over). Must follow bind. */
ACCEL_API accel_status nn_params_init(nn_params *p, uint64_t seed);

ACCEL_API int nn_params_count(const nn_params *p);
/* The i-th declared parameter / its name (borrowed, valid while p lives), NULL if out of range. */
ACCEL_API nn_tensor *nn_params_get(const nn_params *p, int i);
ACCEL_API const char *nn_params_name(const nn_params *p, int i);
/* The parameter named `name`, or NULL. */
ACCEL_API nn_tensor *nn_params_find(const nn_params *p, const char *name);
/* Total number of parameter elements. */
ACCEL_API int64_t nn_params_numel(const nn_params *p);

/* Standalone sets only (sink NULL): the flat data / gradient buffers (count elements,
 * parameters in declaration order), NULL before bind or for a set over a sink. */
ACCEL_API float *nn_params_flat_data(const nn_params *p, int64_t *count);
ACCEL_API float *nn_params_flat_grad(const nn_params *p, int64_t *count);

/* Zeroes every bound gradient (on a GPU: queued on the GPU's compute stream). */
ACCEL_API void nn_params_zero_grad(nn_params *p);

/* ===================================================================== layers */
/* Layers are plain structs of borrowed parameter tensors (owned by the nn_params set):
 * _declare fills them (phase 1), _forward records ops once the set is bound. `prefix` is
 * the module name ("transformer.h.0.mlp"); an empty prefix names parameters "weight"... */

typedef struct nn_linear_layer {
    nn_tensor *weight, *bias; /* bias NULL when declared without */
    int64_t in_features, out_features;
    nn_layout layout;
} nn_linear_layer;
/* Declares prefix.weight ([out,in] or [in,out] per layout) and prefix.bias [out]; init is
 * torch's default U(+-1/sqrt(in)) for both. */
ACCEL_API accel_status nn_linear_declare(nn_linear_layer *l, nn_params *p, const char *prefix,
                                         int64_t in, int64_t out, int bias, nn_layout layout);
ACCEL_API nn_tensor *nn_linear_forward(nn_ctx *g, const nn_linear_layer *l, nn_tensor *x);

typedef struct nn_embedding_layer {
    nn_tensor *weight; /* [num, dim], init N(0, 1) as torch */
    int64_t num, dim;
} nn_embedding_layer;
ACCEL_API accel_status nn_embedding_declare(nn_embedding_layer *l, nn_params *p, const char *prefix,
                                            int64_t num, int64_t dim);
ACCEL_API nn_tensor *nn_embedding_forward(nn_ctx *g, const nn_embedding_layer *l,
                                          const int32_t *ids, int ndim, const int64_t *shape);

typedef struct nn_layernorm_layer {
    nn_tensor *weight, *bias; /* [dim], ones / zeros */
    float eps;
} nn_layernorm_layer;
ACCEL_API accel_status nn_layernorm_declare(nn_layernorm_layer *l, nn_params *p, const char *prefix,
                                            int64_t dim, float eps);
ACCEL_API nn_tensor *nn_layernorm_forward(nn_ctx *g, const nn_layernorm_layer *l, nn_tensor *x);

typedef enum nn_activation {
    NN_ACT_GELU = 0,  /* exact erf */
    NN_ACT_GELU_TANH, /* GPT-2's gelu_new */
    NN_ACT_RELU,
    NN_ACT_TANH
} nn_activation;

/* fc -> activation -> proj -> dropout; names prefix.<fc_name> / prefix.<proj_name>. */
typedef struct nn_mlp_layer {
    nn_linear_layer fc, proj;
    nn_activation act;
    float dropout;
} nn_mlp_layer;
/* fc_name/proj_name NULL = "c_fc"/"c_proj" (GPT-2). */
ACCEL_API accel_status nn_mlp_declare(nn_mlp_layer *l, nn_params *p, const char *prefix, int64_t in,
                                      int64_t hidden, int64_t out, nn_activation act,
                                      nn_layout layout, const char *fc_name, const char *proj_name);
ACCEL_API nn_tensor *nn_mlp_forward(nn_ctx *g, const nn_mlp_layer *l, nn_tensor *x);

/* GPT configuration; defaults are GPT-2 small (124M). */
typedef struct nn_gpt_config {
    uint32_t size, version; /* filled by nn_gpt_config_default */
    int n_layer, n_head, n_embd;
    int block_size; /* context length (wpe rows) */
    int vocab_size;
    int tied;          /* 1: lm_head shares transformer.wte.weight */
    nn_activation act; /* NN_ACT_GELU_TANH in GPT-2 */
    float dropout;     /* embd, attn and resid dropout (GPT-2: 0.1) */
    float ln_eps;      /* 1e-5 */
} nn_gpt_config;
#define NN_GPT_CONFIG_VERSION 1
ACCEL_API nn_gpt_config nn_gpt_config_default(void);

/* A pre-LN transformer block of GPT-2 (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp). */
typedef struct nn_block_layer {
    nn_layernorm_layer ln_1, ln_2;
    nn_linear_layer c_attn, c_proj;
    nn_mlp_layer mlp;
    int n_head;
    float dropout;
} nn_block_layer;
/* Declares the block's parameters under prefix with GPT-2 init (residual projections scaled
 * by 1/sqrt(2 n_layer)). */
ACCEL_API accel_status nn_block_declare(nn_block_layer *l, nn_params *p, const char *prefix,
                                        const nn_gpt_config *cfg);
ACCEL_API nn_tensor *nn_block_forward(nn_ctx *g, const nn_block_layer *l, nn_tensor *x);

typedef struct nn_gpt nn_gpt;

/*
 * Declares a GPT into p with Hugging Face GPT-2 names and layouts, in this order:
 * transformer.wte.weight [V,C], transformer.wpe.weight [T,C], per block i
 * transformer.h.i.{ln_1.weight, ln_1.bias, attn.c_attn.weight [C,3C], attn.c_attn.bias,
 * attn.c_proj.weight [C,C], attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight [C,4C],
 * mlp.c_fc.bias, mlp.c_proj.weight [4C,C], mlp.c_proj.bias}, transformer.ln_f.weight/.bias,
 * and lm_head.weight [V,C] when untied. Init (GPT-2): N(0, 0.02) weights, residual c_proj
 * N(0, 0.02/sqrt(2 n_layer)), zero biases, LayerNorm ones/zeros. The caller then binds and
 * inits p. out: owned, free with nn_gpt_free (before p). cfg copied.
 */
ACCEL_API accel_status nn_gpt_declare(nn_gpt **out, nn_params *p, const nn_gpt_config *cfg);
ACCEL_API void nn_gpt_free(nn_gpt *m);
ACCEL_API const nn_gpt_config *nn_gpt_get_config(const nn_gpt *m);

/* Activation recomputation per transformer block (transformers'
 * model.gradient_checkpointing_enable()): with enabled != 0 nn_gpt_forward runs each block
 * under nn_checkpoint, so a training step holds one block's activations at a time (and each
 * block's input) for one more forward per block; losses and gradients are unchanged, bit for
 * bit. Off by default. Returns the previous setting (0 for a NULL model). */
ACCEL_API int nn_gpt_set_recompute(nn_gpt *m, int enabled);

/* Standalone convenience: a new nn_params (flat buffers), declare, bind, init(seed). */
ACCEL_API accel_status nn_gpt_build(nn_gpt **out, nn_params **params_out, const nn_gpt_config *cfg,
                                    uint64_t seed);

/*
 * Forward pass over token ids [B, T] (int32, borrowed during the call; T <= block_size).
 * logits_out (may be NULL) receives [B, T, V]; when targets ([B, T], -100 ignored) is not
 * NULL, loss_out receives the mean cross entropy. Without logits_out the head and the loss
 * are one nn_linear_cross_entropy (the [B, T, V] logits are never made); with it, nn_linear
 * then nn_cross_entropy.
 */
ACCEL_API accel_status nn_gpt_forward(nn_ctx *g, const nn_gpt *m, const int32_t *ids,
                                      const int32_t *targets, int64_t B, int64_t T,
                                      nn_tensor **logits_out, nn_tensor **loss_out);

/* Matmul FLOPs of one forward+backward pass over B x T tokens (6 x matmul parameters per
 * token plus 12 x n_layer x T x C per token for attention), for throughput reports. */
ACCEL_API double nn_gpt_train_flops(const nn_gpt_config *cfg, int64_t B, int64_t T);

/* ===================================================================== accel bridge */
/* The link to the training module (src/nn/glue.c): nn parameters as views into an
 * accel_model's flat buffers, and accel_backward over the tape. */

/*
 * A sink that registers each declared parameter in `model` (accel_model_add_param, same name
 * and shape) and binds it to the model's master weights and gradient views (allocating the
 * model's flat buffers at the first bind). Declare everything before accel_prepare. The model
 * stays on its device: the accelerator's (a GPU in a CUDA build with one) unless
 * accel_model_set_device chose another before the first declaration. Parameters on a GPU are
 * computed with by a ctx on that GPU (nn_ctx_set_device(g, accel_device_of(acc))); a CPU ctx
 * refuses them, naming the op.
 */
ACCEL_API nn_param_sink nn_model_sink(accel_model *model);

/* nn_params_new over nn_model_sink(model). */
ACCEL_API accel_status nn_params_for_model(nn_params **out, accel_model *model);

/*
 * Accelerate's accelerator.backward(loss): seed = accel_backward_begin(acc) (1 / accumulation
 * steps, times the fp16 loss scale), nn_backward(loss, seed) with each parameter that belongs
 * to an accel_model reported through accel_grad_ready as soon as its gradient is complete
 * (so bucket all-reduces overlap the rest of backward), then accel_backward_end(acc), which is
 * called even when backward fails. Returns the first failure: nn_backward's, a grad-ready
 * failure, or accel_backward_end's (ACCEL_EPEER / ACCEL_ETIMEDOUT).
 */
ACCEL_API accel_status accel_backward(accel *acc, nn_tensor *loss);

/*
 * Accelerate's accelerator.autocast(autocast_handler) as a begin/end pair around user code
 * that runs nn ops on g: enabled 1 applies acc's mixed precision (bf16 / fp16; no effect
 * under "no"), enabled 0 locally disables autocast (AutocastKwargs(enabled=False)), also
 * inside the automatically autocast forward of a prepared model. Pairs nest up to 8 deep.
 * Returns ACCEL_OK; ACCEL_EINVAL (NULL argument); ACCEL_ESTATE (too deep, or end without
 * begin). Same thread as g.
 */
ACCEL_API accel_status accel_autocast_begin(accel *acc, nn_ctx *g, int enabled);
ACCEL_API accel_status accel_autocast_end(accel *acc, nn_ctx *g);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_NN_H */
