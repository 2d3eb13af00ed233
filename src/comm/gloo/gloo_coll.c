/*
 * The gloo backend's collectives (gloo.c sets up and handles failures).
 *
 * Reductions never use Gloo's ring allreduce, whose combination order depends on the rank and
 * chunk: every reduction sends block r of every rank to rank r, which reduces them with accel's
 * kernels in rank order (fp32 accumulation for the 16-bit dtypes, the wire dtype's rounding);
 * an allreduce then sends the reduced blocks to every rank (from 1 MiB over a network, 4 MiB on
 * one host, as point-to-point messages in segments on a ring-like schedule: pipelined() below),
 * reduce_scatter keeps them. That moves what a ring moves (2 (n-1)/n of the message per rank)
 * and gives results bit-identical to every other backend; except that over a network, f32 / f64
 * allreduces and reduces from 256 KiB run as a ring of our own, in ring order (gloo_ring.c;
 * ACCEL_GLOO_RING). Every call begins with one exchange of envelopes
 * declaring it (accel__gloo_envelopes_post below), which checks that every member makes the same
 * call, serves as the barrier, and carries a small allreduce's inputs (all together <= 64 KiB:
 * one round trip, every rank reducing them in rank order) or, for a reduction whose blocks are
 * at most 256 KiB, block r to rank r (fused() below). Reduce is the allreduce, kept at the
 * root; an allgather whose blocks fit the envelopes travels in them (allgather_fused() below)
 * unless it rings; a broadcast on two processes, or a large one, is a chain whose first segment
 * travels in the envelopes (broadcast() below); the rest are Gloo's own.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "base/convert.h"
#include "comm/comm.h"
#include "comm/reduce.h"
#include "gloo_impl.h"

accel_status accel__gloo_scratch(accel__gloo *e, int i, size_t nbytes, void **out)
{
    if (e->scratch_nbytes[i] < nbytes) {
        void *p = accel__realloc(e->scratch[i], nbytes);
        if (p == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory for %zu bytes", nbytes);
        }
        e->scratch[i] = p;
        e->scratch_nbytes[i] = nbytes;
    }
    *out = e->scratch[i];
    return ACCEL_OK;
}

/* The reduction at the heart of allreduce / reduce_scatter / reduce: `data` holds n blocks (rank
 * q's at off[q], cnt[q] elements of dtype dt); rank q receives block q of every rank, reduces
 * them in rank order and writes its block to out_block. */
static accel_status reduce_blocks(accel__gloo *e, const accel__coll *op, accel_dtype dt,
                                  const void *data, const size_t *cnt, void *out_block,
                                  const char *what)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t es = accel_dtype_nbytes(dt), mine = cnt[me] * es;
    void *blocks = NULL;
    ACCEL_TRY(accel__gloo_scratch(e, 0, mine * (size_t)n + 1, &blocks));
    for (int q = 0; q < n; q++) {
        e->send_nbytes[q] = cnt[q] * es;
        e->recv_nbytes[q] = mine;
        e->in[q] = (const char *)blocks + (size_t)q * mine;
    }
    GLOO_CALL(what, accel__gloo_alltoallv, e->g, data, e->send_nbytes, blocks, e->recv_nbytes);
    accel__reduce(dt, op->op, out_block, NULL, e->in, n, cnt[me], n);
    return ACCEL_OK;
}

/* Small allreduces (every input together at most this) travel whole in the call's envelope
 * (exchange() below): one round trip, every rank reducing all the inputs in rank order.
 * (Latency, not bandwidth, is what they cost.) */
#define ONESHOT_NBYTES ((size_t)64 << 10)

static int travels_inline(const accel__gloo *e, const accel__coll *op)
{
    return (op->kind == ACCEL__COLL_ALLREDUCE || op->kind == ACCEL__COLL_REDUCE) &&
           op->count * accel_dtype_nbytes(op->dtype) * (size_t)e->n_ranks <= ONESHOT_NBYTES;
}

/* The inputs that came in the envelopes: rank q's at in0 + q * stride. */
static void allreduce_inline(accel__gloo *e, const accel__coll *op, void *out, const char *in0,
                             size_t stride)
{
    const int n = e->n_ranks;
    for (int q = 0; q < n; q++) {
        e->in[q] = q == e->rank ? op->send : in0 + (size_t)q * stride;
    }
    if (op->wire != ACCEL_F32) {
        accel__reduce_wire(op->wire, op->op, out, NULL, e->in, n, op->count, n);
    } else {
        accel__reduce(op->dtype, op->op, out, NULL, e->in, n, op->count, n);
    }
}

/* Large allreduces: rank q owns chunk q; every rank sends chunk q of its input to q, q reduces
 * the n inputs in rank order and sends the reduced chunk to every rank (what a ring moves,
 * 2 (n-1)/n of the message per rank). The chunks travel as point-to-point messages in segments
 * of SEG_NBYTES, so segment k is reduced and sent on while k + 1 arrives. (Gloo's alltoallv
 * then allgatherv, one message per peer each with a ready-notice round trip and an idle link
 * between them, reached 0.7 of Gloo's own ring over a 1 Gbit/s link: docs/performance.md.)
 *
 * Every rank follows the same schedule: round j sends segment j of chunk me + s to rank me + s,
 * for s = 1 .. n-1, then the reduced segment j - 1 of its own chunk to the same ranks in the
 * same order; it receives in the mirrored order (step s from rank me - s). Gloo sends a message
 * only once its receive is posted, so the receiver paces its senders: with more than two ranks
 * at most WINDOW receives are posted at a time, so each machine's link carries about one flow
 * each way, as in a ring, instead of n - 1 flows overflowing its queue (over the emulated
 * 1 Gbit/s network this cut TCP retransmissions 3-10x and gained 0.05-0.08 of Gloo's ring at
 * 4 x 1; docs/performance.md, sixth pass). With a window of two, the next step's sender already
 * holds its ready notice when this step ends, so the link does not idle. Two ranks have one
 * flow each way anyway: every receive is posted at once (a window cost them a quarter). */
#define SEG_NBYTES ((size_t)1 << 20)
#define WINDOW 2
/* Below this, Gloo's alltoallv then allgatherv (unless the chunks fit the envelopes: fused()
 * below): on one host (TCP loopback) the point-to-point messages cost 2-3x more per call from
 * 64 KiB to 1 MiB, while over a 1 Gbit/s link they gained from 1 MiB up (docs/performance.md,
 * "gloo's allreduce over an emulated network"; at 256 KiB the scheduled exchange did not beat
 * the two Gloo calls there either, sixth pass): 1 MiB when some member has a peer on another
 * host, else 4 MiB. */
#define PIPELINE_NBYTES(e) ((e)->remote ? (size_t)1 << 20 : (size_t)4 << 20)

/* A receive of the schedule: segment k from rank q, of its input or (reduced) of its chunk. */
typedef struct slot {
    char *buf;
    size_t nbytes, k, ix;
    int q, reduced, last_in; /* last_in: the last input of this rank's segment k */
} slot;

static accel_status pipelined(accel__gloo *e, const accel__coll *op, accel_dtype dt,
                              const char *data, char *result, const size_t *off, const char *what)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t es = accel_dtype_nbytes(dt), *cnt = e->cnt, mine = cnt[me];
    const size_t window = n > 2 ? WINDOW : SIZE_MAX;
    size_t per = 0;
    for (int q = 0; q < n; q++) {
        per = cnt[q] > per ? cnt[q] : per;
    }
    const size_t seg = seg_size(per, SEG_NBYTES / es, 1);
    const size_t n_seg = (per + seg - 1) / seg, max_msgs = 2 * n_seg * (size_t)n;
    char *in = NULL;
    slot *rx = NULL; /* the receives in schedule order */
    size_t *sx = NULL, n_rx = 0, n_sx = 0, posted = 0;
    ACCEL_TRY(accel__gloo_scratch(e, 0, mine * es * (size_t)n + 1, (void **)&in));
    ACCEL_TRY(accel__gloo_scratch(e, 2, max_msgs * (sizeof(slot) + sizeof(size_t)), (void **)&rx));
    sx = (size_t *)(rx + max_msgs);
    for (size_t j = 0; j <= n_seg; j++) {
        for (int reduced = 0; reduced < 2; reduced++) {
            const size_t k = j - (size_t)reduced;
            if ((reduced == 0 && j == n_seg) || (reduced == 1 && j == 0)) {
                continue;
            }
            for (int s = 1; s < n; s++) {
                const int q = (me - s + n) % n;
                const size_t len = seg_len(reduced ? cnt[q] : mine, seg, k);
                char *buf = reduced ? result + (off[q] + k * seg) * es
                                    : in + ((size_t)q * mine + k * seg) * es;
                if (len > 0) {
                    rx[n_rx++] =
                        (slot){buf, len * es, k, SIZE_MAX, q, reduced, !reduced && s == n - 1};
                }
            }
        }
    }
    accel__gloo_msgs_begin(e->g);
#define POST_RECVS(upto)                                                                           \
    for (; posted < n_rx && posted < (upto); posted++) {                                           \
        slot *r_ = &rx[posted];                                                                    \
        GLOO_CALL(what, accel__gloo_post, e->g, 0, r_->q,                                          \
                  (uint32_t)(r_->k * 2 + (size_t)r_->reduced), r_->buf, r_->nbytes, &r_->ix);      \
    }
#define SEND(k, q, reduced, buf, len)                                                              \
    do {                                                                                           \
        if ((len) > 0) {                                                                           \
            GLOO_CALL(what, accel__gloo_post, e->g, 1, q, (uint32_t)((k)*2 + (size_t)(reduced)),   \
                      (void *)(buf), (len)*es, &sx[n_sx++]);                                       \
        }                                                                                          \
    } while (0)
    POST_RECVS(window); /* first, so that the peers' first sends find them */
    for (size_t k = 0; k < n_seg; k++) {
        for (int s = 1; s < n; s++) {
            const int q = (me + s) % n;
            SEND(k, q, 0, data + (off[q] + k * seg) * es, seg_len(cnt[q], seg, k));
        }
    }
    for (size_t t = 0; t < n_rx; t++) {
        POST_RECVS(window == SIZE_MAX ? SIZE_MAX : t + window);
        GLOO_CALL(what, accel__gloo_wait, e->g, rx[t].ix);
        if (rx[t].last_in) { /* this rank's segment k has every input: reduce it, send it on */
            const size_t k = rx[t].k, len = seg_len(mine, seg, k);
            char *to = result + (off[me] + k * seg) * es;
            for (int q = 0; q < n; q++) {
                e->in[q] = q == me ? data + (off[me] + k * seg) * es
                                   : in + ((size_t)q * mine + k * seg) * es;
            }
            accel__reduce(dt, op->op, to, NULL, e->in, n, len, n);
            for (int s = 1; s < n; s++) {
                SEND(k, (me + s) % n, 1, to, len);
            }
        }
    }
    for (size_t i = 0; i < n_sx; i++) {
        GLOO_CALL(what, accel__gloo_wait, e->g, sx[i]);
    }
#undef SEND
#undef POST_RECVS
    return ACCEL_OK;
}

/* The element type reductions move and reduce: the wire dtype when there is one (every input is
 * rounded to it first; accel__reduce accumulates 16-bit inputs in fp32 and rounds once, which is
 * what accel__reduce_wire is). */
static accel_dtype moved_dtype(const accel__coll *op)
{
    return op->wire != ACCEL_F32 ? op->wire : op->dtype;
}

/* With a wire dtype, *w is op's input rounded to it (scratch 1), else NULL. The front end takes
 * a wire dtype for allreduce only (comm.c), so the whole input is what gets rounded. */
static accel_status wire_input(accel__gloo *e, const accel__coll *op, void **w)
{
    *w = NULL;
    if (op->wire == ACCEL_F32) {
        return ACCEL_OK;
    }
    ACCEL_ASSERT(op->kind == ACCEL__COLL_ALLREDUCE);
    ACCEL_TRY(accel__gloo_scratch(e, 1, op->count * accel_dtype_nbytes(op->wire) + 1, w));
    (op->wire == ACCEL_BF16 ? accel__f32_to_bf16_n : accel__f32_to_f16_n)(*w, op->send, op->count);
    return ACCEL_OK;
}

/* The reduced wire-dtype result w back into out, in op's dtype. */
static void wire_output(const accel__coll *op, void *out, const void *w)
{
    (op->wire == ACCEL_BF16 ? accel__bf16_to_f32_n : accel__f16_to_f32_n)(out, w, op->count);
}

/* Allreduce into out (the user's recv, or scratch for a non-root reduce), of inputs too large
 * to travel inline. */
static accel_status allreduce(accel__gloo *e, const accel__coll *op, void *out, const char *what)
{
    const int n = e->n_ranks;
    size_t *off = e->send_nbytes; /* here: the chunks' offsets, in elements */
    for (int q = 0; q < n; q++) {
        accel__chunk_range(op->count, n, q, &off[q], &e->cnt[q]);
    }
    const accel_dtype dt = moved_dtype(op);
    const size_t es = accel_dtype_nbytes(dt);
    const void *data = op->send;
    void *result = out, *w = NULL;
    ACCEL_TRY(wire_input(e, op, &w));
    if (w != NULL) {
        data = result = w;
    }
    if (op->count * es >= PIPELINE_NBYTES(e)) {
        ACCEL_TRY(pipelined(e, op, dt, data, result, off, what));
    } else {
        char *mine = (char *)result + off[e->rank] * es; /* reduce_blocks reuses off's table */
        ACCEL_TRY(reduce_blocks(e, op, dt, data, e->cnt, mine, what));
        for (int q = 0; q < n; q++) {
            e->recv_nbytes[q] = e->cnt[q] * es;
        }
        GLOO_CALL(what, accel__gloo_allgatherv, e->g, NULL, result, e->recv_nbytes);
    }
    if (w != NULL) {
        wire_output(op, out, w);
    }
    return ACCEL_OK;
}

/* ---- the envelope: every call's first exchange ---- */

/* Every envelope is received into a buffer of the declaration and this many bytes, whatever the
 * call: at most 256 KiB a member, and 4 MiB for all together (each member computes the same from
 * n alone, so a mismatched envelope fits too). Not less than a small allreduce's inputs
 * (ONESHOT_NBYTES / n, since 4 MiB >= 64 KiB). */
#define FUSE_CHUNK_NBYTES ((size_t)256 << 10)
#define FUSE_TOTAL_NBYTES ((size_t)4 << 20)
_Static_assert(FUSE_CHUNK_NBYTES >= ONESHOT_NBYTES && FUSE_TOTAL_NBYTES >= ONESHOT_NBYTES,
               "an envelope must hold a small allreduce's input");

size_t accel__gloo_envelope_room(int n)
{
    const size_t total = FUSE_TOTAL_NBYTES / (size_t)n;
    return total < FUSE_CHUNK_NBYTES ? total : FUSE_CHUNK_NBYTES;
}

/* Every member sends every other an envelope: its declaration of the call, then for a small
 * allreduce (travels_inline) its whole input, or for a reduction whose chunks fit
 * (envelope_room: fused() below) chunk q of its input to member q (`data`: chunk q is cnt[q]
 * elements of es bytes at off[q]). The declarations are compared before any other data is used
 * or any other message is sent (but the ring's early segments, gloo_ring.c, sized to fit any
 * call's receives): Gloo's transport aborts the process when a message is larger than the
 * buffer posted for it, so a mismatched call must never reach it. Envelopes are received into
 * buffers of a size that depends on n alone (envelope_room), which a mismatched one fits too.
 * Every member sees the same table and fails alike (ACCEL_EINVAL, naming two calls; *mismatch
 * set), the connections untouched. One round trip that is also the barrier, and a small
 * allreduce's whole data movement; env->all receives the table (env->stride bytes per member:
 * rank q's declaration, then what q sent this member). Two halves, so that a caller can post
 * its own receives between them (the batch of messages begins in the first). The receives are
 * posted here, not one call ahead: a receive posted ahead sends its ready notice to a peer that
 * may have left the communicator already, whose connection reset then discards what this
 * process had not read yet of the last call. */
accel_status accel__gloo_envelopes_post(accel__gloo *e, const accel__coll *op, const char *what,
                                        const char *data, size_t es, const size_t *off,
                                        const size_t *cnt, accel__gloo_env *env)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t head = sizeof(accel__coll_decl);
    const size_t st = (head + accel__gloo_envelope_room(n) + 7) & ~(size_t)7;
    const size_t payload = travels_inline(e, op) ? op->count * accel_dtype_nbytes(op->dtype) : 0;
    char *all = NULL, *out = NULL;
    size_t *ix = NULL;
    ACCEL_TRY(accel__gloo_scratch(e, 0, st * (size_t)n, (void **)&all));
    ACCEL_TRY(accel__gloo_scratch(e, 2, 2 * sizeof(size_t) * (size_t)n, (void **)&ix));
    if (data != NULL) { /* one envelope per peer, each with its chunk after the declaration */
        ACCEL_TRY(accel__gloo_scratch(e, 3, st * (size_t)n, (void **)&out));
    }
    *env = (accel__gloo_env){all, st, ix};
    accel__coll_decl mine = accel__coll_declare(e->has_declare_as ? &e->declare_as : op);
    e->has_declare_as = 0;
    memcpy(all + (size_t)me * st, &mine, head);
    if (payload > 0) {
        memcpy(all + (size_t)me * st + head, op->send, payload);
    }
    accel__gloo_msgs_begin(e->g);
    for (int q = 0; q < n; q++) {
        if (q != me) {
            GLOO_CALL(what, accel__gloo_post, e->g, 0, q, 0, all + (size_t)q * st, st, &ix[q]);
        }
    }
    for (int s = 1; s < n; s++) {
        const int q = (me + s) % n; /* every member to a different peer first */
        if (data != NULL) {
            char *to_q = out + (size_t)q * st;
            memcpy(to_q, &mine, head);
            memcpy(to_q + head, data + off[q] * es, cnt[q] * es);
            GLOO_CALL(what, accel__gloo_post, e->g, 1, q, 0, to_q, head + cnt[q] * es, &ix[n + q]);
        } else {
            GLOO_CALL(what, accel__gloo_post, e->g, 1, q, 0, all + (size_t)me * st, head + payload,
                      &ix[n + q]);
        }
    }
    return ACCEL_OK;
}

accel_status accel__gloo_envelopes_check(accel__gloo *e, const accel__gloo_env *env,
                                         const char *what, int *mismatch)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t head = sizeof(accel__coll_decl);
    for (int q = 0; q < n; q++) {
        if (q != me) {
            GLOO_CALL(what, accel__gloo_wait, e->g, env->ix[q]);
            GLOO_CALL(what, accel__gloo_wait, e->g, env->ix[n + q]);
        }
    }
    accel__coll_decl first;
    memcpy(&first, env->all, head);
    for (int q = 1; q < n; q++) {
        accel__coll_decl dq;
        memcpy(&dq, env->all + (size_t)q * env->stride, head);
        const int any_alloc =
            first.kind == ACCEL__GLOO_CALL_ALLOC_ANY && dq.kind == ACCEL__GLOO_CALL_ALLOC_ANY;
        if (!any_alloc && memcmp(&dq, &first, head) != 0) {
            char msg[sizeof(e->broken_msg)];
            *mismatch = 1;
            if (accel__coll_decl_mismatch("gloo", &first, e->process[0], &dq, e->process[q], n, msg,
                                          sizeof(msg))) {
                return accel__seterr(NULL, ACCEL_EINVAL, "%s", msg); /* still usable */
            }
            pthread_mutex_lock(&e->mu);
            e->broken_st = ACCEL_EINVAL;
            snprintf(e->broken_msg, sizeof(e->broken_msg), "%s", msg);
            atomic_store(&e->broken, 1);
            pthread_mutex_unlock(&e->mu);
            return accel__seterr(NULL, ACCEL_EINVAL, "%s", msg);
        }
    }
    return ACCEL_OK;
}

/* Both halves, nothing posted between them; *env_out and *stride: the table. */
static accel_status exchange(accel__gloo *e, const accel__coll *op, const char *what,
                             const char *data, size_t es, const size_t *off, const size_t *cnt,
                             char **env_out, size_t *stride)
{
    accel__gloo_env env;
    int mismatch = 0;
    ACCEL_TRY(accel__gloo_envelopes_post(e, op, what, data, es, off, cnt, &env));
    ACCEL_TRY(accel__gloo_envelopes_check(e, &env, what, &mismatch));
    *env_out = env.all;
    *stride = env.stride;
    return ACCEL_OK;
}

/* ---- broadcast ---- */

/* Gloo's broadcast is a binomial tree of whole messages: the root sends all of it to log2 n
 * processes in turn, each forwarding it only once it has all of it (at 4 x 1 over the emulated
 * 1 Gbit/s network, 16 MiB took 2.3 times the link's time for the bytes). From
 * CHAIN_NBYTES on 3 or more processes it is a chain instead, root -> root + 1 -> ... ->
 * root - 1, in segments (at least CHAIN_MIN_SEGS, at most CHAIN_SEG_NBYTES unless that makes
 * more than ACCEL__GLOO_MAX_SEGS), each forwarded as soon as it arrives: the message crosses
 * each link once, and the chain costs a segment's time per process beyond the first. On two
 * processes every broadcast is that chain of one hop.
 *
 * The chain's first segment travels in the root's envelope to root + 1 (on two processes as much
 * of the message as an envelope holds), so it crosses while the call is checked instead of after
 * (the check's round trip, about 1.4 ms over the emulated network, had put a 256 KiB broadcast
 * on 3-4 processes at 0.69-0.83 of Gloo's own). Envelopes land in buffers of a size fixed by n
 * (envelope_room), so a mismatched call's fits too. Broadcast combines nothing, so every path
 * gives the same bytes. */
#define CHAIN_NBYTES ((size_t)256 << 10)
#define CHAIN_SEG_NBYTES ((size_t)256 << 10)
#define CHAIN_MIN_SEGS 2

/* The chain's segment k of nb bytes: segment 0 is `first` bytes (at most nb), the others seg. */
static size_t chain_off(size_t first, size_t seg, size_t k)
{
    return k == 0 ? 0 : first + (k - 1) * seg;
}

static size_t chain_len(size_t nb, size_t first, size_t seg, size_t k)
{
    return k == 0 ? first : seg_len(nb - first, seg, k - 1);
}

/* The chain after the envelopes; segment 0 came in them when `fused` (root + 1 has it, and the
 * root does not send it again). */
static accel_status chain_broadcast(accel__gloo *e, char *buf, size_t nb, int root, size_t first,
                                    size_t seg, int fused, const char *what)
{
    const int n = e->n_ranks, me = e->rank, pos = (me - root + n) % n;
    const int prev = (me + n - 1) % n, next = (me + 1) % n;
    const size_t n_seg = 1 + (nb > first ? (nb - first + seg - 1) / seg : 0);
    const size_t k0 = fused && pos <= 1 ? 1 : 0; /* the root's first send, root + 1's receive */
    size_t *rx = NULL, *tx = NULL, n_tx = 0;
    ACCEL_TRY(accel__gloo_scratch(e, 4, 2 * n_seg * sizeof(size_t), (void **)&rx));
    tx = rx + n_seg;
    accel__gloo_msgs_begin(e->g);
    for (size_t k = k0; k < n_seg && pos > 0; k++) { /* every receive first */
        GLOO_CALL(what, accel__gloo_post, e->g, 0, prev, (uint32_t)k,
                  buf + chain_off(first, seg, k), chain_len(nb, first, seg, k), &rx[k]);
    }
    for (size_t k = 0; k < n_seg; k++) {
        if (pos > 0 && k >= k0) {
            GLOO_CALL(what, accel__gloo_wait, e->g, rx[k]);
        }
        if (pos < n - 1 && (pos > 0 || k >= k0)) {
            GLOO_CALL(what, accel__gloo_post, e->g, 1, next, (uint32_t)k,
                      buf + chain_off(first, seg, k), chain_len(nb, first, seg, k), &tx[n_tx++]);
        }
    }
    for (size_t i = 0; i < n_tx; i++) {
        GLOO_CALL(what, accel__gloo_wait, e->g, tx[i]);
    }
    return ACCEL_OK;
}

static accel_status broadcast(accel__gloo *e, const accel__coll *op, const char *what)
{
    const int n = e->n_ranks, me = e->rank, root = op->root, next = (root + 1) % n;
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype),
                 room = accel__gloo_envelope_room(n);
    const int chain = n == 2 || nb >= CHAIN_NBYTES;
    size_t seg = nb > 0 ? seg_size(nb, CHAIN_SEG_NBYTES, CHAIN_MIN_SEGS) : 1, first = seg;
    if (n == 2) { /* one hop, nothing to forward: what an envelope holds, the rest in one message */
        first = nb < room ? nb : room;
        seg = nb > first ? nb - first : 1;
    }
    const int fused = chain && nb > 0 && first <= room;
    for (int q = 0; q < n; q++) { /* segment 0 in the root's envelope to root + 1 */
        e->send_nbytes[q] = 0;
        e->cnt[q] = q == next && fused ? first : 0;
    }
    char *env = NULL;
    size_t st = 0;
    ACCEL_TRY(exchange(e, op, what, me == root && fused ? op->send : NULL, 1, e->send_nbytes,
                       e->cnt, &env, &st));
    if (me == root && op->send != op->recv && nb > 0) {
        memcpy(op->recv, op->send, nb);
    }
    if (me == next && fused) {
        memcpy(op->recv, env + (size_t)root * st + sizeof(accel__coll_decl), first);
    }
    if (nb == 0) {
        return ACCEL_OK;
    }
    if (chain) {
        return chain_broadcast(e, op->recv, nb, root, first, seg, fused, what);
    }
    GLOO_CALL(what, accel__gloo_broadcast, e->g, op->recv, nb, root);
    return ACCEL_OK;
}

/* ---- reductions whose chunks travel in the envelopes ---- */

/* 1 when a reduction that does not travel inline takes fused() below: its largest chunk (a
 * reduce_scatter's block) fits an envelope. Ahead of the pipelined path too: at 4 x 1 over the
 * emulated 1 Gbit/s network a 1 MiB allreduce (chunks of 256 KiB) took 31 ms fused against 33-35
 * pipelined (docs/performance.md, seventh pass). */
static int fuses(const accel__gloo *e, const accel__coll *op)
{
    const size_t es = accel_dtype_nbytes(moved_dtype(op)),
                 room = accel__gloo_envelope_room(e->n_ranks);
    if (op->kind == ACCEL__COLL_REDUCE_SCATTER) {
        return op->count * es <= room;
    }
    if (op->kind != ACCEL__COLL_ALLREDUCE && op->kind != ACCEL__COLL_REDUCE) {
        return 0;
    }
    size_t off0 = 0, largest = 0; /* chunk 0 is the largest */
    accel__chunk_range(op->count, e->n_ranks, 0, &off0, &largest);
    return largest * es <= room;
}

/* A reduction whose chunks fit the envelopes: the envelope to q carries chunk q of this member's
 * input, so after the one exchange every member holds every input of its own chunk and reduces
 * them in rank order (reduce_scatter ends there). An allreduce then gathers the reduced chunks
 * with Gloo's allgatherv; a reduce sends them to the root, whose receives are posted before it
 * reduces its own. Two dependent exchanges where the envelopes, Gloo's alltoallv and its
 * allgatherv made three. (Sending the reduced chunk to every member at once instead of the
 * allgatherv's ring was slower over the emulated network at 4 x 1, 256 KiB: 7.7 ms against
 * 6.9, also with its receives posted beside the envelopes': n - 1 flows converge on every
 * machine's link, where a ring has one.) */
static accel_status fused(accel__gloo *e, const accel__coll *op, const char *what)
{
    const int n = e->n_ranks, me = e->rank;
    const int scatter = op->kind == ACCEL__COLL_REDUCE_SCATTER;
    const int has_result = op->kind != ACCEL__COLL_REDUCE || me == op->root;
    const accel_dtype dt = moved_dtype(op);
    const size_t es = accel_dtype_nbytes(dt), head = sizeof(accel__coll_decl);
    size_t *off = e->send_nbytes, *cnt = e->cnt; /* the chunks, in elements */
    for (int q = 0; q < n; q++) {
        if (scatter) {
            off[q] = (size_t)q * op->count;
            cnt[q] = op->count;
        } else {
            accel__chunk_range(op->count, n, q, &off[q], &cnt[q]);
        }
    }
    const char *data = op->send;
    char *result = op->recv;
    void *w = NULL;
    ACCEL_TRY(wire_input(e, op, &w));
    if (w != NULL) {
        data = result = w;
    } else if (!has_result) { /* a reduce's member other than the root: its chunk only */
        void *own = NULL;
        ACCEL_TRY(accel__gloo_scratch(e, 1, op->count * es + 1, &own));
        result = own;
    }
    char *env = NULL;
    size_t st = 0, *ix = NULL, n_msgs = 0;
    ACCEL_TRY(exchange(e, op, what, data, es, off, cnt, &env, &st));
    if (op->kind == ACCEL__COLL_REDUCE) { /* the reduced chunks go to the root only */
        ACCEL_TRY(accel__gloo_scratch(e, 2, 2 * sizeof(size_t) * (size_t)n, (void **)&ix));
        accel__gloo_msgs_begin(e->g);
        for (int q = 0; q < n && me == op->root; q++) {
            if (q != me && cnt[q] > 0) {
                GLOO_CALL(what, accel__gloo_post, e->g, 0, q, 0, result + off[q] * es, cnt[q] * es,
                          &ix[n_msgs++]);
            }
        }
    }
    for (int q = 0; q < n; q++) {
        e->in[q] = q == me ? data + off[me] * es : env + (size_t)q * st + head;
    }
    char *to = scatter ? (char *)op->recv : result + off[me] * es;
    accel__reduce(dt, op->op, to, NULL, e->in, n, cnt[me], n);
    if (op->kind == ACCEL__COLL_ALLREDUCE) {
        for (int q = 0; q < n; q++) {
            e->recv_nbytes[q] = cnt[q] * es;
        }
        GLOO_CALL(what, accel__gloo_allgatherv, e->g, NULL, result, e->recv_nbytes);
    } else if (op->kind == ACCEL__COLL_REDUCE && me != op->root && cnt[me] > 0) {
        GLOO_CALL(what, accel__gloo_post, e->g, 1, op->root, 0, to, cnt[me] * es, &ix[n_msgs++]);
    }
    for (size_t i = 0; i < n_msgs; i++) {
        GLOO_CALL(what, accel__gloo_wait, e->g, ix[i]);
    }
    if (w != NULL) { /* an allreduce: every member has the result */
        wire_output(op, op->recv, w);
    }
    return ACCEL_OK;
}

/* An allgather whose block fits an envelope travels in them: every member's envelope to every
 * other carries its block, so one exchange is the whole call. Each link carries the n - 1 blocks
 * a ring would, in one round trip instead of the envelopes' and then Gloo's ring of n - 1
 * dependent steps (at 4 x 1 over the emulated 1 Gbit/s network, 256 KiB in all took 2.3-2.6x
 * Gloo's own allgather that way; docs/performance.md). */
static accel_status allgather_fused(accel__gloo *e, const accel__coll *op, const char *what)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t es = accel_dtype_nbytes(op->dtype), nb = op->count * es;
    char *out = op->recv, *env = NULL;
    size_t st = 0;
    for (int q = 0; q < n; q++) { /* this member's block to every other */
        e->send_nbytes[q] = 0;
        e->cnt[q] = op->count;
    }
    ACCEL_TRY(exchange(e, op, what, op->send, es, e->send_nbytes, e->cnt, &env, &st));
    for (int q = 0; q < n; q++) {
        const char *from = q == me ? op->send : env + (size_t)q * st + sizeof(accel__coll_decl);
        if (from != out + (size_t)q * nb && nb > 0) {
            memcpy(out + (size_t)q * nb, from, nb);
        }
    }
    return ACCEL_OK;
}

void accel__gloo_declare_next(accel__gloo *e, const accel__coll *op)
{
    if (e != NULL) {
        e->declare_as = *op;
        e->has_declare_as = 1;
    }
}

void accel__gloo_declare_clear(accel__gloo *e)
{
    if (e != NULL) {
        e->has_declare_as = 0;
    }
}

accel_status accel__gloo_alloc_check(accel__gloo *e, size_t nbytes)
{
    accel__coll alloc =
        ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, nbytes, ACCEL_U8, ACCEL_SUM, 0);
    alloc.kind = (accel__coll_kind)ACCEL__COLL_DECL_ALLOC;
    accel__coll barrier = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
    accel__gloo_declare_next(e, &alloc);
    accel_status st = accel__gloo_run(e, &barrier);
    accel__gloo_declare_clear(e);
    return st;
}

accel_status accel__gloo_run(accel__gloo *e, const accel__coll *op)
{
    if (atomic_load(&e->broken)) {
        return accel__seterr(NULL, e->broken_st, "%s", e->broken_msg);
    }
    char what[160];
    accel__coll_str(op, e->n_ranks, what, sizeof(what));
    const accel__coll_decl d = accel__coll_declare(op);
    if (!e->has_declare_as && accel__gloo_rings(e, &d)) {
        return accel__gloo_ring(e, op, &d, what);
    }
    if (!travels_inline(e, op) && fuses(e, op)) {
        return fused(e, op, what);
    }
    if (op->kind == ACCEL__COLL_ALLGATHER &&
        op->count * accel_dtype_nbytes(op->dtype) <= accel__gloo_envelope_room(e->n_ranks)) {
        return allgather_fused(e, op, what);
    }
    if (op->kind == ACCEL__COLL_BROADCAST) {
        return broadcast(e, op, what);
    }
    char *env = NULL;
    size_t stride = 0;
    ACCEL_TRY(exchange(e, op, what, NULL, 0, NULL, NULL, &env, &stride));
    const int n = e->n_ranks, me = e->rank;
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype);
    if (travels_inline(e, op)) { /* the data came with the envelopes */
        if (op->kind == ACCEL__COLL_ALLREDUCE || me == op->root) {
            allreduce_inline(e, op, op->recv, env + sizeof(accel__coll_decl), stride);
        }
        return ACCEL_OK;
    }
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return allreduce(e, op, op->recv, what);
    case ACCEL__COLL_REDUCE: {
        void *out = op->recv;
        if (me != op->root) {
            ACCEL_TRY(accel__gloo_scratch(e, 1, nb + 1, &out));
        }
        accel__coll ar = *op;
        ar.kind = ACCEL__COLL_ALLREDUCE;
        return allreduce(e, &ar, out, what);
    }
    case ACCEL__COLL_REDUCE_SCATTER: {
        for (int q = 0; q < n; q++) {
            e->cnt[q] = op->count;
        }
        return reduce_blocks(e, op, op->dtype, op->send, e->cnt, op->recv, what);
    }
    case ACCEL__COLL_ALLGATHER: {
        for (int q = 0; q < n; q++) {
            e->recv_nbytes[q] = nb;
        }
        const int in_place = op->send == (const char *)op->recv + (size_t)me * nb;
        GLOO_CALL(what, accel__gloo_allgatherv, e->g, in_place ? NULL : op->send, op->recv,
                  e->recv_nbytes);
        return ACCEL_OK;
    }
    case ACCEL__COLL_BROADCAST: /* broadcast() runs it, envelopes included */
        break;
    case ACCEL__COLL_GATHER: {
        const void *send = op->send;
        if (me == op->root && send == (const char *)op->recv + (size_t)me * nb) {
            void *copy =
                NULL; /* Gloo copies the root's own block with memcpy: no overlap allowed */
            ACCEL_TRY(accel__gloo_scratch(e, 1, nb + 1, &copy));
            memcpy(copy, send, nb);
            send = copy;
        }
        GLOO_CALL(what, accel__gloo_gather, e->g, send, nb, op->recv, op->root);
        return ACCEL_OK;
    }
    case ACCEL__COLL_BARRIER: /* the exchange was one */
        return ACCEL_OK;
    }
    return accel__seterr(NULL, ACCEL_EINTERNAL, "gloo: no path for collective %d", (int)op->kind);
}
