/*
 * Where a ctx computes (nn_ctx_set_device) and the copies of tensors to the host: the CPU, or
 * a GPU through the backend table of nn_gpu.h (src/nn/cuda/ in CUDA builds; none otherwise).
 * Switching devices releases the device arena, so it is refused while the ctx holds tensors.
 */
#include "nn_gpu.h"

#ifdef ACCEL_HAVE_CUDA
extern const nn_gpu_ops accel__nn_cuda_ops;
const nn_gpu_ops *const accel__nn_gpu = &accel__nn_cuda_ops;
#else
const nn_gpu_ops *const accel__nn_gpu = NULL;
#endif

void accel__nn_drop_gpu(nn_ctx *g)
{
    if (g->device.type == ACCEL_DEVICE_CUDA) {
        accel__nn_free_blocks(g->dblocks, 1);
        g->dblocks = NULL;
        g->dtotal_cap = 0;
        accel__nn_free_blocks(g->dtmp.top, 1);
        g->dtmp = (nn_stack){NULL, 0, 0};
        accel__nn_gpu->close(g);
    }
    g->device = (accel_device){ACCEL_DEVICE_CPU, 0};
}

accel_status nn_ctx_set_device(nn_ctx *g, accel_device device)
{
    if (g == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_ctx_set_device: ctx is NULL");
    }
    int busy = g->n_nodes > 0;
    for (const nn_block *b = g->blocks; b != NULL && !busy; b = b->next) {
        busy = b->used > 0;
    }
    /* (After backward the next allocation resets the ctx, so nothing stays live.) */
    if (busy && !g->backward_done) {
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "nn_ctx_set_device: the ctx holds tensors; reset it first");
    }
    if (device.type == ACCEL_DEVICE_CPU) {
        accel__nn_drop_gpu(g);
        return ACCEL_OK;
    }
    if (device.type != ACCEL_DEVICE_CUDA) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_ctx_set_device: unknown device type %d",
                             (int)device.type);
    }
    if (accel__nn_gpu == NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "nn_ctx_set_device: cuda:%d: this build has no CUDA "
                             "(configure with -DACCEL_CUDA=ON)",
                             device.index);
    }
    if (g->device.type == ACCEL_DEVICE_CUDA && g->device.index == device.index) {
        return ACCEL_OK;
    }
    accel__nn_drop_gpu(g);
    accel_status st = accel__nn_gpu->open(g, device.index);
    if (st != ACCEL_OK) {
        return st;
    }
    g->device = device;
    return ACCEL_OK;
}

accel_device nn_ctx_device(const nn_ctx *g)
{
    return g != NULL ? g->device : (accel_device){ACCEL_DEVICE_CPU, 0};
}

int accel__nn_gpu_refuse(nn_ctx *g, const char *op, nn_tensor *const *ts, int n)
{
    if (g != NULL && g->device.type == ACCEL_DEVICE_CUDA) {
        accel__nn_fail(g, ACCEL_EUNSUPPORTED,
                       "%s: not implemented on CUDA yet (the ctx computes on cuda:%d)", op,
                       g->device.index);
        return 1;
    }
    for (int k = 0; k < n; k++) {
        if (nn__on_gpu(ts[k])) {
            accel__nn_fail(g, ACCEL_EUNSUPPORTED,
                           "%s: not implemented on CUDA yet (input %d is on the GPU)", op, k);
            return 1;
        }
    }
    return 0;
}

static accel_status copy_out(const nn_tensor *t, const float *src, float *dst, const char *fn)
{
    if (t == NULL || dst == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: %s is NULL", fn, t ? "dst" : "tensor");
    }
    if (!nn_is_contiguous(t)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: the tensor is not contiguous", fn);
    }
    if (nn__stale(t)) {
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "%s: the tensor is from before nn_ctx_reset (stale: its memory is "
                             "reused)",
                             fn);
    }
    if (src == NULL) {
        return accel__seterr(NULL, ACCEL_ESTATE, "%s: the tensor has no gradient", fn);
    }
    size_t nbytes = (size_t)nn_numel(t) * sizeof(float);
    if (nn__on_gpu(t)) {
        return accel__nn_gpu->to_host(NULL, dst, src, nbytes);
    }
    memcpy(dst, src, nbytes);
    return ACCEL_OK;
}

accel_status nn_tensor_to_host(const nn_tensor *t, float *dst)
{
    if (t != NULL && t->data == NULL && nn_numel(t) > 0) { /* accel__nn_norm_operand's */
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "nn_tensor_to_host: the tensor holds only the 2-byte copy its "
                             "products read (a GPT block's LayerNorm output under autocast)");
    }
    return copy_out(t, t ? t->data : NULL, dst, "nn_tensor_to_host");
}

accel_status nn_tensor_grad_to_host(const nn_tensor *t, float *dst)
{
    return copy_out(t, nn_tensor_grad(t), dst, "nn_tensor_grad_to_host");
}
