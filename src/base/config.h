/*
 * Accelerate's config file (default_config.yaml): where it is, what each key means to accel,
 * and its values, read once by one code for the library (accel_init, src/core/accel.c) and for
 * the `accel` tool (launch, env, config, test). Knows no accelerator handle: option
 * resolution stays in core, flag precedence in the tool.
 */
#ifndef ACCEL_BASE_CONFIG_H
#define ACCEL_BASE_CONFIG_H

#include <stddef.h>

#include "accel/status.h"
#include "base/ytree.h"

#define ACCEL__CONFIG_MAX_NOTES 24

typedef struct accel__config {
    int present;               /* 0 when no file was found at the default locations */
    int explicit_path;         /* the file was asked for (argument or ACCELERATE_CONFIG_FILE) */
    char path[4096];           /* the file read (or looked for); PATH_MAX, longer is refused */
    accel__ynode *root;        /* the file as read; NULL when absent (accel__config_free) */
    char compute_environment[32]; /* LOCAL_MACHINE when absent */
    char distributed_type[32];    /* required key */
    char mixed_precision[8];      /* "no", "fp16", "bf16", "fp8"; "" when absent or null */
    int use_cpu;                  /* -1 absent */
    int debug;                    /* -1 absent */
    /* The keys of accel launch (-1 / NULL when absent; strings borrowed from root). */
    int num_processes; /* -1 absent or -1 in the file (Accelerate's "pass --num_processes") */
    int num_machines, machine_rank, main_process_port, same_network;
    const char *main_process_ip, *rdzv_backend, *gpu_ids, *mpirun_hostfile;
    /* ZeRO stage from the section distributed_type selects: deepspeed_config.zero_stage
     * (DEEPSPEED, default 2) or fsdp_config's sharding strategy (FSDP, default FULL_SHARD = 3);
     * -1 otherwise. zero_stage_key says where it came from, for messages. */
    int zero_stage;
    char zero_stage_key[64];
    /* fsdp_config.fsdp_sharding_strategy is HYBRID_SHARD or HYBRID_SHARD_ZERO2 (shard inside a
     * machine, replicate across machines); 0 otherwise. */
    int zero_hybrid;
    /* deepspeed_config.gradient_accumulation_steps under DEEPSPEED; -1 otherwise. */
    int gradient_accumulation_steps;
    /* Keys the file sets that accel does not act on, one line each, naming file and line. */
    int n_notes;     /* the last one says how many more were left out, past the cap */
    int n_notes_cut; /* notes left out (0: none) */
    char notes[ACCEL__CONFIG_MAX_NOTES][512];
} accel__config;

/*
 * Finds and reads the config file: `path` when not NULL (missing -> ACCEL_ENOTFOUND naming
 * it), else ACCELERATE_CONFIG_FILE, else $HF_HOME/accelerate/default_config.yaml, else
 * $XDG_CACHE_HOME/huggingface/accelerate/default_config.yaml, else
 * ~/.cache/huggingface/accelerate/default_config.yaml (absent default -> ACCEL_OK, present 0).
 * Every key of every Accelerate version has a policy (docs/configuration.md): used (by the
 * library or by accel launch), accepted, ignored with a note when its value asks for something
 * accel does not do, or refused. Unknown keys are noted, never an error. Errors name the file
 * and the line: malformed values of used keys, a missing distributed_type, bad YAML ->
 * ACCEL_EINVAL; setups accel does not implement (DEEPSPEED's JSON file, Megatron-LM, TPUs,
 * SageMaker, ...) -> ACCEL_EUNSUPPORTED. On success *out must be released with
 * accel__config_free; on failure nothing is held.
 */
accel_status accel__config_load(const char *path, accel__config *out);
void accel__config_free(accel__config *c);

/* Writes the default config path into buf (the file may not exist). Returns the length the
 * path needs, as snprintf: nbytes or more when it was cut (a very long $HF_HOME), and then buf
 * must not be used. */
size_t accel__config_default_path(char *buf, size_t nbytes);

/* The line of a key in the file ("deepspeed_config.zero_stage"), 0 when absent. */
int accel__config_line(const accel__config *c, const char *key);

/* ZeRO stage of an FSDP sharding strategy: FULL_SHARD / HYBRID_SHARD 3, SHARD_GRAD_OP /
 * HYBRID_SHARD_ZERO2 2, NO_SHARD 0, or PyTorch's numbers 1-5 for them; -1 when not one. */
int accel__config_fsdp_stage(const char *strategy);
/* 1 when an FSDP sharding strategy (as accel__config_fsdp_stage takes it) is a hybrid one:
 * HYBRID_SHARD, HYBRID_SHARD_ZERO2, or PyTorch's 4 and 5 for them; else 0. */
int accel__config_fsdp_hybrid(const char *strategy);
/* 1 when ids is a comma-separated list of device ids ("0", "0,1,3"): digits between single
 * commas, none at either end (CUDA_VISIBLE_DEVICES stops at the first empty entry); else 0.
 * "all" is the caller's to handle. */
int accel__config_gpu_ids_valid(const char *ids);

#endif /* ACCEL_BASE_CONFIG_H */
