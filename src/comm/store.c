/*
 * The store's client (and, for the serving process, the owner of the server): connection with
 * retries until the deadline, the greeting, and one synchronous request/answer exchange per
 * call over a non-blocking socket, every read and write bounded by poll() and a deadline.
 *
 * Invariant: requests and answers alternate on the connection; an exchange that fails half-way
 * (timeout, server gone, malformed answer) leaves the stream out of step, so the handle is then
 * broken and every later call fails at once with the first failure's status.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "store_wire.h"

/* How long past its own deadline a get/wait waits for the server's "missing" answer, unless
 * the config says otherwise. */
#define ANSWER_GRACE_S 5.0

struct accel__store {
    int fd;
    accel__store_server *srv; /* this process serves the store */
    int port;
    double timeout_s;
    double grace_s;      /* see ANSWER_GRACE_S */
    double answer_s;     /* accel__store_config.answer_s */
    double configured_s; /* accel__store_config.configured_s, for the connect message */
    double until;        /* accel__store_bound; 0: none */
    accel_status broken;
    char name[320]; /* "addr:port" */
};

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Milliseconds left until deadline for poll(), at least 0. */
static int ms_left(double deadline)
{
    double left = deadline - accel__now();
    return left <= 0 ? 0 : left > 3600 ? 3600000 : (int)(left * 1000.0) + 1;
}

/* ---- connecting ---- */

/* One non-blocking connect to a, bounded by deadline. Returns the fd or -1 (errno set). */
static int connect_one(const struct addrinfo *a, double deadline)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
        return -1;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof(err);
        if (poll(&p, 1, ms_left(deadline)) <= 0) {
            err = ETIMEDOUT;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
        }
        if (err != 0) {
            close(fd);
            errno = err;
            return -1;
        }
    }
    /* A connect to a local port in the ephemeral range that nobody listens on yet can pick
     * that very port as its source and connect to itself (TCP simultaneous open): it would
     * read back its own greeting and hold the port the server needs. Treat it as refused. */
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&me, &ml) == 0 &&
        getpeername(fd, (struct sockaddr *)&peer, &pl) == 0 && ml == pl &&
        memcmp(&me, &peer, ml) == 0) {
        close(fd);
        errno = ECONNREFUSED;
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* ---- raw I/O ---- */

static accel_status io_fail(accel__store *st, accel_status status, const char *what, int err)
{
    st->broken = status;
    if (status == ACCEL_EPEER) {
        return accel__seterr(NULL, status,
                             "store %s: the server closed the connection during %s (%s): the "
                             "process serving it (process 0, or machine 0's accel launch) exited "
                             "or crashed",
                             st->name, what, err != 0 ? strerror(err) : "end of stream");
    }
    return accel__seterr(NULL, status,
                         "store %s: no answer to %s before the deadline (the process serving "
                         "it, process 0 or machine 0's accel launch, is stopped, hung or "
                         "unreachable)",
                         st->name, what);
}

static accel_status send_all(accel__store *st, const uint8_t *buf, size_t n, double deadline,
                             const char *what)
{
    while (n > 0) {
        ssize_t k = send(st->fd, buf, n, MSG_NOSIGNAL);
        if (k > 0) {
            buf += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = st->fd, .events = POLLOUT};
            if (poll(&p, 1, ms_left(deadline)) == 0) {
                return io_fail(st, ACCEL_ETIMEDOUT, what, 0);
            }
            continue;
        }
        return io_fail(st, ACCEL_EPEER, what, errno);
    }
    return ACCEL_OK;
}

static accel_status recv_all(accel__store *st, uint8_t *buf, size_t n, double deadline,
                             const char *what)
{
    while (n > 0) {
        ssize_t k = recv(st->fd, buf, n, 0);
        if (k > 0) {
            buf += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            return io_fail(st, ACCEL_EPEER, what, 0);
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd p = {.fd = st->fd, .events = POLLIN};
            if (poll(&p, 1, ms_left(deadline)) == 0) {
                return io_fail(st, ACCEL_ETIMEDOUT, what, 0);
            }
            continue;
        }
        return io_fail(st, ACCEL_EPEER, what, errno);
    }
    return ACCEL_OK;
}

void accel__host_port(char *buf, size_t cap, const char *addr, int port)
{
    snprintf(buf, cap, strchr(addr, ':') != NULL ? "[%s]:%d" : "%s:%d", addr, port);
}

accel_status accel__store_refuse_link_local(const char *addr, const struct addrinfo *res)
{
    for (const struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        if (a->ai_family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr)) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "store: MASTER_ADDR=%s is " ACCEL__LINK_LOCAL_REFUSED, addr);
        }
    }
    return ACCEL_OK;
}

/* Connects (retrying while nobody listens yet) and exchanges the greeting; *again when the
 * connection closed before the greeting (connect again). */
static accel_status connect_greet(accel__store *st, const char *addr, double deadline, int *again)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", st->port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(addr, port_s, &hints, &res);
    if (gai != 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "store: cannot resolve MASTER_ADDR \"%s\": %s",
                             addr, gai_strerror(gai));
    }
    accel_status bad = accel__store_refuse_link_local(addr, res);
    if (bad != ACCEL_OK) { /* at once: unscoped, connects would fail until the deadline */
        freeaddrinfo(res);
        return bad;
    }
    double delay = 0.005;
    int err = 0;
    while ((st->fd = -1, 1)) {
        for (struct addrinfo *a = res; a != NULL && st->fd < 0; a = a->ai_next) {
            st->fd = connect_one(a, deadline);
            err = st->fd < 0 ? errno : 0;
        }
        if (st->fd >= 0 || accel__now() >= deadline) {
            break;
        }
        sleep_s(delay); /* the server is not up yet (refused) or the network hiccuped */
        delay = delay < 0.1 ? delay * 2 : 0.1;
    }
    freeaddrinfo(res);
    if (st->fd < 0) {
        return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                             "store %s: could not connect within %g s (%s): is process 0 (or "
                             "machine 0's accel launch) running, with the same MASTER_ADDR and "
                             "MASTER_PORT?",
                             st->name, st->configured_s, strerror(err));
    }
    /* A stopped server's kernel accepts the connection, but the greeting never comes: a
     * best-effort client does not wait the whole deadline for it. */
    double greet_s = st->timeout_s, greet_by = deadline; /* the wait, for the message */
    if (st->answer_s > 0 && accel__now() + st->answer_s < deadline) {
        greet_s = st->answer_s;
        greet_by = accel__now() + st->answer_s;
    }
    uint8_t hello[8], back[8];
    store_put32(hello, STORE_MAGIC);
    store_put32(hello + 4, STORE_VERSION);
    accel_status s = send_all(st, hello, 8, greet_by, "the greeting");
    if (s == ACCEL_OK) {
        s = recv_all(st, back, 8, greet_by, "the greeting");
    }
    if (s == ACCEL_EPEER && accel__now() < deadline) {
        /* Closed before greeting: a store going away (the previous communicator's, on the same
         * port) or one not up yet behind a stale listener. Connect again. */
        close(st->fd);
        st->fd = -1;
        st->broken = ACCEL_OK;
        sleep_s(0.01);
        *again = 1;
        return ACCEL_OK;
    }
    if (s == ACCEL_OK &&
        (store_get32(back) != STORE_MAGIC || store_get32(back + 4) != STORE_VERSION)) {
        s = ACCEL_EIO;
    }
    if (s == ACCEL_ETIMEDOUT) {
        /* A tiny ACCEL_TIMEOUT ends here, as does a listener that never answers. */
        return accel__seterr(NULL, s,
                             "store %s: connected, but no greeting came back within %g s (the "
                             "timeout is too short, the server is stopped, or the program "
                             "listening there is not an accel store: another program uses "
                             "MASTER_PORT?)",
                             st->name, greet_s);
    }
    if (s != ACCEL_OK) {
        return accel__seterr(NULL, ACCEL_EIO,
                             "store %s: the program listening there is not an accel store of "
                             "this version (another program uses MASTER_PORT?)",
                             st->name);
    }
    return ACCEL_OK;
}

static accel_status connect_store(accel__store *st, const char *addr, double deadline)
{
    for (;;) {
        int again = 0;
        accel_status s = connect_greet(st, addr, deadline, &again);
        if (!again) {
            return s;
        }
    }
}

/* The port st would serve is taken (status s, its message set): when an accel store there
 * lingers after a failure (accel__store_close_failed), the message goes on with that failure,
 * e.g. the clash of two jobs, read from it within a second. */
static accel_status port_taken(accel__store *st, const char *addr, accel_status s)
{
    char msg[ACCEL__ERRMSG_NBYTES], cause[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
    size_t n = 0;
    double wait_s = st->timeout_s < 1 ? st->timeout_s : 1;
    accel__store probe = {
        .fd = -1, .port = st->port, .timeout_s = wait_s, .grace_s = wait_s, .configured_s = wait_s};
    snprintf(probe.name, sizeof(probe.name), "%s", st->name);
    int found =
        connect_store(&probe, addr, accel__now() + wait_s) == ACCEL_OK &&
        accel__store_get(&probe, STORE_CLOSING_KEY, cause, sizeof(cause) - 1, &n, 0) == ACCEL_OK;
    if (probe.fd >= 0) {
        close(probe.fd);
    }
    cause[found ? n : 0] = '\0';
    return accel__seterr(NULL, s, "%s%s%s", msg,
                         found ? "; the store there closes soon, after this failure: " : "", cause);
}

accel_status accel__store_open(accel__store **out, const accel__store_config *cfg)
{
    if (out == NULL || cfg == NULL || cfg->addr == NULL || cfg->addr[0] == '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "store: no address given");
    }
    if (cfg->port < (cfg->serve ? 0 : 1) || cfg->port > 65535) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "store: port %d is not valid (1..65535; 0 only for the serving "
                             "process, which then picks a free port)",
                             cfg->port);
    }
    accel__store *st = accel__calloc(1, sizeof(*st));
    if (st == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "store: out of memory");
    }
    st->fd = -1;
    st->port = cfg->port;
    st->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1800;
    st->grace_s = cfg->grace_s > 0 ? cfg->grace_s : ANSWER_GRACE_S;
    st->answer_s = cfg->answer_s > 0 ? cfg->answer_s : 0;
    st->configured_s = cfg->configured_s > 0 ? cfg->configured_s : st->timeout_s;
    accel_status s = ACCEL_OK;
    int in_use = 0;
    if (cfg->serve) {
        s = accel__store_server_start(&st->srv, cfg->addr, cfg->port, cfg->on_set, cfg->hook_arg,
                                      &st->port, &in_use);
    }
    accel__host_port(st->name, sizeof(st->name), cfg->addr, st->port);
    if (in_use) {
        s = port_taken(st, cfg->addr, s);
    }
    if (s == ACCEL_OK) {
        s = connect_store(st, cfg->addr, accel__now() + st->timeout_s);
    }
    if (s != ACCEL_OK) {
        accel__store_close(st);
        return s;
    }
    *out = st;
    return ACCEL_OK;
}

void accel__store_close_failed(accel__store *st, const char *cause, double linger_s)
{
    if (st == NULL) {
        return;
    }
    linger_s = st->srv != NULL ? linger_s : 0;
    if (linger_s > 0) {
        accel__store_server_unhook(st->srv);
        /* Why, for a process that finds the port taken meanwhile (port_taken). A failure here
         * must not replace the thread's message: the caller is reporting its own. */
        char saved[ACCEL__ERRMSG_NBYTES];
        accel_status saved_status = accel_last_status(NULL);
        snprintf(saved, sizeof(saved), "%s", accel_last_error(NULL));
        if (cause != NULL && cause[0] != '\0' &&
            accel__store_set(st, STORE_CLOSING_KEY, cause, strlen(cause)) != ACCEL_OK) {
            accel__seterr(NULL, saved_status, "%s", saved);
        }
    }
    if (st->fd >= 0) {
        close(st->fd);
    }
    if (st->srv != NULL) {
        if (linger_s > 0) {
            sleep_s(linger_s); /* the server goes on answering, and holding the port */
        }
        /* Clients still at work learn why the server stops instead of a bare closed
         * connection: a process 0 that fails (a clash its hook saw, a failed setup step) thereby
         * tells the others the cause. */
        char why[ACCEL__ERRMSG_NBYTES];
        int n =
            snprintf(why, sizeof(why), "the process serving it (pid %d) closed it", (int)getpid());
        if (cause != NULL && cause[0] != '\0') {
            snprintf(why + n, sizeof(why) - (size_t)n, " after this failure: %s", cause);
        }
        accel__store_server_stop(st->srv, why);
    }
    accel__free(st);
}

void accel__store_close(accel__store *st)
{
    accel__store_close_failed(st, NULL, 0);
}

void accel__store_abandon(accel__store *st)
{
    if (st == NULL) {
        return;
    }
    if (st->srv != NULL) {
        accel__store_server_detach(st->srv); /* serves until the process exits */
        st->srv = NULL;
    }
    accel__store_close(st);
}

accel_status accel__store_broken(const accel__store *st)
{
    return st->broken;
}

void accel__store_interrupt(accel__store *st)
{
    if (st != NULL && st->fd >= 0) {
        shutdown(st->fd, SHUT_RDWR); /* the fd stays open (and valid) until accel__store_close */
    }
}

void accel__store_keepalive(int fd)
{
    int on = 1, idle_s = 2, intvl_s = 2, count = 3;
    unsigned user_ms = 8000; /* unacknowledged data: the same bound as the probes */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl_s, sizeof(intvl_s));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

int accel__store_port(const accel__store *st)
{
    return st->port;
}

const char *accel__store_name(const accel__store *st)
{
    return st->name;
}

/* ---- requests ---- */

static accel_status check_key(const accel__store *st, const char *key)
{
    size_t n = key != NULL ? strlen(key) : 0;
    if (n == 0 || n > ACCEL__STORE_KEY_MAX) {
        return accel__seterr(NULL, ACCEL_EINVAL, "store %s: key of %zu bytes (1..%d allowed)",
                             st->name, n, ACCEL__STORE_KEY_MAX);
    }
    return ACCEL_OK;
}

static uint8_t *put_key(uint8_t *p, const char *key)
{
    size_t n = strlen(key);
    store_put16(p, (uint16_t)n);
    memcpy(p + 2, key, n);
    return p + 2 + n;
}

/* Sends the request in req[4..len) (its length is filled in here) and reads the answer: its
 * status, and its payload (owned by the caller: accel__free) in *payload / *payload_len.
 * The answer must come before deadline. */
static accel_status exchange(accel__store *st, uint8_t *req, size_t len, double deadline,
                             const char *what, uint8_t *status, uint8_t **payload,
                             size_t *payload_len)
{
    if (st->broken != ACCEL_OK) {
        return accel__seterr(NULL, st->broken,
                             "store %s: %s: the connection failed earlier and is unusable",
                             st->name, what);
    }
    if (st->until > 0 && deadline > st->until) {
        deadline = st->until;
    }
    store_put32(req, (uint32_t)(len - 4));
    ACCEL_TRY(send_all(st, req, len, deadline, what));
    uint8_t head[5];
    ACCEL_TRY(recv_all(st, head, 4, deadline, what));
    uint32_t n = store_get32(head);
    if (n < 1 || n > 1 + ACCEL__STORE_VALUE_MAX) {
        st->broken = ACCEL_EIO;
        return accel__seterr(NULL, ACCEL_EIO, "store %s: malformed answer to %s", st->name, what);
    }
    uint8_t *body = accel__malloc(n);
    if (body == NULL) {
        st->broken = ACCEL_ENOMEM;
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "store %s: out of memory for an answer of %u "
                             "bytes",
                             st->name, (unsigned)n);
    }
    accel_status s = recv_all(st, body, n, deadline, what);
    if (s != ACCEL_OK) {
        accel__free(body);
        return s;
    }
    *status = body[0];
    if (*status == STORE_GONE) {
        st->broken = ACCEL_EPEER;
        accel_status e = accel__seterr(NULL, ACCEL_EPEER,
                                       "store %s: the server stopped before answering %s: %.*s",
                                       st->name, what, (int)(n - 1), (const char *)body + 1);
        accel__free(body);
        return e;
    }
    if (*status == STORE_BAD) {
        st->broken = ACCEL_EIO;
        accel_status e = accel__seterr(NULL, ACCEL_EIO, "store %s: the server refused %s: %.*s",
                                       st->name, what, (int)(n - 1), (const char *)body + 1);
        accel__free(body);
        return e;
    }
    memmove(body, body + 1, n - 1);
    *payload = body;
    *payload_len = n - 1;
    return ACCEL_OK;
}

void accel__store_bound(accel__store *st, double until)
{
    st->until = until;
}

void accel__store_set_timeout(accel__store *st, double timeout_s)
{
    st->timeout_s = timeout_s;
}

static uint32_t to_ms(double s)
{
    return s <= 0 ? 0 : s >= 4e6 ? 4000000000u : (uint32_t)(s * 1000.0);
}

/* The answer to a missing key: ENOTFOUND (did not wait) or ETIMEDOUT, naming the key. */
static accel_status missing(const accel__store *st, const uint8_t *key, size_t n, double timeout_s)
{
    if (timeout_s <= 0) {
        return accel__seterr(NULL, ACCEL_ENOTFOUND, "store %s: key \"%.*s\" is not set", st->name,
                             (int)n, (const char *)key);
    }
    return accel__seterr(NULL, ACCEL_ETIMEDOUT, "store %s: key \"%.*s\" was not set within %g s",
                         st->name, (int)n, (const char *)key, timeout_s);
}

/* Sends request op with key count n_keys and, when key is not NULL, key and the value (a set, a
 * declaration; a departure has neither), and waits for the answer until the store's timeout. */
static accel_status send_key_value(accel__store *st, uint8_t op, uint16_t n_keys, const char *key,
                                   const void *value, size_t nbytes, const char *what)
{
    size_t len = 4 + STORE_REQ_HEAD + (key != NULL ? 2 + strlen(key) + 4 + nbytes : 0);
    uint8_t *req = accel__calloc(1, len);
    if (req == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "store %s: out of memory", st->name);
    }
    req[4] = op;
    store_put16(req + 6, n_keys);
    if (key != NULL) {
        uint8_t *p = put_key(req + 4 + STORE_REQ_HEAD, key);
        store_put32(p, (uint32_t)nbytes);
        if (nbytes > 0) {
            memcpy(p + 4, value, nbytes);
        }
    }
    uint8_t status, *ans = NULL;
    size_t ans_len;
    accel_status s =
        exchange(st, req, len, accel__now() + st->timeout_s, what, &status, &ans, &ans_len);
    accel__free(req);
    accel__free(ans);
    return s;
}

accel_status accel__store_set(accel__store *st, const char *key, const void *value, size_t nbytes)
{
    ACCEL_TRY(check_key(st, key));
    if (nbytes > ACCEL__STORE_VALUE_MAX || (value == NULL && nbytes > 0)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "store %s: value of %zu bytes for key \"%s\" "
                             "(at most %u)",
                             st->name, nbytes, key, ACCEL__STORE_VALUE_MAX);
    }
    return send_key_value(st, STORE_SET, 0, key, value, nbytes, "a set");
}

accel_status accel__store_get(accel__store *st, const char *key, void *buf, size_t cap,
                              size_t *nbytes, double timeout_s)
{
    ACCEL_TRY(check_key(st, key));
    uint8_t req[4 + STORE_REQ_HEAD + 2 + ACCEL__STORE_KEY_MAX] = {0};
    req[4] = STORE_GET;
    store_put16(req + 6, 1);
    store_put32(req + 8, to_ms(timeout_s));
    size_t len = (size_t)(put_key(req + 4 + STORE_REQ_HEAD, key) - req);
    uint8_t status, *ans = NULL;
    size_t ans_len = 0;
    double wait_s = timeout_s > 0 ? timeout_s : 0;
    ACCEL_TRY(exchange(st, req, len, accel__now() + wait_s + st->grace_s, "a get", &status, &ans,
                       &ans_len));
    accel_status s = ACCEL_OK;
    if (status != STORE_OK) {
        s = missing(st, (const uint8_t *)key, strlen(key), timeout_s);
    } else if (ans_len > cap) {
        s = accel__seterr(NULL, ACCEL_EINVAL,
                          "store %s: the value of key \"%s\" is %zu bytes, more than the %zu "
                          "expected",
                          st->name, key, ans_len, cap);
    } else {
        if (ans_len > 0) {
            memcpy(buf, ans, ans_len);
        }
        if (nbytes != NULL) {
            *nbytes = ans_len;
        }
    }
    accel__free(ans);
    return s;
}

accel_status accel__store_add(accel__store *st, const char *key, int64_t delta, int64_t *out)
{
    ACCEL_TRY(check_key(st, key));
    uint8_t req[4 + STORE_REQ_HEAD + 2 + ACCEL__STORE_KEY_MAX + 8] = {0};
    req[4] = STORE_ADD;
    uint8_t *p = put_key(req + 4 + STORE_REQ_HEAD, key);
    store_put64(p, (uint64_t)delta);
    uint8_t status, *ans = NULL;
    size_t ans_len = 0;
    ACCEL_TRY(exchange(st, req, (size_t)(p + 8 - req), accel__now() + st->timeout_s, "an add",
                       &status, &ans, &ans_len));
    accel_status s = ACCEL_OK;
    if (status != STORE_OK || ans_len != 8) {
        st->broken = ACCEL_EIO;
        s = accel__seterr(NULL, ACCEL_EIO, "store %s: malformed answer to an add", st->name);
    } else if (out != NULL) {
        *out = (int64_t)store_get64(ans);
    }
    accel__free(ans);
    return s;
}

accel_status accel__store_wait(accel__store *st, const char *const *keys, size_t n_keys,
                               double timeout_s)
{
    if (n_keys == 0 || n_keys > STORE_WAIT_KEYS_MAX) {
        return accel__seterr(NULL, ACCEL_EINVAL, "store %s: wait on %zu keys (1..%u allowed)",
                             st->name, n_keys, STORE_WAIT_KEYS_MAX);
    }
    size_t len = 4 + STORE_REQ_HEAD;
    for (size_t i = 0; i < n_keys; i++) {
        ACCEL_TRY(check_key(st, keys[i]));
        len += 2 + strlen(keys[i]);
    }
    uint8_t *req = accel__calloc(1, len);
    if (req == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "store %s: out of memory", st->name);
    }
    req[4] = STORE_WAIT;
    store_put16(req + 6, (uint16_t)n_keys);
    store_put32(req + 8, to_ms(timeout_s));
    uint8_t *p = req + 4 + STORE_REQ_HEAD;
    for (size_t i = 0; i < n_keys; i++) {
        p = put_key(p, keys[i]);
    }
    uint8_t status, *ans = NULL;
    size_t ans_len = 0;
    double wait_s = timeout_s > 0 ? timeout_s : 0;
    accel_status s = exchange(st, req, len, accel__now() + wait_s + st->grace_s, "a wait", &status,
                              &ans, &ans_len);
    accel__free(req);
    if (s == ACCEL_OK && status != STORE_OK) {
        s = missing(st, ans, ans_len, timeout_s);
    }
    accel__free(ans);
    return s;
}

accel_status accel__store_declare(accel__store *st, const char *key, const void *value,
                                  size_t nbytes)
{
    ACCEL_TRY(check_key(st, key));
    if (nbytes > ACCEL__STORE_VALUE_MAX || (value == NULL && nbytes > 0)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "store %s: declared value of %zu bytes", st->name,
                             nbytes);
    }
    accel__store_keepalive(st->fd); /* this end notices a vanished server machine too */
    return send_key_value(st, STORE_PRESENCE, 1, key, value, nbytes, "a declaration");
}

accel_status accel__store_depart(accel__store *st)
{
    return send_key_value(st, STORE_PRESENCE, 0, NULL, NULL, 0, "a departure");
}

accel_status accel__store_beat(accel__store *st, int id, const char *name, uint64_t count,
                               int behind, double silent_s, double answer_s,
                               accel__store_silent *out, int cap, int *n_out)
{
    *n_out = 0;
    size_t n = name != NULL ? strlen(name) : 0;
    if (n == 0 || n > ACCEL__STORE_BEAT_NAME_MAX || id < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "store %s: a beat as %d with a name of %zu bytes",
                             st->name, id, n);
    }
    uint8_t req[4 + STORE_REQ_HEAD + 20 + ACCEL__STORE_BEAT_NAME_MAX] = {0};
    uint8_t *p = req + 4 + STORE_REQ_HEAD;
    req[4] = STORE_BEAT;
    store_put32(req + 8, to_ms(silent_s));
    store_put32(p, (uint32_t)id);
    store_put32(p + 4, behind ? 1u : 0u);
    store_put64(p + 8, count);
    store_put32(p + 16, (uint32_t)n);
    memcpy(p + 20, name, n);
    uint8_t status, *ans = NULL;
    size_t len = 0;
    ACCEL_TRY(exchange(st, req, 4 + STORE_REQ_HEAD + 20 + n, accel__now() + answer_s, "a beat",
                       &status, &ans, &len));
    accel_status s = ACCEL_OK;
    size_t off = 0;
    while (s == ACCEL_OK && off < len) {
        size_t m = off + 18 <= len ? store_get16(ans + off + 16) : 0;
        if (status != STORE_OK || off + 18 > len || m > ACCEL__STORE_BEAT_NAME_MAX ||
            off + 18 + m > len) {
            st->broken = ACCEL_EIO;
            s = accel__seterr(NULL, ACCEL_EIO, "store %s: malformed answer to a beat", st->name);
        } else if (*n_out < cap) {
            accel__store_silent *q = &out[(*n_out)++];
            q->id = (int)store_get32(ans + off);
            q->silent_s = store_get32(ans + off + 4) * 1e-3;
            q->count = store_get64(ans + off + 8);
            memcpy(q->name, ans + off + 18, m);
            q->name[m] = '\0';
        }
        off += 18 + m;
    }
    accel__free(ans);
    return s;
}
