/*
 * The profiler's public face (accel/track.h): sessions of the accelerator's trace recorder
 * (base/trace.c) opened by accel_profile_begin and written by accel_profile_end into
 * <dir>/profile_<rank>.json, and the user's own ranges. The recorder lives as long as the
 * accelerator (created by accel_init, handed to the communicator), so no thread ever records
 * into a freed one.
 */
#include <stdio.h>
#include <string.h>

#include "base/fs.h"
#include "profile.h"

accel_status accel_profile_begin(accel *acc, const char *dir)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_profile_begin: acc is NULL");
    }
    if (accel__trace_on(acc->trace)) {
        return accel__seterr(acc, ACCEL_ESTATE,
                             "accel_profile_begin: a profiler session is already open");
    }
    if (dir == NULL) {
        dir = acc->opt.logging_dir ? acc->opt.logging_dir
                                   : (acc->opt.project_dir ? acc->opt.project_dir : ".");
    }
    if (accel__mkdirs(dir) != ACCEL_OK) {
        return accel__adopt_thread_error(acc, ACCEL_EIO);
    }
    char name[64];
    snprintf(name, sizeof(name), "profile_%d.json", acc->rank);
    char *path = accel__path_join(dir, name);
    if (path == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_profile_begin: out of memory");
    }
    accel_status st = accel__trace_start(acc->trace);
    if (st != ACCEL_OK) {
        accel__free(path);
        return accel__adopt_thread_error(acc, st);
    }
    accel__free(acc->profile_path);
    acc->profile_path = path;
    return ACCEL_OK;
}

/* Closes the session and writes the file; the caller decides about the barrier. */
static accel_status finish(accel *acc)
{
    accel_status st = accel__trace_stop(acc->trace, acc->profile_path, acc->rank);
    return accel__adopt_thread_error(acc, st);
}

accel_status accel_profile_end(accel *acc)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_profile_end: acc is NULL");
    }
    if (!accel__trace_on(acc->trace)) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_profile_end: no profiler session is open");
    }
    accel_status st = finish(acc);
    /* Accelerate's profile() waits for everyone after writing, so no process moves on (and,
     * say, deletes the folder) while another is still writing. */
    if (acc->n_ranks > 1) {
        accel_status bst = accel_wait_for_everyone(acc);
        if (st == ACCEL_OK) {
            st = bst;
        }
    }
    return st;
}

void accel__profile_finish_local(accel *acc)
{
    if (acc != NULL && accel__trace_on(acc->trace) && finish(acc) != ACCEL_OK) {
        accel__log(&acc->log, ACCEL__LOG_WARN, "profiler: %s", accel_last_error(acc));
    }
}

int accel_profile_active(const accel *acc)
{
    return acc != NULL && accel__trace_on(acc->trace);
}

void accel_profile_push(accel *acc, const char *name)
{
    accel__prof_begin(acc, name ? name : "(null)", ACCEL__PROF_USER);
}

void accel_profile_push_cat(accel *acc, const char *name, const char *category)
{
    accel__prof_begin(acc, name ? name : "(null)", category ? category : ACCEL__PROF_USER);
}

void accel_profile_pop(accel *acc)
{
    accel__prof_end(acc);
}
