/*
 * Internal profiler ranges for accel's own phases, recorded into the Chrome trace that
 * accel_profile_begin/end (accel/track.h) writes as profile_<rank>.json.
 *
 *     accel__prof_begin(acc, "backward", ACCEL__PROF_NN);
 *     ...
 *     accel__prof_end(acc);
 *
 * Cost when no session is open: one relaxed load of a process-wide flag and a not-taken branch
 * (the calls are static inline). When a session is open each range takes a mutex once, at its
 * end. Thread-safe: ranges nest per thread (up to 32 deep) and every thread appears as its own
 * track (tid); the communication thread records bucket all-reduces this way.
 *
 * `acc` may be NULL in code that has no accelerator (the communication thread): the range then
 * goes to the session most recently begun in this process (there is normally one accelerator
 * per process). Such callers must be stopped before accel_free.
 *
 * `name` is copied (first 63 characters); `cat` must be a string literal (stored by pointer).
 * A range begun before accel_profile_begin or left open across accel_profile_end is dropped.
 */
#ifndef ACCEL_CORE_PROFILE_H
#define ACCEL_CORE_PROFILE_H

#include "internal.h"

/* Categories used by accel's modules (the "cat" field; Perfetto can filter on it). */
#define ACCEL__PROF_NN "nn"       /* forward, backward */
#define ACCEL__PROF_COMM "comm"   /* bucket all-reduce, broadcasts, barriers */
#define ACCEL__PROF_DATA "data"   /* waiting for a batch */
#define ACCEL__PROF_OPTIM "optim" /* optimizer step, clipping, zero_grad */
#define ACCEL__PROF_CKPT "ckpt"   /* checkpoint writes and reads */
#define ACCEL__PROF_USER "user"   /* accel_profile_push/pop */

/* Nonzero while a profiler session is open in this process. Read through the inlines. */
extern int accel__prof_on;

void accel__prof_begin_slow(accel *acc, const char *name, const char *cat, const char *arg_name,
                            long long arg);
void accel__prof_end_slow(accel *acc);
/* A span measured by the caller, in accel__now() seconds (e.g. timed on another thread). */
void accel__prof_span_slow(accel *acc, const char *name, const char *cat, double t0, double t1,
                           const char *arg_name, long long arg);

static inline int accel__prof_enabled(void)
{
    return __builtin_expect(__atomic_load_n(&accel__prof_on, __ATOMIC_RELAXED) != 0, 0);
}

/* Opens a range on the calling thread. */
static inline void accel__prof_begin(accel *acc, const char *name, const char *cat)
{
    if (accel__prof_enabled()) {
        accel__prof_begin_slow(acc, name, cat, NULL, 0);
    }
}

/* Opens a range with one integer argument shown in the trace ("bucket": 3). arg_name must be a
 * string literal. */
static inline void accel__prof_begin_arg(accel *acc, const char *name, const char *cat,
                                         const char *arg_name, long long arg)
{
    if (accel__prof_enabled()) {
        accel__prof_begin_slow(acc, name, cat, arg_name, arg);
    }
}

/* Closes the innermost range of the calling thread. */
static inline void accel__prof_end(accel *acc)
{
    if (accel__prof_enabled()) {
        accel__prof_end_slow(acc);
    }
}

static inline void accel__prof_span(accel *acc, const char *name, const char *cat, double t0,
                                    double t1, const char *arg_name, long long arg)
{
    if (accel__prof_enabled()) {
        accel__prof_span_slow(acc, name, cat, t0, t1, arg_name, arg);
    }
}

/* Closes an open session of acc and writes its file without the cross-process barrier
 * (accel_end_training, accel_free). No-op without a session. */
void accel__profile_finish_local(accel *acc);

/* Test hook: replaces the progress bar's clock (NULL restores accel__now). */
void accel__progress_set_clock(double (*now)(void));

#endif /* ACCEL_CORE_PROFILE_H */
