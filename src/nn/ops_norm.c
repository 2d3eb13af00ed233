/*
 * Row-wise ops: softmax, log_softmax, cross_entropy, layernorm, embedding.
 *
 * Each keeps only per-row statistics for backward (log-sum-exp, mean and 1/std), never a
 * second copy of its input: backward recomputes probabilities from the saved logits and the
 * row statistic. Rows are independent, so forward and the input-gradient loops are
 * OpenMP-parallel over rows; parameter gradients (LayerNorm weight/bias, embedding rows) are
 * summed over rows serially so the result does not depend on the thread count.
 */
#include "nn_gpu.h"

/* ---- softmax / log_softmax over dim, as (outer, len, inner) ---- */

static void softmax_backward(nn_ctx *g, nn_node *n)
{
    int64_t outer = n->i[0], len = n->i[1], inner = n->i[2];
    int log = (int)n->i[3];
    const float *y = n->out->data, *gy = n->out->grad;
    float *gx = accel__nn_grad(g, n->in[0]);
    if (gx == NULL) {
        return;
    }
    NN_OMP_FOR(outer * len * inner)
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < inner; j++) {
            int64_t base = o * len * inner + j;
            float dot = 0.0f;
            for (int64_t l = 0; l < len; l++) {
                int64_t k = base + l * inner;
                dot += log ? gy[k] : gy[k] * y[k];
            }
            for (int64_t l = 0; l < len; l++) {
                int64_t k = base + l * inner;
                gx[k] += log ? gy[k] - nn__expf(y[k]) * dot : y[k] * (gy[k] - dot);
            }
        }
    }
}

static nn_tensor *softmax_run(nn_ctx *g, nn_tensor *x, int dim, int log)
{
    if (x == NULL) {
        return NULL;
    }
    x = accel__nn_contig(g, x, log ? "nn_log_softmax" : "nn_softmax", 0);
    if (x == NULL) {
        return NULL;
    }
    int d = accel__nn_dim(x, dim);
    if (d < 0) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_%ssoftmax: dim %d out of range for %d-D",
                              log ? "log_" : "", dim, x->ndim);
    }
    int64_t outer = 1, inner = 1, len = x->shape[d];
    for (int e = 0; e < x->ndim; e++) {
        if (e < d) {
            outer *= x->shape[e];
        } else if (e > d) {
            inner *= x->shape[e];
        }
    }
    nn_tensor *y = accel__nn_new(g, x->ndim, x->shape);
    if (y == NULL) {
        return NULL;
    }
    NN_OMP_FOR(outer * len * inner)
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < inner; j++) {
            int64_t base = o * len * inner + j;
            float m = -INFINITY, s = 0.0f;
            for (int64_t l = 0; l < len; l++) {
                m = x->data[base + l * inner] > m ? x->data[base + l * inner] : m;
            }
            for (int64_t l = 0; l < len; l++) {
                float e = nn__expf(x->data[base + l * inner] - m);
                y->data[base + l * inner] = e;
                s += e;
            }
            float ls = m + logf(s), inv = 1.0f / s;
            for (int64_t l = 0; l < len; l++) {
                int64_t k = base + l * inner;
                y->data[k] = log ? x->data[k] - ls : y->data[k] * inv;
            }
        }
    }
    if (accel__nn_needs_grad(g, &x, 1)) {
        nn_node *n =
            accel__nn_record(g, log ? "log_softmax" : "softmax", y, &x, 1, softmax_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = outer;
        n->i[1] = len;
        n->i[2] = inner;
        n->i[3] = log;
    }
    return y;
}

static nn_tensor *softmax_impl(nn_ctx *g, nn_tensor *x, int dim, int log)
{
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = softmax_run(g, x, dim, log);
    accel__nn_fp_leave(g, &fs);
    return y;
}

nn_tensor *nn_softmax(nn_ctx *g, nn_tensor *x, int dim)
{
    NN_CPU_ONLY(g, "nn_softmax", x);
    return softmax_impl(g, x, dim, 0);
}

nn_tensor *nn_log_softmax(nn_ctx *g, nn_tensor *x, int dim)
{
    NN_CPU_ONLY(g, "nn_log_softmax", x);
    return softmax_impl(g, x, dim, 1);
}

/* ---- cross entropy: saves the row log-sum-exp and a copy of the targets ---- */

nn_cross_entropy_options nn_cross_entropy_options_default(void)
{
    nn_cross_entropy_options o;
    memset(&o, 0, sizeof(o));
    o.size = (uint32_t)sizeof(o);
    o.version = NN_CROSS_ENTROPY_OPTIONS_VERSION;
    o.ignore_index = -100;
    o.reduction = NN_REDUCTION_MEAN;
    o.label_smoothing = 0.0f;
    return o;
}

NN_KERNEL float accel__nn_row_max(const float *x, int64_t n)
{
    float m = -INFINITY;
    NN_SIMD_MAX(m)
    for (int64_t c = 0; c < n; c++) {
        m = x[c] > m ? x[c] : m;
    }
    return m;
}

NN_KERNEL float accel__nn_ce_row_stats(const float *restrict x, int64_t C, float *sx_out)
{
    float m = accel__nn_row_max(x, C), s = 0.0f, sx = 0.0f;
    NN_SIMD_SUM(s, sx)
    for (int64_t c = 0; c < C; c++) {
        s += nn__expf(x[c] - m);
        sx += x[c];
    }
    *sx_out = sx;
    return m + logf(s);
}

/* g (+)= gr * (softmax(x) - eps / C) for one row with log-sum-exp l (target term added by the
 * caller); written when `write`. */
NN_KERNEL static void ce_row_grad(const float *restrict x, int64_t C, float l, float gr, float uni,
                                  int write, float *restrict g)
{
    if (write) {
        NN_SIMD
        for (int64_t c = 0; c < C; c++) {
            g[c] = gr * (nn__expf(x[c] - l) - uni);
        }
    } else {
        NN_SIMD
        for (int64_t c = 0; c < C; c++) {
            g[c] += gr * (nn__expf(x[c] - l) - uni);
        }
    }
}

static void ce_backward(nn_ctx *g, nn_node *n)
{
    int64_t rows = n->i[0], C = n->i[1], ignore = n->i[2];
    nn_reduction red = (nn_reduction)n->i[3];
    float eps = n->f[0], scale = n->f[1];
    const float *x = n->in[0]->data, *lse = n->p[0], *gy = n->out->grad;
    const int32_t *t = n->p[1];
    int fresh;
    float *gx = accel__nn_grad_w(g, n->in[0], &fresh);
    if (gx == NULL) {
        return;
    }
    float uni = eps / (float)C;
    NN_OMP_FOR(rows * C)
    for (int64_t r = 0; r < rows; r++) {
        float *gxr = gx + r * C;
        if (t[r] == ignore) {
            if (fresh) {
                memset(gxr, 0, (size_t)C * sizeof(float));
            }
            continue;
        }
        float gr = (red == NN_REDUCTION_NONE ? gy[r] : gy[0]) * scale;
        ce_row_grad(x + r * C, C, lse[r], gr, uni, fresh, gxr);
        gxr[t[r]] -= gr * (1.0f - eps);
    }
}

accel_status accel__nn_ce_check(nn_ctx *g, const char *who, int64_t rows, int64_t C,
                                const int32_t *targets, const nn_cross_entropy_options *opts,
                                nn_cross_entropy_options *o, int64_t *count)
{
    *o = nn_cross_entropy_options_default();
    if (ACCEL__OPTIONS_COPY(NULL, who, nn_cross_entropy_options, o, opts, label_smoothing) !=
        ACCEL_OK) {
        accel__nn_fail(g, ACCEL_EINVAL, "%s", accel_last_error(NULL));
        return ACCEL_EINVAL;
    }
    if (targets == NULL) {
        accel__nn_fail(g, ACCEL_EINVAL, "%s: targets is NULL", who);
        return ACCEL_EINVAL;
    }
    if (o->reduction < NN_REDUCTION_MEAN || o->reduction > NN_REDUCTION_NONE ||
        !(o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f) || o->chunk_rows < 0) {
        accel__nn_fail(g, ACCEL_EINVAL,
                       "%s: invalid reduction %d, label_smoothing %g or chunk_rows %lld", who,
                       (int)o->reduction, (double)o->label_smoothing, (long long)o->chunk_rows);
        return ACCEL_EINVAL;
    }
    *count = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (targets[r] == o->ignore_index) {
            continue;
        }
        if (targets[r] < 0 || targets[r] >= C) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "%s: target %d at position %lld is outside "
                           "[0, %lld) and not ignore_index %lld",
                           who, (int)targets[r], (long long)r, (long long)C,
                           (long long)o->ignore_index);
            return ACCEL_EINVAL;
        }
        (*count)++;
    }
    return ACCEL_OK;
}

accel_status accel__nn_ce_args(nn_ctx *g, const nn_tensor *logits, const int32_t *targets,
                               const nn_cross_entropy_options *opts, nn_cross_entropy_options *o,
                               int64_t *rows, int64_t *count)
{
    if (logits->ndim < 1) {
        accel__nn_fail(g, ACCEL_EINVAL, "nn_cross_entropy: logits must have a class dim");
        return ACCEL_EINVAL;
    }
    int64_t C = logits->shape[logits->ndim - 1];
    *rows = C ? nn_numel(logits) / C : 0;
    if (C == 0) {
        /* Rows with no class to pick: every target would be out of range, but with rows
         * counted from numel there would be none to check and the loss would be NaN. */
        int64_t lead = 1;
        for (int d = 0; d < logits->ndim - 1; d++) {
            lead *= logits->shape[d];
        }
        if (lead > 0) {
            char b[64];
            accel__nn_fail(g, ACCEL_EINVAL, "nn_cross_entropy: logits %s have no classes",
                           accel__nn_shape_str(logits, b, sizeof(b)));
            return ACCEL_EINVAL;
        }
    }
    return accel__nn_ce_check(g, "nn_cross_entropy", *rows, C, targets, opts, o, count);
}

static nn_tensor *cross_entropy_impl(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                                     const nn_cross_entropy_options *opts)
{
    nn_cross_entropy_options o;
    int64_t rows, count;
    if (logits == NULL ||
        accel__nn_ce_args(g, logits, targets, opts, &o, &rows, &count) != ACCEL_OK) {
        return NULL;
    }
    logits = accel__nn_contig(g, logits, "nn_cross_entropy", 0);
    if (logits == NULL) {
        return NULL;
    }
    int64_t C = logits->shape[logits->ndim - 1];
    nn_tensor *y = o.reduction == NN_REDUCTION_NONE
                       ? accel__nn_new(g, logits->ndim - 1, logits->shape)
                       : accel__nn_new(g, 0, NULL);
    float *lse = accel__nn_alloc(g, (size_t)rows * sizeof(float));
    float *row_loss = accel__nn_alloc(g, (size_t)rows * sizeof(float));
    int32_t *tcopy = accel__nn_alloc(g, (size_t)rows * sizeof(int32_t));
    if (y == NULL || lse == NULL || row_loss == NULL || tcopy == NULL) {
        return NULL;
    }
    memcpy(tcopy, targets, (size_t)rows * sizeof(int32_t));
    float eps = o.label_smoothing;
    NN_OMP_FOR(rows * C)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = logits->data + r * C;
        float sx;
        lse[r] = accel__nn_ce_row_stats(xr, C, &sx);
        row_loss[r] = tcopy[r] == o.ignore_index
                          ? 0.0f
                          : lse[r] - (1.0f - eps) * xr[tcopy[r]] - eps / (float)C * sx;
    }
    float scale = 1.0f;
    if (o.reduction == NN_REDUCTION_NONE) {
        memcpy(y->data, row_loss, (size_t)rows * sizeof(float));
    } else {
        double acc = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            acc += row_loss[r];
        }
        /* torch: mean over non-ignored targets; 0/0 = NaN when all are ignored. */
        scale = o.reduction == NN_REDUCTION_MEAN ? (float)(1.0 / (double)count) : 1.0f;
        y->data[0] = o.reduction == NN_REDUCTION_MEAN ? (float)(acc / (double)count) : (float)acc;
    }
    if (accel__nn_needs_grad(g, &logits, 1)) {
        nn_node *n = accel__nn_record(g, "cross_entropy", y, &logits, 1, ce_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = rows;
        n->i[1] = C;
        n->i[2] = o.ignore_index;
        n->i[3] = o.reduction;
        n->f[0] = eps;
        n->f[1] = scale;
        n->p[0] = lse;
        n->p[1] = tcopy;
    }
    return y;
}

nn_tensor *nn_cross_entropy(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                            const nn_cross_entropy_options *opts)
{
    if (nn__use_gpu(g, logits, NULL, NULL)) {
        return accel__nn_gpu->cross_entropy(g, logits, targets, opts);
    }
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = cross_entropy_impl(g, logits, targets, opts);
    accel__nn_fp_leave(g, &fs);
    return y;
}

/* ---- layernorm: saves mean and 1/std per row ---- */

/* One row of the input gradient: gx (+)= rs * (gy*w - mean(gy*w) - xhat * mean(gy*w*xhat)). */
NN_KERNEL static void ln_row_grad(const float *restrict xr, const float *restrict gr,
                                  const float *restrict w, float mu, float rs, int64_t C, int write,
                                  float *restrict gxr)
{
    float s1 = 0.0f, s2 = 0.0f;
    NN_SIMD_SUM(s1, s2)
    for (int64_t c = 0; c < C; c++) {
        float d = gr[c] * w[c];
        s1 += d;
        s2 += d * (xr[c] - mu) * rs;
    }
    s1 /= (float)C;
    s2 /= (float)C;
    if (write) {
        NN_SIMD
        for (int64_t c = 0; c < C; c++) {
            gxr[c] = rs * (gr[c] * w[c] - s1 - (xr[c] - mu) * rs * s2);
        }
    } else {
        NN_SIMD
        for (int64_t c = 0; c < C; c++) {
            gxr[c] += rs * (gr[c] * w[c] - s1 - (xr[c] - mu) * rs * s2);
        }
    }
}

/* Weight and bias gradients summed over rows, serially (thread-count independent). */
NN_KERNEL static void ln_param_grad(const float *restrict x, const float *restrict gy,
                                    const float *restrict mean, const float *restrict rstd,
                                    int64_t rows, int64_t C, float *restrict gw, float *restrict gb)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C, *gr = gy + r * C;
        float mu = mean[r], rs = rstd[r];
        if (gw != NULL) {
            NN_SIMD
            for (int64_t c = 0; c < C; c++) {
                gw[c] += gr[c] * (xr[c] - mu) * rs;
            }
        }
        if (gb != NULL) {
            NN_SIMD
            for (int64_t c = 0; c < C; c++) {
                gb[c] += gr[c];
            }
        }
    }
}

static void ln_backward(nn_ctx *g, nn_node *n)
{
    int64_t rows = n->i[0], C = n->i[1];
    const float *x = n->in[0]->data, *gy = n->out->grad;
    const float *w = n->p[2]; /* weight, or ones when the layer has none */
    const float *mean = n->p[0], *rstd = n->p[1];
    int fresh;
    float *gx = accel__nn_grad_w(g, n->in[0], &fresh);
    float *gw = n->in[1] ? accel__nn_grad(g, n->in[1]) : NULL;
    float *gb = n->in[2] ? accel__nn_grad(g, n->in[2]) : NULL;
    if (gx != NULL) {
        NN_OMP_FOR(rows * C)
        for (int64_t r = 0; r < rows; r++) {
            ln_row_grad(x + r * C, gy + r * C, w, mean[r], rstd[r], C, fresh, gx + r * C);
        }
    }
    if (gw != NULL || gb != NULL) {
        ln_param_grad(x, gy, mean, rstd, rows, C, gw, gb);
    }
}

/* One row of the forward; returns the mean and writes 1/std to *rs_out. */
NN_KERNEL static float ln_row(const float *restrict xr, const float *restrict w,
                              const float *restrict b, int64_t C, float eps, float *restrict yr,
                              float *rs_out)
{
    float s = 0.0f, v = 0.0f;
    NN_SIMD_SUM(s)
    for (int64_t c = 0; c < C; c++) {
        s += xr[c];
    }
    float mu = s / (float)C;
    NN_SIMD_SUM(v)
    for (int64_t c = 0; c < C; c++) {
        v += (xr[c] - mu) * (xr[c] - mu);
    }
    float rs = 1.0f / sqrtf(v / (float)C + eps);
    NN_SIMD
    for (int64_t c = 0; c < C; c++) {
        yr[c] = (xr[c] - mu) * rs * w[c] + b[c];
    }
    *rs_out = rs;
    return mu;
}

static nn_tensor *layernorm_impl(nn_ctx *g, nn_tensor *x, nn_tensor *weight, nn_tensor *bias,
                                 float eps)
{
    if (x == NULL) {
        return NULL;
    }
    /* A weight or bias refused must fail the op, not run it as if it had none; the first
     * refusal's message stands. */
    nn_tensor *weight_in = weight, *bias_in = bias;
    x = accel__nn_contig(g, x, "nn_layernorm", 0);
    weight = weight && x ? accel__nn_contig(g, weight, "nn_layernorm", 1) : NULL;
    bias =
        bias && x && (weight || !weight_in) ? accel__nn_contig(g, bias, "nn_layernorm", 2) : NULL;
    if (x == NULL || (weight_in != NULL && weight == NULL) || (bias_in != NULL && bias == NULL)) {
        return NULL;
    }
    if (x->ndim < 1) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_layernorm: input must be >= 1-D");
    }
    int64_t C = x->shape[x->ndim - 1], rows = C ? nn_numel(x) / C : 0;
    if ((weight && nn_numel(weight) != C) || (bias && nn_numel(bias) != C)) {
        return accel__nn_fail(g, ACCEL_EINVAL,
                              "nn_layernorm: weight/bias must have %lld "
                              "elements",
                              (long long)C);
    }
    nn_tensor *y = accel__nn_new(g, x->ndim, x->shape);
    float *mean = accel__nn_alloc(g, (size_t)rows * sizeof(float));
    float *rstd = accel__nn_alloc(g, (size_t)rows * sizeof(float));
    if (y == NULL || mean == NULL || rstd == NULL) {
        return NULL;
    }
    /* A missing weight/bias becomes ones/zeros so the row loops have no branches. */
    float *w = weight ? weight->data : accel__nn_alloc(g, (size_t)C * sizeof(float));
    float *b = bias ? bias->data : accel__nn_zalloc(g, (size_t)C * sizeof(float));
    if (w == NULL || b == NULL) {
        return NULL;
    }
    if (weight == NULL) {
        for (int64_t c = 0; c < C; c++) {
            w[c] = 1.0f;
        }
    }
    NN_OMP_FOR(rows * C)
    for (int64_t r = 0; r < rows; r++) {
        mean[r] = ln_row(x->data + r * C, w, b, C, eps, y->data + r * C, &rstd[r]);
    }
    nn_tensor *in[3] = {x, weight, bias};
    if (accel__nn_needs_grad(g, in, 3)) {
        nn_node *n = accel__nn_record(g, "layernorm", y, in, 3, ln_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = rows;
        n->i[1] = C;
        n->p[0] = mean;
        n->p[1] = rstd;
        n->p[2] = w;
    }
    return y;
}

nn_tensor *nn_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *weight, nn_tensor *bias, float eps)
{
    if (nn__use_gpu(g, x, weight, bias)) {
        return accel__nn_gpu->layernorm(g, x, weight, bias, eps);
    }
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = layernorm_impl(g, x, weight, bias, eps);
    accel__nn_fp_leave(g, &fs);
    return y;
}

nn_tensor *nn_add_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                            nn_tensor *bias, float eps, nn_tensor **sum)
{
    if (sum == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_add_layernorm: sum is NULL");
    }
    if (nn__use_gpu(g, x, r, weight) || nn__on_gpu(bias)) {
        return accel__nn_gpu->add_layernorm(g, x, r, weight, bias, eps, sum, 0);
    }
    /* Checked as this op's inputs (the two ops would name themselves and number weight, bias
     * as nn_layernorm's inputs 1, 2). */
    if (!accel__nn_inputs_ok(g, "nn_add_layernorm", (nn_tensor *[]){x, r, weight, bias}, 4)) {
        return NULL;
    }
    nn_tensor *s = nn_add(g, x, r);
    nn_tensor *y = nn_layernorm(g, s, weight, bias, eps);
    if (y != NULL) {
        *sum = s;
    }
    return y;
}

nn_tensor *accel__nn_norm_operand(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                                  nn_tensor *bias, float eps, nn_tensor **sum)
{
    if (nn__use_gpu(g, x, r, weight) || nn__on_gpu(bias)) {
        return accel__nn_gpu->add_layernorm(g, x, r, weight, bias, eps, sum, 1);
    }
    return r != NULL ? nn_add_layernorm(g, x, r, weight, bias, eps, sum)
                     : nn_layernorm(g, x, weight, bias, eps);
}

/* ---- embedding ---- */

/* Scatter-add of gradient rows into the table, in row order (repeated ids sum serially). */
NN_KERNEL static void emb_scatter_add(const int32_t *ids, const float *gy, int64_t rows, int64_t C,
                                      float *gw)
{
    for (int64_t r = 0; r < rows; r++) {
        float *dst = gw + (int64_t)ids[r] * C;
        const float *src = gy + r * C;
        NN_SIMD
        for (int64_t c = 0; c < C; c++) {
            dst[c] += src[c];
        }
    }
}

static void emb_backward(nn_ctx *g, nn_node *n)
{
    float *gw = accel__nn_grad(g, n->in[0]);
    if (gw != NULL) {
        emb_scatter_add(n->p[0], n->out->grad, n->i[0], n->i[1], gw);
    }
}

int accel__nn_embedding_args(nn_ctx *g, const nn_tensor *weight, const int32_t *ids, int ndim,
                             const int64_t *shape, int64_t *oshape, int64_t *rows)
{
    if (ids == NULL || weight->ndim != 2 || ndim < 0 || ndim >= NN_MAX_DIMS ||
        (ndim > 0 && shape == NULL)) {
        accel__nn_fail(g, ACCEL_EINVAL,
                       "nn_embedding: need 2-D weight, ids and an "
                       "id shape of 0..%d dims",
                       NN_MAX_DIMS - 1);
        return 0;
    }
    int64_t V = weight->shape[0];
    *rows = 1;
    for (int d = 0; d < ndim; d++) {
        /* A negative size or a count that wraps would check too few ids (or none). */
        if (shape[d] < 0 || (shape[d] > 0 && *rows > INT64_MAX / shape[d])) {
            accel__nn_fail(g, ACCEL_EINVAL, "nn_embedding: id shape dim %d of size %lld %s", d,
                           (long long)shape[d],
                           shape[d] < 0 ? "is negative" : "overflows the id count");
            return 0;
        }
        *rows *= shape[d];
        oshape[d] = shape[d];
    }
    oshape[ndim] = weight->shape[1];
    for (int64_t r = 0; r < *rows; r++) {
        if (ids[r] < 0 || ids[r] >= V) {
            accel__nn_fail(g, ACCEL_EINVAL,
                           "nn_embedding: id %d at position %lld outside [0, %lld)",
                           (int)ids[r], (long long)r, (long long)V);
            return 0;
        }
    }
    return 1;
}

nn_tensor *nn_embedding(nn_ctx *g, nn_tensor *weight, const int32_t *ids, int ndim,
                        const int64_t *shape)
{
    if (weight == NULL) {
        return NULL;
    }
    if (nn__use_gpu(g, weight, NULL, NULL)) {
        return accel__nn_gpu->embedding(g, weight, ids, ndim, shape);
    }
    /* The input checked first, as on a GPU (and a NULL ctx before the note below reads it). */
    if (!accel__nn_input_ok(g, "nn_embedding", 0, weight)) {
        return NULL;
    }
    if (weight->sink_compute != NULL) {
        accel__nn_autocast_note(g, weight); /* a model's forward usually starts here */
    }
    int64_t oshape[NN_MAX_DIMS], rows;
    if (!accel__nn_embedding_args(g, weight, ids, ndim, shape, oshape, &rows)) {
        return NULL;
    }
    weight = accel__nn_contig(g, weight, "nn_embedding", 0);
    if (weight == NULL) {
        return NULL;
    }
    int64_t C = weight->shape[1];
    nn_tensor *y = accel__nn_new(g, ndim + 1, oshape);
    int32_t *idc = accel__nn_alloc(g, (size_t)rows * sizeof(int32_t));
    if (y == NULL || idc == NULL) {
        return NULL;
    }
    memcpy(idc, ids, (size_t)rows * sizeof(int32_t));
    NN_OMP_FOR(rows * C)
    for (int64_t r = 0; r < rows; r++) {
        memcpy(y->data + r * C, weight->data + (int64_t)idc[r] * C, (size_t)C * sizeof(float));
    }
    if (accel__nn_needs_grad(g, &weight, 1)) {
        nn_node *n = accel__nn_record(g, "embedding", y, &weight, 1, emb_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = rows;
        n->i[1] = C;
        n->p[0] = idc;
    }
    return y;
}
