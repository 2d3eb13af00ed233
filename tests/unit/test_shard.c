/*
 * Accelerate's BatchSamplerShard, reproduced index for index: every worked example of
 * accelerate-semantics.md section 6.3 (N = 2), its extras, and hand-computed cases for 3 and 4
 * processes; lengths per process in every mode against the shards actually produced.
 */
#include <string.h>

#include "check.h"
#include "data/data_internal.h"

static char *fmt_plan(const accel__plan *p, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int64_t b = 0; b < p->n_batches; b++) {
        for (int64_t i = p->off[b]; i < p->off[b + 1]; i++) {
            at += (size_t)snprintf(buf + at, n - at, "%s%lld", i == p->off[b] ? "" : " ",
                                   (long long)p->idx[i]);
        }
        if (b + 1 < p->n_batches) {
            at += (size_t)snprintf(buf + at, n - at, "|");
        }
    }
    return buf;
}

/* Shards range(n) in batches of bs for every process and compares with expected[rank]. */
static void check_range(int64_t n, int64_t bs, int nr, int drop_last, int split, int even,
                        const char *const *expected)
{
    int64_t order[256];
    for (int64_t i = 0; i < n; i++) {
        order[i] = i;
    }
    accel__plan inner = {0}, out = {0};
    CHECK(accel__plan_batches(&inner, order, n, bs, drop_last) == ACCEL_OK);
    for (int r = 0; r < nr; r++) {
        char buf[2048];
        accel__plan_clear(&out);
        CHECK(accel__shard_batches(&out, &inner, bs, drop_last, nr, r, split, even) == ACCEL_OK);
        CHECK_MSG(strcmp(fmt_plan(&out, buf, sizeof(buf)), expected[r]) == 0,
                  "range(%lld) bs%lld N%d drop%d split%d even%d rank %d: got \"%s\" want \"%s\"",
                  (long long)n, (long long)bs, nr, drop_last, split, even, r, buf, expected[r]);
        int64_t len = accel__shard_len(inner.n_batches, drop_last, nr, r, split, even);
        if (!split) { /* split: len is the inner length even when a process gets fewer */
            CHECK_MSG(len == out.n_batches, "len %lld vs %lld batches (rank %d)", (long long)len,
                      (long long)out.n_batches, r);
        }
    }
    accel__plan_free(&inner);
    accel__plan_free(&out);
}

#define R(n, bs, nr, drop, split, even, ...)                                                       \
    check_range(n, bs, nr, drop, split, even, (const char *const[]){__VA_ARGS__})

int main(void)
{
    /* Section 6.3, N = 2, no split. */
    R(24, 3, 2, 0, 0, 1, "0 1 2|6 7 8|12 13 14|18 19 20", "3 4 5|9 10 11|15 16 17|21 22 23");
    R(21, 3, 2, 0, 0, 1, "0 1 2|6 7 8|12 13 14|18 19 20", "3 4 5|9 10 11|15 16 17|0 1 2");
    R(22, 3, 2, 0, 0, 1, "0 1 2|6 7 8|12 13 14|18 19 20", "3 4 5|9 10 11|15 16 17|21 0 1");
    R(20, 3, 2, 0, 0, 1, "0 1 2|6 7 8|12 13 14|18 19 0", "3 4 5|9 10 11|15 16 17|1 2 3");
    R(2, 3, 2, 0, 0, 1, "0 1 0", "1 0 1");
    R(20, 3, 2, 1, 0, 1, "0 1 2|6 7 8|12 13 14", "3 4 5|9 10 11|15 16 17");
    R(21, 3, 2, 0, 0, 0, "0 1 2|6 7 8|12 13 14|18 19 20", "3 4 5|9 10 11|15 16 17");
    R(20, 3, 2, 0, 0, 0, "0 1 2|6 7 8|12 13 14|18 19", "3 4 5|9 10 11|15 16 17");
    R(2, 3, 2, 0, 0, 0, "0 1", "");
    R(2, 3, 2, 1, 0, 1, "", "");
    /* Split. */
    R(22, 4, 2, 0, 1, 1, "0 1|4 5|8 9|12 13|16 17|20 21", "2 3|6 7|10 11|14 15|18 19|0 1");
    R(21, 4, 2, 0, 1, 1, "0 1|4 5|8 9|12 13|16 17|20 0", "2 3|6 7|10 11|14 15|18 19|1 2");
    R(2, 4, 2, 0, 1, 1, "0 1", "0 1");
    R(21, 4, 2, 0, 1, 0, "0 1|4 5|8 9|12 13|16 17|20", "2 3|6 7|10 11|14 15|18 19");
    R(21, 4, 2, 1, 1, 1, "0 1|4 5|8 9|12 13|16 17", "2 3|6 7|10 11|14 15|18 19");
    R(2, 4, 2, 0, 1, 0, "0 1", "");
    /* Extras of 6.3. */
    R(9, 5, 2, 0, 0, 1, "0 1 2 3 4", "5 6 7 8 0");
    R(10, 3, 4, 0, 0, 1, "0 1 2", "3 4 5", "6 7 8", "9 0 1");
    /* Three processes (hand-computed with the algorithm of 6.3). */
    R(20, 3, 3, 0, 0, 1, "0 1 2|9 10 11|18 19 0", "3 4 5|12 13 14|1 2 3", "6 7 8|15 16 17|4 5 6");
    R(20, 3, 3, 0, 0, 0, "0 1 2|9 10 11|18 19", "3 4 5|12 13 14", "6 7 8|15 16 17");
    R(20, 3, 3, 1, 0, 1, "0 1 2|9 10 11", "3 4 5|12 13 14", "6 7 8|15 16 17");
    R(10, 6, 3, 0, 1, 1, "0 1|6 7", "2 3|8 9", "4 5|0 1");
    R(2, 3, 3, 0, 0, 1, "0 1 0", "1 0 1", "0 1 0");
    /* Four processes. */
    R(22, 2, 4, 0, 0, 1, "0 1|8 9|16 17", "2 3|10 11|18 19", "4 5|12 13|20 21", "6 7|14 15|0 1");
    R(22, 2, 4, 0, 0, 0, "0 1|8 9|16 17", "2 3|10 11|18 19", "4 5|12 13|20 21", "6 7|14 15");
    R(5, 8, 4, 0, 1, 1, "0 1", "2 3", "4 0", "1 2");
    R(24, 3, 4, 0, 0, 1, "0 1 2|12 13 14", "3 4 5|15 16 17", "6 7 8|18 19 20", "9 10 11|21 22 23");

    /* Variable-size batches (Accelerate's test_batch_sampler_with_varying_batch_size). */
    {
        static const int64_t idx[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
        static const int64_t lens[] = {3, 2, 4, 3, 2};
        accel__plan inner = {0}, out = {0};
        int64_t at = 0;
        for (int b = 0; b < 5; b++) {
            CHECK(accel__plan_push(&inner, idx + at, lens[b], NULL, 0) == ACCEL_OK);
            at += lens[b];
        }
        char buf[256];
        CHECK(accel__shard_batches(&out, &inner, 0, 0, 2, 0, 0, 0) == ACCEL_OK);
        CHECK(strcmp(fmt_plan(&out, buf, sizeof(buf)), "0 1 2|5 6 7 8|12 13") == 0);
        CHECK(accel__shard_len(5, 0, 2, 0, 0, 0) == 3);
        accel__plan_clear(&out);
        CHECK(accel__shard_batches(&out, &inner, 0, 0, 2, 1, 0, 0) == ACCEL_OK);
        CHECK(strcmp(fmt_plan(&out, buf, sizeof(buf)), "3 4|9 10 11") == 0);
        CHECK(accel__shard_len(5, 0, 2, 1, 0, 0) == 2);
        /* Accelerate refuses even_batches without a batch size. */
        CHECK(accel__shard_batches(&out, &inner, 0, 0, 2, 0, 0, 1) == ACCEL_EINVAL);
        accel__plan_free(&inner);
        accel__plan_free(&out);
    }
    /* split_batches with a batch size not divisible by the processes. */
    {
        accel__plan inner = {0}, out = {0};
        int64_t order[6] = {0, 1, 2, 3, 4, 5};
        CHECK(accel__plan_batches(&inner, order, 6, 3, 0) == ACCEL_OK);
        CHECK(accel__shard_batches(&out, &inner, 3, 0, 2, 0, 1, 1) == ACCEL_EINVAL);
        CHECK(strstr(accel_last_error(NULL), "multiple") != NULL);
        accel__plan_free(&inner);
        accel__plan_free(&out);
    }

    /* Lengths: for every mode, len() equals the batches produced and even modes agree. */
    for (int nr = 2; nr <= 4; nr++) {
        for (int64_t n = 1; n <= 40; n++) {
            for (int64_t bs = 1; bs <= 5; bs++) {
                for (int mode = 0; mode < 4; mode++) {
                    int drop = mode & 1, even = (mode >> 1) & 1;
                    int64_t order[64];
                    for (int64_t i = 0; i < n; i++) {
                        order[i] = i;
                    }
                    accel__plan inner = {0}, out = {0};
                    CHECK(accel__plan_batches(&inner, order, n, bs, drop) == ACCEL_OK);
                    int64_t first = -1;
                    for (int r = 0; r < nr; r++) {
                        accel__plan_clear(&out);
                        CHECK(accel__shard_batches(&out, &inner, bs, drop, nr, r, 0, even) ==
                              ACCEL_OK);
                        CHECK(accel__shard_len(inner.n_batches, drop, nr, r, 0, even) ==
                              out.n_batches);
                        for (int64_t b = 0; even && !drop && b < out.n_batches; b++) {
                            CHECK(accel__plan_batch_len(&out, b) == bs);
                        }
                        if (even && r > 0) {
                            CHECK(first == out.n_batches);
                        }
                        first = out.n_batches;
                    }
                    accel__plan_free(&inner);
                    accel__plan_free(&out);
                }
            }
        }
    }
    printf("test_shard: ok\n");
    return 0;
}
