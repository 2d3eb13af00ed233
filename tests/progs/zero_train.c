/*
 * Helper for tests/ckpt/test_zero_ckpt.sh: a small GPT (nn, tied embeddings) trained with
 * AdamW, gradient accumulation 2 and clipping under a ZeRO stage, on a global batch of 12
 * sequences per micro-step split evenly over the processes (1 to 4), so runs on different
 * process counts compute the same mathematics and differ only in rounding.
 *   zero_train STAGE STEPS OUT [save AT DIR MODEL_DIR] [load FROM DIR] [model DIR]
 *     trains micro-steps [FROM, 2 * STEPS) (FROM 0 unless loading), writes the final weights
 *     (fp32, in registration order) to OUT; `save`: after micro-step AT (odd: inside an
 *     accumulation window), save_state DIR and save_model MODEL_DIR; `load`: load_state DIR
 *     first; `model`: save_model DIR at the end.
 *   zero_train STAGE STEPS OUT peak DIR
 *     a larger GPT (6 layers of width 64); at the end, save_model DIR with one tensor gathered
 *     per round, and check on the main process that the library's allocations grew by less
 *     than a third of the model's bytes meanwhile (a counting allocator; measured about a
 *     quarter at stage 3, whose receive buffer is 4 x the largest piece of a tensor, up to a
 *     layer's unit): the writer never holds the model.
 *   zero_train compare A B TOL
 *     exit 0 when the weight files agree within TOL (max |a - b| / max(1, |b|)); TOL 0: bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "ckpt/state.h"
#include "small_gpt.h"
#include "zero_master.h"

#define GLOBAL 12 /* sequences per micro-step, all processes together */
#define T 8
#define ACCUM 2

#define TRY(acc, call)                                                                             \
    do {                                                                                           \
        if ((call) != ACCEL_OK) {                                                                  \
            fprintf(stderr, "zero_train: %s: %s\n", #call, accel_last_error(acc));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A counting allocator (a size header before each block): bytes in use and their peak. */
static size_t in_use, peak;
#define HDR 16

static void *count_malloc(size_t n)
{
    char *p = malloc(n + HDR);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    in_use += n;
    peak = in_use > peak ? in_use : peak;
    return p + HDR;
}

static void count_free(void *q)
{
    if (q != NULL) {
        size_t n;
        memcpy(&n, (char *)q - HDR, sizeof n);
        in_use -= n;
        free((char *)q - HDR);
    }
}

static void *count_calloc(size_t k, size_t n)
{
    void *p = count_malloc(k * n);
    if (p != NULL) {
        memset(p, 0, k * n);
    }
    return p;
}

static void *count_realloc(void *q, size_t n)
{
    void *p = count_malloc(n);
    if (p != NULL && q != NULL) {
        size_t old;
        memcpy(&old, (char *)q - HDR, sizeof old);
        memcpy(p, q, old < n ? old : n);
        count_free(q);
    }
    return p;
}

static void tokens(int micro, int seq, int32_t *ids, int32_t *tg)
{
    for (int t = 0; t < T; t++) {
        ids[t] = (int32_t)((micro * 131 + seq * 17 + t * 7) % 40);
        tg[t] = (int32_t)((micro * 29 + seq * 5 + t * 3 + 1) % 40);
    }
}

static float *read_weights(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "zero_train: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *w = malloc((size_t)len + 1);
    *n = fread(w, sizeof(float), (size_t)len / sizeof(float), f);
    fclose(f);
    return w;
}

static int compare(const char *a, const char *b, double tol)
{
    size_t na, nb;
    float *x = read_weights(a, &na), *y = read_weights(b, &nb);
    if (na != nb || na == 0) {
        fprintf(stderr, "zero_train: %s has %zu weights, %s %zu\n", a, na, b, nb);
        return 1;
    }
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < na; i++) {
        double d = fabs((double)x[i] - y[i]) / fmax(1.0, fabs((double)y[i]));
        if (!(d <= worst)) { /* NaN counts as a difference */
            worst = isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    int same = memcmp(x, y, na * sizeof(float)) == 0;
    printf("max relative difference %.3g (weight %zu)%s\n", worst, at,
           same ? ", bit-identical" : "");
    free(x);
    free(y);
    return (tol == 0 ? same : worst <= tol) ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "compare") == 0) {
        return compare(argv[2], argv[3], atof(argv[4]));
    }
    if (argc < 4) {
        fprintf(stderr, "usage: zero_train STAGE STEPS OUT [save AT DIR MODEL_DIR] [load FROM "
                        "DIR] [model DIR]\n");
        return 2;
    }
    int stage = atoi(argv[1]), steps = atoi(argv[2]), save_at = -1, from = 0;
    const char *out = argv[3], *save_dir = NULL, *save_model_dir = NULL, *load_dir = NULL,
               *model_dir = NULL, *peak_dir = NULL;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "save") == 0 && i + 3 < argc) {
            save_at = atoi(argv[i + 1]);
            save_dir = argv[i + 2];
            save_model_dir = argv[i + 3];
            i += 3;
        } else if (strcmp(argv[i], "load") == 0 && i + 2 < argc) {
            from = atoi(argv[i + 1]);
            load_dir = argv[i + 2];
            i += 2;
        } else if (strcmp(argv[i], "model") == 0 && i + 1 < argc) {
            model_dir = argv[++i];
        } else if (strcmp(argv[i], "peak") == 0 && i + 1 < argc) {
            peak_dir = argv[++i];
        } else {
            fprintf(stderr, "zero_train: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    if (peak_dir != NULL) {
        TRY(NULL, accel_replace_allocator(count_malloc, count_realloc, count_calloc, count_free));
    }
    accel_options o = accel_options_default();
    o.zero_stage = stage;
    o.gradient_accumulation_steps = ACCUM;
    o.first_bucket_mb = 0.004; /* several buckets, so pieces split parameters */
    o.bucket_cap_mb = 0.01;
    accel *acc;
    TRY(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    if (GLOBAL % n != 0) {
        fprintf(stderr, "zero_train: %d processes do not divide %d sequences\n", n, GLOBAL);
        return 2;
    }
    int per = GLOBAL / n;
    /* peak: tensors large next to the writer's bookkeeping */
    nn_gpt_config cfg = small_gpt_config(peak_dir ? 6 : 2, 2, peak_dir ? 64 : 16, T, 40, 1);
    accel_model *m;
    nn_params *p;
    nn_gpt *gpt;
    small_gpt_new(acc, &cfg, 7, &m, &p, &gpt);
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 1e-2;
    ao.weight_decay = 0.1;
    accel_optimizer *opt = accel_adamw(acc, m, &ao);
    if (opt == NULL) {
        fprintf(stderr, "zero_train: %s\n", accel_last_error(acc));
        return 1;
    }
    TRY(acc, accel_prepare(acc, m, opt));
    if (load_dir != NULL) {
        TRY(acc, accel_load_state(acc, load_dir));
    }
    nn_ctx *g;
    TRY(NULL, nn_ctx_new(&g));
    int32_t *ids = malloc((size_t)per * T * sizeof(int32_t)),
            *tg = malloc((size_t)per * T * sizeof(int32_t));
    for (int micro = from; micro < steps * ACCUM; micro++) {
        for (int s = 0; s < per; s++) {
            tokens(micro, rank * per + s, ids + s * T, tg + s * T);
        }
        nn_ctx_reset(g);
        TRY(acc, accel_accumulate(acc, m));
        nn_tensor *loss = NULL;
        TRY(NULL, nn_gpt_forward(g, gpt, ids, tg, per, T, NULL, &loss));
        TRY(acc, accel_backward(acc, loss));
        if (accel_sync_gradients(acc)) {
            TRY(acc, accel_clip_grad_norm(acc, m, 0.3, 2.0, NULL));
            TRY(acc, accel_optimizer_step(opt));
        }
        TRY(acc, accel_optimizer_zero_grad(opt));
        if (micro + 1 == save_at) {
            TRY(acc, accel_save_state(acc, save_dir));
            TRY(acc, accel_save_model(acc, m, save_model_dir, NULL));
        }
    }
    if (model_dir != NULL) {
        TRY(acc, accel_save_model(acc, m, model_dir, NULL));
    }
    if (peak_dir != NULL) {
        accel__ckpt_gather_round_nbytes = 1; /* a round per tensor */
        size_t before = in_use, model_nbytes = accel_model_numel(m) * sizeof(float);
        peak = in_use;
        TRY(acc, accel_save_model(acc, m, peak_dir, NULL));
        if (rank == 0) {
            printf("save_model: allocations grew by at most %zu bytes for a model of %zu\n",
                   peak - before, model_nbytes);
            if (peak - before >= model_nbytes / 3) {
                fprintf(stderr, "zero_train: save_model held %zu bytes, the model has %zu\n",
                        peak - before, model_nbytes);
                return 1;
            }
        }
    }
    /* The fp32 master from the owners' pieces (collective): under mixed precision at stages
     * 1-2 the gathered weights are the compute copy widened. */
    float *master = malloc(accel_model_numel(m) * sizeof(float));
    zero_read_master(acc, m, master);
    if (rank == 0) {
        FILE *f = fopen(out, "wb");
        if (f != NULL) {
            fwrite(master, sizeof(float), accel_model_numel(m), f);
        }
        if (f == NULL || fclose(f) != 0) {
            fprintf(stderr, "zero_train: cannot write %s\n", out);
            return 1;
        }
    }
    free(master);
    free(ids);
    free(tg);
    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(p);
    accel_free(acc);
    return 0;
}
