/*
 * accel/train.h - the training core: models as flat buffers, bucketed and overlapped gradient
 * sync, gradient accumulation, optimizers, learning-rate schedulers, clipping, uneven inputs.
 *
 * A hand-written (llm.c style) training step looks like this:
 *
 *     accel_model *m;  accel_model_new(acc, &m);
 *     accel_model_add_param(m, "fc.weight", 2, (int64_t[]){out, in}, NULL);
 *     accel_model_add_param(m, "fc.bias", 1, (int64_t[]){out}, NULL);
 *     accel_model_alloc(m);                     // then initialise weights through the views
 *     accel_optimizer *opt = accel_adamw(acc, m, NULL);
 *     accel_scheduler *sch = accel_linear_schedule(acc, opt, 100, 1000);
 *     accel_prepare(acc, m, opt, sch);         // broadcasts process 0's weights, builds buckets
 *     for (...) {
 *         accel_accumulate(acc, m);             // decides sync_gradients for this micro-step
 *         forward(...);
 *         double seed = accel_backward_begin(acc);   // 1 / gradient_accumulation_steps
 *         backward(seed, ...);                  // += into the grad views, then for each param:
 *         accel_grad_ready(m, i);               //   its all-reduce may start now
 *         accel_backward_end(acc);              // waits only for unfinished buckets
 *         if (accel_sync_gradients(acc)) accel_clip_grad_norm(acc, m, 1.0, 2.0, NULL);
 *         accel_optimizer_step(opt);            // no-op while accumulating
 *         accel_scheduler_step(sch);
 *         accel_optimizer_zero_grad(opt);
 *     }
 *
 * Memory layout: master weights, gradients, the mixed-precision compute copy and optimizer
 * state are each ONE contiguous buffer with the same layout, fixed by accel_model_alloc:
 * parameters in REVERSE registration order (the last registered parameter at offset 0), so
 * that the gradient buckets, which follow the order in which a backward pass produces
 * gradients, are contiguous slices and every gradient is a view into its bucket (no copies).
 * Buckets are decided at alloc (by size, see accel_options.first_bucket_mb / bucket_cap_mb).
 * With zero_stage 0 (DDP) parameters are packed end to end; sharded stages pad every bucket
 * with zeros to a multiple of 16 x the process count, so the buffers are then longer than
 * accel_model_numel.
 *
 * Threading: a model, optimizer or scheduler belongs to the thread that drives the training
 * loop. The communication thread only touches gradient buckets between their launch in
 * accel_grad_ready / accel_backward_end and the end of accel_backward_end.
 */
#ifndef ACCEL_TRAIN_H
#define ACCEL_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel_optimizer accel_optimizer;
typedef struct accel_scheduler accel_scheduler;

/* Longest parameter name, in bytes, without the terminating NUL. */
#define ACCEL_PARAM_NAME_MAX 255

/* ===================================== Models ===================================== */

/* A parameter's view. Plain data owned by the model: valid until accel_model_free /
 * accel_free_memory. Pointers are NULL before the model is allocated. */
typedef struct accel_param {
    const char *name;  /* PyTorch state_dict style: "h.0.attn.c_attn.weight" */
    int index;         /* registration index */
    accel_dtype dtype; /* ACCEL_F32 (the master dtype) */
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    size_t numel;
    size_t offset; /* element offset in the master / gradient / compute / optimizer buffers */
    /* CPU conveniences: the fp32 master weights (writable) and the gradient (a view into its
     * bucket; backward adds (+=) into it). NULL where they cannot apply (device memory). */
    float *data;
    float *grad;
    int frozen; /* 1: excluded from sync, clipping norm and optimizer updates */
    int bucket; /* index of its gradient bucket after accel_prepare, else -1 (frozen) */
    /* The same memory as typed views (dtype, shape and device of the parameter): master
     * weights, gradient, and the working copy forward passes read: the master itself in
     * fp32 mode, else its rounding STORED in the compute dtype (2 bytes per element under
     * bf16 / fp16). compute_view.data is NULL until the copy is valid (accel_prepare). */
    accel_tensor data_view;
    accel_tensor grad_view;
    accel_tensor compute_view;
} accel_param;

/*
 * Creates an empty model on acc. out: receives the handle on success only; free with
 * accel_model_free (or accel_free_memory / accel_free). Returns ACCEL_OK, ACCEL_EINVAL, ENOMEM.
 */
ACCEL_API accel_status accel_model_new(accel *acc, accel_model **out);

/*
 * Where the model's buffers will live: by default the accelerator's device (accel_device_of:
 * GPU LOCAL_RANK in a CUDA build with a GPU, else the CPU). Call before accel_model_alloc to
 * keep a model elsewhere, e.g. {ACCEL_DEVICE_CPU, 0} for code that reads the float *
 * conveniences on the host. Returns ACCEL_OK; ACCEL_ESTATE once allocated; the device's
 * opening error (ACCEL_EUNSUPPORTED naming why a GPU cannot be used, ACCEL_EINVAL).
 */
ACCEL_API accel_status accel_model_set_device(accel_model *m, accel_device device);

/* Releases the model and its buffers; waits for its in-flight all-reduces. Accepts NULL.
 * Optimizers over this model must be freed first. */
ACCEL_API void accel_model_free(accel_model *m);

/*
 * Registers a parameter (fp32). Must come before accel_model_alloc.
 *   name: copied; 1..ACCEL_PARAM_NAME_MAX bytes, unique in the model.
 *   ndim: 1..ACCEL_MAX_DIMS; shape: ndim positive dims (copied).
 *   index_out: receives the registration index (may be NULL).
 * Returns ACCEL_OK; ACCEL_EINVAL naming the parameter (duplicate name, name too long or empty,
 * bad ndim or a dimension <= 0, registration after alloc/prepare); ACCEL_ENOMEM.
 */
ACCEL_API accel_status accel_model_add_param(accel_model *m, const char *name, int ndim,
                                             const int64_t *shape, int *index_out);

/*
 * Allocates the flat buffers (64-byte aligned, zero-filled); after it the views carry data and
 * grad pointers and weights can be initialised. Idempotent. Called implicitly by the first
 * accel_model_param and by accel_prepare. With several processes on one machine (shm backend)
 * the gradient buffer is placed in shared memory so bucket all-reduces are zero-copy, which
 * makes this call (and so the first accel_model_param) a collective: every process must
 * allocate its model, in the same order. Returns ACCEL_OK, ACCEL_EINVAL (no parameter),
 * ACCEL_ENOMEM, or ACCEL_EPEER / ACCEL_ETIMEDOUT from the collective.
 */
ACCEL_API accel_status accel_model_alloc(accel_model *m);

ACCEL_API int accel_model_num_params(const accel_model *m);
/* Total elements over all parameters (frozen included). */
ACCEL_API size_t accel_model_numel(const accel_model *m);

/* The view of parameter i (allocating the buffers first if needed), or NULL when i is out of
 * range or the allocation failed (accel_last_error says which). Borrowed from the model. */
ACCEL_API const accel_param *accel_model_param(accel_model *m, int i);

/* Registration index of the parameter called `name`, or -1. */
ACCEL_API int accel_model_find(const accel_model *m, const char *name);

/* The flat buffers as CPU conveniences (NULL before alloc). master: fp32 weights; grad: fp32
 * gradients, in the layout described at the top (accel_model_numel elements with zero_stage
 * 0). NULL with ACCEL_ESTATE where a float pointer cannot apply (the buffer is not in host
 * memory, or the master is sharded: ZeRO stage 3, and stages 1-2 under mixed precision with
 * several processes; accel_save_model writes it). Borrowed. */
ACCEL_API float *accel_model_master(accel_model *m);
ACCEL_API float *accel_model_grad(accel_model *m);

/*
 * Mixed precision working copy. Under mixed_precision bf16 / fp16 the model keeps, next to the
 * fp32 master, a working copy holding every master weight rounded (to nearest even) to the
 * compute dtype, refreshed by accel_prepare and after every real optimizer step; forward
 * passes read it (nn does so automatically, widening each weight to fp32 for the op that uses
 * it). It is STORED in the compute dtype: 2 bytes per parameter.
 * accel_model_compute_dtype: ACCEL_BF16 / ACCEL_F16, or ACCEL_F32 without mixed precision.
 * accel_model_compute_view: fills *out with the whole copy as a 1-D view (same layout as the
 * master, compute dtype; the master itself in fp32 mode). Returns ACCEL_OK, ACCEL_EINVAL for a
 * NULL argument, ACCEL_ESTATE while the copy is not valid (not allocated, or allocated but not
 * yet prepared, or, with a sharded master at ZeRO stages 1-2, after a checkpoint load until
 * the next materialize, gather_all or step; fp32 mode is valid from alloc). Borrowed.
 * accel_model_compute: the fp32 convenience: the master in fp32 mode; NULL before alloc, and
 * NULL with ACCEL_ESTATE under bf16 / fp16 (the copy is not fp32; use the view).
 */
ACCEL_API accel_dtype accel_model_compute_dtype(const accel_model *m);
ACCEL_API accel_status accel_model_compute_view(const accel_model *m, accel_tensor *out);
ACCEL_API const float *accel_model_compute(const accel_model *m);

/*
 * Freezes (frozen = 1) or unfreezes parameter `index` (or the one called `name` for the _by_name
 * form). A frozen parameter gets no gradient (its grad view is zeroed before every sync),
 * is not all-reduced, is skipped by clipping and by every optimizer, and so stays
 * bit-identical. Only before accel_prepare (buckets depend on it): ACCEL_ESTATE after;
 * ACCEL_EINVAL for an unknown index or name.
 */
ACCEL_API accel_status accel_model_freeze(accel_model *m, int index, int frozen);
ACCEL_API accel_status accel_model_freeze_by_name(accel_model *m, const char *name, int frozen);

/*
 * ZeRO stage 3 (FSDP FULL_SHARD) units: the parameters gathered together before use and
 * released after, one gradient bucket each. By default every maximal run of consecutive
 * parameters whose names share their prefix up to the first all-digit component
 * ("transformer.h.3.") is a unit, and consecutive parameters without such a component form one
 * ("transformer.wte.weight", "transformer.wpe.weight"): each top-level block or layer, as FSDP's
 * transformer auto-wrap policy. accel_model_set_unit makes parameters [first, first + count)
 * (registration indices) one unit of their own (FSDP's wrapping of a module by hand); call it
 * before accel_model_alloc. Ignored below stage 3. Returns ACCEL_OK, ACCEL_EINVAL for a bad
 * range, ACCEL_ESTATE once the model is allocated.
 */
ACCEL_API accel_status accel_model_set_unit(accel_model *m, int first, int count);
/* Number of units (stage 3; the number of buckets otherwise), valid once allocated. */
ACCEL_API int accel_model_num_units(const accel_model *m);
/*
 * Stage 3: makes parameter `index`'s data (and its working copy) valid before it is read, by
 * gathering its unit from the owners' shards (an allgather: every process calls it in the same
 * order, as a forward does) and prefetching the next unit in the direction of the pass (forward:
 * registration order, inside accel_backward_begin/end: reverse); units left behind are released
 * (their memory given back; reading them gives zeros). nn calls it through nn_model_sink for
 * every parameter an op reads, forward and backward. Stages 1-2 under mixed precision with
 * several processes (the fp32 master sharded): the same with the gradient buckets as units,
 * whose data is the working copy widened to fp32 (no communication, except after a checkpoint
 * load: the first call all-gathers the working copy from the loaded master pieces, so call it
 * on every process). A no-op otherwise or for an unprepared model. Returns ACCEL_OK,
 * ACCEL_EINVAL for a bad index, or the collective's failure.
 */
ACCEL_API accel_status accel_model_materialize(accel_model *m, int index);
/*
 * Stage 3: gathers every unit (summon_full_params): each process then holds all the weights
 * until the next optimizer step or materialize releases them. Collective. Stages 1-2 under
 * mixed precision with a sharded master: every parameter's data is the working copy widened
 * to fp32 (not the fp32 master) until then. A no-op otherwise.
 */
ACCEL_API accel_status accel_model_gather_all(accel_model *m);

/* Gradient buckets, decided at accel_model_alloc (by size) and completed by accel_prepare
 * (frozen parameters). Bucket b communicates grad[offset, offset + count), from its first to
 * its last trainable parameter, as one message; bucket 0 is launched first. A bucket whose
 * parameters were all frozen after alloc has n_params 0 and count 0 and is never sent. Times
 * are accel monotonic seconds of the last backward that communicated (0 when it did not). */
typedef struct accel_bucket_info {
    size_t offset, count;
    int n_params;       /* non-frozen parameters in it */
    double launch_time; /* when its all-reduce was submitted to the communication thread */
    double done_time;   /* when it was first seen complete (polled while backward ran, else at
                           accel_backward_end) */
} accel_bucket_info;

ACCEL_API int accel_model_num_buckets(const accel_model *m);
/* Fills *info for bucket b. Returns ACCEL_OK or ACCEL_EINVAL for b out of range. */
ACCEL_API accel_status accel_model_bucket_info(const accel_model *m, int b,
                                               accel_bucket_info *info);

/* ======================== Accumulation and gradient synchronisation ======================= */

/*
 * Accelerate's accumulate(model) entry, called at the top of each micro-step: if
 * sync_with_dataloader and the active prepared loader is on its last batch, resets the
 * micro-step counter and syncs; else advances it and syncs when step % gradient_accumulation_
 * steps == 0. Communication is allowed on this micro-step when syncing, or when distributed
 * with sync_each_batch; otherwise the next backward of `model` (NULL: every model of acc)
 * runs without all-reduce (no_sync) and gradients accumulate locally. Returns ACCEL_OK.
 */
ACCEL_API accel_status accel_accumulate(accel *acc, accel_model *model);

/* Accelerate's sync_gradients: 1 when this micro-step steps the optimizer. */
ACCEL_API int accel_sync_gradients(const accel *acc);
/* Accelerate's accelerator.step: the micro-step counter of accel_accumulate. */
ACCEL_API long long accel_accumulation_step(const accel *acc);

/*
 * Starts a backward pass on every prepared model of acc and returns the factor to seed it
 * with: 1 / gradient_accumulation_steps (Accelerate divides the loss by the accumulation steps
 * on every backward, even the short last window of an epoch), times the fp16 loss scale when
 * one is active. Gradients must be ADDED into the grad views (they accumulate across
 * micro-steps until accel_optimizer_zero_grad). Inside a join region (accel_join_begin) on a
 * communicating micro-step this is a collective. Never fails on a valid acc.
 */
ACCEL_API double accel_backward_begin(accel *acc);

/*
 * Marks parameter `index` of m as holding its final gradient for this backward. When every
 * parameter of a bucket is ready and this micro-step communicates, the bucket's all-reduce
 * (average over processes) is queued; buckets are launched strictly in bucket order on every
 * process. A frozen parameter is accepted and ignored.
 * Returns ACCEL_OK; ACCEL_EINVAL for an index out of range or marked twice in one backward;
 * ACCEL_ESTATE outside accel_backward_begin / accel_backward_end; a comm failure.
 */
ACCEL_API accel_status accel_grad_ready(accel_model *m, int index);

/*
 * Completes the backward: every parameter not marked ready is marked now (it contributes what
 * its grad holds, zero when the backward never touched it), the remaining buckets are launched
 * and all are waited for. Afterwards the grads of a communicating micro-step hold the average
 * over processes. Returns ACCEL_OK or the first comm failure (ACCEL_EPEER / ACCEL_ETIMEDOUT).
 */
ACCEL_API accel_status accel_backward_end(accel *acc);

/* DDP's no_sync context as a begin/end pair (nestable): backward passes inside it do not
 * communicate. Only effective when distributed. Returns ACCEL_OK or ACCEL_ESTATE for an
 * unbalanced end. */
ACCEL_API accel_status accel_no_sync_begin(accel *acc, accel_model *m);
ACCEL_API accel_status accel_no_sync_end(accel *acc, accel_model *m);

/* Accelerate's trigger_sync_in_backward: the next backward of m all-reduces even inside
 * no_sync or a non-syncing accumulation micro-step. Returns ACCEL_OK. */
ACCEL_API accel_status accel_trigger_sync_in_backward(accel *acc, accel_model *m);

/*
 * join_uneven_inputs (DDP's Join), for loaders without even_batches:
 *     accel_join_begin(acc, m, 1);
 *     for (batches of this process) { ...usual step... }
 *     accel_join_end(acc, m);
 * Inside the region every communicating backward first all-reduces the number of processes
 * still training. A process that reaches accel_join_end keeps answering: it contributes 0 to
 * that count and zeros to every bucket all-reduce (same order) until the count is 0, then all
 * processes leave together and the weights of the last process to join are broadcast so all
 * end identical. divide_by_initial_world_size (1, or -1 for the default 1): gradients are
 * averaged over all processes even when some have joined; 0: over the processes still
 * training. Must be the same on every process. accel_join_end is a collective.
 * Returns ACCEL_OK, ACCEL_ESTATE (end without begin, begin twice), or a comm failure.
 */
ACCEL_API accel_status accel_join_begin(accel *acc, accel_model *m,
                                        int divide_by_initial_world_size);
ACCEL_API accel_status accel_join_end(accel *acc, accel_model *m);

/* ===================================== Optimizers ===================================== */

#define ACCEL_SGD_OPTIONS_VERSION 1
#define ACCEL_ADAM_OPTIONS_VERSION 1

/* torch.optim.SGD. Start from accel_sgd_options_default() (lr 1e-3, everything else 0). */
typedef struct accel_sgd_options {
    uint32_t size, version;
    double lr, momentum, dampening, weight_decay;
    int nesterov, maximize;
} accel_sgd_options;

/* torch.optim.Adam / AdamW. Defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0
 * (Adam: L2 added to the gradient) or 1e-2 (AdamW: decoupled decay). */
typedef struct accel_adam_options {
    uint32_t size, version;
    double lr, beta1, beta2, eps, weight_decay;
    int amsgrad, maximize;
} accel_adam_options;

ACCEL_API accel_sgd_options accel_sgd_options_default(void);
ACCEL_API accel_adam_options accel_adam_options_default(void);
ACCEL_API accel_adam_options accel_adamw_options_default(void);

/*
 * Create an optimizer over every parameter of m (one param group, index 0). Its state (flat
 * buffers parallel to the master buffer) is allocated at accel_prepare, which requires the model
 * to be prepared (in the same or an earlier call).
 *   o: borrowed; NULL = defaults; must come from the matching _default() (size set).
 * Returns ACCEL_OK; ACCEL_EINVAL naming the hyper-parameter (negative lr, betas outside [0, 1),
 * negative eps / weight decay / momentum, nesterov without momentum or with dampening);
 * ACCEL_ENOMEM. Free with accel_optimizer_free (before its model).
 */
ACCEL_API accel_status accel_sgd_new(accel *acc, accel_model *m, const accel_sgd_options *o,
                                     accel_optimizer **out);
ACCEL_API accel_status accel_adam_new(accel *acc, accel_model *m, const accel_adam_options *o,
                                      accel_optimizer **out);
ACCEL_API accel_status accel_adamw_new(accel *acc, accel_model *m, const accel_adam_options *o,
                                       accel_optimizer **out);
/* Pointer-returning conveniences: NULL on failure (accel_last_error(acc) says why). */
ACCEL_API accel_optimizer *accel_sgd(accel *acc, accel_model *m, const accel_sgd_options *o);
ACCEL_API accel_optimizer *accel_adam(accel *acc, accel_model *m, const accel_adam_options *o);
ACCEL_API accel_optimizer *accel_adamw(accel *acc, accel_model *m, const accel_adam_options *o);

ACCEL_API void accel_optimizer_free(accel_optimizer *opt);

/*
 * One update of every non-frozen parameter (one fused, vectorised, multithreaded pass over the
 * flat buffers), as torch.optim. A no-op returning ACCEL_OK on micro-steps where
 * accel_sync_gradients is 0. With an fp16 loss scaler the step is skipped when a gradient is
 * inf/nan on any process (see accel_optimizer_step_was_skipped).
 * Returns ACCEL_OK; ACCEL_EINVAL when the optimizer was not prepared; ACCEL_ESTATE while a
 * refused accel_load_state has left the state partly loaded (until a load succeeds).
 */
ACCEL_API accel_status accel_optimizer_step(accel_optimizer *opt);
/* Zeroes the model's gradients, only when accel_sync_gradients (Accelerate). */
ACCEL_API accel_status accel_optimizer_zero_grad(accel_optimizer *opt);
/* 1 when the last real step of opt was skipped (fp16 overflow). */
ACCEL_API int accel_optimizer_step_was_skipped_opt(const accel_optimizer *opt);
/* Accelerate's optimizer_step_was_skipped: any live optimizer of acc skipped its last step. */
ACCEL_API int accel_optimizer_step_was_skipped(const accel *acc);
/* Number of real (not skipped) steps taken. */
ACCEL_API long long accel_optimizer_num_steps(const accel_optimizer *opt);

/* Param groups: each has its own lr and weight decay. Group 0 holds every parameter at
 * creation. add_group creates an empty group (lr >= 0, weight_decay >= 0) and returns its index
 * in *group (may be NULL); set_param_group moves a parameter. At most ACCEL_OPTIM_MAX_GROUPS.
 * Return ACCEL_OK or ACCEL_EINVAL naming the bad value. */
#define ACCEL_OPTIM_MAX_GROUPS 16
ACCEL_API int accel_optimizer_num_groups(const accel_optimizer *opt);
ACCEL_API accel_status accel_optimizer_add_group(accel_optimizer *opt, double lr,
                                                 double weight_decay, int *group);
ACCEL_API accel_status accel_optimizer_set_param_group(accel_optimizer *opt, int param_index,
                                                       int group);
/*
 * The usual "no weight decay for biases and norms" split: creates a group with group 0's lr and
 * weight_decay 0, and moves into it every parameter whose name contains one of `patterns`
 * (NULL-terminated list; NULL = {"bias", "ln_", "norm", "LayerNorm"}). *group receives its
 * index (may be NULL). Returns ACCEL_OK or ACCEL_EINVAL.
 */
ACCEL_API accel_status accel_optimizer_no_decay_group(accel_optimizer *opt,
                                                      const char *const *patterns, int *group);
/* Current lr of a group (NAN for a bad group) and setter (ACCEL_EINVAL for lr < 0). */
ACCEL_API double accel_optimizer_get_lr(const accel_optimizer *opt, int group);
ACCEL_API accel_status accel_optimizer_set_lr(accel_optimizer *opt, int group, double lr);

/* ===================================== Schedulers ===================================== */

typedef enum accel_schedule_kind {
    ACCEL_SCHED_CONSTANT = 0,
    ACCEL_SCHED_CONSTANT_WARMUP, /* transformers get_constant_schedule_with_warmup */
    ACCEL_SCHED_LINEAR,          /* get_linear_schedule_with_warmup */
    ACCEL_SCHED_COSINE,          /* get_cosine_schedule_with_warmup (num_cycles, default 0.5) */
    ACCEL_SCHED_COSINE_RESTARTS, /* ..._with_hard_restarts (num_cycles, default 1) */
    ACCEL_SCHED_POLYNOMIAL,      /* get_polynomial_decay_schedule_with_warmup */
    ACCEL_SCHED_STEP,            /* torch StepLR (step_size, gamma) */
    ACCEL_SCHED_MULTISTEP,       /* torch MultiStepLR (milestones, gamma) */
    ACCEL_SCHED_ONE_CYCLE,       /* torch OneCycleLR (lr only: cycle_momentum is not done) */
    ACCEL_SCHED_LAMBDA           /* torch LambdaLR with a C callback */
} accel_schedule_kind;

/* lr of a group = its initial lr * fn(step, ctx), step = 0, 1, 2, ... */
typedef double (*accel_lr_lambda)(long long step, void *ctx);

#define ACCEL_SCHED_MAX_MILESTONES 32

#define ACCEL_SCHEDULER_OPTIONS_VERSION 1

/* Start from accel_scheduler_options_default(kind); fields not used by the kind are ignored.
 * Defaults as transformers / torch. */
typedef struct accel_scheduler_options {
    uint32_t size, version;
    accel_schedule_kind kind;
    long long warmup_steps; /* warmup kinds */
    long long total_steps;  /* linear, cosine*, polynomial, one-cycle */
    double num_cycles;      /* cosine: 0.5, restarts: 1 */
    double power, lr_end;   /* polynomial: 1.0, 1e-7 */
    long long step_size;    /* step */
    double gamma;           /* step, multistep: 0.1 */
    int n_milestones;       /* multistep */
    long long milestones[ACCEL_SCHED_MAX_MILESTONES];
    double max_lr;           /* one-cycle (required, > 0) */
    double pct_start;        /* one-cycle: 0.3 */
    int anneal_linear;       /* one-cycle: 0 = cos (default), 1 = linear */
    double div_factor;       /* one-cycle: 25 */
    double final_div_factor; /* one-cycle: 1e4 */
    int three_phase;         /* one-cycle: 0 */
    accel_lr_lambda lambda;  /* lambda kind (required) */
    void *lambda_ctx;
} accel_scheduler_options;

ACCEL_API accel_scheduler_options accel_scheduler_options_default(accel_schedule_kind kind);

/*
 * Creates a scheduler over opt; like torch it sets each group's lr for step 0 at once.
 * Returns ACCEL_OK or ACCEL_EINVAL naming the field (negative steps, lr_end >= lr for
 * polynomial, total_steps <= 0, unsorted milestones, no lambda, ...). Free with
 * accel_scheduler_free (before its optimizer).
 */
ACCEL_API accel_status accel_scheduler_new(accel *acc, accel_optimizer *opt,
                                           const accel_scheduler_options *o, accel_scheduler **out);
/* Conveniences (NULL on failure, accel_last_error(acc) says why). */
ACCEL_API accel_scheduler *accel_constant_schedule(accel *acc, accel_optimizer *opt,
                                                   long long warmup_steps);
ACCEL_API accel_scheduler *accel_linear_schedule(accel *acc, accel_optimizer *opt,
                                                 long long warmup_steps, long long total_steps);
ACCEL_API accel_scheduler *accel_cosine_schedule(accel *acc, accel_optimizer *opt,
                                                 long long warmup_steps, long long total_steps);
ACCEL_API void accel_scheduler_free(accel_scheduler *s);

/*
 * Advances the schedule with Accelerate's AcceleratedScheduler rules once prepared: with
 * step_scheduler_with_optimizer off, one tick per call; else nothing while accumulating (with
 * adjust_scheduler only the internal step count moves), nothing when an optimizer step was
 * skipped, and num_processes ticks per real step unless split_batches (one-cycle: only while
 * its step count <= total_steps). Not prepared: one tick per call, as a bare torch scheduler.
 * Returns ACCEL_OK, or ACCEL_EINVAL when one-cycle is stepped past total_steps (torch's error).
 */
ACCEL_API accel_status accel_scheduler_step(accel_scheduler *s);
/* The lr the last tick set for `group` (torch get_last_lr), NAN for a bad group. */
ACCEL_API double accel_scheduler_get_last_lr(const accel_scheduler *s, int group);
/* Ticks taken (torch last_epoch). */
ACCEL_API long long accel_scheduler_last_step(const accel_scheduler *s);

/* ===================================== Clipping ===================================== */

/*
 * torch.nn.utils.clip_grad_norm_ over m's non-frozen gradients (call it when
 * accel_sync_gradients, on the synced gradients): unscales first (accel_unscale_gradients),
 * computes the total norm of order norm_type (> 0, or INFINITY for the max), and multiplies
 * every gradient by min(1, max_norm / (total + 1e-6)).
 *   total_norm: receives the norm before clipping (may be NULL).
 * Returns ACCEL_OK or ACCEL_EINVAL (max_norm < 0, norm_type <= 0 or NaN, model not allocated).
 */
ACCEL_API accel_status accel_clip_grad_norm(accel *acc, accel_model *m, double max_norm,
                                            double norm_type, double *total_norm);
/* torch clip_grad_value_: clamps every non-frozen gradient into [-clip, clip] (clip >= 0). */
ACCEL_API accel_status accel_clip_grad_value(accel *acc, accel_model *m, double clip);
/* Divides the gradients of opt's model (NULL: every optimizer) by the fp16 loss scale, once per
 * step; a no-op without an fp16 scaler. Returns ACCEL_OK or the scaler's failure. */
ACCEL_API accel_status accel_unscale_gradients(accel *acc, accel_optimizer *opt);

/* The current fp16 loss scale (GradScaler.get_scale): init_scale (65536) at first, halved
 * (backoff_factor) on every skipped step and doubled (growth_factor) after growth_interval
 * consecutive clean steps. 1.0 when no scaler is active (fp32, bf16, or before the first
 * accel_prepare of a model under fp16). */
ACCEL_API double accel_loss_scale(const accel *acc);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_TRAIN_H */
