/*
 * gloo's ring: f32 / f64 allreduces and reduces of RING_NBYTES or more, reduce_scatters and
 * allgathers of as much in all, on two or more ranks over a network (gloo_coll.c runs every
 * other call).
 *
 * Over a network, ranks that each send to every other (gloo_coll.c's schedules, or the
 * envelopes' exchange) move what a ring moves, yet at 4 x 1 over the emulated 1 Gbit/s network
 * they reached only 0.8-0.9 of Gloo's own ring from 1 MiB (docs/performance.md, eighth pass): a
 * ring keeps one connection busy each way per machine, the all-to-all n - 1 by turns. So such a
 * call runs as a ring of point-to-point messages when e->ring (ACCEL_GLOO_RING; default: when
 * some member has a peer on another host). Chunk c (accel__chunk_range) starts at rank c + 1 and
 * is combined at every rank it passes on its way round to c: x[c+1], x[c+2], ..., x[c] ("ring
 * order"), then goes round once more so that every rank has it. Deterministic, but not the rank
 * order of the other paths and backends. The 16-bit dtypes keep the rank-order paths: combined
 * in fp32 and rounded once, their partial results would cross the wire in fp32, twice their
 * bytes. Each chunk goes round in at least RING_MIN_SEGS segments (on two ranks, ring_seg's),
 * so that one segment's step overlaps the next's (4 x 1 at 256 KiB over the emulated 1 Gbit/s
 * network, against Gloo's ring: whole chunks 0.53-0.64; 4 segments 0.79-0.86, 2 segments, Gloo's
 * own choice, 0.86-1.03 since the first step's sends go before the other receives are posted;
 * on two ranks, 2 segments were slower: docs/performance.md, twelfth pass).
 *
 * The call check overlaps the ring's first step (docs/performance.md, ninth pass): every receive
 * of the ring is posted beside the envelopes, and the first step's segments leave before the
 * declarations are compared; the first of them rides in the envelope to the right neighbour
 * when it fits one (in_envelope; sixteenth pass). A member sends nothing else before its check
 * passes, and every member sees every declaration, so a message that arrives before the check is
 * one of those "early" segments; each lands in a receive of EARLY_NBYTES whatever the call, which
 * no early segment of any call exceeds, so a mismatched one fits too (Gloo's transport aborts the
 * process on a message larger than its receive). After a mismatch (the communicator is then broken
 * for good), each member waits for the early segments that the declarations say its neighbours sent
 * it and took from it, so none is left in flight from or into a buffer after the call returns.
 */
#include <string.h>

#include "base/base.h"
#include "comm/comm.h"
#include "comm/reduce.h"
#include "gloo_impl.h"

#define RING_NBYTES ((size_t)256 << 10)
#define RING_SEG_NBYTES ((size_t)256 << 10)
#define RING_MIN_SEGS 2 /* a chunk's segments at least, on 3 or more ranks */
/* On two ranks a ring is one step each way, as are gloo_coll.c's other paths, but its first step
 * overlaps the call check: over the emulated 1 Gbit/s network it beat the envelopes' exchange at
 * 256 KiB (2.6-3.3 ms against 3.4-4.5) and, in segments of up to 1 MiB (Gloo's own ring's
 * largest), 4 a chunk below 512 KiB chunks and 2 from there, the pipelined path from 1 MiB too
 * (docs/performance.md, tenth and thirteenth passes). */
#define PAIR_SEG_NBYTES ((size_t)1 << 20)
#define PAIR_MIN_SEGS 4
#define PAIR_FEW_SEGS_NBYTES ((size_t)512 << 10) /* chunks from here: 2 segments at least */
#define EARLY_NBYTES PAIR_SEG_NBYTES             /* the largest segment of either */
#define EARLY_KEY ((uint32_t)1 << 31)            /* + segment: the first step's early segments */

int accel__gloo_rings(const accel__gloo *e, const accel__coll_decl *d)
{
    const size_t es = accel_dtype_nbytes((accel_dtype)d->dtype);
    const size_t nbytes = d->count * es *
                          (d->kind == ACCEL__COLL_ALLGATHER || d->kind == ACCEL__COLL_REDUCE_SCATTER
                               ? (size_t)e->n_ranks
                               : 1); /* in all, or of input */
    if (!e->ring || e->n_ranks < 2 || nbytes < RING_NBYTES) {
        return 0;
    }
    return d->kind == ACCEL__COLL_ALLGATHER || /* any dtype: nothing is combined */
           (d->wire == ACCEL_F32 && (d->dtype == ACCEL_F32 || d->dtype == ACCEL_F64) &&
            (d->kind == ACCEL__COLL_ALLREDUCE || d->kind == ACCEL__COLL_REDUCE ||
             d->kind == ACCEL__COLL_REDUCE_SCATTER));
}

/* Chunk c of a ring call declared d on n ranks, in elements of the whole (an allgather's result,
 * a reduce_scatter's input): their block c, else accel__chunk_range's. */
static void ring_chunk_range(const accel__coll_decl *d, int n, int c, size_t *off, size_t *cnt)
{
    if (d->kind == ACCEL__COLL_ALLGATHER || d->kind == ACCEL__COLL_REDUCE_SCATTER) {
        *off = (size_t)c * d->count;
        *cnt = d->count;
    } else {
        accel__chunk_range(d->count, n, c, off, cnt);
    }
}

/* Segment length (elements) of a ring call declared d on n ranks: at least RING_MIN_SEGS a chunk
 * (on 2, PAIR_MIN_SEGS, or 2 from PAIR_FEW_SEGS_NBYTES), at most ACCEL__GLOO_MAX_SEGS, else
 * RING_SEG_NBYTES (on 2, PAIR_SEG_NBYTES). */
static size_t ring_seg(const accel__coll_decl *d, int n)
{
    const size_t es = accel_dtype_nbytes((accel_dtype)d->dtype);
    size_t off = 0, per = 0; /* chunk 0 is the largest */
    ring_chunk_range(d, n, 0, &off, &per);
    if (n > 2) {
        return seg_size(per, RING_SEG_NBYTES / es, RING_MIN_SEGS);
    }
    return seg_size(per, PAIR_SEG_NBYTES / es,
                    per * es >= PAIR_FEW_SEGS_NBYTES ? 2 : PAIR_MIN_SEGS);
}

/* How many segments of chunk c a member whose call is declared d sends (and its right
 * neighbour receives) before the call check: all of them, when d rings and they fit
 * EARLY_NBYTES; else none. */
static size_t early_segs(const accel__gloo *e, const accel__coll_decl *d, int c)
{
    if (!accel__gloo_rings(e, d)) {
        return 0;
    }
    const size_t es = accel_dtype_nbytes((accel_dtype)d->dtype), seg = ring_seg(d, e->n_ranks);
    size_t off = 0, cnt = 0;
    ring_chunk_range(d, e->n_ranks, c, &off, &cnt);
    return seg * es <= EARLY_NBYTES ? (cnt + seg - 1) / seg : 0;
}

/* 1 when the first of those early segments travels in the envelope to the right neighbour
 * instead of a message of its own: when it fits an envelope (accel__gloo_envelope_room). One
 * message and one ready notice less a call each way, and the check's round trip is the first
 * segment's (over the emulated 1 Gbit/s network, 2 x 1 at 1 MiB took about 1 ms less a call:
 * docs/performance.md, sixteenth pass). */
static size_t in_envelope(const accel__gloo *e, const accel__coll_decl *d)
{
    if (!accel__gloo_rings(e, d)) {
        return 0;
    }
    const size_t nbytes = ring_seg(d, e->n_ranks) * accel_dtype_nbytes((accel_dtype)d->dtype);
    return nbytes <= EARLY_NBYTES && nbytes <= accel__gloo_envelope_room(e->n_ranks);
}

/* The chunk a rank receives from its left neighbour in ring step t (0 .. 2n-3): steps
 * 0 .. n-2 carry partial results (step t: chunk me - 2 - t), steps n-1 .. 2n-3 final ones
 * (chunk me - 1 - (t - (n - 1))). */
static int ring_chunk(int me, int n, int t)
{
    const int c = t < n - 1 ? me - 2 - t : me - 1 - (t - (n - 1));
    return ((c % n) + n) % n;
}

/* The chunk that `sender` sends in the first step of a ring call declared d: an allgather's
 * own block, an allreduce's input of the chunk before its own. */
static int first_chunk(const accel__coll_decl *d, int sender, int n)
{
    return d->kind == ACCEL__COLL_ALLGATHER ? sender : (sender + n - 1) % n;
}

/* After a mismatch found by the envelopes (env: every member's declaration): waits for the
 * early segments this member's neighbours sent it and took from it (rx: this member's early
 * receives by segment; tx: its early sends in order, from its first that is not in the
 * envelope). Segment k is a message of its own, the same key on both sides, from the first
 * that is not in the sender's envelope. */
static accel_status settle(accel__gloo *e, const accel__gloo_env *env, const size_t *rx,
                           const size_t *tx, const char *what)
{
    const int n = e->n_ranks, me = e->rank, left = (me + n - 1) % n;
    accel__coll_decl d[3]; /* left, this member, right */
    for (int i = 0; i < 3; i++) {
        memcpy(&d[i], env->all + (size_t)((left + i) % n) * env->stride, sizeof(d[i]));
    }
    const size_t got = early_segs(e, &d[0], first_chunk(&d[0], left, n));
    const size_t posted = early_segs(e, &d[1], first_chunk(&d[1], left, n));
    const size_t sent = early_segs(e, &d[1], first_chunk(&d[1], me, n));
    const size_t taken = early_segs(e, &d[2], first_chunk(&d[2], me, n));
    const size_t from_left = in_envelope(e, &d[0]), mine = in_envelope(e, &d[1]);
    const size_t from_right = in_envelope(e, &d[2]);
    for (size_t k = from_left > mine ? from_left : mine; k < got && k < posted; k++) {
        GLOO_CALL(what, accel__gloo_wait, e->g, rx[k]);
    }
    for (size_t k = from_right > mine ? from_right : mine; k < sent && k < taken; k++) {
        GLOO_CALL(what, accel__gloo_wait, e->g, tx[k - mine]);
    }
    return ACCEL_OK;
}

/* An allreduce, reduce, reduce_scatter or allgather that rings: the envelopes, then the ring (a
 * reduce_scatter is an allreduce's first half, ending with this rank's block; an allgather its
 * second half: each block goes round from its owner). Every receive is posted before
 * the check (one sender each, so no window is needed); segments go round one after the other, so
 * segment k of step t + 1 leaves while segment k + 1 of step t arrives. An allgather's early
 * segments land in scratch and are copied into place once the check has passed (in the user's
 * buffer, a mismatched one could overflow its block). */
accel_status accel__gloo_ring(accel__gloo *e, const accel__coll *op, const accel__coll_decl *d,
                              const char *what)
{
    const int n = e->n_ranks, me = e->rank, right = (me + 1) % n, left = (me + n - 1) % n;
    const int gather = op->kind == ACCEL__COLL_ALLGATHER;
    const int scatter = op->kind == ACCEL__COLL_REDUCE_SCATTER; /* the first half only */
    const size_t es = accel_dtype_nbytes(op->dtype);
    size_t *off = e->send_nbytes, *cnt = e->cnt; /* the chunks, in elements of out */
    for (int q = 0; q < n; q++) {
        ring_chunk_range(d, n, q, &off[q], &cnt[q]);
    }
    char *out = op->recv; /* a reduce's member other than the root: scratch */
    if (op->kind == ACCEL__COLL_REDUCE && me != op->root) {
        ACCEL_TRY(accel__gloo_scratch(e, 1, op->count * es + 1, (void **)&out));
    }
    const size_t per = cnt[0], seg = ring_seg(d, n);
    const size_t n_seg = (per + seg - 1) / seg, steps = (scatter ? 1 : 2) * ((size_t)n - 1);
    const size_t t0 = gather ? (size_t)n - 1 : 0; /* the first step */
    const int first = first_chunk(d, me, n);
    const int early = seg * es <= EARLY_NBYTES; /* step t0's segments leave before the check */
    const size_t k0 = in_envelope(e, d); /* step t0's first early segment that is a message */
    const accel_reduce_op partial = op->op == ACCEL_AVG ? ACCEL_SUM : op->op;
    const char *data = op->send; /* an allreduce's input; an allgather's own block */
    const char *sent = gather ? data : data + off[first] * es; /* the first step's chunk */
    /* Step t's partial results at t * per, or an allgather's early segments (and room for one
     * of any call's). */
    char *acc = NULL;
    size_t *rx = NULL, *tx = NULL, n_tx = 0;
    const size_t partials = gather ? 1 : (size_t)n - 1;
    ACCEL_TRY(accel__gloo_scratch(e, 5, partials * per * es + EARLY_NBYTES, (void **)&acc));
    ACCEL_TRY(accel__gloo_scratch(e, 4, (2 * steps * n_seg + 2 * (size_t)n) * sizeof(size_t),
                                  (void **)&rx));
    tx = rx + steps * n_seg;
    size_t *env_off = tx + steps * n_seg, *env_cnt = env_off + n; /* what each envelope carries */
    for (int q = 0; q < n; q++) {
        env_off[q] = 0;
        env_cnt[q] = k0 > 0 && q == right ? seg_len(cnt[first], seg, 0) : 0;
    }
    /* Where step t's segment k lands (and leaves from, passed on), and its key. */
#define RING_DEST(t, k) (out + (off[ring_chunk(me, n, (int)(t))] + (k)*seg) * es)
#define RING_BUF(t, k)                                                                             \
    ((t) < (size_t)n - 1 || ((t) == t0 && early) ? acc + (((t)-t0) * per + (k)*seg) * es           \
                                                 : RING_DEST(t, k))
#define RING_KEY(t, k)                                                                             \
    ((t) == t0 && early ? EARLY_KEY + (uint32_t)(k) : (uint32_t)(1 + (t)*n_seg + (k)))
#define RING_SEND(t, k, buf, len)                                                                  \
    do {                                                                                           \
        if ((len) > 0) {                                                                           \
            GLOO_CALL(what, accel__gloo_post, e->g, 1, right, RING_KEY(t, k), (void *)(buf),       \
                      (len)*es, &tx[n_tx++]);                                                      \
        }                                                                                          \
    } while (0)
    accel__gloo_env env;
    ACCEL_TRY(
        accel__gloo_envelopes_post(e, op, what, k0 > 0 ? sent : NULL, es, env_off, env_cnt, &env));
    /* The first step's receives, its early sends, then the other steps' receives: posting is
     * CPU time (a ready notice each), which the first step's segments on the wire now hide. */
    for (size_t t = t0; t < steps; t++) {
        for (size_t k = t == t0 ? k0 : 0; k < n_seg; k++) {
            const size_t len = seg_len(cnt[ring_chunk(me, n, (int)t)], seg, k);
            if (len > 0) {
                GLOO_CALL(what, accel__gloo_post, e->g, 0, left, RING_KEY(t, k), RING_BUF(t, k),
                          t == t0 && early ? EARLY_NBYTES : len * es, &rx[(t - t0) * n_seg + k]);
            }
        }
        for (size_t k = k0; k < n_seg && early && t == t0; k++) {
            RING_SEND(t0, k, sent + k * seg * es, seg_len(cnt[first], seg, k));
        }
    }
    int mismatch = 0;
    const accel_status st = accel__gloo_envelopes_check(e, &env, what, &mismatch);
    if (st != ACCEL_OK) {
        if (mismatch) {
            ACCEL_TRY(settle(e, &env, rx, tx, what));
        }
        return st;
    }
    for (size_t k = 0; k < n_seg && !early; k++) {
        RING_SEND(t0, k, sent + k * seg * es, seg_len(cnt[first], seg, k));
    }
    if (gather && op->send != out + off[me] * es && cnt[me] > 0) {
        memcpy(out + off[me] * es, op->send, cnt[me] * es); /* this member's own block */
    }
    for (size_t t = t0; t < steps; t++) {
        const int c = ring_chunk(me, n, (int)t);
        for (size_t k = 0; k < n_seg; k++) {
            const size_t len = seg_len(cnt[c], seg, k);
            if (len == 0) {
                continue;
            }
            char *buf;
            if (t == t0 && k < k0) { /* the left neighbour's envelope brought it */
                buf = env.all + (size_t)left * env.stride + sizeof(accel__coll_decl);
            } else {
                GLOO_CALL(what, accel__gloo_wait, e->g, rx[(t - t0) * n_seg + k]);
                buf = RING_BUF(t, k);
            }
            if (t < (size_t)n - 1) { /* combine this rank's input with the partial result */
                const int last = t == (size_t)n - 2;
                char *to = !last ? buf : out + ((scatter ? 0 : off[me]) + k * seg) * es;
                e->in[0] = buf;
                e->in[1] = data + (off[c] + k * seg) * es;
                accel__reduce(op->dtype, last ? op->op : partial, to, NULL, e->in, 2, len, n);
                buf = to;
            } else if (buf != RING_DEST(t, k)) { /* an allgather's early segment into place */
                memcpy(RING_DEST(t, k), buf, len * es);
                buf = RING_DEST(t, k);
            }
            if (t + 1 < steps) {
                RING_SEND(t + 1, k, buf, len);
            }
        }
    }
    for (size_t i = 0; i < n_tx; i++) {
        GLOO_CALL(what, accel__gloo_wait, e->g, tx[i]);
    }
#undef RING_SEND
#undef RING_KEY
#undef RING_BUF
#undef RING_DEST
    return ACCEL_OK;
}
