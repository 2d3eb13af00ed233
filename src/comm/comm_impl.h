/*
 * The communicator front end's private state, shared by comm.c (creation, validation, the
 * backend table), work.c (posting, the host-progress adapter, waiting, groups, abort) and
 * split.c (sub-communicators, symmetric memory: the calls that need the communicator idle).
 */
#ifndef ACCEL_COMM_IMPL_H
#define ACCEL_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm.h"

/* A work item's life: posted inside an open group, queued for the progress thread (or posted
 * to a native-async backend), running, complete. */
enum { W_GROUPED, W_QUEUED, W_RUNNING, W_DONE };

struct accel_work {
    accel__comm *comm; /* NULL once the communicator is freed (the handle stays valid) */
    accel__coll op;
    accel__stream *stream;
    void *req;    /* the native-async backend's request */
    void *owned;  /* accel__work_own: freed with the handle */
    uint64_t seq; /* the communicator's post number: "#seq" in messages */
    _Atomic int state;
    int user;   /* a handle the caller holds (else the blocking path's own) */
    int orphan; /* its waiter gave up: whoever completes it releases it */
    accel_status st;
    struct accel_work *next;      /* queue / group list link, or free-list link */
    struct accel_work *prev_live; /* user-owned handles not yet freed */
    struct accel_work *next_live;
    char msg[ACCEL__ERRMSG_NBYTES]; /* the failure message, valid when st != ACCEL_OK */
};

struct accel__comm {
    const accel__comm_backend *be;
    void *impl;
    accel__comm_config cfg;
    char name[64];
    char job_id[256];
    char master_addr[256];
    char socket_ifname[64];
    char gloo_ring[32];

    pthread_mutex_t mu;
    pthread_cond_t work_cv;              /* the progress thread waits here for queued work */
    pthread_cond_t done_cv;              /* waiters wait here for completions (CLOCK_MONOTONIC) */
    accel_work *head, *tail;             /* queued for the progress thread */
    accel_work *group_head, *group_tail; /* posted inside the open group */
    int group_depth;
    int running;       /* a collective or an idle-only call is executing */
    double op_started; /* when it began (accel__now()), for the watchdog */
    int thread_started, stop;
    pthread_t thread;
    accel_work *free_list; /* recycled handles: no allocation per step */
    accel_work *live;
    uint64_t n_posts;

    accel_status broken;
    char broken_msg[ACCEL__ERRMSG_NBYTES];
    int aborted; /* accel__comm_abort ran (the backend's abort is called once) */
};

/* Creates the front end around a backend endpoint (init or split made impl): c's lock, name and
 * config copies. On failure impl is destroyed. */
accel_status accel__comm_wrap(accel__comm **out, const accel__comm_config *cfg,
                              const accel__comm_backend *be, void *impl, const char *name);

/* Validates op against c (ACCEL_OK or the error set). */
accel_status accel__coll_validate(const accel__comm *c, const accel__coll *op);

/* Records the first failure; later calls repeat it. Caller holds mu. */
void accel__comm_mark_broken(accel__comm *c, accel_status st, const char *msg);

/* Waits until nothing is queued or running (the communicator's deadline), then claims it
 * (running = 1) for an idle-only call `what`; ESTATE inside a group, and with `healthy` the
 * broken status when broken. accel__comm_release gives it back. */
accel_status accel__comm_claim_idle(accel__comm *c, const char *what, int healthy);
void accel__comm_release(accel__comm *c);

/* Drains posted work (the communicator's deadline, then an abort and a grace period) and stops
 * the progress thread: accel__comm_free's first half. 0 when work is still in flight after all
 * that (the communicator must then stay allocated). */
int accel__comm_drain(accel__comm *c);

/* Absolute monotonic seconds as a timespec for pthread_cond_timedwait on CLOCK_MONOTONIC. */
struct timespec accel__comm_abstime(double deadline);

#endif /* ACCEL_COMM_IMPL_H */
