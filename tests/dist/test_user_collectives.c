/*
 * User-level collectives (gather, gather_object, reduce, broadcast, broadcast_object,
 * pad_across_processes, split_between_processes, triggers) on 1-4 processes, each checked
 * against the expected result computed here from the process count alone.
 * ACCEL_TEST_NPROCS: 1 2 3 4
 */
#include <stdint.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"

static int R, N; /* this process's index, number of processes */

/* The deterministic byte pattern process r writes at element byte k. */
static unsigned char pat(int r, size_t k)
{
    return (unsigned char)(r * 37 + (int)k * 11 + 5);
}

static void test_gather_one(accel *acc, accel_dtype dt, int ndim, const int64_t *shape)
{
    accel_tensor in = accel_tensor_view(NULL, dt, ndim, shape);
    size_t nbytes = accel_tensor_nbytes(&in);
    unsigned char *src = malloc(nbytes + 1), *dst = malloc(nbytes * (size_t)N + 1);
    CHECK(src && dst);
    for (size_t k = 0; k < nbytes; k++) {
        src[k] = pat(R, k);
    }
    in.data = src;
    accel_tensor out = {.data = dst};
    CHECK_OK(acc, accel_gather(acc, &in, &out));
    CHECK(out.data == dst && out.dtype == dt);
    CHECK(out.ndim == (ndim == 0 ? 1 : ndim));
    CHECK(out.shape[0] == (ndim == 0 ? 1 : shape[0]) * N);
    for (int i = 1; i < ndim; i++) {
        CHECK(out.shape[i] == shape[i]);
    }
    for (int r = 0; r < N; r++) {
        for (size_t k = 0; k < nbytes; k++) {
            CHECK_MSG(dst[(size_t)r * nbytes + k] == pat(r, k), "dtype %s rank %d byte %zu",
                      accel_dtype_name(dt), r, k);
        }
    }
    free(src);
    free(dst);
}

static void test_gather(accel *acc)
{
    test_gather_one(acc, ACCEL_F32, 2, (int64_t[]){2, 3});
    test_gather_one(acc, ACCEL_I64, 2, (int64_t[]){0, 5}); /* 0 rows */
    test_gather_one(acc, ACCEL_U8, 1, (int64_t[]){7});
    test_gather_one(acc, ACCEL_F16, 0, NULL); /* scalar: becomes [N] */
    test_gather_one(acc, ACCEL_BF16, 3, (int64_t[]){1, 2, 2});
    test_gather_one(acc, ACCEL_F64, 1, (int64_t[]){1000});

    /* A shape mismatch fails on every process (no hang), names the process, and leaves the
     * communicator usable. */
    if (N > 1) {
        float buf[8] = {0}, outb[8 * 4];
        int64_t rows = R == N - 1 ? 2 : 1;
        accel_tensor in = accel_tensor_view(buf, ACCEL_F32, 1, &rows);
        accel_tensor out = {.data = outb};
        accel_status st = accel_gather(acc, &in, &out);
        CHECK(st == ACCEL_EINVAL);
        char want[32];
        snprintf(want, sizeof want, "process %d", N - 1);
        CHECK_MSG(strstr(accel_last_error(acc), want) != NULL, "%s", accel_last_error(acc));
        test_gather_one(acc, ACCEL_I32, 1, (int64_t[]){3});
    }
    /* Bad arguments are caught locally, before any exchange (every process passes them). */
    accel_tensor out = {0};
    CHECK(accel_gather(acc, NULL, &out) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "in") != NULL);
    int64_t three = 3;
    accel_tensor nodata = accel_tensor_view(NULL, ACCEL_F32, 1, &three);
    CHECK(accel_gather(acc, &nodata, &out) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "in->data") != NULL);
}

static void test_gather_object(accel *acc)
{
    /* Process r contributes r * 13 bytes (process 0: nothing), then a second round with sizes
     * that are not multiples of anything. */
    for (int round = 0; round < 2; round++) {
        size_t mine = round == 0 ? (size_t)R * 13 : (size_t)(1000 * R + 5 + round);
        unsigned char *blob = malloc(mine + 1);
        CHECK(blob);
        for (size_t k = 0; k < mine; k++) {
            blob[k] = pat(R + round, k);
        }
        accel_blobs *b = NULL;
        CHECK_OK(acc, accel_gather_object(acc, mine ? blob : NULL, mine, &b));
        CHECK(accel_blobs_count(b) == N);
        for (int r = 0; r < N; r++) {
            size_t nb = 12345;
            const unsigned char *p = accel_blobs_data(b, r, &nb);
            size_t want = round == 0 ? (size_t)r * 13 : (size_t)(1000 * r + 5 + round);
            CHECK(p != NULL);
            CHECK_MSG(nb == want, "round %d rank %d: %zu bytes, want %zu", round, r, nb, want);
            CHECK(((uintptr_t)p & 15) == 0);
            for (size_t k = 0; k < nb; k++) {
                CHECK(p[k] == pat(r + round, k));
            }
        }
        CHECK(accel_blobs_data(b, N, NULL) == NULL && accel_blobs_data(b, -1, NULL) == NULL);
        accel_blobs_free(b);
        free(blob);
    }
    accel_blobs_free(NULL);
    CHECK(accel_blobs_count(NULL) == 0);
    accel_blobs *b = NULL;
    CHECK(accel_gather_object(acc, NULL, 4, &b) == ACCEL_EINVAL && b == NULL);
    CHECK(accel_gather_object(acc, "x", 1, NULL) == ACCEL_EINVAL);
}

static void test_reduce(accel *acc)
{
    enum { K = 5 };
    double sum_r = N * (N - 1) / 2.0; /* sum of process indexes */
    float f[K];
    int64_t k5 = K;
    accel_tensor t = accel_tensor_view(f, ACCEL_F32, 1, &k5);
    for (int i = 0; i < K; i++) {
        f[i] = (float)(R + i);
    }
    CHECK_OK(acc, accel_allreduce_tensor(acc, &t, ACCEL_SUM, 0.5));
    for (int i = 0; i < K; i++) {
        CHECK_NEAR(f[i], (sum_r + (double)N * i) * 0.5, 1e-5);
    }
    for (int i = 0; i < K; i++) {
        f[i] = (float)(R + i);
    }
    CHECK_OK(acc, accel_allreduce_tensor(acc, &t, ACCEL_AVG, 1.0));
    for (int i = 0; i < K; i++) {
        CHECK_NEAR(f[i], sum_r / N + i, 1e-5);
    }
    /* bf16 with a scale: small integers and halves are exact in bf16. */
    uint16_t h[2] = {0x3f80, 0x4000}; /* 1.0, 2.0 */
    int64_t two = 2;
    accel_tensor tb = accel_tensor_view(h, ACCEL_BF16, 1, &two);
    CHECK_OK(acc, accel_allreduce_tensor(acc, &tb, ACCEL_SUM, 2.0));
    float got0, got1;
    uint32_t u0 = (uint32_t)h[0] << 16, u1 = (uint32_t)h[1] << 16;
    memcpy(&got0, &u0, 4);
    memcpy(&got1, &u1, 4);
    CHECK_NEAR(got0, 2.0 * N, 0);
    CHECK_NEAR(got1, 4.0 * N, 0);
    /* Integers: MAX works, a scale does not. */
    int32_t iv[3] = {R, -R, 7};
    int64_t three = 3;
    accel_tensor ti = accel_tensor_view(iv, ACCEL_I32, 1, &three);
    CHECK_OK(acc, accel_allreduce_tensor(acc, &ti, ACCEL_MAX, 1.0));
    CHECK(iv[0] == N - 1 && iv[1] == 0 && iv[2] == 7);
    CHECK(accel_allreduce_tensor(acc, &ti, ACCEL_SUM, 2.0) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "scale") != NULL);
    CHECK(accel_allreduce_tensor(acc, &ti, (accel_reduce_op)99, 1.0) == ACCEL_EINVAL);
}

static void test_broadcast(accel *acc)
{
    int root = N - 1;
    double d[4];
    for (int i = 0; i < 4; i++) {
        d[i] = R * 10 + i;
    }
    int64_t four = 4;
    accel_tensor t = accel_tensor_view(d, ACCEL_F64, 1, &four);
    CHECK_OK(acc, accel_broadcast_tensor(acc, &t, root));
    for (int i = 0; i < 4; i++) {
        CHECK(d[i] == root * 10 + i);
    }
    CHECK(accel_broadcast_tensor(acc, &t, N) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "from_process") != NULL);

    /* broadcast_object: a string from the last process, then an empty blob from process 0. */
    char msg[64];
    snprintf(msg, sizeof msg, "hello from process %d", root);
    void *blob = R == root ? msg : NULL;
    size_t nbytes = R == root ? strlen(msg) + 1 : 0;
    CHECK_OK(acc, accel_broadcast_object(acc, &blob, &nbytes, root));
    CHECK(nbytes == strlen(msg) + 1 && strcmp(blob, msg) == 0);
    if (R == root) {
        CHECK(blob == msg); /* the root keeps its own pointer */
    } else {
        accel_blob_free(blob);
    }
    blob = NULL;
    nbytes = 0;
    CHECK_OK(acc, accel_broadcast_object(acc, &blob, &nbytes, 0));
    CHECK(nbytes == 0);
    CHECK((R == 0) == (blob == NULL));
    accel_blob_free(blob);
    CHECK(accel_broadcast_object(acc, NULL, &nbytes, 0) == ACCEL_EINVAL);
}

/* Checks the padded tensor `out` (I32, [A, max, B] viewed around dim) against the pattern
 * value(r, a, i, b) written by process r before padding. */
static int32_t pv(int r, int64_t a, int64_t i, int64_t b)
{
    return (int32_t)(r * 1000 + a * 100 + i * 10 + b);
}

static void test_pad_one(accel *acc, int dim, int pad_first)
{
    /* Process r holds shape [2, r + 1, 3] padded along `dim` (0, 1 or -1 via 2). */
    int64_t shape[3] = {2, 2, 3};
    int d = dim < 0 ? dim + 3 : dim;
    shape[d] = R + 1;
    int64_t A = 1, B = 1;
    for (int i = 0; i < d; i++) {
        A *= shape[i];
    }
    for (int i = d + 1; i < 3; i++) {
        B *= shape[i];
    }
    int64_t rows = shape[d];
    int32_t *src = malloc(sizeof(int32_t) * (size_t)(A * rows * B));
    CHECK(src);
    for (int64_t a = 0; a < A; a++) {
        for (int64_t i = 0; i < rows; i++) {
            for (int64_t b = 0; b < B; b++) {
                src[(a * rows + i) * B + b] = pv(R, a, i, b);
            }
        }
    }
    accel_tensor in = accel_tensor_view(src, ACCEL_I32, 3, shape);
    int64_t max = -1;
    CHECK_OK(acc, accel_pad_across_processes_size(acc, &in, dim, &max));
    CHECK(max == N);
    int32_t *dst = malloc(sizeof(int32_t) * (size_t)(A * max * B));
    CHECK(dst);
    accel_tensor out = {.data = dst};
    int32_t pad = -7;
    CHECK_OK(acc, accel_pad_across_processes(acc, &in, dim, &pad, pad_first, &out));
    CHECK(out.ndim == 3 && out.dtype == ACCEL_I32 && out.shape[d] == N);
    int64_t npad = max - rows;
    for (int64_t a = 0; a < A; a++) {
        for (int64_t i = 0; i < max; i++) {
            for (int64_t b = 0; b < B; b++) {
                int64_t src_i = pad_first ? i - npad : i;
                int32_t want = (src_i >= 0 && src_i < rows) ? pv(R, a, src_i, b) : pad;
                CHECK_MSG(dst[(a * max + i) * B + b] == want,
                          "dim %d pad_first %d at %lld,%lld,%lld", dim, pad_first, (long long)a,
                          (long long)i, (long long)b);
            }
        }
    }
    free(src);
    free(dst);
}

static void test_pad(accel *acc)
{
    for (int pf = 0; pf < 2; pf++) {
        test_pad_one(acc, 0, pf);
        test_pad_one(acc, 1, pf);
        test_pad_one(acc, -1, pf);
    }
    /* Accelerate's own example: process 0 holds arange(N + 1), the others arange(N); default
     * pad value 0 (pad_value NULL) at the end. */
    int64_t n = R == 0 ? N + 1 : N;
    float v[8], o[8];
    for (int i = 0; i < n; i++) {
        v[i] = (float)i;
    }
    accel_tensor in = accel_tensor_view(v, ACCEL_F32, 1, &n), out = {.data = o};
    CHECK_OK(acc, accel_pad_across_processes(acc, &in, 0, NULL, 0, &out));
    CHECK(out.shape[0] == N + 1);
    for (int i = 0; i <= N; i++) {
        CHECK(o[i] == (i < n ? (float)i : 0.0f));
    }
    CHECK(accel_pad_across_processes(acc, &in, 1, NULL, 0, &out) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "dim 1") != NULL);
    CHECK(accel_pad_across_processes_size(acc, &in, 0, NULL) == ACCEL_EINVAL);
}

static void test_split(accel *acc)
{
    for (size_t n = 0; n <= 20; n++) {
        /* Independent reference: deal item i to process i % N (round robin); process p's share
         * is then the count of such items, and the ranges are laid out in process order. */
        size_t want_start = 0, want_count = 0, longest = 0;
        for (int p = 0; p < N; p++) {
            size_t c = 0;
            for (size_t i = 0; i < n; i++) {
                c += (i % (size_t)N) == (size_t)p;
            }
            if (p < R) {
                want_start += c;
            } else if (p == R) {
                want_count = c;
            }
            longest = c > longest ? c : longest;
        }
        for (int padded = 0; padded < 2; padded++) {
            size_t start = 99, count = 99, npad = 99;
            CHECK_OK(acc, accel_split_between_processes(acc, n, padded, &start, &count, &npad));
            CHECK_MSG(start == want_start && count == want_count, "n %zu: got %zu+%zu want %zu+%zu",
                      n, start, count, want_start, want_count);
            CHECK(npad == (padded ? longest - want_count : 0));
            CHECK(start + count <= n);
        }
    }
    /* Accelerate's docstring example: ["A","B","C"] on 2 processes. */
    if (N == 2) {
        size_t s, c, p;
        CHECK_OK(acc, accel_split_between_processes(acc, 3, 1, &s, &c, &p));
        CHECK(R == 0 ? (s == 0 && c == 2 && p == 0) : (s == 2 && c == 1 && p == 1));
    }
    size_t s, c;
    CHECK(accel_split_between_processes(acc, 3, 0, NULL, &c, NULL) == ACCEL_EINVAL);
    CHECK(accel_split_between_processes(acc, 3, 0, &s, NULL, NULL) == ACCEL_EINVAL);
    CHECK_OK(acc, accel_split_between_processes(acc, 3, 1, &s, &c, NULL));
}

static void test_triggers(accel *acc)
{
    int t = -1;
    CHECK_OK(acc, accel_check_trigger(acc, &t));
    CHECK(t == 0);
    if (R == N - 1) {
        CHECK_OK(acc, accel_set_trigger(acc));
    }
    CHECK_OK(acc, accel_check_trigger(acc, &t));
    CHECK(t == 1);
    CHECK_OK(acc, accel_check_trigger(acc, &t));
    CHECK(t == 0); /* reset everywhere after a positive check */
    CHECK_OK(acc, accel_set_trigger(acc));
    CHECK_OK(acc, accel_set_trigger(acc)); /* raising twice is still one flag */
    CHECK_OK(acc, accel_check_trigger(acc, &t));
    CHECK(t == 1);
    CHECK_OK(acc, accel_check_trigger(acc, &t));
    CHECK(t == 0);
    CHECK(accel_check_trigger(acc, NULL) == ACCEL_EINVAL);
}

int main(void)
{
    accel *acc;
    if (accel_init(&acc, NULL) != ACCEL_OK) {
        fprintf(stderr, "accel_init: %s\n", accel_last_error(NULL));
        return 1;
    }
    R = accel_process_index(acc);
    N = accel_num_processes(acc);
    test_gather(acc);
    test_gather_object(acc);
    test_reduce(acc);
    test_broadcast(acc);
    test_pad(acc);
    test_split(acc);
    test_triggers(acc);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_free(acc);

    /* Debug mode (ACCELERATE_DEBUG_MODE / opts.debug): a mismatch lists every process's shape,
     * and reduce / broadcast check shapes too. A second accelerator in the same processes. */
    accel_options o = accel_options_default();
    o.debug = 1;
    CHECK_OK(NULL, accel_init(&acc, &o));
    if (N > 1) {
        float buf[4] = {0}, outb[4 * 4];
        int64_t rows = R == 1 ? 2 : 1;
        accel_tensor in = accel_tensor_view(buf, ACCEL_F32, 1, &rows), out = {.data = outb};
        CHECK(accel_gather(acc, &in, &out) == ACCEL_EINVAL);
        CHECK_MSG(strstr(accel_last_error(acc), "process 0: F32[1]; process 1: F32[2]") != NULL,
                  "%s", accel_last_error(acc));
        CHECK(accel_allreduce_tensor(acc, &in, ACCEL_SUM, 1.0) == ACCEL_EINVAL);
        CHECK(accel_broadcast_tensor(acc, &in, 0) == ACCEL_EINVAL);
        CHECK(strstr(accel_last_error(acc), "process 1: F32[2]") != NULL);
    }
    test_gather(acc); /* everything still works with the checks on */
    test_reduce(acc);
    test_broadcast(acc);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_free(acc);
    printf("test_user_collectives: process %d of %d ok\n", R, N);
    return 0;
}
