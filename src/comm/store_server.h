/*
 * What the store server's two files share (private to src/comm): store_server.c owns the
 * thread, the sockets and the connections' bytes; store_requests.c owns the key-value table and
 * what a request does (its answer, a parked wait, a presence, a beat).
 *
 * Invariant: only the server thread touches the connections and the table (and
 * accel__store_server_stop, after joining it); the hook alone is shared, under hook_mu.
 */
#ifndef ACCEL_COMM_STORE_SERVER_H
#define ACCEL_COMM_STORE_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "store_wire.h"

typedef struct entry {
    char *key; /* NULL: free slot */
    uint8_t *value;
    size_t nbytes;
} entry;

typedef struct conn {
    int fd;
    int greeted;
    uint8_t *in; /* received bytes not yet handled */
    size_t in_len, in_cap;
    uint8_t *out; /* answer bytes not yet written */
    size_t out_len, out_off, out_cap;
    /* A parked GET or WAIT: its request body (owned), the keys in it, the first key not yet
     * present, and the deadline. parked == 0 when none. */
    int parked;
    uint8_t op;
    uint8_t *req;
    const uint8_t **keys;
    uint16_t *key_lens;
    size_t n_keys, next_key;
    double deadline;
    int closing; /* close once the output is flushed */
    /* A declared presence: the key and value set if the connection ends; NULL when none. */
    char *gone_key;
    uint8_t *gone_value;
    size_t gone_nbytes;
    /* Heartbeats: the beater's id and name (NULL: the connection does not beat) and when its
     * last request came (every request counts as a beat). */
    char *beat_name;
    uint32_t beat_id;
    uint64_t beat_count; /* the beater's progress (the watch: operations posted) */
    double heard_at;
} conn;

struct accel__store_server {
    int listen_fd;
    int wake[2]; /* a byte written to wake[1] stops the thread */
    pthread_t thread;
    pthread_mutex_t hook_mu; /* detach clears the hook: no call runs after it returns */
    accel__store_hook hook;
    void *hook_arg;
    entry *table;
    size_t table_cap, table_used;
    conn **conns;
    size_t n_conns, conns_cap;
};

/* Grows *buf (capacity *cap) to hold need bytes, doubling. Returns 0, or -1 out of memory
 * (*buf unchanged). */
static inline int store_reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) {
        return 0;
    }
    size_t c = *cap > 0 ? *cap : 256;
    while (c < need) {
        c *= 2;
    }
    uint8_t *b = accel__realloc(*buf, c);
    if (b == NULL) {
        return -1;
    }
    *buf = b;
    *cap = c;
    return 0;
}

/* ---- port_owner.c ---- */

/* Who listens on TCP `port` on this machine, for a message: "pid 1234, <command line>" when a
 * process of this user does (read from /proc), else "" (unknown: another user's, no /proc).
 * The command line is one line (accel__oneline) of ACCEL__PORT_OWNER_CMD_NBYTES - 1 bytes at
 * most. Only for an error path: it may read every process's descriptors. */
void accel__port_owner(int port, char *out, size_t cap);
#define ACCEL__PORT_OWNER_CMD_NBYTES 161
/* Writes the n bytes at raw (a /proc cmdline: arguments separated by NULs), more of which were
 * not read when `more`, to out (cap bytes, NUL-terminated) as one line for a message: NULs and
 * control characters (newline, tab, ...) as spaces, each run of them as one space, none at
 * either end. A line that does not fit (or `more`) ends with "...", cut between words when a
 * space lies in the second half of the line, else between UTF-8 characters. */
void accel__oneline(const char *raw, size_t n, int more, char *out, size_t cap);

/* ---- store_requests.c: requests and the table ---- */

/* Handles every complete message in c->in (the greeting first), queuing the answers in c->out;
 * stops at a parked request or a closing connection. */
void accel__store_consume(accel__store_server *srv, conn *c);
/* Answers c's parked request if all its keys exist now, or MISSING if now is past its
 * deadline. */
void accel__store_try_parked(accel__store_server *srv, conn *c, double now);
/* c ends: its declared presence, if any, sets its key (waiters answered). The caller has taken
 * c out of srv->conns. */
void accel__store_lost(accel__store_server *srv, conn *c);
/* The server stops: queues GONE and why as c's last answer (to its parked request, the one
 * still unread in c->in, or the next it sends), unless c is still greeting or already
 * closing. */
void accel__store_farewell(conn *c, const char *why);
/* Frees c's parked request / its declared presence (each may be absent). */
void accel__store_unpark(conn *c);
void accel__store_forget_presence(conn *c);

/* ---- store_server.c: the connections ---- */

/* Writes c's pending output without blocking. Returns -1 when the connection is finished (an
 * error, or everything written and c->closing), else 0. */
int accel__store_flush_out(conn *c);

#endif /* ACCEL_COMM_STORE_SERVER_H */
