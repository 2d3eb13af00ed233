/*
 * nn: bad input to the public API on the CPU gets a clear error naming the culprit, never a
 * crash or a silent wrong answer. One case per defect a fault-injection sweep found (each
 * crashed, wrapped or answered wrongly before its fix); the cases that already failed cleanly
 * are covered by test_nn_autograd's test_nograd_errors and the op tests.
 */
#include <stdint.h>
#include <string.h>

#include "accel/nn.h"
#include "check.h"

/* An op that must return NULL with exactly the message `text`. */
#define CHECK_NULL_ERR(expr, text)                                                                 \
    do {                                                                                           \
        const void *check_r_ = (const void *)(expr);                                               \
        const char *check_m_ = accel_last_error(NULL);                                             \
        CHECK_MSG(check_r_ == NULL && strcmp(check_m_, (text)) == 0,                               \
                  "%s: got %s \"%s\", expected NULL \"%s\"", #expr,                                \
                  check_r_ ? "a tensor" : "NULL", check_m_, (text));                               \
    } while (0)

static const int64_t s23[2] = {2, 3};

/* A wrapped element count (2^40 x 2^40 is 0 mod 2^64) made a tensor with no memory for a
 * huge shape; reshape's product could wrap the same way. */
static void test_overflowing_shapes(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    int64_t big = INT64_C(1) << 40;
    CHECK_NULL_ERR(nn_tensor_new(g, 2, (int64_t[]){big, big}),
                   "nn tensor: shape too large (dim 1 of size 1099511627776 overflows the "
                   "element count)");
    CHECK_NULL_ERR(nn_tensor_new(g, 1, (int64_t[]){INT64_C(1) << 62}),
                   "nn tensor: shape too large (dim 0 of size 4611686018427387904 overflows the "
                   "element count)");
    /* A zero dim makes numel 0, but the strides still come from the other sizes. */
    CHECK(nn_tensor_new(g, 3, (int64_t[]){0, big, big}) == NULL);
    CHECK(nn_numel(nn_tensor_new(g, 3, (int64_t[]){0, 3, 4})) == 0);
    CHECK_NULL_ERR(nn_tensor_new(g, 2, NULL), "nn tensor: shape is NULL for ndim 2");
    float v[6] = {1, 2, 3, 4, 5, 6};
    nn_tensor *x = nn_tensor_from(g, v, 2, s23);
    nn_tensor *e = nn_tensor_new(g, 1, (int64_t[]){0});
    CHECK_NULL_ERR(nn_reshape(g, e, 3, (int64_t[]){INT64_C(1) << 32, INT64_C(1) << 32, 0}),
                   "nn_reshape: size 4294967296 in dim 1 overflows the element count");
    CHECK(nn_reshape(g, x, 3, (int64_t[]){INT64_C(1) << 32, INT64_C(1) << 32, 0}) == NULL);

    /* Parameters: one wrapped count, and a set whose total would wrap. */
    nn_params *p;
    CHECK_OK(NULL, nn_params_new(&p, NULL));
    nn_init z = {NN_INIT_ZEROS, 0.0f};
    CHECK(nn_params_declare(p, "w", 2, (int64_t[]){big, big}, z) == NULL);
    CHECK(strstr(accel_last_error(NULL), "nn_params_declare(w): dim 1 of size") != NULL);
    CHECK(nn_params_declare(p, "a", 1, (int64_t[]){INT64_C(1) << 59}, z) != NULL);
    CHECK(nn_params_declare(p, "b", 1, (int64_t[]){INT64_C(1) << 59}, z) == NULL);
    CHECK(strstr(accel_last_error(NULL), "overflow the set's count") != NULL);
    CHECK(nn_params_declare(p, "c", 1, (int64_t[]){2}, (nn_init){(nn_init_kind)9, 0.0f}) == NULL);
    CHECK(strcmp(accel_last_error(NULL), "nn_params_declare(c): unknown init kind 9") == 0);
    nn_params_free(p);
    nn_ctx_free(g);
}

/* NULL handles: accessors and settings are no-ops, ops fail with a message. */
static void test_null_handles(void)
{
    CHECK(nn_numel(NULL) == 0 && nn_is_contiguous(NULL) == 0);
    CHECK(isnan(nn_item(NULL)));
    CHECK(strcmp(accel_last_error(NULL), "nn_item: tensor is NULL") == 0);
    CHECK(nn_ctx_set_grad_enabled(NULL, 0) == 0 && nn_ctx_set_training(NULL, 0) == 0);
    nn_ctx_set_seed(NULL, 1);
    nn_ctx_set_step(NULL, 1);
    CHECK(nn_ctx_step(NULL) == 0 && nn_ctx_get_stats(NULL).n_nodes == 0);
    CHECK(nn_ctx_set_autocast(NULL, ACCEL_BF16) == ACCEL_F32);
    CHECK(nn_ctx_autocast_dtype(NULL) == ACCEL_F32);
    CHECK(nn_gpt_train_flops(NULL, 1, 1) == 0.0);

    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    float v[6] = {1, 2, 3, 4, 5, 6};
    nn_tensor *x = nn_tensor_from(g, v, 2, s23);
    CHECK_NULL_ERR(nn_add(NULL, x, x), "nn_add: ctx is NULL");
    CHECK_NULL_ERR(nn_tanh(NULL, x), "nn_tanh: ctx is NULL");
    CHECK_NULL_ERR(nn_dropout(NULL, x, 0.5f), "nn_dropout: ctx is NULL"); /* crashed */
    CHECK_NULL_ERR(nn_embedding(NULL, x, (int32_t[]){0}, 1, (int64_t[]){1}),
                   "nn_embedding: ctx is NULL");
    /* Linear without input features: the bias in every row (it left the output unwritten). */
    nn_tensor *y =
        nn_linear(g, nn_tensor_new(g, 2, (int64_t[]){2, 0}), nn_tensor_new(g, 2, (int64_t[]){0, 3}),
                  nn_tensor_from(g, v, 1, (int64_t[]){3}), NN_LAYOUT_IN_OUT);
    CHECK(y != NULL && y->data[0] == 1.0f && y->data[2] == 3.0f && y->data[3] == 1.0f &&
          y->data[5] == 3.0f);
    CHECK_NULL_ERR(nn_linear_forward(g, NULL, x), "nn_linear_forward: layer is NULL");
    CHECK_NULL_ERR(nn_layernorm_forward(g, NULL, x), "nn_layernorm_forward: layer is NULL");
    CHECK_NULL_ERR(nn_mlp_forward(g, NULL, x), "nn_mlp_forward: layer is NULL");
    CHECK_NULL_ERR(nn_block_forward(g, NULL, x), "nn_block_forward: layer is NULL");
    CHECK_NULL_ERR(nn_embedding_forward(g, NULL, (int32_t[]){0}, 1, (int64_t[]){1}),
                   "nn_embedding_forward: layer is NULL");
    /* nn_item of a tensor that is not one element reads no memory past it. */
    CHECK(isnan(nn_item(x)));
    CHECK(strcmp(accel_last_error(NULL), "nn_item: tensor [2, 3] has 6 elements, not 1") == 0);
    CHECK(isnan(nn_item(nn_tensor_new(g, 1, (int64_t[]){0}))));
    nn_ctx_free(g);
}

/* Tensors that outlived their tape or belong to another ctx, and parameters not bound. */
static void test_stale_foreign_unbound(void)
{
    nn_ctx *g, *h;
    CHECK_OK(NULL, nn_ctx_new(&g));
    CHECK_OK(NULL, nn_ctx_new(&h));
    float v[6] = {1, 2, 3, 4, 5, 6};
    nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, v, 2, s23), 1);
    nn_tensor *loss = nn_sum_all(g, nn_tanh(g, x));
    nn_tensor *y = nn_tanh(g, x);
    CHECK_NULL_ERR(nn_add(h, y, y), "nn_add: input 0 belongs to another nn_ctx");
    nn_ctx_reset(g);
    /* Backward of a loss from before the reset used to return OK and compute nothing. */
    CHECK_ERR(NULL, nn_backward(loss, 1.0f, NULL), ACCEL_ESTATE,
              "nn_backward: the output is from before the ctx was reset (its tape is gone; run "
              "the forward again)");
    CHECK_NULL_ERR(nn_tanh(g, y), "nn_tanh: input 0 is from before nn_ctx_reset (stale)");
    nn_ctx_reset(g);

    nn_params *p;
    CHECK_OK(NULL, nn_params_new(&p, NULL));
    nn_tensor *w = nn_params_declare(p, "w", 2, (int64_t[]){3, 2}, (nn_init){NN_INIT_ONES, 0.0f});
    CHECK(w != NULL);
    x = nn_tensor_from(g, v, 2, s23);
    CHECK_NULL_ERR(nn_matmul(g, x, w), "nn_matmul: input 1 is parameter 0, which has no data "
                                       "(bind its nn_params set before use)");
    CHECK_NULL_ERR(nn_linear(g, x, w, NULL, NN_LAYOUT_IN_OUT),
                   "nn_linear: input 1 is parameter 0, which has no data (bind its nn_params set "
                   "before use)");
    CHECK_OK(NULL, nn_params_bind(p));
    nn_ctx_reset(g);
    x = nn_tensor_from(g, v, 2, s23);
    CHECK(nn_matmul(g, x, w) != NULL);
    nn_params_free(p);
    nn_ctx_free(h);
    nn_ctx_free(g);
}

/* Every tensor carries its ctx and step, leaves and no-grad results too: they used to pass
 * the checks (only recorded results had the stamp) and read memory the arena had reused. */
static void test_stale_foreign_leaves(void)
{
    nn_ctx *g, *h;
    CHECK_OK(NULL, nn_ctx_new(&g));
    CHECK_OK(NULL, nn_ctx_new(&h));
    float v[6] = {1, 2, 3, 4, 5, 6};
    /* (After a reset new tensors take the arena from its start: the first one's struct is
     * overwritten, and its stamp with it. The check is best effort; pad keeps x's intact.) */
    nn_tensor *pad = nn_tensor_from(g, v, 2, s23), *x = nn_tensor_from(g, v, 2, s23);
    CHECK(pad != NULL);
    CHECK_NULL_ERR(nn_tanh(h, x), "nn_tanh: input 0 belongs to another nn_ctx");
    CHECK_NULL_ERR(nn_linear(h, nn_tensor_from(h, v, 2, s23), nn_transpose(g, x, 0, 1), NULL,
                             NN_LAYOUT_IN_OUT),
                   "nn_linear: input 1 belongs to another nn_ctx"); /* a view: its owner's */
    nn_ctx_set_grad_enabled(g, 0);
    nn_tensor *y = nn_tanh(g, x); /* not recorded */
    nn_ctx_set_grad_enabled(g, 1);
    CHECK(y != NULL && nn_concat(g, (nn_tensor *[]){x, y}, 2, 0) != NULL);
    CHECK_NULL_ERR(nn_concat(h, (nn_tensor *[]){nn_tensor_from(h, v, 2, s23), y}, 2, 0),
                   "nn_concat: input 1 belongs to another nn_ctx");
    nn_ctx_reset(g);
    nn_tensor *fresh = nn_tensor_from(g, v, 2, s23); /* where pad was */
    CHECK_NULL_ERR(nn_add(g, fresh, x), "nn_add: input 1 is from before nn_ctx_reset (stale)");
    CHECK_NULL_ERR(nn_dropout(g, y, 0.0f), "nn_dropout: input 0 is from before nn_ctx_reset "
                                           "(stale)"); /* p 0 returned y itself */
    CHECK_NULL_ERR(nn_reshape(g, y, 1, (int64_t[]){6}),
                   "nn_reshape: input 0 is from before nn_ctx_reset (stale)");
    /* Reading its values: memory the arena reuses. */
    float back[6];
    CHECK_ERR(NULL, nn_tensor_to_host(y, back), ACCEL_ESTATE,
              "nn_tensor_to_host: the tensor is from before nn_ctx_reset (stale: its memory is "
              "reused)");
    /* After backward the next allocation resets the ctx: the step's tensors are done. */
    nn_ctx_reset(g);
    x = nn_tensor_requires_grad(nn_tensor_from(g, v, 2, s23), 1);
    y = nn_tanh(g, x);
    CHECK_OK(NULL, nn_backward(nn_sum_all(g, y), 1.0f, NULL));
    CHECK_NULL_ERR(nn_add(g, y, y), "nn_add: input 0 is from before nn_ctx_reset (stale): "
                                    "nn_backward ended its step, so the ctx resets at its "
                                    "next allocation");
    /* nn_backward tells a leaf by the tape, no longer by a missing stamp. */
    nn_ctx_reset(g);
    x = nn_tensor_requires_grad(nn_tensor_from(g, v, 0, NULL), 1);
    CHECK_ERR(NULL, nn_backward(x, 1.0f, NULL), ACCEL_EINVAL,
              "nn_backward: the output is a leaf (nn_tensor_new / nn_tensor_from), not an op "
              "result: it has no tape");
    nn_tensor *loss = nn_sum_all(g, nn_tanh(g, x));
    CHECK_OK(NULL, nn_backward(loss, 1.0f, NULL));
    CHECK(!isnan(nn_item(loss))); /* readable after backward, until the reset */
    nn_ctx_reset(g);
    CHECK(isnan(nn_item(loss)));
    CHECK(strcmp(accel_last_error(NULL), "nn_item: the tensor is from before nn_ctx_reset "
                                         "(stale: its memory is reused)") == 0);
    nn_ctx_free(h);
    nn_ctx_free(g);
}

/* A view of a parameter is arena memory of the step that made it, though the parameter
 * outlives the step: one kept across a reset (a cached transpose of a tied weight) used to pass
 * every check, the owner's, and be read where later tensors had written. */
static void test_stale_param_views(void)
{
    nn_ctx *g, *h;
    CHECK_OK(NULL, nn_ctx_new(&g));
    CHECK_OK(NULL, nn_ctx_new(&h));
    nn_params *p;
    CHECK_OK(NULL, nn_params_new(&p, NULL));
    nn_tensor *w = nn_params_declare(p, "w", 2, s23, (nn_init){NN_INIT_ONES, 0.0f});
    nn_tensor *s = nn_params_declare(p, "s", 1, (int64_t[]){1}, (nn_init){NN_INIT_ONES, 0.0f});
    CHECK(w != NULL && s != NULL);
    CHECK_OK(NULL, nn_params_bind(p));
    CHECK_OK(NULL, nn_params_init(p, 1));
    float v[6] = {1, 2, 3, 4, 5, 6}, back[6];
    /* As in test_stale_foreign_leaves, pad takes the arena's start, so that the tensors made
     * after the reset overwrite it and leave the views' stamps intact. */
    nn_tensor *pad = nn_tensor_from(g, v, 2, s23);
    nn_tensor *wt = nn_transpose(g, w, 0, 1), *flat = nn_reshape(g, w, 1, (int64_t[]){6});
    nn_tensor *s0 = nn_reshape(g, s, 0, NULL);
    CHECK(pad != NULL && wt != NULL && flat != NULL && s0 != NULL);
    CHECK(nn_linear(g, nn_tensor_from(g, v, 2, s23), wt, NULL, NN_LAYOUT_IN_OUT) != NULL);
    CHECK(nn_item(s0) == 1.0f);
    CHECK_NULL_ERR(nn_linear(h, nn_tensor_from(h, v, 2, s23), wt, NULL, NN_LAYOUT_IN_OUT),
                   "nn_linear: input 1 belongs to another nn_ctx");
    nn_ctx_reset(g);
    nn_tensor *x = nn_tensor_from(g, v, 2, s23); /* where pad was */
    CHECK_NULL_ERR(nn_linear(g, x, wt, NULL, NN_LAYOUT_IN_OUT),
                   "nn_linear: input 1 is from before nn_ctx_reset (stale)");
    CHECK_NULL_ERR(nn_add(g, nn_reshape(g, x, 1, (int64_t[]){6}), flat),
                   "nn_add: input 1 is from before nn_ctx_reset (stale)");
    CHECK(isnan(nn_item(s0)));
    CHECK(strcmp(accel_last_error(NULL), "nn_item: the tensor is from before nn_ctx_reset "
                                         "(stale: its memory is reused)") == 0);
    CHECK_ERR(NULL, nn_tensor_to_host(flat, back), ACCEL_ESTATE,
              "nn_tensor_to_host: the tensor is from before nn_ctx_reset (stale: its memory is "
              "reused)");
    /* A view made in this step is good, the parameter itself in any step. */
    CHECK(nn_linear(g, x, nn_transpose(g, w, 0, 1), NULL, NN_LAYOUT_IN_OUT) != NULL);
    CHECK(nn_item(nn_reshape(g, s, 0, NULL)) == 1.0f);
    CHECK_OK(NULL, nn_tensor_to_host(w, back));
    nn_params_free(p);
    nn_ctx_free(h);
    nn_ctx_free(g);
}

/* Shapes an op accepted but answered wrongly, and configs that trained on silently. */
static void test_bad_shapes_and_configs(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    /* Two rows of zero classes: no target is valid, the loss was NaN without an error. */
    CHECK_NULL_ERR(
        nn_cross_entropy(g, nn_tensor_new(g, 2, (int64_t[]){2, 0}), (int32_t[]){0, 0}, NULL),
        "nn_cross_entropy: logits [2, 0] have no classes");
    /* Messages that named the wrong culprit: a dim out of range read as a size mismatch, a
     * NULL array as a count. */
    float v[6] = {1, 2, 3, 4, 5, 6};
    nn_tensor *x = nn_tensor_from(g, v, 2, s23), *outs[2];
    CHECK_ERR(NULL, nn_split(g, x, 4, 2, (int64_t[]){1, 2}, outs), ACCEL_EINVAL,
              "nn_split: dim 4 out of range for 2-D input");
    CHECK_ERR(NULL, nn_split(g, x, 1, 2, (int64_t[]){4, -1}, outs), ACCEL_EINVAL,
              "nn_split: size 4 of part 0 is negative or past dim 1's 3");
    CHECK_ERR(NULL, nn_split(g, x, 1, 2, (int64_t[]){INT64_MAX, INT64_MAX}, outs), ACCEL_EINVAL,
              "nn_split: size 9223372036854775807 of part 0 is negative or past dim 1's 3");
    CHECK_OK(NULL, nn_split(g, x, 1, 2, (int64_t[]){1, 2}, outs));
    CHECK(outs[1]->shape[1] == 2);
    CHECK_NULL_ERR(nn_concat(g, NULL, 2, 0), "nn_concat: xs is NULL");
    nn_ctx_free(g);

    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = 1;
    cfg.n_head = 2;
    cfg.n_embd = 8;
    cfg.block_size = 4;
    cfg.vocab_size = 11;
    nn_gpt *m = NULL;
    nn_params *p = NULL;
    nn_gpt_config bad = cfg;
    bad.act = (nn_activation)9; /* ran as tanh */
    CHECK_ERR(NULL, nn_gpt_build(&m, &p, &bad, 1), ACCEL_EINVAL,
              "nn_gpt_declare: invalid config (ln_eps 1e-05 must be finite and >= 0, act 9 "
              "must be an nn_activation)");
    bad = cfg;
    bad.ln_eps = -1.0f; /* NaN for flat rows */
    CHECK(nn_gpt_build(&m, &p, &bad, 1) == ACCEL_EINVAL && m == NULL && p == NULL);
    nn_params *q;
    CHECK_OK(NULL, nn_params_new(&q, NULL));
    nn_mlp_layer mlp;
    CHECK_ERR(NULL,
              nn_mlp_declare(&mlp, q, "m", 2, 4, 2, (nn_activation)9, NN_LAYOUT_OUT_IN, NULL, NULL),
              ACCEL_EINVAL, "nn_mlp_declare: act is not an nn_activation");
    nn_block_layer blk;
    CHECK(nn_block_declare(&blk, q, "b", NULL) == ACCEL_EINVAL);
    bad = cfg;
    bad.n_head = 0;
    CHECK(nn_block_declare(&blk, q, "b", &bad) == ACCEL_EINVAL);
    nn_params_free(q);
}

int main(void)
{
    test_overflowing_shapes();
    test_null_handles();
    test_stale_foreign_unbound();
    test_stale_foreign_leaves();
    test_stale_param_views();
    test_bad_shapes_and_configs();
    return 0;
}
