/*
 * Mismatched collectives (issue 11, item 2): when the last process calls another collective,
 * or the same one with another count, dtype, reduce op or root (small and large messages, an
 * allocation against a collective, count 0 against count 3), every process fails with
 * ACCEL_EINVAL and the same message naming both calls and their number, and the communicator
 * stays broken; matched calls of every kind, count 0 included, still succeed. Then the last
 * process leaves while the others wait in an all-reduce: first with accel_free (they report
 * "exited (accel_free)"), finally by exit(0) without freeing (they report "exited (status 0)").
 * tests/comm/test_comm_faults.sh runs it on gloo and hier too, where the messages are worded
 * differently but name both calls (or the process that left), and tests/comm/test_mpi.sh on mpi
 * in debug mode (ACCELERATE_DEBUG_MODE=1: mpi checks declarations only then), less the
 * departures: under mpirun a process that leaves is Open MPI's runtime's to report.
 *
 * ACCEL_TEST_NPROCS: 2 3 4
 */
#include <string.h>
#include <unistd.h>

#include "check.h"

#define BIG (1u << 20) /* elements: 4 MiB of f32, the large-message algorithm */

static accel *acc;
static int R, N, L; /* L: the process that deviates */
static float *a, *b;
static int pid_of_last;

static void init(void)
{
    CHECK_OK(NULL, accel_init(&acc, NULL));
    R = accel_process_index(acc);
    N = accel_num_processes(acc);
    L = N - 1;
    int me = (int)getpid(), pid = me;
    CHECK_OK(acc, accel_broadcast(acc, &me, &pid, 1, ACCEL_I32, L, NULL));
    pid_of_last = pid;
}

/* The call just made must have failed with EINVAL naming both calls, the same on every process
 * (shm: "collective mismatch: rank 0 called <mine> #N, rank L called <theirs> #N"; the other
 * backends word it their own way but name the two calls), and the communicator must stay
 * broken; then a fresh one for the next case. */
static void expect(accel_status st, const char *mine, const char *theirs)
{
    const char *msg = accel_last_error(acc);
    CHECK_MSG(st == ACCEL_EINVAL, "rank %d, %s against %s: got %s: %s", R, mine, theirs,
              accel_status_name(st), msg);
    char want[512];
    if (strcmp(accel_backend_name(acc), "shm") == 0) {
        /* Both calls carry the same sequence number: init's own collectives come first (how
         * many is init's business), then the barrier each case starts with, then this call. */
        int found = 0;
        for (int seq = 2; seq < 16 && !found; seq++) {
            snprintf(want, sizeof(want),
                     "collective mismatch: rank 0 called %s #%d, rank %d called %s #%d", mine, seq,
                     L, theirs, seq);
            found = strstr(msg, want) != NULL;
        }
        CHECK_MSG(found, "rank %d: message \"%s\" lacks \"%s\" (for any one #N)", R, msg, want);
    } else {
        /* Where accel_alloc_shared is plain memory it declares its size. */
        if (strcmp(theirs, "accel_alloc_shared()") == 0) {
            theirs = "accel_alloc_shared(nbytes=4096)";
        }
        CHECK_MSG(strstr(msg, "collective mismatch") != NULL && strstr(msg, mine) != NULL &&
                      strstr(msg, theirs) != NULL,
                  "rank %d: message \"%s\" does not name the mismatch of %s and %s", R, msg, mine,
                  theirs);
        /* ... and the process that deviated by its job-wide number (hier's machine-level
         * check named it by its rank inside the machine). */
        char p[64], r[64];
        snprintf(p, sizeof(p), "process %d called", L);
        snprintf(r, sizeof(r), "rank %d called", L);
        CHECK_MSG(strstr(msg, p) != NULL || strstr(msg, r) != NULL,
                  "rank %d: message \"%s\" does not name process %d", R, msg, L);
    }
    CHECK(accel_barrier(acc, NULL) != ACCEL_OK);
    accel_free(acc);
    init();
}

/* The call just made must have failed with EPEER because process L left: on shm the message
 * says how (`how`: "accel_free", "status 0"), elsewhere it names process L. */
static void expect_left(accel_status st, const char *how)
{
    const char *msg = accel_last_error(acc);
    CHECK_MSG(st == ACCEL_EPEER, "rank %d: got %s: %s", R, accel_status_name(st), msg);
    char want[256], alt[64] = "";
    if (strcmp(accel_backend_name(acc), "shm") == 0) {
        snprintf(want, sizeof(want), "rank %d (pid %d) exited (%s)", L, pid_of_last, how);
    } else {
        /* gloo: "process L died or closed its connection"; hier's machine: "rank L (pid P)" */
        snprintf(want, sizeof(want), "process %d ", L);
        snprintf(alt, sizeof(alt), "rank %d (pid %d)", L, pid_of_last);
    }
    CHECK_MSG(strstr(msg, want) != NULL || (alt[0] && strstr(msg, alt) != NULL),
              "rank %d: \"%s\" lacks \"%s\"", R, msg, want);
}

static void matched_calls(void)
{
    /* Every kind, with count 0 and with a small count. */
    for (size_t count = 0; count <= 5; count += 5) {
        CHECK_OK(acc, accel_allreduce(acc, a, b, count, ACCEL_F32, ACCEL_SUM, NULL));
        CHECK_OK(acc, accel_reduce_to(acc, a, b, count, ACCEL_F32, ACCEL_MAX, L, NULL));
        CHECK_OK(acc, accel_reduce_scatter(acc, a, b, count, ACCEL_F32, ACCEL_SUM, NULL));
        CHECK_OK(acc, accel_allgather(acc, a, b, count, ACCEL_F32, NULL));
        CHECK_OK(acc, accel_broadcast(acc, a, b, count, ACCEL_F32, L, NULL));
        CHECK_OK(acc, accel_gather_to(acc, a, b, count, ACCEL_F32, 0, NULL));
        CHECK_OK(acc, accel_barrier(acc, NULL));
    }
    for (size_t i = 0; i < 5; i++) {
        a[i] = (float)(R + 1);
    }
    CHECK_OK(acc, accel_allreduce(acc, a, b, 5, ACCEL_F32, ACCEL_SUM, NULL));
    CHECK(b[4] == (float)(N * (N + 1) / 2));
}

int main(void)
{
    a = calloc(BIG * 4 + 64, sizeof(float));
    b = calloc(BIG * 4 + 64, sizeof(float));
    CHECK(a != NULL && b != NULL);
    init();
    if (N < 2) {
        accel_free(acc);
        return 77;
    }
    matched_calls();
    accel_free(acc);
    init();
    const int last = R == L;

    /* count */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, last ? 999 : 1000, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1000, f32, sum)", "allreduce(count=999, f32, sum)");
    /* count, large messages (two-shot; checked before any slot is read) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, last ? BIG - 1 : BIG, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1048576, f32, sum)", "allreduce(count=1048575, f32, sum)");
    /* count, mid-size messages (gloo: inputs in the call's envelopes against the block path) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, last ? 300000 : 40000, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=40000, f32, sum)", "allreduce(count=300000, f32, sum)");
    /* dtype, large messages (gloo's ring: first segments of another size and number that
     * leave before the check) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, BIG, last ? ACCEL_F64 : ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1048576, f32, sum)", "allreduce(count=1048576, f64, sum)");
    /* dtype, mid-size messages (gloo's ring on two processes: the first segment in the
     * envelope, f32, against one of its own, f64) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, 262144, last ? ACCEL_F64 : ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=262144, f32, sum)", "allreduce(count=262144, f64, sum)");
    /* operation, large messages (gloo's ring: the same first segments, another call) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(last ? accel_reduce_to(acc, a, b, BIG, ACCEL_F32, ACCEL_SUM, 0, NULL)
                : accel_allreduce(acc, a, b, BIG, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1048576, f32, sum)", "reduce(count=1048576, f32, sum, root=0)");
    /* operation, large messages (gloo's ring: an allgather's first segments, its own block,
     * against an allreduce's, the chunk before its own) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(last ? accel_allgather(acc, a, b, BIG / 4, ACCEL_F32, NULL)
                : accel_allreduce(acc, a, b, BIG, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1048576, f32, sum)", "allgather(count=262144, f32)");
    /* operation, large messages (gloo's ring: a reduce_scatter's first segments, of blocks,
     * against an allreduce's, of chunks) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(last ? accel_reduce_scatter(acc, a, b, BIG / 4, ACCEL_F32, ACCEL_SUM, NULL)
                : accel_allreduce(acc, a, b, BIG, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1048576, f32, sum)", "reduce_scatter(count=262144, f32, sum)");
    /* dtype */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, 1000, last ? ACCEL_I32 : ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=1000, f32, sum)", "allreduce(count=1000, i32, sum)");
    /* reduce op */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_allreduce(acc, a, b, 1000, ACCEL_F32, last ? ACCEL_MAX : ACCEL_SUM, NULL),
           "allreduce(count=1000, f32, sum)", "allreduce(count=1000, f32, max)");
    /* root */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_broadcast(acc, a, a, 10, ACCEL_F32, last ? 1 : 0, NULL),
           "broadcast(count=10, f32, root=0)", "broadcast(count=10, f32, root=1)");
    /* root, large messages (gloo: each declared root's envelope to the process after it carries
     * the chain's first segment) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_broadcast(acc, a, a, BIG, ACCEL_F32, last ? 1 : 0, NULL),
           "broadcast(count=1048576, f32, root=0)", "broadcast(count=1048576, f32, root=1)");
    /* operation */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(last ? accel_barrier(acc, NULL)
                : accel_allreduce(acc, a, b, 4, ACCEL_F32, ACCEL_SUM, NULL),
           "allreduce(count=4, f32, sum)", "barrier()");
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(last ? accel_allgather(acc, a, b, 400, ACCEL_F32, NULL)
                : accel_reduce_scatter(acc, a, b, 400, ACCEL_F32, ACCEL_SUM, NULL),
           "reduce_scatter(count=400, f32, sum)", "allgather(count=400, f32)");
    /* count 0 against count 3 (a call that moves nothing still meets the others) */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    expect(accel_gather_to(acc, a, b, last ? 3 : 0, ACCEL_F32, 0, NULL),
           "gather(count=0, f32, root=0)", "gather(count=3, f32, root=0)");
    /* an allocation against a collective */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    {
        void *p = NULL;
        expect(last ? accel_alloc_shared(acc, 4096, &p)
                    : accel_allreduce(acc, a, b, 4, ACCEL_F32, ACCEL_SUM, NULL),
               "allreduce(count=4, f32, sum)", "accel_alloc_shared()");
    }
    matched_calls(); /* the fresh communicator works */
    if (strcmp(accel_backend_name(acc), "mpi") == 0) {
        accel_free(acc);
        free(a);
        free(b);
        printf("rank %d: mismatches reported\n", R);
        return 0;
    }

    /* The last process frees its accelerator while the others wait for it. */
    if (last) {
        accel_free(acc);
    } else {
        expect_left(accel_allreduce(acc, a, b, 4, ACCEL_F32, ACCEL_SUM, NULL), "accel_free");
        accel_free(acc);
    }
    init();

    /* The last process exits (status 0) without freeing, while the others wait. */
    CHECK_OK(acc, accel_barrier(acc, NULL));
    if (last) {
        exit(0);
    }
    expect_left(accel_allreduce(acc, a, b, 4, ACCEL_F32, ACCEL_SUM, NULL), "status 0");
    accel_free(acc);
    free(a);
    free(b);
    printf("rank %d: mismatches and departures reported\n", R);
    return 0;
}
