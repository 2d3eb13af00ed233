/*
 * Helper for tests/cli/test_elastic.sh: a tiny MLP regression trained data-parallel with
 * gradient accumulation 2, AdamW, a linear schedule and a shuffled loader, saving its whole
 * state every --checkpoint_every optimizer steps (automatic naming under --project_dir) and
 * resuming through resume_from_checkpoint (ACCELERATE_RESUME_FROM_CHECKPOINT=latest, set by
 * the test), so that `accel launch --max_restarts N` continues a killed job. With --kill_rank R
 * --kill_micro M, process R SIGKILLs itself just before its micro-step M (counted from the start
 * of training), in the first attempt only (ACCEL_RESTART_COUNT 0). The main process ends with
 * "final step S fingerprint F", F an FNV-1a hash of the fp32 master weights' bytes.
 *   elastic_train --project_dir D [--steps 12] [--checkpoint_every 3] [--kill_rank R --kill_micro M]
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>
#include <accel/nn.h>

#define N_SAMPLES 96
#define D_IN 4
#define D_OUT 2
#define ACCUM 2

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static accel_status step_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, ctx, sizeof(int));
}

static accel_status step_load(void *ctx, const void *data, size_t nbytes)
{
    if (nbytes != sizeof(int)) {
        return ACCEL_ECORRUPT;
    }
    memcpy(ctx, data, sizeof(int));
    return ACCEL_OK;
}

int main(int argc, char **argv)
{
    const char *project_dir = NULL;
    int steps = 12, every = 3, kill_rank = -1, kill_micro = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--project_dir") == 0) {
            project_dir = argv[i + 1];
        } else if (strcmp(argv[i], "--steps") == 0) {
            steps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--checkpoint_every") == 0) {
            every = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--kill_rank") == 0) {
            kill_rank = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--kill_micro") == 0) {
            kill_micro = atoi(argv[i + 1]);
        }
    }
    if (project_dir == NULL || steps < 1 || every < 1) {
        fprintf(stderr, "usage: elastic_train --project_dir D [--steps N] [--checkpoint_every K] "
                        "[--kill_rank R --kill_micro M]\n");
        return 2;
    }
    const char *rc = getenv("ACCEL_RESTART_COUNT");
    int first_attempt = rc == NULL || atoi(rc) == 0;

    accel *acc = NULL;
    accel_options o = accel_options_default();
    o.project_dir = project_dir;
    o.automatic_checkpoint_naming = 1;
    o.gradient_accumulation_steps = ACCUM;
    ACCEL_CHECK(accel_init(&acc, &o));
    ACCEL_CHECK(accel_set_seed(acc, 1234, 0));

    static float xs[N_SAMPLES * D_IN], ys[N_SAMPLES * D_OUT];
    uint64_t s = 42;
    for (int i = 0; i < N_SAMPLES * D_IN; i++) {
        xs[i] = (float)((double)(splitmix(&s) >> 11) * 0x1.0p-53 - 0.5);
    }
    for (int i = 0; i < N_SAMPLES; i++) {
        ys[i * D_OUT] = xs[i * D_IN] - 2.0f * xs[i * D_IN + 1];
        ys[i * D_OUT + 1] = xs[i * D_IN + 2] * xs[i * D_IN + 3];
    }
    const char *names[2] = {"x", "y"};
    accel_tensor cols[2] = {accel_tensor_view(xs, ACCEL_F32, 2, (int64_t[]){N_SAMPLES, D_IN}),
                            accel_tensor_view(ys, ACCEL_F32, 2, (int64_t[]){N_SAMPLES, D_OUT})};
    accel_dataset *ds = NULL;
    ACCEL_CHECK(accel_tensor_dataset_new(&ds, 2, names, cols));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 4;
    lo.shuffle = 1;
    accel_loader *dl;
    ACCEL_CHECK(accel_loader_new(acc, ds, &lo, &dl));

    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_mlp_layer net;
    ACCEL_CHECK(accel_model_new(acc, &model));
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_mlp_declare(&net, params, "net", D_IN, 8, D_OUT, NN_ACT_TANH,
                               NN_LAYOUT_OUT_IN, "fc1", "fc2"));
    ACCEL_CHECK(nn_params_bind(params));
    ACCEL_CHECK(nn_params_init(params, 7));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 1e-2;
    accel_optimizer *opt = accel_adamw(acc, model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    int nproc = accel_num_processes(acc);
    accel_scheduler *sch = accel_linear_schedule(acc, opt, 2LL * nproc, (long long)steps * nproc);
    ACCEL_CHECK(sch ? ACCEL_OK : accel_last_status(acc));
    int step = 0;
    ACCEL_CHECK(accel_register_for_checkpointing(acc, step_save, step_load, &step));
    ACCEL_CHECK(accel_prepare(acc, model, opt, sch, dl)); /* resumes when there is a checkpoint */
    if (accel_checkpoint_dir(acc) != NULL) {
        accel_print(acc, "resumed from %s at step %d\n", accel_checkpoint_dir(acc), step);
    }

    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));
    int micro = 0;
    while (step < steps) {
        accel_batch *b;
        accel_status st = accel_loader_next(dl, &b);
        if (st == ACCEL_EOF) {
            continue;
        }
        ACCEL_CHECK(st);
        if (first_attempt && accel_process_index(acc) == kill_rank &&
            step * ACCUM + micro == kill_micro) {
            fprintf(stderr, "elastic_train: process %d SIGKILLs itself before micro-step %d\n",
                    kill_rank, kill_micro);
            raise(SIGKILL);
        }
        const accel_tensor *x = accel_batch_field(b, "x"), *y = accel_batch_field(b, "y");
        ACCEL_CHECK(accel_accumulate(acc, model));
        nn_tensor *out = nn_mlp_forward(g, &net, nn_tensor_from(g, x->data, 2, x->shape));
        nn_tensor *loss = nn_mse_loss(g, out, nn_tensor_from(g, y->data, 2, y->shape),
                                      NN_REDUCTION_MEAN);
        ACCEL_CHECK(loss ? ACCEL_OK : accel_last_status(NULL));
        ACCEL_CHECK(accel_backward(acc, loss));
        nn_ctx_reset(g);
        micro++;
        if (!accel_sync_gradients(acc)) {
            continue;
        }
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_scheduler_step(sch));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        step++;
        micro = 0;
        if (step % every == 0) {
            ACCEL_CHECK(accel_save_state(acc, NULL));
        }
    }
    const unsigned char *w = (const unsigned char *)accel_model_master(model);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < accel_model_numel(model) * sizeof(float); i++) {
        h = (h ^ w[i]) * 1099511628211ull;
    }
    accel_print(acc, "final step %d fingerprint %016llx\n", step, (unsigned long long)h);
    nn_ctx_free(g);
    nn_params_free(params);
    accel_free(acc);
    accel_dataset_free(ds);
    return 0;
}
