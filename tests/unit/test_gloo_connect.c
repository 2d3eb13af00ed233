/*
 * Two moments of a gloo communicator's setup with a peer that stops:
 *
 * 1. accel__gloo_connect with a peer whose record is in the store but which never connects (a
 *    process stopped, or killed with its launcher, right after it published its addresses): the
 *    wait for its connection ends at the communicator's timeout. Gloo waits 5 times a pair's
 *    timeout for its first connection, and the pairs had ACCEL_TIMEOUT, so such a peer cost
 *    5 x ACCEL_TIMEOUT (10 s at 2 s in the fault sweep; 2.5 hours at the default 1800 s). Only
 *    the side of a pair that listens waits so, the side with the lower address; the planted
 *    record's port is the highest there is in the comparison (raw 0xffff), so rank 0 here always
 *    listens. With timeout 1 s: at most 3 s (before: 5 s), ACCEL_ETIMEDOUT naming rank 1 (before:
 *    ACCEL_EIO naming nobody).
 * 2. accel__gloo_open (process 0) with a peer (a child) that connects and then stops, before the
 *    connection check, the communicator's first exchange: ACCEL_ETIMEDOUT naming process 1
 *    (before: "Gloo does not say which", the check being Gloo's own allgather). With two
 *    stopped peers, both are named; with one stopped and one alive, only the stopped one (the
 *    live one, which also waits for it, may record the diagnosis first). Then the same
 *    with another process's diagnosis already recorded in the store (planted): process 0 adopts
 *    it as "process 2 reported: ..." (before: the bare text, "... on process 2 ...", which read
 *    as its own).
 */
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "check.h"
#include "comm/store.h"
#ifdef ACCEL_HAVE_GLOO
#include "comm/gloo/gloo.h"
#include "comm/gloo/gloo_cxx.h"
#endif

#define LIMIT_S 3.0         /* the timeout (1 s) plus a loaded machine's margin; before: 5 s */
#define CHECK_TIMEOUT_S 2.0 /* case 2: the rendezvous with the children comes within it */

#ifdef ACCEL_HAVE_GLOO
static void connect_never(void)
{
    accel__store *st = NULL;
    accel__store_config c = {.addr = "127.0.0.1", .port = 0, .serve = 1, .timeout_s = 5};
    CHECK_OK(NULL, accel__store_open(&st, &c));
    /* Rank 1's record: Gloo's tcp::Address of its pair with rank 0, trivially copyable: a
     * sockaddr_storage and a sequence number. Nothing listens there. */
    struct {
        struct sockaddr_storage ss;
        ssize_t seq;
    } rec;
    memset(&rec, 0, sizeof(rec));
    struct sockaddr_in *sa = (struct sockaddr_in *)&rec.ss;
    sa->sin_family = AF_INET;
    sa->sin_port = 0xffff;
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_OK(NULL, accel__store_set(st, "t/1", &rec, sizeof(rec)));

    accel__gloo_ctx *g = NULL;
    accel__gloo_err err = {.peer = -1};
    const double t0 = accel__now();
    accel_status s = accel__gloo_connect(&g, st, "t/", 0, 2, "127.0.0.1", 1.0, &err);
    const double took = accel__now() - t0;
    printf("test_gloo_connect: %s after %.2f s, peer %d: %s\n", accel_status_name(s), took,
           err.peer, err.msg);
    CHECK(s == ACCEL_ETIMEDOUT);
    CHECK(err.peer == 1);
    CHECK_MSG(took <= LIMIT_S, "took %.2f s", took);
    accel__gloo_free(g);
    accel__store_close(st);
}

/* Member `rank` of n_ranks of a gloo communicator whose store is at 127.0.0.1:port. */
static accel__comm_config member_config(int rank, int n_ranks, int port)
{
    return (accel__comm_config){.backend = "gloo",
                                .rank = rank,
                                .n_ranks = n_ranks,
                                .local_n_ranks = 1,
                                .master_addr = "127.0.0.1",
                                .master_port = port,
                                .timeout_s = CHECK_TIMEOUT_S};
}

/* A child, rank `rank` of n_ranks under `prefix` in the store at the port it reads from fd:
 * with `stops`, connects (accel__gloo_connect) and then stops before the connection check;
 * else opens the communicator whole (accel__gloo_open), failing as it may, and exits. Returns
 * its pid. */
static pid_t start_member(const char *prefix, int rank, int n_ranks, int stops, int *to_child)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* stopped or not, when a failed check ends the parent */
        close(fds[1]);
        int port = 0;
        if (read(fds[0], &port, sizeof(port)) != (ssize_t)sizeof(port)) {
            _exit(1);
        }
        if (!stops) {
            accel__comm_config cfg = member_config(rank, n_ranks, port);
            accel__gloo *e = NULL;
            _exit(accel__gloo_open(&e, &cfg, prefix, 0, NULL) == ACCEL_OK ? 0 : 1);
        }
        accel__store_config c = {.addr = "127.0.0.1", .port = port, .timeout_s = 10};
        accel__store *st = NULL;
        accel__gloo_ctx *g = NULL;
        accel__gloo_err err = {.peer = -1};
        if (accel__store_open(&st, &c) != ACCEL_OK ||
            accel__gloo_connect(&g, st, prefix, rank, n_ranks, "127.0.0.1", 10, &err) != ACCEL_OK) {
            fprintf(stderr, "test_gloo_connect: the child could not connect: %s\n", err.msg);
            _exit(1);
        }
        raise(SIGSTOP);
        _exit(0);
    }
    close(fds[0]);
    *to_child = fds[1];
    return pid;
}

/* Process 0's accel__gloo_open with children 1, 2, ...: kinds[q - 1] is 'S' for one that stops
 * after connecting, 'L' for one that lives. `planted`: another process's diagnosis is in the
 * store first. The message must start with `want` (anywhere: contain it). */
static void check_stopped(const char *prefix, const char *kinds, const char *planted,
                          const char *want, int anywhere)
{
    const int n_ranks = 1 + (int)strlen(kinds);
    pid_t pids[8];
    int to_child[8];
    CHECK(n_ranks <= 8);
    for (int q = 1; q < n_ranks; q++) {
        pids[q] = start_member(prefix, q, n_ranks, kinds[q - 1] == 'S', &to_child[q]);
    }
    accel__store *st = NULL;
    accel__store_config c = {.addr = "127.0.0.1", .port = 0, .serve = 1, .timeout_s = 5};
    CHECK_OK(NULL, accel__store_open(&st, &c));
    int port = accel__store_port(st);
    if (planted != NULL) {
        char key[64];
        snprintf(key, sizeof(key), "%sabort", prefix);
        CHECK_OK(NULL, accel__store_add(st, key, 1, NULL));
        snprintf(key, sizeof(key), "%sabort/msg", prefix);
        CHECK_OK(NULL, accel__store_set(st, key, planted, strlen(planted)));
    }
    for (int q = 1; q < n_ranks; q++) {
        CHECK(write(to_child[q], &port, sizeof(port)) == (ssize_t)sizeof(port));
        close(to_child[q]);
    }
    accel__comm_config cfg = member_config(0, n_ranks, port);
    accel__gloo *e = NULL;
    const double t0 = accel__now();
    accel_status s = accel__gloo_open(&e, &cfg, prefix, 0, NULL);
    const double took = accel__now() - t0;
    const char *msg = accel_last_error(NULL);
    printf("test_gloo_connect: %s after %.2f s: %s\n", accel_status_name(s), took, msg);
    CHECK(s == ACCEL_ETIMEDOUT);
    CHECK_MSG(anywhere ? strstr(msg, want) != NULL : strncmp(msg, want, strlen(want)) == 0,
              "\"%s\"\n    does not %s \"%s\"", msg, anywhere ? "contain" : "start with", want);
    /* The timeout, the grace (a quarter), the record (1 s), and a loaded machine's margin. */
    CHECK_MSG(took <= CHECK_TIMEOUT_S + 6, "took %.2f s", took);
    for (int q = 1; q < n_ranks; q++) {
        kill(pids[q], SIGKILL);
        CHECK(waitpid(pids[q], NULL, 0) == pids[q]);
    }
    accel__store_close(st);
}
#endif

int main(void)
{
#ifndef ACCEL_HAVE_GLOO
    printf("test_gloo_connect: skipped: this build has no gloo backend\n");
    return 0;
#else
    connect_never();
    check_stopped("s/", "S", NULL,
                  "gloo: the connection check on process 0 timed out after 2 s waiting for "
                  "process 1 (connected, then stopped or hung, or still connecting to one that "
                  "is) (",
                  0);
    /* Every process whose data did not come is named, not one that sent its data. */
    check_stopped("ss/", "SS", NULL,
                  "gloo: the connection check on process 0 timed out after 2 s waiting for "
                  "processes 1, 2 (",
                  0);
    check_stopped("sl/", "SL", NULL, "timed out after 2 s waiting for process 1 (", 1);
    char planted[128];
    snprintf(planted, sizeof(planted),
             "%d|2|gloo: the connection check on process 2 timed out after 2 s waiting for "
             "process 1",
             (int)ACCEL_ETIMEDOUT);
    check_stopped("r/", "S", planted,
                  "gloo: process 2 reported: the connection check on process 2 timed out after 2 "
                  "s waiting for process 1",
                  0);
    printf("test_gloo_connect: ok\n");
    return 0;
#endif
}
