/*
 * gather_for_metrics: all-gather per-sample results of every process and, on the last batch of
 * a prepared loader, keep only the first `remainder` rows so the duplicates even_batches or
 * dispatch added to complete the last round are dropped. Sizes are exchanged first, so
 * processes may hold different row counts. Results live in buffers of the accelerator's data
 * slot, grown only (no allocation per step once warm).
 */
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "core/gstate.h"
#include "data_internal.h"

typedef struct data_slot {
    unsigned char *buf, *tmp;
    size_t cap_buf, cap_tmp;
    int64_t *hdr;
    size_t cap_hdr;
    accel_blob_ref *refs;
    size_t cap_refs;
} data_slot;

static void slot_free(accel *acc, void *state)
{
    (void)acc;
    data_slot *s = state;
    accel__aligned_free(s->buf);
    accel__aligned_free(s->tmp);
    accel__free(s->hdr);
    accel__free(s->refs);
    accel__free(s);
}

static data_slot *slot_of(accel *acc)
{
    data_slot *s = accel__module(acc, ACCEL__MOD_DATA);
    if (s == NULL) {
        s = accel__calloc(1, sizeof(*s));
        if (s != NULL) {
            accel__module_set(acc, ACCEL__MOD_DATA, s, slot_free);
        }
    }
    return s;
}

static int reserve(void **p, size_t *cap, size_t nbytes, int aligned)
{
    if (nbytes <= *cap) {
        return 1;
    }
    if (nbytes > SIZE_MAX / 4) {
        return 0; /* doubling towards it would wrap to 0 and loop */
    }
    size_t ncap = *cap ? *cap : 256;
    while (ncap < nbytes) {
        ncap *= 2;
    }
    void *np = aligned ? accel__aligned_alloc(ncap) : accel__malloc(ncap);
    if (np == NULL) {
        return 0;
    }
    if (aligned) {
        accel__aligned_free(*p);
    } else {
        accel__free(*p);
    }
    *p = np;
    *cap = ncap;
    return 1;
}

/* All-gather `per` elements of dtype dt from every process into recv (rank-major). */
static accel_status allgather(accel *acc, const void *send, void *recv, size_t per, accel_dtype dt)
{
    accel__coll op;
    memset(&op, 0, sizeof(op));
    op.kind = ACCEL__COLL_ALLGATHER;
    op.send = send;
    op.recv = recv;
    op.count = per;
    op.dtype = dt;
    accel_status st = accel__comm_run(acc->comm, &op);
    return st == ACCEL_OK ? ACCEL_OK : accel__adopt_thread_error(acc, st);
}

/* Rows to keep out of `total` gathered ones (Accelerate's gather_for_metrics). */
static int64_t keep_rows(const accel *acc, int64_t total)
{
    int remainder = accel__grad_state_remainder(acc);
    if (accel__grad_state_active_loaders(acc) > 0 && accel__grad_state_end_of_dataloader(acc) &&
        remainder > 0 && remainder < total) {
        return remainder;
    }
    return total;
}

#define HDR_WORDS (4 + ACCEL_MAX_DIMS)

accel_status accel_gather_for_metrics(accel *acc, const accel_tensor *in, accel_tensor *out)
{
    if (acc == NULL || in == NULL || out == NULL || in->ndim < 1 || in->ndim > ACCEL_MAX_DIMS ||
        accel_dtype_nbytes(in->dtype) == 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_gather_for_metrics: need acc, out and a tensor with ndim >= 1");
    }
    data_slot *s = slot_of(acc);
    int n = acc->n_ranks;
    if (s == NULL ||
        !reserve((void **)&s->hdr, &s->cap_hdr, (size_t)(n + 1) * HDR_WORDS * sizeof(int64_t), 0)) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_gather_for_metrics: out of memory");
    }
    int64_t *mine = s->hdr + (size_t)n * HDR_WORDS;
    memset(mine, 0, HDR_WORDS * sizeof(int64_t));
    /* A tensor this process cannot send (a negative dimension, a size that overflows, NULL
     * data) goes out as -1 rows: every process then returns the same error, where returning
     * here alone left the others waiting in the gathers (and the size was a wrapped huge
     * number). */
    uint64_t elems = 1;
    int bad = 0;
    for (int d = 0; d < in->ndim; d++) {
        bad |= in->shape[d] < 0 || __builtin_mul_overflow(elems, (uint64_t)in->shape[d], &elems) ||
               elems > SIZE_MAX / 8 / (size_t)(n + 1);
    }
    size_t nbytes = bad ? 0 : accel_tensor_nbytes(in);
    bad |= nbytes > 0 && in->data == NULL;
    mine[0] = bad ? -1 : in->shape[0];
    mine[1] = in->dtype;
    mine[2] = in->ndim;
    mine[3] = (int64_t)nbytes;
    for (int d = 1; d < in->ndim; d++) {
        mine[4 + d] = in->shape[d];
    }
    ACCEL_TRY(allgather(acc, mine, s->hdr, HDR_WORDS, ACCEL_I64));
    size_t maxb = 0;
    int64_t rows = 0;
    for (int r = 0; r < n; r++) {
        if (s->hdr[(size_t)r * HDR_WORDS] < 0) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_gather_for_metrics: process %d's tensor has a negative "
                                 "dimension, a size that overflows or NULL data",
                                 r);
        }
    }
    for (int r = 0; r < n; r++) {
        const int64_t *h = s->hdr + (size_t)r * HDR_WORDS;
        if (h[1] != mine[1] || h[2] != mine[2] || memcmp(h + 5, mine + 5, 7 * sizeof(int64_t))) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_gather_for_metrics: process %d's tensor differs in dtype "
                                 "or trailing shape from process %d's",
                                 r, acc->rank);
        }
        maxb = (size_t)h[3] > maxb ? (size_t)h[3] : maxb;
        rows += h[0];
    }
    if (!reserve((void **)&s->tmp, &s->cap_tmp, maxb * (size_t)(n + 1) + 1, 1) ||
        !reserve((void **)&s->buf, &s->cap_buf, maxb * (size_t)n + 1, 1)) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_gather_for_metrics: out of memory");
    }
    unsigned char *send = s->tmp + maxb * (size_t)n;
    memcpy(send, in->data, nbytes);
    ACCEL_TRY(allgather(acc, send, s->tmp, maxb, ACCEL_U8));
    size_t at = 0;
    for (int r = 0; r < n; r++) {
        size_t b = (size_t)s->hdr[(size_t)r * HDR_WORDS + 3];
        memcpy(s->buf + at, s->tmp + (size_t)r * maxb, b);
        at += b;
    }
    *out = *in;
    out->data = s->buf;
    out->shape[0] = keep_rows(acc, rows);
    return ACCEL_OK;
}

accel_status accel_gather_for_metrics_objects(accel *acc, const accel_blob_ref *items, size_t n,
                                              const accel_blob_ref **out, size_t *n_out)
{
    if (acc == NULL || out == NULL || n_out == NULL || (n > 0 && items == NULL)) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_gather_for_metrics_objects: NULL argument");
    }
    data_slot *s = slot_of(acc);
    int nr = acc->n_ranks;
    size_t mybytes = 0;
    int bad = n > (size_t)INT64_MAX; /* sent as -1 items: every process fails alike, as above */
    for (size_t i = 0; i < n && !bad; i++) {
        bad = (items[i].nbytes > 0 && items[i].data == NULL) ||
              __builtin_add_overflow(mybytes, items[i].nbytes, &mybytes) ||
              mybytes > SIZE_MAX / 4 / (size_t)(nr + 1);
    }
    if (s == NULL ||
        !reserve((void **)&s->hdr, &s->cap_hdr, (size_t)(nr + 1) * 2 * sizeof(int64_t), 0)) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_gather_for_metrics_objects: out of memory");
    }
    int64_t mine[2] = {bad ? -1 : (int64_t)n, bad ? 0 : (int64_t)mybytes};
    ACCEL_TRY(allgather(acc, mine, s->hdr, 2, ACCEL_I64));
    for (int r = 0; r < nr; r++) {
        if (s->hdr[2 * r] < 0) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_gather_for_metrics_objects: process %d's items have NULL "
                                 "data or sizes that overflow",
                                 r);
        }
    }
    size_t maxn = 0, maxb = 0, total_n = 0;
    for (int r = 0; r < nr; r++) {
        size_t cn = (size_t)s->hdr[2 * r], cb = (size_t)s->hdr[2 * r + 1];
        maxn = cn > maxn ? cn : maxn;
        maxb = cb > maxb ? cb : maxb;
        total_n += cn;
    }
    /* Layout of tmp: [nr blocks of maxn sizes][my sizes]; buf: [nr blocks of maxb][my bytes]. */
    size_t sizes_nbytes = (maxn + 1) * sizeof(int64_t);
    if (!reserve((void **)&s->tmp, &s->cap_tmp, sizes_nbytes * (size_t)(nr + 1), 1) ||
        !reserve((void **)&s->buf, &s->cap_buf, (maxb + 1) * (size_t)(nr + 1), 1) ||
        !reserve((void **)&s->refs, &s->cap_refs, (total_n + 1) * sizeof(accel_blob_ref), 0)) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_gather_for_metrics_objects: out of memory");
    }
    int64_t *sizes = (int64_t *)s->tmp;
    int64_t *my_sizes = sizes + (size_t)nr * maxn;
    unsigned char *my_bytes = s->buf + (size_t)nr * maxb;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        my_sizes[i] = (int64_t)items[i].nbytes;
        if (items[i].nbytes > 0) {
            memcpy(my_bytes + at, items[i].data, items[i].nbytes);
        }
        at += items[i].nbytes;
    }
    if (maxn > 0) {
        ACCEL_TRY(allgather(acc, my_sizes, sizes, maxn, ACCEL_I64));
    }
    if (maxb > 0) {
        ACCEL_TRY(allgather(acc, my_bytes, s->buf, maxb, ACCEL_U8));
    }
    size_t k = 0;
    for (int r = 0; r < nr; r++) {
        size_t off = (size_t)r * maxb;
        for (int64_t i = 0; i < s->hdr[2 * r]; i++) {
            s->refs[k].data = s->buf + off;
            s->refs[k].nbytes = (size_t)sizes[(size_t)r * maxn + (size_t)i];
            off += s->refs[k].nbytes;
            k++;
        }
    }
    *out = s->refs;
    *n_out = (size_t)keep_rows(acc, (int64_t)total_n);
    return ACCEL_OK;
}
