/*
 * Layers and the GPT-2 builder. Declaration order and names are Hugging Face GPT-2's
 * state_dict (transformer.wte.weight, transformer.h.0.attn.c_attn.weight [in, out], ...), so
 * the flat buffer that the training module builds from these declarations saves as a
 * checkpoint the transformers GPT-2 classes load, and the order matches DDP's bucket order.
 */
#include <stdio.h>

#include "nn_internal.h"

#define NN_NAME_NBYTES 256

static const char *join(char *buf, const char *prefix, const char *leaf)
{
    if (prefix == NULL || prefix[0] == '\0') {
        snprintf(buf, NN_NAME_NBYTES, "%s", leaf);
    } else {
        snprintf(buf, NN_NAME_NBYTES, "%s.%s", prefix, leaf);
    }
    return buf;
}

static accel_status declared(const nn_tensor *t)
{
    return t != NULL ? ACCEL_OK : accel_last_status(NULL);
}

/* ---- linear ---- */

static accel_status linear_declare_init(nn_linear_layer *l, nn_params *p, const char *prefix,
                                        int64_t in, int64_t out, int bias, nn_layout layout,
                                        nn_init w_init, nn_init b_init)
{
    char name[NN_NAME_NBYTES];
    if (l == NULL || in <= 0 || out <= 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_linear_declare(%s): bad layer or sizes",
                             prefix ? prefix : "");
    }
    memset(l, 0, sizeof(*l));
    int64_t wshape[2] = {layout == NN_LAYOUT_IN_OUT ? in : out,
                         layout == NN_LAYOUT_IN_OUT ? out : in};
    l->weight = nn_params_declare(p, join(name, prefix, "weight"), 2, wshape, w_init);
    ACCEL_TRY(declared(l->weight));
    if (bias) {
        l->bias = nn_params_declare(p, join(name, prefix, "bias"), 1, &out, b_init);
        ACCEL_TRY(declared(l->bias));
    }
    l->in_features = in;
    l->out_features = out;
    l->layout = layout;
    return ACCEL_OK;
}

accel_status nn_linear_declare(nn_linear_layer *l, nn_params *p, const char *prefix, int64_t in,
                               int64_t out, int bias, nn_layout layout)
{
    /* torch.nn.Linear's default: kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(in)) for both. */
    nn_init u = {NN_INIT_UNIFORM, in > 0 ? 1.0f / sqrtf((float)in) : 0.0f};
    return linear_declare_init(l, p, prefix, in, out, bias, layout, u, u);
}

nn_tensor *nn_linear_forward(nn_ctx *g, const nn_linear_layer *l, nn_tensor *x)
{
    if (l == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_linear_forward: layer is NULL");
    }
    return nn_linear(g, x, l->weight, l->bias, l->layout);
}

/* ---- embedding / layernorm ---- */

static accel_status embedding_declare_init(nn_embedding_layer *l, nn_params *p, const char *prefix,
                                           int64_t num, int64_t dim, nn_init init)
{
    char name[NN_NAME_NBYTES];
    int64_t shape[2] = {num, dim};
    memset(l, 0, sizeof(*l));
    l->weight = nn_params_declare(p, join(name, prefix, "weight"), 2, shape, init);
    ACCEL_TRY(declared(l->weight));
    l->num = num;
    l->dim = dim;
    return ACCEL_OK;
}

accel_status nn_embedding_declare(nn_embedding_layer *l, nn_params *p, const char *prefix,
                                  int64_t num, int64_t dim)
{
    return embedding_declare_init(l, p, prefix, num, dim, (nn_init){NN_INIT_NORMAL, 1.0f});
}

nn_tensor *nn_embedding_forward(nn_ctx *g, const nn_embedding_layer *l, const int32_t *ids,
                                int ndim, const int64_t *shape)
{
    if (l == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_embedding_forward: layer is NULL");
    }
    return nn_embedding(g, l->weight, ids, ndim, shape);
}

accel_status nn_layernorm_declare(nn_layernorm_layer *l, nn_params *p, const char *prefix,
                                  int64_t dim, float eps)
{
    char name[NN_NAME_NBYTES];
    memset(l, 0, sizeof(*l));
    l->weight =
        nn_params_declare(p, join(name, prefix, "weight"), 1, &dim, (nn_init){NN_INIT_ONES, 0.0f});
    ACCEL_TRY(declared(l->weight));
    l->bias =
        nn_params_declare(p, join(name, prefix, "bias"), 1, &dim, (nn_init){NN_INIT_ZEROS, 0.0f});
    ACCEL_TRY(declared(l->bias));
    l->eps = eps;
    return ACCEL_OK;
}

nn_tensor *nn_layernorm_forward(nn_ctx *g, const nn_layernorm_layer *l, nn_tensor *x)
{
    if (l == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_layernorm_forward: layer is NULL");
    }
    return nn_layernorm(g, x, l->weight, l->bias, l->eps);
}

/* ---- MLP ---- */

static nn_tensor *activate(nn_ctx *g, nn_activation act, nn_tensor *x)
{
    switch (act) {
    case NN_ACT_GELU:
        return nn_gelu(g, x, 0);
    case NN_ACT_GELU_TANH:
        return nn_gelu(g, x, 1);
    case NN_ACT_RELU:
        return nn_relu(g, x);
    default:
        return nn_tanh(g, x);
    }
}

accel_status nn_mlp_declare(nn_mlp_layer *l, nn_params *p, const char *prefix, int64_t in,
                            int64_t hidden, int64_t out, nn_activation act, nn_layout layout,
                            const char *fc_name, const char *proj_name)
{
    char name[NN_NAME_NBYTES];
    if (l == NULL || (unsigned)act > NN_ACT_TANH) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_mlp_declare: %s",
                             l == NULL ? "layer is NULL" : "act is not an nn_activation");
    }
    memset(l, 0, sizeof(*l));
    ACCEL_TRY(nn_linear_declare(&l->fc, p, join(name, prefix, fc_name ? fc_name : "c_fc"), in,
                                hidden, 1, layout));
    ACCEL_TRY(nn_linear_declare(&l->proj, p, join(name, prefix, proj_name ? proj_name : "c_proj"),
                                hidden, out, 1, layout));
    l->act = act;
    return ACCEL_OK;
}

nn_tensor *nn_mlp_forward(nn_ctx *g, const nn_mlp_layer *l, nn_tensor *x)
{
    if (l == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_mlp_forward: layer is NULL");
    }
    if ((l->act == NN_ACT_GELU || l->act == NN_ACT_GELU_TANH) && l->fc.layout == l->proj.layout) {
        /* One op: on a GPU cuBLASLt fuses GELU into the products (the same bits on the CPU). */
        nn_tensor *y =
            nn_linear_gelu_linear(g, x, l->fc.weight, l->fc.bias, l->proj.weight, l->proj.bias,
                                  l->fc.layout, l->act == NN_ACT_GELU_TANH);
        return nn_dropout(g, y, l->dropout);
    }
    nn_tensor *h = activate(g, l->act, nn_linear_forward(g, &l->fc, x));
    return nn_dropout(g, nn_linear_forward(g, &l->proj, h), l->dropout);
}

/* ---- GPT-2 block and model ---- */

nn_gpt_config nn_gpt_config_default(void)
{
    nn_gpt_config c;
    memset(&c, 0, sizeof(c));
    c.size = (uint32_t)sizeof(c);
    c.version = NN_GPT_CONFIG_VERSION;
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.block_size = 1024;
    c.vocab_size = 50257;
    c.tied = 1;
    c.act = NN_ACT_GELU_TANH;
    c.dropout = 0.1f;
    c.ln_eps = 1e-5f;
    return c;
}

accel_status nn_block_declare(nn_block_layer *l, nn_params *p, const char *prefix,
                              const nn_gpt_config *cfg)
{
    char name[NN_NAME_NBYTES];
    if (l == NULL || p == NULL || cfg == NULL || cfg->n_head <= 0 || cfg->n_embd <= 0 ||
        cfg->n_embd % cfg->n_head != 0 || cfg->n_layer <= 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_block_declare: need a layer, a set and a config with n_layer > 0 "
                             "and n_embd a positive multiple of n_head");
    }
    int64_t C = cfg->n_embd;
    nn_init w = {NN_INIT_NORMAL, 0.02f}, zero = {NN_INIT_ZEROS, 0.0f};
    /* GPT-2 scales the init of the projections that write into the residual stream. */
    nn_init wres = {NN_INIT_NORMAL, 0.02f / sqrtf(2.0f * (float)cfg->n_layer)};
    memset(l, 0, sizeof(*l));
    ACCEL_TRY(nn_layernorm_declare(&l->ln_1, p, join(name, prefix, "ln_1"), C, cfg->ln_eps));
    ACCEL_TRY(linear_declare_init(&l->c_attn, p, join(name, prefix, "attn.c_attn"), C, 3 * C, 1,
                                  NN_LAYOUT_IN_OUT, w, zero));
    ACCEL_TRY(linear_declare_init(&l->c_proj, p, join(name, prefix, "attn.c_proj"), C, C, 1,
                                  NN_LAYOUT_IN_OUT, wres, zero));
    ACCEL_TRY(nn_layernorm_declare(&l->ln_2, p, join(name, prefix, "ln_2"), C, cfg->ln_eps));
    ACCEL_TRY(linear_declare_init(&l->mlp.fc, p, join(name, prefix, "mlp.c_fc"), C, 4 * C, 1,
                                  NN_LAYOUT_IN_OUT, w, zero));
    ACCEL_TRY(linear_declare_init(&l->mlp.proj, p, join(name, prefix, "mlp.c_proj"), 4 * C, C, 1,
                                  NN_LAYOUT_IN_OUT, wres, zero));
    l->mlp.act = cfg->act;
    l->mlp.dropout = cfg->dropout;
    l->n_head = cfg->n_head;
    l->dropout = cfg->dropout;
    return ACCEL_OK;
}

/* LayerNorm l of x, or of x + r when r is not NULL (then *x becomes the sum): a residual add
 * and the LayerNorm after it as one op (nn_add_layernorm, one pass on a GPU). products: only
 * products read the output (a block's ln_1, ln_2), which on a GPU under autocast then holds
 * only their 2-byte operand (accel__nn_norm_operand). */
static nn_tensor *norm_after(nn_ctx *g, const nn_layernorm_layer *l, nn_tensor **x, nn_tensor *r,
                             int products)
{
    if (products) {
        return accel__nn_norm_operand(g, *x, r, l->weight, l->bias, l->eps, x);
    }
    if (r == NULL) {
        return nn_layernorm_forward(g, l, *x);
    }
    return nn_add_layernorm(g, *x, r, l->weight, l->bias, l->eps, x);
}

/* The newest tape node whose output is x, or NULL. */
static nn_node *made_by(nn_ctx *g, const nn_tensor *x)
{
    nn_node *n = g->tape;
    while (n != NULL && n->out != x) {
        n = n->prev;
    }
    return n;
}

/* A block of input x + r (r: the previous block's branch not added yet, or NULL) whose own
 * last residual add is left to the next LayerNorm: returns the residual stream before it and
 * *branch (the MLP's output) to add; NULL (and *branch NULL) on failure. */
static nn_tensor *block_open(nn_ctx *g, const nn_block_layer *l, nn_tensor *x, nn_tensor *r,
                             nn_tensor **branch, nn_node **start)
{
    *branch = NULL;
    nn_tensor *h = norm_after(g, &l->ln_1, &x, r, 1);
    *start = made_by(g, x);
    /* qkv is read only by the attention (on a GPU under autocast maybe only rounded). */
    const nn_linear_layer *ca = &l->c_attn;
    h = accel__nn_linear_qkv(g, h, ca->weight, ca->bias, ca->layout, l->n_head, l->dropout);
    h = nn_causal_attention(g, h, l->n_head, l->dropout);
    h = nn_dropout(g, nn_linear_forward(g, &l->c_proj, h), l->dropout);
    if (h == NULL) {
        return NULL;
    }
    *branch = nn_mlp_forward(g, &l->mlp, norm_after(g, &l->ln_2, &x, h, 1));
    return *branch != NULL ? x : NULL;
}

nn_tensor *nn_block_forward(nn_ctx *g, const nn_block_layer *l, nn_tensor *x)
{
    if (l == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_block_forward: layer is NULL");
    }
    nn_tensor *m;
    nn_node *start;
    x = block_open(g, l, x, NULL, &m, &start);
    return x != NULL ? nn_add(g, x, m) : NULL;
}

struct nn_gpt {
    nn_gpt_config cfg;
    nn_embedding_layer wte, wpe;
    nn_block_layer *h;
    nn_layernorm_layer ln_f;
    nn_tensor *lm_head; /* wte.weight when tied */
    int32_t *pos;       /* 0..block_size-1 for the position embedding */
    int recompute;      /* blocks under nn_checkpoint */
};

int nn_gpt_set_recompute(nn_gpt *m, int enabled)
{
    if (m == NULL) {
        return 0;
    }
    int prev = m->recompute;
    m->recompute = enabled != 0;
    return prev;
}

/* A block as a checkpointed segment (its layer struct is the segment's context). */
static nn_tensor *block_segment(nn_ctx *g, void *layer, nn_tensor *x)
{
    return nn_block_forward(g, layer, x);
}

accel_status nn_gpt_declare(nn_gpt **out, nn_params *p, const nn_gpt_config *config)
{
    if (out == NULL || p == NULL || config == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_gpt_declare: out, params and cfg needed");
    }
    nn_gpt_config c = nn_gpt_config_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(NULL, "nn_gpt_declare", nn_gpt_config, &c, config, ln_eps));
    const nn_gpt_config *cfg = &c;
    if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 ||
        cfg->n_embd % cfg->n_head != 0 || cfg->block_size <= 0 || cfg->vocab_size <= 0 ||
        !(cfg->dropout >= 0.0f && cfg->dropout < 1.0f)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_gpt_declare: invalid config (n_layer %d, n_head %d, n_embd %d, "
                             "block_size %d, vocab_size %d, dropout %g; n_embd must divide by "
                             "n_head; use nn_gpt_config_default)",
                             cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->block_size,
                             cfg->vocab_size, (double)cfg->dropout);
    }
    /* A negative epsilon makes LayerNorm's 1/sqrt(var + eps) NaN for flat rows, and an unknown
     * activation would silently run as tanh: refuse both here rather than train on them. */
    if (!(cfg->ln_eps >= 0.0f && cfg->ln_eps < INFINITY) || (unsigned)cfg->act > NN_ACT_TANH) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_gpt_declare: invalid config (ln_eps %g must be finite and >= 0, "
                             "act %d must be an nn_activation)",
                             (double)cfg->ln_eps, (int)cfg->act);
    }
    nn_gpt *m = accel__calloc(1, sizeof(*m));
    accel_status st = ACCEL_ENOMEM;
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nn_gpt_declare: out of memory");
    }
    m->cfg = *cfg;
    m->h = accel__calloc((size_t)cfg->n_layer, sizeof(*m->h));
    m->pos = accel__malloc((size_t)cfg->block_size * sizeof(int32_t));
    if (m->h == NULL || m->pos == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "nn_gpt_declare: out of memory");
        goto fail;
    }
    for (int t = 0; t < cfg->block_size; t++) {
        m->pos[t] = t;
    }
    nn_init w = {NN_INIT_NORMAL, 0.02f};
    ACCEL_TRY_GOTO(
        embedding_declare_init(&m->wte, p, "transformer.wte", cfg->vocab_size, cfg->n_embd, w), st,
        fail);
    ACCEL_TRY_GOTO(
        embedding_declare_init(&m->wpe, p, "transformer.wpe", cfg->block_size, cfg->n_embd, w), st,
        fail);
    for (int i = 0; i < cfg->n_layer; i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "transformer.h.%d", i);
        ACCEL_TRY_GOTO(nn_block_declare(&m->h[i], p, prefix, cfg), st, fail);
    }
    ACCEL_TRY_GOTO(nn_layernorm_declare(&m->ln_f, p, "transformer.ln_f", cfg->n_embd, cfg->ln_eps),
                   st, fail);
    if (cfg->tied) {
        m->lm_head = m->wte.weight;
    } else {
        int64_t shape[2] = {cfg->vocab_size, cfg->n_embd};
        m->lm_head = nn_params_declare(p, "lm_head.weight", 2, shape, w);
        ACCEL_TRY_GOTO(declared(m->lm_head), st, fail);
    }
    *out = m;
    return ACCEL_OK;
fail:
    nn_gpt_free(m);
    return st;
}

void nn_gpt_free(nn_gpt *m)
{
    if (m == NULL) {
        return;
    }
    accel__free(m->h);
    accel__free(m->pos);
    accel__free(m);
}

const nn_gpt_config *nn_gpt_get_config(const nn_gpt *m)
{
    return m ? &m->cfg : NULL;
}

accel_status nn_gpt_build(nn_gpt **out, nn_params **params_out, const nn_gpt_config *cfg,
                          uint64_t seed)
{
    if (out == NULL || params_out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_gpt_build: out and params_out needed");
    }
    nn_params *p = NULL;
    nn_gpt *m = NULL;
    accel_status st;
    ACCEL_TRY(nn_params_new(&p, NULL));
    ACCEL_TRY_GOTO(nn_gpt_declare(&m, p, cfg), st, fail);
    ACCEL_TRY_GOTO(nn_params_bind(p), st, fail);
    ACCEL_TRY_GOTO(nn_params_init(p, seed), st, fail);
    *out = m;
    *params_out = p;
    return ACCEL_OK;
fail:
    nn_gpt_free(m);
    nn_params_free(p);
    return st;
}

static accel_status gpt_forward_ops(nn_ctx *g, const nn_gpt *m, const int32_t *ids,
                                    const int32_t *targets, int64_t B, int64_t T,
                                    nn_tensor **logits_out, nn_tensor **loss_out);

accel_status nn_gpt_forward(nn_ctx *g, const nn_gpt *m, const int32_t *ids, const int32_t *targets,
                            int64_t B, int64_t T, nn_tensor **logits_out, nn_tensor **loss_out)
{
    if (g == NULL || m == NULL || ids == NULL || B <= 0 || T <= 0 || T > m->cfg.block_size ||
        (targets != NULL && loss_out == NULL)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_gpt_forward: need ctx, model, ids, 0 < T (%lld) <= block_size "
                             "and loss_out with targets",
                             (long long)T);
    }
    /* One flush-denormal scope for the whole forward (the ops inside only count it). */
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    accel_status st = gpt_forward_ops(g, m, ids, targets, B, T, logits_out, loss_out);
    accel__nn_fp_leave(g, &fs);
    return st;
}

static accel_status gpt_forward_ops(nn_ctx *g, const nn_gpt *m, const int32_t *ids,
                                    const int32_t *targets, int64_t B, int64_t T,
                                    nn_tensor **logits_out, nn_tensor **loss_out)
{
    const nn_gpt_config *c = &m->cfg;
    int64_t bt[2] = {B, T};
    nn_tensor *x = nn_add(g, nn_embedding_forward(g, &m->wte, ids, 2, bt),
                          nn_embedding_forward(g, &m->wpe, m->pos, 1, &T));
    x = nn_dropout(g, x, c->dropout);
    /* Without recomputation a block's last residual add goes into the next LayerNorm (r: the
     * branch still to add). Its nodes after the add that made its input, through that last
     * add, are a segment whose backward gives back what it allocates (its intermediate
     * gradients: only the residual stream's leaves the block, into its input's); a
     * checkpointed block is a segment that ends with its add. */
    nn_tensor *r = NULL;
    nn_node *start = NULL; /* the node that made the block's input */
    for (int i = 0; i <= c->n_layer; i++) {
        nn_node *next = NULL;
        if (i < c->n_layer) {
            x = m->recompute ? nn_checkpoint(g, block_segment, (void *)&m->h[i], x)
                             : block_open(g, &m->h[i], x, r, &r, &next);
        } else {
            /* Only the head's product reads ln_f's output (nn_linear_cross_entropy, or
             * nn_linear for the logits). */
            nn_tensor *sum = x;
            x = norm_after(g, &m->ln_f, &sum, r, 1);
            next = r != NULL && x != NULL ? made_by(g, sum) : NULL;
        }
        if (x == NULL) {
            return accel_last_status(NULL);
        }
        if (i > 0 && start != NULL && next != NULL && g->grad_enabled &&
            !accel__nn_rewind_segment(g, next, start)) {
            return accel_last_status(NULL);
        }
        start = next;
    }
    if (logits_out == NULL && targets != NULL) {
        /* Training: the head and the loss in chunks, without the [B, T, V] logits. */
        nn_tensor *loss =
            nn_linear_cross_entropy(g, x, m->lm_head, targets, NN_LAYOUT_OUT_IN, NULL);
        if (loss == NULL) {
            return accel_last_status(NULL);
        }
        *loss_out = loss;
        return ACCEL_OK;
    }
    nn_tensor *logits = nn_linear(g, x, m->lm_head, NULL, NN_LAYOUT_OUT_IN);
    if (logits == NULL) {
        return accel_last_status(NULL);
    }
    if (logits_out != NULL) {
        *logits_out = logits;
    }
    if (targets != NULL) {
        nn_tensor *loss = nn_cross_entropy(g, logits, targets, NULL);
        if (loss == NULL) {
            return accel_last_status(NULL);
        }
        *loss_out = loss;
    }
    return ACCEL_OK;
}

double nn_gpt_train_flops(const nn_gpt_config *c, int64_t B, int64_t T)
{
    if (c == NULL) {
        return 0.0;
    }
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    double matmul_params = L * 12.0 * C * C + V * C;
    double per_token = 6.0 * matmul_params + 12.0 * L * (double)T * C;
    return per_token * (double)B * (double)T;
}
