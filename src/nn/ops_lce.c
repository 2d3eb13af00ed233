/*
 * nn_linear_cross_entropy on the CPU: a linear head and cross entropy over row chunks, so the
 * [rows, V] logits and their gradient never exist at once (the GPU path is cuda/lce_gpu.c).
 *
 * Invariant: per chunk the arithmetic is nn_linear's and nn_cross_entropy's (the same sgemm
 * calls, row statistic, gradient expression and autocast rounding), and the gradient of the
 * mean / sum is fixed once the forward has run except for the incoming scalar, so forward
 * computes dx and dW for a seed of 1 and backward only scales them. With one chunk holding
 * every row the products are the unfused ones, so a seed of 1 gives the same bits.
 */
#include <pthread.h>

#include "nn_gpu.h"

static long long env_chunk_rows;

static void read_env_chunk_rows(void)
{
    long long v = 0;
    if (accel__env_int("ACCEL_NN_CE_CHUNK_ROWS", &v) == ACCEL_OK && v > 0) {
        env_chunk_rows = v;
    }
}

int64_t accel__nn_lce_chunk_rows(const nn_cross_entropy_options *o, int64_t rows, int64_t V,
                                 int64_t nbytes)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_env_chunk_rows);
    int64_t r = o->chunk_rows > 0 ? o->chunk_rows : (int64_t)env_chunk_rows;
    if (r <= 0) {
        r = nbytes / ((int64_t)sizeof(float) * (V > 0 ? V : 1));
        r = r >= 128 ? r - r % 128 : r; /* whole tiles for the products */
    }
    r = r < rows ? r : rows;
    return r > 0 ? r : 1;
}

int accel__nn_lce_args(nn_ctx *g, const nn_tensor *x, const nn_tensor *w, nn_layout layout,
                       const int32_t *targets, const nn_cross_entropy_options *opts, int need_grad,
                       nn_cross_entropy_options *o, int64_t *rows, int64_t *C, int64_t *V,
                       int64_t *count)
{
    int in_out = layout == NN_LAYOUT_IN_OUT;
    if (layout != NN_LAYOUT_OUT_IN && !in_out) {
        accel__nn_fail(g, ACCEL_EINVAL, "nn_linear_cross_entropy: unknown layout %d", (int)layout);
        return 0;
    }
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[in_out ? 0 : 1] ||
        w->shape[0] == 0 || w->shape[1] == 0) {
        char s1[64], s2[64];
        accel__nn_fail(g, ACCEL_EINVAL,
                       "nn_linear_cross_entropy: input %s does not match weight %s (%s layout; "
                       "weight 2-D and not empty)",
                       accel__nn_shape_str(x, s1, sizeof(s1)),
                       accel__nn_shape_str(w, s2, sizeof(s2)), in_out ? "[in, out]" : "[out, in]");
        return 0;
    }
    *C = in_out ? w->shape[0] : w->shape[1];
    *V = in_out ? w->shape[1] : w->shape[0];
    *rows = nn_numel(x) / *C;
    if (accel__nn_ce_check(g, "nn_linear_cross_entropy", *rows, *V, targets, opts, o, count) !=
        ACCEL_OK) {
        return 0;
    }
    if (o->reduction == NN_REDUCTION_NONE && need_grad) {
        accel__nn_fail(g, ACCEL_EUNSUPPORTED,
                       "nn_linear_cross_entropy: reduction none is forward-only (its gradient is "
                       "not a scaled constant); use nn_linear + nn_cross_entropy");
        return 0;
    }
    return 1;
}

/* x[c] = gr * (softmax(x)[c] - uni) in place for a row with log-sum-exp l: ce_row_grad's
 * expression (ops_norm.c), written over the logits. */
NN_KERNEL static void row_grad_inplace(float *x, int64_t V, float l, float gr, float uni)
{
    NN_SIMD
    for (int64_t c = 0; c < V; c++) {
        x[c] = gr * (nn__expf(x[c] - l) - uni);
    }
}

/* dst (+)= seed * src, rounded to dt under autocast (then src is scaled in place: backward
 * runs once per node). */
static void scale_into(accel_dtype dt, float seed, float *src, float *dst, int64_t n, int write)
{
    if (dt != ACCEL_F32) {
        if (seed != 1.0f) {
            NN_OMP_FOR(n)
            for (int64_t i = 0; i < n; i++) {
                src[i] *= seed;
            }
        }
        if (write) {
            accel__nn_round(dt, dst, src, n);
        } else {
            accel__nn_add_rounded(dt, dst, src, n);
        }
        return;
    }
    NN_OMP_FOR(n)
    for (int64_t i = 0; i < n; i++) {
        dst[i] = write ? seed * src[i] : dst[i] + seed * src[i];
    }
}

static void lce_backward(nn_ctx *g, nn_node *n)
{
    accel_dtype dt = (accel_dtype)n->i[0];
    int64_t rows = n->i[1], C = n->i[2], V = n->i[3];
    float seed = n->out->grad[0];
    int fresh;
    float *gx = n->p[0] != NULL ? accel__nn_grad_w(g, n->in[0], &fresh) : NULL;
    if (gx != NULL) {
        scale_into(dt, seed, n->p[0], gx, rows * C, fresh);
    }
    /* Fetched after gx was written, so x == w adds rather than overwrites. */
    float *gw = n->p[1] != NULL ? accel__nn_grad_w(g, n->in[1], &fresh) : NULL;
    if (gw != NULL) {
        scale_into(dt, seed, n->p[1], gw, V * C, fresh);
    }
}

/* What one forward needs across its chunks. */
typedef struct lce_run {
    accel_dtype dt;
    int in_out;
    int64_t rows, C, V, chunk;
    const float *xd, *wd; /* the operands as the products read them */
    const int32_t *t;
    int64_t ignore;
    float eps, scale;          /* label smoothing; d(loss)/d(row loss) */
    float *logits;             /* chunk x V scratch */
    float *row_loss, *dx, *dw; /* dx / dw NULL when not wanted */
} lce_run;

/* Rows [r0, r0 + nr): logits, each row's loss and, when a gradient is wanted, the logits'
 * gradient in their place, then its products into dx and dW. */
static void lce_chunk(const lce_run *a, int64_t r0, int64_t nr)
{
    int64_t C = a->C, V = a->V;
    float *L = a->logits;
    const float *xc = a->xd + r0 * C;
    accel__nn_gemm(0, !a->in_out, nr, V, C, 1.0f, xc, C, a->wd, a->in_out ? V : C, 0.0f, L, V);
    int grad = a->dx != NULL || a->dw != NULL;
    float uni = a->eps / (float)V;
    NN_OMP_FOR(nr * V)
    for (int64_t r = 0; r < nr; r++) {
        float *Lr = L + r * V, sx;
        int32_t t = a->t[r0 + r];
        float l = accel__nn_ce_row_stats(Lr, V, &sx);
        int ignored = t == a->ignore;
        a->row_loss[r0 + r] = ignored ? 0.0f : l - (1.0f - a->eps) * Lr[t] - uni * sx;
        if (!grad) {
            continue;
        }
        if (ignored) {
            memset(Lr, 0, (size_t)V * sizeof(float));
            continue;
        }
        row_grad_inplace(Lr, V, l, a->scale, uni);
        Lr[t] -= a->scale * (1.0f - a->eps);
    }
    if (!grad) {
        return;
    }
    if (a->dt != ACCEL_F32) { /* the gradient enters the products rounded, as in nn_linear */
        accel__nn_round(a->dt, L, L, nr * V);
    }
    if (a->dx != NULL) {
        accel__nn_gemm(0, a->in_out, nr, C, V, 1.0f, L, V, a->wd, a->in_out ? V : C, 0.0f,
                       a->dx + r0 * C, C);
    }
    if (a->dw != NULL) {
        float beta = r0 > 0 ? 1.0f : 0.0f;
        if (a->in_out) { /* dW [C, V] += x_c^T dL */
            accel__nn_gemm(1, 0, C, V, nr, 1.0f, xc, C, L, V, beta, a->dw, V);
        } else { /* dW [V, C] += dL^T x_c */
            accel__nn_gemm(1, 0, V, C, nr, 1.0f, L, V, xc, C, beta, a->dw, C);
        }
    }
}

static nn_tensor *lce_impl(nn_ctx *g, nn_tensor *x, nn_tensor *w, const int32_t *targets,
                           nn_layout layout, const nn_cross_entropy_options *opts)
{
    if (x == NULL || w == NULL) {
        return NULL;
    }
    x = accel__nn_contig(g, x, "nn_linear_cross_entropy", 0);
    w = x != NULL ? accel__nn_contig(g, w, "nn_linear_cross_entropy", 1) : NULL;
    if (x == NULL || w == NULL) {
        return NULL;
    }
    nn_cross_entropy_options o;
    lce_run a;
    int64_t count;
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
    a.dt = nn__autocast(g);
    a.in_out = layout == NN_LAYOUT_IN_OUT;
    a.chunk = accel__nn_lce_chunk_rows(&o, a.rows, a.V, NN_LCE_CHUNK_NBYTES);
    a.t = targets;
    a.ignore = o.ignore_index;
    a.eps = o.label_smoothing;
    /* torch: mean over non-ignored targets; 0/0 = NaN when all are ignored. */
    a.scale = o.reduction == NN_REDUCTION_MEAN ? (float)(1.0 / (double)count) : 1.0f;
    a.xd = x->data;
    a.wd = w->data;
    if (a.dt != ACCEL_F32) {
        /* Read only by this forward, so x's rounded copy is per-op scratch (a parameter w is
         * widened into it from its working copy; another w gets an arena copy). */
        float *xr = accel__nn_tmp_scratch(g, a.rows * a.C, 0);
        if (xr != NULL) {
            accel__nn_round(a.dt, xr, x->data, a.rows * a.C);
        }
        a.xd = xr;
        a.wd = accel__nn_cast(g, w, a.dt, NULL);
    }
    a.logits = accel__nn_tmp_scratch(g, a.chunk * a.V, 0);
    a.row_loss = o.reduction == NN_REDUCTION_NONE ? y->data : accel__nn_tmp_scratch(g, a.rows, 0);
    /* dx and dW stay in the arena until backward. */
    a.dx = need_x ? accel__nn_scratch(g, a.rows * a.C, 0) : NULL;
    a.dw = need_w ? accel__nn_scratch(g, a.V * a.C, a.rows == 0) : NULL;
    if (a.xd == NULL || a.wd == NULL || a.logits == NULL || a.row_loss == NULL ||
        (need_x && a.dx == NULL) || (need_w && a.dw == NULL)) {
        return NULL;
    }
    for (int64_t r0 = 0; r0 < a.rows; r0 += a.chunk) {
        lce_chunk(&a, r0, a.rows - r0 < a.chunk ? a.rows - r0 : a.chunk);
    }
    if (o.reduction != NN_REDUCTION_NONE) {
        double acc = 0.0; /* in row order, as nn_cross_entropy sums */
        for (int64_t r = 0; r < a.rows; r++) {
            acc += a.row_loss[r];
        }
        y->data[0] = o.reduction == NN_REDUCTION_MEAN ? (float)(acc / (double)count) : (float)acc;
    }
    if (need_x || need_w) {
        nn_tensor *ins[2] = {x, w};
        nn_node *n = accel__nn_record(g, "linear_cross_entropy", y, ins, 2, lce_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = a.dt;
        n->i[1] = a.rows;
        n->i[2] = a.C;
        n->i[3] = a.V;
        n->p[0] = a.dx;
        n->p[1] = a.dw;
    }
    return y;
}

nn_tensor *nn_linear_cross_entropy(nn_ctx *g, nn_tensor *x, nn_tensor *w, const int32_t *targets,
                                   nn_layout layout, const nn_cross_entropy_options *opts)
{
    if (g == NULL) {
        return accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", "nn_linear_cross_entropy");
    }
    if (nn__use_gpu(g, x, w, NULL)) {
        return accel__nn_gpu->linear_cross_entropy(g, x, w, targets, layout, opts);
    }
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    nn_tensor *y = lce_impl(g, x, w, targets, layout, opts);
    accel__nn_tmp_release(g, tm);
    accel__nn_fp_leave(g, &fs);
    return y;
}
