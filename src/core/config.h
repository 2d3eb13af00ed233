/*
 * Accelerate's config file (default_config.yaml): location, parsing and validation. Used by
 * accel_init (mixed_precision, use_cpu, debug) and by `accel launch` (num_processes, ports).
 */
#ifndef ACCEL_CORE_CONFIG_H
#define ACCEL_CORE_CONFIG_H

#include "internal.h"

typedef struct accel__config {
    int present;                     /* 0 when no file was found at the default locations */
    char path[1024];                 /* the file read */
    char distributed_type[32];       /* required key */
    char compute_environment[32];    /* LOCAL_MACHINE by default */
    accel_precision mixed_precision; /* ACCEL_PRECISION_UNSET when absent or null */
    int use_cpu;                     /* -1 absent */
    int debug;                       /* -1 absent */
    int num_processes;               /* -1 absent */
    int num_machines;                /* -1 absent */
    int machine_rank;                /* -1 absent */
    int main_process_port;           /* -1 absent */
    char main_process_ip[256];       /* "" absent */
} accel__config;

/*
 * Finds the config file: `path` when not NULL (missing -> ACCEL_ENOTFOUND naming it), else
 * ACCELERATE_CONFIG_FILE, else $HF_HOME/accelerate/default_config.yaml, else
 * $XDG_CACHE_HOME/huggingface/accelerate/default_config.yaml, else
 * ~/.cache/huggingface/accelerate/default_config.yaml (absent default -> ACCEL_OK, present=0).
 * Unknown keys, wrong types or a missing distributed_type -> ACCEL_EINVAL naming file and key;
 * paradigms accel does not implement (DEEPSPEED, FSDP, ...) -> ACCEL_EUNSUPPORTED.
 */
accel_status accel__config_load(const char *path, accel__config *out);

/* Writes the default config path into buf (never fails; may not exist). */
void accel__config_default_path(char *buf, size_t nbytes);

#endif
