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
#include "coll_cases.h"

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
    /* The dtypes that exist for files: moved whole-byte ones travel, nothing reduces them, and
     * packed sub-byte ones are refused (with a message, not garbage). */
    uint64_t ids[2] = {rank == 0 ? UINT64_MAX : 0, 5};
    CHECK(accel_allreduce(acc, ids, ids, 2, ACCEL_U64, ACCEL_SUM, NULL) == ACCEL_EUNSUPPORTED);
    CHECK(strstr(accel_last_error(acc), "U64") != NULL);
    CHECK_OK(acc, accel_broadcast(acc, ids, ids, 2, ACCEL_U64, 0, NULL));
    CHECK(ids[0] == UINT64_MAX && ids[1] == 5);
    CHECK(accel_broadcast(acc, v, v, 4, ACCEL_F4, 0, NULL) == ACCEL_EUNSUPPORTED);
    CHECK(strstr(accel_last_error(acc), "F4") != NULL);
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
    if (strcmp(accel_backend_name(acc), "hier") == 0) {
        ref_group = accel_local_num_processes(acc); /* a machine's processes reduce first */
    }
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
