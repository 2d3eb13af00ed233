/*
 * The tracker registry and Accelerate's tracking flow: init_trackers (main process only),
 * log, get_tracker, end_training. Started trackers live in the accelerator's ACCEL__MOD_TRACK
 * slot and are finished when it is freed.
 *
 * Invariants: every check that can reject log_with (unknown name, missing directory) runs on
 * every process before any tracker starts, so all processes fail or succeed together; after a
 * successful start a tracker's failures are warnings, never errors, because a full disk must
 * not kill a week-long training run.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "core/profile.h"
#include "core/settings.h"
#include "track_internal.h"

#define MAX_TRACKERS 32
#define FAIL_WARN_MAX 3 /* per tracker: further write failures are counted, not printed */

typedef struct reg_entry {
    accel_tracker_ops ops;
    char *name; /* owned copy; ops.name points here */
    int builtin;
} reg_entry;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static reg_entry registry[MAX_TRACKERS];
static int n_registry;
static int builtins_added;

struct accel_tracker {
    accel_tracker_ops ops;
    char name[64];
    void *state;
    int builtin;
    long long failures;
};

typedef struct track_state {
    const accel__log_ctx *log; /* the accelerator's, for the trackers' own lines */
    accel_tracker trackers[MAX_TRACKERS];
    int n;
    int logged; /* accel_log was called since accel_init_trackers (resume is then too late) */
} track_state;

static accel_tracker blank_tracker = {.name = "blank"};

/* ---- callback error messages ---- */

static _Thread_local int cb_msg_set;
static _Thread_local char cb_msg[512];

accel_status accel_tracker_seterr(accel_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb_msg, sizeof(cb_msg), fmt, ap);
    va_end(ap);
    cb_msg_set = 1;
    return st;
}

static const char *cb_message(accel_status st)
{
    return cb_msg_set ? cb_msg : accel_status_str(st);
}

/* The log context of the accelerator whose tracker callback runs on this thread, so a
 * built-in tracker's lines carry that accelerator's rank and level. */
static _Thread_local const accel__log_ctx *cb_log;

const accel__log_ctx *accel__track_log(void)
{
    return cb_log;
}

/* Before each callback: a fresh message, and the context its lines go to. */
static void cb_begin(const track_state *ts)
{
    cb_msg_set = 0;
    cb_log = ts->log;
}

/* ---- registry ---- */

accel_tracker_ops accel_tracker_ops_default(void)
{
    accel_tracker_ops o;
    memset(&o, 0, sizeof(o));
    o.size = (uint32_t)sizeof(o);
    return o;
}

static int find_locked(const char *name)
{
    for (int i = 0; i < n_registry; i++) {
        if (strcmp(registry[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

static accel_status add_locked(const accel_tracker_ops *ops, int builtin)
{
    int i = find_locked(ops->name);
    if (i >= 0) {
        if (!builtin) {
            accel__log(NULL, ACCEL__LOG_WARN, "tracker \"%s\" was already registered; replacing it",
                       ops->name);
        }
        accel__free(registry[i].name);
    } else {
        if (n_registry == MAX_TRACKERS) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_register_tracker: more than %d trackers registered",
                                 MAX_TRACKERS);
        }
        i = n_registry++;
    }
    /* A table compiled against an older header is shorter: copy what it has, zero the rest. */
    memset(&registry[i].ops, 0, sizeof(registry[i].ops));
    memcpy(&registry[i].ops, ops,
           ops->size < sizeof(registry[i].ops) ? ops->size : sizeof(registry[i].ops));
    registry[i].ops.size = (uint32_t)sizeof(registry[i].ops);
    registry[i].name = accel__strdup(ops->name);
    registry[i].ops.name = registry[i].name;
    registry[i].builtin = builtin;
    if (registry[i].name == NULL) {
        n_registry--;
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_register_tracker: out of memory");
    }
    return ACCEL_OK;
}

static void add_builtins_locked(void)
{
    if (builtins_added) {
        return;
    }
    builtins_added = 1;
    add_locked(&accel__tracker_tensorboard, 1);
    add_locked(&accel__tracker_mlflow, 1);
    add_locked(&accel__tracker_jsonl, 1);
    add_locked(&accel__tracker_csv, 1);
}

accel_status accel_register_tracker(const accel_tracker_ops *ops)
{
    if (ops == NULL || ops->size < offsetof(accel_tracker_ops, user)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_register_tracker: ops is NULL or not made by "
                             "accel_tracker_ops_default()");
    }
    if (ops->name == NULL || ops->name[0] == '\0' || strlen(ops->name) >= 64 ||
        strchr(ops->name, ',') != NULL || strcmp(ops->name, "all") == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_register_tracker: name must be 1-63 characters, without ',' "
                             "and not \"all\"");
    }
    if (ops->start == NULL || ops->log == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_register_tracker: tracker \"%s\" lacks the %s callback",
                             ops->name, ops->start == NULL ? "start" : "log");
    }
    pthread_mutex_lock(&reg_lock);
    add_builtins_locked();
    accel_status st = add_locked(ops, 0);
    pthread_mutex_unlock(&reg_lock);
    return st;
}

/* ---- per-accelerator state ---- */

static void finish_all(track_state *ts)
{
    for (int i = 0; i < ts->n; i++) {
        accel_tracker *t = &ts->trackers[i];
        if (t->ops.finish != NULL) {
            cb_begin(ts);
            accel_status st = t->ops.finish(t->state);
            if (st != ACCEL_OK) {
                accel__log(ts->log, ACCEL__LOG_WARN, "tracker %s: finish failed: %s", t->name,
                           cb_message(st));
            }
        }
        if (t->failures > FAIL_WARN_MAX) {
            accel__log(ts->log, ACCEL__LOG_WARN, "tracker %s: %lld log calls failed in total", t->name,
                       t->failures);
        }
    }
    ts->n = 0;
}

static void track_free(accel *acc, void *state)
{
    (void)acc;
    finish_all(state);
    accel__free(state);
}

static track_state *get_state(accel *acc, int create)
{
    track_state *ts = accel__module(acc, ACCEL__MOD_TRACK);
    if (ts == NULL && create) {
        ts = accel__calloc(1, sizeof(*ts));
        if (ts != NULL) {
            ts->log = &acc->log;
            accel__module_set(acc, ACCEL__MOD_TRACK, ts, track_free);
        }
    }
    return ts;
}

static accel_status check_values(accel *acc, const char *fn, const accel_value *v, int n)
{
    if (n < 0 || (n > 0 && v == NULL)) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: values is NULL or n=%d is negative", fn, n);
    }
    for (int i = 0; i < n; i++) {
        if (v[i].key == NULL || v[i].key[0] == '\0') {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: values[%d] has no key", fn, i);
        }
        if (v[i].kind == ACCEL_VALUE_TEXT && v[i].text == NULL) {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: values[%d] (\"%s\") is text but NULL", fn,
                                 i, v[i].key);
        }
        if (v[i].kind != ACCEL_VALUE_TEXT && v[i].kind != ACCEL_VALUE_SCALAR) {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: values[%d] (\"%s\") has kind %d", fn, i,
                                 v[i].key, (int)v[i].kind);
        }
    }
    return ACCEL_OK;
}

/* Splits log_with into registry indices (deduplicated, in order). */
static accel_status resolve_log_with(accel *acc, const char *log_with, int *idx, int *n_idx)
{
    *n_idx = 0;
    const char *p = log_with;
    while (*p) {
        while (*p == ' ' || *p == ',') {
            p++;
        }
        const char *e = p;
        while (*e && *e != ',') {
            e++;
        }
        size_t len = (size_t)(e - p);
        while (len > 0 && p[len - 1] == ' ') {
            len--;
        }
        if (len == 0) {
            p = e;
            continue;
        }
        char name[64];
        if (len >= sizeof(name)) {
            return accel__seterr(acc, ACCEL_EINVAL, "log_with: tracker name \"%.*s\" is too long",
                                 (int)len, p);
        }
        memcpy(name, p, len);
        name[len] = '\0';
        int lo, hi;
        if (strcmp(name, "all") == 0) {
            lo = 0;
            hi = n_registry;
        } else {
            lo = find_locked(name);
            if (lo < 0) {
                char known[512] = "";
                for (int i = 0; i < n_registry; i++) {
                    size_t k = strlen(known);
                    snprintf(known + k, sizeof(known) - k, "%s%s", i ? ", " : "", registry[i].name);
                }
                return accel__seterr(acc, ACCEL_EINVAL,
                                     "log_with: unknown tracker \"%s\" (registered: %s, or all)",
                                     name, known);
            }
            hi = lo + 1;
        }
        for (int i = lo; i < hi; i++) {
            int dup = 0;
            for (int j = 0; j < *n_idx; j++) {
                dup |= idx[j] == i;
            }
            if (!dup) {
                idx[(*n_idx)++] = i;
            }
        }
        p = e;
    }
    return ACCEL_OK;
}

accel_status accel__track_validate(accel *acc, const char *log_with, const char *logging_dir)
{
    if (log_with == NULL || log_with[0] == '\0') {
        return ACCEL_OK;
    }
    int idx[MAX_TRACKERS], n = 0;
    pthread_mutex_lock(&reg_lock);
    add_builtins_locked();
    accel_status st = resolve_log_with(acc, log_with, idx, &n);
    for (int i = 0; st == ACCEL_OK && i < n; i++) {
        if (registry[idx[i]].ops.requires_logging_directory &&
            (logging_dir == NULL || logging_dir[0] == '\0')) {
            st = accel__seterr(acc, ACCEL_EINVAL,
                               "tracker %s needs a logging directory: set the project_dir or "
                               "logging_dir option",
                               registry[idx[i]].name);
        }
    }
    pthread_mutex_unlock(&reg_lock);
    return st;
}

accel_status accel_init_trackers(accel *acc, const char *project_name, const accel_value *config,
                                 int n_config)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_init_trackers: acc is NULL");
    }
    if (project_name == NULL || project_name[0] == '\0' || strchr(project_name, '/') != NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_init_trackers: project_name must be a non-empty name without "
                             "'/'");
    }
    ACCEL_TRY(check_values(acc, "accel_init_trackers", config, n_config));
    track_state *ts = get_state(acc, 1);
    if (ts == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_init_trackers: out of memory");
    }
    finish_all(ts);
    ts->logged = 0;
    const char *log_with = acc->settings->track.log_with;
    if (log_with == NULL || log_with[0] == '\0') {
        return ACCEL_OK; /* Accelerate: log_with=None starts nothing */
    }

    /* Take a snapshot of the chosen registry entries so the lock is not held across user
     * callbacks (which may themselves register trackers). */
    accel_tracker chosen[MAX_TRACKERS];
    int n_chosen = 0, idx[MAX_TRACKERS];
    pthread_mutex_lock(&reg_lock);
    add_builtins_locked();
    accel_status st = resolve_log_with(acc, log_with, idx, &n_chosen);
    for (int i = 0; st == ACCEL_OK && i < n_chosen; i++) {
        memset(&chosen[i], 0, sizeof(chosen[i]));
        chosen[i].ops = registry[idx[i]].ops;
        chosen[i].builtin = registry[idx[i]].builtin;
        snprintf(chosen[i].name, sizeof(chosen[i].name), "%s", registry[idx[i]].name);
        chosen[i].ops.name = NULL; /* the registry copy may be replaced; use t->name */
    }
    pthread_mutex_unlock(&reg_lock);
    ACCEL_TRY(st);

    const char *dir = acc->settings->track.logging_dir;
    ACCEL_TRY(accel__track_validate(acc, log_with, dir));

    accel_tracker_start_info info = {
        .project_name = project_name,
        .logging_dir = (dir != NULL && dir[0] != '\0') ? dir : NULL,
        .process_index = acc->rank,
        .start_time = accel__wall_time(),
    };
    for (int i = 0; i < n_chosen; i++) {
        accel_tracker *t = &chosen[i];
        if (acc->rank != 0 && !t->ops.all_processes) {
            continue;
        }
        ts->trackers[ts->n] = *t;
        accel_tracker *s = &ts->trackers[ts->n];
        cb_begin(ts);
        /* Built-in trackers take the accelerator's track settings (what accel_init read from
         * the environment for them) as their user pointer. */
        st = s->ops.start(s->builtin ? (void *)&acc->settings->track : s->ops.user, &info,
                          &s->state);
        if (st != ACCEL_OK) {
            st = accel__seterr(acc, st, "tracker %s: start failed: %s", s->name, cb_message(st));
            finish_all(ts);
            return st;
        }
        ts->n++;
        if (s->ops.store_init_configuration != NULL && n_config > 0) {
            cb_begin(ts);
            st = s->ops.store_init_configuration(s->state, config, n_config);
            if (st != ACCEL_OK) {
                st = accel__seterr(acc, st, "tracker %s: storing the configuration failed: %s",
                                   s->name, cb_message(st));
                finish_all(ts);
                return st;
            }
        }
    }
    return ACCEL_OK;
}

accel_status accel_log(accel *acc, const accel_value *values, int n, long long step)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_log: acc is NULL");
    }
    if (step < ACCEL_NO_STEP) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_log: step=%lld is negative", step);
    }
    ACCEL_TRY(check_values(acc, "accel_log", values, n));
    track_state *ts = get_state(acc, 0);
    if (ts == NULL) {
        return ACCEL_OK;
    }
    ts->logged = 1;
    for (int i = 0; i < ts->n; i++) {
        accel_tracker *t = &ts->trackers[i];
        cb_begin(ts);
        accel_status st = t->ops.log(t->state, values, n, step);
        if (st != ACCEL_OK) {
            t->failures++;
            if (t->failures <= FAIL_WARN_MAX) {
                accel__log(&acc->log, ACCEL__LOG_WARN, "tracker %s: logging step %lld failed: %s%s", t->name,
                           step, cb_message(st),
                           t->failures == FAIL_WARN_MAX ? " (further failures are counted only)"
                                                        : "");
            }
        }
    }
    return ACCEL_OK;
}

accel_status accel_trackers_resume(accel *acc, long long step)
{
    if (acc == NULL || step < 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_trackers_resume: %s",
                             acc == NULL ? "acc is NULL" : "step is negative");
    }
    track_state *ts = get_state(acc, 0);
    if (ts == NULL || ts->logged) {
        /* Checked on every process (all of them called init_trackers and log) so that a
         * misplaced call fails everywhere, not only where trackers run. */
        return accel__seterr(acc, ACCEL_ESTATE,
                             "accel_trackers_resume: call it after accel_init_trackers and "
                             "before the first accel_log of the run (%s)",
                             ts == NULL ? "no accel_init_trackers yet" : "accel_log was called");
    }
    for (int i = 0; i < ts->n; i++) {
        accel_tracker *t = &ts->trackers[i];
        if (t->ops.resume == NULL) {
            accel__log(&acc->log, ACCEL__LOG_WARN,
                       "tracker %s cannot resume: what the interrupted run logged at steps >= "
                       "%lld stays (it has no resume callback)",
                       t->name, step);
            continue;
        }
        cb_begin(ts);
        accel_status st = t->ops.resume(t->state, step);
        if (st != ACCEL_OK) {
            accel__log(&acc->log, ACCEL__LOG_WARN, "tracker %s: resuming at step %lld failed: %s", t->name,
                       step, cb_message(st));
        }
    }
    return ACCEL_OK;
}

accel_tracker *accel_get_tracker(accel *acc, const char *name)
{
    if (acc == NULL || name == NULL) {
        accel__seterr(acc, ACCEL_EINVAL, "accel_get_tracker: acc or name is NULL");
        return NULL;
    }
    track_state *ts = get_state(acc, 0);
    for (int i = 0; ts != NULL && i < ts->n; i++) {
        if (strcmp(ts->trackers[i].name, name) == 0) {
            return &ts->trackers[i];
        }
    }
    if (acc->rank != 0) {
        return &blank_tracker;
    }
    accel__seterr(acc, ACCEL_EINVAL, "accel_get_tracker: no started tracker named \"%s\"", name);
    return NULL;
}

const char *accel_tracker_name(const accel_tracker *t)
{
    return t != NULL ? t->name : "";
}

void *accel_tracker_state(const accel_tracker *t)
{
    return t != NULL ? t->state : NULL;
}

const char *accel_tracker_run_dir(const accel_tracker *t)
{
    if (t == NULL || !t->builtin || t->state == NULL) {
        return NULL;
    }
    const accel__track_common *c = t->state;
    return c->magic == ACCEL__TRACK_MAGIC ? c->run_dir : NULL;
}

accel_status accel_end_training(accel *acc)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_end_training: acc is NULL");
    }
    track_state *ts = get_state(acc, 0);
    if (ts != NULL) {
        finish_all(ts);
    }
    accel__profile_finish_local(acc);
    return ACCEL_OK;
}
