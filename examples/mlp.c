/*
 * mlp: a small classifier trained data-parallel, evaluated with gather_for_metrics.
 *
 *     build/examples/mlp                                    (1 process)
 *     accel launch --num_processes 2 build/examples/mlp     (2 processes)
 *
 * The data: three interleaved noisy spirals in the plane (a seeded synthetic set, identical on
 * every process): 1500 training points and 300 evaluation points. The model: Linear(2, H) ->
 * ReLU -> Linear(H, 3) from the nn toolkit, AdamW, cross entropy. After every epoch each process
 * predicts its shard of the evaluation set; accel_gather_for_metrics collects the (prediction,
 * label) pairs of all processes and drops the samples the sharded loader repeated to give
 * every process the same number of batches, so the accuracy is over exactly 300 points.
 *
 * Options: --epochs N (default 20), --hidden N (64), --batch N (32, per process),
 * --lr X (0.01), --seed N (42); --help lists them.
 */
#define _DEFAULT_SOURCE /* M_PI under -std=c11 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>
#include <accel/nn.h>

#include "args.h"

#define N_CLASSES 3
#define N_TRAIN 1500
#define N_EVAL 300

/* A tiny seeded generator for the data (splitmix64), so the set does not depend on accel. */
static double uniform(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

/* n points of the spirals: class k, radius r in (0, 1], angle 4r + 2 pi k / 3 + noise. */
static void spirals(float *x, int32_t *y, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        int k = i % N_CLASSES;
        double r = (i / N_CLASSES + 1.0) / (n / N_CLASSES), u1 = uniform(&seed),
               u2 = uniform(&seed);
        double noise = 0.2 * sqrt(-2.0 * log(u1 + 1e-12)) * cos(2.0 * M_PI * u2); /* Box-Muller */
        double a = 4.0 * r + 2.0 * M_PI * k / N_CLASSES + noise;
        x[2 * i] = (float)(r * sin(a));
        x[2 * i + 1] = (float)(r * cos(a));
        y[i] = k;
    }
}

static accel_loader *make_loader(accel *acc, accel_dataset **ds, float *x, int32_t *y, int n,
                                 int batch, int shuffle)
{
    const char *names[2] = {"x", "y"};
    accel_tensor cols[2] = {accel_tensor_view(x, ACCEL_F32, 2, (int64_t[]){n, 2}),
                            accel_tensor_view(y, ACCEL_I32, 1, (int64_t[]){n})};
    ACCEL_CHECK(accel_tensor_dataset_new(ds, 2, names, cols));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = batch;
    lo.shuffle = shuffle;
    accel_loader *dl;
    ACCEL_CHECK(accel_loader_new(acc, *ds, &lo, &dl));
    return dl;
}

static const char usage[] =
    "usage: mlp [--epochs N] [--hidden N] [--batch N] [--lr X] [--seed N]\n"
    "  --epochs N   passes over the 1500 training points (default 20)\n"
    "  --hidden N   width of the hidden layer, up to 65536 (default 64)\n"
    "  --batch N    training points per process per step, up to 1500 (default 32)\n"
    "  --lr X       AdamW's learning rate (default 0.01)\n"
    "  --seed N     the data, the initial weights and the shuffling (default 42)\n";

int main(int argc, char **argv)
{
    int epochs = 20, hidden = 64, batch = 32, seed = 42;
    double lr = 0.01;
    const arg_opt opts[] = {
        {"--epochs", ARG_INT, &epochs, 1, 1000000},
        {"--hidden", ARG_INT, &hidden, 1, 65536},
        {"--batch", ARG_INT, &batch, 1, N_TRAIN},
        {"--lr", ARG_REAL, &lr, 1e-9, 10},
        {"--seed", ARG_INT, &seed, 0, INT_MAX},
    };
    int status = args_parse("mlp", usage, opts, 5, argc, argv);
    if (status != ARGS_GO_ON) {
        return status;
    }

    accel *acc = NULL;
    ACCEL_CHECK(accel_init(&acc, NULL));
    ACCEL_CHECK(accel_set_seed(acc, (uint64_t)seed, 0)); /* model init and shuffling */

    static float train_x[2 * N_TRAIN], eval_x[2 * N_EVAL];
    static int32_t train_y[N_TRAIN], eval_y[N_EVAL];
    spirals(train_x, train_y, N_TRAIN, (uint64_t)seed);
    spirals(eval_x, eval_y, N_EVAL, (uint64_t)seed + 1);
    accel_dataset *train_ds = NULL, *eval_ds = NULL;
    accel_loader *train_dl = make_loader(acc, &train_ds, train_x, train_y, N_TRAIN, batch, 1);
    accel_loader *eval_dl = make_loader(acc, &eval_ds, eval_x, eval_y, N_EVAL, 2 * batch, 0);

    /* model = Sequential(Linear(2, H), ReLU(), Linear(H, 3)) as net.fc1 / net.fc2 */
    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_mlp_layer net;
    ACCEL_CHECK(accel_model_new(acc, &model));
    /* ReLU has no CUDA kernel in nn yet: the model stays in host memory */
    ACCEL_CHECK(accel_model_set_device(model, (accel_device){ACCEL_DEVICE_CPU, 0}));
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_mlp_declare(&net, params, "net", 2, hidden, N_CLASSES, NN_ACT_RELU,
                               NN_LAYOUT_OUT_IN, "fc1", "fc2"));
    ACCEL_CHECK(nn_params_bind(params));
    ACCEL_CHECK(nn_params_init(params, (uint64_t)seed));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = lr;
    accel_optimizer *opt = accel_adamw(acc, model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, model, opt, train_dl, eval_dl));

    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));
    double accuracy = 0.0;
    for (int epoch = 0; epoch < epochs; epoch++) {
        /* Train. */
        double loss_sum = 0.0;
        long long n_batches = 0;
        accel_batch *b;
        while (accel_loader_next(train_dl, &b) == ACCEL_OK) {
            const accel_tensor *x = accel_batch_field(b, "x"), *y = accel_batch_field(b, "y");
            nn_tensor *in = nn_tensor_from(g, x->data, 2, x->shape);
            nn_tensor *logits = nn_mlp_forward(g, &net, in);
            nn_tensor *loss = nn_cross_entropy(g, logits, y->data, NULL);
            ACCEL_CHECK(accel_backward(acc, loss));
            ACCEL_CHECK(accel_optimizer_step(opt));
            ACCEL_CHECK(accel_optimizer_zero_grad(opt));
            loss_sum += nn_item(loss);
            n_batches++;
        }
        double mean_loss[2] = {loss_sum, (double)n_batches};
        ACCEL_CHECK(accel_allreduce(acc, mean_loss, mean_loss, 2, ACCEL_F64, ACCEL_SUM, NULL));

        /* Evaluate: no tape, predictions gathered from every process. */
        nn_ctx_set_grad_enabled(g, 0);
        long long correct = 0, seen = 0;
        while (accel_loader_next(eval_dl, &b) == ACCEL_OK) {
            const accel_tensor *x = accel_batch_field(b, "x"), *y = accel_batch_field(b, "y");
            nn_tensor *logits = nn_mlp_forward(g, &net, nn_tensor_from(g, x->data, 2, x->shape));
            ACCEL_CHECK(logits ? ACCEL_OK : accel_last_status(NULL));
            int32_t pairs[2 * 128]; /* (prediction, label) per row */
            int32_t *pl = b->rows <= 128 ? pairs : malloc((size_t)b->rows * 2 * sizeof(int32_t));
            ACCEL_CHECK(pl ? ACCEL_OK : ACCEL_ENOMEM);
            for (int64_t r = 0; r < b->rows; r++) {
                const float *row = logits->data + r * N_CLASSES;
                int best = 0;
                for (int c = 1; c < N_CLASSES; c++) {
                    best = row[c] > row[best] ? c : best;
                }
                pl[2 * r] = best;
                pl[2 * r + 1] = ((const int32_t *)y->data)[r];
            }
            accel_tensor mine = accel_tensor_view(pl, ACCEL_I32, 2, (int64_t[]){b->rows, 2}), all;
            ACCEL_CHECK(accel_gather_for_metrics(acc, &mine, &all));
            for (int64_t r = 0; r < all.shape[0]; r++) {
                const int32_t *p = (const int32_t *)all.data + 2 * r;
                correct += p[0] == p[1];
            }
            seen += all.shape[0];
            if (pl != pairs) {
                free(pl);
            }
            nn_ctx_reset(g);
        }
        nn_ctx_set_grad_enabled(g, 1);
        accuracy = seen ? (double)correct / (double)seen : 0.0;
        accel_print(acc, "epoch %2d  train loss %.4f  eval accuracy %.4f (%lld samples)\n", epoch,
                    mean_loss[0] / mean_loss[1], accuracy, seen);
    }
    accel_print(acc, "final accuracy %.4f\n", accuracy);

    nn_ctx_free(g);
    nn_params_free(params);
    accel_free(acc); /* also frees the model, optimizer and loaders */
    accel_dataset_free(train_ds);
    accel_dataset_free(eval_ds);
    return 0;
}
