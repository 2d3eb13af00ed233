/*
 * The gloo backend's inside, shared by its two halves (private to src/comm/gloo): gloo.c sets up,
 * records failures and is the backend; gloo_coll.c runs the collectives, gloo_ring.c those that
 * ring.
 */
#ifndef ACCEL_COMM_GLOO_IMPL_H
#define ACCEL_COMM_GLOO_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/base.h"
#include "gloo.h"
#include "gloo_cxx.h"

struct accel__gloo {
    int rank, n_ranks;
    int *process; /* the job-wide process index of each rank, for messages */
    double timeout_s;
    accel__log_ctx log;
    accel__store *store;
    pthread_mutex_t mu; /* the failure record and the store (abort may come from any thread) */
    char prefix[400];
    char listen[128]; /* "eth0 (10.0.0.2)" (ACCEL_SOCKET_IFNAME) or "10.0.0.2" (the route) */
    accel__gloo_ctx *g;
    uint64_t n_splits;
    int remote; /* some member has a peer on another host */
    int ring;   /* large f32 / f64 reductions run as a ring (ACCEL_GLOO_RING, agreed) */
    /* Grow-only scratch (no allocation per step once warm) and per-rank tables. */
    void *scratch[6];
    size_t scratch_nbytes[6];
    size_t *cnt, *send_nbytes, *recv_nbytes; /* elements, bytes to and bytes from each rank */
    const void **in;
    /* accel__gloo_declare_next's call, declared by the next run instead of its own. */
    accel__coll declare_as;
    int has_declare_as;
    /* The first failure: every later call repeats it. */
    _Atomic int broken;
    accel_status broken_st;
    char broken_msg[ACCEL__ERRMSG_NBYTES];
};

/* Scratch buffer i (0 .. 4) of at least nbytes, grown as needed: the envelopes use 0 and 2 (3
 * with data), as do the paths that run after them; a non-root reduce's result and the wire
 * dtype's copy 1; the ring 3 and 4, since the envelopes' stay in use beside it. */
accel_status accel__gloo_scratch(accel__gloo *e, int i, size_t nbytes, void **out);

/* Segments: a chunk is cut into at most this many (larger segments beyond); segment k of a chunk
 * of cnt elements has seg_len elements. */
#define ACCEL__GLOO_MAX_SEGS 64
static inline size_t seg_len(size_t cnt, size_t seg, size_t k)
{
    return k * seg >= cnt ? 0 : cnt - k * seg < seg ? cnt - k * seg : seg;
}
/* The segment length for chunks of at most per elements: seg, unless that makes fewer than
 * min_segs a chunk (then per / min_segs) or more than ACCEL__GLOO_MAX_SEGS (then per / that);
 * never 0. */
static inline size_t seg_size(size_t per, size_t seg, size_t min_segs)
{
    seg = (per + seg - 1) / seg < min_segs ? (per + min_segs - 1) / min_segs : seg;
    seg = (per + seg - 1) / seg > ACCEL__GLOO_MAX_SEGS
              ? (per + ACCEL__GLOO_MAX_SEGS - 1) / ACCEL__GLOO_MAX_SEGS
              : seg;
    return seg > 0 ? seg : 1;
}

/* The envelopes of a call (gloo_coll.c), in two halves: _post begins the call's batch of
 * messages and posts them, _check waits for them and compares the declarations (on a mismatch:
 * ACCEL_EINVAL, *mismatch set, the table still in all). */
typedef struct accel__gloo_env {
    char *all; /* member q's declaration (and what it sent this member) at q * stride */
    size_t stride;
    size_t *ix; /* the messages' indices */
} accel__gloo_env;
accel_status accel__gloo_envelopes_post(accel__gloo *e, const accel__coll *op, const char *what,
                                        const char *data, size_t es, const size_t *off,
                                        const size_t *cnt, accel__gloo_env *env);
accel_status accel__gloo_envelopes_check(accel__gloo *e, const accel__gloo_env *env,
                                         const char *what, int *mismatch);
/* The bytes an envelope holds after the declaration on n members (the same for every call). */
size_t accel__gloo_envelope_room(int n);

/* 1 when the call declared d runs as gloo_ring.c's ring; accel__gloo_ring runs op (declared d)
 * whole. */
int accel__gloo_rings(const accel__gloo *e, const accel__coll_decl *d);
accel_status accel__gloo_ring(accel__gloo *e, const accel__coll *op, const accel__coll_decl *d,
                              const char *what);

/* A failed Gloo call (what: the collective, for the message): the diagnosis naming the process
 * at fault is recorded in the store and every connection reset (the communicator is broken
 * for good); returns the status to report. */
accel_status accel__gloo_failed(accel__gloo *e, accel_status st, const accel__gloo_err *err,
                                const char *what);

/* Calls a gloo_cxx function (its error out-parameter appended) and turns a failure into the
 * communicator's failure, returned from the caller. */
#define GLOO_CALL(what, fn, ...)                                                                   \
    do {                                                                                           \
        accel__gloo_err err_;                                                                      \
        accel_status st_ = fn(__VA_ARGS__, &err_);                                                 \
        if (st_ != ACCEL_OK) {                                                                     \
            return accel__gloo_failed(e, st_, &err_, (what));                                      \
        }                                                                                          \
    } while (0)

#endif /* ACCEL_COMM_GLOO_IMPL_H */
