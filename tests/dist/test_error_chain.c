/* ACCEL_TEST_NPROCS: 2
 *
 * A collective failure reported through the layers that wrap it, exact text: process 1 stays
 * away (sleeps past the 1 s timeout) while process 0 runs a backward whose gradient buckets
 * are all-reduced on the communication thread. Process 0's accel_backward_end must say what
 * failed and, inside, the communicator's message naming process 1 and its pid, whole: the
 * wrapping message is formatted from the previous one (issue 11, item 3), and every later call
 * repeats the same failure.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

int main(void)
{
    accel_options o = accel_options_default();
    o.timeout_s = 1;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK(accel_num_processes(acc) == 2);
    int rank = accel_process_index(acc);
    int32_t pid = (int32_t)getpid(), pids[2];
    CHECK_OK(acc, accel_allgather(acc, &pid, pids, 2, ACCEL_I32, NULL));

    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 2, (int64_t[]){64, 64}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "b", 1, (int64_t[]){64}, NULL));
    CHECK_OK(acc, accel_prepare(acc, m));
    CHECK_OK(acc, accel_wait_for_everyone(acc));

    if (rank == 1) {
        sleep(3); /* stuck: process 0 gives up after 1 s */
        accel_free(acc);
        return 0;
    }
    (void)accel_backward_begin(acc);
    for (int i = 0; i < 2; i++) {
        (void)accel_grad_ready(m, i); /* launches the bucket when complete */
    }
    char want[1024];
    snprintf(want, sizeof want,
             "accel_backward_end: gradient all-reduce failed: allreduce: process 0 timed out "
             "after 1 s waiting for process 1 (pid %d) (stopped, hung, or calling a different "
             "collective)",
             (int)pids[1]);
    CHECK_ERR(acc, accel_backward_end(acc), ACCEL_ETIMEDOUT, want);
    CHECK_ERR(NULL, ACCEL_ETIMEDOUT, ACCEL_ETIMEDOUT, want);
    /* The communicator is broken: the next collective repeats the cause, unwrapped. */
    CHECK_ERR(acc, accel_wait_for_everyone(acc), ACCEL_ETIMEDOUT,
              want + strlen("accel_backward_end: gradient all-reduce failed: "));
    accel_free(acc);
    printf("test_error_chain: ok\n");
    return 0;
}
