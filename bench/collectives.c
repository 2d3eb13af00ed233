/*
 * Collectives benchmark in the style of nccl-tests: for allreduce, allgather, reduce_scatter and
 * broadcast of f32 from 4 KiB to 256 MiB (x4 steps), the time per call, algbw = bytes / time and
 * busbw = algbw x the bus factor (allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n,
 * broadcast 1), next to single-thread memcpy bandwidth at the same size measured in the same run
 * (while the other ranks wait), and busbw / memcpy. Bytes are the whole array (for allgather and
 * reduce_scatter the total, as nccl-tests). Times are the best of 5 batches (the machine is
 * shared; the slowest rank's time counts within a batch). Prints on process 0 only.
 *
 * Three columns per row: out of place and in place on plain malloc'd buffers, and in place on a
 * buffer from accel_alloc_shared ("symmetric"), which the shm backend reduces without copies
 * above ACCEL_SHM_ZEROCOPY_NBYTES (the way the training module's gradient buffer is used).
 *
 * Under mpirun, in a build with MPI, two more columns: Open MPI's own blocking collective on
 * MPI_COMM_WORLD (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast), out of
 * place, timed the same way in the same run, and vs_mpi = its time / accel's out-of-place time
 * (above 1: accel is faster; the mpi backend's target is >= 0.95 at every size). The program
 * then initialises MPI itself (accel uses it, and leaves it to the program to finalise).
 *
 *   accel launch --num_processes 2 build/bench/collectives [--max-mib 256] [--coll NAME]
 *   mpirun -np 2 build/bench/collectives --backend mpi       (or shm: accel's shm against MPI)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "core/internal.h"
#ifdef ACCEL_HAVE_MPI
#include <mpi.h>
#endif

#define CHECK_ACC(acc, call)                                                                       \
    do {                                                                                           \
        accel_status st_ = (call);                                                                 \
        if (st_ != ACCEL_OK) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                      \
                    accel_status_name(st_), accel_last_error(acc));                                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef enum { ALLREDUCE, ALLGATHER, REDUCE_SCATTER, BROADCAST } coll;
static const char *coll_names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast"};

/* One call; in place uses the forms of collectives.h (the chunk inside the full buffer). */
static void run_once(accel *acc, coll c, float *send, float *recv, size_t count, int in_place)
{
    int n = accel_num_processes(acc), r = accel_process_index(acc);
    size_t off, cnt;
    accel_chunk_range(count, n, r, &off, &cnt);
    switch (c) {
    case ALLREDUCE:
        CHECK_ACC(acc, accel_allreduce(acc, in_place ? recv : send, recv, count, ACCEL_F32,
                                       ACCEL_SUM, NULL));
        break;
    case ALLGATHER:
        CHECK_ACC(acc,
                  accel_allgather(acc, in_place ? recv + off : send, recv, count, ACCEL_F32, NULL));
        break;
    case REDUCE_SCATTER:
        CHECK_ACC(acc, accel_reduce_scatter(acc, send, in_place ? send + off : recv, count,
                                            ACCEL_F32, ACCEL_SUM, NULL));
        break;
    case BROADCAST:
        CHECK_ACC(acc,
                  accel_broadcast(acc, in_place ? recv : send, recv, count, ACCEL_F32, 0, NULL));
        break;
    }
}

#define TRIALS 5

/* Iterations per trial: ~0.05 s worth at memory speed, at least 2. */
static int iters_for(size_t nbytes)
{
    size_t it = (size_t)(128u << 20) / (nbytes > 0 ? nbytes : 1);
    if (it > 2000) {
        it = 2000;
    }
    return it < 2 ? 2 : (int)it;
}

/* Single-thread memcpy bandwidth (bytes copied per second), best of a few runs. */
static double memcpy_bw(void *dst, const void *src, size_t nbytes)
{
    int iters = iters_for(nbytes);
    double best = 1e30;
    for (int rep = 0; rep < TRIALS; rep++) {
        double t0 = accel__now();
        for (int i = 0; i < iters; i++) {
            memcpy(dst, src, nbytes);
            __asm__ __volatile__("" : : "r"(dst) : "memory"); /* keep every copy */
        }
        double t = (accel__now() - t0) / iters;
        best = t < best ? t : best;
    }
    return (double)nbytes / best;
}

/* Best batch time of one collective, the slowest rank's (every rank returns the same). */
static double time_coll(accel *acc, coll c, float *send, float *recv, size_t count, int in_place)
{
    int iters = iters_for(count * sizeof(float));
    for (int i = 0; i < 2 + iters / 10; i++) {
        run_once(acc, c, send, recv, count, in_place); /* warm up: faults, caches */
    }
    /* Best of TRIALS batches: the machine is shared, and the best batch is the one least
     * disturbed by other processes (memcpy is measured the same way). */
    double t = 1e30;
    for (int trial = 0; trial < TRIALS; trial++) {
        CHECK_ACC(acc, accel_barrier(acc, NULL));
        double t0 = accel__now();
        for (int i = 0; i < iters; i++) {
            run_once(acc, c, send, recv, count, in_place);
        }
        double ti = (accel__now() - t0) / iters;
        t = ti < t ? ti : t;
    }
    CHECK_ACC(acc, accel_allreduce(acc, &t, &t, 1, ACCEL_F64, ACCEL_MAX, NULL));
    return t;
}

/* Open MPI's own collective, out of place, timed as time_coll; 0 when MPI is not running. */
static double time_raw_mpi(accel *acc, coll c, float *send, float *recv, size_t count)
{
#ifdef ACCEL_HAVE_MPI
    int on = 0, off = 0;
    MPI_Initialized(&on);
    MPI_Finalized(&off);
    int n = 1;
    if (on && !off) {
        MPI_Comm_size(MPI_COMM_WORLD, &n);
    }
    if (!on || off || n != accel_num_processes(acc) || count > (size_t)1 << 30) {
        return 0;
    }
    const int cnt = (int)count, per = (int)(count / (size_t)n);
    int iters = iters_for(count * sizeof(float));
    double t = 1e30;
    for (int trial = -1; trial < TRIALS; trial++) { /* trial -1 warms up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = accel__now();
        for (int i = 0; i < (trial < 0 ? 2 + iters / 10 : iters); i++) {
            switch (c) {
            case ALLREDUCE:
                MPI_Allreduce(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                break;
            case ALLGATHER:
                MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD);
                break;
            case REDUCE_SCATTER:
                MPI_Reduce_scatter_block(send, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                break;
            case BROADCAST:
                MPI_Bcast(recv, cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
                break;
            }
        }
        double ti = (accel__now() - t0) / (trial < 0 ? 2 + iters / 10 : iters);
        t = trial >= 0 && ti < t ? ti : t;
    }
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
#else
    (void)acc, (void)c, (void)send, (void)recv, (void)count;
    return 0;
#endif
}

int main(int argc, char **argv)
{
    size_t max_mib = 256;
    int only = -1;
    accel_options o = accel_options_default();
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--max-mib") == 0) {
            max_mib = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--backend") == 0) {
            o.backend = argv[i + 1];
        } else if (strcmp(argv[i], "--coll") == 0) {
            for (int c = 0; c < 4; c++) {
                if (strcmp(argv[i + 1], coll_names[c]) == 0) {
                    only = c;
                }
            }
        }
    }
#ifdef ACCEL_HAVE_MPI
    const int own_mpi = getenv("OMPI_COMM_WORLD_SIZE") != NULL; /* started by mpirun */
    if (own_mpi) {
        int level = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    }
#endif
    accel *acc;
    CHECK_ACC(NULL, accel_init(&acc, &o));
    int n = accel_num_processes(acc), rank = accel_process_index(acc);
    size_t max_nbytes = max_mib << 20;
    float *send = malloc(max_nbytes), *recv = malloc(max_nbytes);
    void *symp = NULL;
    CHECK_ACC(acc, accel_alloc_shared(acc, max_nbytes, &symp));
    float *sym = symp;
    if (send == NULL || recv == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < max_nbytes / sizeof(float); i++) {
        send[i] = (float)(i % 100);
        recv[i] = 0;
        sym[i] = (float)(i % 100);
    }
    if (rank == 0) {
        printf("# accel collectives benchmark: %d processes, backend %s, f32\n", n,
               accel_backend_name(acc));
        printf("# busbw factor: allreduce 2(n-1)/n, allgather/reduce_scatter (n-1)/n, "
               "broadcast 1; memcpy = single-thread memcpy of the same size, same run\n");
        printf("# ratio = busbw / memcpy; bandwidths in GB/s; times are the slowest rank's\n");
        printf("%-15s %10s %10s | %-34s | %-34s | %-34s | %7s | %-17s\n", "", "", "",
               "out of place", "in place", "in place, symmetric (accel_alloc_shared)", "",
               "Open MPI's own");
        printf("%-15s %10s %10s | %10s %7s %7s %6s | %10s %7s %7s %6s | %10s %7s %7s %6s | %7s | "
               "%10s %6s\n",
               "collective", "size(B)", "count", "time(us)", "algbw", "busbw", "ratio", "time(us)",
               "algbw", "busbw", "ratio", "time(us)", "algbw", "busbw", "ratio", "memcpy",
               "time(us)", "vs_mpi");
    }
    for (int c = 0; c < 4; c++) {
        if (only >= 0 && c != only) {
            continue;
        }
        for (size_t nbytes = 4096; nbytes <= max_nbytes; nbytes *= 4) {
            size_t count = nbytes / sizeof(float);
            double t_oop = time_coll(acc, (coll)c, send, recv, count, 0);
            double t_ip = time_coll(acc, (coll)c, send, recv, count, 1);
            double t_sym = time_coll(acc, (coll)c, sym, sym, count, 1);
            double t_mpi = time_raw_mpi(acc, (coll)c, send, recv, count);
            double mbw = 0;
            if (rank == 0) {
                mbw = memcpy_bw(recv, send, nbytes); /* others wait in the barrier */
            }
            CHECK_ACC(acc, accel_barrier(acc, NULL));
            if (rank == 0) {
                double factor = c == ALLREDUCE   ? 2.0 * (n - 1) / n
                                : c == BROADCAST ? 1.0
                                                 : (double)(n - 1) / n;
                double bus_oop = (double)nbytes / t_oop * factor;
                double bus_ip = (double)nbytes / t_ip * factor;
                double bus_sym = (double)nbytes / t_sym * factor;
                char raw[32] = "         -      -";
                if (t_mpi > 0) {
                    snprintf(raw, sizeof(raw), "%10.2f %6.2f", t_mpi * 1e6, t_mpi / t_oop);
                }
                printf("%-15s %10zu %10zu | %10.2f %7.2f %7.2f %6.2f | %10.2f %7.2f %7.2f %6.2f | "
                       "%10.2f %7.2f %7.2f %6.2f | %7.2f | %s\n",
                       coll_names[c], nbytes, count, t_oop * 1e6, nbytes / t_oop * 1e-9,
                       bus_oop * 1e-9, bus_oop / mbw, t_ip * 1e6, nbytes / t_ip * 1e-9,
                       bus_ip * 1e-9, bus_ip / mbw, t_sym * 1e6, nbytes / t_sym * 1e-9,
                       bus_sym * 1e-9, bus_sym / mbw, mbw * 1e-9, raw);
                fflush(stdout);
            }
        }
    }
    CHECK_ACC(acc, accel_free_shared(acc, sym));
    accel_free(acc);
    free(send);
    free(recv);
#ifdef ACCEL_HAVE_MPI
    if (own_mpi) {
        MPI_Finalize();
    }
#endif
    return 0;
}
