/*
 * The job's key-value store (private to the library): a small TCP server that one process of a
 * job (rank 0) runs on a thread, on MASTER_ADDR:MASTER_PORT, and a client per process. It is how
 * processes that share nothing yet agree on something: the shm backend's job nonce and its
 * "everyone attached" step today; NCCL unique ids and multi-machine launch later.
 *
 * Semantics: keys are strings (1..512 bytes, any bytes but NUL), values are byte strings up to
 * 1 MiB. set overwrites; get and wait block until their keys exist or the deadline passes; add
 * treats the value as a decimal int64 (missing = 0) and returns the new value atomically, so it
 * serves as a counter or a claim ("the first to add gets 1"). Keys are never deleted: use fresh
 * names for each use. Every call has a deadline; a server that dies closes the connection and
 * every waiting client fails at once with ACCEL_EPEER, a stopped or unreachable one with
 * ACCEL_ETIMEDOUT; messages name the address. A server closed by its process answers every
 * client's request in progress or next with why (accel__store_close) before it closes.
 *
 * Presence: a client may declare a key and value that the server sets when the client's
 * connection ends without a departure (the process died or exited without leaving, or its
 * machine vanished: keepalive notices within about 10 s). Waiters on that key (a parked get) then
 * learn it at once: the liveness watch of backends that cannot see their peers die (watch.h).
 *
 * Heartbeats: a client that beats (accel__store_beat, every period) is heard at each request it
 * sends; each beat is answered with the other beaters that have not been heard for longer than
 * the beater asks (the server's clock: no clocks are compared across machines), and on request
 * with those whose progress count (carried by the beats) is below the beater's. A process that
 * is stopped, hung or cut off keeps its connection (TCP keepalive answers for it) but stops
 * beating: the liveness watch names it that way.
 *
 * Plain POSIX sockets, no authentication: any local
 * user can connect, so nothing secret may be stored here (the shm backend's nonce only names
 * files that are private to the user anyway).
 *
 * Wire format (little-endian): greeting u32 magic "ACST" + u32 version each way; request u32
 * length + (u8 op, u8 0, u16 key count, u32 timeout ms, op fields: key = u16 length + bytes,
 * value = u32 length + bytes, delta = i64); response u32 length + (u8 status, payload); a
 * stopping server's last answer on every connection has status GONE (store_wire.h).
 */
#ifndef ACCEL_COMM_STORE_H
#define ACCEL_COMM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "accel/status.h"

typedef struct accel__store accel__store;
/* Why an IPv6 link-local MASTER_ADDR is refused by the store (so by every backend) and by accel
 * launch, and what to use instead: another machine could not reach the link-local address gloo
 * would listen on. Follows "<the address> is ". */
#define ACCEL__LINK_LOCAL_REFUSED                                                                  \
    "an IPv6 link-local address (fe80::/10), which accel does not support (the gloo and hier "     \
    "backends could not use it: Gloo's connections carry no scope id): give machine 0's global "   \
    "or unique-local (fd00::/8) IPv6 address, or an IPv4 one"

#define ACCEL__STORE_KEY_MAX 512
#define ACCEL__STORE_VALUE_MAX (1u << 20)
#define ACCEL__STORE_BEAT_NAME_MAX 200 /* bytes of a beater's name */
#define ACCEL__STORE_SILENT_MAX 32     /* silent beaters listed in one answer, at most */

/* Called on the server thread after a set or add has been applied and before its caller gets
 * the answer (so whatever the hook does has happened when accel__store_set returns anywhere).
 * Must be quick and must not call the store. `value` is the new value (for add, its decimal). */
typedef void (*accel__store_hook)(void *arg, const char *key, const void *value, size_t nbytes);

typedef struct accel__store_config {
    const char *addr;         /* host name or numeric IPv4/IPv6 address (MASTER_ADDR) */
    int port;                 /* MASTER_PORT, 1..65535; 0 only with serve: any free port */
    int serve;                /* 1: this process also runs the server (exactly one per job) */
    double timeout_s;         /* connecting gives up after this (the server may start later); also
                                 the deadline of set and add */
    accel__store_hook on_set; /* serve only; may be NULL */
    void *hook_arg;
    /* How long past its own wait a get or wait may take to be answered before it fails with
     * ACCEL_ETIMEDOUT (a stopped server); 0: 5 s. */
    double grace_s;
    /* Once connected, the greeting must come within this (0: by the connect deadline): for a
     * best-effort client, such as one recording a failure, that may wait timeout_s for a server
     * not up yet but not for a stopped one (its kernel accepts connections; it never greets). */
    double answer_s;
    /* The wait the user configured (ACCEL_TIMEOUT, the launcher's rendezvous timeout), named by
     * the message of a connection that never came, when timeout_s is only what is left of it or
     * one try of a caller that retries; 0: timeout_s. */
    double configured_s;
} accel__store_config;

/* Connects to the store at addr:port, first starting the server there when cfg->serve. The
 * server's port taken is ACCEL_EIO naming the address ("address already in use": another job
 * or program has it; when it is a store lingering after a failure, accel__store_close_failed,
 * the message ends with that failure, read from it within a second), as is an address that is
 * not this machine's. A peer on the port that is
 * not an accel store is ACCEL_EIO too. An address that is (or resolves to) an IPv6 link-local
 * one, scope id or not, is ACCEL_EINVAL at once, naming it (ACCEL__LINK_LOCAL_REFUSED). On success
 * *out is the client (and the server, if any): one thread at a time. */
accel_status accel__store_open(accel__store **out, const accel__store_config *cfg);
/* "addr:port", or "[addr]:port" for an IPv6 address, into buf (cap bytes): how the store and
 * accel launch name an endpoint in messages (accel__store_name). */
void accel__host_port(char *buf, size_t cap, const char *addr, int port);
/* Closes the client and, for the serving process, stops the server. Clients still connected
 * then see ACCEL_EPEER, in their request in progress or their next one, saying why: "the
 * server stopped before answering ...: the process serving it (pid N) closed it". Accepts
 * NULL. */
void accel__store_close(accel__store *st);
/* accel__store_close for a process that closes its store because it failed: the clients' text
 * goes on with " after this failure: <cause>" (NULL or "": none), so that a process 0 that
 * stops early tells the others why. With linger_s > 0 a serving process first goes on serving
 * for linger_s seconds, without its hook, holding the port (and telling a process that would
 * serve there the cause): the caller waits that long. For a failure that another job's
 * processes caused by coming to this port (a clash), so that one that comes a little later
 * fails at once, naming the clash, instead of taking the port over and waiting there in vain.
 * The key "store/closing" is the store's own. */
void accel__store_close_failed(accel__store *st, const char *cause, double linger_s);

/* Like accel__store_close, but the server (if this process runs it) keeps serving until the
 * process exits: after a failed rendezvous, the others can still read the failure that was
 * published, and a late process of another job cannot take the port over and wait there in
 * vain. A later accel__store_open serving the same port in this process then finds it taken. */
void accel__store_abandon(accel__store *st);

/* The port actually used (the free port picked for port 0). */
int accel__store_port(const accel__store *st);
/* "addr:port", for messages. Valid until accel__store_close. */
const char *accel__store_name(const accel__store *st);

/* Sets key to the nbytes bytes at value (overwriting). */
accel_status accel__store_set(accel__store *st, const char *key, const void *value, size_t nbytes);
/* Waits until key exists (at most timeout_s; 0: not at all) and copies its value into buf (cap
 * bytes), its length into *nbytes. ACCEL_ETIMEDOUT naming the key when the deadline passes
 * (ACCEL_ENOTFOUND with timeout_s 0); ACCEL_EINVAL when the value is longer than cap. */
accel_status accel__store_get(accel__store *st, const char *key, void *buf, size_t cap,
                              size_t *nbytes, double timeout_s);
/* Adds delta to the counter key (created at 0) and writes the result to *out (may be NULL). */
accel_status accel__store_add(accel__store *st, const char *key, int64_t delta, int64_t *out);
/* Waits until every one of the n_keys keys exists (at most timeout_s; 0: not at all).
 * ACCEL_ETIMEDOUT (ACCEL_ENOTFOUND with timeout_s 0) naming the first missing key. */
accel_status accel__store_wait(accel__store *st, const char *const *keys, size_t n_keys,
                               double timeout_s);

/* Declares this client's presence: when its connection ends without accel__store_depart (the
 * process dies or exits without it; its machine vanishes: TCP keepalive on both ends notices
 * within about 10 s), the server sets key to the nbytes bytes at value, unless key exists (the
 * first loss is kept), and answers the gets waiting for it. A second declaration replaces the
 * first. A client that serves the store declares nothing the others could see after it died. */
accel_status accel__store_declare(accel__store *st, const char *key, const void *value,
                                  size_t nbytes);
/* Withdraws the declaration: closing the client afterwards is a clean departure. */
accel_status accel__store_depart(accel__store *st);
/* A beater worth naming (accel__store_beat): not heard for a while, or behind. */
typedef struct accel__store_silent {
    int id;                                    /* the beater's id (the watch: its process) */
    double silent_s;                           /* since its last request, on the server */
    uint64_t count;                            /* its progress, as of its last beat */
    char name[ACCEL__STORE_BEAT_NAME_MAX + 1]; /* its name, as it beats it */
} accel__store_silent;

/* Beats: the server hears this client (as beater id, named name: 1..ACCEL__STORE_BEAT_NAME_MAX
 * bytes, with progress count, e.g. operations posted) now and at each later request of it, and
 * answers with the other beaters not heard for more than silent_s, and, with behind, those
 * whose count is below this one's (at most cap of them, ACCEL__STORE_SILENT_MAX at most) in
 * out[0..*n_out). The answer must come within answer_s (a stopped or hung server:
 * ACCEL_ETIMEDOUT, and st is broken). Costs the server one pass over its connections. */
accel_status accel__store_beat(accel__store *st, int id, const char *name, uint64_t count,
                               int behind, double silent_s, double answer_s,
                               accel__store_silent *out, int cap, int *n_out);

/* Bounds every later request on st: its answer must also come by `until` (accel__now()'s clock;
 * 0 lifts the bound). A request cut short fails with ACCEL_ETIMEDOUT and breaks st, as one
 * that a stopped server does not answer. For best-effort traffic, such as recording a failure,
 * that must not wait a whole timeout on a stopped server. */
void accel__store_bound(accel__store *st, double until);
/* The deadline of every later set and add on st (accel__store_config.timeout_s): for a client
 * that connected in short tries, so as to notice something else between them. */
void accel__store_set_timeout(accel__store *st, double timeout_s);
/* How long a best-effort failure record's store traffic may take (accel__store_bound, answer_s):
 * a stopped server then delays the failure by about this much, not by a timeout per request. */
#define ACCEL__STORE_RECORD_S 1.0
/* ACCEL_OK while st is usable, else the status of the failure that broke it (a lost
 * connection, an answer that did not come): tells a get that timed out on a missing key (st
 * still usable) from one the server did not answer. */
accel_status accel__store_broken(const accel__store *st);
/* From any thread: makes the call in progress on st (and every later one) fail at once with
 * ACCEL_EPEER, to stop a thread waiting in a get. The connection ends (a declaration on it is
 * then a loss): use it on clients that declared nothing. */
void accel__store_interrupt(accel__store *st);

#endif /* ACCEL_COMM_STORE_H */
