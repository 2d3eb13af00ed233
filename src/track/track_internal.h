/*
 * Private interface of the tracking module: the protobuf wire-format encoder/decoder and CRC32C
 * used by the TensorBoard event files, the event-file reader (used by tests), the built-in
 * tracker tables, and small file-system helpers shared by the trackers.
 */
#ifndef ACCEL_TRACK_INTERNAL_H
#define ACCEL_TRACK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "accel/accel.h"
#include "base/base.h"
#include "base/fs.h"

/* ---- CRC32C (Castagnoli), as TFRecord framing uses it ---- */
uint32_t accel__crc32c(const void *data, size_t nbytes);
/* TFRecord's masked CRC: rotate right by 15 and add 0xa282ead8. */
uint32_t accel__crc32c_masked(const void *data, size_t nbytes);

/* ---- Protobuf wire format ---- */

enum { ACCEL__PB_VARINT = 0, ACCEL__PB_I64 = 1, ACCEL__PB_LEN = 2, ACCEL__PB_I32 = 5 };

/* A growable output buffer. Appends after an allocation failure are dropped and `failed` is
 * set, so a caller checks once at the end. */
typedef struct accel__pb {
    uint8_t *data;
    size_t len, cap;
    int failed;
} accel__pb;

void accel__pb_reset(accel__pb *b); /* len = 0, keeps the memory */
void accel__pb_free(accel__pb *b);
void accel__pb_raw_varint(accel__pb *b, uint64_t v);
void accel__pb_varint(accel__pb *b, uint32_t field, uint64_t v); /* int32/int64/enum/bool */
void accel__pb_double(accel__pb *b, uint32_t field, double v);
void accel__pb_float(accel__pb *b, uint32_t field, float v);
void accel__pb_bytes(accel__pb *b, uint32_t field, const void *data, size_t nbytes);
/* A string field: bytes outside well-formed UTF-8 are written as the UTF-8 of their Latin-1
 * reading (protobuf readers reject a string field that is not UTF-8). Raw bytes: pb_bytes. */
void accel__pb_string(accel__pb *b, uint32_t field, const char *s);
/* Appends a nested message already encoded in `msg`. */
void accel__pb_message(accel__pb *b, uint32_t field, const accel__pb *msg);

/* A field read by accel__pb_next. For LEN fields `data`/`nbytes` point into the input; for
 * I64/I32 `u` holds the raw little-endian bits. */
typedef struct accel__pb_field {
    uint32_t field;
    int wire;
    uint64_t u;
    const uint8_t *data;
    size_t nbytes;
} accel__pb_field;

/* Reads the next field of [*p, end). Returns 1 with *f set, 0 at the end, -1 when malformed. */
int accel__pb_next(const uint8_t **p, const uint8_t *end, accel__pb_field *f);
double accel__pb_as_double(const accel__pb_field *f);
float accel__pb_as_float(const accel__pb_field *f);

/* ---- TensorBoard event files ---- */

/* Writes one TFRecord (length, masked CRC of length, data, masked CRC of data). Returns 0 or
 * -1 on a short write. */
int accel__tfrecord_write(FILE *f, const void *data, size_t nbytes);

/* One decoded summary value of an event file (reader side, for tests and tools). */
typedef struct accel__tf_value {
    double wall_time;
    long long step;
    const char *tag;    /* owned by the reader callback's caller; valid during the callback */
    const char *plugin; /* plugin_name of the metadata, "" when none */
    int has_simple;     /* simple_value present */
    float simple_value;
    const char *text;  /* first string_val of a tensor, NULL when none */
    int session_start; /* a SessionLog START event (tag and plugin ""), not a summary value */
} accel__tf_value;

/* Callback per event: file_version is non-NULL for the version event; v is NULL then. A
 * SessionLog START event comes as a value with session_start set. */
typedef int (*accel__tf_visit)(void *ctx, const char *file_version, const accel__tf_value *v);

/* Reads an event file, checking every CRC and size, and calls visit for the version record
 * and for every summary value. Returns ACCEL_OK, ACCEL_EIO / ACCEL_ECORRUPT naming the file
 * and offset, or ACCEL_EINTERNAL if visit returns nonzero. */
accel_status accel__tfevents_read(const char *path, accel__tf_visit visit, void *ctx);

/* Checks a log_with list against the registry (unknown names, trackers needing a directory
 * when logging_dir is NULL) without starting anything; sets the error on acc. Used by
 * accel_init_trackers, and meant for accel_init so that bad names fail at construction as in
 * Accelerate. */
accel_status accel__track_validate(accel *acc, const char *log_with, const char *logging_dir);

/* ---- Built-in trackers (each in its own file) ---- */
extern const accel_tracker_ops accel__tracker_tensorboard;
extern const accel_tracker_ops accel__tracker_mlflow;
extern const accel_tracker_ops accel__tracker_jsonl;
extern const accel_tracker_ops accel__tracker_csv;

/* Returns the run folder of a built-in tracker state (accel_tracker_run_dir). */
typedef struct accel__track_common {
    uint32_t magic; /* ACCEL__TRACK_MAGIC for built-in states */
    char *run_dir;
} accel__track_common;
#define ACCEL__TRACK_MAGIC 0x74726b31u /* "trk1" */

/* ---- Helpers ---- */

/* Formats v in the shortest form that reads back exactly; "nan", "inf", "-inf" otherwise
 * (what Python's float() accepts). */
void accel__track_fmt_double(char *out, size_t cap, double v);
/* The length of the well-formed UTF-8 sequence at p (1-4), or 0 when p does not start one
 * (a stray continuation byte, an overlong form, a surrogate, a value past U+10FFFF). */
int accel__utf8_len(const unsigned char *p);
/* A copy of s in which each byte outside well-formed UTF-8 is replaced by the UTF-8 of its
 * Latin-1 reading (as the JSON files escape it). Returns owned memory (accel__free), or NULL
 * when out of memory. */
char *accel__utf8_dup(const char *s);
/* Appends a JSON string literal of s (quoted, escaped) to the stream: always valid UTF-8 (a
 * byte outside well-formed UTF-8 becomes \u00XX) with control characters escaped, so it is
 * also a YAML double-quoted scalar. */
void accel__json_string(FILE *f, const char *s);
/* A record file (metrics.jsonl / .csv, an event file) whose last append failed, a full disk
 * say: closes f, cuts the file back to `good` bytes (where the last whole record ended; a
 * partial record would corrupt, for the file's readers, every record written after the disk
 * has room again) and reopens it with `mode`. good < 0: no cut. Returns the new stream, or NULL
 * with errno set (the caller retries at its next record). */
FILE *accel__track_reopen_at(FILE *f, const char *path, long long good, const char *mode);
/* 1 when `path` no longer names the file open as f: deleted or replaced while the run wrote
 * it (TensorFlow's EventsWriter makes the same check and writes a new file). */
int accel__track_file_gone(FILE *f, const char *path);
/* Takes the lock file `path` (base/fs.h; its folder must exist) that keeps a second job off a
 * tracker's files while this one writes them: accel__lockfile_take_named, with its message set
 * as the tracker's (accel_tracker_seterr). ACCEL_ESTATE when another process holds it: "<what>
 * is being written by another job (<holder>; lock <path>)" followed by `advice` (may be "");
 * other failures as accel__lockfile_take_named's. */
accel_status accel__track_lock(accel__lockfile *l, const char *path, const char *what,
                               const char *advice);
/* The log context of the accelerator whose tracker callback is running on this thread (NULL
 * outside callbacks: the default context). */
const accel__log_ctx *accel__track_log(void);
/* Warns through the library logger that a logged value is not finite (the first few only). */
void accel__track_warn_nonfinite(const char *tracker, const char *key, double v);

#endif /* ACCEL_TRACK_INTERNAL_H */
