/*
 * The flat geometry (flat.h): parameter offsets, buckets and their padding, and the mapping
 * between a rank's shard and the flat index space. Pure arithmetic over sizes: no buffers, no
 * accelerator. Invariant: buckets tile [0, padded_numel) in order, each padded to a multiple
 * of pad_unit, so piece r of every bucket is padded / n_ranks elements and the shards tile
 * [0, padded_numel / n_ranks).
 */
#include <string.h>

#include "base/base.h"
#include "flat.h"

static accel_status lay_out(accel__flat *f, const accel__flat_param *params, int n_params, int nb,
                            int n_ranks, size_t pad_unit, size_t *offsets, const int *bucket);

/* What both builders require of their sizes. */
static accel_status check_sizes(int n_params, int n_ranks, size_t pad_unit)
{
    if (n_params < 1 || n_ranks < 1 || pad_unit < 1 || pad_unit % (size_t)n_ranks != 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "flat geometry: %d parameters, %d ranks, pad unit %zu (need >= 1 "
                             "parameter and a pad unit that is a multiple of the ranks)",
                             n_params, n_ranks, pad_unit);
    }
    return ACCEL_OK;
}

accel_status accel__flat_build(accel__flat *f, const accel__flat_param *params, int n_params,
                               double first_nbytes, double cap_nbytes, int n_ranks, size_t pad_unit,
                               size_t *offsets, int *bucket)
{
    ACCEL_TRY(check_sizes(n_params, n_ranks, pad_unit));
    /* Pass 1, backward order: DDP's size rule over trainable parameters (a frozen one inside
     * a bucket counts towards its size, one before its first trainable parameter does not).
     * Frozen parameters get the bucket of the next trainable one, resolved in pass 2. */
    int nb = 0, open = 0;
    size_t u = 0, start = 0; /* unpadded position, and where the open bucket's count starts */
    for (int i = n_params - 1; i >= 0; i--) {
        if (params[i].numel == 0) {
            return accel__seterr(NULL, ACCEL_EINVAL, "flat geometry: parameter %d is empty", i);
        }
        bucket[i] = -1;
        if (!params[i].frozen) {
            if (!open) {
                nb++;
                open = 1;
                start = u;
            }
            bucket[i] = nb - 1;
            double limit = nb == 1 ? first_nbytes : cap_nbytes;
            if ((double)(u + params[i].numel - start) * sizeof(float) >= limit) {
                open = 0;
            }
        }
        u += params[i].numel;
    }
    /* Pass 2, forward over memory from the end: a frozen parameter joins the bucket of the
     * trainable one after it, or the last bucket (or the only one, when none is trainable). */
    int next = nb > 0 ? nb - 1 : 0;
    for (int i = 0; i < n_params; i++) {
        if (bucket[i] < 0) {
            bucket[i] = next;
        } else {
            next = bucket[i];
        }
    }
    if (nb == 0) {
        nb = 1;
    }
    return lay_out(f, params, n_params, nb, n_ranks, pad_unit, offsets, bucket);
}

/* Pass 3, given every parameter's bucket (buckets consecutive in memory order): offsets, with
 * each bucket padded before the next starts, and the shard offsets. */
static accel_status lay_out(accel__flat *f, const accel__flat_param *params, int n_params, int nb,
                            int n_ranks, size_t pad_unit, size_t *offsets, const int *bucket)
{
    size_t u = 0;
    for (int i = 0; i < n_params; i++) {
        u += params[i].numel;
    }
    accel__flat_bucket *bk = accel__calloc((size_t)nb, sizeof(*bk));
    if (bk == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "flat geometry: out of memory for %d buckets", nb);
    }
    size_t off = 0; /* backward (memory) order */
    for (int i = n_params - 1; i >= 0; i--) {
        accel__flat_bucket *b = &bk[bucket[i]];
        if (b->count == 0 && b->padded == 0) {
            b->offset = off; /* first parameter of this bucket */
        }
        offsets[i] = off;
        b->count += params[i].numel;
        b->padded = (b->count + pad_unit - 1) / pad_unit * pad_unit;
        off = b->offset + b->count;
        if (i == 0 || bucket[i - 1] != bucket[i]) {
            off = b->offset + b->padded;
        }
    }
    memset(f, 0, sizeof(*f));
    f->numel = u;
    f->padded_numel = off;
    f->pad_unit = pad_unit;
    f->n_ranks = n_ranks;
    f->n_buckets = nb;
    f->buckets = bk;
    size_t so = 0;
    for (int b = 0; b < nb; b++) {
        bk[b].shard_offset = so;
        so += bk[b].padded / (size_t)n_ranks;
    }
    return ACCEL_OK;
}

accel_status accel__flat_build_units(accel__flat *f, const accel__flat_param *params, int n_params,
                                     const int *unit_of, int n_ranks, size_t pad_unit,
                                     size_t *offsets, int *bucket)
{
    ACCEL_TRY(check_sizes(n_params, n_ranks, pad_unit));
    int n_units = unit_of[n_params - 1] + 1;
    for (int i = 0; i < n_params; i++) {
        if (params[i].numel == 0) {
            return accel__seterr(NULL, ACCEL_EINVAL, "flat geometry: parameter %d is empty", i);
        }
        if (unit_of[i] < (i ? unit_of[i - 1] : 0) || unit_of[i] > (i ? unit_of[i - 1] + 1 : 0)) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "flat geometry: unit %d of parameter %d does not follow unit %d "
                                 "(units are consecutive runs numbered from 0)",
                                 unit_of[i], i, i ? unit_of[i - 1] : -1);
        }
        /* Memory is reverse registration order: the last unit is bucket 0. */
        bucket[i] = n_units - 1 - unit_of[i];
    }
    return lay_out(f, params, n_params, n_units, n_ranks, pad_unit, offsets, bucket);
}

void accel__flat_free(accel__flat *f)
{
    if (f != NULL) {
        accel__free(f->buckets);
        memset(f, 0, sizeof(*f));
    }
}

size_t accel__flat_shard_numel(const accel__flat *f)
{
    return f->padded_numel / (size_t)f->n_ranks;
}

void accel__flat_piece(const accel__flat *f, int b, int rank, size_t *offset, size_t *count)
{
    const accel__flat_bucket *bk = &f->buckets[b];
    size_t piece = bk->padded / (size_t)f->n_ranks;
    *offset = bk->offset + (size_t)rank * piece;
    *count = piece;
}

int accel__flat_bucket_of(const accel__flat *f, size_t flat_index)
{
    int lo = 0, hi = f->n_buckets - 1;
    while (lo < hi) { /* the last bucket starting at or before flat_index */
        int mid = (lo + hi + 1) / 2;
        if (f->buckets[mid].offset <= flat_index) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

size_t accel__flat_from_shard(const accel__flat *f, int rank, size_t shard_index)
{
    int lo = 0, hi = f->n_buckets - 1;
    while (lo < hi) { /* the last bucket whose pieces start at or before shard_index */
        int mid = (lo + hi + 1) / 2;
        if (f->buckets[mid].shard_offset <= shard_index) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    size_t off, count;
    accel__flat_piece(f, lo, rank, &off, &count);
    return off + (shard_index - f->buckets[lo].shard_offset);
}

void accel__flat_to_shard(const accel__flat *f, size_t flat_index, int *rank, size_t *shard_index)
{
    const accel__flat_bucket *bk = &f->buckets[accel__flat_bucket_of(f, flat_index)];
    size_t piece = bk->padded / (size_t)f->n_ranks, in = flat_index - bk->offset;
    *rank = (int)(in / piece);
    *shard_index = bk->shard_offset + in % piece;
}
