/*
 * Resolved settings (src/core/settings.c): every value accel_init decides, each with its
 * source, and the per-module views that modules read instead of the environment.
 *
 * Option resolution itself (argument > env > config file > default) stays in accel.c; while
 * it runs it records the source of every value it takes from the environment or the config
 * file here, and accel__settings_finish fills in the rest (argument or default) and builds
 * the table that accel_settings_summary prints. After accel_init nothing in the library calls
 * getenv or reads the config file: what a module needs later is in its settings struct.
 */
#ifndef ACCEL_CORE_SETTINGS_H
#define ACCEL_CORE_SETTINGS_H

#include <stddef.h>

#include "accel/core.h"
#include "base/base.h"

/* The fields of accel_options, X(name, kind), in declaration order. Kinds: FLAG (-1 unset),
 * INT, REAL, STRING, PRECISION, DTYPE (comm_dtype), SHARD (zero_shard_size). */
#define ACCEL__OPTION_FIELDS(X)                                                                    \
    X(cpu, FLAG)                                                                                   \
    X(backend, STRING)                                                                             \
    X(timeout_s, REAL)                                                                             \
    X(debug, FLAG)                                                                                 \
    X(config_file, STRING)                                                                         \
    X(mixed_precision, PRECISION)                                                                  \
    X(gradient_accumulation_steps, INT)                                                            \
    X(sync_with_dataloader, FLAG)                                                                  \
    X(sync_each_batch, FLAG)                                                                       \
    X(adjust_scheduler, FLAG)                                                                      \
    X(step_scheduler_with_optimizer, FLAG)                                                         \
    X(split_batches, FLAG)                                                                         \
    X(dispatch_batches, FLAG)                                                                      \
    X(even_batches, FLAG)                                                                          \
    X(use_seedable_sampler, FLAG)                                                                  \
    X(bucket_cap_mb, REAL)                                                                         \
    X(first_bucket_mb, REAL)                                                                       \
    X(overlap_comm, FLAG)                                                                          \
    X(comm_dtype, DTYPE)                                                                           \
    X(init_scale, REAL)                                                                            \
    X(growth_factor, REAL)                                                                         \
    X(backoff_factor, REAL)                                                                        \
    X(growth_interval, INT)                                                                        \
    X(project_dir, STRING)                                                                         \
    X(logging_dir, STRING)                                                                         \
    X(automatic_checkpoint_naming, FLAG)                                                           \
    X(total_limit, INT)                                                                            \
    X(iteration, FLAG)                                                                             \
    X(save_on_each_node, FLAG)                                                                     \
    X(log_with, STRING)                                                                            \
    X(zero_stage, FLAG)                                                                            \
    X(resume_from_checkpoint, STRING)                                                              \
    X(zero_shard_size, SHARD)

typedef enum accel__option_id {
#define ACCEL__OPTION_ENUM(name, kind) ACCEL__OPT_##name,
    ACCEL__OPTION_FIELDS(ACCEL__OPTION_ENUM)
#undef ACCEL__OPTION_ENUM
        ACCEL__OPT_COUNT
} accel__option_id;

#define ACCEL__SOURCE_NBYTES 512 /* a value or a source text, config-file paths included */

/*
 * Per-module views of the resolved settings, filled by accel__settings_views: what each module
 * reads instead of acc->opt or the environment. Strings are owned by the accelerator (its
 * copies of the options) and live as long as it.
 */
/* What train (models and their buckets, the reducer, accumulation, the fp16 scaler, schedulers)
 * reads. Values as resolved into accel_options (flags 0 / 1). */
typedef struct accel__train_settings {
    accel_precision mixed_precision;
    int gradient_accumulation_steps;   /* <= 0 counts as 1 */
    int sync_with_dataloader;          /* 1: the end of a loader closes the window */
    int sync_each_batch;               /* 1: communicate on every micro-step */
    int adjust_scheduler;              /* 1: accumulating micro-steps count in step_count */
    int step_scheduler_with_optimizer; /* 0: a scheduler ticks on every call */
    int split_batches;                 /* 1: one tick per optimizer step, else one per process */
    double first_bucket_mb, bucket_cap_mb; /* DDP's bucket sizes */
    int overlap_comm;                      /* 0: buckets launch at accel_backward_end */
    int comm_dtype;                        /* accel_dtype of the gradient wire; < 0: theirs */
    double init_scale, growth_factor, backoff_factor; /* the fp16 loss scaler */
    int growth_interval;
    int zero_stage;      /* 0-3 */
    int zero_shard_size; /* processes per shard group; 0: all; ACCEL_SHARD_MACHINE */
} accel__train_settings;

typedef struct accel__data_settings {
    int split_batches, even_batches, use_seedable_sampler; /* 0 / 1 */
    int dispatch_batches; /* -1: by dataset kind (1 for iterable datasets), else 0 / 1 */
} accel__data_settings;

typedef struct accel__ckpt_settings {
    const char *project_dir;            /* NULL: none */
    int automatic_checkpoint_naming;    /* 0 / 1 */
    int total_limit;                    /* 0: keep every checkpoint */
    int iteration;                      /* the first automatic checkpoint number */
    int save_on_each_node;              /* 0 / 1 */
    const char *resume_from_checkpoint; /* NULL: none; "latest" or a folder */
    accel_precision mixed_precision;    /* to name it in messages */
} accel__ckpt_settings;

/* What the track module (trackers, named loggers) takes from the options and environment. */
typedef struct accel__track_settings {
    const char *log_with;               /* NULL: no tracker */
    const char *logging_dir;            /* NULL: none */
    const char *mlflow_tracking_uri;    /* MLFLOW_TRACKING_URI; NULL unset */
    const char *mlflow_experiment_name; /* MLFLOW_EXPERIMENT_NAME; NULL unset */
    const char *mlflow_run_id;          /* MLFLOW_RUN_ID; NULL unset */
    const char *user;                   /* USER; "unknown" unset (mlflow's user tag) */
    int logger_level; /* accel_log_level of accel_get_logger loggers: ACCELERATE_LOG_LEVEL >
                         ACCEL_LOG_LEVEL > info */
} accel__track_settings;

typedef struct accel__setting accel__setting; /* one line of the table (settings.c) */

typedef struct accel__settings {
    char src[ACCEL__OPT_COUNT][ACCEL__SOURCE_NBYTES]; /* "" until a source is recorded */
    accel__train_settings train;
    accel__data_settings data;
    accel__ckpt_settings ckpt;
    accel__track_settings track;
    char *launch_sources; /* ACCEL_LAUNCH_SOURCES: "VAR\tsource\n" lines; NULL when unset */
    accel__setting *lines;
    int n_lines, cap_lines;
    char *summary; /* accel_settings_summary's text, built by accel__settings_finish */
    char *strings; /* owned copies the track settings point into (a NUL-separated pool) */
} accel__settings;

/* An empty record; reads ACCEL_LAUNCH_SOURCES (accel launch's account of the variables it
 * set). Free with accel__settings_free (accepts NULL). */
accel_status accel__settings_new(accel__settings **out);
void accel__settings_free(accel__settings *s);

/* Records the source of an option field (printf-style, e.g. "env ACCEL_TIMEOUT"). */
void accel__settings_src(accel__settings *s, accel__option_id id, const char *fmt, ...)
    ACCEL_PRINTF(3, 4);
/* Records that option `id` came from environment variable `var`: "env VAR", or, when accel
 * launch set VAR, "accel launch: <its source> (env VAR)". */
void accel__settings_src_env(accel__settings *s, accel__option_id id, const char *var);
/* Writes the source text of environment variable `var` into buf (as above). Returns buf. */
const char *accel__settings_env_source(const accel__settings *s, const char *var, char *buf,
                                       size_t nbytes);

/* Adds a line for a value that is not an option field (process layout, rendezvous, log
 * level, ...). Returns ACCEL_OK or ACCEL_ENOMEM. */
accel_status accel__settings_add(accel__settings *s, const char *name, const char *value,
                                 const char *source);

/* Reads what modules take from the environment later (the track settings), recording
 * their sources. Returns ACCEL_OK or ACCEL_ENOMEM. */
accel_status accel__settings_read_env(accel__settings *s);

/* Fills the module views from the resolved options `o` (the accelerator's own copy, whose
 * strings outlive the views). */
void accel__settings_views(accel__settings *s, const accel_options *o);

/*
 * Completes the table: every option field of `resolved` with its recorded source, else
 * "argument" when the caller's `given` (before resolution) set it, else "default"; then the
 * other lines and the environment variables of the env table that are set and not shown yet.
 * Builds the summary text. Returns ACCEL_OK or ACCEL_ENOMEM.
 */
accel_status accel__settings_finish(accel__settings *s, const accel_options *given,
                                    const accel_options *resolved);

/* The value of option field `id` of `o` as the table shows it (reals exactly: the shortest text
 * that reads back as the same double), into buf. */
void accel__settings_format(const accel_options *o, accel__option_id id, char *buf, size_t nbytes);
/* The name of option field `id` ("mixed_precision"). Static string. */
const char *accel__settings_field_name(accel__option_id id);

/*
 * Checks that every process of acc's job resolved the same settings (src/core/agree.c): after
 * accel__settings_finish, with acc->comm open. Collective over the job: one allreduce of a
 * digest per option field (a few hundred bytes), and on a difference one allgather of each
 * process's value and source of the first field that differs. A difference is ACCEL_EINVAL on
 * every process, naming the setting, process 0 and the first process that differs, and each
 * one's value and source; other failures are the communicator's (EPEER, ETIMEDOUT). One
 * process: nothing to check, ACCEL_OK. Which fields must agree, and why the others may differ,
 * is docs/configuration.md, "Settings every process must share".
 */
accel_status accel__settings_agree(accel *acc);

/* Writes "[rank 0/N] accel: resolved configuration ..." and the table to stderr in one
 * write(2), so that other processes' lines do not cut through it (the main process calls it
 * in debug mode). */
void accel__settings_print(const accel__settings *s, int n_ranks);

#endif /* ACCEL_CORE_SETTINGS_H */
