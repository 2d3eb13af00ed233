/*
 * Private bulk conversions between f32 and f16 / bf16, for the modules that cast whole buffers
 * (mixed precision, compressed communication, checkpoints, nn autocast), and the per-ISA kernel
 * tables behind them so tests and benchmarks can compare every vector path with the scalar one.
 *
 * Every kernel produces exactly the bits of the scalar reference in src/base/half.h (RNE,
 * subnormals kept, NaN quietened), whatever the CPU's FTZ/DAZ settings.
 */
#ifndef ACCEL_BASE_CONVERT_H
#define ACCEL_BASE_CONVERT_H

#include <stddef.h>
#include <stdint.h>

typedef enum accel__cvt_isa {
    ACCEL__CVT_SCALAR = 0, /* portable C over half.h */
    ACCEL__CVT_AVX2,       /* AVX2 + F16C */
    ACCEL__CVT_AVX512,     /* AVX-512F + AVX-512BW */
    ACCEL__CVT_ISA_COUNT
} accel__cvt_isa;

typedef struct accel__cvt_kernels {
    const char *name;
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t count);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t count);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t count);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t count);
} accel__cvt_kernels;

/* The kernels of `isa`, or NULL when this CPU (or this build) cannot run them. */
const accel__cvt_kernels *accel__cvt_kernels_for(accel__cvt_isa isa);

/* The kernels in use: the best available, unless overridden by accel__cvt_force. Thread-safe. */
const accel__cvt_kernels *accel__cvt_best(void);

/* Forces dispatch to `isa` (tests, benchmarks); returns 0 if it is not available (nothing
 * changes), 1 otherwise. ACCEL__CVT_ISA_COUNT restores automatic choice. Not thread-safe with
 * conversions running concurrently. */
int accel__cvt_force(accel__cvt_isa isa);

/* Convenience wrappers over accel__cvt_best(). Buffers must not overlap. */
void accel__f32_to_bf16_n(uint16_t *dst, const float *src, size_t count);
void accel__bf16_to_f32_n(float *dst, const uint16_t *src, size_t count);
void accel__f32_to_f16_n(uint16_t *dst, const float *src, size_t count);
void accel__f16_to_f32_n(float *dst, const uint16_t *src, size_t count);

/* Kernel tables defined in convert_x86.c (NULL entries when not compiled for x86-64). */
extern const accel__cvt_kernels accel__cvt_avx2_kernels;
extern const accel__cvt_kernels accel__cvt_avx512_kernels;
/* 1 when the x86 kernels are compiled in (x86-64 GCC/Clang). */
extern const int accel__cvt_have_x86;

#endif /* ACCEL_BASE_CONVERT_H */
