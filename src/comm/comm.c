/*
 * Communicator front end: argument validation, backend choice, the progress thread that runs
 * asynchronous collectives, and the "broken" state.
 *
 * Invariant: at most one collective runs at a time (flag `running`), and collectives run in the
 * order they were issued: a blocking call runs inline on the caller's thread only when nothing
 * is queued or running, otherwise it queues behind the asynchronous ones and waits. After a
 * backend failure the communicator is broken: every later call (and every queued one) fails
 * with the first failure's status and message, because peers can no longer be trusted to be in
 * step.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "base/base.h"
#include "base/trace.h"
#include "comm/reduce.h"

extern const accel__comm_backend accel__backend_self;
extern const accel__comm_backend accel__backend_shm;

struct accel_work {
    accel__comm *comm; /* NULL once the communicator is freed (the handle stays valid) */
    accel__coll op;
    accel__coll_hooks hooks;
    _Atomic int done;
    accel_status st;
    struct accel_work *next;      /* queue link, or free-list link */
    struct accel_work *prev_live; /* user-owned handles not yet freed */
    struct accel_work *next_live;
    char msg[ACCEL__ERRMSG_NBYTES]; /* the failure message, valid when st != ACCEL_OK */
};

struct accel__comm {
    const accel__comm_backend *be;
    void *impl;
    accel__comm_config cfg;
    char job_id[256];
    char master_addr[256];

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the progress thread waits here for queued work */
    pthread_cond_t done_cv; /* waiters wait here for completions */
    accel_work *head, *tail;
    int running; /* a collective is executing (inline or on the progress thread) */
    int thread_started, stop;
    pthread_t thread;
    accel_work *free_list; /* recycled handles: no allocation per step */
    accel_work *live;

    accel_status broken;
    char broken_msg[ACCEL__ERRMSG_NBYTES];
};

static const char *const kind_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                         "reduce",    "gather",         "barrier"};

const char *accel__coll_name(accel__coll_kind kind)
{
    return (unsigned)kind < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[kind]
                                                                       : "collective";
}

void accel__chunk_range(size_t count, int n_ranks, int rank, size_t *off, size_t *chunk_count)
{
    size_t n = (size_t)n_ranks, r = (size_t)rank;
    size_t base = count / n, extra = count % n;
    *off = r * base + (r < extra ? r : extra);
    *chunk_count = base + (r < extra ? 1 : 0);
}

/* ---- creation and teardown ---- */

const char *accel__comm_backends_built(void)
{
    return "self, shm";
}

accel_status accel__comm_new(accel__comm **out, const accel__comm_config *cfg)
{
    const accel__comm_backend *be = NULL;
    if (cfg == NULL || cfg->backend == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "communicator: no backend named");
    }
    if (cfg->n_ranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->n_ranks) {
        return accel__seterr(NULL, ACCEL_EINVAL, "communicator: rank %d of %d processes", cfg->rank,
                             cfg->n_ranks);
    }
    if (strcmp(cfg->backend, "self") == 0) {
        if (cfg->n_ranks != 1) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "backend \"self\" runs one process, but the job has %d",
                                 cfg->n_ranks);
        }
        be = &accel__backend_self;
    } else if (strcmp(cfg->backend, "shm") == 0) {
        be = &accel__backend_shm;
    } else if (strcmp(cfg->backend, "mpi") == 0 || strcmp(cfg->backend, "nccl") == 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "backend \"%s\" is not implemented yet; on one machine use \"shm\" "
                             "(the default under accel launch)",
                             cfg->backend);
    } else {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "unknown backend \"%s\" (expected self, shm, mpi or nccl)",
                             cfg->backend);
    }
    accel__comm *c = accel__calloc(1, sizeof(*c));
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory creating the communicator");
    }
    c->be = be;
    c->cfg = *cfg;
    snprintf(c->job_id, sizeof(c->job_id), "%s", cfg->job_id != NULL ? cfg->job_id : "");
    c->cfg.job_id = c->job_id;
    snprintf(c->master_addr, sizeof(c->master_addr), "%s",
             cfg->master_addr != NULL ? cfg->master_addr : "127.0.0.1");
    c->cfg.master_addr = c->master_addr;
    c->cfg.backend = be->name;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        accel__free(c);
        return accel__seterr(NULL, ACCEL_EINTERNAL, "communicator: pthread_mutex_init failed");
    }
    pthread_cond_init(&c->work_cv, NULL);
    pthread_cond_init(&c->done_cv, NULL);
    accel_status st = be->init(c, &c->impl);
    if (st != ACCEL_OK) {
        pthread_cond_destroy(&c->work_cv);
        pthread_cond_destroy(&c->done_cv);
        pthread_mutex_destroy(&c->mu);
        accel__free(c);
        return st;
    }
    *out = c;
    return ACCEL_OK;
}

void accel__comm_free(accel__comm *c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->work_cv);
    int started = c->thread_started;
    pthread_mutex_unlock(&c->mu);
    if (started) {
        pthread_join(c->thread, NULL); /* it drains the queue before leaving */
    }
    /* Handles the user still holds outlive us: they are complete, so detach them. */
    for (accel_work *w = c->live; w != NULL; w = w->next_live) {
        w->comm = NULL;
    }
    while (c->free_list != NULL) {
        accel_work *w = c->free_list;
        c->free_list = w->next;
        accel__free(w);
    }
    c->be->destroy(c, c->impl);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
    pthread_mutex_destroy(&c->mu);
    accel__free(c);
}

int accel__comm_rank(const accel__comm *c)
{
    return c->cfg.rank;
}
int accel__comm_n_ranks(const accel__comm *c)
{
    return c->cfg.n_ranks;
}
const char *accel__comm_backend_name(const accel__comm *c)
{
    return c->be->name;
}
double accel__comm_timeout(const accel__comm *c)
{
    return c->cfg.timeout_s;
}
const accel__comm_config *accel__comm_cfg(const accel__comm *c)
{
    return &c->cfg;
}

/* ---- validation ---- */

static int overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

/* Checks buffers of one side: send (send_n bytes) and recv (recv_n bytes) may only overlap as
 * the in-place form, i.e. with send exactly at `inplace_send`. */
static accel_status check_buffers(const accel__coll *op, const char *what, size_t send_n,
                                  size_t recv_n, const void *inplace_send)
{
    if (send_n > 0 && op->send == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: send buffer is NULL with %zu elements", what,
                             op->count);
    }
    if (recv_n > 0 && op->recv == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: recv buffer is NULL with %zu elements", what,
                             op->count);
    }
    if (overlaps(op->send, send_n, op->recv, recv_n) && op->send != inplace_send) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "%s: send and recv buffers overlap but are not the in-place form",
                             what);
    }
    return ACCEL_OK;
}

static accel_status validate(const accel__comm *c, const accel__coll *op)
{
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "collective on a NULL communicator");
    }
    if (op == NULL || (unsigned)op->kind > ACCEL__COLL_BARRIER) {
        return accel__seterr(NULL, ACCEL_EINVAL, "collective: invalid operation kind");
    }
    const char *what = accel__coll_name(op->kind);
    if (op->kind == ACCEL__COLL_BARRIER) {
        return ACCEL_OK;
    }
    int n = c->cfg.n_ranks, me = c->cfg.rank;
    size_t es = accel_dtype_nbytes(op->dtype);
    if ((unsigned)op->dtype >= ACCEL_DTYPE_COUNT) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: dtype %d is not a valid accel_dtype", what,
                             (int)op->dtype);
    }
    if (es == 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "%s: %s is a packed sub-byte dtype; collectives need whole-byte "
                             "elements (send the bytes as U8)",
                             what, accel_dtype_name(op->dtype));
    }
    int reducing = op->kind == ACCEL__COLL_ALLREDUCE || op->kind == ACCEL__COLL_REDUCE_SCATTER ||
                   op->kind == ACCEL__COLL_REDUCE;
    if (reducing && !accel__reduce_supported(op->dtype)) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "%s: reducing %s is not implemented", what,
                             accel_dtype_name(op->dtype));
    }
    if (reducing) {
        if ((unsigned)op->op > ACCEL_PROD) {
            return accel__seterr(NULL, ACCEL_EINVAL, "%s: reduce op %d is not valid", what,
                                 (int)op->op);
        }
        if (op->op == ACCEL_AVG && op->dtype == ACCEL_BOOL) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "%s: ACCEL_AVG is not defined for BOOL (use SUM/MAX for "
                                 "'any', MIN/PROD for 'all')",
                                 what);
        }
    }
    int rooted = op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_REDUCE ||
                 op->kind == ACCEL__COLL_GATHER;
    if (rooted && (op->root < 0 || op->root >= n)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: root %d is not a process index (0..%d)", what,
                             op->root, n - 1);
    }
    size_t limit = SIZE_MAX / es / (op->kind == ACCEL__COLL_GATHER ? (size_t)n : 1);
    if (op->count > limit) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: count %zu overflows the address space", what,
                             op->count);
    }
    size_t nb = op->count * es, off, cnt;
    const char *s = op->send;
    char *r = op->recv;
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return check_buffers(op, what, nb, nb, r);
    case ACCEL__COLL_REDUCE_SCATTER:
        accel__chunk_range(op->count, n, me, &off, &cnt);
        return check_buffers(op, what, nb, cnt * es, r != NULL ? r - off * es : NULL);
    case ACCEL__COLL_ALLGATHER:
        accel__chunk_range(op->count, n, me, &off, &cnt);
        return check_buffers(op, what, cnt * es, nb, r != NULL ? r + off * es : NULL);
    case ACCEL__COLL_BROADCAST:
        return check_buffers(op, what, me == op->root ? nb : 0, nb, r);
    case ACCEL__COLL_REDUCE:
        return check_buffers(op, what, nb, me == op->root ? nb : 0, r);
    case ACCEL__COLL_GATHER:
        (void)s;
        return check_buffers(op, what, nb, me == op->root ? nb * (size_t)n : 0,
                             r != NULL ? r + (size_t)me * nb : NULL);
    default:
        return ACCEL_OK;
    }
}

/* ---- execution ---- */

/* Records the first failure; later calls repeat it. Caller holds mu. */
static void mark_broken(accel__comm *c, accel_status st, const char *msg)
{
    if (c->broken == ACCEL_OK) {
        c->broken = st;
        snprintf(c->broken_msg, sizeof(c->broken_msg), "%s", msg);
    }
}

/* Runs one collective and its hooks on the calling thread; the caller has set `running`. */
static accel_status execute(accel__comm *c, const accel__coll *op, const accel__coll_hooks *h,
                            char *msg, size_t msg_nbytes)
{
    if (h->pre != NULL) {
        h->pre(h->arg);
    }
    accel_status st = c->be->run(c, c->impl, op);
    if (st == ACCEL_OK && h->post != NULL) {
        h->post(h->arg);
    }
    pthread_mutex_lock(&c->mu);
    if (st != ACCEL_OK) {
        snprintf(msg, msg_nbytes, "%s", accel_last_error(NULL));
        mark_broken(c, st, msg);
    }
    c->running = 0;
    pthread_cond_broadcast(&c->work_cv); /* queued work may have waited for the inline call */
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
            w->st = c->broken;
            snprintf(w->msg, sizeof(w->msg), "%s", c->broken_msg);
        } else {
            c->running = 1;
            pthread_mutex_unlock(&c->mu);
            /* The communication thread's own track in the accelerator's trace. */
            accel__trace_begin(c->cfg.trace, accel__coll_name(w->op.kind), ACCEL__PROF_COMM,
                               "count", (long long)w->op.count);
            w->st = execute(c, &w->op, &w->hooks, w->msg, sizeof(w->msg));
            accel__trace_end(c->cfg.trace);
            pthread_mutex_lock(&c->mu);
        }
        atomic_store_explicit(&w->done, 1, memory_order_release);
        pthread_cond_broadcast(&c->done_cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* A handle from the free list (or a new one), linked into the live list. Caller holds mu. */
static accel_work *work_alloc(accel__comm *c)
{
    accel_work *w = c->free_list;
    if (w != NULL) {
        c->free_list = w->next;
    } else {
        w = accel__malloc(sizeof(*w));
        if (w == NULL) {
            return NULL;
        }
    }
    memset(w, 0, offsetof(accel_work, msg));
    w->msg[0] = '\0';
    w->comm = c;
    w->next_live = c->live;
    if (c->live != NULL) {
        c->live->prev_live = w;
    }
    c->live = w;
    return w;
}

accel_status accel__comm_run(accel__comm *c, const accel__coll *op, accel_work **work)
{
    return accel__comm_run_hooked(c, op, NULL, work);
}

accel_status accel__comm_run_hooked(accel__comm *c, const accel__coll *op,
                                    const accel__coll_hooks *hooks, accel_work **work)
{
    static const accel__coll_hooks none = {NULL, NULL, NULL};
    if (hooks == NULL) {
        hooks = &none;
    }
    ACCEL_TRY(validate(c, op));
    pthread_mutex_lock(&c->mu);
    if (c->broken != ACCEL_OK) {
        accel_status st = c->broken;
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, st, "%s", c->broken_msg);
    }
    if (work == NULL && c->head == NULL && !c->running) {
        /* The latency path: nothing ahead of us, run on this thread. */
        c->running = 1;
        pthread_mutex_unlock(&c->mu);
        char msg[ACCEL__ERRMSG_NBYTES];
        return execute(c, op, hooks, msg, sizeof(msg)); /* the thread error is already set */
    }
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
            pthread_mutex_unlock(&c->mu);
            return accel__seterr(NULL, ACCEL_EINTERNAL, "%s: cannot start the communication thread",
                                 accel__coll_name(op->kind));
        }
        c->thread_started = 1;
    }
    accel_work local, *w;
    if (work != NULL) {
        w = work_alloc(c);
        if (w == NULL) {
            pthread_mutex_unlock(&c->mu);
            return accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory for the work handle",
                                 accel__coll_name(op->kind));
        }
    } else {
        w = &local;
        memset(w, 0, offsetof(accel_work, msg));
        w->comm = c;
    }
    w->op = *op;
    w->hooks = *hooks;
    w->next = NULL;
    if (c->tail != NULL) {
        c->tail->next = w;
    } else {
        c->head = w;
    }
    c->tail = w;
    pthread_cond_broadcast(&c->work_cv);
    if (work != NULL) {
        pthread_mutex_unlock(&c->mu);
        *work = w;
        return ACCEL_OK;
    }
    while (!atomic_load_explicit(&w->done, memory_order_acquire)) {
        pthread_cond_wait(&c->done_cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    if (w->st != ACCEL_OK) {
        return accel__seterr(NULL, w->st, "%s", w->msg);
    }
    return ACCEL_OK;
}

/* ---- work handles (public) ---- */

accel_status accel_work_wait(accel_work *w)
{
    if (w == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_work_wait: work handle is NULL");
    }
    accel__comm *c = w->comm;
    if (c != NULL && !atomic_load_explicit(&w->done, memory_order_acquire)) {
        pthread_mutex_lock(&c->mu);
        while (!atomic_load_explicit(&w->done, memory_order_acquire)) {
            pthread_cond_wait(&c->done_cv, &c->mu);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (w->st != ACCEL_OK) {
        return accel__seterr(NULL, w->st, "%s", w->msg);
    }
    return ACCEL_OK;
}

int accel_work_test(accel_work *w, accel_status *st)
{
    if (w == NULL || !atomic_load_explicit(&w->done, memory_order_acquire)) {
        return 0;
    }
    if (st != NULL) {
        *st = w->st;
    }
    if (w->st != ACCEL_OK) {
        accel__seterr(NULL, w->st, "%s", w->msg);
    }
    return 1;
}

void accel_work_free(accel_work *w)
{
    if (w == NULL) {
        return;
    }
    accel__comm *c = w->comm;
    if (c == NULL) {
        accel__free(w); /* the communicator is gone; the handle was detached */
        return;
    }
    pthread_mutex_lock(&c->mu);
    while (!atomic_load_explicit(&w->done, memory_order_acquire)) {
        pthread_cond_wait(&c->done_cv, &c->mu);
    }
    if (w->prev_live != NULL) {
        w->prev_live->next_live = w->next_live;
    } else {
        c->live = w->next_live;
    }
    if (w->next_live != NULL) {
        w->next_live->prev_live = w->prev_live;
    }
    w->next = c->free_list;
    c->free_list = w;
    pthread_mutex_unlock(&c->mu);
}

/* ---- symmetric memory ---- */

/* Runs a memory operation with the communicator idle: queued collectives first (they may use
 * the backend's registry), nothing else while it runs. */
static accel_status run_idle(accel__comm *c, size_t nbytes, void *p, void **out)
{
    pthread_mutex_lock(&c->mu);
    while (c->head != NULL || c->running) {
        pthread_cond_wait(&c->done_cv, &c->mu);
    }
    if (out != NULL && c->broken != ACCEL_OK) {
        accel_status st = c->broken;
        pthread_mutex_unlock(&c->mu);
        return accel__seterr(NULL, st, "%s", c->broken_msg);
    }
    c->running = 1;
    pthread_mutex_unlock(&c->mu);
    accel_status st =
        out != NULL ? c->be->alloc(c, c->impl, nbytes, out) : c->be->dealloc(c, c->impl, p);
    pthread_mutex_lock(&c->mu);
    /* A lost peer breaks the communicator; failures every process saw alike (no memory,
     * different sizes) do not. Processes at different calls abort the job in the backend. */
    if (out != NULL && (st == ACCEL_EPEER || st == ACCEL_ETIMEDOUT)) {
        mark_broken(c, st, accel_last_error(NULL));
    }
    c->running = 0;
    pthread_cond_broadcast(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    return st;
}

accel_status accel__comm_alloc(accel__comm *c, size_t nbytes, void **out)
{
    if (c == NULL || out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_alloc_shared: %s is NULL",
                             c == NULL ? "communicator" : "out");
    }
    if (c->be->alloc == NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "accel_alloc_shared: backend %s has no shared memory", c->be->name);
    }
    return run_idle(c, nbytes, NULL, out);
}

accel_status accel__comm_dealloc(accel__comm *c, void *p)
{
    if (c == NULL || p == NULL || c->be->dealloc == NULL) {
        return c == NULL && p != NULL
                   ? accel__seterr(NULL, ACCEL_EINVAL, "accel_free_shared: communicator is NULL")
                   : ACCEL_OK;
    }
    return run_idle(c, 0, p, NULL);
}

int accel__comm_zero_copy(const accel__comm *c)
{
    return c != NULL && c->be->zero_copy;
}

/* ---- convenience wrappers ---- */

accel_status accel__allreduce(accel__comm *c, const void *send, void *recv, size_t count,
                              accel_dtype dt, accel_reduce_op op)
{
    accel__coll o = {ACCEL__COLL_ALLREDUCE, send, recv, count, dt, op, 0};
    return accel__comm_run(c, &o, NULL);
}

accel_status accel__broadcast(accel__comm *c, void *buf, size_t count, accel_dtype dt, int root)
{
    accel__coll o = {ACCEL__COLL_BROADCAST, buf, buf, count, dt, ACCEL_SUM, root};
    return accel__comm_run(c, &o, NULL);
}

accel_status accel__barrier(accel__comm *c)
{
    accel__coll o = {ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0};
    return accel__comm_run(c, &o, NULL);
}
