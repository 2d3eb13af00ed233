/*
 * What the emulator's NCCL files share (private to tests/cuemu): nccl.c (the API, communicators,
 * the segment, groups), nccl_coll.c (the collectives' data path through the slots) and
 * nccl_worker.c (non-blocking communicators: a worker thread each). See nccl.c's comment.
 */
#ifndef ACCEL_CUEMU_NCCL_EMU_H
#define ACCEL_CUEMU_NCCL_EMU_H

#include <stdatomic.h>
#include <stddef.h>

#include <nccl.h>

#define SLOT_NBYTES ((size_t)4 << 20)
#define MAX_RANKS 64
#define MAX_QUEUED 256 /* calls in one group */

typedef struct seg_hdr {
    _Atomic unsigned count, gen; /* the barrier */
    _Atomic int aborted;         /* a member aborted */
    _Atomic int more[MAX_RANKS]; /* point-to-point rounds: member r has messages left */
} seg_hdr;

struct ncclComm {
    int rank, n;
    int dead;            /* destroyed: every later call is ncclInvalidArgument */
    _Atomic int aborted; /* this process aborted it */
    ncclResult_t failed; /* the first failure: later calls report it */
    seg_hdr *h;          /* the segment (n > 1) or private memory (n = 1) */
    char *slots;         /* n slots of SLOT_NBYTES after the header */
    size_t map_nbytes;
    unsigned n_splits; /* children made, for their segments' names */
    _Atomic int polled; /* ncclCommGetAsyncError was called since the last split was issued */
    char name[96];
    char last[256];
    struct worker *w; /* non-blocking: the thread that runs its calls; NULL: blocking */
};

typedef enum { K_ALLREDUCE, K_REDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST } coll_kind;

typedef struct coll {
    coll_kind kind;
    const char *fn;
    const char *send;
    char *recv;
    size_t count; /* elements: per rank for reduce_scatter's output and allgather's input */
    ncclDataType_t t;
    ncclRedOp_t op;
    int root;
    ncclComm_t c;
} coll;

typedef struct p2p {
    ncclComm_t c;
    int is_send, peer;
    char *buf;
    size_t nbytes, done;
    int complete;
} p2p;

static inline char *slot(ncclComm_t c, int r)
{
    return c->slots + (size_t)r * SLOT_NBYTES;
}

/* nccl.c */
/* Records the failure of fn (on c, or the thread when c is NULL: ncclGetLastError), prints it,
 * makes it c's lasting failure unless r is ncclInvalidArgument; returns r. */
ncclResult_t cuemu_nccl_fail(ncclComm_t c, ncclResult_t r, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Bytes of one element of t; 0 for the types accel moves as bytes (fp8). */
size_t cuemu_nccl_type_nbytes(ncclDataType_t t);
/* Waits until every rank of c has arrived (or an abort, or ACCEL_CUEMU_NCCL_TIMEOUT_S). */
ncclResult_t cuemu_nccl_barrier(ncclComm_t c, const char *fn);
/* Maps c's segment (by name) and waits for the others: c->n, rank and name are set. */
ncclResult_t cuemu_nccl_attach(ncclComm_t c, const char *fn);
/* A split's exchange through comm: the child's size, this rank in it, the split's number. */
ncclResult_t cuemu_nccl_split_exchange(ncclComm_t comm, int color, int key, int *n, int *rank,
                                       unsigned *k);
/* Runs a group's calls (n_colls collectives, then n_msgs messages) on this thread. */
ncclResult_t cuemu_nccl_run_queued(const coll *colls, int n_colls, const p2p *msgs, int n_msgs);

/* nccl_coll.c: one collective, in chunks of a slot, between barriers. */
ncclResult_t cuemu_nccl_run_coll(const coll *k);

/* nccl_worker.c: a non-blocking communicator's worker. Each submit hands a call to it and
 * returns ncclInProgress, c's state until the call is done (then its result). */
ncclResult_t cuemu_nccl_worker_start(ncclComm_t c, const char *fn);
void cuemu_nccl_worker_stop(ncclComm_t c); /* joins it (an aborted call ends at once) */
ncclResult_t cuemu_nccl_state(ncclComm_t c);
/* ncclInvalidArgument (not lasting, as NCCL's) while c's previous call is in progress, else
 * ncclSuccess. */
ncclResult_t cuemu_nccl_idle(ncclComm_t c, const char *fn);
ncclResult_t cuemu_nccl_submit_init(ncclComm_t c);
ncclResult_t cuemu_nccl_submit_coll(const coll *k);
ncclResult_t cuemu_nccl_submit_group(ncclComm_t c, const coll *colls, int n_colls, const p2p *msgs,
                                     int n_msgs);
/* child: made by the caller (its worker started), set up by comm's worker, which writes it to
 * *newcomm when done (NULL: no color). */
ncclResult_t cuemu_nccl_submit_split(ncclComm_t comm, int color, int key, ncclComm_t child,
                                     ncclComm_t *newcomm);
ncclResult_t cuemu_nccl_submit_nop(ncclComm_t c);

#endif /* ACCEL_CUEMU_NCCL_EMU_H */
