/*
 * The store's server: one thread polling the listening socket, a wake-up pipe and every client
 * connection (all non-blocking), with the key-value table in memory (open addressing).
 *
 * Invariants: a connection has at most one request in progress (clients are synchronous); a
 * request whose keys are missing is parked with its deadline and answered as soon as the last
 * key appears or the deadline passes; the server never blocks on a client (answers go through
 * a per-connection output buffer), so one stalled or hostile client cannot stop the others. A
 * malformed request gets a BAD answer and the connection is closed. A connection that declared
 * its presence and ends without departing sets its declared key (unless it exists) as it goes.
 * A connection that beats (the liveness watch's) is heard at each request it sends; a beat
 * learns which other beaters have been silent for longer than it asks (or are behind it).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

/* ---- the table ---- */

static uint64_t hash(const uint8_t *k, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h = (h ^ k[i]) * 1099511628211ull;
    }
    return h;
}

/* The slot holding key, or the free slot where it would go. */
static entry *slot(entry *table, size_t cap, const uint8_t *k, size_t n)
{
    for (size_t i = hash(k, n) & (cap - 1);; i = (i + 1) & (cap - 1)) {
        entry *e = &table[i];
        if (e->key == NULL || (strlen(e->key) == n && memcmp(e->key, k, n) == 0)) {
            return e;
        }
    }
}

static entry *find(accel__store_server *srv, const uint8_t *k, size_t n)
{
    entry *e = slot(srv->table, srv->table_cap, k, n);
    return e->key != NULL ? e : NULL;
}

/* Stores a copy of value under key. Returns 0, or -1 when out of memory. */
static int put(accel__store_server *srv, const uint8_t *k, size_t n, const void *value,
               size_t nbytes, entry **out)
{
    if (2 * (srv->table_used + 1) > srv->table_cap) { /* keep the load under one half */
        size_t cap = srv->table_cap * 2;
        entry *t = accel__calloc(cap, sizeof(*t));
        if (t == NULL) {
            return -1;
        }
        for (size_t i = 0; i < srv->table_cap; i++) {
            if (srv->table[i].key != NULL) {
                const char *key = srv->table[i].key;
                *slot(t, cap, (const uint8_t *)key, strlen(key)) = srv->table[i];
            }
        }
        accel__free(srv->table);
        srv->table = t;
        srv->table_cap = cap;
    }
    uint8_t *v = accel__malloc(nbytes > 0 ? nbytes : 1);
    if (v == NULL) {
        return -1;
    }
    memcpy(v, value, nbytes);
    entry *e = slot(srv->table, srv->table_cap, k, n);
    if (e->key == NULL) {
        char *key = accel__malloc(n + 1);
        if (key == NULL) {
            accel__free(v);
            return -1;
        }
        memcpy(key, k, n);
        key[n] = '\0';
        e->key = key;
        srv->table_used++;
    }
    accel__free(e->value);
    e->value = v;
    e->nbytes = nbytes;
    *out = e;
    return 0;
}

/* ---- connections ---- */

static int flush_out(conn *c);

static double deadline_after(uint32_t ms)
{
    return accel__now() + (double)ms * 1e-3;
}

static int reserve(uint8_t **buf, size_t *cap, size_t need)
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

static void unpark(conn *c)
{
    accel__free(c->req);
    accel__free(c->keys);
    accel__free(c->key_lens);
    c->req = NULL;
    c->keys = NULL;
    c->key_lens = NULL;
    c->parked = 0;
}

/* Queues an answer: status and up to two payload pieces. */
static void answer(conn *c, uint8_t status, const void *a, size_t an, const void *b, size_t bn)
{
    size_t len = 1 + an + bn;
    if (reserve(&c->out, &c->out_cap, c->out_len + 4 + len) != 0) {
        c->closing = 1; /* out of memory: the client sees the connection close */
        return;
    }
    uint8_t *p = c->out + c->out_len;
    store_put32(p, (uint32_t)len);
    p[4] = status;
    if (an > 0) {
        memcpy(p + 5, a, an);
    }
    if (bn > 0) {
        memcpy(p + 5 + an, b, bn);
    }
    c->out_len += 4 + len;
}

static void bad(conn *c, const char *why)
{
    answer(c, STORE_BAD, why, strlen(why), NULL, 0);
    c->closing = 1;
}

/* Answers a parked request if all its keys exist now (or its deadline passed). */
static void try_parked(accel__store_server *srv, conn *c, double now)
{
    while (c->next_key < c->n_keys && find(srv, c->keys[c->next_key], c->key_lens[c->next_key])) {
        c->next_key++;
    }
    if (c->next_key == c->n_keys) {
        if (c->op == STORE_GET) {
            entry *e = find(srv, c->keys[0], c->key_lens[0]);
            answer(c, STORE_OK, e->value, e->nbytes, NULL, 0);
        } else {
            answer(c, STORE_OK, NULL, 0, NULL, 0);
        }
        unpark(c);
    } else if (now >= c->deadline) {
        answer(c, STORE_MISSING, c->keys[c->next_key], c->key_lens[c->next_key], NULL, 0);
        unpark(c);
    }
}

/* After a set or add: runs the hook, then answers the requests that waited for it. */
static void updated(accel__store_server *srv, const entry *e)
{
    pthread_mutex_lock(&srv->hook_mu);
    if (srv->hook != NULL) {
        srv->hook(srv->hook_arg, e->key, e->value, e->nbytes);
    }
    pthread_mutex_unlock(&srv->hook_mu);
    double now = accel__now();
    for (size_t i = 0; i < srv->n_conns; i++) {
        conn *c = srv->conns[i];
        if (c != NULL && c->parked) { /* NULL: closed this round */
            try_parked(srv, c, now);
            /* Send now rather than at the next poll round: the setter may be done with the
             * store, and stop the server, before then. A failure shows at the next poll. */
            if (!c->parked) {
                (void)flush_out(c);
            }
        }
    }
}

/* Reads a key at *p (u16 length + bytes) within [*p, end). Returns 0 or -1 if malformed. */
static int read_key(const uint8_t **p, const uint8_t *end, const uint8_t **k, uint16_t *n)
{
    if (end - *p < 2) {
        return -1;
    }
    *n = store_get16(*p);
    if (*n == 0 || *n > ACCEL__STORE_KEY_MAX || end - (*p + 2) < *n ||
        memchr(*p + 2, '\0', *n) != NULL) {
        return -1;
    }
    *k = *p + 2;
    *p += 2 + (size_t)*n;
    return 0;
}

static void forget_presence(conn *c)
{
    accel__free(c->gone_key);
    accel__free(c->gone_value);
    c->gone_key = NULL;
    c->gone_value = NULL;
    c->gone_nbytes = 0;
}

/* A PRESENCE request's fields in [p, end): one key and a value (a declaration) or nothing (the
 * departure). */
static void declare(conn *c, size_t n_keys, const uint8_t *p, const uint8_t *end)
{
    if (n_keys == 0 && p == end) {
        forget_presence(c);
        answer(c, STORE_OK, NULL, 0, NULL, 0);
        return;
    }
    const uint8_t *k;
    uint16_t kn;
    if (n_keys != 1 || read_key(&p, end, &k, &kn) != 0 || end - p < 4 ||
        (size_t)(end - p - 4) != store_get32(p)) {
        bad(c, "malformed presence");
        return;
    }
    size_t nbytes = store_get32(p);
    char *key = accel__malloc((size_t)kn + 1);
    uint8_t *value = accel__malloc(nbytes > 0 ? nbytes : 1);
    if (key == NULL || value == NULL) {
        accel__free(key);
        accel__free(value);
        bad(c, "server out of memory");
        return;
    }
    memcpy(key, k, kn);
    key[kn] = '\0';
    memcpy(value, p + 4, nbytes);
    forget_presence(c);
    c->gone_key = key;
    c->gone_value = value;
    c->gone_nbytes = nbytes;
    accel__store_keepalive(c->fd); /* a vanished client machine ends the connection too */
    answer(c, STORE_OK, NULL, 0, NULL, 0);
}

/* A BEAT request's fields in [p, end): u32 id, u32 flags, u64 count, u32 length + name;
 * timeout_ms is the silence asked about. Names c as a beater and answers with every other
 * beater silent for longer or (flag 1) whose count is below c's: per entry u32 id, u32 silence
 * in ms, u64 count, u16 length + name (at most STORE_SILENT_MAX; one pass over the
 * connections). */
static void beat(accel__store_server *srv, conn *c, const uint8_t *p, const uint8_t *end,
                 uint32_t timeout_ms)
{
    size_t n = end - p >= 20 ? store_get32(p + 16) : 0;
    if (end - p < 20 || (size_t)(end - p - 20) != n || n == 0 || n > STORE_BEAT_NAME_MAX) {
        bad(c, "malformed beat");
        return;
    }
    if (c->beat_name == NULL || strlen(c->beat_name) != n || memcmp(c->beat_name, p + 20, n) != 0) {
        char *name = accel__malloc(n + 1);
        if (name == NULL) {
            bad(c, "server out of memory");
            return;
        }
        memcpy(name, p + 20, n);
        name[n] = '\0';
        accel__free(c->beat_name);
        c->beat_name = name;
    }
    c->beat_id = store_get32(p);
    c->beat_count = store_get64(p + 8);
    int behind = store_get32(p + 4) & 1;
    uint8_t out[STORE_SILENT_MAX * (18 + STORE_BEAT_NAME_MAX)];
    size_t len = 0;
    int listed = 0;
    double now = accel__now();
    for (size_t i = 0; i < srv->n_conns && listed < STORE_SILENT_MAX; i++) {
        const conn *o = srv->conns[i];
        if (o == NULL || o == c || o->beat_name == NULL ||
            ((now - o->heard_at) * 1000.0 <= (double)timeout_ms &&
             !(behind && o->beat_count < c->beat_count))) {
            continue;
        }
        size_t m = strlen(o->beat_name);
        store_put32(out + len, o->beat_id);
        store_put32(out + len + 4, (uint32_t)((now - o->heard_at) * 1000.0));
        store_put64(out + len + 8, o->beat_count);
        store_put16(out + len + 16, (uint16_t)m);
        memcpy(out + len + 18, o->beat_name, m);
        len += 18 + m;
        listed++;
    }
    answer(c, STORE_OK, out, len, NULL, 0);
}

/* c ends: if it declared its presence and did not depart, its key is set (the first loss is
 * kept) and its waiters answered. */
static void lost(accel__store_server *srv, conn *c)
{
    unpark(c); /* c takes no answer any more */
    entry *e;
    if (c->gone_key != NULL &&
        find(srv, (const uint8_t *)c->gone_key, strlen(c->gone_key)) == NULL &&
        put(srv, (const uint8_t *)c->gone_key, strlen(c->gone_key), c->gone_value,
            c->gone_nbytes, &e) == 0) {
        updated(srv, e);
    }
}

/* Handles one request body (len bytes at body); body stays valid only during the call. */
static void handle(accel__store_server *srv, conn *c, const uint8_t *body, size_t len)
{
    if (len < STORE_REQ_HEAD) {
        bad(c, "short request");
        return;
    }
    c->heard_at = accel__now(); /* a beat, if c beats */
    uint8_t op = body[0];
    size_t n_keys = store_get16(body + 2);
    uint32_t timeout_ms = store_get32(body + 4);
    const uint8_t *p = body + STORE_REQ_HEAD, *end = body + len, *k;
    uint16_t kn;
    entry *e;
    if (op == STORE_SET || op == STORE_ADD) {
        if (read_key(&p, end, &k, &kn) != 0) {
            bad(c, "malformed key");
            return;
        }
        if (op == STORE_SET) {
            if (end - p < 4 || (size_t)(end - p - 4) != store_get32(p)) {
                bad(c, "malformed value");
                return;
            }
            if (put(srv, k, kn, p + 4, store_get32(p), &e) != 0) {
                bad(c, "server out of memory");
                return;
            }
            answer(c, STORE_OK, NULL, 0, NULL, 0);
        } else {
            if (end - p != 8) {
                bad(c, "malformed add");
                return;
            }
            int64_t v = 0;
            entry *old = find(srv, k, kn);
            if (old != NULL) {
                char num[32];
                size_t m = old->nbytes < sizeof(num) - 1 ? old->nbytes : sizeof(num) - 1;
                memcpy(num, old->value, m);
                num[m] = '\0';
                char *stop;
                v = strtoll(num, &stop, 10);
                if (m == 0 || *stop != '\0') {
                    bad(c, "add on a key whose value is not a counter");
                    return;
                }
            }
            v += (int64_t)store_get64(p);
            char num[32];
            int m = snprintf(num, sizeof(num), "%" PRId64, v);
            if (put(srv, k, kn, num, (size_t)m, &e) != 0) {
                bad(c, "server out of memory");
                return;
            }
            uint8_t raw[8];
            store_put64(raw, (uint64_t)v);
            answer(c, STORE_OK, raw, 8, NULL, 0);
        }
        updated(srv, e);
        return;
    }
    if (op == STORE_PRESENCE) {
        declare(c, n_keys, p, end);
        return;
    }
    if (op == STORE_BEAT) {
        beat(srv, c, p, end, timeout_ms);
        return;
    }
    if (op != STORE_GET && op != STORE_WAIT) {
        bad(c, "unknown operation");
        return;
    }
    if ((op == STORE_GET && n_keys != 1) || n_keys == 0 || n_keys > STORE_WAIT_KEYS_MAX) {
        bad(c, "bad key count");
        return;
    }
    /* Park a copy of the request, then answer at once if possible. */
    c->req = accel__malloc(len);
    c->keys = accel__calloc(n_keys, sizeof(*c->keys));
    c->key_lens = accel__calloc(n_keys, sizeof(*c->key_lens));
    if (c->req == NULL || c->keys == NULL || c->key_lens == NULL) {
        unpark(c);
        bad(c, "server out of memory");
        return;
    }
    memcpy(c->req, body, len);
    p = c->req + STORE_REQ_HEAD;
    end = c->req + len;
    for (size_t i = 0; i < n_keys; i++) {
        if (read_key(&p, end, &c->keys[i], &c->key_lens[i]) != 0) {
            unpark(c);
            bad(c, "malformed key");
            return;
        }
    }
    if (p != end) {
        unpark(c);
        bad(c, "trailing bytes");
        return;
    }
    c->parked = 1;
    c->op = op;
    c->n_keys = n_keys;
    c->next_key = 0;
    c->deadline = deadline_after(timeout_ms);
    try_parked(srv, c, accel__now());
}

/* Handles every complete message in c->in. */
static void consume(accel__store_server *srv, conn *c)
{
    size_t off = 0;
    while (!c->closing && !c->parked) {
        size_t avail = c->in_len - off;
        if (!c->greeted) {
            if (avail < 8) {
                break;
            }
            if (store_get32(c->in + off) != STORE_MAGIC ||
                store_get32(c->in + off + 4) != STORE_VERSION) {
                c->closing = 1; /* not our protocol: say nothing */
                break;
            }
            uint8_t hello[8];
            store_put32(hello, STORE_MAGIC);
            store_put32(hello + 4, STORE_VERSION);
            if (reserve(&c->out, &c->out_cap, c->out_len + 8) != 0) {
                c->closing = 1;
                break;
            }
            memcpy(c->out + c->out_len, hello, 8);
            c->out_len += 8;
            c->greeted = 1;
            off += 8;
            continue;
        }
        if (avail < 4) {
            break;
        }
        uint32_t len = store_get32(c->in + off);
        if (len > STORE_BODY_MAX) {
            bad(c, "request too large");
            break;
        }
        if (avail - 4 < len) {
            break;
        }
        handle(srv, c, c->in + off + 4, len);
        off += 4 + (size_t)len;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
}

/* Reads what the connection has. Returns -1 when it is finished (EOF or error). */
static int on_readable(accel__store_server *srv, conn *c)
{
    for (;;) {
        if (reserve(&c->in, &c->in_cap, c->in_len + 4096) != 0) {
            return -1;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            if (c->in_len > 4 + STORE_BODY_MAX + 8) {
                consume(srv, c); /* a full message is there: do not buffer more */
                if (c->in_len > 4 + STORE_BODY_MAX + 8) {
                    return -1; /* a client that keeps sending while parked */
                }
            }
            continue;
        }
        if (n == 0) {
            return -1;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            consume(srv, c);
            return 0;
        }
        return -1;
    }
}

/* Writes pending output. Returns -1 when the connection is finished. */
static int flush_out(conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            return -1;
        }
    }
    c->out_off = c->out_len = 0;
    return c->closing ? -1 : 0;
}

static void conn_free(conn *c)
{
    unpark(c);
    forget_presence(c);
    accel__free(c->beat_name);
    close(c->fd);
    accel__free(c->in);
    accel__free(c->out);
    accel__free(c);
}

static void accept_all(accel__store_server *srv)
{
    for (;;) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            return; /* EAGAIN, or a transient error: poll tells us again */
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (srv->n_conns == srv->conns_cap) {
            size_t cap = srv->conns_cap > 0 ? 2 * srv->conns_cap : 16;
            conn **cs = accel__realloc(srv->conns, cap * sizeof(*cs));
            if (cs == NULL) {
                close(fd);
                continue;
            }
            srv->conns = cs;
            srv->conns_cap = cap;
        }
        conn *c = accel__calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        srv->conns[srv->n_conns++] = c;
    }
}

static void *serve(void *arg)
{
    accel__store_server *srv = arg;
    struct pollfd *fds = NULL;
    size_t fds_cap = 0;
    for (;;) {
        size_t need = (2 + srv->n_conns) * sizeof(*fds);
        if (reserve((uint8_t **)&fds, &fds_cap, need) != 0) {
            struct timespec ts = {0, 10000000}; /* out of memory: try again shortly */
            nanosleep(&ts, NULL);
            continue;
        }
        fds[0] = (struct pollfd){.fd = srv->wake[0], .events = POLLIN};
        fds[1] = (struct pollfd){.fd = srv->listen_fd, .events = POLLIN};
        double now = accel__now(), next = now + 3600;
        for (size_t i = 0; i < srv->n_conns; i++) {
            conn *c = srv->conns[i];
            fds[2 + i] = (struct pollfd){
                .fd = c->fd, .events = (short)(POLLIN | (c->out_len > c->out_off ? POLLOUT : 0))};
            if (c->parked && c->deadline < next) {
                next = c->deadline;
            }
        }
        int timeout_ms = next <= now ? 0 : (int)((next - now) * 1000.0) + 1;
        if (poll(fds, 2 + srv->n_conns, timeout_ms) < 0 && errno != EINTR) {
            break;
        }
        if (fds[0].revents != 0) {
            break;
        }
        size_t n_polled = srv->n_conns; /* connections accepted now are polled next round */
        if (fds[1].revents & POLLIN) {
            accept_all(srv);
        }
        now = accel__now();
        for (size_t i = 0; i < n_polled; i++) {
            conn *c = srv->conns[i];
            int done = 0;
            if (fds[2 + i].revents & (POLLIN | POLLHUP | POLLERR)) {
                done = on_readable(srv, c) != 0;
            }
            if (!done && c->parked) {
                try_parked(srv, c, now);
            }
            if (c->out_len > c->out_off || c->closing) {
                done |= flush_out(c) != 0;
            }
            if (done) {
                srv->conns[i] = NULL; /* before lost(): updated() skips it */
                lost(srv, c);
                conn_free(c);
            }
        }
        /* Drop the finished connections, keeping the order of the others. */
        size_t kept = 0;
        for (size_t i = 0; i < srv->n_conns; i++) {
            if (srv->conns[i] != NULL) {
                srv->conns[kept++] = srv->conns[i];
            }
        }
        srv->n_conns = kept;
    }
    accel__free(fds);
    return NULL;
}

/* ---- start and stop ---- */

accel_status accel__store_server_start(accel__store_server **out, const char *addr, int port,
                                       accel__store_hook hook, void *hook_arg, int *bound_port)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(addr, port_s, &hints, &res);
    if (gai != 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "store: cannot resolve MASTER_ADDR \"%s\": %s",
                             addr, gai_strerror(gai));
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        /* Lets a new job bind while connections of a finished one linger in TIME_WAIT; on
         * Linux it does not let two listeners share a port. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        return accel__seterr(
            NULL, ACCEL_EIO, "store: cannot serve on %s:%d: %s (%s)", addr, port, strerror(err),
            err == EADDRINUSE ? "another job or program uses this port: give each job its own "
                                "MASTER_PORT, or start it with accel launch"
                              : "MASTER_ADDR must be an address of process 0's machine");
    }
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *bound_port = sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&sa)->sin_port);

    accel__store_server *srv = accel__calloc(1, sizeof(*srv));
    entry *table = accel__calloc(64, sizeof(entry));
    if (srv == NULL || table == NULL || pipe2(srv->wake, O_CLOEXEC) != 0) {
        accel__free(table);
        accel__free(srv);
        close(fd);
        return accel__seterr(NULL, ACCEL_ENOMEM, "store: out of memory starting the server");
    }
    srv->listen_fd = fd;
    pthread_mutex_init(&srv->hook_mu, NULL);
    srv->hook = hook;
    srv->hook_arg = hook_arg;
    srv->table = table;
    srv->table_cap = 64;
    if (pthread_create(&srv->thread, NULL, serve, srv) != 0) {
        pthread_mutex_destroy(&srv->hook_mu);
        close(srv->wake[0]);
        close(srv->wake[1]);
        close(fd);
        accel__free(table);
        accel__free(srv);
        return accel__seterr(NULL, ACCEL_EINTERNAL, "store: cannot start the server thread");
    }
    *out = srv;
    return ACCEL_OK;
}

void accel__store_server_detach(accel__store_server *srv)
{
    pthread_mutex_lock(&srv->hook_mu);
    srv->hook = NULL; /* its argument may go away now */
    pthread_mutex_unlock(&srv->hook_mu);
    pthread_detach(srv->thread);
}

void accel__store_server_stop(accel__store_server *srv)
{
    if (srv == NULL) {
        return;
    }
    char b = 1;
    while (write(srv->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(srv->thread, NULL);
    for (size_t i = 0; i < srv->n_conns; i++) {
        (void)flush_out(srv->conns[i]); /* answers already given go out before the close */
        conn_free(srv->conns[i]);
    }
    for (size_t i = 0; i < srv->table_cap; i++) {
        accel__free(srv->table[i].key);
        accel__free(srv->table[i].value);
    }
    close(srv->wake[0]);
    close(srv->wake[1]);
    close(srv->listen_fd);
    pthread_mutex_destroy(&srv->hook_mu);
    accel__free(srv->conns);
    accel__free(srv->table);
    accel__free(srv);
}
