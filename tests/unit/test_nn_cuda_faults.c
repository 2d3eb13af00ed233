/* ACCEL_TEST_LABELS: gpu
 *
 * nn's GPU ops given bad input fail as the CPU ops do: NULL with an error naming the op and the
 * culprit, never a crash, a launch error or a wrong answer. For every op with a CUDA kernel
 * (nn_add, nn_gelu, nn_dropout, nn_embedding, nn_layernorm, nn_add_layernorm, nn_linear,
 * nn_linear_gelu_linear, nn_cross_entropy, nn_causal_attention, nn_linear_cross_entropy):
 *  - each tensor input in turn: from the CPU ctx given to the GPU ctx and from the GPU ctx
 *    given to the CPU ctx, from a second GPU ctx, from before nn_ctx_reset, a parameter
 *    declared but not bound (the same message on both devices), NULL (NULL back, the earlier
 *    message kept; an optional input may be NULL); a NULL ctx; an input from a step whose
 *    backward ran; nn_item and the copies to the host of a tensor from before the reset;
 *  - shapes that do not match, bad ids, targets and options, element counts that overflow
 *    int64: the same status and message as the CPU op;
 *  - zero-sized dims: the same result as the CPU (shape, values, and input gradients after a
 *    backward), no launch error;
 *  - a tensor holding only its 2-byte copy (a GPT block's LayerNorm output under bf16
 *    autocast) given to ops that read fp32 values, and a head size the kernels do not take.
 * Exits 77 (skipped) where the build has no CUDA or no GPU can be used.
 */
#include "nn_cuda_check.h"

/* nn_internal.h: the GPT's LayerNorm whose output only products read. */
nn_tensor *accel__nn_norm_operand(nn_ctx *g, nn_tensor *x, nn_tensor *r, nn_tensor *weight,
                                  nn_tensor *bias, float eps, nn_tensor **sum);

enum { OP_ADD, OP_GELU, OP_DROP, OP_EMB, OP_LN, OP_ADD_LN, OP_LIN, OP_LGL, OP_CE, OP_ATTN, OP_LCE };
enum { N_OPS = OP_LCE + 1, MAX_T = 5, MAX_ELEMS = 4096 };

typedef struct op_shapes {
    int n_in;
    int ndim[MAX_T];
    int64_t shape[MAX_T][3];
    int64_t n_ids; /* ids (nn_embedding) or targets: rows of the input */
} op_shapes;

static const char *const op_names[N_OPS] = {"nn_add",
                                            "nn_gelu",
                                            "nn_dropout",
                                            "nn_embedding",
                                            "nn_layernorm",
                                            "nn_add_layernorm",
                                            "nn_linear",
                                            "nn_linear_gelu_linear",
                                            "nn_cross_entropy",
                                            "nn_causal_attention",
                                            "nn_linear_cross_entropy"};

/* Each op's tensor inputs, in the order of its public arguments. */
static const op_shapes op_default[N_OPS] = {
    {2, {2, 2}, {{4, 8}, {4, 8}}, 0},
    {1, {2}, {{4, 8}}, 0},
    {1, {2}, {{4, 8}}, 0},
    {1, {2}, {{10, 8}}, 4},
    {3, {2, 1, 1}, {{4, 8}, {8}, {8}}, 0},
    {4, {2, 2, 1, 1}, {{4, 8}, {4, 8}, {8}, {8}}, 0},
    {3, {2, 2, 1}, {{4, 8}, {8, 16}, {16}}, 0},
    {5, {2, 2, 1, 2, 1}, {{4, 8}, {8, 16}, {16}, {16, 8}, {8}}, 0},
    {1, {2}, {{4, 8}}, 4},
    {1, {3}, {{2, 3, 24}}, 0},
    {2, {2, 2}, {{4, 8}, {8, 10}}, 4},
};

/* Inputs the op may take as NULL (biases, LayerNorm's weight). */
static int optional_input(int op, int k)
{
    return ((op == OP_LN || op == OP_LIN) && k >= 1 + (op == OP_LIN)) ||
           (op == OP_ADD_LN && k >= 2) || (op == OP_LGL && (k == 2 || k == 4));
}

static int32_t tgt[64]; /* ids and targets: every one < 8, so valid for each op here */
static float vals[MAX_ELEMS];

static nn_tensor *run(nn_ctx *g, int op, nn_tensor *const *in, int64_t n_ids)
{
    nn_tensor *sum = NULL;
    switch (op) {
    case OP_ADD:
        return nn_add(g, in[0], in[1]);
    case OP_GELU:
        return nn_gelu(g, in[0], 1);
    case OP_DROP:
        return nn_dropout(g, in[0], 0.5f);
    case OP_EMB:
        return nn_embedding(g, in[0], tgt, 1, (int64_t[]){n_ids});
    case OP_LN:
        return nn_layernorm(g, in[0], in[1], in[2], 1e-5f);
    case OP_ADD_LN:
        return nn_add_layernorm(g, in[0], in[1], in[2], in[3], 1e-5f, &sum);
    case OP_LIN:
        return nn_linear(g, in[0], in[1], in[2], NN_LAYOUT_IN_OUT);
    case OP_LGL:
        return nn_linear_gelu_linear(g, in[0], in[1], in[2], in[3], in[4], NN_LAYOUT_IN_OUT, 1);
    case OP_CE:
        return nn_cross_entropy(g, in[0], tgt, NULL);
    case OP_ATTN:
        return nn_causal_attention(g, in[0], 2, 0.0f);
    default:
        return nn_linear_cross_entropy(g, in[0], in[1], tgt, NN_LAYOUT_IN_OUT, NULL);
    }
}

static nn_tensor *make(nn_ctx *g, int ndim, const int64_t *shape)
{
    CHECK(numel(ndim, shape) <= MAX_ELEMS);
    nn_tensor *t = nn_tensor_from(g, vals, ndim, shape);
    CHECK_MSG(t != NULL, "%s", accel_last_error(NULL));
    return nn_tensor_requires_grad(t, 1);
}

static void make_inputs(nn_ctx *g, const op_shapes *s, nn_tensor **in)
{
    for (int k = 0; k < MAX_T; k++) {
        in[k] = k < s->n_in ? make(g, s->ndim[k], s->shape[k]) : NULL;
    }
}

/* The op must return NULL with status st and exactly the message want. */
static void expect_err(nn_tensor *y, accel_status st, const char *want, const char *what)
{
    const char *got = accel_last_error(NULL);
    CHECK_MSG(y == NULL && accel_last_status(NULL) == st && strcmp(got, want) == 0,
              "%s: got %s %s \"%s\", expected NULL %s \"%s\"", what, y ? "a tensor" : "NULL",
              accel_status_name(accel_last_status(NULL)), got, accel_status_name(st), want);
}

/* Each input in turn from the wrong ctx or step, unbound, NULL; a NULL ctx. */
static void test_inputs(void)
{
    nn_ctx *g2;
    CHECK_OK(NULL, nn_ctx_new(&g2));
    CHECK_OK(NULL, nn_ctx_set_device(g2, (accel_device){ACCEL_DEVICE_CUDA, 0}));
    nn_params *p;
    CHECK_OK(NULL, nn_params_new(&p, NULL));
    int n_cases = 0;
    for (int op = 0; op < N_OPS; op++) {
        const op_shapes *s = &op_default[op];
        const char *name = op_names[op];
        nn_tensor *in[MAX_T];
        char want[256], what[96];
        /* The good call works on both devices. */
        nn_ctx_reset(ggpu);
        make_inputs(ggpu, s, in);
        CHECK_MSG(run(ggpu, op, in, s->n_ids) != NULL, "%s: %s", name, accel_last_error(NULL));
        for (int k = 0; k < s->n_in; k++) {
            snprintf(what, sizeof what, "%s, input %d", name, k);
            /* A CPU tensor given to the GPU ctx, and a GPU tensor given to the CPU ctx. */
            nn_ctx_reset(ggpu);
            nn_ctx_reset(gcpu);
            make_inputs(ggpu, s, in);
            in[k] = make(gcpu, s->ndim[k], s->shape[k]);
            snprintf(want, sizeof want,
                     "%s: input %d belongs to another nn_ctx and is in host memory (the ctx "
                     "computes on cuda:0)",
                     name, k);
            expect_err(run(ggpu, op, in, s->n_ids), ACCEL_EINVAL, want, what);
            make_inputs(gcpu, s, in);
            in[k] = make(ggpu, s->ndim[k], s->shape[k]);
            snprintf(want, sizeof want,
                     "%s: input %d belongs to another nn_ctx and is on the GPU (the ctx "
                     "computes on the CPU)",
                     name, k);
            expect_err(run(gcpu, op, in, s->n_ids), ACCEL_EINVAL, want, what);
            /* From a second GPU ctx. */
            nn_ctx_reset(g2);
            make_inputs(ggpu, s, in);
            in[k] = make(g2, s->ndim[k], s->shape[k]);
            snprintf(want, sizeof want, "%s: input %d belongs to another nn_ctx", name, k);
            expect_err(run(ggpu, op, in, s->n_ids), ACCEL_EINVAL, want, what);
            /* From before a reset: made after some padding, so that the inputs made after the
             * reset (which take the arena from its start) leave its struct as it was. */
            nn_ctx_reset(ggpu);
            for (int i = 0; i < 16; i++) {
                make(ggpu, 1, (int64_t[]){1});
            }
            nn_tensor *stale = make(ggpu, s->ndim[k], s->shape[k]);
            nn_ctx_reset(ggpu);
            make_inputs(ggpu, s, in);
            in[k] = stale;
            snprintf(want, sizeof want, "%s: input %d is from before nn_ctx_reset (stale)", name,
                     k);
            expect_err(run(ggpu, op, in, s->n_ids), ACCEL_ESTATE, want, what);
            /* A parameter not bound yet, on either device. */
            char pname[32];
            snprintf(pname, sizeof pname, "p%d", n_cases);
            nn_tensor *w = nn_params_declare(p, pname, s->ndim[k], s->shape[k],
                                             (nn_init){NN_INIT_ZEROS, 0.0f});
            CHECK(w != NULL);
            snprintf(want, sizeof want,
                     "%s: input %d is parameter %d, which has no data (bind its nn_params set "
                     "before use)",
                     name, k, w->param_index);
            for (int d = 0; d < 2; d++) {
                nn_ctx *g = d == 0 ? ggpu : gcpu;
                nn_ctx_reset(g);
                make_inputs(g, s, in);
                in[k] = w;
                expect_err(run(g, op, in, s->n_ids), ACCEL_ESTATE, want, what);
            }
            /* NULL: a required input gives NULL and leaves the message of the op that failed
             * before (the chaining nn.h documents); an optional one is fine. */
            nn_ctx_reset(ggpu);
            make_inputs(ggpu, s, in);
            CHECK(nn_softmax(ggpu, in[k], -1) == NULL); /* the earlier failure */
            const char *earlier = "nn_softmax: not implemented on CUDA yet (the ctx computes on "
                                  "cuda:0)";
            CHECK(strcmp(accel_last_error(NULL), earlier) == 0);
            in[k] = NULL;
            nn_tensor *y = run(ggpu, op, in, s->n_ids);
            if (optional_input(op, k)) {
                CHECK_MSG(y != NULL, "%s: %s", what, accel_last_error(NULL));
            } else {
                CHECK_MSG(y == NULL && strcmp(accel_last_error(NULL), earlier) == 0,
                          "%s: NULL input: %s", what, accel_last_error(NULL));
            }
            n_cases++;
        }
        /* A NULL ctx. */
        nn_ctx_reset(ggpu);
        make_inputs(ggpu, s, in);
        snprintf(want, sizeof want, "%s: ctx is NULL", name);
        expect_err(run(NULL, op, in, s->n_ids), ACCEL_EINVAL, want, name);
        /* An input from a step whose backward ran: the ctx resets at its next allocation. */
        nn_ctx_reset(ggpu);
        make_inputs(ggpu, s, in);
        nn_tensor *y = run(ggpu, op, in, s->n_ids);
        CHECK(y != NULL);
        float *ones = xmalloc((size_t)(nn_numel(y) + 1) * sizeof(float));
        for (int64_t i = 0; i < nn_numel(y); i++) {
            ones[i] = 1.0f;
        }
        CHECK_OK(NULL, nn_backward_grad(y, ones, NULL));
        free(ones);
        snprintf(want, sizeof want,
                 "%s: input 0 is from before nn_ctx_reset (stale): nn_backward ended its step, "
                 "so the ctx resets at its next allocation",
                 name);
        expect_err(run(ggpu, op, in, s->n_ids), ACCEL_ESTATE, want, name);
    }
    nn_ctx_reset(ggpu);
    nn_ctx_reset(gcpu);
    nn_params_free(p);
    nn_ctx_free(g2);
    printf("  inputs: %d ops x each input (wrong ctx or step, unbound, NULL): %d cases ok\n", N_OPS,
           n_cases);
}

/* Values read from a GPU tensor of an earlier step: refused before any copy (the device memory
 * holds this step's tensors); a loss stays readable after backward until the reset. */
static void test_stale_reads(void)
{
    nn_ctx_reset(ggpu);
    for (int i = 0; i < 16; i++) { /* padding, as in test_inputs */
        make(ggpu, 1, (int64_t[]){1});
    }
    nn_tensor *x = make(ggpu, 2, (int64_t[]){4, 8});
    nn_tensor *loss = nn_cross_entropy(ggpu, x, tgt, NULL);
    CHECK_OK(NULL, nn_backward(loss, 1.0f, NULL));
    float v[32];
    CHECK(!isnan(nn_item(loss)) && nn_tensor_grad_to_host(x, v) == ACCEL_OK);
    nn_ctx_reset(ggpu);
    make(ggpu, 2, (int64_t[]){4, 8});
    CHECK(isnan(nn_item(loss)) && accel_last_status(NULL) == ACCEL_ESTATE);
    CHECK_ERR(NULL, nn_tensor_to_host(x, v), ACCEL_ESTATE,
              "nn_tensor_to_host: the tensor is from before nn_ctx_reset (stale: its memory is "
              "reused)");
    CHECK(nn_tensor_grad_to_host(x, v) == ACCEL_ESTATE);
    nn_ctx_reset(ggpu);
    printf("  values of an earlier step's GPU tensors: refused\n");
}

/* A view of a parameter kept from an earlier step is refused as stale before anything reads
 * where it points (its struct is arena memory the next step reuses), though the parameter
 * outlives the step: the GPU ops' checks read the view's own stamp as the CPU ops' do. The
 * parameter here is a host one, so a view of this step gets the host-memory message instead. */
static void test_stale_param_view(void)
{
    nn_params *p;
    CHECK_OK(NULL, nn_params_new(&p, NULL));
    nn_tensor *w = nn_params_declare(p, "w", 2, (int64_t[]){8, 16}, (nn_init){NN_INIT_ONES, 0});
    CHECK(w != NULL);
    CHECK_OK(NULL, nn_params_bind(p));
    CHECK_OK(NULL, nn_params_init(p, 1));
    nn_ctx_reset(ggpu);
    for (int i = 0; i < 16; i++) { /* padding, as in test_inputs */
        make(ggpu, 1, (int64_t[]){1});
    }
    nn_tensor *wv = nn_reshape(ggpu, w, 2, (int64_t[]){8, 16});
    CHECK_MSG(wv != NULL, "%s", accel_last_error(NULL));
    nn_tensor *x = make(ggpu, 2, (int64_t[]){4, 8});
    expect_err(nn_linear(ggpu, x, wv, NULL, NN_LAYOUT_IN_OUT), ACCEL_EINVAL,
               "nn_linear: input 1 is in host memory and the ctx on cuda:0 (a parameter of a "
               "model kept on the CPU: compute it with a CPU ctx)",
               "a host parameter's view");
    nn_ctx_reset(ggpu);
    x = make(ggpu, 2, (int64_t[]){4, 8});
    expect_err(nn_linear(ggpu, x, wv, NULL, NN_LAYOUT_IN_OUT), ACCEL_ESTATE,
               "nn_linear: input 1 is from before nn_ctx_reset (stale)",
               "an earlier step's view of a parameter");
    nn_ctx_reset(ggpu);
    nn_params_free(p);
    printf("  an earlier step's view of a parameter: refused as stale\n");
}

/* ---- bad shapes and arguments: the CPU op's status and message ---- */

typedef nn_tensor *(*bad_fn)(nn_ctx *g);

static nn_tensor *T1(nn_ctx *g, int64_t a)
{
    return make(g, 1, (int64_t[]){a});
}
static nn_tensor *T2(nn_ctx *g, int64_t a, int64_t b)
{
    return make(g, 2, (int64_t[]){a, b});
}
static nn_tensor *T3(nn_ctx *g, int64_t a, int64_t b, int64_t c)
{
    return make(g, 3, (int64_t[]){a, b, c});
}
static nn_tensor *T0(nn_ctx *g)
{
    return make(g, 0, NULL);
}

static nn_tensor *b_add(nn_ctx *g)
{
    return nn_add(g, T2(g, 4, 8), T2(g, 4, 7));
}
static nn_tensor *b_ln_w(nn_ctx *g)
{
    return nn_layernorm(g, T2(g, 4, 8), T1(g, 7), NULL, 1e-5f);
}
static nn_tensor *b_ln_0d(nn_ctx *g)
{
    return nn_layernorm(g, T0(g), NULL, NULL, 1e-5f);
}
static nn_tensor *b_addln(nn_ctx *g)
{
    nn_tensor *s;
    return nn_add_layernorm(g, T2(g, 4, 8), T2(g, 4, 7), NULL, NULL, 1e-5f, &s);
}
static nn_tensor *b_addln_b(nn_ctx *g)
{
    nn_tensor *s;
    return nn_add_layernorm(g, T2(g, 4, 8), T2(g, 4, 8), T1(g, 8), T1(g, 9), 1e-5f, &s);
}
static nn_tensor *b_addln_sum(nn_ctx *g)
{
    return nn_add_layernorm(g, T2(g, 4, 8), T2(g, 4, 8), NULL, NULL, 1e-5f, NULL);
}
static nn_tensor *b_lin_in(nn_ctx *g)
{
    return nn_linear(g, T2(g, 4, 7), T2(g, 8, 16), NULL, NN_LAYOUT_IN_OUT);
}
static nn_tensor *b_lin_bias(nn_ctx *g)
{
    return nn_linear(g, T2(g, 4, 8), T2(g, 16, 8), T1(g, 15), NN_LAYOUT_OUT_IN);
}
static nn_tensor *b_lin_w1d(nn_ctx *g)
{
    return nn_linear(g, T2(g, 4, 8), T1(g, 8), NULL, NN_LAYOUT_IN_OUT);
}
static nn_tensor *b_lin_x0d(nn_ctx *g)
{
    return nn_linear(g, T0(g), T2(g, 1, 8), NULL, NN_LAYOUT_IN_OUT);
}
static nn_tensor *b_lgl_w2(nn_ctx *g)
{
    return nn_linear_gelu_linear(g, T2(g, 4, 8), T2(g, 8, 16), NULL, T2(g, 15, 8), NULL,
                                 NN_LAYOUT_IN_OUT, 1);
}
static nn_tensor *b_lgl_b1(nn_ctx *g)
{
    return nn_linear_gelu_linear(g, T2(g, 4, 8), T2(g, 8, 16), T1(g, 15), T2(g, 16, 8), NULL,
                                 NN_LAYOUT_IN_OUT, 1);
}
static nn_tensor *b_lgl_b2(nn_ctx *g)
{
    return nn_linear_gelu_linear(g, T2(g, 4, 8), T2(g, 8, 16), NULL, T2(g, 16, 8), T1(g, 7),
                                 NN_LAYOUT_IN_OUT, 1);
}
static nn_tensor *b_ce_target(nn_ctx *g)
{
    return nn_cross_entropy(g, T2(g, 2, 8), (const int32_t[]){1, 8}, NULL);
}
static nn_tensor *b_ce_neg(nn_ctx *g)
{
    return nn_cross_entropy(g, T2(g, 2, 8), (const int32_t[]){-3, 1}, NULL);
}
static nn_tensor *b_ce_null(nn_ctx *g)
{
    return nn_cross_entropy(g, T2(g, 2, 8), NULL, NULL);
}
static nn_tensor *b_ce_0d(nn_ctx *g)
{
    return nn_cross_entropy(g, T0(g), tgt, NULL);
}
static nn_tensor *b_ce_nocls(nn_ctx *g)
{
    return nn_cross_entropy(g, T2(g, 2, 0), tgt, NULL);
}
static nn_tensor *b_ce_smooth(nn_ctx *g)
{
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.label_smoothing = 2.0f;
    return nn_cross_entropy(g, T2(g, 2, 8), tgt, &o);
}
static nn_tensor *b_ce_red(nn_ctx *g)
{
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.reduction = (nn_reduction)9;
    return nn_cross_entropy(g, T2(g, 2, 8), tgt, &o);
}
static nn_tensor *b_attn_2d(nn_ctx *g)
{
    return nn_causal_attention(g, T2(g, 3, 24), 2, 0.0f);
}
static nn_tensor *b_attn_width(nn_ctx *g)
{
    return nn_causal_attention(g, T3(g, 2, 3, 25), 2, 0.0f);
}
static nn_tensor *b_attn_heads(nn_ctx *g)
{
    return nn_causal_attention(g, T3(g, 2, 3, 24), 0, 0.0f);
}
static nn_tensor *b_attn_drop(nn_ctx *g)
{
    return nn_causal_attention(g, T3(g, 2, 3, 24), 2, 1.5f);
}
static nn_tensor *b_emb_id(nn_ctx *g)
{
    return nn_embedding(g, T2(g, 10, 8), (const int32_t[]){1, 10}, 1, (int64_t[]){2});
}
static nn_tensor *b_emb_neg(nn_ctx *g)
{
    return nn_embedding(g, T2(g, 10, 8), (const int32_t[]){-1}, 1, (int64_t[]){1});
}
static nn_tensor *b_emb_w1d(nn_ctx *g)
{
    return nn_embedding(g, T1(g, 10), tgt, 1, (int64_t[]){2});
}
static nn_tensor *b_emb_ids(nn_ctx *g)
{
    return nn_embedding(g, T2(g, 10, 8), NULL, 1, (int64_t[]){2});
}
static nn_tensor *b_emb_shape(nn_ctx *g)
{
    return nn_embedding(g, T2(g, 10, 8), tgt, 2, NULL);
}
static nn_tensor *b_emb_negshape(nn_ctx *g)
{
    return nn_embedding(g, T2(g, 10, 8), tgt, 2, (int64_t[]){-1, -2});
}
static nn_tensor *b_emb_huge(nn_ctx *g)
{
    return nn_embedding(g, T2(g, 10, 8), tgt, 3,
                        (int64_t[]){INT64_C(1) << 32, INT64_C(1) << 32, INT64_C(1) << 32});
}
static nn_tensor *b_lce_in(nn_ctx *g)
{
    return nn_linear_cross_entropy(g, T2(g, 4, 7), T2(g, 8, 10), tgt, NN_LAYOUT_IN_OUT, NULL);
}
static nn_tensor *b_lce_target(nn_ctx *g)
{
    return nn_linear_cross_entropy(g, T2(g, 2, 8), T2(g, 8, 10), (const int32_t[]){0, 10},
                                   NN_LAYOUT_IN_OUT, NULL);
}
static nn_tensor *b_lce_chunk(nn_ctx *g)
{
    nn_cross_entropy_options o = nn_cross_entropy_options_default();
    o.chunk_rows = -1;
    return nn_linear_cross_entropy(g, T2(g, 4, 8), T2(g, 8, 10), tgt, NN_LAYOUT_IN_OUT, &o);
}
static nn_tensor *b_lce_layout(nn_ctx *g)
{
    return nn_linear_cross_entropy(g, T2(g, 4, 8), T2(g, 8, 10), tgt, (nn_layout)7, NULL);
}
static nn_tensor *b_lce_targets(nn_ctx *g)
{
    return nn_linear_cross_entropy(g, T2(g, 4, 8), T2(g, 8, 10), NULL, NN_LAYOUT_IN_OUT, NULL);
}
static nn_tensor *b_drop_p(nn_ctx *g)
{
    return nn_dropout(g, T2(g, 4, 8), 1.5f);
}
static nn_tensor *b_drop_nan(nn_ctx *g)
{
    return nn_dropout(g, T2(g, 4, 8), NAN);
}
static nn_tensor *b_huge(nn_ctx *g)
{
    return nn_tensor_new(g, 2, (int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40});
}
static nn_tensor *b_huge_zero(nn_ctx *g)
{
    return nn_tensor_new(g, 3, (int64_t[]){0, INT64_C(1) << 40, INT64_C(1) << 40});
}
static nn_tensor *b_reshape_huge(nn_ctx *g)
{
    return nn_reshape(g, T1(g, 0), 3, (int64_t[]){INT64_C(1) << 32, INT64_C(1) << 32, 0});
}

static void test_bad_args(void)
{
    static const struct {
        const char *name;
        bad_fn fn;
    } cases[] = {
        {"add shapes", b_add},
        {"layernorm weight", b_ln_w},
        {"layernorm 0-D", b_ln_0d},
        {"add_layernorm shapes", b_addln},
        {"add_layernorm bias", b_addln_b},
        {"add_layernorm sum NULL", b_addln_sum},
        {"linear in", b_lin_in},
        {"linear bias", b_lin_bias},
        {"linear 1-D weight", b_lin_w1d},
        {"linear 0-D input", b_lin_x0d},
        {"lgl w2", b_lgl_w2},
        {"lgl b1", b_lgl_b1},
        {"lgl b2", b_lgl_b2},
        {"ce target", b_ce_target},
        {"ce negative target", b_ce_neg},
        {"ce targets NULL", b_ce_null},
        {"ce 0-D", b_ce_0d},
        {"ce no classes", b_ce_nocls},
        {"ce smoothing", b_ce_smooth},
        {"ce reduction", b_ce_red},
        {"attention 2-D", b_attn_2d},
        {"attention width", b_attn_width},
        {"attention heads", b_attn_heads},
        {"attention dropout", b_attn_drop},
        {"embedding id", b_emb_id},
        {"embedding negative id", b_emb_neg},
        {"embedding 1-D weight", b_emb_w1d},
        {"embedding ids NULL", b_emb_ids},
        {"embedding shape NULL", b_emb_shape},
        {"embedding negative shape", b_emb_negshape},
        {"embedding huge shape", b_emb_huge},
        {"lce in", b_lce_in},
        {"lce target", b_lce_target},
        {"lce chunk_rows", b_lce_chunk},
        {"lce layout", b_lce_layout},
        {"lce targets NULL", b_lce_targets},
        {"dropout p", b_drop_p},
        {"dropout NaN", b_drop_nan},
        {"tensor huge", b_huge},
        {"tensor huge with a 0 dim", b_huge_zero},
        {"reshape huge", b_reshape_huge},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < n; c++) {
        char msg[2][512];
        accel_status st[2];
        for (int d = 0; d < 2; d++) {
            nn_ctx *g = d == 0 ? gcpu : ggpu;
            nn_ctx_reset(g);
            nn_tensor *y = cases[c].fn(g);
            st[d] = accel_last_status(NULL);
            snprintf(msg[d], sizeof msg[d], "%s", accel_last_error(NULL));
            CHECK_MSG(y == NULL && st[d] != ACCEL_OK, "%s on the %s: not refused (%s)",
                      cases[c].name, d ? "GPU" : "CPU", msg[d]);
        }
        CHECK_MSG(st[0] == st[1] && strcmp(msg[0], msg[1]) == 0,
                  "%s: the GPU's %s \"%s\" is not the CPU's %s \"%s\"", cases[c].name,
                  accel_status_name(st[1]), msg[1], accel_status_name(st[0]), msg[0]);
    }
    nn_ctx_reset(gcpu);
    nn_ctx_reset(ggpu);
    printf("  bad shapes and arguments: %d cases, the CPU's status and message\n", n);
}

/* ---- zero-sized dims: the CPU's result ---- */

/* Output and input gradients of t on g's side, in host memory (ESTATE: no gradient). */
static accel_status grad_of(const nn_tensor *t, float *dst)
{
    return nn_tensor_grad_to_host(t, dst);
}

/* 1 when a and b (n floats) agree within tol, NaN matching NaN. */
static int agree(const float *a, const float *b, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i]) ||
            (!isnan(a[i]) && fabs((double)a[i] - (double)b[i]) > tol * (1.0 + fabs(b[i])))) {
            return 0;
        }
    }
    return 1;
}

static void test_zero_sizes(void)
{
    static const struct {
        const char *name;
        int op;
        op_shapes s;
    } cases[] = {
        {"add [0, 8]", OP_ADD, {2, {2, 2}, {{0, 8}, {0, 8}}, 0}},
        {"add [2, 0] + [0]", OP_ADD, {2, {2, 1}, {{2, 0}, {0}}, 0}},
        {"add [4, 0]", OP_ADD, {2, {2, 2}, {{4, 0}, {4, 0}}, 0}},
        {"gelu [0, 8]", OP_GELU, {1, {2}, {{0, 8}}, 0}},
        {"dropout [0, 8]", OP_DROP, {1, {2}, {{0, 8}}, 0}},
        {"embedding, no ids", OP_EMB, {1, {2}, {{10, 8}}, 0}},
        {"embedding, 0 columns", OP_EMB, {1, {2}, {{10, 0}}, 4}},
        {"layernorm [0, 8]", OP_LN, {3, {2, 1, 1}, {{0, 8}, {8}, {8}}, 0}},
        {"layernorm [4, 0]", OP_LN, {3, {2, 1, 1}, {{4, 0}, {0}, {0}}, 0}},
        {"add_layernorm [0, 8]", OP_ADD_LN, {4, {2, 2, 1, 1}, {{0, 8}, {0, 8}, {8}, {8}}, 0}},
        {"add_layernorm [4, 0]", OP_ADD_LN, {4, {2, 2, 1, 1}, {{4, 0}, {4, 0}, {0}, {0}}, 0}},
        {"linear, no rows", OP_LIN, {3, {2, 2, 1}, {{0, 8}, {8, 16}, {16}}, 0}},
        {"linear, no inputs", OP_LIN, {3, {2, 2, 1}, {{4, 0}, {0, 16}, {16}}, 0}},
        {"linear, no outputs", OP_LIN, {3, {2, 2, 1}, {{4, 8}, {8, 0}, {0}}, 0}},
        {"lgl, no rows", OP_LGL, {5, {2, 2, 1, 2, 1}, {{0, 8}, {8, 16}, {16}, {16, 8}, {8}}, 0}},
        {"lgl, no inputs", OP_LGL, {5, {2, 2, 1, 2, 1}, {{4, 0}, {0, 16}, {16}, {16, 8}, {8}}, 0}},
        {"lgl, no hidden", OP_LGL, {5, {2, 2, 1, 2, 1}, {{4, 8}, {8, 0}, {0}, {0, 8}, {8}}, 0}},
        {"lgl, no outputs", OP_LGL, {5, {2, 2, 1, 2, 1}, {{4, 8}, {8, 16}, {16}, {16, 0}, {0}}, 0}},
        {"cross_entropy, no rows", OP_CE, {1, {2}, {{0, 8}}, 0}},
        {"attention, B 0", OP_ATTN, {1, {3}, {{0, 3, 24}}, 0}},
        {"attention, T 0", OP_ATTN, {1, {3}, {{2, 0, 24}}, 0}},
        {"attention, C 0", OP_ATTN, {1, {3}, {{2, 3, 0}}, 0}},
        {"attention, head size 64, B 0", OP_ATTN, {1, {3}, {{0, 3, 384}}, 0}},
        {"attention, head size 64, T 0", OP_ATTN, {1, {3}, {{2, 0, 384}}, 0}},
        {"lce, no rows", OP_LCE, {2, {2, 2}, {{0, 8}, {8, 10}}, 0}},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    static float y[2][MAX_ELEMS], gr[2][MAX_ELEMS], ones[MAX_ELEMS];
    for (int i = 0; i < MAX_ELEMS; i++) {
        ones[i] = 1.0f;
    }
    /* In fp32 (1e-5), and under bf16 and fp16 autocast (1e-2: the bias rows of a linear
     * without inputs, rounded), where other kernels run (2-byte copies, tensor cores). */
    static const int modes[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    for (int c = 0; c < 3 * n; c++) {
        const char *name = cases[c % n].name;
        int mode = modes[c / n];
        double tol = mode == ACCEL_F32 ? 1e-5 : 1e-2;
        nn_tensor *in[2][MAX_T], *out[2];
        for (int d = 0; d < 2; d++) {
            nn_ctx *g = d == 0 ? gcpu : ggpu;
            nn_ctx_reset(g);
            nn_ctx_set_autocast(g, mode);
            make_inputs(g, &cases[c % n].s, in[d]);
            out[d] = run(g, cases[c % n].op, in[d], cases[c % n].s.n_ids);
            CHECK_MSG(out[d] != NULL, "%s on the %s (autocast %d): %s", name, d ? "GPU" : "CPU",
                      mode, accel_last_error(NULL));
            CHECK(nn_numel(out[d]) <= MAX_ELEMS);
            CHECK_OK(NULL, nn_tensor_to_host(out[d], y[d]));
            CHECK_OK(NULL, nn_backward_grad(out[d], ones, NULL));
        }
        CHECK_MSG(
            out[0]->ndim == out[1]->ndim &&
                memcmp(out[0]->shape, out[1]->shape, (size_t)out[0]->ndim * sizeof(int64_t)) == 0,
            "%s (autocast %d): output shapes differ", name, mode);
        CHECK_MSG(agree(y[1], y[0], nn_numel(out[0]), tol), "%s (autocast %d): outputs differ",
                  name, mode);
        for (int k = 0; k < cases[c % n].s.n_in; k++) {
            accel_status st[2];
            for (int d = 0; d < 2; d++) {
                st[d] = grad_of(in[d][k], gr[d]);
            }
            int64_t m = nn_numel(in[0][k]);
            /* A gradient never written (nothing reached it) and one of zeros are the same. */
            for (int d = 0; d < 2; d++) {
                if (st[d] != ACCEL_OK) {
                    memset(gr[d], 0, (size_t)m * sizeof(float));
                }
            }
            CHECK_MSG(agree(gr[1], gr[0], m, tol),
                      "%s (autocast %d): input %d's gradients differ (%s / %s)", name, mode, k,
                      accel_status_name(st[0]), accel_status_name(st[1]));
        }
    }
    for (int d = 0; d < 2; d++) {
        nn_ctx_set_autocast(d ? ggpu : gcpu, ACCEL_F32);
        nn_ctx_reset(d ? ggpu : gcpu);
    }
    printf("  zero-sized dims: %d cases x fp32, bf16, fp16: the CPU's outputs and gradients\n", n);
}

/* ---- what the kernels do not take ---- */

/* A GPT block's LayerNorm output under bf16 autocast holds only its 2-byte copy: the ops that
 * read fp32 values refuse it by name; a head size above the kernels' is refused. */
static void test_kernel_limits(void)
{
    nn_ctx_reset(ggpu);
    nn_ctx_set_autocast(ggpu, ACCEL_BF16);
    CHECK(nn_ctx_set_autocast(ggpu, ACCEL_I32) == ACCEL_BF16); /* not a mode: ignored */
    nn_tensor *x = T2(ggpu, 4, 64), *w = T1(ggpu, 64);
    nn_tensor *h = accel__nn_norm_operand(ggpu, x, NULL, w, NULL, 1e-5f, NULL);
    CHECK_MSG(h != NULL && h->data == NULL, "%s", accel_last_error(NULL));
    char want[256];
    const char *tail = "holds only the 2-byte copy that products read (a GPT block's LayerNorm "
                       "output or qkv under autocast): use nn_layernorm or nn_linear";
    snprintf(want, sizeof want, "nn_add: input 1 %s", tail);
    expect_err(nn_add(ggpu, x, h), ACCEL_EINVAL, want, "shell to nn_add");
    snprintf(want, sizeof want, "nn_gelu: input 0 %s", tail);
    expect_err(nn_gelu(ggpu, h, 1), ACCEL_EINVAL, want, "shell to nn_gelu");
    snprintf(want, sizeof want, "nn_layernorm: input 0 %s", tail);
    expect_err(nn_layernorm(ggpu, h, NULL, NULL, 1e-5f), ACCEL_EINVAL, want, "shell to LN");
    snprintf(want, sizeof want, "nn_cross_entropy: input 0 %s", tail);
    expect_err(nn_cross_entropy(ggpu, h, tgt, NULL), ACCEL_EINVAL, want, "shell to CE");
    snprintf(want, sizeof want, "nn_linear: input 1 %s", tail); /* only as input 0 */
    expect_err(nn_linear(ggpu, x, h, NULL, NN_LAYOUT_IN_OUT), ACCEL_EINVAL, want, "shell as W");
    float host[256];
    CHECK(nn_tensor_to_host(h, host) == ACCEL_ESTATE);
    CHECK(nn_linear(ggpu, h, T2(ggpu, 64, 8), NULL, NN_LAYOUT_IN_OUT) != NULL); /* a product */
    nn_ctx_set_autocast(ggpu, ACCEL_F32);
    nn_ctx_reset(ggpu);
    expect_err(nn_causal_attention(ggpu, T3(ggpu, 1, 2, 3 * 2 * 264), 2, 0.0f), ACCEL_EUNSUPPORTED,
               "nn_causal_attention: head size 264: CUDA supports up to 256", "head size");
    nn_ctx_reset(ggpu);
    printf("  2-byte-only tensors and head sizes the kernels do not take: refused\n");
}

int main(void)
{
    if (nn_cuda_check_init("test_nn_cuda_faults") != 0) {
        return 77;
    }
    for (int i = 0; i < MAX_ELEMS; i++) {
        vals[i] = frand();
    }
    for (int i = 0; i < 64; i++) {
        tgt[i] = (int32_t)((i * 5 + 1) % 8);
    }
    test_inputs();
    test_stale_reads();
    test_stale_param_view();
    test_bad_args();
    test_zero_sizes();
    test_kernel_limits();
    nn_cuda_check_done("test_nn_cuda_faults");
    return 0;
}
