/*
 * gather_for_metrics returns exactly the dataset (no duplicate, nothing lost) for dataset sizes
 * 1..50 with batch 3, gathering tensors and objects, in the default (BatchSamplerShard,
 * even_batches) mode and with dispatch_batches; a tensor or objects one process cannot send
 * fail on every process alike.
 * ACCEL_TEST_NPROCS: 1 2 3
 */
#include <string.h>

#include "accel/data.h"
#include "check.h"
#include "index_dataset.h"

static void run(accel *acc, int64_t n, int dispatch, int objects)
{
    accel_dataset ds = ids_dataset(&n);
    accel_loader_options o = accel_loader_options_default();
    o.batch_size = 3;
    o.dispatch_batches = dispatch;
    accel_loader *l;
    CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
    CHECK_OK(acc, accel_prepare(acc, l));
    int count[64] = {0};
    int64_t total = 0;
    accel_batch *b;
    accel_status st;
    while ((st = accel_loader_next(l, &b)) == ACCEL_OK) {
        const accel_tensor *x = accel_batch_field(b, "x");
        if (objects) {
            accel_blob_ref items[8];
            char txt[8][24];
            for (int64_t i = 0; i < x->shape[0]; i++) {
                snprintf(txt[i], sizeof(txt[i]), "%lld", (long long)((int64_t *)x->data)[i]);
                items[i].data = txt[i];
                items[i].nbytes = strlen(txt[i]);
            }
            const accel_blob_ref *out;
            size_t n_out;
            CHECK_OK(acc, accel_gather_for_metrics_objects(acc, items, (size_t)x->shape[0], &out,
                                                           &n_out));
            for (size_t i = 0; i < n_out; i++) {
                char buf[24] = {0};
                memcpy(buf, out[i].data, out[i].nbytes);
                long v = strtol(buf, NULL, 10);
                CHECK(v >= 0 && v < n);
                count[v]++;
                total++;
            }
        } else {
            accel_tensor g;
            CHECK_OK(acc, accel_gather_for_metrics(acc, x, &g));
            for (int64_t i = 0; i < g.shape[0]; i++) {
                int64_t v = ((int64_t *)g.data)[i];
                CHECK(v >= 0 && v < n);
                count[v]++;
                total++;
            }
        }
    }
    CHECK_MSG(st == ACCEL_EOF, "%s", accel_last_error(acc));
    CHECK_MSG(total == n, "n=%lld dispatch=%d objects=%d: gathered %lld samples", (long long)n,
              dispatch, objects, (long long)total);
    for (int64_t i = 0; i < n; i++) {
        CHECK_MSG(count[i] == 1, "n=%lld: sample %lld seen %d times", (long long)n, (long long)i,
                  count[i]);
    }
    accel_loader_free(l);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    for (int64_t n = 1; n <= 50; n++) {
        run(acc, n, 0, 0);
        run(acc, n, 0, 1);
        run(acc, n, 1, 0);
    }
    /* Fault sweep: the last process passes a tensor with a negative dimension, then objects
     * with NULL data. It returned alone (or copied a wrapped size) while the others waited in
     * the gather; now every process gets the same error, and the next gather works. */
    int rank = accel_process_index(acc), last = accel_num_processes(acc) - 1;
    char want[200];
    float v[4] = {1, 2, 3, 4};
    accel_tensor t = accel_tensor_view(v, ACCEL_F32, 1, (int64_t[]){rank == last ? -4 : 4}), out;
    snprintf(want, sizeof want,
             "accel_gather_for_metrics: process %d's tensor has a negative dimension, a size that "
             "overflows or NULL data",
             last);
    CHECK_ERR(acc, accel_gather_for_metrics(acc, &t, &out), ACCEL_EINVAL, want);
    accel_blob_ref item = {rank == last ? NULL : v, 8};
    const accel_blob_ref *got;
    size_t n_got;
    snprintf(want, sizeof want,
             "accel_gather_for_metrics_objects: process %d's items have NULL data or sizes that "
             "overflow",
             last);
    CHECK_ERR(acc, accel_gather_for_metrics_objects(acc, &item, 1, &got, &n_got), ACCEL_EINVAL,
              want);
    t.shape[0] = 4;
    CHECK_OK(acc, accel_gather_for_metrics(acc, &t, &out));
    CHECK(out.shape[0] == 4 * (last + 1));
    accel_free(acc);
    return 0;
}
