/*
 * The accelerator handle's life: option resolution (argument > environment > config file >
 * default, each value's source recorded in core/settings.c), accel_init and accel_free. After
 * accel_init every field of acc->opt is resolved, so no other module re-reads the environment.
 * The process layout and the communicator are in layout.c; state queries and process control
 * are in process.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/fs.h"
#include "comm/comm.h"
#include "config.h"
#include "device/device.h"
#include "device/sim.h"
#include "internal.h"
#include "layout.h"
#include "profile.h"
#include "settings.h"

accel_options accel_options_default(void)
{
    accel_options o;
    memset(&o, 0, sizeof(o));
    o.size = (uint32_t)sizeof(o);
    o.version = ACCEL_OPTIONS_VERSION;
    o.cpu = -1;
    o.timeout_s = -1;
    o.debug = -1;
    o.mixed_precision = ACCEL_PRECISION_UNSET;
    o.sync_with_dataloader = -1;
    o.sync_each_batch = -1;
    o.adjust_scheduler = -1;
    o.step_scheduler_with_optimizer = -1;
    o.split_batches = -1;
    o.dispatch_batches = -1;
    o.even_batches = -1;
    o.use_seedable_sampler = -1;
    o.bucket_cap_mb = -1;
    o.first_bucket_mb = -1;
    o.overlap_comm = -1;
    o.comm_dtype = -1;
    o.zero_stage = -1;
    o.init_scale = -1;
    o.growth_factor = -1;
    o.backoff_factor = -1;
    o.automatic_checkpoint_naming = -1;
    o.iteration = -1;
    o.save_on_each_node = -1;
    o.zero_shard_size = -1;
    return o;
}

/* ---- option resolution ---- */

static accel_status parse_precision(const char *s, accel_precision *out)
{
    static const char *names[] = {"no", "fp16", "bf16", "fp8"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = (accel_precision)i;
            return ACCEL_OK;
        }
    }
    return ACCEL_EINVAL;
}

/* The resolution after the config file is read (cfg borrowed, released by the caller). */
static accel_status resolve_with(accel_options *o, const accel__config *cfg, accel__settings *set);

/* "config file PATH:KEY (line N)" as the source of an option. */
static void src_config(accel__settings *set, accel__option_id id, const accel__config *cfg,
                       const char *key)
{
    int line = accel__config_line(cfg, key);
    accel__settings_src(set, id, "config file %s:%s%s%.0d%s", cfg->path, key,
                        line > 0 ? " (line " : "", line, line > 0 ? ")" : "");
}

/* zero_shard_size against the processes: groups of equal size, so the shards of every
 * replica match. */
static accel_status check_shard_size(const accel_options *o, const accel__layout *l)
{
    int n = o->zero_shard_size == ACCEL_SHARD_MACHINE ? l->local_n_ranks : o->zero_shard_size;
    if (n > 0 && l->n_ranks % n != 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             o->zero_shard_size == ACCEL_SHARD_MACHINE
                                 ? "zero_shard_size=machine: %d processes per machine do not "
                                   "divide the %d processes (hybrid sharding needs equal machines)"
                                 : "zero_shard_size=%d does not divide the %d processes",
                             n, l->n_ranks);
    }
    return ACCEL_OK;
}

static accel_status resolve_options(accel_options *o, const accel__layout *l, accel__settings *set)
{
    accel__config cfg;
    ACCEL_TRY(accel__config_load(o->config_file, &cfg));
    if (l->rank == 0) {
        accel__config_warn(&cfg, l->launched);
    }
    /* Which file: the argument, ACCELERATE_CONFIG_FILE, or the default location. */
    char src[ACCEL__SOURCE_NBYTES];
    if (o->config_file != NULL) {
        snprintf(src, sizeof(src), "argument");
    } else if (cfg.explicit_path) {
        accel__settings_env_source(set, "ACCELERATE_CONFIG_FILE", src, sizeof(src));
    } else {
        snprintf(src, sizeof(src), "default location");
    }
    char value[sizeof(cfg.path) + 16];
    snprintf(value, sizeof(value), "%s%s", cfg.path, cfg.present ? "" : " (none there)");
    accel_status st = accel__settings_add(set, "config_file", value, src);
    if (st == ACCEL_OK) {
        st = resolve_with(o, &cfg, set);
    }
    if (st == ACCEL_OK) {
        st = check_shard_size(o, l);
    }
    accel__config_free(&cfg);
    return st;
}

static accel_status resolve_with(accel_options *o, const accel__config *cfg, accel__settings *set)
{
    /* mixed precision: argument > ACCELERATE_MIXED_PRECISION > config file > "no" */
    if (o->mixed_precision == ACCEL_PRECISION_UNSET) {
        const char *s;
        o->mixed_precision = ACCEL_PRECISION_NO;
        if (cfg->mixed_precision[0] != '\0') {
            parse_precision(cfg->mixed_precision, &o->mixed_precision); /* checked by the reader */
            src_config(set, ACCEL__OPT_mixed_precision, cfg, "mixed_precision");
        }
        if (accel__env_string("ACCELERATE_MIXED_PRECISION", &s) == ACCEL_OK) {
            if (parse_precision(s, &o->mixed_precision) != ACCEL_OK) {
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "environment variable ACCELERATE_MIXED_PRECISION=\"%s\" is "
                                     "not one of no, fp16, bf16, fp8",
                                     s);
            }
            accel__settings_src_env(set, ACCEL__OPT_mixed_precision, "ACCELERATE_MIXED_PRECISION");
        }
    } else if ((int)o->mixed_precision < ACCEL_PRECISION_NO ||
               o->mixed_precision > ACCEL_PRECISION_FP8) {
        return accel__seterr(NULL, ACCEL_EINVAL, "option mixed_precision=%d is not valid",
                             (int)o->mixed_precision);
    }
    if (o->mixed_precision == ACCEL_PRECISION_FP8) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "mixed_precision=fp8 needs a GPU with fp8 support; use bf16 or fp16");
    }

    /* gradient accumulation: argument > env > config file (deepspeed_config) > 1 (Accelerate
     * lets the env win; we keep the one precedence rule everywhere, docs/configuration.md). */
    if (o->gradient_accumulation_steps < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "option gradient_accumulation_steps=%d must be >= 1",
                             o->gradient_accumulation_steps);
    }
    if (o->gradient_accumulation_steps == 0) {
        long long v = cfg->gradient_accumulation_steps > 0 ? cfg->gradient_accumulation_steps : 1;
        if (cfg->gradient_accumulation_steps > 0) {
            src_config(set, ACCEL__OPT_gradient_accumulation_steps, cfg,
                       "deepspeed_config.gradient_accumulation_steps");
        }
        accel_status st = accel__env_int("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", &v);
        if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
            return st;
        }
        if (st == ACCEL_OK) {
            accel__settings_src_env(set, ACCEL__OPT_gradient_accumulation_steps,
                                    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
        }
        if (v < 1 || v > 1 << 30) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable ACCELERATE_GRADIENT_ACCUMULATION_STEPS=%lld "
                                 "must be >= 1",
                                 v);
        }
        o->gradient_accumulation_steps = (int)v;
    }

    /* cpu: OR of the argument and ACCELERATE_USE_CPU, as Accelerate. */
    int env_cpu = 0;
    accel_status st = accel__env_bool("ACCELERATE_USE_CPU", &env_cpu);
    if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
        return st;
    }
    /* The source is the first that says yes (the argument's "argument" is filled in later). */
    if (o->cpu <= 0 && env_cpu) {
        accel__settings_src_env(set, ACCEL__OPT_cpu, "ACCELERATE_USE_CPU");
    } else if (o->cpu <= 0 && cfg->use_cpu > 0) {
        src_config(set, ACCEL__OPT_cpu, cfg, "use_cpu");
    }
    o->cpu = (o->cpu > 0) || env_cpu || cfg->use_cpu > 0;

    if (o->debug < 0) {
        o->debug = cfg->debug > 0;
        if (cfg->debug >= 0) {
            src_config(set, ACCEL__OPT_debug, cfg, "debug");
        }
        st = accel__env_bool("ACCELERATE_DEBUG_MODE", &o->debug);
        if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
            return st;
        }
        if (st == ACCEL_OK) {
            accel__settings_src_env(set, ACCEL__OPT_debug, "ACCELERATE_DEBUG_MODE");
        }
    }

    if (o->timeout_s < 0) {
        o->timeout_s = 1800;
        st = accel__env_real("ACCEL_TIMEOUT", &o->timeout_s);
        if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
            return st;
        }
        if (st == ACCEL_OK) {
            accel__settings_src_env(set, ACCEL__OPT_timeout_s, "ACCEL_TIMEOUT");
        }
        if (o->timeout_s <= 0) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable ACCEL_TIMEOUT=%g must be > 0", o->timeout_s);
        }
    } else if (o->timeout_s == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "option timeout_s=0 must be > 0");
    }

#define DEFAULT_FLAG(field, value)                                                                 \
    do {                                                                                           \
        if (o->field < 0) {                                                                        \
            o->field = (value);                                                                    \
        }                                                                                          \
    } while (0)
    DEFAULT_FLAG(sync_with_dataloader, 1);
    DEFAULT_FLAG(sync_each_batch, 0);
    DEFAULT_FLAG(adjust_scheduler, 0);
    DEFAULT_FLAG(step_scheduler_with_optimizer, 1);
    DEFAULT_FLAG(split_batches, 0);
    /* dispatch_batches stays -1: its default depends on the dataset kind (data module). */
    DEFAULT_FLAG(even_batches, 1);
    DEFAULT_FLAG(use_seedable_sampler, 0);
    DEFAULT_FLAG(bucket_cap_mb, 25.0);
    DEFAULT_FLAG(first_bucket_mb, 1.0);
    DEFAULT_FLAG(overlap_comm, 1);
    DEFAULT_FLAG(init_scale, 65536.0);
    DEFAULT_FLAG(growth_factor, 2.0);
    DEFAULT_FLAG(backoff_factor, 0.5);
    DEFAULT_FLAG(automatic_checkpoint_naming, 0);
    DEFAULT_FLAG(iteration, 0);
    DEFAULT_FLAG(save_on_each_node, 0);
#undef DEFAULT_FLAG
    if (o->growth_interval == 0) {
        o->growth_interval = 2000;
    }
    if (o->growth_interval < 0 || o->total_limit < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "option %s must be >= 0",
                             o->growth_interval < 0 ? "growth_interval" : "total_limit");
    }
    if (o->logging_dir == NULL) {
        o->logging_dir = o->project_dir;
        accel__settings_src(set, ACCEL__OPT_logging_dir, "default (project_dir)");
    }

    /* ZeRO stage: argument > ACCEL_ZERO_STAGE > config file (deepspeed_config, fsdp_config)
     * > 0. */
    if (o->zero_stage < 0) {
        long long v = cfg->zero_stage > 0 ? cfg->zero_stage : 0;
        st = accel__env_int("ACCEL_ZERO_STAGE", &v);
        if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
            return st;
        }
        if (v < 0 || v > 3) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable ACCEL_ZERO_STAGE=%lld must be 0, 1, 2 or 3",
                                 v);
        }
        o->zero_stage = (int)v;
        if (st == ACCEL_OK) {
            accel__settings_src_env(set, ACCEL__OPT_zero_stage, "ACCEL_ZERO_STAGE");
        } else if (cfg->zero_stage > 0) {
            src_config(set, ACCEL__OPT_zero_stage, cfg, cfg->zero_stage_key);
        }
    } else if (o->zero_stage > 3) {
        return accel__seterr(NULL, ACCEL_EINVAL, "option zero_stage=%d must be 0, 1, 2 or 3",
                             o->zero_stage);
    }
    /* Hybrid sharding: argument > ACCEL_ZERO_SHARD_SIZE (a count or "machine") > config file
     * (a HYBRID_SHARD strategy) > 0 (every process). The count is checked against the layout
     * by check_shard_size. */
    if (o->zero_shard_size == -1) {
        const char *s;
        o->zero_shard_size = cfg->zero_hybrid ? ACCEL_SHARD_MACHINE : 0;
        if (accel__env_string("ACCEL_ZERO_SHARD_SIZE", &s) == ACCEL_OK) {
            char *end = NULL;
            long v = strtol(s, &end, 10);
            if (strcasecmp(s, "machine") == 0) {
                o->zero_shard_size = ACCEL_SHARD_MACHINE;
            } else if (end != s && *end == '\0' && v >= 0 && v <= 1 << 24) {
                o->zero_shard_size = (int)v;
            } else {
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "environment variable ACCEL_ZERO_SHARD_SIZE=\"%s\" is not a "
                                     "process count >= 0 or \"machine\"",
                                     s);
            }
            accel__settings_src_env(set, ACCEL__OPT_zero_shard_size, "ACCEL_ZERO_SHARD_SIZE");
        } else if (cfg->zero_hybrid) {
            src_config(set, ACCEL__OPT_zero_shard_size, cfg, "fsdp_config.fsdp_sharding_strategy");
        }
    } else if (o->zero_shard_size < 0 && o->zero_shard_size != ACCEL_SHARD_MACHINE) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "option zero_shard_size=%d must be >= 0 or ACCEL_SHARD_MACHINE",
                             o->zero_shard_size);
    }
    /* resume_from_checkpoint: argument > ACCELERATE_RESUME_FROM_CHECKPOINT > none. */
    if (o->resume_from_checkpoint == NULL) {
        if (accel__env_string("ACCELERATE_RESUME_FROM_CHECKPOINT", &o->resume_from_checkpoint) ==
            ACCEL_OK) {
            accel__settings_src_env(set, ACCEL__OPT_resume_from_checkpoint,
                                    "ACCELERATE_RESUME_FROM_CHECKPOINT");
        } else {
            o->resume_from_checkpoint = NULL;
        }
    }
    if (o->resume_from_checkpoint != NULL && o->resume_from_checkpoint[0] == '\0') {
        o->resume_from_checkpoint = NULL;
    }
    if (o->resume_from_checkpoint != NULL && strcmp(o->resume_from_checkpoint, "latest") == 0 &&
        (o->project_dir == NULL || o->automatic_checkpoint_naming != 1)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "resume_from_checkpoint=latest needs project_dir and "
                             "automatic_checkpoint_naming (the checkpoints it looks for are "
                             "project_dir/checkpoints/checkpoint_<n>)");
    }
    return ACCEL_OK;
}

/* Everything accel_init decides before it creates the handle: the log level, the process
 * layout, the options, and the environment values modules read later, with their sources. */
static accel_status resolve_all(accel_options *o, accel__layout *l, accel__log_level *log_level,
                                accel__settings *set)
{
    *log_level = ACCEL__LOG_WARN;
    char src[ACCEL__SOURCE_NBYTES] = "default";
    const char *lvl;
    if (accel__env_string("ACCEL_LOG_LEVEL", &lvl) == ACCEL_OK) {
        int level = accel__log_parse_level(lvl);
        if (level < 0) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable ACCEL_LOG_LEVEL=\"%s\" is not one of "
                                 "debug, info, warn, error, off",
                                 lvl);
        }
        *log_level = (accel__log_level)level;
        accel__settings_env_source(set, "ACCEL_LOG_LEVEL", src, sizeof(src));
    }
    static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
    ACCEL_TRY(accel__settings_add(set, "log_level", level_names[*log_level], src));
    /* The handle-less log context reads ACCEL_LOG_LEVEL once: now, not at its first use. */
    (void)accel__log_default();
    ACCEL_TRY(accel__layout_read(l));
    ACCEL_TRY(accel__layout_record(l, set));
    ACCEL_TRY(resolve_options(o, l, set));
    return accel__settings_read_env(set);
}

/* ACCEL_SIM_GPU=n: n simulated GPUs stand in for CUDA (a testing aid of builds without CUDA;
 * src/device/sim.h). A CUDA build refuses it, so a real GPU is never replaced unnoticed. */
static accel_status sim_gpus_env(int *n_sim)
{
    long long n = 0;
    accel_status st = accel__env_int("ACCEL_SIM_GPU", &n);
    *n_sim = 0;
    if (st == ACCEL_ENOTFOUND || (st == ACCEL_OK && n == 0)) {
        return ACCEL_OK;
    }
    if (st != ACCEL_OK) {
        return st;
    }
#ifdef ACCEL_HAVE_CUDA
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "accel_init: ACCEL_SIM_GPU=%lld: simulated GPUs are a testing aid of "
                         "builds without CUDA, and this build drives real GPUs (unset "
                         "ACCEL_SIM_GPU)",
                         n);
#else
    if (n < 0 || n > ACCEL__SIM_MAX_GPUS) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_init: environment variable ACCEL_SIM_GPU=%lld must be 0..%d", n,
                             ACCEL__SIM_MAX_GPUS);
    }
    *n_sim = (int)n;
    return ACCEL_OK;
#endif
}

accel_status accel_init(accel **out, const accel_options *opts)
{
    if (out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_init: argument out is NULL");
    }
    accel__keep_std_streams(); /* before any socket, pipe or shared-memory file takes fd 0-2 */
    /* A program built against an older layout passed fewer fields: the rest stay unset. */
    accel_options o = accel_options_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(NULL, "accel_init", accel_options, &o, opts, log_with));
    const accel_options given = o;

    accel__settings *set;
    ACCEL_TRY(accel__settings_new(&set));
    accel__layout l;
    accel__log_level log_level;
    accel_status st = resolve_all(&o, &l, &log_level, set);
    accel *acc = st == ACCEL_OK ? accel__calloc(1, sizeof(*acc)) : NULL;
    if (acc == NULL) {
        accel__settings_free(set);
        return st != ACCEL_OK ? st : accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    }
    acc->settings = set;
    acc->opt = o;
    /* Borrowed strings in the options must outlive accel_init: keep copies. */
    acc->opt.backend = NULL;
    acc->opt.config_file = NULL;
    acc->opt.project_dir = accel__strdup(o.project_dir);
    acc->opt.logging_dir = accel__strdup(o.logging_dir);
    acc->opt.log_with = accel__strdup(o.log_with);
    acc->opt.resume_from_checkpoint = accel__strdup(o.resume_from_checkpoint);
    accel__settings_views(set, &acc->opt);
    acc->resume_pending = o.resume_from_checkpoint != NULL;
    acc->rank = l.rank;
    acc->n_ranks = l.n_ranks;
    acc->local_rank = l.local_rank;
    acc->local_n_ranks = l.local_n_ranks;
    acc->log.rank = l.rank;
    acc->log.n_ranks = l.n_ranks;
    acc->log.level = log_level;
    st = accel__trace_new(&acc->trace);
    if (st != ACCEL_OK) {
        accel__settings_free(set);
        accel__free(acc);
        return st;
    }

    st = accel__layout_machines(acc);
    if (st == ACCEL_OK) {
        st = sim_gpus_env(&acc->sim_gpus);
    }
    if (st == ACCEL_OK) {
        st = accel__device_setup(acc, l.launched);
    }
    if (st == ACCEL_OK) {
        st = accel__layout_comm_open(acc, &o, &l, set);
    }
    if (st == ACCEL_OK) {
        st = accel__settings_finish(set, &given, &o);
    }
    if (st == ACCEL_OK) {
        /* Two machines' config files or environments differing would otherwise train
         * something else without a word: every process fails alike, naming the setting. */
        st = accel__settings_agree(acc);
    }
    if (st == ACCEL_OK) {
        accel__comm_set_debug(acc->comm, acc->opt.debug != 0);
    }
    if (st != ACCEL_OK) {
        accel_free(acc);
        return st; /* the thread error already names the cause */
    }
    accel__log(&acc->log, ACCEL__LOG_INFO, "initialised: %d processes, backend %s, device %s",
               l.n_ranks, acc->backend, acc->device_name);
    if (acc->opt.debug && acc->rank == 0) {
        /* ACCELERATE_DEBUG_MODE / accel launch --debug: what this job runs with, and why. */
        accel__settings_print(set, acc->n_ranks);
    }
    *out = acc;
    return ACCEL_OK;
}

void accel__module_set(accel *acc, accel__module_id id, void *state,
                       void (*free_fn)(accel *acc, void *state))
{
    acc->modules[id].state = state;
    acc->modules[id].free_fn = free_fn;
}

void accel__module_release(accel *acc, accel__module_id id)
{
    if (acc->modules[id].state != NULL && acc->modules[id].free_fn != NULL) {
        acc->modules[id].free_fn(acc, acc->modules[id].state);
    }
    acc->modules[id].state = NULL;
    acc->modules[id].free_fn = NULL;
}

void accel_free(accel *acc)
{
    if (acc == NULL) {
        return;
    }
    accel_free_memory(acc);
    for (int i = ACCEL__MOD_COUNT - 1; i >= 0; i--) {
        accel__module_release(acc, (accel__module_id)i);
    }
    /* A session the program forgot to end still produces its file (no barrier: accel_free is
     * not a collective). The recorder goes after the communicator, whose thread records. */
    accel__profile_finish_local(acc);
    accel__comm_free(acc->comm);
    if (acc->dev != NULL) {
        accel__coll_stage_free(acc);
        accel__device_close(acc->dev);
    }
    accel__trace_free(acc->trace);
    accel__free(acc->profile_path);
    accel__free((void *)acc->opt.project_dir);
    accel__free((void *)acc->opt.logging_dir);
    accel__free((void *)acc->opt.log_with);
    accel__free((void *)acc->opt.resume_from_checkpoint);
    accel__free(acc->summary);
    accel__settings_free(acc->settings);
    accel__free(acc);
}

/* ---- state repr (the other state queries are in process.c) ---- */

const char *accel_state_summary(accel *acc)
{
    if (acc == NULL) {
        return ""; /* as accel_settings_summary */
    }
    /* On a GPU, a line naming it, its driver, runtime and NCCL versions follows the device. */
    char gpu[512] = "";
#ifdef ACCEL_HAVE_CUDA
    if (acc->device.type == ACCEL_DEVICE_CUDA) {
        char about[256], nccl[32];
        accel__device_describe(acc->dev, about, sizeof(about));
        accel__nccl_version(nccl, sizeof(nccl));
        snprintf(gpu, sizeof(gpu), "GPU: %s, NCCL %s\n", about, nccl);
    }
#endif
    /* Several machines add where this process is and what each level runs on (Accelerate's
     * lines stay as they are, so one machine prints exactly its repr). */
    char machines[512] = "";
    if (acc->n_machines > 1 && acc->comm != NULL) {
        char levels[256];
        accel__comm_describe(acc->comm, levels, sizeof(levels));
        snprintf(machines, sizeof(machines), "Num machines: %d\nMachine index: %d\nComm: %s\n",
                 acc->n_machines, acc->machine_rank, levels);
    }
    char buf[1536];
    snprintf(buf, sizeof(buf),
             "Distributed environment: %s  Backend: %s\nNum processes: %d\nProcess index: %d\n"
             "Local process index: %d\n%sDevice: %s\n%s\nMixed precision type: %s\n",
             accel_distributed_type_name(acc->dist_type), acc->backend, acc->n_ranks, acc->rank,
             acc->local_rank, machines, acc->device_name, gpu,
             accel_precision_name(acc->opt.mixed_precision));
    accel__free(acc->summary);
    acc->summary = accel__strdup(buf);
    return acc->summary != NULL ? acc->summary : "";
}
