/*
 * accel/cuda.h's model functions (built with ACCEL_CUDA only): device pointers to a model's
 * whole flat master and gradient buffers, for kernels that work on the flat layout. Invariant:
 * a pointer is returned only for an allocated model whose buffers are GPU memory.
 */
#include "accel/cuda.h"
#include "train/train_internal.h"

static float *device_buffer(accel_model *m, float *buf, const char *who)
{
    if (m == NULL) {
        accel__seterr(NULL, ACCEL_EINVAL, "%s: model is NULL", who);
        return NULL;
    }
    if (!m->allocated) {
        accel__seterr(m->acc, ACCEL_ESTATE, "%s: the model is not allocated (accel_model_alloc)",
                      who);
        return NULL;
    }
    if (accel__device_which(m->dev).type != ACCEL_DEVICE_CUDA) {
        accel__seterr(m->acc, ACCEL_ESTATE,
                      "%s: the model is in %s memory, not a GPU's (use "
                      "accel_model_master / accel_model_grad)",
                      who, accel__device_name(m->dev));
        return NULL;
    }
    return buf;
}

float *accel_cuda_model_master(accel_model *m)
{
    return device_buffer(m, m ? m->master : NULL, "accel_cuda_model_master");
}

float *accel_cuda_model_grad(accel_model *m)
{
    return device_buffer(m, m ? m->grad : NULL, "accel_cuda_model_grad");
}
