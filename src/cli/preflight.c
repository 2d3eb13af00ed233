/*
 * `accel launch --preflight` on several machines: before the program starts, every rank's
 * network paths are tried. Each launcher listens on the address its machine uses towards
 * machine 0 (its "node leader" endpoint) and publishes it in the store; then it forks one
 * probe per local rank (the rank's environment, before exec), which opens its own store
 * connection and connects to every machine's endpoint. A probe that fails prints and records
 * the failing hop; every launcher waits for every machine's verdict, so all of them agree on
 * whether the job may start. The probes use no accel API beyond the store.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "comm/store.h"
#include "launch.h"

#define HOP_TIMEOUT_S 10.0

/* A listening socket on the address this machine uses to reach master_addr (the kernel's
 * route: a UDP connect sends nothing), port 0. Writes "addr port" to ep. Returns the fd. */
static int listen_towards(const char *master, int port, char *ep, size_t cap)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(master, port_s, &hints, &res) != 0) {
        return -1;
    }
    struct sockaddr_storage me;
    socklen_t len = sizeof(me);
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
             getsockname(fd, (struct sockaddr *)&me, &len) == 0;
    if (fd >= 0) {
        close(fd);
    }
    freeaddrinfo(res);
    if (!ok) {
        return -1;
    }
    if (me.ss_family == AF_INET) {
        ((struct sockaddr_in *)&me)->sin_port = 0;
    } else {
        ((struct sockaddr_in6 *)&me)->sin6_port = 0;
    }
    fd = socket(me.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (fd < 0 || bind(fd, (struct sockaddr *)&me, len) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&me, &len) != 0 ||
        getnameinfo((struct sockaddr *)&me, len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    snprintf(ep, cap, "%s %s", host, serv);
    return fd;
}

/* Connects to "addr port", sends our rank and waits for the one-byte answer. 0 or errno. */
static int probe_endpoint(const char *ep, int rank)
{
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (sscanf(ep, "%1024s %31s", host, serv) != 2) {
        return EINVAL;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, serv, &hints, &res) != 0) {
        return EINVAL;
    }
    int err = 0;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {(time_t)HOP_TIMEOUT_S, 0};
    if (fd < 0) {
        err = errno;
    } else {
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* bounds connect too */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        uint32_t r = (uint32_t)rank;
        char ack = 0;
        if (connect(fd, res->ai_addr, res->ai_addrlen) != 0 ||
            send(fd, &r, sizeof(r), MSG_NOSIGNAL) != (ssize_t)sizeof(r)) {
            err = errno;
        } else if (recv(fd, &ack, 1, 0) != 1) {
            err = errno != 0 ? errno : ECONNRESET;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return err == EINPROGRESS || err == EAGAIN ? ETIMEDOUT : err;
}

/* The probe of one rank (a forked child): never returns. */
static void probe(const launch_settings *s, int port, int rank)
{
    char key[64], ep[NI_MAXHOST + 40], why[1200] = "";
    size_t nb = 0;
    accel__store *st = NULL;
    accel__store_config sc = {.addr = s->master_addr, .port = port, .timeout_s = HOP_TIMEOUT_S};
    if (accel__store_open(&st, &sc) != ACCEL_OK) {
        accel__host_port(ep, sizeof(ep), s->master_addr, port);
        fprintf(stderr,
                "accel launch: preflight: rank %d (machine %d) -> the rendezvous store at %s: "
                "%s\n",
                rank, s->machine_rank, ep, accel_last_error(NULL));
        _exit(2);
    }
    for (int m = 0; m < s->num_machines && why[0] == '\0'; m++) {
        snprintf(key, sizeof(key), "launch/leader/%d", m);
        if (accel__store_get(st, key, ep, sizeof(ep) - 1, &nb, HOP_TIMEOUT_S) != ACCEL_OK) {
            snprintf(why, sizeof(why), "machine %d's launcher: no endpoint published: %s", m,
                     accel_last_error(NULL));
            break;
        }
        ep[nb] = '\0';
        int err = probe_endpoint(ep, rank);
        if (err != 0) {
            char *sp = strchr(ep, ' '), at[NI_MAXHOST + 40];
            if (sp != NULL) {
                *sp = '\0';
            }
            accel__host_port(at, sizeof(at), ep, sp != NULL ? atoi(sp + 1) : 0);
            snprintf(why, sizeof(why), "machine %d's launcher at %s: %s", m, at, strerror(err));
        }
    }
    snprintf(key, sizeof(key), "launch/preflight/%d", rank);
    const char *v = why[0] != '\0' ? why : "ok";
    accel_status st_set = accel__store_set(st, key, v, strlen(v));
    if (why[0] != '\0') {
        fprintf(stderr, "accel launch: preflight: rank %d (machine %d) -> %s\n", rank,
                s->machine_rank, why);
    }
    accel__store_close(st);
    fflush(stderr);
    _exit(why[0] != '\0' || st_set != ACCEL_OK ? 1 : 0);
}

/* Answers one probe: reads its rank, sends one byte. */
static void answer(int lfd)
{
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
        return;
    }
    struct timeval tv = {1, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    uint32_t rank;
    if (recv(c, &rank, sizeof(rank), MSG_WAITALL) == (ssize_t)sizeof(rank)) {
        (void)send(c, "k", 1, MSG_NOSIGNAL);
    }
    close(c);
}

int launch_preflight(const launch_settings *s, launch_rdzv *r)
{
    accel__store *st = launch_rdzv_store(r);
    const int me = s->machine_rank, N = s->n_procs * s->num_machines;
    const int port = launch_rdzv_port(r);
    char ep[NI_MAXHOST + 40], key[64];
    int lfd = listen_towards(s->master_addr, port, ep, sizeof(ep));
    if (lfd < 0) {
        fprintf(stderr,
                "accel launch: preflight: machine %d cannot listen on its address "
                "towards %s: %s\n",
                me, s->master_addr, strerror(errno));
        return 1;
    }
    const char *closed = getenv("ACCEL_TEST_PREFLIGHT_CLOSED");
    if (closed != NULL && strcmp(closed, "1") == 0) {
        /* Test hook: this machine's endpoint is published but unreachable (a firewall). Closed
         * before it is published: a probe that connected in between would be reset, not
         * refused. */
        close(lfd);
        lfd = -1;
    }
    /* Test hook "drop": the endpoint listens but never answers (a firewall that drops), so
     * every probe's hop to it waits HOP_TIMEOUT_S. */
    const int serve_fd = closed != NULL && strcmp(closed, "drop") == 0 ? -1 : lfd;
    snprintf(key, sizeof(key), "launch/leader/%d", me);
    pid_t *pids = accel__calloc((size_t)s->n_procs, sizeof(*pids));
    if (pids == NULL || accel__store_set(st, key, ep, strlen(ep)) != ACCEL_OK) {
        fprintf(stderr, "accel launch: preflight: %s\n",
                pids == NULL ? "out of memory" : accel_last_error(NULL));
        if (lfd >= 0) {
            close(lfd);
        }
        accel__free(pids);
        return 1;
    }
    fflush(NULL); /* the probes must not write our buffered output again */
    int n_left = 0, failed = 0, rc = 0;
    const pid_t launcher = getpid();
    for (int i = 0; i < s->n_procs; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            launch_stop_release(); /* the launcher's flag would not stop a probe */
            /* The probe opens its own store connection. Holding the launcher's (and its
             * listener) would keep them open past a SIGKILL of the launcher, so machine 0
             * would not see it gone ("launch/lost/<m>") until the probes end; and a probe
             * must not outlive its launcher, which no longer waits for it. */
            if (close_range(3, ~0U, 0) != 0) { /* a kernel before 5.9 */
                for (int fd = 3; fd < 65536; fd++) {
                    close(fd);
                }
            }
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) {
                _exit(1);
            }
            probe(s, port, me * s->n_procs + i);
        }
        if (pid < 0) {
            fprintf(stderr, "accel launch: preflight: fork: %s\n", strerror(errno));
            failed = 1;
            break;
        }
        pids[n_left++] = pid;
    }
    /* Serve the probes of every machine until every machine has its verdict, a stop signal or
     * a failure another launcher published. */
    const double deadline = accel__now() + s->rdzv_timeout_s;
    int published = 0, all = 0;
    while (!all && accel__now() < deadline && (rc = launch_rdzv_check(r, "the preflight")) == 0) {
        struct pollfd p = {.fd = serve_fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            answer(lfd);
        }
        int wst;
        pid_t pid;
        while ((pid = waitpid(-1, &wst, WNOHANG)) > 0) {
            for (int i = 0; i < s->n_procs; i++) {
                pids[i] = pids[i] == pid ? 0 : pids[i];
            }
            n_left--;
            failed |= !(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
        }
        if (n_left == 0 && !published) {
            snprintf(key, sizeof(key), "launch/preflight_done/%d", me);
            (void)accel__store_set(st, key, failed ? "failed" : "ok", failed ? 6 : 2);
            published = 1;
        }
        all = published;
        for (int m = 0; m < s->num_machines && all; m++) {
            char v[8];
            size_t nb;
            snprintf(key, sizeof(key), "launch/preflight_done/%d", m);
            if (accel__store_get(st, key, v, sizeof(v), &nb, 0) != ACCEL_OK) {
                all = 0;
            } else if (nb != 2) {
                failed = 1; /* another machine's rank failed a hop */
            }
        }
    }
    for (int i = 0; rc != 0 && i < s->n_procs; i++) {
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL); /* stopped: their hops may wait HOP_TIMEOUT_S */
        }
    }
    if (lfd >= 0) {
        close(lfd); /* after the kill: a hop reset by it would be printed after our cause */
    }
    while (n_left > 0 && wait(NULL) > 0) {
        n_left--;
    }
    accel__free(pids);
    if (rc != 0) {
        return rc;
    }
    if (!all) {
        fprintf(stderr,
                "accel launch: preflight: not every machine finished its checks within "
                "%g s\n",
                s->rdzv_timeout_s);
        return 1;
    }
    if (failed) {
        /* Name every failing hop of the job, whichever machine it started from. */
        for (int rank = 0; rank < N; rank++) {
            char v[1200];
            size_t nb = 0;
            snprintf(key, sizeof(key), "launch/preflight/%d", rank);
            if (accel__store_get(st, key, v, sizeof(v) - 1, &nb, 0) != ACCEL_OK) {
                fprintf(stderr,
                        "accel launch: preflight failed: rank %d (machine %d) did not "
                        "reach the rendezvous store\n",
                        rank, rank / s->n_procs);
            } else if ((v[nb] = '\0', strcmp(v, "ok") != 0)) {
                fprintf(stderr, "accel launch: preflight failed: rank %d (machine %d) -> %s\n",
                        rank, rank / s->n_procs, v);
            }
        }
        return 1;
    }
    char at[320];
    accel__host_port(at, sizeof(at), s->master_addr, port);
    fprintf(stderr,
            "accel launch: preflight: all %d ranks reached the rendezvous at %s and the "
            "launchers of all %d machines\n",
            N, at, s->num_machines);
    return 0;
}
