/*
 * The nn toolkit's CUDA backend (the table of nn_gpu.h): opening a GPU for a ctx (its
 * cuBLASLt handle and workspace, its pinned staging), device memory for the ctx's device
 * arena, copies, and the checks shared by the GPU ops.
 *
 * Everything is queued on the GPU's compute stream (accel_cuda_device_stream: the stream
 * accel_cuda_stream gives, where accel's own kernels and the reducer's events go), so ops,
 * accel's optimizer and the gradient buckets are ordered without synchronising. The host waits
 * only where it reads a result (to_host synchronises the stream after its copy) and where
 * pinned staging memory is about to be overwritten (its bank's event).
 */
#include <stdio.h>
#include <string.h>

#include "accel/cuda.h"
#include "gpu_internal.h"

/* cuBLASLt's workspace: what its heuristics ask for on Hopper is at most a few MiB. */
#define WORKSPACE_NBYTES ((size_t)32 << 20)

/* A failed copy or memset of nbytes. */
static accel_status cuda_err_n(cudaError_t e, const char *what, size_t nbytes)
{
    accel_status st = e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO;
    cudaGetLastError(); /* reported here: not the next launch's error */
    return accel__seterr(NULL, st, "nn (CUDA): %s of %zu bytes failed: %s (%s)", what, nbytes,
                         cudaGetErrorString(e), cudaGetErrorName(e));
}

static accel_status cuda_err(cudaError_t e, const char *what)
{
    accel_status st = e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO;
    return accel__seterr(NULL, st, "nn (CUDA): %s failed: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

static void bank_free(nn_stage_bank *b)
{
    if (b->done != NULL) {
        cudaEventSynchronize(b->done); /* no copy may still read the pinned memory */
        cudaEventDestroy(b->done);
    }
    if (b->host != NULL) {
        cudaFreeHost(b->host);
    }
    memset(b, 0, sizeof(*b));
}

static void cu_close(nn_ctx *g)
{
    nn_gpu_state *s = g->gpu;
    if (s == NULL) {
        return;
    }
    cudaSetDevice(s->ordinal);
    bank_free(&s->bank[0]);
    bank_free(&s->bank[1]);
    if (s->lt != NULL) {
        cublasLtDestroy(s->lt);
    }
    if (s->workspace != NULL) {
        cudaFree(s->workspace);
    }
    accel__free(s);
    g->gpu = NULL;
}

static accel_status cu_open(nn_ctx *g, int ordinal)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError(); /* clear the sticky error of a machine without a GPU */
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "nn_ctx_set_device: cuda:%d: no usable GPU (%s)", ordinal,
                             e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    }
    if (ordinal < 0 || ordinal >= n) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_ctx_set_device: cuda:%d: %d GPU(s) visible",
                             ordinal, n);
    }
    nn_gpu_state *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nn_ctx_set_device: out of memory");
    }
    s->ordinal = ordinal;
    g->gpu = s;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess) {
        cu_close(g);
        return cuda_err(e, "cudaSetDevice");
    }
    s->stream = accel_cuda_device_stream(ordinal);
    if (s->stream == NULL) {
        accel_status st = accel_last_status(NULL);
        accel__seterr(NULL, st, "nn_ctx_set_device: cuda:%d: no compute stream: %s", ordinal,
                      accel_last_error(NULL));
        cu_close(g);
        return st;
    }
    for (int k = 0; k < 2; k++) {
        if ((e = cudaEventCreateWithFlags(&s->bank[k].done, cudaEventDisableTiming)) !=
            cudaSuccess) {
            s->bank[k].done = NULL;
            cu_close(g);
            return cuda_err(e, "cudaEventCreateWithFlags (staging)");
        }
    }
    cublasStatus_t bs = cublasLtCreate(&s->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        s->lt = NULL;
        cu_close(g);
        return accel__seterr(NULL, ACCEL_EIO, "nn (CUDA): cublasLtCreate failed: %s",
                             cublasGetStatusString(bs));
    }
    if ((e = cudaMalloc(&s->workspace, WORKSPACE_NBYTES)) != cudaSuccess) {
        s->workspace = NULL;
        cu_close(g);
        return cuda_err(e, "cudaMalloc (cuBLASLt workspace)");
    }
    s->workspace_nbytes = WORKSPACE_NBYTES;
    return ACCEL_OK;
}

static void *cu_alloc(size_t nbytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not the next kernel launch's error */
        cuda_err(e, "cudaMalloc");
        return NULL;
    }
    return p;
}

static void cu_free(void *p)
{
    cudaFree(p);
}

/* The stream for a copy or memset touching device pointer p: g's, or without a ctx the
 * compute stream of the GPU that holds p. */
static accel_status stream_for(nn_ctx *g, const void *p, cudaStream_t *out, const char *what)
{
    if (g != NULL && g->gpu != NULL) {
        *out = nn__cu_stream(g);
        return ACCEL_OK;
    }
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_err(e, what);
    }
    if (a.type != cudaMemoryTypeDevice) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn (CUDA): %s: %p is not GPU memory", what, p);
    }
    *out = accel_cuda_device_stream(a.device);
    return *out != NULL ? ACCEL_OK : accel_last_status(NULL);
}

static accel_status cu_zero(nn_ctx *g, void *p, size_t nbytes)
{
    cudaStream_t st;
    ACCEL_TRY(stream_for(g, p, &st, "cudaPointerGetAttributes (zeroing)"));
    cudaError_t e = cudaMemsetAsync(p, 0, nbytes, st);
    return e == cudaSuccess ? ACCEL_OK : cuda_err_n(e, "cudaMemsetAsync", nbytes);
}

/* A copy between the host and a GPU, queued on the compute stream of the GPU side
 * after the ops before it, then waited for. */
static accel_status copy_waited(nn_ctx *g, void *dst, const void *src, size_t nbytes,
                                enum cudaMemcpyKind kind)
{
    const int to_host = kind == cudaMemcpyDeviceToHost;
    cudaStream_t st;
    ACCEL_TRY(stream_for(g, to_host ? src : dst, &st,
                         to_host ? "cudaPointerGetAttributes (copy to the host)"
                                 : "cudaPointerGetAttributes (copy to the GPU)"));
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, kind, st);
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(st);
    }
    return e == cudaSuccess
               ? ACCEL_OK
               : cuda_err_n(e,
                            to_host ? "cudaMemcpyAsync to the host" : "cudaMemcpyAsync to the GPU",
                            nbytes);
}

/* The host reads dst next. */
static accel_status cu_to_host(nn_ctx *g, void *dst, const void *src, size_t nbytes)
{
    return copy_waited(g, dst, src, nbytes, cudaMemcpyDeviceToHost);
}

/* Waits until no copy reads bank b's pinned memory. */
static accel_status bank_wait(nn_stage_bank *b)
{
    if (b->pending) {
        cudaError_t e = cudaEventSynchronize(b->done);
        if (e != cudaSuccess) {
            return cuda_err(e, "cudaEventSynchronize (staging)");
        }
        b->pending = 0;
    }
    return ACCEL_OK;
}

/* Replaces b's pinned memory by `cap` bytes (b has no copy in flight). */
static accel_status bank_grow(nn_stage_bank *b, size_t cap)
{
    if (b->host != NULL) {
        cudaFreeHost(b->host);
        b->host = NULL;
        b->cap = 0;
    }
    void *h = NULL;
    cudaError_t e = cudaHostAlloc(&h, cap, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return accel__seterr(NULL, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                             "nn (CUDA): cudaHostAlloc of %zu pinned staging bytes failed: %s", cap,
                             cudaGetErrorString(e));
    }
    b->host = h;
    b->cap = cap;
    return ACCEL_OK;
}

/* Pinned room for nbytes of this step's staging. A new step (ctx epoch) takes the other bank,
 * so the host fills it while the previous step's copies from this one may still run; a bank
 * is waited for only when it is taken again (two steps later) or when one step outgrows it. */
static unsigned char *stage_room(nn_ctx *g, nn_gpu_state *s, size_t nbytes, accel_status *st)
{
    nn_stage_bank *b = &s->bank[s->cur];
    if (s->stage_epoch != g->epoch) {
        s->stage_want = b->used > s->stage_want ? b->used : s->stage_want;
        s->cur ^= 1;
        s->stage_epoch = g->epoch;
        b = &s->bank[s->cur];
        if ((*st = bank_wait(b)) != ACCEL_OK) {
            return NULL;
        }
        b->used = 0;
        if (b->cap < s->stage_want && (*st = bank_grow(b, s->stage_want)) != ACCEL_OK) {
            return NULL;
        }
    }
    size_t need = (nbytes + 63) & ~(size_t)63;
    if (b->used + need > b->cap) {
        /* This step outgrew the bank: once its copies are done, all of it is free again. */
        if ((*st = bank_wait(b)) != ACCEL_OK) {
            return NULL;
        }
        size_t want = b->used + need;
        s->stage_want = want > s->stage_want ? want : s->stage_want;
        b->used = 0;
        if (need > b->cap) {
            size_t cap = need < ((size_t)64 << 10) ? ((size_t)64 << 10) : need;
            if ((*st = bank_grow(b, cap)) != ACCEL_OK) {
                return NULL;
            }
        }
    }
    unsigned char *h = b->host + b->used;
    b->used += need;
    return h;
}

/* Queues the copy of nbytes of host memory h to device memory d on g's stream, from pinned
 * staging (h is free again on return); 0 and the ctx error (naming op) on failure. */
static int stage_to(nn_ctx *g, void *d, const void *h, size_t nbytes, const char *op)
{
    nn_gpu_state *s = g->gpu;
    accel_status st = ACCEL_OK;
    unsigned char *pin = stage_room(g, s, nbytes, &st);
    if (pin == NULL) {
        accel__nn_fail(g, st, "%s: staging %zu bytes for the GPU: %s", op, nbytes,
                       accel_last_error(NULL));
        return 0;
    }
    memcpy(pin, h, nbytes);
    nn_stage_bank *b = &s->bank[s->cur];
    cudaError_t e = cudaMemcpyAsync(d, pin, nbytes, cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess) {
        e = cudaEventRecord(b->done, s->stream);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        accel__nn_fail(g, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                       "%s: copying %zu staged bytes to cuda:%d: %s (%s)", op, nbytes, s->ordinal,
                       cudaGetErrorString(e), cudaGetErrorName(e));
        return 0;
    }
    b->pending = 1;
    return 1;
}

void *accel__nn_cu_stage(nn_ctx *g, const void *h, size_t nbytes, const char *op)
{
    /* The arena first: its allocation may reset the ctx (a new step, a new epoch). */
    void *d = accel__nn_dalloc(g, nbytes);
    if (d == NULL || nbytes == 0) {
        return d;
    }
    return stage_to(g, d, h, nbytes, op) ? d : NULL;
}

/* Copies of user memory: through a ctx's staging (nn_tensor_from: queued, src free on return,
 * the host does not wait for the GPU), or without one (nn_params_init) a copy waited for. */
static accel_status cu_to_device(nn_ctx *g, void *dst, const void *src, size_t nbytes)
{
    if (g != NULL && g->gpu != NULL) {
        /* On failure the thread's error is the staging's (accel__nn_fail sets both). */
        return nbytes == 0 || stage_to(g, dst, src, nbytes, "copy to the GPU")
                   ? ACCEL_OK
                   : accel_last_status(NULL);
    }
    return copy_waited(g, dst, src, nbytes, cudaMemcpyHostToDevice);
}

static accel_status cu_copy(nn_ctx *g, void *dst, const void *src, size_t nbytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, nn__cu_stream(g));
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "cudaMemcpyAsync (on the GPU)");
}

static accel_status cu_add_host(nn_ctx *g, float *d, const float *h, int64_t n)
{
    float *tmp = accel__nn_cu_stage(g, h, (size_t)n * sizeof(float), "nn_backward (seed)");
    if (tmp == NULL) {
        return accel_last_status(NULL); /* the thread's error is the staging's */
    }
    cudaError_t e = nn_cu_acc(nn__cu_stream(g), d, tmp, n, 0, 0);
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "nn_backward: seeding the gradient");
}

int accel__nn_cu_sum_parts(nn_ctx *g, int64_t rows, int64_t cols, int n, float **part)
{
    int64_t count = nn_cu_col_sum_part_count(rows, cols) * n;
    *part = count > 0 ? accel__nn_dtmp_alloc(g, (size_t)count * sizeof(float)) : NULL;
    return count == 0 || *part != NULL;
}

int accel__nn_cu_ok(nn_ctx *g, cudaError_t e, const char *op)
{
    if (e == cudaSuccess) {
        return 1;
    }
    accel__nn_fail(g, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                   "%s: CUDA: %s (%s)", op, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

/* shell_ok: input 0 may be a shell (accel__nn_norm_operand's or accel__nn_linear_qkv's
 * output: no fp32 values). NULL entries are optional inputs left out. Compares only, on host
 * structs: no launch, no synchronisation. */
static int check_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n, int shell_ok)
{
    if (g == NULL) {
        accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", op);
        return 0;
    }
    for (int k = 0; k < n; k++) {
        nn_tensor *t = ts[k];
        if (t == NULL) {
            continue;
        }
        /* As the CPU ops' accel__nn_contig: a parameter is made present (a no-op but under
         * ZeRO-3, which refuses GPU models) and teaches NN_AUTOCAST_AUTO the model's dtype;
         * then the checks the CPU ops make (a parameter not bound, a tensor of another ctx or
         * of an earlier step), before any that reads where t's memory is. */
        if (t->sink_materialize != NULL && accel__nn_param_use(t) != ACCEL_OK) {
            accel__nn_fail(g, accel_last_status(NULL), "%s: parameter %d: %s", op,
                           (t->base ? t->base : t)->param_index, accel_last_error(NULL));
            return 0;
        }
        if (!accel__nn_input_ok(g, op, k, t)) {
            return 0;
        }
        if (g->device.type != ACCEL_DEVICE_CUDA && nn__on_gpu(t)) {
            if (t->param_index >= 0 || (t->base != NULL && t->base->param_index >= 0)) {
                accel__nn_fail(g, ACCEL_EINVAL,
                               "%s: parameter %d is on the GPU (the model's device) but the ctx "
                               "computes on the CPU: nn_ctx_set_device(g, accel_device_of(acc)), "
                               "or keep the model on the CPU (accel_model_set_device before "
                               "nn_params_for_model)",
                               op, (t->base ? t->base : t)->param_index);
            } else {
                accel__nn_fail(g, ACCEL_EINVAL,
                               "%s: input %d is on the GPU but the ctx computes on the CPU "
                               "(nn_ctx_set_device)",
                               op, k);
            }
            return 0;
        }
        if (g->device.type != ACCEL_DEVICE_CUDA) {
            continue; /* a CPU input of a CPU ctx: a GPU input further on is the culprit */
        }
        if (!nn__on_gpu(t)) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: input %d is in host memory and the ctx on cuda:%d%s", op, k,
                           g->device.index,
                           t->param_index >= 0 || (t->base != NULL && t->base->param_index >= 0)
                               ? " (a parameter of a model kept on the CPU: compute it with a "
                                 "CPU ctx)"
                               : "");
            return 0;
        }
        if (!nn_is_contiguous(t)) {
            accel__nn_fail(g, ACCEL_EUNSUPPORTED,
                           "%s: input %d is a strided view: not supported on CUDA yet", op, k);
            return 0;
        }
        const nn_tensor *owner = t->base != NULL ? t->base : t;
        if (owner->data == NULL && nn_numel(owner) > 0 && !(shell_ok && k == 0)) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: input %d holds only the 2-byte copy that products read (a GPT "
                           "block's LayerNorm output or qkv under autocast): use nn_layernorm "
                           "or nn_linear",
                           op, k);
            return 0;
        }
        if (t->sink_compute != NULL) {
            accel__nn_autocast_note(g, t);
        }
    }
    /* Only a CPU ctx with no input on a GPU gets here, and nn__use_gpu sends an op to its GPU
     * path only for a CUDA ctx or an input on a GPU: every GPU op passes the inputs that chose
     * its path, so this is an internal invariant, not a user's error. */
    ACCEL_ASSERT(g->device.type == ACCEL_DEVICE_CUDA);
    return 1;
}

int accel__nn_cu_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n)
{
    return check_inputs(g, op, ts, n, 0);
}

int accel__nn_cu_product_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n)
{
    return check_inputs(g, op, ts, n, 1);
}

int32_t *accel__nn_cu_ints(nn_ctx *g, const int32_t *h, int64_t n, const char *op)
{
    return accel__nn_cu_stage(g, h, (size_t)n * sizeof(int32_t), op);
}

int accel__nn_cu_rnd(accel_dtype dt)
{
    return dt == ACCEL_BF16 ? 1 : dt == ACCEL_F16 ? 2 : 0;
}

const nn_gpu_ops accel__nn_cuda_ops = {
    .open = cu_open,
    .close = cu_close,
    .alloc = cu_alloc,
    .free = cu_free,
    .zero = cu_zero,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .copy = cu_copy,
    .add_host = cu_add_host,
    .add = accel__nn_cu_add,
    .gelu = accel__nn_cu_gelu,
    .dropout = accel__nn_cu_dropout,
    .embedding = accel__nn_cu_embedding,
    .layernorm = accel__nn_cu_layernorm,
    .add_layernorm = accel__nn_cu_add_layernorm,
    .linear = accel__nn_cu_linear,
    .linear_qkv = accel__nn_cu_linear_qkv,
    .linear_gelu_linear = accel__nn_cu_linear_gelu_linear,
    .cross_entropy = accel__nn_cu_cross_entropy,
    .attention = accel__nn_cu_attention,
    .linear_cross_entropy = accel__nn_cu_linear_cross_entropy,
};
