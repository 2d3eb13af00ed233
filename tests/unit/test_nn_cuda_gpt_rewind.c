/* ACCEL_TEST_LABELS: gpu
 *
 * The GPT on a GPU without recomputation, its blocks' backward giving back the arena memory it
 * allocates (accel__nn_rewind_segment, ACCEL_NN_REWIND): a few training steps through accel
 * (bf16 and fp32, dropout 0.1, AdamW, gradient clipping) give bit-identical losses and
 * gradient norms with the rewinds on and off and with recomputation, and the step's arena
 * peak is lower with them on. Under bf16 the residual stream's gradient and its 2-byte shadow
 * cross the rewind set aside below the mark (a product in the block below reads the shadow),
 * and every LayerNorm's backward (ln_f's too) reads the 2-byte gradient its reader wrote.
 * Exits 77 (skipped) where accel does not run on a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "check.h"
#include "small_gpt.h"

enum { STEPS = 3, L = 3, B = 2, T = 32, V = 64 };

/* src/nn/recompute.c's test hook: GPT blocks' backward rewinds (1) or keeps all (0). */
void accel__nn_set_rewind(int on);
#ifdef ACCEL_HAVE_CUDA
unsigned long accel__nn_cu_half_copies(void); /* gpu_internal.h: rounding passes so far */
unsigned long accel__nn_cu_ln_half_dys(void); /* gpu_internal.h: LayerNorms read 2-byte dY */
#else
static unsigned long accel__nn_cu_half_copies(void)
{
    return 0;
}
static unsigned long accel__nn_cu_ln_half_dys(void)
{
    return 0;
}
#endif

typedef struct result {
    float loss[STEPS];
    double norm[STEPS];
    size_t peak;
    unsigned long roundings; /* rounding passes (the shadows kept across rewinds need none) */
    unsigned long ln_half;   /* LayerNorm backwards that read their dY in 2 bytes */
} result;

/* 0 after STEPS steps into *r; 77 where accel is not on a GPU. */
static int train(accel_precision mp, int rewind, int recompute, result *r)
{
    accel_options o = accel_options_default();
    o.mixed_precision = mp;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    if (accel_device_of(acc).type != ACCEL_DEVICE_CUDA) {
        printf("SKIP: accel runs on %s here, not a GPU\n", accel_device_name(acc));
        accel_free(acc);
        return 77;
    }
    nn_gpt_config cfg = small_gpt_config(L, 2, 128, T, V, 1);
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
    CHECK_OK(NULL, nn_ctx_set_device(g, accel_device_of(acc)));
    nn_ctx_set_seed(g, 4);
    int32_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 11 + 2) % V;
        tg[i] = (i * 3 + 5) % V;
    }
    accel__nn_set_rewind(rewind);
    r->peak = 0;
    unsigned long c0 = accel__nn_cu_half_copies(), l0 = accel__nn_cu_ln_half_dys();
    for (int s = 0; s < STEPS; s++) {
        nn_tensor *loss = NULL;
        CHECK_OK(NULL, nn_gpt_forward(g, gpt, ids, tg, B, T, NULL, &loss));
        CHECK_OK(acc, accel_backward(acc, loss));
        size_t peak = nn_ctx_get_stats(g).peak_nbytes;
        r->peak = peak > r->peak ? peak : r->peak;
        r->loss[s] = nn_item(loss);
        CHECK_OK(acc, accel_clip_grad_norm(acc, m, 1.0, 2.0, &r->norm[s]));
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        nn_ctx_reset(g);
    }
    r->roundings = accel__nn_cu_half_copies() - c0;
    r->ln_half = accel__nn_cu_ln_half_dys() - l0;
    accel__nn_set_rewind(1);
    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(p);
    accel_free(acc);
    return 0;
}

static void same(const result *a, const result *b, const char *what)
{
    for (int s = 0; s < STEPS; s++) {
        CHECK_MSG(memcmp(&a->loss[s], &b->loss[s], sizeof(float)) == 0,
                  "%s: step %d: loss %.9g rewinding, %.9g", what, s, (double)a->loss[s],
                  (double)b->loss[s]);
        CHECK_MSG(memcmp(&a->norm[s], &b->norm[s], sizeof(double)) == 0,
                  "%s: step %d: gradient norm %.17g rewinding, %.17g", what, s, a->norm[s],
                  b->norm[s]);
    }
}

int main(void)
{
    static const struct {
        accel_precision mp;
        const char *name;
    } cases[] = {{ACCEL_PRECISION_BF16, "bf16"}, {ACCEL_PRECISION_NO, "fp32"}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        result on, off, rc;
        if (train(cases[c].mp, 1, 0, &on) == 77) {
            return 77;
        }
        train(cases[c].mp, 0, 0, &off);
        train(cases[c].mp, 1, 1, &rc);
        char what[64];
        snprintf(what, sizeof(what), "%s, rewinds off", cases[c].name);
        same(&on, &off, what);
        snprintf(what, sizeof(what), "%s, recomputed", cases[c].name);
        same(&on, &rc, what);
        CHECK_MSG(on.peak < off.peak, "%s: arena peak %zu rewinding, %zu without", cases[c].name,
                  on.peak, off.peak);
        CHECK_MSG(on.roundings == off.roundings, "%s: %lu rounding passes rewinding, %lu without",
                  cases[c].name, on.roundings, off.roundings);
#ifdef ACCEL_HAVE_CUDA
        /* Under bf16 every LayerNorm (a block's ln_1 and ln_2, and ln_f before the head) reads
         * the 2-byte gradient its one reader wrote; in fp32 none. */
        unsigned long ln_half = cases[c].mp == ACCEL_PRECISION_BF16 ? STEPS * (2 * L + 1) : 0;
        CHECK_MSG(on.ln_half == ln_half && off.ln_half == ln_half && rc.ln_half == ln_half,
                  "%s: %lu, %lu and %lu LayerNorm backwards read a 2-byte dY (rewinding, without, "
                  "recomputed), expected %lu",
                  cases[c].name, on.ln_half, off.ln_half, rc.ln_half, ln_half);
#endif
        printf("%s: %d steps, the same losses (%.6f ... %.6f) and norms, %lu rounding passes; "
               "arena peak %zu bytes rewinding, %zu without, %zu recomputed\n",
               cases[c].name, STEPS, (double)on.loss[0], (double)on.loss[STEPS - 1], on.roundings,
               on.peak, off.peak, rc.peak);
    }
    printf("ok\n");
    return 0;
}
