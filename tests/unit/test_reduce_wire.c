/*
 * Wire-dtype reduction kernels (accel__reduce_wire, src/comm/reduce.c and reduce_x86.c) against
 * what they promise: bit for bit the compressed path, i.e. every f32 input converted to BF16 /
 * F16, reduced in that dtype by accel__reduce (scalar, the reference ISA), converted back to
 * f32. For every wire x op x instruction set available here, 1-4 inputs, odd lengths (vector
 * bodies and tails), unaligned pointers, in place, the second output, and inputs that exercise
 * rounding: values with mantissa bits below the wire format (ties included), signed zeros,
 * subnormals, infinities, NaNs (any NaN matches any NaN), and f16 overflow.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "check.h"
#include "comm/reduce.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Mostly values in [-4, 4) with all 23 mantissa bits random, some special. */
static float next_input(void)
{
    uint64_t r = next_u64();
    switch (r % 32) {
    case 0:
        return INFINITY;
    case 1:
        return -0.0f;
    case 2:
        return 1e-41f; /* subnormal */
    case 3:
        return 70000.0f; /* above f16's range */
    case 4: {
        uint32_t bits = 0x3f808000u; /* exactly halfway between two bf16 values */
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    case 5:
        return NAN;
    default: {
        uint32_t bits = (uint32_t)(r >> 8);
        float f = (float)(bits & 0xffffff) / (float)(1 << 22) - 2.0f;
        return f * (r & 0x80 ? 2.0f : 1.0f);
    }
    }
}

static uint16_t to_wire(accel_dtype w, float f)
{
    return w == ACCEL_BF16 ? accel__f32_to_bf16(f) : accel__f32_to_f16(f);
}
static float from_wire(accel_dtype w, uint16_t h)
{
    return w == ACCEL_BF16 ? accel__bf16_to_f32(h) : accel__f16_to_f32(h);
}

/* The compressed path: convert, reduce in the wire dtype (scalar), convert back. */
static void reference(accel_dtype w, accel_reduce_op op, float *out, float *const *in, int n_in,
                      size_t count)
{
    uint16_t *h[4], *r = malloc((count + 1) * 2);
    const void *hin[4];
    CHECK(r != NULL);
    for (int k = 0; k < n_in; k++) {
        h[k] = malloc((count + 1) * 2);
        CHECK(h[k] != NULL);
        for (size_t i = 0; i < count; i++) {
            h[k][i] = to_wire(w, in[k][i]);
        }
        hin[k] = h[k];
    }
    accel__reduce_isa(ACCEL__ISA_SCALAR, w, op, r, NULL, hin, n_in, count, n_in);
    for (size_t i = 0; i < count; i++) {
        out[i] = from_wire(w, r[i]);
    }
    for (int k = 0; k < n_in; k++) {
        free(h[k]);
    }
    free(r);
}

static void expect_same(const float *got, const float *want, size_t count, const char *what,
                        accel__isa isa, accel_dtype w, int op, int n_in)
{
    for (size_t i = 0; i < count; i++) {
        /* Two NaNs meeting in one operation give the payload of whichever operand the compiler
         * put first (the scalar reference at -O0 orders them otherwise than the vector code):
         * NaN against NaN is a match, whatever the bits. */
        if (memcmp(&got[i], &want[i], 4) != 0 && !(isnan(got[i]) && isnan(want[i]))) {
            uint32_t a, b;
            memcpy(&a, &got[i], 4);
            memcpy(&b, &want[i], 4);
            fprintf(stderr,
                    "%s: isa %s wire %s op %d n_in %d count %zu: element %zu is %08x, the "
                    "compressed path gives %08x\n",
                    what, accel__isa_name(isa), accel_dtype_name(w), op, n_in, count, i, a, b);
            exit(1);
        }
    }
}

static void one_case(accel__isa isa, accel_dtype w, accel_reduce_op op, int n_in, size_t count,
                     size_t misalign)
{
    float *buf[4], *in[4], *want = malloc((count + 1) * 4), *out = malloc((count + 2) * 4);
    float *out2 = malloc((count + 1) * 4);
    CHECK(want != NULL && out != NULL && out2 != NULL);
    const void *cin[4];
    for (int k = 0; k < n_in; k++) {
        buf[k] = malloc((count + 2) * 4);
        CHECK(buf[k] != NULL);
        in[k] = buf[k] + misalign;
        for (size_t i = 0; i < count; i++) {
            in[k][i] = next_input();
        }
        cin[k] = in[k];
    }
    reference(w, op, want, in, n_in, count);
    float *o = out + misalign;
    accel__reduce_wire_isa(isa, w, op, o, out2, cin, n_in, count, n_in);
    expect_same(o, want, count, "out", isa, w, op, n_in);
    expect_same(out2, want, count, "out2", isa, w, op, n_in);
    /* In place on the last input (the allreduce form). */
    accel__reduce_wire_isa(isa, w, op, in[n_in - 1], NULL, cin, n_in, count, n_in);
    expect_same(in[n_in - 1], want, count, "in place", isa, w, op, n_in);
    for (int k = 0; k < n_in; k++) {
        free(buf[k]);
    }
    free(want);
    free(out);
    free(out2);
}

int main(void)
{
    static const size_t counts[] = {0, 1, 7, 8, 15, 16, 31, 33, 64, 65, 127, 1000, 4099};
    static const accel_dtype wires[] = {ACCEL_BF16, ACCEL_F16};
    int cases = 0;
    for (int isa = 0; isa < ACCEL__ISA_COUNT; isa++) {
        if (!accel__isa_available((accel__isa)isa)) {
            continue;
        }
        for (int wi = 0; wi < 2; wi++) {
            for (int op = ACCEL_SUM; op <= ACCEL_PROD; op++) {
                for (int n_in = 1; n_in <= 4; n_in++) {
                    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                        one_case((accel__isa)isa, wires[wi], (accel_reduce_op)op, n_in, counts[c],
                                 c % 3);
                        cases++;
                    }
                }
            }
        }
    }
    /* The dispatching entry point uses the best ISA: same answer. */
    float a[5] = {1.00390625f, 2.5f, -3.0f, 1e-41f, 65519.0f}, b[5] = {1, 1, 1, 1, 1}, r[5];
    const void *in[2] = {a, b};
    float *ins[2] = {a, b}, want[5];
    reference(ACCEL_F16, ACCEL_AVG, want, ins, 2, 5);
    accel__reduce_wire(ACCEL_F16, ACCEL_AVG, r, NULL, in, 2, 5, 2);
    CHECK(memcmp(r, want, sizeof(r)) == 0);
    printf("test_reduce_wire: %d cases, best isa %s\n", cases, accel__isa_name(accel__isa_best()));
    return 0;
}
