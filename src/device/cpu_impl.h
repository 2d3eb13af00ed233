/*
 * Shared by the CPU device's files: the ISA-dispatch attribute of its vectorised loops, the
 * size from which a default-stream kernel fans out to OpenMP threads, and the optimizer
 * kernels of cpu_optim.c that the operations table in cpu.c calls.
 */
#ifndef ACCEL_DEVICE_CPU_IMPL_H
#define ACCEL_DEVICE_CPU_IMPL_H

#include "device.h"

/* Hot loops are compiled for AVX-512, AVX2 and the baseline ISA and picked at load time,
 * because the build targets baseline x86-64. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL
#endif

/* Below this many elements a kernel runs on the calling thread only. */
#define ACCEL__CPU_PARALLEL_MIN 65536

/* One optimizer update; `parallel`: may use the OpenMP pool (default stream). */
void accel__cpu_sgd(const accel__sgd_args *a, int parallel);
void accel__cpu_adam(const accel__adam_args *a, int parallel);

#endif /* ACCEL_DEVICE_CPU_IMPL_H */
