/*
 * The accelerator handle (struct accel) and the core services every module above core uses:
 * module state slots and the list of objects (core/object.h). The runtime below (allocation,
 * errors, logging, env) is base/base.h, included here.
 */
#ifndef ACCEL_CORE_INTERNAL_H
#define ACCEL_CORE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "accel/core.h"
#include "base/base.h"
#include "core/object.h"

/* ---- The accelerator handle ---- */

/* Module state slots: each module (train, data, ...) keeps its per-accelerator state in its own
 * slot so core needs no knowledge of it. accel_free releases slots in reverse order. */
typedef enum accel__module_id {
    ACCEL__MOD_COLL = 0, /* user-level collectives (triggers) */
    ACCEL__MOD_GSTATE,   /* the GradientState (core/gstate.h); accel_free_memory drops it */
    ACCEL__MOD_DATA,
    ACCEL__MOD_PRECISION,
    ACCEL__MOD_CKPT,
    ACCEL__MOD_TRACK,
    ACCEL__MOD_NN,
    ACCEL__MOD_LOGGER, /* named user loggers (src/track/logger.c) */
    ACCEL__MOD_COUNT
} accel__module_id;

typedef struct accel__module_slot {
    void *state;
    void (*free_fn)(accel *acc, void *state);
} accel__module_slot;

struct accel__comm;

/* accel's own random generator (xoshiro256**): src/core/rng.c, used through src/core/rng.h. */
typedef struct accel__gen {
    uint64_t s[4];
} accel__gen;

struct accel {
    accel__errbuf err;  /* first: base records a handle's errors through it (base.h) */
    accel__log_ctx log; /* rank prefix and level of this accelerator's log lines */
    accel_options opt; /* fully resolved: no field unset */
    struct accel__settings *settings; /* every value's source; module views (core/settings.h) */
    int rank, n_ranks;
    int local_rank, local_n_ranks;
    int n_machines, machine_rank; /* ACCEL_NUM_MACHINES / GROUP_RANK, else from the layout */
    accel_distributed_type dist_type;
    accel_device device;
    struct accel__device *dev; /* the open handle of `device` (device/device.h) */
    int n_gpus;                /* GPUs this process can see (0 on the CPU) */
    int sim_gpus;              /* ACCEL_SIM_GPU: simulated GPUs (a testing aid; 0: none) */
    char device_name[32];
    char backend[16];
    struct accel__comm *comm;

    accel__module_slot modules[ACCEL__MOD_COUNT];
    accel__object *objects; /* live objects, newest first */
    accel__gen rng;  /* the accelerator's generator (src/core/rng.c) */
    int rng_seeded;  /* 0 until accel_set_seed or first use */

    int resume_pending; /* resume_from_checkpoint set and the first accel_prepare to come */
    /* Not empty after accel_load_state refused a fused load that had written part of the
     * tensors (src/ckpt/state.c): why; optimizer steps and saves refuse with it until a load
     * succeeds. */
    char partial_load[400];
    char *summary; /* accel_state_summary buffer */
    struct accel__trace *trace; /* the profiler's recorder (base/trace.h); lives as long as acc */
    char *profile_path;         /* where the open profiler session's file goes */
    /* pinned host memory that buffer collectives on device memory stage through (coll_stage.c),
     * and whether a call is using it (taken with __atomic builtins) */
    void *stage_buf;
    size_t stage_nbytes;
    int stage_busy;
};

/* ---- The process's device (device_select.c) ---- */

/* Accelerate's device rule, as a pure function of its inputs: the CPU when forced or when no
 * GPU is usable (n_gpus 0), else GPU local_rank, wrapping round-robin when the machine runs
 * more processes than it has GPUs (they share them). */
accel_device accel__choose_device(int force_cpu, int n_gpus, int local_rank);
/* NO for a process not started by a launcher, else MULTI_GPU on a GPU and MULTI_CPU on the
 * CPU. */
accel_distributed_type accel__choose_dist_type(accel_device device, int launched);
/* Picks acc's device by that rule (cpu option resolved, layout read), opens it and fills
 * acc->device, dev, device_name and dist_type. A GPU that is present but fails is an error
 * naming it (never a silent fall back to the CPU). */
accel_status accel__device_setup(accel *acc, int launched);

#ifdef ACCEL_HAVE_CUDA
/* NCCL's version ("2.28.9") into buf (src/core/cuda/cuda_api.c). */
void accel__nccl_version(char *buf, size_t nbytes);
#endif

/* Frees the staging buffer of device-memory collectives (coll_stage.c); accel_free. */
void accel__coll_stage_free(accel *acc);

/* Module slot access: returns the state (NULL if none). */
static inline void *accel__module(const accel *acc, accel__module_id id)
{
    return acc->modules[id].state;
}
void accel__module_set(accel *acc, accel__module_id id, void *state,
                       void (*free_fn)(accel *acc, void *state));
/* Frees a slot's state now (its free_fn) and empties the slot. */
void accel__module_release(accel *acc, accel__module_id id);

/* accel_prepare without the resume: checks and prepares the objects (src/core/prepare.c). The
 * public accel_prepare_objects (src/ckpt/resume.c) adds resume_from_checkpoint's load. */
accel_status accel__prepare_objects(accel *acc, int n, void *const *objs);

#endif /* ACCEL_CORE_INTERNAL_H */
