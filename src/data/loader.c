/*
 * The loader: the epoch protocol (DataLoaderShard.__iter__: generator sync, plan,
 * end-of-dataloader one batch early, gradient state push/pop), iterable streams with
 * IterableDatasetShard, lengths and the loader position (its creation, preparation and release
 * are in loader_new.c).
 * Invariant: while an epoch of a prepared loader runs, the GradientState (core/gstate.h) shows
 * this loader's end_of_dataloader and remainder, and the values it replaced are restored when
 * it ends.
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "core/gstate.h"
#include "core/profile.h"
#include "data_internal.h"

int64_t accel__dataset_len(const accel_loader *l)
{
    if (l->map_style) {
        return l->ds.len(l->ds.ctx);
    }
    if (l->ds.total_length != NULL) {
        int64_t n = l->ds.total_length(l->ds.ctx);
        return n >= 0 ? n : -1;
    }
    return -1;
}

/* ---- gradient state ---- */

static void state_push(accel_loader *l)
{
    if (!l->track_state || l->active) {
        return;
    }
    accel__grad_state_loader_enter(l->acc, l->remainder, &l->saved_eod, &l->saved_remainder);
    l->active = 1;
}

static void state_pop(accel_loader *l)
{
    if (!l->active) {
        return;
    }
    accel__grad_state_loader_leave(l->acc, l->saved_eod, l->saved_remainder);
    l->active = 0;
}

/* ---- epochs ---- */

static int64_t total_batch_size(const accel_loader *l)
{
    return l->split ? l->o.batch_size : l->o.batch_size * l->n_ranks;
}

accel_status accel__loader_begin_order(accel_loader *l)
{
    int64_t n = accel__dataset_len(l);
    if (n < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "loader: dataset len() returned %lld",
                             (long long)n);
    }
    if (n > l->cap_order) {
        /* A length past SIZE_MAX / 8 wrapped the byte count to a small buffer, then filled. */
        int64_t *o = (uint64_t)n <= SIZE_MAX / sizeof(int64_t)
                         ? accel__realloc(l->order, (size_t)n * sizeof(int64_t))
                         : NULL;
        if (o == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for %lld indices",
                                 (long long)n);
        }
        l->order = o;
        l->cap_order = n;
    }
    if (l->o.shuffle && l->seedable) {
        /* SeedableRandomSampler: a pure function of (seed, epoch). */
        accel__gen g;
        accel__gen_seed(&g, accel__seed_mix(l->seed, (uint64_t)l->epoch));
        accel__gen_permutation(&g, l->order, n);
    } else if (l->o.shuffle) {
        accel__gen_permutation(&l->gen, l->order, n);
    } else {
        for (int64_t i = 0; i < n; i++) {
            l->order[i] = i;
        }
    }
    return accel__plan_batches(&l->inner, l->order, n, l->o.batch_size, l->o.drop_last);
}

static accel_status ensure_samples(accel_sample **s, int64_t *cap, int64_t n);

static accel_status begin_epoch(accel_loader *l)
{
    accel *acc = l->acc;
    /* rng_types = ["generator"]: every process starts the epoch from process 0's generator. */
    if (l->track_state && l->o.shuffle && !l->seedable && acc->n_ranks > 1) {
        accel_status st = accel__broadcast(acc->comm, l->gen.s, 4, ACCEL_I64, 0);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
    }
    l->epoch_gen = l->gen;
    int64_t n = accel__dataset_len(l);
    l->remainder = (!l->o.drop_last && n >= 0) ? (int)(n % total_batch_size(l)) : -1;
    l->k = 0;
    int sharded = l->n_ranks > 1 && !l->dispatch;
    if (l->map_style) {
        accel_status st = accel__loader_begin_order(l);
        if (st == ACCEL_OK && sharded) {
            accel__plan_clear(&l->plan);
            st = accel__shard_batches(&l->plan, &l->inner, l->o.batch_size, l->o.drop_last,
                                      l->n_ranks, l->rank, l->split, l->even);
        } else if (st == ACCEL_OK) {
            accel__plan tmp = l->plan;
            l->plan = l->inner;
            l->inner = tmp;
        }
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
        l->n_batches = l->plan.n_batches;
        /* dispatch skips whole dispatched steps, so the base stream starts at 0 */
        l->k = l->dispatch ? 0 : (l->skip < l->n_batches ? l->skip : l->n_batches);
        if (l->workers != NULL && (!l->dispatch || acc->rank == 0)) {
            accel__workers_start(l->workers, l->k, l->n_batches);
        }
    } else {
        if (l->epoch > 0 || l->stream_done || l->first_len > 0) {
            if (l->ds.reset == NULL) {
                return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                                     "loader: the iterable dataset has no reset callback, so it "
                                     "cannot start epoch %lld",
                                     (long long)l->epoch);
            }
            accel__clear_error();
            accel_status st = l->ds.reset(l->ds.ctx, l->epoch);
            if (st != ACCEL_OK) {
                return accel__seterr(acc, st, "loader: dataset reset(epoch %lld): %s",
                                     (long long)l->epoch, accel__cause(st));
            }
        }
        int64_t want = sharded ? total_batch_size(l) : l->o.batch_size;
        for (int b = 0; b < 2; b++) {
            accel_status st = ensure_samples(&l->ibuf[b], &l->ibuf_cap[b], want);
            if (st != ACCEL_OK) {
                return accel__adopt_thread_error(acc, st);
            }
        }
        l->first_len = 0;
        l->stream_done = 0;
        l->have_next = -1;
    }
    if (l->dispatch) {
        accel_status st = accel__dispatch_begin(l);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
    }
    l->in_epoch = 1;
    state_push(l);
    return ACCEL_OK;
}

/* Ends the epoch in progress (advance: the next one is epoch + 1, as Accelerate's iteration). */
void accel__loader_end_epoch(accel_loader *l, int advance)
{
    if (!l->in_epoch) {
        return;
    }
    if (l->workers != NULL) {
        accel__workers_stop(l->workers);
    }
    state_pop(l);
    l->in_epoch = 0;
    l->skip = 0;
    if (advance) {
        l->epoch++;
    }
}

/* ---- building batches ---- */

static accel_status ensure_samples(accel_sample **s, int64_t *cap, int64_t n)
{
    if (n <= *cap) {
        return ACCEL_OK;
    }
    accel_sample *ns = accel__calloc((size_t)n, sizeof(*ns));
    if (ns == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for %lld samples",
                             (long long)n);
    }
    ACCEL_TRY(accel__samples_init(ns, n));
    accel__samples_free(*s, *cap);
    accel__free(*s);
    *s = ns;
    *cap = n;
    return ACCEL_OK;
}

static accel_status collate(accel_loader *l, const accel_sample *s, int64_t n,
                            const int64_t *indices, accel_batch *out)
{
    out->n_fields = 0;
    if (l->o.collate != NULL) {
        accel__clear_error();
        accel_status st = l->o.collate(l->o.collate_ctx, s, n, out);
        if (st == ACCEL_OK) {
            st = accel__batch_check(out);
        }
        if (st != ACCEL_OK) {
            return accel__seterr(NULL, st, "loader: collate of %lld samples: %s", (long long)n,
                                 accel__cause(st));
        }
        out->rows = n;
        return ACCEL_OK;
    }
    return accel__collate_default(&l->pad, s, n, indices, out);
}

static accel_status set_indices(accel_batch *b, const int64_t *idx, int64_t n)
{
    accel__bufset *bs = b->priv;
    if (idx == NULL) {
        b->indices = NULL;
        return ACCEL_OK;
    }
    if (n > bs->cap_indices) {
        int64_t *ni = accel__realloc(bs->indices, (size_t)n * sizeof(int64_t));
        if (ni == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory");
        }
        bs->indices = ni;
        bs->cap_indices = n;
    }
    memcpy(bs->indices, idx, (size_t)n * sizeof(int64_t));
    b->indices = bs->indices;
    return ACCEL_OK;
}

void accel__loader_build(accel_loader *l, int64_t k, accel_sample *samples, accel__slot *slot)
{
    int64_t n = accel__plan_batch_len(&l->plan, k);
    const int64_t *idx = l->plan.idx + l->plan.off[k];
    accel_status st = ACCEL_OK;
    for (int64_t i = 0; i < n && st == ACCEL_OK; i++) {
        samples[i].n_fields = 0;
        accel__clear_error();
        st = l->ds.get(l->ds.ctx, idx[i], &samples[i]);
        if (st != ACCEL_OK) {
            st = accel__seterr(NULL, st, "loader: dataset get(index %lld) failed: %s",
                               (long long)idx[i], accel__cause(st));
        }
    }
    if (st == ACCEL_OK) {
        st = collate(l, samples, n, idx, &slot->batch);
    }
    if (st == ACCEL_OK) {
        st = set_indices(&slot->batch, idx, n);
    }
    slot->st = st;
    slot->err[0] = '\0';
    if (st != ACCEL_OK) {
        snprintf(slot->err, sizeof(slot->err), "%s", accel_last_error(NULL));
    }
}

accel_status accel__iter_fill(accel_loader *l, accel_sample *buf, int64_t want, int64_t *got)
{
    *got = 0;
    for (int64_t i = 0; i < want; i++) {
        buf[i].n_fields = 0;
        accel__clear_error();
        accel_status st = l->ds.next(l->ds.ctx, &buf[i]);
        if (st == ACCEL_EOF) {
            break;
        }
        if (st != ACCEL_OK) {
            return accel__seterr(NULL, st, "loader: dataset next() failed in epoch %lld: %s",
                                 (long long)l->epoch, accel__cause(st));
        }
        (*got)++;
    }
    return ACCEL_OK;
}

/* One batch of the iterable stream into `out` (*have = 0 when the stream has no more).
 * Sharded: IterableDatasetShard, whose process slice of each buffer is exactly one batch. */
accel_status accel__iter_produce(accel_loader *l, accel_batch *out, int *have)
{
    *have = 0;
    if (l->stream_done) {
        return ACCEL_OK;
    }
    int sharded = l->n_ranks > 1 && !l->dispatch;
    int64_t bs = l->o.batch_size;
    int64_t real = sharded ? total_batch_size(l) : bs;
    int64_t pbs = sharded ? (l->split ? bs / l->n_ranks : bs) : bs;
    accel_sample *buf = (sharded && l->first_len == 0) ? l->ibuf[0] : l->ibuf[1];
    int64_t got;
    ACCEL_TRY(accel__iter_fill(l, buf, real, &got));
    if (!sharded) {
        if (got < real) {
            l->stream_done = 1;
        }
        if (got == 0 || (got < real && l->o.drop_last)) {
            return ACCEL_OK;
        }
        ACCEL_TRY(collate(l, buf, got, NULL, out));
        *have = 1;
        return ACCEL_OK;
    }
    int64_t lo = (int64_t)l->rank * pbs;
    if (got == real) {
        if (l->first_len == 0) {
            l->first_len = real;
        }
        ACCEL_TRY(collate(l, buf + lo, pbs, NULL, out));
        *have = 1;
        return ACCEL_OK;
    }
    l->stream_done = 1;
    if (got == 0 || l->o.drop_last) {
        return ACCEL_OK;
    }
    /* Complete the partial buffer by cycling the first full one (or itself when none). */
    const accel_sample *first = l->first_len > 0 ? l->ibuf[0] : buf;
    int64_t first_len = l->first_len > 0 ? l->first_len : got;
    ACCEL_TRY(ensure_samples(&l->samples, &l->n_samples, pbs));
    for (int64_t q = lo; q < lo + pbs; q++) {
        void *keep = l->samples[q - lo].priv;
        l->samples[q - lo] = q < got ? buf[q] : first[(q - got) % first_len];
        l->samples[q - lo].priv = keep;
    }
    ACCEL_TRY(collate(l, l->samples, pbs, NULL, out));
    *have = 1;
    return ACCEL_OK;
}

accel_status accel__base_next(accel_loader *l, accel_batch **out)
{
    if (!l->map_style) {
        int have;
        ACCEL_TRY(accel__iter_produce(l, &l->slots[0].batch, &have));
        *out = &l->slots[0].batch;
        return have ? ACCEL_OK : ACCEL_EOF;
    }
    if (l->k >= l->n_batches) {
        return ACCEL_EOF;
    }
    accel__slot *slot = &l->slots[0];
    if (l->workers != NULL) {
        accel__prof_begin(l->acc, "data wait", ACCEL__PROF_DATA);
        slot = accel__workers_get(l->workers, l->k);
        accel__prof_end(l->acc);
    } else {
        ACCEL_TRY(
            ensure_samples(&l->samples, &l->n_samples, accel__plan_batch_len(&l->plan, l->k)));
        accel__loader_build(l, l->k, l->samples, slot);
    }
    if (slot->st != ACCEL_OK) {
        return accel__seterr(NULL, slot->st, "%s", slot->err);
    }
    l->k++;
    *out = &slot->batch;
    return ACCEL_OK;
}

/* Ends the epoch after a failure with message `msg`, which may be the thread's message or a
 * worker slot's: both can change while the workers stop, so it is kept first. */
static accel_status fail_epoch(accel_loader *l, accel_status st, const char *msg)
{
    char keep[ACCEL__ERRMSG_NBYTES];
    snprintf(keep, sizeof(keep), "%s", msg);
    accel__loader_end_epoch(l, 1);
    return accel__seterr(l->acc, st, "%s", keep);
}

static accel_status next_map(accel_loader *l, accel_batch **out, int *last)
{
    if (l->k >= l->n_batches) {
        return ACCEL_EOF;
    }
    int64_t k = l->k;
    accel__slot *slot;
    if (l->workers != NULL) {
        accel__prof_begin(l->acc, "data wait", ACCEL__PROF_DATA);
        slot = accel__workers_get(l->workers, k);
        accel__prof_end(l->acc);
    } else {
        slot = &l->slots[0];
        accel_status st =
            ensure_samples(&l->samples, &l->n_samples, accel__plan_batch_len(&l->plan, k));
        if (st != ACCEL_OK) {
            return fail_epoch(l, st, accel_last_error(NULL));
        }
        accel__loader_build(l, k, l->samples, slot);
    }
    if (slot->st != ACCEL_OK) {
        return fail_epoch(l, slot->st, slot->err);
    }
    l->k++;
    *last = l->k == l->n_batches;
    *out = &slot->batch;
    return ACCEL_OK;
}

static accel_status next_iter(accel_loader *l, accel_batch **out, int *last)
{
    for (;;) {
        int cur;
        if (l->have_next >= 0) {
            cur = l->have_next;
        } else {
            int have;
            cur = 0;
            accel_status st = accel__iter_produce(l, &l->slots[cur].batch, &have);
            if (st != ACCEL_OK) {
                return fail_epoch(l, st, accel_last_error(NULL));
            }
            if (!have) {
                return ACCEL_EOF;
            }
        }
        /* Look one batch ahead so the last batch is known when it is handed out. */
        int have_nx;
        accel_status st = accel__iter_produce(l, &l->slots[cur ^ 1].batch, &have_nx);
        if (st != ACCEL_OK) {
            return fail_epoch(l, st, accel_last_error(NULL));
        }
        l->have_next = have_nx ? cur ^ 1 : -2;
        int64_t k = l->k++;
        if (k < l->skip) {
            if (!have_nx) {
                return ACCEL_EOF;
            }
            continue;
        }
        l->slots[cur].batch.indices = NULL;
        *last = !have_nx;
        *out = &l->slots[cur].batch;
        return ACCEL_OK;
    }
}

accel_status accel_loader_next(accel_loader *l, accel_batch **out)
{
    if (l == NULL || out == NULL) {
        return accel__seterr(l != NULL ? l->acc : NULL, ACCEL_EINVAL,
                             "accel_loader_next: %s is NULL", l == NULL ? "loader" : "out");
    }
    if (!l->in_epoch) {
        ACCEL_TRY(begin_epoch(l));
    }
    int last = 0;
    accel_batch *b = NULL;
    accel_status st;
    if (l->dispatch) {
        st = accel__dispatch_next(l, &b, &last);
        if (st != ACCEL_OK && st != ACCEL_EOF) {
            accel__loader_end_epoch(l, 1);
            return accel__adopt_thread_error(l->acc, st);
        }
    } else if (l->map_style) {
        st = next_map(l, &b, &last);
    } else {
        st = next_iter(l, &b, &last);
    }
    if (st == ACCEL_EOF) {
        accel__loader_end_epoch(l, 1);
        return ACCEL_EOF;
    }
    if (st != ACCEL_OK) {
        return st;
    }
    b->epoch = l->epoch;
    b->index = (l->dispatch ? l->dk : l->k) - 1;
    if (l->active) {
        accel__grad_state_loader_batch(l->acc, last, l->remainder);
    }
    *out = b;
    return ACCEL_OK;
}

/* ---- lengths, epochs, positions ---- */

/* Batches per epoch, whole. */
static int64_t epoch_len(const accel_loader *l)
{
    if (l->dispatch) {
        return accel__dispatch_len(l);
    }
    int64_t n = accel__dataset_len(l);
    if (n < 0) {
        return -1;
    }
    int64_t bs = l->o.batch_size;
    if (!l->map_style && l->n_ranks > 1) {
        /* One batch per buffer of total_batch_size elements. */
        int64_t real = total_batch_size(l);
        return l->o.drop_last ? n / real : accel__ceil_div(n, real);
    }
    int64_t inner = l->o.drop_last ? n / bs : accel__ceil_div(n, bs);
    if (!l->map_style || l->n_ranks == 1) {
        return inner;
    }
    return accel__shard_len(inner, l->o.drop_last, l->n_ranks, l->rank, l->split, l->even);
}

int64_t accel_loader_len(const accel_loader *l)
{
    if (l == NULL) {
        return -1;
    }
    int64_t n = epoch_len(l);
    /* The epoch a skip applies to (pending or running) has only the rest, as Accelerate's
     * skipped loader (len(batch_sampler) - skip_batches). */
    if (n > 0 && l->skip > 0) {
        n = l->skip < n ? n - l->skip : 0;
    }
    return n;
}

accel_status accel_loader_set_epoch(accel_loader *l, int64_t epoch)
{
    if (l == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_loader_set_epoch: loader is NULL");
    }
    /* At most 2^53, as a checkpoint's: the epochs after it must still be countable. */
    if (epoch < 0 || epoch > ACCEL__STATE_COUNT_MAX) {
        return accel__seterr(l->acc, ACCEL_EINVAL,
                             "accel_loader_set_epoch: epoch %lld is not in 0..2^53",
                             (long long)epoch);
    }
    accel__loader_end_epoch(l, 0);
    l->epoch = epoch;
    return ACCEL_OK;
}

int64_t accel_loader_epoch(const accel_loader *l)
{
    return l != NULL ? l->epoch : -1;
}

accel_status accel_loader_skip_first_batches(accel_loader *l, int64_t n)
{
    if (l == NULL || n < 0) {
        return accel__seterr(l != NULL ? l->acc : NULL, ACCEL_EINVAL,
                             "accel_loader_skip_first_batches: %s",
                             l == NULL ? "loader is NULL" : "n is negative");
    }
    if (l->in_epoch && (l->dispatch ? l->dk : l->k) > l->skip) {
        return accel__seterr(l->acc, ACCEL_ESTATE,
                             "accel_loader_skip_first_batches: the epoch has already started "
                             "(%lld batches handed out)",
                             (long long)l->k);
    }
    if (l->in_epoch) {
        accel__loader_end_epoch(l, 0); /* restart the same epoch from the same generator state */
        l->gen = l->epoch_gen;
    }
    l->skip = n;
    return ACCEL_OK;
}

accel_status accel_loader_get_position(const accel_loader *l, accel_loader_position *out)
{
    if (l == NULL || out == NULL) {
        return accel__seterr(l != NULL ? l->acc : NULL, ACCEL_EINVAL,
                             "accel_loader_get_position: argument is NULL");
    }
    out->epoch = l->epoch;
    out->batches = l->in_epoch ? (l->dispatch ? l->dk : l->k) : l->skip;
    out->seed = l->seed;
    memcpy(out->rng, l->in_epoch ? l->epoch_gen.s : l->gen.s, sizeof(out->rng));
    return ACCEL_OK;
}

accel_status accel_loader_set_position(accel_loader *l, const accel_loader_position *pos)
{
    if (l == NULL || pos == NULL) {
        return accel__seterr(l != NULL ? l->acc : NULL, ACCEL_EINVAL,
                             "accel_loader_set_position: argument is NULL");
    }
    if (pos->epoch < 0 || pos->batches < 0 || pos->epoch > ACCEL__STATE_COUNT_MAX ||
        pos->batches > ACCEL__STATE_COUNT_MAX ||
        (pos->rng[0] | pos->rng[1] | pos->rng[2] | pos->rng[3]) == 0) {
        return accel__seterr(l->acc, ACCEL_EINVAL,
                             "accel_loader_set_position: epoch %lld or batches %lld not in "
                             "0..2^53, or an all-zero generator state",
                             (long long)pos->epoch, (long long)pos->batches);
    }
    accel__loader_end_epoch(l, 0);
    l->epoch = pos->epoch;
    l->skip = pos->batches;
    l->seed = pos->seed;
    memcpy(l->gen.s, pos->rng, sizeof(l->gen.s));
    return ACCEL_OK;
}
