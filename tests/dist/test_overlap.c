/* ACCEL_TEST_NPROCS: 2 3
 *
 * Overlap: a backward that marks one parameter ready every 25 ms shows, from the recorded
 * timestamps, the first bucket's all-reduce launched (and completed) before the last gradient
 * is ready, while with overlap_comm off nothing is launched before accel_backward_end. The
 * averaged gradients are checked in both modes. Ordering only, no speed is asserted; a run
 * where the machine was too busy to complete bucket 0 within the backward is retried.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/internal.h"

#define NPARAM 4
#define COUNT 4096 /* 16 KiB per parameter: one bucket each */

static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* One backward; returns the time just before the last accel_grad_ready. */
static double backward(accel *acc, accel_model *m, int rank)
{
    double seed = accel_backward_begin(acc);
    double t_last = 0;
    for (int p = NPARAM - 1; p >= 0; p--) {
        const accel_param *pp = accel_model_param(m, p);
        sleep_ms(25); /* "computing" this gradient */
        for (int i = 0; i < COUNT; i++) {
            pp->grad[i] += (float)(seed * (rank + 1) * (p + 1));
        }
        if (p == 0) {
            t_last = accel__now();
        }
        CHECK_OK(acc, accel_grad_ready(m, p));
    }
    CHECK_OK(acc, accel_backward_end(acc));
    return t_last;
}

static void check_grads(accel_model *m, int n)
{
    double mean_rank = (n + 1) / 2.0; /* mean of rank + 1 */
    for (int p = 0; p < NPARAM; p++) {
        const accel_param *pp = accel_model_param(m, p);
        CHECK_NEAR(pp->grad[0], mean_rank * (p + 1), 1e-5);
        CHECK_NEAR(pp->grad[COUNT - 1], mean_rank * (p + 1), 1e-5);
        memset(pp->grad, 0, COUNT * sizeof(float));
    }
}

static void run(int overlap)
{
    accel_options o = accel_options_default();
    o.first_bucket_mb = 16384.0 / 1048576.0;
    o.bucket_cap_mb = 16384.0 / 1048576.0;
    o.overlap_comm = overlap;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    for (int p = 0; p < NPARAM; p++) {
        char name[32];
        snprintf(name, sizeof(name), "layers.%d.weight", p);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, (int64_t[]){COUNT}, NULL));
    }
    CHECK_OK(acc, accel_prepare(acc, m));
    CHECK(accel_model_num_buckets(m) == NPARAM);
    int ok = 0;
    for (int attempt = 0; attempt < 5 && !ok; attempt++) {
        CHECK_OK(acc, accel_wait_for_everyone(acc));
        double t_last = backward(acc, m, rank);
        check_grads(m, n);
        accel_bucket_info b0, bl;
        CHECK_OK(acc, accel_model_bucket_info(m, 0, &b0));
        CHECK_OK(acc, accel_model_bucket_info(m, NPARAM - 1, &bl));
        CHECK(b0.launch_time > 0 && b0.done_time >= b0.launch_time);
        if (!overlap) {
            /* Everything goes out at accel_backward_end, after the last gradient. */
            CHECK(b0.launch_time > t_last);
            ok = 1;
        } else {
            CHECK_MSG(b0.launch_time < t_last, "bucket 0 launched %.3f ms after the last grad",
                      (b0.launch_time - t_last) * 1e3);
            CHECK(bl.launch_time >= t_last);
            /* Completed while backward still ran: agree on it across processes. */
            int32_t done = b0.done_time < t_last;
            CHECK_OK(acc, accel_allreduce(acc, &done, &done, 1, ACCEL_I32, ACCEL_MIN, NULL));
            ok = done;
            if (rank == 0 && ok) {
                printf("bucket 0: launched %.1f ms and done %.1f ms before the last grad_ready\n",
                       (t_last - b0.launch_time) * 1e3, (t_last - b0.done_time) * 1e3);
            }
        }
    }
    CHECK_MSG(ok, "bucket 0 never completed before the end of backward in 5 attempts");
    accel_free(acc);
}

int main(void)
{
    run(1);
    run(0);
    return 0;
}
