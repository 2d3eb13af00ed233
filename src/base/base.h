/*
 * The runtime below every other module of libaccel (DESIGN.md §2): allocation, error
 * reporting, logging, the environment-variable table, the clock, and the names of the device
 * stream / event types that comm and device share. Base knows no accelerator handle and no
 * communicator; everything here is usable from any thread unless a comment says otherwise.
 *
 * Invariant: a function that fails sets the message with accel__seterr (on the handle when it
 * has one, always on the thread) and returns the same status, so callers only propagate.
 */
#ifndef ACCEL_BASE_H
#define ACCEL_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "accel/status.h"
#include "accel/tensor.h"

#define ACCEL__ERRMSG_NBYTES 1024

/* ---- Memory: every allocation goes through these (accel_replace_allocator swaps them) ---- */
void *accel__malloc(size_t nbytes);
void *accel__calloc(size_t n, size_t nbytes);
void *accel__realloc(void *p, size_t nbytes);
void accel__free(void *p);
char *accel__strdup(const char *s);
/* 64-byte aligned allocation for vectorised buffers; free with accel__aligned_free. */
void *accel__aligned_alloc(size_t nbytes);
void accel__aligned_free(void *p);
/* Zero-filled host pages straight from the kernel (pages.c), for buffers whose parts come and
 * go (ZeRO-3's gathered weights): only touched pages take memory. NULL when out of memory;
 * not counted by accel_replace_allocator's functions. */
void *accel__pages_alloc(size_t nbytes);
void accel__pages_free(void *p, size_t nbytes);
/* Gives back the whole pages inside [p, p + nbytes): they read as zeros afterwards (bytes of the
 * partial pages at the ends are kept). */
void accel__pages_drop(void *p, size_t nbytes);
/* [p, p + nbytes) reads as zeros afterwards: the whole pages inside are given back, the bytes
 * of the partial pages at the ends zero-filled. */
void accel__pages_clear(void *p, size_t nbytes);
/* Gives back every page of a whole buffer from accel__pages_alloc(nbytes). */
void accel__pages_drop_all(void *p, size_t nbytes);
/* Maps every page of [p, p + nbytes) (inside one accel__pages_alloc buffer) writable now, in
 * one call, where the kernel can (Linux >= 5.14: MADV_POPULATE_WRITE): pages not resident come
 * back zero-filled, resident ones are untouched. 0, or -1 when the kernel cannot (the pages
 * then fault in on first use, as before). */
int accel__pages_populate(void *p, size_t nbytes);
/* Bytes of [p, p + nbytes) (p page-aligned) that are resident now. */
size_t accel__pages_resident(const void *p, size_t nbytes);

/* ---- Errors ---- */

/*
 * The error record of a handle. Every handle that reports errors (the accelerator) starts with
 * one, so base can record a failure on a handle whose layout it does not otherwise know.
 */
typedef struct accel__errbuf {
    accel_status status;
    char msg[ACCEL__ERRMSG_NBYTES];
} accel__errbuf;

/* Records status and message on the calling thread and, when acc is not NULL, on the handle
 * (whose first member is an accel__errbuf); returns st so that `return accel__seterr(acc,
 * ACCEL_EINVAL, "...")` reads naturally. The message is formatted into a local buffer first,
 * so an argument may be accel_last_error(NULL) itself (a message that wraps the last one). */
accel_status accel__seterr(accel *acc, accel_status st, const char *fmt, ...) ACCEL_PRINTF(3, 4);
accel_status accel__vseterr(accel *acc, accel_status st, const char *fmt, va_list ap);
/* Copies the thread's last error onto acc (after a call into a handle-less layer). */
accel_status accel__adopt_thread_error(accel *acc, accel_status st);
/* Before calling the user's code (callbacks that return a status): empties the thread's
 * message, so that accel__cause afterwards tells a message the callback set (through an accel
 * call that failed) from a stale one. */
void accel__clear_error(void);
/* The thread's message when something set one since accel__clear_error, else the text of st. */
const char *accel__cause(accel_status st);

/* ---- Versioned options structs (NCCL's config initialiser) ---- */

/*
 * Every public *_options struct starts with `uint32_t size, version`, filled by its _default().
 * ACCEL__OPTIONS_COPY(acc, who, type, dst, src, v1_last) is the one check of them: it brings
 * the caller's `src` (const type *; NULL leaves *dst alone) into `*dst`, which already holds
 * this build's defaults. A struct that did not come from the _default() (version 0, or size
 * short of the first version's layout, which ends at field v1_last) is ACCEL_EINVAL naming
 * `who` and the _default() to use; otherwise the fields the caller's build knew are copied, so
 * a program built against an older header leaves the newer fields at their defaults.
 */
accel_status accel__options_copy(accel *acc, const char *who, const char *type, void *dst,
                                 size_t dst_nbytes, const void *src, size_t v1_nbytes);
#define ACCEL__OPTIONS_COPY(acc, who, type, dst, src, v1_last)                                     \
    accel__options_copy((acc), (who), #type, (dst), sizeof(type), 1 ? (src) : (const type *)NULL,  \
                        offsetof(type, v1_last) + sizeof(((type *)NULL)->v1_last))

/* Propagate a failure (NCCLCHECK style). The callee has already set the message. */
#define ACCEL_TRY(call)                                                                            \
    do {                                                                                           \
        accel_status accel__st_ = (call);                                                          \
        if (accel__st_ != ACCEL_OK) {                                                              \
            return accel__st_;                                                                     \
        }                                                                                          \
    } while (0)

#define ACCEL_TRY_GOTO(call, st_var, label)                                                        \
    do {                                                                                           \
        (st_var) = (call);                                                                         \
        if ((st_var) != ACCEL_OK) {                                                                \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Internal invariants only, never runtime conditions (ggml's GGML_ASSERT). The hook (tests)
 * runs before the abort. */
typedef void (*accel__abort_hook)(const char *file, int line, const char *expr);
void accel__set_abort_hook(accel__abort_hook hook);
void accel__assert_fail(const char *file, int line, const char *expr);
#define ACCEL_ASSERT(x)                                                                            \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            accel__assert_fail(__FILE__, __LINE__, #x);                                            \
        }                                                                                          \
    } while (0)

/* ---- Logging: stderr only, "[rank r/N] accel LEVEL: ..." ---- */
typedef enum accel__log_level {
    ACCEL__LOG_DEBUG = 0,
    ACCEL__LOG_INFO = 1,
    ACCEL__LOG_WARN = 2,
    ACCEL__LOG_ERROR = 3,
    ACCEL__LOG_OFF = 4
} accel__log_level;

/* Where a line goes and what it is prefixed with: each accelerator (and each communicator,
 * which gets a copy) owns one, so two handles in one process log with their own rank and
 * level. rank < 0: no rank prefix. */
typedef struct accel__log_ctx {
    int rank, n_ranks;
    accel__log_level level;
} accel__log_ctx;

/* The context of code that has no handle: no rank, level from ACCEL_LOG_LEVEL (warn when
 * unset or malformed), read once. */
const accel__log_ctx *accel__log_default(void);
/* One line through lc (NULL = accel__log_default()), written with a single write(2) so
 * processes sharing a terminal never interleave mid-line. */
void accel__log(const accel__log_ctx *lc, accel__log_level level, const char *fmt, ...)
    ACCEL_PRINTF(3, 4);
int accel__log_enabled(const accel__log_ctx *lc, accel__log_level level);
/* Parses "debug|info|warn|warning|error|off" (any case) or 0-4. Returns -1 if not valid. */
int accel__log_parse_level(const char *s);

/* ---- Environment variables: one table (src/base/env.c), read once ---- */
typedef enum accel__env_type {
    ACCEL__ENV_INT,
    ACCEL__ENV_REAL,
    ACCEL__ENV_BOOL,
    ACCEL__ENV_STRING
} accel__env_type;

typedef struct accel__env_var {
    const char *name;
    accel__env_type type;
    const char *dflt; /* NULL: no default */
    const char *doc;
} accel__env_var;

/* The table, terminated by a {NULL} entry; `accel env` prints it. */
const accel__env_var *accel__env_table(void);

/* Typed getters. Each returns ACCEL_OK with *out set, ACCEL_ENOTFOUND when the variable is
 * unset or empty (*out untouched), or ACCEL_EINVAL naming the variable and its value when it
 * does not parse. `name` must be in the table (asserted) so that `accel env` lists it. */
accel_status accel__env_int(const char *name, long long *out);
accel_status accel__env_real(const char *name, double *out);
accel_status accel__env_bool(const char *name, int *out);
/* Borrowed from the environment. */
accel_status accel__env_string(const char *name, const char **out);

/* Parses a boolean the way Accelerate's str_to_bool does ("1/true/yes/y/on" and
 * "0/false/no/n/off", any case). Returns 1, 0 or -1 for invalid. */
int accel__parse_bool(const char *s);

/* ---- Clock ---- */

/* Monotonic seconds (CLOCK_MONOTONIC). */
double accel__now(void);

/* ---- Unguessable values ---- */

/* Fills buf with n bytes from the kernel's random source (getrandom), for values that must not
 * be guessable (job ids and nonces, shared-memory names). 0, or -1 if it failed. */
int accel__os_random(void *buf, size_t n);
/* 128 random bits as 32 lower-case hex digits and a NUL into out (nbytes >= 33). 0, or -1 if
 * nbytes is too small or the random source failed. */
int accel__random_hex(char *out, size_t nbytes);

/* ---- Hashing ---- */

/* 64-bit FNV-1a of nbytes at p, or of a NUL-terminated string: unseeded (the same value in every
 * process), for tables and digests, not for anything an adversary chooses. */
uint64_t accel__fnv1a(const void *p, size_t nbytes);
uint64_t accel__fnv1a_str(const char *s);

/* ---- Messages ---- */

/* A shape for messages, "[768, 3072]" (truncated to fit buf). Returns buf. */
const char *accel__shape_str(char *buf, size_t nbytes, int ndim, const int64_t *shape);

/* ---- Device work ordering, shared by comm and device ---- */

/* A device stream and an event on it, defined by the device implementation (src/device/).
 * NULL everywhere means "the host, in program order": host backends and the CPU device never
 * need one. */
typedef struct accel__stream accel__stream;
typedef struct accel__event accel__event;

#endif /* ACCEL_BASE_H */
