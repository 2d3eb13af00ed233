/*
 * Process state and process control on 1-3 processes: index/count queries and the summary
 * string, wait_for_everyone ordering, main/local-main-process-first (checked through a file the
 * leader writes inside its region), and the run-on-process helpers.
 * ACCEL_TEST_NPROCS: 1 2 3
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"

static int R, N;

/* A file shared by the processes of this job only: `accel launch` gives each launch a unique
 * ACCEL_JOB_ID; a lone process run by hand uses its pid. */
static void job_path(char *buf, size_t nbytes, const char *what)
{
    const char *dir = getenv("TMPDIR");
    const char *job = getenv("ACCEL_JOB_ID");
    char pid[32];
    if (job == NULL || *job == '\0') {
        snprintf(pid, sizeof pid, "%ld", (long)getpid());
        job = pid;
    }
    snprintf(buf, nbytes, "%s/accel_test_pc_%s_%s", dir && *dir ? dir : "/tmp", job, what);
}

static void test_state(accel *acc)
{
    CHECK(N >= 1 && R >= 0 && R < N);
    const char *ws = getenv("WORLD_SIZE");
    if (ws != NULL) {
        CHECK(atoi(ws) == N);
        CHECK(atoi(getenv("RANK")) == R);
    }
    /* One machine: local == global. */
    CHECK(accel_local_process_index(acc) == R);
    CHECK(accel_local_num_processes(acc) == N);
    CHECK(accel_is_main_process(acc) == (R == 0));
    CHECK(accel_is_local_main_process(acc) == (R == 0));
    CHECK(accel_is_last_process(acc) == (R == N - 1));
    CHECK(accel_use_distributed(acc) == (N > 1));
    /* Accelerate's rule: a launched process (LOCAL_RANK set) is MULTI_CPU even when alone;
     * use_distributed still needs more than one process. */
    int launched = getenv("LOCAL_RANK") != NULL;
    accel_distributed_type dt = accel_distributed_type_of(acc);
    CHECK(dt == (launched ? ACCEL_DIST_MULTI_CPU : ACCEL_DIST_NO));
    CHECK(strcmp(accel_distributed_type_name(dt), launched ? "MULTI_CPU" : "NO") == 0);
    CHECK(strcmp(accel_device_name(acc), "cpu") == 0);

    const char *s = accel_state_summary(acc);
    char want[64];
    CHECK(
        strstr(s, launched ? "Distributed environment: MULTI_CPU" : "Distributed environment: NO"));
    snprintf(want, sizeof want, "Num processes: %d\n", N);
    CHECK_MSG(strstr(s, want) != NULL, "summary:\n%s", s);
    snprintf(want, sizeof want, "Process index: %d\n", R);
    CHECK_MSG(strstr(s, want) != NULL, "summary:\n%s", s);
    snprintf(want, sizeof want, "Local process index: %d\n", R);
    CHECK_MSG(strstr(s, want) != NULL, "summary:\n%s", s);
    CHECK(strstr(s, "Device: cpu") != NULL);
    CHECK(strstr(s, "Mixed precision type: no") != NULL);
}

/* Each process appends its index in turn, one turn per barrier: the file then reads 0..N-1
 * only if nobody ran ahead of a barrier. */
static void test_wait_for_everyone(accel *acc)
{
    char path[256];
    job_path(path, sizeof path, "turns");
    if (R == 0) {
        remove(path);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    for (int turn = 0; turn < N; turn++) {
        if (turn == R) {
            usleep(20000); /* a late writer would be overtaken without the barrier */
            FILE *f = fopen(path, "a");
            CHECK(f != NULL);
            fprintf(f, "%d\n", R);
            fclose(f);
        }
        CHECK_OK(acc, accel_wait_for_everyone(acc));
    }
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    for (int i = 0; i < N; i++) {
        int v = -1;
        CHECK(fscanf(f, "%d", &v) == 1 && v == i);
    }
    fclose(f);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (R == 0) {
        remove(path);
    }
}

/* The leader writes a file inside its region after a pause; followers must find it complete
 * as soon as they enter theirs. */
static void test_first(accel *acc, int local)
{
    char path[256];
    job_path(path, sizeof path, local ? "local_first" : "main_first");
    int leader = local ? accel_is_local_main_process(acc) : accel_is_main_process(acc);
    if (leader) {
        remove(path); /* the followers are held in _begin until we leave the region */
    }
    CHECK_OK(acc, local ? accel_local_main_process_first_begin(acc)
                        : accel_main_process_first_begin(acc));
    if (leader) {
        usleep(100000);
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        fprintf(f, "written by the leader\n");
        fclose(f);
    } else {
        FILE *f = fopen(path, "r");
        CHECK_MSG(f != NULL, "process %d entered before the leader wrote %s", R, path);
        char line[64] = "";
        CHECK(fgets(line, sizeof line, f) != NULL);
        CHECK(strcmp(line, "written by the leader\n") == 0);
        fclose(f);
    }
    CHECK_OK(acc,
             local ? accel_local_main_process_first_end(acc) : accel_main_process_first_end(acc));
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (leader) {
        remove(path);
    }
}

static accel_status count_call(void *ctx)
{
    (*(int *)ctx)++;
    return ACCEL_OK;
}

static accel_status fail_call(void *ctx)
{
    (void)ctx;
    return ACCEL_EIO;
}

static void test_on_helpers(accel *acc)
{
    int n = 0;
    CHECK_OK(acc, accel_on_main_process(acc, count_call, &n));
    CHECK(n == (R == 0));
    n = 0;
    CHECK_OK(acc, accel_on_local_main_process(acc, count_call, &n));
    CHECK(n == (R == 0));
    n = 0;
    CHECK_OK(acc, accel_on_last_process(acc, count_call, &n));
    CHECK(n == (R == N - 1));
    for (int p = 0; p < N; p++) {
        n = 0;
        CHECK_OK(acc, accel_on_process(acc, p, count_call, &n));
        CHECK(n == (R == p));
        n = 0;
        CHECK_OK(acc, accel_on_local_process(acc, p, count_call, &n));
        CHECK(n == (R == p));
    }
    /* fn's status comes back on the chosen process only. */
    accel_status st = accel_on_last_process(acc, fail_call, NULL);
    CHECK(st == (R == N - 1 ? ACCEL_EIO : ACCEL_OK));
    CHECK(accel_on_process(acc, 0, NULL, NULL) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "fn") != NULL);
}

int main(void)
{
    accel *acc;
    if (accel_init(&acc, NULL) != ACCEL_OK) {
        fprintf(stderr, "accel_init: %s\n", accel_last_error(NULL));
        return 1;
    }
    R = accel_process_index(acc);
    N = accel_num_processes(acc);
    test_state(acc);
    test_wait_for_everyone(acc);
    test_first(acc, 0);
    test_first(acc, 1);
    test_on_helpers(acc);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_free(acc);
    printf("test_process_control: process %d of %d ok\n", R, N);
    return 0;
}
