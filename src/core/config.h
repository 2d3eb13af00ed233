/*
 * Accelerate's config file (default_config.yaml): location, parsing and validation. Used by
 * accel_init (mixed_precision, use_cpu, debug; the launcher keys are checked against the run).
 */
#ifndef ACCEL_CORE_CONFIG_H
#define ACCEL_CORE_CONFIG_H

#include "internal.h"

#define ACCEL__CONFIG_MAX_NOTES 24

typedef struct accel__config {
    int present;                     /* 0 when no file was found at the default locations */
    int explicit_path;               /* the file was asked for (option or ACCELERATE_CONFIG_FILE) */
    char path[1024];                 /* the file read */
    char distributed_type[32];       /* required key */
    char compute_environment[32];    /* LOCAL_MACHINE by default */
    accel_precision mixed_precision; /* ACCEL_PRECISION_UNSET when absent or null */
    int use_cpu;                     /* -1 absent */
    int debug;                       /* -1 absent */
    int num_processes;               /* -1 absent */
    int num_machines;                /* -1 absent */
    int machine_rank;                /* -1 absent */
    /* Keys the file sets that accel does not act on, one line each (accel__config_warn). */
    int n_notes;
    char notes[ACCEL__CONFIG_MAX_NOTES][512];
} accel__config;

/*
 * Finds the config file: `path` when not NULL (missing -> ACCEL_ENOTFOUND naming it), else
 * ACCELERATE_CONFIG_FILE, else $HF_HOME/accelerate/default_config.yaml, else
 * $XDG_CACHE_HOME/huggingface/accelerate/default_config.yaml, else
 * ~/.cache/huggingface/accelerate/default_config.yaml (absent default -> ACCEL_OK, present=0).
 * Every key of every Accelerate version has a policy (docs/configuration.md): used, accepted,
 * ignored with a note when its value asks for something accel does not do, or refused. Unknown
 * keys are noted, never an error. Malformed values of the keys accel uses, a missing
 * distributed_type or bad YAML -> ACCEL_EINVAL naming file and key; setups accel does not
 * implement (MULTI_GPU without CUDA, DEEPSPEED, FSDP, several machines, ...) ->
 * ACCEL_EUNSUPPORTED naming file, key and value.
 */
accel_status accel__config_load(const char *path, accel__config *out);

/* Logs the file's notes as warnings, and a num_processes above 1 when the run has one process
 * (`n_processes`), each once per process (calls with the same lines stay silent). Call on the
 * main process only. */
void accel__config_warn(const accel__config *c, int n_processes);

/* Writes the default config path into buf (never fails; may not exist). */
void accel__config_default_path(char *buf, size_t nbytes);

#endif
