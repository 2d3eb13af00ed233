/*
 * Setup-failure records in the store against a stopped process 0 (its store answers nothing):
 * each is best effort and bounded by ACCEL__STORE_RECORD_S (1 s), where a store call used to
 * wait its whole timeout. A stopped server looks, to a client connected before the stop, like a
 * greeter that then never answers (the fake here, a child process); to a new client, like a
 * listener that never greets (a real store, SIGSTOPped). The cases, each limited to 3 s where
 * the unbounded calls took 5 s or more:
 *  1. shm: a process whose setup failed records it (accel__shm_rdv_fail): its get waited the
 *     store's answer grace (5 s);
 *  2. gloo: a process whose setup failed after its store connected (a bad ACCEL_GLOO_RING, with
 *     ACCEL_TIMEOUT=6) tells the others (tell_setup_failed): its set waited 6 s;
 *  3. gloo: a process that refuses a communicator (accel__gloo_refuse, hier's shm level failed)
 *     connects to tell it: the greeting waited 5 s.
 *  4. shm: a second claimant of a rank (two jobs on one port) reports the clash in the store
 *     (clash() in shm_rdv.c) to a process 0 that stops as it receives the report (its store's
 *     hook stops it before the answer): the set waited the store's timeout (6 s).
 * Each keeps its own message. With a store that answers, the records are all there (the bound
 * does not cut them).
 *
 * And the shm rendezvous's waits on a process 0 whose store answers but which does not do its
 * part, each ACCEL_ETIMEDOUT saying what process 0 had not done (before, the store's message:
 * 'key "shm/1/job" was not set within 0.99 s'): it never publishes the job, or it never creates
 * the segment after the rank was claimed.
 */
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "check.h"
#include "comm/shm.h"
#include "comm/store.h"
#include "comm/store_wire.h"
#ifdef ACCEL_HAVE_GLOO
#include "comm/gloo/gloo.h"
#endif

#define LIMIT_S 3.0 /* the bound (1 s) plus a loaded machine's margin; unbounded: 5 s or more */

/* A child that greets every connection as a store does, then never answers (as process 0
 * stopped after the others connected). Returns its pid; its port in *port. */
static pid_t start_greeter(int *port)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 16) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    *port = ntohs(sa.sin_port);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* also when a failed check ends the parent */
        for (;;) { /* the connections stay open (and unread) until the parent kills us */
            int fd = accept(lfd, NULL, NULL);
            uint8_t hello[8], back[8];
            store_put32(back, STORE_MAGIC);
            store_put32(back + 4, STORE_VERSION);
            if (fd < 0) {
                _exit(1);
            }
            if (recv(fd, hello, 8, MSG_WAITALL) != 8 || send(fd, back, 8, 0) != 8) {
                close(fd);
            }
        }
    }
    close(lfd);
    return pid;
}

static void end_child(pid_t pid)
{
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, NULL, 0) == pid);
}

/* The hook of start_store's child with stop_at_clash: stops the process serving the store as
 * a clash report arrives, before the report's set is answered. */
static void stop_on_clash(void *arg, const char *key, const void *value, size_t nbytes)
{
    (void)arg, (void)value, (void)nbytes;
    const size_t n = strlen(key);
    if (n >= 6 && strcmp(key + n - 6, "/clash") == 0) {
        raise(SIGSTOP);
    }
}

/* A real store served by a child (to be stopped; with stop_at_clash, it stops itself at a
 * clash report). Returns its pid; its port in *port. */
static pid_t start_store(int *port, int stop_at_clash)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* stopped or not, when a failed check ends the parent */
        accel__store_config c = {.addr = "127.0.0.1",
                                 .port = 0,
                                 .serve = 1,
                                 .timeout_s = 5,
                                 .on_set = stop_at_clash ? stop_on_clash : NULL};
        accel__store *st = NULL;
        CHECK_OK(NULL, accel__store_open(&st, &c));
        int p = accel__store_port(st);
        CHECK(write(fds[1], &p, sizeof(p)) == (ssize_t)sizeof(p));
        for (;;) {
            pause();
        }
    }
    close(fds[1]);
    CHECK(read(fds[0], port, sizeof(*port)) == (ssize_t)sizeof(*port));
    close(fds[0]);
    return pid;
}

static accel__store *open_client(int port, int serve)
{
    accel__store_config c = {.addr = "127.0.0.1", .port = port, .serve = serve, .timeout_s = 60};
    accel__store *st = NULL;
    CHECK_OK(NULL, accel__store_open(&st, &c));
    return st;
}

/* Checks that a record call took at most LIMIT_S and kept status want and message text. */
static void check_record(const char *what, double t0, accel_status got, accel_status want,
                         const char *text)
{
    double took = accel__now() - t0;
    printf("%s: %.2f s\n", what, took);
    CHECK_MSG(took <= LIMIT_S, "%s took %.2f s (bound: 1 s)", what, took);
    CHECK_MSG(got == want && strcmp(accel_last_error(NULL), text) == 0, "%s: %s \"%s\"", what,
              accel_status_name(got), accel_last_error(NULL));
}

static void expect_key(accel__store *st, const char *key, const char *want)
{
    char buf[ACCEL__ERRMSG_NBYTES];
    size_t n = 0;
    CHECK_OK(NULL, accel__store_get(st, key, buf, sizeof(buf) - 1, &n, 0));
    buf[n] = '\0';
    CHECK_MSG(strcmp(buf, want) == 0, "%s: \"%s\", want \"%s\"", key, buf, want);
}

/* 1. accel__shm_rdv_fail of process 1 on the store st. */
static accel_status shm_record(accel__store *st)
{
    accel__shm *s = accel__calloc(1, sizeof(*s));
    CHECK(s != NULL);
    s->rank = 1;
    s->n_ranks = 2;
    s->store = st;
    snprintf(s->rdv_key, sizeof(s->rdv_key), "shm/9/");
    accel__seterr(NULL, ACCEL_EINVAL, "shm: process 1's own failure");
    accel_status r = accel__shm_rdv_fail(s, ACCEL_EINVAL);
    accel__free(s);
    return r;
}

static void shm_fail(void)
{
    int port;
    pid_t pid = start_store(&port, 0);
    accel__store *st = open_client(port, 0); /* connected first, then stopped */
    CHECK(kill(pid, SIGSTOP) == 0);
    double t0 = accel__now();
    accel_status r = shm_record(st);
    check_record("shm setup failure, process 0 stopped", t0, r, ACCEL_EINVAL,
                 "shm: process 1's own failure");
    accel__store_close(st);
    end_child(pid);

    /* a store that answers has the record */
    st = open_client(0, 1);
    t0 = accel__now();
    r = shm_record(st);
    check_record("shm setup failure", t0, r, ACCEL_EINVAL, "shm: process 1's own failure");
    expect_key(st, "shm/9/done", "process 1: shm: process 1's own failure");
    accel__store_close(st);
}

/* The shm rendezvous of process 1 of 2 (accel__shm_rdv_begin) at the store on `port`, with
 * timeout_s; its keys are "shm/<n>/", n counting this process's rendezvous (rdv_calls here). */
static unsigned rdv_calls;

static accel__shm *rdv_process(double timeout_s)
{
    accel__shm *s = accel__calloc(1, sizeof(*s));
    CHECK(s != NULL);
    s->rank = 1;
    s->n_ranks = 2;
    s->timeout_s = timeout_s;
    return s;
}

static accel_status rdv_begin(accel__shm *s, int port, double timeout_s)
{
    accel__comm_config cfg = {.backend = "shm",
                              .rank = 1,
                              .n_ranks = 2,
                              .local_n_ranks = 2,
                              .master_addr = "127.0.0.1",
                              .master_port = port};
    char key[64], want[32];
    accel_status r = accel__shm_rdv_begin(s, &cfg, key, sizeof(key), accel__now() + timeout_s);
    snprintf(want, sizeof(want), "shm/%u/", ++rdv_calls);
    CHECK_MSG(strcmp(s->rdv_key, want) == 0, "keys \"%s\", planted \"%s\"", s->rdv_key, want);
    return r;
}

static void rdv_end(accel__shm *s)
{
    accel__store_close(s->store);
    accel__free(s);
}

static void shm_rdv_waits(void)
{
    accel__store *st = open_client(0, 1); /* process 0's store, but not process 0 */
    const int port = accel__store_port(st);
    char want[ACCEL__ERRMSG_NBYTES], key[64];

    /* it never publishes the job */
    accel__shm *s = rdv_process(1);
    double t0 = accel__now();
    accel_status r = rdv_begin(s, port, 1);
    snprintf(want, sizeof(want),
             "shm: process 0 did not begin the job's rendezvous within 1 s (the job met at "
             "127.0.0.1:%d; its store answers, but process 0 is stuck before this "
             "communicator, creates fewer of them than this process, or the store is another "
             "program's)",
             port);
    check_record("shm rendezvous, no job", t0, r, ACCEL_ETIMEDOUT, want);
    rdv_end(s);

    /* it published the job, the rank is claimed, but it never creates the segment */
    snprintf(key, sizeof(key), "shm/%u/job", rdv_calls + 1);
    CHECK_OK(NULL, accel__store_set(st, key, "2 abc", 5));
    s = rdv_process(1);
    CHECK_OK(NULL, rdv_begin(s, port, 1));
    t0 = accel__now();
    r = accel__shm_rdv_created(s, ACCEL_OK, accel__now() + 1);
    snprintf(want, sizeof(want),
             "shm: process 0 did not create the segment within 1 s (the job met at "
             "127.0.0.1:%d; its store answers: process 0 is stuck in its setup)",
             port);
    check_record("shm rendezvous, no segment", t0, r, ACCEL_ETIMEDOUT, want);
    rdv_end(s);
    accel__store_close(st);
}

/* 4. A clash reported to a process 0 that stops on receiving it. */
static void shm_clash(void)
{
    int port;
    pid_t pid = start_store(&port, 1);
    accel__store *st = open_client(port, 0);
    char key[64];
    snprintf(key, sizeof(key), "shm/%u/job", rdv_calls + 1);
    CHECK_OK(NULL, accel__store_set(st, key, "2 abc", 5));
    snprintf(key, sizeof(key), "shm/%u/rank/1", rdv_calls + 1);
    CHECK_OK(NULL, accel__store_add(st, key, 1, NULL)); /* another job's process 1 */
    accel__store_close(st);
    accel__shm *s = rdv_process(6);
    double t0 = accel__now();
    accel_status r = rdv_begin(s, port, 6);
    char want[ACCEL__ERRMSG_NBYTES];
    snprintf(want, sizeof(want),
             "shm: rank 1 of the job at 127.0.0.1:%d was already taken by another process: two "
             "jobs use the same MASTER_ADDR and MASTER_PORT, and both stop (give each job its "
             "own MASTER_PORT, or start it with accel launch)",
             port);
    check_record("shm clash report, process 0 stopped", t0, r, ACCEL_EINVAL, want);
    rdv_end(s);
    end_child(pid);
}

#ifdef ACCEL_HAVE_GLOO
static accel__comm_config gloo_config(int port, int rank, double timeout_s)
{
    return (accel__comm_config){.backend = "gloo",
                                .rank = rank,
                                .n_ranks = 2,
                                .local_n_ranks = 1,
                                .master_addr = "127.0.0.1",
                                .master_port = port,
                                .timeout_s = timeout_s,
                                .gloo_ring = "bogus"};
}

static void gloo_fail(void)
{
    int port;
    pid_t pid = start_greeter(&port);
    accel__comm_config cfg = gloo_config(port, 1, 6);
    accel__gloo *g = NULL;
    double t0 = accel__now();
    accel_status r = accel__gloo_open(&g, &cfg, "t/", 0, NULL);
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
    CHECK_MSG(strstr(msg, "bogus") != NULL, "%s", msg);
    check_record("gloo setup failure, process 0 stopped", t0, r, ACCEL_EINVAL, msg);
    end_child(pid);

    /* a store that answers has the record */
    accel__store *st = open_client(0, 1);
    cfg = gloo_config(accel__store_port(st), 1, 6);
    CHECK(accel__gloo_open(&g, &cfg, "t/", 0, NULL) == ACCEL_EINVAL);
    expect_key(st, "t/setup_failed", msg);
    expect_key(st, "t/setup_seen/1", "");
    accel__store_close(st);
}

static void gloo_refuse(void)
{
    int port;
    pid_t pid = start_store(&port, 0);
    CHECK(kill(pid, SIGSTOP) == 0);
    accel__comm_config cfg = gloo_config(port, 1, 60);
    double t0 = accel__now();
    accel__seterr(NULL, ACCEL_ETIMEDOUT, "shm: process 1's own failure");
    accel__gloo_refuse(&cfg, "t/", ACCEL_ETIMEDOUT);
    check_record("gloo refusal, process 0 stopped", t0, accel_last_status(NULL), ACCEL_ETIMEDOUT,
                 "shm: process 1's own failure");
    end_child(pid);

    /* a store that answers has the record */
    accel__store *st = open_client(0, 1);
    cfg = gloo_config(accel__store_port(st), 1, 60);
    accel__seterr(NULL, ACCEL_ETIMEDOUT, "shm: process 1's own failure");
    accel__gloo_refuse(&cfg, "t/", ACCEL_ETIMEDOUT);
    expect_key(st, "t/setup_failed", "shm: process 1's own failure");
    expect_key(st, "t/setup_seen/1", "");
    accel__store_close(st);
}
#endif

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    shm_fail();
    shm_rdv_waits();
    shm_clash();
#ifdef ACCEL_HAVE_GLOO
    gloo_fail();
    gloo_refuse();
#else
    printf("gloo cases skipped: this build has no gloo backend\n");
#endif
    printf("test_comm_records: ok\n");
    return 0;
}
