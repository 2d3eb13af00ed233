/*
 * The small GPT that many test programs train: its configuration and its model on an
 * accelerator (an accel_model holding the nn parameters, as examples/gpt.c builds it). A failed
 * call prints file:line, the call and accel_last_error and exits 1 (check.h's CHECK_OK).
 *
 *     nn_gpt_config cfg = small_gpt_config(2, 2, 16, T, 32, 1);
 *     small_gpt_new(acc, &cfg, seed, &m, &p, &gpt);   (free gpt, then p; accel_free frees m)
 */
#ifndef ACCEL_TESTS_SMALL_GPT_H
#define ACCEL_TESTS_SMALL_GPT_H

#include <stdint.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "check.h"

/* GPT-2 of this shape (tied or untied head, tanh GELU) without dropout, so runs are
 * deterministic. */
static inline nn_gpt_config small_gpt_config(int n_layer, int n_head, int n_embd, int block_size,
                                             int vocab_size, int tied)
{
    nn_gpt_config c = nn_gpt_config_default();
    c.n_layer = n_layer;
    c.n_head = n_head;
    c.n_embd = n_embd;
    c.block_size = block_size;
    c.vocab_size = vocab_size;
    c.tied = tied;
    c.dropout = 0.0f;
    return c;
}

/* cfg's GPT declared in a new model of acc; the parameters are not bound yet (callers that
 * measure what binding allocates, or load weights, bind themselves). */
static inline void small_gpt_declare(accel *acc, const nn_gpt_config *cfg, accel_model **m,
                                     nn_params **p, nn_gpt **gpt)
{
    CHECK_OK(acc, accel_model_new(acc, m));
    CHECK_OK(NULL, nn_params_for_model(p, *m));
    CHECK_OK(NULL, nn_gpt_declare(gpt, *p, cfg));
}

/* small_gpt_declare, then bound and initialised from seed. */
static inline void small_gpt_new(accel *acc, const nn_gpt_config *cfg, uint64_t seed,
                                 accel_model **m, nn_params **p, nn_gpt **gpt)
{
    small_gpt_declare(acc, cfg, m, p, gpt);
    CHECK_OK(NULL, nn_params_bind(*p));
    CHECK_OK(NULL, nn_params_init(*p, seed));
}

#endif
