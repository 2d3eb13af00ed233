/*
 * accel/core.h - the Accelerator: options, process state, process control, prepare, seeds.
 *
 * Hugging Face Accelerate for C. A program creates one accel handle with accel_init(), and the
 * same loop then runs on one process, many processes on one machine (`accel launch`) or many
 * machines:
 *
 *     accel *acc;
 *     accel_options o = accel_options_default();
 *     o.gradient_accumulation_steps = 4;
 *     if (accel_init(&acc, &o) != ACCEL_OK) {
 *         fprintf(stderr, "%s\n", accel_last_error(NULL));
 *         return 1;
 *     }
 *     accel_print(acc, "%s", accel_state_summary(acc));
 *     ...
 *     accel_free(acc);
 *
 * Option precedence, for every option: a field set in accel_options > ACCELERATE_* / ACCEL_*
 * environment variable > config file > default. (Accelerate lets ACCELERATE_GRADIENT_
 * ACCUMULATION_STEPS override the argument; accel does not.) Unset fields hold the sentinels
 * documented below.
 *
 * Threading: an accel handle belongs to the thread that created it unless a function says
 * otherwise. accel_last_error(NULL) is per thread.
 */
#ifndef ACCEL_CORE_H
#define ACCEL_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ACCEL_VERSION_MAJOR 0
#define ACCEL_VERSION_MINOR 1
#define ACCEL_VERSION_PATCH 0
#define ACCEL_VERSION_STRING "0.1.0"

/* The version of the accel_options layout; bumped when fields are appended. */
#define ACCEL_OPTIONS_VERSION 4

/* Mixed precision. ACCEL_PRECISION_UNSET falls back to ACCELERATE_MIXED_PRECISION, then "no". */
typedef enum accel_precision {
    ACCEL_PRECISION_UNSET = -1,
    ACCEL_PRECISION_NO = 0,
    ACCEL_PRECISION_FP16 = 1,
    ACCEL_PRECISION_BF16 = 2,
    ACCEL_PRECISION_FP8 = 3
} accel_precision;

/* Accelerate's DistributedType values that accel can be in. */
typedef enum accel_distributed_type {
    ACCEL_DIST_NO = 0,        /* one process, no communication */
    ACCEL_DIST_MULTI_CPU = 1, /* processes on CPUs (shm on one machine, mpi across machines) */
    ACCEL_DIST_MULTI_GPU = 2  /* one process per CUDA device (nccl) */
} accel_distributed_type;

/*
 * Options for accel_init. Always start from accel_options_default(): it fills `size` and
 * `version` (so a newer library can tell which fields an older program knew) and marks every
 * other field unset. Integer flags use -1 for unset, counts 0, pointers NULL, reals < 0.
 * Strings are borrowed for the duration of accel_init only.
 */
typedef struct accel_options {
    uint32_t size;    /* sizeof(accel_options) as the caller compiled it */
    uint32_t version; /* ACCEL_OPTIONS_VERSION as the caller compiled it */

    /* Process state */
    int cpu;             /* force CPU even with GPUs (-1 unset; OR-ed with ACCELERATE_USE_CPU) */
    const char *backend; /* "self" | "shm" | "mpi" | "gloo" | "hier" | "nccl"; NULL = chosen
                            from the env (docs/comm.md) */
    double timeout_s;    /* collective and rendezvous deadline; < 0 = ACCEL_TIMEOUT, 1800 */
    int debug;           /* -1 unset = ACCELERATE_DEBUG_MODE */
    const char *config_file; /* NULL = ACCELERATE_CONFIG_FILE, then the default locations */

    /* Precision and gradient accumulation */
    accel_precision mixed_precision;
    int gradient_accumulation_steps;   /* 0 unset = env, then 1 */
    int sync_with_dataloader;          /* -1 unset = 1 */
    int sync_each_batch;               /* -1 unset = 0 */
    int adjust_scheduler;              /* -1 unset = 0 (Accelerate's effective default) */
    int step_scheduler_with_optimizer; /* -1 unset = 1 */

    /* Data loading (Accelerate's DataLoaderConfiguration) */
    int split_batches;        /* -1 unset = 0 */
    int dispatch_batches;     /* -1 unset = 0 for map-style, 1 for iterable datasets */
    int even_batches;         /* -1 unset = 1 */
    int use_seedable_sampler; /* -1 unset = 0 */

    /* Gradient communication */
    double bucket_cap_mb;   /* < 0 unset = 25 */
    double first_bucket_mb; /* < 0 unset = 1 */
    int overlap_comm;       /* -1 unset = 1: all-reduce buckets while backward runs */
    int comm_dtype;         /* -1 unset = gradient dtype; ACCEL_BF16 / ACCEL_F16 compress */

    /* fp16 loss scaling (GradScalerKwargs) */
    double init_scale;     /* < 0 unset = 65536 */
    double growth_factor;  /* < 0 unset = 2 */
    double backoff_factor; /* < 0 unset = 0.5 */
    int growth_interval;   /* 0 unset = 2000 */

    /* Project (ProjectConfiguration) */
    const char *project_dir;         /* NULL = none */
    const char *logging_dir;         /* NULL = project_dir */
    int automatic_checkpoint_naming; /* -1 unset = 0 */
    int total_limit;                 /* 0 unset = keep all */
    int iteration;                   /* -1 unset = 0; the counter: accel_checkpoint_iteration */
    int save_on_each_node;           /* -1 unset = 0 */

    /* Tracking */
    const char *log_with; /* comma list of tracker names or "all"; NULL = none */

    /* Sharding (version 2) */
    int zero_stage; /* -1 unset = ACCEL_ZERO_STAGE, then 0: DDP, every process holds the full
                       model and optimizer state. 1 (optimizer state sharded), 2 (+ gradients)
                       and 3 (+ parameters): docs/training.md, "ZeRO stages" */

    /* Resuming (version 3): what the first accel_prepare loads, so that a job restarted by
     * `accel launch --max_restarts N` continues where its last checkpoint left it.
     * NULL = ACCELERATE_RESUME_FROM_CHECKPOINT, then nothing. "latest": the newest valid
     * checkpoint of project_dir/checkpoints (needs project_dir and automatic_checkpoint_naming;
     * a damaged newest one is skipped, as accel_load_state(acc, NULL) does), nothing when there
     * is none yet; any other value: that checkpoint folder, which must exist. */
    const char *resume_from_checkpoint;

    /* Hybrid sharding (version 4): whom the ZeRO state (stages 1-3) is sharded over. -1 unset
     * = ACCEL_ZERO_SHARD_SIZE, then the config file (fsdp_sharding_strategy HYBRID_SHARD or
     * HYBRID_SHARD_ZERO2: ACCEL_SHARD_MACHINE), then 0: every process. N > 0: groups of N
     * consecutive processes (N divides num_processes), each holding a full replica of the
     * sharded state, gradients reduced inside a group and averaged across the groups.
     * ACCEL_SHARD_MACHINE: the processes of each machine (FSDP's HYBRID_SHARD, DeepSpeed's
     * hpZ). docs/training.md, "Hybrid sharding". */
    int zero_shard_size;
} accel_options;

/* accel_options.zero_shard_size: shard inside each machine, replicate across machines. */
#define ACCEL_SHARD_MACHINE (-2)

/* Returns options with size/version filled and every other field unset. */
ACCEL_API accel_options accel_options_default(void);

/*
 * Creates the accelerator: resolves options (argument > env > config > default), reads the
 * process layout from the environment (RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE /
 * MASTER_ADDR / MASTER_PORT, else OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*, SLURM_*), and
 * connects the communication backend (a collective call: every process must call it).
 *   out:  receives the handle on success only; free with accel_free.
 *   opts: borrowed; NULL means accel_options_default().
 * Returns ACCEL_OK; ACCEL_EINVAL naming the option or variable at fault ("RANK=abc");
 * ACCEL_ETIMEDOUT / ACCEL_EPEER when peers do not join; ACCEL_EUNSUPPORTED for a backend not
 * built in. On failure accel_last_error(NULL) holds the message.
 */
ACCEL_API accel_status accel_init(accel **out, const accel_options *opts);

/* Releases the handle and everything prepared through it (models, loaders, trackers, shared
 * memory). Not a collective: a process may free while others have died. Accepts NULL. */
ACCEL_API void accel_free(accel *acc);

/* ---- Process state (all cheap, thread-safe reads) ----
 * A NULL acc reads as no process: index -1, counts and flags 0, ACCEL_DIST_NO, the CPU,
 * "" for names, ACCEL_PRECISION_UNSET, NULL options (and accel_print prints nothing). */

ACCEL_API int accel_process_index(const accel *acc);       /* global rank, 0-based */
ACCEL_API int accel_local_process_index(const accel *acc); /* rank on this machine */
ACCEL_API int accel_num_processes(const accel *acc);
ACCEL_API int accel_local_num_processes(const accel *acc);
ACCEL_API int accel_is_main_process(const accel *acc);       /* process_index == 0 */
ACCEL_API int accel_is_local_main_process(const accel *acc); /* local index == 0 */
ACCEL_API int accel_is_last_process(const accel *acc);       /* index == num - 1 */
/* 1 when distributed_type != NO and num_processes > 1 (Accelerate's use_distributed). */
ACCEL_API int accel_use_distributed(const accel *acc);
ACCEL_API accel_distributed_type accel_distributed_type_of(const accel *acc);
/* "NO", "MULTI_CPU", "MULTI_GPU" (Accelerate's strings). Static string. */
ACCEL_API const char *accel_distributed_type_name(accel_distributed_type t);
ACCEL_API accel_device accel_device_of(const accel *acc);
/* "cpu" or "cuda:N" into a static-per-handle buffer, valid while acc lives. */
ACCEL_API const char *accel_device_name(const accel *acc);
/* The backend in use: "self", "shm", "mpi", "gloo", "hier" or "nccl". */
ACCEL_API const char *accel_backend_name(const accel *acc);
/* The communication backends built into this library, comma-separated ("self, shm"). Static
 * string. Thread-safe. */
ACCEL_API const char *accel_backends_built(void);
ACCEL_API accel_precision accel_mixed_precision(const accel *acc);
/* "no", "fp16", "bf16", "fp8". Static string. */
ACCEL_API const char *accel_precision_name(accel_precision p);
ACCEL_API int accel_gradient_accumulation_steps(const accel *acc);
/* The resolved options (every field set). Borrowed, valid while acc lives. */
ACCEL_API const accel_options *accel_resolved_options(const accel *acc);

/*
 * The resolved configuration with the source of every value, one "  name = value  [source]"
 * line each: every accel_options field, then the process layout (process_index, num_processes,
 * ...), backend, main_process_ip / main_process_port, log levels, config_file, and every other
 * environment variable accel reads that is set. Sources read "argument", "env NAME",
 * "config file PATH:KEY (line N)", "accel launch: --flag V (env NAME)" (also "accel launch:
 * config file ..." and "accel launch: default of --flag" for what the launcher passed on),
 * "default". With debug mode on (accel_options.debug, ACCELERATE_DEBUG_MODE, accel launch
 * --debug) accel_init prints it to stderr on the main process. Borrowed, valid while acc
 * lives; "" for NULL. Thread-safe.
 */
ACCEL_API const char *accel_settings_summary(const accel *acc);
/* The source / the value (as printed) of one line of that table by name ("mixed_precision",
 * "num_processes", "MLFLOW_RUN_ID", ...); NULL for a name not in it. Borrowed, valid while
 * acc lives. Thread-safe. */
ACCEL_API const char *accel_setting_source(const accel *acc, const char *name);
ACCEL_API const char *accel_setting_value(const accel *acc, const char *name);

/*
 * Accelerate's state repr:
 *   "Distributed environment: MULTI_CPU  Backend: shm\nNum processes: 2\nProcess index: 0\n
 *    Local process index: 0\nDevice: cpu\n\nMixed precision type: no\n"
 * Returns a string owned by acc, valid until the next call of this function on acc; "" for NULL.
 */
ACCEL_API const char *accel_state_summary(accel *acc);

/* ---- Process control ---- */

/* printf to stdout on the main process only (Accelerate's accelerator.print); no-op elsewhere.
 * Flushes stdout. */
ACCEL_API void accel_print(const accel *acc, const char *fmt, ...) ACCEL_PRINTF(2, 3);

/* Barrier over all processes (wait_for_everyone). Returns ACCEL_OK, ACCEL_EPEER /
 * ACCEL_ETIMEDOUT naming the process that did not arrive, or ACCEL_EINVAL (acc NULL). */
ACCEL_API accel_status accel_wait_for_everyone(accel *acc);

/*
 * main_process_first / local_main_process_first as begin/end pairs: the (local) main process
 * runs the region first, the others enter once it has left:
 *     accel_main_process_first_begin(acc); download_or_build(); accel_main_process_first_end(acc);
 * Every process must call both. Return as accel_wait_for_everyone.
 */
ACCEL_API accel_status accel_main_process_first_begin(accel *acc);
ACCEL_API accel_status accel_main_process_first_end(accel *acc);
ACCEL_API accel_status accel_local_main_process_first_begin(accel *acc);
ACCEL_API accel_status accel_local_main_process_first_end(accel *acc);

/* Run-on-process helpers (Accelerate's on_main_process & co.): call fn(ctx) only on the named
 * process, or on every process when the program is not distributed (as Accelerate); return
 * fn's status there and ACCEL_OK elsewhere (ACCEL_EINVAL when acc or fn is NULL). Not
 * collectives. */
typedef accel_status (*accel_process_fn)(void *ctx);
ACCEL_API accel_status accel_on_main_process(accel *acc, accel_process_fn fn, void *ctx);
ACCEL_API accel_status accel_on_local_main_process(accel *acc, accel_process_fn fn, void *ctx);
ACCEL_API accel_status accel_on_last_process(accel *acc, accel_process_fn fn, void *ctx);
ACCEL_API accel_status accel_on_process(accel *acc, int process_index, accel_process_fn fn,
                                        void *ctx);
ACCEL_API accel_status accel_on_local_process(accel *acc, int local_process_index,
                                              accel_process_fn fn, void *ctx);

/* ---- Preparing objects ---- */

/*
 * Accelerate's prepare(): takes models, optimizers, schedulers and loaders created on this
 * accelerator, in any order, and readies them for distributed training (models: process 0's
 * weights broadcast and gradient buckets built; loaders: sharded over processes; ...). Models
 * are prepared before optimizers, optimizers before schedulers, whatever the argument order.
 * A collective: every process must call it with the same objects. Preparing an object twice
 * is a no-op. Use the macro: accel_prepare(acc, model, opt, sched, loader).
 * With resume_from_checkpoint set (accel_options), the first accel_prepare of the accelerator
 * then loads that checkpoint into every object (accel_load_state, a collective whose outcome
 * every process shares): prepare everything in that one call and register objects for
 * checkpointing before it. accel_checkpoint_dir(acc) then names the folder loaded (NULL when
 * "latest" found none).
 * Returns ACCEL_OK, ACCEL_EINVAL naming the argument that is not an accel object or belongs
 * to another accelerator, the first failure of an object's preparation, or accel_load_state's
 * failure (a damaged or mismatching checkpoint, ACCEL_ENOTFOUND for a missing folder).
 */
ACCEL_API accel_status accel_prepare_objects(accel *acc, int n, void *const *objs);
#ifndef __cplusplus
#define accel_prepare(acc, ...)                                                                    \
    accel_prepare_objects((acc), (int)(sizeof((void *[]){__VA_ARGS__}) / sizeof(void *)),          \
                          (void *[]){__VA_ARGS__})
#else /* C++ (CUDA sources) has no compound literals: a function template, below */
#define accel_prepare(acc, ...) accel__prepare_cpp((acc), __VA_ARGS__)
#endif

/*
 * Accelerate's free_memory(): frees every model, optimizer, scheduler and loader still alive on
 * acc (their handles become invalid) and resets the step counters, so another training can
 * follow in the same process. Not a collective.
 */
ACCEL_API void accel_free_memory(accel *acc);

/* ---- Seeds and random generators (Accelerate's set_seed / synchronize_rng_states) ---- */

/* Words in a generator state (xoshiro256**, see docs/data.md). */
#define ACCEL_RNG_STATE_WORDS 4

/*
 * Seeds the accelerator's generator, the one nn uses for parameter initialisation and dropout
 * and from which loaders created afterwards without an explicit seed draw theirs. With
 * device_specific the process index is added to `seed` first (Accelerate's set_seed), so every
 * process gets a different stream. Call it before creating models and loaders. Not a
 * collective. Returns ACCEL_OK or ACCEL_EINVAL (acc NULL).
 */
ACCEL_API accel_status accel_set_seed(accel *acc, uint64_t seed, int device_specific);

/* Copies process 0's generator state to every process (a collective). Returns ACCEL_OK or the
 * communication failure. */
ACCEL_API accel_status accel_synchronize_rng_states(accel *acc);

/* Reads / restores the accelerator's generator state (for checkpoints). set rejects an
 * all-zero state with ACCEL_EINVAL. Same thread as acc. */
ACCEL_API accel_status accel_get_rng_state(accel *acc, uint64_t state[ACCEL_RNG_STATE_WORDS]);
ACCEL_API accel_status accel_set_rng_state(accel *acc,
                                           const uint64_t state[ACCEL_RNG_STATE_WORDS]);

#ifdef __cplusplus
}

template <typename... T> static inline accel_status accel__prepare_cpp(accel *acc, T *...objs)
{
    void *v[] = {static_cast<void *>(objs)...};
    return accel_prepare_objects(acc, (int)sizeof...(T), v);
}
#endif

#endif /* ACCEL_CORE_H */
