/*
 * dispatch_batches (Accelerate's DataLoaderDispatcher): only process 0 reads the dataset. Per
 * step it takes one base batch (split_batches) or concatenates num_processes of them, looks one
 * step ahead to know whether this is the last, and broadcasts a header (shapes, dtypes, names,
 * flags) then the data; every process keeps its slice [p*b, (p+1)*b) with b = rows / N. On the
 * last step, when rows % N != 0 and not drop_last, b grows by one and the missing rows come
 * from the first rows of the first global batch; remainder = rows of that last step.
 * Invariant: every process makes the same broadcasts in the same order, even when process 0
 * fails to read (it then broadcasts an error flag instead of data).
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "data_internal.h"

#define NAME_WORDS 6 /* 48 bytes per field name */
#define FIELD_WORDS (2 + ACCEL_MAX_DIMS + NAME_WORDS)
#define HDR_WORDS (4 + ACCEL_MAX_FIELDS * FIELD_WORDS)

struct accel__dispatch {
    accel_batch g[2];  /* global batches: process 0 holds the current one and the next */
    accel_batch first; /* the first rows of the epoch's first global batch */
    accel_batch out;   /* this process's slice */
    int64_t first_rows;
    int pend; /* process 0: g[] index of the prefetched step, -1 none yet, -2 none left */
    int64_t step;
    int64_t hdr[HDR_WORDS];
    char names[ACCEL_MAX_FIELDS][NAME_WORDS * 8];
};

accel_status accel__dispatch_new(accel_loader *l, accel__dispatch **out)
{
    (void)l;
    accel__dispatch *d = accel__calloc(1, sizeof(*d));
    if (d == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory");
    }
    accel_status st = ACCEL_OK;
    for (int i = 0; i < 2 && st == ACCEL_OK; i++) {
        st = accel__batch_init(&d->g[i]);
    }
    if (st == ACCEL_OK) {
        st = accel__batch_init(&d->first);
    }
    if (st == ACCEL_OK) {
        st = accel__batch_init(&d->out);
    }
    if (st != ACCEL_OK) {
        accel__dispatch_free(d);
        return st;
    }
    *out = d;
    return ACCEL_OK;
}

void accel__dispatch_free(accel__dispatch *d)
{
    if (d == NULL) {
        return;
    }
    accel__batch_free(&d->g[0]);
    accel__batch_free(&d->g[1]);
    accel__batch_free(&d->first);
    accel__batch_free(&d->out);
    accel__free(d);
}

accel_status accel__dispatch_begin(accel_loader *l)
{
    l->disp->pend = -1;
    l->disp->step = 0;
    l->disp->first_rows = 0;
    l->dk = 0;
    return ACCEL_OK;
}

static size_t row_nbytes(const accel_tensor *t)
{
    size_t n = accel_dtype_nbytes(t->dtype);
    for (int d = 1; d < t->ndim; d++) {
        n *= (size_t)t->shape[d];
    }
    return n;
}

/* Appends the rows of src to g (same fields, dtypes and trailing shapes). */
static accel_status append(accel_batch *g, const accel_batch *src)
{
    if (g->rows == 0) {
        g->n_fields = src->n_fields;
    } else if (g->n_fields != src->n_fields) {
        return accel__seterr(NULL, ACCEL_EINVAL, "dispatch_batches: batches have different fields");
    }
    for (int f = 0; f < src->n_fields; f++) {
        const accel_tensor *s = &src->field[f];
        accel_tensor *t = &g->field[f];
        if (g->rows > 0) {
            int same = t->dtype == s->dtype && t->ndim == s->ndim;
            for (int d = 1; same && d < s->ndim; d++) {
                same = t->shape[d] == s->shape[d];
            }
            if (!same) {
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "dispatch_batches: batches of different shapes cannot be "
                                     "concatenated (field \"%s\"); use dispatch_batches = 0 or "
                                     "split_batches = 1",
                                     src->name[f] ? src->name[f] : "?");
            }
        }
        size_t rb = row_nbytes(s);
        size_t have = (size_t)g->rows * rb, add = (size_t)s->shape[0] * rb;
        /* Keep the rows already there: copy through a grown buffer when needed. */
        accel__bufset *bs = g->priv;
        if (bs->cap[f] < have + add) {
            void *old = bs->buf[f];
            size_t oldcap = bs->cap[f];
            bs->buf[f] = NULL;
            bs->cap[f] = 0;
            void *nb = accel__bufset_get(bs, f, 2 * (have + add));
            if (nb == NULL) {
                bs->buf[f] = old;
                bs->cap[f] = oldcap;
                return accel__seterr(NULL, ACCEL_ENOMEM, "dispatch_batches: out of memory");
            }
            if (have > 0) {
                memcpy(nb, old, have);
            }
            accel__aligned_free(old);
        }
        memcpy((char *)bs->buf[f] + have, s->data, add);
        *t = *s;
        t->data = bs->buf[f];
        t->shape[0] = g->rows + s->shape[0];
        g->name[f] = src->name[f];
    }
    g->rows += src->n_fields > 0 ? src->field[0].shape[0] : 0;
    return ACCEL_OK;
}

/* Process 0: the next global batch into g (*have = 0 at the end). */
static accel_status fetch(accel_loader *l, accel_batch *g, int *have)
{
    int want = l->split ? 1 : l->n_ranks;
    int got = 0;
    g->rows = 0;
    *have = 0;
    for (int i = 0; i < want; i++) {
        accel_batch *b;
        accel_status st = accel__base_next(l, &b);
        if (st == ACCEL_EOF) {
            break;
        }
        ACCEL_TRY(st);
        ACCEL_TRY(append(g, b));
        got++;
    }
    /* A partial group of base batches is kept only without drop_last. */
    *have = got > 0 && (got == want || !l->o.drop_last);
    return ACCEL_OK;
}

static accel_status bcast(accel *acc, void *buf, size_t count, accel_dtype dt)
{
    accel_status st = accel__broadcast(acc->comm, buf, count, dt, 0);
    return st == ACCEL_OK ? ACCEL_OK : accel__adopt_thread_error(acc, st);
}

accel_status accel__dispatch_next(accel_loader *l, accel_batch **out, int *last)
{
    accel *acc = l->acc;
    accel__dispatch *d = l->disp;
    int nr = l->n_ranks;
    for (;;) {
        int cur = 0, stop = 0, is_last = 0;
        accel_status rst = ACCEL_OK;
        int64_t *h = d->hdr;
        memset(h, 0, sizeof(d->hdr));
        if (acc->rank == 0) {
            int have = 0;
            if (d->pend == -1) {
                rst = fetch(l, &d->g[0], &have);
                cur = 0;
            } else if (d->pend >= 0) {
                cur = d->pend;
                have = 1;
            }
            int have_nx = 0;
            if (rst == ACCEL_OK && have) {
                rst = fetch(l, &d->g[cur ^ 1], &have_nx);
            }
            d->pend = have_nx ? cur ^ 1 : -2;
            h[0] = rst != ACCEL_OK ? 2 : !have;
            h[1] = !have_nx;
            if (rst != ACCEL_OK) {
                /* The others cannot see this process's error: send its status and message in
                 * the header words a failed read leaves unused. */
                h[1] = rst;
                snprintf((char *)(h + 4), (HDR_WORDS - 4) * sizeof(int64_t), "%s",
                         accel_last_error(NULL));
            }
            const accel_batch *g = &d->g[cur];
            h[2] = g->rows;
            h[3] = g->n_fields;
            for (int f = 0; rst == ACCEL_OK && have && f < g->n_fields; f++) {
                int64_t *fh = h + 4 + f * FIELD_WORDS;
                fh[0] = g->field[f].dtype;
                fh[1] = g->field[f].ndim;
                memcpy(fh + 2, g->field[f].shape, sizeof(g->field[f].shape));
                snprintf((char *)(fh + 2 + ACCEL_MAX_DIMS), NAME_WORDS * 8, "%s",
                         g->name[f] ? g->name[f] : "");
            }
        }
        ACCEL_TRY(bcast(acc, h, HDR_WORDS, ACCEL_I64));
        if (h[0] == 2) {
            if (acc->rank == 0) {
                return rst;
            }
            char *msg = (char *)(h + 4);
            msg[(HDR_WORDS - 4) * sizeof(int64_t) - 1] = '\0';
            return accel__seterr(NULL, (accel_status)h[1],
                                 "dispatch_batches: process 0 failed to read the dataset: %s", msg);
        }
        stop = h[0] != 0;
        if (stop) {
            return ACCEL_EOF;
        }
        is_last = (int)h[1];
        accel_batch *g = &d->g[cur];
        g->rows = h[2];
        g->n_fields = (int)h[3];
        for (int f = 0; f < g->n_fields; f++) {
            const int64_t *fh = h + 4 + f * FIELD_WORDS;
            accel_tensor *t = &g->field[f];
            if (acc->rank != 0) {
                t->dtype = (accel_dtype)fh[0];
                t->ndim = (int)fh[1];
                memcpy(t->shape, fh + 2, sizeof(t->shape));
                t->device.type = ACCEL_DEVICE_CPU;
                t->device.index = 0;
                memcpy(d->names[f], fh + 2 + ACCEL_MAX_DIMS, NAME_WORDS * 8);
                d->names[f][NAME_WORDS * 8 - 1] = '\0';
                g->name[f] = d->names[f];
                t->data = accel_batch_scratch(g, f, accel_tensor_nbytes(t));
                if (t->data == NULL) {
                    return accel__seterr(NULL, ACCEL_ENOMEM, "dispatch_batches: out of memory");
                }
            }
            ACCEL_TRY(bcast(acc, t->data, accel_tensor_nbytes(t), ACCEL_U8));
        }
        /* The first rows of the epoch's first global batch complete the last one. */
        if (d->step == 0) {
            d->first_rows = g->rows < nr ? g->rows : nr;
            d->first.n_fields = g->n_fields;
            for (int f = 0; f < g->n_fields; f++) {
                size_t nb = row_nbytes(&g->field[f]) * (size_t)d->first_rows;
                void *p = accel_batch_scratch(&d->first, f, nb);
                if (p == NULL) {
                    return accel__seterr(NULL, ACCEL_ENOMEM, "dispatch_batches: out of memory");
                }
                memcpy(p, g->field[f].data, nb);
                d->first.field[f] = g->field[f];
                d->first.field[f].data = p;
            }
        }
        int64_t step = d->step++;
        int64_t observed = g->rows;
        int64_t b = observed / nr;
        if (is_last && !l->o.drop_last && observed % nr != 0) {
            b += 1;
        }
        /* This process's slice, padding past the end by cycling the first rows. */
        accel_batch *o = &d->out;
        o->n_fields = g->n_fields;
        for (int f = 0; f < g->n_fields; f++) {
            size_t rb = row_nbytes(&g->field[f]);
            char *dst = accel_batch_scratch(o, f, rb * (size_t)b);
            if (dst == NULL) {
                return accel__seterr(NULL, ACCEL_ENOMEM, "dispatch_batches: out of memory");
            }
            for (int64_t q = (int64_t)acc->rank * b, i = 0; i < b; q++, i++) {
                const char *src = q < observed ? (const char *)g->field[f].data + (size_t)q * rb
                                               : (const char *)d->first.field[f].data +
                                                     (size_t)((q - observed) % d->first_rows) * rb;
                memcpy(dst + (size_t)i * rb, src, rb);
            }
            o->field[f] = g->field[f];
            o->field[f].data = dst;
            o->field[f].shape[0] = b;
            o->name[f] = g->name[f];
        }
        o->rows = b;
        o->indices = NULL;
        if (is_last) {
            l->remainder = (int)observed;
        }
        if (step < l->skip) {
            if (is_last) {
                return ACCEL_EOF;
            }
            continue;
        }
        l->dk = step + 1;
        *last = is_last;
        *out = o;
        return ACCEL_OK;
    }
}

int64_t accel__dispatch_len(const accel_loader *l)
{
    int64_t n = accel__dataset_len(l);
    if (n < 0) {
        return -1;
    }
    int64_t bs = l->o.batch_size;
    int64_t base = l->o.drop_last ? n / bs : accel__ceil_div(n, bs);
    if (l->split) {
        return base;
    }
    return l->o.drop_last ? base / l->n_ranks : accel__ceil_div(base, l->n_ranks);
}
