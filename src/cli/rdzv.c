/*
 * The launchers' rendezvous of a job on several machines, through the job's TCP store
 * (comm/store.h): machine 0's launcher serves it on main_process_ip:main_process_port for the
 * whole job, every launcher joins it, claims its machine rank, publishes what it was started
 * with and waits (--rdzv_conf timeout) for every other machine, naming the ones missing. While
 * the processes run, the launchers watch each other through it: the first failure anywhere is
 * published under "launch/<attempt>/failed" and every launcher stops its processes within a
 * second of seeing it; machine 0 also reads each machine's heartbeat counter, so a launcher that
 * died (kill -9, a lost machine) is noticed within LOST_S. With --max_restarts, every launcher
 * waits until every machine has stopped the attempt, and they all start the next one together
 * (machine 0 makes each attempt's job id); a lost launcher or an interrupt ("launch/final")
 * ends the restarts. Keys live under "launch/"; the ranks' own keys are prefixed by
 * ACCEL_JOB_ID, so the two never meet. Each machine's record also carries a token of the CPUs
 * its launcher may use (boot id and CPU set), so that machines emulated on one host do not each
 * bind their processes to the same CPUs. The rendezvous waits in slices of SLICE_S, looking
 * between them for a failure another launcher published and for a stop signal (which it
 * publishes); machines other than 0 check machine 0's record before they publish their own.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel/accel.h"
#include "base/base.h"
#include "comm/store.h"
#include "launch.h"

#define OP_TIMEOUT_S 5.0 /* one store call; a stuck main launcher is then noticed */
#define LOST_S 5.0       /* a launcher whose heartbeat stands still this long is gone */
#define SLICE_S 0.5      /* a rendezvous wait between two looks at failures and signals */
#define SAY_S 5.0        /* the first "waiting for" line (half the timeout when shorter) */
#define SAY_AGAIN_S 30.0 /* and the next ones */

struct launch_rdzv {
    const launch_settings *s;
    accel__store *st;
    int attempt; /* 0, then the restart count */
    int port;
    char job_id[64];
    char host[256];
    char name[320]; /* "addr:port" of the store */
    launch_watch watch;
    /* Machine 0: each machine's last heartbeat value and when it last changed. */
    long long *beat;
    double *beat_at;
    int *finished; /* the machine published done or stopped */
    int lost;      /* the store broke: said once, the supervisor's later ticks stay quiet */
    /* The machines whose CPU token equals this one's, this one included (1: none shares). */
    int n_sharing_machines;
    double t0, deadline, say_at; /* the rendezvous: its start, end and next "waiting" line */
    char cause[1024]; /* machine 0: why the rendezvous failed, told to clients at the close */
    int linger;       /* machine 0: serve a little longer, so that the others read it */
};

static void key_of(char *buf, size_t n, const char *what, int machine)
{
    snprintf(buf, n, "launch/%s/%d", what, machine);
}

/* The key of this attempt: "launch/<attempt>/<what>" or, machine >= 0, ".../<machine>". */
static void attempt_key(launch_rdzv *r, char *buf, size_t n, const char *what, int machine)
{
    int k = snprintf(buf, n, "launch/%d/%s", r->attempt, what);
    if (machine >= 0 && k > 0 && (size_t)k < n) {
        snprintf(buf + k, n - (size_t)k, "/%d", machine);
    }
}

static int has_key(launch_rdzv *r, const char *key)
{
    char v[8];
    size_t nb;
    accel_status st = accel__store_get(r->st, key, v, sizeof(v), &nb, 0);
    return st == ACCEL_OK || st == ACCEL_EINVAL; /* EINVAL: present, longer than v */
}

/* Publishes the job's first failure (later ones are consequences): "<exit status> <text>". */
static void publish_failure(launch_rdzv *r, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void publish_failure(launch_rdzv *r, int status, const char *fmt, ...)
{
    int64_t n = 0;
    char key[64];
    attempt_key(r, key, sizeof(key), "failed_claim", -1);
    if (accel__store_add(r->st, key, 1, &n) != ACCEL_OK || n != 1) {
        return;
    }
    char msg[1024];
    int k = snprintf(msg, sizeof(msg), "%d ", status);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + k, sizeof(msg) - (size_t)k, fmt, ap);
    va_end(ap);
    attempt_key(r, key, sizeof(key), "failed", -1);
    (void)accel__store_set(r->st, key, msg, strlen(msg));
}

/* The published failure, if any: its exit status (>= 1) with its text in msg; else 0. */
static int read_failure(launch_rdzv *r, char *msg, size_t cap)
{
    size_t nb = 0;
    char key[64];
    attempt_key(r, key, sizeof(key), "failed", -1);
    if (accel__store_get(r->st, key, msg, cap - 1, &nb, 0) != ACCEL_OK) {
        return 0;
    }
    msg[nb] = '\0';
    char *end;
    long status = strtol(msg, &end, 10);
    const char *text = *end == ' ' ? end + 1 : end;
    memmove(msg, text, strlen(text) + 1);
    return status >= 1 && status <= 255 ? (int)status : 1;
}

/* "1, 3": the machines that have not published their record at the rendezvous. */
static int list_missing(launch_rdzv *r, char *buf, size_t cap)
{
    int n = 0;
    size_t len = 0;
    buf[0] = '\0';
    for (int m = 0; m < r->s->num_machines; m++) {
        char key[64];
        key_of(key, sizeof(key), "machine", m);
        if (!has_key(r, key)) {
            len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%d", n ? ", " : "", m);
            n++;
            if (len >= cap) {
                break;
            }
        }
    }
    return n;
}

/* 0, or, when a stop signal came (stop.c), its exit status (128 + the signal) after saying
 * so and publishing it, with this machine's end of the attempt: the others then stop at once
 * instead of waiting for this one. during: what was going on ("the preflight"); NULL: the
 * rendezvous. Bounded: a hung machine 0 holds the exit for a second at most. */
static int interrupted(launch_rdzv *r, const char *during)
{
    const int sig = launch_stop_signal();
    if (sig == 0) {
        return 0;
    }
    const char *name = launch_stop_name(sig);
    fprintf(stderr,
            "accel launch: machine %d: interrupted by %s during %s%s: nothing was started\n",
            r->s->machine_rank, name, during != NULL ? during : "the rendezvous at ",
            during != NULL ? "" : r->name);
    snprintf(r->cause, sizeof(r->cause),
             "machine %d's launcher (host %s) was interrupted by %s during %s", r->s->machine_rank,
             r->host, name, during != NULL ? during : "the rendezvous");
    if (r->st != NULL) {
        char key[64];
        accel__store_bound(r->st, accel__now() + ACCEL__STORE_RECORD_S);
        publish_failure(r, 128 + sig, "%s", r->cause);
        attempt_key(r, key, sizeof(key), "stopped", r->s->machine_rank);
        (void)accel__store_set(r->st, key, "1", 1); /* machine 0 waits for nobody's end here */
        (void)accel__store_set(r->st, "launch/final", "stop", 4);
        r->linger = 1;
    }
    return 128 + sig;
}

/* After the first few seconds (SAY_S, or half the timeout), then every SAY_AGAIN_S: which
 * machines this launcher still waits for, and how to start them. */
static void say_waiting(launch_rdzv *r)
{
    const launch_settings *s = r->s;
    double now = accel__now();
    if (now < r->say_at) {
        return;
    }
    r->say_at = now + SAY_AGAIN_S;
    if (r->st == NULL) {
        fprintf(stderr,
                "accel launch: machine %d: waiting for machine 0's launcher at %s (up to %g s "
                "in all)\n",
                s->machine_rank, r->name, s->rdzv_timeout_s);
        return;
    }
    char missing[256], how[300] = "start each with its --machine_rank";
    if (list_missing(r, missing, sizeof(missing)) == 1) {
        snprintf(how, sizeof(how), "start it with --machine_rank %s", missing);
    }
    fprintf(stderr,
            "accel launch: machine %d: waiting for machine(s) %s of %d at %s (up to %g s in all; "
            "%s --num_machines %d --num_processes %d --main_process_ip %s --main_process_port "
            "%d)\n",
            s->machine_rank, missing, s->num_machines, r->name, s->rdzv_timeout_s, how,
            s->num_machines, s->n_procs * s->num_machines, s->master_addr, r->port);
}

/* Machine 0 serves the store; the others connect, retrying until the rendezvous deadline.
 * Returns 0, or the exit status after saying why. */
static int open_store(launch_rdzv *r)
{
    const launch_settings *s = r->s;
    accel__store_config sc = {.addr = s->master_addr,
                              .port = s->port,
                              .serve = s->machine_rank == 0,
                              .timeout_s = OP_TIMEOUT_S,
                              .configured_s = s->rdzv_timeout_s}; /* the loop's tries */
    if (sc.serve) {
        /* The server's thread must never take the launcher's signals: the supervisor waits for
         * SIGCHLD and the stop signals on a signalfd, which only sees signals blocked in every
         * thread. The thread inherits this mask. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        accel_status st = accel__store_open(&r->st, &sc);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (st != ACCEL_OK) {
            fprintf(stderr,
                    "accel launch: error: machine 0 cannot serve the rendezvous on %s: %s\n"
                    "accel launch: machine 0 must run where --main_process_ip points, on a free "
                    "--main_process_port (0 picks one)\n",
                    r->name, accel_last_error(NULL));
            return 1;
        }
        r->port = accel__store_port(r->st);
        if (s->port == 0) {
            fprintf(stderr,
                    "accel launch: main process port %d (start the other machines with "
                    "--main_process_port %d)\n",
                    r->port, r->port);
        }
        return 0;
    }
    /* Tries of a slice, so that a stop signal is noticed at once; the store that answers is
     * opened again with the timeout of one call, which also bounds every later set and add. */
    for (;;) {
        int sig = interrupted(r, NULL);
        if (sig != 0) {
            return sig;
        }
        double left = r->deadline - accel__now();
        sc.timeout_s = left < SLICE_S ? (left > 0.05 ? left : 0.05) : SLICE_S;
        accel_status st = accel__store_open(&r->st, &sc);
        if (st == ACCEL_OK) {
            accel__store_close(r->st);
            r->st = NULL;
            sc.timeout_s = OP_TIMEOUT_S;
            st = accel__store_open(&r->st, &sc);
        }
        if (st == ACCEL_OK) {
            r->port = s->port;
            return 0;
        }
        if (st != ACCEL_ETIMEDOUT || accel__now() >= r->deadline) {
            char within[64] = "";
            if (st == ACCEL_ETIMEDOUT) {
                snprintf(within, sizeof(within), " within %g s", s->rdzv_timeout_s);
            }
            fprintf(stderr,
                    "accel launch: error: machine %d: no rendezvous with the main process "
                    "(machine 0's launcher) at %s%s: %s\n"
                    "accel launch: is machine 0 started, with the same --main_process_ip and "
                    "--main_process_port, and is that address reachable from this machine?\n",
                    s->machine_rank, r->name, within, accel_last_error(NULL));
            return 1;
        }
        say_waiting(r);
    }
}

/* 1 after saying so when another launcher published a failure of the rendezvous, else 0. */
static int failed_elsewhere(launch_rdzv *r)
{
    char msg[1024];
    if (read_failure(r, msg, sizeof(msg)) == 0) {
        return 0;
    }
    fprintf(stderr, "accel launch: error: machine %d: the rendezvous at %s failed: %s\n",
            r->s->machine_rank, r->name, msg);
    snprintf(r->cause, sizeof(r->cause), "%s", msg);
    r->linger = 1;
    return 1;
}

static int store_failed(launch_rdzv *r)
{
    fprintf(stderr, "accel launch: error: machine %d: rendezvous at %s: %s\n", r->s->machine_rank,
            r->name, accel_last_error(NULL));
    return 1;
}

/* Waits for machine m's record (rec, cap bytes), checks it against this machine's job shape
 * and counts the machines that share this one's CPUs (token). Returns 0, or the exit status
 * after saying why: a different job shape (machine 0 also publishes it), the deadline (naming
 * the machines missing), a failure another launcher published, a stop signal, a broken store. */
static int check_machine(launch_rdzv *r, int m, const char *token, char *rec, size_t cap)
{
    const launch_settings *s = r->s;
    char key[64], msg[1024], peer_token[64];
    size_t nb = 0;
    key_of(key, sizeof(key), "machine", m);
    for (;;) {
        int sig = interrupted(r, NULL);
        if (sig != 0) {
            return sig;
        }
        double left = r->deadline - accel__now();
        accel_status st = accel__store_get(r->st, key, rec, cap - 1, &nb,
                                           left < SLICE_S ? (left > 0 ? left : 0) : SLICE_S);
        if (st == ACCEL_OK) {
            break;
        }
        if ((st == ACCEL_ETIMEDOUT || st == ACCEL_ENOTFOUND) &&
            accel__store_broken(r->st) == ACCEL_OK && failed_elsewhere(r) != 0) {
            return 1;
        }
        /* Also when the store broke while reading the failure: a machine 0 that stopped tells
         * why in the error (accel__store_close_failed). */
        if ((st != ACCEL_ETIMEDOUT && st != ACCEL_ENOTFOUND) ||
            accel__store_broken(r->st) != ACCEL_OK) {
            return store_failed(r);
        }
        if (accel__now() >= r->deadline) {
            char missing[256];
            list_missing(r, missing, sizeof(missing));
            fprintf(stderr,
                    "accel launch: error: rendezvous at %s timed out after %g s: machine rank(s) "
                    "%s of %d did not arrive (start them with --machine_rank, the same "
                    "--main_process_ip and --main_process_port; a longer wait: --rdzv_conf "
                    "timeout=SECONDS)\n",
                    r->name, s->rdzv_timeout_s, missing, s->num_machines);
            snprintf(r->cause, sizeof(r->cause),
                     "machine rank(s) %s of %d did not arrive within %g s", missing,
                     s->num_machines, s->rdzv_timeout_s);
            return 1;
        }
        say_waiting(r);
    }
    rec[nb] = '\0';
    if (launch_check_record(s, m, rec, peer_token, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "accel launch: error: %s\n", msg);
        if (s->machine_rank == 0) {
            /* For the machines still waiting; they get it at the store's close too. */
            publish_failure(r, 1, "%s", msg);
            snprintf(r->cause, sizeof(r->cause), "%s", msg);
            r->linger = 1;
        }
        return 1;
    }
    if (m == s->machine_rank || (strcmp(token, "-") != 0 && strcmp(peer_token, token) == 0)) {
        r->n_sharing_machines++;
    }
    return 0;
}

static int tick(void *arg);
static void on_failure(void *arg, int rank, int wstatus);

int launch_rdzv_join(const launch_settings *s, launch_rdzv **out)
{
    *out = NULL;
    launch_rdzv *r = accel__calloc(1, sizeof(*r));
    if (r == NULL) {
        fprintf(stderr, "accel launch: error: out of memory\n");
        return 1;
    }
    r->s = s;
    r->watch = (launch_watch){.tick = tick, .on_failure = on_failure, .arg = r};
    if (gethostname(r->host, sizeof(r->host)) != 0) {
        r->host[0] = '\0';
    }
    r->host[sizeof(r->host) - 1] = '\0';
    if (r->host[0] == '\0') {
        /* An empty field would shift the CPU token into the host's place in the record. */
        snprintf(r->host, sizeof(r->host), "?");
    }
    r->t0 = accel__now();
    r->deadline = r->t0 + s->rdzv_timeout_s;
    r->say_at = r->t0 + (s->rdzv_timeout_s / 2 < SAY_S ? s->rdzv_timeout_s / 2 : SAY_S);
    launch_host_port(r->name, sizeof(r->name), s->master_addr, s->port);
    const int me = s->machine_rank, M = s->num_machines;
    char key[64], rec[512], token[64];
    int64_t claims = 0;
    launch_stop_catch(); /* until the supervisor takes the signals over */
    int rc = open_store(r);
    if (rc != 0) {
        goto fail;
    }
    launch_host_port(r->name, sizeof(r->name), s->master_addr, r->port);
    rc = 1;
    key_of(key, sizeof(key), "claim", me);
    if (accel__store_add(r->st, key, 1, &claims) != ACCEL_OK) {
        rc = store_failed(r);
        goto fail;
    }
    if (claims != 1) {
        fprintf(stderr,
                "accel launch: error: machine rank %d joined the rendezvous at %s twice: another "
                "launcher was started with --machine_rank %d\n",
                me, r->name, me);
        publish_failure(r, 1, "machine rank %d was started twice (host %s)", me, r->host);
        goto fail;
    }
    launch_cpu_token(token, sizeof(token));
    char own[512];
    snprintf(own, sizeof(own), "%d %d %d %d %s %s", M, s->n_procs, s->max_restarts, s->preflight,
             r->host, token);
    key_of(key, sizeof(key), "machine", me);
    /* Machine 0's record first (it publishes it as soon as it serves): a machine started with
     * another job shape says why itself, instead of seeing machine 0 stop; it still publishes
     * its own, so that machine 0 names the difference too. */
    if (me != 0 && (rc = check_machine(r, 0, token, rec, sizeof(rec))) != 0) {
        if (rc == 1 && accel__store_broken(r->st) == ACCEL_OK) {
            (void)accel__store_set(r->st, key, own, strlen(own));
        }
        goto fail;
    }
    if (accel__store_set(r->st, key, own, strlen(own)) != ACCEL_OK) {
        rc = store_failed(r);
        goto fail;
    }
    for (int m = me == 0 ? 0 : 1; m < M; m++) {
        if ((rc = check_machine(r, m, token, rec, sizeof(rec))) != 0) {
            goto fail;
        }
    }
    /* check_machine looks for failures only between slices, and records already there need
     * none: a launcher interrupted just before the last machine arrived would go unseen. */
    rc = 1;
    if (failed_elsewhere(r) != 0) {
        goto fail;
    }
    r->beat = accel__calloc((size_t)M, sizeof(*r->beat));
    r->beat_at = accel__calloc((size_t)M, sizeof(*r->beat_at));
    r->finished = accel__calloc((size_t)M, sizeof(*r->finished));
    if (r->beat == NULL || r->beat_at == NULL || r->finished == NULL) {
        fprintf(stderr, "accel launch: error: out of memory\n");
        goto fail;
    }
    const int base = me * s->n_procs;
    char backend[256], ranks[64];
    launch_expected_backend(s, backend, sizeof(backend));
    if (s->n_procs == 1) {
        snprintf(ranks, sizeof(ranks), "rank %d", base);
    } else {
        snprintf(ranks, sizeof(ranks), "ranks %d-%d", base, base + s->n_procs - 1);
    }
    fprintf(stderr,
            "accel launch: rendezvous: machine %d of %d (%s), %s of %d, backend %s, master %s, "
            "all %d machines in %.1f s\n",
            me, M, r->host, ranks, s->n_procs * M, backend, r->name, M, accel__now() - r->t0);
    *out = r;
    return 0;

fail:
    launch_rdzv_free(r);
    return rc;
}

int launch_rdzv_cpu_sharers(const launch_rdzv *r)
{
    return r->n_sharing_machines;
}

const char *launch_rdzv_job_id(const launch_rdzv *r)
{
    return r->job_id;
}

int launch_rdzv_port(const launch_rdzv *r)
{
    return r->port;
}

const launch_watch *launch_rdzv_watch(const launch_rdzv *r)
{
    return &r->watch;
}

accel__store *launch_rdzv_store(launch_rdzv *r)
{
    return r->st;
}

static void on_failure(void *arg, int rank, int wstatus)
{
    launch_rdzv *r = arg;
    char what[96];
    launch_describe_status(wstatus, what, sizeof(what));
    publish_failure(r, launch_exit_status(wstatus), "rank %d on machine %d (host %s) failed: %s",
                    rank, r->s->machine_rank, r->host, what);
}

/* Machine 0: 0, or the exit status after publishing that machine m's launcher is gone. */
static int check_heartbeats(launch_rdzv *r, double now)
{
    for (int m = 1; m < r->s->num_machines; m++) {
        char key[64], v[32];
        size_t nb = 0;
        if (r->finished[m]) {
            continue;
        }
        attempt_key(r, key, sizeof(key), "done", m);
        int done = has_key(r, key);
        attempt_key(r, key, sizeof(key), "stopped", m);
        if (done || has_key(r, key)) {
            r->finished[m] = 1;
            continue;
        }
        key_of(key, sizeof(key), "alive", m);
        long long beat = 0;
        if (accel__store_get(r->st, key, v, sizeof(v) - 1, &nb, 0) == ACCEL_OK) {
            v[nb] = '\0';
            beat = atoll(v);
        }
        if (beat != r->beat[m] || r->beat_at[m] == 0) {
            r->beat[m] = beat;
            r->beat_at[m] = now;
        } else if (now - r->beat_at[m] > LOST_S) {
            publish_failure(r, 1, "machine %d's launcher stopped answering (no heartbeat for %g s)",
                            m, LOST_S);
            (void)accel__store_set(r->st, "launch/final", "lost", 4); /* no restart without it */
            r->finished[m] = 1; /* gone: nobody waits for it any more */
            r->beat_at[m] = -1;
            return 1;
        }
    }
    return 0;
}

/* The supervisor's tick: heartbeat, then the job's failure, then (machine 0) the others'
 * heartbeats. A store that broke means machine 0's launcher is gone: stop too. */
static int tick(void *arg)
{
    launch_rdzv *r = arg;
    char key[64], msg[1024];
    key_of(key, sizeof(key), "alive", r->s->machine_rank);
    if (r->lost) {
        return 1; /* ticks during the teardown: the cause was named ("the connection failed
                   * earlier and is unusable" would be a second, misleading line) */
    }
    if (accel__store_add(r->st, key, 1, NULL) != ACCEL_OK) {
        fprintf(stderr,
                "accel launch: machine %d lost the rendezvous (machine 0's launcher) at %s: %s; "
                "stopping this machine's processes\n",
                r->s->machine_rank, r->name, accel_last_error(NULL));
        r->lost = 1;
        return 1;
    }
    int status = read_failure(r, msg, sizeof(msg));
    if (status == 0 && r->s->machine_rank == 0) {
        if (check_heartbeats(r, accel__now()) != 0) {
            status = read_failure(r, msg, sizeof(msg));
        }
    }
    if (status != 0) {
        fprintf(stderr, "accel launch: machine %d: stopping: %s\n", r->s->machine_rank, msg);
    }
    return status;
}

int launch_rdzv_check(launch_rdzv *r, const char *during)
{
    char msg[1024];
    int rc = interrupted(r, during);
    if (rc == 0 && read_failure(r, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "accel launch: error: machine %d: %s stopped: %s\n", r->s->machine_rank,
                during, msg);
        rc = 1;
    }
    return rc;
}

int launch_rdzv_begin(launch_rdzv *r, int attempt)
{
    char key[64];
    size_t nb = 0;
    r->attempt = attempt;
    memset(r->finished, 0, (size_t)r->s->num_machines * sizeof(*r->finished));
    memset(r->beat_at, 0, (size_t)r->s->num_machines * sizeof(*r->beat_at));
    attempt_key(r, key, sizeof(key), "job", -1);
    launch_stop_catch(); /* a restart's (the supervisor gave them back), until the next one */
    if (r->s->machine_rank == 0) {
        if (accel__random_hex(r->job_id, sizeof(r->job_id)) != 0) {
            fprintf(stderr, "accel launch: error: no random source for the job id: %s\n",
                    strerror(errno));
            return 1;
        }
        if (accel__store_set(r->st, key, r->job_id, strlen(r->job_id)) == ACCEL_OK) {
            return 0;
        }
    } else {
        /* In slices, looking for a stop signal and a failure published meanwhile. */
        const double deadline = accel__now() + r->s->rdzv_timeout_s;
        for (double left; (left = deadline - accel__now()) > 0;) {
            accel_status st = accel__store_get(r->st, key, r->job_id, sizeof(r->job_id) - 1, &nb,
                                               left < SLICE_S ? left : SLICE_S);
            if (st == ACCEL_OK) {
                r->job_id[nb] = '\0';
                return 0;
            }
            if (st != ACCEL_ETIMEDOUT || accel__store_broken(r->st) != ACCEL_OK) {
                goto failed; /* the store's error says why */
            }
            int rc = launch_rdzv_check(r, "the job's start");
            if (rc != 0) {
                return rc;
            }
        }
        fprintf(stderr,
                "accel launch: error: machine %d: machine 0's launcher at %s did not start "
                "attempt %d within %g s\n",
                r->s->machine_rank, r->name, attempt, r->s->rdzv_timeout_s);
        return 1;
    }
failed:
    fprintf(stderr, "accel launch: error: machine %d: rendezvous at %s: %s\n", r->s->machine_rank,
            r->name, accel_last_error(NULL));
    return 1;
}

/* Whether every machine but those finished[] knows of has published the end of this attempt
 * (another machine than 0 reads the keys itself; machine 0's heartbeat check marks them). */
static int all_finished(launch_rdzv *r, char *missing, size_t cap)
{
    size_t len = 0;
    missing[0] = '\0';
    for (int m = 0; m < r->s->num_machines; m++) {
        char key[64];
        if (!r->finished[m]) {
            attempt_key(r, key, sizeof(key), "done", m);
            int done = has_key(r, key);
            attempt_key(r, key, sizeof(key), "stopped", m);
            r->finished[m] = done || has_key(r, key);
        }
        if (!r->finished[m] && len < cap) {
            len += (size_t)snprintf(missing + len, cap - len, "%s%d", len ? ", " : "", m);
        }
    }
    return len == 0;
}

int launch_rdzv_finish(launch_rdzv *r, int rc, launch_outcome outcome, int *again)
{
    char key[64], msg[1024], missing[256];
    const int me = r->s->machine_rank;
    *again = 0;
    launch_stop_release(); /* after a failed preflight: a signal takes its old course again */
    if (outcome == LAUNCH_INTERRUPTED || outcome == LAUNCH_NOT_STARTED) {
        publish_failure(r, rc != 0 ? rc : 1, "machine %d's launcher (host %s) %s", me, r->host,
                        outcome == LAUNCH_INTERRUPTED ? "was interrupted"
                                                      : "could not start its processes");
        (void)accel__store_set(r->st, "launch/final", "stop", 4);
    }
    attempt_key(r, key, sizeof(key), outcome == LAUNCH_SUCCEEDED ? "done" : "stopped", me);
    (void)accel__store_set(r->st, key, "1", 1);
    if (me != 0 && r->s->max_restarts == 0) {
        return rc;
    }
    /* Machine 0 serves the store until every machine has finished (or is gone); with restarts
     * every machine waits, so that all agree whether the job starts again. */
    int said = 0;
    for (;;) {
        if (me == 0 && check_heartbeats(r, accel__now()) != 0) {
            read_failure(r, msg, sizeof(msg));
            fprintf(stderr, "accel launch: machine 0: %s\n", msg);
        }
        if (me != 0) {
            key_of(key, sizeof(key), "alive", me);
            if (accel__store_add(r->st, key, 1, NULL) != ACCEL_OK) {
                fprintf(stderr, "accel launch: machine %d lost the rendezvous at %s: %s\n", me,
                        r->name, accel_last_error(NULL));
                return rc != 0 ? rc : 1;
            }
            if (has_key(r, "launch/final")) {
                break; /* machine 0 gave up on a lost machine, or a launcher was stopped */
            }
        }
        if (all_finished(r, missing, sizeof(missing))) {
            break;
        }
        if (!said) {
            fprintf(stderr, "accel launch: machine %d: waiting for machine(s) %s to finish\n", me,
                    missing);
            said = 1;
        }
        struct timespec pause = {0, 200 * 1000000L};
        nanosleep(&pause, NULL);
    }
    int status = read_failure(r, msg, sizeof(msg));
    if (rc == 0 && status != 0) {
        fprintf(stderr, "accel launch: machine %d: the job failed elsewhere: %s\n", me, msg);
        rc = status;
    }
    *again = status != 0 && r->attempt < r->s->max_restarts && !has_key(r, "launch/final");
    /* With restarts the others read the verdict after they saw everyone finish: machine 0
     * keeps the store up until each has said it left (or a bounded wait for a lost one). */
    attempt_key(r, key, sizeof(key), "left", me);
    (void)accel__store_set(r->st, key, "1", 1);
    for (int m = 1; me == 0 && r->s->max_restarts > 0 && m < r->s->num_machines; m++) {
        const char *keys[1] = {key};
        attempt_key(r, key, sizeof(key), "left", m);
        if (r->beat_at[m] >= 0) {
            (void)accel__store_wait(r->st, keys, 1, 2 * OP_TIMEOUT_S);
        }
    }
    return rc;
}

/* Machine 0: whether another machine's launcher claimed its rank; alone, nobody is there to
 * read why the rendezvous failed, so there is no reason to serve any longer. */
static int others_joined(launch_rdzv *r)
{
    int joined = 0;
    for (int m = 1; m < r->s->num_machines && !joined; m++) {
        char key[64];
        key_of(key, sizeof(key), "claim", m);
        joined = has_key(r, key);
    }
    return joined;
}

void launch_rdzv_free(launch_rdzv *r)
{
    launch_stop_release(); /* a second signal, e.g. during the linger, ends the launcher */
    if (r == NULL) {
        return;
    }
    /* Machine 0 after a failed rendezvous: the others waiting read the failure published
     * within a slice; one that is too late learns it from the store's last answer. */
    int linger = r->linger && r->s->machine_rank == 0 && others_joined(r);
    accel__store_close_failed(r->st, r->cause, linger ? 2 * SLICE_S : 0);
    accel__free(r->beat);
    accel__free(r->beat_at);
    accel__free(r->finished);
    accel__free(r);
}
