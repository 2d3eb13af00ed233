/*
 * The mpi backend's private state, shared by mpi.c (MPI start and finish, communicators, waits
 * with deadlines, abort, split, plain symmetric memory) and mpi_coll.c (the collectives).
 * Compiled only when the build found MPI (ACCEL_MPI, CMakeLists.txt).
 */
#ifndef ACCEL_COMM_MPI_IMPL_H
#define ACCEL_COMM_MPI_IMPL_H

#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm/comm.h"

/* What a member tells its peers when it aborts the communicator (on the `ctl` communicator). */
typedef struct accel__mpi_note {
    int32_t rank;
    int32_t status;
    char msg[240];
} accel__mpi_note;

/* What a wait knows of each of its requests: the process a receive waits for (-1: a send, or
 * no request) and the bytes it expects, which the message must bring exactly (mpi_check.c). */
typedef struct accel__mpi_rx {
    int peer;
    int64_t nbytes;
} accel__mpi_rx;

/* One plain "symmetric" allocation (mpi has no shared memory: collectives copy). */
typedef struct accel__mpi_block {
    void *p;
    struct accel__mpi_block *next;
} accel__mpi_block;

typedef struct accel__mpi {
    MPI_Comm comm; /* the collectives: a private copy, never the program's MPI_COMM_WORLD */
    MPI_Comm ctl;  /* abort notices, so they never match a collective's messages */
    int rank, n_ranks;
    int one_node; /* every process on one machine (the job's layout): a message is one copy */
    double timeout_s;
    double prev_enter; /* when this process entered its previous collective (or made this one) */
    accel__log_ctx log;
    MPI_Request abort_rx; /* always posted: a peer's notice ends every wait here */
    accel__mpi_note rx_note, tx_note;
    MPI_Request *abort_tx; /* n_ranks sends of tx_note, MPI_REQUEST_NULL when none */
    _Atomic int aborted;   /* this member aborted, or heard a peer's notice */
    int peer_note;         /* rx_note holds a peer's notice */
    int stuck;             /* a request never completed: MPI objects must leak at destroy */
    char *scratch;         /* grows to the largest need; no allocation in the steady state */
    size_t scratch_nbytes;
    int *counts, *displs;   /* n_ranks each: the per-process chunks of the pipelined path */
    const void **ins;       /* n_ranks operands of a local reduction */
    MPI_Request *reqs;      /* 2 * n_ranks: the small-message exchange's sends and receives */
    accel__mpi_rx *req_rx;  /* for each of reqs: whose message a receive waits for, its bytes */
    MPI_Request *pipe_reqs; /* pipe_n each, grow-only: the pipelined path's requests */
    accel__mpi_rx *pipe_rx; /* and what each receive waits for */
    size_t pipe_n;
    MPI_Status *statuses; /* max(2 * n_ranks, pipe_n): a wait's, for the received sizes */
    size_t statuses_n;
    accel__mpi_block *blocks;
    const accel__coll *cur; /* the collective running (named in messages), or NULL */
    /* The call check (mpi_check.c). Every message of a collective carries its fingerprint in
     * its tag: call_tag | ACCEL__MPI_MSG_*. tag_bits: the tag bits MPI gives (MPI_TAG_UB). */
    int tag_bits;
    int call_tag;
    int debug;               /* ACCELERATE_DEBUG_MODE: every call exchanges its declaration */
    accel__coll_decl *decls; /* n_ranks: the declarations exchanged (debug mode) */
    accel_status broken;     /* a mismatch the declarations showed: every later call fails */
    char broken_msg[ACCEL__ERRMSG_NBYTES];
} accel__mpi;

/* ---- the call check (mpi_check.c) ----
 *
 * A tag is [fingerprint of the call's declaration | call kind | message kind]: the low
 * MSG_BITS say which message of a collective it is, the next KIND_BITS the collective, the rest
 * (as many as MPI_TAG_UB allows) a hash of its count, total, dtype, op, root and wire. Messages
 * of calls declared differently never match, so a mismatched call cannot take another call's
 * data: it waits until the deadline. Tag 0 is the declaration exchange of debug mode. */
enum {
    ACCEL__MPI_MSG_DECLARE, /* debug mode's declarations (tag 0, whatever the call) */
    ACCEL__MPI_MSG_DIRECT,  /* the direct path's inputs */
    ACCEL__MPI_MSG_SCATTER, /* the pipelined path's first step: chunk q of every input to q */
    ACCEL__MPI_MSG_GATHER,  /* its second: the reduced chunks back */
    ACCEL__MPI_MSG_BLOCK,   /* allgather's and broadcast's blocks */
    ACCEL__MPI_MSG_COLLECT, /* gather's blocks to the root */
    ACCEL__MPI_MSG_BARRIER  /* a barrier's rounds */
};
#define ACCEL__MPI_MSG_BITS 3
#define ACCEL__MPI_KIND_BITS 3
/* Reads MPI_TAG_UB (m->tag_bits) and allocates m->decls: at endpoint creation. */
accel_status accel__mpi_check_setup(accel__mpi *m);
/* m->call_tag for op: its fingerprint and kind, the message kind bits 0. */
void accel__mpi_fingerprint(accel__mpi *m, const accel__coll *op);
/* Debug mode: every member sends every other its declaration d and compares them all; a
 * difference is ACCEL_EINVAL on every member with the same message naming two calls, before any
 * data moves (and every later call fails alike, but for two allocations of different sizes). */
accel_status accel__mpi_check_call(accel__mpi *m, const accel__coll_decl *d);
/* After a wait's requests completed (rc: MPI_Testall's; m->statuses hold theirs): 1 when a
 * receive's message was not the bytes it expects (shorter, or longer: MPI's truncation), with
 * "process 1 sent 2400 bytes where this call expects 4000" in buf; else 0. Two calls whose
 * fingerprints collide meet in one tag; unless their messages are the same size, this tells
 * them apart. */
int accel__mpi_check_sizes(accel__mpi *m, int n, const accel__mpi_rx *rx, int rc, char *buf,
                           size_t nbytes);
/* Tests only (tests/mpi/mpi_mismatch.c, linked to the static library): when set, every call's
 * fingerprint is hook(its declaration, the fingerprint computed), so a test can make two calls
 * collide on purpose. Set before any communicator exists; NULL in every program but that one. */
extern uint64_t (*accel__mpi_fingerprint_hook)(const accel__coll_decl *d, uint64_t fp);
/* After a timeout: "; process 1 sent a message of another call (barrier): ..." when a peer's
 * first unreceived message carries another call's tag, else "". Caller holds the MPI lock. */
void accel__mpi_foreign_hint(accel__mpi *m, char *buf, size_t nbytes);

/* The MPI datatype that moves elements of dt (a named type, or a committed contiguous byte
 * type for the formats MPI lacks: F16, BF16, the F8s). */
MPI_Datatype accel__mpi_type(accel_dtype dt);

/* After a collective's messages completed: ACCEL_OK, or the abort error when a peer's notice
 * has arrived. A peer that gave up on the call (its deadline) sends its notice before
 * returning, and its user may then free or reuse a buffer that Open MPI still reads a large
 * message from (from the peer's memory, after the fact): data from a call a peer abandoned is
 * refused, never returned as a result. */
accel_status accel__mpi_check_abandoned(accel__mpi *m, const char *what);
/* Waits for *req until the communicator's deadline, progressing MPI and watching for aborts.
 * `what` names the call in messages (with m->cur, the step of that collective). Errors: EPEER (an
 * MPI error, or a peer's abort notice), ETIMEDOUT (then the peers are sent an abort notice naming
 * this process). */
accel_status accel__mpi_wait(accel__mpi *m, MPI_Request *req, const char *what);
/* The same for n requests at once (all must complete). rx: NULL, or for each request the
 * process whose message it receives (-1: a send) and the bytes it expects: a timeout names those
 * that sent nothing, and a message of another size (two calls whose fingerprints collide) is
 * ACCEL_EINVAL naming the peer and both sizes, which breaks the endpoint as a mismatch does
 * (every later call fails) and tells the peers (their waits end with it). n is at most
 * m->statuses_n when rx is not NULL. */
accel_status accel__mpi_waitall(accel__mpi *m, int n, MPI_Request *reqs, const accel__mpi_rx *rx,
                                const char *what);
/* MPI_Irecv of count elements of t (es bytes each) from q into buf, noting in *rx what it
 * waits for. Caller holds the MPI lock. */
static inline int accel__mpi_irecv(accel__mpi *m, void *buf, int count, MPI_Datatype t, size_t es,
                                   int q, int tag, MPI_Request *req, accel__mpi_rx *rx)
{
    rx->peer = q;
    rx->nbytes = (int64_t)count * (int64_t)es;
    return MPI_Irecv(buf, count, t, q, tag, m->comm, req);
}

/* An MPI return code as an accel error naming the call and this process (EPEER). */
accel_status accel__mpi_fail(accel__mpi *m, int rc, const char *what);

/* Scratch of at least nbytes, or NULL (the error set). */
char *accel__mpi_scratch(accel__mpi *m, size_t nbytes);

/* Serialises accel's MPI calls when MPI was started below MPI_THREAD_MULTIPLE (by the program);
 * no-ops otherwise. */
void accel__mpi_lock(void);
void accel__mpi_unlock(void);

/* One collective (accel__comm_ops.run), in mpi_coll.c. */
accel_status accel__mpi_run(void *impl, const accel__coll *op);

#endif /* ACCEL_COMM_MPI_IMPL_H */
