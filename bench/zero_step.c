/*
 * bench/zero_step: issue 17's benchmark. For the GPT benchmark model (bench.h; --layers and
 * --width make it larger), under ZeRO stages 0-3 in ONE run: the per-process bytes of
 * parameters, gradients and optimizer state held between backward and the optimizer step
 * (everything accel allocates for the model and its AdamW, counted through
 * accel_replace_allocator, plus the resident pages of the buffers accel maps itself: the shm
 * backend's shared gradients, ZeRO-2/3's gradient and weight pages; tests/count_alloc.h),
 * under stage 3 the full weights resident after forward (the units gathered then; under mixed
 * precision at stages 1-2 the buckets widened to fp32 then), and the training throughput
 * relative to stage 0.
 *
 * Each stage has its own accelerator (zero_stage is an accelerator option), all alive at once,
 * with the same initial weights and tokens; rounds alternate K steps of every stage, so a
 * change of machine load hits every stage alike, and each stage's step time is the median
 * over rounds (the slowest process's time of each step). Targets (issue 17): stage 3 bytes <=
 * stage 0 / N + one unit; throughput >= 0.95 of stage 0 for stages 1 and 2, >= 0.85 for
 * stage 3 on 2 processes. A stage this build refuses is reported with the reason, not timed.
 * The final losses of the stages are printed as a check that they train the same model.
 *
 * Usage: accel launch -n N zero_step [--layers L] [--width C] [--heads H] [--batch B]
 *        [--steps K] [--rounds R] [--mixed_precision no|bf16|fp16]
 * (run it with 2 and 4 processes; scripts/bench-all.sh does)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/check.h"
#include "accel/nn.h"
#include "bench.h"
#include "core/internal.h"
#include "count_alloc.h"

#define N_STAGES 4

typedef struct stage {
    accel *acc;
    accel_model *model;
    nn_params *p;
    nn_gpt *m;
    accel_optimizer *opt;
    nn_ctx *g;
    int ok;
    char why[512];
    size_t nbytes;   /* training state per process between backward and the step */
    size_t gathered; /* full weights resident after forward (stage 3: the units gathered;
                        stages 1-2 under mixed precision: the buckets widened) */
    double *t;       /* step seconds, slowest process */
    float loss;
} stage;

/* Synthetic tokens (different per process) and next-token targets. */
static void tokens(int32_t *ids, int32_t *tg, long count, int vocab, int rank)
{
    uint64_t s = 88172645463325252ull + 7919ull * (uint64_t)rank;
    for (long i = 0; i < count; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        ids[i] = (int32_t)(s % (uint64_t)vocab);
    }
    for (long i = 0; i < count; i++) {
        tg[i] = ids[(i + 1) % count];
    }
}

/* One training step; with `mapped` it also samples the weights accel maps itself after forward
 * (into s->gathered) and the gradients it maps itself after backward (into *mapped). */
static float step(stage *s, const int32_t *ids, const int32_t *tg, int batch, int T, size_t *mapped)
{
    nn_tensor *loss = NULL;
    ACCEL_CHECK(nn_gpt_forward(s->g, s->m, ids, tg, batch, T, NULL, &loss));
    if (mapped != NULL) {
        s->gathered = count_alloc_gathered(s->model);
    }
    ACCEL_CHECK(accel_backward(s->acc, loss));
    if (mapped != NULL) {
        *mapped = count_alloc_mapped_grad(s->model);
    }
    ACCEL_CHECK(accel_optimizer_step(s->opt));
    ACCEL_CHECK(accel_optimizer_zero_grad(s->opt));
    float v = nn_item(loss);
    nn_ctx_reset(s->g);
    return v;
}

/* Stage z's accelerator; a refusal leaves s->acc NULL and the reason in s->why. */
static void init_stage(stage *s, int z, accel_precision mp)
{
    accel_options o = accel_options_default();
    o.zero_stage = z;
    o.mixed_precision = mp;
    if (accel_init(&s->acc, &o) != ACCEL_OK) {
        snprintf(s->why, sizeof(s->why), "%s", accel_last_error(NULL));
    }
}

/* Builds the model of an initialised stage, AdamW, accel_prepare and one step, counting what
 * stays allocated (the step's arena excluded: it is created after the count). A refusal of
 * accel_prepare leaves s->ok 0 and the reason in s->why. */
static void setup(stage *s, const nn_gpt_config *cfg, const int32_t *ids, const int32_t *tg,
                  int batch)
{
    accel_status st;
    size_t before = count_alloc_live();
    ACCEL_CHECK(accel_model_new(s->acc, &s->model));
    /* ZeRO with the model on a GPU is not done: host memory */
    ACCEL_CHECK(accel_model_set_device(s->model, (accel_device){ACCEL_DEVICE_CPU, 0}));
    ACCEL_CHECK(nn_params_for_model(&s->p, s->model));
    ACCEL_CHECK(nn_gpt_declare(&s->m, s->p, cfg));
    ACCEL_CHECK(nn_params_bind(s->p));
    ACCEL_CHECK(nn_params_init(s->p, 1234));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 3e-4;
    s->opt = accel_adamw(s->acc, s->model, &ao);
    ACCEL_CHECK(s->opt ? ACCEL_OK : accel_last_status(s->acc));
    st = accel_prepare(s->acc, s->model, s->opt);
    if (st != ACCEL_OK) {
        snprintf(s->why, sizeof(s->why), "%s", accel_last_error(s->acc));
        return;
    }
    ACCEL_CHECK(nn_ctx_new(&s->g));
    size_t mapped = 0;
    s->loss = step(s, ids, tg, batch, cfg->block_size, &mapped);
    nn_ctx_free(s->g);
    s->nbytes = count_alloc_live() - before + mapped;
    ACCEL_CHECK(nn_ctx_new(&s->g));
    s->ok = 1;
}

static int arg_int(int argc, char **argv, const char *flag, int dflt)
{
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], flag) == 0) {
            return atoi(argv[i + 1]);
        }
    }
    return dflt;
}

int main(int argc, char **argv)
{
    ACCEL_CHECK(count_alloc_install()); /* before any other accel call */
    nn_gpt_config cfg = bench_gpt_config();
    cfg.n_layer = arg_int(argc, argv, "--layers", cfg.n_layer);
    cfg.n_embd = arg_int(argc, argv, "--width", cfg.n_embd);
    cfg.n_head = arg_int(argc, argv, "--heads", cfg.n_head);
    int batch = arg_int(argc, argv, "--batch", 8), K = arg_int(argc, argv, "--steps", 3);
    int rounds = arg_int(argc, argv, "--rounds", 5);
    accel_precision mp = ACCEL_PRECISION_NO;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--mixed_precision") == 0) {
            mp = strcmp(argv[i + 1], "bf16") == 0   ? ACCEL_PRECISION_BF16
                 : strcmp(argv[i + 1], "fp16") == 0 ? ACCEL_PRECISION_FP16
                                                    : ACCEL_PRECISION_NO;
        }
    }
    if (cfg.n_layer < 1 || cfg.n_embd < 1 || cfg.n_head < 1 || cfg.n_embd % cfg.n_head != 0 ||
        batch < 1 || K < 1 || rounds < 1) {
        fprintf(stderr, "zero_step: bad arguments (width must be a multiple of heads)\n");
        return 2;
    }
    const int T = cfg.block_size;

    stage st[N_STAGES];
    memset(st, 0, sizeof(st));
    for (int z = 0; z < N_STAGES; z++) {
        init_stage(&st[z], z, mp);
    }
    if (st[0].acc == NULL) {
        fprintf(stderr, "zero_step: accel_init failed: %s\n", st[0].why);
        return 1;
    }
    int rank = accel_process_index(st[0].acc), n = accel_num_processes(st[0].acc);
    int32_t *ids = malloc((size_t)batch * T * sizeof(int32_t));
    int32_t *tg = malloc((size_t)batch * T * sizeof(int32_t));
    ACCEL_CHECK(ids && tg ? ACCEL_OK : ACCEL_ENOMEM);
    tokens(ids, tg, (long)batch * T, cfg.vocab_size, rank);
    for (int z = 0; z < N_STAGES; z++) {
        if (st[z].acc != NULL) {
            setup(&st[z], &cfg, ids, tg, batch);
        }
        st[z].t = calloc((size_t)(rounds * K), sizeof(double));
        ACCEL_CHECK(st[z].t ? ACCEL_OK : ACCEL_ENOMEM);
    }
    if (!st[0].ok) {
        fprintf(stderr, "zero_step: stage 0 failed: %s\n", st[0].why);
        return 1;
    }

    for (int r = 0; r < rounds; r++) {
        for (int z = 0; z < N_STAGES; z++) {
            for (int k = 0; k < K && st[z].ok; k++) {
                double t0 = accel__now();
                st[z].loss = step(&st[z], ids, tg, batch, T, NULL);
                double dt = accel__now() - t0;
                /* The step of the slowest process (a collective on that stage's accelerator). */
                ACCEL_CHECK(accel_allreduce(st[z].acc, &dt, &dt, 1, ACCEL_F64, ACCEL_MAX, NULL));
                st[z].t[r * K + k] = dt;
            }
        }
    }

    if (rank == 0) {
        printf("zero_step: L=%d C=%d H=%d T=%d V=%d untied, %s, batch %d per process, %d "
               "process(es), %lld parameters, %d rounds x %d steps per stage\n",
               cfg.n_layer, cfg.n_embd, cfg.n_head, T, cfg.vocab_size, accel_precision_name(mp),
               batch, n, (long long)nn_params_numel(st[0].p), rounds, K);
        printf("  stage  state bytes/process  of stage 0  + gathered units  step ms  tokens/s  "
               "throughput vs stage 0  final loss\n");
        double t0 = bench_median(st[0].t, rounds * K);
        for (int z = 0; z < N_STAGES; z++) {
            if (!st[z].ok) {
                printf("  %d      not available: %s\n", z, st[z].why);
                continue;
            }
            double tz = bench_median(st[z].t, rounds * K);
            printf("  %d      %19zu  %10.3f  %16zu  %7.2f  %8.0f  %21.3f  %.6f\n", z, st[z].nbytes,
                   (double)st[z].nbytes / (double)st[0].nbytes, st[z].gathered, tz * 1e3,
                   (double)n * batch * T / tz, t0 / tz, (double)st[z].loss);
        }
        printf("  (compare: accel estimate-memory --bytes --num_processes %d --n_layer %d "
               "--n_embd %d --n_head %d --vocab_size %d --n_positions %d --tied 0)\n",
               n, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, T);
        fflush(stdout);
    }
    for (int z = N_STAGES - 1; z >= 0; z--) {
        nn_ctx_free(st[z].g);
        nn_gpt_free(st[z].m);
        nn_params_free(st[z].p);
        accel_free(st[z].acc);
        free(st[z].t);
    }
    free(ids);
    free(tg);
    return 0;
}
