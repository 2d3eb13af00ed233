/*
 * Views (reshape, transpose, slice, split), the strided copy that materialises a view when a
 * kernel needs contiguous input, and concat.
 *
 * Views record no tape node: they alias their owner's storage and, through accel__nn_grad,
 * its gradient, so gradient written through a view lands in the owner directly. Only the
 * copy op needs a backward (a strided scatter-add).
 */
#include "nn_gpu.h"

static nn_tensor *new_view(nn_ctx *g, nn_tensor *x)
{
    nn_tensor *v = accel__nn_alloc(g, sizeof(*v));
    if (v == NULL) {
        return NULL;
    }
    *v = *x;
    v->base = x->base ? x->base : x;
    v->grad = NULL;
    /* Shadows belong to the owner (accel__nn_cu_operand reads them there). */
    v->shadow = NULL;
    v->grad_shadow = NULL;
    v->grad_shadow_rnd = 0;
    v->grad_reserved = NULL;
    v->grad_shadow_reserved = NULL;
    v->grad_borrowed = 0;
    v->param_index = -1;
    /* Stamped as any tensor of g: the checks read this stamp and then the owner's (a view
     * of a parameter lives in g's arena for one step, though the parameter outlives it). */
    v->use_ctx = g;
    v->use_epoch = g->epoch;
    v->next_ready = NULL;
    return v;
}

/* Walks a (padded to 4-D) strided tensor in row-major order. */
#define NN_FOR4(t, body)                                                                           \
    do {                                                                                           \
        int64_t sh_[4] = {1, 1, 1, 1}, st_[4] = {0, 0, 0, 0};                                      \
        int pad_ = 4 - (t)->ndim;                                                                  \
        for (int d_ = 0; d_ < (t)->ndim; d_++) {                                                   \
            sh_[pad_ + d_] = (t)->shape[d_];                                                       \
            st_[pad_ + d_] = (t)->stride[d_];                                                      \
        }                                                                                          \
        int64_t k_ = 0;                                                                            \
        for (int64_t i0 = 0; i0 < sh_[0]; i0++)                                                    \
            for (int64_t i1 = 0; i1 < sh_[1]; i1++)                                                \
                for (int64_t i2 = 0; i2 < sh_[2]; i2++)                                            \
                    for (int64_t i3 = 0; i3 < sh_[3]; i3++, k_++) {                                \
                        int64_t off_ = i0 * st_[0] + i1 * st_[1] + i2 * st_[2] + i3 * st_[3];      \
                        body;                                                                      \
                    }                                                                              \
    } while (0)

static void copy_backward(nn_ctx *g, nn_node *n)
{
    float *gx = accel__nn_grad(g, n->in[0]);
    const float *gy = n->out->grad;
    if (gx == NULL) {
        return;
    }
    NN_FOR4(n->in[0], gx[off_] += gy[k_]);
}

accel_status accel__nn_param_use(const nn_tensor *x)
{
    const nn_tensor *owner = x->base ? x->base : x;
    if (owner->param_index < 0 || owner->sink_materialize == NULL) {
        return ACCEL_OK;
    }
    return owner->sink_materialize(owner->sink_ctx, owner->param_index);
}

/* 1 when t, carved from a ctx's arena (any tensor but a parameter: new_tensor, new_view), is
 * g's and of g's current step; else 0 after failing g. One from another ctx, or from before a
 * reset, may sit in memory that now holds other tensors; after backward the next allocation
 * resets the ctx, so the step's tensors are about to be overwritten too. */
static int stamp_ok(nn_ctx *g, const char *op, int k, const nn_tensor *t)
{
    if (t->use_ctx != g) {
        int on_gpu = nn__on_gpu(t), g_gpu = g->device.type == ACCEL_DEVICE_CUDA;
        if (on_gpu == g_gpu) {
            accel__nn_fail(g, ACCEL_EINVAL, "%s: input %d belongs to another nn_ctx", op, k);
        } else if (g_gpu) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: input %d belongs to another nn_ctx and is in host memory (the "
                           "ctx computes on cuda:%d)",
                           op, k, g->device.index);
        } else {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: input %d belongs to another nn_ctx and is on the GPU (the ctx "
                           "computes on the CPU)",
                           op, k);
        }
        return 0;
    }
    if (t->use_epoch != g->epoch || g->backward_done) {
        accel__nn_fail(g, ACCEL_ESTATE, "%s: input %d is from before nn_ctx_reset (stale)%s", op, k,
                       t->use_epoch == g->epoch ? ": nn_backward ended its step, so the ctx "
                                                  "resets at its next allocation"
                                                : "");
        return 0;
    }
    return 1;
}

int accel__nn_input_ok(nn_ctx *g, const char *op, int k, const nn_tensor *x)
{
    if (g == NULL) {
        accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", op);
        return 0;
    }
    /* A view's own struct is arena memory of the ctx and step that made it, whatever its
     * owner: a view of a parameter kept from an earlier step (a cached transpose of a tied
     * weight) may already hold other tensors, though the parameter itself is still good. */
    if (x->base != NULL && !stamp_ok(g, op, k, x)) {
        return 0;
    }
    const nn_tensor *owner = x->base ? x->base : x;
    if (owner->param_index >= 0) {
        /* A parameter declared but not bound yet has no memory: a kernel would read NULL. */
        if (owner->data == NULL && owner->shadow == NULL) {
            accel__nn_fail(g, ACCEL_ESTATE,
                           "%s: input %d is parameter %d, which has no data (bind its nn_params "
                           "set before use)",
                           op, k, owner->param_index);
            return 0;
        }
        return 1;
    }
    return stamp_ok(g, op, k, owner);
}

int accel__nn_inputs_ok(nn_ctx *g, const char *op, nn_tensor *const *ts, int n)
{
    for (int k = 0; k < n; k++) {
        if (ts[k] != NULL && !accel__nn_input_ok(g, op, k, ts[k])) {
            return 0;
        }
    }
    return 1;
}

nn_tensor *accel__nn_contig(nn_ctx *g, nn_tensor *x, const char *op, int k)
{
    /* Every op takes its inputs through here: a parameter whose sink gathers it is made
     * present before any kernel reads it. */
    if (x != NULL && x->sink_materialize != NULL) {
        accel_status st = accel__nn_param_use(x);
        if (st != ACCEL_OK) {
            return accel__nn_fail(g, st, "%s: parameter %d: %s", op,
                                  (x->base ? x->base : x)->param_index, accel_last_error(NULL));
        }
    }
    if (x != NULL && !accel__nn_input_ok(g, op, k, x)) {
        return NULL;
    }
    if (x != NULL && x->sink_compute != NULL) {
        accel__nn_autocast_note(g, x);
    }
    if (x == NULL || nn_is_contiguous(x)) {
        return x;
    }
    NN_CPU_ONLY(g, "nn_contiguous (a strided copy)", x);
    nn_tensor *y = accel__nn_new(g, x->ndim, x->shape);
    if (y == NULL) {
        return NULL;
    }
    const float *src = x->data;
    float *dst = y->data;
    NN_FOR4(x, dst[k_] = src[off_]);
    if (accel__nn_needs_grad(g, &x, 1) &&
        !accel__nn_record(g, "contiguous", y, &x, 1, copy_backward)) {
        return NULL;
    }
    return y;
}

nn_tensor *nn_contiguous(nn_ctx *g, nn_tensor *x)
{
    return accel__nn_contig(g, x, "nn_contiguous", 0);
}

nn_tensor *nn_reshape(nn_ctx *g, nn_tensor *x, int ndim, const int64_t *shape)
{
    if (x == NULL) {
        return NULL;
    }
    if (ndim < 0 || ndim > NN_MAX_DIMS || (ndim > 0 && shape == NULL)) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_reshape: ndim %d out of range", ndim);
    }
    int64_t n = nn_numel(x), known = 1;
    int infer = -1;
    int64_t sh[NN_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        sh[d] = shape[d];
        if (sh[d] == -1 && infer < 0) {
            infer = d;
        } else if (sh[d] < 0) {
            return accel__nn_fail(g, ACCEL_EINVAL, "nn_reshape: invalid size %lld in dim %d",
                                  (long long)sh[d], d);
        } else if (sh[d] > 0 && known > INT64_MAX / sh[d]) {
            /* A product that wraps could match numel(x) and make a view past the data. */
            return accel__nn_fail(g, ACCEL_EINVAL,
                                  "nn_reshape: size %lld in dim %d overflows "
                                  "the element count",
                                  (long long)sh[d], d);
        } else {
            known *= sh[d];
        }
    }
    if (infer >= 0) {
        sh[infer] = known ? n / known : 0;
        known *= sh[infer];
    }
    if (known != n) {
        char b[64];
        return accel__nn_fail(g, ACCEL_EINVAL,
                              "nn_reshape: cannot view %s (%lld elements) as "
                              "%lld elements",
                              accel__nn_shape_str(x, b, sizeof(b)), (long long)n, (long long)known);
    }
    nn_tensor *c = accel__nn_contig(g, x, "nn_reshape", 0);
    nn_tensor *v = c ? new_view(g, c) : NULL;
    if (v == NULL) {
        return NULL;
    }
    v->ndim = ndim;
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        v->shape[d] = sh[d];
        v->stride[d] = s;
        s *= sh[d];
    }
    return v;
}

nn_tensor *nn_transpose(nn_ctx *g, nn_tensor *x, int dim0, int dim1)
{
    if (x == NULL) {
        return NULL;
    }
    int a = accel__nn_dim(x, dim0), b = accel__nn_dim(x, dim1);
    if (a < 0 || b < 0) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_transpose: dims %d, %d out of range for %d-D",
                              dim0, dim1, x->ndim);
    }
    nn_tensor *v = new_view(g, x);
    if (v == NULL) {
        return NULL;
    }
    v->shape[a] = x->shape[b];
    v->shape[b] = x->shape[a];
    v->stride[a] = x->stride[b];
    v->stride[b] = x->stride[a];
    return v;
}

nn_tensor *nn_slice(nn_ctx *g, nn_tensor *x, int dim, int64_t start, int64_t end)
{
    if (x == NULL) {
        return NULL;
    }
    int d = accel__nn_dim(x, dim);
    if (d < 0 || start < 0 || end < start || end > x->shape[d]) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_slice: dim %d range [%lld, %lld) invalid", dim,
                              (long long)start, (long long)end);
    }
    nn_tensor *v = new_view(g, x);
    if (v == NULL) {
        return NULL;
    }
    v->shape[d] = end - start;
    /* (a shell, accel__nn_norm_operand's output, has no data: its views neither) */
    v->data = x->data != NULL ? x->data + start * x->stride[d] : NULL;
    v->offset = x->offset + start * x->stride[d];
    return v;
}

accel_status nn_split(nn_ctx *g, nn_tensor *x, int dim, int n, const int64_t *sizes,
                      nn_tensor **outs)
{
    if (x == NULL || sizes == NULL || outs == NULL || n <= 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_split: %s",
                             x == NULL ? "input is NULL" : "sizes/outs/n invalid");
    }
    int d = accel__nn_dim(x, dim);
    if (d < 0) {
        accel__nn_fail(g, ACCEL_EINVAL, "nn_split: dim %d out of range for %d-D input", dim,
                       x->ndim);
        return ACCEL_EINVAL;
    }
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        /* Checked against what is left, so the running sum cannot wrap. */
        if (sizes[k] < 0 || sizes[k] > x->shape[d] - total) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "nn_split: size %lld of part %d is negative or past dim %d's %lld",
                           (long long)sizes[k], k, dim, (long long)x->shape[d]);
            return ACCEL_EINVAL;
        }
        total += sizes[k];
    }
    if (total != x->shape[d]) {
        accel__nn_fail(g, ACCEL_EINVAL, "nn_split: sizes sum to %lld, dim %d has %lld",
                       (long long)total, dim, (long long)x->shape[d]);
        return ACCEL_EINVAL;
    }
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        outs[k] = nn_slice(g, x, d, at, at + sizes[k]);
        if (outs[k] == NULL) {
            return accel_last_status(NULL);
        }
        at += sizes[k];
    }
    return ACCEL_OK;
}

/* ---- concat: out = [x0 | x1 | ...] along dim, as (outer, inner_k) blocks ---- */

static void concat_backward(nn_ctx *g, nn_node *n)
{
    int64_t outer = n->i[0], row = n->i[1], at = 0;
    const float *gy = n->out->grad;
    for (int k = 0; k < n->n_in; k++) {
        nn_tensor *x = n->in[k];
        int64_t inner = outer ? nn_numel(x) / outer : 0;
        float *gx = accel__nn_grad(g, x);
        if (gx != NULL) {
            for (int64_t o = 0; o < outer; o++) {
                for (int64_t j = 0; j < inner; j++) {
                    gx[o * inner + j] += gy[o * row + at + j];
                }
            }
        }
        at += inner;
    }
}

nn_tensor *nn_concat(nn_ctx *g, nn_tensor *const *xs, int n, int dim)
{
    if (xs == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_concat: xs is NULL");
    }
    if (n <= 0 || n > 4) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_concat: n = %d (1..4 tensors supported)", n);
    }
    nn_tensor *c[4];
    for (int k = 0; k < n; k++) {
        if (xs[k] == NULL) {
            return NULL;
        }
        NN_CPU_ONLY(g, "nn_concat", xs[k]);
        c[k] = accel__nn_contig(g, xs[k], "nn_concat", k);
        if (c[k] == NULL) {
            return NULL;
        }
    }
    int d = accel__nn_dim(c[0], dim);
    if (d < 0) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_concat: dim %d out of range", dim);
    }
    int64_t shape[NN_MAX_DIMS];
    memcpy(shape, c[0]->shape, sizeof(shape));
    shape[d] = 0;
    for (int k = 0; k < n; k++) {
        int ok = c[k]->ndim == c[0]->ndim;
        for (int e = 0; ok && e < c[0]->ndim; e++) {
            ok = e == d || c[k]->shape[e] == c[0]->shape[e];
        }
        if (!ok) {
            return accel__nn_fail(g, ACCEL_EINVAL,
                                  "nn_concat: input %d shape differs outside "
                                  "dim %d",
                                  k, dim);
        }
        shape[d] += c[k]->shape[d];
    }
    nn_tensor *y = accel__nn_new(g, c[0]->ndim, shape);
    if (y == NULL) {
        return NULL;
    }
    int64_t outer = 1;
    for (int e = 0; e < d; e++) {
        outer *= shape[e];
    }
    int64_t row = outer ? nn_numel(y) / outer : 0, at = 0;
    for (int k = 0; k < n; k++) {
        int64_t inner = outer ? nn_numel(c[k]) / outer : 0;
        for (int64_t o = 0; o < outer; o++) {
            memcpy(y->data + o * row + at, c[k]->data + o * inner, (size_t)inner * sizeof(float));
        }
        at += inner;
    }
    if (accel__nn_needs_grad(g, c, n)) {
        nn_node *nd = accel__nn_record(g, "concat", y, c, n, concat_backward);
        if (nd == NULL) {
            return NULL;
        }
        nd->i[0] = outer;
        nd->i[1] = row;
    }
    return y;
}
