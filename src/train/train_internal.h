/*
 * Private structures of the training core, shared by src/train/ (all files) and by the modules that
 * build on it (precision, ZeRO sharding, checkpoints). Invariant: master, compute, grad and
 * every optimizer-state buffer use one layout (parameters in reverse registration order), so a
 * range [off, off + count) means the same elements in all of them.
 */
#ifndef ACCEL_TRAIN_INTERNAL_H
#define ACCEL_TRAIN_INTERNAL_H

#include "accel/accel.h"
#include "comm/comm.h"
#include "core/internal.h"

typedef struct accel__bucket {
    size_t offset, count; /* element range of the gradient buffer */
    int n_params;         /* non-frozen parameters in it */
    int pending;          /* parameters not yet ready in the current backward */
    accel_work *work;     /* in-flight all-reduce, NULL when none */
    double launch_time, done_time;
} accel__bucket;

struct accel_model {
    accel__object obj; /* first: accel_prepare dispatches on it */
    accel *acc;
    int n_params, cap_params;
    accel_param *params; /* registration order; names owned (char *) */
    size_t numel;
    int allocated;
    float *master;  /* fp32 master weights */
    float *compute; /* working copy: master rounded to compute_dtype, stored as fp32 values
                       (the CPU kernels multiply in fp32); == master in fp32 mode */
    float *grad;    /* fp32 gradients (accumulated in fp32 across micro-steps) */
    int grad_shared; /* grad is from accel__comm_alloc: bucket all-reduces are zero-copy */
    accel_dtype compute_dtype; /* ACCEL_F32, or ACCEL_BF16 / ACCEL_F16 under mixed precision */
    int compute_valid;         /* compute == round(master) (set by the refresh) */
    uint16_t *comm_buf;        /* comm_dtype bf16/f16: compressed gradients, numel elements */

    int n_buckets;
    accel__bucket *buckets;
    unsigned char *ready; /* per parameter, current backward */

    /* Per micro-step communication state. */
    int accum_allows;  /* set by accel_accumulate (1 until then) */
    int no_sync_depth; /* accel_no_sync_begin nesting */
    int trigger_sync;  /* accel_trigger_sync_in_backward, consumed by the next backward */
    int in_backward;   /* between accel_backward_begin and accel_backward_end */
    int comm_now;      /* this backward all-reduces */
    int next_launch;   /* first bucket not yet launched (launch order = bucket order) */
    accel_status comm_err;

    /* join_uneven_inputs. */
    int join_active;
    int join_divide_initial;
    int join_n_active; /* processes still training at the current backward */
};

typedef enum accel__optim_kind { ACCEL__SGD = 0, ACCEL__ADAM, ACCEL__ADAMW } accel__optim_kind;

typedef struct accel__optim_group {
    double lr, weight_decay;
} accel__optim_group;

/* A maximal run of parameters adjacent in memory with the same group and not frozen. */
typedef struct accel__optim_segment {
    size_t offset, count;
    int group;
} accel__optim_segment;

struct accel_optimizer {
    accel__object obj;
    accel *acc;
    accel_model *model;
    accel__optim_kind kind;
    /* Hyper-parameters shared by every group (torch keeps them per group; accel per optimizer
     * except lr and weight decay). */
    double momentum, dampening, beta1, beta2, eps;
    int nesterov, maximize, amsgrad;
    int n_groups;
    accel__optim_group groups[ACCEL_OPTIM_MAX_GROUPS];
    int *param_group; /* per parameter (registration index) */
    int segments_dirty;
    int n_segments;
    accel__optim_segment *segments;
    /* State, parallel to the master buffer (allocated at prepare, zero-filled):
     * SGD: state_a = momentum buffer; Adam: state_a = exp_avg, state_b = exp_avg_sq,
     * state_c = max_exp_avg_sq (amsgrad). */
    float *state_a, *state_b, *state_c;
    long long n_steps;    /* real steps taken (Adam's `step`) */
    int step_was_skipped; /* last real step skipped by the fp16 scaler */
    int unscaled;         /* gradients already unscaled for the coming step */
    int found_inf;        /* this process saw an inf/NaN while unscaling (fp16 scaler) */
};

/*
 * The fp16 loss-scaler hook (issue 6). When the ACCEL__MOD_PRECISION slot holds a state whose
 * first member is this struct, the training core consults it; otherwise it behaves as in fp32
 * (scale 1, never skips).
 */
typedef struct accel__precision_hooks {
    /* Factor multiplied into accel_backward_begin's seed (the loss scale). */
    double (*loss_scale)(accel *acc, void *state);
    /* Divides opt's gradients by the scale (once per step) and records inf/nan. */
    accel_status (*unscale)(accel *acc, void *state, accel_optimizer *opt);
    /* Before opt's update: *skip = 1 when an inf/nan was found on any process. */
    accel_status (*should_skip)(accel *acc, void *state, accel_optimizer *opt, int *skip);
    /* After the step decision (skipped or not): updates the scale. */
    void (*update)(accel *acc, void *state, int skipped);
} accel__precision_hooks;

static inline const accel__precision_hooks *accel__precision(accel *acc)
{
    return (const accel__precision_hooks *)accel__module(acc, ACCEL__MOD_PRECISION);
}

/* Waits for (and releases) every in-flight bucket all-reduce of m; first failure. */
accel_status accel__model_wait_buckets(accel_model *m);

/* Rebuilds the optimizer segments (after group or freeze changes). */
accel_status accel__optim_build_segments(accel_optimizer *opt);

/* Vectorised kernels over [0, n) of parallel arrays (optim_kernels.c). */
void accel__sgd_kernel(float *p, const float *g, float *buf, size_t n, float lr, float wd,
                       float momentum, float dampening, int nesterov, int maximize, int first_step);
void accel__adam_kernel(float *p, const float *g, float *m, float *v, float *vmax, size_t n,
                        float lr, float wd, int decoupled, float beta1, float beta2, float eps,
                        float bias_correction1, float bias_correction2_sqrt, int maximize);
/* sum of |g|^p (p > 0; p == 2 and p == 1 fast) in double, and max |g|. */
double accel__pow_sum(const float *g, size_t n, double p);
double accel__abs_max(const float *g, size_t n);
void accel__scale(float *g, size_t n, float s);

/* ---- mixed precision (precision.c) ---- */

/* Installs the fp16 loss scaler in the ACCEL__MOD_PRECISION slot when mixed_precision is fp16
 * and none is there yet (called by model prepare). ACCEL_EINVAL for out-of-range scaler
 * options. */
accel_status accel__precision_install(accel *acc);
/* Scaler state for checkpoints: get returns 0 (outputs untouched) when no scaler is active;
 * set installs the scaler if needed and returns ACCEL_ESTATE when mixed_precision is not fp16,
 * ACCEL_EINVAL for scale <= 0 / inf or a negative tracker. */
int accel__scaler_get(const accel *acc, double *scale, long long *growth_tracker);
accel_status accel__scaler_set(accel *acc, double scale, long long growth_tracker);
/* ACCEL_F32, ACCEL_BF16 or ACCEL_F16 from mixed_precision. */
accel_dtype accel__compute_dtype(const accel *acc);
/* compute = round(master) over all / a range of elements (no-op in fp32 mode). Call after
 * anything writes the master weights (prepare, optimizer step, checkpoint load). */
void accel__model_refresh_compute(accel_model *m);
void accel__model_refresh_compute_range(accel_model *m, size_t offset, size_t count);
/* Compressed communication: validation at prepare, and bucket conversions to / from
 * m->comm_buf (same element offsets as grad). */
accel_status accel__comm_dtype_check(accel *acc);
int accel__comm_compressed(const accel_model *m);
void accel__bucket_compress(accel_model *m, size_t offset, size_t count);
void accel__bucket_decompress(accel_model *m, size_t offset, size_t count);

#endif /* ACCEL_TRAIN_INTERNAL_H */
