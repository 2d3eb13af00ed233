/*
 * The loader on real processes: shuffles identical on every process although each process
 * seeds its own generator differently (process 0's generator is broadcast at every epoch
 * start), different per epoch, each epoch covering the dataset; dispatch_batches reproducing
 * Accelerate's 9 samples / bs 3 / 2 processes example, and a read failure on process 0 reaching
 * every process with its status and message; lengths agree with the batches seen; loaders
 * that differ between processes (dataset length, batch size) refused by accel_prepare on
 * every process.
 * ACCEL_TEST_NPROCS: 1 2 3 4
 */
#include <string.h>

#include "accel/data.h"
#include "check.h"
#include "index_dataset.h"

/* The same dataset, except that sample 7 cannot be read. */
static accel_status bad_get(void *ctx, int64_t i, accel_sample *out)
{
    if (i == 7) {
        return ACCEL_ECORRUPT; /* the loader names the sample */
    }
    return ids_get(ctx, i, out);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int nr = accel_num_processes(acc), rank = accel_process_index(acc);
    CHECK_OK(acc, accel_set_seed(acc, 1000, 1)); /* a different loader seed on every process */
    int64_t n = 48;
    accel_dataset ds = ids_dataset(&n);
    accel_loader_options o = accel_loader_options_default();
    o.batch_size = 4;
    o.shuffle = 1;
    o.num_workers = 2;
    accel_loader *l;
    CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
    CHECK_OK(acc, accel_prepare(acc, l));
    int64_t prev_first = -1;
    int differ = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        int64_t mine[64], count = 0;
        accel_batch *b;
        while (accel_loader_next(l, &b) == ACCEL_OK) {
            for (int64_t i = 0; i < b->rows; i++) {
                mine[count++] = b->indices[i];
            }
        }
        CHECK(count == accel_loader_len(l) * 4);
        /* 48 = 12 batches: every process gets 12 / N full batches when N divides 12. */
        int64_t all[256];
        int64_t per = count;
        CHECK_OK(acc, accel_allgather(acc, mine, all, (size_t)per * (size_t)nr, ACCEL_I64, NULL));
        int seen[48] = {0};
        for (int64_t i = 0; i < per * nr; i++) {
            CHECK(all[i] >= 0 && all[i] < 48);
            seen[all[i]]++;
        }
        for (int i = 0; i < 48; i++) {
            CHECK_MSG(seen[i] == 1, "epoch %d: sample %d seen %d times", epoch, i, seen[i]);
        }
        if (prev_first >= 0 && all[0] != prev_first) {
            differ = 1;
        }
        prev_first = all[0];
    }
    CHECK(differ); /* the shuffle changes between epochs */
    accel_loader_free(l);

    /* dispatch_batches: 9 samples, bs 3 (6.6). */
    if (nr == 2) {
        n = 9;
        o = accel_loader_options_default();
        o.batch_size = 3;
        o.dispatch_batches = 1;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        CHECK_OK(acc, accel_prepare(acc, l));
        CHECK(accel_loader_len(l) == 2);
        static const int64_t want[2][2][3] = {{{0, 1, 2}, {6, 7}}, {{3, 4, 5}, {8, 0}}};
        accel_batch *b;
        int step = 0;
        while (accel_loader_next(l, &b) == ACCEL_OK) {
            const accel_tensor *x = accel_batch_field(b, "x");
            CHECK(x != NULL && b->rows == (step == 0 ? 3 : 2));
            for (int64_t i = 0; i < b->rows; i++) {
                CHECK(((int64_t *)x->data)[i] == want[rank][step][i]);
            }
            step++;
        }
        CHECK(step == 2);
        /* skip_first_batches skips whole dispatched steps (Accelerate: single batches of the
         * base loader, docs/data.md); the length is the rest of the epoch. */
        CHECK_OK(acc, accel_loader_skip_first_batches(l, 1));
        CHECK(accel_loader_len(l) == 1);
        step = 0;
        while (accel_loader_next(l, &b) == ACCEL_OK) {
            const accel_tensor *x = accel_batch_field(b, "x");
            CHECK(b->rows == 2 && ((int64_t *)x->data)[0] == want[rank][1][0]);
            step++;
        }
        CHECK(step == 1 && accel_loader_len(l) == 2);
        accel_loader_free(l);

        /* Process 0 fails to read a batch: every process gets its status and its message. */
        accel_dataset bad = ds;
        bad.get = bad_get;
        CHECK_OK(acc, accel_loader_new(acc, &bad, &o, &l));
        CHECK_OK(acc, accel_prepare(acc, l));
        accel_status st;
        while ((st = accel_loader_next(l, &b)) == ACCEL_OK) {
        }
        char msg[512];
        snprintf(msg, sizeof msg, "%sloader: dataset get(index 7) failed: %s",
                 rank == 0 ? "" : "dispatch_batches: process 0 failed to read the dataset: ",
                 accel_status_str(ACCEL_ECORRUPT));
        CHECK_ERR(acc, st, ACCEL_ECORRUPT, msg);
        accel_loader_free(l);

        /* Processes that built different loaders (fault sweep): the last one with a longer
         * dataset, then with another batch size. Prepare used to shard each process's own
         * dataset, silently handing out other or repeated samples; now every process gets the
         * same error. With even_batches off (uneven inputs, a join region) lengths may differ. */
        int64_t n_own = rank == nr - 1 ? 50 : 48;
        accel_dataset own = ids_dataset(&n_own);
        accel_loader_options oo = accel_loader_options_default();
        oo.batch_size = 4;
        CHECK_OK(acc, accel_loader_new(acc, &own, &oo, &l));
        CHECK_ERR(acc, accel_prepare(acc, l), ACCEL_EINVAL,
                  "accel_prepare: the processes built different loaders: dataset length is 48 on "
                  "some processes and 50 on others (every process must build the same loader "
                  "over the same dataset; uneven lengths need even_batches = 0)");
        accel_loader_free(l);
        n_own = 48;
        oo.batch_size = rank == 0 ? 4 : 2;
        CHECK_OK(acc, accel_loader_new(acc, &own, &oo, &l));
        CHECK(accel_prepare(acc, l) == ACCEL_EINVAL);
        CHECK(strstr(accel_last_error(acc), "batch_size is 2 on some processes and 4 on others"));
        accel_loader_free(l);
        n_own = rank == nr - 1 ? 50 : 48;
        oo.batch_size = 4;
        oo.even_batches = 0;
        CHECK_OK(acc, accel_loader_new(acc, &own, &oo, &l));
        CHECK_OK(acc, accel_prepare(acc, l));
        accel_loader_free(l);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_free(acc);
    return 0;
}
