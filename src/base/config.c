/*
 * Reads Accelerate's config file into accel__config (base/config.h). JSON configs parse too
 * (JSON is YAML flow syntax). Every key any Accelerate version writes has one policy in the
 * tables below (the table in docs/configuration.md is the same):
 *   used      accel acts on it (the library, or accel launch); a malformed value is an error
 *             naming the file and the line;
 *   accepted  nothing for accel to do whatever the value (launcher details, PyTorch wrapping);
 *   ignored   accel does not do what it configures: a note when the value asks for something,
 *             silence for the neutral values Accelerate writes by default (false, 'no', {},
 *             []), so a stock file stays quiet;
 *   refused   ACCEL_EUNSUPPORTED when the value asks for it, rather than silently running
 *             something else.
 * Keys not in the tables (a newer Accelerate, a typo) are noted, never an error: accel reads
 * the default location on its own, so a file written for Python must not stop C programs.
 */
#include "base/config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/fs.h"

/* Why a GPU setting does not apply in a build without CUDA. A CUDA build runs MULTI_GPU (each
 * process takes GPU LOCAL_RANK, src/core/device_select.c) and accel launch passes gpu_ids on
 * as CUDA_VISIBLE_DEVICES. */
#define NO_GPU "this build of accel has no CUDA (configure with -DACCEL_CUDA=ON), it runs on the CPU"

/* ---- values ---- */

static int neutral_text(const char *v)
{
    return v[0] == '\0' || strcmp(v, "~") == 0 || strcasecmp(v, "null") == 0 ||
           strcmp(v, "None") == 0 || strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0 ||
           strcmp(v, "0") == 0 || strcasecmp(v, "none") == 0;
}

/* A value that asks for nothing: a neutral scalar, or a mapping / sequence of them. */
static int neutral(const accel__ynode *v)
{
    if (v->kind == ACCEL__Y_SCALAR) {
        return neutral_text(v->text);
    }
    for (int i = 0; i < v->n; i++) {
        if (!neutral(v->items[i])) {
            return 0;
        }
    }
    return 1;
}

/* The value as written, short: "true", "{ipex: true}", "[a, b]". */
static size_t describe_to(const accel__ynode *v, char *out, size_t cap)
{
    if (cap == 0) {
        return 0;
    }
    if (v->kind == ACCEL__Y_SCALAR) {
        int k = snprintf(out, cap, "%.150s", v->text);
        return k < 0 ? 0 : (size_t)k < cap ? (size_t)k : cap - 1;
    }
    size_t k = (size_t)snprintf(out, cap, "%c", v->kind == ACCEL__Y_MAP ? '{' : '[');
    for (int i = 0; i < v->n && k + 1 < cap; i++) {
        if (k + 8 >= cap) {
            k += (size_t)snprintf(out + k, cap - k, ", ...");
            break;
        }
        k += (size_t)snprintf(out + k, cap - k, "%s%.40s%s", i ? ", " : "",
                              v->kind == ACCEL__Y_MAP ? v->keys[i] : "",
                              v->kind == ACCEL__Y_MAP ? ": " : "");
        k = k < cap ? k : cap - 1;
        k += describe_to(v->items[i], out + k, cap - k);
    }
    if (k + 1 < cap) {
        k += (size_t)snprintf(out + k, cap - k, "%c", v->kind == ACCEL__Y_MAP ? '}' : ']');
    }
    return k < cap ? k : cap - 1;
}

static const char *describe(const accel__ynode *v, char *out, size_t cap)
{
    describe_to(v, out, cap);
    return out;
}

/* ---- messages: "config file P, line L: key: ..." ---- */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
note(accel__config *c, const accel__ynode *v, const char *fmt, ...)
{
    size_t cap = sizeof(c->notes[0]);
    if (c->n_notes >= ACCEL__CONFIG_MAX_NOTES) {
        /* Past the cap the last note says how many were left out, rather than the list
         * ending as if complete (a file of 300,000 unknown keys showed 24). */
        c->n_notes_cut += c->n_notes_cut == 0 ? 2 : 1;
        snprintf(c->notes[ACCEL__CONFIG_MAX_NOTES - 1], cap,
                 "config file %.400s: %d more notes like the ones above, not shown", c->path,
                 c->n_notes_cut);
        return;
    }
    char *out = c->notes[c->n_notes++];
    int k = snprintf(out, cap, "config file %s, line %d: ", c->path, v->line);
    if (k > 0 && (size_t)k < cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(out + k, cap - (size_t)k, fmt, ap);
        va_end(ap);
    }
}

static accel_status bad(const accel__config *c, const char *key, const accel__ynode *v,
                        const char *want)
{
    char val[200];
    return accel__seterr(NULL, ACCEL_EINVAL, "config file %s, line %d: %s: \"%s\" is not %s",
                         c->path, v->line, key, describe(v, val, sizeof(val)), want);
}

static accel_status refuse(const accel__config *c, const char *key, const accel__ynode *v,
                           const char *why)
{
    char val[200];
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                         "config file %s, line %d: %s: %s is not supported: %s%s", c->path,
                         v->line, key, describe(v, val, sizeof(val)), why,
                         c->explicit_path ? ""
                                          : " (accel reads this default location on its own; "
                                            "set ACCELERATE_CONFIG_FILE to use another file)");
}

/* ---- typed getters: a null value leaves *out as it is ---- */

static accel_status get_int(const accel__config *c, const char *key, const accel__ynode *v,
                            long lo, long hi, int *out)
{
    if (accel__yscalar_is_null(v)) {
        return ACCEL_OK;
    }
    char *end;
    errno = 0;
    long x = v->kind == ACCEL__Y_SCALAR ? strtol(v->text, &end, 10) : 0;
    if (v->kind != ACCEL__Y_SCALAR || errno != 0 || end == v->text || *end != '\0' || x < lo ||
        x > hi) {
        char want[64];
        snprintf(want, sizeof(want), "an integer from %ld to %ld", lo, hi);
        return bad(c, key, v, want);
    }
    *out = (int)x;
    return ACCEL_OK;
}

static accel_status get_bool(const accel__config *c, const char *key, const accel__ynode *v,
                             int *out)
{
    if (accel__yscalar_is_null(v)) {
        return ACCEL_OK;
    }
    int b = v->kind == ACCEL__Y_SCALAR ? accel__parse_bool(v->text) : -1;
    if (b < 0) {
        return bad(c, key, v, "true or false");
    }
    *out = b;
    return ACCEL_OK;
}

/* A short scalar (kept in the tree; *out borrows it). */
static accel_status get_str(const accel__config *c, const char *key, const accel__ynode *v,
                            const char **out)
{
    if (accel__yscalar_is_null(v)) {
        return ACCEL_OK;
    }
    if (v->kind != ACCEL__Y_SCALAR || strlen(v->text) > 1000) {
        return bad(c, key, v, "a string");
    }
    *out = v->text;
    return ACCEL_OK;
}

static accel_status get_name(const accel__config *c, const char *key, const accel__ynode *v,
                             char *out, size_t cap)
{
    const char *s = NULL;
    ACCEL_TRY(get_str(c, key, v, &s));
    if (s != NULL && strlen(s) >= cap) {
        return bad(c, key, v, "a known name");
    }
    if (s != NULL) {
        strcpy(out, s);
    }
    return ACCEL_OK;
}

/* ---- the keys ---- */

typedef accel_status (*key_fn)(accel__config *c, const char *key, const accel__ynode *v);

typedef enum { USED, ACCEPTED, IGNORED, REFUSED } key_policy;

typedef struct key_rule {
    const char *name;
    key_policy policy;
    key_fn use;         /* USED: checks and keeps the value */
    const char *reason; /* IGNORED / REFUSED: why, for the note or the error */
} key_rule;

static accel_status use_distributed_type(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_name(c, key, v, c->distributed_type, sizeof(c->distributed_type));
}

static accel_status use_compute_environment(accel__config *c, const char *key,
                                            const accel__ynode *v)
{
    return get_name(c, key, v, c->compute_environment, sizeof(c->compute_environment));
}

static accel_status use_mixed_precision(accel__config *c, const char *key, const accel__ynode *v)
{
    static const char *names[] = {"no", "fp16", "bf16", "fp8"};
    if (accel__yscalar_is_null(v)) {
        return ACCEL_OK;
    }
    for (int i = 0; v->kind == ACCEL__Y_SCALAR && i < 4; i++) {
        if (strcasecmp(v->text, names[i]) == 0) {
            strcpy(c->mixed_precision, names[i]);
            return ACCEL_OK;
        }
    }
    return bad(c, key, v, "one of no, fp16, bf16, fp8");
}

/* Legacy (Accelerate < 0.12): fp16: true means mixed_precision fp16 (applied in validate, so
 * that mixed_precision wins whatever the order). */
static accel_status use_fp16(accel__config *c, const char *key, const accel__ynode *v)
{
    int b = 0;
    return get_bool(c, key, v, &b);
}

static accel_status use_use_cpu(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_bool(c, key, v, &c->use_cpu);
}

static accel_status use_debug(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_bool(c, key, v, &c->debug);
}

/* -1 is Accelerate's "pass --num_processes on the command line" (its ClusterConfig default). */
static accel_status use_num_processes(accel__config *c, const char *key, const accel__ynode *v)
{
    ACCEL_TRY(get_int(c, key, v, -1, 1 << 20, &c->num_processes));
    return c->num_processes == 0 ? bad(c, key, v, "a process count (1 or more)") : ACCEL_OK;
}

static accel_status use_num_machines(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_int(c, key, v, 1, 1 << 20, &c->num_machines);
}

static accel_status use_machine_rank(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_int(c, key, v, 0, 1 << 20, &c->machine_rank);
}

static accel_status use_main_process_port(accel__config *c, const char *key,
                                          const accel__ynode *v)
{
    return get_int(c, key, v, 0, 65535, &c->main_process_port);
}

static accel_status use_main_process_ip(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_str(c, key, v, &c->main_process_ip);
}

static accel_status use_rdzv_backend(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_str(c, key, v, &c->rdzv_backend);
}

static accel_status use_same_network(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_bool(c, key, v, &c->same_network);
}

/* "all" (what `accelerate config` writes) or a comma-separated list of device ids. */
static accel_status use_gpu_ids(accel__config *c, const char *key, const accel__ynode *v)
{
    ACCEL_TRY(get_str(c, key, v, &c->gpu_ids));
    if (c->gpu_ids != NULL && strcasecmp(c->gpu_ids, "all") != 0) {
        if (!accel__config_gpu_ids_valid(c->gpu_ids)) {
            return bad(c, key, v, "all or a comma-separated list of device ids");
        }
#if !defined(ACCEL_HAVE_CUDA)
        note(c, v, "ignoring %s: %s (%s)", key, c->gpu_ids, NO_GPU);
#endif
    }
    return ACCEL_OK;
}

static accel_status use_mpirun_config(accel__config *c, const char *key, const accel__ynode *v)
{
    if (v->kind != ACCEL__Y_MAP) {
        return accel__yscalar_is_null(v) ? ACCEL_OK : bad(c, key, v, "a mapping");
    }
    const accel__ynode *h = accel__ynode_get(v, "mpirun_hostfile");
    return h != NULL ? get_str(c, "mpirun_config.mpirun_hostfile", h, &c->mpirun_hostfile)
                     : ACCEL_OK;
}

/* Sections read once distributed_type is known (validate): only checked to be mappings here. */
static accel_status use_section(accel__config *c, const char *key, const accel__ynode *v)
{
    return v->kind == ACCEL__Y_MAP || accel__yscalar_is_null(v) ? ACCEL_OK
                                                                 : bad(c, key, v, "a mapping");
}

static const char tpu_only[] = "TPU settings (distributed_type XLA), which accel does not run";
static const char no_dynamo[] = "torch.compile (dynamo) has no counterpart in C: there is no "
                                "graph compiler to configure";

/* Every top-level key of ClusterConfig from Accelerate 0.18 to 1.14, the legacy fp16 and
 * dynamo_backend, in docs/configuration.md's order. */
static const key_rule keys[] = {
    {"compute_environment", USED, use_compute_environment, NULL},
    {"distributed_type", USED, use_distributed_type, NULL},
    {"mixed_precision", USED, use_mixed_precision, NULL},
    {"fp16", USED, use_fp16, NULL},
    {"use_cpu", USED, use_use_cpu, NULL},
    {"debug", USED, use_debug, NULL},
    {"num_processes", USED, use_num_processes, NULL},
    {"num_machines", USED, use_num_machines, NULL},
    {"machine_rank", USED, use_machine_rank, NULL},
    {"gpu_ids", USED, use_gpu_ids, NULL},
    {"main_process_ip", USED, use_main_process_ip, NULL},
    {"main_process_port", USED, use_main_process_port, NULL},
    {"rdzv_backend", USED, use_rdzv_backend, NULL},
    {"same_network", USED, use_same_network, NULL},
    {"mpirun_config", USED, use_mpirun_config, NULL},
    {"deepspeed_config", USED, use_section, NULL},
    {"fsdp_config", USED, use_section, NULL},
    {"main_training_function", ACCEPTED, NULL, NULL},
    {"enable_cpu_affinity", ACCEPTED, NULL, NULL},
    {"ipex_config", IGNORED, NULL, "Intel Extension for PyTorch is a PyTorch add-on"},
    {"dynamo_config", IGNORED, NULL, no_dynamo},
    {"dynamo_backend", IGNORED, NULL, no_dynamo},
    {"fp8_config", IGNORED, NULL, "fp8 training needs a GPU with fp8 support"},
    {"megatron_lm_config", IGNORED, NULL, "used with distributed_type MEGATRON_LM only"},
    {"downcast_bf16", IGNORED, NULL, tpu_only},
    {"tpu_name", IGNORED, NULL, tpu_only},
    {"tpu_zone", IGNORED, NULL, tpu_only},
    {"tpu_use_cluster", IGNORED, NULL, tpu_only},
    {"tpu_use_sudo", IGNORED, NULL, tpu_only},
    {"command_file", IGNORED, NULL, tpu_only},
    {"commands", IGNORED, NULL, tpu_only},
    {"tpu_vm", IGNORED, NULL, tpu_only},
    {"tpu_env", IGNORED, NULL, tpu_only},
    {"parallelism_config", REFUSED, NULL,
     "tensor, context and sequence parallelism are not implemented"},
    {"tp_config", REFUSED, NULL, "tensor parallelism is not implemented"},
    {NULL, USED, NULL, NULL},
};

static accel_status use_zero_stage(accel__config *c, const char *key, const accel__ynode *v)
{
    ACCEL_TRY(get_int(c, key, v, 0, 3, &c->zero_stage));
    snprintf(c->zero_stage_key, sizeof(c->zero_stage_key), "%s", key);
    return ACCEL_OK;
}

static accel_status use_ds_accumulation(accel__config *c, const char *key, const accel__ynode *v)
{
    return get_int(c, key, v, 1, 1 << 30, &c->gradient_accumulation_steps);
}

static const char ds_engine[] = "a setting of the DeepSpeed engine, which accel does not use";

/* deepspeed_config under distributed_type DEEPSPEED (the keys `accelerate config` writes and
 * `accelerate launch --use_deepspeed` reads). */
static const key_rule deepspeed_keys[] = {
    {"zero_stage", USED, use_zero_stage, NULL},
    {"gradient_accumulation_steps", USED, use_ds_accumulation, NULL},
    {"deepspeed_config_file", REFUSED, NULL,
     "accel does not read DeepSpeed's JSON configs: give zero_stage (and "
     "gradient_accumulation_steps) in deepspeed_config instead"},
    {"offload_optimizer_device", IGNORED, NULL, "offloading is not implemented"},
    {"offload_param_device", IGNORED, NULL, "offloading is not implemented"},
    {"offload_optimizer_nvme_path", ACCEPTED, NULL, NULL},
    {"offload_param_nvme_path", ACCEPTED, NULL, NULL},
    {"gradient_clipping", IGNORED, NULL,
     "clip in the loop with accel_clip_grad_norm, as without DeepSpeed"},
    {"zero3_init_flag", IGNORED, NULL, ds_engine},
    {"zero3_save_16bit_model", IGNORED, NULL, ds_engine},
    {"deepspeed_moe_layer_cls_names", IGNORED, NULL, ds_engine},
    {"deepspeed_hostfile", ACCEPTED, NULL, NULL},
    {"deepspeed_exclusion_filter", ACCEPTED, NULL, NULL},
    {"deepspeed_inclusion_filter", ACCEPTED, NULL, NULL},
    {"deepspeed_multinode_launcher", ACCEPTED, NULL, NULL},
    {NULL, USED, NULL, NULL},
};

static accel_status use_fsdp_version(accel__config *c, const char *key, const accel__ynode *v)
{
    int version = 1;
    return get_int(c, key, v, 1, 2, &version);
}

static accel_status use_fsdp_strategy(accel__config *c, const char *key, const accel__ynode *v)
{
    if (accel__yscalar_is_null(v)) {
        return ACCEL_OK;
    }
    int stage = v->kind == ACCEL__Y_SCALAR ? accel__config_fsdp_stage(v->text) : -1;
    if (stage < 0) {
        return bad(c, key, v,
                   "a sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, "
                   "HYBRID_SHARD_ZERO2, or 1-5)");
    }
    c->zero_hybrid = accel__config_fsdp_hybrid(v->text);
    /* fsdp_reshard_after_forward (FSDP2's spelling) wins over the deprecated strategy. */
    if (strcmp(c->zero_stage_key, "fsdp_config.fsdp_reshard_after_forward") != 0) {
        c->zero_stage = stage;
        snprintf(c->zero_stage_key, sizeof(c->zero_stage_key), "%s", key);
    }
    return ACCEL_OK;
}

/* FSDP2: true = FULL_SHARD (3), false = SHARD_GRAD_OP (2); FSDP1 also takes a strategy. */
static accel_status use_fsdp_reshard(accel__config *c, const char *key, const accel__ynode *v)
{
    if (accel__yscalar_is_null(v)) {
        return ACCEL_OK;
    }
    int b = v->kind == ACCEL__Y_SCALAR ? accel__parse_bool(v->text) : -1;
    int stage = b == 1 ? 3 : b == 0 ? 2 : v->kind == ACCEL__Y_SCALAR ? accel__config_fsdp_stage(v->text) : -1;
    if (stage < 0) {
        return bad(c, key, v, "true, false or a sharding strategy");
    }
    c->zero_stage = stage;
    snprintf(c->zero_stage_key, sizeof(c->zero_stage_key), "%s", key);
    return ACCEL_OK;
}

/* fsdp_config under distributed_type FSDP: the sharding is accel's ZeRO stage; how PyTorch
 * wraps, prefetches and saves modules has no counterpart (accel shards one flat buffer). */
static const key_rule fsdp_keys[] = {
    {"fsdp_version", USED, use_fsdp_version, NULL},
    {"fsdp_sharding_strategy", USED, use_fsdp_strategy, NULL},
    {"fsdp_reshard_after_forward", USED, use_fsdp_reshard, NULL},
    {"fsdp_offload_params", IGNORED, NULL, "offloading is not implemented"},
    {"fsdp_auto_wrap_policy", ACCEPTED, NULL, NULL},
    {"fsdp_transformer_layer_cls_to_wrap", ACCEPTED, NULL, NULL},
    {"fsdp_min_num_params", ACCEPTED, NULL, NULL},
    {"fsdp_backward_prefetch", ACCEPTED, NULL, NULL},
    {"fsdp_backward_prefetch_policy", ACCEPTED, NULL, NULL},
    {"fsdp_forward_prefetch", ACCEPTED, NULL, NULL},
    {"fsdp_state_dict_type", ACCEPTED, NULL, NULL},
    {"fsdp_use_orig_params", ACCEPTED, NULL, NULL},
    {"fsdp_cpu_ram_efficient_loading", ACCEPTED, NULL, NULL},
    {"fsdp_sync_module_states", ACCEPTED, NULL, NULL},
    {"fsdp_activation_checkpointing", ACCEPTED, NULL, NULL},
    {"fsdp_ignored_modules", ACCEPTED, NULL, NULL},
    {NULL, USED, NULL, NULL},
};

/* Applies `rules` to every entry of `map`; `prefix` names a section in messages. */
static accel_status apply_rules(accel__config *c, const key_rule *rules, const char *prefix,
                                const accel__ynode *map)
{
    for (int i = 0; i < map->n; i++) {
        char key[192];
        snprintf(key, sizeof(key), "%s%s%s", prefix ? prefix : "", prefix ? "." : "",
                 map->keys[i]);
        const accel__ynode *v = map->items[i];
        const key_rule *r = rules;
        while (r->name != NULL && strcmp(r->name, map->keys[i]) != 0) {
            r++;
        }
        char val[200];
        if (r->name == NULL) {
            note(c, v,
                 "ignoring unknown key \"%s\" (not in Accelerate's config up to 1.14: a "
                 "newer Accelerate, or a typo?)",
                 key);
        } else if (r->policy == USED) {
            ACCEL_TRY(r->use(c, key, v));
        } else if (r->policy == ACCEPTED || neutral(v)) {
            continue;
        } else if (r->policy == REFUSED) {
            return refuse(c, key, v, r->reason);
        } else {
            note(c, v, "ignoring %s: %s (%s)", key, describe(v, val, sizeof(val)), r->reason);
        }
    }
    return ACCEL_OK;
}

int accel__config_gpu_ids_valid(const char *ids)
{
    const char *p = ids;
    for (;;) {
        size_t n = strspn(p, "0123456789");
        if (n == 0) {
            return 0;
        }
        p += n;
        if (*p == '\0') {
            return 1;
        }
        if (*p++ != ',') {
            return 0;
        }
    }
}

int accel__config_fsdp_stage(const char *s)
{
    static const struct {
        const char *name;
        int stage;
    } strategies[] = {
        {"FULL_SHARD", 3},    {"SHARD_GRAD_OP", 2}, {"NO_SHARD", 0},
        {"HYBRID_SHARD", 3},  {"HYBRID_SHARD_ZERO2", 2},
    };
    for (int i = 0; i < 5; i++) {
        /* PyTorch's ShardingStrategy numbers them 1-5 in this order. */
        if (strcasecmp(s, strategies[i].name) == 0 || (s[0] == '1' + i && s[1] == '\0')) {
            return strategies[i].stage;
        }
    }
    return -1;
}

int accel__config_fsdp_hybrid(const char *s)
{
    return accel__config_fsdp_stage(s) >= 0 &&
           (strncasecmp(s, "HYBRID_SHARD", 12) == 0 || strcmp(s, "4") == 0 || strcmp(s, "5") == 0);
}

/* The distributed types of Accelerate (0.18 to 1.14) accel does not run, and why. */
static const char *const not_run[][2] = {
    {"MEGATRON_LM", "Megatron-LM is not implemented"},
    {"XLA", "accel runs on CPUs and CUDA GPUs"},
    {"TPU", "accel runs on CPUs and CUDA GPUs"},
    {"MPS", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_NPU", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_XPU", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_MLU", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_MUSA", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_SDAA", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_HPU", "accel runs on CPUs and CUDA GPUs"},
    {"MULTI_NEURON", "accel runs on CPUs and CUDA GPUs"},
};

/* The section of distributed_type DEEPSPEED / FSDP: its keys, and the default stage when the
 * file does not give one (DeepSpeedPlugin's zero_stage 2, FSDP's FULL_SHARD). */
static accel_status read_section(accel__config *c, const char *name, const key_rule *rules,
                                 int default_stage, const char *default_key)
{
    const accel__ynode *sec = accel__ynode_get(c->root, name);
    if (sec != NULL && sec->kind == ACCEL__Y_MAP) {
        ACCEL_TRY(apply_rules(c, rules, name, sec));
    }
    if (c->zero_stage < 0) {
        c->zero_stage = default_stage;
        snprintf(c->zero_stage_key, sizeof(c->zero_stage_key), "%s", default_key);
    }
    return ACCEL_OK;
}

static accel_status validate(accel__config *c)
{
    accel__ynode v = {.kind = ACCEL__Y_SCALAR};
    v.line = accel__config_line(c, "compute_environment");
    if (c->compute_environment[0] == '\0') {
        strcpy(c->compute_environment, "LOCAL_MACHINE");
    }
    v.text = c->compute_environment;
    if (strcmp(c->compute_environment, "AMAZON_SAGEMAKER") == 0) {
        return refuse(c, "compute_environment", &v, "accel runs on the local machine only");
    }
    if (strcmp(c->compute_environment, "LOCAL_MACHINE") != 0) {
        return bad(c, "compute_environment", &v, "LOCAL_MACHINE or AMAZON_SAGEMAKER");
    }
    if (c->distributed_type[0] == '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: distributed_type is required",
                             c->path);
    }
    const accel__ynode *fp16 = accel__ynode_get(c->root, "fp16");
    if (c->mixed_precision[0] == '\0' && fp16 != NULL && fp16->kind == ACCEL__Y_SCALAR &&
        accel__parse_bool(fp16->text) == 1) {
        strcpy(c->mixed_precision, "fp16");
    }
    const char *dt = c->distributed_type;
    v.text = c->distributed_type;
    v.line = accel__config_line(c, "distributed_type");
    /* The sections of the other paradigms ask for something accel will not do here. */
    static const struct {
        const char *section, *type;
    } owners[] = {{"deepspeed_config", "DEEPSPEED"}, {"fsdp_config", "FSDP"}};
    for (int i = 0; i < 2; i++) {
        const accel__ynode *sec = accel__ynode_get(c->root, owners[i].section);
        char val[200];
        if (sec != NULL && strcmp(dt, owners[i].type) != 0 && !neutral(sec)) {
            note(c, sec, "ignoring %s: %s (used with distributed_type %s only)",
                 owners[i].section, describe(sec, val, sizeof(val)), owners[i].type);
        }
    }
    if (strcmp(dt, "NO") == 0 || strcmp(dt, "MULTI_CPU") == 0) {
        if (strcmp(dt, "NO") == 0 && c->num_processes < 0 &&
            accel__ynode_get(c->root, "num_processes") == NULL) {
            c->num_processes = 1; /* Accelerate's process_config */
        }
        return ACCEL_OK;
    }
    if (strcmp(dt, "MULTI_GPU") == 0) { /* as accel launch --multi_gpu */
#if !defined(ACCEL_HAVE_CUDA)
        note(c, &v, "distributed_type: MULTI_GPU: %s", NO_GPU);
#endif
        return ACCEL_OK;
    }
    if (strcmp(dt, "DEEPSPEED") == 0) {
        return read_section(c, "deepspeed_config", deepspeed_keys, 2,
                            "distributed_type DEEPSPEED (DeepSpeed's default stage)");
    }
    if (strcmp(dt, "FSDP") == 0) {
        return read_section(c, "fsdp_config", fsdp_keys, 3,
                            "distributed_type FSDP (FULL_SHARD, FSDP's default)");
    }
    for (size_t i = 0; i < sizeof(not_run) / sizeof(not_run[0]); i++) {
        if (strcmp(dt, not_run[i][0]) == 0) {
            return refuse(c, "distributed_type", &v, not_run[i][1]);
        }
    }
    return bad(c, "distributed_type", &v,
               "a distributed type of Accelerate (NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP, ...)");
}

int accel__config_line(const accel__config *c, const char *key)
{
    const accel__ynode *n = accel__ynode_path(c->root, key);
    return n != NULL ? n->line : 0;
}

size_t accel__config_default_path(char *buf, size_t nbytes)
{
    const char *hf = getenv("HF_HOME");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (hf != NULL && hf[0] != '\0') {
        n = snprintf(buf, nbytes, "%s/accelerate/default_config.yaml", hf);
    } else if (xdg != NULL && xdg[0] != '\0') {
        n = snprintf(buf, nbytes, "%s/huggingface/accelerate/default_config.yaml", xdg);
    } else {
        n = snprintf(buf, nbytes, "%s/.cache/huggingface/accelerate/default_config.yaml",
                     home != NULL ? home : "");
    }
    return n < 0 ? nbytes : (size_t)n;
}

/* Opens the file: O_NONBLOCK and fstat, so a directory or a FIFO is named as such (it would
 * otherwise be a YAML error, or block the open). *f NULL and ACCEL_OK: an absent default. */
static accel_status open_config(const accel__config *c, FILE **f)
{
    *f = NULL;
    int fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (!c->explicit_path && errno == ENOENT) {
            return ACCEL_OK;
        }
        return accel__seterr(NULL, c->explicit_path && errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
                             "config file %s: %s", c->path, strerror(errno));
    }
    struct stat sb;
    int is_stat = fstat(fd, &sb) == 0;
    if (!is_stat || !S_ISREG(sb.st_mode)) {
        int err = errno;
        close(fd);
        return is_stat ? accel__seterr(NULL, ACCEL_EINVAL, "config file %s is %s, not a YAML file",
                                       c->path, accel__file_kind(sb.st_mode))
                       : accel__seterr(NULL, ACCEL_EIO, "config file %s: %s", c->path,
                                       strerror(err));
    }
    *f = fdopen(fd, "rb");
    if (*f == NULL) {
        close(fd);
        return accel__seterr(NULL, ACCEL_ENOMEM, "config file %s: %s", c->path, strerror(errno));
    }
    return ACCEL_OK;
}

void accel__config_free(accel__config *c)
{
    if (c != NULL) {
        accel__ynode_free(c->root);
        c->root = NULL;
    }
}

accel_status accel__config_load(const char *path, accel__config *out)
{
    accel__config *c = accel__calloc(1, sizeof(*c));
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    c->use_cpu = c->debug = c->num_processes = c->num_machines = c->machine_rank = -1;
    c->main_process_port = c->same_network = c->zero_stage = c->gradient_accumulation_steps = -1;
    c->explicit_path = 1;
    int from_env = 0;
    if (path == NULL) {
        path = getenv("ACCELERATE_CONFIG_FILE");
        from_env = path != NULL && path[0] != '\0';
        if (!from_env) {
            c->explicit_path = 0;
        }
    }
    /* A path cut to fit would name another file, which might exist: refused instead. */
    size_t len = c->explicit_path ? (size_t)snprintf(c->path, sizeof(c->path), "%s", path)
                                  : accel__config_default_path(c->path, sizeof(c->path));
    FILE *f = NULL;
    accel_status st = ACCEL_OK;
    if (len == 0) {
        st = accel__seterr(NULL, ACCEL_EINVAL,
                           "config file \"\": an empty path names no file (give a path, or no "
                           "option for the default location)");
    } else if (len >= sizeof(c->path)) {
        st = accel__seterr(NULL, ACCEL_EINVAL,
                           "config file %.64s...: the path is %zu bytes long, more than a path "
                           "can be (%zu)%s",
                           c->path, len, sizeof(c->path) - 1,
                           c->explicit_path ? ""
                                            : " (the default location, under a long $HF_HOME, "
                                              "$XDG_CACHE_HOME or $HOME)");
    } else {
        st = open_config(c, &f);
    }
    if (st == ACCEL_OK && f != NULL) {
        st = accel__ytree_parse(f, c->path, &c->root);
        fclose(f);
        if (st == ACCEL_OK && c->root->kind != ACCEL__Y_MAP) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "config file %s: the top level must be a mapping of keys", c->path);
        }
        st = st == ACCEL_OK ? apply_rules(c, keys, NULL, c->root) : st;
        st = st == ACCEL_OK ? validate(c) : st;
        c->present = st == ACCEL_OK;
    }
    if (st != ACCEL_OK && (from_env || !c->explicit_path)) {
        /* A file the user did not name on this command line: say where its name came from, so
         * that a forgotten export or an old default file is found. */
        char msg[ACCEL__ERRMSG_NBYTES];
        snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
        st = accel__seterr(NULL, st, "%s (%s)", msg,
                           c->explicit_path ? "the file named by $ACCELERATE_CONFIG_FILE"
                                            : "the default config file: fix it, rewrite it with "
                                              "accel config, or name another with --config_file");
    }
    if (st != ACCEL_OK) {
        accel__config_free(c);
    } else {
        *out = *c;
    }
    accel__free(c);
    return st;
}
