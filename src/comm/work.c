/*
 * Communicator front end, part 2: work. Posting, the host-progress adapter (one progress thread
 * per communicator running host backends' synchronous `run`), the native-async path (backend
 * post/test), waits with deadlines, groups, abort, and the public accel_work functions.
 *
 * Invariants: ops of a communicator run in post order, at most one at a time (flag `running`);
 * a blocking call runs inline on the caller's thread only when nothing is queued or running.
 * Every work item is on the `live` list from allocation to release, so the communicator can
 * account for it at teardown. A waiter that gives up on an item still in flight marks it
 * orphan, and whoever completes it releases it (its memory may be in use until then). Every
 * wait has a deadline; the watchdog waits (blocking calls, accel_work_wait, frees) abort the
 * communicator when theirs passes (watchdog_deadline), which makes every member fail instead
 * of hang.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/trace.h"
#include "comm_impl.h"

#define GRACE_S 10.0 /* after an abort, how long a watchdog still waits for the backend */

struct timespec accel__comm_abstime(double deadline)
{
    /* accel__now() is CLOCK_MONOTONIC seconds: rebuild the timespec from the same clock. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double left = deadline - accel__now();
    left = left < 0 ? 0 : left > 1e9 ? 1e9 : left;
    time_t s = (time_t)left;
    long ns = now.tv_nsec + (long)((left - (double)s) * 1e9);
    struct timespec ts = {now.tv_sec + s + ns / 1000000000L, ns % 1000000000L};
    return ts;
}

double accel__comm_deadline(const accel__comm *c)
{
    return accel__now() + c->cfg.timeout_s;
}

static int native(const accel__comm *c)
{
    return (c->be->caps & ACCEL__COMM_NATIVE_ASYNC) != 0;
}

/* When a watchdog waiting on c since t0 gives up (mu held). Native-async backends have no
 * deadlines of their own: the communicator's timeout from t0. Host backends time out inside
 * every wait themselves (and name the process at fault, which the watchdog cannot), and work
 * queued behind others legitimately waits longer than one timeout: only a running operation
 * that outlives its own deadlines by far (a stuck hook, a backend that broke its contract)
 * counts as stuck. */
static double watchdog_deadline(const accel__comm *c, double t0)
{
    if (native(c)) {
        return t0 + c->cfg.timeout_s;
    }
    /* An inline call leaves op_started 0 (a clock read costs 5% of a small all-reduce): it is
     * timed from when this wait began. */
    double since = !c->running ? accel__now() : c->op_started > 0 ? c->op_started : t0;
    return since + 2 * c->cfg.timeout_s + GRACE_S;
}

/* ---- work items (caller holds mu) ---- */

static accel_work *work_alloc(accel__comm *c, const accel__coll *op, accel__stream *stream,
                              int user)
{
    accel_work *w = c->free_list;
    if (w != NULL) {
        c->free_list = w->next;
    } else if ((w = accel__malloc(sizeof(*w))) == NULL) {
        return NULL;
    }
    memset(w, 0, offsetof(accel_work, msg));
    w->msg[0] = '\0';
    w->comm = c;
    w->op = *op;
    w->stream = stream;
    w->user = user;
    w->seq = ++c->n_posts;
    w->next_live = c->live;
    if (c->live != NULL) {
        c->live->prev_live = w;
    }
    c->live = w;
    return w;
}

static void work_release(accel__comm *c, accel_work *w)
{
    if (w->prev_live != NULL) {
        w->prev_live->next_live = w->next_live;
    } else {
        c->live = w->next_live;
    }
    if (w->next_live != NULL) {
        w->next_live->prev_live = w->prev_live;
    }
    if (w->req != NULL) {
        c->be->ops->req_free(c->impl, w->req);
        w->req = NULL;
    }
    accel__free(w->owned);
    w->owned = NULL;
    w->next = c->free_list;
    c->free_list = w;
}

/* Marks w complete with st (msg when it failed) and wakes the waiters. */
static void complete(accel__comm *c, accel_work *w, accel_status st, const char *msg)
{
    w->st = st;
    if (st != ACCEL_OK) {
        snprintf(w->msg, sizeof(w->msg), "%s", msg);
    }
    atomic_store_explicit(&w->state, W_DONE, memory_order_release);
    pthread_cond_broadcast(&c->done_cv);
    if (w->orphan) {
        work_release(c, w);
    }
}

/* "allreduce(count=4, f32, sum) #7 on communicator world (rank 0 of 2)" */
static void describe(const accel__comm *c, const accel_work *w, char *buf, size_t nbytes)
{
    char call[160];
    accel__coll_str(&w->op, c->cfg.n_ranks, call, sizeof(call));
    snprintf(buf, nbytes, "%s #%llu on communicator %s (rank %d of %d)", call,
             (unsigned long long)w->seq, c->name, c->cfg.rank, c->cfg.n_ranks);
}

/* ---- the host-progress adapter ---- */

/* c's broken status, copying its message to msg (mu held). */
static accel_status broken_status(const accel__comm *c, char *msg, size_t msg_nbytes)
{
    if (c->broken != ACCEL_OK) {
        snprintf(msg, msg_nbytes, "%s", c->broken_msg);
    }
    return c->broken;
}

/* Runs one collective and its hooks on the calling thread, which holds `running`. */
static accel_status execute(accel__comm *c, const accel__coll *op, char *msg, size_t msg_nbytes)
{
    accel_status st = ACCEL_OK;
    if (op->pre != NULL) {
        op->pre(op->hook_arg);
        /* The hook may have taken a while: an abort meanwhile stops the call here. */
        pthread_mutex_lock(&c->mu);
        st = broken_status(c, msg, msg_nbytes);
        pthread_mutex_unlock(&c->mu);
    }
    if (st == ACCEL_OK && (st = c->be->ops->run(c->impl, op)) != ACCEL_OK) {
        snprintf(msg, msg_nbytes, "%s", accel_last_error(NULL));
    }
    if (st == ACCEL_OK && op->post != NULL) {
        op->post(op->hook_arg);
    }
    pthread_mutex_lock(&c->mu);
    if (st != ACCEL_OK) {
        /* On the aborting process the backend's error is the abort's echo: report the abort. */
        st = c->aborted ? broken_status(c, msg, msg_nbytes) : st;
        accel__comm_mark_broken(c, st, msg);
        accel__seterr(NULL, st, "%s", msg);
    }
    c->running = 0;
    if (c->thread_started) {
        pthread_cond_broadcast(&c->work_cv); /* queued work may have waited for this call */
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static void *progress_main(void *arg)
{
    accel__comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->running || (c->head == NULL && !c->stop)) {
            pthread_cond_wait(&c->work_cv, &c->mu);
        }
        if (c->head == NULL) {
            break; /* stop requested and the queue is drained */
        }
        accel_work *w = c->head;
        c->head = w->next;
        if (c->head == NULL) {
            c->tail = NULL;
        }
        if (c->broken != ACCEL_OK) {
            complete(c, w, c->broken, c->broken_msg);
            continue;
        }
        c->running = 1;
        c->op_started = accel__now();
        atomic_store_explicit(&w->state, W_RUNNING, memory_order_relaxed);
        pthread_mutex_unlock(&c->mu);
        /* The communication thread's own track in the accelerator's trace. */
        accel__trace_begin(c->cfg.trace, accel__coll_name(w->op.kind), ACCEL__PROF_COMM, "count",
                           (long long)w->op.count);
        char msg[ACCEL__ERRMSG_NBYTES];
        accel_status st = execute(c, &w->op, msg, sizeof(msg));
        accel__trace_end(c->cfg.trace);
        pthread_mutex_lock(&c->mu);
        complete(c, w, st, msg);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Launches w (not grouped) with mu held: queued for the progress thread, or posted natively.
 * On failure w is complete with the error, which is also returned. */
static accel_status launch(accel__comm *c, accel_work *w)
{
    if (c->broken != ACCEL_OK) {
        complete(c, w, c->broken, c->broken_msg);
        return accel__seterr(NULL, c->broken, "%s", c->broken_msg);
    }
    if (native(c)) {
        if (w->op.pre != NULL) {
            w->op.pre(w->op.hook_arg);
        }
        atomic_store_explicit(&w->state, W_RUNNING, memory_order_relaxed);
        accel_status st = c->be->ops->post(c->impl, &w->op, w->stream, &w->req);
        if (st != ACCEL_OK) {
            char msg[ACCEL__ERRMSG_NBYTES];
            snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
            if (st != ACCEL_EUNSUPPORTED) { /* a refusal launched nothing (comm.h, post) */
                accel__comm_mark_broken(c, st, msg);
            }
            complete(c, w, st, msg);
        }
        return st;
    }
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
            const char *m = "cannot start the communication thread";
            complete(c, w, ACCEL_EINTERNAL, m);
            return accel__seterr(NULL, ACCEL_EINTERNAL, "%s: %s", c->name, m);
        }
        c->thread_started = 1;
    }
    atomic_store_explicit(&w->state, W_QUEUED, memory_order_relaxed);
    w->next = NULL;
    if (c->tail != NULL) {
        c->tail->next = w;
    } else {
        c->head = w;
    }
    c->tail = w;
    pthread_cond_broadcast(&c->work_cv);
    return ACCEL_OK;
}

/* Native-async: asks the backend whether w completed (mu held). */
static void poll_native(accel__comm *c, accel_work *w)
{
    accel_status st = ACCEL_OK;
    if (atomic_load_explicit(&w->state, memory_order_acquire) != W_RUNNING ||
        !c->be->ops->test(c->impl, w->req, &st)) {
        return;
    }
    char msg[ACCEL__ERRMSG_NBYTES] = "";
    if (st != ACCEL_OK) {
        snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
        accel__comm_mark_broken(c, st, msg);
    } else if (w->op.post != NULL) {
        w->op.post(w->op.hook_arg);
    }
    complete(c, w, st, msg);
}

/* ---- waiting ---- */

/* Waits with mu held until w is complete or `deadline`: ACCEL_OK (complete), ESTATE (grouped,
 * never launched yet) or ETIMEDOUT, with the message naming w; `since` is when the wait began. */
static accel_status wait_locked(accel__comm *c, accel_work *w, double deadline, double since)
{
    double nap = 1e-6;
    for (;;) {
        int state = atomic_load_explicit(&w->state, memory_order_acquire);
        if (state == W_DONE) {
            return ACCEL_OK;
        }
        if (state == W_GROUPED) {
            char what[512];
            describe(c, w, what, sizeof(what));
            return accel__seterr(NULL, ACCEL_ESTATE,
                                 "%s was posted inside a group that has not ended: call "
                                 "accel__comm_group_end before waiting for it",
                                 what);
        }
        if (native(c)) {
            poll_native(c, w);
            if (atomic_load_explicit(&w->state, memory_order_acquire) == W_DONE) {
                return ACCEL_OK;
            }
        }
        if (accel__now() >= deadline) {
            char what[512];
            describe(c, w, what, sizeof(what));
            return accel__seterr(NULL, ACCEL_ETIMEDOUT, "%s not complete after %.3g s", what,
                                 accel__now() - since);
        }
        if (native(c)) {
            /* Poll with a growing nap (a device backend has no thread that could wake us). */
            pthread_mutex_unlock(&c->mu);
            struct timespec ts = {0, (long)(nap * 1e9)};
            nanosleep(&ts, NULL);
            nap = nap < 1e-3 ? nap * 2 : nap;
            pthread_mutex_lock(&c->mu);
        } else {
            struct timespec ts = accel__comm_abstime(deadline);
            pthread_cond_timedwait(&c->done_cv, &c->mu, &ts);
        }
    }
}

/* The watchdog: waits until watchdog_deadline; when it passes, aborts the communicator (every
 * member fails promptly) and waits a grace period for the backend to let go. mu held. ACCEL_OK
 * when w completed (its own status aside), else the error. */
static accel_status wait_watchdog(accel__comm *c, accel_work *w)
{
    double t0 = accel__now();
    accel_status st;
    while ((st = wait_locked(c, w, watchdog_deadline(c, t0), t0)) == ACCEL_ETIMEDOUT &&
           accel__now() < watchdog_deadline(c, t0)) {
        /* another operation started meanwhile: the queue is moving */
    }
    if (st != ACCEL_ETIMEDOUT) {
        return st;
    }
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
    if (c->be->ops->suspects != NULL) {
        c->be->ops->suspects(c->impl, msg, sizeof(msg));
    }
    pthread_mutex_unlock(&c->mu);
    accel__comm_abort(c, ACCEL_ETIMEDOUT, msg);
    pthread_mutex_lock(&c->mu);
    (void)wait_locked(c, w, accel__now() + GRACE_S, t0);
    return accel__seterr(NULL, ACCEL_ETIMEDOUT, "%s", msg);
}

/* w's outcome as a status and the thread's error. */
static accel_status outcome(const accel_work *w)
{
    return w->st == ACCEL_OK ? ACCEL_OK : accel__seterr(NULL, w->st, "%s", w->msg);
}

accel_status accel__work_wait(accel_work *w, double deadline)
{
    if (w == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__work_wait: work handle is NULL");
    }
    accel__comm *c = w->comm;
    if (c != NULL && atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        pthread_mutex_lock(&c->mu);
        accel_status st = wait_locked(c, w, deadline, accel__now());
        pthread_mutex_unlock(&c->mu);
        ACCEL_TRY(st);
    }
    return outcome(w);
}

int accel__work_test(accel_work *w, accel_status *st)
{
    if (w == NULL) {
        return 0;
    }
    accel__comm *c = w->comm;
    if (c != NULL && native(c) && atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        pthread_mutex_lock(&c->mu);
        poll_native(c, w);
        pthread_mutex_unlock(&c->mu);
    }
    if (atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        return 0;
    }
    if (st != NULL) {
        *st = w->st;
    }
    (void)outcome(w);
    return 1;
}

void accel__work_free(accel_work *w)
{
    if (w == NULL) {
        return;
    }
    accel__comm *c = w->comm;
    if (c == NULL) {
        accel__free(w->owned); /* the communicator is gone; the handle was detached */
        accel__free(w);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (atomic_load_explicit(&w->state, memory_order_acquire) == W_GROUPED) {
        /* Freed before its group ended: it stays in the group and is released at its end. */
        w->orphan = 1;
    } else if (wait_watchdog(c, w) != ACCEL_OK &&
               atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        w->orphan = 1; /* still in the backend's hands: released when it completes */
    } else {
        work_release(c, w);
    }
    pthread_mutex_unlock(&c->mu);
}

void accel__work_own(accel_work *w, void *mem)
{
    accel__comm *c = w->comm;
    pthread_mutex_lock(&c->mu);
    w->owned = mem;
    pthread_mutex_unlock(&c->mu);
}

/* ---- posting ---- */

accel_status accel__comm_post(accel__comm *c, const accel__coll *op, accel__stream *stream,
                              accel_work **work)
{
    if (work == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__comm_post: work is NULL");
    }
    *work = NULL;
    ACCEL_TRY(accel__coll_validate(c, op));
    pthread_mutex_lock(&c->mu);
    if (c->broken != ACCEL_OK) {
        accel_status st = c->broken;
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, st, "%s", c->broken_msg);
    }
    accel_work *w = work_alloc(c, op, stream, 1);
    if (w == NULL) {
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory for the work handle",
                             accel__coll_name(op->kind));
    }
    accel_status st = ACCEL_OK;
    if (c->group_depth > 0) {
        atomic_store_explicit(&w->state, W_GROUPED, memory_order_relaxed);
        w->next = NULL;
        if (c->group_tail != NULL) {
            c->group_tail->next = w;
        } else {
            c->group_head = w;
        }
        c->group_tail = w;
    } else if ((st = launch(c, w)) != ACCEL_OK) {
        work_release(c, w);
        w = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    *work = w;
    return st;
}

accel_status accel__comm_run(accel__comm *c, const accel__coll *op)
{
    ACCEL_TRY(accel__coll_validate(c, op));
    pthread_mutex_lock(&c->mu);
    if (c->broken != ACCEL_OK) {
        accel_status st = c->broken;
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, st, "%s", c->broken_msg);
    }
    if (c->group_depth > 0) {
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "%s: a blocking collective inside a group (post it, and wait after "
                             "accel__comm_group_end)",
                             accel__coll_name(op->kind));
    }
    if (!native(c) && c->head == NULL && !c->running) {
        /* The latency path: nothing ahead of us, run on this thread. */
        c->running = 1;
        c->op_started = 0;
        c->n_posts++;
        pthread_mutex_unlock(&c->mu);
        char msg[ACCEL__ERRMSG_NBYTES];
        return execute(c, op, msg, sizeof(msg)); /* the thread error is already set */
    }
    accel_work *w = work_alloc(c, op, NULL, 0);
    if (w == NULL) {
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory for the work item",
                             accel__coll_name(op->kind));
    }
    accel_status st = launch(c, w);
    if (st == ACCEL_OK && (st = wait_watchdog(c, w)) == ACCEL_OK) {
        st = outcome(w);
    }
    if (atomic_load_explicit(&w->state, memory_order_acquire) == W_DONE) {
        work_release(c, w);
    } else {
        w->orphan = 1;
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- groups ---- */

accel_status accel__comm_group_begin(accel__comm *c)
{
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__comm_group_begin: communicator is NULL");
    }
    pthread_mutex_lock(&c->mu);
    c->group_depth++;
    pthread_mutex_unlock(&c->mu);
    return ACCEL_OK;
}

accel_status accel__comm_group_end(accel__comm *c)
{
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__comm_group_end: communicator is NULL");
    }
    pthread_mutex_lock(&c->mu);
    if (c->group_depth == 0) {
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "accel__comm_group_end on communicator %s without a group begun",
                             c->name);
    }
    if (--c->group_depth > 0) {
        pthread_mutex_unlock(&c->mu);
        return ACCEL_OK;
    }
    accel_work *w = c->group_head;
    c->group_head = c->group_tail = NULL;
    accel_status first = ACCEL_OK;
    const int bracket =
        native(c) && c->be->ops->group != NULL && w != NULL && c->broken == ACCEL_OK;
    if (bracket) {
        first = c->be->ops->group(c->impl, 1);
    }
    while (w != NULL) {
        accel_work *next = w->next;
        accel_status st = first;
        if (st == ACCEL_OK) {
            st = launch(c, w); /* after a failure the rest complete with the broken status */
        } else {
            complete(c, w, st, accel_last_error(NULL));
        }
        first = first != ACCEL_OK ? first : st;
        w = next;
    }
    if (bracket) {
        accel_status st = c->be->ops->group(c->impl, 0);
        first = first != ACCEL_OK ? first : st;
    }
    pthread_mutex_unlock(&c->mu);
    return first;
}

/* ---- abort ---- */

void accel__comm_abort(accel__comm *c, accel_status st, const char *msg)
{
    if (c == NULL) {
        return;
    }
    if (st == ACCEL_OK) {
        st = ACCEL_EPEER; /* an abort is a failure, whatever the caller passed */
    }
    char full[ACCEL__ERRMSG_NBYTES];
    snprintf(full, sizeof(full), "communicator %s aborted by process %d: %s", c->name, c->cfg.rank,
             msg != NULL ? msg : "");
    pthread_mutex_lock(&c->mu);
    const int first = !c->aborted;
    c->aborted = 1;
    accel__comm_mark_broken(c, st, full);
    pthread_cond_broadcast(&c->done_cv);
    pthread_cond_broadcast(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    if (first && c->be->ops->abort != NULL) {
        c->be->ops->abort(c->impl, st, msg != NULL ? msg : "");
    }
}

/* ---- idle-only calls and teardown ---- */

accel_status accel__comm_claim_idle(accel__comm *c, const char *what, int healthy)
{
    pthread_mutex_lock(&c->mu);
    if (c->group_depth > 0) {
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, ACCEL_ESTATE, "%s inside a group on communicator %s", what,
                             c->name);
    }
    /* Posted work first: it may use what the call changes (the backend's registry). */
    const double t0 = accel__now();
    while ((c->head != NULL || c->running) && accel__now() < watchdog_deadline(c, t0)) {
        struct timespec ts = accel__comm_abstime(watchdog_deadline(c, t0));
        pthread_cond_timedwait(&c->done_cv, &c->mu, &ts);
    }
    if (c->head != NULL || c->running) {
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                             "%s: communicator %s still busy with posted work after %.3g s", what,
                             c->name, accel__now() - t0);
    }
    if (healthy && c->broken != ACCEL_OK) {
        accel_status st = c->broken;
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, st, "%s", c->broken_msg);
    }
    c->running = 1;
    c->op_started = accel__now();
    pthread_mutex_unlock(&c->mu);
    return ACCEL_OK;
}

void accel__comm_release(accel__comm *c)
{
    pthread_mutex_lock(&c->mu);
    c->running = 0;
    if (c->thread_started) {
        pthread_cond_broadcast(&c->work_cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Whether anything posted is still in flight (mu held). */
static int busy(const accel__comm *c)
{
    if (c->head != NULL || c->running) {
        return 1;
    }
    for (const accel_work *w = c->live; w != NULL; w = w->next_live) {
        if (atomic_load_explicit(&w->state, memory_order_acquire) == W_RUNNING) {
            return 1; /* native-async work the backend still holds */
        }
    }
    return 0;
}

/* Waits until nothing is in flight, or the watchdog's deadline (from t0; with `grace`, only
 * GRACE_S from t0) passes (mu held). */
static void wait_quiet(accel__comm *c, double t0, int grace)
{
    double deadline;
    while (busy(c) && accel__now() < (deadline = grace ? t0 + GRACE_S : watchdog_deadline(c, t0))) {
        if (native(c)) {
            for (accel_work *w = c->live; w != NULL; w = w->next_live) {
                poll_native(c, w);
            }
            pthread_mutex_unlock(&c->mu);
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&c->mu);
        } else {
            struct timespec ts = accel__comm_abstime(deadline);
            pthread_cond_timedwait(&c->done_cv, &c->mu, &ts);
        }
    }
}

int accel__comm_drain(accel__comm *c)
{
    pthread_mutex_lock(&c->mu);
    /* An open group's work was never launched (nor on the peers): it fails, it does not run. */
    for (accel_work *w = c->group_head, *next; w != NULL; w = next) {
        next = w->next;
        complete(c, w, ACCEL_ESTATE, "communicator freed inside an open group");
    }
    c->group_head = c->group_tail = NULL;
    c->group_depth = 0;
    wait_quiet(c, accel__now(), 0);
    if (busy(c)) {
        pthread_mutex_unlock(&c->mu);
        accel__comm_abort(c, ACCEL_ETIMEDOUT, "freed with work still in flight");
        pthread_mutex_lock(&c->mu);
        wait_quiet(c, accel__now(), 1);
    }
    const int quiet = !busy(c);
    c->stop = 1;
    pthread_cond_broadcast(&c->work_cv);
    int started = c->thread_started;
    pthread_mutex_unlock(&c->mu);
    if (!quiet) {
        /* Something (a hook, a wedged device) holds the communicator even after the abort:
         * its memory must outlive it. */
        accel__log(&c->cfg.log, ACCEL__LOG_ERROR,
                   "communicator %s: work still in flight %g s after an abort; leaving the "
                   "communicator allocated",
                   c->name, GRACE_S);
        return 0;
    }
    if (started) {
        pthread_join(c->thread, NULL); /* the queue is empty: it leaves at once */
    }
    return 1;
}

/* ---- the public work handle (include/accel/collectives.h) ---- */

accel_status accel_work_wait(accel_work *w)
{
    if (w == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_work_wait: work handle is NULL");
    }
    accel__comm *c = w->comm;
    if (c != NULL && atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        pthread_mutex_lock(&c->mu);
        accel_status st = wait_watchdog(c, w);
        pthread_mutex_unlock(&c->mu);
        ACCEL_TRY(st);
    }
    return outcome(w);
}

int accel_work_test(accel_work *w, accel_status *st)
{
    return accel__work_test(w, st);
}

void accel_work_free(accel_work *w)
{
    accel__work_free(w);
}
