/*
 * Private interface of the nn toolkit: the ctx (arena + tape), tape nodes, helpers shared by
 * the op files, the counter-based RNG and the vectorisable math kernels.
 *
 * Invariant: every op output is a fresh contiguous arena tensor that owns its storage
 * (base == NULL); views point at the storage owner, so a gradient always lives on an owner and
 * a view's gradient is the owner's gradient at the view's offset and strides.
 */
#ifndef ACCEL_NN_INTERNAL_H
#define ACCEL_NN_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "accel/nn.h"
#include "base/base.h"

/* The kernels never rely on floating-point exception flags; without this GCC refuses to
 * if-convert the clamps and selects in the math below, and those loops stay scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
/* The NN_SIMD pragmas are requests: clang reports a loop it could not vectorise (a max
 * reduction in one ISA clone) as a warning, which -Werror would turn into a build failure for
 * a missed optimisation. The result is correct either way. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#ifdef ACCEL_HAVE_OPENMP
#include <omp.h>
#define NN_PRAGMA(x) _Pragma(#x)
#define NN_OMP_FOR(n) NN_PRAGMA(omp parallel for schedule(static) if ((n) > 32768))
#define NN_SIMD NN_PRAGMA(omp simd)
/* A simd loop accumulating into the named scalars (order of the sum may change). */
#define NN_SIMD_SUM(...) NN_PRAGMA(omp simd reduction(+ : __VA_ARGS__))
#define NN_SIMD_MAX(v) NN_PRAGMA(omp simd reduction(max : v))
static inline int nn__max_threads(void)
{
    return omp_get_max_threads();
}
static inline int nn__thread(void)
{
    return omp_get_thread_num();
}
#else
#define NN_OMP_FOR(n)
#define NN_SIMD
#define NN_SIMD_SUM(...)
#define NN_SIMD_MAX(v)
static inline int nn__max_threads(void)
{
    return 1;
}
static inline int nn__thread(void)
{
    return 0;
}
#endif

typedef struct nn_node nn_node;
typedef void (*nn_backward_fn)(nn_ctx *g, nn_node *n);

struct nn_node {
    nn_backward_fn backward;
    const char *op;
    nn_tensor *out;
    nn_tensor *in[4];
    int n_in;
    int64_t i[8];
    float f[4];
    void *p[4];
    nn_node *prev;
    nn_tensor *ready;         /* parameters whose gradient completes once this node is processed */
    struct nn_rewind *rewind; /* the newest node of a segment whose backward rewinds, or NULL */
};

typedef struct nn_block {
    struct nn_block *next;
    size_t cap, used;
    unsigned char *mem;
} nn_block;

/* A per-op scratch stack: blocks newest first, bytes live now, and the most ever live (the
 * size of the one block a quiet stack keeps). */
typedef struct nn_stack {
    nn_block *top;
    size_t live, peak;
} nn_stack;

struct nn_ctx {
    nn_block *blocks; /* newest first */
    size_t total_cap;
    long long n_grows;
    nn_node *tape; /* newest node */
    int n_nodes;
    uint64_t op_counter; /* ops created this step (dropout key) */
    int grad_enabled, training;
    uint64_t seed, step;
    uint64_t epoch;    /* unique per reset: parameters' first-use marks */
    int backward_done; /* next allocation resets */
    accel_status first_err;
    char first_msg[256];
    /* Autocast: the explicit mode (NN_AUTOCAST_AUTO or a dtype), the dtype AUTO learned from
     * a parameter's sink, and the accel_autocast_begin stack of saved modes. */
    int autocast_mode;
    accel_dtype autocast_auto;
    int autocast_depth;
    int autocast_saved[8];
    /* Flush-denormal scope: the option, and how deep nn entry points are nested (only the
     * outermost one saves, sets and restores the MXCSR). */
    int flush_denormal;
    int fp_depth;
    /* Per-op scratch in host memory, and on a GPU ctx in device memory (dtmp). */
    nn_stack tmp, dtmp;
    /* Device (nn_ctx_set_device): on a GPU, tensor data and gradients come from a second
     * arena of device blocks (dblocks, newest first); `gpu` is the backend's state. */
    accel_device device;
    nn_block *dblocks;
    size_t dtotal_cap;
    void *gpu;
    /* Bytes live in the host / device arena (what a rewind to a mark gives back is no longer
     * live), the device arena's most live this step (the one block a reset keeps on a GPU) and
     * the most of both together (nn_ctx_stats.peak_nbytes). */
    size_t live, dlive, dpeak, peak;
    /* The oldest device block allocations may use while a mark is taken (first fit must not
     * reach below the innermost mark, or a rewind would not free what it placed there). */
    nn_block *dfloor;
};

/* Arena allocation (64-byte aligned); resets the ctx first if backward already ran. NULL and
 * ENOMEM on failure. */
void *accel__nn_alloc(nn_ctx *g, size_t nbytes);
void *accel__nn_zalloc(nn_ctx *g, size_t nbytes);
/* Releases a list of arena blocks (gpu: device memory, through the GPU backend). */
void accel__nn_free_blocks(nn_block *b, int gpu);
/* Back to the CPU: releases the device arena and the GPU backend's state (device.c). */
void accel__nn_drop_gpu(nn_ctx *g);
/* Tensor data and gradient memory: the device arena on a GPU ctx, else accel__nn_alloc /
 * accel__nn_zalloc (zeroing on a GPU is queued on the stream). NULL and ENOMEM on failure. */
void *accel__nn_dalloc(nn_ctx *g, size_t nbytes);
void *accel__nn_dzalloc(nn_ctx *g, size_t nbytes);
/* Per-op scratch, a stack next to the arena: an op (or replay, around each node's backward)
 * takes a mark on entry and releases to it on return, so scratch never outlives the op that
 * took it and the memory is reused by the next op. 64-byte aligned; NULL and ENOMEM (ctx
 * error set) on failure. */
typedef struct nn_tmp_mark {
    nn_block *top;
    size_t used, live;
    nn_block *dtop; /* the device stack's */
    size_t dused, dlive;
} nn_tmp_mark;
nn_tmp_mark accel__nn_tmp_mark(const nn_ctx *g);
void *accel__nn_tmp_alloc(nn_ctx *g, size_t nbytes);
/* Per-op scratch for tensor data: device memory on a GPU ctx (kernels queued in stream order
 * read it before a later op's kernels can reuse it), else accel__nn_tmp_alloc. */
void *accel__nn_dtmp_alloc(nn_ctx *g, size_t nbytes);
void accel__nn_tmp_release(nn_ctx *g, nn_tmp_mark mark);
/* A point in both arenas and the tape to rewind to (activation recomputation, recompute.c):
 * what is allocated after the mark is given back by accel__nn_arena_rewind, so the memory is
 * reused. Marks nest (rewind the newest first); while one is taken the device arena only fills
 * blocks newer than it, so everything after it is above the mark. */
typedef struct nn_arena_mark {
    nn_block *top, *dtop; /* the newest blocks then, and how much of them was used */
    size_t used, dused;
    size_t live, dlive;
    nn_block *dfloor; /* the floor before this mark */
    nn_node *tape;
    int n_nodes;
} nn_arena_mark;
nn_arena_mark accel__nn_arena_mark(nn_ctx *g);
/* Frees everything allocated after m (tensors, nodes: the tape goes back to m's) and drops m. */
void accel__nn_arena_rewind(nn_ctx *g, const nn_arena_mark *m);
/* Drops m and keeps what was allocated after it. */
void accel__nn_arena_keep(nn_ctx *g, const nn_arena_mark *m);
/* 1 when host-arena pointer p (a tensor struct, a node) was allocated after m. */
int accel__nn_arena_after(const nn_ctx *g, const nn_arena_mark *m, const void *p);
/* Marks the tape's nodes from top down to `before` (not included; NULL: the tape's start) as
 * a segment whose backward gives back the arena memory it allocates (recompute.c): its inputs
 * from outside it get their gradients (and 2-byte shadows) set aside first, below the mark.
 * Only where nobody reads the segment's intermediate gradients after backward (a GPT block:
 * the caller never sees its tensors).
 * Segments are marked oldest first and do not nest. 0 and the ctx error on failure. */
int accel__nn_rewind_segment(nn_ctx *g, nn_node *top, nn_node *before);
/* Test hook: segments rewind (1, the default; ACCEL_NN_REWIND) or not (0: accel__nn_rewind_
 * segment marks nothing). Process-wide; not thread-safe. */
void accel__nn_set_rewind(int on);

/* nn's process-wide on/off switches (switches.c): each read once from its environment
 * variable, docs/configuration.md. ACCEL_NN_SHADOW: half shadows (shadow_gpu.c);
 * ACCEL_NN_BGRAD: the bias-gradient epilogue (linear_gpu.c); ACCEL_NN_REWIND: the GPT blocks'
 * backward rewind (recompute.c). accel__nn_switch_set is the test hooks' override:
 * process-wide, not thread-safe. */
typedef enum accel__nn_switch_id {
    ACCEL__NN_SW_SHADOW,
    ACCEL__NN_SW_BGRAD,
    ACCEL__NN_SW_REWIND,
    ACCEL__NN_N_SWITCHES
} accel__nn_switch_id;
int accel__nn_switch(accel__nn_switch_id id);
void accel__nn_switch_set(accel__nn_switch_id id, int on);
/* The replay's segment in progress (recompute.c): rewind_begin at a node that ends a segment
 * (n->rewind); rewind_end before each node (n; NULL after the tape) ends the one in progress
 * when n lies below it (its memory back, its inputs' gradients kept). */
enum { NN_REWIND_SPARE = 8 };
typedef struct nn_rewind_run {
    struct nn_rewind *seg; /* NULL: none in progress */
    nn_arena_mark m;
    struct nn_rewind *last; /* the last one ended */
    /* memory set aside before and dead now, for the next segment's reservations */
    void *spare[NN_REWIND_SPARE];
    size_t spare_nbytes[NN_REWIND_SPARE];
    int n_spare;
} nn_rewind_run;
accel_status accel__nn_rewind_begin(nn_ctx *g, nn_rewind_run *r, nn_node *n);
void accel__nn_rewind_end(nn_ctx *g, nn_rewind_run *r, const nn_node *n);
/* Reverse-mode replay of g's tape (newest node first) with hooks (may be NULL). */
accel_status accel__nn_replay(nn_ctx *g, const nn_backward_hooks *hooks);
/* A new contiguous owner tensor (uninitialised data). */
nn_tensor *accel__nn_new(nn_ctx *g, int ndim, const int64_t *shape);
/* The same with data of 2 bytes an element: an op's private tensor that holds autocast's
 * 2-byte values (the fused MLP's hidden h on a GPU), which only that op's code reads. */
nn_tensor *accel__nn_new_half(nn_ctx *g, int ndim, const int64_t *shape);
/* The same without data (data NULL): a GPU op output whose values only its half shadow holds
 * (accel__nn_norm_operand). */
nn_tensor *accel__nn_new_shell(nn_ctx *g, int ndim, const int64_t *shape);
/* LayerNorm of x, or of x + r (r non-NULL: nn_add_layernorm, *sum the sum), for an output that
 * only products read (nn_linear, nn_linear_gelu_linear, nn_linear_cross_entropy: a GPT block's
 * ln_1 and ln_2, the GPT's ln_f). On the CPU exactly nn_layernorm / nn_add_layernorm; on a GPU
 * under autocast (with shadows on) the output holds only its 2-byte shadow: data is NULL, and
 * every op but those products refuses it; and when one product, recorded right after it, is
 * its only reader, the output's gradient too is kept as that product's 2-byte values (in
 * gradient memory of 2 bytes an element), which LayerNorm's backward reads: nn_tensor_grad of
 * such an output is not fp32 values. */
nn_tensor *accel__nn_norm_operand(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                                  nn_tensor *bias, float eps, nn_tensor **sum);
/* nn_linear of x for an output that only nn_causal_attention(n_head, attn_dropout) reads (a
 * GPT block's c_attn: qkv). On the CPU exactly nn_linear; on a GPU under bf16 autocast (with
 * shadows on), where that attention reads qkv only rounded (its kernels for head size 64),
 * the output holds only its 2-byte shadow: data is NULL, and every op but that attention and
 * the products (which read it rounded anyway) refuses it. */
nn_tensor *accel__nn_linear_qkv(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                                nn_layout layout, int n_head, float attn_dropout);
/* Records an error (thread message + ctx first error) and returns NULL. */
nn_tensor *accel__nn_fail(nn_ctx *g, accel_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Where a sink's parameter `index` lives: the model's device for nn_model_sink, else the CPU
 * (glue.c). nn_params_bind marks each parameter tensor with it. */
accel_device_type accel__nn_sink_device(const nn_param_sink *s, int index);

/* 1 when `small`'s shape equals the trailing dims of `big` (or small has one element): the
 * broadcasts nn_add accepts (ops_elem.c; the GPU path too). */
int accel__nn_is_suffix(const nn_tensor *small, const nn_tensor *big);

/* nn_cross_entropy's arguments (ops_norm.c; the GPU path too): the options copied into *o,
 * checked, and every target checked against logits' class dim; *rows rows, *count of them not
 * ignore_index. ACCEL_EINVAL with g's error set, naming the culprit. */
accel_status accel__nn_ce_args(nn_ctx *g, const nn_tensor *logits, const int32_t *targets,
                               const nn_cross_entropy_options *opts, nn_cross_entropy_options *o,
                               int64_t *rows, int64_t *count);
/* The same checks for `rows` targets over C classes, messages naming `who` (also
 * nn_linear_cross_entropy's). */
accel_status accel__nn_ce_check(nn_ctx *g, const char *who, int64_t rows, int64_t C,
                                const int32_t *targets, const nn_cross_entropy_options *opts,
                                nn_cross_entropy_options *o, int64_t *count);
/* nn_linear_cross_entropy's arguments (ops_lce.c; the GPU path too): x [..., C] and w 2-D in
 * `layout` with C > 0 input features and V > 0 classes, then the cross-entropy checks, and
 * reduction none refused (ACCEL_EUNSUPPORTED) when need_grad. Fills *o, *rows (of x), *C, *V
 * and *count (targets not ignored). 0 after failing g. */
int accel__nn_lce_args(nn_ctx *g, const nn_tensor *x, const nn_tensor *w, nn_layout layout,
                       const int32_t *targets, const nn_cross_entropy_options *opts, int need_grad,
                       nn_cross_entropy_options *o, int64_t *rows, int64_t *C, int64_t *V,
                       int64_t *count);
/* Rows per chunk of nn_linear_cross_entropy: o->chunk_rows, else ACCEL_NN_CE_CHUNK_ROWS, else
 * as many as keep a chunk's fp32 logits within nbytes (a multiple of 128 rows when that is at
 * least 128); at most rows, at least 1. nbytes: NN_LCE_CHUNK_NBYTES on the CPU, twice that on
 * a GPU, where fewer chunks mean fewer passes of the head's dW accumulation (beta 1 per chunk:
 * 13 chunks instead of 26 at GPT-2's B = 32 took 1.9 ms off the H200's 91.7 ms step). */
#define NN_LCE_CHUNK_NBYTES ((int64_t)256 << 20)
int64_t accel__nn_lce_chunk_rows(const nn_cross_entropy_options *o, int64_t rows, int64_t V,
                                 int64_t nbytes);
/* nn_embedding's arguments (ops_norm.c; the GPU path too): weight 2-D, ids and an id shape of
 * 0..NN_MAX_DIMS-1 dims, every id in [0, V). Fills oshape (ndim + 1 dims: the id shape, then
 * C) and *rows. 0 after failing g, naming the culprit. */
int accel__nn_embedding_args(nn_ctx *g, const nn_tensor *weight, const int32_t *ids, int ndim,
                             const int64_t *shape, int64_t *oshape, int64_t *rows);
/* nn_linear's arguments (ops_matmul.c; the GPU path too): weight 2-D and input >= 1-D whose
 * last dim (and the bias's size) match the weight in `layout`. Returns the output (x's shape
 * with the last dim *out; its data 2 bytes an element where half is 1, accel__nn_new_half;
 * none where half is 2, accel__nn_new_shell) with
 * *in, *out and *M = rows of x filled; NULL after failing g. */
nn_tensor *accel__nn_linear_out(nn_ctx *g, const nn_tensor *x, const nn_tensor *w,
                                const nn_tensor *bias, nn_layout layout, int half, int64_t *in,
                                int64_t *out, int64_t *M);
/* nn_causal_attention's arguments (ops_matmul.c; the GPU path too): qkv [B, T, 3C] with C
 * divisible by n_head, dropout in [0, 1). 0 after failing g. */
int accel__nn_attention_args(nn_ctx *g, const nn_tensor *qkv, int n_head, float attn_dropout);
/* 1 when the op must be recorded (grad enabled and some input requires grad). */
int accel__nn_needs_grad(nn_ctx *g, nn_tensor *const *in, int n_in);
/* Appends a tape node producing `out` from inputs; marks out->requires_grad. NULL on OOM. */
nn_node *accel__nn_record(nn_ctx *g, const char *op, nn_tensor *out, nn_tensor *const *in, int n_in,
                          nn_backward_fn bw);
/* The gradient of t (allocating the owner's zeroed gradient on first use), laid out like t;
 * NULL when t does not require grad. Only called during backward, by a caller that will add to
 * it: the owner's grad_shadow (its rounded copy, nn_tensor) is dropped. */
float *accel__nn_grad(nn_ctx *g, nn_tensor *t);
/* The gradient of t for a backward that will overwrite all of it. When t is an owner whose
 * gradient does not exist yet, returns uninitialised arena memory and sets *fresh = 1: the
 * caller must then WRITE every element of t (beta = 0) instead of adding, which saves zeroing
 * and re-reading the intermediate gradients of single-consumer ops. Otherwise as
 * accel__nn_grad with *fresh = 0 (add into it). */
float *accel__nn_grad_w(nn_ctx *g, nn_tensor *t, int *fresh);
/* Borrowed gradients (nn_tensor.grad_borrowed; GPU residual adds): accel__nn_grad_borrow makes
 * t's gradient src itself (a gradient nothing writes any more: the backward's own dY) when t is
 * an owner whose gradient does not exist yet and has no reserved memory; 1 done, 0 not (then
 * write it as usual). accel__nn_grad_take is accel__nn_grad_w for a backward that can start
 * from borrowed values itself: *base = them (*fresh is then 1: write all of t's new gradient as
 * *base + the contribution), else NULL. accel__nn_grad_own gives a borrowed gradient memory of
 * its own (a copy), as accel__nn_grad does before anything adds to it; 0 and the ctx error on
 * failure. */
int accel__nn_grad_borrow(nn_ctx *g, nn_tensor *t, float *src);
float *accel__nn_grad_take(nn_ctx *g, nn_tensor *t, int *fresh, const float **base);
int accel__nn_grad_own(nn_ctx *g, nn_tensor *t);
/* 1 when x (not NULL) may be input k of op on g; else 0 after failing g, naming op, input k
 * and the culprit: g NULL, a parameter not bound (ACCEL_ESTATE), a tensor of another ctx
 * (ACCEL_EINVAL), or one from before a reset or from a step whose backward ran (ACCEL_ESTATE:
 * its memory is, or is about to be, reused). A view is checked twice: its own stamp (its
 * struct is arena memory, even when it views a parameter), then its owner's. Compares only
 * (the stamps new_tensor and new_view write); shared by the CPU ops (accel__nn_contig) and
 * the GPU ops' input checks. Best effort for a stale tensor: its struct is arena memory that
 * later tensors may overwrite. */
int accel__nn_input_ok(nn_ctx *g, const char *op, int k, const nn_tensor *x);
/* accel__nn_input_ok for each of the n tensors ts[k] not NULL, as input k of op: for an op
 * that checks its inputs under its own name before composing other ops (which would name
 * themselves and number the inputs their own way). 1 when all pass, else 0 after failing g. */
int accel__nn_inputs_ok(nn_ctx *g, const char *op, nn_tensor *const *ts, int n);
/* 1 when t (not NULL, not a parameter) is from before its ctx's last reset: its memory may
 * hold other tensors now (the same best-effort stamp check). A view is stale when its own
 * stamp is (a view of a parameter too: its struct is arena memory), or its owner's. Reads of
 * values (nn_item, nn_tensor_to_host) refuse it; after backward the step's tensors stay
 * readable until the reset. */
static inline int nn__stale(const nn_tensor *t)
{
    if (t->base != NULL) {
        const nn_ctx *vg = (const nn_ctx *)t->use_ctx;
        if (vg != NULL && t->use_epoch != vg->epoch) {
            return 1;
        }
    }
    const nn_tensor *o = t->base ? t->base : t;
    const nn_ctx *g = (const nn_ctx *)o->use_ctx;
    return o->param_index < 0 && g != NULL && o->use_epoch != g->epoch;
}
/* Input k of op: made present and checked (accel__nn_input_ok); x if contiguous, else a
 * recorded copy. NULL for NULL (the error is the op's that made it) or after failing g. */
nn_tensor *accel__nn_contig(nn_ctx *g, nn_tensor *x, const char *op, int k);
/* Canonical dim in [0, ndim) or -1. */
int accel__nn_dim(const nn_tensor *x, int dim);
/* Formats a shape as "[2, 3]" into buf. */
const char *accel__nn_shape_str(const nn_tensor *t, char *buf, size_t nbytes);
int accel__nn_same_shape(const nn_tensor *a, const nn_tensor *b);

/* ---- flush-to-zero scope (fpenv.c) ---- */

/* Entered at each nn entry point that runs floating-point kernels (ops, nn_backward) and left
 * before it returns; g may be NULL (then nothing happens). Nested scopes are counted on the
 * ctx; the outermost saves the caller's MXCSR (and each OpenMP worker's), sets FTZ and DAZ
 * when the ctx's flush_denormal option is on, and restores them on leave. */
typedef struct nn_fpscope {
    unsigned saved;
    int counted, active;
} nn_fpscope;
/* Makes parameter x (or the parameter x views) present through its sink's materialize, when
 * it has one (ZeRO stage 3); ACCEL_OK otherwise. */
accel_status accel__nn_param_use(const nn_tensor *x);
void accel__nn_fp_enter(nn_ctx *g, nn_fpscope *s);
void accel__nn_fp_leave(nn_ctx *g, nn_fpscope *s);
/* The calling thread's MXCSR back to the caller's / to the scope's, around user callbacks. */
void accel__nn_fp_pause(const nn_fpscope *s);
void accel__nn_fp_resume(const nn_fpscope *s);

/* Hot loops are compiled for AVX-512, AVX2 and the baseline ISA, picked once at load time
 * (ifunc), because the build targets baseline x86-64 and must run on any of it. A kernel
 * holds no OpenMP region (the outlined region would not be cloned); callers split the work. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define NN_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NN_KERNEL
#endif

/* Cross entropy's row statistic (ops_norm.c): the log-sum-exp of x[0..C) (returned) and the
 * plain sum *sx (label smoothing). */
float accel__nn_ce_row_stats(const float *x, int64_t C, float *sx);
/* Row-major C = alpha op(A) op(B) + beta C through cblas_sgemm (ops_matmul.c). */
void accel__nn_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Largest of x[0..n) (-inf when n == 0), vectorised (ops_norm.c). */
float accel__nn_row_max(const float *x, int64_t n);

/* ---- activations (ops_elem.c), shared with the fused linear + activation ---- */

enum { U_SCALE, U_RELU, U_GELU, U_GELU_TANH, U_TANH, U_SIGMOID };
/* y = act(x) (s: the factor of U_SCALE), OpenMP over chunks for large n. */
void accel__nn_act_forward(int op, float s, const float *x, float *y, int64_t n);
/* gx (+)= act'(x) * gy: written when `write`, else added. y = act(x) (read by tanh and sigmoid
 * only; may be NULL for the others). */
void accel__nn_act_backward(int op, float s, int write, const float *x, const float *y,
                            const float *gy, float *gx, int64_t n);

/* ---- autocast (autocast.c) ---- */

/* The dtype autocast ops run in now (ACCEL_F32 when off). */
static inline accel_dtype nn__autocast(const nn_ctx *g)
{
    return g->autocast_mode == NN_AUTOCAST_AUTO ? g->autocast_auto : (accel_dtype)g->autocast_mode;
}
/* AUTO learns the dtype from a parameter whose sink has a mixed-precision working copy. */
void accel__nn_autocast_note(nn_ctx *g, const nn_tensor *t);
/* dst[i] = round_dt(src[i]) (dst may equal src); dst[i] += round_dt(src[i]). dt is ACCEL_BF16
 * or ACCEL_F16. Vectorised through the library's converters, OpenMP for large n. */
void accel__nn_round(accel_dtype dt, float *dst, const float *src, int64_t n);
void accel__nn_add_rounded(accel_dtype dt, float *dst, const float *src, int64_t n);
/* The values of contiguous t rounded to dt. A parameter with a valid working copy of that
 * dtype is widened from it into per-op scratch (*per_op = 1: gone when the op returns, so
 * backward must cast again); anything else is rounded into an arena copy that lives for the
 * step (*per_op = 0). per_op may be NULL. NULL on OOM (ctx error set). */
const float *accel__nn_cast(nn_ctx *g, const nn_tensor *t, accel_dtype dt, int *per_op);
/* An uninitialised / zeroed scratch of n floats, in the arena (lives for the step) or in
 * per-op scratch (gone when the op or the node's backward returns). NULL + ctx error on OOM. */
float *accel__nn_scratch(nn_ctx *g, int64_t n, int zero);
float *accel__nn_tmp_scratch(nn_ctx *g, int64_t n, int zero);

/* ---- counter-based RNG (splitmix64 finaliser): stateless, thread-count independent ---- */
static inline uint64_t nn__mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t nn__key3(uint64_t a, uint64_t b, uint64_t c)
{
    return nn__mix64(a ^ nn__mix64(b ^ nn__mix64(c)));
}
/* Uniform in [0, 1) with 24 bits. */
static inline float nn__uniform(uint64_t key, uint64_t i)
{
    return (float)(nn__mix64(key + i * 0xD1B54A32D192ED03ull) >> 40) * (1.0f / 16777216.0f);
}

/* ---- vectorisable math: branch-free so loops with NN_SIMD vectorise ---- */

/* exp(x) for fp32, relative error ~2 ulp on [-87, 88]; clamps outside (+-inf included); NaN
 * gives NaN. */
static inline float nn__expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* Round to nearest by the 1.5 * 2^23 trick: no floorf call, so loops vectorise. */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } u;
    /* NaN (NaN weights, a diverged run) passes the clamps and makes p NaN, the right result,
     * but must not reach the float-to-int conversion: that is undefined behaviour. A select,
     * so the loop still vectorises. */
    n = n == n ? n : 0.0f;
    u.i = ((int32_t)n + 127) << 23;
    return p * u.f;
}

/* erf(x) (Abramowitz-Stegun 7.1.26 form refined: max abs error ~1.5e-7). */
static inline float nn__erff(float x)
{
    float ax = fabsf(x);
    float t = 1.0f / (1.0f + 0.3275911f * ax);
    float y =
        t * (0.254829592f +
             t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    float e = 1.0f - y * nn__expf(-ax * ax);
    return x < 0.0f ? -e : e;
}

/* GELU's derivative Phi(x) + x phi(x) (exact erf form). erf(x / sqrt 2) already computes
 * exp(-x^2 / 2), which is phi(x) up to a constant, so one exp serves both terms. */
static inline float nn__gelu_grad(float x)
{
    float z = x * 0.70710678118654752f, az = fabsf(z);
    float e = nn__expf(-z * z);
    float t = 1.0f / (1.0f + 0.3275911f * az);
    float y =
        t * (0.254829592f +
             t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    float erf_abs = 1.0f - y * e;
    float cdf = 0.5f * (1.0f + (z < 0.0f ? -erf_abs : erf_abs));
    return cdf + x * 0.3989422804014327f * e;
}

static inline float nn__tanhf(float x)
{
    float ax = fabsf(x);
    float e = nn__expf(-2.0f * ax);
    float t = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -t : t;
}

static inline float nn__sigmoidf(float x)
{
    return 1.0f / (1.0f + nn__expf(-x));
}

#endif /* ACCEL_NN_INTERNAL_H */
