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
 * and dtypes. On the shm backend each buffer collective is checked before any data moves: a
 * process that calls another collective, or the same one with another count, dtype, op or root,
 * makes it fail with ACCEL_EINVAL on every process, naming both calls ("collective mismatch:
 * rank 0 called allreduce(count=1000, f32, sum) #17, rank 1 called allreduce(count=999, f32,
 * sum) #17"). A process that dies or stops turns into ACCEL_EPEER / ACCEL_ETIMEDOUT (naming the
 * rank) on every survivor, never a hang; one that leaves the job (accel_free, exit) while the
 * others wait for it is reported as "rank N (pid P) exited (status S)", ACCEL_EPEER. After any
 * of these the accelerator's collectives keep failing.
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
 * (accel_chunk_range) into recv. In place when recv == (char *)send + off * element size.
 * A count divisible by the number of processes runs as one equal-count collective (zero-copy on
 * accel_alloc_shared buffers); any other is padded through a scratch buffer (one more copy in
 * and out, done when the call is issued and when the collective completes). */
ACCEL_API accel_status accel_reduce_scatter(accel *acc, const void *send, void *recv, size_t count,
                                            accel_dtype dt, accel_reduce_op op, accel_work **work);

/* The inverse: process r contributes its chunk (accel_chunk_range of `count`) from send; every
 * process receives all `count` elements in recv. In place when send == recv + off * size.
 * Counts that do not divide evenly are padded as for accel_reduce_scatter. */
ACCEL_API accel_status accel_allgather(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, accel_work **work);

/* recv = root's send on every process (`count` elements). In place when send == recv; send is
 * read on root only. */
ACCEL_API accel_status accel_broadcast(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, int root, accel_work **work);

/* recv on root = op over processes of send; recv is not touched elsewhere (may be NULL). */
ACCEL_API accel_status accel_reduce_to(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, accel_reduce_op op, int root,
                                       accel_work **work);

/* Each process sends `count` elements; root receives num_processes * count in rank order. */
ACCEL_API accel_status accel_gather_to(accel *acc, const void *send, void *recv, size_t count,
                                       accel_dtype dt, int root, accel_work **work);

/* Barrier (asynchronous form: returns when everyone has arrived). */
ACCEL_API accel_status accel_barrier(accel *acc, accel_work **work);

/*
 * Symmetric shared memory (NCCL's ncclMemAlloc + symmetric registration, PyTorch's
 * SymmetricMemory): a COLLECTIVE allocation. Every process calls it, in the same order relative
 * to the other collectives, with the same nbytes; each receives its own zero-filled, 64-byte
 * (page) aligned buffer of nbytes bytes (nbytes may be 0: a valid, unusable pointer).
 * On the shm backend every process maps every peer's buffer, so in-place allreduce,
 * reduce_scatter, allgather and broadcast whose buffer lies at the SAME offset of the same
 * allocation on every process (and are larger than ACCEL_SHM_ZEROCOPY_NBYTES) read peers' data
 * directly instead of copying it through staging slots (about 2x less memory traffic). Any other
 * buffer still works (the usual path). With one process (self backend) it is plain memory.
 * The memory lives in /dev/shm but has no name once the call returns: nothing is left behind
 * when a process dies. The call waits for this accel's queued asynchronous collectives first.
 *   out: receives the buffer on success (untouched on failure).
 * Returns ACCEL_OK; ACCEL_ENOMEM (no room in /dev/shm on some process, named; the call then
 * fails on every process); ACCEL_EINVAL (sizes differ between processes, named);
 * ACCEL_EPEER / ACCEL_ETIMEDOUT as any collective. Not thread-safe with other calls on acc.
 */
ACCEL_API accel_status accel_alloc_shared(accel *acc, size_t nbytes, void **out);

/* Frees a buffer of accel_alloc_shared. Local (not a collective): call it once this process's
 * last collective on the buffer has completed; the memory goes back to the system when every
 * process has freed it (or exited). NULL is a no-op. Returns ACCEL_EINVAL if p did not come
 * from accel_alloc_shared (checked on the shm backend only). Buffers still allocated are freed
 * by accel_free. Not thread-safe with other calls on acc. */
ACCEL_API accel_status accel_free_shared(accel *acc, void *p);

/* ---- User-level collectives (Accelerate's gather, reduce, broadcast, pad, split, trigger) ----
 *
 * All blocking. Unless said otherwise each is a collective: every process calls it, in the same
 * order, with tensors of the same dtype and shape. Tensors are accel_tensor views (contiguous,
 * row-major); their memory is always borrowed. With debug mode on (accel_options.debug /
 * ACCELERATE_DEBUG_MODE) gather, reduce and broadcast first compare every process's dtype and
 * shape and fail with ACCEL_EINVAL listing them, instead of exchanging mismatched buffers.
 * Errors: ACCEL_EINVAL naming the argument at fault; ACCEL_EPEER / ACCEL_ETIMEDOUT from the
 * transport. Not thread-safe with other calls on the same accel.
 */

/*
 * Accelerate's gather(tensor): concatenates `in` from every process along dim 0, in process
 * order, on every process. A 0-d tensor is treated as shape [1] (so the result is 1-d).
 *   in:  borrowed; in->data may be NULL only when it holds 0 bytes.
 *   out: out->data must point to num_processes * accel_tensor_nbytes(in) bytes (not overlapping
 *        in->data); the call fills out->dtype, ndim, shape ([N * rows, ...]) and device.
 * Shapes are always exchanged first (a few dozen bytes): a process whose dtype or shape
 * differs fails every process with ACCEL_EINVAL naming it (debug mode lists all shapes).
 */
ACCEL_API accel_status accel_gather(accel *acc, const accel_tensor *in, accel_tensor *out);

/* The result of accel_gather_object: one byte blob per process, in process order. Opaque;
 * owned by the caller, freed with accel_blobs_free. Not tied to the accel handle. */
typedef struct accel_blobs accel_blobs;

/*
 * Accelerate's gather_object: every process contributes `nbytes` bytes (different sizes
 * allowed, 0 included) and every process receives all of them. `blob` is borrowed (may be NULL
 * when nbytes == 0). Serialize structured objects yourself (e.g. JSON, fixed structs).
 *   out: receives an owned accel_blobs on success (free with accel_blobs_free).
 */
ACCEL_API accel_status accel_gather_object(accel *acc, const void *blob, size_t nbytes,
                                           accel_blobs **out);
/* Number of blobs (num_processes at the time of the gather). 0 for NULL. */
ACCEL_API int accel_blobs_count(const accel_blobs *b);
/* The blob of process i (borrowed, valid until accel_blobs_free; 16-byte aligned; non-NULL even
 * when empty) and its size in *nbytes (when nbytes != NULL). NULL if b is NULL or i is out of
 * range. */
ACCEL_API const void *accel_blobs_data(const accel_blobs *b, int i, size_t *nbytes);
/* Frees the blobs. Accepts NULL. */
ACCEL_API void accel_blobs_free(accel_blobs *b);

/*
 * Accelerate's reduce(tensor, reduction, scale): all-reduces t in place (result on every
 * process), then multiplies every element by `scale` (1.0 = leave as is).
 *   op: ACCEL_SUM or ACCEL_AVG ("mean"); ACCEL_MAX / MIN / PROD are accepted too.
 *   scale: must be 1.0 for integer and BOOL dtypes (EINVAL otherwise). For float dtypes the
 *          product is computed in f64 (f32 for f16/bf16/f8, matching their fp32 accumulation)
 *          and rounded once to the dtype (RNE).
 */
ACCEL_API accel_status accel_allreduce_tensor(accel *acc, accel_tensor *t, accel_reduce_op op,
                                              double scale);

/*
 * Accelerate's broadcast(tensor, from_process): overwrites t->data on every process with the
 * bytes of process `from_process`. t must have the same dtype and shape everywhere.
 */
ACCEL_API accel_status accel_broadcast_tensor(accel *acc, accel_tensor *t, int from_process);

/*
 * Accelerate's broadcast_object_list, for one byte blob of any size.
 * On `from_process`: *blob / *nbytes are the input; they are read and left untouched (the
 *   caller keeps ownership of *blob).
 * On every other process: *blob / *nbytes are outputs only (their previous values are ignored
 *   and NOT freed): on success *blob receives a fresh owned copy (free with accel_blob_free;
 *   non-NULL even for 0 bytes) and *nbytes its size. On failure they are left untouched.
 */
ACCEL_API accel_status accel_broadcast_object(accel *acc, void **blob, size_t *nbytes,
                                              int from_process);
/* Frees a blob returned by accel_broadcast_object. Accepts NULL. */
ACCEL_API void accel_blob_free(void *blob);

/*
 * Accelerate's pad_across_processes, in two collective calls so a C caller can allocate:
 *
 *     int64_t rows;
 *     accel_pad_across_processes_size(acc, &t, 0, &rows);        // max of t.shape[0]
 *     accel_tensor out = {.data = malloc(rows * (nbytes(t) / t.shape[0]))};  // or any buffer
 *     accel_pad_across_processes(acc, &t, 0, NULL, 0, &out);
 *
 * _size: *max_size = the maximum over processes of in->shape[dim].
 * _pad:  copies `in` into out->data, padded along `dim` to that maximum with `pad_value` (one
 *        element of in->dtype, borrowed; NULL means zero bytes), after the data (pad_first = 0)
 *        or before it (pad_first = 1). out->data must hold in's shape with shape[dim] replaced by
 *        the maximum, and must not overlap in->data; out's dtype/ndim/shape/device are filled in.
 * dim: 0 <= dim < ndim, or negative from the end (-1 = last). Unlike Accelerate, which returns
 *      the tensor unchanged for an out-of-range dim, that is ACCEL_EINVAL naming dim (silently
 *      not padding hides the bug until the following gather hangs). Shapes may differ across
 *      processes only along dim (other dims are not checked unless debug mode).
 */
ACCEL_API accel_status accel_pad_across_processes_size(accel *acc, const accel_tensor *in,
                                                       int dim, int64_t *max_size);
ACCEL_API accel_status accel_pad_across_processes(accel *acc, const accel_tensor *in, int dim,
                                                  const void *pad_value, int pad_first,
                                                  accel_tensor *out);

/*
 * Accelerate's split_between_processes(inputs, apply_padding), as an index range. Not a
 * collective (pure arithmetic on the process index). With N processes and q, r = divmod(n, N):
 * process p gets items [*start, *start + *count) where *start = p*q + min(p, r) and
 * *count = q + (p < r). Without padding *n_padding = 0. With apply_padding every process must
 * end up with q + (r > 0) items, so a short process appends *n_padding copies of the LAST
 * INPUT item (index n_items - 1, as Accelerate pads with inputs[-1]).
 * Example, 3 items on 2 processes: p0 start 0 count 2; p1 start 2 count 1, and with padding
 * p1 also has n_padding 1 (its items are [2, 2]). One process gets everything.
 *   start, count: required outputs; n_padding: optional output (may be NULL).
 */
ACCEL_API accel_status accel_split_between_processes(const accel *acc, size_t n_items,
                                                     int apply_padding, size_t *start,
                                                     size_t *count, size_t *n_padding);

/*
 * Accelerate's set_trigger / check_trigger: a flag any process may raise (e.g. "loss is NaN,
 * stop"), seen by all at the next check.
 * accel_set_trigger: raises this process's flag. Local, not a collective.
 * accel_check_trigger: collective; *triggered = 1 on every process if any process raised its
 *   flag since the last check (then every flag is reset), else 0.
 */
ACCEL_API accel_status accel_set_trigger(accel *acc);
ACCEL_API accel_status accel_check_trigger(accel *acc, int *triggered);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_COLLECTIVES_H */
