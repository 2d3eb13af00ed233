/*
 * gpt_memory: what accel really allocates for the GPT example's model (examples/gpt.c: nn_gpt
 * in an accel_model, AdamW, accel_prepare), counted through accel_replace_allocator, for
 * comparison with `accel estimate-memory` (tests/cli/test_estimate_memory.sh; count_alloc.h).
 *
 *   gpt_memory [--layers N --width N --heads N --context N --vocab N --tied 0|1 --steps N
 *               --batch N --dropout_pct N --recompute 0|1]
 *   (defaults: the example's 4, 128, 4, 128, 256 (bytes), 1, 2, batch 8, GPT-2's dropout 10%,
 *   no recomputation; precision and ZeRO stage from accel's configuration:
 *   ACCELERATE_MIXED_PRECISION, ACCEL_ZERO_STAGE)
 *
 * Prints, on the main process, one "key value" line each:
 *   params N          parameters of the model
 *   prepared_bytes N  bytes accel holds after accel_prepare that it did not hold before
 *                     accel_model_new (weights, gradients, optimizer state, bookkeeping)
 *   state_bytes N     the same after --steps training steps on synthetic tokens and the
 *                     step's arena freed (so state allocated lazily counts too)
 *   mapped_grad_bytes N  when the gradient buffer is not memory counted here (the shm
 *                     backend's shared buffer with several processes, ZeRO-2/3's pages): its
 *                     resident bytes after the last backward, before the optimizer step
 *                     (under ZeRO-2/3 this process's shard of reduced gradients); else 0
 *   gathered_bytes N  ZeRO-3: resident bytes of the full weights' pages (and of the compute
 *                     copy's) after the last forward, the units gathered then; ZeRO-1/2 under
 *                     mixed precision: the buckets widened to fp32 then; else 0
 *   arena_peak_bytes N  the most bytes nn's step arena held at once in any step
 *                     (nn_ctx_stats.peak_nbytes: activations, their gradients, the tape), which
 *                     --recompute 1 (nn_gpt_set_recompute) lowers
 *   scratch_peak_bytes N  the most per-op scratch any op needed (nn_ctx_stats.
 *                     scratch_peak_nbytes: the head's chunk of logits, nn_linear_cross_entropy)
 * state_bytes + mapped_grad_bytes is the training state held between backward and the step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>
#include <accel/check.h>
#include <accel/nn.h>

#include "count_alloc.h"

int main(int argc, char **argv)
{
    int layers = 4, width = 128, heads = 4, context = 128, vocab = 256, tied = 1, steps = 2;
    int batch = 8, dropout_pct = 10, recompute = 0;
    struct {
        const char *flag;
        int *v;
    } opts[] = {{"--layers", &layers},   {"--width", &width}, {"--heads", &heads},
                {"--context", &context}, {"--vocab", &vocab}, {"--tied", &tied},
                {"--steps", &steps},     {"--batch", &batch}, {"--dropout_pct", &dropout_pct},
                {"--recompute", &recompute}};
    for (int i = 1; i < argc; i += 2) {
        size_t k = 0, n = sizeof(opts) / sizeof(opts[0]);
        while (k < n && strcmp(argv[i], opts[k].flag) != 0) {
            k++;
        }
        if (k == n || i + 1 >= argc) {
            fprintf(stderr, "gpt_memory: bad argument %s\n", argv[i]);
            return 2;
        }
        *opts[k].v = atoi(argv[i + 1]);
    }

    ACCEL_CHECK(count_alloc_install());
    accel *acc = NULL;
    accel_options o = accel_options_default();
    ACCEL_CHECK(accel_init(&acc, &o));

    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = layers;
    cfg.n_head = heads;
    cfg.n_embd = width;
    cfg.block_size = context;
    cfg.vocab_size = vocab;
    cfg.tied = tied;
    cfg.dropout = (float)dropout_pct / 100.0f;
    size_t before = count_alloc_live();
    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_gpt *gpt = NULL;
    ACCEL_CHECK(accel_model_new(acc, &model));
    /* measures host memory: the model stays there in a CUDA build too */
    ACCEL_CHECK(accel_model_set_device(model, (accel_device){ACCEL_DEVICE_CPU, 0}));
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_gpt_declare(&gpt, params, &cfg));
    ACCEL_CHECK(nn_params_bind(params));
    ACCEL_CHECK(nn_params_init(params, 1337));
    nn_gpt_set_recompute(gpt, recompute);
    accel_adam_options ao = accel_adamw_options_default();
    accel_optimizer *opt = accel_adamw(acc, model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, model, opt));
    size_t prepared = count_alloc_live() - before;

    /* A few steps of the example's loop on synthetic tokens. */
    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)batch * (size_t)context);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)batch * (size_t)context);
    ACCEL_CHECK(ids && tg ? ACCEL_OK : ACCEL_ENOMEM);
    for (int i = 0; i < batch * context; i++) {
        ids[i] = (int32_t)((i * 7 + accel_process_index(acc)) % vocab);
        tg[i] = (int32_t)((i * 7 + 1) % vocab);
    }
    size_t mapped = 0, gathered = 0, arena_peak = 0;
    for (int s = 0; s < steps; s++) {
        nn_tensor *loss = NULL;
        ACCEL_CHECK(nn_gpt_forward(g, gpt, ids, tg, batch, context, NULL, &loss));
        gathered = count_alloc_gathered(model);
        ACCEL_CHECK(accel_backward(acc, loss));
        size_t peak = nn_ctx_get_stats(g).peak_nbytes;
        arena_peak = peak > arena_peak ? peak : arena_peak;
        mapped = count_alloc_mapped_grad(model);
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        nn_ctx_reset(g);
    }
    size_t scratch_peak = nn_ctx_get_stats(g).scratch_peak_nbytes;
    nn_ctx_free(g);
    accel_print(acc,
                "params %lld\nprepared_bytes %zu\nstate_bytes %zu\nmapped_grad_bytes %zu\n"
                "gathered_bytes %zu\narena_peak_bytes %zu\nscratch_peak_bytes %zu\n",
                (long long)nn_params_numel(params), prepared, count_alloc_live() - before, mapped,
                gathered, arena_peak, scratch_peak);
    free(ids);
    free(tg);
    nn_gpt_free(gpt);
    nn_params_free(params);
    accel_free(acc);
    return 0;
}
