/*
 * Elementwise ops and reductions: add/sub/mul/div with leading-dim broadcasting, scale,
 * relu/gelu/tanh/sigmoid, sum/mean over a dim, dropout, mse_loss.
 *
 * Broadcasting is kept to the one form transformers need (the smaller operand's shape is a
 * suffix of the larger's), which makes every kernel a (rows x inner) loop: the big operand
 * is indexed r*inner + j, the small one j. Loops are branch-free and marked NN_SIMD so they
 * vectorise, and row loops are OpenMP-parallel above a size threshold.
 */
#include "nn_gpu.h"

/* ---- binary ---- */

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV };
static const char *const binop_names[] = {"add", "sub", "mul", "div"};
/* The public names, for messages. */
static const char *const binop_ops[] = {"nn_add", "nn_sub", "nn_mul", "nn_div"};

/* A operand's row stride: inner when it is the big one, 0 when broadcast. */
typedef struct bshape {
    int64_t rows, inner, sa, sb;
} bshape;

NN_KERNEL static void bin_row(int op, const float *restrict a, const float *restrict b,
                              float *restrict y, int64_t n)
{
    switch (op) {
    case OP_ADD:
        NN_SIMD
        for (int64_t j = 0; j < n; j++) {
            y[j] = a[j] + b[j];
        }
        break;
    case OP_SUB:
        NN_SIMD
        for (int64_t j = 0; j < n; j++) {
            y[j] = a[j] - b[j];
        }
        break;
    case OP_MUL:
        NN_SIMD
        for (int64_t j = 0; j < n; j++) {
            y[j] = a[j] * b[j];
        }
        break;
    default:
        NN_SIMD
        for (int64_t j = 0; j < n; j++) {
            y[j] = a[j] / b[j];
        }
        break;
    }
}

static void bin_forward(int op, const float *a, const float *b, float *y, bshape s)
{
    NN_OMP_FOR(s.rows * s.inner)
    for (int64_t r = 0; r < s.rows; r++) {
        bin_row(op, a + r * s.sa, b + r * s.sb, y + r * s.inner, s.inner);
    }
}

/* t (+)= d(op)/d(side) * gy over one row; `write` overwrites t instead of adding. a and b are
 * the row's operands (either may be the broadcast one). */
NN_KERNEL static void bin_grad_row(int op, int side, int write, const float *restrict a,
                                   const float *restrict b, const float *restrict gr,
                                   float *restrict t, int64_t n)
{
    float sign = (op == OP_SUB && side == 1) ? -1.0f : 1.0f;
    if (op == OP_ADD || op == OP_SUB) {
        if (write) {
            NN_SIMD
            for (int64_t j = 0; j < n; j++) {
                t[j] = sign * gr[j];
            }
        } else {
            NN_SIMD
            for (int64_t j = 0; j < n; j++) {
                t[j] += sign * gr[j];
            }
        }
    } else if (op == OP_MUL) {
        const float *o = side == 0 ? b : a;
        if (write) {
            NN_SIMD
            for (int64_t j = 0; j < n; j++) {
                t[j] = gr[j] * o[j];
            }
        } else {
            NN_SIMD
            for (int64_t j = 0; j < n; j++) {
                t[j] += gr[j] * o[j];
            }
        }
    } else if (side == 0) {
        NN_SIMD
        for (int64_t j = 0; j < n; j++) {
            t[j] = (write ? 0.0f : t[j]) + gr[j] / b[j];
        }
    } else {
        NN_SIMD
        for (int64_t j = 0; j < n; j++) {
            t[j] = (write ? 0.0f : t[j]) - gr[j] * a[j] / (b[j] * b[j]);
        }
    }
}

/* Accumulates d(op)/d(a or b) * gy into ga / gb. A broadcast operand (stride 0) sums over
 * rows, so those rows are walked serially to keep the sum race-free. A full-size operand whose
 * gradient is fresh (first contribution) is written rather than zeroed and added to. */
static void bin_backward(nn_ctx *g, nn_node *n)
{
    int op = (int)n->i[0];
    bshape s = {n->i[1], n->i[2], n->i[3], n->i[4]};
    const float *a = n->in[0]->data, *b = n->in[1]->data, *gy = n->out->grad;
    for (int side = 0; side < 2; side++) {
        int64_t st = side == 0 ? s.sa : s.sb;
        int fresh = 0;
        float *gt =
            st != 0 ? accel__nn_grad_w(g, n->in[side], &fresh) : accel__nn_grad(g, n->in[side]);
        if (gt == NULL) {
            continue;
        }
        int parallel = st != 0;
        (void)parallel;
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (parallel && s.rows * s.inner > 32768)
#endif
        for (int64_t r = 0; r < s.rows; r++) {
            bin_grad_row(op, side, fresh, a + r * s.sa, b + r * s.sb, gy + r * s.inner, gt + r * st,
                         s.inner);
        }
    }
}

int accel__nn_is_suffix(const nn_tensor *small, const nn_tensor *big)
{
    if (nn_numel(small) == 1 && nn_numel(big) >= 1) {
        return 1;
    }
    if (small->ndim > big->ndim) {
        return 0;
    }
    for (int d = 0; d < small->ndim; d++) {
        if (small->shape[small->ndim - 1 - d] != big->shape[big->ndim - 1 - d]) {
            return 0;
        }
    }
    return 1;
}

static nn_tensor *binop_impl(nn_ctx *g, int op, nn_tensor *a, nn_tensor *b)
{
    if (a == NULL || b == NULL) {
        return NULL;
    }
    a = accel__nn_contig(g, a, binop_ops[op], 0);
    b = a != NULL ? accel__nn_contig(g, b, binop_ops[op], 1) : NULL; /* a's message stands */
    if (a == NULL || b == NULL) {
        return NULL;
    }
    int64_t na = nn_numel(a), nb = nn_numel(b);
    /* On equal sizes the operand with more dims gives the output shape ([T,C] + [1,T,C]). */
    int a_big = na > nb || (na == nb && a->ndim >= b->ndim);
    const nn_tensor *big = a_big ? a : b, *small = a_big ? b : a;
    if (!accel__nn_is_suffix(small, big)) {
        char s1[64], s2[64];
        return accel__nn_fail(g, ACCEL_EINVAL,
                              "nn_%s: shapes %s and %s do not broadcast (the smaller must be "
                              "the trailing dims of the larger)",
                              binop_names[op], accel__nn_shape_str(a, s1, sizeof(s1)),
                              accel__nn_shape_str(b, s2, sizeof(s2)));
    }
    bshape s;
    s.inner = nn_numel(small);
    if (na == nb && big->ndim > 0) {
        /* Same size: rows of the last dim, so the row loop has parallelism. */
        s.inner = big->shape[big->ndim - 1];
    }
    s.rows = s.inner ? nn_numel(big) / s.inner : 0;
    s.sa = na >= nb ? s.inner : 0;
    s.sb = nb >= na ? s.inner : 0;
    nn_tensor *y = accel__nn_new(g, big->ndim, big->shape);
    if (y == NULL) {
        return NULL;
    }
    bin_forward(op, a->data, b->data, y->data, s);
    nn_tensor *in[2] = {a, b};
    if (accel__nn_needs_grad(g, in, 2)) {
        nn_node *n = accel__nn_record(g, binop_names[op], y, in, 2, bin_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = op;
        n->i[1] = s.rows;
        n->i[2] = s.inner;
        n->i[3] = s.sa;
        n->i[4] = s.sb;
    }
    return y;
}

static nn_tensor *binop(nn_ctx *g, int op, nn_tensor *a, nn_tensor *b)
{
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = binop_impl(g, op, a, b);
    accel__nn_fp_leave(g, &fs);
    return y;
}

nn_tensor *nn_add(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    if (nn__use_gpu(g, a, b, NULL)) {
        return accel__nn_gpu->add(g, a, b);
    }
    return binop(g, OP_ADD, a, b);
}

nn_tensor *nn_sub(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    NN_CPU_ONLY(g, "nn_sub", a, b);
    return binop(g, OP_SUB, a, b);
}

nn_tensor *nn_mul(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    NN_CPU_ONLY(g, "nn_mul", a, b);
    return binop(g, OP_MUL, a, b);
}

nn_tensor *nn_div(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    NN_CPU_ONLY(g, "nn_div", a, b);
    return binop(g, OP_DIV, a, b);
}

/* ---- unary ---- */

static const char *const unary_names[] = {"scale", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};
static const char *const unary_ops[] = {"nn_scale", "nn_relu", "nn_gelu",
                                        "nn_gelu",  "nn_tanh", "nn_sigmoid"};

#define NN_SQRT_2_OVER_PI 0.7978845608028654f
#define NN_GELU_C 0.044715f

NN_KERNEL static void unary_fwd_range(int op, float s, const float *restrict x, float *restrict y,
                                      int64_t n)
{
    switch (op) {
    case U_SCALE:
        NN_SIMD
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i] * s;
        }
        break;
    case U_RELU:
        NN_SIMD
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        }
        break;
    case U_GELU:
        NN_SIMD
        for (int64_t i = 0; i < n; i++) {
            y[i] = 0.5f * x[i] * (1.0f + nn__erff(x[i] * 0.70710678118654752f));
        }
        break;
    case U_GELU_TANH:
        NN_SIMD
        for (int64_t i = 0; i < n; i++) {
            float u = NN_SQRT_2_OVER_PI * (x[i] + NN_GELU_C * x[i] * x[i] * x[i]);
            y[i] = 0.5f * x[i] * (1.0f + nn__tanhf(u));
        }
        break;
    case U_TANH:
        NN_SIMD
        for (int64_t i = 0; i < n; i++) {
            y[i] = nn__tanhf(x[i]);
        }
        break;
    default:
        NN_SIMD
        for (int64_t i = 0; i < n; i++) {
            y[i] = nn__sigmoidf(x[i]);
        }
        break;
    }
}

void accel__nn_act_forward(int op, float s, const float *x, float *y, int64_t n)
{
    NN_OMP_FOR(n)
    for (int64_t c = 0; c < n; c += 4096) {
        unary_fwd_range(op, s, x + c, y + c, c + 4096 < n ? 4096 : n - c);
    }
}

/* tanh-approximation GELU's derivative. */
static inline float gelu_tanh_grad(float x)
{
    float x2 = x * x;
    float t = nn__tanhf(NN_SQRT_2_OVER_PI * (x + NN_GELU_C * x2 * x));
    float du = NN_SQRT_2_OVER_PI * (1.0f + 3.0f * NN_GELU_C * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* gx = expr (write) or gx += expr, over i in [0, n). */
#define ACT_GRAD_LOOP(expr)                                                                        \
    do {                                                                                           \
        if (write) {                                                                               \
            NN_SIMD                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                      \
                gx[i] = (expr);                                                                    \
            }                                                                                      \
        } else {                                                                                   \
            NN_SIMD                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                      \
                gx[i] += (expr);                                                                   \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* d(op)/dx * gy into gx: written when `write`, else added. */
NN_KERNEL static void unary_bwd_range(int op, float s, int write, const float *restrict x,
                                      const float *restrict y, const float *restrict gy,
                                      float *restrict gx, int64_t n)
{
    switch (op) {
    case U_SCALE:
        ACT_GRAD_LOOP(gy[i] * s);
        break;
    case U_RELU:
        ACT_GRAD_LOOP(gy[i] * (x[i] > 0.0f ? 1.0f : 0.0f));
        break;
    case U_GELU:
        ACT_GRAD_LOOP(gy[i] * nn__gelu_grad(x[i]));
        break;
    case U_GELU_TANH:
        ACT_GRAD_LOOP(gy[i] * gelu_tanh_grad(x[i]));
        break;
    case U_TANH:
        ACT_GRAD_LOOP(gy[i] * (1.0f - y[i] * y[i]));
        break;
    default:
        ACT_GRAD_LOOP(gy[i] * y[i] * (1.0f - y[i]));
        break;
    }
}

void accel__nn_act_backward(int op, float s, int write, const float *x, const float *y,
                            const float *gy, float *gx, int64_t n)
{
    NN_OMP_FOR(n)
    for (int64_t c = 0; c < n; c += 4096) {
        unary_bwd_range(op, s, write, x + c, y ? y + c : NULL, gy + c, gx + c,
                        c + 4096 < n ? 4096 : n - c);
    }
}

static void unary_backward(nn_ctx *g, nn_node *n)
{
    int fresh;
    float *gx = accel__nn_grad_w(g, n->in[0], &fresh);
    if (gx != NULL) {
        accel__nn_act_backward((int)n->i[0], n->f[0], fresh, n->in[0]->data, n->out->data,
                               n->out->grad, gx, nn_numel(n->out));
    }
}

static nn_tensor *unary_impl(nn_ctx *g, int op, nn_tensor *x, float s)
{
    if (x == NULL) {
        return NULL;
    }
    x = accel__nn_contig(g, x, unary_ops[op], 0);
    nn_tensor *y = x ? accel__nn_new(g, x->ndim, x->shape) : NULL;
    if (y == NULL) {
        return NULL;
    }
    accel__nn_act_forward(op, s, x->data, y->data, nn_numel(x));
    if (accel__nn_needs_grad(g, &x, 1)) {
        nn_node *n = accel__nn_record(g, unary_names[op], y, &x, 1, unary_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = op;
        n->f[0] = s;
    }
    return y;
}

static nn_tensor *unary(nn_ctx *g, int op, nn_tensor *x, float s)
{
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = unary_impl(g, op, x, s);
    accel__nn_fp_leave(g, &fs);
    return y;
}

nn_tensor *nn_scale(nn_ctx *g, nn_tensor *x, float s)
{
    NN_CPU_ONLY(g, "nn_scale", x);
    return unary(g, U_SCALE, x, s);
}

nn_tensor *nn_relu(nn_ctx *g, nn_tensor *x)
{
    NN_CPU_ONLY(g, "nn_relu", x);
    return unary(g, U_RELU, x, 0.0f);
}

nn_tensor *nn_gelu(nn_ctx *g, nn_tensor *x, int approximate)
{
    if (nn__use_gpu(g, x, NULL, NULL)) {
        return accel__nn_gpu->gelu(g, x, approximate);
    }
    return unary(g, approximate ? U_GELU_TANH : U_GELU, x, 0.0f);
}

nn_tensor *nn_tanh(nn_ctx *g, nn_tensor *x)
{
    NN_CPU_ONLY(g, "nn_tanh", x);
    return unary(g, U_TANH, x, 0.0f);
}

nn_tensor *nn_sigmoid(nn_ctx *g, nn_tensor *x)
{
    NN_CPU_ONLY(g, "nn_sigmoid", x);
    return unary(g, U_SIGMOID, x, 0.0f);
}

/* ---- sum / mean over a dim, as (outer, len, inner) ---- */

static void reduce_backward(nn_ctx *g, nn_node *n)
{
    int64_t outer = n->i[0], len = n->i[1], inner = n->i[2];
    float s = n->f[0];
    const float *gy = n->out->grad;
    float *gx = accel__nn_grad(g, n->in[0]);
    if (gx == NULL) {
        return;
    }
    NN_OMP_FOR(outer * len * inner)
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t l = 0; l < len; l++) {
            float *gr = gx + (o * len + l) * inner;
            const float *yr = gy + o * inner;
            NN_SIMD
            for (int64_t j = 0; j < inner; j++) {
                gr[j] += yr[j] * s;
            }
        }
    }
}

static nn_tensor *reduce_impl(nn_ctx *g, nn_tensor *x, int dim, int keepdim, int mean, int all)
{
    if (x == NULL) {
        return NULL;
    }
    x = accel__nn_contig(g, x, all ? "nn_sum_all" : mean ? "nn_mean" : "nn_sum", 0);
    if (x == NULL) {
        return NULL;
    }
    int64_t outer = 1, len = nn_numel(x), inner = 1;
    int64_t shape[NN_MAX_DIMS];
    int ndim = 0;
    if (!all) {
        int d = accel__nn_dim(x, dim);
        if (d < 0) {
            return accel__nn_fail(g, ACCEL_EINVAL, "nn_%s: dim %d out of range for %d-D input",
                                  mean ? "mean" : "sum", dim, x->ndim);
        }
        for (int e = 0; e < x->ndim; e++) {
            if (e < d) {
                outer *= x->shape[e];
            } else if (e > d) {
                inner *= x->shape[e];
            }
            if (e != d || keepdim) {
                shape[ndim++] = e == d ? 1 : x->shape[e];
            }
        }
        len = x->shape[d];
    }
    nn_tensor *y = accel__nn_new(g, ndim, shape);
    if (y == NULL) {
        return NULL;
    }
    float s = mean ? 1.0f / (float)len : 1.0f;
    NN_OMP_FOR(outer * len * inner)
    for (int64_t o = 0; o < outer; o++) {
        float *yr = y->data + o * inner;
        for (int64_t j = 0; j < inner; j++) {
            yr[j] = 0.0f;
        }
        for (int64_t l = 0; l < len; l++) {
            const float *xr = x->data + (o * len + l) * inner;
            NN_SIMD
            for (int64_t j = 0; j < inner; j++) {
                yr[j] += xr[j];
            }
        }
        NN_SIMD
        for (int64_t j = 0; j < inner; j++) {
            yr[j] *= s;
        }
    }
    if (accel__nn_needs_grad(g, &x, 1)) {
        nn_node *n = accel__nn_record(g, mean ? "mean" : "sum", y, &x, 1, reduce_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = outer;
        n->i[1] = len;
        n->i[2] = inner;
        n->f[0] = s;
    }
    return y;
}

static nn_tensor *reduce(nn_ctx *g, nn_tensor *x, int dim, int keepdim, int mean, int all)
{
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = reduce_impl(g, x, dim, keepdim, mean, all);
    accel__nn_fp_leave(g, &fs);
    return y;
}

nn_tensor *nn_sum(nn_ctx *g, nn_tensor *x, int dim, int keepdim)
{
    NN_CPU_ONLY(g, "nn_sum", x);
    return reduce(g, x, dim, keepdim, 0, 0);
}

nn_tensor *nn_mean(nn_ctx *g, nn_tensor *x, int dim, int keepdim)
{
    NN_CPU_ONLY(g, "nn_mean", x);
    return reduce(g, x, dim, keepdim, 1, 0);
}

nn_tensor *nn_sum_all(nn_ctx *g, nn_tensor *x)
{
    NN_CPU_ONLY(g, "nn_sum_all", x);
    return reduce(g, x, 0, 0, 0, 1);
}

/* ---- dropout: the mask is recomputed in backward from its counter-based key ---- */

static void dropout_apply(uint64_t key, float p, const float *src, float *dst, int64_t n,
                          int accumulate)
{
    float keep_scale = 1.0f / (1.0f - p);
    NN_OMP_FOR(n)
    for (int64_t i = 0; i < n; i++) {
        float m = nn__uniform(key, (uint64_t)i) >= p ? keep_scale : 0.0f;
        dst[i] = (accumulate ? dst[i] : 0.0f) + src[i] * m;
    }
}

static void dropout_backward(nn_ctx *g, nn_node *n)
{
    float *gx = accel__nn_grad(g, n->in[0]);
    if (gx != NULL) {
        uint64_t key = (uint64_t)n->i[0];
        dropout_apply(key, n->f[0], n->out->grad, gx, nn_numel(n->out), 1);
    }
}

nn_tensor *nn_dropout(nn_ctx *g, nn_tensor *x, float p)
{
    if (nn__use_gpu(g, x, NULL, NULL)) {
        return accel__nn_gpu->dropout(g, x, p);
    }
    if (g == NULL) {
        return accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", "nn_dropout");
    }
    if (x == NULL) {
        return NULL;
    }
    uint64_t op_index = g->op_counter++;
    if (!(p >= 0.0f && p < 1.0f)) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_dropout: p = %g not in [0, 1)", (double)p);
    }
    /* Checked before the identity returns x: a stale x must not pass through. */
    if (!accel__nn_input_ok(g, "nn_dropout", 0, x)) {
        return NULL;
    }
    if (!g->training || p == 0.0f) {
        return x;
    }
    x = accel__nn_contig(g, x, "nn_dropout", 0);
    nn_tensor *y = x ? accel__nn_new(g, x->ndim, x->shape) : NULL;
    if (y == NULL) {
        return NULL;
    }
    uint64_t key = nn__key3(g->seed, g->step, op_index);
    dropout_apply(key, p, x->data, y->data, nn_numel(x), 0);
    if (accel__nn_needs_grad(g, &x, 1)) {
        nn_node *n = accel__nn_record(g, "dropout", y, &x, 1, dropout_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = (int64_t)key;
        n->f[0] = p;
    }
    return y;
}

/* ---- mse_loss ---- */

static void mse_backward(nn_ctx *g, nn_node *n)
{
    const float *a = n->in[0]->data, *b = n->in[1]->data, *gy = n->out->grad;
    int64_t len = nn_numel(n->in[0]);
    int none = n->i[0] == NN_REDUCTION_NONE;
    float s = n->f[0];
    float *ga = accel__nn_grad(g, n->in[0]);
    float *gb = accel__nn_grad(g, n->in[1]);
    for (int64_t i = 0; i < len; i++) {
        float d = 2.0f * (a[i] - b[i]) * s * (none ? gy[i] : gy[0]);
        if (ga != NULL) {
            ga[i] += d;
        }
        if (gb != NULL) {
            gb[i] -= d;
        }
    }
}

static nn_tensor *mse_impl(nn_ctx *g, nn_tensor *input, nn_tensor *target, nn_reduction reduction)
{
    if (input == NULL || target == NULL) {
        return NULL;
    }
    input = accel__nn_contig(g, input, "nn_mse_loss", 0);
    target = input != NULL ? accel__nn_contig(g, target, "nn_mse_loss", 1) : NULL;
    if (input == NULL || target == NULL) {
        return NULL;
    }
    if (!accel__nn_same_shape(input, target)) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_mse_loss: input and target shapes differ");
    }
    if (reduction < NN_REDUCTION_MEAN || reduction > NN_REDUCTION_NONE) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_mse_loss: invalid reduction %d", (int)reduction);
    }
    int64_t len = nn_numel(input);
    nn_tensor *y = reduction == NN_REDUCTION_NONE ? accel__nn_new(g, input->ndim, input->shape)
                                                  : accel__nn_new(g, 0, NULL);
    if (y == NULL) {
        return NULL;
    }
    double acc = 0.0;
    for (int64_t i = 0; i < len; i++) {
        float d = input->data[i] - target->data[i];
        if (reduction == NN_REDUCTION_NONE) {
            y->data[i] = d * d;
        } else {
            acc += (double)d * d;
        }
    }
    float s = reduction == NN_REDUCTION_MEAN ? 1.0f / (float)len : 1.0f;
    if (reduction != NN_REDUCTION_NONE) {
        y->data[0] = (float)(acc * s);
    }
    nn_tensor *in[2] = {input, target};
    if (accel__nn_needs_grad(g, in, 2)) {
        nn_node *n = accel__nn_record(g, "mse_loss", y, in, 2, mse_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = reduction;
        n->f[0] = s;
    }
    return y;
}

nn_tensor *nn_mse_loss(nn_ctx *g, nn_tensor *input, nn_tensor *target, nn_reduction reduction)
{
    NN_CPU_ONLY(g, "nn_mse_loss", input, target);
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tensor *y = mse_impl(g, input, target, reduction);
    accel__nn_fp_leave(g, &fs);
    return y;
}
