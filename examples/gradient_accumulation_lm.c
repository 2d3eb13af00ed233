/*
 * gradient_accumulation_lm: Accelerate's "gradient accumulation on training samples of variable
 * size", in C.
 *
 *     build/examples/gradient_accumulation_lm                                 (1 process)
 *     accel launch --num_processes 2 build/examples/gradient_accumulation_lm  (2 processes)
 *
 * When samples hold different numbers of tokens (language models), averaging the loss of each
 * micro-batch and then averaging over micro-batches and processes weights tokens unevenly. The
 * fix: per optimizer step, count the non-padding labels of every micro-batch on every process
 * (one all-reduce), use a SUM loss, and scale each micro-batch loss by
 * accumulation x num_processes / count: accel_backward divides by the accumulation steps and
 * the gradient all-reduce averages over processes, which leaves sum(loss) / count, the mean
 * over every token of the step. Gradients are synced only on the last micro-batch (no_sync
 * before it).
 *
 * The data: sample i has inputs 1..i+1 (float) and labels = inputs mod 2, padded with -100 to
 * the longest sample of its batch; per_device_batch x accumulation x num_processes samples make
 * exactly one optimizer step. The model: a bias-free Linear(1, 2) with a fixed initial weight,
 * CrossEntropy (sum, ignore_index -100), SGD lr 0.08. The main process also trains a clone in
 * one full-batch step with the mean loss; the two must agree to 1e-6 (exit status 1 if not).
 *
 * Options: --accum N, --batch N (per process). Defaults: 1 process: accumulation 1, batch 8;
 * more: accumulation 2, batch 4 (less where that makes more than 32 samples, the most the
 * check's tolerance holds for; --help).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>
#include <accel/nn.h>

#include "args.h"

#define LR 0.08f
/* At most 32 samples in all: the gradients grow with the inputs (up to the sample count) and
 * the rounding of their fp32 sums with them, so past ~64 samples the two updates differ by
 * more than the 1e-6 of the check although the accumulation is right. */
#define MAX_SAMPLES 32
#define IGNORE (-100)
static const float initial_weight[2] = {-0.007486820220947266f, 0.5364435911178589f};

/* ---- The dataset: sample i = inputs 1..i+1, labels inputs mod 2 (map-style, zero copy) ---- */

typedef struct lm_data {
    int64_t n;     /* samples */
    float *inputs; /* sample i at row i, n columns (only the first i+1 used) */
    int32_t *labels;
} lm_data;

static int64_t lm_len(void *ctx)
{
    return ((lm_data *)ctx)->n;
}

static accel_status lm_get(void *ctx, int64_t i, accel_sample *out)
{
    lm_data *d = ctx;
    int64_t len = i + 1;
    out->n_fields = 2;
    out->name[0] = "input_ids";
    out->field[0] = accel_tensor_view(d->inputs + i * d->n, ACCEL_F32, 1, &len);
    out->name[1] = "labels";
    out->field[1] = accel_tensor_view(d->labels + i * d->n, ACCEL_I32, 1, &len);
    return ACCEL_OK;
}

/* Forward of the Linear(1, 2) on a padded [rows, len] batch: the SUM cross entropy over the
 * non-ignored labels (or the mean, for the clone). */
static nn_tensor *lm_loss(nn_ctx *g, nn_tensor *weight, const float *inputs, const int32_t *labels,
                          int64_t rows, int64_t len, nn_reduction reduction)
{
    nn_tensor *x = nn_tensor_from(g, inputs, 3, (int64_t[]){rows, len, 1});
    nn_tensor *logits = nn_linear(g, x, weight, NULL, NN_LAYOUT_OUT_IN); /* [rows, len, 2] */
    nn_cross_entropy_options ce = nn_cross_entropy_options_default();
    ce.ignore_index = IGNORE;
    ce.reduction = reduction;
    return nn_cross_entropy(g, logits, labels, &ce);
}

static const char usage[] =
    "usage: gradient_accumulation_lm [--accum N] [--batch N]\n"
    "  --accum N    micro-batches per optimizer step (default 1 on 1 process, else 2)\n"
    "  --batch N    samples per micro-batch and process (default 8 on 1 process, else 4,\n"
    "               or fewer where that makes more than 32 samples)\n"
    "  the run has batch x accum x processes samples, at most 32 (sample i has i+1 tokens)\n";

int main(int argc, char **argv)
{
    int accum = 0, batch = 0; /* 0: the default for the process count */
    const arg_opt opts[] = {
        {"--accum", ARG_INT, &accum, 1, MAX_SAMPLES},
        {"--batch", ARG_INT, &batch, 1, MAX_SAMPLES},
    };
    int status = args_parse("gradient_accumulation_lm", usage, opts, 2, argc, argv);
    if (status != ARGS_GO_ON) {
        return status;
    }
    /* accel_backward divides by the accelerator's accumulation steps, so they are an option of
     * accel_init; the default depends on the process count, which the launcher exports. */
    const char *ws = getenv("WORLD_SIZE");
    int multi = ws != NULL && atoi(ws) > 1;
    accum = accum > 0 ? accum : (multi ? 2 : 1);

    accel *acc = NULL;
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = accum;
    ACCEL_CHECK(accel_init(&acc, &o));
    int nproc = accel_num_processes(acc);
    if (batch == 0) { /* 8 on 1 process, 4 on more, fewer where that would pass MAX_SAMPLES */
        batch = nproc > 1 ? 4 : 8;
        batch = batch * accum * nproc > MAX_SAMPLES ? MAX_SAMPLES / (accum * nproc) : batch;
        batch = batch < 1 ? 1 : batch;
    }
    if ((int64_t)batch * accum * nproc > MAX_SAMPLES) { /* the same verdict on every process */
        accel_free(acc);
        return args_fail("gradient_accumulation_lm", usage,
                         "--batch %d x --accum %d x %d process(es) is more than %d samples", batch,
                         accum, nproc, MAX_SAMPLES);
    }

    /* per_device_batch x accumulation x num_processes samples: one optimizer step. */
    lm_data data = {.n = (int64_t)batch * accum * nproc};
    data.inputs = calloc((size_t)(data.n * data.n), sizeof(float));
    data.labels = calloc((size_t)(data.n * data.n), sizeof(int32_t));
    ACCEL_CHECK(data.inputs && data.labels ? ACCEL_OK : ACCEL_ENOMEM);
    for (int64_t i = 0; i < data.n; i++) {
        for (int64_t k = 0; k <= i; k++) {
            data.inputs[i * data.n + k] = (float)(k + 1);
            data.labels[i * data.n + k] = (int32_t)((k + 1) % 2);
        }
    }
    accel_dataset ds = {.ctx = &data, .len = lm_len, .get = lm_get};
    accel_pad_value pad[2] = {{"input_ids", IGNORE}, {"labels", IGNORE}};
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = batch;
    lo.pad = pad;
    lo.n_pad = 2;
    accel_loader *dl;
    ACCEL_CHECK(accel_loader_new(acc, &ds, &lo, &dl));

    /* model = Linear(1, 2, bias=False), its parameters in an accel_model's flat buffers. */
    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_linear_layer fc;
    ACCEL_CHECK(accel_model_new(acc, &model));
    /* a CPU program (it reads the weights on the host): the model stays in host memory */
    ACCEL_CHECK(accel_model_set_device(model, (accel_device){ACCEL_DEVICE_CPU, 0}));
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_linear_declare(&fc, params, "", 1, 2, 0, NN_LAYOUT_OUT_IN));
    ACCEL_CHECK(nn_params_bind(params));
    memcpy(fc.weight->data, initial_weight, sizeof initial_weight);
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    accel_optimizer *opt = accel_sgd(acc, model, &so);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, model, opt, dl));
    accel_print(acc, "initial model weight: [%.4f, %.4f]\n", (double)fc.weight->data[0],
                (double)fc.weight->data[1]);

    /* The micro-batches of one step are read first (their label count is needed before the
     * first backward); a batch's memory is the loader's, so copy it. */
    int64_t cap = (int64_t)batch * data.n;
    float *in = malloc((size_t)(accum * cap) * sizeof(float));
    int32_t *lab = malloc((size_t)(accum * cap) * sizeof(int32_t));
    int64_t *rows = calloc((size_t)accum, sizeof(int64_t)), *lens = calloc((size_t)accum, 8);
    ACCEL_CHECK(in && lab && rows && lens ? ACCEL_OK : ACCEL_ENOMEM);
    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));
    accel_logger *log = accel_get_logger(acc, "gradient_accumulation_lm");
    ACCEL_CHECK(log ? ACCEL_OK : accel_last_status(acc));
    accel_logger_set_stream(log, stdout); /* in line with accel_print's output */

    int64_t total_updates = (accel_loader_len(dl) + accum - 1) / accum;
    for (int64_t update = 0; update < total_updates; update++) {
        int n_micro = 0;
        long long local_items = 0;
        accel_batch *b;
        while (n_micro < accum && accel_loader_next(dl, &b) == ACCEL_OK) {
            const accel_tensor *x = accel_batch_field(b, "input_ids");
            const accel_tensor *y = accel_batch_field(b, "labels");
            rows[n_micro] = x->shape[0];
            lens[n_micro] = x->shape[1];
            memcpy(in + n_micro * cap, x->data, accel_tensor_nbytes(x));
            memcpy(lab + n_micro * cap, y->data, accel_tensor_nbytes(y));
            for (int64_t k = 0; k < accel_tensor_numel(y); k++) {
                local_items += ((const int32_t *)y->data)[k] != IGNORE;
            }
            n_micro++;
        }
        /* num_items_in_batch = accelerator.gather(local count).sum() */
        long long items = local_items;
        ACCEL_CHECK(accel_allreduce(acc, &items, &items, 1, ACCEL_I64, ACCEL_SUM, NULL));
        accel_logger_log(log, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "local items in batch: %lld",
                         local_items);
        accel_print(acc, "total items in batch (all processes): %lld\n", items);

        for (int i = 0; i < n_micro; i++) {
            int last = i == n_micro - 1;
            if (!last) {
                ACCEL_CHECK(accel_no_sync_begin(acc, model)); /* accumulate locally */
            }
            nn_tensor *loss = lm_loss(g, fc.weight, in + i * cap, lab + i * cap, rows[i], lens[i],
                                      NN_REDUCTION_SUM);
            loss = nn_scale(g, loss, (float)((double)accum * nproc / (double)items));
            ACCEL_CHECK(accel_backward(acc, loss));
            if (!last) {
                ACCEL_CHECK(accel_no_sync_end(acc, model));
            }
        }
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
    }
    accel_print(acc, "final model weight:   [%.4f, %.4f]\n", (double)fc.weight->data[0],
                (double)fc.weight->data[1]);

    /* The clone, on the main process: one step on every sample at once with the MEAN loss,
     * standalone nn parameters and a hand-written SGD step. */
    int ok = 1;
    if (accel_is_main_process(acc)) {
        nn_params *cp = NULL;
        nn_linear_layer clone;
        ACCEL_CHECK(nn_params_new(&cp, NULL));
        ACCEL_CHECK(nn_linear_declare(&clone, cp, "", 1, 2, 0, NN_LAYOUT_OUT_IN));
        ACCEL_CHECK(nn_params_bind(cp));
        memcpy(clone.weight->data, initial_weight, sizeof initial_weight);
        float *all_in = malloc((size_t)(data.n * data.n) * sizeof(float));
        int32_t *all_lab = malloc((size_t)(data.n * data.n) * sizeof(int32_t));
        ACCEL_CHECK(all_in && all_lab ? ACCEL_OK : ACCEL_ENOMEM);
        for (int64_t k = 0; k < data.n * data.n; k++) { /* pad as the loader does */
            int in_sample = (k % data.n) <= (k / data.n);
            all_in[k] = in_sample ? data.inputs[k] : IGNORE;
            all_lab[k] = in_sample ? data.labels[k] : IGNORE;
        }
        nn_tensor *loss =
            lm_loss(g, clone.weight, all_in, all_lab, data.n, data.n, NN_REDUCTION_MEAN);
        ACCEL_CHECK(nn_backward(loss, 1.0f, NULL));
        float *gw = nn_tensor_grad(clone.weight);
        for (int k = 0; k < 2; k++) {
            clone.weight->data[k] -= LR * gw[k];
        }
        double diff = 0.0;
        for (int k = 0; k < 2; k++) {
            diff = fmax(diff, fabs((double)clone.weight->data[k] - fc.weight->data[k]));
        }
        ok = diff <= 1e-6;
        printf("clone (full batch, mean loss): [%.4f, %.4f]\n", (double)clone.weight->data[0],
               (double)clone.weight->data[1]);
        printf("max |accumulated - full batch| = %.3g: %s\n", diff,
               ok ? "they agree" : "MISMATCH (tolerance 1e-6)");
        free(all_in);
        free(all_lab);
        nn_params_free(cp);
    }

    nn_ctx_free(g);
    free(in);
    free(lab);
    free(rows);
    free(lens);
    accel_loader_free(dl);
    nn_params_free(params);
    accel_free(acc);
    free(data.inputs);
    free(data.labels);
    return ok ? 0 : 1;
}
