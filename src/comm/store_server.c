/*
 * The store's server: one thread polling the listening socket, a wake-up pipe and every client
 * connection (all non-blocking); what a request does is store_requests.c's.
 *
 * Invariants: the server never blocks on a client (answers go through a per-connection output
 * buffer), so one stalled or hostile client cannot stop the others; a connection that ends is
 * taken out of the list before its loss is handled (which may answer the others).
 */
#include <errno.h>
#include <fcntl.h>
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
#include "store_server.h"
#include "store_wire.h"

/* ---- connections ---- */

/* Reads what the connection has. Returns -1 when it is finished (EOF or error). */
static int on_readable(accel__store_server *srv, conn *c)
{
    for (;;) {
        if (store_reserve(&c->in, &c->in_cap, c->in_len + 4096) != 0) {
            return -1;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            if (c->in_len > 4 + STORE_BODY_MAX + 8) {
                accel__store_consume(srv, c); /* a full message is there: do not buffer more */
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
            accel__store_consume(srv, c);
            return 0;
        }
        return -1;
    }
}

/* Writes pending output. Returns -1 when the connection is finished. */
int accel__store_flush_out(conn *c)
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
    accel__store_unpark(c);
    accel__store_forget_presence(c);
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
        if (store_reserve((uint8_t **)&fds, &fds_cap, need) != 0) {
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
                accel__store_try_parked(srv, c, now);
            }
            if (c->out_len > c->out_off || c->closing) {
                done |= accel__store_flush_out(c) != 0;
            }
            if (done) {
                srv->conns[i] = NULL; /* before accel__store_lost(): updated() skips it */
                accel__store_lost(srv, c);
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
                                       accel__store_hook hook, void *hook_arg, int *bound_port,
                                       int *in_use)
{
    *in_use = 0;
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
    accel_status bad = accel__store_refuse_link_local(addr, res);
    if (bad != ACCEL_OK) {
        freeaddrinfo(res);
        return bad;
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
    if (fd < 0 && err == EADDRINUSE) {
        /* Name the holder when we can: usually the same job started twice. */
        char owner[256], who[300] = "";
        *in_use = 1;
        accel__port_owner(port, owner, sizeof(owner));
        if (owner[0] != '\0') {
            snprintf(who, sizeof(who), "%s listens there; ", owner);
        }
        return accel__seterr(NULL, ACCEL_EIO,
                             "store: cannot serve on %s:%d: %s (%sanother job or program uses "
                             "this port: give each job its own port: accel launch "
                             "--main_process_port, 0 picks a free one; MASTER_PORT for processes "
                             "started by hand)",
                             addr, port, strerror(err), who);
    }
    if (fd < 0) {
        return accel__seterr(NULL, ACCEL_EIO, "store: cannot serve on %s:%d: %s (%s)", addr, port,
                             strerror(err),
                             "MASTER_ADDR must be an address of process 0's machine");
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

void accel__store_server_unhook(accel__store_server *srv)
{
    pthread_mutex_lock(&srv->hook_mu);
    srv->hook = NULL; /* its argument may go away now */
    pthread_mutex_unlock(&srv->hook_mu);
}

void accel__store_server_detach(accel__store_server *srv)
{
    accel__store_server_unhook(srv);
    pthread_detach(srv->thread);
}

/* Reads and drops what c sent that the stopped server will not handle: closing a socket with
 * unread input resets the connection, dropping what is not sent yet (the farewell). A client
 * has at most one request in flight, so more than two of the largest is one that keeps writing:
 * the drain stops there (its farewell may be lost) rather than read it for ever. */
static void drain_in(conn *c)
{
    uint8_t buf[4096];
    size_t left = 2 * (4 + (size_t)STORE_BODY_MAX);
    ssize_t n;
    while (left > 0 && (n = recv(c->fd, buf, left < sizeof(buf) ? left : sizeof(buf), 0)) > 0) {
        left -= (size_t)n;
    }
}

void accel__store_server_stop(accel__store_server *srv, const char *why)
{
    if (srv == NULL) {
        return;
    }
    char b = 1;
    while (write(srv->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(srv->thread, NULL);
    for (size_t i = 0; i < srv->n_conns; i++) {
        /* Answers already given go out before the close, then why the server stops: a client
         * waiting now or asking later reads it instead of a bare closed connection (best
         * effort: a client whose socket buffer is full misses it). */
        conn *c = srv->conns[i];
        accel__store_farewell(c, why);
        drain_in(c);
        (void)accel__store_flush_out(c);
        conn_free(c);
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
