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
 *
 * Zero-copy (messages above ACCEL_SHM_ZEROCOPY_NBYTES): before the first sync every rank
 * publishes where its in-place buffer lies (symmetric allocation id, offset, count; id 0 when it
 * is not in one) and skips its first copy-in if it does. After the sync, if every rank published
 * the same descriptor, the algorithm runs on the buffers themselves (peers' parts mapped here):
 * allreduce reduces my chunk from every buffer into mine, syncs, copies the other chunks from
 * their owners, syncs; reduce_scatter / allgather / broadcast need one exit sync. The exit sync
 * is what lets a caller modify its buffer as soon as the call returns. If descriptors differ,
 * the ranks that skipped their copy-in do it now, everyone syncs once more, and the copying
 * algorithm goes on; with no symmetric buffer anywhere nothing changes but a few stores.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/base.h"
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

/* out (and out2) = the reduction of s->in[0..n_in) for op: through its wire dtype when it has
 * one (rounding on load and store inside the kernel, so the traffic stays f32's and no pass
 * converts), else in its own dtype. */
static void reduce(const accel__shm *s, const accel__coll *op, void *out, void *out2, int n_in,
                   size_t count)
{
    if (op->wire != ACCEL_F32) {
        accel__reduce_wire(op->wire, op->op, out, out2, s->in, n_in, count, s->n_ranks);
    } else {
        accel__reduce(op->dtype, op->op, out, out2, s->in, n_in, count, s->n_ranks);
    }
}

/* ---- zero-copy agreement ---- */

static _Atomic uint64_t n_zero_copy;

uint64_t accel__shm_zero_copy_calls(void)
{
    return atomic_load_explicit(&n_zero_copy, memory_order_relaxed);
}

enum { ZC_NONE, ZC_ALL, ZC_SOME };

/* Publishes this rank's descriptor for the in-place buffer [buf, buf + nbytes) (eligible says
 * whether the call is in the in-place form at all); returns 1 when it lies in a symmetric
 * allocation, i.e. when this rank may skip its first copy-in. */
static int zc_publish(accel__shm *s, int eligible, const void *buf, size_t nbytes, size_t count,
                      accel__shm_desc *d)
{
    size_t off = 0;
    accel__shm_sym *a = eligible ? accel__shm_sym_find(s, buf, nbytes, &off) : NULL;
    d->id = a != NULL ? a->id : 0;
    d->off = off;
    d->count = count;
    accel__shm_put_desc(s, d);
    return a != NULL;
}

/* After the first sync: ZC_ALL (every rank published `mine`, *sym its allocation), ZC_SOME (some
 * rank skipped its copy-in) or ZC_NONE. The same answer on every rank. */
static int zc_agree(const accel__shm *s, const accel__shm_desc *mine, accel__shm_sym **sym)
{
    int all = mine->id != 0, some = 0;
    for (int q = 0; q < s->n_ranks; q++) {
        accel__shm_desc d;
        accel__shm_get_desc(s, q, &d);
        some |= d.id != 0;
        all &= d.id == mine->id && d.off == mine->off && d.count == mine->count;
    }
    if (all) {
        for (accel__shm_sym *a = s->syms; a != NULL; a = a->next) {
            if (a->id == mine->id) {
                atomic_fetch_add_explicit(&n_zero_copy, 1, memory_order_relaxed);
                *sym = a;
                return ZC_ALL;
            }
        }
    }
    return some ? ZC_SOME : ZC_NONE;
}

/* Rank q's copy of the symmetric buffer at byte offset off. */
static char *zc_buf(const accel__shm_sym *a, int q, size_t off)
{
    return a->base[q] + off;
}

static accel_status allreduce_zc(accel__shm *s, const accel__coll *op, const accel__shm_sym *a,
                                 size_t off)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    const int n = s->n_ranks, me = s->rank;
    const int nt = op->count * es >= s->nt_nbytes;
    size_t o, c;
    accel__chunk_range(op->count, n, me, &o, &c);
    for (int q = 0; q < n; q++) {
        s->in[q] = zc_buf(a, q, off) + o * es;
    }
    if (c > 0) {
        reduce(s, op, zc_buf(a, me, off) + o * es, NULL, n, c);
    }
    ACCEL_TRY(accel__shm_sync(s));
    for (int i = 1; i < n; i++) {
        int q = (me + i) % n; /* each rank starts at a different peer */
        accel__chunk_range(op->count, n, q, &o, &c);
        if (c > 0) {
            copy_out(zc_buf(a, me, off) + o * es, zc_buf(a, q, off) + o * es, c * es, nt);
        }
    }
    return accel__shm_sync(s); /* peers are done reading my chunk */
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
    reduce(s, op, op->recv, NULL, s->n_ranks, op->count);
    return ACCEL_OK;
}

/* The slices of chunk [base, base + m) that peers own, from send into my slot. */
static void twoshot_copy_in(accel__shm *s, const accel__coll *op, size_t base, size_t m, char *mine)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    const int n = s->n_ranks, me = s->rank;
    size_t off, cnt;
    for (int i = 1; i < n; i++) {
        int q = (me + i) % n;
        accel__chunk_range(m, n, q, &off, &cnt);
        memcpy(mine + off * es, (const char *)op->send + (base + off) * es, cnt * es);
    }
}

/* Large allreduce / reduce: reduce-scatter + all-gather per chunk (two syncs per chunk). With
 * zc (allreduce only) the first sync also settles zero-copy (see the top). */
static accel_status reduce_twoshot(accel__shm *s, const accel__coll *op, int only_root, int zc)
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
    accel__shm_desc d = {0, 0, 0};
    const int skip = zc && zc_publish(s, send == recv, recv, op->count * es, op->count, &d);
    for (size_t base = 0; base < op->count; base += chunk) {
        size_t m = min_sz(chunk, op->count - base);
        uint64_t t = s->n_slots++;
        char *mine = accel__shm_slot(s, me, t);
        if (!skip || base > 0) {
            twoshot_copy_in(s, op, base, m, mine);
        }
        ACCEL_TRY(accel__shm_sync(s));
        if (zc && base == 0) {
            accel__shm_sym *a = NULL;
            int agree = zc_agree(s, &d, &a);
            if (agree == ZC_ALL) {
                return allreduce_zc(s, op, a, d.off);
            }
            if (agree == ZC_SOME) {
                if (skip) {
                    twoshot_copy_in(s, op, base, m, mine);
                }
                ACCEL_TRY(accel__shm_sync(s));
            }
        }
        accel__chunk_range(m, n, me, &off, &cnt);
        for (int q = 0; q < n; q++) {
            s->in[q] = q == me ? send + (base + off) * es : accel__shm_slot(s, q, t) + off * es;
        }
        reduce(s, op, mine + off * es, gather && !nt ? recv + (base + off) * es : NULL, n, cnt);
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

/* Round lo of reduce_scatter: the pieces destined to the others (rank q's block at q * count
 * of send) into my slot. */
static void rs_copy_in(accel__shm *s, const accel__coll *op, size_t lo, size_t per_round,
                       char *mine)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    const int n = s->n_ranks, me = s->rank;
    const size_t len = round_len(op->count, lo, per_round);
    for (int i = 1; i < n && len > 0; i++) {
        int q = (me + i) % n;
        memcpy(mine + (size_t)q * per_round * es,
               (const char *)op->send + ((size_t)q * op->count + lo) * es, len * es);
    }
}

/* In place on symmetric buffers: my chunk reduced from every buffer into mine; no peer writes
 * what another reads. */
static accel_status reduce_scatter_zc(accel__shm *s, const accel__coll *op, const accel__shm_sym *a,
                                      size_t off)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    const int n = s->n_ranks, me = s->rank;
    const size_t o = (size_t)me * op->count, c = op->count;
    if (c > 0) {
        for (int q = 0; q < n; q++) {
            s->in[q] = zc_buf(a, q, off) + o * es;
        }
        reduce(s, op, zc_buf(a, me, off) + o * es, NULL, n, c);
    }
    return accel__shm_sync(s);
}

/* Each round: everyone copies the pieces destined to the others into its slot (piece of rank q
 * at q * per_round), sync, each reduces its own piece from the peers' slots into recv. */
static accel_status reduce_scatter(accel__shm *s, const accel__coll *op, int zc)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    const int n = s->n_ranks, me = s->rank;
    const size_t per_round = s->slot_nbytes / es / (size_t)n;
    const size_t total = op->count * (size_t)n;
    const char *send = op->send;
    char *recv = op->recv;
    const int nt = total * es >= s->nt_nbytes;
    const size_t off_me = (size_t)me * op->count, cnt_me = op->count;
    accel__shm_desc d = {0, 0, 0};
    const int skip = zc && zc_publish(s, recv == send + off_me * es, send, total * es, total, &d);
    for (size_t lo = 0; lo < cnt_me; lo += per_round) {
        uint64_t t = s->n_slots++;
        char *mine = accel__shm_slot(s, me, t);
        if (!skip || lo > 0) {
            rs_copy_in(s, op, lo, per_round, mine);
        }
        ACCEL_TRY(accel__shm_sync(s));
        if (zc && lo == 0) {
            accel__shm_sym *a = NULL;
            int agree = zc_agree(s, &d, &a);
            if (agree == ZC_ALL) {
                return reduce_scatter_zc(s, op, a, d.off);
            }
            if (agree == ZC_SOME) {
                if (skip) {
                    rs_copy_in(s, op, lo, per_round, mine);
                }
                ACCEL_TRY(accel__shm_sync(s));
            }
        }
        size_t len = round_len(cnt_me, lo, per_round);
        if (len > 0) {
            for (int q = 0; q < n; q++) {
                s->in[q] = q == me ? send + (off_me + lo) * es
                                   : accel__shm_slot(s, q, t) + (size_t)me * per_round * es;
            }
            if (nt) {
                /* Reduce into my own piece of my slot (no peer reads it), then stream out. */
                char *tmp = mine + (size_t)me * per_round * es;
                reduce(s, op, tmp, NULL, n, len);
                accel__copy_nt(recv + lo * es, tmp, len * es);
            } else {
                reduce(s, op, recv + lo * es, NULL, n, len);
            }
        }
    }
    return ACCEL_OK;
}

/* In place on symmetric buffers: the other chunks copied from their owners' buffers. */
static accel_status allgather_zc(accel__shm *s, const accel__coll *op, const accel__shm_sym *a,
                                 size_t off)
{
    const size_t es = accel_dtype_nbytes(op->dtype), c = op->count;
    const int n = s->n_ranks, me = s->rank;
    const int nt = c * (size_t)n * es >= s->nt_nbytes;
    for (int i = 1; i < n && c > 0; i++) {
        int q = (me + i) % n;
        size_t o = (size_t)q * c;
        copy_out(zc_buf(a, me, off) + o * es, zc_buf(a, q, off) + o * es, c * es, nt);
    }
    return accel__shm_sync(s);
}

/* Each round: everyone publishes a piece of its chunk, sync, everyone copies the others'. */
static accel_status allgather(accel__shm *s, const accel__coll *op, int zc)
{
    const size_t es = accel_dtype_nbytes(op->dtype), per_round = s->slot_nbytes / es;
    const int n = s->n_ranks, me = s->rank;
    const size_t total = op->count * (size_t)n, cnt_me = op->count, off_me = (size_t)me * cnt_me;
    const char *send = op->send;
    char *recv = op->recv;
    const int in_place = send == recv + off_me * es;
    const int nt = total * es >= s->nt_nbytes;
    accel__shm_desc d = {0, 0, 0};
    const int skip = zc && zc_publish(s, in_place, recv, total * es, total, &d);
    for (size_t lo = 0; lo < cnt_me; lo += per_round) {
        uint64_t t = s->n_slots++;
        size_t len = round_len(cnt_me, lo, per_round);
        if (len > 0 && (!skip || lo > 0)) {
            memcpy(accel__shm_slot(s, me, t), send + lo * es, len * es);
            if (!in_place) {
                memcpy(recv + (off_me + lo) * es, send + lo * es, len * es);
            }
        }
        ACCEL_TRY(accel__shm_sync(s));
        if (zc && lo == 0) {
            accel__shm_sym *a = NULL;
            int agree = zc_agree(s, &d, &a);
            if (agree == ZC_ALL) {
                return allgather_zc(s, op, a, d.off);
            }
            if (agree == ZC_SOME) {
                if (skip && len > 0) {
                    memcpy(accel__shm_slot(s, me, t), send, len * es); /* in place: lo == 0 */
                }
                ACCEL_TRY(accel__shm_sync(s));
            }
        }
        for (int i = 1; i < n && len > 0; i++) {
            int q = (me + i) % n;
            copy_out(recv + ((size_t)q * cnt_me + lo) * es, accel__shm_slot(s, q, t), len * es, nt);
        }
    }
    return ACCEL_OK;
}

/* In place on symmetric buffers: the root's buffer copied straight into mine. */
static accel_status broadcast_zc(accel__shm *s, const accel__coll *op, const accel__shm_sym *a,
                                 size_t off)
{
    const size_t nbytes = op->count * accel_dtype_nbytes(op->dtype);
    if (s->rank != op->root) {
        copy_out(zc_buf(a, s->rank, off), zc_buf(a, op->root, off), nbytes, nbytes >= s->nt_nbytes);
    }
    return accel__shm_sync(s);
}

static accel_status broadcast(accel__shm *s, const accel__coll *op, int zc)
{
    const size_t es = accel_dtype_nbytes(op->dtype), per_round = s->slot_nbytes / es;
    const int root = op->root;
    const int nt = op->count * es >= s->nt_nbytes;
    const char *send = op->send;
    char *recv = op->recv;
    /* The root must be in place; the others' send is never read. */
    accel__shm_desc d = {0, 0, 0};
    const int skip =
        zc && zc_publish(s, s->rank != root || send == recv, recv, op->count * es, op->count, &d);
    for (size_t lo = 0; lo < op->count; lo += per_round) {
        size_t len = min_sz(per_round, op->count - lo);
        uint64_t t = s->n_slots++;
        if (s->rank == root && (!skip || lo > 0)) {
            memcpy(accel__shm_slot(s, root, t), send + lo * es, len * es);
            if (send != recv) {
                memcpy(recv + lo * es, send + lo * es, len * es);
            }
        }
        ACCEL_TRY(accel__shm_sync(s));
        if (zc && lo == 0) {
            accel__shm_sym *a = NULL;
            int agree = zc_agree(s, &d, &a);
            if (agree == ZC_ALL) {
                return broadcast_zc(s, op, a, d.off);
            }
            if (agree == ZC_SOME) {
                if (skip && s->rank == root) {
                    memcpy(accel__shm_slot(s, root, t), send, len * es); /* in place */
                }
                ACCEL_TRY(accel__shm_sync(s));
            }
        }
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

/* ---- one collective ---- */

accel_status accel__shm_run(accel__shm *s, const accel__coll *op)
{
    s->what = accel__coll_name(op->kind);
    ACCEL_TRY(accel__shm_check_abort(s));
    /* Bytes of the whole array: reduce_scatter and allgather move count per rank. */
    const int per_rank =
        op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_ALLGATHER;
    const size_t whole = per_rank ? op->count * (size_t)s->n_ranks : op->count;
    const size_t nbytes = whole * accel_dtype_nbytes(op->dtype);
    /* Declare the call (fields that do not apply to its kind are 0), so that its first sync
     * checks it against every rank's before any data moves. */
    const int reducing = op->kind == ACCEL__COLL_ALLREDUCE ||
                         op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_REDUCE;
    const int rooted = op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_REDUCE ||
                       op->kind == ACCEL__COLL_GATHER;
    const int barrier = op->kind == ACCEL__COLL_BARRIER;
    accel__shm_begin_call(s, (int)op->kind,
                          barrier                 ? 0
                          : per_rank && op->total ? op->total
                                                  : whole,
                          barrier ? 0 : (int)op->dtype, reducing ? (int)op->op : 0, (int)op->wire,
                          rooted ? op->root : 0);
    if (s->has_declare_as) {
        s->pending = s->declare_as;
        s->has_declare_as = 0;
    }
    if (nbytes == 0 && !barrier) {
        return accel__shm_sync(s); /* nothing to move, but still one checked sync */
    }
    /* The same answer on every rank: it depends on the size and the settings only. */
    const int zc = nbytes > 0 && nbytes > s->zc_nbytes;
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return nbytes <= s->oneshot_nbytes && !zc ? reduce_oneshot(s, op, 0)
                                                  : reduce_twoshot(s, op, 0, zc);
    case ACCEL__COLL_REDUCE:
        return nbytes <= s->oneshot_nbytes ? reduce_oneshot(s, op, 1) : reduce_twoshot(s, op, 1, 0);
    case ACCEL__COLL_REDUCE_SCATTER:
        return reduce_scatter(s, op, zc);
    case ACCEL__COLL_ALLGATHER:
        return allgather(s, op, zc);
    case ACCEL__COLL_BROADCAST:
        return broadcast(s, op, zc);
    case ACCEL__COLL_GATHER:
        return gather(s, op);
    case ACCEL__COLL_BARRIER:
        return accel__shm_sync(s);
    }
    return accel__seterr(NULL, ACCEL_EINTERNAL, "shm: unknown collective kind %d", (int)op->kind);
}
