/*
 * Error reporting: the last status and message per handle and per thread. A failing function
 * writes both so that accel_last_error works with or without a handle (accel_init has none
 * yet). A handle's record is its first member (accel__errbuf), the only thing base knows of
 * it. Also the assertion hook for internal invariants.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static _Thread_local accel_status thread_status;
static _Thread_local char thread_msg[ACCEL__ERRMSG_NBYTES];

static accel__errbuf *errbuf_of(const accel *acc)
{
    return (accel__errbuf *)acc;
}

accel_status accel__vseterr(accel *acc, accel_status st, const char *fmt, va_list ap)
{
    /* Format first, copy after: callers wrap the previous message by passing
     * accel_last_error(NULL), which is thread_msg itself. */
    char msg[ACCEL__ERRMSG_NBYTES];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    thread_status = st;
    memcpy(thread_msg, msg, sizeof(thread_msg));
    if (acc != NULL) {
        accel__errbuf *e = errbuf_of(acc);
        e->status = st;
        memcpy(e->msg, msg, sizeof(e->msg));
    }
    accel__log(NULL, ACCEL__LOG_DEBUG, "%s: %s", accel_status_name(st), msg);
    return st;
}

accel_status accel__seterr(accel *acc, accel_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    accel__vseterr(acc, st, fmt, ap);
    va_end(ap);
    return st;
}

accel_status accel__adopt_thread_error(accel *acc, accel_status st)
{
    if (acc != NULL && st != ACCEL_OK) {
        accel__errbuf *e = errbuf_of(acc);
        e->status = st;
        memcpy(e->msg, thread_msg, sizeof(e->msg));
    }
    return st;
}

void accel__clear_error(void)
{
    thread_msg[0] = '\0';
}

const char *accel__cause(accel_status st)
{
    return thread_msg[0] != '\0' ? thread_msg : accel_status_str(st);
}

const char *accel_last_error(const accel *acc)
{
    return acc != NULL ? errbuf_of(acc)->msg : thread_msg;
}

accel_status accel_last_status(const accel *acc)
{
    return acc != NULL ? errbuf_of(acc)->status : thread_status;
}

static accel__abort_hook abort_hook;

void accel__set_abort_hook(accel__abort_hook hook)
{
    abort_hook = hook;
}

void accel__assert_fail(const char *file, int line, const char *expr)
{
    if (abort_hook != NULL) {
        abort_hook(file, line, expr);
    }
    fprintf(stderr, "accel: internal assertion failed at %s:%d: %s\n", file, line, expr);
    abort();
}

accel_status accel__options_copy(accel *acc, const char *who, const char *type, void *dst,
                                 size_t dst_nbytes, const void *src, size_t v1_nbytes)
{
    if (src == NULL) {
        return ACCEL_OK;
    }
    /* Every options struct starts with these two fields, so they can be read untyped. */
    uint32_t head[2];
    memcpy(head, src, sizeof(head));
    if (head[0] < v1_nbytes || head[1] == 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: options (size %u, version %u) were not made by %s_default()", who,
                             (unsigned)head[0], (unsigned)head[1], type);
    }
    memcpy(dst, src, head[0] < dst_nbytes ? head[0] : dst_nbytes);
    return ACCEL_OK;
}
