/*
 * Helpers of the CUDA benchmarks (bench/cuda_*.cu, built with ACCEL_CUDA only): a checked CUDA
 * call, a wall clock, the GPU's one-line description, and the summary row every benchmark
 * prints for bench/cuda_all.sh ("| benchmark | configuration | figure | target |", which the
 * script collects into one table).
 */
#ifndef ACCEL_BENCH_CUDA_BENCH_H
#define ACCEL_BENCH_CUDA_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <accel/accel.h>
#include <accel/cuda.h>

/* A CUDA call that must succeed. */
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* accel_init, or exit 77 (skipped) when this process has no GPU. */
static inline accel *bench_cuda_init(const char *prog, const accel_options *o)
{
    accel *acc;
    ACCEL_CHECK(accel_init(&acc, o));
    if (accel_device_of(acc).type != ACCEL_DEVICE_CUDA) {
        fprintf(stderr, "%s: skipped: no CUDA GPU for this process (it runs on %s)\n", prog,
                accel_device_name(acc));
        accel_free(acc);
        exit(77);
    }
    return acc;
}

/* "NVIDIA H100 80GB HBM3, driver 13.0" for the process's GPU. */
static inline const char *bench_gpu_name(accel *acc)
{
    static char buf[320];
    struct cudaDeviceProp p;
    int driver = 0;
    CUDA_CHECK(cudaGetDeviceProperties(&p, accel_cuda_device(acc)));
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    snprintf(buf, sizeof(buf), "%s, driver API %d.%d", p.name, driver / 1000, driver % 1000 / 10);
    return buf;
}

#endif
