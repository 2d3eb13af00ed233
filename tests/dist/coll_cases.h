/*
 * The buffer-collective cases shared by test_collectives.c and test_symmetric.c: deterministic
 * inputs per (rank, index), the exact expected result of every collective, and the matrix of
 * collective x dtype x op x in place x root. The including test sets acc, rank, n_ranks,
 * sendbuf and recvbuf (large enough for the biggest count x 8 bytes x processes) first.
 */
#ifndef ACCEL_TEST_COLL_CASES_H
#define ACCEL_TEST_COLL_CASES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "base/half.h"

static int rank, n_ranks;
static accel *acc;

/* Element i of rank r's input for test case `seed`, stored as dtype dt at out. Values are small
 * (|v| <= 2 for floats, <= 6 for integers) so sums and products of 4 ranks stay meaningful. */
static void gen(accel_dtype dt, int r, size_t i, unsigned seed, void *out)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + seed * 977u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float f = (float)((int)(h % 17) - 8) / 4.0f;
    int64_t si = (int64_t)(h % 13) - 6;
    uint64_t ui = h % 13;
    switch (dt) {
    case ACCEL_F32:
        memcpy(out, &f, 4);
        break;
    case ACCEL_F64: {
        double d = (double)f / 3.0;
        memcpy(out, &d, 8);
        break;
    }
    case ACCEL_F16: {
        uint16_t v = accel__f32_to_f16(f);
        memcpy(out, &v, 2);
        break;
    }
    case ACCEL_BF16: {
        uint16_t v = accel__f32_to_bf16(f);
        memcpy(out, &v, 2);
        break;
    }
    case ACCEL_F8_E4M3:
        *(uint8_t *)out = accel__f32_to_f8e4m3(f);
        break;
    case ACCEL_F8_E5M2:
        *(uint8_t *)out = accel__f32_to_f8e5m2(f);
        break;
    case ACCEL_I8:
        *(int8_t *)out = (int8_t)si;
        break;
    case ACCEL_U8:
        *(uint8_t *)out = (uint8_t)ui;
        break;
    case ACCEL_I16: {
        int16_t v = (int16_t)si;
        memcpy(out, &v, 2);
        break;
    }
    case ACCEL_U16: {
        uint16_t v = (uint16_t)ui;
        memcpy(out, &v, 2);
        break;
    }
    case ACCEL_I32: {
        int32_t v = (int32_t)si;
        memcpy(out, &v, 4);
        break;
    }
    case ACCEL_I64:
        memcpy(out, &si, 8);
        break;
    case ACCEL_BOOL:
        *(uint8_t *)out = (uint8_t)(h % 3 != 0);
        break;
    default:
        CHECK(0);
    }
}

static double to_double(accel_dtype dt, const void *p)
{
    uint16_t h;
    float f;
    double d;
    switch (dt) {
    case ACCEL_F32:
        memcpy(&f, p, 4);
        return f;
    case ACCEL_F64:
        memcpy(&d, p, 8);
        return d;
    case ACCEL_F16:
        memcpy(&h, p, 2);
        return accel__f16_to_f32(h);
    case ACCEL_BF16:
        memcpy(&h, p, 2);
        return accel__bf16_to_f32(h);
    case ACCEL_F8_E4M3:
        return accel__f8e4m3_to_f32(*(const uint8_t *)p);
    case ACCEL_F8_E5M2:
        return accel__f8e5m2_to_f32(*(const uint8_t *)p);
    case ACCEL_I8:
        return *(const int8_t *)p;
    case ACCEL_U8:
    case ACCEL_BOOL:
        return *(const uint8_t *)p;
    case ACCEL_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case ACCEL_U16:
        memcpy(&h, p, 2);
        return h;
    case ACCEL_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    }
}

/* Floating-point reductions are checked in the association of the backend: rank order
 * (ref_group 0), or groups of ref_group consecutive ranks first and then the groups in order
 * (hier: a machine's processes, then the machines). */
static int ref_group;

/* *af op= vf and *ad op= v, for a float reduction. */
static void combine(accel_reduce_op op, float *af, double *ad, float vf, double v)
{
    if (op == ACCEL_SUM || op == ACCEL_AVG) {
        *af += vf;
        *ad += v;
    } else if (op == ACCEL_PROD) {
        *af *= vf;
        *ad *= v;
    } else if (op == ACCEL_MAX) {
        *af = vf > *af ? vf : *af;
        *ad = v > *ad ? v : *ad;
    } else {
        *af = vf < *af ? vf : *af;
        *ad = v < *ad ? v : *ad;
    }
}

/* The expected reduction of element i over all ranks, stored as dt at out. */
static void ref_reduce(accel_dtype dt, accel_reduce_op op, size_t i, unsigned seed, void *out)
{
    unsigned char e[8];
    if (dt == ACCEL_BOOL) {
        int is_or = op == ACCEL_SUM || op == ACCEL_MAX, acc_b = !is_or;
        for (int r = 0; r < n_ranks; r++) {
            gen(dt, r, i, seed, e);
            acc_b = is_or ? (acc_b | (e[0] != 0)) : (acc_b & (e[0] != 0));
        }
        *(uint8_t *)out = (uint8_t)acc_b;
        return;
    }
    if (accel_dtype_is_float(dt)) {
        /* Groups of ref_group consecutive ranks combine first, then the groups in order. */
        const int group = ref_group > 0 ? ref_group : n_ranks;
        float af = 0;
        double ad = 0;
        for (int g0 = 0; g0 < n_ranks; g0 += group) {
            float pf = 0;
            double pd = 0;
            for (int r = g0; r < g0 + group; r++) {
                gen(dt, r, i, seed, e);
                double v = to_double(dt, e);
                float vf = (float)v; /* exact: every non-f64 input is an f32 value */
                if (r == g0) {
                    pf = vf;
                    pd = v;
                } else {
                    combine(op, &pf, &pd, vf, v);
                }
            }
            if (g0 == 0) {
                af = pf;
                ad = pd;
            } else {
                combine(op, &af, &ad, pf, pd);
            }
        }
        if (op == ACCEL_AVG) {
            af /= (float)n_ranks;
            ad /= (double)n_ranks;
        }
        uint16_t h;
        switch (dt) {
        case ACCEL_F32:
            memcpy(out, &af, 4);
            break;
        case ACCEL_F64:
            memcpy(out, &ad, 8);
            break;
        case ACCEL_F16:
            h = accel__f32_to_f16(af);
            memcpy(out, &h, 2);
            break;
        case ACCEL_BF16:
            h = accel__f32_to_bf16(af);
            memcpy(out, &h, 2);
            break;
        case ACCEL_F8_E4M3:
            *(uint8_t *)out = accel__f32_to_f8e4m3(af);
            break;
        default:
            *(uint8_t *)out = accel__f32_to_f8e5m2(af);
            break;
        }
        return;
    }
    uint64_t a = 0;
    int64_t s = 0;
    for (int r = 0; r < n_ranks; r++) {
        gen(dt, r, i, seed, e);
        int64_t v = (int64_t)to_double(dt, e);
        if (r == 0) {
            a = (uint64_t)v;
            s = v;
        } else if (op == ACCEL_SUM) {
            a += (uint64_t)v;
        } else if (op == ACCEL_AVG) {
            s += v;
        } else if (op == ACCEL_PROD) {
            a *= (uint64_t)v;
        } else if (op == ACCEL_MAX) {
            a = (uint64_t)(v > (int64_t)a ? v : (int64_t)a);
        } else {
            a = (uint64_t)(v < (int64_t)a ? v : (int64_t)a);
        }
    }
    if (op == ACCEL_AVG) {
        a = (uint64_t)(s / n_ranks);
    }
    memcpy(out, &a, accel_dtype_nbytes(dt)); /* little-endian: the wrapped low bytes */
}

static char *sendbuf, *recvbuf;
static size_t buf_nbytes;

static void fill_input(accel_dtype dt, int r, size_t first, size_t count, unsigned seed, char *dst)
{
    size_t es = accel_dtype_nbytes(dt);
    for (size_t i = 0; i < count; i++) {
        gen(dt, r, first + i, seed, dst + i * es);
    }
}

static void expect_eq(const void *got, const void *want, size_t es, const char *what,
                      accel_dtype dt, int op, size_t count, int in_place, int root, size_t i)
{
    if (memcmp(got, want, es) != 0) {
        fprintf(stderr,
                "rank %d/%d: %s dtype %s op %d count %zu in_place %d root %d: element %zu is "
                "%.9g, expected %.9g\n",
                rank, n_ranks, what, accel_dtype_name(dt), op, count, in_place, root, i,
                to_double(dt, got), to_double(dt, want));
        exit(1);
    }
}

static unsigned seed_counter;

/* One case of one collective; every process runs the same sequence. */
static void run_case(int kind, accel_dtype dt, accel_reduce_op op, size_t count, int in_place,
                     int root)
{
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather",
                                  "broadcast", "reduce",         "gather_to"};
    const size_t es = accel_dtype_nbytes(dt);
    const unsigned seed = ++seed_counter;
    size_t off, cnt;
    accel_chunk_range(count, n_ranks, rank, &off, &cnt);
    unsigned char want[8];
    memset(recvbuf, 0x5A, count * es * (size_t)n_ranks + es);
    const char *name = names[kind];
    switch (kind) {
    case 0: { /* allreduce */
        char *in = in_place ? recvbuf : sendbuf;
        fill_input(dt, rank, 0, count, seed, in);
        CHECK_OK(acc, accel_allreduce(acc, in, recvbuf, count, dt, op, NULL));
        for (size_t i = 0; i < count; i++) {
            ref_reduce(dt, op, i, seed, want);
            expect_eq(recvbuf + i * es, want, es, name, dt, op, count, in_place, root, i);
        }
        break;
    }
    case 1: { /* reduce_scatter: in place means recv is my chunk inside send */
        fill_input(dt, rank, 0, count, seed, sendbuf);
        char *out = in_place ? sendbuf + off * es : recvbuf;
        CHECK_OK(acc, accel_reduce_scatter(acc, sendbuf, out, count, dt, op, NULL));
        for (size_t j = 0; j < cnt; j++) {
            ref_reduce(dt, op, off + j, seed, want);
            expect_eq(out + j * es, want, es, name, dt, op, count, in_place, root, off + j);
        }
        break;
    }
    case 2: { /* allgather: rank r contributes elements [off_r, off_r + cnt_r) */
        char *in = in_place ? recvbuf + off * es : sendbuf;
        fill_input(dt, rank, off, cnt, seed, in);
        CHECK_OK(acc, accel_allgather(acc, in, recvbuf, count, dt, NULL));
        for (int q = 0; q < n_ranks; q++) {
            size_t qo, qc;
            accel_chunk_range(count, n_ranks, q, &qo, &qc);
            for (size_t j = 0; j < qc; j++) {
                gen(dt, q, qo + j, seed, want);
                expect_eq(recvbuf + (qo + j) * es, want, es, name, dt, op, count, in_place, root,
                          qo + j);
            }
        }
        break;
    }
    case 3: { /* broadcast */
        char *in = in_place ? recvbuf : sendbuf;
        if (rank == root) {
            fill_input(dt, rank, 0, count, seed, in);
        }
        CHECK_OK(acc, accel_broadcast(acc, in, recvbuf, count, dt, root, NULL));
        for (size_t i = 0; i < count; i++) {
            gen(dt, root, i, seed, want);
            expect_eq(recvbuf + i * es, want, es, name, dt, op, count, in_place, root, i);
        }
        break;
    }
    case 4: { /* reduce to root; recv untouched (NULL) elsewhere */
        char *in = in_place && rank == root ? recvbuf : sendbuf;
        fill_input(dt, rank, 0, count, seed, in);
        CHECK_OK(acc, accel_reduce_to(acc, in, rank == root ? recvbuf : NULL, count, dt, op, root,
                                      NULL));
        for (size_t i = 0; rank == root && i < count; i++) {
            ref_reduce(dt, op, i, seed, want);
            expect_eq(recvbuf + i * es, want, es, name, dt, op, count, in_place, root, i);
        }
        break;
    }
    default: { /* gather_to: in place on root means its send is its slot of recv */
        char *in = in_place && rank == root ? recvbuf + (size_t)rank * count * es : sendbuf;
        fill_input(dt, rank, 0, count, seed, in);
        CHECK_OK(acc,
                 accel_gather_to(acc, in, rank == root ? recvbuf : NULL, count, dt, root, NULL));
        for (int q = 0; rank == root && q < n_ranks; q++) {
            for (size_t j = 0; j < count; j++) {
                gen(dt, q, j, seed, want);
                expect_eq(recvbuf + ((size_t)q * count + j) * es, want, es, name, dt, op, count,
                          in_place, root, j);
            }
        }
        break;
    }
    }
}

static const accel_dtype all_dtypes[] = {
    ACCEL_F32, ACCEL_F64, ACCEL_F16, ACCEL_BF16, ACCEL_F8_E4M3, ACCEL_F8_E5M2, ACCEL_I8,
    ACCEL_U8,  ACCEL_I16, ACCEL_U16, ACCEL_I32,  ACCEL_I64,     ACCEL_BOOL};
enum { N_DTYPES = sizeof(all_dtypes) / sizeof(all_dtypes[0]) };

/* only_in_place: skip the out-of-place forms (the symmetric test's copying path is covered by
 * test_collectives). */
static int only_in_place;

static void matrix(size_t count, int big)
{
    /* Large counts: every collective, on a few representative dtype/op pairs. */
    static const struct {
        accel_dtype dt;
        accel_reduce_op op;
    } big_set[] = {{ACCEL_F32, ACCEL_SUM},
                   {ACCEL_BF16, ACCEL_AVG},
                   {ACCEL_I32, ACCEL_MAX},
                   {ACCEL_U8, ACCEL_MIN}};
    int n_pairs = big ? (int)(sizeof(big_set) / sizeof(big_set[0])) : N_DTYPES * 5;
    for (int kind = 0; kind < 6; kind++) {
        int reducing = kind == 0 || kind == 1 || kind == 4;
        int rooted = kind >= 3;
        for (int p = 0; p < n_pairs; p++) {
            accel_dtype dt = big ? big_set[p].dt : all_dtypes[p / 5];
            accel_reduce_op op = big ? big_set[p].op : (accel_reduce_op)(p % 5);
            if (!reducing && !big && op != ACCEL_SUM) {
                continue; /* the op is ignored: one pass per dtype */
            }
            if (dt == ACCEL_BOOL && op == ACCEL_AVG) {
                continue;
            }
            for (int in_place = only_in_place; in_place < 2; in_place++) {
                for (int ri = 0; ri < (rooted ? 2 : 1); ri++) {
                    int root = ri == 0 ? 0 : n_ranks - 1;
                    if (ri == 1 && n_ranks == 1) {
                        continue;
                    }
                    run_case(kind, dt, op, count, in_place, root);
                }
            }
        }
    }
}

#endif /* ACCEL_TEST_COLL_CASES_H */
