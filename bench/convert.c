/*
 * Conversion throughput: f32 -> bf16, bf16 -> f32, f32 -> f16, f16 -> f32 for every kernel set
 * this CPU can run, against memcpy of the f32-side buffer measured in the same run.
 *
 *     build/bench/convert [MiB]        (default 64: the f32 buffer size)
 *
 * Each row is the best of several repetitions on warm (already faulted-in) buffers. GB/s counts
 * the f32-side bytes, so "x memcpy" compares converting N floats with copying those N floats.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "core/internal.h"
#include "base/convert.h"

#define REPS 7

typedef enum { F32_BF16, BF16_F32, F32_F16, F16_F32, N_OPS } op_kind;
static const char *op_names[N_OPS] = {"f32->bf16", "bf16->f32", "f32->f16", "f16->f32"};

static double time_op(const accel__cvt_kernels *k, op_kind op, float *f, uint16_t *h, size_t n)
{
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = accel__now();
        switch (op) {
        case F32_BF16:
            k->f32_to_bf16(h, f, n);
            break;
        case BF16_F32:
            k->bf16_to_f32(f, h, n);
            break;
        case F32_F16:
            k->f32_to_f16(h, f, n);
            break;
        default:
            k->f16_to_f32(f, h, n);
            break;
        }
        double t = accel__now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
    size_t n = mib * 1024 * 1024 / sizeof(float);
    float *f = malloc(n * sizeof *f), *f2 = malloc(n * sizeof *f2);
    uint16_t *h = malloc(n * sizeof *h);
    if (f == NULL || f2 == NULL || h == NULL || n == 0) {
        fprintf(stderr, "convert: cannot allocate %zu MiB buffers\n", mib);
        return 1;
    }
    /* Realistic values (weights around 1e-2, some subnormal-range and large ones) and every
     * page touched before timing. */
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        f[i] = (float)((double)(int64_t)s * 0x1p-69);
    }
    memset(f2, 0, n * sizeof *f2);
    memset(h, 0, n * sizeof *h);

    double tm = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = accel__now();
        memcpy(f2, f, n * sizeof *f);
        double t = accel__now() - t0;
        tm = t < tm ? t : tm;
    }
    double gb = (double)(n * sizeof(float)) / 1e9;
    printf("buffer: %zu MiB of f32 (%zu elements); memcpy of it: %.2f ms, %.2f GB/s\n\n", mib, n,
           tm * 1e3, gb / tm);
    printf("%-10s %-10s %9s %9s %9s\n", "op", "kernels", "ms", "GB/s", "x memcpy");
    for (int isa = 0; isa < ACCEL__CVT_ISA_COUNT; isa++) {
        const accel__cvt_kernels *k = accel__cvt_kernels_for((accel__cvt_isa)isa);
        if (k == NULL) {
            continue;
        }
        for (int op = 0; op < N_OPS; op++) {
            /* keep f holding the original values: widening writes into it */
            if (op == BF16_F32 || op == F16_F32) {
                memcpy(f2, f, n * sizeof *f);
            }
            double t = time_op(k, (op_kind)op, op == BF16_F32 || op == F16_F32 ? f2 : f, h, n);
            printf("%-10s %-10s %9.2f %9.2f %9.2f\n", op_names[op], k->name, t * 1e3, gb / t,
                   tm / t);
        }
    }
    printf("\ndispatch default: %s\n", accel__cvt_best()->name);
    free(f);
    free(f2);
    free(h);
    return 0;
}
