/*
 * What the store's client (store.c) and server (store_server.c) share: the wire format of
 * store.h's comment, little-endian helpers, and the server's start/stop.
 */
#ifndef ACCEL_COMM_STORE_WIRE_H
#define ACCEL_COMM_STORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

struct addrinfo;
/* ACCEL_EINVAL naming MASTER_ADDR addr when one of res, getaddrinfo's answer for it, is an IPv6
 * link-local address (store.h, accel__store_open); else ACCEL_OK. */
accel_status accel__store_refuse_link_local(const char *addr, const struct addrinfo *res);

#define STORE_MAGIC 0x54534341u /* "ACST" */
#define STORE_VERSION 2u /* 2: the GONE answer */
#define STORE_REQ_HEAD 8u /* op, 0, key count, timeout ms */
/* The largest request body: a set of the largest key and value, or a wait on many keys. */
#define STORE_BODY_MAX (STORE_REQ_HEAD + 2u + ACCEL__STORE_KEY_MAX + 4u + ACCEL__STORE_VALUE_MAX)
#define STORE_WAIT_KEYS_MAX 4096u

/* PRESENCE with one key and a value declares the connection's presence (the server sets key to
 * value if the connection ends without a PRESENCE of no key, its departure). BEAT (no key; the
 * timeout field is the silence asked about) names the connection as a beater and is answered
 * with the beaters silent for longer (store.h, accel__store_beat). */
enum {
    STORE_SET = 1,
    STORE_GET = 2,
    STORE_ADD = 3,
    STORE_WAIT = 4,
    STORE_PRESENCE = 5,
    STORE_BEAT = 6
};
#define STORE_BEAT_NAME_MAX ACCEL__STORE_BEAT_NAME_MAX
#define STORE_SILENT_MAX ACCEL__STORE_SILENT_MAX
/* Response status: OK; MISSING: the deadline passed (payload: the first missing key); BAD: a
 * malformed request (payload: why), after which the server closes the connection; GONE: the
 * server stopped (payload: why), the connection's last answer, sent to every client at the
 * stop, so that a client reads it as the answer to its request in progress or its next one. */
enum { STORE_OK = 0, STORE_MISSING = 1, STORE_BAD = 2, STORE_GONE = 3 };

static inline void store_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void store_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}
static inline void store_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}
static inline uint16_t store_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t store_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t store_get64(const uint8_t *p)
{
    return (uint64_t)store_get32(p) | (uint64_t)store_get32(p + 4) << 32;
}

typedef struct accel__store_server accel__store_server;

/* Binds addr:port (port 0: any free port; *bound_port says which) and starts the server
 * thread. The error names the address; *in_use is 1 when the port is taken. */
accel_status accel__store_server_start(accel__store_server **out, const char *addr, int port,
                                       accel__store_hook hook, void *hook_arg, int *bound_port,
                                       int *in_use);
/* The key a store sets to the cause while it lingers after a failure (accel__store_close_failed),
 * for a process that finds the port taken meanwhile. */
#define STORE_CLOSING_KEY "store/closing"
/* Stops the thread and closes every connection, answering each with GONE and why (the
 * client's message; see accel__store_farewell). Accepts NULL. */
void accel__store_server_stop(accel__store_server *srv, const char *why);
/* Stops calling the hook (its argument may go away); the server goes on serving. */
void accel__store_server_unhook(accel__store_server *srv);
/* Lets the server run until the process exits (its memory stays in use), without its hook. */
void accel__store_server_detach(accel__store_server *srv);

/* TCP keepalive and a user timeout on a presence connection (either end), so that a machine
 * that vanishes (no FIN ever comes) ends the connection within about 10 s. */
void accel__store_keepalive(int fd);

#endif /* ACCEL_COMM_STORE_WIRE_H */
