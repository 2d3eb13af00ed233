/*
 * accel's own profiler ranges, recorded into the accelerator's trace recorder (base/trace.h)
 * that accel_profile_begin/end (accel/track.h) open and write as profile_<rank>.json.
 *
 *     accel__prof_begin(acc, "backward", ACCEL__PROF_NN);
 *     ...
 *     accel__prof_end(acc);
 *
 * Cost when no session is open: one relaxed load and a not-taken branch (all inline).
 */
#ifndef ACCEL_CORE_PROFILE_H
#define ACCEL_CORE_PROFILE_H

#include "base/trace.h"
#include "internal.h"

static inline accel__trace *accel__trace_of(const accel *acc)
{
    return acc != NULL ? acc->trace : NULL;
}

static inline void accel__prof_begin(accel *acc, const char *name, const char *cat)
{
    accel__trace_begin(accel__trace_of(acc), name, cat, NULL, 0);
}

/* With one integer argument shown in the trace ("bucket": 3); arg_name a string literal. */
static inline void accel__prof_begin_arg(accel *acc, const char *name, const char *cat,
                                         const char *arg_name, long long arg)
{
    accel__trace_begin(accel__trace_of(acc), name, cat, arg_name, arg);
}

static inline void accel__prof_end(accel *acc)
{
    accel__trace_end(accel__trace_of(acc));
}

static inline void accel__prof_span(accel *acc, const char *name, const char *cat, double t0,
                                    double t1, const char *arg_name, long long arg)
{
    accel__trace_span(accel__trace_of(acc), name, cat, t0, t1, arg_name, arg);
}

/* Closes an open session of acc and writes its file without the cross-process barrier
 * (accel_end_training, accel_free). No-op without a session. */
void accel__profile_finish_local(accel *acc);

/* Test hook: replaces the progress bar's clock (NULL restores accel__now). */
void accel__progress_set_clock(double (*now)(void));

#endif /* ACCEL_CORE_PROFILE_H */
