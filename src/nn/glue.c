/*
 * The one bridge between nn and the training module: a parameter sink over an accel_model
 * (nn parameters become views into the model's flat master and gradient buffers) and
 * accel_backward (seed from accel_backward_begin, tape replay reporting each parameter to
 * accel_grad_ready as soon as its gradient is final, accel_backward_end).
 *
 * Invariant: this is the only nn file that calls the training module; the rest of nn sees
 * parameters only as (data, grad, index) views.
 */
#include "accel/accel.h"
#include "nn_internal.h"

static int model_declare(void *ctx, const char *name, int ndim, const int64_t *shape)
{
    /* The model stays where it is placed (the accelerator's device unless
     * accel_model_set_device chose another): on a GPU its parameters bind to device memory
     * and the ops computing with them run on a GPU ctx (nn_ctx_set_device). */
    int index = -1;
    accel_status st = accel_model_add_param((accel_model *)ctx, name, ndim, shape, &index);
    return st == ACCEL_OK ? index : (int)st;
}

static accel_status model_bind(void *ctx, int index, float **data, float **grad)
{
    const accel_param *p = accel_model_param((accel_model *)ctx, index);
    if (p == NULL) {
        return accel_last_status(NULL) != ACCEL_OK
                   ? accel_last_status(NULL)
                   : accel__seterr(NULL, ACCEL_EINVAL, "nn_model_sink: no parameter %d", index);
    }
    /* The model's views of a parameter are fixed once its buffers exist (buckets are slices
     * of the same flat buffer), so binding it once is enough. The views, not p->data /
     * p->grad: those host conveniences are NULL when the model is on a GPU. */
    *data = p->data_view.data;
    *grad = p->grad_view.data;
    return ACCEL_OK;
}

accel_device_type accel__nn_sink_device(const nn_param_sink *s, int index)
{
    if (s->declare != model_declare) {
        return ACCEL_DEVICE_CPU; /* other sinks give host memory (nn_param_sink's contract) */
    }
    const accel_param *p = accel_model_param((accel_model *)s->ctx, index);
    return p != NULL ? p->data_view.device.type : ACCEL_DEVICE_CPU;
}

/* The parameter's view of the model's mixed-precision working copy (data NULL until prepare
 * has made it valid); its dtype says which precision the model computes in and its device
 * where the copy is (the ops read it only on that device). */
static void model_compute(void *ctx, int index, accel_tensor *view)
{
    accel_model *m = ctx;
    const accel_param *p = accel_model_param(m, index);
    if (p == NULL) {
        *view = accel_tensor_view(NULL, accel_model_compute_dtype(m), 0, NULL);
        return;
    }
    *view = p->compute_view;
}

/* ZeRO stage 3: the parameter's unit gathered before an op reads it (a no-op below). */
static accel_status model_materialize(void *ctx, int index)
{
    return accel_model_materialize((accel_model *)ctx, index);
}

nn_param_sink nn_model_sink(accel_model *model)
{
    nn_param_sink s = {model, model_declare, model_bind, model_compute, model_materialize};
    return s;
}

accel_status nn_params_for_model(nn_params **out, accel_model *model)
{
    if (model == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_params_for_model: model is NULL");
    }
    nn_param_sink s = nn_model_sink(model);
    return nn_params_new(out, &s);
}

/* Parameters from other sinks (a standalone nn_params set) are not synchronised by accel. */
static accel_status grad_ready(void *ctx, const nn_tensor *param)
{
    (void)ctx;
    if (param->sink_declare != model_declare) {
        return ACCEL_OK;
    }
    return accel_grad_ready((accel_model *)param->sink_ctx, param->param_index);
}

accel_status accel_backward(accel *acc, nn_tensor *loss)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_backward: acc is NULL");
    }
    accel_profile_push_cat(acc, "backward", "nn");
    double seed = accel_backward_begin(acc);
    nn_backward_hooks hooks = {acc, grad_ready};
    accel_status st = nn_backward(loss, (float)seed, &hooks);
    if (st != ACCEL_OK) {
        accel__adopt_thread_error(acc, st);
    }
    /* End the pass even after a failure so the model's backward state is closed. When that
     * fails too (a bucket launched by the failed pass broke the communicator), its status goes
     * with its message, which is the thread's last. */
    accel_status end = accel_backward_end(acc);
    accel_profile_pop(acc);
    return end != ACCEL_OK ? end : st;
}

accel_status accel_autocast_begin(accel *acc, nn_ctx *g, int enabled)
{
    if (acc == NULL || g == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_autocast_begin: acc and ctx needed");
    }
    int depth = (int)(sizeof(g->autocast_saved) / sizeof(g->autocast_saved[0]));
    if (g->autocast_depth >= depth) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_autocast_begin: nested more than %d deep",
                             depth);
    }
    g->autocast_saved[g->autocast_depth++] = g->autocast_mode;
    accel_precision mp = accel_mixed_precision(acc);
    int mode = ACCEL_F32;
    if (enabled && mp == ACCEL_PRECISION_BF16) {
        mode = ACCEL_BF16;
    } else if (enabled && mp == ACCEL_PRECISION_FP16) {
        mode = ACCEL_F16;
    }
    g->autocast_mode = mode;
    return ACCEL_OK;
}

accel_status accel_autocast_end(accel *acc, nn_ctx *g)
{
    if (acc == NULL || g == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_autocast_end: acc and ctx needed");
    }
    if (g->autocast_depth == 0) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_autocast_end without accel_autocast_begin");
    }
    g->autocast_mode = g->autocast_saved[--g->autocast_depth];
    return ACCEL_OK;
}
