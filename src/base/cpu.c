/*
 * CPU feature detection. GCC's and clang's __builtin_cpu_supports cover the AVX2 / AVX-512
 * flags (including the OS's save of the vector state) but clang 14 does not know "f16c", so
 * that one comes from CPUID directly; F16C instructions need the AVX state, hence the AVX2
 * check beside it.
 */
#include "base/cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static const char *const names[ACCEL__CPU_FEATURE_COUNT] = {
    [ACCEL__CPU_AVX2] = "avx2",         [ACCEL__CPU_FMA] = "fma",
    [ACCEL__CPU_F16C] = "f16c",         [ACCEL__CPU_AVX512F] = "avx512f",
    [ACCEL__CPU_AVX512BW] = "avx512bw", [ACCEL__CPU_AVX512VL] = "avx512vl",
    [ACCEL__CPU_AVX512DQ] = "avx512dq",
};

const char *accel__cpu_feature_name(accel__cpu_feature f)
{
    return (int)f >= 0 && f < ACCEL__CPU_FEATURE_COUNT ? names[f] : "?";
}

int accel__cpu_has(accel__cpu_feature f)
{
#if HAVE_X86
    __builtin_cpu_init();
    switch (f) {
    case ACCEL__CPU_AVX2:
        return __builtin_cpu_supports("avx2");
    case ACCEL__CPU_FMA:
        return __builtin_cpu_supports("fma");
    case ACCEL__CPU_F16C: {
        unsigned a, b, c, d;
        return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
               (c & bit_F16C) != 0;
    }
    case ACCEL__CPU_AVX512F:
        return __builtin_cpu_supports("avx512f");
    case ACCEL__CPU_AVX512BW:
        return __builtin_cpu_supports("avx512bw");
    case ACCEL__CPU_AVX512VL:
        return __builtin_cpu_supports("avx512vl");
    case ACCEL__CPU_AVX512DQ:
        return __builtin_cpu_supports("avx512dq");
    case ACCEL__CPU_FEATURE_COUNT:
        break;
    }
    return 0;
#else
    (void)f;
    return 0;
#endif
}
