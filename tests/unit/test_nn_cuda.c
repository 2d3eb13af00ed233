/* ACCEL_TEST_LABELS: gpu
 *
 * The nn ops on CUDA (src/nn/cuda/) against the same ops on the CPU, on fresh random inputs
 * each run (the seed is printed; ACCEL_TEST_SEED=N repeats a run): the forward output and the
 * gradient of every input, for a random output gradient (or d(loss) = 1 for a scalar loss),
 * compared as rel = ||gpu - cpu|| / ||cpu||. Before each case the GPU ctx's arena is filled
 * with NaN, so an output or fresh gradient element a kernel forgot to write fails the
 * comparison. Tolerances, per op:
 *  - fp32: 1e-5 forward and backward (add, GELU, dropout, embedding, cross entropy, linear;
 *    the summation order differs from the CPU's, and the CPU's exp/erf/tanh are its own
 *    approximations within a few ulp); LayerNorm and attention gradients 1e-4 (each element
 *    is a difference of row sums, which cancellation amplifies); the composed mini GPT 1e-4;
 *  - bf16 autocast (linear, attention): 1e-2 (both sides round the same operands, but a
 *    product's rounding to bf16 can fall either side of a tie on the other device's sum);
 *  - nn_linear_gelu_linear, fused by cuBLASLt's GELU_AUX_BIAS / DGELU_BGRAD epilogues: 1e-2 in
 *    fp32 (cuBLASLt's tanh GELU and its derivative are its own approximations, not the CPU's
 *    formula) and 2e-2 under bf16 autocast (the hidden gradient is not rounded before GELU's
 *    derivative, as the three ops round it); where it takes the three ops (the erf form, a
 *    hidden width not a multiple of 8) the ops' own tolerances.
 * Dropout (also inside attention) draws the CPU's counter-based mask: the same elements drop.
 * Also: ops without a CUDA implementation and mixed CPU/GPU inputs fail with a message naming
 * the op, and an accel_model's parameters on the GPU (nn_model_sink) compute and take their
 * gradients there like the same model's on the CPU. The host ids and targets ops stage through
 * pinned memory (asynchronous copies, double-buffered across steps) are checked over several
 * steps, the caller's buffer overwritten as soon as each op returns, one step outgrowing the
 * staging so it grows within the step. Exits 77 (skipped) where the build has no CUDA
 * or no GPU can be used.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "check.h"

#define POISON_N ((int64_t)4 << 20) /* floats of NaN laid in the GPU arena before each case */
#define MAX_IN 6

static nn_ctx *gcpu, *ggpu;
static uint64_t seed;
static float *poison_buf;

static uint64_t next(void) /* splitmix64 */
{
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float frand(void) /* uniform in [-1, 1) */
{
    return (float)((double)(next() >> 11) * 0x1p-52 - 1.0);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL);
    return p;
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= shape[d];
    }
    return n;
}

/* ||out - ref|| / ||ref|| over the columns [c0, c0 + n) of rows x ld matrices. */
static double rel_err_cols(const float *out, const float *ref, int64_t rows, int64_t ld, int64_t c0,
                           int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = c0; c < c0 + n; c++) {
            double d = (double)out[r * ld + c] - (double)ref[r * ld + c];
            num += d * d;
            den += (double)ref[r * ld + c] * (double)ref[r * ld + c];
        }
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static double rel_err(const float *out, const float *ref, int64_t n)
{
    return rel_err_cols(out, ref, 1, n, 0, n);
}

/* Resets a ctx to the same state on both devices (step, seed, autocast); on the GPU, lays NaN
 * over the start of its arena first, where the case's tensors will be carved. */
static void prepare(nn_ctx *g, int is_gpu, int autocast)
{
    int64_t shape[1] = {POISON_N};
    nn_ctx_reset(g);
    if (is_gpu) {
        for (int k = 0; k < 2; k++) { /* twice: the first may grow the arena by a new block */
            CHECK_MSG(nn_tensor_from(g, poison_buf, 1, shape) != NULL, "%s",
                      accel_last_error(NULL));
            nn_ctx_reset(g);
        }
    }
    nn_ctx_set_step(g, 7);
    nn_ctx_set_seed(g, 1234);
    nn_ctx_set_autocast(g, autocast);
    nn_ctx_set_training(g, 1);
}

typedef struct in_spec {
    int ndim;
    int64_t shape[4];
    float scale, offset; /* values: offset + scale * U(-1, 1) */
    int grad;            /* requires grad */
} in_spec;

typedef nn_tensor *(*case_fn)(nn_ctx *g, nn_tensor **in, const void *arg);

typedef struct run_out {
    float *y;
    int64_t ny;
    float *grads[MAX_IN];
} run_out;

/* One forward (and, unless `forward_only`, backward: from gout, or d(y) = 1 when it is NULL)
 * on g; the output and input gradients come back in host memory. */
static run_out run_one(nn_ctx *g, int is_gpu, int autocast, const in_spec *spec, int n_in,
                       float *const *data, case_fn fn, const void *arg, const float *gout,
                       int forward_only)
{
    run_out r;
    memset(&r, 0, sizeof(r));
    prepare(g, is_gpu, autocast);
    nn_tensor *in[MAX_IN] = {NULL};
    for (int k = 0; k < n_in; k++) {
        in[k] = nn_tensor_from(g, data[k], spec[k].ndim, spec[k].shape);
        CHECK_MSG(in[k] != NULL, "%s", accel_last_error(NULL));
        nn_tensor_requires_grad(in[k], spec[k].grad);
    }
    nn_tensor *y = fn(g, in, arg);
    CHECK_MSG(y != NULL, "%s: %s", is_gpu ? "gpu" : "cpu", accel_last_error(NULL));
    r.ny = nn_numel(y);
    r.y = xmalloc((size_t)r.ny * sizeof(float));
    CHECK_OK(NULL, nn_tensor_to_host(y, r.y));
    if (forward_only) {
        return r;
    }
    if (gout == NULL) {
        CHECK_OK(NULL, nn_backward(y, 1.0f, NULL));
    } else {
        CHECK_OK(NULL, nn_backward_grad(y, gout, NULL));
    }
    for (int k = 0; k < n_in; k++) {
        if (spec[k].grad) {
            r.grads[k] = xmalloc((size_t)nn_numel(in[k]) * sizeof(float));
            CHECK_OK(NULL, nn_tensor_grad_to_host(in[k], r.grads[k]));
        }
    }
    return r;
}

static void free_run(run_out *r, int n_in)
{
    free(r->y);
    for (int k = 0; k < n_in; k++) {
        free(r->grads[k]);
    }
}

/* Runs fn on both devices over the same random inputs and output gradient and compares. */
static void check_case(const char *name, const in_spec *spec, int n_in, case_fn fn, const void *arg,
                       int autocast, int scalar, double tol_fwd, double tol_grad)
{
    float *data[MAX_IN];
    for (int k = 0; k < n_in; k++) {
        int64_t n = numel(spec[k].ndim, spec[k].shape);
        data[k] = xmalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            data[k][i] = spec[k].offset + spec[k].scale * frand();
        }
    }
    /* A forward on the CPU sizes the output gradient. */
    run_out c = run_one(gcpu, 0, autocast, spec, n_in, data, fn, arg, NULL, !scalar);
    float *gout = NULL;
    if (!scalar) {
        gout = xmalloc((size_t)c.ny * sizeof(float));
        for (int64_t i = 0; i < c.ny; i++) {
            gout[i] = frand();
        }
        free_run(&c, n_in);
        c = run_one(gcpu, 0, autocast, spec, n_in, data, fn, arg, gout, 0);
    }
    run_out gg = run_one(ggpu, 1, autocast, spec, n_in, data, fn, arg, gout, 0);
    CHECK_MSG(gg.ny == c.ny, "%s: %lld outputs on the GPU, %lld on the CPU", name, (long long)gg.ny,
              (long long)c.ny);
    double e = rel_err(gg.y, c.y, c.ny);
    printf("  %-34s forward %.3g", name, e);
    CHECK_MSG(e <= tol_fwd, "%s: forward rel err %g > %g", name, e, tol_fwd);
    for (int k = 0; k < n_in; k++) {
        if (spec[k].grad) {
            double eg = rel_err(gg.grads[k], c.grads[k], numel(spec[k].ndim, spec[k].shape));
            printf(", grad %d %.3g", k, eg);
            CHECK_MSG(eg <= tol_grad, "%s: gradient of input %d: rel err %g > %g", name, k, eg,
                      tol_grad);
        }
    }
    printf("\n");
    fflush(stdout);
    free_run(&c, n_in);
    free_run(&gg, n_in);
    free(gout);
    for (int k = 0; k < n_in; k++) {
        free(data[k]);
    }
}

/* ---- the cases ---- */

static nn_tensor *f_add(nn_ctx *g, nn_tensor **in, const void *arg)
{
    (void)arg;
    return nn_add(g, in[0], in[1]);
}

static nn_tensor *f_gelu(nn_ctx *g, nn_tensor **in, const void *arg)
{
    return nn_gelu(g, in[0], *(const int *)arg);
}

static nn_tensor *f_dropout(nn_ctx *g, nn_tensor **in, const void *arg)
{
    /* Two dropouts: the second op index must key its mask as the CPU's does. */
    return nn_dropout(g, nn_dropout(g, in[0], *(const float *)arg), 0.5f);
}

typedef struct emb_arg {
    const int32_t *ids;
    int64_t shape[2];
} emb_arg;

static nn_tensor *f_embedding(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const emb_arg *a = arg;
    return nn_embedding(g, in[0], a->ids, 2, a->shape);
}

static nn_tensor *f_layernorm(nn_ctx *g, nn_tensor **in, const void *arg)
{
    (void)arg;
    return nn_layernorm(g, in[0], in[1], in[2], 1e-5f);
}

static nn_tensor *f_layernorm_plain(nn_ctx *g, nn_tensor **in, const void *arg)
{
    (void)arg;
    return nn_layernorm(g, in[0], NULL, NULL, 1e-5f);
}

typedef struct lin_arg {
    nn_layout layout;
    int bias;
} lin_arg;

static nn_tensor *f_linear(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const lin_arg *a = arg;
    return nn_linear(g, in[0], in[1], a->bias ? in[2] : NULL, a->layout);
}

typedef struct ce_arg {
    const int32_t *targets;
    nn_cross_entropy_options opts;
} ce_arg;

static nn_tensor *f_ce(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const ce_arg *a = arg;
    return nn_cross_entropy(g, in[0], a->targets, &a->opts);
}

typedef struct attn_arg {
    int n_head;
    float p;
} attn_arg;

static nn_tensor *f_attention(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const attn_arg *a = arg;
    return nn_causal_attention(g, in[0], a->n_head, a->p);
}

/* Two attentions over the same qkv: the second backward adds to the first's gradient. */
static nn_tensor *f_attention_twice(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const attn_arg *a = arg;
    nn_tensor *y1 = nn_causal_attention(g, in[0], a->n_head, a->p);
    return nn_add(g, y1, nn_causal_attention(g, in[0], a->n_head, a->p));
}

typedef struct lgl_arg {
    nn_layout layout;
    int b1, b2, approximate;
} lgl_arg;

/* in: x, w1, w2, b1, b2. */
static nn_tensor *f_lgl(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const lgl_arg *a = arg;
    return nn_linear_gelu_linear(g, in[0], in[1], a->b1 ? in[3] : NULL, in[2], a->b2 ? in[4] : NULL,
                                 a->layout, a->approximate);
}

/* A small GPT-2 step with every GPU op, a tied embedding (used by embedding and the head:
 * its gradient accumulates) and a residual read twice. in: wte [V, C], wpe [T, C], ln w, ln b,
 * c_attn [C, 3C], c_proj [C, C]. */
typedef struct gpt_arg {
    const int32_t *ids, *targets, *pos;
    int64_t B, T;
    int n_head;
} gpt_arg;

static nn_tensor *f_gpt(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const gpt_arg *a = arg;
    int64_t shape[2] = {a->B, a->T}, pshape[1] = {a->T};
    nn_tensor *h = nn_add(g, nn_embedding(g, in[0], a->ids, 2, shape),
                          nn_embedding(g, in[1], a->pos, 1, pshape));
    nn_tensor *x = nn_layernorm(g, h, in[2], in[3], 1e-5f);
    nn_tensor *qkv = nn_linear(g, x, in[4], NULL, NN_LAYOUT_IN_OUT);
    nn_tensor *att = nn_causal_attention(g, qkv, a->n_head, 0.1f);
    nn_tensor *proj = nn_gelu(g, nn_linear(g, att, in[5], NULL, NN_LAYOUT_IN_OUT), 1);
    h = nn_add(g, h, nn_dropout(g, proj, 0.1f));
    x = nn_layernorm(g, h, in[2], in[3], 1e-5f);
    nn_tensor *logits = nn_linear(g, x, in[0], NULL, NN_LAYOUT_OUT_IN);
    return nn_cross_entropy(g, logits, a->targets, NULL);
}

static void test_elementwise(void)
{
    in_spec same[2] = {{3, {3, 5, 7}, 1.0f, 0.0f, 1}, {3, {3, 5, 7}, 1.0f, 0.0f, 1}};
    check_case("add [3,5,7] + [3,5,7]", same, 2, f_add, NULL, ACCEL_F32, 0, 1e-5, 1e-5);
    in_spec bcast[2] = {{3, {4, 6, 33}, 1.0f, 0.0f, 1}, {1, {33}, 1.0f, 0.0f, 1}};
    check_case("add [4,6,33] + [33]", bcast, 2, f_add, NULL, ACCEL_F32, 0, 1e-5, 1e-5);
    in_spec bcast2[2] = {{1, {33}, 1.0f, 0.0f, 1}, {2, {70, 33}, 1.0f, 0.0f, 1}};
    check_case("add [33] + [70,33]", bcast2, 2, f_add, NULL, ACCEL_F32, 0, 1e-5, 1e-5);
    in_spec x[1] = {{2, {7, 1001}, 4.0f, 0.0f, 1}};
    int exact = 0, tanh_form = 1;
    check_case("gelu (erf)", x, 1, f_gelu, &exact, ACCEL_F32, 0, 1e-5, 1e-5);
    check_case("gelu (tanh)", x, 1, f_gelu, &tanh_form, ACCEL_F32, 0, 1e-5, 1e-5);
    float p = 0.3f;
    check_case("dropout 0.3 then 0.5", x, 1, f_dropout, &p, ACCEL_F32, 0, 1e-6, 1e-6);
}

static void test_embedding(void)
{
    int32_t ids[3 * 17];
    for (int i = 0; i < 3 * 17; i++) {
        ids[i] = (int32_t)(next() % 20); /* 51 ids over 20 rows of 50: repeats and unused rows */
    }
    emb_arg a = {ids, {3, 17}};
    in_spec w[1] = {{2, {50, 40}, 1.0f, 0.0f, 1}};
    check_case("embedding [50,40] by [3,17]", w, 1, f_embedding, &a, ACCEL_F32, 0, 1e-6, 1e-6);
}

static void test_layernorm(void)
{
    in_spec s[3] = {
        {3, {4, 9, 96}, 2.0f, 3.0f, 1}, {1, {96}, 1.0f, 1.0f, 1}, {1, {96}, 1.0f, 0.0f, 1}};
    check_case("layernorm [4,9,96]", s, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
    in_spec wide[3] = {
        {2, {5, 1000}, 1.0f, -2.0f, 1}, {1, {1000}, 1.0f, 1.0f, 1}, {1, {1000}, 1.0f, 0.0f, 1}};
    check_case("layernorm [5,1000]", wide, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
    in_spec plain[1] = {{2, {6, 333}, 1.0f, 0.5f, 1}};
    check_case("layernorm [6,333] no affine", plain, 1, f_layernorm_plain, NULL, ACCEL_F32, 0, 1e-5,
               1e-4);
}

static void test_linear(void)
{
    static const struct {
        const char *name;
        int64_t M0, M1, in, out;
        nn_layout layout;
        int bias, autocast;
        double tol;
    } cases[] = {
        {"linear [out,in] + bias", 2, 5, 24, 40, NN_LAYOUT_OUT_IN, 1, ACCEL_F32, 1e-5},
        {"linear [in,out] + bias", 2, 5, 24, 40, NN_LAYOUT_IN_OUT, 1, ACCEL_F32, 1e-5},
        {"linear [out,in] odd sizes", 1, 7, 13, 9, NN_LAYOUT_OUT_IN, 0, ACCEL_F32, 1e-5},
        {"linear [in,out] odd sizes + bias", 3, 5, 17, 11, NN_LAYOUT_IN_OUT, 1, ACCEL_F32, 1e-5},
        {"linear bf16 [out,in] + bias", 4, 16, 64, 48, NN_LAYOUT_OUT_IN, 1, ACCEL_BF16, 1e-2},
        {"linear bf16 [in,out] + bias", 4, 16, 64, 48, NN_LAYOUT_IN_OUT, 1, ACCEL_BF16, 1e-2},
        {"linear bf16 [in,out]", 2, 8, 32, 96, NN_LAYOUT_IN_OUT, 0, ACCEL_BF16, 1e-2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int in_out = cases[i].layout == NN_LAYOUT_IN_OUT;
        in_spec s[3] = {{3, {cases[i].M0, cases[i].M1, cases[i].in}, 1.0f, 0.0f, 1},
                        {2,
                         {in_out ? cases[i].in : cases[i].out, in_out ? cases[i].out : cases[i].in},
                         0.5f,
                         0.0f,
                         1},
                        {1, {cases[i].out}, 1.0f, 0.0f, 1}};
        lin_arg a = {cases[i].layout, cases[i].bias};
        check_case(cases[i].name, s, cases[i].bias ? 3 : 2, f_linear, &a, cases[i].autocast, 0,
                   cases[i].tol, cases[i].tol);
    }
}

static void test_cross_entropy(void)
{
    enum { ROWS = 21, C = 1000 };
    int32_t t[ROWS];
    for (int r = 0; r < ROWS; r++) {
        t[r] = r % 5 == 3 ? -100 : (int32_t)(next() % C);
    }
    in_spec s[1] = {{3, {3, 7, C}, 3.0f, 0.0f, 1}};
    ce_arg a = {t, nn_cross_entropy_options_default()};
    check_case("cross_entropy mean", s, 1, f_ce, &a, ACCEL_F32, 1, 1e-5, 1e-5);
    a.opts.label_smoothing = 0.1f;
    a.opts.reduction = NN_REDUCTION_SUM;
    check_case("cross_entropy sum, smoothing 0.1", s, 1, f_ce, &a, ACCEL_F32, 1, 1e-5, 1e-5);
    a.opts.reduction = NN_REDUCTION_NONE;
    check_case("cross_entropy none, smoothing 0.1", s, 1, f_ce, &a, ACCEL_F32, 0, 1e-5, 1e-5);
}

static void test_attention(void)
{
    static const struct {
        const char *name;
        int64_t B, T, C;
        int H;
        float p;
        int autocast;
        double tol_fwd, tol_grad;
    } cases[] = {
        {"attention B2 T37 H3 hd16", 2, 37, 48, 3, 0.0f, ACCEL_F32, 1e-5, 1e-4},
        {"attention B1 T64 H2 hd64", 1, 64, 128, 2, 0.0f, ACCEL_F32, 1e-5, 1e-4},
        {"attention hd40 dropout 0.2", 2, 20, 80, 2, 0.2f, ACCEL_F32, 1e-5, 1e-4},
        /* Autocast without dropout, hd a multiple of 16 up to 128: the tensor-core forward
         * and backward (partial query and key tiles, whole tiles, both tile shapes, fp16, one
         * row); hd 160 and dropout: the warp kernels. */
        {"attention bf16 T33 H4 hd32", 2, 33, 128, 4, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 B2 H3 T70 hd64", 2, 70, 192, 3, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T128 hd64", 1, 128, 128, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T130 hd32", 1, 130, 64, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T90 hd128", 1, 90, 256, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention fp16 T70 hd48", 2, 70, 96, 2, 0.0f, ACCEL_F16, 1e-2, 1e-2},
        {"attention fp16 T1 hd64", 2, 1, 128, 2, 0.0f, ACCEL_F16, 1e-2, 1e-2},
        {"attention bf16 T20 hd160 (warp)", 1, 20, 160, 1, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 dropout 0.1 (warp)", 2, 24, 64, 2, 0.1f, ACCEL_BF16, 1e-2, 1e-2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        in_spec s[1] = {{3, {cases[i].B, cases[i].T, 3 * cases[i].C}, 1.5f, 0.0f, 1}};
        attn_arg a = {cases[i].H, cases[i].p};
        check_case(cases[i].name, s, 1, f_attention, &a, cases[i].autocast, 0, cases[i].tol_fwd,
                   cases[i].tol_grad);
    }
    in_spec s[1] = {{3, {1, 70, 3 * 128}, 1.5f, 0.0f, 1}};
    attn_arg a = {2, 0.0f};
    check_case("attention bf16 twice (grads add up)", s, 1, f_attention_twice, &a, ACCEL_BF16, 0,
               1e-2, 1e-2);
}

#ifdef ACCEL_HAVE_CUDA
void nn_cu_attn_set_kernel(int kind); /* nn_kernels.h: 0 auto (tensor cores), 1 warp kernels */
void nn_cu_attn_tc_counts(unsigned long *fwd, unsigned long *bwd); /* nn_kernels.h */

/* The attention forward, then the kernel its backward will take (arg: attn_kind_arg). */
typedef struct attn_kind_arg {
    attn_arg attn;
    int bwd_kind;
} attn_kind_arg;

static nn_tensor *f_attention_then(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const attn_kind_arg *a = arg;
    nn_tensor *y = nn_causal_attention(g, in[0], a->attn.n_head, a->attn.p);
    nn_cu_attn_set_kernel(a->bwd_kind);
    return y;
}
#endif

/* The tensor-core kernels against the warp kernels on the same GPU and inputs, three runs:
 * both directions on tensor cores (tc), the tensor-core forward with the warp backward (mixed)
 * and both warp (warp). The kernels' counters say which ran (results alone cannot: every sum
 * is rounded to bf16 / fp16, so the two kernels can agree bit for bit). tc and mixed share
 * their forward bit for bit, so their gradients differ only by the backward: dq, dk and dv
 * within 2e-3 each (both backwards round the same operands and sum in fp32; the emulator's
 * agree bit for bit in bf16; 2e-3 still fails a 1% error in any one of them). Otherwise 1e-2
 * as against the CPU. */
static void test_attention_kernels(void)
{
#ifdef ACCEL_HAVE_CUDA
    static const struct {
        const char *name;
        int64_t B, T, C;
        int H;
        int autocast;
    } cases[] = {
        {"bf16 B2 H3 T70 hd64", 2, 70, 192, 3, ACCEL_BF16},
        {"bf16 T128 hd64", 1, 128, 128, 2, ACCEL_BF16},
        {"bf16 T90 hd128", 1, 90, 256, 2, ACCEL_BF16},
        {"fp16 T70 hd48", 1, 70, 96, 2, ACCEL_F16},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t B = cases[i].B, T = cases[i].T, C = cases[i].C, n = B * T * 3 * C;
        in_spec s[1] = {{3, {B, T, 3 * C}, 1.5f, 0.0f, 1}};
        attn_kind_arg tc_arg = {{cases[i].H, 0.0f}, 0}, mixed_arg = {{cases[i].H, 0.0f}, 1};
        float *data[1] = {xmalloc((size_t)n * sizeof(float))};
        float *gout = xmalloc((size_t)(B * T * C) * sizeof(float));
        for (int64_t k = 0; k < n; k++) {
            data[0][k] = 1.5f * frand();
        }
        for (int64_t k = 0; k < B * T * C; k++) {
            gout[k] = frand();
        }
        int ac = cases[i].autocast;
        unsigned long f0, b0, f1, b1, f2, b2, f3, b3;
        nn_cu_attn_tc_counts(&f0, &b0);
        nn_cu_attn_set_kernel(0);
        run_out tc = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &tc_arg, gout, 0);
        nn_cu_attn_tc_counts(&f1, &b1);
        nn_cu_attn_set_kernel(0);
        run_out mixed = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &mixed_arg, gout, 0);
        nn_cu_attn_tc_counts(&f2, &b2);
        nn_cu_attn_set_kernel(1);
        run_out warp = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &mixed_arg, gout, 0);
        nn_cu_attn_tc_counts(&f3, &b3);
        nn_cu_attn_set_kernel(0);
        CHECK_MSG(f1 - f0 == 1 && b1 - b0 == 1 && f2 - f1 == 1 && b2 - b1 == 0 && f3 == f2 &&
                      b3 == b2,
                  "attention %s: tensor-core forwards / backwards queued per run: tc %lu / %lu "
                  "(want 1 / 1), mixed %lu / %lu (1 / 0), warp %lu / %lu (0 / 0)",
                  cases[i].name, f1 - f0, b1 - b0, f2 - f1, b2 - b1, f3 - f2, b3 - b2);
        double ey = rel_err(tc.y, warp.y, tc.ny), ey_mixed = rel_err(tc.y, mixed.y, tc.ny);
        double eb[3], eg = rel_err(tc.grads[0], warp.grads[0], n);
        for (int part = 0; part < 3; part++) { /* dq, dk, dv */
            eb[part] = rel_err_cols(tc.grads[0], mixed.grads[0], B * T, 3 * C, part * C, C);
        }
        printf("  attention %-19s tensor cores vs warp: forward %.3g, backward dq %.3g dk %.3g "
               "dv %.3g, both %.3g\n",
               cases[i].name, ey, eb[0], eb[1], eb[2], eg);
        CHECK_MSG(ey_mixed == 0.0, "attention %s: the same forward differs between runs (%g)",
                  cases[i].name, ey_mixed);
        CHECK_MSG(eb[0] <= 2e-3 && eb[1] <= 2e-3 && eb[2] <= 2e-3,
                  "attention %s: tensor-core backward vs warp backward (same forward): dq %g, "
                  "dk %g, dv %g > 2e-3",
                  cases[i].name, eb[0], eb[1], eb[2]);
        CHECK_MSG(ey <= 1e-2 && eg <= 1e-2,
                  "attention %s: tensor cores vs warp: forward %g, forward and backward %g",
                  cases[i].name, ey, eg);
        free_run(&tc, 1);
        free_run(&mixed, 1);
        free_run(&warp, 1);
        free(gout);
        free(data[0]);
    }
#endif
}

static void test_gpt(void)
{
    enum { B = 2, T = 16, C = 32, V = 40 };
    int32_t ids[B * T], targets[B * T], pos[T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(next() % V);
        targets[i] = (int32_t)(next() % V);
    }
    for (int i = 0; i < T; i++) {
        pos[i] = i;
    }
    gpt_arg a = {ids, targets, pos, B, T, 2};
    in_spec s[6] = {{2, {V, C}, 0.5f, 0.0f, 1},     {2, {T, C}, 0.5f, 0.0f, 1},
                    {1, {C}, 0.2f, 1.0f, 1},        {1, {C}, 0.2f, 0.0f, 1},
                    {2, {C, 3 * C}, 0.3f, 0.0f, 1}, {2, {C, C}, 0.3f, 0.0f, 1}};
    check_case("mini GPT step (all ops composed)", s, 6, f_gpt, &a, ACCEL_F32, 1, 1e-4, 1e-4);
}

static void test_linear_gelu_linear(void)
{
    static const struct {
        const char *name;
        int64_t in, hidden, out;
        nn_layout layout;
        int b1, b2, approximate, grad_x, autocast;
        double tol;
    } cases[] = {
        {"lgl fused [in,out] biases", 24, 64, 40, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_F32, 1e-2},
        {"lgl fused [out,in] biases", 24, 64, 40, NN_LAYOUT_OUT_IN, 1, 1, 1, 1, ACCEL_F32, 1e-2},
        {"lgl fused no b1, odd in/out", 13, 32, 9, NN_LAYOUT_IN_OUT, 0, 1, 1, 1, ACCEL_F32, 1e-2},
        {"lgl fused, x without grad", 32, 96, 32, NN_LAYOUT_IN_OUT, 1, 0, 1, 0, ACCEL_F32, 1e-2},
        {"lgl fused bf16 [in,out]", 64, 256, 64, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_BF16, 2e-2},
        {"lgl fused bf16 [out,in]", 48, 128, 40, NN_LAYOUT_OUT_IN, 1, 1, 1, 1, ACCEL_BF16, 2e-2},
        {"lgl hidden 12: three ops", 16, 12, 16, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_F32, 1e-5},
        {"lgl erf form: three ops", 16, 32, 16, NN_LAYOUT_IN_OUT, 1, 1, 0, 1, ACCEL_F32, 1e-5},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int io = cases[i].layout == NN_LAYOUT_IN_OUT;
        int64_t in = cases[i].in, hid = cases[i].hidden, out = cases[i].out;
        in_spec s[5] = {{3, {2, 7, in}, 1.5f, 0.0f, cases[i].grad_x},
                        {2, {io ? in : hid, io ? hid : in}, 0.4f, 0.0f, 1},
                        {2, {io ? hid : out, io ? out : hid}, 0.3f, 0.0f, 1},
                        {1, {hid}, 0.5f, 0.0f, cases[i].b1},
                        {1, {out}, 0.5f, 0.0f, cases[i].b2}};
        lgl_arg a = {cases[i].layout, cases[i].b1, cases[i].b2, cases[i].approximate};
        check_case(cases[i].name, s, 5, f_lgl, &a, cases[i].autocast, 0, cases[i].tol,
                   cases[i].tol);
    }
    /* Only the second weight needs a gradient: the first product records nothing and the
     * second is a plain linear. */
    in_spec s[5] = {{3, {2, 5, 16}, 1.0f, 0.0f, 0},
                    {2, {16, 64}, 0.4f, 0.0f, 0},
                    {2, {64, 8}, 0.3f, 0.0f, 1},
                    {1, {64}, 0.5f, 0.0f, 0},
                    {1, {8}, 0.5f, 0.0f, 1}};
    lgl_arg a = {NN_LAYOUT_IN_OUT, 1, 1, 1};
    check_case("lgl fused, only w2 b2 with grad", s, 5, f_lgl, &a, ACCEL_F32, 0, 1e-2, 1e-2);
}

/* Ids and targets go to the GPU from pinned staging, asynchronously: the caller's buffer is
 * free as soon as the op returns (overwritten here at once), one step's banks alternate with
 * the next's, and a step that stages more than its bank holds waits for it and grows it. */
static void test_staging(void)
{
    enum { V = 97, C = 8 };
    /* (Under the CUDA emulator, where a row's block of threads costs much, 7000 outgrow too.) */
    const int64_t max_n = getenv("ACCEL_CUEMU") != NULL ? 7000 : 70000;
    float *w = xmalloc((size_t)V * C * sizeof(float)), *logits = xmalloc(2 * max_n * sizeof(float));
    int32_t *ids = xmalloc(max_n * sizeof(int32_t)), *keep = xmalloc(3 * max_n * sizeof(int32_t));
    float *yg = xmalloc((size_t)max_n * C * sizeof(float));
    for (int i = 0; i < V * C; i++) {
        w[i] = frand();
    }
    for (int step = 0; step < 6; step++) {
        /* Step 3 stages 3 x max_n ids (820 KiB, or 82): more than the banks held until then. */
        int64_t n = step == 3 ? max_n : 50 + 1000 * step, reps = step == 3 ? 3 : 2;
        int64_t wshape[2] = {V, C}, shape[1] = {n};
        nn_ctx_reset(ggpu);
        nn_tensor *wt = nn_tensor_from(ggpu, w, 2, wshape);
        nn_tensor *ys[3] = {NULL};
        for (int r = 0; r < reps; r++) {
            for (int64_t i = 0; i < n; i++) {
                ids[i] = keep[r * max_n + i] = (int32_t)(next() % V);
            }
            ys[r] = nn_embedding(ggpu, wt, ids, 1, shape);
            CHECK_MSG(ys[r] != NULL, "staging step %d: %s", step, accel_last_error(NULL));
            memset(ids, 0, (size_t)n * sizeof(int32_t)); /* the op must not read it any more */
        }
        for (int r = 0; r < reps; r++) {
            CHECK_OK(NULL, nn_tensor_to_host(ys[r], yg));
            for (int64_t i = 0; i < n * C; i++) {
                float want = w[keep[r * max_n + i / C] * C + i % C];
                CHECK_MSG(yg[i] == want, "staging step %d, copy %d: row %lld has the wrong ids",
                          step, r, (long long)(i / C));
            }
        }
        /* Targets too: rows of logits {0, 64} cost exactly 64 for target 0 and 0 for target 1
         * (e^-64 vanishes next to 1), so the summed loss counts the zeros staged. */
        int64_t lshape[2] = {n, 2}, zeros = 0;
        for (int64_t i = 0; i < n; i++) {
            logits[2 * i] = 0.0f;
            logits[2 * i + 1] = 64.0f;
            ids[i] = (int32_t)(next() % 2);
            zeros += ids[i] == 0;
        }
        nn_tensor *l = nn_tensor_from(ggpu, logits, 2, lshape);
        nn_cross_entropy_options o = nn_cross_entropy_options_default();
        o.reduction = NN_REDUCTION_SUM;
        nn_tensor *loss = nn_cross_entropy(ggpu, l, ids, &o);
        memset(ids, 0, (size_t)n * sizeof(int32_t));
        CHECK_MSG(loss != NULL, "staging step %d: %s", step, accel_last_error(NULL));
        float got = nn_item(loss);
        CHECK_MSG(got == 64.0f * (float)zeros, "staging step %d: cross entropy %g, want %g", step,
                  (double)got, 64.0 * (double)zeros);
    }
    nn_ctx_reset(ggpu);
    printf("  staging: 6 steps of ids and targets, one outgrowing the banks: ok\n");
    free(w);
    free(logits);
    free(ids);
    free(keep);
    free(yg);
}

/* Ops without a CUDA kernel, and CPU tensors given to a GPU op, fail naming the op. */
static void test_errors(void)
{
    prepare(ggpu, 1, ACCEL_F32);
    nn_ctx_reset(gcpu);
    int64_t shape[2] = {2, 3};
    float v[6] = {1, 2, 3, 4, 5, 6};
    nn_tensor *x = nn_tensor_from(ggpu, v, 2, shape), *h = nn_tensor_from(gcpu, v, 2, shape);
    CHECK(x != NULL && h != NULL);
    CHECK(nn_softmax(ggpu, x, -1) == NULL);
    CHECK_MSG(strcmp(accel_last_error(NULL),
                     "nn_softmax: not implemented on CUDA yet (the ctx computes on cuda:0)") == 0,
              "%s", accel_last_error(NULL));
    CHECK(nn_matmul(ggpu, x, x) == NULL);
    CHECK(strstr(accel_last_error(NULL), "nn_matmul: not implemented on CUDA") != NULL);
    CHECK(nn_softmax(gcpu, x, -1) == NULL); /* a GPU tensor on a CPU ctx */
    CHECK_MSG(strcmp(accel_last_error(NULL),
                     "nn_softmax: not implemented on CUDA yet (input 0 is on the GPU)") == 0,
              "%s", accel_last_error(NULL));
    CHECK(nn_embedding(ggpu, h, (const int32_t[]){0}, 0, NULL) == NULL); /* CPU weight */
    CHECK(strstr(accel_last_error(NULL), "nn_embedding: input 0 is in host memory") != NULL);
    CHECK(nn_add(ggpu, x, h) == NULL);
    CHECK_MSG(strcmp(accel_last_error(NULL),
                     "nn_add: input 1 is in host memory and the ctx on cuda:0") == 0,
              "%s", accel_last_error(NULL));
    CHECK(nn_transpose(ggpu, x, 0, 1) != NULL);                   /* a view is fine ... */
    CHECK(nn_gelu(ggpu, nn_transpose(ggpu, x, 0, 1), 0) == NULL); /* ... a strided input not */
    CHECK(strstr(accel_last_error(NULL), "strided view") != NULL);
    /* A ctx holding tensors cannot move. */
    CHECK(nn_ctx_set_device(ggpu, (accel_device){ACCEL_DEVICE_CPU, 0}) == ACCEL_ESTATE);
    float item = nn_item(x);
    CHECK(item == 1.0f);
}

/* The parameters of an accel_model on the GPU (the accelerator's device in a CUDA build):
 * nn_model_sink binds the model's device views, nn_params_init writes them, a GPU ctx computes
 * with them and accumulates their gradients in the model's device memory, as the same model
 * kept on the CPU does with a CPU ctx (fp32 1e-5); nn_params_zero_grad zeroes them. A CPU ctx
 * refuses them naming the parameter; an op without a CUDA kernel names itself. */
static void test_model_params(void)
{
    accel *acc = NULL;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    if (accel_device_of(acc).type != ACCEL_DEVICE_CUDA) {
        printf("test_nn_cuda: model parameters not checked: accel runs on %s\n",
               accel_device_name(acc));
        accel_free(acc);
        return;
    }
    enum { IN = 24, OUT = 40, ROWS = 6 };
    accel_model *m[2];
    nn_params *p[2];
    nn_linear_layer l[2];
    for (int d = 0; d < 2; d++) { /* 0: the GPU (default), 1: kept on the CPU */
        CHECK_OK(acc, accel_model_new(acc, &m[d]));
        if (d == 1) {
            CHECK_OK(acc, accel_model_set_device(m[d], (accel_device){ACCEL_DEVICE_CPU, 0}));
        }
        CHECK_OK(NULL, nn_params_for_model(&p[d], m[d]));
        CHECK_OK(NULL, nn_linear_declare(&l[d], p[d], "fc", IN, OUT, 1, NN_LAYOUT_IN_OUT));
        CHECK_OK(NULL, nn_params_bind(p[d]));
        CHECK_OK(NULL, nn_params_init(p[d], 7));
    }
    const accel_param *wp = accel_model_param(m[0], 0);
    CHECK(wp != NULL && wp->data == NULL && wp->data_view.device.type == ACCEL_DEVICE_CUDA);
    CHECK(l[0].weight->data == wp->data_view.data && l[0].weight->grad == wp->grad_view.data);
    float w[2][IN * OUT], x[ROWS * IN], dy[ROWS * OUT], y[2][ROWS * OUT], gw[2][IN * OUT];
    float gb[2][OUT];
    for (int d = 0; d < 2; d++) {
        CHECK_OK(NULL, nn_tensor_to_host(l[d].weight, w[d]));
    }
    CHECK(memcmp(w[0], w[1], sizeof w[0]) == 0); /* the same init, wherever it lands */
    for (int i = 0; i < ROWS * IN; i++) {
        x[i] = frand();
    }
    for (int i = 0; i < ROWS * OUT; i++) {
        dy[i] = frand();
    }
    int64_t xs[2] = {ROWS, IN};
    for (int d = 0; d < 2; d++) {
        nn_ctx *g = d == 0 ? ggpu : gcpu;
        prepare(g, d == 0, ACCEL_F32);
        for (int rep = 0; rep < 2; rep++) { /* two passes: gradients accumulate */
            nn_tensor *xt = nn_tensor_from(g, x, 2, xs);
            nn_tensor *yt = nn_linear_forward(g, &l[d], xt);
            CHECK_MSG(yt != NULL, "%s", accel_last_error(NULL));
            CHECK_OK(NULL, nn_tensor_to_host(yt, y[d]));
            CHECK_OK(NULL, nn_backward_grad(yt, dy, NULL));
            nn_ctx_reset(g);
        }
        CHECK_OK(NULL, nn_tensor_grad_to_host(l[d].weight, gw[d]));
        CHECK_OK(NULL, nn_tensor_grad_to_host(l[d].bias, gb[d]));
    }
    double ey = rel_err(y[0], y[1], ROWS * OUT), ew = rel_err(gw[0], gw[1], IN * OUT);
    double eb = rel_err(gb[0], gb[1], OUT);
    printf("  %-28s fwd %.2e  grad weight %.2e  bias %.2e\n", "model parameters on the GPU", ey, ew,
           eb);
    CHECK_MSG(ey <= 1e-5 && ew <= 1e-5 && eb <= 1e-5, "%g %g %g", ey, ew, eb);
    nn_params_zero_grad(p[0]);
    CHECK_OK(NULL, nn_tensor_grad_to_host(l[0].weight, gw[0]));
    for (int i = 0; i < IN * OUT; i++) {
        CHECK(gw[0][i] == 0.0f);
    }
    /* A CPU ctx refuses GPU parameters; an op without a CUDA kernel names itself. */
    prepare(ggpu, 1, ACCEL_F32);
    nn_ctx_reset(gcpu);
    nn_tensor *xc = nn_tensor_from(gcpu, x, 2, xs);
    CHECK(nn_linear_forward(gcpu, &l[0], xc) == NULL);
    CHECK_MSG(accel_last_status(NULL) == ACCEL_EINVAL &&
                  strstr(accel_last_error(NULL), "nn_linear: parameter 0 is on the GPU") != NULL,
              "%s", accel_last_error(NULL));
    CHECK(nn_relu(ggpu, l[0].weight) == NULL);
    CHECK_MSG(accel_last_status(NULL) == ACCEL_EUNSUPPORTED &&
                  strstr(accel_last_error(NULL), "nn_relu: not implemented on CUDA") != NULL,
              "%s", accel_last_error(NULL));
    nn_ctx_reset(gcpu);
    nn_ctx_reset(ggpu);
    for (int d = 0; d < 2; d++) {
        nn_params_free(p[d]);
        accel_model_free(m[d]);
    }
    accel_free(acc);
}

int main(void)
{
    /* nn says at level info when cuBLASLt offers no algorithm with a fused epilogue (the op
     * then runs plain products and kernels): show it in this test's output. */
    if (getenv("ACCEL_LOG_LEVEL") == NULL) {
        setenv("ACCEL_LOG_LEVEL", "info", 1);
    }
    CHECK_OK(NULL, nn_ctx_new(&gcpu));
    CHECK_OK(NULL, nn_ctx_new(&ggpu));
    accel_status st = nn_ctx_set_device(ggpu, (accel_device){ACCEL_DEVICE_CUDA, 0});
    if (st != ACCEL_OK) {
        CHECK_MSG(st == ACCEL_EUNSUPPORTED, "%s: %s", accel_status_name(st),
                  accel_last_error(NULL));
        fprintf(stderr, "test_nn_cuda: skipped: %s\n", accel_last_error(NULL));
        nn_ctx_free(ggpu);
        nn_ctx_free(gcpu);
        return 77;
    }
    CHECK(nn_ctx_device(ggpu).type == ACCEL_DEVICE_CUDA);
    const char *s = getenv("ACCEL_TEST_SEED");
    seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("test_nn_cuda: seed %llu (ACCEL_TEST_SEED=%llu repeats this run)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    fflush(stdout);
    poison_buf = xmalloc((size_t)POISON_N * sizeof(float));
    for (int64_t i = 0; i < POISON_N; i++) {
        poison_buf[i] = NAN;
    }
    test_elementwise();
    test_embedding();
    test_layernorm();
    test_linear();
    test_cross_entropy();
    test_attention();
    test_attention_kernels();
    test_gpt();
    test_linear_gelu_linear();
    test_staging();
    test_errors();
    test_model_params();
    free(poison_buf);
    nn_ctx_free(ggpu);
    nn_ctx_free(gcpu);
    printf("test_nn_cuda: ok\n");
    return 0;
}
