/* ACCEL_TEST_LABELS: gpu
 *
 * The nn ops on CUDA (src/nn/cuda/) against the same ops on the CPU, through
 * tests/nn_cuda_check.h (fresh random inputs each run, the forward output and the gradient of
 * every input for a random output gradient, or d(loss) = 1 for a scalar loss, over a
 * NaN-poisoned GPU arena). Attention has its own program (test_nn_cuda_attn.c). Tolerances,
 * per op:
 *  - fp32: 1e-5 forward and backward (add, GELU, dropout, embedding, cross entropy, linear;
 *    the summation order differs from the CPU's, and the CPU's exp/erf/tanh are its own
 *    approximations within a few ulp); LayerNorm gradients 1e-4 (each element is a difference
 *    of row sums, which cancellation amplifies); the composed mini GPT 1e-4;
 *  - bf16 autocast (linear): 1e-2 (both sides round the same operands, but a product's
 *    rounding to bf16 can fall either side of a tie on the other device's sum); the same
 *    with the bias gradient summed by cuBLASLt's BGRADA / BGRADB epilogue (ACCEL_NN_BGRAD=1)
 *    and by its fallback, and for a linear used twice (the bias gradient accumulates);
 *  - nn_linear_gelu_linear, fused by cuBLASLt's GELU_AUX_BIAS / DGELU_BGRAD epilogues: 1e-2 in
 *    fp32 (cuBLASLt's tanh GELU and its derivative are its own approximations, not the CPU's
 *    formula) and 2e-2 under bf16 autocast (the hidden gradient is not rounded before GELU's
 *    derivative, as the three ops round it); under autocast by default (a plain 2-byte
 *    product, then one kernel for the derivative and the bias gradient, which rounds the
 *    hidden gradient first as the three ops do) 1e-2; where it takes the three ops (the erf
 *    form, a hidden width not a multiple of 8) the ops' own tolerances.
 * Dropout draws the CPU's counter-based mask: the same elements drop. LayerNorm also with
 * only its weight or only its bias taking a gradient, over several blocks of rows.
 * Also: ops without a CUDA implementation and mixed CPU/GPU inputs fail with a message naming
 * the op, and an accel_model's parameters on the GPU (nn_model_sink) compute and take their
 * gradients there like the same model's on the CPU. The host ids and targets ops stage through
 * pinned memory (asynchronous copies, double-buffered across steps) are checked over several
 * steps, the caller's buffer overwritten as soon as each op returns, one step outgrowing the
 * staging so it grows within the step. Exits 77 (skipped) where the build has no CUDA
 * or no GPU can be used.
 */
#include "nn_cuda_check.h"

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

/* The same linear twice, added: every gradient (the bias's too) takes two contributions. */
static nn_tensor *f_linear_twice(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const lin_arg *a = arg;
    nn_tensor *b = a->bias ? in[2] : NULL;
    return nn_add(g, nn_linear(g, in[0], in[1], b, a->layout),
                  nn_linear(g, in[0], in[1], b, a->layout));
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
    /* 999 and 1002 elements: the vector kernels' scalar tails (3 and 2 elements). */
    in_spec odd[1] = {{2, {3, 333}, 4.0f, 0.0f, 1}}, even[1] = {{2, {3, 334}, 4.0f, 0.0f, 1}};
    check_case("gelu (tanh) [3,333]", odd, 1, f_gelu, &tanh_form, ACCEL_F32, 0, 1e-5, 1e-5);
    check_case("gelu (erf) [3,334]", even, 1, f_gelu, &exact, ACCEL_F32, 0, 1e-5, 1e-5);
    /* The bias gradient summed over 1300 rows: three chunks of partial sums, then their sum. */
    in_spec tall[2] = {{2, {1300, 20}, 1.0f, 0.0f, 1}, {1, {20}, 1.0f, 0.0f, 1}};
    check_case("add [1300,20] + [20]", tall, 2, f_add, NULL, ACCEL_F32, 0, 1e-5, 1e-5);
    in_spec tall_odd[2] = {{1, {37}, 1.0f, 0.0f, 1}, {3, {4, 150, 37}, 1.0f, 0.0f, 1}};
    check_case("add [37] + [4,150,37]", tall_odd, 2, f_add, NULL, ACCEL_F32, 0, 1e-5, 1e-5);
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
    /* 2000 ids, one of them a third of all rows, over 300 columns (two blocks of columns):
     * every row of gw still sums its rows in row order, as the CPU does (bit for bit). */
    static int32_t many[2000];
    for (int i = 0; i < 2000; i++) {
        many[i] = i % 3 == 1 ? 7 : (int32_t)(next() % 290);
    }
    emb_arg b = {many, {4, 500}};
    in_spec wide[1] = {{2, {300, 300}, 1.0f, 0.0f, 1}};
    check_case("embedding [300,300] by [4,500]", wide, 1, f_embedding, &b, ACCEL_F32, 0, 0.0, 0.0);
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
    /* 2100 rows of an odd width: the parameter gradients in five chunks, then their sum. */
    in_spec tall[3] = {
        {3, {3, 700, 37}, 1.0f, 0.5f, 1}, {1, {37}, 1.0f, 1.0f, 1}, {1, {37}, 1.0f, 0.0f, 1}};
    check_case("layernorm [3,700,37]", tall, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
    /* The register-row kernels' widths: 768 (6 float4s a lane), 512 (4), GPT-2's 9 rows of a
     * block of 8. */
    in_spec gpt2[3] = {
        {2, {9, 768}, 1.0f, 0.5f, 1}, {1, {768}, 1.0f, 1.0f, 1}, {1, {768}, 1.0f, 0.0f, 1}};
    check_case("layernorm [9,768]", gpt2, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
    /* 300 rows: the parameter gradients from three blocks of 128 rows (the last partial). */
    in_spec gpt2_tall[3] = {
        {3, {2, 150, 768}, 1.0f, 0.5f, 1}, {1, {768}, 1.0f, 1.0f, 1}, {1, {768}, 1.0f, 0.0f, 1}};
    check_case("layernorm [2,150,768]", gpt2_tall, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
    in_spec half_k[1] = {{2, {17, 512}, 1.0f, -0.5f, 1}};
    check_case("layernorm [17,512] no affine", half_k, 1, f_layernorm_plain, NULL, ACCEL_F32, 0,
               1e-5, 1e-4);
}

/* One of LayerNorm's two parameters taking a gradient (the other's spec grad 0), over several
 * blocks of rows: the weight's or the bias's partial rows summed alone (both together are one
 * launch), by the register-row kernel (768) and by the row kernel's column sums (37). */
static void test_layernorm_one_param(void)
{
    for (int k = 0; k < 2; k++) {
        in_spec s[3] = {{3, {2, 150, 768}, 1.0f, 0.5f, 1},
                        {1, {768}, 1.0f, 1.0f, k == 0},
                        {1, {768}, 1.0f, 0.0f, k == 1}};
        char name[64];
        snprintf(name, sizeof(name), "layernorm [2,150,768] %s only", k ? "bias" : "weight");
        check_case(name, s, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
        in_spec tall[3] = {{3, {3, 700, 37}, 1.0f, 0.5f, 1},
                           {1, {37}, 1.0f, 1.0f, k == 0},
                           {1, {37}, 1.0f, 0.0f, k == 1}};
        snprintf(name, sizeof(name), "layernorm [3,700,37] %s only", k ? "bias" : "weight");
        check_case(name, tall, 3, f_layernorm, NULL, ACCEL_F32, 0, 1e-5, 1e-4);
    }
}

#ifdef ACCEL_HAVE_CUDA
void accel__nn_cu_lt_epilogues(int level); /* gpu_internal.h: 2 all, 1 no DGELU_BGRAD, 0 none */
void accel__nn_cu_dgelu_kernel(int on);    /* gpu_internal.h: 1 kernel (default), 0 epilogue */
void accel__nn_cu_bgrad_epilogue(int on);  /* gpu_internal.h: 0 column sums (default), 1 BGRAD */
#else
/* The library without CUDA has no such hooks (and this program skips before any case). */
static void accel__nn_cu_lt_epilogues(int level)
{
    (void)level;
}
static void accel__nn_cu_dgelu_kernel(int on)
{
    (void)on;
}
static void accel__nn_cu_bgrad_epilogue(int on)
{
    (void)on;
}
#endif

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
        /* Bias gradients over more than one chunk of rows (fp32 dY, the bf16 copy). */
        {"linear [in,out] 1100 rows + bias", 2, 550, 16, 36, NN_LAYOUT_IN_OUT, 1, ACCEL_F32, 1e-5},
        {"linear bf16 [out,in] 1200 rows + bias", 3, 400, 32, 40, NN_LAYOUT_OUT_IN, 1, ACCEL_BF16,
         1e-2},
        {"linear bf16 [in,out] 1100 rows + bias", 2, 550, 24, 264, NN_LAYOUT_IN_OUT, 1, ACCEL_BF16,
         1e-2},
        {"linear fp16 [out,in] + bias", 4, 16, 64, 48, NN_LAYOUT_OUT_IN, 1, ACCEL_F16, 1e-2},
        {"linear bf16 [out,in] 1200 rows, out 13", 3, 400, 16, 13, NN_LAYOUT_OUT_IN, 1, ACCEL_BF16,
         1e-2},
    };
    /* Each case three ways: the bias gradient by the column-sum kernel (the default); by
     * cuBLASLt's BGRADA / BGRADB epilogue in the weight-gradient product (ACCEL_NN_BGRAD=1);
     * and that switch on where cuBLASLt has no such algorithm (the column-sum kernel into the
     * epilogue's scratch). The same tolerances: only the order of the fp32 sum differs. Then
     * a linear used twice, so that the bias gradient accumulates a second contribution. */
    static const char *const mode[3] = {"", " (BGRAD epilogue)", " (BGRAD, no epilogues)"};
    size_t n_cases = sizeof(cases) / sizeof(cases[0]);
    for (size_t r = 0; r < 3 * n_cases + 6; r++) {
        size_t i = r < 3 * n_cases ? r % n_cases : (r - 3 * n_cases) % 2 + 4;
        int m = (int)(r < 3 * n_cases ? r / n_cases : (r - 3 * n_cases) / 2);
        int twice = r >= 3 * n_cases;
        accel__nn_cu_bgrad_epilogue(m > 0);
        accel__nn_cu_lt_epilogues(m == 2 ? 0 : 2);
        char name[96];
        snprintf(name, sizeof name, "%s%s%s", twice ? "twice: " : "", cases[i].name, mode[m]);
        int in_out = cases[i].layout == NN_LAYOUT_IN_OUT;
        in_spec s[3] = {{3, {cases[i].M0, cases[i].M1, cases[i].in}, 1.0f, 0.0f, 1},
                        {2,
                         {in_out ? cases[i].in : cases[i].out, in_out ? cases[i].out : cases[i].in},
                         0.5f,
                         0.0f,
                         1},
                        {1, {cases[i].out}, 1.0f, 0.0f, 1}};
        lin_arg a = {cases[i].layout, cases[i].bias};
        check_case(name, s, cases[i].bias ? 3 : 2, twice ? f_linear_twice : f_linear, &a,
                   cases[i].autocast, 0, cases[i].tol, cases[i].tol);
    }
    accel__nn_cu_bgrad_epilogue(0);
    accel__nn_cu_lt_epilogues(2);
    /* fp32 too, twice (fresh, then accumulated), both layouts, over two chunks of rows. */
    for (int m = 0; m < 3; m++) {
        for (int io = 0; io < 2; io++) {
            accel__nn_cu_bgrad_epilogue(m > 0);
            accel__nn_cu_lt_epilogues(m == 2 ? 0 : 2);
            char name[96];
            snprintf(name, sizeof name, "twice: linear %s 600 rows + bias%s",
                     io ? "[in,out]" : "[out,in]", mode[m]);
            in_spec s[3] = {{3, {2, 300, 20}, 1.0f, 0.0f, 1},
                            {2, {io ? 20 : 36, io ? 36 : 20}, 0.5f, 0.0f, 1},
                            {1, {36}, 1.0f, 0.0f, 1}};
            lin_arg a = {io ? NN_LAYOUT_IN_OUT : NN_LAYOUT_OUT_IN, 1};
            check_case(name, s, 3, f_linear_twice, &a, ACCEL_F32, 0, 1e-5, 1e-5);
        }
    }
    accel__nn_cu_bgrad_epilogue(0);
    accel__nn_cu_lt_epilogues(2);
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

typedef struct lgl_case {
    const char *name;
    int64_t rows, in, hidden, out;
    nn_layout layout;
    int b1, b2, approximate, grad_x, autocast;
    double tol;
} lgl_case;

/* One nn_linear_gelu_linear case against the CPU, named name, at tolerance tol. */
static void check_lgl(const lgl_case *c, const char *name, double tol)
{
    int io = c->layout == NN_LAYOUT_IN_OUT;
    int64_t in = c->in, hid = c->hidden, out = c->out;
    in_spec s[5] = {{3, {2, c->rows, in}, 1.5f, 0.0f, c->grad_x},
                    {2, {io ? in : hid, io ? hid : in}, 0.4f, 0.0f, 1},
                    {2, {io ? hid : out, io ? out : hid}, 0.3f, 0.0f, 1},
                    {1, {hid}, 0.5f, 0.0f, c->b1},
                    {1, {out}, 0.5f, 0.0f, c->b2}};
    lgl_arg a = {c->layout, c->b1, c->b2, c->approximate};
    check_case(name, s, 5, f_lgl, &a, c->autocast, 0, tol, tol);
}

static void test_linear_gelu_linear(void)
{
    static const lgl_case cases[] = {
        {"lgl fused [in,out] biases", 7, 24, 64, 40, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_F32, 1e-2},
        {"lgl fused [out,in] biases", 7, 24, 64, 40, NN_LAYOUT_OUT_IN, 1, 1, 1, 1, ACCEL_F32, 1e-2},
        {"lgl fused no b1, odd in/out", 7, 13, 32, 9, NN_LAYOUT_IN_OUT, 0, 1, 1, 1, ACCEL_F32,
         1e-2},
        {"lgl fused, x without grad", 7, 32, 96, 32, NN_LAYOUT_IN_OUT, 1, 0, 1, 0, ACCEL_F32, 1e-2},
        {"lgl fused bf16 [in,out]", 7, 64, 256, 64, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_BF16, 2e-2},
        {"lgl fused bf16 [out,in]", 7, 48, 128, 40, NN_LAYOUT_OUT_IN, 1, 1, 1, 1, ACCEL_BF16, 2e-2},
        {"lgl fused bf16 no b1, x without grad", 7, 24, 64, 16, NN_LAYOUT_IN_OUT, 0, 1, 1, 0,
         ACCEL_BF16, 2e-2},
        {"lgl fused fp16 [in,out]", 7, 64, 128, 48, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_F16, 2e-2},
        /* 600 rows: the hidden gradient's bias sum over two chunks of rows (scratch partial
         * rows); hidden 264: a full and a partial block of 256 columns. */
        {"lgl fused bf16, 600 rows, hidden 264", 300, 16, 264, 8, NN_LAYOUT_IN_OUT, 1, 1, 1, 1,
         ACCEL_BF16, 2e-2},
        {"lgl hidden 12: three ops", 7, 16, 12, 16, NN_LAYOUT_IN_OUT, 1, 1, 1, 1, ACCEL_F32, 1e-5},
        {"lgl erf form: three ops", 7, 16, 32, 16, NN_LAYOUT_IN_OUT, 1, 1, 0, 1, ACCEL_F32, 1e-5},
    };
    /* Each case four times. Under autocast, by default (level 3), the hidden gradient's
     * product stored plain in 2 bytes and one kernel for GELU's derivative and the bias
     * gradient. Then with cuBLASLt's DGELU_BGRAD epilogue (ACCEL_NN_DGELU=epilogue; fp32's
     * only way); as if cuBLASLt had no DGELU_BGRAD (DGELU, then the bias gradient summed by a
     * kernel); as if it had no epilogue at all (the plain products and the epilogues'
     * kernels). Under autocast each writes the 2-byte h, GELU input, dZ and bias gradient the
     * epilogues would. */
    static const char *const mode[4] = {" (no epilogues)", " (no DGELU_BGRAD)",
                                        " (DGELU_BGRAD epilogue)", ""};
    size_t n_cases = sizeof(cases) / sizeof(cases[0]);
    for (size_t r = 0; r < 4 * n_cases; r++) {
        size_t i = r % n_cases;
        int level = 3 - (int)(r / n_cases);
        if (level == 3 && cases[i].autocast == ACCEL_F32) {
            continue; /* fp32 takes the epilogue either way: level 2 runs it */
        }
        char name[96];
        snprintf(name, sizeof name, "%s%s", cases[i].name,
                 level == 2 && cases[i].autocast == ACCEL_F32 ? "" : mode[level]);
        accel__nn_cu_lt_epilogues(level < 2 ? level : 2);
        accel__nn_cu_dgelu_kernel(level == 3);
        /* The default path under autocast rounds the hidden gradient before GELU's
         * derivative, as the three ops do: the autocast linear's tolerance. */
        check_lgl(&cases[i], name, level == 3 ? 1e-2 : cases[i].tol);
    }
    accel__nn_cu_dgelu_kernel(1);
    accel__nn_cu_lt_epilogues(2);
    /* The second bias's gradient by the BGRAD epilogue of the second weight's gradient product
     * (ACCEL_NN_BGRAD=1), the rest by default. */
    accel__nn_cu_bgrad_epilogue(1);
    for (size_t i = 0; i < n_cases; i++) {
        if (!cases[i].b2) {
            continue;
        }
        char name[96];
        snprintf(name, sizeof name, "%s (BGRAD epilogue)", cases[i].name);
        check_lgl(&cases[i], name, cases[i].autocast != ACCEL_F32 ? 1e-2 : cases[i].tol);
    }
    accel__nn_cu_bgrad_epilogue(0);
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
    /* (Under the CUDA emulator, where a row's block of threads costs much, 7000 outgrow too, and
     * the other steps, which only alternate the banks, stage 100 more rows each, not 1000.) */
    const int cuemu = getenv("ACCEL_CUEMU") != NULL;
    const int64_t max_n = cuemu ? 7000 : 70000, more = cuemu ? 100 : 1000;
    float *w = xmalloc((size_t)V * C * sizeof(float)), *logits = xmalloc(2 * max_n * sizeof(float));
    int32_t *ids = xmalloc(max_n * sizeof(int32_t)), *keep = xmalloc(3 * max_n * sizeof(int32_t));
    float *yg = xmalloc((size_t)max_n * C * sizeof(float));
    for (int i = 0; i < V * C; i++) {
        w[i] = frand();
    }
    for (int step = 0; step < 6; step++) {
        /* Step 3 stages 3 x max_n ids (820 KiB, or 82): more than the banks held until then. */
        int64_t n = step == 3 ? max_n : 50 + more * step, reps = step == 3 ? 3 : 2;
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
    CHECK(strstr(accel_last_error(NULL),
                 "nn_embedding: input 0 belongs to another nn_ctx and is in host memory") != NULL);
    CHECK(nn_add(ggpu, x, h) == NULL);
    CHECK_MSG(strcmp(accel_last_error(NULL), "nn_add: input 1 belongs to another nn_ctx and is in "
                                             "host memory (the ctx computes on cuda:0)") == 0,
              "%s", accel_last_error(NULL));
    CHECK(nn_transpose(ggpu, x, 0, 1) != NULL);                   /* a view is fine ... */
    CHECK(nn_gelu(ggpu, nn_transpose(ggpu, x, 0, 1), 0) == NULL); /* ... a strided input not */
    CHECK(strstr(accel_last_error(NULL), "strided view") != NULL);
    /* A ctx holding tensors cannot move. */
    CHECK(nn_ctx_set_device(ggpu, (accel_device){ACCEL_DEVICE_CPU, 0}) == ACCEL_ESTATE);
    /* nn_item reads a one-element tensor (x has six: NaN, test_nn_faults). */
    float item = nn_item(nn_tensor_from(ggpu, v, 0, NULL));
    CHECK(item == 1.0f && isnan(nn_item(x)));
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
    if (nn_cuda_check_init("test_nn_cuda") != 0) {
        return 77;
    }
    test_elementwise();
    test_embedding();
    test_layernorm();
    test_linear();
    test_cross_entropy();
    test_gpt();
    test_linear_gelu_linear();
    test_staging();
    test_errors();
    test_model_params();
    test_layernorm_one_param();
    nn_cuda_check_done("test_nn_cuda");
    return 0;
}
