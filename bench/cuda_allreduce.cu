/*
 * cuda_allreduce: accel_allreduce on GPU memory through the staging path (issue 14's
 * benchmark): processes sharing a GPU (or one each) with a host backend (shm), the buffer in
 * device memory, so each call copies it to pinned host memory, reduces it there and copies it
 * back (src/core/coll_stage.c).
 *
 *     build-cuda/accel launch --num_processes 2 build-cuda/bench/cuda_allreduce [--max-mib 256]
 *
 * For f32 sums from 1 MiB to --max-mib (x2 steps), in place: the time per call (best of 3
 * batches, the slowest process's), algbw = bytes / time and busbw = algbw x 2(n-1)/n (as
 * nccl-tests), next to the same allreduce on host memory in the same run (the staging's
 * cost is the difference). Prints on process 0, then a summary row for bench/cuda_all.sh.
 * Exits 77 when this process has no GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_bench.h"

#define TRIALS 3

/* Seconds per call on buf (count floats), the slowest process's best batch. */
static double time_allreduce(accel *acc, float *buf, size_t count)
{
    const size_t nbytes = count * sizeof(float);
    int iters = (int)((64u << 20) / nbytes);
    iters = iters < 2 ? 2 : iters > 20 ? 20 : iters;
    for (int i = 0; i < 2; i++) { /* warm up: faults, the staging buffer's growth */
        ACCEL_CHECK(accel_allreduce(acc, buf, buf, count, ACCEL_F32, ACCEL_SUM, NULL));
    }
    double best = 1e30;
    for (int t = 0; t < TRIALS; t++) {
        ACCEL_CHECK(accel_barrier(acc, NULL));
        double t0 = bench_now();
        for (int i = 0; i < iters; i++) {
            ACCEL_CHECK(accel_allreduce(acc, buf, buf, count, ACCEL_F32, ACCEL_SUM, NULL));
        }
        double dt = (bench_now() - t0) / iters;
        best = dt < best ? dt : best;
    }
    ACCEL_CHECK(accel_allreduce(acc, &best, &best, 1, ACCEL_F64, ACCEL_MAX, NULL));
    return best;
}

int main(int argc, char **argv)
{
    int max_mib = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--max-mib") == 0) {
            max_mib = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "cuda_allreduce: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (max_mib < 1) {
        fprintf(stderr, "cuda_allreduce: --max-mib must be at least 1\n");
        return 2;
    }
    accel *acc = bench_cuda_init("cuda_allreduce", NULL);
    const int n = accel_num_processes(acc);
    const double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;
    const size_t max_bytes = (size_t)max_mib << 20;
    float *dev = NULL;
    CUDA_CHECK(cudaMalloc(&dev, max_bytes));
    CUDA_CHECK(cudaMemset(dev, 0, max_bytes));
    float *host = (float *)calloc(1, max_bytes);
    if (host == NULL) {
        fprintf(stderr, "cuda_allreduce: out of memory\n");
        return 1;
    }
    accel_print(acc,
                "cuda_allreduce: %s; %d process%s, backend %s, f32 sum in place, best of %d "
                "batches; GB/s = 1e9 bytes/s%s\n",
                bench_gpu_name(acc), n, n > 1 ? "es" : "", accel_backend_name(acc), TRIALS,
                n > 1 ? "" : " (one process: busbw is algbw)");
    accel_print(acc, "  %9s  %10s %9s %9s  %10s %9s  %7s\n", "size", "device ms", "algbw",
                "busbw", "host ms", "busbw", "dev/host");
    char row[256];
    int k = 0;
    for (size_t nbytes = (size_t)1 << 20; nbytes <= max_bytes; nbytes *= 2) {
        const size_t count = nbytes / sizeof(float);
        double td = time_allreduce(acc, dev, count), th = time_allreduce(acc, host, count);
        double alg = (double)nbytes / td / 1e9, busd = alg * bus;
        double bush = (double)nbytes / th / 1e9 * bus;
        accel_print(acc, "  %6zu MiB  %10.3f %9.2f %9.2f  %10.3f %9.2f  %7.2f\n", nbytes >> 20,
                    td * 1e3, alg, busd, th * 1e3, bush, th / td);
        if ((nbytes >> 20) == 1 || (nbytes >> 20) == 16 || nbytes * 2 > max_bytes) {
            k += snprintf(row + k, sizeof(row) - (size_t)k, "%s%zu MiB %.2f (host %.2f)",
                          k ? ", " : "", nbytes >> 20, busd, bush);
        }
    }
    accel_print(acc,
                "| allreduce busbw on device buffers, GB/s | %d process%s, backend %s%s | %s | - |\n",
                n, n > 1 ? "es" : "", accel_backend_name(acc),
                strcmp(accel_backend_name(acc), "nccl") != 0 ? " (staged)" : "", row);
    CUDA_CHECK(cudaFree(dev));
    free(host);
    accel_free(acc);
    return 0;
}
