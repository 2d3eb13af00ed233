/*
 * What the launchers of a job on several machines watch while the processes run (rdzv.c has
 * the rendezvous): each beats a heartbeat counter and reads the job's first failure every tick;
 * machine 0 also names a launcher whose connection closed without a goodbye (launch_rdzv__lost),
 * or whose counter stood still LOST_S. At the end of an attempt every machine publishes done or
 * stopped, and machine 0 (every machine, with restarts) waits until all have, so that the store
 * outlives the last reader and all agree on a restart; a stop signal there is said and
 * published too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "base/base.h"
#include "rdzv_int.h"

/* Machine m's launcher heartbeat counter, 0 before its first beat. */
long long launch_rdzv__beat_of(launch_rdzv *r, int m)
{
    char key[64], v[32];
    size_t nb = 0;
    key_of(key, sizeof(key), "alive", m);
    if (accel__store_get(r->st, key, v, sizeof(v) - 1, &nb, 0) != ACCEL_OK) {
        return 0;
    }
    v[nb] = '\0';
    return atoll(v);
}

int launch_rdzv__lost(launch_rdzv *r, int m)
{
    char key[64];
    key_of(key, sizeof(key), "lost", m);
    return launch_rdzv__has_key(r, key);
}

void launch_rdzv__on_failure(void *arg, int rank, int wstatus)
{
    launch_rdzv *r = arg;
    char what[96];
    launch_describe_status(wstatus, what, sizeof(what));
    launch_rdzv__publish_failure(r, launch_exit_status(wstatus),
                                 "rank %d on machine %d (host %s) failed: %s", rank,
                                 r->s->machine_rank, r->host, what);
}

void launch_rdzv__on_stopped(void *arg, const char *what)
{
    launch_rdzv *r = arg;
    char key[64];
    size_t len = strlen(r->stopped_ranks);
    if (r->s->machine_rank == 0 || len + 2 >= sizeof(r->stopped_ranks)) {
        return; /* machine 0 printed it itself; or the line is full: the first ones are named */
    }
    snprintf(r->stopped_ranks + len, sizeof(r->stopped_ranks) - len, "%s%s", len ? "; " : "", what);
    attempt_key(r, key, sizeof(key), "stopped_rank", r->s->machine_rank);
    (void)accel__store_set(r->st, key, r->stopped_ranks, strlen(r->stopped_ranks));
}

/* Whether machine m published the end of this attempt (done or stopped). */
static int ended(launch_rdzv *r, int m)
{
    char key[64];
    attempt_key(r, key, sizeof(key), "done", m);
    if (launch_rdzv__has_key(r, key)) {
        return 1;
    }
    attempt_key(r, key, sizeof(key), "stopped", m);
    return launch_rdzv__has_key(r, key);
}

/* Machine 0: 0, or the exit status after publishing that machine m's launcher is gone, said
 * in r->gone too: the first failure wins, and a rank here that saw machine m's ranks die with
 * their launcher has often published its own before, so launch_rdzv_finish names it last.
 * A launcher that died is seen at once (its store connection closed); one that is stopped or
 * cut off keeps its connection, and its heartbeat standing still LOST_S names it. */
static int check_heartbeats(launch_rdzv *r, double now)
{
    for (int m = 1; m < r->s->num_machines; m++) {
        if (r->finished[m]) {
            continue;
        }
        if (ended(r, m)) {
            r->finished[m] = 1;
            continue;
        }
        long long beat = launch_rdzv__beat_of(r, m);
        const int lost = launch_rdzv__lost(r, m);
        if (!lost && (beat != r->beat[m] || r->beat_at[m] == 0)) {
            r->beat[m] = beat;
            r->beat_at[m] = now;
        } else if (lost || now - r->beat_at[m] > LOST_S) {
            if (lost) {
                snprintf(r->gone, sizeof(r->gone), "machine %d's launcher is gone " LOST_WHY, m);
            } else {
                snprintf(r->gone, sizeof(r->gone),
                         "machine %d's launcher stopped answering (no heartbeat for %g s)", m,
                         LOST_S);
            }
            launch_rdzv__publish_failure(r, 1, "%s", r->gone);
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
int launch_rdzv__tick(void *arg)
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
    int status = launch_rdzv__read_failure(r, msg, sizeof(msg));
    if (status == 0 && r->s->machine_rank == 0) {
        if ((status = check_heartbeats(r, accel__now())) != 0) {
            snprintf(msg, sizeof(msg), "%s", r->gone);
        }
    }
    if (status != 0) {
        fprintf(stderr, "accel launch: machine %d: stopping: %s\n", r->s->machine_rank, msg);
    }
    return status;
}

/* Whether every machine but those finished[] knows of has published the end of this attempt
 * (another machine than 0 reads the keys itself; machine 0's heartbeat check marks them). */
static int all_finished(launch_rdzv *r, char *missing, size_t cap)
{
    size_t len = 0;
    missing[0] = '\0';
    for (int m = 0; m < r->s->num_machines; m++) {
        if (!r->finished[m]) {
            r->finished[m] = ended(r, m);
        }
        if (!r->finished[m] && len < cap) {
            len += (size_t)snprintf(missing + len, cap - len, "%s%d", len ? ", " : "", m);
        }
    }
    return len == 0;
}

/* A stop signal while this machine waits for the others' end (its processes ended): 0, or
 * 128 + the signal after saying so and publishing it (launch_rdzv__interrupted). */
static int interrupted_waiting(launch_rdzv *r)
{
    return launch_rdzv__interrupted(r, "the wait for the other machines",
                                    "this machine's processes had ended");
}

int launch_rdzv_finish(launch_rdzv *r, int rc, launch_outcome outcome, int *again)
{
    char key[64], msg[1024], missing[256];
    const int me = r->s->machine_rank;
    *again = 0;
    /* The waits below say a stop signal, publish it and end the launcher with it (before, it
     * ended silently with the default action); caught until the end, or, when the job starts
     * again, through the pause until launch_rdzv_begin looks at it. */
    launch_stop_catch();
    if (outcome == LAUNCH_INTERRUPTED || outcome == LAUNCH_NOT_STARTED) {
        launch_rdzv__publish_failure(
            r, rc != 0 ? rc : 1, "machine %d's launcher (host %s) %s", me, r->host,
            outcome == LAUNCH_INTERRUPTED ? "was interrupted" : "could not start its processes");
        (void)accel__store_set(r->st, "launch/final", "stop", 4);
    }
    attempt_key(r, key, sizeof(key), outcome == LAUNCH_SUCCEEDED ? "done" : "stopped", me);
    (void)accel__store_set(r->st, key, "1", 1);
    if (me != 0 && r->s->max_restarts == 0) {
        launch_stop_release();
        return rc;
    }
    /* Machine 0 serves the store until every machine has finished (or is gone); with restarts
     * every machine waits, so that all agree whether the job starts again. */
    int said = 0, sig_rc = 0;
    for (;;) {
        if (me == 0) {
            (void)check_heartbeats(r, accel__now()); /* said below */
        }
        if (me != 0) {
            key_of(key, sizeof(key), "alive", me);
            if (accel__store_add(r->st, key, 1, NULL) != ACCEL_OK) {
                fprintf(stderr, "accel launch: machine %d lost the rendezvous at %s: %s\n", me,
                        r->name, accel_last_error(NULL));
                return rc != 0 ? rc : 1;
            }
            if (launch_rdzv__has_key(r, "launch/final")) {
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
        if (sig_rc == 0 && (sig_rc = interrupted_waiting(r)) != 0) {
            launch_stop_release(); /* a second signal ends the launcher at once */
            if (me != 0 || outcome == LAUNCH_INTERRUPTED) {
                return sig_rc; /* nobody reads from it; or the second signal: "now" */
            }
            /* Machine 0 serves on until the others, which stop their processes now, have
             * read it: lingering would race their ticks. Its own store needs no bound. */
            accel__store_bound(r->st, 0);
        }
        struct timespec pause = {0, 200 * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (sig_rc != 0) {
        return sig_rc;
    }
    int status = launch_rdzv__read_failure(r, msg, sizeof(msg));
    if (r->gone[0] != '\0') {
        fprintf(stderr, "accel launch: machine 0: the job failed: %s\n", r->gone);
        r->gone[0] = '\0';
    } else if (rc == 0 && status != 0) {
        fprintf(stderr, "accel launch: machine %d: the job failed elsewhere: %s\n", me, msg);
    }
    /* Last, the stopped processes of the other machines, which their peers' timeouts blame
     * on someone else: only their own launcher saw them stopped. */
    for (int m = 1; me == 0 && (rc != 0 || status != 0) && m < r->s->num_machines; m++) {
        size_t nb = 0;
        attempt_key(r, key, sizeof(key), "stopped_rank", m);
        if (accel__store_get(r->st, key, msg, sizeof(msg) - 1, &nb, 0) == ACCEL_OK) {
            msg[nb] = '\0';
            fprintf(stderr, "accel launch: machine 0: on machine %d, %s\n", m, msg);
        }
    }
    if (rc == 0 && status != 0) {
        rc = status;
    }
    *again =
        status != 0 && r->attempt < r->s->max_restarts && !launch_rdzv__has_key(r, "launch/final");
    /* With restarts the others read the verdict after they saw everyone finish: machine 0
     * keeps the store up until each has said it left (or a bounded wait for a lost one). */
    attempt_key(r, key, sizeof(key), "left", me);
    (void)accel__store_set(r->st, key, "1", 1);
    for (int m = 1; me == 0 && r->s->max_restarts > 0 && m < r->s->num_machines; m++) {
        const char *keys[1] = {key};
        const double until = accel__now() + 2 * OP_TIMEOUT_S;
        attempt_key(r, key, sizeof(key), "left", m);
        /* In slices, so that a stop signal is seen. */
        while (r->beat_at[m] >= 0 && launch_stop_signal() == 0 && accel__now() < until &&
               accel__store_wait(r->st, keys, 1, SLICE_S) == ACCEL_ETIMEDOUT) {
        }
    }
    sig_rc = interrupted_waiting(r);
    if (sig_rc != 0 || !*again) {
        launch_stop_release();
    }
    if (sig_rc != 0) {
        *again = 0;
        return sig_rc;
    }
    return rc;
}
