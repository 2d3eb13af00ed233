/*
 * The liveness watch (src/comm/watch.h), with forked processes of one machine and a store:
 *  - a process killed: every other one's member fails with EPEER naming it and its pid, in
 *    about a second;
 *  - a process stopped while another has an operation in flight: that member fails with
 *    ETIMEDOUT after its timeout, naming the stopped process and its pid;
 *  - process 0 serving the store killed: the others fail with EPEER naming process 0;
 *  - a clean end: nobody fails, and process 0 (serving) leaves only after the others left;
 *  - two "machines" of 2 processes: process 3 stopped while the others wait: each fails with
 *    ETIMEDOUT, process 0 and 1 naming process 3 by its missing heartbeat (they cannot see it
 *    in /proc: not their machine), process 2 by /proc, and none names a live process;
 *  - the same, process 3 running but never posting (busy elsewhere): it is named as behind
 *    (its count of operations posted), not as silent;
 *  - process 0 serving the store stopped: process 1 fails with ETIMEDOUT naming process 0;
 *  - an operation complete but never tested (the member's progress counts it): no stall.
 * Each child reports its member's failures on a pipe as "status message" lines. The scenarios
 * are independent (each its own store, port, key prefix and pipe), and nearly all their time is
 * waiting for a timeout or a heartbeat, so each runs in a process of its own, all at once: the
 * test takes its longest scenario's time (about 4 s) instead of their sum (about 14 s).
 */
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "check.h"
#include "comm/store.h"
#include "comm/watch.h"

static int report_fd;      /* the children's end of the scenario's pipe */
static int report_rd;      /* the scenario's end */
static double complete_at; /* progress: the operation in flight completes then (0: never) */
static accel__watch_member *the_member;
static int port;

static void on_fail(void *arg, accel_status st, const char *msg)
{
    char line[1200];
    int n = snprintf(line, sizeof(line), "%d %s %s\n", *(int *)arg, accel_status_name(st), msg);
    CHECK(write(report_fd, line, (size_t)n) == n); /* one write: lines do not interleave */
}

/* The backend's side: an operation completes at complete_at, and nobody tests it. */
static void progress(void *arg)
{
    (void)arg;
    if (complete_at > 0 && accel__now() > complete_at &&
        atomic_load(&the_member->done) < atomic_load(&the_member->posted)) {
        atomic_fetch_add(&the_member->done, 1);
    }
}

/* A free port, its socket still bound in *fd (the caller closes it). */
static int free_port(int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    CHECK(bind(*fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(getsockname(*fd, (struct sockaddr *)&a, &len) == 0);
    return ntohs(a.sin_port);
}

static accel__store *open_store(int serve)
{
    accel__store_config c = {.addr = "127.0.0.1", .port = port, .serve = serve, .timeout_s = 10};
    accel__store *st = NULL;
    CHECK_OK(NULL, accel__store_open(&st, &c));
    return st;
}

typedef struct job {
    const char *prefix;
    int n, launcher; /* launcher: the parent serves the store, not process 0 */
    double timeout_s;
    int per_machine; /* processes per "machine" (0: all on one) */
} job;

/* What process i does once every process has joined (m is its member). */
typedef void (*act_fn)(const job *j, int i, accel__watch *w, accel__watch_member *m);

static void child_main(const job *j, int i, act_fn act)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed check leaves no stopped child behind */
    int serves = !j->launcher && i == 0;
    accel__store *st = open_store(serves);
    accel__store *sync = open_store(0);
    accel__watch_config wc = {.what = "test",
                              .prefix = j->prefix,
                              .addr = "127.0.0.1",
                              .launcher_serves = j->launcher,
                              .serves = serves,
                              .process = i,
                              .n_processes = j->n,
                              .local_process = j->per_machine > 0 ? i % j->per_machine : i,
                              .local_n_processes = j->per_machine > 0 ? j->per_machine : j->n,
                              .timeout_s = j->timeout_s,
                              .period_s = 0.1,
                              .log = {.rank = -1, .level = ACCEL__LOG_OFF}};
    accel__watch *w = NULL;
    CHECK_OK(NULL, accel__watch_start(&w, st, &wc));
    static accel__watch_member m;
    static int me;
    the_member = &m;
    me = i;
    m.fail = on_fail;
    m.progress = progress;
    m.arg = &me;
    m.timeout_s = j->timeout_s;
    accel__watch_join(w, &m);
    char key[64];
    snprintf(key, sizeof(key), "%s/joined", j->prefix);
    int64_t v = 0;
    CHECK_OK(NULL, accel__store_add(sync, key, 1, &v));
    snprintf(key, sizeof(key), "%s/all", j->prefix);
    if (v == j->n) {
        CHECK_OK(NULL, accel__store_set(sync, key, "", 0));
    }
    char buf[4];
    size_t n;
    CHECK_OK(NULL, accel__store_get(sync, key, buf, sizeof(buf), &n, 10));
    accel__store_close(sync);
    act(j, i, w, &m);
    _exit(0);
}

/* Starts j's processes; pids[i] is process i. */
static void start(const job *j, act_fn act, pid_t *pids)
{
    for (int i = 0; i < j->n; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            child_main(j, i, act);
        }
    }
}

/* Reads report lines for up to limit_s s, until `want` lines came; returns how many. */
static int read_reports(int fd, char *buf, size_t cap, int want, double limit_s)
{
    size_t len = 0;
    int lines = 0;
    double deadline = accel__now() + limit_s;
    while (lines < want && accel__now() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            ssize_t k = read(fd, buf + len, cap - 1 - len);
            CHECK(k > 0);
            len += (size_t)k;
            buf[len] = '\0';
            lines = 0;
            for (const char *s = buf; (s = strchr(s, '\n')) != NULL; s++) {
                lines++;
            }
        }
    }
    buf[len] = '\0';
    return lines;
}

static void reap(pid_t pid, int want_ok)
{
    int ws;
    CHECK(waitpid(pid, &ws, 0) == pid);
    if (want_ok) {
        CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child %d failed (%#x)", (int)pid, ws);
    }
}

/* Ends a scenario whose processes may still run (or be stopped): each killed and reaped. */
static void kill_all(const pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) {
        kill(pids[i], SIGKILL);
        reap(pids[i], 0);
    }
}

/* Runs j to its end, every process exiting 0, then expects no report within wait_s s. */
static void expect_no_report(const job *j, act_fn act, int fd, double wait_s, const char *what)
{
    pid_t pids[8];
    char buf[8192];
    CHECK(j->n <= 8);
    start(j, act, pids);
    for (int i = 0; i < j->n; i++) {
        reap(pids[i], 1);
    }
    int lines = read_reports(fd, buf, sizeof(buf), 1, wait_s);
    CHECK_MSG(lines == 0, "%s: %s", what, buf);
}

/* ---- the scenarios ---- */

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void killed_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)w;
    (void)m;
    if (i == j->n - 1) {
        raise(SIGKILL);
    }
    sleep_s(5); /* the failure is reported meanwhile */
}

static void stopped_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    (void)w;
    if (i == 1) {
        raise(SIGSTOP);
    }
    atomic_fetch_add(&m->posted, 1); /* an operation in flight that never completes */
    sleep_s(5);
}

static void machines_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    (void)w;
    if (i == 3) {
        raise(SIGSTOP);
    }
    atomic_fetch_add(&m->posted, 1);
    sleep_s(8);
}

static void behind_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    (void)w;
    if (i != 3) {
        atomic_fetch_add(&m->posted, 1); /* process 3 never gets to it */
    }
    sleep_s(8);
}

static void server_stop_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    (void)w;
    if (i == 0) {
        sleep_s(0.2); /* the last one's barrier set is answered first */
        raise(SIGSTOP);
    }
    atomic_fetch_add(&m->posted, 1);
    sleep_s(8);
}

static void untested_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    complete_at = accel__now() + 0.2;
    atomic_fetch_add(&m->posted, 1); /* posted, complete at 0.2 s, never tested */
    sleep_s(3);
    CHECK(atomic_load(&m->done) == 1);
    if (i == 1) {
        sleep_s(0.3);
    }
    accel__watch_leave(w, m);
}

static void server_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    (void)w;
    (void)m;
    if (i == 0) {
        sleep_s(0.2); /* the last one's barrier set is answered first */
        raise(SIGKILL);
    }
    sleep_s(5);
}

static void clean_act(const job *j, int i, accel__watch *w, accel__watch_member *m)
{
    (void)j;
    if (i == 1) {
        sleep_s(0.5); /* process 0 must wait for this one */
    }
    double t0 = accel__now();
    accel__watch_leave(w, m);
    if (i == 0) {
        CHECK_MSG(accel__now() - t0 > 0.3, "process 0 left after %.2f s, before process 1",
                  accel__now() - t0);
    }
}

/* 1. process 2 of 3 killed: 0 and 1 fail with EPEER naming it */
static void scenario_killed(void)
{
    char buf[8192], want[128];
    pid_t pids[3];
    accel__store *srv = open_store(1);
    job kill_job = {"k", 3, 1, 30, 0};
    start(&kill_job, killed_act, pids);
    double t0 = accel__now();
    int lines = read_reports(report_rd, buf, sizeof(buf), 2, 10);
    CHECK_MSG(lines == 2, "%d reports in %.1f s: %s", lines, accel__now() - t0, buf);
    CHECK_MSG(accel__now() - t0 < 5, "the death took %.1f s to be seen", accel__now() - t0);
    snprintf(want, sizeof(want), "EPEER test: process 2 (pid %d) on host", (int)pids[2]);
    CHECK_MSG(strstr(buf, want) != NULL, "\"%s\" lacks \"%s\"", buf, want);
    kill_all(pids, 3);
    accel__store_close(srv);
}

/* 2. process 1 of 2 stopped while 0 waits: 0 fails with ETIMEDOUT naming it */
static void scenario_stopped(void)
{
    char buf[8192], want[128];
    pid_t pids[3];
    accel__store *srv = open_store(1);
    job stop_job = {"s", 2, 1, 1, 0};
    start(&stop_job, stopped_act, pids);
    int lines = read_reports(report_rd, buf, sizeof(buf), 1, 10);
    CHECK_MSG(lines == 1, "%d reports: %s", lines, buf);
    snprintf(want, sizeof(want), "process 1 (pid %d) is stopped", (int)pids[1]);
    CHECK_MSG(strncmp(buf, "0 ETIMEDOUT test: process 0 of 2: a collective made no progress", 60) ==
                      0 &&
                  strstr(buf, want) != NULL,
              "\"%s\" lacks \"%s\"", buf, want);
    kill_all(pids, 2);
    accel__store_close(srv);
}

/* 3. process 0 serving the store killed: 1 and 2 fail with EPEER naming it */
static void scenario_server_killed(void)
{
    char buf[8192], want[128];
    pid_t pids[3];
    job server_job = {"v", 3, 0, 30, 0};
    start(&server_job, server_act, pids);
    int lines = read_reports(report_rd, buf, sizeof(buf), 2, 10);
    CHECK_MSG(lines == 2, "%d reports: %s", lines, buf);
    /* (its pid too, when the others had read it before it died: not waited for here) */
    snprintf(want, sizeof(want), "EPEER test: the job's store at 127.0.0.1:%d, served by process 0",
             port);
    CHECK_MSG(strstr(buf, want) != NULL, "\"%s\" lacks \"%s\"", buf, want);
    kill_all(pids, 3);
}

/* 4. a clean end: no failure, process 0 leaves after the others */
static void scenario_clean_end(void)
{
    job clean_job = {"c", 3, 0, 30, 0};
    expect_no_report(&clean_job, clean_act, report_rd, 0.5, "a clean end reported");
}

/* 5. two machines of 2; process 3 stopped: 0 and 1 name it by its heartbeat, 2 by /proc */
static void scenario_machines(void)
{
    char buf[8192], want[128];
    pid_t mp[4];
    accel__store *srv = open_store(1);
    job machines_job = {"m", 4, 1, 3, 2};
    start(&machines_job, machines_act, mp);
    int lines = read_reports(report_rd, buf, sizeof(buf), 3, 15);
    CHECK_MSG(lines == 3, "%d reports: %s", lines, buf);
    for (int i = 0; i < 3; i++) {
        char *line = buf, *end;
        snprintf(want, sizeof(want), "%d ETIMEDOUT test: process %d of 4: a collective", i, i);
        while (line != NULL && strncmp(line, want, strlen(want)) != 0) {
            line = strchr(line, '\n');
            line = line != NULL ? line + 1 : NULL;
        }
        CHECK_MSG(line != NULL, "no line \"%s\" in %s", want, buf);
        end = strchr(line, '\n');
        *end = '\0';
        if (i < 2) {
            snprintf(want, sizeof(want), "; process 3 (pid %d) on host ", (int)mp[3]);
            CHECK_MSG(strstr(line, want) != NULL && strstr(line, ": no heartbeat for ") != NULL,
                      "\"%s\" lacks \"%s...: no heartbeat for\"", line, want);
        } else {
            snprintf(want, sizeof(want), "; process 3 (pid %d) is stopped", (int)mp[3]);
            CHECK_MSG(strstr(line, want) != NULL, "\"%s\" lacks \"%s\"", line, want);
        }
        /* no false accusation: the live ones beat, and process 3 is named once */
        CHECK_MSG(strstr(line, "process 0 (pid") == NULL &&
                      strstr(line, "process 1 (pid") == NULL &&
                      strstr(line, "process 2 (pid") == NULL,
                  "a live process named: %s", line);
        CHECK_MSG(strstr(strstr(line, "process 3 (pid") + 1, "process 3 (pid") == NULL,
                  "process 3 named twice: %s", line);
        *end = '\n';
    }
    kill_all(mp, 4);
    accel__store_close(srv);
}

/* 5b. process 3 busy elsewhere: named as behind by 0, 1 and 2 */
static void scenario_behind(void)
{
    char buf[8192], want[128];
    pid_t mp[4];
    accel__store *srv = open_store(1);
    job behind_job = {"b", 4, 1, 3, 2};
    start(&behind_job, behind_act, mp);
    int lines = read_reports(report_rd, buf, sizeof(buf), 3, 15);
    CHECK_MSG(lines == 3, "%d reports: %s", lines, buf);
    snprintf(want, sizeof(want), "; process 3 (pid %d) on host ", (int)mp[3]);
    for (char *line = buf; *line != '\0';) {
        char *end = strchr(line, '\n'), *at = strstr(line, want);
        *end = '\0';
        CHECK_MSG(at != NULL && strstr(at, " is behind: 0 operations posted on the job's first") &&
                      strstr(line, "no heartbeat") == NULL,
                  "not named as behind: %s", line);
        CHECK_MSG(strstr(line, "process 0 (pid") == NULL &&
                      strstr(line, "process 1 (pid") == NULL &&
                      strstr(line, "process 2 (pid") == NULL,
                  "a process at the collective named: %s", line);
        line = end + 1;
    }
    kill_all(mp, 4);
    accel__store_close(srv);
}

/* 6. process 0 serving the store stopped: process 1 names it */
static void scenario_server_stopped(void)
{
    char buf[8192], want[128];
    pid_t pids[3];
    job server_stop_job = {"z", 2, 0, 1.5, 0};
    start(&server_stop_job, server_stop_act, pids);
    int lines = read_reports(report_rd, buf, sizeof(buf), 1, 15);
    CHECK_MSG(lines == 1, "%d reports: %s", lines, buf);
    snprintf(want, sizeof(want),
             "1 ETIMEDOUT test: the job's store at 127.0.0.1:%d, served by "
             "process 0 (pid %d), did not answer",
             port, (int)pids[0]);
    CHECK_MSG(strstr(buf, want) != NULL, "\"%s\" lacks \"%s\"", buf, want);
    kill_all(pids, 2);
}

/* 7. an operation complete but never tested, for 3 timeouts: no stall */
static void scenario_untested(void)
{
    job untested_job = {"u", 2, 0, 1, 0};
    expect_no_report(&untested_job, untested_act, report_rd, 0.2,
                     "an untested complete operation was a stall");
}

/* Each scenario in a process of its own (with its own pipe, port and store), all at once. */
static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"1. a process killed", scenario_killed},
    {"2. a process stopped", scenario_stopped},
    {"3. the store's server killed", scenario_server_killed},
    {"4. a clean end", scenario_clean_end},
    {"5. two machines, a process stopped", scenario_machines},
    {"5b. two machines, a process behind", scenario_behind},
    {"6. the store's server stopped", scenario_server_stopped},
    {"7. a complete operation never tested", scenario_untested},
};
#define N_SCENARIOS (sizeof(scenarios) / sizeof(scenarios[0]))

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    /* A port each, all bound at once so that no two scenarios draw the same one. */
    int fds[N_SCENARIOS], ports[N_SCENARIOS];
    for (size_t s = 0; s < N_SCENARIOS; s++) {
        ports[s] = free_port(&fds[s]);
    }
    for (size_t s = 0; s < N_SCENARIOS; s++) {
        close(fds[s]);
    }
    pid_t spids[N_SCENARIOS];
    for (size_t s = 0; s < N_SCENARIOS; s++) {
        spids[s] = fork();
        CHECK(spids[s] >= 0);
        if (spids[s] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* the test killed (a timeout): its scenarios too */
            int p[2];
            CHECK(pipe(p) == 0);
            report_rd = p[0];
            report_fd = p[1];
            port = ports[s];
            scenarios[s].run();
            exit(0);
        }
    }
    int failed = 0;
    for (size_t s = 0; s < N_SCENARIOS; s++) {
        int ws;
        CHECK(waitpid(spids[s], &ws, 0) == spids[s]);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "test_watch: scenario %s failed (%#x)\n", scenarios[s].name, ws);
            failed = 1;
        }
    }
    CHECK(!failed);
    printf("watch: ok\n");
    return 0;
}
