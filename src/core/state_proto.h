/*
 * The state protocol: how an object (core/object.h) saves its state into a checkpoint and
 * loads it back, without knowing files, formats or processes. Declared here so every module
 * can implement its objects' state_save / state_load; implemented by src/ckpt
 * (state_writer.c, state_reader.c), which owns the folder, the file formats, verification and
 * the collective protocol (docs/checkpoint.md, "The state protocol").
 *
 * Saving: state_save puts named tensors (views, read when the file is written, so they must
 * stay valid and unchanged until state_save's caller returns) and JSON values into a writer.
 * Loading: state_load gets them from a reader with every check (presence, dtype, shape,
 * range) and must modify nothing live: a tensor is copied into its destination, and staged
 * actions run, only after every object of every process validated its part; then nothing
 * can fail any more.
 *
 * JSON values are put and got by key in the current object; accel__state_begin / _enter open
 * a nested object or array (in an array, keys are NULL when putting; elements are read with
 * accel__state_get_f64s or accel__state_enter_item). Every failure sets the thread's error
 * naming the checkpoint folder, the file and the key or tensor; the object returns it as is.
 */
#ifndef ACCEL_CORE_STATE_PROTO_H
#define ACCEL_CORE_STATE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "accel/core.h" /* ACCEL_RNG_STATE_WORDS */
#include "accel/tensor.h"
#include "base/base.h"
#include "core/object.h"

/* Which part of an object's state a writer or reader is for (core/object.h). */
typedef enum accel__state_part {
    ACCEL__STATE_SHARED = 0, /* identical on every process, written once */
    ACCEL__STATE_RANK        /* this process's own */
} accel__state_part;

/*
 * A piece of a tensor: the elements [offset, offset + numel(piece)) of the row-major
 * flattening of a tensor of shape `shape` (a process's shard of sharded state). A whole
 * tensor is the piece at offset 0 with the view's own shape.
 */
typedef struct accel__state_piece {
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    int64_t offset;
} accel__state_piece;

/* ---- saving ---- */

accel__state_part accel__state_writer_part(const accel__state_writer *w);

/* Puts tensor `name` (unique in the object's part; a host view of contiguous memory).
 * ACCEL_EINVAL for a duplicate or bad name, a view that is not host memory, or a part whose
 * container takes no tensors. */
accel_status accel__state_put_tensor(accel__state_writer *w, const char *name, accel_tensor view);
/* Puts `piece` as part of tensor `name` described by `whole`. A piece covering the whole
 * tensor is put as the tensor; a true piece is ACCEL_EUNSUPPORTED until sharded checkpoints
 * have a file format (the ZeRO issue). */
accel_status accel__state_put_piece(accel__state_writer *w, const char *name, accel_tensor piece,
                                    const accel__state_piece *whole);

/* JSON values under `key` in the current object (key NULL: appended to the current array).
 * ACCEL_EINVAL for a missing key in an object, a duplicate key, a part whose container takes
 * no JSON values; ACCEL_ENOMEM. */
accel_status accel__state_put_i64(accel__state_writer *w, const char *key, int64_t v);
accel_status accel__state_put_f64(accel__state_writer *w, const char *key, double v);
accel_status accel__state_put_bool(accel__state_writer *w, const char *key, int v);
accel_status accel__state_put_str(accel__state_writer *w, const char *key, const char *v);
/* As "0x" and 16 hexadecimal digits (JSON numbers lose 64-bit integers in other readers). */
accel_status accel__state_put_u64(accel__state_writer *w, const char *key, uint64_t v);
/* A generator state: an array of ACCEL_RNG_STATE_WORDS words as accel__state_put_u64. */
accel_status accel__state_put_gen(accel__state_writer *w, const char *key,
                                  const uint64_t s[ACCEL_RNG_STATE_WORDS]);
/* An array of n numbers. */
accel_status accel__state_put_f64s(accel__state_writer *w, const char *key, const double *v,
                                   size_t n);
/* Opens a nested object (array = 0) or array (array = 1) under `key`; close with
 * accel__state_end. */
accel_status accel__state_begin(accel__state_writer *w, const char *key, int array);
accel_status accel__state_end(accel__state_writer *w);

/* Raw bytes, appended (a ACCEL__STORE_BYTES part only). */
accel_status accel__state_put_bytes(accel__state_writer *w, const void *data, size_t n);

/* ---- loading ---- */

accel__state_part accel__state_reader_part(const accel__state_reader *r);
/* The object's index among the live objects of its kind (for messages). */
int accel__state_index(const accel__state_reader *r);
/* How many processes saved the checkpoint. A per-process part comes from this process's file
 * when the count is unchanged, else from process 0's when this process has none (the object
 * decides what that means: a loader rescales its position). */
int accel__state_saved_processes(const accel__state_reader *r);

/*
 * Tensor `name` into `dst` (host memory, contiguous): ACCEL_EINVAL naming the file and the
 * tensor when it is missing ("the live <kind> has it") or its dtype or shape differs (both
 * shapes named). The copy happens when the load is applied. Every tensor of a part must be
 * read by its object: one left unread fails the load (ACCEL_EINVAL naming it).
 */
accel_status accel__state_get_tensor(accel__state_reader *r, const char *name, accel_tensor dst);
/* The piece `whole` describes of tensor `name` (saved whole, of shape whole->shape) into
 * `piece`: how a shard is loaded from a full tensor. */
accel_status accel__state_get_piece(accel__state_reader *r, const char *name, accel_tensor piece,
                                    const accel__state_piece *whole);

/* The largest counter (steps, epochs, batches) a checkpoint may hold: 2^53, exact as a double
 * and out of reach of any run, so a loaded counter can still count (a damaged or edited file
 * holding INT64_MAX would overflow at the next step). Use it as `hi` of such a counter. */
#define ACCEL__STATE_COUNT_MAX ((int64_t)1 << 53)

/* JSON values of the current object, range-checked: ACCEL_ECORRUPT "checkpoint D: F is
 * malformed: <key path> ..." when missing, of another type or out of [lo, hi] (reals must
 * be finite). Strings are borrowed until the load ends. */
int accel__state_has(const accel__state_reader *r, const char *key);
accel_status accel__state_get_i64(accel__state_reader *r, const char *key, int64_t lo, int64_t hi,
                                  int64_t *out);
accel_status accel__state_get_f64(accel__state_reader *r, const char *key, double lo, double hi,
                                  double *out);
accel_status accel__state_get_bool(accel__state_reader *r, const char *key, int *out);
accel_status accel__state_get_str(accel__state_reader *r, const char *key, const char **out);
accel_status accel__state_get_u64(accel__state_reader *r, const char *key, uint64_t *out);
/* A generator state as put by accel__state_put_gen; all-zero is refused (not a state). */
accel_status accel__state_get_gen(accel__state_reader *r, const char *key,
                                  uint64_t s[ACCEL_RNG_STATE_WORDS]);
/* The length of array `key`. */
accel_status accel__state_get_len(accel__state_reader *r, const char *key, size_t *n);
/* Array `key` of exactly n numbers in [lo, hi]. */
accel_status accel__state_get_f64s(accel__state_reader *r, const char *key, double lo, double hi,
                                   double *out, size_t n);
/* Enters object `key`, or element i (an object) of array `key`; leave with
 * accel__state_leave. */
accel_status accel__state_enter(accel__state_reader *r, const char *key);
accel_status accel__state_enter_item(accel__state_reader *r, const char *key, size_t i);
void accel__state_leave(accel__state_reader *r);

/* The raw bytes of a ACCEL__STORE_BYTES part, borrowed until the load ends. */
accel_status accel__state_get_bytes(accel__state_reader *r, const void **data, size_t *n);

/* Fails the load with `st` and "checkpoint D: F: <message>": for values that are well-formed
 * but wrong (ACCEL_ECORRUPT) or do not fit the live object (ACCEL_EINVAL). Returns st. */
accel_status accel__state_fail(accel__state_reader *r, accel_status st, const char *fmt, ...)
    ACCEL_PRINTF(3, 4);

/*
 * Stages `apply(obj, data)` for when the load is applied: after every process validated its
 * files and every tensor was copied, in the order objects are loaded (core/object.h's kinds,
 * then creation order). Returns `data`, nbytes of zeroed memory the load owns (filled by the
 * caller now, read by apply), or NULL with ACCEL_ENOMEM set. apply cannot fail.
 */
void *accel__state_stage(accel__state_reader *r, size_t nbytes,
                         void (*apply)(accel__object *obj, void *data));

/* Where an iterating object resumes (a loader: its epoch, the batches already handed out and
 * its live epoch length, -1 when unknown). load_state checks that every process resumes at
 * the same epoch, and at the same batch when their lengths are equal. */
accel_status accel__state_resume_at(accel__state_reader *r, int64_t epoch, int64_t batch,
                                    int64_t length);

#endif /* ACCEL_CORE_STATE_PROTO_H */
