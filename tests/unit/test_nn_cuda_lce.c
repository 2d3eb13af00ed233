/* ACCEL_TEST_LABELS: gpu
 *
 * nn_linear_cross_entropy on CUDA (src/nn/cuda/lce_gpu.c: cuBLASLt logits per chunk, the fused
 * classifier kernel, dx and dW made in forward and scaled in backward) through
 * tests/nn_cuda_check.h (NaN-poisoned GPU arena, random inputs): the loss and the gradients of
 * x and w against nn_linear + nn_cross_entropy on the CPU (the unfused reference) and against
 * the CPU's fused op. Tolerances: fp32 1e-5 for the loss, 1e-4 for the gradients (GPU and CPU
 * sum the products and the softmax in different orders); bf16 / fp16 autocast 1e-2. Cases:
 * several chunks with a partial last one, one chunk, both layouts, mean and sum, ignore_index
 * (a whole chunk of ignored rows), label smoothing, a random incoming gradient (the stored dx
 * and dW scaled by it), a weight also read by an embedding (gradients add), and reduction
 * none without gradients (evaluation: the loss only, nothing recorded), vocabularies that
 * are not a multiple of 4 (the kernel's scalar path), GPT-2's 50304 (the one-read kernel with
 * its row in 201 KB of shared memory, several batches of loads a thread) and 60000 (past the
 * 227 KB a block may hold: the two-pass kernel). Exits 77 (skipped) where the build has no CUDA
 * or no GPU can be used.
 */
#include "nn_cuda_check.h"

typedef struct lce_arg {
    const int32_t *targets;
    nn_layout layout;
    nn_cross_entropy_options opts;
    int ref_unfused; /* the CPU side runs nn_linear + nn_cross_entropy */
    int emb;         /* x + embedding(w, targets' rows): w gets two contributions */
} lce_arg;

static nn_tensor *f_lce(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const lce_arg *a = arg;
    nn_tensor *x = in[0];
    if (a->emb) {
        int64_t rows = in[0]->shape[0];
        int32_t ids[64];
        for (int64_t r = 0; r < rows && r < 64; r++) {
            ids[r] = (int32_t)(r % in[1]->shape[0]);
        }
        x = nn_add(g, x, nn_embedding(g, in[1], ids, 1, &rows));
    }
    if (a->ref_unfused && g == gcpu) {
        return nn_cross_entropy(g, nn_linear(g, x, in[1], NULL, a->layout), a->targets, &a->opts);
    }
    return nn_linear_cross_entropy(g, x, in[1], a->targets, a->layout, &a->opts);
}

static void test_lce(void)
{
    enum { ROWS = 21, C = 64, V = 1000 };
    int32_t t[ROWS], t_chunk[ROWS];
    for (int r = 0; r < ROWS; r++) {
        t[r] = r % 5 == 3 ? -100 : (int32_t)(next() % V);
        t_chunk[r] = r >= 4 && r < 8 ? -100 : (int32_t)(next() % V); /* chunk [4, 8) ignored */
    }
    static const struct {
        const char *name;
        int layout, reduction, emb, scalar, autocast, ignored_chunk;
        int64_t chunk;
        float eps;
        double tol_fwd, tol_grad;
    } cases[] = {
        {"chunks of 5 fp32 mean", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 0, 1, ACCEL_F32, 0, 5, 0.0f,
         1e-5, 1e-4},
        {"one chunk fp32 mean", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 0, 1, ACCEL_F32, 0, 0, 0.0f,
         1e-5, 1e-4},
        {"chunks of 4, one all ignored", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 0, 1, ACCEL_F32, 1, 4,
         0.0f, 1e-5, 1e-4},
        {"chunks of 8 [in, out] sum smoothing", NN_LAYOUT_IN_OUT, NN_REDUCTION_SUM, 0, 0, ACCEL_F32,
         0, 8, 0.1f, 1e-5, 1e-4},
        {"chunks of 6 fp32 random seed", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 0, 0, ACCEL_F32, 0, 6,
         0.0f, 1e-5, 1e-4},
        {"chunks of 5 embedding (tied)", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 1, 1, ACCEL_F32, 0, 5,
         0.0f, 1e-5, 1e-4},
        {"chunks of 4 bf16 mean", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 0, 1, ACCEL_BF16, 0, 4, 0.0f,
         1e-2, 1e-2},
        {"chunks of 7 bf16 [in, out] seed", NN_LAYOUT_IN_OUT, NN_REDUCTION_SUM, 0, 0, ACCEL_BF16, 0,
         7, 0.0f, 1e-2, 1e-2},
        {"chunks of 5 fp16 embedding", NN_LAYOUT_OUT_IN, NN_REDUCTION_MEAN, 1, 1, ACCEL_F16, 0, 5,
         0.0f, 1e-2, 1e-2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int in_out = cases[i].layout == NN_LAYOUT_IN_OUT;
        in_spec s[2] = {{2, {ROWS, C}, 1.0f, 0.0f, 1},
                        {2, {in_out ? C : V, in_out ? V : C}, 0.5f, 0.0f, 1}};
        lce_arg a = {cases[i].ignored_chunk ? t_chunk : t, (nn_layout)cases[i].layout,
                     nn_cross_entropy_options_default(), 1, cases[i].emb};
        a.opts.reduction = (nn_reduction)cases[i].reduction;
        a.opts.label_smoothing = cases[i].eps;
        a.opts.chunk_rows = cases[i].chunk;
        for (int ref = 1; ref >= 0; ref--) {
            char name[96];
            snprintf(name, sizeof(name), "%s vs cpu %s", cases[i].name, ref ? "unfused" : "fused");
            a.ref_unfused = ref;
            check_case(name, s, 2, f_lce, &a, cases[i].autocast, cases[i].scalar, cases[i].tol_fwd,
                       cases[i].tol_grad);
        }
    }
}

/* A vocabulary that is not a multiple of 4 (1001, 1002): rows of logits the classifier kernel
 * reads as scalars, not 16-byte vectors; and the vector paths' limits of shared memory. */
static void test_odd_vocab(void)
{
    enum { ROWS = 13, C = 32 };
    static const struct {
        const char *name;
        int64_t V;
        int autocast;
        double tol_fwd, tol_grad;
    } cases[] = {
        {"vocab 1001 fp32", 1001, ACCEL_F32, 1e-5, 1e-4},
        {"vocab 1002 bf16", 1002, ACCEL_BF16, 1e-2, 1e-2},
        /* GPT-2's rows: 201 KB of shared memory (opted into past 48 KB), 12 or 13 slots of
         * 16 bytes a thread (batches of loads with a partial last one); rows too long for it
         * (240 KB), which the two-pass kernel reads twice as 16-byte vectors. */
        {"vocab 50304 bf16", 50304, ACCEL_BF16, 1e-2, 1e-2},
        {"vocab 50304 fp32", 50304, ACCEL_F32, 1e-5, 1e-4},
        {"vocab 60000 fp32", 60000, ACCEL_F32, 1e-5, 1e-4},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t t[ROWS];
        for (int r = 0; r < ROWS; r++) {
            t[r] = r == 5 ? -100 : (int32_t)(next() % (uint64_t)cases[i].V);
        }
        in_spec s[2] = {{2, {ROWS, C}, 1.0f, 0.0f, 1}, {2, {cases[i].V, C}, 0.5f, 0.0f, 1}};
        lce_arg a = {t, NN_LAYOUT_OUT_IN, nn_cross_entropy_options_default(), 0, 0};
        a.opts.chunk_rows = 5;
        a.opts.label_smoothing = 0.1f;
        check_case(cases[i].name, s, 2, f_lce, &a, cases[i].autocast, 1, cases[i].tol_fwd,
                   cases[i].tol_grad);
    }
}

/* Evaluation: no grad, reduction none: per-row losses equal the CPU's, nothing recorded. */
static void test_eval(void)
{
    enum { ROWS = 9, C = 32, V = 300 };
    float *x = xmalloc(ROWS * C * sizeof(float)), *w = xmalloc(V * C * sizeof(float));
    int32_t t[ROWS];
    for (int i = 0; i < ROWS * C; i++) {
        x[i] = frand();
    }
    for (int i = 0; i < V * C; i++) {
        w[i] = frand();
    }
    for (int r = 0; r < ROWS; r++) {
        t[r] = r == 2 ? -100 : (int32_t)(next() % V);
    }
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.reduction = NN_REDUCTION_NONE;
    o.chunk_rows = 4;
    int64_t xs[2] = {ROWS, C}, ws[2] = {V, C};
    float out[2][ROWS];
    for (int k = 0; k < 2; k++) {
        nn_ctx *g = k ? ggpu : gcpu;
        prepare(g, k, ACCEL_F32);
        int prev = nn_ctx_set_grad_enabled(g, 0);
        nn_tensor *xt = nn_tensor_requires_grad(nn_tensor_from(g, x, 2, xs), 1);
        nn_tensor *wt = nn_tensor_requires_grad(nn_tensor_from(g, w, 2, ws), 1);
        nn_tensor *y = k ? nn_linear_cross_entropy(g, xt, wt, t, NN_LAYOUT_OUT_IN, &o)
                         : nn_cross_entropy(g, nn_linear(g, xt, wt, NULL, NN_LAYOUT_OUT_IN), t, &o);
        CHECK_MSG(y != NULL && nn_numel(y) == ROWS, "%s", accel_last_error(NULL));
        CHECK_OK(NULL, nn_tensor_to_host(y, out[k]));
        CHECK(nn_ctx_get_stats(g).n_nodes == 0);
        nn_ctx_set_grad_enabled(g, prev);
    }
    double e = rel_err(out[1], out[0], ROWS);
    printf("  %-34s forward %.3g\n", "eval, reduction none", e);
    CHECK_MSG(e <= 1e-5 && out[1][2] == 0.0f, "eval: rel err %g, ignored row %g", e,
              (double)out[1][2]);
    /* With a gradient wanted, reduction none is refused. */
    prepare(ggpu, 1, ACCEL_F32);
    nn_tensor *xt = nn_tensor_requires_grad(nn_tensor_from(ggpu, x, 2, xs), 1);
    nn_tensor *wt = nn_tensor_from(ggpu, w, 2, ws);
    CHECK(nn_linear_cross_entropy(ggpu, xt, wt, t, NN_LAYOUT_OUT_IN, &o) == NULL &&
          accel_last_status(NULL) == ACCEL_EUNSUPPORTED);
    free(x);
    free(w);
}

int main(void)
{
    if (nn_cuda_check_init("test_nn_cuda_lce") != 0) {
        return 77;
    }
    test_lce();
    test_odd_vocab();
    test_eval();
    nn_cuda_check_done("test_nn_cuda_lce");
    return 0;
}
