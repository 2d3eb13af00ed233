/*
 * hello: the smallest tour of accel's process state and collectives.
 *
 *     accel launch --num_processes 2 build/examples/hello
 *
 * Every process prints its state in turn, then the processes sum a number, collect each
 * other's hostname and pid, and split 10 work items between themselves. No options.
 */
#define _DEFAULT_SOURCE /* gethostname under -std=c11 */

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <accel/accel.h>

#include "args.h"

int main(int argc, char **argv)
{
    int status = args_parse("hello",
                            "usage: hello (no options; run it under accel launch for more "
                            "processes)\n",
                            NULL, 0, argc, argv);
    if (status != ARGS_GO_ON) {
        return status;
    }
    accel *acc = NULL;
    ACCEL_CHECK(accel_init(&acc, NULL));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);

    /* 1. Each process describes itself, one at a time (a barrier between turns). */
    for (int turn = 0; turn < n; turn++) {
        if (turn == rank) {
            printf("--- process %d ---\n%s", rank, accel_state_summary(acc));
            fflush(stdout);
        }
        ACCEL_CHECK(accel_wait_for_everyone(acc));
    }

    /* 2. All-reduce: the sum of (rank + 1) over all processes, on every process. */
    double x = rank + 1;
    ACCEL_CHECK(accel_allreduce(acc, &x, &x, 1, ACCEL_F64, ACCEL_SUM, NULL));
    accel_print(acc, "allreduce: sum of rank+1 over %d processes = %g\n", n, x);

    /* 3. gather_object: variable-length strings from everyone, on everyone. */
    char host[64] = "?", me[128];
    gethostname(host, sizeof host - 1);
    int len = snprintf(me, sizeof me, "process %d: %s pid %ld", rank, host, (long)getpid());
    accel_blobs *all = NULL;
    ACCEL_CHECK(accel_gather_object(acc, me, (size_t)len + 1, &all));
    for (int i = 0; i < accel_blobs_count(all); i++) {
        accel_print(acc, "gather_object: %s\n", (const char *)accel_blobs_data(all, i, NULL));
    }
    accel_blobs_free(all);

    /* 4. split_between_processes: which of 10 items is mine? Gathered so the main process can
     *    show everyone's share. */
    size_t share[2];
    ACCEL_CHECK(accel_split_between_processes(acc, 10, 0, &share[0], &share[1], NULL));
    int64_t mine[2] = {(int64_t)share[0], (int64_t)share[1]}, two = 2;
    int64_t *every = malloc(sizeof mine * (size_t)n); /* gather output: n times the input */
    accel_tensor t = accel_tensor_view(mine, ACCEL_I64, 1, &two), out = {.data = every};
    ACCEL_CHECK(every ? accel_gather(acc, &t, &out) : ACCEL_ENOMEM);
    for (int i = 0; i < n; i++) {
        accel_print(acc, "split_between_processes: process %d gets items [%d, %d)\n", i,
                    (int)every[2 * i], (int)(every[2 * i] + every[2 * i + 1]));
    }
    free(every);

    accel_free(acc);
    return 0;
}
