/*
 * The mpi backend's collectives: each posts nonblocking MPI calls and waits for them with the
 * communicator's deadline (accel__mpi_wait), on the front end's progress thread.
 *
 * Reductions give the bits every accel backend gives (inputs combined in rank order, 16-bit and
 * 8-bit floats accumulated in f32 and rounded once), which MPI's own algorithms do not promise:
 * they group operands their own way, and a user op on 16-bit data rounds at every combine. So
 * every reduction is ours, over point-to-point messages (MPI_Isend / MPI_Irecv):
 *  - Small messages ((n_ranks - 1) x bytes <= 64 KiB): the direct path, one round of messages
 *    carrying every input to every process, each reducing them in rank order: one message
 *    latency (latency is what counts at these sizes).
 *  - Larger ones: the pipelined path. Process q owns chunk q of the message: every process sends
 *    it chunk q of its input, q reduces the n inputs in rank order with accel's kernel, and sends
 *    the reduced chunk to every process (allreduce), to the root (reduce) or keeps it
 *    (reduce_scatter). That moves what a ring moves (2 (n-1)/n of the message per process) in
 *    two message latencies. Chunks travel in segments of SEG_NBYTES: segment k is reduced while
 *    segment k + 1 arrives, and sent on as soon as it is reduced, so the reduction reads data
 *    that just arrived (in cache) and overlaps the transfers.
 * MPI's nonblocking collectives (Open MPI's libnbc) were slower than both: its MPI_Iallreduce
 * reduces to a root and broadcasts back on small process counts (twice the bytes on the
 * critical path of MPI_Allreduce's exchange), and each of its rounds advances only when tested.
 * Allgather, broadcast, gather and barrier are point-to-point messages too (one exchange round;
 * a broadcast of a large message scatters it first; a barrier's rounds of empty messages). Every
 * message's tag carries the call's fingerprint (mpi_check.c), which MPI's own collectives could
 * not: a process at a mismatched call never takes another call's data.
 */
#include <limits.h>
#include <string.h>

#include "base/base.h"
#include "comm/reduce.h"
#include "mpi_impl.h"

/* Elements per MPI call of an element-wise collective (MPI counts are int). */
#define SLICE ((size_t)1 << 30)

/* Small messages: every process sends its whole input to every other (to the root alone for a
 * reduce) and reduces all of them in rank order itself: one round of point-to-point messages
 * instead of a nonblocking collective's multi-step schedule, while the bytes stay few. */
#define DIRECT_NBYTES ((size_t)64 << 10) /* (n_ranks - 1) x message bytes at most */
/* Open MPI's shared-memory transport copies a message of up to 4 KiB (its header included)
 * through its queues at once; a longer one takes a rendezvous (a handshake, then the receiver
 * reads it with a process_vm_readv system call), which doubled the time of a 4 KiB allreduce.
 * So a message of up to DIRECT_FRAG_MAX bytes goes in pieces of DIRECT_FRAG_NBYTES; above it
 * the single rendezvous copy is faster than many pieces. */
#define DIRECT_FRAG_NBYTES ((size_t)4032)
#define DIRECT_FRAG_MAX ((size_t)8 << 10)
/* A message's tag: the call's fingerprint (mpi_check.c) and the message's kind. */
#define TAG(m, msg) ((m)->call_tag | ACCEL__MPI_MSG_##msg)
/* Bytes per message of the pipelined path: large enough that per-message costs (a few us)
 * stay small against the copy, small enough that a segment of every input fits in cache.
 * (128 KiB gave 0.89-0.98 of MPI_Allreduce at 1 MiB on 2 processes, 256 KiB 0.94-1.08; on a
 * later machine 256 KiB gave 0.87-0.96 at 2 MiB and 0.80-1.01 at 4 MiB, 512 KiB 0.97-1.13 and
 * 0.84-0.98, 4 processes alike: docs/performance.md, thirteenth pass.) */
#define SEG_NBYTES ((size_t)512 << 10)
/* Segments whose input receives are posted ahead of the one being reduced. Open MPI's
 * shared-memory transport copies a large message (process_vm_readv) in the receiver once its
 * receive is posted and the sender's header is there: with every receive posted up front, the
 * first wait copied every segment, the first ones leaving the cache before they were reduced
 * (4 MiB on 2 processes: 0.88-1.06 of MPI_Allreduce, median 0.94, against 0.95-1.07, median
 * 1.02, with 2 ahead). Two, not one: a network's next transfers go on during a reduction. */
#define RECV_AHEAD 2

/* n_req null requests (and peers -1) in the endpoint's grow-only arrays (the statuses' too),
 * or NULL (ENOMEM). */
static MPI_Request *pipe_reqs(accel__mpi *m, size_t n_req)
{
    if (n_req > m->pipe_n) {
        MPI_Request *r = accel__realloc(m->pipe_reqs, n_req * sizeof(*r));
        m->pipe_reqs = r != NULL ? r : m->pipe_reqs;
        accel__mpi_rx *p = r != NULL ? accel__realloc(m->pipe_rx, n_req * sizeof(*p)) : NULL;
        m->pipe_rx = p != NULL ? p : m->pipe_rx;
        MPI_Status *s = p != NULL && n_req > m->statuses_n
                            ? accel__realloc(m->statuses, n_req * sizeof(*s))
                            : m->statuses;
        if (p == NULL || s == NULL) {
            accel__seterr(NULL, ACCEL_ENOMEM, "mpi: out of memory for %zu requests", n_req);
            return NULL;
        }
        m->statuses = s;
        m->statuses_n = n_req > m->statuses_n ? n_req : m->statuses_n;
        m->pipe_n = n_req;
    }
    for (size_t i = 0; i < n_req; i++) {
        m->pipe_reqs[i] = MPI_REQUEST_NULL;
        m->pipe_rx[i].peer = -1;
    }
    return m->pipe_reqs;
}

/* The direct path over count elements of dt; tmp holds n_ranks x count elements. */
static accel_status direct(accel__mpi *m, accel_dtype dt, accel_reduce_op rop, const void *send,
                           void *recv, size_t count, int root, char *tmp)
{
    const int n = m->n_ranks, me = m->rank;
    const size_t es = accel_dtype_nbytes(dt), nb = count * es;
    const size_t frag = nb <= DIRECT_FRAG_MAX ? DIRECT_FRAG_NBYTES / es : count; /* per message */
    const size_t n_frag = count / frag + (count % frag != 0);
    const MPI_Datatype t = accel__mpi_type(dt);
    const int gets = root < 0 || me == root;
    MPI_Request *reqs = pipe_reqs(m, 2 * (size_t)n * n_frag);
    if (reqs == NULL) {
        return ACCEL_ENOMEM;
    }
    int k = 0, rc = MPI_SUCCESS;
    accel__mpi_lock();
    for (int q = 0; q < n && rc == MPI_SUCCESS; q++) {
        m->ins[q] = q == me ? send : tmp + (size_t)q * nb;
        for (size_t f = 0; q != me && gets && f < n_frag && rc == MPI_SUCCESS; f++) {
            const size_t len = count - f * frag < frag ? count - f * frag : frag;
            rc = accel__mpi_irecv(m, tmp + (size_t)q * nb + f * frag * es, (int)len, t, es, q,
                                  TAG(m, DIRECT), &reqs[k], &m->pipe_rx[k]);
            k++;
        }
    }
    for (int q = 0; q < n && rc == MPI_SUCCESS; q++) {
        for (size_t f = 0; q != me && (root < 0 || q == root) && f < n_frag && rc == MPI_SUCCESS;
             f++) {
            const size_t len = count - f * frag < frag ? count - f * frag : frag;
            rc = (gets ? MPI_Isend : MPI_Issend)((const char *)send + f * frag * es, (int)len, t, q,
                                                 TAG(m, DIRECT), m->comm, &reqs[k++]);
        }
    }
    accel__mpi_unlock();
    /* What was posted completes before its buffers go, even when a later post failed. */
    accel_status st = accel__mpi_waitall(m, k, reqs, m->pipe_rx, "exchange step");
    if (rc != MPI_SUCCESS) {
        return accel__mpi_fail(m, rc, "exchange step");
    }
    ACCEL_TRY(st);
    if (gets) {
        accel__reduce(dt, rop, recv, NULL, m->ins, n, count, n);
    }
    return ACCEL_OK;
}

/* ---- the pipelined path ---- */

#define SCATTER (-2) /* pipelined's root for a reduce_scatter: the reduced chunk stays here */
#define MAX_SEGS 256 /* segments per chunk at most (larger segments beyond): bounded requests */

/* The requests of segment k, in the order they are waited for: receives of the inputs, sends
 * of this process's inputs, receives of the reduced chunks, sends of its reduced chunk; n of
 * each (one per process, MPI_REQUEST_NULL for itself and for empty messages). */
enum { IN_RECV, IN_SEND, OUT_RECV, OUT_SEND, N_KINDS };

/* Elements in segment k of a chunk of cnt elements cut in segments of seg (0 past its end). */
static size_t seg_len(size_t cnt, size_t seg, size_t k)
{
    return k * seg >= cnt ? 0 : cnt - k * seg < seg ? cnt - k * seg : seg;
}

/* One pipelined collective's layout: chunk q is m->counts[q] elements at m->displs[q]. */
typedef struct pipe {
    MPI_Datatype t;
    size_t es, seg, n_seg;
    MPI_Request *reqs;
    accel__mpi_rx *rx;
} pipe;

static size_t req_at(const accel__mpi *m, size_t k, int kind, int q)
{
    return (k * N_KINDS + (size_t)kind) * (size_t)m->n_ranks + (size_t)q;
}

/* Posts request `kind` of segment k with process q: a receive of len elements into recv_to when
 * it is not NULL, else a send of len elements from `from`; nothing when len is 0. */
static int post(accel__mpi *m, const pipe *p, size_t k, int kind, int q, size_t len, char *recv_to,
                const char *from, int tag)
{
    if (len == 0) {
        return MPI_SUCCESS;
    }
    const size_t i = req_at(m, k, kind, q);
    if (recv_to != NULL) {
        return accel__mpi_irecv(m, recv_to, (int)len, p->t, p->es, q, tag, &p->reqs[i], &p->rx[i]);
    }
    return MPI_Isend(from, (int)len, p->t, q, tag, m->comm, &p->reqs[i]);
}

/* The receives of segment k of every input's chunk `me` (per elements) into tmp. Caller holds
 * the MPI lock. */
static int post_in_recvs(accel__mpi *m, const pipe *p, size_t k, size_t per, char *tmp)
{
    const int n = m->n_ranks, me = m->rank;
    int rc = MPI_SUCCESS;
    for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
        const int q = (me + n - i) % n;
        rc = post(m, p, k, IN_RECV, q, seg_len(per, p->seg, k),
                  tmp + ((size_t)q * per + k * p->seg) * p->es, NULL, TAG(m, SCATTER));
    }
    return rc;
}

/* The receives of every reduced chunk into recv. Caller holds the MPI lock. */
static int post_out_recvs(accel__mpi *m, const pipe *p, char *recv)
{
    const int n = m->n_ranks, me = m->rank;
    int rc = MPI_SUCCESS;
    for (size_t k = 0; k < p->n_seg && rc == MPI_SUCCESS; k++) {
        for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
            const int q = (me + n - i) % n;
            const size_t len = seg_len((size_t)m->counts[q], p->seg, k);
            rc = post(m, p, k, OUT_RECV, q, len, recv + ((size_t)m->displs[q] + k * p->seg) * p->es,
                      NULL, TAG(m, GATHER));
        }
    }
    return rc;
}

/*
 * The pipelined path (see the top of this file) over the chunks m->counts / m->displs (each at
 * most INT_MAX elements) of send: this process reduces chunk `me` of every input, in rank order,
 * into `mine`, and sends it on: to every process (root -1, allreduce: recv gets every chunk), to
 * the root (root >= 0, reduce: only the root's recv is written), or nowhere (root SCATTER,
 * reduce_scatter). tmp holds n_ranks x m->counts[me] elements. send may equal recv (in place).
 */
static accel_status pipelined(accel__mpi *m, accel_dtype dt, accel_reduce_op rop, const char *send,
                              char *recv, char *mine, int root, char *tmp)
{
    const int n = m->n_ranks, me = m->rank;
    const size_t per = (size_t)m->counts[me];
    size_t most = 0;
    for (int q = 0; q < n; q++) {
        most = (size_t)m->counts[q] > most ? (size_t)m->counts[q] : most;
    }
    pipe p = {.t = accel__mpi_type(dt), .es = accel_dtype_nbytes(dt)};
    p.seg = SEG_NBYTES / p.es;
    p.seg = (most + MAX_SEGS - 1) / MAX_SEGS > p.seg ? (most + MAX_SEGS - 1) / MAX_SEGS : p.seg;
    p.n_seg = (most + p.seg - 1) / p.seg;
    const size_t n_req = p.n_seg * N_KINDS * (size_t)n;
    if ((p.reqs = pipe_reqs(m, n_req)) == NULL) {
        return ACCEL_ENOMEM;
    }
    p.rx = m->pipe_rx;
    /* gathers: the reduced chunks come here. In place, chunk q of recv is this process's input
     * to q until that send completes: their receives wait until then. */
    const int gathers = root == -1 || root == me, late = gathers && send == recv;
    int rc = MPI_SUCCESS;
    accel__mpi_lock();
    /* Receives first (the first RECV_AHEAD segments' inputs), then sends, each in segment
     * order and starting with a different process on each process. */
    for (size_t k = 0; k < RECV_AHEAD && k < p.n_seg && rc == MPI_SUCCESS; k++) {
        rc = post_in_recvs(m, &p, k, per, tmp);
    }
    if (gathers && !late && rc == MPI_SUCCESS) {
        rc = post_out_recvs(m, &p, recv);
    }
    for (size_t k = 0; k < p.n_seg && rc == MPI_SUCCESS; k++) {
        for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
            const int q = (me + i) % n;
            const size_t len = seg_len((size_t)m->counts[q], p.seg, k);
            rc = post(m, &p, k, IN_SEND, q, len, NULL,
                      send + ((size_t)m->displs[q] + k * p.seg) * p.es, TAG(m, SCATTER));
        }
    }
    accel__mpi_unlock();
    accel_status st = ACCEL_OK;
    for (size_t k = 0; k < p.n_seg && rc == MPI_SUCCESS && st == ACCEL_OK; k++) {
        const size_t len = seg_len(per, p.seg, k);
        const size_t at = req_at(m, k, IN_RECV, 0);
        st = accel__mpi_waitall(m, n, p.reqs + at, p.rx + at, "reduce-scatter step");
        if (st != ACCEL_OK) {
            continue;
        }
        if (k + RECV_AHEAD < p.n_seg) {
            accel__mpi_lock();
            rc = post_in_recvs(m, &p, k + RECV_AHEAD, per, tmp);
            accel__mpi_unlock();
        }
        if (len == 0 || rc != MPI_SUCCESS) {
            continue;
        }
        for (int q = 0; q < n; q++) {
            m->ins[q] = q == me ? send + ((size_t)m->displs[me] + k * p.seg) * p.es
                                : tmp + ((size_t)q * per + k * p.seg) * p.es;
        }
        char *out = mine + k * p.seg * p.es;
        accel__reduce(dt, rop, out, NULL, m->ins, n, len, n);
        accel__mpi_lock();
        for (int i = 1; i < n && rc == MPI_SUCCESS && root != SCATTER; i++) {
            const int q = (me + i) % n;
            if (root < 0 || q == root) {
                rc = post(m, &p, k, OUT_SEND, q, len, NULL, out, TAG(m, GATHER));
            }
        }
        accel__mpi_unlock();
    }
    for (size_t k = 0; late && k < p.n_seg && rc == MPI_SUCCESS && st == ACCEL_OK; k++) {
        const size_t at = req_at(m, k, IN_SEND, 0);
        st = accel__mpi_waitall(m, n, p.reqs + at, NULL, "reduce-scatter step");
    }
    if (late && rc == MPI_SUCCESS && st == ACCEL_OK) {
        accel__mpi_lock();
        rc = post_out_recvs(m, &p, recv);
        accel__mpi_unlock();
    }
    /* What was posted completes before its buffers go, even when a later post failed (after a
     * failed wait the endpoint is broken and keeps its buffers). */
    for (size_t k = 0; k < p.n_seg && st == ACCEL_OK; k++) {
        const size_t at = req_at(m, k, 0, 0);
        st = accel__mpi_waitall(m, N_KINDS * n, p.reqs + at, p.rx + at,
                                root == SCATTER ? "reduce-scatter step"
                                : root < 0      ? "allgather step"
                                                : "gather step");
    }
    if (rc != MPI_SUCCESS) {
        return accel__mpi_fail(m, rc, "posting a message");
    }
    return st;
}

/* ALLREDUCE (root < 0) or REDUCE of one slice, wire dtype included. */
static accel_status reduce_slice(accel__mpi *m, const accel__coll *op, const char *send, char *recv,
                                 size_t count, int root)
{
    const int n = m->n_ranks, me = m->rank;
    const accel_dtype dt = op->wire != ACCEL_F32 ? op->wire : op->dtype;
    const size_t es = accel_dtype_nbytes(dt), per = count / (size_t)n + (count % (size_t)n != 0);
    const int small = count * es * (size_t)(n - 1) <= DIRECT_NBYTES;
    /* Scratch: the wire copy, then what the path needs (direct: every input; pipelined: the
     * received chunks and, off the root of a reduce, this process's reduced chunk). */
    const size_t wire_nbytes = op->wire != ACCEL_F32 ? count * es : 0;
    const size_t need = small ? (size_t)n * count * es : (size_t)(n + 1) * per * es;
    char *scratch = accel__mpi_scratch(m, wire_nbytes + need);
    if (scratch == NULL) {
        return ACCEL_ENOMEM;
    }
    char *out = recv, *tmp = scratch + wire_nbytes;
    if (wire_nbytes > 0) {
        /* Compress here, move and reduce 16-bit elements, decompress: accel__reduce_wire's
         * bits (each input rounded, f32 accumulation, one rounding) with half the bytes. */
        ACCEL_TRY(accel_convert(scratch, dt, send, ACCEL_F32, count));
        send = out = scratch;
    }
    if (small) {
        ACCEL_TRY(direct(m, dt, op->op, send, out, count, root, tmp));
    } else {
        for (int q = 0; q < n; q++) {
            size_t off, cnt;
            accel__chunk_range(count, n, q, &off, &cnt);
            m->counts[q] = (int)cnt;
            m->displs[q] = (int)off;
        }
        char *mine =
            root < 0 || me == root ? out + (size_t)m->displs[me] * es : tmp + (size_t)n * per * es;
        ACCEL_TRY(pipelined(m, dt, op->op, send, out, mine, root, tmp));
    }
    if (wire_nbytes > 0 && (root < 0 || me == root)) {
        ACCEL_TRY(accel_convert(recv, ACCEL_F32, scratch, dt, count));
    }
    return ACCEL_OK;
}

static accel_status reduce_scatter(accel__mpi *m, const accel__coll *op)
{
    const int n = m->n_ranks;
    const size_t es = accel_dtype_nbytes(op->dtype), count = op->count;
    char *tmp = accel__mpi_scratch(m, (size_t)n * count * es);
    if (tmp == NULL) {
        return ACCEL_ENOMEM;
    }
    for (int q = 0; q < n; q++) {
        m->counts[q] = (int)count;
        m->displs[q] = (int)((size_t)q * count);
    }
    return pipelined(m, op->dtype, op->op, op->send, NULL, op->recv, SCATTER, tmp);
}

/* ---- the collectives that only move data ---- */

/* Blocks of buf (process q's: m->counts[q] elements at m->displs[q]) to every process in one
 * round of messages: every process sends its block to every other and receives theirs in place
 * (an allgather; MPI's MPI_Iallgather ran at a third to a half of MPI_Allgather's speed). With
 * root >= 0, root holds every block already: it receives nothing, and nobody sends to it (the
 * second step of a broadcast). `mine` is where this process's block comes from: its place in
 * buf, or the caller's input, which is then copied into its place once the messages are posted,
 * while peers read them. Peers reading (process_vm_readv, Open MPI's shared-memory transport) a
 * copy this process had just written took 3-4 times MPI_Allgather's time at 256 KiB-4 MiB in
 * most runs (0.21-0.30 of it; from the input 0.94-1.05).
 *
 * A process that only sends in a call (here a broadcast's root, a reduce's and a gather's
 * other processes) sends synchronously (MPI_Issend: complete once the receive matched): an
 * eager send would let it finish a call that no peer made, and the peer's next call declared
 * the same way would take that stale message. Every other process receives in every call, so
 * it cannot finish one that its peers did not make. */
static accel_status exchange_blocks(accel__mpi *m, MPI_Datatype t, size_t es, const char *mine,
                                    char *buf, int root)
{
    const int n = m->n_ranks, me = m->rank;
    char *place = buf + (size_t)m->displs[me] * es;
    int k = 0, rc = MPI_SUCCESS;
    accel__mpi_lock();
    for (int i = 1; i < n && rc == MPI_SUCCESS && me != root; i++) {
        const int q = (me + n - i) % n;
        if (m->counts[q] > 0) {
            rc = accel__mpi_irecv(m, buf + (size_t)m->displs[q] * es, m->counts[q], t, es, q,
                                  TAG(m, BLOCK), &m->reqs[k], &m->req_rx[k]);
            k++;
        }
    }
    for (int i = 1; i < n && rc == MPI_SUCCESS && m->counts[me] > 0; i++) {
        const int q = (me + i) % n;
        if (q != root) {
            m->req_rx[k].peer = -1;
            rc = (me == root ? MPI_Issend : MPI_Isend)(mine, m->counts[me], t, q, TAG(m, BLOCK),
                                                       m->comm, &m->reqs[k++]);
        }
    }
    accel__mpi_unlock();
    if (mine != place && rc == MPI_SUCCESS) {
        memcpy(place, mine, (size_t)m->counts[me] * es);
    }
    /* What was posted completes before its buffers go, even when a later post failed. */
    accel_status st = accel__mpi_waitall(m, k, m->reqs, m->req_rx, "exchange step");
    return rc != MPI_SUCCESS ? accel__mpi_fail(m, rc, "exchange step") : st;
}

/* The block goes out from send (exchange_blocks copies it into recv while peers read it). */
static accel_status allgather(accel__mpi *m, const accel__coll *op)
{
    const size_t es = accel_dtype_nbytes(op->dtype);
    for (int q = 0; q < m->n_ranks; q++) {
        m->counts[q] = (int)op->count;
        m->displs[q] = (int)((size_t)q * op->count);
    }
    return exchange_blocks(m, accel__mpi_type(op->dtype), es, op->send, op->recv, -1);
}

/* Broadcast of one slice: small messages, two processes, and every process on one machine, the
 * root sends the whole message to every process; larger ones across machines scatter then
 * exchange (every process gets chunk q from the root and passes it on: the root's link carries
 * the message once, not once per process). On one machine every receiver copies the message
 * from the root's buffer itself (process_vm_readv), all at once: flat took 0.4-0.45 of the
 * scatter's time at 256 KiB-4 MiB on 4 processes. The root sends from send and copies it into
 * recv while the first messages travel (see exchange_blocks()). */
static accel_status broadcast_slice(accel__mpi *m, const accel__coll *op, const char *send,
                                    char *recv, size_t count)
{
    const int n = m->n_ranks, me = m->rank, root = op->root;
    const size_t es = accel_dtype_nbytes(op->dtype), nb = count * es;
    const MPI_Datatype t = accel__mpi_type(op->dtype);
    const int flat = n == 2 || m->one_node || nb * (size_t)(n - 1) <= DIRECT_NBYTES;
    for (int q = 0; q < n; q++) {
        size_t off, cnt;
        accel__chunk_range(count, n, q, &off, &cnt);
        m->counts[q] = flat ? (q == root ? (int)count : 0) : (int)cnt;
        m->displs[q] = flat ? 0 : (int)off;
    }
    if (!flat) {
        /* The scatter: chunk q from the root to q. */
        int k = 0, rc = MPI_SUCCESS;
        accel__mpi_lock();
        for (int q = 0; q < n && rc == MPI_SUCCESS; q++) {
            const size_t at = (size_t)m->displs[q] * es;
            if (me == root && q != root && m->counts[q] > 0) {
                m->req_rx[k].peer = -1;
                rc = MPI_Issend(send + at, m->counts[q], t, q, TAG(m, BLOCK), m->comm,
                                &m->reqs[k++]);
            } else if (me != root && q == me && m->counts[q] > 0) {
                rc = accel__mpi_irecv(m, recv + at, m->counts[q], t, es, root, TAG(m, BLOCK),
                                      &m->reqs[k], &m->req_rx[k]);
                k++;
            }
        }
        accel__mpi_unlock();
        if (me == root && send != recv && rc == MPI_SUCCESS) {
            memcpy(recv, send, nb);
        }
        accel_status st = accel__mpi_waitall(m, k, m->reqs, m->req_rx, "scatter step");
        ACCEL_TRY(rc != MPI_SUCCESS ? accel__mpi_fail(m, rc, "scatter step") : st);
    }
    /* Scattered, the root's recv has its chunk by now. */
    const char *mine = me == root && flat ? send : recv;
    return exchange_blocks(m, t, es, mine + (size_t)m->displs[me] * es, recv, root);
}

/* GATHER: every other process sends its block to the root (synchronously: it only sends). Not
 * MPI_Igather: MPI's collectives cannot carry the call's fingerprint, and two of them called
 * differently are erroneous in MPI (a gather's receive may take a barrier's empty message). */
static accel_status gather(accel__mpi *m, const accel__coll *op)
{
    const int n = m->n_ranks, me = m->rank;
    const size_t es = accel_dtype_nbytes(op->dtype), nb = op->count * es;
    const MPI_Datatype t = accel__mpi_type(op->dtype);
    const int cnt = (int)op->count;
    int k = 0, rc = MPI_SUCCESS;
    if (me == op->root && (const char *)op->send != (char *)op->recv + (size_t)me * nb) {
        memcpy((char *)op->recv + (size_t)me * nb, op->send, nb);
    }
    accel__mpi_lock();
    for (int i = 1; i < n && rc == MPI_SUCCESS && me == op->root; i++) {
        const int q = (me + n - i) % n;
        rc = accel__mpi_irecv(m, (char *)op->recv + (size_t)q * nb, cnt, t, es, q, TAG(m, COLLECT),
                              &m->reqs[k], &m->req_rx[k]);
        k++;
    }
    if (me != op->root) {
        m->req_rx[k].peer = -1;
        rc = MPI_Issend(op->send, cnt, t, op->root, TAG(m, COLLECT), m->comm, &m->reqs[k++]);
    }
    accel__mpi_unlock();
    accel_status st = accel__mpi_waitall(m, k, m->reqs, m->req_rx, "gather");
    return rc != MPI_SUCCESS ? accel__mpi_fail(m, rc, "gather") : st;
}

/* BARRIER: the dissemination barrier (what MPI_Ibarrier runs), ceil(log2 n) rounds of empty
 * messages: in round r every process tells process me + 2^r and waits to hear from me - 2^r,
 * so after the last round every process has heard, through a chain, from every other. The
 * rounds' sources differ, so one tag serves them all. */
static accel_status barrier(accel__mpi *m)
{
    const int n = m->n_ranks, me = m->rank;
    for (int dist = 1; dist < n; dist *= 2) {
        const int to = (me + dist) % n, from = (me + n - dist) % n;
        m->reqs[0] = m->reqs[1] = MPI_REQUEST_NULL;
        m->req_rx[1].peer = -1;
        accel__mpi_lock();
        int rc = accel__mpi_irecv(m, NULL, 0, MPI_BYTE, 1, from, TAG(m, BARRIER), &m->reqs[0],
                                  &m->req_rx[0]);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Isend(NULL, 0, MPI_BYTE, to, TAG(m, BARRIER), m->comm, &m->reqs[1]);
        }
        accel__mpi_unlock();
        accel_status st = accel__mpi_waitall(m, 2, m->reqs, m->req_rx, "barrier");
        ACCEL_TRY(rc != MPI_SUCCESS ? accel__mpi_fail(m, rc, "barrier") : st);
    }
    return ACCEL_OK;
}

static accel_status run(accel__mpi *m, const accel__coll *op)
{
    if (op->kind == ACCEL__COLL_BARRIER || op->count == 0) {
        /* A count-0 call moves nothing, but still meets its peers: a barrier's rounds under its
         * own fingerprint (its kind and count 0 in the tag), which a peer at another call (the
         * same with count 5) never matches. Both then time out, each told that the other sent
         * a message of another call, instead of this one returning ACCEL_OK unseen. */
        return barrier(m);
    }
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
    case ACCEL__COLL_REDUCE:
    case ACCEL__COLL_BROADCAST: {
        /* Element-wise: slices of at most SLICE elements, one after the other. */
        const size_t es = accel_dtype_nbytes(op->dtype);
        const int root = op->kind == ACCEL__COLL_ALLREDUCE ? -1 : op->root;
        const char *send = op->send;
        char *recv = op->recv;
        for (size_t done = 0; done < op->count; done += SLICE) {
            const size_t cnt = op->count - done < SLICE ? op->count - done : SLICE;
            const size_t off = done * es;
            const char *s = send != NULL ? send + off : NULL;
            char *r = recv != NULL ? recv + off : NULL;
            ACCEL_TRY(op->kind == ACCEL__COLL_BROADCAST ? broadcast_slice(m, op, s, r, cnt)
                                                        : reduce_slice(m, op, s, r, cnt, root));
        }
        return ACCEL_OK;
    }
    default:
        if (op->count > (size_t)INT_MAX / (size_t)m->n_ranks) {
            return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                                 "mpi: %s of %zu elements per process: MPI counts are int (at "
                                 "most %d elements in all)",
                                 accel__coll_name(op->kind), op->count, INT_MAX);
        }
        return op->kind == ACCEL__COLL_REDUCE_SCATTER ? reduce_scatter(m, op)
               : op->kind == ACCEL__COLL_ALLGATHER    ? allgather(m, op)
                                                      : gather(m, op);
    }
}

accel_status accel__mpi_run(void *impl, const accel__coll *op)
{
    accel__mpi *m = impl;
    const double enter = accel__now();
    if (m->broken != ACCEL_OK) {
        return accel__seterr(NULL, m->broken, "%s", m->broken_msg);
    }
    m->cur = op;
    accel__mpi_fingerprint(m, op);
    accel_status st = ACCEL_OK;
    if (m->debug) {
        const accel__coll_decl d = accel__coll_declare(op);
        st = accel__mpi_check_call(m, &d);
    }
    if (st == ACCEL_OK) {
        st = run(m, op);
    }
    /* A peer abandons this call no sooner than the deadline after it entered it, which was
     * after it got this process's data of the previous call (sent once this process entered
     * that one, at prev_enter). Data read before half that deadline can't be an abandoned
     * buffer's; only a slower call asks MPI whether a notice came (an MPI_Test here costs up to
     * a fifth of a 4 MiB allreduce). */
    if (st == ACCEL_OK && accel__now() > m->prev_enter + 0.5 * m->timeout_s) {
        st = accel__mpi_check_abandoned(m, accel__coll_name(op->kind));
    }
    m->prev_enter = enter;
    m->cur = NULL;
    return st;
}
