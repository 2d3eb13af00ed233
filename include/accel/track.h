/*
 * accel/track.h - what people watch while a run trains: experiment trackers, named loggers,
 * a progress bar and the profiler timeline.
 *
 *     accel_options o = accel_options_default();
 *     o.project_dir = "runs";
 *     o.log_with = "tensorboard,jsonl";              // or "all"
 *     accel_init(&acc, &o);
 *     accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4), ACCEL_TEXT("model", "gpt2")};
 *     accel_init_trackers(acc, "my_run", cfg, 2);    // main process only; others no-op
 *     ...
 *     accel_value v[] = {ACCEL_SCALAR("loss", loss), ACCEL_SCALAR("lr", lr)};
 *     accel_log(acc, v, 2, step);
 *     ...
 *     accel_end_training(acc);
 *
 * Trackers follow Accelerate's GeneralTracker: every tracker has a name, says whether it needs
 * a logging directory, is started once, stores the run configuration, logs values at a step
 * and is finished. Built in: "tensorboard" (event files under logging_dir/project_name),
 * "mlflow" (MLflow's file store under logging_dir/mlruns), "jsonl" and "csv" (one record per
 * log call under logging_dir/project_name). User trackers register through the same interface.
 *
 * Tracker I/O failures after start never stop training: the call logs a warning through the
 * library logger and returns ACCEL_OK.
 *
 * Threading: trackers, loggers and progress bars belong to the thread that owns `acc`. The
 * profiler's internal ranges (src/core/profile.h) may be recorded from any thread.
 */
#ifndef ACCEL_TRACK_H
#define ACCEL_TRACK_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Values logged to trackers ---- */

typedef enum accel_value_kind {
    ACCEL_VALUE_SCALAR = 0, /* a number: a TensorBoard scalar, an MLflow metric / param */
    ACCEL_VALUE_TEXT = 1    /* a string: TensorBoard text, an MLflow tag / param */
} accel_value_kind;

/*
 * One key/value. `key` and `text` are borrowed for the duration of the call that receives
 * them. Keys may contain '/' (TensorBoard groups by it; MLflow makes folders).
 */
typedef struct accel_value {
    const char *key;
    accel_value_kind kind;
    double scalar;    /* for ACCEL_VALUE_SCALAR */
    const char *text; /* for ACCEL_VALUE_TEXT */
} accel_value;

#define ACCEL_SCALAR(k, v) ((accel_value){.key = (k), .kind = ACCEL_VALUE_SCALAR, .scalar = (v)})
#define ACCEL_TEXT(k, s) ((accel_value){.key = (k), .kind = ACCEL_VALUE_TEXT, .text = (s)})

/* Step value meaning "no step" (Accelerate's step=None): trackers record step 0. */
#define ACCEL_NO_STEP (-1LL)

/* ---- Tracker interface ---- */

/* What a tracker's start callback receives. Strings are borrowed for the call only. */
typedef struct accel_tracker_start_info {
    const char *project_name; /* run name given to accel_init_trackers */
    const char *logging_dir;  /* resolved logging directory; NULL when none is configured */
    int process_index;        /* the calling process */
    double start_time;        /* seconds since the Unix epoch */
} accel_tracker_start_info;

/*
 * A tracker: a table of callbacks plus a context. Register with accel_register_tracker; the
 * table is copied (name included), `user` is borrowed until the process exits or the name is
 * registered again. Every callback returns ACCEL_OK or an error status; it may set a message
 * with accel_tracker_seterr.
 *   start:      creates the run; writes its state to *state. Required.
 *   store_init_configuration: records the run configuration (hyperparameters). May be NULL.
 *   log:        records values at `step` (ACCEL_NO_STEP for none). Required.
 *   finish:     closes the run and frees *state. Called exactly once after a successful start
 *               (also when the accelerator is freed without accel_end_training). May be NULL.
 *   resume:     the run continues an interrupted one from `step` (accel_trackers_resume): drop
 *               or hide what was logged at steps >= step. May be NULL (the tracker then keeps
 *               those records, with a warning). Last in the table: one whose `size` ends
 *               before it has none.
 */
typedef struct accel_tracker_ops {
    uint32_t size; /* sizeof(accel_tracker_ops) as the caller compiled it */
    const char *name;
    int requires_logging_directory; /* 1: accel_init_trackers fails without a logging dir */
    int all_processes;              /* 0 (Accelerate's main_process_only): only process 0 runs it */
    accel_status (*start)(void *user, const accel_tracker_start_info *info, void **state);
    accel_status (*store_init_configuration)(void *state, const accel_value *config, int n);
    accel_status (*log)(void *state, const accel_value *values, int n, long long step);
    accel_status (*finish)(void *state);
    void *user;
    accel_status (*resume)(void *state, long long step);
} accel_tracker_ops;

/* Returns a zeroed table with `size` set. */
ACCEL_API accel_tracker_ops accel_tracker_ops_default(void);

/*
 * Adds a tracker name usable in log_with (Accelerate's register_tracker_class). Registering an
 * existing name replaces it with a warning; built-in names may be replaced too.
 * Returns ACCEL_OK or ACCEL_EINVAL naming the missing field (name, start, log).
 * Thread-safe; call before accel_init_trackers.
 */
ACCEL_API accel_status accel_register_tracker(const accel_tracker_ops *ops);

/* Sets the message a failing tracker callback reports (accel_last_error shows it, prefixed by
 * the tracker name). Returns st. Usable only inside a callback. */
ACCEL_API accel_status accel_tracker_seterr(accel_status st, const char *fmt, ...)
    ACCEL_PRINTF(2, 3);

/*
 * Starts the trackers named in the log_with option (comma list, "all" = every registered
 * tracker) for run `project_name`, then stores `config` (n values, may be 0) in each.
 * Runs on the main process only (others return ACCEL_OK and keep no trackers), except trackers
 * with all_processes set. Not a collective.
 * Returns ACCEL_OK; ACCEL_EINVAL naming an unknown tracker, a tracker that needs a logging
 * directory when neither logging_dir nor project_dir is set, or a bad argument; ACCEL_EIO
 * naming a directory or file that cannot be created. On failure no tracker stays started.
 * Calling it again finishes the previous trackers first.
 */
ACCEL_API accel_status accel_init_trackers(accel *acc, const char *project_name,
                                           const accel_value *config, int n_config);

/*
 * Logs n values at `step` (>= 0, or ACCEL_NO_STEP) to every started tracker (Accelerate's
 * accelerator.log). NaN / infinite scalars are logged with a warning, in the closest form
 * each format allows (JSON: null). A tracker that fails to write logs a warning and is
 * skipped: the call still returns ACCEL_OK. Returns ACCEL_EINVAL only for bad arguments
 * (values NULL with n > 0, a NULL key, a text value with NULL text). No-op where no tracker
 * is started (other processes).
 */
ACCEL_API accel_status accel_log(accel *acc, const accel_value *values, int n, long long step);

/*
 * A resumed run continues its trackers cleanly from `step`, the first step it will log again
 * (TensorBoard's purge_step): what the interrupted run logged at steps >= step is dropped, so
 * the steps between the checkpoint and the interruption are not recorded twice. Call it after
 * accel_init_trackers and accel_load_state, before the first accel_log:
 *
 *     accel_init_trackers(acc, "gpt", cfg, n);
 *     if (resuming && accel_load_state(acc, NULL) == ACCEL_OK)
 *         accel_trackers_resume(acc, step + 1);     // `step`: restored by load_state
 *
 * jsonl / csv: the files are rewritten (crash-safe) without records at steps >= step (records
 * logged without a step are kept). tensorboard: a SessionLog START event at `step`, which
 * makes TensorBoard discard the earlier events at steps >= step. mlflow: the run continues the
 * earlier run of the same name in the experiment (or MLFLOW_RUN_ID), as MLflow's resume does,
 * and metric lines at steps >= step are dropped from its history. User trackers: their resume
 * callback. Main process only, like the other tracker calls (elsewhere a no-op).
 * Returns ACCEL_OK (a tracker that fails to resume logs a warning, as a failed log does);
 * ACCEL_EINVAL for step < 0; ACCEL_ESTATE before accel_init_trackers or after an accel_log
 * of this run.
 */
ACCEL_API accel_status accel_trackers_resume(accel *acc, long long step);

typedef struct accel_tracker accel_tracker;

/*
 * The started tracker named `name` (Accelerate's get_tracker). On processes without trackers
 * returns a blank tracker (name "blank", state NULL) as Accelerate does. Returns NULL with
 * ACCEL_EINVAL set when the main process has no started tracker of that name.
 * Borrowed; valid until accel_end_training / accel_init_trackers / accel_free.
 */
ACCEL_API accel_tracker *accel_get_tracker(accel *acc, const char *name);
/* The tracker's name. Static or owned by the tracker. */
ACCEL_API const char *accel_tracker_name(const accel_tracker *t);
/* The state the tracker's start wrote (the raw run object); NULL for a blank tracker. */
ACCEL_API void *accel_tracker_state(const accel_tracker *t);
/* For built-in trackers: the folder the run writes into (event files, metrics.jsonl, the
 * MLflow run folder); NULL otherwise. Owned by the tracker. */
ACCEL_API const char *accel_tracker_run_dir(const accel_tracker *t);

/*
 * Finishes every started tracker (flushes and closes files, marks the MLflow run FINISHED) and
 * ends a profiler session still open. Accelerate's end_training. Main process only for
 * trackers; harmless elsewhere and when called twice. Returns ACCEL_OK (finish failures are
 * warnings).
 */
ACCEL_API accel_status accel_end_training(accel *acc);

/* ---- Named loggers (accelerate.logging.get_logger) ---- */

typedef enum accel_log_level {
    ACCEL_LOG_DEBUG = 0,
    ACCEL_LOG_INFO = 1,
    ACCEL_LOG_WARNING = 2,
    ACCEL_LOG_ERROR = 3,
    ACCEL_LOG_OFF = 4
} accel_log_level;

/* Which processes print a logger line. */
typedef enum accel_log_scope {
    ACCEL_LOG_MAIN_ONLY = 0,     /* global main process only (the default) */
    ACCEL_LOG_ALL_PROCESSES = 1, /* every process, in whatever order they get there */
    ACCEL_LOG_IN_ORDER = 2       /* every process in rank order, a barrier after each turn:
                                    a collective, every process must make the call */
} accel_log_scope;

typedef struct accel_logger accel_logger;

/*
 * The logger named `name` (same handle for the same name), owned by acc. Lines go to stderr as
 * "[rank r/N] name LEVEL: message", one write per line. Level: accel_logger_set_level, else
 * ACCELERATE_LOG_LEVEL, else ACCEL_LOG_LEVEL, else INFO. Returns NULL with ACCEL_EINVAL /
 * ACCEL_ENOMEM set on failure.
 */
ACCEL_API accel_logger *accel_get_logger(accel *acc, const char *name);
ACCEL_API void accel_logger_set_level(accel_logger *lg, accel_log_level level);
ACCEL_API accel_log_level accel_logger_level(const accel_logger *lg);
/* Redirects output (tests); NULL = stderr. The stream is borrowed. */
ACCEL_API void accel_logger_set_stream(accel_logger *lg, FILE *stream);

/*
 * Logs one line at `level` from the processes `scope` selects. ACCEL_LOG_IN_ORDER is a
 * collective (barrier after each process's turn; its failure is reported through the library
 * log). Messages below the level print nothing, but IN_ORDER still takes part in the barriers.
 */
ACCEL_API void accel_logger_log(accel_logger *lg, accel_log_level level, accel_log_scope scope,
                                const char *fmt, ...) ACCEL_PRINTF(4, 5);
/* Main-process-only shorthands. */
ACCEL_API void accel_logger_debug(accel_logger *lg, const char *fmt, ...) ACCEL_PRINTF(2, 3);
ACCEL_API void accel_logger_info(accel_logger *lg, const char *fmt, ...) ACCEL_PRINTF(2, 3);
ACCEL_API void accel_logger_warning(accel_logger *lg, const char *fmt, ...) ACCEL_PRINTF(2, 3);
ACCEL_API void accel_logger_error(accel_logger *lg, const char *fmt, ...) ACCEL_PRINTF(2, 3);
/* Warns once per distinct formatted message (Accelerate's warning_once), main process only. */
ACCEL_API void accel_logger_warning_once(accel_logger *lg, const char *fmt, ...) ACCEL_PRINTF(2, 3);

/* ---- Progress bar ---- */

#define ACCEL_PROGRESS_OPTIONS_VERSION 1

/* Progress bar options; start from accel_progress_options_default(). */
typedef struct accel_progress_options {
    uint32_t size, version;
    long long total;     /* expected count; 0 = unknown (no percentage / remaining time) */
    const char *desc;    /* prefix, e.g. "train"; copied */
    FILE *stream;        /* NULL = stderr; borrowed while the bar lives */
    int local_main;      /* 1: the main process of every machine draws; 0: global main only */
    int tty;             /* -1 auto (isatty), 1 redraw in place with \r, 0 plain lines */
    double interval_s;   /* plain mode: print at least every interval_s (default 10) */
    double percent_step; /* plain mode: also print when progress crosses k*percent (default 10;
                            0 = time only) */
    int width;           /* bar characters in tty mode (default 30) */
    long long initial;   /* count already done (a resumed run, tqdm's initial): the bar starts
                            there and the rate counts only this run's progress (default 0) */
} accel_progress_options;

ACCEL_API accel_progress_options accel_progress_options_default(void);

typedef struct accel_progress accel_progress;

/*
 * A progress bar: "desc  45%|#############                | 45/100 [00:12<00:15, 3.61it/s,
 * loss=2.31, lr=0.0003]". On processes that do not draw, the handle is inert.
 *   opts: borrowed; NULL = defaults; else made by accel_progress_options_default().
 *   out:  receives the bar on success only; free with accel_progress_close.
 * Returns ACCEL_OK; ACCEL_EINVAL naming the option out of range; ACCEL_ENOMEM.
 */
ACCEL_API accel_status accel_progress_new(accel *acc, const accel_progress_options *opts,
                                          accel_progress **out);
/* Advances by n and redraws when due. Accepts NULL. */
ACCEL_API void accel_progress_update(accel_progress *p, long long n);
/* Sets a caller field shown after the rate (up to 8 fields; key copied, at most 31 chars). The
 * new value shows at the next redraw. Accepts NULL. */
ACCEL_API void accel_progress_set_field(accel_progress *p, const char *key, double value);
/* Draws the final state unless the last plain line already shows it (no line twice), ends
 * the line, and frees. Accepts NULL. */
ACCEL_API void accel_progress_close(accel_progress *p);

/* ---- Profiler timeline ---- */

/*
 * Starts recording a Chrome trace (Perfetto / chrome://tracing) of accel's phases (forward,
 * backward, each bucket's all-reduce, data waits, optimizer steps, checkpoint writes) and the
 * user's ranges. `dir`: where accel_profile_end writes profile_<process_index>.json; NULL =
 * logging_dir, else project_dir, else ".". Copied. Returns ACCEL_ESTATE if a session is already
 * open, ACCEL_EIO if dir cannot be created.
 */
ACCEL_API accel_status accel_profile_begin(accel *acc, const char *dir);
/*
 * Stops recording, writes dir/profile_<process_index>.json (temp + rename) and waits for every
 * process (Accelerate's profile() barrier), so every process must call it when more than one
 * runs. Returns ACCEL_OK, ACCEL_ESTATE without an open session, ACCEL_EIO naming the file.
 */
ACCEL_API accel_status accel_profile_end(accel *acc);
/* User ranges, nested per thread: push opens a span named `name` (copied, up to 63 chars) in
 * category "user", push_cat in `category` (a string that outlives the session: a literal),
 * so a program's own kernels can be filtered apart in Perfetto; pop closes the innermost.
 * No-ops when no session is open. Thread-safe. */
ACCEL_API void accel_profile_push(accel *acc, const char *name);
ACCEL_API void accel_profile_push_cat(accel *acc, const char *name, const char *category);
ACCEL_API void accel_profile_pop(accel *acc);
/* 1 while a session is open. */
ACCEL_API int accel_profile_active(const accel *acc);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_TRACK_H */
