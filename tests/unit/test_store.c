/*
 * The job's key-value store (src/comm/store.h): set/get/add/wait between processes, deadlines
 * (a missing key times out naming it; timeout 0 does not wait), values of every size up to the
 * limit, the port-0 server, a taken port (an error naming the address), no server at all (the
 * error naming the configured wait), an IPv6 link-local address (refused at once, naming it), a
 * program on the port that is not a store or never greets (a best-effort client waits only its
 * answer_s), a malformed request (that client is dropped, the others carry on), the server's hook,
 * a server that dies (clients waiting in get fail with EPEER at once, not at their deadline) or is
 * stopped (ETIMEDOUT; a bounded request at its bound, accel__store_bound), and one abandoned
 * after a failure (it keeps serving and holding its port, without its hook). A serving process
 * that closes its store while clients use it tells them why (a waiting get and an idle client's
 * next request fail with EPEER naming its pid and, when it closes for a failure, that failure);
 * one that closes after a clash first lingers (the port taken, naming the failure, clients
 * served without the hook); a client that keeps writing does not stop the close. Presence: a
 * client that declared a key and dies (or exits without departing) has it set by the server,
 * which wakes a get waiting for it; one that departs does not; a second declaration replaces
 * the first; the first loss is kept; interrupting a client stops a get in progress at once.
 * Heartbeats: a beat lists exactly the other beaters not heard for longer than asked (a client
 * that never beat is not one; any request of a beater counts as heard), with their ids, names
 * and silences, and when asked those whose count is behind; a bad name is refused.
 */
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "base/base.h"
#include "comm/store.h"

static accel__store *open_store(int port, int serve, double timeout_s)
{
    accel__store_config c = {
        .addr = "127.0.0.1", .port = port, .serve = serve, .timeout_s = timeout_s};
    accel__store *st = NULL;
    CHECK_OK(NULL, accel__store_open(&st, &c));
    return st;
}

static void expect(accel_status got, accel_status want, const char *text)
{
    CHECK_MSG(got == want, "got %s, want %s: %s", accel_status_name(got), accel_status_name(want),
              accel_last_error(NULL));
    CHECK_MSG(strstr(accel_last_error(NULL), text) != NULL, "\"%s\" lacks \"%s\"",
              accel_last_error(NULL), text);
}

/* Gets key from st (waiting up to timeout_s) and checks that its value is want. */
static void expect_value(accel__store *st, const char *key, const char *want, double timeout_s)
{
    char buf[64];
    size_t n = 0;
    CHECK_OK(NULL, accel__store_get(st, key, buf, sizeof(buf), &n, timeout_s));
    CHECK_MSG(n == strlen(want) && memcmp(buf, want, n) == 0, "%s: \"%.*s\", want \"%s\"", key,
              (int)n, buf, want);
}

static int hook_calls;
static char hook_last[64];
static void hook(void *arg, const char *key, const void *value, size_t nbytes)
{
    (void)value;
    (void)nbytes;
    *(int *)arg += 1;
    snprintf(hook_last, sizeof(hook_last), "%s", key);
}

/* A server on a free port whose hook counts its calls in *calls, and key set to value through
 * it: *calls is then 1 (checked). */
static accel__store *open_hooked(int *calls, const char *key, const char *value)
{
    accel__store_config c = {.addr = "127.0.0.1",
                             .port = 0,
                             .serve = 1,
                             .timeout_s = 5,
                             .on_set = hook,
                             .hook_arg = calls};
    accel__store *st = NULL;
    CHECK_OK(NULL, accel__store_open(&st, &c));
    CHECK_OK(NULL, accel__store_set(st, key, value, strlen(value)));
    CHECK(*calls == 1);
    return st;
}

/* Serving on port fails: another server has it. cause: the failure after which that server
 * lingers, which the error names (NULL: it does not linger, and none is named). */
static void expect_taken(int port, const char *cause)
{
    accel__store_config c = {.addr = "127.0.0.1", .port = port, .serve = 1, .timeout_s = 5};
    accel__store *again = NULL;
    expect(accel__store_open(&again, &c), ACCEL_EIO, "Address already in use");
    const char *msg = accel_last_error(NULL);
    const char *soon = "; the store there closes soon, after this failure: ";
    CHECK_MSG(cause != NULL ? strstr(msg, soon) != NULL && strstr(msg, cause) != NULL
                            : strstr(msg, soon) == NULL,
              "%s", msg);
}

/* A child process that connects, runs fn, and exits 0 on success. */
static pid_t child(int port, void (*fn)(accel__store *st, int i), int i)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        accel__store *st = open_store(port, 0, 10);
        fn(st, i);
        accel__store_close(st);
        _exit(0);
    }
    return pid;
}

static void reap_ok(pid_t pid)
{
    int ws;
    CHECK(waitpid(pid, &ws, 0) == pid);
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child %d failed (%#x)", (int)pid, ws);
}

/* Children: count in, then wait for "go" and set "done/<i>". */
static void counter_child(accel__store *st, int i)
{
    int64_t v = 0;
    CHECK_OK(NULL, accel__store_add(st, "ctr", 1, &v));
    CHECK(v >= 1 && v <= 8);
    char buf[8];
    size_t n = 0;
    CHECK_OK(NULL, accel__store_get(st, "go", buf, sizeof(buf), &n, 10));
    CHECK(n == 2 && memcmp(buf, "go", 2) == 0);
    char k[32];
    snprintf(k, sizeof(k), "done/%d", i);
    CHECK_OK(NULL, accel__store_set(st, k, "", 0));
}

static void basics(void)
{
    accel__store_config c = {.addr = "127.0.0.1",
                             .port = 0,
                             .serve = 1,
                             .timeout_s = 10,
                             .on_set = hook,
                             .hook_arg = &hook_calls};
    accel__store *srv = NULL;
    CHECK_OK(NULL, accel__store_open(&srv, &c));
    int port = accel__store_port(srv);
    CHECK(port > 0 && port < 65536);
    char name[64];
    snprintf(name, sizeof(name), "127.0.0.1:%d", port);
    CHECK(strcmp(accel__store_name(srv), name) == 0);

    /* set / get, overwrite, empty value, the hook ran before set returned */
    CHECK_OK(NULL, accel__store_set(srv, "a", "hello", 5));
    CHECK(hook_calls == 1 && strcmp(hook_last, "a") == 0);
    char buf[64];
    size_t n = 0;
    CHECK_OK(NULL, accel__store_get(srv, "a", buf, sizeof(buf), &n, 0));
    CHECK(n == 5 && memcmp(buf, "hello", 5) == 0);
    CHECK_OK(NULL, accel__store_set(srv, "a", "", 0));
    CHECK_OK(NULL, accel__store_get(srv, "a", buf, sizeof(buf), &n, 0));
    CHECK(n == 0);
    /* a value longer than the buffer */
    CHECK_OK(NULL, accel__store_set(srv, "long", "0123456789", 10));
    expect(accel__store_get(srv, "long", buf, 4, &n, 0), ACCEL_EINVAL, "\"long\" is 10 bytes");
    /* missing keys: no wait with timeout 0, a deadline otherwise, both naming the key */
    expect(accel__store_get(srv, "nope", buf, sizeof(buf), &n, 0), ACCEL_ENOTFOUND,
           "key \"nope\" is not set");
    expect(accel__store_get(srv, "nope", buf, sizeof(buf), &n, 0.2), ACCEL_ETIMEDOUT,
           "key \"nope\" was not set within 0.2 s");
    const char *keys[] = {"a", "long", "absent"};
    expect(accel__store_wait(srv, keys, 3, 0.1), ACCEL_ETIMEDOUT, "key \"absent\"");
    CHECK_OK(NULL, accel__store_wait(srv, keys, 2, 0));
    /* counters, readable as decimal text */
    int64_t v = 0;
    CHECK_OK(NULL, accel__store_add(srv, "n", 5, &v));
    CHECK(v == 5);
    CHECK_OK(NULL, accel__store_add(srv, "n", -7, &v));
    CHECK(v == -2);
    CHECK_OK(NULL, accel__store_get(srv, "n", buf, sizeof(buf), &n, 0));
    CHECK(n == 2 && memcmp(buf, "-2", 2) == 0);
    /* the largest value, and one byte more */
    size_t big = ACCEL__STORE_VALUE_MAX;
    char *vb = malloc(big + 1), *back = malloc(big);
    CHECK(vb != NULL && back != NULL);
    for (size_t i = 0; i < big; i++) {
        vb[i] = (char)(i * 7);
    }
    CHECK_OK(NULL, accel__store_set(srv, "big", vb, big));
    CHECK_OK(NULL, accel__store_get(srv, "big", back, big, &n, 0));
    CHECK(n == big && memcmp(vb, back, big) == 0);
    expect(accel__store_set(srv, "big", vb, big + 1), ACCEL_EINVAL, "at most");
    free(vb);
    free(back);
    expect(accel__store_set(srv, "", "x", 1), ACCEL_EINVAL, "key of 0 bytes");

    /* 8 processes: an atomic counter, a wait released by one set, keys from others */
    pid_t kids[8];
    for (int i = 0; i < 8; i++) {
        kids[i] = child(port, counter_child, i);
    }
    for (;;) { /* until every child has counted itself in */
        CHECK_OK(NULL, accel__store_get(srv, "ctr", buf, sizeof(buf) - 1, &n, 10));
        buf[n] = '\0';
        if (atoi(buf) == 8) {
            break;
        }
        usleep(1000);
    }
    CHECK_OK(NULL, accel__store_set(srv, "go", "go", 2));
    const char *done[8];
    char done_k[8][16];
    for (int i = 0; i < 8; i++) {
        snprintf(done_k[i], sizeof(done_k[i]), "done/%d", i);
        done[i] = done_k[i];
    }
    CHECK_OK(NULL, accel__store_wait(srv, done, 8, 10));
    for (int i = 0; i < 8; i++) {
        reap_ok(kids[i]);
    }

    /* a malformed request: that connection is refused and closed, the others go on */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    unsigned char junk[] = {0x41, 0x43, 0x53, 0x54, 2,  0, 0, 0,                 /* greeting v2 */
                            9,    0,    0,    0,    77, 0, 0, 0, 0, 0, 0, 0, 0}; /* op 77 */
    CHECK(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
    char reply[128];
    ssize_t got = 0, k;
    while ((k = read(fd, reply + got, sizeof(reply) - (size_t)got)) > 0) {
        got += k; /* until the server closes */
    }
    CHECK(got >= 8 + 5 && reply[8 + 4] == 2); /* greeting, then status BAD */
    close(fd);
    CHECK_OK(NULL, accel__store_get(srv, "go", buf, sizeof(buf), &n, 0));

    /* the port is taken: the error names the address */
    accel__store_config c2 = {.addr = "127.0.0.1", .port = port, .serve = 1, .timeout_s = 1};
    accel__store *other = NULL;
    expect(accel__store_open(&other, &c2), ACCEL_EIO, name);
    CHECK(strstr(accel_last_error(NULL), "Address already in use") != NULL);
    CHECK(strstr(accel_last_error(NULL), "MASTER_PORT") != NULL);
    /* ... and who holds it (here: this process), usually the same job started twice */
    char holder[64];
    snprintf(holder, sizeof(holder), "(pid %d, ", (int)getpid());
    CHECK_MSG(strstr(accel_last_error(NULL), holder) != NULL &&
                  strstr(accel_last_error(NULL), "test_store listens there; ") != NULL &&
                  strstr(accel_last_error(NULL), "--main_process_port") != NULL,
              "%s", accel_last_error(NULL));
    accel__store_close(srv);

    /* nobody serves the port any more: connecting gives up at the deadline */
    accel__store_config c3 = {.addr = "127.0.0.1", .port = port, .serve = 0, .timeout_s = 0.3};
    expect(accel__store_open(&other, &c3), ACCEL_ETIMEDOUT, "could not connect within 0.3 s");
    /* a retrying caller's try names the wait the user configured (configured_s) */
    c3.configured_s = 7;
    expect(accel__store_open(&other, &c3), ACCEL_ETIMEDOUT, "could not connect within 7 s (");
    /* port 0 only for the server */
    c3.port = 0;
    expect(accel__store_open(&other, &c3), ACCEL_EINVAL, "port 0 is not valid");
}

/* A plain TCP listener that is not a store: it accepts and closes. */
static void not_a_store(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = accept(lfd, NULL, NULL);
        const char msg[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
        if (write(fd, msg, sizeof(msg) - 1) < 0) {
            _exit(1);
        }
        close(fd);
        _exit(0);
    }
    close(lfd);
    accel__store_config c = {
        .addr = "127.0.0.1", .port = ntohs(sa.sin_port), .serve = 0, .timeout_s = 5};
    accel__store *st = NULL;
    expect(accel__store_open(&st, &c), ACCEL_EIO, "is not an accel store");
    reap_ok(pid);
}

/* A listener that accepts and never answers (or a timeout too short for the greeting): a
 * timeout saying so, not "not an accel store" (which a 1e-9 s ACCEL_TIMEOUT used to report). */
static void silent_listener(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    accel__store_config c = {
        .addr = "127.0.0.1", .port = ntohs(sa.sin_port), .serve = 0, .timeout_s = 0.3};
    accel__store *st = NULL;
    double t0 = accel__now();
    expect(accel__store_open(&st, &c), ACCEL_ETIMEDOUT, "no greeting came back within 0.3 s");
    CHECK(accel__now() - t0 < 5.0);
    /* a best-effort client (answer_s) waits that long for the greeting, not its timeout: a
     * stopped server looks so */
    c.timeout_s = 60;
    c.answer_s = 0.3;
    expect(accel__store_open(&st, &c), ACCEL_ETIMEDOUT, "no greeting came back within 0.3 s");
    close(lfd);
}

/* An IPv6 link-local MASTER_ADDR, scope id or not, is refused at once, naming it and what to
 * use instead (before, a client without the scope id retried until its deadline, and the
 * server said "Invalid argument"). */
static void link_local(void)
{
    const char *addrs[] = {"fe80::1", "fe80::1%lo", "FE80::abcd:1"};
    for (size_t i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
        for (int serve = 0; serve < 2; serve++) {
            accel__store_config c = {
                .addr = addrs[i], .port = 29999, .serve = serve, .timeout_s = 5};
            accel__store *st = NULL;
            expect(accel__store_open(&st, &c), ACCEL_EINVAL, addrs[i]);
            const char *msg = accel_last_error(NULL);
            CHECK_MSG(strstr(msg, "is an IPv6 link-local address") != NULL &&
                          strstr(msg, "unique-local (fd00::/8) IPv6 address") != NULL,
                      "%s", msg);
            CHECK(st == NULL);
        }
    }
}

/* The serving process dies (or stops) while a client waits. */
static void server_trouble(int sig)
{
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        accel__store *srv = open_store(0, 1, 30);
        int port = accel__store_port(srv);
        CHECK(write(p[1], &port, sizeof(port)) == (ssize_t)sizeof(port));
        pause(); /* serving on the thread until killed */
        _exit(0);
    }
    int port = 0;
    CHECK(read(p[0], &port, sizeof(port)) == (ssize_t)sizeof(port));
    close(p[0]);
    close(p[1]);
    accel__store *st = open_store(port, 0, 1), *patient = open_store(port, 0, 600);
    CHECK_OK(NULL, accel__store_set(st, "x", "1", 1));
    char buf[8];
    size_t n;
    kill(pid, sig);
    int ws;
    CHECK(waitpid(pid, &ws, WUNTRACED) == pid); /* dead or stopped now */
    if (sig == SIGKILL) {
        /* The wait's deadline is far; the closed connection ends it at once. */
        expect(accel__store_get(st, "never", buf, sizeof(buf), &n, 600), ACCEL_EPEER,
               "closed the connection");
        /* and the handle stays broken */
        expect(accel__store_set(st, "x", "2", 1), ACCEL_EPEER, "failed earlier");
    } else {
        /* A stopped server answers nothing: set gives up at the store's timeout (1 s). */
        expect(accel__store_set(st, "x", "2", 1), ACCEL_ETIMEDOUT, "no answer");
        /* A bound ends a far deadline (600 s, and the answer's grace) at the bound. */
        double t0 = accel__now();
        accel__store_bound(patient, t0 + 0.5);
        expect(accel__store_get(patient, "never", buf, sizeof(buf), &n, 600), ACCEL_ETIMEDOUT,
               "no answer");
        CHECK(accel__now() - t0 < 10.0);
        kill(pid, SIGKILL);
    }
    accel__store_close(patient);
    accel__store_close(st);
    if (sig != SIGKILL) {
        CHECK(waitpid(pid, &ws, 0) == pid);
    }
}

/* A server abandoned after a failure keeps serving (and holding its port) without its hook. */
static void abandoned(void)
{
    int calls = 0;
    accel__store *srv = open_hooked(&calls, "why", "failed");
    int port = accel__store_port(srv);
    accel__store_abandon(srv);
    accel__store *st = open_store(port, 0, 5);
    expect_value(st, "why", "failed", 0);
    CHECK_OK(NULL, accel__store_set(st, "more", "x", 1));
    CHECK(calls == 1); /* the hook's argument may be gone: it is not called any more */
    expect_taken(port, NULL);
    accel__store_close(st);
}

/* A get in another thread, with its outcome copied out (the message is per thread). */
typedef struct getter {
    accel__store *st;
    accel_status status;
    char msg[ACCEL__ERRMSG_NBYTES];
} getter;

static void *get_never(void *arg)
{
    getter *g = arg;
    char buf[8];
    size_t n = 0;
    g->status = accel__store_get(g->st, "never", buf, sizeof(buf), &n, 600);
    snprintf(g->msg, sizeof(g->msg), "%s", accel_last_error(NULL));
    return NULL;
}

/* The serving process closes its store while a client waits in a get (or is about to: either
 * way its answer is the farewell) and another is idle: both learn why from the server, not a
 * bare closed connection (a process 0 that failed on a clash and closed before its peers were
 * done left them with only that). A close for a failure names it; a normal close only the pid,
 * even after a failure the closing thread recorded and handled earlier (the farewell used to
 * name that). */
static void closed_while_used(void)
{
    for (int failed = 0; failed < 2; failed++) {
        accel__store *srv = open_store(0, 1, 5);
        int port = accel__store_port(srv);
        accel__store *idle = open_store(port, 0, 5);
        CHECK_OK(NULL, accel__store_set(idle, "x", "1", 1));
        getter g = {.st = open_store(port, 0, 5)};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, get_never, &g) == 0);
        char buf[8];
        size_t n = 0;
        expect(accel__store_get(srv, "absent", buf, sizeof(buf), &n, 0), ACCEL_ENOTFOUND,
               "not set"); /* handled: not why the store closes */
        if (failed) {
            accel__store_close_failed(srv, "two jobs use the same port (a test)", 0);
        } else {
            accel__store_close(srv);
        }
        CHECK(pthread_join(th, NULL) == 0);
        char why[128];
        snprintf(why, sizeof(why), "the process serving it (pid %d) closed it", (int)getpid());
        CHECK_MSG(g.status == ACCEL_EPEER && strstr(g.msg, "stopped before answering a get") &&
                      strstr(g.msg, why) != NULL,
                  "waiting get: %s: %s", accel_status_name(g.status), g.msg);
        expect(accel__store_set(idle, "x", "2", 1), ACCEL_EPEER, why);
        const char *idle_msg = accel_last_error(NULL);
        const char *cause = " after this failure: two jobs use the same port (a test)";
        CHECK_MSG((strstr(g.msg, cause) != NULL) == failed, "waiting get: %s", g.msg);
        CHECK_MSG((strstr(idle_msg, cause) != NULL) == failed, "idle client: %s", idle_msg);
        CHECK_MSG(strstr(g.msg, "after this failure") == NULL || failed, "%s", g.msg);
        expect(accel__store_set(idle, "x", "3", 1), ACCEL_EPEER, "failed earlier");
        accel__store_close(g.st);
        accel__store_close(idle);
    }
}

/* What a client that comes while the store lingers (see linger()) finds, 0.2 s after the close
 * began: a server that answers (the keys say what happened), and the port taken, with the
 * failure named. */
static void *come_late(void *arg)
{
    int port = *(int *)arg;
    usleep(200000);
    accel__store *late = open_store(port, 0, 5);
    expect_value(late, "job", "2 n", 5);
    CHECK_OK(NULL, accel__store_set(late, "clash", "1 2", 3));
    expect_taken(port, "two jobs met here (a test)");
    return late;
}

/* A close for a clash with a linger of 3 s: meanwhile the port stays taken (another server
 * cannot start there, and its error names the failure) and a client that comes gets answers,
 * but the hook is not called any more (its argument may be gone); a client waiting from before
 * gets the farewell naming the cause, and so does the late one at its next request; afterwards
 * the port is free. */
static void linger(void)
{
    int calls = 0;
    accel__store *srv = open_hooked(&calls, "job", "2 n");
    int port = accel__store_port(srv);
    getter g = {.st = open_store(port, 0, 5)};
    pthread_t waiter, th;
    CHECK(pthread_create(&waiter, NULL, get_never, &g) == 0);
    CHECK(pthread_create(&th, NULL, come_late, &port) == 0);
    accel__store_close_failed(srv, "two jobs met here (a test)", 3);
    void *late = NULL;
    CHECK(pthread_join(th, &late) == 0);
    CHECK(pthread_join(waiter, NULL) == 0);
    CHECK(calls == 1); /* the late set did not reach the hook */
    CHECK_MSG(g.status == ACCEL_EPEER &&
                  strstr(g.msg, "after this failure: two jobs met here (a test)") != NULL,
              "waiting get: %s: %s", accel_status_name(g.status), g.msg);
    expect(accel__store_set(late, "x", "1", 1), ACCEL_EPEER, "two jobs met here (a test)");
    accel__store_close(open_store(port, 1, 5)); /* the port is free again */
    accel__store_close(late);
    accel__store_close(g.st);
}

/* Writes well-formed sets (the largest value) on a raw connection until it fails, never
 * reading an answer. */
static void *keep_writing(void *arg)
{
    int fd = *(int *)arg;
    size_t len = 4 + 8 + 2 + 1 + 4 + ACCEL__STORE_VALUE_MAX;
    unsigned char *req = calloc(1, len);
    CHECK(req != NULL);
    unsigned char head[] = {0, 0, 0, 0, 1 /* set */, 0, 0, 0, 0, 0, 0, 0, 1, 0, 'k'};
    uint32_t body = (uint32_t)(len - 4), v = ACCEL__STORE_VALUE_MAX;
    memcpy(req, head, sizeof(head));
    for (int i = 0; i < 4; i++) {
        req[i] = (unsigned char)(body >> (8 * i));
        req[sizeof(head) + i] = (unsigned char)(v >> (8 * i));
    }
    for (;;) {
        size_t off = 0;
        ssize_t k = 0;
        while (off < len && (k = send(fd, req + off, len - off, MSG_NOSIGNAL)) > 0) {
            off += (size_t)k;
        }
        if (k <= 0) {
            break;
        }
    }
    free(req);
    return NULL;
}

/* A client that keeps writing while the server closes: the close reads what is left of its
 * input only up to a bound, and returns (it used to read for as long as the client wrote). */
static void writer_at_close(void)
{
    accel__store *srv = open_store(0, 1, 5);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)accel__store_port(srv)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    unsigned char hello[8] = {0x41, 0x43, 0x53, 0x54, 2, 0, 0, 0}, back[8];
    CHECK(write(fd, hello, sizeof(hello)) == (ssize_t)sizeof(hello));
    CHECK(read(fd, back, sizeof(back)) == (ssize_t)sizeof(back)); /* greeted */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, keep_writing, &fd) == 0);
    char buf[4];
    size_t n = 0;
    for (int i = 0; i < 10000; i++) { /* until the server has handled some of its sets */
        if (accel__store_get(srv, "k", buf, sizeof(buf), &n, 0) != ACCEL_ENOTFOUND) {
            break;
        }
        usleep(1000);
    }
    accel__store_close(srv);
    shutdown(fd, SHUT_RDWR); /* ends the writer if the server's close left it connected */
    CHECK(pthread_join(th, NULL) == 0);
    close(fd);
}

/* Children of presence(): declare, then leave in the way i says. */
static void presence_child(accel__store *st, int i)
{
    if (i == 0) { /* exits without departing */
        CHECK_OK(NULL, accel__store_declare(st, "lost/a", "process 7 (pid 1)", 17));
        _exit(0);
    }
    if (i == 1) { /* departs, then exits */
        CHECK_OK(NULL, accel__store_declare(st, "lost/b", "b", 1));
        CHECK_OK(NULL, accel__store_depart(st));
        return;
    }
    /* i == 2: replaces its declaration, then is killed; i == 3: loses "lost/a" again */
    CHECK_OK(NULL, accel__store_declare(st, i == 2 ? "lost/c" : "lost/a", "second", 6));
    if (i == 2) {
        CHECK_OK(NULL, accel__store_declare(st, "lost/d", "d", 1));
    }
    raise(SIGKILL);
}

static void *interrupt_later(void *arg)
{
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    accel__store_interrupt(arg);
    return NULL;
}

static void presence(void)
{
    accel__store *srv = open_store(0, 1, 10);
    int port = accel__store_port(srv);
    char buf[32];
    size_t n = 0;
    /* a loss wakes the get waiting for it at once */
    pid_t pid = child(port, presence_child, 0);
    double t0 = accel__now();
    CHECK_OK(NULL, accel__store_get(srv, "lost/a", buf, sizeof(buf), &n, 30));
    CHECK_MSG(accel__now() - t0 < 5, "the loss took %.1f s", accel__now() - t0);
    CHECK(n == 17 && memcmp(buf, "process 7 (pid 1)", 17) == 0);
    reap_ok(pid);
    /* a departure is not a loss */
    reap_ok(child(port, presence_child, 1));
    /* killed: the second declaration is what is set */
    int ws;
    pid = child(port, presence_child, 2);
    CHECK(waitpid(pid, &ws, 0) == pid && WIFSIGNALED(ws));
    CHECK_OK(NULL, accel__store_get(srv, "lost/d", buf, sizeof(buf), &n, 10));
    /* ... and the first loss of a key stays */
    pid = child(port, presence_child, 3);
    CHECK(waitpid(pid, &ws, 0) == pid && WIFSIGNALED(ws));
    CHECK_OK(NULL, accel__store_set(srv, "sync", "", 0)); /* the server handled the close */
    CHECK_OK(NULL, accel__store_get(srv, "lost/a", buf, sizeof(buf), &n, 0));
    CHECK(n == 17);
    expect(accel__store_get(srv, "lost/b", buf, sizeof(buf), &n, 0), ACCEL_ENOTFOUND, "lost/b");
    expect(accel__store_get(srv, "lost/c", buf, sizeof(buf), &n, 0), ACCEL_ENOTFOUND, "lost/c");
    /* interrupting a client ends its get at once */
    accel__store *st = open_store(port, 0, 10);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, interrupt_later, st) == 0);
    t0 = accel__now();
    expect(accel__store_get(st, "never", buf, sizeof(buf), &n, 30), ACCEL_EPEER, "during a get");
    CHECK(accel__now() - t0 < 5);
    pthread_join(th, NULL);
    accel__store_close(st);
    accel__store_close(srv);
}

/* Heartbeats between three clients of one server: a, b beat, c never does. */
static void heartbeats(void)
{
    accel__store *srv = open_store(0, 1, 10);
    int port = accel__store_port(srv);
    accel__store *a = open_store(port, 0, 10), *b = open_store(port, 0, 10);
    accel__store_silent s[ACCEL__STORE_SILENT_MAX];
    int n = -1;
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 0, 0, 0.3, 5, s, 4, &n));
    CHECK(n == 0);
    CHECK_OK(NULL, accel__store_beat(b, 2, "process 2", 0, 0, 0.3, 5, s, 4, &n));
    CHECK(n == 0); /* a was heard just now */
    struct timespec ts = {0, 500000000};
    nanosleep(&ts, NULL);
    /* b: a has been silent for 0.5 s; srv (never beat) is not listed */
    CHECK_OK(NULL, accel__store_beat(b, 2, "process 2", 0, 0, 0.3, 5, s, 4, &n));
    CHECK_MSG(n == 1 && s[0].id == 1 && s[0].silent_s >= 0.45 && s[0].silent_s < 5 &&
                  strcmp(s[0].name, "process 1 (pid 11) on host x") == 0,
              "n %d id %d silent %g name %s", n, s[0].id, s[0].silent_s, s[0].name);
    /* a larger threshold: nobody */
    CHECK_OK(NULL, accel__store_beat(b, 2, "process 2", 0, 0, 3, 5, s, 4, &n));
    CHECK(n == 0);
    /* any request of a counts as heard: a get */
    char buf[8];
    size_t len;
    expect(accel__store_get(a, "none", buf, sizeof(buf), &len, 0), ACCEL_ENOTFOUND, "none");
    CHECK_OK(NULL, accel__store_beat(b, 2, "process 2", 0, 0, 0.3, 5, s, 4, &n));
    CHECK(n == 0);
    /* a sees b as heard (it just beat), with a new name kept */
    nanosleep(&ts, NULL);
    CHECK_OK(NULL, accel__store_beat(b, 7, "process 7", 0, 0, 0.3, 5, s, 4, &n));
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 0, 0, 0.3, 5, s, 4, &n));
    CHECK(n == 0);
    nanosleep(&ts, NULL);
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 0, 0, 0.3, 5, s, 4, &n));
    CHECK_MSG(n == 1 && s[0].id == 7 && strcmp(s[0].name, "process 7") == 0, "n %d", n);
    /* a client that closes is no longer listed */
    accel__store_close(b);
    CHECK_OK(NULL, accel__store_set(srv, "sync", "", 0));
    nanosleep(&ts, NULL);
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 0, 0, 0.3, 5, s, 4, &n));
    CHECK(n == 0);
    /* counts: asked for, the beaters behind this one are listed too, heard or not */
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 5, 0, 30, 5, s, 4, &n));
    b = open_store(port, 0, 10);
    CHECK_OK(NULL, accel__store_beat(b, 2, "process 2", 3, 1, 30, 5, s, 4, &n));
    CHECK(n == 0); /* a (5) is not behind b (3) */
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 5, 1, 30, 5, s, 4, &n));
    CHECK_MSG(n == 1 && s[0].id == 2 && s[0].count == 3 && s[0].silent_s < 30, "n %d", n);
    CHECK_OK(NULL, accel__store_beat(a, 1, "process 1 (pid 11) on host x", 5, 0, 30, 5, s, 4, &n));
    CHECK(n == 0); /* not asked */
    CHECK_OK(NULL, accel__store_beat(b, 2, "process 2", 3, 1, 30, 5, s, 4, &n));
    CHECK(n == 0); /* a is still ahead */
    accel__store_close(b);
    expect(accel__store_beat(a, 1, "", 0, 0, 0.3, 5, s, 4, &n), ACCEL_EINVAL, "a beat as 1");
    accel__store_close(a);
    accel__store_close(srv);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    basics();
    not_a_store();
    silent_listener();
    link_local();
    server_trouble(SIGKILL);
    server_trouble(SIGSTOP);
    abandoned();
    closed_while_used();
    linger();
    writer_at_close();
    presence();
    heartbeats();
    printf("store: ok\n");
    return 0;
}
