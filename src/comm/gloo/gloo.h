/*
 * The gloo backend's endpoint (private to src/comm/gloo), for the backend's ops (gloo.c) and
 * the hier composition (hier.c, hier_coll.c), which runs one gloo communicator across its nodes.
 */
#ifndef ACCEL_COMM_GLOO_H
#define ACCEL_COMM_GLOO_H

#include "comm/comm.h"
#include "comm/store.h"

typedef struct accel__gloo accel__gloo;

/* Connects cfg->rank of cfg->n_ranks through the store at cfg->master_addr:master_port (served
 * by this process when `serve`), under keys starting with `prefix` (unique to this
 * communicator in the job). process[q] is the job-wide index of rank q, used in messages (NULL:
 * q itself). Collective; every wait has cfg->timeout_s. */
accel_status accel__gloo_open(accel__gloo **out, const accel__comm_config *cfg, const char *prefix,
                              int serve, const int *process);
/* For a process whose setup failed before it opened gloo communicator `prefix` (as rank
 * cfg->rank; hier's shm level, say), with accel_last_error saying why: tells the members
 * already waiting in that communicator's rendezvous, which then fail at once with the message
 * instead of at their deadline. Best effort (a store not up within 5 s, or that does not
 * answer within ACCEL__STORE_RECORD_S, a stopped one, is skipped); keeps accel_last_error. */
void accel__gloo_refuse(const accel__comm_config *cfg, const char *prefix, accel_status st);
/* Process 0 serves the store when no launcher does, and the store ends with its program: after
 * a failed setup it waits until every member of communicator `prefix` (n_members, but `self`;
 * -1: none) has said it learnt of the failure (each process leaving a failed accel__gloo_open
 * or accel__gloo_refuse says so), or until `until` (accel__now() seconds), so that a process
 * still polling names the culprit rather than a vanished store. */
void accel__gloo_await_seen(accel__store *store, const char *prefix, int n_members, int self,
                            double until);
/* How long process 0 waits so for the others: 5 s, or the timeout when shorter (for those that
 * never came). */
#define ACCEL__GLOO_SEEN_WAIT(timeout_s) ((timeout_s) < 5.0 ? (timeout_s) : 5.0)
/* How long a wait that timed out gives another member to record its own diagnosis before
 * this one's (accel__gloo_failed; fail() in gloo.c says why): a quarter of the timeout, at
 * most 2 s. Recording then takes up to ACCEL__STORE_RECORD_S more. */
#define ACCEL__GLOO_GRACE_S(timeout_s) ((timeout_s) / 4 < 2.0 ? (timeout_s) / 4 : 2.0)
/* Runs one collective (comm.h semantics, bit-identical to the other backends). */
accel_status accel__gloo_run(accel__gloo *e, const accel__coll *op);
/* The next accel__gloo_run declares `op` (copied) instead of its own call in the envelope
 * every member compares: hier's calls are its own decomposition of the user's, which can agree
 * while the user's calls differ. Cleared by that run, or by accel__gloo_declare_clear. NULL e:
 * nothing. */
void accel__gloo_declare_next(accel__gloo *e, const accel__coll *op);
void accel__gloo_declare_clear(accel__gloo *e);
/* accel_alloc_shared's check on a backend whose shared memory is plain memory: one envelope
 * exchange declaring an allocation of nbytes, so a process that allocates while the others
 * call a collective, or asks for another size, fails on every member (ACCEL_EINVAL naming both
 * calls; sizes that differ do not break the communicator, as on shm). */
accel_status accel__gloo_alloc_check(accel__gloo *e, size_t nbytes);
/* hier's allocation: matches any other of this kind whatever its size (hier compares the sizes
 * after the exchange, on every process of the job alike), but not a collective. */
#define ACCEL__GLOO_CALL_ALLOC_ANY (ACCEL__COLL_DECL_ALLOC + 1)
/* Breaks the communicator on every member (any thread): the failure is recorded in the store
 * naming this process and `msg`, and every connection is reset. */
void accel__gloo_abort(accel__gloo *e, accel_status st, const char *msg);
/* The backend's split (comm.h's ops->split, collective over e): *child is the new endpoint,
 * NULL for a process in no child. */
accel_status accel__gloo_split(accel__gloo *e, const accel__comm_split_info *how,
                               accel__gloo **child);
/* "gloo across 2 processes, listening on eth0": accel_state_summary's line. */
void accel__gloo_describe(const accel__gloo *e, char *buf, size_t nbytes);
/* Leaves (peers waiting on this process fail) and frees. Accepts NULL. */
void accel__gloo_close(accel__gloo *e);

#endif /* ACCEL_COMM_GLOO_H */
