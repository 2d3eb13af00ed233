/*
 * nn_linear on CUDA through cuBLASLt. Row-major [M, in] x weight is computed as the
 * column-major product Y^T = W' X^T, so no operand is ever copied or transposed. In fp32 the
 * product is plain fp32 (CUBLAS_COMPUTE_32F: no TF32); under autocast bf16 / fp16 the inputs
 * are rounded into 2-byte copies and multiplied with fp32 accumulation into an fp32 output,
 * as the CPU's autocast does: the bias is added in fp32 by cuBLASLt's bias epilogue (a plain
 * product plus a bias kernel where cuBLASLt offers no algorithm with the epilogue), and in
 * backward each gradient contribution is rounded to the dtype before it is added. One
 * exception: nn_linear_gelu_linear's hidden tensor, read only rounded, is written in 2 bytes
 * by the GELU epilogue under autocast, and its gradient too (by default a plain 2-byte product
 * and one kernel for GELU's derivative and the bias gradient; or the DGELU epilogue).
 */
#include <pthread.h>
#include <string.h>

#include "lt_gpu.h"

/* grad (+)= the product of p, rounded under autocast: p->D is set here. t: the tensor whose
 * gradient grad is (an input's), or NULL (a weight's); half_dy: grad is t's 2-byte gradient
 * (accel__nn_cu_ln_dy_grad said *half = 1). */
static int grad_matmul(nn_ctx *g, lt_mm *p, void *grad, nn_tensor *t, int fresh, int half_dy,
                       int rnd, const char *what)
{
    if (rnd == 0) {
        p->D = grad;
        p->beta = fresh ? 0.0f : 1.0f;
        return accel__nn_lt_matmul(g, p, what);
    }
    if (half_dy) {
        /* t's LayerNorm, its only reader, reads the 2-byte product as it is: stored in t's
         * gradient memory (2 bytes an element), with no widening pass (6 bytes an element)
         * and no fp32 dY to read (2 bytes an element less there). */
        p->D = grad;
        p->d_type = lt_in_type(rnd);
        p->beta = 0.0f;
        return accel__nn_lt_matmul(g, p, what);
    }
    /* The product stored rounded, in 2 bytes (the rounding rnd_dt would do on its fp32 copy),
     * then widened into grad: 2 + 2 bytes an element in between instead of 4 + 4. A fresh
     * gradient is then exactly those 2-byte values widened: when t's consumer asked for its
     * gradient's shadow, they are it (kept in the arena instead of per-op scratch). */
    int64_t n = p->m * p->n;
    int keep = fresh && t != NULL && t->base == NULL && t->grad_shadow_rnd == rnd;
    p->D = keep ? accel__nn_cu_grad_shadow_alloc(g, t) : accel__nn_dtmp_alloc(g, (size_t)n * 2);
    p->d_type = lt_in_type(rnd);
    p->beta = 0.0f;
    if (p->D == NULL && keep && g->first_err == ACCEL_OK) { /* shadows off */
        keep = 0;
        p->D = accel__nn_dtmp_alloc(g, (size_t)n * 2);
    }
    if (p->D == NULL || !accel__nn_lt_matmul(g, p, what) ||
        !accel__nn_cu_ok(g, nn_cu_acc_half(nn__cu_stream(g), grad, p->D, n, rnd, fresh), what)) {
        return 0;
    }
    if (keep) {
        t->grad_shadow = p->D;
    }
    return 1;
}

/* What a linear node is (n->i[5]): a plain nn_linear, or one of the two products of
 * nn_linear_gelu_linear. FUSED_GELU (the first): y = gelu(x W1 + b1) with the GELU input kept
 * (n->p[3]); its output gradient arrives already through GELU's derivative (dZ, written by the
 * second node) and its bias gradient may too (n->p[2]). FUSED_DGELU (the second, reading the
 * first's private output): its input gradient is the product through the DGELU(_BGRAD)
 * epilogue with the first node's GELU input (n->p[3] is that node).
 * Under autocast the first node's output is only ever read rounded (by the second product),
 * and its gradient too (by the first node's products), so both are kept in the 2-byte dtype:
 * y->data holds h as 2-byte values (its first half) and y->grad dZ likewise, with the GELU
 * input (aux) and the first bias's gradient (n->p[2]) also 2-byte, as cuBLASLt requires of an
 * epilogue's aux and bias with a 2-byte D. The tensor is private to the op, so nothing else
 * reads them as fp32. */
enum { LIN_PLAIN = 0, LIN_FUSED_DGELU = 1, LIN_FUSED_GELU = 2 };

/* How the fused MLP makes its hidden gradient under autocast (ACCEL_NN_DGELU, read once; the
 * test hook accel__nn_cu_dgelu_kernel): 1 "kernel" (the default), the product stored plain in
 * 2 bytes, then nn_cu_dgelu_bgrad_half for GELU's derivative and the bias gradient in one pass
 * (2 + 2 bytes read and 2 written an element; the CPU's definition: the hidden gradient
 * rounded before the derivative, the bias gradient summed from the rounded dZ); 0 "epilogue",
 * cuBLASLt's DGELU_BGRAD (from the fp32 product; a separate kernel of its own on Hopper) and
 * its fallbacks. fp32 always takes the epilogue. */
static int dgelu_kernel = 1;
static pthread_once_t dgelu_once = PTHREAD_ONCE_INIT;

static void dgelu_read_env(void)
{
    const char *v;
    if (accel__env_string("ACCEL_NN_DGELU", &v) != ACCEL_OK) {
        return;
    }
    if (strcmp(v, "epilogue") == 0) {
        dgelu_kernel = 0;
    } else if (strcmp(v, "kernel") != 0) {
        accel__log(NULL, ACCEL__LOG_WARN, "ACCEL_NN_DGELU=%s ignored: kernel or epilogue", v);
    }
}

void accel__nn_cu_dgelu_kernel(int on)
{
    pthread_once(&dgelu_once, dgelu_read_env);
    dgelu_kernel = on;
}

static int use_dgelu_kernel(void)
{
    pthread_once(&dgelu_once, dgelu_read_env);
    return dgelu_kernel;
}

/* How a linear's bias gradient is summed (ACCEL_NN_BGRAD, read once; the test hook
 * accel__nn_cu_bgrad_epilogue): 0 (the default) by the column-sum kernel over the 2-byte dY
 * (fp32 dY without autocast), a pass of its own; 1 by cuBLASLt's BGRADA / BGRADB epilogue in
 * the weight-gradient product, which reads dY anyway (dY is its A in the [in, out] layout,
 * its B, transposed, in [out, in]), into scratch in D's type and then added to the gradient.
 * Either way the sum of dY as the products read it, in fp32, rounded to the dtype under
 * autocast, then added; only the order of the fp32 sum differs. Where cuBLASLt offers no
 * algorithm with the epilogue the column-sum kernel makes the same scratch (said once). */
void accel__nn_cu_bgrad_epilogue(int on)
{
    accel__nn_switch_set(ACCEL__NN_SW_BGRAD, on);
}

/* The input gradient of a FUSED_DGELU node n: dZ = (dY op(W2)) * gelu'(Z) into gx (the first
 * node's output gradient) and the first bias's gradient into an arena buffer the first node
 * then adds. p: the input-gradient product, D unset. */
static int dgelu_grad(nn_ctx *g, nn_node *n, lt_mm *p, void *gx, int fresh, const char *what)
{
    nn_node *a = n->p[3];
    const nn_tensor *b1 = a->in[2];
    /* The first node's mode decides the types of its aux and of h's gradient (the two nodes
     * differ only if NN_AUTOCAST_AUTO learned the dtype from the second weight). */
    int rnd = (int)a->i[4];
    int want_db = b1 != NULL && b1->requires_grad;
    p->d_type = lt_in_type(rnd);
    if (rnd != 0 && use_dgelu_kernel()) {
        /* gx is the 2-byte, always fresh hidden gradient (half_grad): the product lands there
         * and the kernel turns it into dZ in place; the bias gradient is stored, not added. */
        float *part = NULL;
        void *db = want_db ? accel__nn_dalloc(g, (size_t)p->m * 2) : NULL;
        if (want_db && (db == NULL || !accel__nn_cu_sum_parts(g, p->n, p->m, 1, &part))) {
            return 0;
        }
        if (want_db) {
            a->p[2] = db;
        }
        p->D = gx;
        p->beta = 0.0f;
        return accel__nn_lt_matmul(g, p, what) &&
               accel__nn_cu_ok(
                   g,
                   nn_cu_dgelu_bgrad_half(nn__cu_stream(g), gx, a->p[3], p->n, p->m, db, part, rnd),
                   what);
    }
    p->act = LT_ACT_DGELU;
    p->aux = a->p[3];
    size_t elem_nbytes = rnd ? 2 : sizeof(float);
    if (want_db) {
        /* Zeroed, so the sums are right whether the epilogue stores them (as documented) or
         * adds them. */
        p->dbias = accel__nn_dzalloc(g, (size_t)p->m * elem_nbytes);
        if (p->dbias == NULL) {
            return 0;
        }
        a->p[2] = p->dbias;
    }
    /* The first node's output is private to the op, so its gradient is always fresh here; an
     * epilogue never accumulates (beta would enter before the derivative), so anything else
     * would go through scratch (fp32 only: a 2-byte gradient is always fresh, half_grad). */
    int64_t count = p->m * p->n;
    p->D = fresh ? gx : accel__nn_dtmp_alloc(g, (size_t)count * sizeof(float));
    p->beta = 0.0f;
    return p->D != NULL && accel__nn_lt_matmul(g, p, what) &&
           (fresh || accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), gx, p->D, count, 0, 0), what));
}

/* The 2-byte gradient (dZ) of the fused MLP's private hidden tensor x under autocast: its
 * first and only contribution, written by the DGELU epilogue and read by the first node's
 * products as they are. NULL and the ctx error on failure. */
static void *half_grad(nn_ctx *g, nn_tensor *x, int64_t count, const char *what)
{
    if (x->base != NULL || x->grad != NULL || x->grad_reserved != NULL) {
        accel__nn_fail(g, ACCEL_ESTATE, "%s: the hidden tensor's gradient was already taken", what);
        return NULL;
    }
    x->grad = accel__nn_dalloc(g, (size_t)count * 2);
    return x->grad;
}

static void linear_backward(nn_ctx *g, nn_node *n)
{
    const char *what =
        n->i[5] != LIN_PLAIN ? "nn_linear_gelu_linear (backward)" : "nn_linear (backward)";
    nn_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    int64_t M = n->i[0], in = n->i[1], out = n->i[2];
    int in_out = n->i[3] == NN_LAYOUT_IN_OUT, rnd = (int)n->i[4];
    const void *xd = rnd ? n->p[0] : x->data, *wd = rnd ? n->p[1] : w->data;
    const float *gy = n->out->grad;
    /* The first fused node's gradient (dZ) is 2-byte already under autocast (half_grad). */
    int half_gy = rnd != 0 && n->i[5] == LIN_FUSED_GELU;
    /* The rounded dY: the shadow its writer made (the residual add's backward), else a copy. */
    const nn_tensor *yt = n->out;
    const void *gyd = !rnd || half_gy ? (const void *)gy
                      : yt->grad_shadow != NULL && yt->grad_shadow_rnd == rnd
                          ? yt->grad_shadow
                          : accel__nn_cu_half_copy(g, gy, M * out, rnd, 1, what);
    if (gyd == NULL) {
        return;
    }
    cudaDataType_t ty = lt_in_type(rnd);
    int fx = 1, half_dy = 0;
    int half_gx = n->i[5] == LIN_FUSED_DGELU && ((const nn_node *)n->p[3])->i[4] != 0;
    void *gx = NULL;
    if (half_gx) {
        gx = in > 0 ? half_grad(g, x, M * in, what) : NULL;
    } else if (in > 0 && M > 0 && out > 0 && n->i[5] != LIN_FUSED_DGELU) {
        /* All of x's gradient by grad_matmul's one product: 2-byte where a LayerNorm reads it. */
        gx = accel__nn_cu_ln_dy_grad(g, n, x, rnd, &fx, &half_dy);
    } else if (in > 0) {
        gx = accel__nn_grad_w(g, x, &fx);
    }
    if (gx == NULL && g->first_err != ACCEL_OK) {
        return;
    }
    if (gx != NULL && M > 0) {
        lt_mm p = {in_out, 0,  in,   M,           out,  wd,   in_out ? out : in, gyd, out, NULL, in,
                   0.0f,   ty, NULL, LT_ACT_NONE, NULL, NULL, CUDA_R_32F};
        if (n->i[5] == LIN_FUSED_DGELU) {
            if (!dgelu_grad(g, n, &p, gx, fx, what)) {
                return;
            }
        } else if (out == 0) {
            if (fx) {
                accel__nn_cu_ok(
                    g, cudaMemsetAsync(gx, 0, (size_t)(M * in) * sizeof(float), nn__cu_stream(g)),
                    what);
            }
        } else if (!grad_matmul(g, &p, gx, x, fx, half_dy, rnd, what)) {
            return;
        }
    }
    /* Fetched after gx was written, so x == w (however odd) adds rather than overwrites. */
    int fw;
    float *gw = in * out > 0 ? accel__nn_grad_w(g, w, &fw) : NULL;
    /* The bias gradient from the weight-gradient product's epilogue (ACCEL_NN_BGRAD=1), where
     * that product runs and the bias was not summed by the fused MLP: into db, D's type. */
    void *db = NULL;
    if (gw != NULL && M > 0 && b != NULL && b->requires_grad && out > 0 && n->p[2] == NULL &&
        !half_gy && accel__nn_switch(ACCEL__NN_SW_BGRAD)) {
        db = accel__nn_dtmp_alloc(g, (size_t)out * (rnd ? 2 : sizeof(float)));
        if (db == NULL) {
            return;
        }
    }
    if (gw != NULL) {
        lt_mm p;
        if (in_out) { /* dW [in, out] = X^T dY: column-major out x in = dY X^T */
            lt_mm q = {0,    1,   out,  in, M,    gyd,         out,  xd,   in,
                       NULL, out, 0.0f, ty, NULL, LT_ACT_NONE, NULL, NULL, CUDA_R_32F};
            p = q;
        } else { /* dW [out, in] = dY^T X: column-major in x out = X dY^T */
            lt_mm q = {0,    1,  in,   out, M,    xd,          in,   gyd,  out,
                       NULL, in, 0.0f, ty,  NULL, LT_ACT_NONE, NULL, NULL, CUDA_R_32F};
            p = q;
        }
        if (db != NULL) { /* the sums over the product's k (the M rows) of dY, A or B */
            p.act = in_out ? LT_ACT_BGRADA : LT_ACT_BGRADB;
            p.dbias = db;
        }
        if (M == 0) {
            if (fw) {
                accel__nn_cu_ok(
                    g, cudaMemsetAsync(gw, 0, (size_t)(in * out) * sizeof(float), nn__cu_stream(g)),
                    what);
            }
        } else if (!grad_matmul(g, &p, gw, NULL, fw, 0, rnd, what)) {
            return;
        }
    }
    float *gb = b && out > 0 ? accel__nn_grad(g, b) : NULL;
    /* Summed already: by this product's epilogue (db, in D's type) or by the second node's
     * DGELU_BGRAD (n->p[2]); under autocast stored rounded, in 2 bytes. */
    const void *sum = db != NULL ? db : n->p[2];
    if (gb != NULL && sum != NULL) {
        int half = db != NULL ? rnd != 0 : half_gy;
        accel__nn_cu_ok(g,
                        half ? nn_cu_acc_half(nn__cu_stream(g), gb, sum, out, rnd, 0)
                             : nn_cu_acc(nn__cu_stream(g), gb, sum, out, rnd, 0),
                        what);
        return;
    }
    if (half_gy && gb != NULL) {
        /* dgelu_grad sums the first bias's gradient whenever it needs one. */
        accel__nn_fail(g, ACCEL_ESTATE, "%s: the first bias's gradient was not summed", what);
        return;
    }
    float *part = NULL;
    if (gb != NULL && accel__nn_cu_sum_parts(g, M, out, 1, &part)) {
        /* Under autocast the bias gradient of a low-precision kernel: the rounded dY (the
         * 2-byte copy the products read, half the bytes of dY) summed, then rounded. */
        accel__nn_cu_ok(g, nn_cu_col_sum(nn__cu_stream(g), gyd, rnd, M, out, gb, 0, rnd, part),
                        what);
    }
}

/* y = x W (+ bias) recorded as a node of `kind`: for LIN_FUSED_GELU y = gelu(...) with the GELU
 * input kept for backward (under autocast y->data holds h in 2 bytes); for LIN_FUSED_DGELU
 * `first` is the LIN_FUSED_GELU node that made x. x_op: the operand the product reads for x
 * when the caller has it (the fused MLP's 2-byte h), else NULL. *rec: the node (NULL when
 * nothing was recorded). NULL on failure, the ctx error set. */
static nn_tensor *linear_fwd(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                             nn_layout layout, int kind, nn_node *first, const void *x_op,
                             const char *what, nn_node **rec, int shell)
{
    *rec = NULL;
    if (x == NULL || w == NULL) {
        return NULL;
    }
    nn_tensor *ins[3] = {x, w, bias};
    if (!accel__nn_cu_product_inputs(g, what, ins, 3)) {
        return NULL;
    }
    int64_t in, out, M;
    int rnd = accel__nn_cu_rnd(nn__autocast(g));
    /* Under autocast the fused first product writes h in 2 bytes, and cuBLASLt then takes
     * its bias, its GELU input (aux) and, in backward, its bias gradient in that type too;
     * h's data is allocated at 2 bytes an element (only this file reads it). */
    int half_out = rnd != 0 && kind == LIN_FUSED_GELU;
    /* shell (LIN_PLAIN, rnd != 0, a non-empty product): y only as its 2-byte shadow. */
    nn_tensor *y = accel__nn_linear_out(g, x, w, bias, layout, shell ? 2 : half_out, &in, &out, &M);
    if (y == NULL || (shell && accel__nn_cu_shadow_alloc(g, y, rnd) == NULL)) {
        return NULL;
    }
    int in_out = layout == NN_LAYOUT_IN_OUT;
    if (in == 0) { /* no input features: y is the bias (or zeros) for every row */
        M = nn_numel(y) / (out ? out : 1);
    }
    const void *xd = x_op != NULL ? x_op : accel__nn_cu_operand(g, x, rnd, 0, what);
    const void *wd = accel__nn_cu_operand(g, w, rnd, 0, what);
    const void *bd = bias ? bias->data : NULL;
    if (xd == NULL || wd == NULL) {
        return NULL;
    }
    if (bias != NULL && (half_out || shell)) { /* the CPU's rounded bias, exactly, in 2 bytes */
        /* (the working copy when the model keeps one, aligned as the epilogue needs) */
        bd = accel__nn_cu_operand(g, bias, rnd, 0, what);
        if (bd != NULL && lt_alignment_of(bd) < 16) {
            bd = accel__nn_cu_half_copy(g, bias->data, out, rnd, 0, what);
        }
        if (bd == NULL) {
            return NULL;
        }
    } else if (bias != NULL && rnd != 0) { /* the CPU's autocast rounds the bias too */
        float *br = accel__nn_dalloc(g, (size_t)out * sizeof(float));
        if (br == NULL ||
            (out > 0 &&
             !accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), br, bias->data, out, rnd, 1), what))) {
            return NULL;
        }
        bd = br;
    } else if (bd != NULL && lt_alignment_of(bd) < 16 && in > 0 && M * out > 0) {
        /* Epilogues may read the bias in 16-byte vectors, and a parameter view can sit at any
         * offset: an aligned copy keeps the fused epilogue (lt_matmul would go without it). */
        float *ba = accel__nn_dalloc(g, (size_t)out * sizeof(float));
        if (ba == NULL ||
            !accel__nn_cu_ok(g,
                             cudaMemcpyAsync(ba, bd, (size_t)out * sizeof(float),
                                             cudaMemcpyDeviceToDevice, nn__cu_stream(g)),
                             what)) {
            return NULL;
        }
        bd = ba;
    }
    void *aux = NULL; /* the GELU input, for backward */
    if (kind == LIN_FUSED_GELU &&
        (aux = accel__nn_dalloc(g, (size_t)(M * out) * (half_out ? 2 : sizeof(float)))) == NULL) {
        return NULL;
    }
    if (M * out > 0) {
        if (in == 0) {
            if (!accel__nn_cu_ok(g,
                                 cudaMemsetAsync(y->data, 0, (size_t)(M * out) * sizeof(float),
                                                 nn__cu_stream(g)),
                                 what) ||
                (bd != NULL &&
                 !accel__nn_cu_ok(
                     g, nn_cu_add(nn__cu_stream(g), y->data, M * out, bd, out, y->data), what))) {
                return NULL;
            }
        } else {
            /* Y^T (out x M) = op(W) (out x in) X^T (in x M). */
            lt_mm p = {!in_out,           0,  out,         M,       in,   wd,
                       in_out ? out : in, xd, in,          y->data, out,  0.0f,
                       lt_in_type(rnd),   bd, LT_ACT_NONE, NULL,    NULL, CUDA_R_32F};
            if (kind == LIN_FUSED_GELU) {
                p.act = LT_ACT_GELU;
                p.aux = aux;
                p.d_type = half_out ? lt_in_type(rnd) : CUDA_R_32F;
            }
            if (shell) {
                p.D = y->shadow;
                p.d_type = lt_in_type(rnd);
            }
            if (!(shell ? accel__nn_lt_shell_matmul(g, &p, bias != NULL ? bias->data : NULL, what)
                        : accel__nn_lt_matmul(g, &p, what))) {
                return NULL;
            }
        }
    }
    if (accel__nn_needs_grad(g, ins, 3)) {
        /* Backward reads dY only rounded (but the fused first product's, 2-byte already):
         * its writers are asked for a shadow. */
        y->grad_shadow_rnd = kind != LIN_FUSED_GELU && accel__nn_cu_shadows_on() ? rnd : 0;
        static const char *const names[] = {"linear", "linear_dgelu", "linear_gelu"};
        nn_node *n = accel__nn_record(g, names[kind], y, ins, 3, linear_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = M;
        n->i[1] = in;
        n->i[2] = out;
        n->i[3] = layout;
        n->i[4] = rnd;
        n->i[5] = kind;
        n->p[0] = (void *)xd;
        n->p[1] = (void *)wd;
        n->p[3] = kind == LIN_FUSED_GELU ? (void *)aux : (void *)first;
        *rec = n;
    }
    return y;
}

nn_tensor *accel__nn_cu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                               nn_layout layout)
{
    nn_node *n;
    return linear_fwd(g, x, w, bias, layout, LIN_PLAIN, NULL, NULL, "nn_linear", &n, 0);
}

nn_tensor *accel__nn_cu_linear_shell(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                                     nn_layout layout, int rnd)
{
    nn_node *n;
    int shell = rnd != 0 && rnd == accel__nn_cu_rnd(nn__autocast(g)) && x != NULL && x->ndim >= 1 &&
                x->shape[x->ndim - 1] > 0 && nn_numel(x) > 0;
    return linear_fwd(g, x, w, bias, layout, LIN_PLAIN, NULL, NULL, "nn_linear", &n, shell);
}

nn_tensor *accel__nn_cu_linear_gelu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w1, nn_tensor *b1,
                                           nn_tensor *w2, nn_tensor *b2, nn_layout layout)
{
    static const char what[] = "nn_linear_gelu_linear";
    if (x == NULL || w1 == NULL || w2 == NULL) {
        return NULL;
    }
    /* All five first, numbered as the caller passed them: the second product's own check
     * would number w2 and b2 as its inputs 1 and 2, and come after the first product ran. */
    nn_tensor *ins[5] = {x, w1, b1, w2, b2};
    if (!accel__nn_cu_product_inputs(g, what, ins, 5)) {
        return NULL;
    }
    /* cuBLASLt's GELU input (aux) needs a leading dimension, the hidden width, that is a
     * multiple of 8; empty products have nothing to fuse. Those take the three ops. */
    int64_t hidden = w1->ndim == 2 ? w1->shape[layout == NN_LAYOUT_IN_OUT ? 1 : 0] : 0;
    int64_t in = x->ndim >= 1 ? x->shape[x->ndim - 1] : 0;
    if (hidden <= 0 || hidden % 8 != 0 || in == 0 || nn_numel(x) == 0 || nn_numel(w2) == 0) {
        nn_tensor *h = accel__nn_cu_gelu(g, accel__nn_cu_linear(g, x, w1, b1, layout), 1);
        return accel__nn_cu_linear(g, h, w2, b2, layout);
    }
    nn_node *first, *second;
    nn_tensor *h = linear_fwd(g, x, w1, b1, layout, LIN_FUSED_GELU, NULL, NULL, what, &first, 0);
    /* Under autocast h holds its 2-byte values: the second product reads them as they are. */
    const void *h_op = h != NULL && accel__nn_cu_rnd(nn__autocast(g)) != 0 ? h->data : NULL;
    /* Without a first node (nothing before needs a gradient) the second is a plain linear. */
    return linear_fwd(g, h, w2, b2, layout, first ? LIN_FUSED_DGELU : LIN_PLAIN, first, h_op, what,
                      &second, 0);
}
