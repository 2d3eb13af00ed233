/*
 * accel/status.h - status codes, the last error and the allocator hook, shared by every accel
 * header.
 *
 * Every accel call that can fail returns an accel_status; ACCEL_OK is 0 and every error is
 * negative, so `if (st)` and `if (st < 0)` both test for failure. The table below is the one
 * source of the names and descriptions (libuv's UV_ERRNO_MAP idea): add a code here and
 * accel_status_name / accel_status_str follow.
 */
#ifndef ACCEL_STATUS_H
#define ACCEL_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Symbol export: the shared library is built with -fvisibility=hidden. */
#if defined(ACCEL_BUILDING) && defined(__GNUC__)
#define ACCEL_API __attribute__((visibility("default")))
#else
#define ACCEL_API
#endif

/* Marks a printf-like declaration (format string at argument fmt_idx, values from args_idx) so
 * that GCC and Clang check the caller's format string. */
#if defined(__GNUC__)
#define ACCEL_PRINTF(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define ACCEL_PRINTF(fmt_idx, args_idx)
#endif

/* X(name, value, description) */
#define ACCEL_STATUS_MAP(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EIO, -3, "input/output error")                                                               \
    X(ECORRUPT, -4, "corrupt or malformed data")                                                   \
    X(EPEER, -5, "a peer process failed")                                                          \
    X(ETIMEDOUT, -6, "timed out")                                                                  \
    X(EUNSUPPORTED, -7, "not supported")                                                           \
    X(ESTATE, -8, "call not valid in the current state")                                           \
    X(ENOTFOUND, -9, "not found")                                                                  \
    X(EOF, -10, "end of data")                                                                     \
    X(EINTERNAL, -11, "internal error")

typedef enum accel_status {
#define ACCEL__STATUS_ENUM(name, value, desc) ACCEL_##name = value,
    ACCEL_STATUS_MAP(ACCEL__STATUS_ENUM)
#undef ACCEL__STATUS_ENUM
} accel_status;

/* The enum name without prefix ("EPEER"), or "UNKNOWN" for a value outside the table.
 * Returns a static string. Thread-safe. */
ACCEL_API const char *accel_status_name(accel_status st);

/* A one-line description ("a peer process failed"), or "unknown status". Returns a static
 * string. Thread-safe. */
ACCEL_API const char *accel_status_str(accel_status st);

/* The accelerator and the model, which most headers name, declared here once: C99, all that
 * these headers need (the library itself is C11), does not allow repeating a typedef. */
typedef struct accel accel;
typedef struct accel_model accel_model;

/*
 * The message of the last failure: on `acc` when acc != NULL, else of the calling thread
 * (which also sees failures of accel_init and of calls that take no accelerator). Never NULL
 * ("" when nothing failed). Valid until the next accel call on the same handle or thread.
 */
ACCEL_API const char *accel_last_error(const accel *acc);

/* Status of the last failure on `acc` (or on the thread when NULL); ACCEL_OK if none. */
ACCEL_API accel_status accel_last_status(const accel *acc);

/*
 * Replaces the allocator behind every allocation accel makes (libuv's uv_replace_allocator),
 * for programs that account or pool memory. Call it before any other accel function, once:
 * memory allocated before is released with the functions in place when it was allocated only
 * if they are the same. realloc_fn(NULL, n) must behave as malloc_fn(n); calloc_fn(n, size)
 * must zero-fill. Returns ACCEL_OK, or ACCEL_EINVAL when a function is NULL (nothing changes).
 * Not thread-safe.
 */
typedef void *(*accel_malloc_fn)(size_t nbytes);
typedef void *(*accel_realloc_fn)(void *p, size_t nbytes);
typedef void *(*accel_calloc_fn)(size_t count, size_t nbytes);
typedef void (*accel_free_fn)(void *p);
ACCEL_API accel_status accel_replace_allocator(accel_malloc_fn malloc_fn,
                                               accel_realloc_fn realloc_fn,
                                               accel_calloc_fn calloc_fn, accel_free_fn free_fn);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_STATUS_H */
