/*
 * The launchers' rendezvous of a job on several machines, through the job's TCP store
 * (comm/store.h): machine 0's launcher serves it on main_process_ip:main_process_port for the
 * whole job, every launcher joins it, claims its machine rank, publishes what it was started
 * with and waits (--rdzv_conf timeout) for every other machine, naming the ones missing. While
 * the processes run, the launchers watch each other through it (rdzv_watch.c): the first failure
 * anywhere is published under "launch/<attempt>/failed" and every launcher stops its processes
 * within a second of seeing it; machine 0 also names a launcher that died (kill -9, a crash)
 * within a second, from the key its store server sets when that launcher's connection ends
 * without a goodbye ("launch/lost/<m>", accel__store_declare), and one that is stopped or cut
 * off from its heartbeat counter, within LOST_S. With --max_restarts, every
 * launcher waits until every machine has stopped the attempt, and they all start the next one
 * together (machine 0 makes each attempt's job id); a lost launcher or an interrupt
 * ("launch/final") ends the restarts. Keys live under "launch/"; the ranks' own keys are prefixed
 * by ACCEL_JOB_ID, so the two never meet. Each machine's record also carries a token of the CPUs
 * its launcher may use (boot id and CPU set), so that machines emulated on one host do not each
 * bind their processes to the same CPUs. The rendezvous waits in slices of SLICE_S, looking
 * between them for a failure another launcher published and for a stop signal (which it
 * publishes); machines other than 0 check machine 0's record before they publish their own.
 * When every record is there, the others beat their heartbeat until machine 0 has seen each
 * one beat ("launch/ready"): a launcher that died after publishing its record is named at once
 * (its lost key), a stopped one within ALIVE_S, and nothing starts.
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
#include "rdzv_int.h"

int launch_rdzv__has_key(launch_rdzv *r, const char *key)
{
    char v[8];
    size_t nb;
    accel_status st = accel__store_get(r->st, key, v, sizeof(v), &nb, 0);
    return st == ACCEL_OK || st == ACCEL_EINVAL; /* EINVAL: present, longer than v */
}

void launch_rdzv__publish_failure(launch_rdzv *r, int status, const char *fmt, ...)
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

int launch_rdzv__read_failure(launch_rdzv *r, char *msg, size_t cap)
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
        if (!launch_rdzv__has_key(r, key)) {
            len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%d", n ? ", " : "", m);
            n++;
            if (len >= cap) {
                break;
            }
        }
    }
    return n;
}

int launch_rdzv__interrupted(launch_rdzv *r, const char *during, const char *after)
{
    const int sig = launch_stop_signal();
    if (sig == 0) {
        return 0;
    }
    const char *name = launch_stop_name(sig);
    fprintf(stderr, "accel launch: machine %d: interrupted by %s during %s%s: %s\n",
            r->s->machine_rank, name, during != NULL ? during : "the rendezvous at ",
            during != NULL ? "" : r->name, after);
    snprintf(r->cause, sizeof(r->cause),
             "machine %d's launcher (host %s) was interrupted by %s during %s", r->s->machine_rank,
             r->host, name, during != NULL ? during : "the rendezvous");
    if (r->st != NULL) {
        char key[64];
        accel__store_bound(r->st, accel__now() + ACCEL__STORE_RECORD_S);
        launch_rdzv__publish_failure(r, 128 + sig, "%s", r->cause);
        attempt_key(r, key, sizeof(key), "stopped", r->s->machine_rank);
        (void)accel__store_set(r->st, key, "1", 1); /* machine 0 waits for nobody's end here */
        attempt_key(r, key, sizeof(key), "left", r->s->machine_rank);
        (void)accel__store_set(r->st, key, "1", 1); /* nor, with restarts, for its leaving */
        (void)accel__store_set(r->st, "launch/final", "stop", 4);
        r->linger = 1;
    }
    return 128 + sig;
}

/* Before the processes start: launch_rdzv__interrupted, "nothing was started". */
static int interrupted(launch_rdzv *r, const char *during)
{
    return launch_rdzv__interrupted(r, during, "nothing was started");
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
    /* Tries of a slice, so that a stop signal is noticed at once; the store that answers then
     * takes the timeout of one call, which bounds every later set and add. */
    for (;;) {
        int sig = interrupted(r, NULL);
        if (sig != 0) {
            return sig;
        }
        double left = r->deadline - accel__now();
        sc.timeout_s = left < SLICE_S ? (left > 0.05 ? left : 0.05) : SLICE_S;
        accel_status st = accel__store_open(&r->st, &sc);
        if (st == ACCEL_OK) {
            accel__store_set_timeout(r->st, OP_TIMEOUT_S);
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
    if (launch_rdzv__read_failure(r, msg, sizeof(msg)) == 0) {
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

/* After a rendezvous wait that got nothing (st): 0 to wait on, else the exit status after
 * saying why: a failure another launcher published, or the store's error. The failure is read
 * first, and the store judged after: when the store broke while reading it, a machine 0 that
 * stopped tells why in the store's error (accel__store_close_failed). */
static int wait_ended(launch_rdzv *r, accel_status st)
{
    const int waiting =
        (st == ACCEL_ETIMEDOUT || st == ACCEL_ENOTFOUND) && accel__store_broken(r->st) == ACCEL_OK;
    if (waiting && failed_elsewhere(r) != 0) {
        return 1;
    }
    return !waiting || accel__store_broken(r->st) != ACCEL_OK ? store_failed(r) : 0;
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
        int rc = wait_ended(r, st);
        if (rc != 0) {
            return rc;
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
            launch_rdzv__publish_failure(r, 1, "%s", msg);
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

/* Machine 0, every record there: a launcher killed after it published its record would leave
 * the others' processes waiting ACCEL_TIMEOUT for its ranks, so each other launcher must beat
 * (await_confirmed) within ALIVE_S before "launch/ready" lets them all go on. Returns 0, or
 * the exit status after saying why (and publishing it). Borrows finished[] for "seen". */
static int confirm_alive(launch_rdzv *r)
{
    const int M = r->s->num_machines;
    const double until = accel__now() + ALIVE_S;
    for (int m = 1; m < M; m++) {
        r->beat[m] = launch_rdzv__beat_of(r, m);
    }
    for (;;) {
        int sig = interrupted(r, NULL);
        if (sig != 0) {
            return sig;
        }
        if (failed_elsewhere(r) != 0) {
            return 1;
        }
        int silent = -1, lost = -1;
        for (int m = 1; m < M; m++) {
            lost = lost < 0 && launch_rdzv__lost(r, m) ? m : lost;
            r->finished[m] = r->finished[m] || launch_rdzv__beat_of(r, m) != r->beat[m];
            silent = silent < 0 && !r->finished[m] ? m : silent;
        }
        if (silent < 0 && lost < 0) {
            break;
        }
        if (lost < 0 && accel__now() < until) {
            struct timespec pause = {0, (long)(BEAT_S / 2 * 1e9)};
            nanosleep(&pause, NULL);
            continue;
        }
        if (lost >= 0) { /* at once: its connection closed */
            snprintf(r->cause, sizeof(r->cause),
                     "machine %d's launcher is gone after it published its record " LOST_WHY
                     ": nothing was started",
                     lost);
        } else {
            snprintf(r->cause, sizeof(r->cause),
                     "machine %d's launcher stopped answering after it published its record "
                     "(no heartbeat for %g s): nothing was started",
                     silent, ALIVE_S);
        }
        launch_rdzv__publish_failure(r, 1, "%s", r->cause);
        fprintf(stderr, "accel launch: error: machine 0: the rendezvous at %s failed: %s\n",
                r->name, r->cause);
        r->linger = 1;
        return 1;
    }
    memset(r->finished, 0, (size_t)M * sizeof(*r->finished));
    if (accel__store_set(r->st, "launch/ready", "1", 1) != ACCEL_OK) {
        return store_failed(r);
    }
    return 0;
}

/* Machines 1..M-1, every record there: beats every BEAT_S until machine 0 has seen every
 * launcher alive (confirm_alive). Returns 0, or the exit status after saying why. */
static int await_confirmed(launch_rdzv *r)
{
    const double until = accel__now() + ALIVE_S + LOST_S;
    char key[64], v[8];
    size_t nb = 0;
    key_of(key, sizeof(key), "alive", r->s->machine_rank);
    for (;;) {
        int sig = interrupted(r, NULL);
        if (sig != 0) {
            return sig;
        }
        if (accel__store_add(r->st, key, 1, NULL) != ACCEL_OK) {
            return store_failed(r);
        }
        accel_status st = accel__store_get(r->st, "launch/ready", v, sizeof(v), &nb, BEAT_S);
        if (st == ACCEL_OK) {
            return 0;
        }
        int rc = wait_ended(r, st);
        if (rc != 0) {
            return rc;
        }
        if (accel__now() >= until) {
            fprintf(stderr,
                    "accel launch: error: machine %d: machine 0's launcher at %s did not confirm "
                    "the rendezvous within %g s\n",
                    r->s->machine_rank, r->name, ALIVE_S + LOST_S);
            return 1;
        }
    }
}

int launch_rdzv_join(const launch_settings *s, launch_rdzv **out)
{
    *out = NULL;
    launch_rdzv *r = accel__calloc(1, sizeof(*r));
    if (r == NULL) {
        fprintf(stderr, "accel launch: error: out of memory\n");
        return 1;
    }
    r->s = s;
    r->watch = (launch_watch){.tick = launch_rdzv__tick,
                              .on_failure = launch_rdzv__on_failure,
                              .on_stopped = launch_rdzv__on_stopped,
                              .arg = r};
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
    accel__host_port(r->name, sizeof(r->name), s->master_addr, s->port);
    const int me = s->machine_rank, M = s->num_machines;
    char key[64], rec[512], token[64];
    int64_t claims = 0;
    launch_stop_catch(); /* until the supervisor takes the signals over */
    int rc = open_store(r);
    if (rc != 0) {
        goto fail;
    }
    accel__host_port(r->name, sizeof(r->name), s->master_addr, r->port);
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
        launch_rdzv__publish_failure(r, 1, "machine rank %d was started twice (host %s)", me,
                                     r->host);
        goto fail;
    }
    /* Should this launcher die (kill -9, a crash, its machine lost), machine 0's store server
     * sets "launch/lost/<m>" as the connection closes, and machine 0 names it at once; a
     * launcher that leaves says goodbye first (launch_rdzv_free). */
    key_of(key, sizeof(key), "lost", me);
    if (me != 0 && accel__store_declare(r->st, key, "1", 1) != ACCEL_OK) {
        rc = store_failed(r);
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
    if ((rc = me == 0 ? confirm_alive(r) : await_confirmed(r)) != 0) {
        goto fail;
    }
    rc = 1;
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

int launch_rdzv_check(launch_rdzv *r, const char *during)
{
    char msg[1024];
    int rc = interrupted(r, during);
    if (rc == 0 && launch_rdzv__read_failure(r, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "accel launch: error: machine %d: %s stopped: %s\n", r->s->machine_rank,
                during, msg);
        rc = 1;
    }
    /* Machine 0 names a launcher killed in between at once (its store connection closed);
     * without this it would wait for that machine's preflight verdict until the timeout. */
    for (int m = 1; rc == 0 && r->s->machine_rank == 0 && m < r->s->num_machines; m++) {
        if (launch_rdzv__lost(r, m)) {
            snprintf(msg, sizeof(msg), "machine %d's launcher is gone " LOST_WHY, m);
            launch_rdzv__publish_failure(r, 1, "%s", msg);
            r->finished[m] = 1; /* gone: launch_rdzv_finish neither waits for it nor says so */
            fprintf(stderr, "accel launch: error: machine 0: %s stopped: %s\n", during, msg);
            rc = 1;
        }
    }
    return rc;
}

int launch_rdzv_begin(launch_rdzv *r, int attempt)
{
    char key[64];
    size_t nb = 0;
    r->attempt = attempt;
    memset(r->finished, 0, (size_t)r->s->num_machines * sizeof(*r->finished));
    r->stopped_ranks[0] = '\0';
    memset(r->beat_at, 0, (size_t)r->s->num_machines * sizeof(*r->beat_at));
    attempt_key(r, key, sizeof(key), "job", -1);
    launch_stop_catch(); /* a restart's (kept since launch_rdzv_finish), until the next one */
    /* A restart: the pause (--monitor_interval) in slices, looking for a stop signal, which
     * is published for this attempt, so that the others stop it (and none starts it that had
     * not yet), and for one published by another machine. */
    int rc = 0;
    const double pause_end = accel__now() + r->s->monitor_interval_s;
    for (double left = pause_end - accel__now(); attempt > 0; left = pause_end - accel__now()) {
        if ((rc = launch_rdzv_check(r, "the pause between restarts")) != 0) {
            return rc;
        }
        if (left <= 0) {
            break;
        }
        const double slice = left < SLICE_S ? left : SLICE_S; /* a signal ends it early */
        struct timespec pause = {(time_t)slice, (long)((slice - (double)(time_t)slice) * 1e9)};
        nanosleep(&pause, NULL);
    }
    if (r->s->machine_rank == 0) {
        if (accel__random_hex(r->job_id, sizeof(r->job_id)) != 0) {
            fprintf(stderr, "accel launch: error: no random source for the job id: %s\n",
                    strerror(errno));
            return 1;
        }
        return accel__store_set(r->st, key, r->job_id, strlen(r->job_id)) == ACCEL_OK
                   ? 0
                   : store_failed(r);
    }
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
            return store_failed(r); /* the store's error says why */
        }
        rc = launch_rdzv_check(r, "the job's start");
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

/* Machine 0: whether another machine's launcher claimed its rank; alone, nobody is there to
 * read why the rendezvous failed, so there is no reason to serve any longer. */
static int others_joined(launch_rdzv *r)
{
    int joined = 0;
    for (int m = 1; m < r->s->num_machines && !joined; m++) {
        char key[64];
        key_of(key, sizeof(key), "claim", m);
        joined = launch_rdzv__has_key(r, key);
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
    if (r->s->machine_rank != 0 && r->st != NULL && accel__store_broken(r->st) == ACCEL_OK) {
        /* Not lost: leaving (bounded: a stopped machine 0 must not hold the exit). */
        accel__store_bound(r->st, accel__now() + ACCEL__STORE_RECORD_S);
        (void)accel__store_depart(r->st);
    }
    accel__store_close_failed(r->st, r->cause, linger ? 2 * SLICE_S : 0);
    accel__free(r->beat);
    accel__free(r->beat_at);
    accel__free(r->finished);
    accel__free(r);
}
