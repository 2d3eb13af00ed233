/*
 * nn: the GPT-2 builder. Parameter names, order and shapes are Hugging Face GPT-2's (tied and
 * untied head); init follows GPT-2 (N(0, 0.02), residual projections scaled by
 * 1/sqrt(2 n_layer), LayerNorm ones/zeros, zero biases) and is reproducible from the seed;
 * every parameter is reported ready exactly once per backward; the loss at init is about
 * ln(vocab) and falls over 20 Adam steps on a fixed batch; the arena stops growing.
 */
#include <string.h>

#include "accel/nn.h"
#include "check.h"
#include "small_gpt.h"

static nn_gpt_config small_config(int tied)
{
    nn_gpt_config c = small_gpt_config(2, 4, 32, 16, 64, tied);
    c.act = NN_ACT_GELU;
    return c;
}

static void check_names(int tied)
{
    nn_gpt_config c = small_config(tied);
    nn_gpt *m;
    nn_params *p;
    CHECK_OK(NULL, nn_gpt_build(&m, &p, &c, 1));
    int64_t C = c.n_embd, V = c.vocab_size;
    struct {
        const char *name;
        int ndim;
        int64_t s0, s1;
    } want[64];
    int n = 0;
#define WANT(nm, nd, a, b) want[n].name = nm, want[n].ndim = nd, want[n].s0 = a, want[n++].s1 = b
    static char names[2][12][64];
    WANT("transformer.wte.weight", 2, V, C);
    WANT("transformer.wpe.weight", 2, c.block_size, C);
    const char *leaf[12] = {"ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
                            "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                            "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
                            "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    int64_t shp[12][3] = {{1, C, 0},     {1, C, 0},     {2, C, 3 * C}, {1, 3 * C, 0},
                          {2, C, C},     {1, C, 0},     {1, C, 0},     {1, C, 0},
                          {2, C, 4 * C}, {1, 4 * C, 0}, {2, 4 * C, C}, {1, C, 0}};
    for (int i = 0; i < c.n_layer; i++) {
        for (int k = 0; k < 12; k++) {
            snprintf(names[i][k], sizeof(names[i][k]), "transformer.h.%d.%s", i, leaf[k]);
            WANT(names[i][k], (int)shp[k][0], shp[k][1], shp[k][2]);
        }
    }
    WANT("transformer.ln_f.weight", 1, C, 0);
    WANT("transformer.ln_f.bias", 1, C, 0);
    if (!tied) {
        WANT("lm_head.weight", 2, V, C);
    }
    CHECK_MSG(nn_params_count(p) == n, "%d params, want %d", nn_params_count(p), n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        nn_tensor *t = nn_params_get(p, i);
        CHECK_MSG(strcmp(nn_params_name(p, i), want[i].name) == 0, "param %d is %s, want %s", i,
                  nn_params_name(p, i), want[i].name);
        CHECK_MSG(t->ndim == want[i].ndim && t->shape[0] == want[i].s0 &&
                      (t->ndim == 1 || t->shape[1] == want[i].s1),
                  "%s has the wrong shape", want[i].name);
        total += nn_numel(t);
    }
    CHECK(nn_params_numel(p) == total);

    /* Init statistics. */
    nn_tensor *wte = nn_params_find(p, "transformer.wte.weight");
    nn_tensor *proj = nn_params_find(p, "transformer.h.1.mlp.c_proj.weight");
    double s = 0, s2 = 0, q2 = 0;
    for (int64_t i = 0; i < nn_numel(wte); i++) {
        s += wte->data[i];
        s2 += (double)wte->data[i] * wte->data[i];
    }
    double sd = sqrt(s2 / (double)nn_numel(wte));
    CHECK_MSG(fabs(sd - 0.02) < 0.002 && fabs(s / (double)nn_numel(wte)) < 0.002, "wte sd %g", sd);
    for (int64_t i = 0; i < nn_numel(proj); i++) {
        q2 += (double)proj->data[i] * proj->data[i];
    }
    double want_sd = 0.02 / sqrt(2.0 * c.n_layer);
    CHECK_MSG(fabs(sqrt(q2 / (double)nn_numel(proj)) - want_sd) < 0.1 * want_sd, "c_proj sd %g",
              sqrt(q2 / (double)nn_numel(proj)));
    nn_tensor *lnw = nn_params_find(p, "transformer.h.0.ln_1.weight");
    nn_tensor *fcb = nn_params_find(p, "transformer.h.0.mlp.c_fc.bias");
    for (int64_t i = 0; i < C; i++) {
        CHECK(lnw->data[i] == 1.0f && fcb->data[i] == 0.0f);
    }
    /* The same seed gives the same weights. */
    nn_gpt *m2;
    nn_params *p2;
    CHECK_OK(NULL, nn_gpt_build(&m2, &p2, &c, 1));
    int64_t cnt;
    float *f1 = nn_params_flat_data(p, &cnt), *f2 = nn_params_flat_data(p2, NULL);
    CHECK(memcmp(f1, f2, (size_t)cnt * sizeof(float)) == 0);
    nn_gpt_free(m2);
    nn_params_free(p2);
    nn_gpt_free(m);
    nn_params_free(p);
}

typedef struct counter {
    int seen[128];
    int n;
} counter;

static accel_status count_ready(void *ctx, const nn_tensor *param)
{
    counter *c = ctx;
    int index = param->param_index;
    CHECK(index >= 0 && index < 128);
    c->seen[index]++;
    c->n++;
    return ACCEL_OK;
}

static void train(int tied, float dropout)
{
    nn_gpt_config c = small_config(tied);
    c.dropout = dropout;
    nn_gpt *m;
    nn_params *p;
    CHECK_OK(NULL, nn_gpt_build(&m, &p, &c, 7));
    enum { B = 4, T = 16 };
    int32_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)((i * 7 + 3) % c.vocab_size);
        tg[i] = (int32_t)((i * 5 + 1) % c.vocab_size);
    }
    tg[3] = -100;
    int64_t n;
    float *w = nn_params_flat_data(p, &n), *gr = nn_params_flat_grad(p, NULL);
    float *mom = calloc((size_t)n, sizeof(float)), *var = calloc((size_t)n, sizeof(float));
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    float first = 0, last = 0;
    nn_ctx_stats after2 = {0};
    for (int step = 1; step <= 20; step++) {
        nn_tensor *loss = NULL, *logits = NULL;
        CHECK_OK(NULL, nn_gpt_forward(g, m, ids, tg, B, T, &logits, &loss));
        CHECK(logits->ndim == 3 && logits->shape[2] == c.vocab_size);
        counter cnt;
        memset(&cnt, 0, sizeof(cnt));
        nn_backward_hooks hooks = {&cnt, count_ready};
        nn_params_zero_grad(p);
        CHECK_OK(NULL, nn_backward(loss, 1.0f, &hooks));
        CHECK_MSG(cnt.n == nn_params_count(p), "%d hooks for %d params", cnt.n, nn_params_count(p));
        for (int i = 0; i < nn_params_count(p); i++) {
            CHECK(cnt.seen[i] == 1);
        }
        float l = nn_item(loss);
        CHECK(isfinite(l));
        if (step == 1) {
            first = l;
            CHECK_MSG(fabsf(l - logf((float)c.vocab_size)) < 0.3f, "init loss %g", l);
        }
        last = l;
        if (step == 2) {
            after2 = nn_ctx_get_stats(g);
        }
        /* Adam, lr 1e-2 (bias-corrected). */
        float b1 = 0.9f, b2 = 0.999f, lr = 1e-2f;
        float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
        for (int64_t i = 0; i < n; i++) {
            mom[i] = b1 * mom[i] + (1 - b1) * gr[i];
            var[i] = b2 * var[i] + (1 - b2) * gr[i] * gr[i];
            w[i] -= lr * (mom[i] / c1) / (sqrtf(var[i] / c2) + 1e-8f);
        }
    }
    nn_ctx_stats end = nn_ctx_get_stats(g);
    CHECK(end.n_grows == after2.n_grows && end.reserved_nbytes == after2.reserved_nbytes);
    printf("  tied=%d dropout=%.1f: loss %.4f -> %.4f\n", tied, (double)dropout, (double)first,
           (double)last);
    CHECK_MSG(last < 0.5f * first, "loss did not fall: %g -> %g", first, last);
    /* Context shorter than block_size works; longer is rejected. */
    nn_tensor *logits = NULL;
    CHECK_OK(NULL, nn_gpt_forward(g, m, ids, NULL, 2, 5, &logits, NULL));
    CHECK(logits->shape[1] == 5);
    CHECK(nn_gpt_forward(g, m, ids, NULL, 1, c.block_size + 1, &logits, NULL) == ACCEL_EINVAL);
    nn_ctx_free(g);
    free(mom);
    free(var);
    nn_gpt_free(m);
    nn_params_free(p);
}

int main(void)
{
    check_names(1);
    check_names(0);
    train(1, 0.0f);
    train(0, 0.0f);
    train(0, 0.1f);
    nn_gpt_config bad = small_config(1);
    bad.n_head = 5;
    nn_gpt *m;
    nn_params *p;
    CHECK(nn_gpt_build(&m, &p, &bad, 1) == ACCEL_EINVAL);
    printf("test_nn_gpt: ok\n");
    return 0;
}
