/*
 * accel_prepare with resume_from_checkpoint (accel_options): the public entry of prepare lives
 * here, above core, because resuming is a checkpoint load and core cannot call ckpt. The
 * objects are prepared by core (accel__prepare_objects); then, at the first accel_prepare of
 * the accelerator only, the checkpoint is loaded into them. Invariant: every process takes the
 * same branch, since accel_load_state agrees on its outcome across processes.
 */
#include <string.h>

#include "accel/ckpt.h"
#include "core/internal.h"
#include "core/settings.h"

accel_status accel_prepare_objects(accel *acc, int n, void *const *objs)
{
    ACCEL_TRY(accel__prepare_objects(acc, n, objs));
    if (!acc->resume_pending) {
        return ACCEL_OK;
    }
    acc->resume_pending = 0;
    const char *what = acc->settings->ckpt.resume_from_checkpoint;
    int latest = strcmp(what, "latest") == 0;
    accel_status st = accel_load_state(acc, latest ? NULL : what);
    if (st == ACCEL_ENOTFOUND && latest) {
        /* A first start: nothing to continue from. */
        accel__log(&acc->log, ACCEL__LOG_INFO,
                   "resume_from_checkpoint=latest: no checkpoint in %s/checkpoints yet, starting "
                   "from the beginning",
                   acc->settings->ckpt.project_dir);
        return ACCEL_OK;
    }
    if (st == ACCEL_OK) {
        accel__log(&acc->log, ACCEL__LOG_INFO, "resumed from %s", accel_checkpoint_dir(acc));
    }
    return st;
}
