/*
 * The trace recorder behind the profiler timeline: complete ("X") events recorded per thread
 * while a session is open, written as a Chrome trace (Perfetto, chrome://tracing) with
 * timestamps in microseconds of CLOCK_MONOTONIC, so the files of the processes of one machine
 * line up when opened together.
 *
 * One recorder per accelerator; the communicator gets the same pointer, so its progress thread
 * records bucket all-reduces on its own track (tid). Cost when no session is open: one relaxed
 * load and a not-taken branch (the checks are inline). When a session is open each range takes
 * the recorder's mutex once, at its end. Ranges nest per thread (up to 32 deep); a range
 * straddling start/stop is dropped rather than mismatched.
 */
#ifndef ACCEL_BASE_TRACE_H
#define ACCEL_BASE_TRACE_H

#include "base.h"

/* Categories used by accel's modules (the "cat" field; Perfetto can filter on it). */
#define ACCEL__PROF_NN "nn"       /* forward, backward */
#define ACCEL__PROF_COMM "comm"   /* bucket all-reduce, broadcasts, barriers */
#define ACCEL__PROF_DATA "data"   /* waiting for a batch */
#define ACCEL__PROF_OPTIM "optim" /* optimizer step, clipping, zero_grad */
#define ACCEL__PROF_CKPT "ckpt"   /* checkpoint writes and reads */
#define ACCEL__PROF_USER "user"   /* accel_profile_push/pop */

typedef struct accel__trace accel__trace;

/* A recorder with no session open. Returns ACCEL_OK or ACCEL_ENOMEM. */
accel_status accel__trace_new(accel__trace **out);
/* Accepts NULL. No thread may be recording into it any more. */
void accel__trace_free(accel__trace *t);

/* Opens a session (events recorded from now on); ACCEL_ESTATE when one is open. */
accel_status accel__trace_start(accel__trace *t);
/* Closes the session and writes its events to `path` atomically (temporary file, fsync,
 * rename), `pid` naming the process track ("rank <pid>"). ACCEL_ESTATE without a session,
 * ACCEL_EIO naming the file. The events are dropped either way. */
accel_status accel__trace_stop(accel__trace *t, const char *path, int pid);

/* Out-of-line halves of the inline calls below. */
void accel__trace_begin_slow(accel__trace *t, const char *name, const char *cat,
                             const char *arg_name, long long arg);
void accel__trace_end_slow(accel__trace *t);
void accel__trace_span_slow(accel__trace *t, const char *name, const char *cat, double t0,
                            double t1, const char *arg_name, long long arg);

/* Nonzero while a session is open on t (NULL: never). The recorder's first member is this
 * flag, which is what lets the check stay inline. */
static inline int accel__trace_on(const accel__trace *t)
{
    return t != NULL && __builtin_expect(__atomic_load_n((const int *)t, __ATOMIC_RELAXED), 0);
}

/* Opens a range on the calling thread; arg_name (a string literal, may be NULL) labels one
 * integer argument shown in the trace ("bucket": 3). */
static inline void accel__trace_begin(accel__trace *t, const char *name, const char *cat,
                                      const char *arg_name, long long arg)
{
    if (accel__trace_on(t)) {
        accel__trace_begin_slow(t, name, cat, arg_name, arg);
    }
}

/* Ranges the calling thread has open (recorded or not): a range begun while a session was
 * open must be closed even after the session stopped, or the thread's stack would leak. */
extern _Thread_local int accel__trace_depth;

/* Closes the innermost range of the calling thread. */
static inline void accel__trace_end(accel__trace *t)
{
    if (accel__trace_depth > 0 || accel__trace_on(t)) {
        accel__trace_end_slow(t);
    }
}

/* A span measured by the caller, in accel__now() seconds (e.g. timed on another thread). */
static inline void accel__trace_span(accel__trace *t, const char *name, const char *cat,
                                     double t0, double t1, const char *arg_name, long long arg)
{
    if (accel__trace_on(t)) {
        accel__trace_span_slow(t, name, cat, t0, t1, arg_name, arg);
    }
}

#endif /* ACCEL_BASE_TRACE_H */
