/*
 * The gloo backend: processes on many machines over TCP, through Gloo (gloo_cxx.cc wraps it).
 * Rendezvous through the job's store at MASTER_ADDR:MASTER_PORT (served by the launcher under
 * a multi-machine accel launch, else by process 0), listening on ACCEL_SOCKET_IFNAME /
 * GLOO_SOCKET_IFNAME or the interface of the route to MASTER_ADDR, in the route's family when
 * the interface has an address of it.
 *
 * The collectives are in gloo_coll.c.
 *
 * Failures: the first process that sees one (a connection closed by a dead peer, a deadline)
 * records its diagnosis in the store ("<prefix>abort"), then resets all its connections, so
 * every peer waiting on it fails at once and, reading the record, names the original culprit
 * rather than its messenger.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "comm/comm.h"
#include "comm/store.h"
#include "gloo.h"
#include "gloo_cxx.h"
#include "gloo_impl.h"

/* ---- setup ---- */

/* The numeric form of address a (IPv4 or IPv6) in out. */
static int numeric(const struct sockaddr *a, char *out, size_t out_nbytes)
{
    const void *ip = a->sa_family == AF_INET6
                         ? (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr
                         : (const void *)&((const struct sockaddr_in *)a)->sin_addr;
    return inet_ntop(a->sa_family, ip, out, (socklen_t)out_nbytes) != NULL;
}

/* The local numeric address of the route to addr:port (where a connect would leave from), and
 * its family (AF_INET, AF_INET6) in *family. */
static accel_status route_to(const char *addr, int port, char *out, size_t out_nbytes, int *family)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_DGRAM;
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", port > 0 ? port : 29500);
    int rc = getaddrinfo(addr, ports, &hints, &res);
    if (rc != 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "gloo: cannot resolve MASTER_ADDR=%s: %s", addr,
                             gai_strerror(rc));
    }
    accel_status st = ACCEL_EIO;
    for (struct addrinfo *a = res; a != NULL && st != ACCEL_OK; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        /* A UDP connect sends nothing: it only asks the kernel for the route. */
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &len) == 0 &&
            numeric((struct sockaddr *)&ss, out, out_nbytes)) {
            *family = ss.ss_family;
            st = ACCEL_OK;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    freeaddrinfo(res);
    if (st != ACCEL_OK) {
        return accel__seterr(NULL, ACCEL_EIO,
                             "gloo: no route to MASTER_ADDR=%s from this machine (set "
                             "ACCEL_SOCKET_IFNAME to the interface to use)",
                             addr);
    }
    return ACCEL_OK;
}

/* Interface ifname's first address of `family` in out (1), never an IPv6 link-local one
 * (fe80::/10): it means something only with the scope id of the machine that has it, so no
 * other machine could connect to it. *named: the interface exists; *link_local: it has one. */
static int first_addr(const struct ifaddrs *all, const char *ifname, int family, char *out,
                      size_t out_nbytes, int *named, int *link_local)
{
    for (const struct ifaddrs *i = all; i != NULL; i = i->ifa_next) {
        if (strcmp(i->ifa_name, ifname) != 0) {
            continue;
        }
        *named = 1;
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != family) {
            continue;
        }
        if (family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr)) {
            *link_local = 1;
            continue;
        }
        if (numeric(i->ifa_addr, out, out_nbytes)) {
            return 1;
        }
    }
    return 0;
}

static const char *family_name(int family)
{
    return family == AF_INET6 ? "IPv6" : "IPv4";
}

/* The address to listen on when interface ifname is named: its first of `family`, the family
 * of the route to MASTER_ADDR, which the machines that name no interface listen in (Gloo's own
 * choice, the interface's first address whatever its family, is IPv4 on a dual-stack
 * interface, and Gloo cannot pair an IPv4 end with an IPv6 one). An interface without one
 * listens in the other family, as before (every machine may name an IPv4 interface while the
 * route to MASTER_ADDR is IPv6), saying so in `note` (else ""), which a failed connection
 * repeats. Neither: ACCEL_EINVAL, why in `why`. */
static accel_status iface_addr(const char *ifname, int family, char *out, size_t out_nbytes,
                               char *note, size_t note_nbytes, char *why, size_t why_nbytes)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) {
        snprintf(why, why_nbytes, "cannot list this machine's network interfaces: %s",
                 strerror(errno));
        return ACCEL_EIO;
    }
    const int other = family == AF_INET6 ? AF_INET : AF_INET6;
    int named = 0, link_local = 0;
    const int found = first_addr(all, ifname, family, out, out_nbytes, &named, &link_local);
    const int found_other =
        !found && first_addr(all, ifname, other, out, out_nbytes, &named, &link_local);
    freeifaddrs(all);
    note[0] = '\0';
    char lacks[192];
    snprintf(lacks, sizeof(lacks), "interface %s has no %s address%s", ifname, family_name(family),
             family == AF_INET6 && link_local
                 ? " other than link-local ones (fe80::, which other machines cannot reach)"
                 : "");
    if (!named) {
        snprintf(why, why_nbytes,
                 "this machine has no network interface named %s (ACCEL_SOCKET_IFNAME, else "
                 "GLOO_SOCKET_IFNAME)",
                 ifname);
    } else if (found_other) {
        snprintf(note, note_nbytes,
                 "%s, the family of the route to MASTER_ADDR: listening in %s instead, which "
                 "every process must then use",
                 lacks, family_name(other));
    } else if (!found) {
        snprintf(why, why_nbytes, "%s, nor an %s one: give it one, or name another interface",
                 lacks, family_name(other));
    }
    return found || found_other ? ACCEL_OK : ACCEL_EINVAL;
}

void accel__gloo_close(accel__gloo *e)
{
    if (e == NULL) {
        return;
    }
    accel__gloo_free(e->g);
    accel__store_close(e->store);
    pthread_mutex_destroy(&e->mu);
    for (size_t i = 0; i < sizeof(e->scratch) / sizeof(e->scratch[0]); i++) {
        accel__free(e->scratch[i]);
    }
    accel__free(e->process);
    accel__free(e->cnt);
    accel__free(e->send_nbytes);
    accel__free(e->recv_nbytes);
    accel__free(e->in);
    accel__free(e);
}

/* Gloo writes to its sockets with plain writev: a write to a peer that just died raises
 * SIGPIPE, whose default action ends this process before Gloo can report the peer (PyTorch
 * never sees it: Python ignores SIGPIPE). A program that left SIGPIPE at its default gets it
 * ignored, as Python does, so the write fails with EPIPE and the dead peer is an ACCEL_EPEER
 * naming it; a handler or disposition the program set is kept. */
static void ignore_sigpipe(void)
{
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
        sa.sa_handler == SIG_DFL) {
        signal(SIGPIPE, SIG_IGN);
    }
}

/* This process's ACCEL_GLOO_RING (v; NULL: unset): 0 never, 1 always, 2 (auto) when remote. */
static accel_status ring_setting(const char *v, int32_t *out)
{
    v = v != NULL && v[0] != '\0' ? v : "auto";
    const int b = strcmp(v, "auto") == 0 ? 2 : accel__parse_bool(v);
    if (b < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "environment variable ACCEL_GLOO_RING=%s must be auto, 1 or 0", v);
    }
    *out = b;
    return ACCEL_OK;
}

static const char *ring_name(int32_t v)
{
    return v == 2 ? "auto" : v ? "1" : "0";
}

static accel_status fail(accel__gloo *e, accel_status st, const char *msg, double grace);

/* The connection check's wait for member q's pair timed out: the failure names q and every later
 * member whose pair had not come either (the earlier ones' had). */
static accel_status check_timed_out(accel__gloo *e, const size_t *ix, int q,
                                    const accel__gloo_err *err)
{
    char who[200] = "";
    size_t len = 0;
    int n_missing = 0;
    for (int p = q; p < e->n_ranks; p++) {
        if (p == e->rank || (p != q && accel__gloo_arrived(e->g, ix[p]))) {
            continue;
        }
        if (len + 32 < sizeof(who)) {
            int w = snprintf(who + len, sizeof(who) - len, "%s%d", n_missing > 0 ? ", " : "",
                             e->process[p]);
            len += w > 0 ? (size_t)w : 0;
        } else if (len < sizeof(who) - 1) { /* a long list ends so, once */
            snprintf(who + len, sizeof(who) - len, ", ...");
            len = sizeof(who) - 1;
        }
        n_missing++;
    }
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg),
             "gloo: the connection check on process %d timed out after %g s waiting for "
             "process%s %s (connected, then stopped or hung, or still connecting to one that is) "
             "(%s)",
             e->process[e->rank], e->timeout_s, n_missing > 1 ? "es" : "", who, err->msg);
    return fail(e, ACCEL_ETIMEDOUT, msg, ACCEL__GLOO_GRACE_S(e->timeout_s));
}

/* The connection check, the communicator's first exchange: every member sends `mine` (two
 * int32) to every other and receives theirs into all (member q's at all + 2q), every message
 * posted before any wait (one round). Point-to-point rather than Gloo's allgather, which does
 * not say whose data is missing: a member that connected and then stopped or hung is named. */
static accel_status check_connections(accel__gloo *e, const int32_t *mine, int32_t *all)
{
    const int n = e->n_ranks, me = e->rank;
    const char *what = "the connection check";
    const size_t pair_nbytes = 2 * sizeof(int32_t);
    size_t *ix = NULL;
    ACCEL_TRY(accel__gloo_scratch(e, 2, 2 * sizeof(size_t) * (size_t)n, (void **)&ix));
    memcpy(all + 2 * me, mine, pair_nbytes);
    accel__gloo_msgs_begin(e->g);
    /* The receives first: a send then needs no ready notice from its receiver. */
    for (int q = 0; q < n; q++) {
        if (q != me) {
            GLOO_CALL(what, accel__gloo_post, e->g, 0, q, 0, all + 2 * q, pair_nbytes, &ix[q]);
        }
    }
    for (int s = 1; s < n; s++) {
        const int q = (me + s) % n;
        GLOO_CALL(what, accel__gloo_post, e->g, 1, q, 0, all + 2 * me, pair_nbytes, &ix[n + q]);
    }
    for (int q = 0; q < n; q++) {
        accel__gloo_err err = {.peer = -1};
        accel_status st = q != me ? accel__gloo_wait(e->g, ix[q], &err) : ACCEL_OK;
        if (st == ACCEL_ETIMEDOUT) {
            return check_timed_out(e, ix, q, &err);
        }
        if (st != ACCEL_OK) {
            return accel__gloo_failed(e, st, &err, what);
        }
    }
    for (int q = 0; q < n; q++) {
        if (q != me) {
            GLOO_CALL(what, accel__gloo_wait, e->g, ix[n + q]);
        }
    }
    return ACCEL_OK;
}

/* e->remote: whether some member has a peer on another host, and e->ring. Every member must take
 * the same allreduce path (gloo_coll.c's thresholds depend on both), so they agree on them in the
 * connection check: each member's (remote, ACCEL_GLOO_RING) to every other, a different setting
 * refused alike on every member. */
static accel_status agree_paths(accel__gloo *e, int32_t ring)
{
    const int n = e->n_ranks;
    int32_t mine[2] = {accel__gloo_remote_peers(e->g) > 0, ring};
    int32_t *all = accel__calloc((size_t)n, sizeof(mine));
    if (all == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory");
    }
    accel_status st = check_connections(e, mine, all);
    for (int q = 0; q < n && st == ACCEL_OK; q++) {
        e->remote |= all[2 * q] != 0;
    }
    for (int q = 1; q < n && st == ACCEL_OK; q++) {
        if (all[2 * q + 1] != all[1]) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "gloo: processes disagree on ACCEL_GLOO_RING: process %d has %s, "
                               "process %d has %s (set it alike on every machine, or nowhere)",
                               e->process[0], ring_name(all[1]), e->process[q],
                               ring_name(all[2 * q + 1]));
        }
    }
    if (st == ACCEL_OK) {
        e->ring = all[1] == 2 ? e->remote : all[1];
    }
    accel__free(all);
    return st;
}

/* Tells the members of communicator `prefix` waiting in its rendezvous (every wait there polls
 * for "<prefix>setup_failed") that this process's setup failed: `why`, unless NULL (a failure
 * it read there), and that it knows ("<prefix>setup_seen/<rank>", which process 0 awaits
 * before its store goes). Best effort, like fail()'s record: a stopped process 0 (its store
 * answers nothing) costs ACCEL__STORE_RECORD_S, not a store timeout. */
static void tell_setup_failed(accel__store *store, const char *prefix, int rank, const char *why)
{
    char key[ACCEL__ERRMSG_NBYTES];
    accel__store_bound(store, accel__now() + ACCEL__STORE_RECORD_S);
    if (why != NULL) {
        snprintf(key, sizeof(key), "%ssetup_failed", prefix);
        (void)accel__store_set(store, key, why, strlen(why));
    }
    snprintf(key, sizeof(key), "%ssetup_seen/%d", prefix, rank);
    (void)accel__store_set(store, key, "", 0);
    accel__store_bound(store, 0); /* process 0 then awaits the others' word on it */
}

void accel__gloo_refuse(const accel__comm_config *cfg, const char *prefix, accel_status st)
{
    char why[ACCEL__ERRMSG_NBYTES];
    snprintf(why, sizeof(why), "%s", accel_last_error(NULL));
    accel__store *store = NULL;
    /* A store not up yet may come within the wait; a stopped one is not waited for. */
    accel__store_config sc = {.addr = cfg->master_addr,
                              .port = cfg->master_port,
                              .timeout_s = ACCEL__GLOO_SEEN_WAIT(cfg->timeout_s),
                              .answer_s = ACCEL__STORE_RECORD_S};
    if (accel__store_open(&store, &sc) == ACCEL_OK) {
        tell_setup_failed(store, prefix, cfg->rank, why);
        accel__store_close(store);
    }
    accel__seterr(NULL, st, "%s", why); /* not the store's word */
}

void accel__gloo_await_seen(accel__store *store, const char *prefix, int n_members, int self,
                            double until)
{
    const size_t n = (size_t)n_members, key_nbytes = strlen(prefix) + 32;
    char *keys = accel__calloc(n, key_nbytes);
    const char **ptrs = accel__calloc(n, sizeof(*ptrs));
    size_t n_keys = 0;
    for (size_t q = 0; q < n && keys != NULL && ptrs != NULL; q++) {
        if ((int)q != self) {
            ptrs[n_keys] = keys + q * key_nbytes;
            snprintf(keys + q * key_nbytes, key_nbytes, "%ssetup_seen/%zu", prefix, q);
            n_keys++;
        }
    }
    const double left = until - accel__now();
    if (keys != NULL && ptrs != NULL && n_keys > 0 && left > 0) {
        (void)accel__store_wait(store, ptrs, n_keys, left);
    }
    accel__free(ptrs);
    accel__free(keys);
}

accel_status accel__gloo_open(accel__gloo **out, const accel__comm_config *cfg, const char *prefix,
                              int serve, const int *process)
{
    ignore_sigpipe();
    accel__gloo *e = accel__calloc(1, sizeof(*e));
    const size_t n = (size_t)cfg->n_ranks;
    if (e == NULL || pthread_mutex_init(&e->mu, NULL) != 0) {
        accel__free(e);
        return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory");
    }
    e->process = accel__calloc(n, sizeof(int));
    e->cnt = accel__calloc(n, sizeof(size_t));
    e->send_nbytes = accel__calloc(n, sizeof(size_t));
    e->recv_nbytes = accel__calloc(n, sizeof(size_t));
    e->in = accel__calloc(n, sizeof(void *));
    if (e->process == NULL || e->cnt == NULL || e->send_nbytes == NULL || e->recv_nbytes == NULL ||
        e->in == NULL) {
        accel__gloo_close(e);
        return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory");
    }
    e->rank = cfg->rank;
    e->n_ranks = cfg->n_ranks;
    e->timeout_s = cfg->timeout_s;
    e->log = cfg->log;
    for (size_t q = 0; q < n; q++) {
        e->process[q] = process != NULL ? process[q] : cfg->process_base + (int)q;
    }
    snprintf(e->prefix, sizeof(e->prefix), "%s", prefix);

    char host[64] = "";
    accel__store_config sc = {.addr = cfg->master_addr,
                              .port = cfg->master_port,
                              .serve = serve,
                              .timeout_s = cfg->timeout_s};
    int32_t ring = 0;
    accel_status st = accel__store_open(&e->store, &sc);
    if (st == ACCEL_OK) { /* a bad value then ends the others' wait below, naming it */
        st = ring_setting(cfg->gloo_ring, &ring);
    }
    int family = AF_UNSPEC;
    if (st == ACCEL_OK) {
        st = route_to(cfg->master_addr, cfg->master_port, host, sizeof(host), &family);
    }
    if (st == ACCEL_OK) {
        accel__gloo_err err = {.peer = -1};
        char note[320] = "";
        snprintf(e->listen, sizeof(e->listen), "%s", host);
        if (cfg->socket_ifname != NULL) {
            snprintf(e->listen, sizeof(e->listen), "%s", cfg->socket_ifname);
            st = iface_addr(cfg->socket_ifname, family, host, sizeof(host), note, sizeof(note),
                            err.msg, sizeof(err.msg));
            if (st == ACCEL_OK) {
                snprintf(e->listen, sizeof(e->listen), "%s (%s)", cfg->socket_ifname, host);
            }
            if (note[0] != '\0') {
                accel__log(&e->log, ACCEL__LOG_INFO, "gloo: %s", note);
            }
        }
        if (st == ACCEL_OK) {
            st = accel__gloo_connect(&e->g, e->store, e->prefix, e->rank, e->n_ranks, host,
                                     cfg->timeout_s, &err);
        }
        if (st == ACCEL_EPEER && err.peer < 0) {
            st = accel__seterr(NULL, st, "%s", err.msg); /* another process's published failure */
        } else if (st != ACCEL_OK) {
            /* After a timeout the store names only the key, Gloo only an address: say whose. */
            char who[160] = "";
            if (st == ACCEL_ETIMEDOUT && err.peer >= 0) {
                snprintf(who, sizeof(who),
                         err.unconnected
                             ? "process %d did not connect within %g s (it, or a process it "
                               "connects to first, is stopped, hung, or dead): "
                             : "process %d never arrived (not started, stopped, hung, or died): ",
                         e->process[err.peer], cfg->timeout_s);
            }
            st = accel__seterr(NULL, st,
                               "gloo: process %d could not connect to the other %d processes "
                               "through the store at %s (listening on %s%s%s): %s%s",
                               e->process[e->rank], e->n_ranks - 1, accel__store_name(e->store),
                               e->listen, note[0] != '\0' ? "; " : "", note, who, err.msg);
        }
    }
    if (st != ACCEL_OK && e->store != NULL) {
        /* The others are waiting for this process: end their wait with the reason (unless it
         * is another's, read there). */
        char why[ACCEL__ERRMSG_NBYTES];
        snprintf(why, sizeof(why), "%s", accel_last_error(NULL));
        tell_setup_failed(e->store, e->prefix, e->rank, st != ACCEL_EPEER ? why : NULL);
        if (serve) {
            accel__gloo_await_seen(e->store, e->prefix, e->n_ranks, e->rank,
                                   accel__now() + ACCEL__GLOO_SEEN_WAIT(cfg->timeout_s));
        }
        accel__seterr(NULL, st, "%s", why); /* not the store's word on these keys */
    }
    if (st != ACCEL_OK) {
        /* Process 0's server stays up so that the others fail on their own deadline with a
         * message, not on a vanished store. */
        if (serve) {
            accel__store_abandon(e->store);
            e->store = NULL;
        }
        accel__gloo_close(e);
        return st;
    }
    st = agree_paths(e, ring);
    if (st != ACCEL_OK) {
        accel__gloo_close(e);
        return st;
    }
    accel__log(&e->log, ACCEL__LOG_INFO,
               "gloo: %d processes connected, listening on %s, store %s%s", e->n_ranks, e->listen,
               accel__store_name(e->store),
               e->ring && e->n_ranks >= 2 ? ", f32/f64 reductions from 256 KiB in ring order" : "");
    *out = e;
    return ACCEL_OK;
}

/* ---- failures ---- */

/* Records the first failure of this communicator job-wide (first to the store wins) or adopts
 * the one recorded there, resets every connection so peers waiting on this rank fail at once,
 * and returns it with the message set. With grace > 0 (a wait that timed out), first gives the
 * others up to grace s to record theirs.
 *
 * Why the grace: a wait here that timed out may be waiting on a process that itself waits on
 * the culprit (hier: process 0 across for process 2, stuck inside its machine on a stopped
 * process 3). Both deadlines pass within microseconds of each other; the diagnosis recorded
 * first names the process at fault for everyone. */
static accel_status fail(accel__gloo *e, accel_status st, const char *msg, double grace)
{
    pthread_mutex_lock(&e->mu);
    if (atomic_load(&e->broken)) {
        pthread_mutex_unlock(&e->mu);
        return accel__seterr(NULL, e->broken_st, "%s", e->broken_msg);
    }
    char rec[ACCEL__ERRMSG_NBYTES + 16];
    char key[sizeof(e->prefix) + 8], mkey[sizeof(key) + 8];
    snprintf(key, sizeof(key), "%sabort", e->prefix);
    snprintf(mkey, sizeof(mkey), "%s/msg", key);
    /* Recording is best effort: its store traffic ends ACCEL__STORE_RECORD_S after the wait for
     * another's diagnosis, answered or not (a stopped process 0's store answers nothing). */
    const double until = accel__now() + grace + ACCEL__STORE_RECORD_S;
    size_t got = 0;
    int64_t first = 0;
    if (e->store != NULL) {
        accel__store_bound(e->store, until);
        if (grace > 0) { /* a record that comes is adopted below */
            (void)accel__store_get(e->store, mkey, rec, sizeof(rec), &got, grace);
        }
    }
    const int me = e->process[e->rank];
    snprintf(rec, sizeof(rec), "%d|%d|%s", (int)st, me, msg);
    if (e->store != NULL && accel__store_add(e->store, key, 1, &first) == ACCEL_OK) {
        if (first == 1) {
            (void)accel__store_set(e->store, mkey, rec, strlen(rec));
        } else {
            /* Someone else saw it first: its record is the cause (written before the connection
             * resets that woke us, so a short wait is enough). */
            double left = until - accel__now() - 0.5; /* the answer's own time */
            if (accel__store_get(e->store, mkey, rec, sizeof(rec) - 1, &got,
                                 left > 0.1 ? left : 0.1) == ACCEL_OK) {
                rec[got] = '\0';
            }
        }
    }
    if (e->store != NULL) {
        accel__store_bound(e->store, 0);
    }
    /* "<status>|<process>|<message>": another process's diagnosis is said to be its, unless its
     * message starts by naming it ("gloo: process 2 aborted ..."). */
    char *bar = strchr(rec, '|'), *bar2 = bar != NULL ? strchr(bar + 1, '|') : NULL;
    const int by = bar2 != NULL ? atoi(bar + 1) : me;
    const char *text = bar2 != NULL ? bar2 + 1 : msg;
    const char *body = strncmp(text, "gloo: ", 6) == 0 ? text + 6 : text;
    char own[32];
    snprintf(own, sizeof(own), "process %d ", by);
    e->broken_st = bar2 != NULL ? (accel_status)atoi(rec) : st;
    if (by == me || strncmp(body, own, strlen(own)) == 0) {
        snprintf(e->broken_msg, sizeof(e->broken_msg), "%s", text);
    } else {
        snprintf(e->broken_msg, sizeof(e->broken_msg), "gloo: process %d reported: %s", by, body);
    }
    atomic_store(&e->broken, 1);
    pthread_mutex_unlock(&e->mu);
    accel__gloo_break(e->g);
    return accel__seterr(NULL, e->broken_st, "%s", e->broken_msg);
}

accel_status accel__gloo_failed(accel__gloo *e, accel_status st, const accel__gloo_err *err,
                                const char *what)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    const int me = e->process[e->rank];
    if (err->peer >= 0 && st == ACCEL_EPEER) {
        snprintf(msg, sizeof(msg),
                 "gloo: process %d died or closed its connection to process %d during %s (%s)",
                 e->process[err->peer], me, what, err->msg);
    } else if (st == ACCEL_ETIMEDOUT && err->peer >= 0) {
        snprintf(msg, sizeof(msg),
                 "gloo: %s on process %d timed out after %g s waiting for process %d (stopped, "
                 "hung, or calling a different collective) (%s)",
                 what, me, e->timeout_s, e->process[err->peer], err->msg);
    } else if (st == ACCEL_ETIMEDOUT) {
        /* Inside one of Gloo's own collectives, which does not say whose data is missing. */
        snprintf(msg, sizeof(msg),
                 "gloo: %s on process %d timed out after %g s waiting for another process "
                 "(stopped, hung, or calling a different collective; Gloo does not say which) "
                 "(%s)",
                 what, me, e->timeout_s, err->msg);
    } else {
        snprintf(msg, sizeof(msg), "gloo: %s failed on process %d: %s", what, me, err->msg);
    }
    /* Time for another's diagnosis (see fail()). */
    double grace = st != ACCEL_ETIMEDOUT ? 0 : ACCEL__GLOO_GRACE_S(e->timeout_s);
    return fail(e, st, msg, grace);
}

void accel__gloo_abort(accel__gloo *e, accel_status st, const char *msg)
{
    if (e == NULL) {
        return;
    }
    char m[ACCEL__ERRMSG_NBYTES];
    snprintf(m, sizeof(m), "gloo: process %d aborted the communicator: %s", e->process[e->rank],
             msg);
    (void)fail(e, st, m, 0);
}

/* ---- the backend ---- */

/* World communicators made by this process: each gets its own keys in the store. */
static _Atomic unsigned n_worlds;

static accel_status gloo_init(const accel__comm_config *cfg, void **impl)
{
    char prefix[400];
    snprintf(prefix, sizeof(prefix), "%.300s/%d/gloo/w%u/", cfg->job_id != NULL ? cfg->job_id : "",
             cfg->restart_count, atomic_fetch_add(&n_worlds, 1));
    return accel__gloo_open((accel__gloo **)impl, cfg, prefix, !cfg->store_served && cfg->rank == 0,
                            NULL);
}

/* Each child connects its members under its own keys; then every member of the parent learns
 * every child's outcome (an allgather of statuses over the parent), so all fail or none. */
static accel_status gloo_split(void *impl, const accel__comm_split_info *how, void **child)
{
    accel__gloo *e = impl, *c = NULL;
    *child = NULL;
    const unsigned long long k = ++e->n_splits;
    int32_t *all = accel__calloc((size_t)e->n_ranks, sizeof(int32_t));
    int *process = how->cfg != NULL ? accel__calloc((size_t)how->cfg->n_ranks, sizeof(int)) : NULL;
    accel_status st =
        all == NULL || (how->cfg != NULL && process == NULL) ? ACCEL_ENOMEM : ACCEL_OK;
    if (st != ACCEL_OK) {
        accel__free(all);
        accel__free(process);
        return fail(e, st, "gloo: out of memory in accel__comm_split", 0);
    }
    if (how->cfg != NULL) {
        char prefix[sizeof(e->prefix) + 48];
        snprintf(prefix, sizeof(prefix), "%ss%llu.%d/", e->prefix, k, how->color);
        for (int i = 0; i < how->cfg->n_ranks; i++) {
            process[i] = e->process[how->members[i]];
        }
        st = accel__gloo_open(&c, how->cfg, prefix, 0, process);
    }
    char mine[ACCEL__ERRMSG_NBYTES] = "";
    if (st != ACCEL_OK) {
        snprintf(mine, sizeof(mine), "%s", accel_last_error(NULL));
    }
    all[e->rank] = (int32_t)st;
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, &all[e->rank], all, 1, ACCEL_I32, ACCEL_SUM, 0);
    accel_status ex = accel__gloo_run(e, &op);
    for (int q = 0; q < e->n_ranks && ex == ACCEL_OK; q++) {
        if (all[q] != ACCEL_OK) {
            ex = q == e->rank ? accel__seterr(NULL, st, "%s", mine)
                              : accel__seterr(NULL, (accel_status)all[q],
                                              "accel__comm_split: process %d could not connect "
                                              "its group over gloo (%s)",
                                              e->process[q], accel_status_name(all[q]));
        }
    }
    accel__free(all);
    accel__free(process);
    if (ex != ACCEL_OK) {
        accel__gloo_close(c);
        return ex;
    }
    *child = c;
    return ACCEL_OK;
}

accel_status accel__gloo_split(accel__gloo *e, const accel__comm_split_info *how,
                               accel__gloo **child)
{
    void *c = NULL;
    accel_status st = gloo_split(e, how, &c);
    *child = c;
    return st;
}

void accel__gloo_describe(const accel__gloo *e, char *buf, size_t nbytes)
{
    snprintf(buf, nbytes, "gloo across %d processes, listening on %s", e->n_ranks, e->listen);
}

static void gloo_describe(void *impl, char *buf, size_t nbytes)
{
    accel__gloo_describe(impl, buf, nbytes);
}

static accel_status gloo_run(void *impl, const accel__coll *op)
{
    return accel__gloo_run(impl, op);
}

/* Plain memory, but still the collective the contract makes it (checked like a call). */
static accel_status gloo_mem_alloc(void *impl, size_t nbytes, void **out)
{
    ACCEL_TRY(accel__gloo_alloc_check(impl, nbytes));
    return accel__comm_plain_alloc(impl, nbytes, out);
}

static void gloo_abort(void *impl, accel_status st, const char *msg)
{
    accel__gloo_abort(impl, st, msg);
}

static void gloo_destroy(void *impl)
{
    accel__gloo_close(impl);
}

const accel__comm_ops accel__gloo_ops = {
    .init = gloo_init,
    .split = gloo_split,
    .run = gloo_run,
    .abort = gloo_abort,
    .mem_alloc = gloo_mem_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = gloo_destroy,
    .describe = gloo_describe,
};
