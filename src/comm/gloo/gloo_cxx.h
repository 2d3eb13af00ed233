/*
 * The C face of Gloo (private to src/comm/gloo): the one C++ file, gloo_cxx.cc, wraps a Gloo
 * TCP context behind these functions, so the backend (gloo.c) stays C. Every function catches
 * every C++ exception and returns a status; none throws.
 *
 * Data movement only: bytes, no dtypes, no reductions (gloo.c reduces with accel's own kernels
 * in rank order, which Gloo's ring algorithms cannot promise). Every call waits at most the
 * context's timeout. A failure fills *err: the message, and the rank of the peer whose
 * connection failed when Gloo's message names one (-1 otherwise).
 */
#ifndef ACCEL_COMM_GLOO_CXX_H
#define ACCEL_COMM_GLOO_CXX_H

#include <stddef.h>
#include <stdint.h>

#include "accel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel__store accel__store;
typedef struct accel__gloo_ctx accel__gloo_ctx;

typedef struct accel__gloo_err {
    char msg[400];
    int peer;        /* the rank at the other end of the failed connection, or -1; after
                      * accel__gloo_connect timed out: the rank whose record never came, or -1 */
    int timeout;     /* 1: a wait passed its deadline (else the connection failed) */
    int unconnected; /* accel__gloo_connect: peer's record came, but not its connection */
} accel__gloo_err;

/* Connects rank `rank` of n_ranks to every other through Gloo's TCP transport, meeting in the
 * store under keys starting with `prefix`, listening on numeric address `host` (IPv4 or IPv6,
 * the family the other ranks listen in). `store` is borrowed and used only during this call.
 * ACCEL_ETIMEDOUT / ACCEL_EPEER / ACCEL_EIO with err set; ACCEL_EPEER with the message found
 * there when another process published "<prefix>setup_failed" while this one waited. */
accel_status accel__gloo_connect(accel__gloo_ctx **out, accel__store *store, const char *prefix,
                                 int rank, int n_ranks, const char *host, double timeout_s,
                                 accel__gloo_err *err);
/* How many peers listen on an address of another host (not one of this network namespace's
 * interfaces). */
int accel__gloo_remote_peers(const accel__gloo_ctx *g);
/* Frees the context (its connections close; peers still waiting see them close). NULL ok. */
void accel__gloo_free(accel__gloo_ctx *g);

/* Every rank sends send_nbytes[q] bytes (consecutive in send) to rank q and receives
 * recv_nbytes[q] bytes (consecutive in recv) from it; the own block is copied. */
accel_status accel__gloo_alltoallv(accel__gloo_ctx *g, const void *send, const size_t *send_nbytes,
                                   void *recv, const size_t *recv_nbytes, accel__gloo_err *err);
/* recv receives every rank's block, rank q's nbytes[q] bytes after those of ranks < q; this
 * rank's block comes from `send`, or is already in place in recv when send is NULL. */
accel_status accel__gloo_allgatherv(accel__gloo_ctx *g, const void *send, void *recv,
                                    const size_t *nbytes, accel__gloo_err *err);
/* root's buf (nbytes) to every rank's buf. */
accel_status accel__gloo_broadcast(accel__gloo_ctx *g, void *buf, size_t nbytes, int root,
                                   accel__gloo_err *err);
/* Every rank's nbytes bytes to root's recv, in rank order (recv unused elsewhere). */
accel_status accel__gloo_gather(accel__gloo_ctx *g, const void *send, size_t nbytes, void *recv,
                                int root, accel__gloo_err *err);

/* Point-to-point messages, for algorithms Gloo's collectives cannot express. A batch begins
 * with accel__gloo_msgs_begin (a fresh tag); each post starts one message of nbytes > 0 to or
 * from `peer` under `key` (the two ends of a message give the same key, unique in the batch)
 * and returns its index in the batch; a wait waits for one message by index, at most the
 * context's timeout. Posting every receive before the data can arrive spares the sender
 * Gloo's wait for the receiver's ready notice. The buffers stay in use until their message is
 * waited for; after a failure, until the context is freed. */
void accel__gloo_msgs_begin(accel__gloo_ctx *g);
accel_status accel__gloo_post(accel__gloo_ctx *g, int is_send, int peer, uint32_t key, void *buf,
                              size_t nbytes, size_t *index, accel__gloo_err *err);
accel_status accel__gloo_wait(accel__gloo_ctx *g, size_t index, accel__gloo_err *err);
/* 1 when message `index` of the batch has completed, without waiting (also after another wait
 * of the batch failed: which of the others did come); 0 otherwise. */
int accel__gloo_arrived(accel__gloo_ctx *g, size_t index);

/* Shuts down every connection of the context (any thread): every wait on it, here and on the
 * peers waiting on this rank, fails at once. */
void accel__gloo_break(accel__gloo_ctx *g);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_COMM_GLOO_CXX_H */
