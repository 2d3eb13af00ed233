/*
 * The loader on one process: sharded iteration as process p of N (accel__loader_prepare_as),
 * IterableDatasetShard examples, deterministic order with 0, 1 and 4 workers, shuffles that
 * change per epoch, the seedable sampler, skip_first_batches, end_of_dataloader / remainder in
 * the gradient state (nested loaders), padding collate, bad input, position save/restore.
 */
#include <string.h>

#include "check.h"
#include "core/gstate.h"
#include "data/data_internal.h"

/* ---- a map-style dataset of int64 scalars "x" = index, optional failure / variable length ---- */
typedef struct ids {
    int64_t n;
    int64_t fail_at;  /* get() fails at this index (-1 never) */
    int fail_silent;  /* ... returning the status without a message */
    int varlen;       /* "seq" field of length 1 + index % 3 */
    int64_t vals[64]; /* backing store for zero-copy views */
    int32_t seq[64][3];
} ids;

static int64_t ids_len(void *ctx)
{
    return ((ids *)ctx)->n;
}

static accel_status ids_get(void *ctx, int64_t i, accel_sample *out)
{
    ids *d = ctx;
    if (i == d->fail_at) {
        return d->fail_silent ? ACCEL_ECORRUPT
                              : accel__seterr(NULL, ACCEL_ECORRUPT, "record is damaged");
    }
    int64_t *x = accel_sample_scratch(out, 0, sizeof(int64_t));
    CHECK(x != NULL);
    *x = i;
    out->n_fields = 1;
    out->name[0] = "x";
    out->field[0] = accel_tensor_view(x, ACCEL_I64, 0, NULL);
    if (d->varlen) {
        int64_t len = 1 + i % 3;
        for (int k = 0; k < 3; k++) {
            d->seq[i % 64][k] = (int32_t)(i * 10 + k);
        }
        out->n_fields = 2;
        out->name[1] = "seq";
        out->field[1] = accel_tensor_view(d->seq[i % 64], ACCEL_I32, 1, &len);
    }
    return ACCEL_OK;
}

static accel_dataset ids_dataset(ids *d, int64_t n)
{
    memset(d, 0, sizeof(*d));
    d->n = n;
    d->fail_at = -1;
    accel_dataset ds = {0};
    ds.ctx = d;
    ds.len = ids_len;
    ds.get = ids_get;
    return ds;
}

/* ---- an iterable stream of int64 0..n-1 ---- */
typedef struct stream {
    int64_t n, at;
    int64_t fail_at; /* next() fails when reaching this element (0: never) */
    int fail_reset;  /* reset() fails */
} stream;

static accel_status stream_next(void *ctx, accel_sample *out)
{
    stream *s = ctx;
    if (s->at >= s->n) {
        return ACCEL_EOF;
    }
    if (s->fail_at > 0 && s->at == s->fail_at) {
        return accel__seterr(NULL, ACCEL_EIO, "stream broke at %lld", (long long)s->at);
    }
    int64_t *x = accel_sample_scratch(out, 0, sizeof(int64_t));
    *x = s->at++;
    out->n_fields = 1;
    out->name[0] = "x";
    out->field[0] = accel_tensor_view(x, ACCEL_I64, 0, NULL);
    return ACCEL_OK;
}

static accel_status stream_reset(void *ctx, int64_t epoch)
{
    (void)epoch;
    if (((stream *)ctx)->fail_reset) {
        return ACCEL_EIO; /* without a message */
    }
    ((stream *)ctx)->at = 0;
    return ACCEL_OK;
}

/* A user collate that builds a bad batch (fault sweep): 99 fields, or a negative dimension.
 * The loader handed it out as it was (accel_batch_field read past the field arrays). */
static accel_status bad_collate(void *ctx, const accel_sample *s, int64_t n, accel_batch *out)
{
    (void)s;
    (void)n;
    static float none[1];
    out->n_fields = *(int *)ctx == 0 ? 99 : 1;
    out->name[0] = "x";
    out->field[0] = accel_tensor_view(none, ACCEL_F32, 1, (int64_t[]){-1});
    return ACCEL_OK;
}

/* ---- datasets whose samples are bad input (fault sweep): what collate must refuse ---- */
static float bad_data[4];
static int bad_kind; /* 0: a negative dimension, 1: NULL data, 2: a size that overflows */

static int64_t bad_len(void *ctx)
{
    return *(int64_t *)ctx;
}

static accel_status bad_get(void *ctx, int64_t i, accel_sample *out)
{
    (void)ctx;
    out->n_fields = 1;
    out->name[0] = "x";
    int64_t shape[2] = {4, 1};
    if (i == 2 && bad_kind == 0) {
        shape[0] = -4;
    } else if (i == 2 && bad_kind == 2) {
        shape[0] = shape[1] = (int64_t)1 << 40;
    }
    out->field[0] =
        accel_tensor_view(i == 2 && bad_kind == 1 ? NULL : bad_data, ACCEL_F32, 2, shape);
    return ACCEL_OK;
}

static accel_status failing_collate(void *ctx, const accel_sample *s, int64_t n, accel_batch *out)
{
    (void)ctx, (void)s, (void)out;
    return accel__seterr(NULL, ACCEL_EINVAL, "cannot stack %lld ragged samples", (long long)n);
}

static int64_t stream_len(void *ctx)
{
    return ((stream *)ctx)->n;
}

/* Runs one epoch and formats it "0 1 2|3 4 5"; returns the batch count. */
static int64_t epoch_str(accel_loader *l, char *buf, size_t n)
{
    size_t at = 0;
    int64_t nb = 0;
    buf[0] = '\0';
    accel_batch *b;
    accel_status st;
    while ((st = accel_loader_next(l, &b)) == ACCEL_OK) {
        const accel_tensor *x = accel_batch_field(b, "x");
        CHECK(x != NULL && x->dtype == ACCEL_I64 && x->ndim == 1 && x->shape[0] == b->rows);
        for (int64_t i = 0; i < b->rows; i++) {
            at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? " " : (nb ? "|" : ""),
                                   (long long)((int64_t *)x->data)[i]);
        }
        nb++;
    }
    CHECK_MSG(st == ACCEL_EOF, "%s", accel_last_error(NULL));
    return nb;
}

static accel *acc;

static accel_loader *make(const accel_dataset *ds, int64_t bs, int shuffle, int workers)
{
    accel_loader_options o = accel_loader_options_default();
    o.batch_size = bs;
    o.shuffle = shuffle;
    o.num_workers = workers;
    o.seed_set = 1;
    o.seed = 1234;
    accel_loader *l;
    CHECK_OK(acc, accel_loader_new(acc, ds, &o, &l));
    return l;
}

static void check_shard(const accel_dataset *ds, int64_t bs, int nr, int split, int even, int drop,
                        const char *const *want)
{
    for (int r = 0; r < nr; r++) {
        if (ds->reset != NULL) { /* each simulated process reads the stream from the start */
            ds->reset(ds->ctx, 0);
        }
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = bs;
        o.drop_last = drop;
        o.split_batches = split;
        o.even_batches = even;
        o.dispatch_batches = 0;
        accel_loader *l;
        CHECK_OK(acc, accel_loader_new(acc, ds, &o, &l));
        CHECK_OK(acc, accel__loader_prepare_as(l, r, nr));
        char buf[1024];
        int64_t nb = epoch_str(l, buf, sizeof(buf));
        CHECK_MSG(strcmp(buf, want[r]) == 0, "rank %d of %d: got \"%s\" want \"%s\"", r, nr, buf,
                  want[r]);
        int64_t len = accel_loader_len(l);
        CHECK_MSG(len == nb, "rank %d: len %lld, %lld batches", r, (long long)len, (long long)nb);
        accel_loader_free(l);
    }
}

#define SHARD(ds, bs, nr, split, even, drop, ...)                                                  \
    check_shard(ds, bs, nr, split, even, drop, (const char *const[]){__VA_ARGS__})

int main(void)
{
    CHECK_OK(NULL, accel_init(&acc, NULL));
    ids d;
    accel_dataset ds = ids_dataset(&d, 22);
    char a[2048], b2[2048];

    /* Map-style through the loader: Accelerate's range(22), bs3 on 2 processes. */
    SHARD(&ds, 3, 2, 0, 1, 0, "0 1 2|6 7 8|12 13 14|18 19 20", "3 4 5|9 10 11|15 16 17|21 0 1");
    SHARD(&ds, 4, 2, 1, 1, 0, "0 1|4 5|8 9|12 13|16 17|20 21", "2 3|6 7|10 11|14 15|18 19|0 1");

    /* IterableDatasetShard (6.4): range(10), bs4, N2, plain and split; 3 processes; tiny. */
    stream s = {10, 0, 0, 0};
    accel_dataset it = {0};
    it.ctx = &s;
    it.next = stream_next;
    it.reset = stream_reset;
    it.total_length = stream_len;
    SHARD(&it, 4, 2, 0, 1, 0, "0 1 2 3|8 9 0 1", "4 5 6 7|2 3 4 5");
    SHARD(&it, 4, 2, 1, 1, 0, "0 1|4 5|8 9", "2 3|6 7|0 1");
    SHARD(&it, 4, 2, 0, 1, 1, "0 1 2 3", "4 5 6 7");
    SHARD(&it, 2, 3, 0, 1, 0, "0 1|6 7", "2 3|8 9", "4 5|0 1");
    SHARD(&it, 2, 4, 0, 1, 0, "0 1|8 9", "2 3|0 1", "4 5|2 3", "6 7|4 5");
    s.n = 3;
    SHARD(&it, 4, 2, 0, 1, 0, "0 1 2 0", "1 2 0 1");
    s.n = 10;
    { /* unsharded iterable: the last batch short unless drop_last */
        stream_reset(&s, 0);
        accel_loader *l = make(&it, 4, 0, 0);
        CHECK(epoch_str(l, a, sizeof(a)) == 3 && strcmp(a, "0 1 2 3|4 5 6 7|8 9") == 0);
        CHECK(epoch_str(l, a, sizeof(a)) == 3); /* second epoch via reset */
        CHECK(accel_loader_len(l) == 3);
        accel_loader_free(l);
    }

    /* Deterministic order with 0, 1 and 4 workers, shuffled, over 3 epochs. */
    {
        char ref[3][2048];
        int wk[3] = {0, 1, 4};
        for (int w = 0; w < 3; w++) {
            accel_loader *l = make(&ds, 3, 1, wk[w]);
            for (int e = 0; e < 3; e++) {
                epoch_str(l, a, sizeof(a));
                if (w == 0) {
                    strcpy(ref[e], a);
                } else {
                    CHECK_MSG(strcmp(a, ref[e]) == 0, "workers %d epoch %d: %s vs %s", wk[w], e, a,
                              ref[e]);
                }
            }
            accel_loader_free(l);
        }
        CHECK(strcmp(ref[0], ref[1]) != 0 && strcmp(ref[1], ref[2]) != 0);
        CHECK(strcmp(ref[0], "0 1 2|3 4 5|6 7 8|9 10 11|12 13 14|15 16 17|18 19 20|21") != 0);
        /* Every epoch is a permutation. */
        int seen[22] = {0};
        for (char *p = ref[1]; *p;) {
            long v = strtol(p, &p, 10);
            CHECK(v >= 0 && v < 22 && !seen[v]);
            seen[v] = 1;
            while (*p == ' ' || *p == '|') {
                p++;
            }
        }
    }

    /* Seedable sampler: the order is a function of (seed, epoch) only. */
    {
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = 5;
        o.shuffle = 1;
        o.seed_set = 1;
        o.seed = 7;
        o.use_seedable_sampler = 1;
        accel_loader *l1;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l1));
        accel_loader *l2;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l2));
        CHECK_OK(acc, accel_prepare(acc, l1, l2));
        epoch_str(l1, a, sizeof(a));
        epoch_str(l1, a, sizeof(a));
        epoch_str(l1, a, sizeof(a)); /* epoch 2 */
        CHECK_OK(acc, accel_loader_set_epoch(l2, 2));
        epoch_str(l2, b2, sizeof(b2));
        CHECK(strcmp(a, b2) == 0);
        CHECK_OK(acc, accel_loader_set_epoch(l2, 1));
        epoch_str(l2, b2, sizeof(b2));
        CHECK(strcmp(a, b2) != 0);
        accel_loader_free(l1);
        accel_loader_free(l2);
    }

    /* skip_first_batches: map-style skips indices without reading them; one epoch only. The
     * length is the rest of that epoch (Accelerate's len(skipped loader)), then whole again. */
    {
        d.fail_at = 1; /* reading index 1 would fail: skipping batch 0 must not read it */
        accel_loader *l = make(&ds, 3, 0, 0);
        CHECK(accel_loader_len(l) == 8);
        CHECK_OK(acc, accel_loader_skip_first_batches(l, 2));
        CHECK(accel_loader_len(l) == 6);
        accel_batch *b;
        CHECK_OK(acc, accel_loader_next(l, &b));
        CHECK(b->index == 2 && b->indices[0] == 6);
        CHECK(accel_loader_len(l) == 6);
        while (accel_loader_next(l, &b) == ACCEL_OK) {
        }
        d.fail_at = -1;
        CHECK(accel_loader_len(l) == 8);
        CHECK(epoch_str(l, a, sizeof(a)) == 8);                /* the next epoch is whole */
        CHECK_OK(acc, accel_loader_skip_first_batches(l, 20)); /* past the end: nothing left */
        CHECK(accel_loader_len(l) == 0);
        accel_loader_free(l);
        /* iterable: produced and discarded */
        stream_reset(&s, 0);
        l = make(&it, 4, 0, 2);
        CHECK_OK(acc, accel_loader_skip_first_batches(l, 1));
        CHECK(epoch_str(l, a, sizeof(a)) == 2 && strcmp(a, "4 5 6 7|8 9") == 0);
        accel_loader_free(l);
    }

    /* end_of_dataloader is set while the last batch is processed; remainder; nesting. */
    {
        accel_loader *outer = make(&ds, 4, 0, 0); /* 22 = 5*4 + 2: remainder 2 */
        accel_loader *inner = make(&ds, 10, 0, 2);
        CHECK_OK(acc, accel__loader_prepare_as(outer, 0, 1));
        CHECK_OK(acc, accel__loader_prepare_as(inner, 0, 1));
        CHECK(accel__grad_state_active_loaders(acc) == 0 && accel__grad_state_remainder(acc) == -1);
        accel_batch *b;
        int n = 0;
        while (accel_loader_next(outer, &b) == ACCEL_OK) {
            n++;
            CHECK(accel__grad_state_active_loaders(acc) == 1 &&
                  accel__grad_state_remainder(acc) == 2);
            CHECK(accel__grad_state_end_of_dataloader(acc) == (n == 6));
            if (n == 2 || n == 6) { /* evaluation inside the epoch */
                int m = 0;
                while (accel_loader_next(inner, &b) == ACCEL_OK) {
                    m++;
                    CHECK(accel__grad_state_active_loaders(acc) == 2 &&
                          accel__grad_state_remainder(acc) == 2);
                    CHECK(accel__grad_state_end_of_dataloader(acc) == (m == 3));
                }
                CHECK(m == 3 && accel__grad_state_active_loaders(acc) == 1);
                CHECK(accel__grad_state_end_of_dataloader(acc) == (n == 6) &&
                      accel__grad_state_remainder(acc) == 2);
            }
        }
        CHECK(n == 6 && accel__grad_state_active_loaders(acc) == 0 &&
              accel__grad_state_end_of_dataloader(acc) == 0 &&
              accel__grad_state_remainder(acc) == -1);
        /* gather_for_metrics on one process keeps `remainder` rows of the last batch */
        int n_rows = 0;
        while (accel_loader_next(outer, &b) == ACCEL_OK) {
            accel_tensor out;
            CHECK_OK(acc, accel_gather_for_metrics(acc, accel_batch_field(b, "x"), &out));
            n_rows += (int)out.shape[0];
        }
        CHECK(n_rows == 22);
        accel_loader_free(inner);
        accel_loader_free(outer);
    }

    /* Collate: variable-length field padded with -100; without a pad value: EINVAL naming the
     * sample index. */
    {
        d.varlen = 1;
        accel_pad_value pad = {"seq", -100};
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = 3;
        o.pad = &pad;
        o.n_pad = 1;
        accel_loader *l;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        accel_batch *b;
        CHECK_OK(acc, accel_loader_next(l, &b));
        const accel_tensor *sq = accel_batch_field(b, "seq");
        CHECK(sq->ndim == 2 && sq->shape[0] == 3 && sq->shape[1] == 3);
        const int32_t *v = sq->data;
        int32_t want[9] = {0, -100, -100, 10, 11, -100, 20, 21, 22};
        CHECK(memcmp(v, want, sizeof(want)) == 0);
        accel_loader_free(l);
        o.n_pad = 0;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        CHECK(accel_loader_next(l, &b) == ACCEL_EINVAL);
        CHECK_MSG(strstr(accel_last_error(acc), "index 1") != NULL, "%s", accel_last_error(acc));
        accel_loader_free(l);
        d.varlen = 0;
    }

    /* A failing dataset callback: its status and the sample index, with and without workers. */
    for (int w = 0; w <= 2; w += 2) {
        d.fail_at = 13;
        accel_loader *l = make(&ds, 4, 0, w);
        accel_batch *b;
        accel_status st;
        int n = 0;
        while ((st = accel_loader_next(l, &b)) == ACCEL_OK) {
            n++;
        }
        CHECK(st == ACCEL_ECORRUPT && n == 3);
        CHECK_ERR(acc, st, ACCEL_ECORRUPT,
                  "loader: dataset get(index 13) failed: record is damaged");
        CHECK_ERR(NULL, st, ACCEL_ECORRUPT,
                  "loader: dataset get(index 13) failed: record is damaged");
        /* A callback that sets no message: the status's text, never an earlier message. */
        d.fail_silent = 1;
        while ((st = accel_loader_next(l, &b)) == ACCEL_OK) {
        }
        char want[256];
        snprintf(want, sizeof want, "loader: dataset get(index 13) failed: %s",
                 accel_status_str(ACCEL_ECORRUPT));
        CHECK_ERR(acc, st, ACCEL_ECORRUPT, want);
        d.fail_at = -1;
        d.fail_silent = 0;
        CHECK(epoch_str(l, a, sizeof(a)) == 6); /* the next epoch works */
        accel_loader_free(l);
    }

    /* The other callbacks failing: exact messages. */
    {
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = 4;
        o.collate = failing_collate;
        accel_loader *l;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        accel_batch *b;
        CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_EINVAL,
                  "loader: collate of 4 samples: cannot stack 4 ragged samples");
        accel_loader_free(l);
        int kind = 0;
        o.collate = bad_collate;
        o.collate_ctx = &kind;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_EINVAL,
                  "loader: collate of 4 samples: the batch has 99 fields (0..8)");
        kind = 1;
        CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_EINVAL,
                  "loader: collate of 4 samples: field 0 (\"x\") of the batch has an invalid "
                  "dtype, rank or shape, or NULL data");
        accel_loader_free(l);
        o.collate = failing_collate;
        o.collate_ctx = NULL;
        stream s2 = {10, 0, 9, 0};
        accel_dataset it2 = {0};
        it2.ctx = &s2;
        it2.next = stream_next;
        it2.reset = stream_reset;
        l = make(&it2, 4, 0, 0);
        CHECK(accel_loader_next(l, &b) == ACCEL_OK);
        CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_EIO,
                  "loader: dataset next() failed in epoch 0: stream broke at 9");
        s2.fail_reset = 1;
        char want[256];
        snprintf(want, sizeof want, "loader: dataset reset(epoch 1): %s",
                 accel_status_str(ACCEL_EIO));
        CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_EIO, want);
        accel_loader_free(l);
    }

    /* Bad options. */
    {
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = 0;
        CHECK(accel_loader_new(acc, &ds, &o, &(accel_loader *){NULL}) == ACCEL_EINVAL);
        accel_dataset empty = {0};
        CHECK(accel_loader_new(acc, &empty, NULL, &(accel_loader *){NULL}) == ACCEL_EINVAL);
        /* Options not made by the _default(): the one check every options struct gets. */
        accel_loader_options zero = {0};
        CHECK(accel_loader_new(acc, &ds, &zero, &(accel_loader *){NULL}) == ACCEL_EINVAL);
        CHECK_MSG(strstr(accel_last_error(acc), "accel_loader_options_default()") != NULL, "%s",
                  accel_last_error(acc));
        o.batch_size = 3;
        o.split_batches = 1;
        accel_loader *l;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        CHECK(accel__loader_prepare_as(l, 0, 2) == ACCEL_EINVAL);
        accel_loader_free(l);
    }

    /* Fault sweep: bad samples are ACCEL_EINVAL naming the sample (a negative dimension hung
     * the loader, doubling its scratch size to 0 forever; NULL data crashed the copy), huge
     * lengths and sizes are counted without overflow, and limits no loader reaches refused. */
    {
        int64_t n_bad = 5;
        accel_dataset bd = {0};
        bd.ctx = &n_bad;
        bd.len = bad_len;
        bd.get = bad_get;
        const char *want[3] = {"collate: field \"x\" of sample index 2 has a negative dimension",
                               "collate: field \"x\" of sample index 2 has NULL data",
                               "collate: field \"x\" of sample index 2 has a size that overflows"};
        for (bad_kind = 0; bad_kind < 3; bad_kind++) {
            accel_loader *l = make(&bd, 3, 0, 0);
            accel_batch *b;
            CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_EINVAL, want[bad_kind]);
            accel_loader_free(l);
        }
        accel_batch fake = {0};
        CHECK(accel_batch_scratch(&fake, 0, 8) == NULL);
        accel_loader *l = make(&bd, 3, 0, 0);
        accel_batch *b;
        bad_kind = -1;
        CHECK_OK(acc, accel_loader_next(l, &b));
        CHECK(accel_batch_scratch(b, 0, SIZE_MAX) == NULL); /* hung: ENOMEM now */
        CHECK(accel_last_status(NULL) == ACCEL_ENOMEM);
        accel_loader_free(l);
        n_bad = INT64_MAX; /* ceil(len / batch_size) overflowed */
        l = make(&bd, 3, 0, 0);
        CHECK(accel_loader_len(l) == INT64_MAX / 3 + 1);
        accel_loader_free(l);
        n_bad = ((int64_t)1 << 61) + 1; /* len x 8 bytes wrapped to an 8-byte index array */
        l = make(&bd, 3, 0, 0);
        CHECK_ERR(acc, accel_loader_next(l, &b), ACCEL_ENOMEM,
                  "loader: out of memory for 2305843009213693953 indices");
        accel_loader_free(l);
        n_bad = 5;
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = INT64_MAX;
        CHECK(accel_loader_new(acc, &bd, &o, &(accel_loader *){NULL}) == ACCEL_EINVAL);
        o.batch_size = 1;
        o.num_workers = 1 << 30; /* num_workers x prefetch_factor overflowed an int */
        CHECK(accel_loader_new(acc, &bd, &o, &(accel_loader *){NULL}) == ACCEL_EINVAL);
        o.num_workers = 1;
        o.prefetch_factor = 1 << 30;
        CHECK_ERR(acc, accel_loader_new(acc, &bd, &o, &(accel_loader *){NULL}), ACCEL_EINVAL,
                  "accel_loader_new: batch_size 1, num_workers 1 or num_workers x prefetch_factor "
                  "(1073741824) too large (at most 2^31 - 1, 4096 and 2^20)");
        /* Epochs and positions past 2^53: the next epoch would overflow. */
        l = make(&bd, 3, 0, 0);
        CHECK_ERR(acc, accel_loader_set_epoch(l, INT64_MAX), ACCEL_EINVAL,
                  "accel_loader_set_epoch: epoch 9223372036854775807 is not in 0..2^53");
        accel_loader_position pos;
        CHECK_OK(acc, accel_loader_get_position(l, &pos));
        pos.epoch = INT64_MAX;
        CHECK(accel_loader_set_position(l, &pos) == ACCEL_EINVAL);
        pos.epoch = 0;
        pos.batches = INT64_MAX;
        CHECK(accel_loader_set_position(l, &pos) == ACCEL_EINVAL);
        accel_loader_free(l);
    }

    /* Position: save mid-epoch, restore on a fresh loader, the rest is identical. */
    {
        accel_loader *l = make(&ds, 3, 1, 2);
        epoch_str(l, a, sizeof(a));
        accel_batch *b;
        CHECK_OK(acc, accel_loader_next(l, &b));
        CHECK_OK(acc, accel_loader_next(l, &b));
        accel_loader_position pos;
        CHECK_OK(acc, accel_loader_get_position(l, &pos));
        CHECK(pos.epoch == 1 && pos.batches == 2);
        char rest[2][2048];
        epoch_str(l, rest[0], sizeof(rest[0]));
        epoch_str(l, a, sizeof(a));
        accel_loader *l2 = make(&ds, 3, 1, 0);
        CHECK_OK(acc, accel_loader_set_position(l2, &pos));
        epoch_str(l2, rest[1], sizeof(rest[1]));
        CHECK(strcmp(rest[0], rest[1]) == 0);
        epoch_str(l2, b2, sizeof(b2));
        CHECK(strcmp(a, b2) == 0); /* and the epoch after too */
        accel_loader_free(l);
        accel_loader_free(l2);
    }

    /* Seeds: accel_set_seed makes loaders without a seed (and the generator) reproducible. */
    {
        uint64_t s1[4], s2[4];
        CHECK_OK(acc, accel_set_seed(acc, 42, 0));
        CHECK_OK(acc, accel_get_rng_state(acc, s1));
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = 4;
        o.shuffle = 1;
        accel_loader *l;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l));
        epoch_str(l, a, sizeof(a));
        CHECK_OK(acc, accel_set_seed(acc, 42, 0));
        CHECK_OK(acc, accel_get_rng_state(acc, s2));
        CHECK(memcmp(s1, s2, sizeof(s1)) == 0);
        accel_loader *l2;
        CHECK_OK(acc, accel_loader_new(acc, &ds, &o, &l2));
        epoch_str(l2, b2, sizeof(b2));
        CHECK(strcmp(a, b2) == 0);
        CHECK_OK(acc, accel_synchronize_rng_states(acc));
        uint64_t zero[4] = {0};
        CHECK(accel_set_rng_state(acc, zero) == ACCEL_EINVAL);
        accel_loader_free(l);
        accel_loader_free(l2);
    }
    accel_free(acc);
    printf("test_loader: ok\n");
    return 0;
}
