/*
 * The mpi backend's collectives: each posts nonblocking MPI calls and waits for them with the
 * communicator's deadline (accel__mpi_wait), on the front end's progress thread.
 *
 * Reductions give the bits every accel backend gives (inputs combined in rank order, 16-bit and
 * 8-bit floats accumulated in f32 and rounded once), which MPI's own algorithms do not promise:
 * they group operands their own way, and a user op on 16-bit data rounds at every combine. So:
 *  - MPI's built-in op where grouping cannot change the bits: integers (SUM/PROD wrap, MAX/MIN),
 *    BOOL (logical or / and), and F32/F64 SUM/PROD/AVG on two processes (one combine, and
 *    IEEE addition and multiplication commute exactly); AVG divides afterwards as the kernel.
 *  - Our user-defined op (accel's kernel, f32 accumulation) on two processes for the narrow
 *    floats and float MAX/MIN, whose ties (+0 / -0, NaN) depend on operand order: MPI keeps
 *    the order of a non-commutative op, and two processes combine each element once.
 *  - Everything else (floats on three or more processes, integer AVG): the ordered path. An
 *    all-to-all hands process q chunk q of every input, q reduces it with accel's kernel in rank
 *    order, and an allgather (allreduce) or gather (reduce) returns the chunks: the bytes a ring
 *    all-reduce moves, in two steps.
 *  - Small messages ((n_ranks - 1) x bytes <= 64 KiB), whatever the op: the direct path, one
 *    round of point-to-point messages carrying every input to every process, each reducing
 *    them in rank order: one message latency, where a nonblocking collective runs a
 *    multi-step schedule (latency is what counts at these sizes).
 */
#include <limits.h>
#include <string.h>

#include "base/base.h"
#include "comm/reduce.h"
#include "mpi_impl.h"

/* Elements per MPI call of an element-wise collective (MPI counts are int). */
#define SLICE ((size_t)1 << 30)

static accel_status posted(accel__mpi *m, int rc, MPI_Request *req, const char *what)
{
    return rc == MPI_SUCCESS ? accel__mpi_wait(m, req, what) : accel__mpi_fail(m, rc, what);
}

/* MPI's op giving accel's bits for (dt, op) on this communicator, or MPI_OP_NULL (ordered path).
 * *divide: the result is a sum still to be divided by the process count (AVG). */
static MPI_Op native_op(const accel__mpi *m, accel_dtype dt, accel_reduce_op op, int *divide)
{
    static const MPI_Op int_ops[] = {MPI_SUM, MPI_OP_NULL, MPI_MAX, MPI_MIN, MPI_PROD};
    *divide = 0;
    switch (dt) {
    case ACCEL_I8:
    case ACCEL_U8:
    case ACCEL_I16:
    case ACCEL_U16:
    case ACCEL_I32:
    case ACCEL_I64:
        return int_ops[op];
    case ACCEL_BOOL:
        return op == ACCEL_SUM || op == ACCEL_MAX ? MPI_LOR : MPI_LAND;
    case ACCEL_F32:
    case ACCEL_F64:
        if (m->n_ranks != 2) {
            return MPI_OP_NULL;
        }
        if (op == ACCEL_SUM || op == ACCEL_AVG || op == ACCEL_PROD) {
            *divide = op == ACCEL_AVG;
            return op == ACCEL_PROD ? MPI_PROD : MPI_SUM;
        }
        return accel__mpi_user_op(op);
    case ACCEL_F16:
    case ACCEL_BF16:
    case ACCEL_F8_E4M3:
    case ACCEL_F8_E5M2:
        return m->n_ranks == 2 ? accel__mpi_user_op(op) : MPI_OP_NULL;
    default:
        return MPI_OP_NULL;
    }
}

/* The ordered path over `count` (<= SLICE) elements of dt at send: recv gets the reduction
 * everywhere (root < 0) or at root. tmp holds n_ranks * ceil(count / n_ranks) + that many
 * elements again. send may equal recv. */
static accel_status ordered(accel__mpi *m, accel_dtype dt, accel_reduce_op rop, const void *send,
                            void *recv, size_t count, int root, char *tmp)
{
    const int n = m->n_ranks, me = m->rank;
    const size_t es = accel_dtype_nbytes(dt);
    const MPI_Datatype t = accel__mpi_type(dt);
    for (int q = 0; q < n; q++) {
        size_t off, cnt;
        accel__chunk_range(count, n, q, &off, &cnt);
        m->counts[q] = (int)cnt;
        m->displs[q] = (int)off;
    }
    const size_t mine = (size_t)m->counts[me];
    for (int q = 0; q < n; q++) {
        m->rcounts[q] = (int)mine;
        m->rdispls[q] = (int)((size_t)q * mine);
        m->ins[q] = tmp + (size_t)q * mine * es;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    accel__mpi_lock();
    int rc = MPI_Ialltoallv(send, m->counts, m->displs, t, tmp, m->rcounts, m->rdispls, t, m->comm,
                            &req);
    accel__mpi_unlock();
    ACCEL_TRY(posted(m, rc, &req, "all-to-all step"));
    const int here = root < 0 || me == root;
    char *out = here ? (char *)recv + (size_t)m->displs[me] * es : tmp + (size_t)n * mine * es;
    accel__reduce(dt, rop, out, NULL, m->ins, n, mine, n);
    accel__mpi_lock();
    if (root < 0) {
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, t, recv, m->counts, m->displs, t, m->comm, &req);
    } else {
        rc = MPI_Igatherv(here ? MPI_IN_PLACE : out, (int)mine, t, recv, m->counts, m->displs, t,
                          root, m->comm, &req);
    }
    accel__mpi_unlock();
    return posted(m, rc, &req, root < 0 ? "allgather step" : "gather step");
}

/* Small messages: every process sends its whole input to every other (to the root alone for a
 * reduce) and reduces all of them in rank order itself: one round of point-to-point messages
 * instead of a nonblocking collective's multi-step schedule, while the bytes stay few. */
#define DIRECT_NBYTES ((size_t)64 << 10) /* (n_ranks - 1) x message bytes at most */
#define DIRECT_TAG 7302

/* The direct path over count elements of dt; tmp holds n_ranks x count elements. */
static accel_status direct(accel__mpi *m, accel_dtype dt, accel_reduce_op rop, const void *send,
                           void *recv, size_t count, int root, char *tmp)
{
    const int n = m->n_ranks, me = m->rank;
    const size_t nb = count * accel_dtype_nbytes(dt);
    const MPI_Datatype t = accel__mpi_type(dt);
    const int gets = root < 0 || me == root;
    int k = 0, rc = MPI_SUCCESS;
    accel__mpi_lock();
    for (int q = 0; q < n && rc == MPI_SUCCESS; q++) {
        m->ins[q] = q == me ? send : tmp + (size_t)q * nb;
        if (q != me && gets) {
            m->req_peer[k] = q;
            rc = MPI_Irecv(tmp + (size_t)q * nb, (int)count, t, q, DIRECT_TAG, m->comm,
                           &m->reqs[k++]);
        }
    }
    for (int q = 0; q < n && rc == MPI_SUCCESS; q++) {
        if (q != me && (root < 0 || q == root)) {
            m->req_peer[k] = -1;
            rc = MPI_Isend(send, (int)count, t, q, DIRECT_TAG, m->comm, &m->reqs[k++]);
        }
    }
    accel__mpi_unlock();
    /* What was posted completes before its buffers go, even when a later post failed. */
    accel_status st = accel__mpi_waitall(m, k, m->reqs, m->req_peer, "exchange step");
    if (rc != MPI_SUCCESS) {
        return accel__mpi_fail(m, rc, "exchange step");
    }
    ACCEL_TRY(st);
    if (gets) {
        accel__reduce(dt, rop, recv, NULL, m->ins, n, count, n);
    }
    return ACCEL_OK;
}

/* ALLREDUCE (root < 0) or REDUCE of one slice, wire dtype included. */
static accel_status reduce_slice(accel__mpi *m, const accel__coll *op, const char *send, char *recv,
                                 size_t count, int root)
{
    const int n = m->n_ranks;
    const accel_dtype dt = op->wire != ACCEL_F32 ? op->wire : op->dtype;
    const size_t es = accel_dtype_nbytes(dt), per = count / (size_t)n + (count % (size_t)n != 0);
    const int small = count * es * (size_t)(n - 1) <= DIRECT_NBYTES;
    int divide = 0;
    const MPI_Op o = root < 0 && !small ? native_op(m, dt, op->op, &divide) : MPI_OP_NULL;
    /* Scratch: the wire copy, then what the path needs (direct: every input; ordered: the
     * received chunks and this process's reduced chunk). */
    const size_t wire_nbytes = op->wire != ACCEL_F32 ? count * es : 0;
    const size_t need = small ? (size_t)n * count * es : o == MPI_OP_NULL ? (n + 1) * per * es : 0;
    char *scratch = wire_nbytes + need > 0 ? accel__mpi_scratch(m, wire_nbytes + need) : NULL;
    if (wire_nbytes + need > 0 && scratch == NULL) {
        return ACCEL_ENOMEM;
    }
    char *out = recv, *tmp = scratch != NULL ? scratch + wire_nbytes : NULL;
    if (wire_nbytes > 0) {
        /* Compress here, move and reduce 16-bit elements, decompress: accel__reduce_wire's
         * bits (each input rounded, f32 accumulation, one rounding) with half the bytes. */
        ACCEL_TRY(accel_convert(scratch, dt, send, ACCEL_F32, count));
        send = out = scratch;
    }
    if (small) {
        ACCEL_TRY(direct(m, dt, op->op, send, out, count, root, tmp));
    } else if (o != MPI_OP_NULL) {
        MPI_Request req = MPI_REQUEST_NULL;
        accel__mpi_lock();
        int rc = MPI_Iallreduce(send == out ? MPI_IN_PLACE : send, out, (int)count,
                                accel__mpi_type(dt), o, m->comm, &req);
        accel__mpi_unlock();
        ACCEL_TRY(posted(m, rc, &req, accel__coll_name(op->kind)));
        if (divide) {
            const void *in[1] = {out};
            accel__reduce(dt, ACCEL_AVG, out, NULL, in, 1, count, n);
        }
    } else {
        ACCEL_TRY(ordered(m, dt, op->op, send, out, count, root, tmp));
    }
    if (wire_nbytes > 0 && (root < 0 || m->rank == root)) {
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
    const MPI_Datatype t = accel__mpi_type(op->dtype);
    MPI_Request req = MPI_REQUEST_NULL;
    accel__mpi_lock();
    int rc = MPI_Ialltoall(op->send, (int)count, t, tmp, (int)count, t, m->comm, &req);
    accel__mpi_unlock();
    ACCEL_TRY(posted(m, rc, &req, "all-to-all step"));
    for (int q = 0; q < n; q++) {
        m->ins[q] = tmp + (size_t)q * count * es;
    }
    accel__reduce(op->dtype, op->op, op->recv, NULL, m->ins, n, count, n);
    return ACCEL_OK;
}

/* ALLGATHER, GATHER, BARRIER: one MPI call each. */
static accel_status move(accel__mpi *m, const accel__coll *op)
{
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype);
    const MPI_Datatype t = accel__mpi_type(op->dtype);
    const int cnt = (int)op->count;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc;
    accel__mpi_lock();
    switch (op->kind) {
    case ACCEL__COLL_ALLGATHER: {
        const int inplace = (const char *)op->send == (char *)op->recv + (size_t)m->rank * nb;
        rc = MPI_Iallgather(inplace ? MPI_IN_PLACE : op->send, cnt, t, op->recv, cnt, t, m->comm,
                            &req);
        break;
    }
    case ACCEL__COLL_GATHER: {
        const int inplace = m->rank == op->root &&
                            (const char *)op->send == (char *)op->recv + (size_t)m->rank * nb;
        rc = MPI_Igather(inplace ? MPI_IN_PLACE : op->send, cnt, t, op->recv, cnt, t, op->root,
                         m->comm, &req);
        break;
    }
    default:
        rc = MPI_Ibarrier(m->comm, &req);
        break;
    }
    accel__mpi_unlock();
    return posted(m, rc, &req, accel__coll_name(op->kind));
}

static accel_status broadcast_slice(accel__mpi *m, const accel__coll *op, const char *send,
                                    char *recv, size_t count)
{
    const size_t nb = count * accel_dtype_nbytes(op->dtype);
    if (m->rank == op->root && send != recv) {
        memcpy(recv, send, nb);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    accel__mpi_lock();
    int rc = MPI_Ibcast(recv, (int)count, accel__mpi_type(op->dtype), op->root, m->comm, &req);
    accel__mpi_unlock();
    return posted(m, rc, &req, "broadcast");
}

static accel_status run(accel__mpi *m, const accel__coll *op)
{
    if (op->kind == ACCEL__COLL_BARRIER) {
        return move(m, op);
    }
    if (op->count == 0) {
        return ACCEL_OK; /* every process passed the same count: nothing to agree on */
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
        return op->kind == ACCEL__COLL_REDUCE_SCATTER ? reduce_scatter(m, op) : move(m, op);
    }
}

accel_status accel__mpi_run(void *impl, const accel__coll *op)
{
    accel__mpi *m = impl;
    m->cur = op;
    accel_status st = run(m, op);
    m->cur = NULL;
    return st;
}
