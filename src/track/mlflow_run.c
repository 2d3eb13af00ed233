/*
 * The "mlflow" tracker's runs that go on (mlflow_internal.h): continuing an existing run
 * (MLFLOW_RUN_ID, as MLflow's start_run(run_id=...)), resuming (the new run gives way to the
 * newest earlier one of its name, whose histories are cut back to the resumed step), and the
 * run lock that keeps a second job off a run while this one writes it. Invariant: this process
 * continues, moves files into or cuts back a run only while it holds that run's lock (where the
 * file system has locks).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "mlflow_internal.h"
#include "track_internal.h"

/* Replaces *dst by a copy of src; 0 on success. */
static int set_str(char **dst, const char *src)
{
    char *c = accel__strdup(src);
    if (c == NULL) {
        return -1;
    }
    accel__free(*dst);
    *dst = c;
    return 0;
}

/* Continues the existing run <root>/<exp_id>/<run_id>, as MLflow's start_run(run_id=...)
 * does: its name, start time and artifact location stay, its status becomes RUNNING again. */
accel_status accel__mlflow_continue_run(accel__mlflow_state *s, const char *exp_id,
                                        const char *run_id)
{
    char rel[256], name[512], start[32], uri[2048];
    snprintf(rel, sizeof(rel), "%s/%s", exp_id, run_id);
    char *dir = accel__path_join(s->root, rel);
    if (dir == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    if (accel__mlflow_read_meta(dir, "run_name", name, sizeof(name)) != 0 ||
        accel__mlflow_read_meta(dir, "start_time", start, sizeof(start)) != 0 ||
        accel__mlflow_read_meta(dir, "artifact_uri", uri, sizeof(uri)) != 0) {
        accel_status st = accel_tracker_seterr(ACCEL_ECORRUPT,
                                               "%s/meta.yaml lacks run_name, start_time or "
                                               "artifact_uri: not an MLflow run",
                                               dir);
        accel__free(dir);
        return st;
    }
    accel__free(s->common.run_dir);
    s->common.run_dir = dir;
    if (set_str(&s->exp_id, exp_id) || set_str(&s->run_id, run_id) || set_str(&s->run_name, name) ||
        set_str(&s->artifact_uri, uri)) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    s->start_ms = strtoll(start, NULL, 10);
    s->continued = 1;
    return accel__mlflow_write_run_meta(s, 1, -1);
}

/* Takes the lock of run exp_id/run_id into *l, so that no other job continues (resume,
 * MLFLOW_RUN_ID) a run while this one writes it: their metric lines would interleave, and the
 * resume would cut the live run's history. Next to the run's folder, which MLflow reads. */
accel_status accel__mlflow_lock_run(const accel__mlflow_state *s, accel__lockfile *l,
                                    const char *exp_id, const char *run_id, const char *advice)
{
    char rel[256], what[160];
    snprintf(rel, sizeof(rel), "%s/.%s.lock", exp_id, run_id);
    snprintf(what, sizeof(what), "MLflow run %s", run_id);
    char *path = accel__path_join(s->root, rel);
    accel_status st = path ? accel__track_lock(l, path, what, advice)
                           : accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    accel__free(path);
    return st;
}

/* A run id names a folder: letters and digits only. */
static int valid_run_id(const char *id)
{
    size_t n = strlen(id);
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)id[i])) {
            return 0;
        }
    }
    return n > 0 && n < 64;
}

/* The experiment holding run `run_id` under root, into exp_id. Returns 1 when found. An id
 * that is not a folder name (MLFLOW_RUN_ID="../x") is never found. */
int accel__mlflow_find_run(const char *root, const char *run_id, char *exp_id, size_t cap)
{
    if (!valid_run_id(run_id)) {
        return 0;
    }
    DIR *d = opendir(root);
    int found = 0;
    struct dirent *e;
    while (d != NULL && !found && (e = readdir(d)) != NULL) {
        char rel[512];
        snprintf(rel, sizeof(rel), "%s/%s", e->d_name, run_id);
        char *dir = e->d_name[0] != '.' ? accel__path_join(root, rel) : NULL;
        char name[8];
        size_t len = strlen(e->d_name);
        if (dir != NULL && len < cap &&
            accel__mlflow_read_meta(dir, "run_id", name, sizeof(name)) == 0) {
            memcpy(exp_id, e->d_name, len + 1);
            found = 1;
        }
        accel__free(dir);
    }
    if (d != NULL) {
        closedir(d);
    }
    return found;
}

/* The newest other active run of this run's experiment with this run's name (by start time),
 * into out. Returns 1 when there is one. */
static int find_previous_run(const accel__mlflow_state *s, char *out, size_t cap)
{
    char *exp_dir = accel__path_join(s->root, s->exp_id);
    DIR *d = exp_dir ? opendir(exp_dir) : NULL;
    long long best = -1;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, s->run_id) == 0 || !valid_run_id(e->d_name) ||
            strlen(e->d_name) >= cap) {
            continue;
        }
        char *dir = accel__path_join(exp_dir, e->d_name);
        char name[512], stage[32], start[32];
        if (dir != NULL && accel__mlflow_read_meta(dir, "run_name", name, sizeof(name)) == 0 &&
            strcmp(name, s->run_name) == 0 &&
            accel__mlflow_read_meta(dir, "lifecycle_stage", stage, sizeof(stage)) == 0 &&
            strcmp(stage, "active") == 0 &&
            accel__mlflow_read_meta(dir, "start_time", start, sizeof(start)) == 0 &&
            strtoll(start, NULL, 10) > best) {
            best = strtoll(start, NULL, 10);
            memcpy(out, e->d_name, strlen(e->d_name) + 1);
        }
        accel__free(dir);
    }
    if (d != NULL) {
        closedir(d);
    }
    accel__free(exp_dir);
    return best >= 0;
}

/* Calls fn(path, rel, ctx) for every regular file under dir (rel: its path below dir). */
typedef accel_status (*file_fn)(const char *path, const char *rel, void *ctx);

static accel_status walk_files(const char *dir, const char *rel, file_fn fn, void *ctx)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return errno == ENOENT
                   ? ACCEL_OK
                   : accel_tracker_seterr(ACCEL_EIO, "cannot list %s: %s", dir, strerror(errno));
    }
    accel_status st = ACCEL_OK;
    struct dirent *e;
    while (st == ACCEL_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        char sub[1024];
        int w = snprintf(sub, sizeof(sub), "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        char *path = accel__path_join(dir, e->d_name);
        if (w < 0 || (size_t)w >= sizeof(sub)) { /* a cut name would move the file elsewhere */
            st = accel_tracker_seterr(ACCEL_EINVAL, "path too long under %s: %s", dir, e->d_name);
        } else if (path == NULL) {
            st = accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
        } else if (accel__is_dir(path)) {
            st = walk_files(path, sub, fn, ctx);
        } else if (accel__is_file(path)) {
            st = fn(path, sub, ctx);
        }
        accel__free(path);
    }
    closedir(d);
    return st;
}

/* walk_files: moves a file to the same relative place under the folder ctx. */
static accel_status move_file(const char *path, const char *rel, void *ctx)
{
    char *dst = accel__path_join(ctx, rel);
    if (dst == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    char *slash = strrchr(dst, '/');
    *slash = '\0';
    accel_status st = accel__mkdirs(dst);
    *slash = '/';
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    } else if (rename(path, dst) != 0) {
        st =
            accel_tracker_seterr(ACCEL_EIO, "cannot move %s to %s: %s", path, dst, strerror(errno));
    }
    accel__free(dst);
    return st;
}

/* walk_files: rewrites a metric history ("<ms> <value> <step>" lines) without the lines at
 * steps >= *(long long *)ctx, atomically. */
static accel_status drop_later_steps(const char *path, const char *rel, void *ctx)
{
    (void)rel;
    long long from = *(const long long *)ctx;
    char *text = NULL;
    size_t n = 0, out = 0;
    accel_status st = accel__read_file(path, &text, &n);
    if (st != ACCEL_OK) {
        return accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
    for (size_t at = 0; at < n;) {
        char *nl = memchr(text + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (text + at)) + 1 : n - at;
        long long ts, step;
        double v;
        char tail;
        /* Unparsable lines are kept; the value may be "nan" or "inf" (strtod reads both). */
        int keep =
            nl != NULL &&
            (sscanf(text + at, "%lld %lf %lld%c", &ts, &v, &step, &tail) != 4 || step < from);
        if (keep) {
            memmove(text + out, text + at, len);
            out += len;
        }
        at += len;
    }
    if (out != n) {
        st = accel__write_file_atomic(path, text, out);
        if (st != ACCEL_OK) {
            accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        }
    }
    accel__free(text);
    return st;
}

/*
 * Resuming: unless the run already continues an earlier one (MLFLOW_RUN_ID), the run just
 * created gives way to the newest earlier run of the same name in the experiment (its params
 * move over, the new folder goes), and the metric histories lose their lines at steps >= step.
 */
accel_status accel__mlflow_resume(void *state, long long step)
{
    accel__mlflow_state *s = state;
    char prev[128];
    if (!s->continued && find_previous_run(s, prev, sizeof(prev))) {
        /* The newest run of this name may be another job's, alive: then this run stays new. */
        accel__lockfile prev_lock;
        ACCEL_TRY(
            accel__mlflow_lock_run(s, &prev_lock, s->exp_id, prev,
                                   ", the newest run of this name: this run stays a new one"));
        char *fresh = s->common.run_dir;
        s->common.run_dir = NULL;
        accel_status st = accel__mlflow_continue_run(s, s->exp_id, prev);
        char *from = accel__path_join(fresh, "params"), *to = NULL;
        if (st == ACCEL_OK) {
            to = accel__path_join(s->common.run_dir, "params");
            st = from && to ? walk_files(from, "", move_file, to)
                            : accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
        }
        if (st == ACCEL_OK && accel__rmtree(fresh) != ACCEL_OK) {
            st = accel_tracker_seterr(ACCEL_EIO, "%s", accel_last_error(NULL));
        }
        accel__free(from);
        accel__free(to);
        if (s->common.run_dir == NULL) { /* the continuation failed early: keep the new run */
            s->common.run_dir = fresh;
            accel__lockfile_release(&prev_lock);
        } else {
            accel__free(fresh);
            accel__lockfile_release(&s->lock);
            s->lock = prev_lock;
        }
        ACCEL_TRY(st);
        accel__mlflow_log_run(s, "resumed: continuing");
    }
    char *metrics = accel__path_join(s->common.run_dir, "metrics");
    accel_status st = metrics ? walk_files(metrics, "", drop_later_steps, &step)
                              : accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    accel__free(metrics);
    return st;
}
