/*
 * nn_linear_cross_entropy on the CPU against nn_linear + nn_cross_entropy over the same inputs:
 * the loss and the gradients of x and w. With one chunk holding every row and a seed of 1 they
 * are the same bits (fp32 and bf16 autocast); with several chunks (a few rows each, and a last
 * partial one) fp32 agrees to 1e-5 and bf16 to 1e-2 (dW sums the chunks in fp32 before its one
 * rounding to bf16, the unfused op sums all rows in one product); a seed of 0.37 to 1e-5
 * (fp32: the product of the scaled gradient against the scaled product). Cases: both weight
 * layouts, mean and sum, ignore_index (a chunk of ignored rows only), label smoothing, a weight
 * also read by an embedding (gradients add), no-grad (loss only, nothing recorded, no gradient
 * memory), reduction none (forward only), recomputation (nn_checkpoint over layernorm + the
 * op: the same bits), the chunk's scratch staying below the logits' size, and the errors.
 * ACCEL_NN_CE_CHUNK_ROWS is set to 3 before the first call, so defaults take 3-row chunks, and
 * the small GPT's fused loss (nn_gpt_forward without logits) matches its unfused one to 1e-5.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/nn.h"
#include "check.h"

static uint64_t rng = 0x1234567ull;

static float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) * 0x1p-52 - 1.0);
}

static void fill(float *a, int64_t n, float scale) /* scale * frand(), in index order */
{
    for (int64_t i = 0; i < n; i++) {
        a[i] = scale * frand();
    }
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

typedef struct lce_case {
    const char *name;
    int64_t rows, C, V;
    nn_layout layout;
    nn_reduction reduction;
    float eps;          /* label smoothing */
    int ignore_every;   /* every k-th target ignored (0: none; < 0: rows 3..5 all ignored) */
    int64_t chunk_rows; /* 0: the env's 3 */
    accel_dtype autocast;
    float seed;
    int emb;    /* w also read by an embedding */
    double tol; /* 0: the same bits */
} lce_case;

typedef struct result {
    float loss;
    float *gx, *gw;
    nn_ctx_stats stats;
} result;

static result run(const lce_case *k, const float *xv, const float *wv, const int32_t *t, int fused)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    nn_ctx_set_autocast(g, k->autocast);
    int in_out = k->layout == NN_LAYOUT_IN_OUT;
    int64_t xs[2] = {k->rows, k->C}, ws[2] = {in_out ? k->C : k->V, in_out ? k->V : k->C};
    nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, xv, 2, xs), 1);
    nn_tensor *w = nn_tensor_requires_grad(nn_tensor_from(g, wv, 2, ws), 1);
    CHECK(x != NULL && w != NULL);
    nn_tensor *h = x;
    if (k->emb) { /* x + w's first rows picked by the targets: w gets two contributions */
        int32_t ids[64];
        for (int64_t r = 0; r < k->rows; r++) {
            ids[r] = (int32_t)(r % (in_out ? k->C : k->V));
        }
        h = nn_add(g, x, nn_embedding(g, w, ids, 1, &k->rows));
    }
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.reduction = k->reduction;
    o.label_smoothing = k->eps;
    o.chunk_rows = k->chunk_rows;
    nn_tensor *loss = fused ? nn_linear_cross_entropy(g, h, w, t, k->layout, &o)
                            : nn_cross_entropy(g, nn_linear(g, h, w, NULL, k->layout), t, &o);
    CHECK_MSG(loss != NULL, "%s: %s", k->name, accel_last_error(NULL));
    result r;
    r.loss = nn_item(loss);
    CHECK_OK(NULL, nn_backward(loss, k->seed, NULL));
    r.stats = nn_ctx_get_stats(g);
    r.gx = malloc((size_t)(k->rows * k->C) * sizeof(float));
    r.gw = malloc((size_t)(k->V * k->C) * sizeof(float));
    CHECK(r.gx != NULL && r.gw != NULL);
    CHECK_OK(NULL, nn_tensor_grad_to_host(x, r.gx));
    CHECK_OK(NULL, nn_tensor_grad_to_host(w, r.gw));
    nn_ctx_free(g);
    return r;
}

static void check_case(const lce_case *k)
{
    int64_t nx = k->rows * k->C, nw = k->V * k->C;
    float *xv = malloc((size_t)nx * sizeof(float)), *wv = malloc((size_t)nw * sizeof(float));
    int32_t t[64];
    CHECK(xv != NULL && wv != NULL && k->rows <= 64);
    fill(xv, nx, 2.0f);
    fill(wv, nw, 1.0f);
    for (int64_t r = 0; r < k->rows; r++) {
        int32_t v = (int32_t)((frand() + 1.0f) * 0.5f * (float)k->V);
        t[r] = v < k->V ? v : (int32_t)k->V - 1;
        int ignored =
            k->ignore_every > 0 ? r % k->ignore_every == 1 : k->ignore_every < 0 && r >= 3 && r < 6;
        t[r] = ignored ? -100 : t[r];
    }
    result f = run(k, xv, wv, t, 1), u = run(k, xv, wv, t, 0);
    double el = fabs((double)f.loss - u.loss) / (fabs(u.loss) > 0 ? fabs(u.loss) : 1.0);
    double ex = rel_err(f.gx, u.gx, nx), ew = rel_err(f.gw, u.gw, nw);
    printf("  %-40s loss %.9g vs %.9g (%.2g), dx %.2g, dw %.2g\n", k->name, (double)f.loss,
           (double)u.loss, el, ex, ew);
    if (k->tol == 0.0) {
        CHECK_MSG(memcmp(&f.loss, &u.loss, sizeof(float)) == 0, "%s: loss differs", k->name);
        CHECK_MSG(memcmp(f.gx, u.gx, (size_t)nx * sizeof(float)) == 0, "%s: dx differs", k->name);
        CHECK_MSG(memcmp(f.gw, u.gw, (size_t)nw * sizeof(float)) == 0, "%s: dw differs", k->name);
    } else {
        CHECK_MSG(el <= 1e-6 && ex <= k->tol && ew <= k->tol, "%s: errors above %g", k->name,
                  k->tol);
    }
    /* The fused op's per-op scratch holds a chunk, not the logits (and their gradient). */
    if (k->chunk_rows != 0 && k->chunk_rows < k->rows / 2) {
        CHECK_MSG(f.stats.scratch_peak_nbytes < (size_t)(k->rows * k->V) * sizeof(float),
                  "%s: scratch %zu bytes", k->name, f.stats.scratch_peak_nbytes);
    }
    free(f.gx);
    free(f.gw);
    free(u.gx);
    free(u.gw);
    free(xv);
    free(wv);
}

static void test_against_unfused(void)
{
    const nn_layout OI = NN_LAYOUT_OUT_IN, IO = NN_LAYOUT_IN_OUT;
    const nn_reduction MEAN = NN_REDUCTION_MEAN, SUM = NN_REDUCTION_SUM;
    const lce_case cases[] = {
        {"one chunk fp32", 13, 24, 50, OI, MEAN, 0.0f, 0, 64, ACCEL_F32, 1.0f, 0, 0.0},
        {"one chunk fp32 [in, out] sum", 13, 24, 50, IO, SUM, 0.0f, 4, 13, ACCEL_F32, 1.0f, 0, 0.0},
        {"one chunk bf16", 13, 24, 50, OI, MEAN, 0.0f, 4, 13, ACCEL_BF16, 1.0f, 0, 0.0},
        {"one chunk fp16", 13, 24, 50, OI, MEAN, 0.0f, 0, 20, ACCEL_F16, 1.0f, 0, 0.0},
        {"one chunk bf16 sum seed 4", 13, 24, 50, OI, SUM, 0.0f, 0, 20, ACCEL_BF16, 4.0f, 0, 0.0},
        {"one chunk fp32 embedding", 13, 24, 50, OI, MEAN, 0.0f, 0, 13, ACCEL_F32, 1.0f, 1, 0.0},
        {"chunks of 3 (env) fp32", 13, 24, 50, OI, MEAN, 0.0f, 0, 0, ACCEL_F32, 1.0f, 0, 1e-5},
        {"chunks of 4 fp32 ignore", 13, 24, 50, OI, MEAN, 0.0f, 3, 4, ACCEL_F32, 1.0f, 0, 1e-5},
        {"chunks of 3 an all-ignored chunk", 12, 16, 40, OI, MEAN, 0.0f, -1, 3, ACCEL_F32, 1.0f, 0,
         1e-5},
        {"chunks of 5 [in, out] sum", 17, 8, 33, IO, SUM, 0.0f, 0, 5, ACCEL_F32, 1.0f, 0, 1e-5},
        {"chunks of 4 label smoothing 0.1", 13, 24, 50, OI, MEAN, 0.1f, 0, 4, ACCEL_F32, 1.0f, 0,
         1e-5},
        {"chunks of 4 seed 0.37", 13, 24, 50, OI, MEAN, 0.0f, 0, 4, ACCEL_F32, 0.37f, 0, 1e-5},
        {"chunks of 4 embedding", 13, 24, 50, OI, MEAN, 0.0f, 5, 4, ACCEL_F32, 1.0f, 1, 1e-5},
        {"chunks of 3 bf16", 13, 24, 50, OI, MEAN, 0.0f, 4, 3, ACCEL_BF16, 1.0f, 0, 1e-2},
        {"chunks of 3 bf16 [in, out] seed 0.37", 13, 24, 50, IO, SUM, 0.0f, 0, 3, ACCEL_BF16, 0.37f,
         0, 1e-2},
        {"chunks of 64 rows 64", 64, 32, 300, OI, MEAN, 0.0f, 0, 7, ACCEL_F32, 1.0f, 0, 1e-5},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        check_case(&cases[i]);
    }
}

/* No grad: the loss alone, no node, no gradient memory; reduction none matches per row. */
static void test_forward_only(void)
{
    enum { R = 10, C = 8, V = 30 };
    float xv[R * C], wv[V * C];
    int32_t t[R];
    fill(xv, R * C, 1.0f);
    fill(wv, V * C, 1.0f);
    for (int r = 0; r < R; r++) {
        t[r] = r == 4 ? -100 : (r * 7) % V;
    }
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    int64_t xs[2] = {R, C}, ws[2] = {V, C};
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.reduction = NN_REDUCTION_NONE;
    for (int grad = 0; grad < 2; grad++) {
        nn_ctx_reset(g);
        nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, xv, 2, xs), 1);
        nn_tensor *w = nn_tensor_requires_grad(nn_tensor_from(g, wv, 2, ws), 1);
        int prev = nn_ctx_set_grad_enabled(g, grad);
        nn_tensor *y = nn_linear_cross_entropy(g, x, w, t, NN_LAYOUT_OUT_IN, &o);
        if (grad) {
            CHECK(y == NULL && accel_last_status(NULL) == ACCEL_EUNSUPPORTED);
            CHECK(strstr(accel_last_error(NULL), "reduction none is forward-only") != NULL);
        } else {
            CHECK_MSG(y != NULL && y->ndim == 1 && y->shape[0] == R, "%s", accel_last_error(NULL));
            nn_tensor *ref = nn_cross_entropy(g, nn_linear(g, x, w, NULL, NN_LAYOUT_OUT_IN), t, &o);
            CHECK(ref != NULL && rel_err(y->data, ref->data, R) <= 1e-6);
            CHECK(y->data[4] == 0.0f);
            CHECK(nn_ctx_get_stats(g).n_nodes == 0);
        }
        nn_ctx_set_grad_enabled(g, prev);
    }
    /* Mean without grad: no dW in the arena (only the loss and its tensor). */
    nn_ctx_reset(g);
    nn_tensor *x = nn_tensor_from(g, xv, 2, xs), *w = nn_tensor_from(g, wv, 2, ws);
    size_t before = nn_ctx_get_stats(g).used_nbytes;
    nn_tensor *y = nn_linear_cross_entropy(g, x, w, t, NN_LAYOUT_OUT_IN, NULL);
    CHECK(y != NULL && nn_ctx_get_stats(g).n_nodes == 0);
    CHECK(nn_ctx_get_stats(g).used_nbytes - before < (size_t)(V * C) * sizeof(float));
    nn_ctx_free(g);
}

static void test_errors(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    int64_t xs[2] = {3, 4}, ws[2] = {5, 4}, bad[2] = {5, 3};
    nn_tensor *x = nn_tensor_new(g, 2, xs), *w = nn_tensor_new(g, 2, ws);
    nn_tensor *wb = nn_tensor_new(g, 2, bad);
    int32_t t[3] = {0, 4, 1}, tbad[3] = {0, 5, 1};
    CHECK(nn_linear_cross_entropy(g, x, wb, t, NN_LAYOUT_OUT_IN, NULL) == NULL);
    CHECK(strcmp(accel_last_error(NULL),
                 "nn_linear_cross_entropy: input [3, 4] does not match weight [5, 3] ([out, in] "
                 "layout; weight 2-D and not empty)") == 0);
    CHECK(nn_linear_cross_entropy(g, x, w, tbad, NN_LAYOUT_OUT_IN, NULL) == NULL);
    CHECK(strcmp(accel_last_error(NULL),
                 "nn_linear_cross_entropy: target 5 at position 1 is outside [0, 5) and not "
                 "ignore_index -100") == 0);
    CHECK(nn_linear_cross_entropy(g, x, w, NULL, NN_LAYOUT_OUT_IN, NULL) == NULL);
    CHECK(accel_last_status(NULL) == ACCEL_EINVAL);
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.chunk_rows = -1;
    CHECK(nn_linear_cross_entropy(g, x, w, t, NN_LAYOUT_OUT_IN, &o) == NULL);
    CHECK(accel_last_status(NULL) == ACCEL_EINVAL);
    CHECK(nn_linear_cross_entropy(g, NULL, w, t, NN_LAYOUT_OUT_IN, NULL) == NULL);
    CHECK(nn_linear_cross_entropy(NULL, x, w, t, NN_LAYOUT_OUT_IN, NULL) == NULL);
    CHECK(accel_last_status(NULL) == ACCEL_EINVAL);
    nn_ctx_free(g);
}

/* layernorm + the op as a recomputed segment gives the plain call's bits. */
typedef struct seg_arg {
    nn_tensor *w;
    const int32_t *t;
} seg_arg;

static nn_tensor *segment(nn_ctx *g, void *ctx, nn_tensor *x)
{
    const seg_arg *a = ctx;
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.chunk_rows = 4;
    return nn_linear_cross_entropy(g, nn_layernorm(g, x, NULL, NULL, 1e-5f), a->w, a->t,
                                   NN_LAYOUT_OUT_IN, &o);
}

static void test_recompute(void)
{
    enum { R = 11, C = 16, V = 40 };
    float xv[R * C], wv[V * C];
    int32_t t[R];
    fill(xv, R * C, 1.0f);
    fill(wv, V * C, 1.0f);
    for (int r = 0; r < R; r++) {
        t[r] = (r * 13) % V;
    }
    float loss[2], gx[2][R * C], gw[2][V * C];
    for (int rc = 0; rc < 2; rc++) {
        nn_ctx *g;
        CHECK_OK(NULL, nn_ctx_new(&g));
        int64_t xs[2] = {R, C}, ws[2] = {V, C};
        nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, xv, 2, xs), 1);
        seg_arg a = {nn_tensor_requires_grad(nn_tensor_from(g, wv, 2, ws), 1), t};
        nn_tensor *y = rc ? nn_checkpoint(g, segment, &a, x) : segment(g, &a, x);
        CHECK_MSG(y != NULL, "%s", accel_last_error(NULL));
        loss[rc] = nn_item(y);
        CHECK_OK(NULL, nn_backward(y, 1.0f, NULL));
        CHECK_OK(NULL, nn_tensor_grad_to_host(x, gx[rc]));
        CHECK_OK(NULL, nn_tensor_grad_to_host(a.w, gw[rc]));
        nn_ctx_free(g);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    CHECK(memcmp(gx[0], gx[1], sizeof(gx[0])) == 0 && memcmp(gw[0], gw[1], sizeof(gw[0])) == 0);
    printf("  recompute: loss %.9g, same bits\n", (double)loss[0]);
}

/* The small GPT (tied head): nn_gpt_forward without logits (fused, 3-row chunks from the env)
 * against the same forward asking for the logits (unfused). */
static void test_gpt(void)
{
    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_embd = 16;
    cfg.block_size = 8;
    cfg.vocab_size = 40;
    cfg.dropout = 0.0f;
    nn_gpt *m;
    nn_params *p;
    CHECK_OK(NULL, nn_gpt_build(&m, &p, &cfg, 5));
    int64_t n;
    float *grad = nn_params_flat_grad(p, &n);
    float *ref = malloc((size_t)n * sizeof(float));
    CHECK(grad != NULL && ref != NULL);
    enum { B = 2, T = 8 };
    int32_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 7) % 40;
        tg[i] = i == 5 ? -100 : (i * 11 + 3) % 40;
    }
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    float loss[2];
    for (int fused = 0; fused < 2; fused++) {
        nn_params_zero_grad(p);
        nn_tensor *logits = NULL, *l = NULL;
        CHECK_OK(NULL, nn_gpt_forward(g, m, ids, tg, B, T, fused ? NULL : &logits, &l));
        CHECK(fused || logits != NULL);
        loss[fused] = nn_item(l);
        CHECK_OK(NULL, nn_backward(l, 1.0f, NULL));
        if (!fused) {
            memcpy(ref, grad, (size_t)n * sizeof(float));
        }
        nn_ctx_reset(g);
    }
    double e = rel_err(grad, ref, n);
    printf("  gpt: loss %.9g fused, %.9g unfused, gradients %.2g\n", (double)loss[1],
           (double)loss[0], e);
    CHECK(fabsf(loss[1] - loss[0]) <= 1e-6f * fabsf(loss[0]) && e <= 1e-5);
    nn_ctx_free(g);
    free(ref);
    nn_gpt_free(m);
    nn_params_free(p);
}

int main(void)
{
    setenv("ACCEL_NN_CE_CHUNK_ROWS", "3", 1); /* read at the first call */
    test_against_unfused();
    test_forward_only();
    test_errors();
    test_recompute();
    test_gpt();
    printf("test_nn_lce: ok\n");
    return 0;
}
