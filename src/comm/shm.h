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

typedef struct accel__shm {
    int rank, n_ranks;
    double timeout_s;
    double spin_s;         /* ACCEL_SHM_SPIN_US */
    size_t oneshot_nbytes; /* ACCEL_SHM_ONESHOT_NBYTES */
    size_t slot_nbytes;    /* bytes of one data slot (each rank has two) */
    /* ACCEL_SHM_NT_NBYTES: from this message size on, outputs are written with streaming
     * stores (they exceed the cache anyway; skipping the read-for-ownership saves a third of
     * the memory traffic). */
    size_t nt_nbytes;
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

/* Data slot `parity` (0/1) of `rank`: slot_nbytes bytes, 64-byte aligned. */
static inline char *accel__shm_slot(const accel__shm *s, int rank, uint64_t parity)
{
    return s->data + ((size_t)rank * 2 + (size_t)(parity & 1)) * s->slot_nbytes;
}

#endif /* ACCEL_COMM_SHM_H */
