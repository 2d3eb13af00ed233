/*
 * The nn toolkit's CUDA backend (the table of nn_gpu.h): opening a GPU for a ctx (its
 * cuBLASLt handle and workspace), device memory for the ctx's device arena, copies, and the
 * checks shared by the GPU ops.
 *
 * Everything is queued on the legacy default stream: it is ordered with accel's compute
 * stream (a blocking stream) and with the synchronous copies used here, so no call needs an
 * explicit synchronisation.
 */
#include <stdio.h>

#include "gpu_internal.h"

/* cuBLASLt's workspace: what its heuristics ask for on Hopper is at most a few MiB. */
#define WORKSPACE_NBYTES ((size_t)32 << 20)

static accel_status cuda_err(cudaError_t e, const char *what)
{
    accel_status st = e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO;
    return accel__seterr(NULL, st, "nn (CUDA): %s failed: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

static void cu_close(nn_ctx *g)
{
    nn_gpu_state *s = g->gpu;
    if (s == NULL) {
        return;
    }
    cudaSetDevice(s->ordinal);
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

static accel_status cu_zero(void *p, size_t nbytes)
{
    cudaError_t e = cudaMemsetAsync(p, 0, nbytes, 0);
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "cudaMemsetAsync");
}

static accel_status cu_to_device(void *dst, const void *src, size_t nbytes)
{
    cudaError_t e = cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "cudaMemcpy (to the GPU)");
}

static accel_status cu_to_host(void *dst, const void *src, size_t nbytes)
{
    cudaError_t e = cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "cudaMemcpy (to the host)");
}

static accel_status cu_copy(void *dst, const void *src, size_t nbytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, 0);
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "cudaMemcpyAsync (on the GPU)");
}

static accel_status cu_add_host(nn_ctx *g, float *d, const float *h, int64_t n)
{
    float *tmp = accel__nn_dalloc(g, (size_t)n * sizeof(float));
    if (tmp == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nn_backward: out of GPU memory");
    }
    accel_status st = cu_to_device(tmp, h, (size_t)n * sizeof(float));
    if (st != ACCEL_OK) {
        return st;
    }
    cudaError_t e = nn_cu_acc(d, tmp, n, 0, 0);
    return e == cudaSuccess ? ACCEL_OK : cuda_err(e, "nn_backward: seeding the gradient");
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

int accel__nn_cu_inputs(nn_ctx *g, const char *op, nn_tensor *const *ts, int n)
{
    if (g == NULL) {
        accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", op);
        return 0;
    }
    if (g->device.type != ACCEL_DEVICE_CUDA) {
        int k = 0;
        while (k < n && !nn__on_gpu(ts[k])) {
            k++;
        }
        const nn_tensor *t = k < n ? ts[k] : NULL;
        if (t != NULL && t->param_index >= 0) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: parameter %d is on the GPU (the model's device) but the ctx "
                           "computes on the CPU: nn_ctx_set_device(g, accel_device_of(acc)), or "
                           "keep the model on the CPU (accel_model_set_device before "
                           "nn_params_for_model)",
                           op, t->param_index);
        } else {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: input %d is on the GPU but the ctx computes on the CPU "
                           "(nn_ctx_set_device)",
                           op, k);
        }
        return 0;
    }
    for (int k = 0; k < n; k++) {
        nn_tensor *t = ts[k];
        if (t == NULL) {
            continue;
        }
        if (!nn__on_gpu(t)) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: input %d is in host memory and the ctx on cuda:%d%s", op, k,
                           g->device.index,
                           t->param_index >= 0 ? " (a parameter of a model kept on the CPU: "
                                                 "compute it with a CPU ctx)"
                                               : "");
            return 0;
        }
        if (!nn_is_contiguous(t)) {
            accel__nn_fail(g, ACCEL_EUNSUPPORTED,
                           "%s: input %d is a strided view: not supported on CUDA yet", op, k);
            return 0;
        }
        /* As the CPU ops' accel__nn_contig: a parameter is made present (a no-op but under
         * ZeRO-3, which refuses GPU models) and teaches NN_AUTOCAST_AUTO the model's dtype. */
        if (t->sink_materialize != NULL && accel__nn_param_use(t) != ACCEL_OK) {
            accel__nn_fail(g, accel_last_status(NULL), "%s: parameter %d: %s", op, t->param_index,
                           accel_last_error(NULL));
            return 0;
        }
        if (t->sink_compute != NULL) {
            accel__nn_autocast_note(g, t);
        }
    }
    return 1;
}

int32_t *accel__nn_cu_ints(nn_ctx *g, const int32_t *h, int64_t n, const char *op)
{
    int32_t *d = accel__nn_dalloc(g, (size_t)n * sizeof(int32_t));
    if (d == NULL) {
        return NULL;
    }
    cudaError_t e = cudaMemcpy(d, h, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice);
    return accel__nn_cu_ok(g, e, op) ? d : NULL;
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
    .linear = accel__nn_cu_linear,
    .cross_entropy = accel__nn_cu_cross_entropy,
    .attention = accel__nn_cu_attention,
};
