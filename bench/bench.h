/*
 * Helpers shared by the benchmarks: the median of a sample, and issue 4's GPT benchmark model,
 * defined once so every benchmark that times "the GPT step" (gpt_step, mp) times the same one.
 * Timing uses the library's monotonic clock, accel__now() (core/internal.h).
 */
#ifndef ACCEL_BENCH_H
#define ACCEL_BENCH_H

#include <stdlib.h>

#include "accel/nn.h"

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (n >= 1); sorts v in place. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* 4 layers, width 256, 4 heads, context 128, vocab 4096, pre-LN, exact GELU, MLP 4x, untied
 * head, no dropout. */
static inline nn_gpt_config bench_gpt_config(void)
{
    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = 4;
    cfg.n_embd = 256;
    cfg.n_head = 4;
    cfg.block_size = 128;
    cfg.vocab_size = 4096;
    cfg.tied = 0;
    cfg.act = NN_ACT_GELU;
    cfg.dropout = 0.0f;
    return cfg;
}

#endif
