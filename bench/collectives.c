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
 * Two more columns when a baseline runs on the same processes: another library's own collective,
 * out of place, its batches alternating with accel's out-of-place ones (so that both see the
 * same load on a shared machine), and vs_raw = its time / accel's (above 1: accel is faster;
 * the mpi and gloo backends' target is >= 0.95 at every size). Under mpirun, in a build with
 * MPI: Open MPI's blocking collective on MPI_COMM_WORLD (MPI_Allreduce, MPI_Allgather,
 * MPI_Reduce_scatter_block, MPI_Bcast); the program then initialises MPI itself. Under the gloo
 * and hier backends, in a build with Gloo: Gloo's own (gloo::allreduce's ring, gloo::allgather,
 * gloo::broadcast: what PyTorch's gloo process group calls; bench/gloo_raw.cc), on a Gloo
 * context of its own that meets through the job's store; Gloo has no reduce_scatter.
 * --oop-only 1 leaves out the in-place columns (shorter runs); --min-kib K starts the sizes at
 * K KiB instead of 4 (a slow network's small sizes take long), --min-bytes B at B bytes (latency);
 * --max-iters N caps the calls per batch (about 0.05 s of memcpy's worth by default, at most
 * 2000: minutes per size over a 1 Gbit/s link); --baseline 0 runs accel's alone.
 *
 *   accel launch --num_processes 2 build/bench/collectives [--max-mib 256] [--coll NAME]
 *                                                         [--backend shm|gloo|hier|...]
 *   mpirun -np 2 build/bench/collectives --backend mpi       (or shm: accel's shm against MPI)
 *
 * --backend forces a backend (accel_options.backend; default: accel's choice). For hier, start
 * the processes as several machines (accel launch --num_machines, docs/comm.md).
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
#ifdef BENCH_HAVE_GLOO
#include "gloo_raw.h"
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

/* The baseline: another library's own collective, out of place, on the same processes. */
typedef struct baseline {
    const char *name; /* for the header: "Open MPI's own", "Gloo's own" */
    /* One call (count = the whole array, as run_once): 0 done, 1 not offered, -1 failed. */
    int (*run)(void *ctx, coll c, float *send, float *recv, size_t count);
    void *ctx;
} baseline;

#ifdef ACCEL_HAVE_MPI
static int raw_mpi(void *ctx, coll c, float *send, float *recv, size_t count)
{
    (void)ctx;
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const int cnt = (int)count, per = (int)(count / (size_t)n);
    int rc = MPI_SUCCESS;
    switch (c) {
    case ALLREDUCE:
        rc = MPI_Allreduce(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        rc = MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        rc = MPI_Reduce_scatter_block(send, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BROADCAST:
        rc = MPI_Bcast(recv, cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
    return rc == MPI_SUCCESS ? 0 : -1;
}
#endif

#ifdef BENCH_HAVE_GLOO
static int raw_gloo(void *ctx, coll c, float *send, float *recv, size_t count)
{
    return bench_gloo_run(ctx, (int)c, send, recv, count);
}
#endif

#define TRIALS 5

/* --max-iters: a cap on iters_for (over a slow network, memory speed's counts take minutes). */
static size_t max_iters = 2000;

/* Iterations per trial: ~0.05 s worth at memory speed, at least 2. */
static int iters_for(size_t nbytes)
{
    size_t it = (size_t)(128u << 20) / (nbytes > 0 ? nbytes : 1);
    if (it > max_iters) {
        it = max_iters;
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

/* A batch of iters calls of accel's collective (base NULL) or the baseline's; its time per call
 * on this process, or 0 when the baseline does not offer the collective. */
static double batch(accel *acc, const baseline *base, coll c, float *send, float *recv,
                    size_t count, int in_place, int iters)
{
    CHECK_ACC(acc, accel_barrier(acc, NULL));
    double t0 = accel__now();
    for (int i = 0; i < iters; i++) {
        if (base == NULL) {
            run_once(acc, c, send, recv, count, in_place);
            continue;
        }
        int rc = base->run(base->ctx, c, send, recv, count);
        if (rc != 0) {
            if (rc < 0) {
                fprintf(stderr, "%s %s failed\n", base->name, coll_names[c]);
                exit(1);
            }
            return 0;
        }
    }
    return (accel__now() - t0) / iters;
}

/* Best batch time of one collective, the slowest rank's (every rank returns the same); with
 * base, the baseline's best too (*t_base, 0 if not offered), its batches alternating with
 * accel's so that both see the same load on a shared machine. */
static double time_coll(accel *acc, coll c, float *send, float *recv, size_t count, int in_place,
                        const baseline *base, double *t_base)
{
    int iters = iters_for(count * sizeof(float));
    double t[2] = {1e30, base != NULL ? 1e30 : 0};
    /* Warm up (faults, caches), then the best of TRIALS batches: the machine is shared, and
     * the best batch is the one least disturbed by other processes (memcpy is measured the same
     * way). */
    (void)batch(acc, NULL, c, send, recv, count, in_place, 2 + iters / 10);
    if (base != NULL && batch(acc, base, c, send, recv, count, 0, 2 + iters / 10) == 0) {
        base = NULL, t[1] = 0;
    }
    /* Which goes first alternates (accel, base; base, accel; ...): over the emulated network,
     * the order alone moved a ratio by 0.04 (docs/performance.md, sixteenth pass). */
    for (int trial = 0; trial < TRIALS; trial++) {
        for (int k = 0; k < 2; k++) {
            const int b = (k + trial) % 2; /* 0: accel, 1: the baseline */
            if (b == 1 && base == NULL) {
                continue;
            }
            const double ti =
                batch(acc, b ? base : NULL, c, send, recv, count, b ? 0 : in_place, iters);
            t[b] = ti < t[b] ? ti : t[b];
        }
    }
    CHECK_ACC(acc, accel_allreduce(acc, t, t, 2, ACCEL_F64, ACCEL_MAX, NULL));
    if (t_base != NULL) {
        *t_base = t[1];
    }
    return t[0];
}

int main(int argc, char **argv)
{
    size_t max_mib = 256, min_nbytes = 4 << 10;
    int only = -1, oop_only = 0, want_base = 1;
    accel_options o = accel_options_default();
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--max-mib") == 0) {
            max_mib = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--min-kib") == 0) {
            min_nbytes = (size_t)atol(argv[i + 1]) << 10;
        } else if (strcmp(argv[i], "--min-bytes") == 0) {
            min_nbytes = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--baseline") == 0) {
            want_base = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--max-iters") == 0) {
            max_iters = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--oop-only") == 0) {
            oop_only = atoi(argv[i + 1]);
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
    /* The baseline: Open MPI's own under mpirun, Gloo's own under gloo or hier. */
    baseline base = {NULL, NULL, NULL};
#ifdef ACCEL_HAVE_MPI
    int world_n = 0;
    if (own_mpi) {
        MPI_Comm_size(MPI_COMM_WORLD, &world_n);
    }
    if (want_base && world_n == n) {
        base = (baseline){"Open MPI's own", raw_mpi, NULL};
    }
#endif
#ifdef BENCH_HAVE_GLOO
    const char *be = accel_backend_name(acc), *addr = getenv("MASTER_ADDR"),
               *port = getenv("MASTER_PORT"), *ifname = getenv("ACCEL_SOCKET_IFNAME");
    ifname = ifname != NULL ? ifname : getenv("GLOO_SOCKET_IFNAME");
    bench_gloo *gloo = NULL;
    if (want_base && base.run == NULL && addr != NULL && port != NULL &&
        (strcmp(be, "gloo") == 0 || strcmp(be, "hier") == 0)) {
        gloo = bench_gloo_open(rank, n, addr, atoi(port), ifname, 60);
        if (gloo == NULL) {
            return 1;
        }
        base = (baseline){"Gloo's own", raw_gloo, gloo};
    }
#endif
    if (rank == 0) {
        printf("# accel collectives benchmark: %d processes, backend %s, f32\n", n,
               accel_backend_name(acc));
        printf("# busbw factor: allreduce 2(n-1)/n, allgather/reduce_scatter (n-1)/n, "
               "broadcast 1; memcpy = single-thread memcpy of the same size, same run\n");
        printf("# ratio = busbw / memcpy; bandwidths in GB/s; times are the slowest rank's\n");
        printf("%-15s %10s %10s | %-34s | %-34s | %-34s | %7s | %-17s\n", "", "", "",
               "out of place", "in place", "in place, symmetric (accel_alloc_shared)", "",
               base.name != NULL ? base.name : "no baseline");
        printf("%-15s %10s %10s | %10s %7s %7s %6s | %10s %7s %7s %6s | %10s %7s %7s %6s | %7s | "
               "%10s %6s\n",
               "collective", "size(B)", "count", "time(us)", "algbw", "busbw", "ratio", "time(us)",
               "algbw", "busbw", "ratio", "time(us)", "algbw", "busbw", "ratio", "memcpy",
               "time(us)", "vs_raw");
    }
    for (int c = 0; c < 4; c++) {
        if (only >= 0 && c != only) {
            continue;
        }
        for (size_t nbytes = min_nbytes; nbytes <= max_nbytes; nbytes *= 4) {
            size_t count = nbytes / sizeof(float);
            double t_raw = 0;
            double t_oop = time_coll(acc, (coll)c, send, recv, count, 0,
                                     base.run != NULL ? &base : NULL, &t_raw);
            double t_ip = oop_only ? 0 : time_coll(acc, (coll)c, send, recv, count, 1, NULL, NULL);
            double t_sym = oop_only ? 0 : time_coll(acc, (coll)c, sym, sym, count, 1, NULL, NULL);
            double mbw = 0;
            if (rank == 0) {
                mbw = memcpy_bw(recv, send, nbytes); /* others wait in the barrier */
            }
            CHECK_ACC(acc, accel_barrier(acc, NULL));
            if (rank == 0) {
                double factor = c == ALLREDUCE   ? 2.0 * (n - 1) / n
                                : c == BROADCAST ? 1.0
                                                 : (double)(n - 1) / n;
                char cols[3][48], raw[32] = "         -      -";
                const double ts[3] = {t_oop, t_ip, t_sym};
                for (int k = 0; k < 3; k++) {
                    double bus = (double)nbytes / ts[k] * factor;
                    if (ts[k] > 0) {
                        snprintf(cols[k], sizeof(cols[k]), "%10.2f %7.2f %7.2f %6.2f", ts[k] * 1e6,
                                 nbytes / ts[k] * 1e-9, bus * 1e-9, bus / mbw);
                    } else {
                        snprintf(cols[k], sizeof(cols[k]), "%10s %7s %7s %6s", "-", "-", "-", "-");
                    }
                }
                if (t_raw > 0) {
                    snprintf(raw, sizeof(raw), "%10.2f %6.2f", t_raw * 1e6, t_raw / t_oop);
                }
                printf("%-15s %10zu %10zu | %s | %s | %s | %7.2f | %s\n", coll_names[c], nbytes,
                       count, cols[0], cols[1], cols[2], mbw * 1e-9, raw);
                fflush(stdout);
            }
        }
    }
    CHECK_ACC(acc, accel_free_shared(acc, sym));
#ifdef BENCH_HAVE_GLOO
    bench_gloo_close(gloo);
#endif
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
