/*
 * The shared-memory transport under the shm backend (private to src/comm): one POSIX segment
 * per job holding a header, one cache line per rank and two data slots per rank, plus the sync
 * point that every algorithm in shm_coll.c is built from.
 */
#ifndef ACCEL_COMM_SHM_H
#define ACCEL_COMM_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

typedef struct accel__shm_header accel__shm_header;
typedef struct accel__shm_line accel__shm_line;

/* One symmetric allocation (accel__shm_alloc): the same size on every rank, each rank's part in
 * its own segment, every part mapped by every rank. */
typedef struct accel__shm_sym {
    uint64_t id;       /* the same on every rank: the id-th allocation of the communicator */
    size_t nbytes;     /* as requested */
    size_t map_nbytes; /* page-rounded */
    char **base;       /* n_ranks mappings; base[rank] is this rank's (the user's pointer) */
    struct accel__shm_sym *next;
} accel__shm_sym;

typedef struct accel__shm {
    int rank, n_ranks;
    double timeout_s;
    accel__log_ctx log;
    double spin_s;         /* ACCEL_SHM_SPIN_US */
    size_t oneshot_nbytes; /* ACCEL_SHM_ONESHOT_NBYTES */
    size_t slot_nbytes;    /* bytes of one data slot (each rank has two) */
    /* ACCEL_SHM_NT_NBYTES: from this message size on, outputs are written with streaming
     * stores (they exceed the cache anyway; skipping the read-for-ownership saves a third of
     * the memory traffic). */
    size_t nt_nbytes;
    /* ACCEL_SHM_ZEROCOPY_NBYTES: in-place messages larger than this whose buffers lie in one
     * symmetric allocation at the same offset everywhere skip the data slots. */
    size_t zc_nbytes;
    char name[128]; /* "/accel-<uid>-<job>" */

    void *base;
    size_t map_nbytes;
    accel__shm_header *hdr;
    accel__shm_line *lines;
    char *data;

    uint32_t step;    /* sync points passed by this rank (mirrors its progress word) */
    uint64_t n_slots; /* slots used so far: slot parity alternates per use */
    const char *what; /* the running collective, for messages */
    const void **in;  /* n_ranks input pointers for the reduce kernels */

    accel__shm_sym *syms; /* live symmetric allocations, newest first */
    uint64_t n_allocs;    /* allocations started: the next id is n_allocs + 1 */
    uint64_t n_descs;     /* zero-copy descriptors published (same count on every rank) */
    double next_nudge;    /* earliest time for the next move off a peer's CPU (shm.c) */
} accel__shm;

/* Creates (local rank 0) or opens (others) the job's segment and waits until every rank has
 * attached; then the name is unlinked so nothing remains in /dev/shm whatever happens next.
 * Every failure (timeout, mismatched settings) unlinks the name too. */
accel_status accel__shm_open(accel__shm **out, const accel__comm_config *cfg);
/* Unmaps and frees. Accepts NULL. */
void accel__shm_close(accel__shm *s);

/* Publishes "this rank passed sync point s->step + 1" and waits until every other rank has too.
 * Spins ACCEL_SHM_SPIN_US, then sleeps on a futex; every ~50 ms checks whether the ranks not yet
 * arrived are alive. Returns ACCEL_EPEER (a rank died: the whole job aborts) or ACCEL_ETIMEDOUT
 * (naming the ranks not arrived) with the message set. */
accel_status accel__shm_sync(accel__shm *s);

/* ACCEL_OK, or the job-wide abort (set by any rank) as an error with its message. */
accel_status accel__shm_check_abort(accel__shm *s);

/* Records a job-wide failure diagnosed here (st: ACCEL_EPEER, ACCEL_ETIMEDOUT or ACCEL_EINVAL for
 * "process `rank` called a different collective") and wakes every sleeper; the first diagnosis
 * wins. Every rank then fails its current or next call with accel__shm_check_abort. */
void accel__shm_abort(accel__shm *s, accel_status st, int rank);

/* Zero-copy descriptors in the control lines. put (before a collective's first sync) takes the
 * next of two copies by call parity; get (after that sync) reads `rank`'s copy of the same call.
 * Two copies because a peer may publish its next call's descriptor before this rank has read
 * the current one when the call has a single sync; it cannot get two calls ahead. */
typedef struct accel__shm_desc {
    uint64_t id, off, count; /* zero-copy descriptor: allocation id (0: none), byte offset */
} accel__shm_desc;
void accel__shm_put_desc(accel__shm *s, const accel__shm_desc *d);
void accel__shm_get_desc(const accel__shm *s, int rank, accel__shm_desc *d);
/* Allocation handshake words of the line: seq (allocation id), nbytes, and two phase statuses
 * (0 or a negative accel_status). */
void accel__shm_put_alloc(accel__shm *s, uint64_t seq, uint64_t nbytes, int phase, int status);
void accel__shm_get_alloc(const accel__shm *s, int rank, uint64_t *seq, uint64_t *nbytes,
                          int status[2]);

/* Symmetric allocation (collective; shm_sym.c): every rank calls it with the same nbytes; on
 * success *out is this rank's zero-filled, page-aligned part, and every rank can reach every
 * part through accel__shm_sym_find. Names are unlinked before it returns. */
accel_status accel__shm_alloc(accel__shm *s, size_t nbytes, void **out);
/* Local: unmaps this rank's view of the allocation starting at p. EINVAL if p is not one. */
accel_status accel__shm_free(accel__shm *s, void *p);
/* Unmaps every allocation (communicator teardown). */
void accel__shm_free_all(accel__shm *s);
/* The allocation holding [p, p + nbytes) in this rank's part, or NULL; *off = p - its base. */
accel__shm_sym *accel__shm_sym_find(const accel__shm *s, const void *p, size_t nbytes, size_t *off);

/* Zero-copy collectives run by this process so far (all communicators); for tests. */
uint64_t accel__shm_zero_copy_calls(void);

/* Data slot `parity` (0/1) of `rank`: slot_nbytes bytes, 64-byte aligned. */
static inline char *accel__shm_slot(const accel__shm *s, int rank, uint64_t parity)
{
    return s->data + ((size_t)rank * 2 + (size_t)(parity & 1)) * s->slot_nbytes;
}

#endif /* ACCEL_COMM_SHM_H */
