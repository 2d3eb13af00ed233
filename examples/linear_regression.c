/*
 * linear_regression: Accelerate's gradient-accumulation tutorial, in C.
 *
 *     build/examples/linear_regression                                    (1 process)
 *     accel launch --num_processes 2 build/examples/linear_regression     (2 processes)
 *
 * Learn y = 2x on x = 1..8 with one 1x1 weight starting at 0, MSE loss and SGD (lr 0.02):
 * batches of 2 with 4 gradient-accumulation steps make one optimizer step per epoch, which must
 * equal one step of a clone trained on the whole batch of 8 without accumulation. The batches
 * are global (split_batches): on 2 processes each process gets one sample of every batch of
 * 2, so the same 4 micro-steps see the same 8 samples.
 *
 * The model is trained with the hand-written backward API (no nn toolkit): the gradient is
 * added into the parameter's gradient view, then accel_grad_ready / accel_backward_end sync it.
 *
 * Options: --epochs N (default 1), --accum N (default 4), --batch N (default 2), with
 * batch x accum = 8 (--help). Exit status 1 when the two weights differ (at the 5 decimals
 * printed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>

#include "args.h"

#define N_SAMPLES 8
#define LR 0.02

static const char usage[] =
    "usage: linear_regression [--epochs N] [--accum N] [--batch N]\n"
    "  --epochs N   passes over the 8 samples (default 1)\n"
    "  --accum N    gradient accumulation steps (default 4)\n"
    "  --batch N    samples per batch, over all processes (default 2)\n"
    "  batch x accum must be 8: one optimizer step sees the 8 samples the clone does\n";

int main(int argc, char **argv)
{
    int epochs = 1, accum = 4, batch = 2;
    const arg_opt opts[] = {
        {"--epochs", ARG_INT, &epochs, 1, 1000000},
        {"--accum", ARG_INT, &accum, 1, N_SAMPLES},
        {"--batch", ARG_INT, &batch, 1, N_SAMPLES},
    };
    int status = args_parse("linear_regression", usage, opts, 3, argc, argv);
    if (status != ARGS_GO_ON) {
        return status;
    }
    /* The comparison is only fair when an optimizer step covers the clone's full batch:
     * otherwise the two differ by design, not by a fault of accumulation. */
    if (batch * accum != N_SAMPLES) {
        return args_fail("linear_regression", usage,
                         "--batch %d x --accum %d must be %d (the samples of one step)", batch,
                         accum, N_SAMPLES);
    }

    /* Accelerator(gradient_accumulation_steps=4, dataloader_config=split_batches=True) */
    accel *acc = NULL;
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = accum;
    o.split_batches = 1;
    ACCEL_CHECK(accel_init(&acc, &o));

    /* The data: x = 1..8, y = 2x, as a TensorDataset of two [8, 1] tensors. */
    float x[N_SAMPLES], y[N_SAMPLES];
    for (int i = 0; i < N_SAMPLES; i++) {
        x[i] = (float)(i + 1);
        y[i] = 2.0f * x[i];
    }
    int64_t shape[2] = {N_SAMPLES, 1};
    accel_tensor cols[2] = {accel_tensor_view(x, ACCEL_F32, 2, shape),
                            accel_tensor_view(y, ACCEL_F32, 2, shape)};
    const char *names[2] = {"x", "y"};
    accel_dataset *ds = NULL;
    ACCEL_CHECK(accel_tensor_dataset_new(&ds, 2, names, cols));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = batch;
    accel_loader *dl;
    ACCEL_CHECK(accel_loader_new(acc, ds, &lo, &dl));

    /* The model: one [1, 1] weight, zero-initialised (accel_model_alloc zero-fills). */
    accel_model *model = NULL;
    int w_index = -1;
    ACCEL_CHECK(accel_model_new(acc, &model));
    ACCEL_CHECK(accel_model_add_param(model, "weight", 2, (int64_t[]){1, 1}, &w_index));
    ACCEL_CHECK(accel_model_alloc(model));
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    accel_optimizer *opt = accel_sgd(acc, model, &so);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, model, opt, dl));
    const accel_param *w = accel_model_param(model, w_index);

    /* The clone: the same weight trained by hand on the full batch, no accumulation. */
    double w_clone = 0.0;

    for (int epoch = 0; epoch < epochs; epoch++) {
        accel_batch *b;
        while (accel_loader_next(dl, &b) == ACCEL_OK) {
            ACCEL_CHECK(accel_accumulate(acc, model)); /* with accelerator.accumulate(model): */
            const float *bx = accel_batch_field(b, "x")->data,
                        *by = accel_batch_field(b, "y")->data;
            /* Forward: out = x @ w, loss = mean((out - y)^2). Backward by hand:
             * dloss/dw = 2/rows * sum((out - y) * x), seeded with 1 / accumulation steps. */
            double seed = accel_backward_begin(acc), g = 0.0;
            for (int64_t r = 0; r < b->rows; r++) {
                g += 2.0 * ((double)bx[r] * w->data[0] - by[r]) * bx[r];
            }
            w->grad[0] += (float)(seed * g / (double)b->rows);
            ACCEL_CHECK(accel_grad_ready(model, w_index)); /* its all-reduce may start now */
            ACCEL_CHECK(accel_backward_end(acc));
            ACCEL_CHECK(accel_optimizer_step(opt)); /* no-ops until the 4th micro-step */
            ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        }
        /* The clone's epoch: one step on the mean gradient over all 8 samples. */
        double g = 0.0;
        for (int i = 0; i < N_SAMPLES; i++) {
            g += 2.0 * (x[i] * w_clone - y[i]) * x[i];
        }
        w_clone -= LR * (float)(g / N_SAMPLES);
        w_clone = (float)w_clone; /* the clone keeps fp32 weights too */
    }

    accel_print(acc, "%d process(es), batches of %d, %d accumulation steps, %d epoch(s)\n",
                accel_num_processes(acc), batch, accum, epochs);
    accel_print(acc, "w/ accumulation, the final model weight is %.5f\n", (double)w->data[0]);
    accel_print(acc, "w/o accumulation, the final model weight is %.5f\n", w_clone);
    int agree = fabs((double)w->data[0] - w_clone) < 5e-6;
    accel_print(acc, "%s\n", agree ? "the weights agree" : "MISMATCH: the weights differ");

    accel_loader_free(dl);
    accel_dataset_free(ds);
    accel_free(acc);
    return agree ? 0 : 1;
}
