/* ACCEL_TEST_NPROCS: 3
 *
 * join_uneven_inputs: processes 0, 1, 2 hold 5, 3 and 0 batches. Inside the join region the
 * finished processes answer the others' all-reduces with zeros, nobody hangs, and the weights
 * every process ends with equal a hand computation of DDP's Join: gradients divided by the
 * initial number of processes (or, second run, by the processes still training), then process
 * 0's weights (the last to join) broadcast to all.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define DIM 4
static const int n_batches[3] = {5, 3, 0};
static const double LR = 0.1;

static void batch(int rank, int r, double *x, double *t)
{
    for (int d = 0; d < DIM; d++) {
        x[d] = 0.1 * (rank + 1) + 0.05 * r - 0.2 * d;
    }
    *t = 1.0 + rank - 0.5 * r;
}

/* d/dw of 0.5 (w.x + b - t)^2 into g[0..DIM) and g[DIM] (bias). */
static void grad(const double *w, int rank, int r, double *g)
{
    double x[DIM], t, y = w[DIM];
    batch(rank, r, x, &t);
    for (int d = 0; d < DIM; d++) {
        y += w[d] * x[d];
    }
    for (int d = 0; d < DIM; d++) {
        g[d] = (y - t) * x[d];
    }
    g[DIM] = y - t;
}

static void run(accel *acc, int divide_initial)
{
    int rank = accel_process_index(acc);
    CHECK(accel_num_processes(acc) == 3);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){DIM}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "b", 1, (int64_t[]){1}, NULL));
    const accel_param *pw = accel_model_param(m, 0), *pb = accel_model_param(m, 1);
    for (int d = 0; d < DIM; d++) {
        pw->data[d] = 0.25f * (float)d - 0.3f;
    }
    pb->data[0] = 0.5f;
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    accel_optimizer *opt = accel_sgd(acc, m, &so);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));

    /* Hand computation of the whole job, identical on every process. */
    double ref[DIM + 1];
    for (int d = 0; d < DIM; d++) {
        ref[d] = 0.25f * (float)d - 0.3f;
    }
    ref[DIM] = 0.5;
    for (int r = 0; r < 5; r++) {
        double G[DIM + 1] = {0}, g[DIM + 1];
        int active = 0;
        for (int p = 0; p < 3; p++) {
            if (r < n_batches[p]) {
                grad(ref, p, r, g);
                for (int i = 0; i <= DIM; i++) {
                    G[i] += g[i];
                }
                active++;
            }
        }
        for (int i = 0; i <= DIM; i++) {
            ref[i] -= LR * G[i] / (divide_initial ? 3 : active);
        }
    }

    CHECK_OK(acc, accel_join_begin(acc, m, divide_initial));
    for (int r = 0; r < n_batches[rank]; r++) {
        double w[DIM + 1], g[DIM + 1];
        for (int d = 0; d < DIM; d++) {
            w[d] = pw->data[d];
        }
        w[DIM] = pb->data[0];
        CHECK_OK(acc, accel_accumulate(acc, m));
        double seed = accel_backward_begin(acc);
        grad(w, rank, r, g);
        for (int d = 0; d < DIM; d++) {
            pw->grad[d] += (float)(seed * g[d]);
        }
        pb->grad[0] += (float)(seed * g[DIM]);
        CHECK_OK(acc, accel_grad_ready(m, 1));
        CHECK_OK(acc, accel_grad_ready(m, 0));
        CHECK_OK(acc, accel_backward_end(acc));
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
    }
    CHECK_OK(acc, accel_join_end(acc, m));
    for (int d = 0; d < DIM; d++) {
        CHECK_MSG(fabs(pw->data[d] - ref[d]) <= 1e-5 * (fabs(ref[d]) + 1e-2),
                  "rank %d divide_initial %d: w[%d] = %.9g, want %.9g", rank, divide_initial, d,
                  pw->data[d], ref[d]);
    }
    CHECK_NEAR(pb->data[0], ref[DIM], 1e-5 * (fabs(ref[DIM]) + 1e-2));
    CHECK(accel_join_end(acc, m) == ACCEL_ESTATE);
    accel_free_memory(acc);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    if (accel_num_processes(acc) != 3) {
        fprintf(stderr, "test_join needs 3 processes\n");
        accel_free(acc);
        return 77;
    }
    run(acc, 1);
    run(acc, 0);
    accel_print(acc, "test_join: ok\n");
    accel_free(acc);
    return 0;
}
