/*
 * Internal to the launchers' rendezvous: its state and store keys, shared by rdzv.c (joining,
 * each attempt's start, the close) and rdzv_watch.c (what the launchers watch while the
 * processes run, and the end of each attempt). Nothing else includes it.
 */
#ifndef ACCEL_CLI_RDZV_INT_H
#define ACCEL_CLI_RDZV_INT_H

#include <stdio.h>

#include "comm/store.h"
#include "launch.h"

#define OP_TIMEOUT_S 5.0 /* one store call; a stuck main launcher is then noticed */
#define LOST_S 5.0       /* a launcher whose heartbeat stands still this long is gone */
#define SLICE_S 0.5      /* a rendezvous wait between two looks at failures and signals */
#define BEAT_S 0.2       /* the rendezvous' end: how often a launcher beats (await_confirmed) */
#define ALIVE_S 3.0      /* and how long machine 0 waits for each launcher's beat */
#define SAY_S 5.0        /* the first "waiting for" line (half the timeout when shorter) */
#define SAY_AGAIN_S 30.0 /* and the next ones */
/* Why a launcher whose store connection closed without a goodbye is gone. */
#define LOST_WHY "(its connection to the rendezvous closed: killed, or its machine lost)"

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
    int *finished;  /* the machine published done or stopped */
    int lost;       /* the store broke: said once, the supervisor's later ticks stay quiet */
    char gone[192]; /* machine 0: a launcher found gone in this attempt, said again last */
    char stopped_ranks[512]; /* this attempt's stopped local processes (launch_rdzv__on_stopped) */
    /* The machines whose CPU token equals this one's, this one included (1: none shares). */
    int n_sharing_machines;
    double t0, deadline, say_at; /* the rendezvous: its start, end and next "waiting" line */
    char cause[1024]; /* machine 0: why the rendezvous failed, told to clients at the close */
    int linger;       /* machine 0: serve a little longer, so that the others read it */
};

static inline void key_of(char *buf, size_t n, const char *what, int machine)
{
    snprintf(buf, n, "launch/%s/%d", what, machine);
}

/* The key of this attempt: "launch/<attempt>/<what>" or, machine >= 0, ".../<machine>". */
static inline void attempt_key(launch_rdzv *r, char *buf, size_t n, const char *what, int machine)
{
    int k = snprintf(buf, n, "launch/%d/%s", r->attempt, what);
    if (machine >= 0 && k > 0 && (size_t)k < n) {
        snprintf(buf + k, n - (size_t)k, "/%d", machine);
    }
}

/* Whether key is set in the store. */
int launch_rdzv__has_key(launch_rdzv *r, const char *key);
/* Publishes the job's first failure (later ones are consequences): "<exit status> <text>". */
void launch_rdzv__publish_failure(launch_rdzv *r, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The published failure, if any: its exit status (>= 1) with its text in msg; else 0. */
int launch_rdzv__read_failure(launch_rdzv *r, char *msg, size_t cap);
/* 0, or, when a stop signal came (stop.c), its exit status (128 + the signal) after saying
 * so ("interrupted by SIGTERM during <during>: <after>") and publishing it, with this machine's
 * end of the attempt and "launch/final": the others then stop at once instead of waiting for
 * this one, and nobody restarts. during: what was going on ("the preflight"); NULL: the
 * rendezvous. Bounded: a hung machine 0 holds the exit for a second at most. */
int launch_rdzv__interrupted(launch_rdzv *r, const char *during, const char *after);
/* rdzv_watch.c: machine m's launcher heartbeat counter, 0 before its first beat. */
long long launch_rdzv__beat_of(launch_rdzv *r, int m);
/* rdzv_watch.c: whether machine m's launcher is gone: its store connection closed without a
 * goodbye ("launch/lost/<m>", declared at the rendezvous, set by machine 0's store server). */
int launch_rdzv__lost(launch_rdzv *r, int m);
/* rdzv_watch.c: the supervisor's watch (launch_watch's tick, on_failure, on_stopped). */
int launch_rdzv__tick(void *arg);
void launch_rdzv__on_failure(void *arg, int rank, int wstatus);
/* Another machine than 0: publishes a stopped local process ("launch/<attempt>/stopped_rank/
 * <m>", the text of every one so far), which machine 0 prints last in launch_rdzv_finish. */
void launch_rdzv__on_stopped(void *arg, const char *what);

#endif
