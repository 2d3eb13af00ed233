/* ACCEL_TEST_LABELS: gpu
 *
 * A GPT block's qkv held only as its 2-byte shadow on CUDA (accel__nn_linear_qkv): under bf16
 * autocast, where the attention reads qkv only rounded (head size 64: the forward of 32 query
 * rows a warp and attn_tc_bwd2.cu's backward), the c_attn product writes bf16 qkv directly
 * (cuBLASLt's fp32 sum + bias rounded once) and no fp32 qkv exists. Through
 * tests/nn_cuda_check.h (random inputs, NaN-poisoned GPU arena), a GPT-2 block at head size 64
 * (the LayerNorms as the GPT makes them, c_attn with its bias):
 *  - against the CPU under bf16 autocast (2e-2: the fused MLP's tolerance);
 *  - on the GPU, qkv by accel__nn_linear_qkv against nn_linear: the same bits, output and
 *    every input gradient (the product's rounding is the forward kernel's rounding of fp32
 *    qkv), and the shell path taken (qkv's data NULL, the forward and backward kernels that
 *    read the 2-byte copy ran);
 *  - the same where cuBLASLt offers no bias epilogue (its fallback: the fp32 product, the
 *    bias kernel, a rounding pass);
 *  - with shadows off (ACCEL_NN_SHADOW's hook) or the tensor-core kernels' fast paths off
 *    (ACCEL_NN_ATTN_FAST=0's hook), or head size 32, or fp16: qkv has fp32 data (today's path);
 *  - the shell refused by an op that reads fp32 values, naming it; a backward whose kernels
 *    were turned off since the forward fails with an error instead of reading NULL.
 * Exits 77 (skipped) where the build has no CUDA or no GPU can be used.
 */
#include "nn_cuda_check.h"

/* nn_internal.h: the GPT's LayerNorm whose output only products read, and its qkv product. */
nn_tensor *accel__nn_norm_operand(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                                  nn_tensor *bias, float eps, nn_tensor **sum);
nn_tensor *accel__nn_linear_qkv(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                                nn_layout layout, int n_head, float attn_dropout);
#ifdef ACCEL_HAVE_CUDA
#include "nn/cuda/nn_kernels.h"
void accel__nn_cu_set_shadows(int on);     /* gpu_internal.h */
void accel__nn_cu_lt_epilogues(int level); /* gpu_internal.h */
#endif

enum { B = 2, T = 40, C = 128 };

typedef struct block_arg {
    int qkv_op; /* qkv by accel__nn_linear_qkv (as the GPT), else nn_linear */
    int n_head;
} block_arg;

static int g_saw_shell = -1; /* whether the last block's qkv had no fp32 data */

/* in: x [B, T, C], LayerNorm weight [C], c_attn [C, 3C] and its bias [3C], c_proj [C, C],
 * c_fc [C, 4C], c_proj (MLP) [4C, C]; all [in, out]. */
static nn_tensor *f_block(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const block_arg *a = arg;
    nn_tensor *x = in[0];
    nn_tensor *h = accel__nn_norm_operand(g, x, NULL, in[1], NULL, 1e-5f, NULL);
    nn_tensor *qkv =
        a->qkv_op ? accel__nn_linear_qkv(g, h, in[2], in[3], NN_LAYOUT_IN_OUT, a->n_head, 0.0f)
                  : nn_linear(g, h, in[2], in[3], NN_LAYOUT_IN_OUT);
    g_saw_shell = qkv != NULL && qkv->data == NULL && qkv->shadow != NULL;
    nn_tensor *p =
        nn_linear(g, nn_causal_attention(g, qkv, a->n_head, 0.0f), in[4], NULL, NN_LAYOUT_IN_OUT);
    h = accel__nn_norm_operand(g, x, p, in[1], NULL, 1e-5f, &x);
    nn_tensor *m = nn_linear_gelu_linear(g, h, in[5], NULL, in[6], NULL, NN_LAYOUT_IN_OUT, 1);
    return nn_add(g, x, m);
}

static const in_spec specs[7] = {
    {3, {B, T, C}, 1.0f, 0.0f, 1},  {1, {C}, 0.2f, 1.0f, 1},    {2, {C, 3 * C}, 0.3f, 0.0f, 1},
    {1, {3 * C}, 0.5f, 0.0f, 1},    {2, {C, C}, 0.3f, 0.0f, 1}, {2, {C, 4 * C}, 0.3f, 0.0f, 1},
    {2, {4 * C, C}, 0.3f, 0.0f, 1},
};

static float *data[7], *gout;

#ifdef ACCEL_HAVE_CUDA
/* The block on the GPU with qkv by nn_linear and by accel__nn_linear_qkv: identical bits;
 * expect_shell: whether the second made qkv a shell. */
static void check_same_bits(const char *name, int n_head, int autocast, int expect_shell)
{
    block_arg plain = {0, n_head}, op = {1, n_head};
    run_out off = run_one(ggpu, 1, autocast, specs, 7, data, f_block, &plain, gout, 0);
    CHECK(g_saw_shell == 0);
    run_out on = run_one(ggpu, 1, autocast, specs, 7, data, f_block, &op, gout, 0);
    CHECK_MSG(g_saw_shell == expect_shell, "%s: qkv %s a shell", name,
              g_saw_shell ? "was" : "was not");
    if (expect_shell) { /* the kernels that read the 2-byte copies ran, both ways */
        CHECK(nn_cu_attn_fwd_mode() == 2 && nn_cu_attn_bwd_kernel() == 2);
    }
    int64_t ny = B * T * C;
    CHECK(on.ny == off.ny && on.ny == ny);
    check_same_bits_runs(name, "with the shell qkv", &on, &off, specs, 7);
    printf("  %-44s same bits; qkv %s\n", name, expect_shell ? "a shell" : "in fp32");
    free_run(&off, 7);
    free_run(&on, 7);
}

/* The block's qkv (a shell under bf16 autocast at head size 64) on a fresh step. */
static nn_tensor *make_qkv(int n_head)
{
    prepare(ggpu, 1, ACCEL_BF16);
    nn_tensor *in[4];
    for (int k = 0; k < 4; k++) {
        in[k] = nn_tensor_from(ggpu, data[k], specs[k].ndim, specs[k].shape);
        CHECK(in[k] != NULL && nn_tensor_requires_grad(in[k], 1) != NULL);
    }
    nn_tensor *h = accel__nn_norm_operand(ggpu, in[0], NULL, in[1], NULL, 1e-5f, NULL);
    nn_tensor *qkv = accel__nn_linear_qkv(ggpu, h, in[2], in[3], NN_LAYOUT_IN_OUT, n_head, 0.0f);
    CHECK_MSG(qkv != NULL && qkv->data == NULL, "%s", accel_last_error(NULL));
    return qkv;
}

/* The shell refused where fp32 values are read; a backward without its kernels fails. */
static void test_refusals(void)
{
    nn_tensor *qkv = make_qkv(2);
    CHECK(nn_gelu(ggpu, qkv, 1) == NULL);
    CHECK_MSG(strstr(accel_last_error(NULL), "or qkv") != NULL, "%s", accel_last_error(NULL));
    qkv = make_qkv(2);
    nn_tensor *y = nn_causal_attention(ggpu, qkv, 2, 0.0f);
    CHECK_MSG(y != NULL, "%s", accel_last_error(NULL));
    nn_cu_attn_bwd2_allow(0);
    CHECK(nn_backward_grad(y, gout, NULL) != ACCEL_OK);
    CHECK_MSG(strstr(accel_last_error(NULL), "nn_causal_attention (backward)") != NULL, "%s",
              accel_last_error(NULL));
    nn_cu_attn_bwd2_allow(1);
    printf("  shell qkv                                    refused where fp32 values are read\n");
}
#endif

int main(void)
{
    int rc = nn_cuda_check_init("test_nn_cuda_qkvshell");
    if (rc != 0) {
        return rc;
    }
    random_inputs(specs, 7, data);
    gout = random_floats(B * T * C);
    block_arg op = {1, 2};
    check_case("block bf16, qkv as the GPT's vs cpu", specs, 7, f_block, &op, ACCEL_BF16, 0, 2e-2,
               2e-2);
#ifdef ACCEL_HAVE_CUDA
    check_same_bits("head 64 bf16", 2, ACCEL_BF16, 1);
    check_same_bits("head 32 bf16", 4, ACCEL_BF16, 0);
    check_same_bits("head 64 fp16", 2, ACCEL_F16, 0);
    check_same_bits("head 64 fp32", 2, ACCEL_F32, 0);
    accel__nn_cu_lt_epilogues(0); /* the product's fallback: fp32, bias kernel, rounding pass */
    check_same_bits("head 64 bf16, no cuBLASLt epilogues", 2, ACCEL_BF16, 1);
    accel__nn_cu_lt_epilogues(2);
    accel__nn_cu_set_shadows(0);
    check_same_bits("head 64 bf16, shadows off", 2, ACCEL_BF16, 0);
    accel__nn_cu_set_shadows(1);
    nn_cu_attn_set_kernel(NN_CU_ATTN_TC_SLOW);
    check_same_bits("head 64 bf16, ACCEL_NN_ATTN_FAST=0", 2, ACCEL_BF16, 0);
    nn_cu_attn_set_kernel(NN_CU_ATTN_AUTO);
    test_refusals();
#endif
    for (int k = 0; k < 7; k++) {
        free(data[k]);
    }
    free(gout);
    nn_cuda_check_done("test_nn_cuda_qkvshell");
    return 0;
}
