/*
 * accel/status.h - status codes shared by every accel header.
 *
 * Every accel call that can fail returns an accel_status; ACCEL_OK is 0 and every error is
 * negative, so `if (st)` and `if (st < 0)` both test for failure. The table below is the one
 * source of the names and descriptions (libuv's UV_ERRNO_MAP idea): add a code here and
 * accel_status_name / accel_status_str follow.
 */
#ifndef ACCEL_STATUS_H
#define ACCEL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Symbol export: the shared library is built with -fvisibility=hidden. */
#if defined(ACCEL_BUILDING) && defined(__GNUC__)
#define ACCEL_API __attribute__((visibility("default")))
#else
#define ACCEL_API
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

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_STATUS_H */
