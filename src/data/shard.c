/*
 * Index plans and Accelerate's BatchSamplerShard: which batches of dataset indices process p of
 * N yields. Pure functions of their arguments (no communication, no randomness), so every
 * worked example of the reference is a unit test. Invariant: with even_batches every process
 * gets the same number of batches, each of the inner batch size, the missing samples taken by
 * cycling from the start of the epoch's order ("initial data").
 */
#include <string.h>

#include "data_internal.h"

void accel__plan_clear(accel__plan *p)
{
    p->n_idx = 0;
    p->n_batches = 0;
    if (p->off != NULL) {
        p->off[0] = 0;
    }
}

void accel__plan_free(accel__plan *p)
{
    accel__free(p->idx);
    accel__free(p->off);
    memset(p, 0, sizeof(*p));
}

static accel_status grow(int64_t **buf, int64_t *cap, int64_t need)
{
    if (need <= *cap) {
        return ACCEL_OK;
    }
    int64_t ncap = *cap > 0 ? *cap : 16;
    while (ncap < need) {
        ncap *= 2;
    }
    int64_t *nb = accel__realloc(*buf, (size_t)ncap * sizeof(int64_t));
    if (nb == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for %lld batch indices",
                             (long long)need);
    }
    *buf = nb;
    *cap = ncap;
    return ACCEL_OK;
}

accel_status accel__plan_push(accel__plan *p, const int64_t *a, int64_t na, const int64_t *b,
                              int64_t nb)
{
    ACCEL_TRY(grow(&p->idx, &p->cap_idx, p->n_idx + na + nb));
    ACCEL_TRY(grow(&p->off, &p->cap_off, p->n_batches + 2));
    if (p->n_batches == 0) {
        p->off[0] = 0;
    }
    if (na > 0) {
        memcpy(p->idx + p->n_idx, a, (size_t)na * sizeof(int64_t));
    }
    if (nb > 0) {
        memcpy(p->idx + p->n_idx + na, b, (size_t)nb * sizeof(int64_t));
    }
    p->n_idx += na + nb;
    p->off[++p->n_batches] = p->n_idx;
    return ACCEL_OK;
}

accel_status accel__plan_batches(accel__plan *out, const int64_t *order, int64_t n,
                                 int64_t batch_size, int drop_last)
{
    accel__plan_clear(out);
    for (int64_t s = 0; s < n; s += batch_size) {
        int64_t len = n - s < batch_size ? n - s : batch_size;
        if (len < batch_size && drop_last) {
            break;
        }
        ACCEL_TRY(accel__plan_push(out, order + s, len, NULL, 0));
    }
    return ACCEL_OK;
}

/* Accelerate's "initial data": the first samples of the epoch, doubled until at least `need`
 * (degenerate datasets smaller than one round). Kept in a growable buffer of the caller. */
static accel_status initial_data(const accel__plan *inner, int64_t n_first, int64_t need,
                                 int64_t **buf, int64_t *cap, int64_t *len)
{
    int64_t end = inner->off[n_first < inner->n_batches ? n_first : inner->n_batches];
    *len = end;
    ACCEL_TRY(grow(buf, cap, end > need ? end : need));
    memcpy(*buf, inner->idx, (size_t)end * sizeof(int64_t));
    if (*len == 0) {
        return ACCEL_OK;
    }
    while (*len < need) {
        int64_t add = *len;
        ACCEL_TRY(grow(buf, cap, 2 * *len));
        memcpy(*buf + *len, *buf, (size_t)add * sizeof(int64_t));
        *len += add;
    }
    return ACCEL_OK;
}

static accel_status shard_split(accel__plan *out, const accel__plan *inner, int64_t bs,
                                int drop_last, int n_ranks, int rank, int even)
{
    int64_t per = bs / n_ranks;
    int64_t nb = inner->n_batches;
    for (int64_t b = 0; b < nb; b++) {
        if (accel__plan_batch_len(inner, b) == bs) {
            ACCEL_TRY(accel__plan_push(out, inner->idx + inner->off[b] + per * rank, per, NULL, 0));
        }
    }
    if (drop_last || nb == 0) {
        return ACCEL_OK;
    }
    const int64_t *last = inner->idx + inner->off[nb - 1];
    int64_t last_len = accel__plan_batch_len(inner, nb - 1);
    if (last_len == bs) {
        return ACCEL_OK;
    }
    if (!even) {
        /* The short batch sliced as-is; processes past its end get nothing. */
        if (last_len > per * rank) {
            int64_t take = last_len - per * rank < per ? last_len - per * rank : per;
            ACCEL_TRY(accel__plan_push(out, last + per * rank, take, NULL, 0));
        }
        return ACCEL_OK;
    }
    /* Pad the short batch with the first batch (doubled while shorter than bs), then slice. */
    int64_t *init = NULL, cap = 0, ilen = 0;
    accel_status st = initial_data(inner, 1, bs, &init, &cap, &ilen);
    if (st == ACCEL_OK) {
        int64_t lo = per * rank, hi = per * (rank + 1);
        int64_t *tmp = NULL, tcap = 0;
        st = grow(&tmp, &tcap, per);
        if (st == ACCEL_OK) {
            for (int64_t q = lo; q < hi; q++) {
                tmp[q - lo] = q < last_len ? last[q] : init[q - last_len];
            }
            st = accel__plan_push(out, tmp, per, NULL, 0);
        }
        accel__free(tmp);
    }
    accel__free(init);
    return st;
}

static accel_status shard_rounds(accel__plan *out, const accel__plan *inner, int64_t bs,
                                 int drop_last, int n_ranks, int rank, int even)
{
    int64_t nb = inner->n_batches;
    int64_t pending = -1; /* inner batch this process holds until its round completes */
    for (int64_t b = 0; b < nb; b++) {
        if (b % n_ranks == rank) {
            pending = b;
        }
        /* A round is released when its last batch is full (variable batches: always). */
        if (b % n_ranks == n_ranks - 1 && (bs == 0 || accel__plan_batch_len(inner, b) == bs)) {
            ACCEL_TRY(accel__plan_push(out, inner->idx + inner->off[pending],
                                       accel__plan_batch_len(inner, pending), NULL, 0));
            pending = -1;
        }
    }
    if (drop_last || nb == 0) {
        return ACCEL_OK;
    }
    if (!even) {
        if (pending >= 0 && accel__plan_batch_len(inner, pending) > 0) {
            ACCEL_TRY(accel__plan_push(out, inner->idx + inner->off[pending],
                                       accel__plan_batch_len(inner, pending), NULL, 0));
        }
        return ACCEL_OK;
    }
    if (pending >= 0 && accel__plan_batch_len(inner, pending) == bs) {
        ACCEL_TRY(accel__plan_push(out, inner->idx + inner->off[pending], bs, NULL, 0));
    }
    int64_t *init = NULL, cap = 0, ilen = 0;
    accel_status st = initial_data(inner, n_ranks, (int64_t)n_ranks * bs, &init, &cap, &ilen);
    if (st != ACCEL_OK) {
        return st;
    }
    /* The last inner batch, if short, is topped up first; then whole batches are cut from the
     * initial data until the round is complete. */
    int64_t idx = nb - 1;
    const int64_t *cur = inner->idx + inner->off[idx];
    int64_t cur_len = accel__plan_batch_len(inner, idx);
    if (cur_len == bs) {
        cur_len = 0;
        idx++;
    }
    int64_t cycle = 0;
    while (idx % n_ranks != 0 || cur_len > 0) {
        int64_t take = bs - cur_len;
        if (idx % n_ranks == rank) {
            st = accel__plan_push(out, cur, cur_len, init + cycle, take);
            if (st != ACCEL_OK) {
                break;
            }
        }
        cycle += take;
        cur_len = 0;
        idx++;
    }
    accel__free(init);
    return st;
}

accel_status accel__shard_batches(accel__plan *out, const accel__plan *inner, int64_t batch_size,
                                  int drop_last, int n_ranks, int rank, int split, int even)
{
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks) {
        return accel__seterr(NULL, ACCEL_EINVAL, "loader: process %d of %d is not a process", rank,
                             n_ranks);
    }
    if (split && (batch_size <= 0 || batch_size % n_ranks != 0)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "loader: split_batches needs a batch_size (%lld) that is a multiple "
                             "of the number of processes (%d)",
                             (long long)batch_size, n_ranks);
    }
    if (batch_size == 0 && even) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "loader: variable-size batches need even_batches = 0");
    }
    if (split) {
        return shard_split(out, inner, batch_size, drop_last, n_ranks, rank, even);
    }
    return shard_rounds(out, inner, batch_size, drop_last, n_ranks, rank, even);
}

int64_t accel__shard_len(int64_t inner_len, int drop_last, int n_ranks, int rank, int split,
                         int even)
{
    if (split) {
        return inner_len;
    }
    if (inner_len % n_ranks == 0) {
        return inner_len / n_ranks;
    }
    int64_t len = inner_len / n_ranks;
    if (drop_last) {
        return len;
    }
    if (even) {
        return len + 1;
    }
    return rank < inner_len % n_ranks ? len + 1 : len;
}
