/*
 * accel/collectives.h - collectives over all processes of an accelerator.
 *
 * Two levels:
 *  - buffer collectives (accel_allreduce & co.): (buffer, count, dtype, op), blocking or
 *    asynchronous through an accel_work handle, the NCCL shape. Counts are in elements and
 *    may be 0 or not divisible by the number of processes. F16, BF16 and F8 are reduced with
 *    fp32 accumulation and rounded once.
 *  - user-level collectives on tensors and byte blobs (gather, gather_object, broadcast_object,
 *    pad_across_processes, split_between_processes, triggers), Accelerate's utilities.
 *
 * Every collective must be called by every process, in the same order, with matching counts
 * and dtypes. A process that dies or stops turns into ACCEL_EPEER / ACCEL_ETIMEDOUT (naming the
 * rank) on every survivor, never a hang. Included by accel.h; do not include alone.
 */
#ifndef ACCEL_COLLECTIVES_H
#define ACCEL_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel accel;

typedef enum accel_reduce_op {
    ACCEL_SUM = 0,
    ACCEL_AVG = 1, /* sum / num_processes; integers truncate toward zero; not for BOOL */
    ACCEL_MAX = 2,
    ACCEL_MIN = 3,
    ACCEL_PROD = 4
} accel_reduce_op;

/* BOOL reduces as logic: SUM and MAX are OR, PROD and MIN are AND. */

/* An asynchronous collective in flight. Buffers must stay valid and untouched until it
 * completes. Collectives of one accel run in issue order. */
typedef struct accel_work accel_work;

/* Blocks until `w` completes; returns its status. Does not free it. */
ACCEL_API accel_status accel_work_wait(accel_work *w);
/* 1 if complete (its status is then *st when st != NULL), else 0. Never blocks. */
ACCEL_API int accel_work_test(accel_work *w, accel_status *st);
/* Waits if needed, then frees. Accepts NULL. */
ACCEL_API void accel_work_free(accel_work *w);

/* The even partition used by reduce_scatter / allgather: process `rank` of `n_ranks` owns
 * elements [*off, *off + *count) of `count`; the first count % n_ranks processes get one more. */
ACCEL_API void accel_chunk_range(size_t count, int n_ranks, int rank, size_t *off,
                                 size_t *chunk_count);

/*
 * recv[i] = op over processes of send[i], on every process. In place when send == recv.
 * work: NULL for a blocking call; else receives the handle (free with accel_work_free).
 */
ACCEL_API accel_status accel_allreduce(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, accel_reduce_op op, accel_work **work);

/* send holds `count` elements on every process; process r receives the reduction of its chunk
 * (accel_chunk_range) into recv. In place when recv == (char *)send + off * element size. */
ACCEL_API accel_status accel_reduce_scatter(accel *acc, const void *send, void *recv, size_t count,
                                            accel_dtype dt, accel_reduce_op op, accel_work **work);

/* The inverse: process r contributes its chunk (accel_chunk_range of `count`) from send; every
 * process receives all `count` elements in recv. In place when send == recv + off * size. */
ACCEL_API accel_status accel_allgather(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, accel_work **work);

/* recv = root's send on every process (`count` elements). In place when send == recv; send is
 * read on root only. */
ACCEL_API accel_status accel_broadcast(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, int root, accel_work **work);

/* recv on root = op over processes of send; recv is not touched elsewhere (may be NULL). */
ACCEL_API accel_status accel_reduce(accel *acc, const void *send, void *recv, size_t count,
                                    accel_dtype dt, accel_reduce_op op, int root,
                                    accel_work **work);

/* Each process sends `count` elements; root receives num_processes * count in rank order. */
ACCEL_API accel_status accel_gather_to(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, int root, accel_work **work);

/* Barrier (asynchronous form: returns when everyone has arrived). */
ACCEL_API accel_status accel_barrier(accel *acc, accel_work **work);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_COLLECTIVES_H */
