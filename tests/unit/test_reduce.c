/*
 * Reduction kernels (src/comm/reduce.c) against a straightforward per-element reference, for
 * every dtype x op x instruction set available on this CPU, with odd lengths, unaligned
 * pointers, 1-4 inputs, in-place outputs and the second output. Results must be bit-identical.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/reduce.h"
#include "base/half.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A value in [-4, 4) with few mantissa bits, so products and sums stay finite. */
static float next_float(void)
{
    return (float)((int)(next_u64() % 2048) - 1024) / 256.0f;
}

static void fill(accel_dtype dt, void *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f = next_float();
        uint64_t r = next_u64();
        switch (dt) {
        case ACCEL_F32:
            ((float *)buf)[i] = f;
            break;
        case ACCEL_F64:
            ((double *)buf)[i] = (double)f / 3.0;
            break;
        case ACCEL_F16:
            ((uint16_t *)buf)[i] = accel__f32_to_f16(f);
            break;
        case ACCEL_BF16:
            ((uint16_t *)buf)[i] = accel__f32_to_bf16(f);
            break;
        case ACCEL_F8_E4M3:
            ((uint8_t *)buf)[i] = accel__f32_to_f8e4m3(f);
            break;
        case ACCEL_F8_E5M2:
            ((uint8_t *)buf)[i] = accel__f32_to_f8e5m2(f);
            break;
        case ACCEL_BOOL:
            ((uint8_t *)buf)[i] = (uint8_t)(r % 3 == 0 ? 0 : r % 5 == 0 ? 7 : 1);
            break;
        default:
            memcpy((char *)buf + i * accel_dtype_nbytes(dt), &r, accel_dtype_nbytes(dt));
        }
    }
}

static float dec(accel_dtype dt, const void *p)
{
    uint16_t h;
    uint8_t b;
    switch (dt) {
    case ACCEL_F16:
        memcpy(&h, p, 2);
        return accel__f16_to_f32(h);
    case ACCEL_BF16:
        memcpy(&h, p, 2);
        return accel__bf16_to_f32(h);
    case ACCEL_F8_E4M3:
        memcpy(&b, p, 1);
        return accel__f8e4m3_to_f32(b);
    default:
        memcpy(&b, p, 1);
        return accel__f8e5m2_to_f32(b);
    }
}

static void enc(accel_dtype dt, void *p, float f)
{
    uint16_t h;
    uint8_t b;
    switch (dt) {
    case ACCEL_F16:
        h = accel__f32_to_f16(f);
        memcpy(p, &h, 2);
        break;
    case ACCEL_BF16:
        h = accel__f32_to_bf16(f);
        memcpy(p, &h, 2);
        break;
    case ACCEL_F8_E4M3:
        b = accel__f32_to_f8e4m3(f);
        memcpy(p, &b, 1);
        break;
    default:
        b = accel__f32_to_f8e5m2(f);
        memcpy(p, &b, 1);
        break;
    }
}

static int64_t load_int(accel_dtype dt, const void *p)
{
    switch (dt) {
    case ACCEL_I8:
        return *(const int8_t *)p;
    case ACCEL_U8:
        return *(const uint8_t *)p;
    case ACCEL_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case ACCEL_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case ACCEL_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

/* Element e of the reference result, written to `out` (one element). */
static void ref_elem(accel_dtype dt, accel_reduce_op op, const void *const *in, int n, size_t e,
                     void *out)
{
    size_t es = accel_dtype_nbytes(dt);
    if (dt == ACCEL_F32 || dt == ACCEL_F64 || dt == ACCEL_F16 || dt == ACCEL_BF16 ||
        dt == ACCEL_F8_E4M3 || dt == ACCEL_F8_E5M2) {
        /* f64 is the only type not accumulated in f32. */
        double accd = 0;
        float accf = 0;
        for (int k = 0; k < n; k++) {
            const char *p = (const char *)in[k] + e * es;
            double vd = 0;
            float vf = 0;
            if (dt == ACCEL_F64) {
                memcpy(&vd, p, 8);
            } else if (dt == ACCEL_F32) {
                memcpy(&vf, p, 4);
            } else {
                vf = dec(dt, p);
            }
            if (k == 0) {
                accd = vd;
                accf = vf;
                continue;
            }
            switch (op) {
            case ACCEL_SUM:
            case ACCEL_AVG:
                accd += vd;
                accf += vf;
                break;
            case ACCEL_PROD:
                accd *= vd;
                accf *= vf;
                break;
            case ACCEL_MAX:
                accd = vd > accd ? vd : accd;
                accf = vf > accf ? vf : accf;
                break;
            case ACCEL_MIN:
                accd = vd < accd ? vd : accd;
                accf = vf < accf ? vf : accf;
                break;
            }
        }
        if (op == ACCEL_AVG) {
            accd /= (double)n;
            accf /= (float)n;
        }
        if (dt == ACCEL_F64) {
            memcpy(out, &accd, 8);
        } else if (dt == ACCEL_F32) {
            memcpy(out, &accf, 4);
        } else {
            enc(dt, out, accf);
        }
        return;
    }
    if (dt == ACCEL_BOOL) {
        int is_or = op == ACCEL_SUM || op == ACCEL_MAX;
        int acc = is_or ? 0 : 1;
        for (int k = 0; k < n; k++) {
            int v = ((const uint8_t *)in[k])[e] != 0;
            acc = is_or ? (acc | v) : (acc & v);
        }
        *(uint8_t *)out = (uint8_t)acc;
        return;
    }
    uint64_t acc = 0;
    int64_t sacc = 0;
    for (int k = 0; k < n; k++) {
        int64_t v = load_int(dt, (const char *)in[k] + e * es);
        if (k == 0) {
            acc = (uint64_t)v;
            sacc = v;
            continue;
        }
        switch (op) {
        case ACCEL_SUM:
            acc += (uint64_t)v;
            break;
        case ACCEL_AVG:
            sacc = (int64_t)((uint64_t)sacc + (uint64_t)v);
            break;
        case ACCEL_PROD:
            acc *= (uint64_t)v;
            break;
        case ACCEL_MAX:
            acc = (uint64_t)(v > (int64_t)acc ? v : (int64_t)acc);
            break;
        case ACCEL_MIN:
            acc = (uint64_t)(v < (int64_t)acc ? v : (int64_t)acc);
            break;
        }
    }
    if (op == ACCEL_AVG) {
        acc = (uint64_t)(sacc / n);
    }
    memcpy(out, &acc, es); /* little-endian: the low bytes are the wrapped value */
}

static const accel_dtype all_dtypes[] = {
    ACCEL_F32, ACCEL_F64, ACCEL_F16, ACCEL_BF16, ACCEL_F8_E4M3, ACCEL_F8_E5M2, ACCEL_I8,
    ACCEL_U8,  ACCEL_I16, ACCEL_U16, ACCEL_I32,  ACCEL_I64,     ACCEL_BOOL};

int main(void)
{
    static const size_t counts[] = {1, 7, 31, 255, 256, 257, 1031};
    enum { MAXN = 4, MAXC = 1031, PAD = 64 };
    int checked = 0;
    for (int isa = 0; isa < ACCEL__ISA_COUNT; isa++) {
        if (!accel__isa_available((accel__isa)isa)) {
            printf("isa %s: not available, skipped\n", accel__isa_name((accel__isa)isa));
            continue;
        }
        for (size_t d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++) {
            accel_dtype dt = all_dtypes[d];
            size_t es = accel_dtype_nbytes(dt);
            for (int op = ACCEL_SUM; op <= ACCEL_PROD; op++) {
                if (dt == ACCEL_BOOL && op == ACCEL_AVG) {
                    continue;
                }
                for (int n = 1; n <= MAXN; n++) {
                    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                        size_t count = counts[ci];
                        /* Misalign by one element (and a varying amount) from a 64-byte base. */
                        size_t skew = (ci + (size_t)n) % 3;
                        char *bufs[MAXN], *out, *out2, *ref;
                        const void *in[MAXN];
                        for (int k = 0; k < n; k++) {
                            bufs[k] = malloc((MAXC + PAD) * 8);
                            in[k] = bufs[k] + (skew + (size_t)k) * es;
                            fill(dt, (void *)in[k], count);
                        }
                        out = malloc((MAXC + PAD) * 8);
                        out2 = malloc((MAXC + PAD) * 8);
                        ref = malloc((MAXC + PAD) * 8);
                        for (size_t e = 0; e < count; e++) {
                            ref_elem(dt, (accel_reduce_op)op, in, n, e, ref + e * es);
                        }
                        /* Out of place, with a second output and a guard byte after it. */
                        char *o = out + (skew + 1) * es;
                        memset(out, 0xA5, (MAXC + PAD) * 8);
                        accel__reduce_isa((accel__isa)isa, dt, (accel_reduce_op)op, o, out2, in, n,
                                          count, n);
                        CHECK_MSG(
                            memcmp(o, ref, count * es) == 0, "isa %s dtype %s op %d n %d count %zu",
                            accel__isa_name((accel__isa)isa), accel_dtype_name(dt), op, n, count);
                        CHECK(memcmp(out2, ref, count * es) == 0);
                        CHECK((unsigned char)o[count * es] == 0xA5);
                        /* In place on the last input. */
                        accel__reduce_isa((accel__isa)isa, dt, (accel_reduce_op)op,
                                          (void *)in[n - 1], NULL, in, n, count, n);
                        CHECK_MSG(memcmp(in[n - 1], ref, count * es) == 0,
                                  "in place: isa %s dtype %s op %d n %d count %zu",
                                  accel__isa_name((accel__isa)isa), accel_dtype_name(dt), op, n,
                                  count);
                        for (int k = 0; k < n; k++) {
                            free(bufs[k]);
                        }
                        free(out);
                        free(out2);
                        free(ref);
                        checked++;
                    }
                }
            }
        }
        printf("isa %s: ok\n", accel__isa_name((accel__isa)isa));
    }
    CHECK(checked > 0);
    printf("best isa: %s, %d cases\n", accel__isa_name(accel__isa_best()), checked);
    return 0;
}
