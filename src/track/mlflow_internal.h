/*
 * The "mlflow" tracker's two files (private to src/track): mlflow.c starts a run, writes its
 * params, metrics and tags and finishes it; mlflow_run.c continues an existing run
 * (MLFLOW_RUN_ID, resume) and holds the lock that keeps a second job off a run. See mlflow.c
 * for the file store's layout.
 */
#ifndef ACCEL_TRACK_MLFLOW_INTERNAL_H
#define ACCEL_TRACK_MLFLOW_INTERNAL_H

#include <stddef.h>

#include "accel/status.h"
#include "base/fs.h"
#include "track_internal.h"

/* One run being written; owned by the tracker's state pointer, freed by mlflow.c. */
typedef struct accel__mlflow_state {
    accel__track_common common; /* run_dir: the run folder */
    char *root;                 /* the store root */
    int continued;              /* an earlier run is continued (MLFLOW_RUN_ID or resume) */
    char *exp_id;
    char *run_id;
    char *artifact_uri;
    char *run_name;
    long long start_ms;
    char *user;           /* the run's user tag (USER, read by accel_init) */
    accel__lockfile lock; /* "<experiment>/.<run id>.lock" of the run written */
} accel__mlflow_state;

/* ---- mlflow.c ---- */

/* Reads "<field>: ..." from the meta.yaml in dir into out[cap] (unquoted). Returns 0 if found,
 * -1 otherwise. */
int accel__mlflow_read_meta(const char *dir, const char *field, char *out, size_t cap);
/* Writes the run's meta.yaml atomically with status (1 RUNNING, 3 FINISHED) and end_ms (< 0:
 * null). Sets the tracker message on failure. */
accel_status accel__mlflow_write_run_meta(accel__mlflow_state *s, int status, long long end_ms);
/* Logs where the run lives (`how`: "started", "continuing", ...) and how MLflow opens it. */
void accel__mlflow_log_run(const accel__mlflow_state *s, const char *how);

/* ---- mlflow_run.c ---- */

/* The experiment holding run `run_id` (a valid id: letters and digits) under root, into
 * exp_id[cap]. Returns 1 when found, 0 otherwise (an invalid id included). */
int accel__mlflow_find_run(const char *root, const char *run_id, char *exp_id, size_t cap);
/* Takes the lock of run exp_id/run_id into *l (accel__track_lock, `advice` after its message),
 * so that no other job continues the run while this one writes it. */
accel_status accel__mlflow_lock_run(const accel__mlflow_state *s, accel__lockfile *l,
                                    const char *exp_id, const char *run_id, const char *advice);
/* Makes s continue the existing run <root>/<exp_id>/<run_id>: its name, start time and
 * artifact location stay, its status becomes RUNNING again. s->common.run_dir is replaced only
 * once the run's meta.yaml has been read (on an earlier failure it is left as it was). */
accel_status accel__mlflow_continue_run(accel__mlflow_state *s, const char *exp_id,
                                        const char *run_id);
/* The tracker's resume hook (accel_tracker_ops.resume): see mlflow_run.c. */
accel_status accel__mlflow_resume(void *state, long long step);

#endif
