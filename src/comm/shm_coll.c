/*
 * The shm backend's algorithms, built from data slots and accel__shm_sync (see shm.h).
 *
 * Slot discipline (why no extra barriers are needed): every exchange step takes the next slot
 * of each rank (parity n_slots & 1); a rank writes its slot only in the phase before the sync
 * that publishes it (and, for two-shot, its own reduced slice in the phase after, a region no
 * peer reads then), and peers read it only in the one or two phases after that sync. The slot
 * of the same parity is written again one exchange later, after a sync that every peer can only
 * have passed once it stopped reading. Every algorithm issues the same number of syncs on every
 * rank (it depends only on count, dtype and the settings), so progress numbers stay aligned.
 *
 * Allreduce: one-shot below ACCEL_SHM_ONESHOT_NBYTES (copy in, sync, every rank reduces all
 * slots straight into its output); above, two-shot per chunk of one slot (copy in the slices
 * peers own, sync, reduce my slice from my input and the peers' slots into my slot and output,
 * sync, copy the other slices from peers' slots), the next chunk's copy-in following the
 * previous chunk's copy-out. Inputs never take a private round trip: reductions read peers'
 * slots directly.
 */
#include <string.h>

#include "core/internal.h"
#include "reduce.h"
#include "shm.h"

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Copy into a user output: streaming when the whole message is large. */
static void copy_out(void *dst, const void *src, size_t nbytes, int nt)
{
    if (nt) {
        accel__copy_nt(dst, src, nbytes);
    } else {
        memcpy(dst, src, nbytes);
    }
}

/* Small allreduce / reduce: everyone copies in, then every rank (or only the root) reduces all
 * slots. One sync. */
static accel_status reduce_oneshot(accel__shm *s, const accel__coll *op, int only_root)
{
    size_t nbytes = op->count * accel_dtype_nbytes(op->dtype);
    uint64_t t = s->n_slots++;
    if (nbytes > 0) {
        memcpy(accel__shm_slot(s, s->rank, t), op->send, nbytes);
    }
    ACCEL_TRY(accel__shm_sync(s));
    if (only_root && s->rank != op->root) {
        return ACCEL_OK;
    }
    for (int q = 0; q < s->n_ranks; q++) {
        s->in[q] = q == s->rank ? op->send : accel__shm_slot(s, q, t);
    }
    accel__reduce(op->dtype, op->op, op->recv, NULL, s->in, s->n_ranks, op->count, s->n_ranks);
    return ACCEL_OK;
}

/* Large allreduce / reduce: reduce-scatter + all-gather per chunk (two syncs per chunk). */
static accel_status reduce_twoshot(accel__shm *s, const accel__coll *op, int only_root)
{
    const size_t es = accel_dtype_nbytes(op->dtype), chunk = s->slot_nbytes / es;
    const int n = s->n_ranks, me = s->rank;
    const char *send = op->send;
    char *recv = op->recv;
    const int gather = !only_root || me == op->root;
    /* Large messages: my reduced slice goes to my slot only and reaches recv with the others'
     * in the copy-out, all streamed. */
    const int nt = op->count * es >= s->nt_nbytes;
    size_t off, cnt;
    for (size_t base = 0; base < op->count; base += chunk) {
        size_t m = min_sz(chunk, op->count - base);
        uint64_t t = s->n_slots++;
        char *mine = accel__shm_slot(s, me, t);
        for (int i = 1; i < n; i++) {
            int q = (me + i) % n;
            accel__chunk_range(m, n, q, &off, &cnt);
            memcpy(mine + off * es, send + (base + off) * es, cnt * es);
        }
        ACCEL_TRY(accel__shm_sync(s));
        accel__chunk_range(m, n, me, &off, &cnt);
        for (int q = 0; q < n; q++) {
            s->in[q] = q == me ? send + (base + off) * es : accel__shm_slot(s, q, t) + off * es;
        }
        accel__reduce(op->dtype, op->op, mine + off * es,
                      gather && !nt ? recv + (base + off) * es : NULL, s->in, n, cnt, n);
        ACCEL_TRY(accel__shm_sync(s));
        if (gather) {
            for (int i = nt ? 0 : 1; i < n; i++) {
                int q = (me + i) % n; /* each rank starts at a different peer */
                accel__chunk_range(m, n, q, &off, &cnt);
                copy_out(recv + (base + off) * es, accel__shm_slot(s, q, t) + off * es, cnt * es,
                         nt);
            }
        }
    }
    return ACCEL_OK;
}

/* Rank q's part of round lo (elements [lo, lo + len) of its chunk, len <= per_round). */
static size_t round_len(size_t cnt, size_t lo, size_t per_round)
{
    return cnt > lo ? min_sz(per_round, cnt - lo) : 0;
}

/* Each round: everyone copies the pieces destined to the others into its slot (piece of rank q
 * at q * per_round), sync, each reduces its own piece from the peers' slots into recv. */
static accel_status reduce_scatter(accel__shm *s, const accel__coll *op)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    const int n = s->n_ranks, me = s->rank;
    const size_t per_round = s->slot_nbytes / es / (size_t)n;
    const size_t most = op->count / (size_t)n + (op->count % (size_t)n != 0);
    const char *send = op->send;
    char *recv = op->recv;
    const int nt = op->count * es >= s->nt_nbytes;
    size_t off_me, cnt_me, off, cnt;
    accel__chunk_range(op->count, n, me, &off_me, &cnt_me);
    for (size_t lo = 0; lo < most; lo += per_round) {
        uint64_t t = s->n_slots++;
        char *mine = accel__shm_slot(s, me, t);
        for (int i = 1; i < n; i++) {
            int q = (me + i) % n;
            accel__chunk_range(op->count, n, q, &off, &cnt);
            size_t len = round_len(cnt, lo, per_round);
            if (len > 0) {
                memcpy(mine + (size_t)q * per_round * es, send + (off + lo) * es, len * es);
            }
        }
        ACCEL_TRY(accel__shm_sync(s));
        size_t len = round_len(cnt_me, lo, per_round);
        if (len > 0) {
            for (int q = 0; q < n; q++) {
                s->in[q] = q == me ? send + (off_me + lo) * es
                                   : accel__shm_slot(s, q, t) + (size_t)me * per_round * es;
            }
            if (nt) {
                /* Reduce into my own piece of my slot (no peer reads it), then stream out. */
                char *tmp = mine + (size_t)me * per_round * es;
                accel__reduce(op->dtype, op->op, tmp, NULL, s->in, n, len, n);
                accel__copy_nt(recv + lo * es, tmp, len * es);
            } else {
                accel__reduce(op->dtype, op->op, recv + lo * es, NULL, s->in, n, len, n);
            }
        }
    }
    return ACCEL_OK;
}

/* Each round: everyone publishes a piece of its chunk, sync, everyone copies the others'. */
static accel_status allgather(accel__shm *s, const accel__coll *op)
{
    const size_t es = accel_dtype_nbytes(op->dtype), per_round = s->slot_nbytes / es;
    const int n = s->n_ranks, me = s->rank;
    const size_t most = op->count / (size_t)n + (op->count % (size_t)n != 0);
    const char *send = op->send;
    char *recv = op->recv;
    size_t off_me, cnt_me, off, cnt;
    accel__chunk_range(op->count, n, me, &off_me, &cnt_me);
    const int in_place = send == recv + off_me * es;
    const int nt = op->count * es >= s->nt_nbytes;
    for (size_t lo = 0; lo < most; lo += per_round) {
        uint64_t t = s->n_slots++;
        size_t len = round_len(cnt_me, lo, per_round);
        if (len > 0) {
            memcpy(accel__shm_slot(s, me, t), send + lo * es, len * es);
            if (!in_place) {
                memcpy(recv + (off_me + lo) * es, send + lo * es, len * es);
            }
        }
        ACCEL_TRY(accel__shm_sync(s));
        for (int i = 1; i < n; i++) {
            int q = (me + i) % n;
            accel__chunk_range(op->count, n, q, &off, &cnt);
            len = round_len(cnt, lo, per_round);
            if (len > 0) {
                copy_out(recv + (off + lo) * es, accel__shm_slot(s, q, t), len * es, nt);
            }
        }
    }
    return ACCEL_OK;
}

static accel_status broadcast(accel__shm *s, const accel__coll *op)
{
    const size_t es = accel_dtype_nbytes(op->dtype), per_round = s->slot_nbytes / es;
    const int root = op->root;
    const int nt = op->count * es >= s->nt_nbytes;
    const char *send = op->send;
    char *recv = op->recv;
    for (size_t lo = 0; lo < op->count; lo += per_round) {
        size_t len = min_sz(per_round, op->count - lo);
        uint64_t t = s->n_slots++;
        if (s->rank == root) {
            memcpy(accel__shm_slot(s, root, t), send + lo * es, len * es);
            if (send != recv) {
                memcpy(recv + lo * es, send + lo * es, len * es);
            }
        }
        ACCEL_TRY(accel__shm_sync(s));
        if (s->rank != root) {
            copy_out(recv + lo * es, accel__shm_slot(s, root, t), len * es, nt);
        }
    }
    return ACCEL_OK;
}

/* `count` elements from every rank into root's recv, in rank order. */
static accel_status gather(accel__shm *s, const accel__coll *op)
{
    const size_t es = accel_dtype_nbytes(op->dtype), per_round = s->slot_nbytes / es;
    const int root = op->root, n = s->n_ranks;
    const char *send = op->send;
    char *recv = op->recv;
    for (size_t lo = 0; lo < op->count; lo += per_round) {
        size_t len = min_sz(per_round, op->count - lo);
        uint64_t t = s->n_slots++;
        if (s->rank != root) {
            memcpy(accel__shm_slot(s, s->rank, t), send + lo * es, len * es);
        } else {
            char *dst = recv + ((size_t)root * op->count + lo) * es;
            if (send + lo * es != dst) {
                memcpy(dst, send + lo * es, len * es);
            }
        }
        ACCEL_TRY(accel__shm_sync(s));
        if (s->rank == root) {
            for (int q = 0; q < n; q++) {
                if (q != root) {
                    memcpy(recv + ((size_t)q * op->count + lo) * es, accel__shm_slot(s, q, t),
                           len * es);
                }
            }
        }
    }
    return ACCEL_OK;
}

/* ---- the backend ---- */

static accel_status shm_init(accel__comm *c, void **impl)
{
    accel__shm *s;
    ACCEL_TRY(accel__shm_open(&s, accel__comm_cfg(c)));
    *impl = s;
    return ACCEL_OK;
}

static accel_status shm_run(accel__comm *c, void *impl, const accel__coll *op)
{
    (void)c;
    accel__shm *s = impl;
    s->what = accel__coll_name(op->kind);
    ACCEL_TRY(accel__shm_check_abort(s));
    size_t nbytes = op->count * accel_dtype_nbytes(op->dtype);
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
    case ACCEL__COLL_REDUCE: {
        int only_root = op->kind == ACCEL__COLL_REDUCE;
        return nbytes <= s->oneshot_nbytes ? reduce_oneshot(s, op, only_root)
                                           : reduce_twoshot(s, op, only_root);
    }
    case ACCEL__COLL_REDUCE_SCATTER:
        return reduce_scatter(s, op);
    case ACCEL__COLL_ALLGATHER:
        return allgather(s, op);
    case ACCEL__COLL_BROADCAST:
        return broadcast(s, op);
    case ACCEL__COLL_GATHER:
        return gather(s, op);
    case ACCEL__COLL_BARRIER:
        return accel__shm_sync(s);
    }
    return accel__seterr(NULL, ACCEL_EINTERNAL, "shm: unknown collective kind %d", (int)op->kind);
}

static void shm_destroy(accel__comm *c, void *impl)
{
    (void)c;
    accel__shm_close(impl);
}

const accel__comm_backend accel__backend_shm = {"shm", shm_init, shm_run, shm_destroy};
