/*
 * The program `accel test` launches (libexec/accel/test_worker, next to the tool: a program of
 * its own, so that the nn toolkit and OpenBLAS it links do not slow every start of `accel`,
 * whose launcher starts in a few milliseconds). Every process runs the same checks
 * in the same order (they are collectives): initialisation, every collective, the generator,
 * gather_for_metrics, a short training run with accumulation in the configured precision
 * against a reference computed here, and a checkpoint followed by an exact resume. After each
 * check the processes agree on its outcome; on a failure the main process names the check, the
 * processes and why, writes that line to $ACCEL_TEST_REPORT (for `accel test`'s last line) and
 * exits 1 while the others exit 0, so the launcher's summary shows it.
 * Test hook: ACCEL_TEST_FAIL_CHECK=<check> makes that check fail on the last process.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/data.h"
#include "accel/nn.h"
#include "base/fs.h"

typedef struct ctx {
    accel *acc;
    int rank, n;
    char why[512]; /* this process's failure, "" when it passed */
} ctx;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
failed(ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof(c->why), fmt, ap);
    va_end(ap);
    return -1;
}

/* A call that must succeed. */
#define TRY(c, call)                                                                               \
    do {                                                                                           \
        accel_status st_ = (call);                                                                 \
        if (st_ != ACCEL_OK) {                                                                     \
            return failed((c), "%s: %s", #call, accel_last_error((c)->acc));                       \
        }                                                                                          \
    } while (0)

#define EXPECT(c, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            return failed((c), __VA_ARGS__);                                                       \
        }                                                                                          \
    } while (0)

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s)
{
    return (float)((double)(splitmix(s) >> 11) * 0x1.0p-53 - 0.5);
}

/* ---- the checks ---- */

static int check_init(ctx *c)
{
    const char *ws = getenv("WORLD_SIZE");
    EXPECT(c, ws == NULL || atoi(ws) == c->n, "%d processes, WORLD_SIZE=%s", c->n, ws);
    EXPECT(c, accel_is_main_process(c->acc) == (c->rank == 0), "is_main_process is wrong");
    EXPECT(c, accel_is_last_process(c->acc) == (c->rank == c->n - 1), "is_last_process is wrong");
    if (c->rank == 0) {
        printf("%s", accel_state_summary(c->acc));
    }
    return 0;
}

static int check_collectives(ctx *c)
{
    int r = c->rank, n = c->n;
    float f[2] = {(float)(r + 1), (float)(2 * r)}, g[2];
    TRY(c, accel_allreduce(c->acc, f, g, 2, ACCEL_F32, ACCEL_SUM, NULL));
    EXPECT(c, g[0] == n * (n + 1) / 2 && g[1] == n * (n - 1), "allreduce sum: %g %g", g[0], g[1]);
    TRY(c, accel_allreduce(c->acc, f, g, 2, ACCEL_F32, ACCEL_MAX, NULL));
    EXPECT(c, g[0] == n && g[1] == 2 * (n - 1), "allreduce max: %g %g", g[0], g[1]);
    TRY(c, accel_allreduce(c->acc, f, g, 2, ACCEL_F32, ACCEL_MIN, NULL));
    EXPECT(c, g[0] == 1 && g[1] == 0, "allreduce min: %g %g", g[0], g[1]);
    double d = r, avg;
    TRY(c, accel_allreduce(c->acc, &d, &avg, 1, ACCEL_F64, ACCEL_AVG, NULL));
    EXPECT(c, avg == (n - 1) / 2.0, "allreduce avg: %g", avg);

    int64_t b = 100 + r;
    TRY(c, accel_broadcast(c->acc, &b, &b, 1, ACCEL_I64, n - 1, NULL));
    EXPECT(c, b == 100 + n - 1, "broadcast from process %d: %lld", n - 1, (long long)b);

    size_t count = 2 * (size_t)n + 1, off, chunk;
    int32_t *all = calloc(count, sizeof(int32_t)), *mine = calloc(count, sizeof(int32_t));
    EXPECT(c, all && mine, "out of memory");
    accel_chunk_range(count, n, r, &off, &chunk);
    for (size_t i = 0; i < chunk; i++) {
        mine[i] = (int32_t)(1000 * r + (int)(off + i));
    }
    accel_status st = accel_allgather(c->acc, mine, all, count, ACCEL_I32, NULL);
    int ok = st == ACCEL_OK;
    for (size_t i = 0; ok && i < count; i++) {
        size_t o2, c2;
        int owner = 0;
        for (int q = 0; q < n; q++) {
            accel_chunk_range(count, n, q, &o2, &c2);
            owner = i >= o2 && i < o2 + c2 ? q : owner;
        }
        ok = all[i] == 1000 * owner + (int)i;
    }
    for (size_t i = 0; i < count; i++) {
        all[i] = (int32_t)i + r;
    }
    st = ok ? accel_reduce_scatter(c->acc, all, mine, count, ACCEL_I32, ACCEL_SUM, NULL) : st;
    for (size_t i = 0; ok && st == ACCEL_OK && i < chunk; i++) {
        ok = mine[i] == n * (int)(off + i) + n * (n - 1) / 2;
    }
    free(all);
    free(mine);
    EXPECT(c, st == ACCEL_OK && ok, "allgather / reduce_scatter: %s",
           st == ACCEL_OK ? "wrong values" : accel_last_error(c->acc));

    int64_t v = r, sum = -1, gathered[64];
    TRY(c, accel_reduce_to(c->acc, &v, &sum, 1, ACCEL_I64, ACCEL_SUM, 0, NULL));
    EXPECT(c, r != 0 || sum == (int64_t)n * (n - 1) / 2, "reduce to 0: %lld", (long long)sum);
    if (n <= 64) {
        TRY(c, accel_gather_to(c->acc, &v, gathered, 1, ACCEL_I64, 0, NULL));
        for (int q = 0; r == 0 && q < n; q++) {
            EXPECT(c, gathered[q] == q, "gather_to 0: process %d sent %lld", q,
                   (long long)gathered[q]);
        }
    }
    TRY(c, accel_barrier(c->acc, NULL));

    /* Accelerate's user collectives on tensors and objects. */
    float row[2] = {(float)r, (float)r}, *rows = calloc(2 * (size_t)n, sizeof(float));
    EXPECT(c, rows != NULL, "out of memory");
    accel_tensor in = accel_tensor_view(row, ACCEL_F32, 1, (int64_t[]){2}), out = {.data = rows};
    st = accel_gather(c->acc, &in, &out);
    ok = st == ACCEL_OK && out.shape[0] == 2 * n;
    for (int q = 0; ok && q < 2 * n; q++) {
        ok = rows[q] == (float)(q / 2);
    }
    free(rows);
    EXPECT(c, ok, "gather: %s", st == ACCEL_OK ? "wrong values" : accel_last_error(c->acc));
    float t = (float)r;
    accel_tensor tt = accel_tensor_view(&t, ACCEL_F32, 1, (int64_t[]){1});
    TRY(c, accel_allreduce_tensor(c->acc, &tt, ACCEL_AVG, 2.0));
    EXPECT(c, t == (float)(n - 1), "reduce(mean) * 2: %g", t);
    t = (float)(7 * r);
    TRY(c, accel_broadcast_tensor(c->acc, &tt, n - 1));
    EXPECT(c, t == (float)(7 * (n - 1)), "broadcast(tensor): %g", t);

    char name[32];
    snprintf(name, sizeof(name), "process %d", r);
    accel_blobs *blobs = NULL;
    TRY(c, accel_gather_object(c->acc, name, strlen(name) + 1, &blobs));
    ok = accel_blobs_count(blobs) == n;
    for (int q = 0; ok && q < n; q++) {
        char want[32];
        snprintf(want, sizeof(want), "process %d", q);
        ok = strcmp(accel_blobs_data(blobs, q, NULL), want) == 0;
    }
    accel_blobs_free(blobs);
    EXPECT(c, ok, "gather_object: wrong objects");
    void *obj = (void *)"from 0";
    size_t nbytes = 7;
    TRY(c, accel_broadcast_object(c->acc, &obj, &nbytes, 0));
    ok = nbytes == 7 && strcmp(obj, "from 0") == 0;
    if (r != 0) {
        accel_blob_free(obj);
    }
    EXPECT(c, ok, "broadcast_object: wrong object");

    int64_t max_rows = 0;
    float pad_in[64] = {0}, pad_out[64];
    int my_rows = r % 8 + 1;
    accel_tensor pi = accel_tensor_view(pad_in, ACCEL_F32, 1, (int64_t[]){my_rows});
    accel_tensor po = {.data = pad_out};
    TRY(c, accel_pad_across_processes_size(c->acc, &pi, 0, &max_rows));
    EXPECT(c, max_rows == (n < 8 ? n : 8), "pad_across_processes: %lld rows", (long long)max_rows);
    TRY(c, accel_pad_across_processes(c->acc, &pi, 0, NULL, 0, &po));
    EXPECT(c, po.shape[0] == max_rows, "pad_across_processes: padded to %lld",
           (long long)po.shape[0]);

    size_t start, cnt, total = 0;
    TRY(c, accel_split_between_processes(c->acc, 7, 0, &start, &cnt, NULL));
    int64_t got = (int64_t)cnt;
    TRY(c, accel_allreduce(c->acc, &got, &got, 1, ACCEL_I64, ACCEL_SUM, NULL));
    total = (size_t)got;
    EXPECT(c, total == 7, "split_between_processes: %zu items in all", total);

    if (r == n - 1) {
        TRY(c, accel_set_trigger(c->acc));
    }
    int triggered = 0, again = 1;
    TRY(c, accel_check_trigger(c->acc, &triggered));
    TRY(c, accel_check_trigger(c->acc, &again));
    EXPECT(c, triggered == 1 && again == 0, "set_trigger / check_trigger: %d then %d", triggered,
           again);

    float *shared = NULL;
    TRY(c, accel_alloc_shared(c->acc, 4096, (void **)&shared));
    shared[0] = (float)r;
    TRY(c, accel_allreduce(c->acc, shared, shared, 1024, ACCEL_F32, ACCEL_SUM, NULL));
    float sum0 = shared[0];
    TRY(c, accel_free_shared(c->acc, shared));
    EXPECT(c, sum0 == n * (n - 1) / 2, "allreduce in accel_alloc_shared memory: %g", sum0);
    return 0;
}

static int check_rng(ctx *c)
{
    uint64_t st[ACCEL_RNG_STATE_WORDS], all[ACCEL_RNG_STATE_WORDS * 64];
    if (c->n > 64) {
        return 0;
    }
    for (int specific = 0; specific < 2; specific++) {
        TRY(c, accel_set_seed(c->acc, 42, specific));
        TRY(c, accel_get_rng_state(c->acc, st));
        accel_tensor in = accel_tensor_view(st, ACCEL_I64, 1, (int64_t[]){ACCEL_RNG_STATE_WORDS});
        accel_tensor out = {.data = all};
        TRY(c, accel_gather(c->acc, &in, &out));
        for (int q = 1; q < c->n; q++) {
            int same = memcmp(all, all + q * ACCEL_RNG_STATE_WORDS, sizeof(st)) == 0;
            EXPECT(c, same == !specific,
                   "set_seed(42, device_specific=%d): process %d's "
                   "generator is %s process 0's",
                   specific, q, same ? "the same as" : "not");
        }
    }
    return 0;
}

/* A tensor dataset of `rows` rows of (x[d], y[1]); the caller frees it. */
static accel_dataset *dataset(ctx *c, int rows, int d, float *x, float *y, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < rows; i++) {
        float acc_y = 0.3f;
        for (int k = 0; k < d; k++) {
            x[i * d + k] = uniform(&s);
            acc_y += (float)(k + 1) * 0.5f * x[i * d + k];
        }
        y[i] = acc_y + 0.01f * uniform(&s);
    }
    const char *names[2] = {"x", "y"};
    accel_tensor cols[2] = {accel_tensor_view(x, ACCEL_F32, 2, (int64_t[]){rows, d}),
                            accel_tensor_view(y, ACCEL_F32, 2, (int64_t[]){rows, 1})};
    accel_dataset *ds = NULL;
    if (accel_tensor_dataset_new(&ds, 2, names, cols) != ACCEL_OK) {
        failed(c, "accel_tensor_dataset_new: %s", accel_last_error(NULL));
    }
    return ds;
}

static int check_gather_for_metrics(ctx *c)
{
    int bs = 4, rows = 2 * c->n * bs + 3; /* not a multiple: the last batch is padded */
    float *x = malloc(sizeof(float) * (size_t)rows), *y = malloc(sizeof(float) * (size_t)rows);
    EXPECT(c, x && y, "out of memory");
    for (int i = 0; i < rows; i++) {
        x[i] = (float)i;
        y[i] = 0;
    }
    const char *names[2] = {"i", "y"};
    accel_tensor cols[2] = {accel_tensor_view(x, ACCEL_F32, 1, (int64_t[]){rows}),
                            accel_tensor_view(y, ACCEL_F32, 1, (int64_t[]){rows})};
    accel_dataset *ds = NULL;
    TRY(c, accel_tensor_dataset_new(&ds, 2, names, cols));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = bs;
    accel_loader *dl = NULL;
    int seen = 0, ok = accel_loader_new(c->acc, ds, &lo, &dl) == ACCEL_OK;
    ok = ok && accel_prepare(c->acc, dl) == ACCEL_OK;
    accel_batch *b;
    while (ok && accel_loader_next(dl, &b) == ACCEL_OK) {
        accel_tensor out;
        ok = accel_gather_for_metrics(c->acc, accel_batch_field(b, "i"), &out) == ACCEL_OK;
        for (int64_t k = 0; ok && k < out.shape[0]; k++) {
            ok = ((const float *)out.data)[k] == (float)seen++;
        }
    }
    accel_loader_free(dl);
    accel_dataset_free(ds);
    free(x);
    free(y);
    EXPECT(c, ok && seen == rows, "gathered %d samples, expected each of %d once%s%s", seen, rows,
           ok ? "" : ": ", ok ? "" : accel_last_error(c->acc));
    return 0;
}

typedef struct trainer {
    accel_model *m;
    nn_params *params;
    nn_linear_layer fc;
    accel_optimizer *opt;
    accel_scheduler *sch;
    accel_loader *dl;
    accel_dataset *ds;
} trainer;

#define D_IN 3

static int build(ctx *c, trainer *t, int rows, float *x, float *y, int adam, int shuffle)
{
    memset(t, 0, sizeof(*t));
    if ((t->ds = dataset(c, rows, D_IN, x, y, 11)) == NULL) {
        return -1;
    }
    TRY(c, accel_model_new(c->acc, &t->m));
    /* the checks read the weights on the host: the model stays there */
    TRY(c, accel_model_set_device(t->m, (accel_device){ACCEL_DEVICE_CPU, 0}));
    TRY(c, nn_params_for_model(&t->params, t->m));
    TRY(c, nn_linear_declare(&t->fc, t->params, "fc", D_IN, 1, 1, NN_LAYOUT_OUT_IN));
    TRY(c, nn_params_bind(t->params));
    TRY(c, nn_params_init(t->params, 5));
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = 0.1;
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 1e-2;
    t->opt = adam ? accel_adamw(c->acc, t->m, &ao) : accel_sgd(c->acc, t->m, &so);
    EXPECT(c, t->opt != NULL, "optimizer: %s", accel_last_error(c->acc));
    t->sch = accel_linear_schedule(c->acc, t->opt, 0, 1000);
    EXPECT(c, t->sch != NULL, "scheduler: %s", accel_last_error(c->acc));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 4;
    lo.shuffle = shuffle;
    TRY(c, accel_loader_new(c->acc, t->ds, &lo, &t->dl));
    TRY(c, accel_prepare(c->acc, t->m, t->opt, t->sch, t->dl));
    return 0;
}

static void destroy(ctx *c, trainer *t)
{
    accel_free_memory(c->acc);
    nn_params_free(t->params);
    accel_dataset_free(t->ds);
}

/* Trains `steps` optimizer steps (accumulating); the loader wraps around at its end. */
static int train(ctx *c, trainer *t, nn_ctx *g, int steps)
{
    for (int done = 0; done < steps;) {
        accel_batch *b;
        accel_status st = accel_loader_next(t->dl, &b);
        if (st == ACCEL_EOF) {
            continue;
        }
        TRY(c, st);
        const accel_tensor *x = accel_batch_field(b, "x"), *y = accel_batch_field(b, "y");
        TRY(c, accel_accumulate(c->acc, t->m));
        nn_tensor *pred = nn_linear_forward(g, &t->fc, nn_tensor_from(g, x->data, 2, x->shape));
        nn_tensor *loss =
            nn_mse_loss(g, pred, nn_tensor_from(g, y->data, 2, y->shape), NN_REDUCTION_MEAN);
        EXPECT(c, loss != NULL, "forward: %s", accel_last_error(NULL));
        TRY(c, accel_backward(c->acc, loss));
        nn_ctx_reset(g);
        if (accel_sync_gradients(c->acc)) {
            TRY(c, accel_optimizer_step(t->opt));
            TRY(c, accel_scheduler_step(t->sch));
            TRY(c, accel_optimizer_zero_grad(t->opt));
            done++;
        }
    }
    return 0;
}

/* Every process holds the same weights, bit for bit. */
static int same_everywhere(ctx *c, accel_model *m, const char *what)
{
    float w[D_IN + 1];
    memcpy(w, accel_model_master(m), sizeof(w));
    TRY(c, accel_broadcast(c->acc, w, w, D_IN + 1, ACCEL_F32, 0, NULL));
    EXPECT(c, memcmp(w, accel_model_master(m), sizeof(w)) == 0,
           "%s: this process's weights differ from process 0's", what);
    return 0;
}

/* SGD with accumulation k over the unshuffled loader against the same steps computed here:
 * optimizer step s sees global batches [k*n*s, k*n*(s+1)) (batch j on process j % n), and its
 * gradient is the mean over their samples of d/dw (w.x + b - y)^2. */
static int check_training(ctx *c)
{
    int k = accel_gradient_accumulation_steps(c->acc), bs = 4, steps = 4, skipped = 0;
    int rows = k * c->n * bs * steps;
    float *x = malloc(sizeof(float) * (size_t)rows * D_IN),
          *y = malloc(sizeof(float) * (size_t)rows);
    EXPECT(c, x && y, "out of memory");
    trainer t;
    nn_ctx *g = NULL;
    int rc = build(c, &t, rows, x, y, 0, 0);
    if (rc == 0 && nn_ctx_new(&g) != ACCEL_OK) {
        rc = failed(c, "nn_ctx_new: %s", accel_last_error(NULL));
    }
    double ref[D_IN + 1], start[D_IN + 1]; /* weights then bias, from the prepared start */
    int iw = accel_model_find(t.m, "fc.weight"), ib = accel_model_find(t.m, "fc.bias");
    for (int j = 0; rc == 0 && j <= D_IN; j++) {
        const accel_param *p = accel_model_param(t.m, j < D_IN ? iw : ib);
        ref[j] = start[j] = accel_model_master(t.m)[p->offset + (j < D_IN ? (size_t)j : 0)];
    }
    for (int s = 0; rc == 0 && s < steps; s++) {
        double grad[D_IN + 1] = {0}, lr = accel_scheduler_get_last_lr(t.sch, 0);
        int first = s * k * c->n * bs, count = k * c->n * bs;
        for (int i = first; i < first + count; i++) {
            double e = ref[D_IN] - y[i];
            for (int j = 0; j < D_IN; j++) {
                e += ref[j] * x[i * D_IN + j];
            }
            for (int j = 0; j < D_IN; j++) {
                grad[j] += 2.0 * e * x[i * D_IN + j] / count;
            }
            grad[D_IN] += 2.0 * e / count;
        }
        rc = train(c, &t, g, 1);
        /* fp16's loss scaler skips a step whose gradients overflowed (the first, at 65536). */
        skipped += rc == 0 && accel_optimizer_step_was_skipped(c->acc);
        for (int j = 0; rc == 0 && !accel_optimizer_step_was_skipped(c->acc) && j <= D_IN; j++) {
            ref[j] -= lr * grad[j];
        }
    }
    if (rc == 0) {
        rc = same_everywhere(c, t.m, "training");
    }
    /* fp32 differs from the reference by summation order only; bf16 / fp16 by their rounding
     * of the weights and activations. */
    accel_precision p = accel_mixed_precision(c->acc);
    double tol = p == ACCEL_PRECISION_BF16 ? 2e-2 : p == ACCEL_PRECISION_FP16 ? 5e-3 : 1e-5;
    double moved = 0.0;
    for (int j = 0; j <= D_IN; j++) {
        moved = fmax(moved, fabs(ref[j] - start[j]) / (1.0 + fabs(ref[j])));
    }
    if (rc == 0 && moved < 10 * tol) { /* else the comparison below could not see an error */
        rc = failed(c, "the reference weights moved by %.3g only (tolerance %.3g)", moved, tol);
    }
    for (int j = 0; rc == 0 && j <= D_IN; j++) {
        const accel_param *pp = accel_model_param(t.m, j < D_IN ? iw : ib);
        double got = accel_model_master(t.m)[pp->offset + (j < D_IN ? (size_t)j : 0)];
        if (fabs(got - ref[j]) > tol * (1.0 + fabs(ref[j]))) {
            rc = failed(c,
                        "after %d steps (accumulation %d, precision %s) weight %d is %.7g, "
                        "the reference %.7g",
                        steps, k, accel_precision_name(p), j, got, ref[j]);
        }
    }
    if (rc == 0 && c->rank == 0) {
        printf("  %d optimizer steps (%d skipped by the fp16 loss scaler), accumulation %d, "
               "precision %s: weights match the reference\n",
               steps, skipped, k, accel_precision_name(p));
    }
    nn_ctx_free(g);
    destroy(c, &t);
    free(x);
    free(y);
    return rc;
}

/* AdamW, a shuffled loader and a schedule: save, train on (A), load, train the same steps (B):
 * A and B must be identical bit for bit. The folder is process 0's temporary one. */
static int check_checkpoint(ctx *c)
{
    char tmpl[] = "/tmp/accel-test-XXXXXX";
    void *dir = NULL;
    size_t nbytes = 0;
    if (c->rank == 0) {
        dir = mkdtemp(tmpl);
        nbytes = dir ? strlen(tmpl) + 1 : 1;
        dir = dir ? dir : (void *)"";
    }
    TRY(c, accel_broadcast_object(c->acc, &dir, &nbytes, 0));
    EXPECT(c, ((char *)dir)[0] != '\0', "process 0 could not create a folder in /tmp");
    int rows = 40 * c->n;
    float *x = malloc(sizeof(float) * (size_t)rows * D_IN),
          *y = malloc(sizeof(float) * (size_t)rows);
    trainer t;
    nn_ctx *g = NULL;
    float a[D_IN + 1];
    int rc = x && y ? build(c, &t, rows, x, y, 1, 1) : failed(c, "out of memory");
    rc = rc == 0 && nn_ctx_new(&g) != ACCEL_OK ? failed(c, "nn_ctx_new") : rc;
    rc = rc == 0 ? train(c, &t, g, 4) : rc;
    if (rc == 0 && accel_save_state(c->acc, dir) != ACCEL_OK) {
        rc = failed(c, "accel_save_state: %s", accel_last_error(c->acc));
    }
    rc = rc == 0 ? train(c, &t, g, 5) : rc;
    if (rc == 0) {
        memcpy(a, accel_model_master(t.m), sizeof(a));
        if (accel_load_state(c->acc, dir) != ACCEL_OK) {
            rc = failed(c, "accel_load_state: %s", accel_last_error(c->acc));
        }
    }
    rc = rc == 0 ? train(c, &t, g, 5) : rc;
    if (rc == 0 && memcmp(a, accel_model_master(t.m), sizeof(a)) != 0) {
        rc = failed(c, "5 steps after the resume differ from the same 5 steps before it");
    }
    rc = rc == 0 ? same_everywhere(c, t.m, "checkpoint") : rc;
    nn_ctx_free(g);
    if (x && y) {
        destroy(c, &t);
    }
    free(x);
    free(y);
    accel_barrier(c->acc, NULL);
    if (c->rank == 0) {
        accel__rmtree(dir);
    } else {
        accel_blob_free(dir);
    }
    return rc;
}

static const struct check {
    const char *name, *title;
    int (*run)(ctx *c);
} checks[] = {
    {"init", "initialisation", check_init},
    {"collectives", "every collective", check_collectives},
    {"rng", "random number generator synchronisation", check_rng},
    {"gather_for_metrics", "data loader sharding and gather_for_metrics", check_gather_for_metrics},
    {"training", "training with gradient accumulation in the configured precision", check_training},
    {"checkpoint", "checkpoint and exact resume", check_checkpoint},
};

/* The processes agree on the check's outcome; the main process reports a failure. Returns 0
 * when every process passed. */
static int agree(ctx *c, const struct check *k)
{
    accel_blobs *whys = NULL;
    if (accel_gather_object(c->acc, c->why, strlen(c->why) + 1, &whys) != ACCEL_OK) {
        fprintf(stderr, "accel test: check '%s': the processes could not agree: %s\n", k->name,
                accel_last_error(c->acc));
        exit(1);
    }
    char line[2048] = "";
    size_t len = 0;
    for (int q = 0; q < c->n; q++) {
        const char *w = accel_blobs_data(whys, q, NULL);
        if (w[0] != '\0' && len + 1 < sizeof(line)) {
            len += (size_t)snprintf(line + len, sizeof(line) - len, "%sprocess %d: %s",
                                    len ? "; " : "", q, w);
        }
    }
    accel_blobs_free(whys);
    if (line[0] == '\0') {
        if (c->rank == 0) {
            printf("check %-20s ok (%s)\n", k->name, k->title);
            fflush(stdout);
        }
        return 0;
    }
    if (c->rank == 0) {
        char msg[2300];
        snprintf(msg, sizeof(msg), "check '%s' (%s) failed on %s", k->name, k->title, line);
        fprintf(stderr, "accel test: %s\n", msg);
        const char *report = getenv("ACCEL_TEST_REPORT");
        FILE *f = report ? fopen(report, "w") : NULL;
        if (f != NULL) {
            fprintf(f, "%s\n", msg);
            fclose(f);
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "usage: %s (run by accel test through accel launch; no arguments)\n",
                argv[0]);
        return 2;
    }
    /* Accumulation 2 unless accel launch passed the configured one. */
    setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "2", 0);
    ctx c = {0};
    if (accel_init(&c.acc, NULL) != ACCEL_OK) {
        fprintf(stderr, "accel test: check 'init' failed: %s\n", accel_last_error(NULL));
        return 1;
    }
    c.rank = accel_process_index(c.acc);
    c.n = accel_num_processes(c.acc);
    const char *fail = getenv("ACCEL_TEST_FAIL_CHECK");
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        c.why[0] = '\0';
        checks[i].run(&c);
        if (fail != NULL && strcmp(fail, checks[i].name) == 0 && c.rank == c.n - 1) {
            failed(&c, "failing on purpose (ACCEL_TEST_FAIL_CHECK=%s)", fail);
        }
        if (agree(&c, &checks[i]) != 0) {
            int main_process = c.rank == 0;
            accel_free(c.acc);
            return main_process ? 1 : 0;
        }
    }
    if (c.rank == 0) {
        printf("every check passed on %d process%s\n", c.n, c.n > 1 ? "es" : "");
    }
    accel_free(c.acc);
    return 0;
}
