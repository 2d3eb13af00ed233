/*
 * nn: gradient check of every op against central finite differences, on random small shapes
 * (including broadcasting, ignore_index, label smoothing, dropout with a pinned key).
 *
 * Method and tolerance. The ops run in fp32; the checked scalar is L = sum_i r_i y_i with
 * fixed random r, accumulated in double. The analytic gradient is nn_backward_grad(y, r);
 * the numeric one is (L(x+h) - L(x-h)) / 2h with h = 5e-3. With inputs of magnitude <= ~2
 * and at most a few hundred outputs, fp32 rounding perturbs L by ~1e-6, i.e. ~1e-4 after
 * dividing by 2h, and the O(h^2 f''') truncation term is ~1e-5; so we accept
 * |analytic - numeric| <= 3e-3 + 3e-2 * max(|analytic|, |numeric|). A wrong gradient (a
 * missing term, a wrong sign, a broadcast not summed) is off by O(|gradient|) and fails.
 * relu inputs avoid a band around 0 so no finite difference straddles the kink.
 */
#include <stdint.h>
#include <string.h>

#include "accel/nn.h"
#include "check.h"

#define MAX_IN 4
#define H 5e-3
#define ATOL 3e-3
#define RTOL 3e-2

static uint64_t rng_state = 0x1234567ull;
static double urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1p-53;
}
static int64_t irand(int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(urand() * (double)(hi - lo + 1));
}

typedef struct spec {
    int ndim;
    int64_t shape[4];
    float lo, hi;
    int relu_safe; /* keep |x| >= 0.1 */
    int no_grad;   /* an input that is not differentiated (e.g. mse target) */
} spec;

typedef enum kind {
    K_ADD,
    K_SUB,
    K_MUL,
    K_DIV,
    K_SCALE,
    K_SUM,
    K_MEAN,
    K_SUM_ALL,
    K_RELU,
    K_GELU,
    K_GELU_TANH,
    K_TANH,
    K_SIGMOID,
    K_SOFTMAX,
    K_LOG_SOFTMAX,
    K_CE,
    K_MSE,
    K_EMBEDDING,
    K_LAYERNORM,
    K_LAYERNORM_NOAFFINE,
    K_DROPOUT,
    K_ATTENTION,
    K_MATMUL,
    K_LINEAR,
    K_CONCAT,
    K_SPLIT,
    K_TRANSPOSE,
    K_SLICE,
    K_RESHAPE
} kind;

typedef struct tcase {
    const char *name;
    kind k;
    int n_in;
    spec in[MAX_IN];
    int dim, keepdim, approx, n_head, layout, has_bias;
    float p;
    int32_t ids[512];
    nn_cross_entropy_options ce;
    nn_reduction red;
} tcase;

static nn_tensor *build(nn_ctx *g, nn_tensor **x, const tcase *c)
{
    switch (c->k) {
    case K_ADD:
        return nn_add(g, x[0], x[1]);
    case K_SUB:
        return nn_sub(g, x[0], x[1]);
    case K_MUL:
        return nn_mul(g, x[0], x[1]);
    case K_DIV:
        return nn_div(g, x[0], x[1]);
    case K_SCALE:
        return nn_scale(g, x[0], -1.7f);
    case K_SUM:
        return nn_sum(g, x[0], c->dim, c->keepdim);
    case K_MEAN:
        return nn_mean(g, x[0], c->dim, c->keepdim);
    case K_SUM_ALL:
        return nn_sum_all(g, x[0]);
    case K_RELU:
        return nn_relu(g, x[0]);
    case K_GELU:
        return nn_gelu(g, x[0], 0);
    case K_GELU_TANH:
        return nn_gelu(g, x[0], 1);
    case K_TANH:
        return nn_tanh(g, x[0]);
    case K_SIGMOID:
        return nn_sigmoid(g, x[0]);
    case K_SOFTMAX:
        return nn_softmax(g, x[0], c->dim);
    case K_LOG_SOFTMAX:
        return nn_log_softmax(g, x[0], c->dim);
    case K_CE:
        return nn_cross_entropy(g, x[0], c->ids, &c->ce);
    case K_MSE:
        return nn_mse_loss(g, x[0], x[1], c->red);
    case K_EMBEDDING:
        return nn_embedding(g, x[0], c->ids, 2, (int64_t[]){2, 3});
    case K_LAYERNORM:
        return nn_layernorm(g, x[0], x[1], x[2], 1e-5f);
    case K_LAYERNORM_NOAFFINE:
        return nn_layernorm(g, x[0], NULL, NULL, 1e-5f);
    case K_DROPOUT:
        return nn_dropout(g, x[0], c->p);
    case K_ATTENTION:
        return nn_causal_attention(g, x[0], c->n_head, c->p);
    case K_MATMUL:
        return nn_matmul(g, x[0], x[1]);
    case K_LINEAR:
        return nn_linear(g, x[0], x[1], c->has_bias ? x[2] : NULL, (nn_layout)c->layout);
    case K_CONCAT:
        return nn_concat(g, x, c->n_in, c->dim);
    case K_SPLIT: {
        /* Split into unequal views, then combine them so every piece carries gradient. */
        nn_tensor *parts[2];
        int64_t sizes[2] = {1, x[0]->shape[c->dim < 0 ? x[0]->ndim + c->dim : c->dim] - 1};
        if (nn_split(g, x[0], c->dim, 2, sizes, parts) != ACCEL_OK) {
            return NULL;
        }
        return nn_concat(g, (nn_tensor *[]){nn_scale(g, parts[1], 2.0f), nn_tanh(g, parts[0])}, 2,
                         c->dim);
    }
    case K_TRANSPOSE:
        return nn_mul(g, nn_contiguous(g, nn_transpose(g, x[0], 0, -1)), x[1]);
    case K_SLICE:
        return nn_sigmoid(g, nn_slice(g, x[0], c->dim, 1, 3));
    case K_RESHAPE:
        return nn_tanh(g, nn_reshape(g, nn_transpose(g, x[0], 0, 1), 2, (int64_t[]){-1, 2}));
    }
    return NULL;
}

static int64_t spec_numel(const spec *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) {
        n *= s->shape[d];
    }
    return n;
}

/* One evaluation of the projected output; no-grad so the tape stays empty. */
static double eval_L(nn_ctx *g, const tcase *c, float *const *vals, const float *r, int64_t *n_out)
{
    nn_ctx_reset(g);
    nn_ctx_set_step(g, 7);
    nn_ctx_set_grad_enabled(g, 0);
    nn_tensor *x[MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
        x[i] = nn_tensor_from(g, vals[i], c->in[i].ndim, c->in[i].shape);
    }
    nn_tensor *y = build(g, x, c);
    CHECK_MSG(y != NULL, "%s: forward failed: %s", c->name, accel_last_error(NULL));
    CHECK_MSG(nn_is_contiguous(y), "%s: op output not contiguous", c->name);
    nn_ctx_set_grad_enabled(g, 1);
    int64_t n = nn_numel(y);
    if (n_out != NULL) {
        *n_out = n;
    }
    double L = 0.0;
    for (int64_t i = 0; r != NULL && i < n; i++) {
        L += (double)r[i] * (double)y->data[i];
    }
    return L;
}

static void gradcheck(nn_ctx *g, tcase *c)
{
    float *vals[MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
        int64_t n = spec_numel(&c->in[i]);
        vals[i] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) {
            double u = c->in[i].lo + (c->in[i].hi - c->in[i].lo) * urand();
            if (c->in[i].relu_safe && fabs(u) < 0.1) {
                u = u < 0 ? u - 0.1 : u + 0.1;
            }
            vals[i][k] = (float)u;
        }
    }
    int64_t n_out = 0;
    eval_L(g, c, vals, NULL, &n_out);
    float *r = malloc((size_t)n_out * sizeof(float));
    for (int64_t k = 0; k < n_out; k++) {
        r[k] = (float)(2.0 * urand() - 1.0);
    }

    /* Analytic gradients. */
    nn_ctx_reset(g);
    nn_ctx_set_step(g, 7);
    nn_tensor *x[MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
        x[i] = nn_tensor_requires_grad(nn_tensor_from(g, vals[i], c->in[i].ndim, c->in[i].shape),
                                       !c->in[i].no_grad);
    }
    nn_tensor *y = build(g, x, c);
    CHECK_MSG(y != NULL, "%s: %s", c->name, accel_last_error(NULL));
    CHECK_OK(NULL, nn_backward_grad(y, r, NULL));
    float *ana[MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
        int64_t n = spec_numel(&c->in[i]);
        ana[i] = calloc((size_t)n, sizeof(float));
        float *gr = nn_tensor_grad(x[i]);
        CHECK_MSG(c->in[i].no_grad || gr != NULL, "%s: input %d got no gradient", c->name, i);
        if (gr != NULL) {
            memcpy(ana[i], gr, (size_t)n * sizeof(float));
        }
    }

    /* Numeric gradients, element by element. */
    double worst = 0.0;
    for (int i = 0; i < c->n_in; i++) {
        if (c->in[i].no_grad) {
            continue;
        }
        int64_t n = spec_numel(&c->in[i]);
        for (int64_t k = 0; k < n; k++) {
            float keep = vals[i][k];
            vals[i][k] = (float)(keep + H);
            double hp = (double)vals[i][k] - keep;
            double Lp = eval_L(g, c, vals, r, NULL);
            vals[i][k] = (float)(keep - H);
            double hm = keep - (double)vals[i][k];
            double Lm = eval_L(g, c, vals, r, NULL);
            vals[i][k] = keep;
            double num = (Lp - Lm) / (hp + hm);
            double a = ana[i][k];
            double err = fabs(a - num), tol = ATOL + RTOL * fmax(fabs(a), fabs(num));
            if (err / tol > worst) {
                worst = err / tol;
            }
            CHECK_MSG(err <= tol, "%s: input %d element %lld: analytic %.6g numeric %.6g", c->name,
                      i, (long long)k, a, num);
        }
    }
    printf("  %-28s ok (worst err/tol %.3f)\n", c->name, worst);
    for (int i = 0; i < c->n_in; i++) {
        free(vals[i]);
        free(ana[i]);
    }
    free(r);
}

static spec sp(int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
    spec s;
    memset(&s, 0, sizeof(s));
    s.ndim = ndim;
    s.shape[0] = a;
    s.shape[1] = b;
    s.shape[2] = c;
    s.shape[3] = d;
    s.lo = -1.5f;
    s.hi = 1.5f;
    return s;
}

static tcase mk(const char *name, kind k, int n_in, spec s0, spec s1)
{
    tcase c;
    memset(&c, 0, sizeof(c));
    c.name = name;
    c.k = k;
    c.n_in = n_in;
    c.in[0] = s0;
    c.in[1] = s1;
    c.in[2] = s1;
    c.ce = nn_cross_entropy_options_default();
    return c;
}

/* NaN and infinite inputs (NaN weights of a diverged run) through every op built on the exp
 * kernel, forward and backward: NaN in, NaN out, and no undefined behaviour (the sanitizer
 * build of this test aborted in the float-to-int conversion of nn__expf). */
static void test_nonfinite(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    float v[4] = {NAN, INFINITY, -INFINITY, 0.5f};
    nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, v, 2, (int64_t[]){1, 4}), 1);
    nn_tensor *outs[6] = {nn_gelu(g, x, 0), nn_gelu(g, x, 1),    nn_tanh(g, x),
                          nn_sigmoid(g, x), nn_softmax(g, x, 1), NULL};
    int32_t target = 3;
    outs[5] = nn_cross_entropy(g, x, &target, NULL);
    nn_tensor *sum = NULL;
    for (int i = 0; i < 6; i++) {
        CHECK(outs[i] != NULL);
        CHECK_MSG(isnan(outs[i]->data[0]), "op %d: f(NaN) = %g", i, (double)outs[i]->data[0]);
        nn_tensor *s = nn_sum_all(g, outs[i]);
        sum = sum == NULL ? s : nn_add(g, sum, s);
    }
    CHECK(isnan(outs[2]->data[0]) && outs[2]->data[1] == 1.0f && outs[2]->data[2] == -1.0f);
    CHECK(outs[3]->data[1] == 1.0f && outs[3]->data[2] == 0.0f);
    CHECK_OK(NULL, nn_backward(sum, 1.0f, NULL));
    CHECK(isnan(nn_tensor_grad(x)[0]));
    nn_ctx_free(g);
}

int main(void)
{
    test_nonfinite();
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    spec none = sp(0, 0, 0, 0, 0);
    /* Rounds 0-1 with flush-to-zero (the default), 2-3 with IEEE subnormals. */
    for (int round = 0; round < 4; round++) {
        int64_t B = irand(1, 3), T = irand(2, 4), C = irand(2, 5);
        nn_ctx_set_flush_denormal(g, round < 2);
        printf("round %d (flush_denormal %d): B=%lld T=%lld C=%lld\n", round, round < 2,
               (long long)B, (long long)T, (long long)C);
        spec x3 = sp(3, B, T, C, 0), row = sp(1, C, 0, 0, 0), mat = sp(2, T, C, 0, 0);
        spec scalar = sp(0, 0, 0, 0, 0), pos = x3;
        pos.lo = 0.5f;
        pos.hi = 2.0f;
        tcase cs[64];
        int n = 0;
        cs[n++] = mk("add same shape", K_ADD, 2, x3, x3);
        cs[n++] = mk("add broadcast [C]", K_ADD, 2, x3, row);
        cs[n++] = mk("add broadcast [T,C] first", K_ADD, 2, mat, x3);
        cs[n++] = mk("sub broadcast [T,C]", K_SUB, 2, x3, mat);
        cs[n++] = mk("sub broadcast first", K_SUB, 2, row, x3);
        cs[n++] = mk("mul broadcast scalar", K_MUL, 2, x3, scalar);
        cs[n++] = mk("mul broadcast [C]", K_MUL, 2, row, x3);
        tcase dv = mk("div broadcast [C]", K_DIV, 2, x3, row);
        dv.in[1].lo = 0.5f;
        dv.in[1].hi = 2.0f;
        cs[n++] = dv;
        tcase dv2 = mk("div same shape", K_DIV, 2, x3, pos);
        cs[n++] = dv2;
        cs[n++] = mk("scale", K_SCALE, 1, x3, none);
        for (int d = -1; d < 3; d++) {
            tcase s = mk(d == -1 ? "sum dim -1 keepdim" : "sum dim", K_SUM, 1, x3, none);
            s.dim = d;
            s.keepdim = d == -1;
            cs[n++] = s;
        }
        tcase mn = mk("mean dim 1", K_MEAN, 1, x3, none);
        mn.dim = 1;
        cs[n++] = mn;
        cs[n++] = mk("sum_all", K_SUM_ALL, 1, x3, none);
        tcase rl = mk("relu", K_RELU, 1, x3, none);
        rl.in[0].relu_safe = 1;
        cs[n++] = rl;
        cs[n++] = mk("gelu (erf)", K_GELU, 1, x3, none);
        cs[n++] = mk("gelu (tanh)", K_GELU_TANH, 1, x3, none);
        cs[n++] = mk("tanh", K_TANH, 1, x3, none);
        cs[n++] = mk("sigmoid", K_SIGMOID, 1, x3, none);
        for (int d = -1; d < 2; d++) {
            tcase s = mk("softmax", K_SOFTMAX, 1, x3, none);
            s.dim = d;
            cs[n++] = s;
            tcase l = mk("log_softmax", K_LOG_SOFTMAX, 1, x3, none);
            l.dim = d;
            cs[n++] = l;
        }
        for (int red = 0; red < 3; red++) {
            for (int ls = 0; ls < 2; ls++) {
                tcase ce = mk(ls ? "cross_entropy smoothed" : "cross_entropy", K_CE, 1, x3, none);
                ce.ce.reduction = (nn_reduction)red;
                ce.ce.label_smoothing = ls ? 0.2f : 0.0f;
                for (int64_t k = 0; k < B * T; k++) {
                    ce.ids[k] = (int32_t)irand(0, C - 1);
                }
                ce.ids[0] = -100; /* always one ignored target */
                cs[n++] = ce;
            }
        }
        for (int red = 0; red < 3; red++) {
            tcase m = mk("mse_loss", K_MSE, 2, x3, x3);
            m.red = (nn_reduction)red;
            m.in[1].no_grad = red == 1;
            cs[n++] = m;
        }
        tcase em = mk("embedding (repeated ids)", K_EMBEDDING, 1, sp(2, 4, C, 0, 0), none);
        int32_t ids[6] = {0, 3, 1, 3, 3, 2};
        memcpy(em.ids, ids, sizeof(ids));
        cs[n++] = em;
        tcase ln = mk("layernorm", K_LAYERNORM, 3, x3, row);
        ln.in[2] = row;
        cs[n++] = ln;
        cs[n++] = mk("layernorm no affine", K_LAYERNORM_NOAFFINE, 1, x3, none);
        tcase dr = mk("dropout p=0.4", K_DROPOUT, 1, x3, none);
        dr.p = 0.4f;
        cs[n++] = dr;
        for (int with_drop = 0; with_drop < 2; with_drop++) {
            int heads = (int)irand(1, 2);
            int64_t hd = irand(1, 3);
            tcase at = mk(with_drop ? "causal_attention dropout" : "causal_attention", K_ATTENTION,
                          1, sp(3, B, T + 1, 3 * heads * hd, 0), none);
            at.n_head = heads;
            at.p = with_drop ? 0.3f : 0.0f;
            cs[n++] = at;
        }
        int64_t K = irand(2, 4), N = irand(2, 4);
        cs[n++] = mk("matmul 2-D rhs", K_MATMUL, 2, x3, sp(2, C, N, 0, 0));
        cs[n++] = mk("matmul batched", K_MATMUL, 2, x3, sp(3, B, C, N, 0));
        for (int layout = 0; layout < 2; layout++) {
            for (int bias = 0; bias < 2; bias++) {
                tcase li = mk(layout ? "linear [in,out]" : "linear [out,in]", K_LINEAR, 2 + bias,
                              x3, layout ? sp(2, C, K, 0, 0) : sp(2, K, C, 0, 0));
                li.in[2] = sp(1, K, 0, 0, 0);
                li.layout = layout;
                li.has_bias = bias;
                cs[n++] = li;
            }
        }
        for (int d = -1; d < 2; d++) {
            tcase cc = mk("concat", K_CONCAT, 3, x3, x3);
            cc.dim = d;
            cc.in[1].shape[d < 0 ? 2 : d] += 1;
            cc.in[2] = x3;
            cs[n++] = cc;
            tcase sl = mk("split (views)", K_SPLIT, 1, sp(3, B, T, C, 0), none);
            sl.dim = d;
            cs[n++] = sl;
        }
        cs[n++] = mk("transpose + contiguous", K_TRANSPOSE, 2, x3, sp(3, C, T, B, 0));
        tcase sc = mk("slice (view)", K_SLICE, 1, sp(3, B, 4, C, 0), none);
        sc.dim = 1;
        cs[n++] = sc;
        cs[n++] = mk("reshape of transposed", K_RESHAPE, 1, sp(3, 2, T, 2, 0), none);
        for (int i = 0; i < n; i++) {
            gradcheck(g, &cs[i]);
        }
    }
    nn_ctx_free(g);
    printf("test_nn_ops: all gradients match\n");
    return 0;
}
