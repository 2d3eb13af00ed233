/*
 * Processes out of step (issue 11, item 2): one process's loader is a batch ahead of the
 * others' (accel_loader_skip_first_batches on process 1 only; before checkpoints carried
 * checksums, a same-size edit of one process's loader position did the same, and the run ended
 * with status OK and a NaN loss). That process finishes the epoch a step early and waits for
 * everyone while the others all-reduce gradients: the first diverging collective must fail with
 * "collective mismatch" on every process, and the epoch must never end with status OK on all of
 * them (they trained on garbage before).
 *
 * ACCEL_TEST_NPROCS: 2
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/data.h"
#include "check.h"

#define ROWS 24
#define D 8

static float xs[ROWS * D];

typedef struct run {
    accel_model *m;
    accel_optimizer *opt;
    accel_loader *dl;
    accel_dataset *ds;
} run;

static void build(accel *acc, run *r)
{
    CHECK_OK(acc, accel_model_new(acc, &r->m));
    CHECK_OK(acc, accel_model_add_param(r->m, "w", 1, (int64_t[]){D}, NULL));
    CHECK_OK(acc, accel_model_alloc(r->m));
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = 0.1;
    CHECK((r->opt = accel_sgd(acc, r->m, &so)) != NULL);
    const char *names[1] = {"x"};
    accel_tensor t = accel_tensor_view(xs, ACCEL_F32, 2, (int64_t[]){ROWS, D});
    CHECK_OK(acc, accel_tensor_dataset_new(&r->ds, 1, names, &t));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 2;
    CHECK_OK(acc, accel_loader_new(acc, r->ds, &lo, &r->dl));
    CHECK_OK(acc, accel_prepare(acc, r->m, r->opt, r->dl));
}

static void destroy(accel *acc, run *r)
{
    accel_free_memory(acc);
    accel_dataset_free(r->ds);
    memset(r, 0, sizeof(*r));
}

/* One step: the gradient is the batch mean (all-reduced in backward_end). */
static accel_status step(accel *acc, run *r, const accel_batch *b)
{
    const float *x = accel_batch_field(b, "x")->data;
    accel_status st = accel_accumulate(acc, r->m);
    if (st != ACCEL_OK) {
        return st;
    }
    accel_backward_begin(acc);
    float *g = accel_model_param(r->m, 0)->grad;
    for (int64_t i = 0; i < b->rows; i++) {
        for (int k = 0; k < D; k++) {
            g[k] += x[i * D + k] / (float)b->rows;
        }
    }
    if ((st = accel_backward_end(acc)) != ACCEL_OK ||
        (st = accel_optimizer_step(r->opt)) != ACCEL_OK) {
        return st;
    }
    return accel_optimizer_zero_grad(r->opt);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int rank = accel_process_index(acc);
    CHECK(accel_num_processes(acc) == 2);
    for (int i = 0; i < ROWS * D; i++) {
        xs[i] = (float)(i % 11) * 0.25f;
    }
    run r;
    build(acc, &r);
    if (rank == 1) {
        CHECK_OK(acc, accel_loader_skip_first_batches(r.dl, 1));
    }
    accel_batch *b;
    accel_status st;
    int steps = 0;
    while ((st = accel_loader_next(r.dl, &b)) == ACCEL_OK && (st = step(acc, &r, b)) == ACCEL_OK) {
        steps++;
    }
    if (st == ACCEL_EOF) {
        st = accel_wait_for_everyone(acc);
    }
    const char *msg = accel_last_error(acc);
    CHECK_MSG(st != ACCEL_OK, "rank %d: the processes went out of step and nobody noticed", rank);
    CHECK_MSG(st == ACCEL_EINVAL &&
                  strstr(msg, "collective mismatch: rank 0 called allreduce(count=8, f32, avg) #"),
              "rank %d: after %d steps: %s: %s", rank, steps, accel_status_name(st), msg);
    CHECK_MSG(strstr(msg, ", rank 1 called barrier() #") != NULL, "rank %d: %s", rank, msg);
    printf("rank %d: out of step after %d steps: %s\n", rank, steps, msg);
    destroy(acc, &r);
    accel_free(acc);
    return 0;
}
