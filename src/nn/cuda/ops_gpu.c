/*
 * The nn ops on CUDA tensors, except linear (linear_gpu.c): residual add, GELU, dropout,
 * embedding, LayerNorm, fused softmax + cross entropy and fused causal attention. Each one
 * validates as its CPU twin does (same messages), runs the kernels of nn_kernels.h, and
 * records a backward that runs on the GPU too. Dropout (also inside attention) draws the
 * CPU's counter-based mask, so the same seed, step and op drop the same elements on both.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "gpu_internal.h"

/* ---- add: same shapes, or the smaller operand the trailing dims of the larger ---- */

static void add_backward(nn_ctx *g, nn_node *n)
{
    int64_t ny = nn_numel(n->out);
    const float *gy = n->out->grad;
    for (int side = 0; side < 2; side++) {
        nn_tensor *t = n->in[side];
        int64_t nt = nn_numel(t);
        /* A same-shape addend's gradient is dY itself: borrowed, not copied (both sides may
         * share it; whoever adds to one first gives it its own memory: LayerNorm's backward
         * starts from dY). ACCEL_NN_SHADOW=0 copies, as before (A/B timing). */
        if (nt == ny && ny > 0 && accel__nn_cu_shadows_on() &&
            accel__nn_grad_borrow(g, t, n->out->grad)) {
            if (n->out->grad_shadow != NULL && n->out->grad_shadow_rnd == t->grad_shadow_rnd) {
                t->grad_shadow = n->out->grad_shadow; /* dY's shadow is t's gradient's too */
            }
            continue;
        }
        int fresh = 0;
        float *gt = nt == ny ? accel__nn_grad_w(g, t, &fresh) : accel__nn_grad(g, t);
        if (gt == NULL) {
            continue;
        }
        int64_t rows = nt ? ny / nt : 0;
        float *part = NULL;
        if (nt != ny && !accel__nn_cu_sum_parts(g, rows, nt, 1, &part)) {
            return;
        }
        /* A linear's output (the residual branch) gets its gradient rounded too, in this
         * pass, for that linear's backward products (its grad_shadow_rnd asks for it). */
        void *h = nt == ny && ny > 0 ? accel__nn_cu_grad_shadow_alloc(g, t) : NULL;
        if (h == NULL && g->first_err != ACCEL_OK) {
            return;
        }
        cudaStream_t cs = nn__cu_stream(g);
        cudaError_t e = h != NULL  ? nn_cu_acc_shadow(cs, gt, gy, ny, fresh, h, t->grad_shadow_rnd)
                        : nt == ny ? nn_cu_acc(cs, gt, gy, ny, 0, fresh)
                                   : nn_cu_col_sum(cs, gy, 0, rows, nt, gt, 0, 0, part);
        if (!accel__nn_cu_ok(g, e, "nn_add (backward)")) {
            return;
        }
        t->grad_shadow = h;
    }
}

/* y = a + b: an addend of y's shape borrows y's gradient in backward (add_backward), with its
 * shadow, so y's gradient is wanted rounded wherever an addend's is (a linear's output: the
 * residual branch), which LayerNorm's backward then writes. */
static void want_shadow_of_sum(nn_tensor *y, const nn_tensor *a, const nn_tensor *b)
{
    int64_t ny = nn_numel(y);
    int ra = nn_numel(a) == ny ? a->grad_shadow_rnd : 0,
        rb = nn_numel(b) == ny ? b->grad_shadow_rnd : 0;
    if (accel__nn_cu_shadows_on() && (ra != 0 || rb != 0)) {
        y->grad_shadow_rnd = ra != 0 ? ra : rb;
    }
}

nn_tensor *accel__nn_cu_add(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    if (a == NULL || b == NULL) {
        return NULL;
    }
    nn_tensor *in[2] = {a, b};
    if (!accel__nn_cu_inputs(g, "nn_add", in, 2)) {
        return NULL;
    }
    int64_t na = nn_numel(a), nb = nn_numel(b);
    int a_big = na > nb || (na == nb && a->ndim >= b->ndim);
    const nn_tensor *big = a_big ? a : b, *small = a_big ? b : a;
    if (!accel__nn_is_suffix(small, big)) {
        char s1[64], s2[64];
        return accel__nn_fail(g, ACCEL_EINVAL,
                              "nn_add: shapes %s and %s do not broadcast (the smaller must be "
                              "the trailing dims of the larger)",
                              accel__nn_shape_str(a, s1, sizeof(s1)),
                              accel__nn_shape_str(b, s2, sizeof(s2)));
    }
    nn_tensor *y = accel__nn_new(g, big->ndim, big->shape);
    if (y == NULL) {
        return NULL;
    }
    if (nn_numel(y) > 0 &&
        !accel__nn_cu_ok(g, nn_cu_add(nn__cu_stream(g), a->data, na, b->data, nb, y->data),
                         "nn_add")) {
        return NULL;
    }
    if (accel__nn_needs_grad(g, in, 2) && !accel__nn_record(g, "add", y, in, 2, add_backward)) {
        return NULL;
    }
    want_shadow_of_sum(y, a, b);
    return y;
}

/* ---- GELU ---- */

static void gelu_backward(nn_ctx *g, nn_node *n)
{
    int fresh;
    float *gx = accel__nn_grad_w(g, n->in[0], &fresh);
    if (gx != NULL) {
        accel__nn_cu_ok(g,
                        nn_cu_gelu_bwd(nn__cu_stream(g), n->in[0]->data, n->out->grad, gx,
                                       nn_numel(n->out), (int)n->i[0], fresh),
                        "nn_gelu (backward)");
    }
}

nn_tensor *accel__nn_cu_gelu(nn_ctx *g, nn_tensor *x, int approximate)
{
    if (x == NULL || !accel__nn_cu_inputs(g, "nn_gelu", &x, 1)) {
        return NULL;
    }
    nn_tensor *y = accel__nn_new(g, x->ndim, x->shape);
    int64_t n = y ? nn_numel(y) : 0;
    if (y == NULL ||
        (n > 0 &&
         !accel__nn_cu_ok(g, nn_cu_gelu(nn__cu_stream(g), x->data, y->data, n, approximate != 0),
                          "nn_gelu"))) {
        return NULL;
    }
    if (accel__nn_needs_grad(g, &x, 1)) {
        nn_node *nd =
            accel__nn_record(g, approximate ? "gelu_tanh" : "gelu", y, &x, 1, gelu_backward);
        if (nd == NULL) {
            return NULL;
        }
        nd->i[0] = approximate != 0;
    }
    return y;
}

/* ---- dropout ---- */

static void dropout_backward(nn_ctx *g, nn_node *n)
{
    float *gx = accel__nn_grad(g, n->in[0]);
    if (gx != NULL) {
        accel__nn_cu_ok(g,
                        nn_cu_dropout(nn__cu_stream(g), (uint64_t)n->i[0], n->f[0], n->out->grad,
                                      gx, nn_numel(n->out), 0),
                        "nn_dropout (backward)");
    }
}

nn_tensor *accel__nn_cu_dropout(nn_ctx *g, nn_tensor *x, float p)
{
    if (x == NULL || !accel__nn_cu_inputs(g, "nn_dropout", &x, 1)) {
        return NULL;
    }
    uint64_t op_index = g->op_counter++; /* as the CPU op counts, so the masks agree */
    if (!(p >= 0.0f && p < 1.0f)) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_dropout: p = %g not in [0, 1)", (double)p);
    }
    if (!g->training || p == 0.0f) {
        return x;
    }
    nn_tensor *y = accel__nn_new(g, x->ndim, x->shape);
    if (y == NULL) {
        return NULL;
    }
    uint64_t key = nn__key3(g->seed, g->step, op_index);
    int64_t n = nn_numel(x);
    if (n > 0 &&
        !accel__nn_cu_ok(g, nn_cu_dropout(nn__cu_stream(g), key, p, x->data, y->data, n, 1),
                         "nn_dropout")) {
        return NULL;
    }
    if (accel__nn_needs_grad(g, &x, 1)) {
        nn_node *nd = accel__nn_record(g, "dropout", y, &x, 1, dropout_backward);
        if (nd == NULL) {
            return NULL;
        }
        nd->i[0] = (int64_t)key;
        nd->f[0] = p;
    }
    return y;
}

/* ---- embedding ---- */

/* The ids grouped by value for the backward scatter (a stable counting sort on the host, whose
 * ids these are), staged to the device: [order: the rows, by id then row | start: nd + 1
 * offsets into order | id: the nd distinct ids, ascending]. NULL and the ctx error on failure. */
static int32_t *emb_groups(nn_ctx *g, const int32_t *ids, int64_t rows, int64_t V, int64_t *nd)
{
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    int32_t *cnt = accel__nn_tmp_alloc(g, (size_t)(V + 1) * sizeof(int32_t));
    int32_t *h = accel__nn_tmp_alloc(g, (size_t)(3 * rows + 1) * sizeof(int32_t));
    int32_t *dev = NULL;
    if (cnt != NULL && h != NULL) {
        memset(cnt, 0, (size_t)(V + 1) * sizeof(int32_t));
        for (int64_t r = 0; r < rows; r++) {
            cnt[ids[r] + 1]++;
        }
        int64_t n = 0;
        int32_t *start = h + rows, *gid = NULL;
        for (int64_t v = 0; v < V; v++) { /* cnt[v]: where id v's rows begin */
            if (cnt[v + 1] > 0) {
                start[n++] = cnt[v];
            }
            cnt[v + 1] += cnt[v];
        }
        start[n] = (int32_t)rows;
        gid = start + n + 1;
        for (int64_t v = 0, k = 0; v < V; v++) {
            if (cnt[v + 1] > cnt[v]) {
                gid[k++] = (int32_t)v;
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            h[cnt[ids[r]]++] = (int32_t)r;
        }
        *nd = n;
        dev = accel__nn_cu_ints(g, h, rows + 2 * n + 1, "nn_embedding");
    }
    accel__nn_tmp_release(g, tm);
    return dev;
}

static void emb_backward(nn_ctx *g, nn_node *n)
{
    float *gw = accel__nn_grad(g, n->in[0]);
    int64_t rows = n->i[0], nd = n->i[2];
    if (gw != NULL && nd > 0) {
        const int32_t *grp = n->p[1];
        accel__nn_cu_ok(g,
                        nn_cu_embedding_bwd(nn__cu_stream(g), grp, grp + rows, grp + rows + nd + 1,
                                            nd, n->out->grad, n->i[1], gw),
                        "nn_embedding (backward)");
    }
}

nn_tensor *accel__nn_cu_embedding(nn_ctx *g, nn_tensor *weight, const int32_t *ids, int ndim,
                                  const int64_t *shape)
{
    if (weight == NULL || !accel__nn_cu_inputs(g, "nn_embedding", &weight, 1)) {
        return NULL;
    }
    int64_t oshape[NN_MAX_DIMS], rows;
    if (!accel__nn_embedding_args(g, weight, ids, ndim, shape, oshape, &rows)) {
        return NULL;
    }
    int64_t C = weight->shape[1];
    nn_tensor *y = accel__nn_new(g, ndim + 1, oshape);
    int32_t *idc = y ? accel__nn_cu_ints(g, ids, rows, "nn_embedding") : NULL;
    if (idc == NULL) {
        return NULL;
    }
    if (rows * C > 0 &&
        !accel__nn_cu_ok(g, nn_cu_embedding(nn__cu_stream(g), weight->data, idc, y->data, rows, C),
                         "nn_embedding")) {
        return NULL;
    }
    if (accel__nn_needs_grad(g, &weight, 1)) {
        int64_t nd = 0;
        int32_t *grp = emb_groups(g, ids, rows, weight->shape[0], &nd);
        nn_node *n = grp ? accel__nn_record(g, "embedding", y, &weight, 1, emb_backward) : NULL;
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = rows;
        n->i[1] = C;
        n->i[2] = nd;
        n->p[1] = grp;
    }
    return y;
}

/* ---- LayerNorm: saves mean and 1/std per row ---- */

static void ln_backward(nn_ctx *g, nn_node *n)
{
    int64_t rows = n->i[0], C = n->i[1];
    int fresh;
    const float *gbase; /* a residual add's dY, borrowed: gx = gbase + the gradient */
    nn_tensor *x = n->in[0];
    float *gx = accel__nn_grad_take(g, x, &fresh, &gbase);
    /* The residual stream's gradient, rounded too when a branch's product will read it (the
     * add's inputs borrow it with its shadow): a 2-byte store here, no pass there. */
    void *gh = gx != NULL && rows * C > 0 ? accel__nn_cu_grad_shadow_alloc(g, x) : NULL;
    if (gh == NULL && g->first_err != ACCEL_OK) {
        return;
    }
    float *gw = n->in[1] ? accel__nn_grad(g, n->in[1]) : NULL;
    float *gb = n->in[2] ? accel__nn_grad(g, n->in[2]) : NULL;
    if (rows * C == 0 || (gx == NULL && gw == NULL && gb == NULL)) {
        return;
    }
    const float *w = n->in[1] ? n->in[1]->data : NULL;
    int64_t np = gw != NULL || gb != NULL ? nn_cu_layernorm_bwd_part_count(rows, C) : 0;
    float *part = np > 0 ? accel__nn_dtmp_alloc(g, (size_t)np * sizeof(float)) : NULL;
    if (np > 0 && part == NULL) {
        return;
    }
    /* dY as 2-byte values of n->i[2] in the output's gradient memory (accel__nn_cu_ln_half_dy),
     * read as they are; where the kernel cannot, widened first into scratch (the fp32 dY). */
    const float *gy = n->out->grad;
    const void *gyh = n->i[3] ? (const void *)gy : NULL;
    if (gyh != NULL && !nn_cu_layernorm_bwd_reads_half(C, x->data, gyh, w, gx, fresh, gbase, gh)) {
        float *wide = accel__nn_dtmp_alloc(g, (size_t)(rows * C) * sizeof(float));
        if (wide == NULL ||
            !accel__nn_cu_ok(g,
                             nn_cu_acc_half(nn__cu_stream(g), wide, gyh, rows * C, (int)n->i[2], 1),
                             "nn_layernorm (backward)")) {
            return;
        }
        gy = wide;
        gyh = NULL;
    }
    accel__nn_cu_ok(g,
                    nn_cu_layernorm_bwd(nn__cu_stream(g), x->data, gy, gyh, (int)n->i[2], w,
                                        n->p[0], n->p[1], rows, C, gx, fresh, gbase, gh,
                                        x->grad_shadow_rnd, gw, gb, part),
                    "nn_layernorm (backward)");
    x->grad_shadow = gh;
}

/* LayerNorm backwards queued to read a 2-byte dY (accel__nn_cu_ln_half_dys), and the bytes an
 * element of their dY's memory (accel__nn_cu_ln_dy_elem_nbytes). */
static atomic_ulong n_ln_half_dy;
static size_t ln_dy_elem_nbytes = 2;

unsigned long accel__nn_cu_ln_half_dys(void)
{
    return n_ln_half_dy;
}

void accel__nn_cu_ln_dy_elem_nbytes(int nbytes)
{
    ln_dy_elem_nbytes = (size_t)nbytes;
}

void *accel__nn_cu_ln_dy_grad(nn_ctx *g, nn_node *n, nn_tensor *x, int rnd, int *fresh, int *half)
{
    *half = 0;
    nn_node *ln = n->prev;
    /* x's first gradient, x its own owner, and x the output of n's prev, which opted in (a
     * shell of rnd): no other op read x or a view of it after the LayerNorm (its node would sit
     * between the two), and none before it (x did not exist). */
    if (rnd == 0 || !x->requires_grad || x->base != NULL || x->grad != NULL || ln == NULL ||
        ln->backward != ln_backward || ln->out != x || ln->i[2] != rnd) {
        return accel__nn_grad_w(g, x, fresh);
    }
    /* Half the fp32 gradient's bytes: nothing reads this memory as fp32. */
    x->grad = x->grad_reserved != NULL
                  ? x->grad_reserved
                  : accel__nn_dalloc(g, (size_t)nn_numel(x) * ln_dy_elem_nbytes);
    x->grad_shadow = NULL;
    if (x->grad == NULL) {
        *fresh = 0;
        return NULL;
    }
    ln->i[3] = 1;
    n_ln_half_dy++;
    *fresh = *half = 1;
    return x->grad;
}

/* LayerNorm of x, or (r non-NULL, the same shape as x) of the sum x + r, which *sum receives:
 * one kernel, and the tape nodes the two ops would record (the add's, then the LayerNorm's).
 * operand_only: the output is read only by products, so with a shadow its fp32 values are not
 * stored at all (a shell tensor: 4 bytes an element neither written nor allocated). */
static nn_tensor *ln_forward(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *w, nn_tensor *b,
                             float eps, nn_tensor **sum, int operand_only)
{
    if (x == NULL) {
        return NULL;
    }
    /* In the public argument order, so that a message names the right input. */
    nn_tensor *in[4] = {x, r, w, b};
    if (r != NULL ? !accel__nn_cu_inputs(g, "nn_add_layernorm", in, 4)
                  : !accel__nn_cu_inputs(g, "nn_layernorm", (nn_tensor *[]){x, w, b}, 3)) {
        return NULL;
    }
    if (x->ndim < 1) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_layernorm: input must be >= 1-D");
    }
    int64_t C = x->shape[x->ndim - 1], rows = C ? nn_numel(x) / C : 0;
    if ((w && nn_numel(w) != C) || (b && nn_numel(b) != C)) {
        return accel__nn_fail(g, ACCEL_EINVAL,
                              "nn_layernorm: weight/bias must have %lld "
                              "elements",
                              (long long)C);
    }
    /* Under autocast the output's rounded copy too, for the product that normally reads it
     * (2 more bytes an element here instead of a 6-byte rounding pass there). */
    int rnd = accel__nn_cu_shadow_rnd(g);
    int shell = operand_only && rnd != 0 && rows * C > 0;
    nn_tensor *s = r != NULL ? accel__nn_new(g, x->ndim, x->shape) : NULL;
    nn_tensor *y = r != NULL && s == NULL ? NULL
                   : shell                ? accel__nn_new_shell(g, x->ndim, x->shape)
                                          : accel__nn_new(g, x->ndim, x->shape);
    float *mean = accel__nn_dalloc(g, (size_t)rows * sizeof(float));
    float *rstd = accel__nn_dalloc(g, (size_t)rows * sizeof(float));
    if (y == NULL || mean == NULL || rstd == NULL) {
        return NULL;
    }
    nn_cu_ln a = {.x = x->data, .res = r ? r->data : NULL, .sum = s ? s->data : NULL,
                  .w = w ? w->data : NULL, .b = b ? b->data : NULL, .y = y->data, .dt = rnd,
                  .mean = mean, .rstd = rstd, .rows = rows, .C = C, .eps = eps};
    if (rnd != 0 && rows * C > 0 && (a.yh = accel__nn_cu_shadow_alloc(g, y, rnd)) == NULL) {
        return NULL;
    }
    if (rows > 0 && !accel__nn_cu_ok(g, nn_cu_layernorm(nn__cu_stream(g), &a), "nn_layernorm")) {
        return NULL;
    }
    nn_tensor *ar[2] = {x, r};
    if (r != NULL && accel__nn_needs_grad(g, ar, 2) &&
        !accel__nn_record(g, "add", s, ar, 2, add_backward)) {
        return NULL;
    }
    if (r != NULL) {
        want_shadow_of_sum(s, x, r);
    }
    nn_tensor *lin[3] = {r != NULL ? s : x, w, b};
    if (accel__nn_needs_grad(g, lin, 3)) {
        nn_node *n = accel__nn_record(g, "layernorm", y, lin, 3, ln_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = rows;
        n->i[1] = C;
        /* A shell is read only by products: its first (fresh) gradient may stay 2-byte. */
        n->i[2] = shell ? rnd : 0;
        n->i[3] = 0;
        n->p[0] = mean;
        n->p[1] = rstd;
    }
    if (sum != NULL) {
        *sum = s;
    }
    return y;
}

nn_tensor *accel__nn_cu_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b, float eps)
{
    return ln_forward(g, x, NULL, w, b, eps, NULL, 0);
}

nn_tensor *accel__nn_cu_add_layernorm(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *w,
                                      nn_tensor *b, float eps, nn_tensor **sum, int operand_only)
{
    if (x == NULL || (r == NULL && !operand_only)) {
        return NULL;
    }
    nn_tensor *in[4] = {x, r, w, b}; /* numbered as the caller passed them */
    if (r != NULL && !accel__nn_cu_inputs(g, "nn_add_layernorm", in, 4)) {
        return NULL;
    }
    if (r != NULL && !accel__nn_same_shape(x, r)) { /* a broadcast: the two ops */
        nn_tensor *s = accel__nn_cu_add(g, x, r);
        nn_tensor *y = s != NULL ? ln_forward(g, s, NULL, w, b, eps, NULL, operand_only) : NULL;
        if (y != NULL) {
            *sum = s;
        }
        return y;
    }
    return ln_forward(g, x, r, w, b, eps, r != NULL ? sum : NULL, operand_only);
}

/* ---- fused softmax + cross entropy over the last dim ---- */

static void ce_backward(nn_ctx *g, nn_node *n)
{
    int fresh;
    float *gx = accel__nn_grad_w(g, n->in[0], &fresh);
    if (gx == NULL || n->i[0] * n->i[1] == 0) {
        return;
    }
    accel__nn_cu_ok(g,
                    nn_cu_ce_bwd(nn__cu_stream(g), n->in[0]->data, n->p[1], n->p[0], n->out->grad,
                                 n->i[0], n->i[1], n->i[2], n->f[0], n->f[1],
                                 n->i[3] == NN_REDUCTION_NONE, gx, fresh),
                    "nn_cross_entropy (backward)");
}

nn_tensor *accel__nn_cu_cross_entropy(nn_ctx *g, nn_tensor *logits, const int32_t *targets,
                                      const nn_cross_entropy_options *opts)
{
    nn_cross_entropy_options o;
    int64_t rows, count;
    if (logits == NULL || !accel__nn_cu_inputs(g, "nn_cross_entropy", &logits, 1) ||
        accel__nn_ce_args(g, logits, targets, opts, &o, &rows, &count) != ACCEL_OK) {
        return NULL;
    }
    int64_t C = logits->shape[logits->ndim - 1];
    nn_tensor *y = o.reduction == NN_REDUCTION_NONE
                       ? accel__nn_new(g, logits->ndim - 1, logits->shape)
                       : accel__nn_new(g, 0, NULL);
    float *lse = accel__nn_dalloc(g, (size_t)rows * sizeof(float));
    float *row_loss = o.reduction == NN_REDUCTION_NONE
                          ? (y ? y->data : NULL)
                          : accel__nn_dalloc(g, (size_t)rows * sizeof(float));
    int32_t *tdev = accel__nn_cu_ints(g, targets, rows, "nn_cross_entropy");
    if (y == NULL || lse == NULL || row_loss == NULL || tdev == NULL) {
        return NULL;
    }
    float eps = o.label_smoothing;
    if (rows > 0 && !accel__nn_cu_ok(g,
                                     nn_cu_ce_fwd(nn__cu_stream(g), logits->data, tdev, rows, C,
                                                  o.ignore_index, eps, lse, row_loss),
                                     "nn_cross_entropy")) {
        return NULL;
    }
    float scale = 1.0f;
    if (o.reduction != NN_REDUCTION_NONE) {
        /* torch: mean over non-ignored targets; 0/0 = NaN when all are ignored. */
        double divisor = o.reduction == NN_REDUCTION_MEAN ? (double)count : 1.0;
        scale = o.reduction == NN_REDUCTION_MEAN ? (float)(1.0 / (double)count) : 1.0f;
        if (!accel__nn_cu_ok(g, nn_cu_sum_div(nn__cu_stream(g), row_loss, rows, divisor, y->data),
                             "nn_cross_entropy")) {
            return NULL;
        }
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
        n->p[1] = tdev;
    }
    return y;
}

/* ---- fused causal self-attention over packed qkv ---- */

/* The forward's arguments, with its 2-byte copy of qkv (p[1], or NULL). */
static nn_cu_attn attn_of(const nn_node *n)
{
    nn_cu_attn a = {n->i[0],           n->i[1],      n->i[2], n->i[3], n->i[4], n->f[0], n->f[1],
                    (uint64_t)n->i[5], (int)n->i[6], n->p[1], NULL,    NULL,    NULL};
    return a;
}

static void attn_backward(nn_ctx *g, nn_node *n)
{
    nn_cu_attn a = attn_of(n);
    int fresh;
    float *gqkv = accel__nn_grad_w(g, n->in[0], &fresh);
    float *D = accel__nn_dtmp_alloc(g, (size_t)(a.B * a.H * a.T) * sizeof(float));
    if (gqkv == NULL || D == NULL || a.B * a.T == 0) {
        return;
    }
    /* Where the forward kept qkv's 2-byte copy (the tensor-core kernels apply), the kernels
     * read dy's 2-byte copy too (the same values they would round to): the projection's
     * backward product kept as dy's shadow where it was, else one pass over dy here (~0.03 ms
     * a layer at GPT-2 124M, B 32, on an H200). */
    if (a.qkv_h != NULL && a.rnd != 0 && n->out->grad_shadow != NULL &&
        n->out->grad_shadow_rnd == a.rnd) {
        a.dy_h = n->out->grad_shadow; /* the projection's backward product, kept 2-byte */
    } else if (a.qkv_h != NULL && a.rnd != 0) {
        size_t n_y = (size_t)(a.B * a.T * a.C);
        void *dy_h = accel__nn_dtmp_alloc(g, n_y * 2);
        if (dy_h == NULL ||
            !accel__nn_cu_ok(g, nn_cu_to_half(nn__cu_stream(g), n->out->grad, dy_h, (int64_t)n_y,
                                              a.rnd),
                             "nn_causal_attention (backward)")) {
            return;
        }
        a.dy_h = dy_h;
    }
    /* The gradient's 2-byte copy for the qkv product's backward (its grad_shadow_rnd asks),
     * where attn_tc_bwd2.cu's kernels write it as they write the gradient (fresh; bf16, head
     * 64, from the 2-byte copies): 2 more bytes an element there instead of a 6-byte rounding
     * pass in the product's backward. */
    nn_tensor *q = n->in[0];
    if (fresh && a.qkv_h != NULL && a.dy_h != NULL && a.rnd == 1 && a.hd == 64 &&
        q->grad_shadow_rnd == a.rnd) {
        a.gqkv_h = accel__nn_cu_grad_shadow_alloc(g, q);
        if (a.gqkv_h == NULL && g->first_err != ACCEL_OK) {
            return;
        }
    }
    if (accel__nn_cu_ok(g,
                        nn_cu_attn_bwd(nn__cu_stream(g), &a, q->data, n->out->data, n->p[0],
                                       n->out->grad, D, gqkv, fresh),
                        "nn_causal_attention (backward)")) {
        q->grad_shadow = a.gqkv_h;
    }
}

/* ACCEL_NN_ATTN and ACCEL_NN_ATTN_FAST, read at the first attention forward (an nn ctx needs
 * no accel_init, so there are no resolved settings to take them from). */
static void attn_kernel_read_env(void)
{
    const char *v;
    long long fast = 1;
    if (accel__env_int("ACCEL_NN_ATTN_FAST", &fast) == ACCEL_OK && fast == 0) {
        nn_cu_attn_set_kernel(NN_CU_ATTN_TC_SLOW);
    }
    if (accel__env_string("ACCEL_NN_ATTN", &v) != ACCEL_OK) {
        return;
    }
    if (strcmp(v, "warp") == 0) {
        nn_cu_attn_set_kernel(NN_CU_ATTN_WARP);
    } else if (strcmp(v, "auto") != 0) {
        accel__log(NULL, ACCEL__LOG_WARN, "ACCEL_NN_ATTN=%s ignored: auto or warp", v);
    }
}

/* Once per process, whichever ctx (and thread) runs attention first. */
void accel__nn_cu_attn_env(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, attn_kernel_read_env);
}

nn_cu_attn accel__nn_cu_attn_of(const nn_ctx *g, int64_t B, int64_t T, int64_t C, int n_head,
                                float attn_dropout)
{
    nn_cu_attn a = {0};
    a.B = B;
    a.T = T;
    a.C = C;
    a.H = n_head;
    a.hd = C / n_head;
    a.scale = 1.0f / sqrtf((float)a.hd);
    a.p = g->training ? attn_dropout : 0.0f;
    a.rnd = accel__nn_cu_rnd(nn__autocast(g));
    return a;
}

/* The forward from qkv's 2-byte shadow alone where qkv is a shell (accel__nn_cu_linear_qkv made
 * it for exactly this kernel); 1 queued, 0 with the ctx error. */
static int attn_from_shell(nn_ctx *g, const nn_tensor *qkv, nn_cu_attn *a, float *y, float *lse)
{
    cudaError_t err = cudaSuccess;
    a->qkv_h = qkv->base == NULL && qkv->shadow_rnd == a->rnd ? qkv->shadow : NULL;
    if (a->qkv_h == NULL || !nn_cu_attn_fwd_tc_read_half(nn__cu_stream(g), a, y, lse, &err)) {
        accel__nn_fail(g, ACCEL_EINVAL,
                       "nn_causal_attention: qkv holds only the 2-byte copy that the kernels for "
                       "head size 64 under bf16 autocast read (a GPT block's c_attn output), and "
                       "they do not apply here: use nn_linear for qkv");
        return 0;
    }
    return accel__nn_cu_ok(g, err, "nn_causal_attention");
}

nn_tensor *accel__nn_cu_attention(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout)
{
    accel__nn_cu_attn_env();
    /* (a shell qkv: accel__nn_cu_linear_qkv's output, read from its shadow) */
    int shell = qkv != NULL && qkv->data == NULL && nn_numel(qkv) > 0;
    if (qkv == NULL || !(shell ? accel__nn_cu_product_inputs : accel__nn_cu_inputs)(
                           g, "nn_causal_attention", &qkv, 1)) {
        return NULL;
    }
    uint64_t op_index = g->op_counter++;
    if (!accel__nn_attention_args(g, qkv, n_head, attn_dropout)) {
        return NULL;
    }
    nn_cu_attn a = accel__nn_cu_attn_of(g, qkv->shape[0], qkv->shape[1], qkv->shape[2] / 3,
                                        n_head, attn_dropout);
    a.key = nn__key3(g->seed, g->step, op_index);
    if (a.hd > NN_CU_ATTN_MAX_HD) {
        return accel__nn_fail(g, ACCEL_EUNSUPPORTED,
                              "nn_causal_attention: head size %lld: CUDA supports up to %d",
                              (long long)a.hd, NN_CU_ATTN_MAX_HD);
    }
    int64_t shape[3] = {a.B, a.T, a.C};
    nn_tensor *y = accel__nn_new(g, 3, shape);
    float *lse = accel__nn_dalloc(g, (size_t)(a.B * a.H * a.T) * sizeof(float));
    if (y == NULL || lse == NULL) {
        return NULL;
    }
    /* Where the tensor-core kernels run, qkv rounded once into a 2-byte copy (kept for the
     * step) that they read instead of rounding fp32 tiles (half the bytes, no conversions):
     * written by the forward itself where its 32-row kernel runs (no separate pass over
     * qkv), else by a pass before the forward. */
    int64_t n_qkv = a.B * a.T * 3 * a.C;
    cudaStream_t cs = nn__cu_stream(g);
    int done = shell;
    /* y's 2-byte copy for the projection's product (accel__nn_cu_operand reads it), written
     * by the forward as it stores y where k_attn_fwd_tc2 runs (bf16, head 64): 2 more bytes
     * an element there instead of a 6-byte rounding pass in the product (elsewhere the
     * launcher's pass, the same bits). */
    if (n_qkv > 0 && a.rnd == 1 && a.hd == 64 && nn_cu_attn_tc_takes_half(&a) &&
        accel__nn_cu_shadow_rnd(g) == a.rnd &&
        (a.y_h = accel__nn_cu_shadow_alloc(g, y, a.rnd)) == NULL) {
        return NULL;
    }
    if (shell && !attn_from_shell(g, qkv, &a, y->data, lse)) {
        return NULL;
    }
    if (!shell && n_qkv > 0 && nn_cu_attn_tc_takes_half(&a)) {
        void *h = accel__nn_dalloc(g, (size_t)n_qkv * 2);
        cudaError_t err = cudaSuccess;
        if (h == NULL) {
            return NULL;
        }
        done = nn_cu_attn_fwd_tc_half(cs, &a, qkv->data, y->data, lse, h, &err);
        if ((done && !accel__nn_cu_ok(g, err, "nn_causal_attention")) ||
            (!done && !accel__nn_cu_ok(g, nn_cu_to_half(cs, qkv->data, h, n_qkv, a.rnd),
                                       "nn_causal_attention"))) {
            return NULL;
        }
        a.qkv_h = h;
    }
    if (!done && a.B * a.T * a.C > 0 &&
        !accel__nn_cu_ok(g, nn_cu_attn_fwd(cs, &a, qkv->data, y->data, lse),
                         "nn_causal_attention")) {
        return NULL;
    }
    if (accel__nn_needs_grad(g, &qkv, 1)) {
        nn_node *n = accel__nn_record(g, "causal_attention", y, &qkv, 1, attn_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = a.B;
        n->i[1] = a.T;
        n->i[2] = a.C;
        n->i[3] = a.H;
        n->i[4] = a.hd;
        n->i[5] = (int64_t)a.key;
        n->i[6] = a.rnd;
        n->f[0] = a.scale;
        n->f[1] = a.p;
        n->p[0] = lse;
        n->p[1] = (void *)a.qkv_h; /* attn_of */
        /* The backward reads dy only rounded, from a 2-byte copy: its writer is asked for one. */
        y->grad_shadow_rnd = a.qkv_h != NULL && accel__nn_cu_shadows_on() ? a.rnd : 0;
    }
    return y;
}
