/*
 * nn: activation recomputation (nn_checkpoint, nn_gpt_set_recompute). The small GPT trained a
 * few steps with and without recomputation, with dropout 0 and 0.1 and under bf16 autocast,
 * gives bit-identical losses and gradients and reports its parameters to grad_ready in the
 * same order; the step's peak arena bytes drop by at least what the model's shape says the
 * blocks' activations take; the arena stops growing. Through accel (bf16 mixed precision,
 * accel_backward, AdamW) the losses are the same. A segment reading a tensor from outside,
 * nested segments, the no-grad path and the misuse errors.
 */
#include <string.h>

#include "accel/nn.h"
#include "check.h"
#include "small_gpt.h"

enum { STEPS = 3, B = 4, MAX_READY = 256 };

/* src/nn/recompute.c's test hook: GPT blocks' backward rewinds (1) or keeps all (0). */
void accel__nn_set_rewind(int on);

typedef struct ready_log {
    int order[MAX_READY];
    int n;
} ready_log;

static accel_status log_ready(void *ctx, const nn_tensor *param)
{
    ready_log *r = ctx;
    CHECK(r->n < MAX_READY);
    r->order[r->n++] = param->param_index;
    return ACCEL_OK;
}

typedef struct run {
    nn_gpt *m;
    nn_params *p;
    nn_ctx *g;
    float loss[STEPS];
    float *grads[STEPS]; /* every step's flat gradient */
    ready_log ready[STEPS];
    nn_ctx_stats stats[STEPS];
} run;

/* STEPS steps of cfg's GPT (plain SGD on a fixed batch, so later steps see other weights). */
static void train(run *r, const nn_gpt_config *cfg, int recompute, int autocast)
{
    memset(r, 0, sizeof(*r));
    CHECK_OK(NULL, nn_gpt_build(&r->m, &r->p, cfg, 7));
    CHECK(nn_gpt_set_recompute(r->m, recompute) == 0);
    CHECK_OK(NULL, nn_ctx_new(&r->g));
    nn_ctx_set_seed(r->g, 99);
    nn_ctx_set_autocast(r->g, autocast);
    int64_t T = cfg->block_size, count;
    int32_t ids[B * 64], tg[B * 64];
    CHECK(B * T <= 64);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 7 + 3) % cfg->vocab_size;
        tg[i] = (i * 5 + 1) % cfg->vocab_size;
    }
    for (int s = 0; s < STEPS; s++) {
        nn_params_zero_grad(r->p);
        nn_tensor *loss = NULL;
        CHECK_OK(NULL, nn_gpt_forward(r->g, r->m, ids, tg, B, T, NULL, &loss));
        nn_backward_hooks h = {&r->ready[s], log_ready};
        CHECK_OK(NULL, nn_backward(loss, 1.0f, &h));
        r->loss[s] = nn_item(loss);
        r->stats[s] = nn_ctx_get_stats(r->g);
        float *grad = nn_params_flat_grad(r->p, &count), *w = nn_params_flat_data(r->p, &count);
        r->grads[s] = malloc((size_t)count * sizeof(float));
        CHECK(r->grads[s] != NULL);
        memcpy(r->grads[s], grad, (size_t)count * sizeof(float));
        for (int64_t i = 0; i < count; i++) {
            w[i] -= 0.05f * grad[i];
        }
        nn_ctx_reset(r->g);
    }
}

static void run_free(run *r)
{
    for (int s = 0; s < STEPS; s++) {
        free(r->grads[s]);
    }
    nn_ctx_free(r->g);
    nn_gpt_free(r->m);
    nn_params_free(r->p);
}

static void compare_gpt(float dropout, int autocast)
{
    nn_gpt_config cfg = small_gpt_config(4, 4, 32, 16, 64, 1);
    cfg.dropout = dropout;
    run plain, rc, keep;
    train(&plain, &cfg, 0, autocast);
    train(&rc, &cfg, 1, autocast);
    accel__nn_set_rewind(0); /* every gradient kept to the step's end */
    train(&keep, &cfg, 0, autocast);
    accel__nn_set_rewind(1);
    int64_t count;
    nn_params_flat_grad(plain.p, &count);
    for (int s = 0; s < STEPS; s++) {
        /* A block's backward rewinding changes where gradients live, not their bits. */
        CHECK(memcmp(&plain.loss[s], &keep.loss[s], sizeof(float)) == 0);
        CHECK(memcmp(plain.grads[s], keep.grads[s], (size_t)count * sizeof(float)) == 0);
        CHECK(keep.stats[s].peak_nbytes == keep.stats[s].used_nbytes); /* nothing rewound */
        CHECK(plain.stats[s].peak_nbytes < keep.stats[s].peak_nbytes);
        CHECK_MSG(memcmp(&plain.loss[s], &rc.loss[s], sizeof(float)) == 0,
                  "dropout %g autocast %d step %d: loss %.9g plain, %.9g recomputed",
                  (double)dropout, autocast, s, (double)plain.loss[s], (double)rc.loss[s]);
        for (int64_t i = 0; i < count; i++) {
            CHECK_MSG(memcmp(&plain.grads[s][i], &rc.grads[s][i], sizeof(float)) == 0,
                      "dropout %g autocast %d step %d: gradient element %lld: %.9g plain, "
                      "%.9g recomputed",
                      (double)dropout, autocast, s, (long long)i, (double)plain.grads[s][i],
                      (double)rc.grads[s][i]);
        }
        CHECK_MSG(plain.ready[s].n == nn_params_count(plain.p) && rc.ready[s].n == plain.ready[s].n,
                  "step %d: %d / %d parameters ready, want %d", s, plain.ready[s].n, rc.ready[s].n,
                  nn_params_count(plain.p));
        CHECK(memcmp(plain.ready[s].order, rc.ready[s].order,
                     (size_t)plain.ready[s].n * sizeof(int)) == 0);
    }

    /* Peak. A plain step keeps, per block, at least its forward activations: ln_1 (C), qkv
     * (3C), attention (C), c_proj (C), the residual (C), ln_2 (C), c_fc (4C), GELU (4C),
     * mlp.c_proj (C) and the residual (C) per token, 18 C floats (dropout adds more). With
     * recomputation a block keeps its output (C) and, while one block is back-propagated,
     * that block's activations and their gradients live again (at most 2 x 18 C more, plus
     * the dropout masks' outputs). So the drop is at least (18 L - L - 2 x 20) C per token. */
    int64_t N = B * (int64_t)cfg.block_size, L = cfg.n_layer;
    double unit = (double)N * cfg.n_embd * sizeof(float);
    double want = (double)(18 * L - L - 40) * unit;
    /* That bound needs enough layers to say anything; measure on a deeper model as well. */
    for (int s = 0; s < STEPS; s++) {
        /* A plain step rewinds too: each block's backward gives back its gradients. */
        CHECK(plain.stats[s].peak_nbytes > plain.stats[s].used_nbytes);
        CHECK(rc.stats[s].peak_nbytes < plain.stats[s].peak_nbytes);
    }
    if (want > 0) {
        double got =
            (double)plain.stats[STEPS - 1].peak_nbytes - (double)rc.stats[STEPS - 1].peak_nbytes;
        CHECK_MSG(got >= want, "peak drop %.0f bytes, want >= %.0f", got, want);
    }
    /* Steady state: from step 2 on neither arena allocates. */
    CHECK(rc.stats[STEPS - 1].n_grows == rc.stats[1].n_grows);
    printf("dropout %g autocast %d: peak %zu bytes plain (%zu without the blocks' rewinds), "
           "%zu recomputed (%.1f%%)\n",
           (double)dropout, autocast, plain.stats[STEPS - 1].peak_nbytes,
           keep.stats[STEPS - 1].peak_nbytes, rc.stats[STEPS - 1].peak_nbytes,
           100.0 * (double)rc.stats[STEPS - 1].peak_nbytes /
               (double)plain.stats[STEPS - 1].peak_nbytes);
    run_free(&plain);
    run_free(&rc);
    run_free(&keep);
}

/* The drop on a deeper model, where it is large: 8 layers (the bound is then 104 C per token). */
static void check_peak_deep(void)
{
    nn_gpt_config cfg = small_gpt_config(8, 2, 16, 16, 32, 1);
    size_t peak[2];
    for (int rc = 0; rc < 2; rc++) {
        run r;
        train(&r, &cfg, rc, ACCEL_F32);
        peak[rc] = r.stats[STEPS - 1].peak_nbytes;
        run_free(&r);
    }
    double unit = (double)B * cfg.block_size * cfg.n_embd * sizeof(float);
    double want = (double)(18 * cfg.n_layer - cfg.n_layer - 40) * unit;
    CHECK_MSG((double)peak[0] - (double)peak[1] >= want,
              "8 layers: peak %zu plain, %zu recomputed: drop below %.0f bytes", peak[0], peak[1],
              want);
    printf("8 layers: peak %zu bytes plain, %zu recomputed (bound on the drop %.0f)\n", peak[0],
           peak[1], want);
}

/* Through accel: a model under bf16 mixed precision (autocast AUTO learns bf16 from the sink's
 * working copy), accel_backward reporting to the reducer, AdamW: STEPS losses. */
static void accel_losses(int recompute, float *losses)
{
    accel_options o = accel_options_default();
    o.cpu = 1;
    o.mixed_precision = ACCEL_PRECISION_BF16;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    nn_gpt_config cfg = small_gpt_config(3, 2, 16, 16, 32, 1);
    cfg.dropout = 0.1f;
    accel_model *m;
    nn_params *p;
    nn_gpt *gpt;
    small_gpt_new(acc, &cfg, 3, &m, &p, &gpt);
    nn_gpt_set_recompute(gpt, recompute);
    accel_optimizer *opt = accel_adamw(acc, m, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    nn_ctx_set_seed(g, 4);
    int32_t ids[B * 16], tg[B * 16];
    for (int i = 0; i < B * 16; i++) {
        ids[i] = (i * 11 + 2) % 32;
        tg[i] = (i * 3 + 5) % 32;
    }
    for (int s = 0; s < STEPS; s++) {
        nn_tensor *loss = NULL;
        CHECK_OK(NULL, nn_gpt_forward(g, gpt, ids, tg, B, 16, NULL, &loss));
        CHECK(nn_ctx_autocast_dtype(g) == ACCEL_BF16);
        CHECK_OK(acc, accel_backward(acc, loss));
        losses[s] = nn_item(loss);
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        nn_ctx_reset(g);
    }
    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(p);
    accel_free(acc);
}

static void check_accel(void)
{
    float plain[STEPS], rc[STEPS];
    accel_losses(0, plain);
    accel_losses(1, rc);
    for (int s = 0; s < STEPS; s++) {
        CHECK_MSG(memcmp(&plain[s], &rc[s], sizeof(float)) == 0,
                  "accel, bf16: step %d: loss %.9g plain, %.9g recomputed", s, (double)plain[s],
                  (double)rc[s]);
    }
    printf("accel, bf16, AdamW: %d steps, the same losses (%.6f ... %.6f)\n", STEPS,
           (double)plain[0], (double)plain[STEPS - 1]);
}

/* ---- segments of one's own ---- */

typedef struct seg_ctx {
    nn_tensor *b; /* from outside the segment, requires grad */
    int inner;    /* run an inner checkpoint too */
    int calls;
    int misbehave; /* 1: return x; 2: return a view; 3: another shape on the second call */
} seg_ctx;

static nn_tensor *inner_fn(nn_ctx *g, void *c, nn_tensor *x)
{
    seg_ctx *s = c;
    return nn_dropout(g, nn_tanh(g, nn_mul(g, x, s->b)), 0.25f);
}

static nn_tensor *seg_fn(nn_ctx *g, void *c, nn_tensor *x)
{
    seg_ctx *s = c;
    s->calls++;
    if (s->misbehave == 1) {
        nn_gelu(g, x, 1);
        return x;
    }
    nn_tensor *h = nn_gelu(g, nn_mul(g, x, s->b), 1);
    h = s->inner ? nn_checkpoint(g, inner_fn, s, h) : inner_fn(g, s, h);
    h = nn_add(g, h, x);
    if (s->misbehave == 2) {
        int64_t shape[1] = {-1};
        return nn_reshape(g, h, 1, shape);
    }
    if (s->misbehave == 3 && s->calls > 1) {
        return nn_sum(g, h, 0, 0);
    }
    return h;
}

/* loss = sum(seg(a) * seg(a)) with seg plain or checkpointed: gradients of a and b. */
static accel_status custom(int checkpoint, int inner, int misbehave, float *ga, float *gb,
                           float *loss_out)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    nn_ctx_set_seed(g, 5);
    float av[4 * 8], bv[8];
    for (int i = 0; i < 32; i++) {
        av[i] = 0.1f * (float)((i * 13) % 17) - 0.8f;
    }
    for (int i = 0; i < 8; i++) {
        bv[i] = 0.3f * (float)(i % 5) - 0.5f;
    }
    int64_t sa[2] = {4, 8}, sb[1] = {8};
    nn_tensor *a = nn_tensor_requires_grad(nn_tensor_from(g, av, 2, sa), 1);
    seg_ctx s = {nn_tensor_requires_grad(nn_tensor_from(g, bv, 1, sb), 1), inner, 0, misbehave};
    nn_tensor *y = checkpoint ? nn_checkpoint(g, seg_fn, &s, a) : seg_fn(g, &s, a);
    accel_status st = y != NULL ? ACCEL_OK : accel_last_status(NULL);
    nn_tensor *loss = y != NULL ? nn_sum_all(g, nn_mul(g, y, y)) : NULL;
    if (st == ACCEL_OK) {
        st = nn_backward(loss, 1.0f, NULL);
    }
    if (st == ACCEL_OK) {
        CHECK(s.calls == (checkpoint ? 2 : 1));
        memcpy(ga, nn_tensor_grad(a), sizeof(av));
        memcpy(gb, nn_tensor_grad(s.b), sizeof(bv));
        *loss_out = nn_item(loss);
    }
    nn_ctx_free(g);
    return st;
}

static void check_custom(void)
{
    float ga0[32], gb0[8], ga[32], gb[8], l0, l;
    CHECK_OK(NULL, custom(0, 0, 0, ga0, gb0, &l0));
    for (int variant = 0; variant < 3; variant++) {
        /* 0: checkpointed; 1: checkpointed with an inner checkpoint; 2: plain with one inside */
        int outer = variant != 2, inner = variant != 0;
        CHECK_OK(NULL, custom(outer, inner, 0, ga, gb, &l));
        CHECK_MSG(memcmp(&l, &l0, sizeof(l)) == 0 && memcmp(ga, ga0, sizeof(ga)) == 0 &&
                      memcmp(gb, gb0, sizeof(gb)) == 0,
                  "variant %d: loss %.9g vs %.9g, or a gradient differs", variant, (double)l,
                  (double)l0);
    }
    CHECK(custom(1, 0, 1, ga, gb, &l) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "from outside") != NULL);
    CHECK(custom(1, 0, 2, ga, gb, &l) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "a view") != NULL);
    CHECK(custom(1, 0, 3, ga, gb, &l) == ACCEL_EINVAL);
    CHECK_MSG(strstr(accel_last_error(NULL), "second run") != NULL, "%s", accel_last_error(NULL));
}

static void check_no_grad(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    float bv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t sb[1] = {8};
    seg_ctx s = {nn_tensor_requires_grad(nn_tensor_from(g, bv, 1, sb), 1), 0, 0, 0};
    nn_ctx_set_grad_enabled(g, 0);
    nn_tensor *y = nn_checkpoint(g, seg_fn, &s, nn_tensor_from(g, bv, 1, sb));
    CHECK(y != NULL && !y->requires_grad && nn_ctx_get_stats(g).n_nodes == 0 && s.calls == 1);
    CHECK(nn_checkpoint(g, seg_fn, &s, NULL) == NULL);
    CHECK(nn_checkpoint(g, NULL, &s, y) == NULL && accel_last_status(NULL) == ACCEL_EINVAL);
    CHECK(nn_checkpoint(NULL, seg_fn, &s, y) == NULL && accel_last_status(NULL) == ACCEL_EINVAL);
    nn_ctx_free(g);
}

int main(void)
{
    compare_gpt(0.0f, ACCEL_F32);
    compare_gpt(0.1f, ACCEL_F32);
    compare_gpt(0.1f, ACCEL_BF16);
    check_peak_deep();
    check_accel();
    check_custom();
    check_no_grad();
    printf("ok\n");
    return 0;
}
