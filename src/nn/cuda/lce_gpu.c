/*
 * nn_linear_cross_entropy on CUDA: the head's logits one chunk of rows at a time (cuBLASLt,
 * with nn_linear's autocast operands), the fused classifier kernel over the chunk (loss, and
 * the logits' gradient in their place or rounded into a 2-byte copy), and the two products
 * that turn it into dx's rows and into dW (fp32, summed over the chunks by beta = 1), all
 * queued on the compute stream during the forward. Backward scales dx and dW by the incoming
 * gradient (a device scalar) and adds them, rounded under autocast, as nn_linear's backward
 * adds its contributions. Per-op scratch (the chunk, the rounded copies of x and w) is given
 * back when the forward returns; the stream's order keeps later ops from reusing it early.
 */
#include "gpu_internal.h"

/* dst (+)= rnd(seed * src) for a stored gradient. */
static void add_scaled(nn_ctx *g, float *dst, const float *src, int64_t n, const float *seed,
                       int rnd, int fresh)
{
    if (n > 0) {
        accel__nn_cu_ok(g, nn_cu_scale_acc(nn__cu_stream(g), dst, src, n, seed, rnd, fresh),
                        "nn_linear_cross_entropy (backward)");
    }
}

static void lce_backward(nn_ctx *g, nn_node *n)
{
    int rnd = (int)n->i[0];
    int64_t rows = n->i[1], C = n->i[2], V = n->i[3];
    int fresh, half = 0;
    /* x's gradient, rounded under autocast; stored as its 2-byte bits where the LayerNorm that
     * made x (the GPT's ln_f) reads it so (accel__nn_cu_ln_dy_grad): the same values, 2 bytes
     * an element written and read instead of 4. */
    float *gx = n->p[0] == NULL ? NULL
                : rows * C > 0  ? accel__nn_cu_ln_dy_grad(g, n, n->in[0], rnd, &fresh, &half)
                                : accel__nn_grad_w(g, n->in[0], &fresh);
    if (half) {
        accel__nn_cu_ok(
            g, nn_cu_scale_half(nn__cu_stream(g), gx, n->p[0], rows * C, n->out->grad, rnd),
            "nn_linear_cross_entropy (backward)");
    } else if (gx != NULL) {
        add_scaled(g, gx, n->p[0], rows * C, n->out->grad, rnd, fresh);
    }
    /* Fetched after gx was written, so x == w adds rather than overwrites. */
    float *gw = n->p[1] != NULL ? accel__nn_grad_w(g, n->in[1], &fresh) : NULL;
    if (gw != NULL) {
        add_scaled(g, gw, n->p[1], V * C, n->out->grad, rnd, fresh);
    }
}

/* One forward's state across its chunks. */
typedef struct lce_run {
    int rnd, in_out;
    int64_t rows, C, V, chunk, esz; /* esz: bytes per operand element */
    const void *xd, *wd;            /* the products' operands */
    const int32_t *t;               /* on the device */
    int64_t ignore;
    float eps, scale;
    float *logits; /* chunk x V */
    void *gh;      /* chunk x V, 2-byte: the gradient as the products read it (autocast) */
    float *row_loss, *dx, *dw;
} lce_run;

static const char what[] = "nn_linear_cross_entropy";

/* Rows [r0, r0 + nr): the products are nn_linear's (linear_gpu.c), column-major. */
static int lce_chunk(nn_ctx *g, const lce_run *a, int64_t r0, int64_t nr)
{
    int64_t C = a->C, V = a->V;
    const void *xc = (const char *)a->xd + r0 * C * a->esz;
    int grad = a->dx != NULL || a->dw != NULL;
    /* logits^T (V x nr) = op(W) X_c^T */
    if (!accel__nn_cu_matmul(g, !a->in_out, 0, V, nr, C, a->wd, a->in_out ? V : C, xc, C, 0.0f,
                             a->logits, V, a->rnd, what) ||
        !accel__nn_cu_ok(g,
                         nn_cu_lce_rows(nn__cu_stream(g), a->logits, a->t + r0, nr, V, a->ignore,
                                        a->eps, a->scale, grad, a->rnd, a->gh, a->row_loss + r0),
                         what)) {
        return 0;
    }
    const void *dl = a->rnd ? a->gh : (const void *)a->logits;
    /* dx_c^T (C x nr) = op(W)' dL^T */
    if (a->dx != NULL && !accel__nn_cu_matmul(g, a->in_out, 0, C, nr, V, a->wd, a->in_out ? V : C,
                                              dl, V, 0.0f, a->dx + r0 * C, C, a->rnd, what)) {
        return 0;
    }
    if (a->dw == NULL) {
        return 1;
    }
    float beta = r0 > 0 ? 1.0f : 0.0f;
    if (a->in_out) { /* dW [C, V] += X_c^T dL: column-major V x C = dL^T X_c */
        return accel__nn_cu_matmul(g, 0, 1, V, C, nr, dl, V, xc, C, beta, a->dw, V, a->rnd, what);
    }
    /* dW [V, C] += dL^T X_c: column-major C x V = X_c^T dL */
    return accel__nn_cu_matmul(g, 0, 1, C, V, nr, xc, C, dl, V, beta, a->dw, C, a->rnd, what);
}

/* The operands and the chunk's buffers (per-op scratch), then every chunk. */
static int lce_run_chunks(nn_ctx *g, lce_run *a, const nn_tensor *x, const nn_tensor *w)
{
    int grad = a->dx != NULL || a->dw != NULL;
    a->xd = accel__nn_cu_operand(g, x, a->rnd, 1, what);
    a->wd = accel__nn_cu_operand(g, w, a->rnd, 1, what);
    a->logits = accel__nn_dtmp_alloc(g, (size_t)(a->chunk * a->V) * sizeof(float));
    a->gh = a->rnd && grad ? accel__nn_dtmp_alloc(g, (size_t)(a->chunk * a->V) * 2) : NULL;
    if (a->xd == NULL || a->wd == NULL || a->logits == NULL || (a->rnd && grad && a->gh == NULL)) {
        return 0;
    }
    if (a->rows == 0 && a->dw != NULL) { /* no chunk: dW is zero */
        return accel__nn_cu_ok(
            g, cudaMemsetAsync(a->dw, 0, (size_t)(a->V * a->C) * sizeof(float), nn__cu_stream(g)),
            what);
    }
    for (int64_t r0 = 0; r0 < a->rows; r0 += a->chunk) {
        if (!lce_chunk(g, a, r0, a->rows - r0 < a->chunk ? a->rows - r0 : a->chunk)) {
            return 0;
        }
    }
    return 1;
}

nn_tensor *accel__nn_cu_linear_cross_entropy(nn_ctx *g, nn_tensor *x, nn_tensor *w,
                                             const int32_t *targets, nn_layout layout,
                                             const nn_cross_entropy_options *opts)
{
    if (x == NULL || w == NULL) {
        return NULL;
    }
    nn_tensor *ins[2] = {x, w};
    nn_cross_entropy_options o;
    lce_run a;
    int64_t count;
    /* x may be a shell (accel__nn_norm_operand: the GPT's ln_f), read as its 2-byte operand. */
    if (!accel__nn_cu_product_inputs(g, what, ins, 2)) {
        return NULL;
    }
    int need_x = accel__nn_needs_grad(g, &x, 1), need_w = accel__nn_needs_grad(g, &w, 1);
    if (!accel__nn_lce_args(g, x, w, layout, targets, opts, need_x || need_w, &o, &a.rows, &a.C,
                            &a.V, &count)) {
        return NULL;
    }
    nn_tensor *y = o.reduction == NN_REDUCTION_NONE ? accel__nn_new(g, x->ndim - 1, x->shape)
                                                    : accel__nn_new(g, 0, NULL);
    if (y == NULL) {
        return NULL;
    }
    a.rnd = accel__nn_cu_rnd(nn__autocast(g));
    a.in_out = layout == NN_LAYOUT_IN_OUT;
    a.esz = a.rnd ? 2 : (int64_t)sizeof(float);
    a.chunk = accel__nn_lce_chunk_rows(&o, a.rows, a.V, 2 * NN_LCE_CHUNK_NBYTES);
    a.ignore = o.ignore_index;
    a.eps = o.label_smoothing;
    /* torch: mean over non-ignored targets; 0/0 = NaN when all are ignored. */
    a.scale = o.reduction == NN_REDUCTION_MEAN ? (float)(1.0 / (double)count) : 1.0f;
    a.t = accel__nn_cu_ints(g, targets, a.rows, what);
    a.row_loss = o.reduction == NN_REDUCTION_NONE
                     ? y->data
                     : accel__nn_dalloc(g, (size_t)(a.rows > 0 ? a.rows : 1) * sizeof(float));
    /* dx and dW stay in the arena until backward. */
    a.dx = need_x ? accel__nn_dalloc(g, (size_t)(a.rows * a.C) * sizeof(float)) : NULL;
    a.dw = need_w ? accel__nn_dalloc(g, (size_t)(a.V * a.C) * sizeof(float)) : NULL;
    if (a.t == NULL || a.row_loss == NULL || (need_x && a.dx == NULL) || (need_w && a.dw == NULL)) {
        return NULL;
    }
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    int ok = lce_run_chunks(g, &a, x, w);
    accel__nn_tmp_release(g, tm);
    if (!ok) {
        return NULL;
    }
    if (o.reduction != NN_REDUCTION_NONE &&
        !accel__nn_cu_ok(g,
                         nn_cu_sum_div(nn__cu_stream(g), a.row_loss, a.rows,
                                       o.reduction == NN_REDUCTION_MEAN ? (double)count : 1.0,
                                       y->data),
                         what)) {
        return NULL;
    }
    if (need_x || need_w) {
        nn_node *n = accel__nn_record(g, "linear_cross_entropy", y, ins, 2, lce_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = a.rnd;
        n->i[1] = a.rows;
        n->i[2] = a.C;
        n->i[3] = a.V;
        n->p[0] = a.dx;
        n->p[1] = a.dw;
    }
    return y;
}
