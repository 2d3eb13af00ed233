/*
 * Helper for tests/comm/test_mpi.sh: mismatched collectives on the mpi backend without debug
 * mode (run with a short ACCEL_TIMEOUT). The last process calls another collective, or the same
 * with another count, dtype, op or root, than the others (small and large messages, the
 * pipelined path, gather and barrier, count 0 against count 3 or 5). The house rule: never a silent
 * wrong answer. So in every case no process may return ACCEL_OK with a result other than its
 * own call's (its buffers are poisoned first), and at least one process must fail, with
 * ACCEL_ETIMEDOUT or ACCEL_EPEER (a peer's notice), within the deadline. On 2 processes, the one
 * whose deadline passes first in "allreduce / barrier" is told that its peer sent a message of
 * another call (on 3 the first may be one that the barrier's first round sends nothing to).
 * A count-0 call still meets its peers (a barrier's rounds under its fingerprint), so in the
 * count-0 cases every process must fail, the one with count 0 included.
 * Two cases make the fingerprints of two calls with different counts collide on purpose (the
 * library's test hook, accel__mpi_fingerprint_hook): there every process must fail with
 * ACCEL_EINVAL (its own size check or a peer's notice of it), at least one naming the sizes.
 * Each case runs on a fresh accel of its own, all of them at once, one thread each (most of a
 * case is waiting out the deadline, and each accel has its own communicator, so the cases
 * cannot see each other's messages); the program's own MPI_Allreduce on MPI_COMM_WORLD then
 * gathers the outcomes, and process 0 prints one line per case and "mpi_mismatch: ok" when all
 * held.
 * (Debug mode's check, ACCEL_EINVAL naming both calls, is tests/dist/test_coll_mismatch.)
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "comm/mpi/mpi_impl.h"

#define BIG (1 << 20) /* elements: 4 MiB of f32, the pipelined path */

enum {
    C_COUNT,
    C_COUNT_BIG,
    C_DTYPE,
    C_OP,
    C_ROOT,
    C_BARRIER,
    C_RS_AG,
    C_GATHER0,
    C_GATHER,
    C_ZERO,
    C_COLLIDE,
    C_COLLIDE_BIG,
    N_CASES
};
static const char *const names[N_CASES] = {
    "allreduce count 1000 / 999",
    "allreduce count 2^20 / 2^20 - 1",
    "allreduce f32 / i32",
    "allreduce sum / max",
    "broadcast root 0 / root 1",
    "allreduce / barrier",
    "reduce_scatter / allgather",
    "gather count 0 / 3",
    "gather count 5 / 3",
    "allreduce count 5 / 0",
    "allreduce count 1001 / 601, fingerprints made to collide",
    "allreduce count 786432 / 784432, fingerprints made to collide",
};
/* The counts of C_COLLIDE and C_COLLIDE_BIG (no other case uses them). */
#define COLLIDE_A 1001
#define COLLIDE_B 601
#define COLLIDE_BIG_A (3 << 18) /* 3 MiB of f32: the pipelined path */
#define COLLIDE_BIG_B ((3 << 18) - 2000)

/* The library's test hook (mpi_impl.h): the two calls of each collision case get one
 * fingerprint, as two declarations whose hashes collide would (1 in 2^25 on Open MPI); every
 * other call keeps its own. */
static uint64_t collide(const accel__coll_decl *d, uint64_t fp)
{
    const int ar = d->kind == ACCEL__COLL_ALLREDUCE;
    if (ar && (d->count == COLLIDE_A || d->count == COLLIDE_B)) {
        return 0x5eed;
    }
    if (ar && (d->count == COLLIDE_BIG_A || d->count == COLLIDE_BIG_B)) {
        return 0xbee;
    }
    return fp;
}

static int R, N, L;

/* One case in its thread: its accel, buffers (count floats each) and outcome. */
typedef struct job {
    int c;
    accel *acc;
    float *a, *b;
    size_t count;
    /* [silently wrong, failed, failed saying why (expect()), failed with another status] */
    int mine[4];
} job;

/* What case c's failures must be: two calls whose fingerprints collide meet in one tag, and the
 * size of a message tells them apart (ACCEL_EINVAL, or a peer's notice of it, naming the sizes);
 * any other mismatch waits out the deadline (ACCEL_ETIMEDOUT, or ACCEL_EPEER: a peer's notice
 * of its timeout), with a hint when a peer's message of another call is there. */
static int collision(int c)
{
    return c == C_COLLIDE || c == C_COLLIDE_BIG;
}
static const char *expect(int c)
{
    return collision(c) ? "bytes where this call expects" : "sent a message of another call";
}
static int expected_status(int c, accel_status st)
{
    return collision(c) ? st == ACCEL_EINVAL : st == ACCEL_ETIMEDOUT || st == ACCEL_EPEER;
}

/* Runs case c's call as this process makes it; *right: its output is its own call's. */
static accel_status run_case(accel *acc, int c, float *a, float *b, size_t count, int *right)
{
    const int last = R == L;
    const float sum = (float)(N * (N + 1) / 2);
    accel_status st = ACCEL_OK;
    for (size_t i = 0; i < count; i++) {
        a[i] = (float)(R + 1);
        b[i] = -7.0f; /* poison: a result never written reads as wrong */
    }
    *right = 1;
    switch (c) {
    case C_COUNT:
    case C_COUNT_BIG: {
        size_t n = (c == C_COUNT ? 1000 : BIG) - (size_t)last;
        st = accel_allreduce(acc, a, b, n, ACCEL_F32, ACCEL_SUM, NULL);
        for (size_t i = 0; i < n; i++) {
            *right &= b[i] == sum;
        }
        break;
    }
    case C_DTYPE:
        if (last) {
            int32_t *ia = (int32_t *)a, *ib = (int32_t *)b;
            for (int i = 0; i < 1000; i++) {
                ia[i] = R + 1;
            }
            st = accel_allreduce(acc, a, b, 1000, ACCEL_I32, ACCEL_SUM, NULL);
            for (int i = 0; i < 1000; i++) {
                *right &= ib[i] == N * (N + 1) / 2;
            }
        } else {
            st = accel_allreduce(acc, a, b, 1000, ACCEL_F32, ACCEL_SUM, NULL);
            for (int i = 0; i < 1000; i++) {
                *right &= b[i] == sum;
            }
        }
        break;
    case C_OP:
        st = accel_allreduce(acc, a, b, 1000, ACCEL_F32, last ? ACCEL_MAX : ACCEL_SUM, NULL);
        for (int i = 0; i < 1000; i++) {
            *right &= b[i] == (last ? (float)N : sum);
        }
        break;
    case C_ROOT: {
        const int root = last ? 1 : 0;
        for (int i = 0; i < 10; i++) {
            a[i] = (float)(R * 1000 + i);
        }
        st = accel_broadcast(acc, a, a, 10, ACCEL_F32, root, NULL);
        for (int i = 0; i < 10; i++) {
            *right &= a[i] == (float)(root * 1000 + i);
        }
        break;
    }
    case C_BARRIER:
        if (last) {
            st = accel_barrier(acc, NULL);
        } else {
            st = accel_allreduce(acc, a, b, 4, ACCEL_F32, ACCEL_SUM, NULL);
            for (int i = 0; i < 4; i++) {
                *right &= b[i] == sum;
            }
        }
        break;
    case C_RS_AG:
        if (last) {
            st = accel_allgather(acc, a, b, 400, ACCEL_F32, NULL);
            for (int i = 0; i < 400 * N; i++) {
                *right &= b[i] == (float)(i / 400 + 1);
            }
        } else {
            st = accel_reduce_scatter(acc, a, b, 400, ACCEL_F32, ACCEL_SUM, NULL);
            for (int i = 0; i < 400; i++) {
                *right &= b[i] == sum;
            }
        }
        break;
    case C_ZERO:
    case C_COLLIDE:
    case C_COLLIDE_BIG: {
        const size_t n = c == C_ZERO      ? (last ? 0 : 5)
                         : c == C_COLLIDE ? (last ? COLLIDE_B : COLLIDE_A)
                                          : (last ? COLLIDE_BIG_B : COLLIDE_BIG_A);
        st = accel_allreduce(acc, a, b, n, ACCEL_F32, ACCEL_SUM, NULL);
        for (size_t i = 0; i < n; i++) {
            *right &= b[i] == sum;
        }
        break;
    }
    case C_GATHER0:
    case C_GATHER: {
        const int n = last ? 3 : c == C_GATHER0 ? 0 : 5;
        st = accel_gather_to(acc, a, b, (size_t)n, ACCEL_F32, 0, NULL);
        for (int i = 0; R == 0 && i < n * N; i++) {
            *right &= b[i] == (float)(i / n + 1);
        }
        break;
    }
    default:
        break;
    }
    return st;
}

static void *run_job(void *arg)
{
    job *j = arg;
    const double t0 = MPI_Wtime();
    int right = 0;
    accel_status st = run_case(j->acc, j->c, j->a, j->b, j->count, &right);
    const double took = MPI_Wtime() - t0;
    const char *msg = st != ACCEL_OK ? accel_last_error(j->acc) : "";
    j->mine[0] = st == ACCEL_OK && !right;
    j->mine[1] = st != ACCEL_OK;
    j->mine[2] = strstr(msg, expect(j->c)) != NULL;
    j->mine[3] = st != ACCEL_OK && !expected_status(j->c, st);
    printf("mpi_mismatch: %s: rank %d: %s in %.1f s%s%s\n", names[j->c], R,
           st == ACCEL_OK ? (right ? "ok, its own call's result" : "ok, WRONG RESULT")
                          : accel_status_name(st),
           took, st != ACCEL_OK ? ": " : "", msg);
    fflush(stdout);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "mpi_mismatch: MPI_Init_thread gave no MPI_THREAD_MULTIPLE\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    L = N - 1;
    if (N < 2) {
        fprintf(stderr, "mpi_mismatch: needs 2 processes or more\n");
        MPI_Finalize();
        return 1;
    }
    accel__mpi_fingerprint_hook = collide;
    /* The accels one after the other (accel_init is collective), then every case at once. */
    job jobs[N_CASES];
    pthread_t threads[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        job *j = &jobs[c];
        *j = (job){.c = c, .count = c == C_COUNT_BIG || c == C_COLLIDE_BIG ? BIG : 1 << 12};
        j->a = malloc(j->count * sizeof(float));
        j->b = malloc(j->count * sizeof(float));
        accel_status st = accel_init(&j->acc, NULL);
        if (j->a == NULL || j->b == NULL || st != ACCEL_OK ||
            strcmp(accel_backend_name(j->acc), "mpi") != 0) {
            fprintf(stderr, "mpi_mismatch: rank %d: accel_init: %s (%s)\n", R,
                    accel_status_name(st), st == ACCEL_OK ? accel_backend_name(j->acc) : "");
            return 1;
        }
    }
    for (int c = 0; c < N_CASES; c++) {
        if (pthread_create(&threads[c], NULL, run_job, &jobs[c]) != 0) {
            fprintf(stderr, "mpi_mismatch: rank %d: cannot start a thread\n", R);
            return 1;
        }
    }
    int failures = 0;
    for (int c = 0; c < N_CASES; c++) {
        pthread_join(threads[c], NULL);
        accel_free(jobs[c].acc);
        free(jobs[c].a);
        free(jobs[c].b);
        int all[4], *mine = jobs[c].mine;
        MPI_Allreduce(mine, all, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        /* A count-0 call meets its peers too, so there every process fails; in a collision
         * every process learns of it (its own check or a peer's notice). */
        const int all_fail = c == C_ZERO || c == C_GATHER0 || collision(c);
        const char *why =
            all[0] > 0               ? "a process returned a wrong result without an error"
            : all[1] == 0            ? "no process failed: the mismatch went unnoticed"
            : all_fail && all[1] < N ? "a process returned ACCEL_OK: the mismatch went unseen there"
            : all[3] > 0 ? (collision(c) ? "a process failed with another status than EINVAL"
                                         : "a process failed with neither ETIMEDOUT nor EPEER")
            : all[2] == 0 && (collision(c) || ((c == C_BARRIER || c == C_ZERO) && N == 2))
                ? "no process said why"
                : NULL;
        if (R == 0) {
            printf("mpi_mismatch: %s: %s\n", names[c], why != NULL ? why : "caught");
            fflush(stdout);
        }
        failures += why != NULL;
    }
    if (R == 0 && failures == 0) {
        printf("mpi_mismatch: ok\n");
    }
    MPI_Finalize();
    return failures != 0;
}
