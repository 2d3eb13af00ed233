/*
 * The store server's request handling (store_server.c owns the thread and the sockets): the
 * key-value table in memory (open addressing), and what each request in a connection's input
 * does, queued as an answer in its output buffer.
 *
 * Invariants: a connection has at most one request in progress (clients are synchronous); a
 * request whose keys are missing is parked with its deadline and answered as soon as the last
 * key appears or the deadline passes. A malformed request gets a BAD answer and the connection
 * is closed; a server that stops answers every client with GONE and why (store.h). A
 * connection that declared its presence and ends without departing sets its declared key
 * (unless it exists) as it goes. A connection that beats (the liveness watch's) is heard at each
 * request it sends; a beat learns which other beaters have been silent for longer than it asks
 * (or are behind it).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store_server.h"
#include "store_wire.h"

/* ---- the table ---- */

/* The slot holding key, or the free slot where it would go. */
static entry *slot(entry *table, size_t cap, const uint8_t *k, size_t n)
{
    for (size_t i = accel__fnv1a(k, n) & (cap - 1);; i = (i + 1) & (cap - 1)) {
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

/* ---- requests ---- */

static double deadline_after(uint32_t ms)
{
    return accel__now() + (double)ms * 1e-3;
}

void accel__store_unpark(conn *c)
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
    if (store_reserve(&c->out, &c->out_cap, c->out_len + 4 + len) != 0) {
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

void accel__store_farewell(conn *c, const char *why)
{
    if (!c->greeted || c->closing) {
        return; /* mid-greeting the client connects again; after a BAD it knows why */
    }
    accel__store_unpark(c);
    answer(c, STORE_GONE, why, strlen(why), NULL, 0);
    c->closing = 1;
}

/* Answers a parked request if all its keys exist now (or its deadline passed). */
void accel__store_try_parked(accel__store_server *srv, conn *c, double now)
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
        accel__store_unpark(c);
    } else if (now >= c->deadline) {
        answer(c, STORE_MISSING, c->keys[c->next_key], c->key_lens[c->next_key], NULL, 0);
        accel__store_unpark(c);
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
            accel__store_try_parked(srv, c, now);
            /* Send now rather than at the next poll round: the setter may be done with the
             * store, and stop the server, before then. A failure shows at the next poll. */
            if (!c->parked) {
                (void)accel__store_flush_out(c);
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

void accel__store_forget_presence(conn *c)
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
        accel__store_forget_presence(c);
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
    accel__store_forget_presence(c);
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
void accel__store_lost(accel__store_server *srv, conn *c)
{
    accel__store_unpark(c); /* c takes no answer any more */
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
        accel__store_unpark(c);
        bad(c, "server out of memory");
        return;
    }
    memcpy(c->req, body, len);
    p = c->req + STORE_REQ_HEAD;
    end = c->req + len;
    for (size_t i = 0; i < n_keys; i++) {
        if (read_key(&p, end, &c->keys[i], &c->key_lens[i]) != 0) {
            accel__store_unpark(c);
            bad(c, "malformed key");
            return;
        }
    }
    if (p != end) {
        accel__store_unpark(c);
        bad(c, "trailing bytes");
        return;
    }
    c->parked = 1;
    c->op = op;
    c->n_keys = n_keys;
    c->next_key = 0;
    c->deadline = deadline_after(timeout_ms);
    accel__store_try_parked(srv, c, accel__now());
}

/* Handles every complete message in c->in. */
void accel__store_consume(accel__store_server *srv, conn *c)
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
            if (store_reserve(&c->out, &c->out_cap, c->out_len + 8) != 0) {
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
