/* ACCEL_TEST_LABELS: gpu
 *
 * Half shadows on CUDA (nn_tensor.shadow / grad_shadow, src/nn/cuda/shadow_gpu.c): under bf16 /
 * fp16 autocast LayerNorm's forward writes its output's 2-byte copy (and a linear's backward
 * keeps its 2-byte input-gradient product when asked), which the products then read instead
 * of rounding the fp32 values in a pass of their own; a residual add's inputs borrow its
 * gradient (nn_tensor.grad_borrowed) instead of copies. Through tests/nn_cuda_check.h (random
 * inputs, NaN-poisoned GPU arena), a GPT-2 block (LayerNorm, qkv product, attention,
 * projection, residual add, LayerNorm, fused MLP, residual add):
 *  - against the CPU under bf16 and fp16 autocast (2e-2: the fused MLP's tolerance);
 *  - on the GPU with shadows on and off (ACCEL_NN_SHADOW's hook): the same bits, output and
 *    every input gradient, and under autocast 3 rounding passes fewer per block (qkv's and the
 *    MLP's inputs: LayerNorm's shadows; the projection's dY: the shadow LayerNorm's backward
 *    writes of the residual gradient, which the adds' inputs borrow; the MLP's dY is the
 *    block's output gradient here, with no LayerNorm after it), and under bf16 2 more (head
 *    64: the projection's input y and the qkv product's dY, the copies the attention's
 *    forward and backward kernels write in their epilogues);
 * with variants: the projection's output also read by GELU, whose backward adds to its
 * gradient after the residual add lent it (it must get memory of its own first); the qkv
 * product reading a slice of LayerNorm's output at an offset (the owner's shadow at the view's
 * offset); the projection applied twice (the second product's 2-byte input gradient kept as the
 * first's dY shadow: one pass fewer); and the LayerNorms as the GPT's blocks make them
 * (accel__nn_norm_operand: under autocast the output holds only its shadow, no fp32 values;
 * also in fp32, where it is a plain output). Such an output is refused by the ops that read
 * fp32 values and by a product in another dtype. Their gradients, which hold only the 2-byte
 * products that LayerNorm's backward reads, take 2 bytes an element of the arena: the same bits
 * as at the fp32 gradient's 4 (a hook), and the peak lower by exactly the bytes saved. The
 * same for the GPT's ln_f, read by the fused head and loss (nn_linear_cross_entropy), whose
 * rounded input gradient is written in 2 bytes.
 * And nn_add_layernorm (the residual add fused into LayerNorm's kernel, which also writes the
 * shadow): against the CPU, and bit for bit against nn_add + nn_layernorm on the GPU, with a
 * width the register-row kernel takes (32), one it does not (30), and a broadcast residual
 * (the two ops), under bf16 autocast and in fp32. Last, a checkpointed segment whose replay
 * writes the shadow of an outside tensor's gradient above its mark (dropped at the rewind),
 * also with that tensor added to the segment's output (its gradient borrowed from the add's
 * before the replay adds to it: it gets memory of its own below the mark).
 * Exits 77 (skipped) where the build has no CUDA or no GPU can be used.
 */
#include "nn_cuda_check.h"

/* nn_internal.h: LayerNorm (of x + r) whose output only products read, as the GPT's blocks. */
nn_tensor *accel__nn_norm_operand(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                                  nn_tensor *bias, float eps, nn_tensor **sum);
#ifdef ACCEL_HAVE_CUDA
void accel__nn_cu_set_shadows(int on);        /* gpu_internal.h */
unsigned long accel__nn_cu_half_copies(void); /* gpu_internal.h */
unsigned long accel__nn_cu_ln_half_dys(void); /* gpu_internal.h */
void accel__nn_cu_ln_dy_elem_nbytes(int nbytes); /* gpu_internal.h */
#else
static void accel__nn_cu_ln_dy_elem_nbytes(int nbytes)
{
    (void)nbytes;
}
static unsigned long accel__nn_cu_ln_half_dys(void)
{
    return 0;
}
static void accel__nn_cu_set_shadows(int on)
{
    (void)on;
}
static unsigned long accel__nn_cu_half_copies(void)
{
    return 0;
}
#endif

/* Head 64 (C / H) in the block: under bf16 the attention kernels of 32 rows a warp
 * (attn_tc_fwd.cu, attn_tc_bwd2.cu), which write y's and dqkv's 2-byte copies. */
enum { B = 3, T = 16, C = 64, H = 1 };

typedef struct block_arg {
    int also_gelu; /* the projection's output read by GELU too, before the residual add */
    int slice;     /* the qkv product reads rows [1, B) of LayerNorm's output (a view) */
    int chain;     /* the projection twice: the second's input gradient is the first's dY */
    int operand;   /* the LayerNorms as the GPT's blocks make them (accel__nn_norm_operand) */
} block_arg;

/* in: x [B, T, C], LayerNorm weight [C], c_attn [C, 3C], c_proj [C, C], c_fc [C, 4C],
 * c_proj (MLP) [4C, C]; all [in, out]. */
static nn_tensor *f_block(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const block_arg *a = arg;
    nn_tensor *x = in[0];
    if (a->slice) {
        x = nn_slice(g, x, 0, 1, B);
    }
    nn_tensor *h = a->operand ? accel__nn_norm_operand(g, in[0], NULL, in[1], NULL, 1e-5f, NULL)
                              : nn_layernorm(g, in[0], in[1], NULL, 1e-5f);
    if (a->slice) {
        h = nn_slice(g, h, 0, 1, B);
    }
    nn_tensor *qkv = nn_linear(g, h, in[2], NULL, NN_LAYOUT_IN_OUT);
    nn_tensor *p =
        nn_linear(g, nn_causal_attention(g, qkv, H, 0.0f), in[3], NULL, NN_LAYOUT_IN_OUT);
    if (a->chain) {
        p = nn_linear(g, p, in[3], NULL, NN_LAYOUT_IN_OUT);
    }
    nn_tensor *z = a->also_gelu ? nn_gelu(g, p, 1) : NULL;
    if (a->operand) { /* as nn_block_forward: the residual add in ln_2's kernel */
        h = accel__nn_norm_operand(g, x, p, in[1], NULL, 1e-5f, &x);
    } else {
        x = nn_add(g, x, p);
        if (z != NULL) {
            x = nn_add(g, x, z);
        }
        h = nn_layernorm(g, x, in[1], NULL, 1e-5f);
    }
    nn_tensor *m = nn_linear_gelu_linear(g, h, in[4], NULL, in[5], NULL, NN_LAYOUT_IN_OUT, 1);
    return nn_add(g, x, m);
}

static const in_spec specs[6] = {
    {3, {B, T, C}, 1.0f, 0.0f, 1}, {1, {C}, 0.2f, 1.0f, 1},        {2, {C, 3 * C}, 0.3f, 0.0f, 1},
    {2, {C, C}, 0.3f, 0.0f, 1},    {2, {C, 4 * C}, 0.3f, 0.0f, 1}, {2, {4 * C, C}, 0.3f, 0.0f, 1},
};

/* The block on the GPU with shadows off and on: identical bits, and the passes saved. */
static void check_same_bits(const char *name, const block_arg *a, int autocast)
{
    float *data[6];
    random_inputs(specs, 6, data);
    int64_t ny = (a->slice ? B - 1 : B) * T * C;
    float *gout = random_floats(ny);
    unsigned long c0 = accel__nn_cu_half_copies(), l0 = accel__nn_cu_ln_half_dys();
    accel__nn_cu_set_shadows(0);
    run_out off = run_one(ggpu, 1, autocast, specs, 6, data, f_block, a, gout, 0);
    unsigned long c1 = accel__nn_cu_half_copies(), l1 = accel__nn_cu_ln_half_dys();
    accel__nn_cu_set_shadows(1);
    run_out on = run_one(ggpu, 1, autocast, specs, 6, data, f_block, a, gout, 0);
    unsigned long c2 = accel__nn_cu_half_copies(), l2 = accel__nn_cu_ln_half_dys();
    /* The GPT's LayerNorms (operand, under autocast, with shadows) read their dY in 2 bytes,
     * the products' own (ln_1's from the qkv product, ln_2's from the MLP's first): 2 a run
     * (not ln_1 when the qkv product reads a slice of it: a view, not the output itself).
     * None without shadows. */
    unsigned long ln_half = a->operand && autocast != ACCEL_F32 ? (a->slice ? 1 : 2) : 0;
    CHECK_MSG(l1 == l0 && l2 - l1 == ln_half,
              "%s: %lu LayerNorm backwards read a 2-byte dY with shadows off, %lu on (expected "
              "0, %lu)",
              name, l1 - l0, l2 - l1, ln_half);
    CHECK(on.ny == off.ny && on.ny == ny);
    check_same_bits_runs(name, "with shadows", &on, &off, specs, 6);
    /* The projection's gradient shadow is dropped when GELU adds to it: one pass comes back.
     * Chained, the first projection's dY is the second's 2-byte input-gradient product. */
    unsigned long saved = autocast == ACCEL_F32 ? 0 : a->chain ? 4 : a->also_gelu ? 2 : 3;
    if (autocast == ACCEL_BF16) {
        saved += 2; /* y's and dqkv's copies, written by the attention's kernels */
    }
    printf("  %-34s same bits; rounding passes %lu without shadows, %lu with\n", name, c1 - c0,
           c2 - c1);
    CHECK_MSG(c1 - c0 == (c2 - c1) + saved, "%s: %lu rounding passes saved, expected %lu", name,
              (c1 - c0) - (c2 - c1), saved);
    free_run(&off, 6);
    free_run(&on, 6);
    free(gout);
    for (int k = 0; k < 6; k++) {
        free(data[k]);
    }
}

/* The GPT's LayerNorm outputs' gradients at 2 bytes an element (they hold only the 2-byte
 * product that LayerNorm's backward reads) against the fp32 gradient's 4 (the hook): the same
 * bits, and the arena's peak (the end of the backward: nothing here gives memory back) lower
 * by exactly ln_1's and ln_2's 2 bytes an element (64-byte aligned allocations); none in fp32,
 * where the gradients are fp32 values. */
static void check_dy_nbytes(const char *name, const block_arg *a, int autocast)
{
    float *data[6];
    random_inputs(specs, 6, data);
    float *gout = random_floats(B * T * C);
    accel__nn_cu_ln_dy_elem_nbytes(4);
    run_out wide = run_one(ggpu, 1, autocast, specs, 6, data, f_block, a, gout, 0);
    size_t peak4 = nn_ctx_get_stats(ggpu).peak_nbytes;
    accel__nn_cu_ln_dy_elem_nbytes(2);
    run_out half = run_one(ggpu, 1, autocast, specs, 6, data, f_block, a, gout, 0);
    size_t peak2 = nn_ctx_get_stats(ggpu).peak_nbytes;
    check_same_bits_runs(name, "with 2-byte LayerNorm dY memory", &half, &wide, specs, 6);
    size_t saved = 0;
#ifdef ACCEL_HAVE_CUDA
    if (autocast != ACCEL_F32) { /* B T C = 3072: 12288 bytes at 4, 6144 at 2 (64-aligned) */
        size_t n = (size_t)(B * T * C);
        saved = 2 * (4 * n - 2 * n);
    }
#endif
    CHECK_MSG(peak4 - peak2 == saved,
              "%s: arena peak %zu bytes with 4-byte LayerNorm dY memory, %zu with 2 (expected "
              "%zu less)",
              name, peak4, peak2, saved);
    printf("  %-34s same bits; arena peak %zu bytes, %zu with 4-byte dY memory\n", name, peak2,
           peak4);
    free_run(&wide, 6);
    free_run(&half, 6);
    free(gout);
    for (int k = 0; k < 6; k++) {
        free(data[k]);
    }
}

/* in: x [rows, C], LayerNorm weight and bias [C], the head's w [V, C]; arg: the targets. The
 * GPT's ln_f and head: nn_linear_cross_entropy of accel__nn_norm_operand's output. */
/* The 4-input case fn in bf16, shadows off and on: the same bits, and with shadows on exactly
 * one LayerNorm backward reads its dY as 2-byte values. */
static void check_one_half_dy(const char *name, const in_spec *sp, case_fn fn, const void *arg,
                              const float *gout)
{
    float *data[4];
    random_inputs(sp, 4, data);
    accel__nn_cu_set_shadows(0);
    run_out off = run_one(ggpu, 1, ACCEL_BF16, sp, 4, data, fn, arg, gout, 0);
    accel__nn_cu_set_shadows(1);
    unsigned long l0 = accel__nn_cu_ln_half_dys();
    run_out on = run_one(ggpu, 1, ACCEL_BF16, sp, 4, data, fn, arg, gout, 0);
    unsigned long l1 = accel__nn_cu_ln_half_dys();
    check_same_bits_runs(name, "with shadows", &on, &off, sp, 4);
#ifdef ACCEL_HAVE_CUDA
    CHECK_MSG(l1 - l0 == 1, "%s: %lu LayerNorm backwards read a 2-byte dY, expected 1", name,
              l1 - l0);
#else
    (void)l0;
    (void)l1;
#endif
    printf("  %-34s same bits with its dY kept 2-byte\n", name);
    free_run(&off, 4);
    free_run(&on, 4);
    for (int k = 0; k < 4; k++) {
        free(data[k]);
    }
}

static nn_tensor *f_head(nn_ctx *g, nn_tensor **in, const void *arg)
{
    nn_tensor *h = accel__nn_norm_operand(g, in[0], NULL, in[1], in[2], 1e-5f, NULL);
    return nn_linear_cross_entropy(g, h, in[3], arg, NN_LAYOUT_OUT_IN, NULL);
}

/* The head's input gradient (its dx, rounded) written as 2-byte values that ln_f's backward
 * reads, at a width the register-row kernel takes (32) and at one it does not (30, widened in
 * scratch): against the CPU under bf16 (the fused head's 1e-2), and the same bits with shadows
 * off (an fp32 output and gradient), with one LayerNorm reading a 2-byte dY. */
static void test_head(int64_t width)
{
    enum { ROWS = 40, V = 50 };
    in_spec sp[4] = {{2, {ROWS, width}, 1.0f, 0.0f, 1},
                     {1, {width}, 0.2f, 1.0f, 1},
                     {1, {width}, 0.2f, 0.0f, 1},
                     {2, {V, width}, 0.3f, 0.0f, 1}};
    int32_t t[ROWS];
    for (int r = 0; r < ROWS; r++) {
        t[r] = (r * 7 + 3) % V;
    }
    char name[64];
    snprintf(name, sizeof(name), "ln_f + head C=%lld bf16 vs cpu", (long long)width);
    check_case(name, sp, 4, f_head, t, ACCEL_BF16, 1, 1e-2, 1e-2);
    snprintf(name, sizeof(name), "ln_f + head C=%lld", (long long)width);
    check_one_half_dy(name, sp, f_head, t, NULL);
}

/* ---- nn_add_layernorm: the residual add fused into the LayerNorm after it ---- */

typedef struct addln_arg {
    int fused;
    int bcast; /* r is [C], broadcast over the rows (not fused: the two ops) */
} addln_arg;

/* in: x [rows, C], r ([rows, C] or [C]), LayerNorm weight and bias [C], w [C, C]. Both outputs
 * go on: linear(LN(x + r)) + gelu(x + r). */
static nn_tensor *f_addln(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const addln_arg *a = arg;
    nn_tensor *s = NULL, *y;
    if (a->fused) {
        y = nn_add_layernorm(g, in[0], in[1], in[2], in[3], 1e-5f, &s);
    } else {
        s = nn_add(g, in[0], in[1]);
        y = nn_layernorm(g, s, in[2], in[3], 1e-5f);
    }
    return nn_add(g, nn_linear(g, y, in[4], NULL, NN_LAYOUT_IN_OUT), nn_gelu(g, s, 1));
}

/* Fused and as two ops, against the CPU and bit for bit against each other on the GPU; C a
 * multiple of 4 (the register-row kernel) or not (one block per row). */
static void test_add_layernorm(int64_t width, int bcast, int autocast)
{
    enum { ROWS = 37 };
    in_spec s[5] = {{2, {ROWS, width}, 1.0f, 0.0f, 1},
                    {bcast ? 1 : 2, {bcast ? width : ROWS, width}, 1.0f, 0.0f, 1},
                    {1, {width}, 0.2f, 1.0f, 1},
                    {1, {width}, 0.2f, 0.0f, 1},
                    {2, {width, width}, 0.3f, 0.0f, 1}};
    char name[96];
    snprintf(name, sizeof(name), "add_layernorm width %lld%s %s", (long long)width,
             bcast ? " broadcast" : "", autocast == ACCEL_BF16 ? "bf16" : "fp32");
    addln_arg fused = {1, bcast}, two = {0, bcast};
    double tol = autocast == ACCEL_BF16 ? 2e-2 : 1e-4;
    check_case(name, s, 5, f_addln, &fused, autocast, 0, tol, tol);
    float *data[5];
    random_inputs(s, 5, data);
    float *gout = random_floats(ROWS * width);
    run_out r1 = run_one(ggpu, 1, autocast, s, 5, data, f_addln, &fused, gout, 0);
    run_out r2 = run_one(ggpu, 1, autocast, s, 5, data, f_addln, &two, gout, 0);
    CHECK_MSG(memcmp(r1.y, r2.y, (size_t)(ROWS * width) * sizeof(float)) == 0,
              "%s: fused output differs from the two ops'", name);
    for (int k = 0; k < 5; k++) {
        size_t nbytes = (size_t)numel(s[k].ndim, s[k].shape) * sizeof(float);
        CHECK_MSG(memcmp(r1.grads[k], r2.grads[k], nbytes) == 0,
                  "%s: gradient of input %d differs from the two ops'", name, k);
    }
    printf("  %-34s same bits as nn_add + nn_layernorm\n", name);
    free_run(&r1, 5);
    free_run(&r2, 5);
    free(gout);
    for (int k = 0; k < 5; k++) {
        free(data[k]);
    }
}

/* accel__nn_norm_operand's output on the GPU under autocast holds no fp32 values: the ops that
 * would read them refuse it, naming it, and so does a product in another dtype; in fp32 it is a
 * plain output. */
static void test_shell(void)
{
    int64_t shape[2] = {4, C}, wshape[2] = {C, C};
    float xs[4 * C], ws[C * C], v[4 * C];
    for (int i = 0; i < 4 * C; i++) {
        xs[i] = frand();
    }
    for (int i = 0; i < C * C; i++) {
        ws[i] = frand();
    }
    prepare(ggpu, 1, ACCEL_BF16);
    nn_tensor *x = nn_tensor_from(ggpu, xs, 2, shape), *w = nn_tensor_from(ggpu, ws, 2, wshape);
    CHECK(x != NULL && w != NULL);
    nn_tensor *h = accel__nn_norm_operand(ggpu, x, NULL, NULL, NULL, 1e-5f, NULL);
    CHECK_MSG(h != NULL && h->data == NULL && h->shadow != NULL, "%s", accel_last_error(NULL));
    nn_tensor *y = nn_linear(ggpu, h, w, NULL, NN_LAYOUT_IN_OUT);
    CHECK_MSG(y != NULL && nn_tensor_to_host(y, v) == ACCEL_OK, "%s", accel_last_error(NULL));
    CHECK(nn_tensor_to_host(h, v) == ACCEL_ESTATE);
    CHECK(nn_gelu(ggpu, h, 1) == NULL);
    CHECK_MSG(strstr(accel_last_error(NULL), "holds only the 2-byte copy") != NULL, "%s",
              accel_last_error(NULL));
    nn_ctx_set_autocast(ggpu, ACCEL_F16);
    CHECK(nn_linear(ggpu, h, w, NULL, NN_LAYOUT_IN_OUT) == NULL);
    CHECK_MSG(strstr(accel_last_error(NULL), "holds only its bf16 copy") != NULL, "%s",
              accel_last_error(NULL));
    prepare(ggpu, 1, ACCEL_F32);
    x = nn_tensor_from(ggpu, xs, 2, shape);
    h = accel__nn_norm_operand(ggpu, x, NULL, NULL, NULL, 1e-5f, NULL);
    CHECK(h != NULL && h->data != NULL && nn_tensor_to_host(h, v) == ACCEL_OK);
    printf("  shell LayerNorm output               refused where fp32 values are read\n");
}

/* A checkpointed segment x + gelu(c) whose input x is a linear's output. With x's gradient
 * there before (add_after) the replay's add adds to it and writes its shadow, which must
 * outlive the segment's rewind: its memory is set aside below the mark like the gradient's
 * (recompute.c), and the linear's backward reads it. Else the add lends x the segment's dY,
 * which the rewind copies into x's own memory without a shadow (the linear's backward rounds
 * dY itself). The same bits with shadows on and off. */
static nn_tensor *seg_add_gelu(nn_ctx *g, void *ctx, nn_tensor *x)
{
    return nn_add(g, x, nn_gelu(g, (nn_tensor *)ctx, 1));
}

static void test_checkpoint(int add_after)
{
    int64_t shape[2] = {8, C}, wshape[2] = {C, C};
    float xs[8 * C], ws[C * C], cs[8 * C], gout[8 * C], out[2][C * C];
    for (int i = 0; i < 8 * C; i++) {
        xs[i] = frand();
        cs[i] = frand();
        gout[i] = frand();
    }
    for (int i = 0; i < C * C; i++) {
        ws[i] = frand();
    }
    for (int on = 0; on < 2; on++) {
        accel__nn_cu_set_shadows(on);
        prepare(ggpu, 1, ACCEL_BF16);
        nn_tensor *x = nn_tensor_from(ggpu, xs, 2, shape);
        nn_tensor *w = nn_tensor_requires_grad(nn_tensor_from(ggpu, ws, 2, wshape), 1);
        nn_tensor *c = nn_tensor_from(ggpu, cs, 2, shape);
        nn_tensor *h = nn_linear(ggpu, x, w, NULL, NN_LAYOUT_IN_OUT);
        nn_tensor *y = nn_checkpoint(ggpu, seg_add_gelu, c, h);
        if (add_after) { /* h's gradient borrowed (from this add) before the segment's replay */
            y = nn_add(ggpu, h, y);
        }
        CHECK_MSG(y != NULL, "%s", accel_last_error(NULL));
        CHECK_OK(NULL, nn_backward_grad(y, gout, NULL));
        CHECK(on && add_after ? h->grad_shadow != NULL : h->grad_shadow == NULL);
        CHECK_OK(NULL, nn_tensor_grad_to_host(w, out[on]));
    }
    CHECK_MSG(memcmp(out[0], out[1], sizeof(out[0])) == 0, "checkpoint: dW differs with shadows");
    printf("  checkpointed segment on a linear's output%s: same bits, its shadow %s\n",
           add_after ? ", added after" : "", add_after ? "kept" : "none (dY lent)");
}

/* in: x [rows, C] (a [C, C] weight w next): linear(accel__nn_norm_operand(x, ln w, ln b)) + x
 * (x also read by the add, so the residual's gradient is the LayerNorm's addend). */
static nn_tensor *f_operand(nn_ctx *g, nn_tensor **in, const void *arg)
{
    (void)arg;
    nn_tensor *h = accel__nn_norm_operand(g, in[0], NULL, in[1], in[2], 1e-5f, NULL);
    return nn_add(g, nn_linear(g, h, in[3], NULL, NN_LAYOUT_IN_OUT), in[0]);
}

/* The GPT's LayerNorm read by one product under bf16 autocast, at a width the register-row
 * kernel takes (a 2-byte dY read as it is) and at ones it does not (widened first, in
 * scratch): against the CPU, and the same bits with shadows off (the fp32 dY). */
static void test_operand_width(int64_t width)
{
    in_spec sp[4] = {{2, {40, width}, 1.0f, 0.0f, 1},
                     {1, {width}, 0.2f, 1.0f, 1},
                     {1, {width}, 0.2f, 0.0f, 1},
                     {2, {width, width}, 0.3f, 0.0f, 1}};
    char name[64];
    snprintf(name, sizeof(name), "operand LayerNorm C=%lld bf16 vs cpu", (long long)width);
    check_case(name, sp, 4, f_operand, NULL, ACCEL_BF16, 0, 2e-2, 2e-2);
    float *gout = random_floats(40 * width);
    snprintf(name, sizeof(name), "operand LayerNorm C=%lld", (long long)width);
    check_one_half_dy(name, sp, f_operand, NULL, gout);
    free(gout);
}

int main(void)
{
    int rc = nn_cuda_check_init("test_nn_cuda_shadow");
    if (rc != 0) {
        return rc;
    }
    static const struct {
        const char *name;
        block_arg a;
        int autocast;
    } cases[] = {
        {"block bf16", {0, 0, 0, 0}, ACCEL_BF16},
        {"block fp16", {0, 0, 0, 0}, ACCEL_F16},
        {"block bf16, projection also to GELU", {1, 0, 0, 0}, ACCEL_BF16},
        {"block bf16, qkv reads a slice", {0, 1, 0, 0}, ACCEL_BF16},
        {"block bf16, projection twice", {0, 0, 1, 0}, ACCEL_BF16},
        {"block bf16, LayerNorms as the GPT's", {0, 0, 0, 1}, ACCEL_BF16},
        {"block fp16, LayerNorms as the GPT's", {0, 0, 0, 1}, ACCEL_F16},
        {"block fp32, LayerNorms as the GPT's", {0, 0, 0, 1}, ACCEL_F32},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[96];
        snprintf(name, sizeof(name), "%s vs cpu", cases[i].name);
        check_case(name, specs, 6, f_block, &cases[i].a, cases[i].autocast, 0, 2e-2, 2e-2);
        check_same_bits(cases[i].name, &cases[i].a, cases[i].autocast);
    }
    test_shell();
    test_operand_width(32);   /* the register-row kernel: dY read in 2 bytes */
    test_operand_width(30);   /* the row kernel: dY widened first */
    test_operand_width(1028); /* past the register-row kernel's 1024 */
    test_checkpoint(0);
    test_checkpoint(1);
    test_add_layernorm(32, 0, ACCEL_BF16);
    test_add_layernorm(32, 0, ACCEL_F32);
    test_add_layernorm(30, 0, ACCEL_BF16);
    test_add_layernorm(32, 1, ACCEL_BF16);
    block_arg gpt = {0, 0, 0, 1};
    check_dy_nbytes("dY memory bf16", &gpt, ACCEL_BF16);
    check_dy_nbytes("dY memory fp16", &gpt, ACCEL_F16);
    check_dy_nbytes("dY memory fp32", &gpt, ACCEL_F32);
    test_head(32);
    test_head(30);
    nn_cuda_check_done("test_nn_cuda_shadow");
    return 0;
}
