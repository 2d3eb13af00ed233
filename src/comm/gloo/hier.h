/*
 * The hier composition's endpoint, private to src/comm/gloo: hier.c sets it up, splits it and
 * frees it; hier_coll.c runs its collectives and its allocation (the algorithms are described
 * there and in docs/comm.md, "Many machines").
 */
#ifndef ACCEL_COMM_GLOO_HIER_H
#define ACCEL_COMM_GLOO_HIER_H

#include <pthread.h>

#include "base/base.h"
#include "comm/comm.h"
#include "comm/store.h"
#include "gloo.h"

extern const accel__comm_ops accel__shm_ops;

typedef struct hier {
    int rank, n_ranks, l, L, node, n_nodes;
    void *shm;           /* the shm endpoint of this machine's L processes */
    accel__gloo *cross;  /* gloo over the n_nodes processes of local rank l */
    accel__store *store; /* the job's store, when this process serves it */
    void *work;          /* the padded, widened copy reductions run on (grow-only) */
    size_t work_nbytes;
    int *process;  /* n_ranks: the job-wide process index of each rank, for messages */
    char key[128]; /* the job's key: names this communicator's shm segment and gloo keys */

    /* The cross-machine worker of the pipeline. */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, stop, pending;
    accel__coll job;
    accel_status job_st;
    char job_msg[ACCEL__ERRMSG_NBYTES];
} hier;

/* ops->run: one user collective, declared to both levels as the user's call. */
accel_status accel__hier_run(void *impl, const accel__coll *op);
/* ops->mem_alloc: plain memory behind an allgather of the sizes, checked on every process. */
accel_status accel__hier_mem_alloc(void *impl, size_t nbytes, void **out);

#endif /* ACCEL_COMM_GLOO_HIER_H */
