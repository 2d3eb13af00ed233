/*
 * The dataset of the data tests on real processes (test_loader_dist.c, test_gather_metrics.c):
 * n samples, sample i holding the int64 i in its one field "x", so every batch names the samples
 * it got.
 */
#ifndef ACCEL_TEST_INDEX_DATASET_H
#define ACCEL_TEST_INDEX_DATASET_H

#include "accel/data.h"

static int64_t ids_len(void *ctx)
{
    return *(int64_t *)ctx;
}

static accel_status ids_get(void *ctx, int64_t i, accel_sample *out)
{
    (void)ctx;
    int64_t *x = accel_sample_scratch(out, 0, sizeof(int64_t));
    *x = i;
    out->n_fields = 1;
    out->name[0] = "x";
    out->field[0] = accel_tensor_view(x, ACCEL_I64, 0, NULL);
    return ACCEL_OK;
}

/* The dataset of *n samples (n borrowed: it must outlive the dataset). */
static accel_dataset ids_dataset(int64_t *n)
{
    accel_dataset ds = {0};
    ds.ctx = n;
    ds.len = ids_len;
    ds.get = ids_get;
    return ds;
}

#endif
