/* ACCEL_TEST_NPROCS: 1 2
 *
 * Exact resume (llm.c's test_gpt2 pattern): a hand-written MLP with dropout, AdamW, a linear
 * warmup schedule, a shuffled sharded loader and gradient accumulation 3 trains 2 epochs while
 * saving its state at two micro-steps (one inside an accumulation window, one on an epoch
 * boundary). For each checkpoint everything is freed, rebuilt from a different initialisation,
 * loaded, and trained to the end: every later loss and the final weights must equal the
 * uninterrupted run's bit for bit. Dropout masks come from the accelerator's generator (saved
 * per process) and from a registered counter (custom_checkpoint_0.bin).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/data.h"
#include "check.h"

#define N_SAMPLES 60
#define D_IN 8
#define D_H 16
#define D_OUT 2
#define EPOCHS 2
#define MAX_STEPS 64
#define P_DROP 0.25f

static float xs[N_SAMPLES * D_IN], ys[N_SAMPLES * D_OUT];

/* The registered object: a counter of micro-steps, also part of the dropout key. */
typedef struct counter {
    uint64_t step;
} counter;

static accel_status counter_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, ctx, sizeof(counter));
}

static accel_status counter_load(void *ctx, const void *data, size_t nbytes)
{
    if (nbytes != sizeof(counter)) {
        return ACCEL_ECORRUPT;
    }
    memcpy(ctx, data, nbytes);
    return ACCEL_OK;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A per-step key drawn from the accelerator's generator (which then moves on). */
static uint64_t draw_key(accel *acc)
{
    uint64_t s[ACCEL_RNG_STATE_WORDS];
    CHECK_OK(acc, accel_get_rng_state(acc, s));
    uint64_t k = mix(s[0] ^ mix(s[1]) ^ mix(s[2] + s[3]));
    s[0] = mix(s[0] + 1);
    CHECK_OK(acc, accel_set_rng_state(acc, s));
    return k;
}

typedef struct run {
    accel_model *m;
    accel_optimizer *opt;
    accel_scheduler *sch;
    accel_loader *dl;
    accel_dataset *ds;
    int w1, b1, w2, b2;
} run;

static void build(accel *acc, run *r, uint64_t init_seed)
{
    CHECK_OK(acc, accel_model_new(acc, &r->m));
    CHECK_OK(acc, accel_model_add_param(r->m, "fc1.weight", 2, (int64_t[]){D_H, D_IN}, &r->w1));
    CHECK_OK(acc, accel_model_add_param(r->m, "fc1.bias", 1, (int64_t[]){D_H}, &r->b1));
    CHECK_OK(acc, accel_model_add_param(r->m, "fc2.weight", 2, (int64_t[]){D_OUT, D_H}, &r->w2));
    CHECK_OK(acc, accel_model_add_param(r->m, "fc2.bias", 1, (int64_t[]){D_OUT}, &r->b2));
    CHECK_OK(acc, accel_model_alloc(r->m));
    for (int i = 0; i < accel_model_num_params(r->m); i++) {
        const accel_param *p = accel_model_param(r->m, i);
        for (size_t k = 0; k < p->numel; k++) {
            p->data[k] = (float)((double)(mix(init_seed + 131 * (uint64_t)i + k) >> 11) /
                                     9007199254740992.0 -
                                 0.5) *
                         0.6f;
        }
    }
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 3e-2;
    CHECK((r->opt = accel_adamw(acc, r->m, &ao)) != NULL);
    CHECK((r->sch = accel_linear_schedule(acc, r->opt, 3, 40)) != NULL);
    const char *names[2] = {"x", "y"};
    accel_tensor ts[2] = {accel_tensor_view(xs, ACCEL_F32, 2, (int64_t[]){N_SAMPLES, D_IN}),
                          accel_tensor_view(ys, ACCEL_F32, 2, (int64_t[]){N_SAMPLES, D_OUT})};
    CHECK_OK(acc, accel_tensor_dataset_new(&r->ds, 2, names, ts));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 4;
    lo.shuffle = 1;
    CHECK_OK(acc, accel_loader_new(acc, r->ds, &lo, &r->dl));
    CHECK_OK(acc, accel_prepare(acc, r->m, r->opt, r->sch, r->dl));
}

static void destroy(accel *acc, run *r)
{
    accel_free_memory(acc);
    accel_dataset_free(r->ds);
    memset(r, 0, sizeof(*r));
}

/* One micro-step: forward, hand-written backward, accumulate/step. Returns the local loss. */
static float step(accel *acc, run *r, const accel_batch *b, counter *c)
{
    const accel_tensor *x = accel_batch_field(b, "x"), *y = accel_batch_field(b, "y");
    const float *X = x->data, *Y = y->data;
    int64_t B = b->rows;
    /* The working copy: the master in fp32, its bf16/fp16 rounding under mixed precision
     * (stored in that dtype; widened here for the hand-written forward). */
    float cw[D_H * D_IN + D_H + D_OUT * D_H + D_OUT];
    accel_tensor cv;
    CHECK_OK(acc, accel_model_compute_view(r->m, &cv));
    CHECK(cv.shape[0] == (int64_t)(sizeof(cw) / sizeof(cw[0])));
    CHECK_OK(NULL, accel_convert(cw, ACCEL_F32, cv.data, cv.dtype, (size_t)cv.shape[0]));
    const float *W1 = cw + accel_model_param(r->m, r->w1)->offset;
    const float *B1 = cw + accel_model_param(r->m, r->b1)->offset;
    const float *W2 = cw + accel_model_param(r->m, r->w2)->offset;
    const float *B2 = cw + accel_model_param(r->m, r->b2)->offset;
    float *gW1 = accel_model_param(r->m, r->w1)->grad, *gB1 = accel_model_param(r->m, r->b1)->grad;
    float *gW2 = accel_model_param(r->m, r->w2)->grad, *gB2 = accel_model_param(r->m, r->b2)->grad;
    CHECK_OK(acc, accel_accumulate(acc, r->m));
    uint64_t key = draw_key(acc) ^ mix(c->step);
    c->step++;
    float h[16][D_H], d[16][D_H], mask[16][D_H], out[16][D_OUT];
    CHECK(B <= 16);
    double loss = 0;
    for (int64_t i = 0; i < B; i++) {
        for (int j = 0; j < D_H; j++) {
            float z = B1[j];
            for (int k = 0; k < D_IN; k++) {
                z += W1[j * D_IN + k] * X[i * D_IN + k];
            }
            h[i][j] = tanhf(z);
            uint64_t u = mix(key + (uint64_t)(i * D_H + j));
            mask[i][j] =
                (double)(u >> 11) / 9007199254740992.0 < P_DROP ? 0.0f : 1.0f / (1 - P_DROP);
            d[i][j] = h[i][j] * mask[i][j];
        }
        for (int o = 0; o < D_OUT; o++) {
            float z = B2[o];
            for (int j = 0; j < D_H; j++) {
                z += W2[o * D_H + j] * d[i][j];
            }
            out[i][o] = z;
            double e = z - Y[i * D_OUT + o];
            loss += e * e;
        }
    }
    loss /= (double)(B * D_OUT);
    float seed = (float)accel_backward_begin(acc);
    for (int64_t i = 0; i < B; i++) {
        float dd[D_H] = {0};
        for (int o = 0; o < D_OUT; o++) {
            float g = seed * 2.0f * (out[i][o] - Y[i * D_OUT + o]) / (float)(B * D_OUT);
            gB2[o] += g;
            for (int j = 0; j < D_H; j++) {
                gW2[o * D_H + j] += g * d[i][j];
                dd[j] += g * W2[o * D_H + j];
            }
        }
        for (int j = 0; j < D_H; j++) {
            float dz = dd[j] * mask[i][j] * (1 - h[i][j] * h[i][j]);
            gB1[j] += dz;
            for (int k = 0; k < D_IN; k++) {
                gW1[j * D_IN + k] += dz * X[i * D_IN + k];
            }
        }
    }
    CHECK_OK(acc, accel_backward_end(acc));
    if (accel_sync_gradients(acc)) {
        CHECK_OK(acc, accel_clip_grad_norm(acc, r->m, 1.0, 2.0, NULL));
    }
    CHECK_OK(acc, accel_optimizer_step(r->opt));
    CHECK_OK(acc, accel_scheduler_step(r->sch));
    CHECK_OK(acc, accel_optimizer_zero_grad(r->opt));
    return (float)loss;
}

/* Trains to the end from wherever r and c are; losses[c->step] is filled per micro-step.
 * Saves into dirs[i] right after micro-step save_at[i]. */
static void train(accel *acc, run *r, counter *c, float *losses, const int *save_at,
                  char (*dirs)[256], int n_save)
{
    while (accel_loader_epoch(r->dl) < EPOCHS) {
        accel_batch *b;
        accel_status st;
        while ((st = accel_loader_next(r->dl, &b)) == ACCEL_OK) {
            uint64_t k = c->step;
            CHECK(k < MAX_STEPS);
            losses[k] = step(acc, r, b, c);
            /* The fp16 loss scale (grows every 2 clean steps here) must resume too. */
            losses[MAX_STEPS + k] = (float)accel_loss_scale(acc);
            for (int i = 0; i < n_save; i++) {
                if ((int)c->step == save_at[i]) {
                    CHECK_OK(acc, accel_save_state(acc, dirs[i]));
                }
            }
        }
        CHECK_MSG(st == ACCEL_EOF, "%s", accel_last_error(acc));
    }
}

static void snapshot(run *r, float *w)
{
    memcpy(w, accel_model_master(r->m), accel_model_numel(r->m) * sizeof(float));
}

static void test_precision(accel_precision prec);

int main(void)
{
    for (int i = 0; i < N_SAMPLES * D_IN; i++) {
        xs[i] = (float)((double)(mix(1000 + (uint64_t)i) >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int i = 0; i < N_SAMPLES; i++) {
        ys[i * 2] = xs[i * D_IN] * 0.7f - xs[i * D_IN + 3];
        ys[i * 2 + 1] = tanhf(xs[i * D_IN + 5] + xs[i * D_IN + 1]);
    }
    test_precision(ACCEL_PRECISION_NO);
    test_precision(ACCEL_PRECISION_BF16);
    test_precision(ACCEL_PRECISION_FP16);
    return 0;
}

static void test_precision(accel_precision prec)
{
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = 3;
    o.mixed_precision = prec;
    o.growth_interval = 2;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc);
    counter c = {0};
    CHECK_OK(acc, accel_register_for_checkpointing(acc, counter_save, counter_load, &c));

    char dirs[2][256];
    for (int i = 0; i < 2; i++) {
        snprintf(dirs[i], sizeof dirs[i], "/tmp/accel_test_resume_%d/%s_%d", (int)getppid(),
                 accel_precision_name(prec), i);
    }
    /* 15 (1 process) or 8 (2 processes) batches per epoch: step 7 is mid-epoch inside an
     * accumulation window; step 15 ends epoch 0 (1 process) or is mid-epoch 1 (2). */
    const int save_at[2] = {7, 15};

    float ref_loss[2 * MAX_STEPS] = {0}, ref_w[D_H * D_IN + D_H + D_OUT * D_H + D_OUT];
    run r;
    CHECK_OK(acc, accel_set_seed(acc, 1234, 1));
    build(acc, &r, 42);
    train(acc, &r, &c, ref_loss, save_at, dirs, 2);
    int total = (int)c.step;
    CHECK(total > save_at[1]);
    snapshot(&r, ref_w);
    destroy(acc, &r);

    for (int s = 0; s < 2; s++) {
        /* A fresh start with other weights, another seed and a counter that disagrees. */
        CHECK_OK(acc, accel_set_seed(acc, 999, 1));
        c.step = 12345;
        build(acc, &r, 7);
        CHECK_OK(acc, accel_load_state(acc, dirs[s]));
        CHECK(strcmp(accel_checkpoint_dir(acc), dirs[s]) == 0);
        CHECK(c.step == (uint64_t)save_at[s]);
        float loss[2 * MAX_STEPS] = {0}, w[sizeof ref_w / sizeof ref_w[0]];
        train(acc, &r, &c, loss, NULL, NULL, 0);
        CHECK_MSG((int)c.step == total, "resumed run took %d steps, reference %d", (int)c.step,
                  total);
        for (int k = save_at[s]; k < total; k++) {
            CHECK_MSG(memcmp(&loss[k], &ref_loss[k], sizeof(float)) == 0,
                      "rank %d resume from step %d: loss at step %d is %.9g, reference %.9g", rank,
                      save_at[s], k, loss[k], ref_loss[k]);
            CHECK_MSG(loss[MAX_STEPS + k] == ref_loss[MAX_STEPS + k],
                      "rank %d resume from step %d: loss scale at step %d is %g, reference %g",
                      rank, save_at[s], k, loss[MAX_STEPS + k], ref_loss[MAX_STEPS + k]);
        }
        snapshot(&r, w);
        CHECK_MSG(memcmp(w, ref_w, sizeof w) == 0, "rank %d: final weights differ (resume at %d)",
                  rank, save_at[s]);
        destroy(acc, &r);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf /tmp/accel_test_resume_%d", (int)getppid());
        CHECK(system(cmd) == 0);
    }
    accel_free(acc);
    printf("resume %s: ok (%d steps, saved at %d and %d)\n", accel_precision_name(prec), total,
           save_at[0], save_at[1]);
}
