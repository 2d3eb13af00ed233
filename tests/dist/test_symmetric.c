/*
 * Symmetric shared memory (accel_alloc_shared) and the zero-copy collectives on it: the in-place
 * matrix of test_collectives (every collective x dtype x op, counts {0, 1, 7, 12} and 1000003,
 * 999996 on a subset) on buffers from accel_alloc_shared with ACCEL_SHM_ZEROCOPY_NBYTES=0, so
 * every non-empty call takes the zero-copy path (counted), except reduce_scatter / allgather of
 * counts that do not split evenly (the public helpers pad those through a scratch buffer; 12 and
 * 999996 split evenly on 1-4 processes); then the fallbacks, which must give the same results
 * without zero-copy: offsets that differ between processes, one process on plain memory, out of
 * place; then the allocation itself: names gone from /dev/shm, size mismatch (EINVAL everywhere,
 * communicator still usable; sizes that differ everywhere, on the last process only, between
 * machines only), ordering after queued asynchronous work, accel_free_shared.
 *
 * ACCEL_TEST_NPROCS: 1 2 3 4
 */
#include <dirent.h>
#include <unistd.h>

#include "coll_cases.h"

/* src/comm/shm.h (not included: its parameter names shadow this test's globals). */
uint64_t accel__shm_zero_copy_calls(void);

static int is_shm;

static void check_no_names(void)
{
    const char *job = getenv("ACCEL_JOB_ID");
    if (job == NULL) {
        return;
    }
    char prefix[256];
    /* Any name of the job: its segment's went once everyone attached. */
    snprintf(prefix, sizeof(prefix), "accel-%u-%s", (unsigned)geteuid(), job);
    DIR *d = opendir("/dev/shm");
    if (d == NULL) {
        return;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        CHECK_MSG(strncmp(e->d_name, prefix, strlen(prefix)) != 0, "left in /dev/shm: %s",
                  e->d_name);
    }
    closedir(d);
}

/* The four zero-copy-capable collectives, in place, on the current sendbuf/recvbuf. */
static void four_cases(size_t count)
{
    run_case(0, ACCEL_F32, ACCEL_SUM, count, 1, 0);
    run_case(0, ACCEL_BF16, ACCEL_AVG, count, 1, 0);
    run_case(1, ACCEL_I32, ACCEL_MAX, count, 1, 0);
    run_case(2, ACCEL_F16, ACCEL_SUM, count, 1, 0);
    run_case(3, ACCEL_F64, ACCEL_SUM, count, 1, n_ranks - 1);
}

/* Runs four_cases with each process's buffers replaced by (s, r); expects no zero-copy. */
static void fallback(char *s, char *r, const char *what)
{
    char *s0 = sendbuf, *r0 = recvbuf;
    sendbuf = s;
    recvbuf = r;
    uint64_t before = accel__shm_zero_copy_calls();
    four_cases(7);
    four_cases(300007);
    CHECK_MSG(accel__shm_zero_copy_calls() == before, "%s: zero-copy ran anyway", what);
    sendbuf = s0;
    recvbuf = r0;
}

int main(void)
{
    setenv("ACCEL_SHM_ZEROCOPY_NBYTES", "0", 0);
    setenv("ACCEL_SHM_NT_NBYTES", "1048576", 0);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    rank = accel_process_index(acc);
    n_ranks = accel_num_processes(acc);
    if (strcmp(accel_backend_name(acc), "hier") == 0) {
        ref_group = accel_local_num_processes(acc); /* a machine's processes reduce first */
    }
    is_shm = strcmp(accel_backend_name(acc), "shm") == 0;
    const size_t big = 1000003;
    buf_nbytes = big * 8 * (size_t)n_ranks + 64;
    void *s = NULL, *r = NULL;
    CHECK_OK(acc, accel_alloc_shared(acc, buf_nbytes + 256, &s));
    CHECK_OK(acc, accel_alloc_shared(acc, buf_nbytes + 256, &r));
    CHECK(s != NULL && r != NULL && ((uintptr_t)s & 63) == 0 && ((uintptr_t)r & 63) == 0);
    CHECK(((char *)s)[0] == 0 && ((char *)r)[buf_nbytes] == 0); /* zero-filled */
    check_no_names();
    sendbuf = s;
    recvbuf = r;

    /* 1. Zero-copy: every in-place case. */
    only_in_place = 1;
    uint64_t zc0 = accel__shm_zero_copy_calls();
    static const size_t small[] = {0, 1, 7, 12}, bigs[] = {big, 999996};
    for (size_t c = 0; c < sizeof(small) / sizeof(small[0]); c++) {
        matrix(small[c], 0);
    }
    for (size_t c = 0; c < sizeof(bigs) / sizeof(bigs[0]); c++) {
        matrix(bigs[c], 1);
    }
    uint64_t zc = accel__shm_zero_copy_calls() - zc0;
    if (is_shm) {
        /* Every non-empty in-place allreduce, reduce_scatter, allgather and broadcast: per small
         * count 64 allreduces + 64 reduce_scatters (dtype x op, no BOOL AVG), 13 allgathers, 13
         * broadcasts per root; each large count 4 pairs of each. Reduce_scatter and allgather
         * only when the count splits evenly. */
        uint64_t roots = n_ranks > 1 ? 2 : 1, want = 0;
        for (size_t c = 1; c < sizeof(small) / sizeof(small[0]); c++) {
            want += 64 + 13 * roots + (small[c] % (size_t)n_ranks == 0 ? 64 + 13 : 0);
        }
        for (size_t c = 0; c < sizeof(bigs) / sizeof(bigs[0]); c++) {
            want += 4 + 4 * roots + (bigs[c] % (size_t)n_ranks == 0 ? 4 + 4 : 0);
        }
        CHECK_MSG(zc == want, "%llu zero-copy calls, expected %llu", (unsigned long long)zc,
                  (unsigned long long)want);
    }

    /* 2. Fallbacks. Offsets that differ per process (still 64-byte aligned). */
    fallback((char *)s + 64 * (size_t)(rank % 2), (char *)r + 64 * (size_t)(rank % 2),
             "different offsets");
    /* Process 0 on plain memory, the others symmetric. */
    char *ps = malloc(buf_nbytes), *pr = malloc(buf_nbytes);
    CHECK(ps != NULL && pr != NULL);
    fallback(rank == 0 ? ps : s, rank == 0 ? pr : r, "process 0 on plain memory");
    /* Out of place on symmetric buffers. */
    uint64_t before = accel__shm_zero_copy_calls();
    run_case(0, ACCEL_F32, ACCEL_SUM, 300007, 0, 0);
    run_case(3, ACCEL_F32, ACCEL_SUM, 300007, 0, 0);
    CHECK(accel__shm_zero_copy_calls() == before);

    /* 3. The allocation. Different sizes: EINVAL on every process, then business as usual;
     * on hier, sizes that differ inside a machine only (the last process's), and between
     * machines only (where the job has several). */
    if (n_ranks > 1) {
        const int L = accel_local_num_processes(acc);
        const size_t sizes[3] = {4096 + (size_t)rank * 64, rank == n_ranks - 1 ? 4160 : 4096,
                                 4096 + (size_t)(rank / L) * 64};
        for (int c = 0; c < (L < n_ranks ? 3 : 2); c++) {
            void *bad = NULL;
            accel_status st = accel_alloc_shared(acc, sizes[c], &bad);
            CHECK_MSG(st == ACCEL_EINVAL && bad == NULL, "sizes %d: %s", c, accel_last_error(acc));
            CHECK_MSG(strstr(accel_last_error(acc), "same size") != NULL, "%s",
                      accel_last_error(acc));
            check_no_names();
            CHECK_OK(acc, accel_barrier(acc, NULL));
        }
    }
    /* Ordered after queued asynchronous work: the allreduce completes before the allocation. */
    float *v = malloc(1000 * sizeof(float));
    for (int i = 0; i < 1000; i++) {
        v[i] = 1.0f;
    }
    accel_work *w = NULL;
    CHECK_OK(acc, accel_allreduce(acc, v, v, 1000, ACCEL_F32, ACCEL_SUM, &w));
    void *z = NULL;
    CHECK_OK(acc, accel_alloc_shared(acc, 0, &z));
    CHECK(accel_work_test(w, NULL) == 1);
    CHECK(v[999] == (float)n_ranks);
    accel_work_free(w);
    free(v);
    CHECK_OK(acc, accel_free_shared(acc, z));
    CHECK_OK(acc, accel_free_shared(acc, NULL));
    if (is_shm) {
        CHECK(accel_free_shared(acc, ps) == ACCEL_EINVAL);
        CHECK(accel_free_shared(acc, z) == ACCEL_EINVAL); /* twice */
    }
    /* A symmetric buffer freed on one process only: its peers' calls on theirs fall back. */
    void *t = NULL;
    CHECK_OK(acc, accel_alloc_shared(acc, 1 << 20, &t));
    if (rank == 0) {
        CHECK_OK(acc, accel_free_shared(acc, t));
        t = malloc(1 << 20);
    }
    float *tf = t;
    for (int i = 0; i < (1 << 18); i++) {
        tf[i] = (float)(rank + i % 5);
    }
    before = accel__shm_zero_copy_calls();
    CHECK_OK(acc, accel_allreduce(acc, tf, tf, 1 << 18, ACCEL_F32, ACCEL_SUM, NULL));
    CHECK(accel__shm_zero_copy_calls() == before);
    for (int i = 0; i < (1 << 18); i++) {
        CHECK(tf[i] == (float)(n_ranks * (n_ranks - 1) / 2 + n_ranks * (i % 5)));
    }
    if (rank == 0) {
        free(t);
    } else {
        CHECK_OK(acc, accel_free_shared(acc, t));
    }

    CHECK_OK(acc, accel_wait_for_everyone(acc));
    CHECK_OK(acc, accel_free_shared(acc, s));
    /* r is left for accel_free to release. */
    if (rank == 0) {
        printf("test_symmetric: %d processes (%s): %u cases ok, %llu zero-copy\n", n_ranks,
               accel_backend_name(acc), seed_counter, (unsigned long long)zc);
    }
    free(ps);
    free(pr);
    accel_free(acc);
    return 0;
}
