/*
 * CPU features for run-time kernel dispatch: one answer for every module (comm reductions,
 * dtype conversions, optimizer kernels, `accel env`), so they always agree on what this CPU
 * can run. All features read 0 on a non-x86 build.
 */
#ifndef ACCEL_BASE_CPU_H
#define ACCEL_BASE_CPU_H

typedef enum accel__cpu_feature {
    ACCEL__CPU_AVX2,
    ACCEL__CPU_FMA,
    ACCEL__CPU_F16C,
    ACCEL__CPU_AVX512F,
    ACCEL__CPU_AVX512BW,
    ACCEL__CPU_AVX512VL,
    ACCEL__CPU_AVX512DQ,
    ACCEL__CPU_FEATURE_COUNT
} accel__cpu_feature;

/* 1 when this CPU (and the OS, for the vector register state) supports f. Thread-safe. */
int accel__cpu_has(accel__cpu_feature f);

/* The feature's name as in /proc/cpuinfo ("avx512bw"). */
const char *accel__cpu_feature_name(accel__cpu_feature f);

#endif /* ACCEL_BASE_CPU_H */
