/*
 * Buffer collectives against a reference computed here: every collective x dtype x op x counts
 * {0, 1, 7} in place and out of place with roots 0 and n-1, the large count 1000003 on a subset
 * (every collective, a few dtype/op pairs), then asynchronous work handles and argument errors.
 * Inputs are a deterministic function of (rank, index), so each process can compute every
 * other process's input and the exact expected result (reductions combine in rank order; half
 * types accumulate in f32 and round once), and results must be bit-identical.
 *
 * ACCEL_TEST_NPROCS: 1 2 3 4
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/half.h"

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
        float af = 0;
        double ad = 0;
        for (int r = 0; r < n_ranks; r++) {
            gen(dt, r, i, seed, e);
            double v = to_double(dt, e);
            float vf = (float)v; /* exact: every non-f64 input is an f32 value */
            if (r == 0) {
                af = vf;
                ad = v;
            } else if (op == ACCEL_SUM || op == ACCEL_AVG) {
                af += vf;
                ad += v;
            } else if (op == ACCEL_PROD) {
                af *= vf;
                ad *= v;
            } else if (op == ACCEL_MAX) {
                af = vf > af ? vf : af;
                ad = v > ad ? v : ad;
            } else {
                af = vf < af ? vf : af;
                ad = v < ad ? v : ad;
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
        CHECK_OK(acc,
                 accel_reduce(acc, in, rank == root ? recvbuf : NULL, count, dt, op, root, NULL));
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
            for (int in_place = 0; in_place < 2; in_place++) {
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

/* Several asynchronous collectives in flight, completed in issue order, with wait and test. */
static void async_checks(void)
{
    enum { K = 6, C = 5000 };
    float *bufs[K];
    accel_work *w[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(C * sizeof(float));
        for (int i = 0; i < C; i++) {
            bufs[k][i] = (float)(rank + k + i % 3);
        }
    }
    for (int k = 0; k < K; k++) {
        if (k == 2) {
            CHECK_OK(acc, accel_broadcast(acc, bufs[k], bufs[k], C, ACCEL_F32, n_ranks - 1, &w[k]));
        } else {
            CHECK_OK(acc, accel_allreduce(acc, bufs[k], bufs[k], C, ACCEL_F32, ACCEL_SUM, &w[k]));
        }
        CHECK(w[k] != NULL);
    }
    /* A blocking call issued now must run after all of them (same order on every rank). */
    int one = 1, total = 0;
    CHECK_OK(acc, accel_allreduce(acc, &one, &total, 1, ACCEL_I32, ACCEL_SUM, NULL));
    CHECK(total == n_ranks);
    for (int k = 0; k < K; k++) {
        accel_status st = ACCEL_EINTERNAL;
        CHECK(accel_work_test(w[k], &st) == 1); /* the blocking call above came after */
        CHECK(st == ACCEL_OK);
        CHECK_OK(acc, accel_work_wait(w[k]));
        for (int i = 0; i < C; i++) {
            float want = k == 2 ? (float)(n_ranks - 1 + k + i % 3)
                                : (float)(n_ranks * (n_ranks - 1) / 2 + n_ranks * (k + i % 3));
            CHECK_MSG(bufs[k][i] == want, "async op %d element %d: %g != %g", k, i,
                      (double)bufs[k][i], (double)want);
        }
        accel_work_free(w[k]);
        free(bufs[k]);
    }
    /* Wait without test, then free without wait; barrier as work. */
    accel_work *b = NULL, *a = NULL;
    float x = 1.0f;
    CHECK_OK(acc, accel_barrier(acc, &b));
    CHECK_OK(acc, accel_allreduce(acc, &x, &x, 1, ACCEL_F32, ACCEL_MAX, &a));
    CHECK_OK(acc, accel_work_wait(b));
    accel_work_free(b);
    accel_work_free(a); /* waits */
    CHECK(x == 1.0f);
    accel_work_free(NULL);
}

static void error_checks(void)
{
    uint8_t flag = 1;
    accel_status st = accel_allreduce(acc, &flag, &flag, 1, ACCEL_BOOL, ACCEL_AVG, NULL);
    CHECK(st == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "BOOL") != NULL);
    float v[4] = {0};
    CHECK(accel_broadcast(acc, v, v, 4, ACCEL_F32, n_ranks, NULL) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "root") != NULL);
    CHECK(accel_allreduce(acc, v, v + 1, 2, ACCEL_F32, ACCEL_SUM, NULL) == ACCEL_EINVAL);
    CHECK(accel_allreduce(acc, v, v, 4, (accel_dtype)99, ACCEL_SUM, NULL) == ACCEL_EINVAL);
    CHECK(accel_allreduce(acc, v, v, 4, ACCEL_F32, (accel_reduce_op)9, NULL) == ACCEL_EINVAL);
    /* Argument errors are local and do not break the communicator. */
    float one = 1.0f;
    CHECK_OK(acc, accel_allreduce(acc, &one, &one, 1, ACCEL_F32, ACCEL_SUM, NULL));
    CHECK(one == (float)n_ranks);
    size_t off = 99, cnt = 99;
    accel_chunk_range(10, 3, 0, &off, &cnt);
    CHECK(off == 0 && cnt == 4);
    accel_chunk_range(10, 3, 2, &off, &cnt);
    CHECK(off == 7 && cnt == 3);
}

int main(void)
{
    /* With a 1 MiB streaming threshold the large cases cover both output paths (u8 stays
     * below it, f32/i32/bf16 go above). An explicit setting from the caller wins. */
    setenv("ACCEL_SHM_NT_NBYTES", "1048576", 0);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    rank = accel_process_index(acc);
    n_ranks = accel_num_processes(acc);
    const size_t big = 1000003;
    buf_nbytes = big * 8 * (size_t)n_ranks + 64;
    sendbuf = malloc(buf_nbytes);
    recvbuf = malloc(buf_nbytes);
    CHECK(sendbuf != NULL && recvbuf != NULL);

    error_checks();
    static const size_t small[] = {0, 1, 7};
    for (size_t c = 0; c < sizeof(small) / sizeof(small[0]); c++) {
        matrix(small[c], 0);
    }
    matrix(big, 1);
    async_checks();
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        printf("test_collectives: %d processes (%s): %u cases ok\n", n_ranks,
               accel_backend_name(acc), seed_counter);
    }
    free(sendbuf);
    free(recvbuf);
    accel_free(acc);
    return 0;
}
