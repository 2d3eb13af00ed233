/*
 * The one communication interface. Everything above src/comm/ (core, train, data, ckpt) talks
 * to other processes only through these functions; backends (self, shm, later mpi and nccl)
 * implement accel__comm_backend and are chosen by name in accel__comm_new.
 *
 * Semantics (all backends): every process calls the same collectives in the same order with
 * the same count/dtype/op/root. Counts are elements. reduce_scatter/allgather use the partition
 * of accel_chunk_range. F16/BF16/F8 reduce with fp32 accumulation. Every wait has the deadline
 * given at creation; a dead peer is detected within seconds and reported as ACCEL_EPEER naming
 * the rank; after any failure the communicator is broken and every later call fails fast.
 *
 * Async: accel__comm_submit_* queue the operation to the communicator's progress thread, which
 * runs queued operations in issue order. Blocking calls run on the caller's thread when nothing
 * is queued, else they queue and wait, so the global order is always the issue order.
 */
#ifndef ACCEL_COMM_H
#define ACCEL_COMM_H

#include <stddef.h>

#include "accel/collectives.h"
#include "accel/tensor.h"
#include "base/base.h"

typedef struct accel__comm accel__comm;

typedef enum accel__coll_kind {
    ACCEL__COLL_ALLREDUCE,
    ACCEL__COLL_REDUCE_SCATTER,
    ACCEL__COLL_ALLGATHER,
    ACCEL__COLL_BROADCAST,
    ACCEL__COLL_REDUCE,
    ACCEL__COLL_GATHER,
    ACCEL__COLL_BARRIER
} accel__coll_kind;

/* One collective call, as queued or run. */
typedef struct accel__coll {
    accel__coll_kind kind;
    const void *send;
    void *recv;
    size_t count; /* see each function below */
    accel_dtype dtype;
    accel_reduce_op op;
    int root;
} accel__coll;

typedef struct accel__comm_config {
    const char *backend; /* "self", "shm", ... */
    int rank, n_ranks;
    int local_rank, local_n_ranks;
    /* The job's secret name (ACCEL_JOB_ID: accel launch makes it random), naming shared
     * resources (shm segments); NULL or "" when none was given: the backend then agrees on one
     * through the job's store (src/comm/store.h) at master_addr:master_port. */
    const char *job_id;
    const char *master_addr;    /* MASTER_ADDR */
    int master_port;            /* MASTER_PORT */
    double timeout_s;           /* deadline for every wait */
    accel__log_ctx log;         /* rank prefix and level of the communicator's log lines */
    struct accel__trace *trace; /* profiler recorder for the progress thread's ranges, or NULL */
} accel__comm_config;

/* A backend: run one collective synchronously on the calling thread. Must validate nothing
 * (accel__comm_run does) and must report failures through accel__seterr(NULL, ...). */
typedef struct accel__comm_backend {
    const char *name;
    accel_status (*init)(accel__comm *c, void **impl);
    accel_status (*run)(accel__comm *c, void *impl, const accel__coll *op);
    void (*destroy)(accel__comm *c, void *impl);
    /* Symmetric memory (accel__comm_alloc), called with the communicator idle. alloc is
     * collective; dealloc is local and fails with EINVAL for a pointer alloc did not return. */
    accel_status (*alloc)(accel__comm *c, void *impl, size_t nbytes, void **out);
    accel_status (*dealloc)(accel__comm *c, void *impl, void *p);
    int zero_copy; /* collectives on alloc'd buffers skip copies (accel__comm_zero_copy) */
} accel__comm_backend;

/* The backends accel__comm_new can create in this build, comma-separated. Static string. */
const char *accel__comm_backends_built(void);

/* Creates a communicator (collective over all ranks). On failure the thread error names the
 * cause (peer, timeout, unknown backend). */
accel_status accel__comm_new(accel__comm **out, const accel__comm_config *cfg);
/* Stops the progress thread (waiting for queued work) and releases the backend. Accepts NULL. */
void accel__comm_free(accel__comm *c);

int accel__comm_rank(const accel__comm *c);
int accel__comm_n_ranks(const accel__comm *c);
const char *accel__comm_backend_name(const accel__comm *c);
double accel__comm_timeout(const accel__comm *c);

/* Runs (blocking) or queues (work != NULL) one collective after validating it. The count of
 * each kind: ALLREDUCE/BROADCAST/REDUCE: elements of the buffer; REDUCE_SCATTER/ALLGATHER: the
 * total, each rank owning its chunk; GATHER: elements sent per rank. */
accel_status accel__comm_run(accel__comm *c, const accel__coll *op, accel_work **work);

/* Work a caller attaches to one collective (accel__comm_run_hooked): `pre` runs on the thread
 * that executes the collective right before the data moves, `post` right after it moved (only
 * when the collective succeeded), both with `arg`. The training core's reducer converts
 * gradients to and from bf16 / f16 this way, off the training thread. A hook must not call
 * into the communicator. */
typedef struct accel__coll_hooks {
    void (*pre)(void *arg);
    void (*post)(void *arg);
    void *arg;
} accel__coll_hooks;

/* accel__comm_run with hooks (NULL: none). */
accel_status accel__comm_run_hooked(accel__comm *c, const accel__coll *op,
                                    const accel__coll_hooks *hooks, accel_work **work);

/* The creation config (its strings point into the communicator; valid until accel__comm_free). */
const accel__comm_config *accel__comm_cfg(const accel__comm *c);

/* "allreduce", "barrier", ...: names used in error messages. Static strings. */
const char *accel__coll_name(accel__coll_kind kind);

/* The partition of reduce_scatter / allgather (accel_chunk_range is the public face): rank
 * `rank` owns [*off, *off + *chunk_count) of `count`, the first count % n_ranks ranks one more. */
void accel__chunk_range(size_t count, int n_ranks, int rank, size_t *off, size_t *chunk_count);

/* Symmetric shared memory (accel_alloc_shared): a collective allocation of nbytes (the same on
 * every process), zero-filled and 64-byte aligned, ordered after every queued collective. In
 * place collectives on buffers at the same offset of one such allocation on every process run
 * without copies on backends where accel__comm_zero_copy is 1 (shm); elsewhere it is plain
 * memory. accel__comm_dealloc is local (NULL is a no-op). Not thread-safe with other calls. */
accel_status accel__comm_alloc(accel__comm *c, size_t nbytes, void **out);
accel_status accel__comm_dealloc(accel__comm *c, void *p);
int accel__comm_zero_copy(const accel__comm *c);

/* Convenience wrappers over accel__comm_run (blocking). */
accel_status accel__allreduce(accel__comm *c, const void *send, void *recv, size_t count,
                              accel_dtype dt, accel_reduce_op op);
accel_status accel__broadcast(accel__comm *c, void *buf, size_t count, accel_dtype dt, int root);
accel_status accel__barrier(accel__comm *c);

#endif /* ACCEL_COMM_H */
