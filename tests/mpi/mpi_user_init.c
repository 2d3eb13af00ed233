/*
 * Helper for tests/comm/test_mpi.sh: accel inside a program that uses MPI itself. Run under
 * mpirun; the argument says who initialises MPI:
 *   multiple  the program, with MPI_Init_thread(MPI_THREAD_MULTIPLE), and finalises it;
 *   single    the program, with plain MPI_Init (MPI_THREAD_SINGLE), and finalises it;
 *   none      the program never calls MPI: accel initialises it and finalises it at exit
 *             (mpirun fails the job when a process exits without MPI_Finalize).
 * Between the program's own MPI calls it runs accel collectives (blocking and asynchronous) on
 * the backend accel chooses under mpirun (it must be mpi), twice (init, free, init again), and
 * checks that accel_free leaves MPI running. Exits 0 when every check passed.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "mpi_user_init: %s:%d: ", __FILE__, __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* The program's own MPI traffic on MPI_COMM_WORLD: a sum of ranks. */
static int own_sum(int rank)
{
    int v = rank, s = -1;
    return MPI_Allreduce(&v, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS ? s : -1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "none";
    const int program_owns = strcmp(mode, "none") != 0;
    int provided = -1, rank = -1, n = 0, flag = 0;
    if (strcmp(mode, "multiple") == 0) {
        EXPECT(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS,
               "MPI_Init_thread");
    } else if (strcmp(mode, "single") == 0) {
        EXPECT(MPI_Init(&argc, &argv) == MPI_SUCCESS, "MPI_Init");
    }
    if (program_owns) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &n);
        EXPECT(own_sum(rank) == n * (n - 1) / 2, "own MPI_Allreduce before accel");
    }

    /* Twice: accel_init after accel_free finds MPI running and uses it again. */
    for (int life = 0; life < 2; life++) {
        accel *acc;
        accel_status st = accel_init(&acc, NULL);
        EXPECT(st == ACCEL_OK, "accel_init: %s: %s", accel_status_name(st), accel_last_error(NULL));
        EXPECT(strcmp(accel_backend_name(acc), "mpi") == 0, "backend %s under mpirun",
               accel_backend_name(acc));
        rank = accel_process_index(acc);
        n = accel_num_processes(acc);
        MPI_Initialized(&flag);
        EXPECT(flag, "MPI is not initialised after accel_init");

        float v[1000];
        for (int round = 0; round < 3; round++) {
            for (int i = 0; i < 1000; i++) {
                v[i] = (float)(rank + 1);
            }
            accel_work *w = NULL;
            st = accel_allreduce(acc, v, v, 1000, ACCEL_F32, ACCEL_SUM, &w);
            EXPECT(st == ACCEL_OK, "accel_allreduce: %s", accel_last_error(acc));
            /* accel's communication thread progresses it while this thread waits. */
            EXPECT(accel_work_wait(w) == ACCEL_OK, "accel_work_wait: %s", accel_last_error(NULL));
            accel_work_free(w);
            EXPECT(v[999] == (float)(n * (n + 1) / 2), "accel sum %g", (double)v[999]);
            st = accel_barrier(acc, NULL);
            EXPECT(st == ACCEL_OK, "accel_barrier: %s", accel_last_error(acc));
            /* The program's MPI between accel's calls (none in flight). */
            if (program_owns) {
                EXPECT(own_sum(rank) == n * (n - 1) / 2, "own MPI_Allreduce between accel calls");
            }
        }
        accel_free(acc);
    }

    MPI_Finalized(&flag);
    EXPECT(!flag, "accel_free finalised MPI");
    if (program_owns) {
        EXPECT(own_sum(rank) == n * (n - 1) / 2, "own MPI_Allreduce after accel_free");
        EXPECT(MPI_Finalize() == MPI_SUCCESS, "MPI_Finalize");
    }
    printf("mpi_user_init %s: rank %d of %d ok\n", mode, rank, n);
    return 0;
}
