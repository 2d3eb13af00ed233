/*
 * The emulated NCCL's non-blocking communicators (nccl_emu.h): a worker thread per
 * communicator runs its calls one at a time (init, a collective, a group, a split, finalize);
 * the caller gets ncclInProgress, and the communicator's state (ncclCommGetAsyncError) stays
 * ncclInProgress until the worker is done. Invariant: a job is handed over only while the
 * state is not ncclInProgress (nccl.c refuses the call otherwise), so the worker's job is never
 * overwritten while it runs.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_emu.h"

typedef enum { J_INIT, J_COLL, J_GROUP, J_SPLIT, J_NOP } job_kind;

typedef struct job {
    job_kind kind;
    coll k;                 /* J_COLL */
    coll colls[MAX_QUEUED]; /* J_GROUP: the caller's queued calls */
    p2p msgs[MAX_QUEUED];
    int n_colls, n_msgs;
    int color, key;      /* J_SPLIT */
    ncclComm_t child;    /* J_SPLIT: made by the call, attached here (or NULL) */
    ncclComm_t *newcomm; /* J_SPLIT: the caller's, written when the split is done */
} job;

static _Thread_local job t_job; /* a call being handed over (large: not on the stack) */

typedef struct worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int has_job, quit;
    job j;
    _Atomic ncclResult_t state; /* ncclInProgress while a call runs, then its result */
} worker;

static ncclResult_t run_job(ncclComm_t c, job *j)
{
    switch (j->kind) {
    case J_INIT:
        return cuemu_nccl_attach(c, "ncclCommInitRankConfig");
    case J_COLL:
        return cuemu_nccl_run_coll(&j->k);
    case J_GROUP:
        return cuemu_nccl_run_queued(j->colls, j->n_colls, j->msgs, j->n_msgs);
    case J_SPLIT: {
        int n = 0, rank = 0;
        unsigned k = 0;
        ncclResult_t r = cuemu_nccl_split_exchange(c, j->color, j->key, &n, &rank, &k);
        ncclComm_t ch = j->child;
        if (ch != NULL) {
            ncclResult_t rc = r;
            if (r == ncclSuccess) {
                ch->n = n;
                ch->rank = rank;
                snprintf(ch->name, sizeof ch->name, "%.80s_s%u_c%d", c->name, k, j->color);
                rc = cuemu_nccl_attach(ch, "ncclCommSplit");
            }
            atomic_store(&ch->w->state, rc); /* the child's own call: its setup */
            r = r == ncclSuccess ? rc : r;   /* NCCL reports the child's setup on the parent */
        }
        /* NCCL's child setup (topology, transports) takes tens of milliseconds on a GPU, so a
         * caller that reads *newcomm without polling the parent first finds NULL there. Here
         * the worker holds the result until the parent has been polled once (or aborted), so
         * such a caller finds NULL every time. Then *newcomm is written, success or not
         * (NCCL's ncclCommInitRankFunc stores it at its exit), before the parent's state
         * changes. */
        while (!atomic_load(&c->polled) && !atomic_load(&c->aborted)) {
            nanosleep(&(struct timespec){0, 100000}, NULL);
        }
        __atomic_store_n(j->newcomm, ch, __ATOMIC_RELEASE);
        return r;
    }
    case J_NOP:
        break;
    }
    return ncclSuccess;
}

static void *worker_main(void *arg)
{
    ncclComm_t c = arg;
    worker *w = c->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->has_job && !w->quit) {
            pthread_cond_wait(&w->cv, &w->mu);
        }
        if (w->quit) {
            break;
        }
        pthread_mutex_unlock(&w->mu);
        ncclResult_t r = run_job(c, &w->j);
        pthread_mutex_lock(&w->mu);
        w->has_job = 0;
        atomic_store(&w->state, r);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Makes c non-blocking: its worker, in progress (its setup is the first job). */
ncclResult_t cuemu_nccl_worker_start(ncclComm_t c, const char *fn)
{
    c->w = calloc(1, sizeof *c->w);
    if (c->w == NULL) {
        return cuemu_nccl_fail(NULL, ncclSystemError, fn, "out of memory");
    }
    pthread_mutex_init(&c->w->mu, NULL);
    pthread_cond_init(&c->w->cv, NULL);
    atomic_store(&c->w->state, ncclInProgress);
    if (pthread_create(&c->w->thread, NULL, worker_main, c) != 0) {
        free(c->w);
        c->w = NULL;
        return cuemu_nccl_fail(NULL, ncclSystemError, fn, "cannot start a worker thread");
    }
    return ncclSuccess;
}

/* Hands j to c's worker: ncclInProgress (c's state until it is done). */
static ncclResult_t submit(ncclComm_t c, const job *j)
{
    pthread_mutex_lock(&c->w->mu);
    c->w->j = *j;
    c->w->has_job = 1;
    atomic_store(&c->w->state, ncclInProgress);
    pthread_cond_signal(&c->w->cv);
    pthread_mutex_unlock(&c->w->mu);
    return ncclInProgress;
}

/* A non-blocking communicator takes a call only once its previous one is done: NCCL's
 * ncclCommEnsureReady (init.cc), which every call but ncclCommGetAsyncError and the abort
 * passes, refuses it with ncclInvalidArgument and this warning (not a lasting failure). */
ncclResult_t cuemu_nccl_idle(ncclComm_t c, const char *fn)
{
    if (c != NULL && c->w != NULL && !c->dead && atomic_load(&c->w->state) == ncclInProgress) {
        return cuemu_nccl_fail(c, ncclInvalidArgument, fn,
                               "Attempt to use communicator before the previous operation "
                               "returned ncclSuccess (it is non-blocking: poll "
                               "ncclCommGetAsyncError until it is not ncclInProgress)");
    }
    return ncclSuccess;
}

ncclResult_t cuemu_nccl_submit_coll(const coll *k)
{
    t_job.kind = J_COLL;
    t_job.k = *k;
    return submit(k->c, &t_job);
}

ncclResult_t cuemu_nccl_submit_group(ncclComm_t c, const coll *colls, int n_colls, const p2p *msgs,
                                     int n_msgs)
{
    ncclResult_t r = cuemu_nccl_idle(c, "ncclGroupEnd");
    if (r != ncclSuccess) {
        return r;
    }
    t_job.kind = J_GROUP;
    memcpy(t_job.colls, colls, (size_t)n_colls * sizeof(coll));
    memcpy(t_job.msgs, msgs, (size_t)n_msgs * sizeof(p2p));
    t_job.n_colls = n_colls;
    t_job.n_msgs = n_msgs;
    return submit(c, &t_job);
}

ncclResult_t cuemu_nccl_submit_init(ncclComm_t c)
{
    t_job.kind = J_INIT;
    return submit(c, &t_job);
}

ncclResult_t cuemu_nccl_submit_split(ncclComm_t comm, int color, int key, ncclComm_t child,
                                     ncclComm_t *newcomm)
{
    t_job.kind = J_SPLIT;
    t_job.color = color;
    t_job.key = key;
    t_job.child = child;
    t_job.newcomm = newcomm;
    atomic_store(&comm->polled, 0);
    return submit(comm, &t_job);
}

ncclResult_t cuemu_nccl_submit_nop(ncclComm_t c)
{
    t_job.kind = J_NOP; /* every call already ran: quiescent once the worker says so */
    return submit(c, &t_job);
}

ncclResult_t cuemu_nccl_state(ncclComm_t c)
{
    return atomic_load(&c->w->state);
}

void cuemu_nccl_worker_stop(ncclComm_t c)
{
    if (c->w == NULL) {
        return;
    }
    pthread_mutex_lock(&c->w->mu);
    c->w->quit = 1;
    pthread_cond_signal(&c->w->cv);
    pthread_mutex_unlock(&c->w->mu);
    pthread_join(c->w->thread, NULL); /* an aborted call returns at its next barrier spin */
    pthread_mutex_destroy(&c->w->mu);
    pthread_cond_destroy(&c->w->cv);
    free(c->w);
    c->w = NULL;
}
