/*
 * Private structures of the training core, shared by src/train/ (all files) and by the modules that
 * build on it (precision, ZeRO sharding, checkpoints). Invariant: master, compute, grad and
 * every optimizer-state buffer use one layout, the model's flat geometry (flat.h: parameters in
 * reverse registration order, buckets padded to the pad unit), so a range [off, off + count)
 * means the same elements in all of them. Every element-wise pass over those buffers goes
 * through the model's device (src/device/device.h).
 */
#ifndef ACCEL_TRAIN_INTERNAL_H
#define ACCEL_TRAIN_INTERNAL_H

#include "accel/accel.h"
#include "comm/comm.h"
#include "core/gstate.h"
#include "core/internal.h"
#include "core/settings.h"
#include "core/state_proto.h"
#include "device/device.h"
#include "flat.h"

/* An element range of the flat buffers. */
typedef struct accel__range {
    size_t offset, count;
} accel__range;

/* The reducer's state for one bucket of the geometry (reducer.c). */
typedef struct accel__bucket {
    struct accel_model *model;
    int index;
    size_t offset, count; /* communicated range: first to last trainable parameter */
    int n_params;         /* trainable parameters in it (0: never communicated) */
    int frozen_first;     /* its frozen ranges inside [offset, offset + count): */
    int n_frozen;         /*   reducer.frozen[frozen_first, frozen_first + n_frozen) */
    int pending;          /* parameters not yet ready in the current backward */
    accel_work *work;     /* in-flight collective, NULL when none */
    accel_work *xwork;    /* hybrid ZeRO-2/3: the owned piece's all-reduce across the replicas,
                             posted once work is complete (on nccl: right behind it, ordered
                             by cross_ev); NULL when none */
    int crossed;          /*   posted (or not needed) for the current backward */
    double launch_time, done_time;
    accel__event *ready_ev; /* on the GPU: recorded on the compute stream when launched */
    accel__event *cross_ev; /* on_device, hybrid: recorded on comm_stream after the
                               reduce-scatter; cross_stream waits for it */
    accel_status hook_st;   /* first failure of its hooks (communication thread), or OK; */
    char *hook_msg;         /*   reported by the wait with this message */
} accel__bucket;

/*
 * Gradient reduction of one model (reducer.c): readiness, launch strictly in bucket order,
 * compression as the all-reduce's wire dtype, wait, profiler spans. Built at prepare.
 */
typedef struct accel__reducer {
    int n_buckets;
    int n_sent; /* buckets with a trainable parameter (the others are never sent) */
    accel__bucket *buckets;
    accel__range *frozen;       /* frozen ranges, grouped by bucket */
    unsigned char *ready;       /* per parameter, current backward */
    int next_launch;            /* first bucket not yet launched */
    int zero_stage;             /* strategy: 0/1 all-reduce, 2/3 reduce-scatter */
    accel_dtype comm_dtype;     /* ACCEL_F32, or ACCEL_BF16 / ACCEL_F16: the wire dtype */
    accel__stream *comm_stream; /* staged: the hooks' copies; on_device: the collectives */
    accel__stream *cross_stream; /* hybrid sharding: the cross-replica all-reduces on nccl;
                                  * staged, the copies of their hooks, which run on the
                                  * replica communicator's thread */
    /* Staging (gradients in GPU memory, a communicator that reads host memory only): each
     * bucket goes device -> host_buf -> collective -> device on comm_stream, the copies run
     * as the collective's hooks, after the bucket's ready_ev. */
    int staged;
    int on_device; /* a device communicator (nccl) reduces the GPU buffers on comm_stream */
    void *host_buf; /* pinned host mirror of the fp32 gradients */
    int populate_failed; /* the kernel cannot populate gradient pages (logged once) */
} accel__reducer;

struct accel_model {
    accel__object obj; /* first: accel_prepare dispatches on it */
    accel *acc;
    accel__device *dev; /* where every buffer lives */
    int n_params, cap_params;
    accel_param *params; /* registration order; names owned (char *) */
    size_t numel;
    int allocated;
    accel__flat flat; /* geometry, fixed at alloc */
    int *flat_bucket; /* per parameter: its bucket of the geometry */
    int zero_stage;   /* 0 (DDP) .. 3, fixed at alloc (zero.c) */
    int rank;         /* this process's piece of every bucket (0 when nothing is sharded) */
    /* Hybrid sharding (zero.c): the state is sharded over flat.n_ranks processes, the shard
     * group; replica is this process's group (rank / group size), and replica 0 alone puts
     * the pieces into checkpoints. From prepare: shard_comm joins the group (acc->comm when
     * there is one group, borrowed) and replica_comm the processes with the same piece in
     * every group (NULL when there is one group). */
    int replica;
    accel__comm *shard_comm, *replica_comm;
    /* Flat buffers of flat.padded_numel elements each, except a sharded master. */
    float *master;   /* fp32 master weights; only this process's shard when master_shard */
    int master_shard; /* the master is the shard (SHARD-indexed): stage 3, and stages 1-2
                         under mixed precision with several processes in the shard group */
    float *weights;  /* the full fp32 weights parameters view: the master unless
                        master_shard; then a page buffer holding the gathered units only
                        (zero3.c): at stage 3 the fp32 master's units, at stages 1-2 the
                        compute copy's units widened to fp32 */
    int compute_stale; /* master_shard at stages 1-2: a load wrote the master pieces; the
                          compute copy is gathered from them at the next collective use */
    int *unit_mark;  /* accel_model_set_unit's unit per parameter (0: by name), or NULL */
    int n_unit_marks, unit_calls;
    struct accel__zero3 *z3; /* the units' state of a sharded master (zero3.c), or NULL */
    int join_saved_stage;     /* inside a ZeRO join region (run as DDP): the stage, else 0 */
    float *join_master_shard; /* ... and a sharded master while the full weights serve */
    float *grad;     /* fp32 gradients (accumulated in fp32 across micro-steps) */
    int grad_shared; /* grad is from accel__comm_alloc: bucket all-reduces are zero-copy */
    int grad_pages;  /* grad is from accel__pages_alloc (ZeRO-2/3 on the host): the parts
                        this process does not own are given back once reduced */
    accel_dtype compute_dtype; /* ACCEL_F32, or ACCEL_BF16 / ACCEL_F16 under mixed precision */
    void *compute;             /* working copy, STORED in compute_dtype (== master in fp32) */
    int compute_valid;         /* compute == round(master) (set by the refresh) */
    double *dev_sum;           /* one double and one int32 of device memory for reductions */
    int32_t *dev_flag;

    accel__reducer red;

    /* Per micro-step communication state. */
    int accum_allows;  /* set by accel_accumulate (1 until then) */
    int no_sync_depth; /* accel_no_sync_begin nesting */
    int trigger_sync;  /* accel_trigger_sync_in_backward, consumed by the next backward */
    int in_backward;   /* between accel_backward_begin and accel_backward_end */
    int comm_now;      /* this backward all-reduces */
    int grad_reduced;  /* ZeRO-2/3: a backward reduced the gradients since the last zero_grad */
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

/* A maximal run of parameters adjacent in memory with the same group and not frozen; under
 * ZeRO (stage >= 1) only the part of it this process owns, inside one piece of one bucket. */
typedef struct accel__optim_segment {
    size_t offset, count; /* flat range (master, gradients) */
    size_t state_offset;  /* where it starts in the optimizer state (= offset at stage 0) */
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
    /* State, parallel to the master buffer at stage 0, to this process's shard from stage 1
     * on (accel__zero_state_numel elements; allocated at prepare, zero-filled):
     * SGD: state_a = momentum buffer; Adam: state_a = exp_avg, state_b = exp_avg_sq,
     * state_c = max_exp_avg_sq (amsgrad). */
    float *state_a, *state_b, *state_c;
    float *shard_state[3]; /* inside a ZeRO join region: the shards of a, b, c (zero.c) */
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

/* ---- accumulation (gstate.c; the rest of the GradientState is core/gstate.h) ---- */

/* gradient_accumulation_steps, at least 1. */
int accel__grad_state_accum_steps(const accel *acc);
/* Inside an open accumulation window: gradients accumulated that no step consumed yet. */
int accel__grad_state_window_open(const accel *acc);
/* accel_accumulate's rule: the next micro-step, synchronising every accum_steps-th one and
 * at the end of the loader (sync_with_dataloader). ACCEL_ENOMEM. */
accel_status accel__grad_state_advance(accel *acc);

/* Rebuilds the optimizer segments (after group or freeze changes). */
accel_status accel__optim_build_segments(accel_optimizer *opt);
/* The optimizer's state protocol (optim_state.c). */
accel_status accel__optim_state_save(accel__object *self, accel__state_writer *w);
accel_status accel__optim_state_load(accel__object *self, accel__state_reader *r);

/* ---- the model's device buffers (model.c) ---- */

/* Typed span of `count` elements of the master / grad buffer from `offset`. */
static inline accel__dspan accel__master_span(const accel_model *m, size_t offset, size_t count)
{
    return accel__dspan_f32(m->master + offset, count);
}
static inline accel__dspan accel__grad_span(const accel_model *m, size_t offset, size_t count)
{
    return accel__dspan_f32(m->grad + offset, count);
}
/* 1 when the model's buffers are host memory (the CPU device), which the host communicators
 * read directly; 0 on a GPU. */
static inline int accel__model_on_host(const accel_model *m)
{
    return accel__device_which(m->dev).type == ACCEL_DEVICE_CPU;
}
/* 1 when the model's buffers reach the communicator through host copies (staging): on a GPU,
 * since no communicator of this build reads GPU memory; on the CPU only when a test forced it
 * with accel__train_force_staging (so the GPU path's logic runs on machines without one). */
int accel__model_staged(const accel_model *m);
/* ZeRO-2/3 with grad_reduced: each process's own pieces scaled by the group's size, so a later
 * reduction adds to them as stage 0 would (sync.c); clears grad_reduced. */
accel_status accel__model_rescale_reduced(accel_model *m);
void accel__train_force_staging(int on);
/* The master weights of process `root` to every process (a collective): in place on the host,
 * through a pinned host copy when staged. */
accel_status accel__model_broadcast_master(accel_model *m, int root);
/* The same for any flat fp32 buffer of padded_numel elements where the model lives (a join
 * region's full optimizer state, zero.c); what names it in an error. */
accel_status accel__model_broadcast_flat(accel_model *m, float *buf, int root, const char *what);
/* Zeroes every gradient (padding included). */
accel_status accel__model_zero_grad(accel_model *m);
/* A device result read back to the host (one small copy). */
accel_status accel__model_read_sum(accel_model *m, double *out);
accel_status accel__model_read_flag(accel_model *m, int32_t *out);

/* ---- the reducer (reducer.c) ---- */

/* Builds the buckets' communication state from the geometry and the current frozen flags
 * (sets every accel_param.bucket), checks that the backend can compress as comm_dtype asks,
 * and sets up staging for gradients in GPU memory. Idempotent. */
accel_status accel__reducer_prepare(accel_model *m);
/* Waits for in-flight work, then releases everything. */
void accel__reducer_free(accel_model *m);
/* A new backward: every bucket pending again, no parameter ready. */
void accel__reducer_begin(accel_model *m);
/* Parameter `index` holds its final gradient: launches every bucket now complete, in order,
 * when this backward communicates. ACCEL_EINVAL when it was already marked. */
accel_status accel__reducer_ready(accel_model *m, int index);
/* The end of a backward: every parameter counts as ready, the remaining buckets are
 * launched (when communicating) and every bucket is waited for. First failure. */
accel_status accel__reducer_finish(accel_model *m);
/* Waits for (and releases) every in-flight bucket collective; first failure. */
accel_status accel__reducer_wait(accel_model *m);
/* gradients *= factor over every communicated range (the join's division). */
accel_status accel__reducer_scale(accel_model *m, float factor);
/* One round of a joined process: zero gradients and every bucket's collective, as the
 * processes still training issue them. */
accel_status accel__reducer_mirror(accel_model *m);

/* ---- ZeRO sharding (zero.c; the layout per stage is in docs/training.md) ---- */

/* Hybrid sharding: the processes of each shard group (accel_options.zero_shard_size
 * resolved: the machine's processes, the count, or every process). */
int accel__zero_group_size(const accel *acc);
/* At prepare (collective): the shard and replica communicators (comm split) when there are
 * several groups; otherwise shard_comm = acc->comm. free releases what new made. */
accel_status accel__zero_groups_new(accel_model *m);
void accel__zero_groups_free(accel_model *m);
/* The communicator the state is sharded over: shard_comm once prepared, else acc->comm. */
static inline accel__comm *accel__zero_comm(const accel_model *m)
{
    return m->shard_comm != NULL ? m->shard_comm : m->acc->comm;
}
/* The rank whose pieces this process puts into a checkpoint: its own in the first replica,
 * -1 (nothing: the first replica holds the same pieces) in the others. */
static inline int accel__zero_save_rank(const accel_model *m)
{
    return m->replica == 0 ? m->rank : -1;
}

/* Elements of each optimizer-state buffer: the shard from stage 1 on, else padded_numel. */
size_t accel__zero_state_numel(const accel_model *m);
/* The part of parameter i (registration index) owned by `rank`: flat range [*flat_off,
 * *flat_off + *count), at *shard_off in that rank's shard; *count 0 when it owns none (or
 * rank is -1: accel__zero_save_rank of a later replica). A
 * parameter lies in one bucket, so the part is one contiguous run of its row-major
 * flattening, from element *flat_off - params[i].offset. Stage 0: the whole parameter (rank
 * 0), *shard_off == *flat_off. */
void accel__zero_param_part(const accel_model *m, int i, int rank, size_t *flat_off,
                            size_t *shard_off, size_t *count);
/* Where this process's owned elements live: the master (flat-indexed unless master_shard) and
 * an optimizer state buffer (flat-indexed at stage 0, shard-indexed from stage 1). */
float *accel__zero_master_at(const accel_model *m, size_t flat_off, size_t shard_off);
float *accel__zero_state_at(const accel_model *m, float *buf, size_t flat_off, size_t shard_off);
/* Cuts the optimizer's segments down to the pieces this process owns (stage >= 1; a no-op at
 * stage 0). ACCEL_ENOMEM. */
accel_status accel__zero_shard_segments(accel_optimizer *opt);
/* After this process wrote its pieces of the master (an optimizer step): every process's
 * full master from the owners' pieces (per-bucket allgather in place) and the compute copy
 * refreshed; with a sharded master at stages 1-2, the owned pieces rounded into the compute
 * copy and the COMPUTE copy all-gathered; stage 3 releases its units. Collective; at stage 0
 * only the compute refresh. */
accel_status accel__zero_gather_master(accel_model *m);
/* master_shard at stages 1-2: this process's master pieces rounded into its pieces of the
 * compute copy, then the compute copy all-gathered per bucket (every bucket, or only those
 * with a trainable parameter), compute_stale cleared and the widened units released.
 * Collective. */
accel_status accel__zero_gather_compute(accel_model *m, int all_buckets);
/* The owned part of parameter i (accel__zero_param_part for this process) as a gradient
 * span; empty when the process owns none of it. */
accel__dspan accel__zero_grad_part(const accel_model *m, int i);

/* join_uneven_inputs under ZeRO: the region runs as DDP. unshard (accel_join_begin, every
 * process): every optimizer's full state gathered (and stage 3's weights, which serve as the
 * master), the model at stage 0 until reshard (accel_join_end, after root's weights were
 * broadcast): root's optimizer state and step count broadcast, each process keeps its pieces,
 * the stage restored. Collective. */
accel_status accel__zero_unshard(accel_model *m);
accel_status accel__zero_reshard(accel_model *m, int root);

/* ---- ZeRO stage 3 (zero3.c) ---- */

/* Every parameter's unit (registration order, runs numbered from 0: accel_model_set_unit's
 * ranges, else by name) into unit_of[n_params]. */
void accel__zero3_units(const accel_model *m, int *unit_of);
/* The unit state and the page buffers of a model whose master is sharded (master_shard):
 * the weights, and at stage 3 the compute copy under mixed precision (stages 1-2 keep a full
 * compute copy, allocated by the caller). ACCEL_ENOMEM. */
accel_status accel__zero3_alloc(accel_model *m);
void accel__zero3_free(accel_model *m);
/* After the full weights were made identical on every process (prepare, join's end): this
 * process's pieces into its master shard, at stages 1-2 the compute copy rounded from the full
 * weights, then every unit released. */
accel_status accel__zero3_take_shard(accel_model *m);
/* 1 unless the master is sharded and no unit was gathered since the last release (a forward
 * that read parameters without accel_model_materialize would have read zeros). */
int accel__zero3_used(const accel_model *m);
/* Stage 3 with the model in device memory (tests): the bytes of the weights' and compute
 * copy's reserved ranges mapped now and at most since the weights became the shard; whether
 * the granule of the weights holding flat element flat_index is mapped (0 on the host). */
void accel__zero3_mapped(const accel_model *m, size_t *now, size_t *peak);
int accel__zero3_is_mapped(const accel_model *m, size_t flat_index);
/* The backend's map and unmap calls on both ranges so far (each one physical allocation: on
 * CUDA cuMemCreate + cuMemMap + cuMemSetAccess, or cuMemUnmap + cuMemRelease), and how often
 * materialize waited for the GPU to finish with a unit that left the window (tests). */
void accel__zero3_calls(const accel_model *m, size_t *maps, size_t *unmaps, uint64_t *waits);
/* Unit (bucket) b of a stage-3 model: 0 released (or, on a device, left the window and not yet
 * unmapped), 1 gather in flight, 2 resident (tests). */
int accel__zero3_unit_state(const accel_model *m, int b);
/* Waits for gathers in flight and releases every unit (their weights are stale after an
 * optimizer step; FSDP reshards after backward). */
accel_status accel__zero3_release_all(accel_model *m);

/* ---- mixed precision (precision.c) ---- */

/* Installs the fp16 loss scaler in the ACCEL__MOD_PRECISION slot when mixed_precision is fp16
 * and none is there yet (called by model prepare). ACCEL_EINVAL for out-of-range scaler
 * options. */
accel_status accel__precision_install(accel *acc);
/* The scaler's scale and growth tracker (accel_loss_scale, tests; checkpoints go through its
 * state protocol): get returns 0 (outputs untouched) when no scaler is active; set installs
 * the scaler if needed and returns ACCEL_ESTATE when mixed_precision is not fp16,
 * ACCEL_EINVAL for scale <= 0 / inf or a negative tracker. */
int accel__scaler_get(const accel *acc, double *scale, long long *growth_tracker);
accel_status accel__scaler_set(accel *acc, double scale, long long growth_tracker);
/* ACCEL_F32, ACCEL_BF16 or ACCEL_F16 from mixed_precision. */
accel_dtype accel__compute_dtype(const accel *acc);
/* compute = round(master) over all / a range of elements (no-op in fp32 mode). Call after
 * anything writes the master weights (prepare, optimizer step, checkpoint load). */
accel_status accel__model_refresh_compute(accel_model *m);
accel_status accel__model_refresh_compute_range(accel_model *m, size_t offset, size_t count);
/* Where an update of the weights from flat element `offset` (param: the master it writes) may
 * write the compute copy in its own pass (accel__adam_args.compute), which then stands for
 * accel__model_refresh_compute_range over the same elements: a valid 16-bit copy rounded from
 * those very weights (stage 0). NULL when the refresh must follow instead. */
void *accel__model_compute_fused(const accel_model *m, const float *param, size_t offset);
/* Compressed communication: validation at prepare. */
accel_status accel__comm_dtype_check(accel *acc);

#endif /* ACCEL_TRAIN_INTERNAL_H */
