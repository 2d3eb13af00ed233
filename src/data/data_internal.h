/*
 * Private interface of the data module (src/data/): index plans and Accelerate's sharding
 * algorithms (shard.c), scratch buffers and collate (collate.c), the worker pool (workers.c),
 * dispatch_batches (dispatch.c) and the loader itself (loader.c; its creation and release in
 * loader_new.c).
 *
 * Invariant: an epoch of a map-style loader is fully described by its plan (the dataset indices
 * of every batch this process yields, in order), computed when the epoch starts; workers only
 * read it, so the order never depends on the number of workers.
 */
#ifndef ACCEL_DATA_INTERNAL_H
#define ACCEL_DATA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "accel/data.h"
#include "core/internal.h"
#include "core/rng.h"
#include "core/state_proto.h"

/* ---- Plans: a list of batches of dataset indices ---- */

typedef struct accel__plan {
    int64_t *idx; /* indices of every batch, concatenated */
    int64_t n_idx, cap_idx;
    int64_t *off; /* batch b is idx[off[b] .. off[b+1]); n_batches + 1 entries */
    int64_t n_batches, cap_off;
} accel__plan;

void accel__plan_clear(accel__plan *p);
void accel__plan_free(accel__plan *p);
/* Appends one batch made of a[0..na) followed by b[0..nb) (b may be NULL). ENOMEM on failure. */
accel_status accel__plan_push(accel__plan *p, const int64_t *a, int64_t na, const int64_t *b,
                              int64_t nb);
static inline int64_t accel__plan_batch_len(const accel__plan *p, int64_t b)
{
    return p->off[b + 1] - p->off[b];
}

/* torch's BatchSampler over `order[0..n)`: batches of batch_size, the last one short unless
 * drop_last drops it. */
accel_status accel__plan_batches(accel__plan *out, const int64_t *order, int64_t n,
                                 int64_t batch_size, int drop_last);

/*
 * Accelerate's BatchSamplerShard: the batches process `rank` of `n_ranks` yields from the inner
 * batch sampler `inner` (batch_size 0 = variable-size batches, which need even == 0).
 * split: every inner batch is sliced; else whole batches go round-robin. Appends to out.
 * Returns ACCEL_OK or ACCEL_EINVAL (split with batch_size % n_ranks != 0, variable batches with
 * even_batches).
 */
accel_status accel__shard_batches(accel__plan *out, const accel__plan *inner, int64_t batch_size,
                                  int drop_last, int n_ranks, int rank, int split, int even);

/* len(BatchSamplerShard) for an inner sampler of inner_len batches. */
int64_t accel__shard_len(int64_t inner_len, int drop_last, int n_ranks, int rank, int split,
                         int even);

/* ---- Scratch buffers behind accel_sample / accel_batch ---- */

typedef struct accel__bufset {
    void *buf[ACCEL_MAX_FIELDS];
    size_t cap[ACCEL_MAX_FIELDS];
    int64_t *indices; /* batches: the rows' dataset indices */
    int64_t cap_indices;
} accel__bufset;

void *accel__bufset_get(accel__bufset *s, int field, size_t nbytes);
void accel__bufset_free(accel__bufset *s);

/* Samples with their own scratch: init gives each its bufset, free releases them. */
accel_status accel__samples_init(accel_sample *s, int64_t n);
void accel__samples_free(accel_sample *s, int64_t n);
accel_status accel__batch_init(accel_batch *b);
void accel__batch_free(accel_batch *b);

/* Pad values of a loader, resolved per field name. */
typedef struct accel__padset {
    int n;
    char *field[ACCEL_MAX_FIELDS];
    double value[ACCEL_MAX_FIELDS];
} accel__padset;

/*
 * The default collate: stacks every field of samples[0..n) into out (shape [n, ...]), or pads
 * fields that have a pad value to the longest along dim 0. `indices` (may be NULL) name the
 * samples in error messages. Returns ACCEL_OK, ACCEL_EINVAL naming the sample index and field
 * when dtypes, field sets or trailing shapes differ, ACCEL_ENOMEM.
 */
accel_status accel__collate_default(const accel__padset *pad, const accel_sample *samples,
                                    int64_t n, const int64_t *indices, accel_batch *out);
/* What a user collate function built, checked before the loader hands it out or broadcasts it
 * (dispatch_batches): 0..ACCEL_MAX_FIELDS fields of a valid dtype and rank, no negative
 * dimension, data for every byte. ACCEL_EINVAL naming the field (message set). */
accel_status accel__batch_check(const accel_batch *b);

/* Writes `value` converted to dtype `dt` into count elements at dst. */
void accel__fill_value(void *dst, accel_dtype dt, double value, int64_t count);

/* ---- The loader ---- */

typedef struct accel__workers accel__workers;
typedef struct accel__dispatch accel__dispatch;

/* One batch being built or handed out, with the outcome of building it. */
typedef struct accel__slot {
    accel_batch batch;
    accel_status st;
    char err[ACCEL__ERRMSG_NBYTES];
    int64_t ready; /* batch number it holds, -1 when none */
} accel__slot;

struct accel_loader {
    accel__object obj; /* first: accel_prepare dispatches on it */
    accel *acc;
    accel_dataset ds;
    int map_style;
    accel_loader_options o;
    accel__padset pad;

    /* Mode, fixed by prepare (defaults: unsharded). */
    int rank, n_ranks; /* the shard this process reads; 0 / 1 when not sharded */
    int split, even, dispatch, seedable;
    int track_state; /* prepared: reports to the GradientState (core/gstate.h) */

    /* Sampler. */
    uint64_t seed;
    accel__gen gen;       /* the random sampler's generator, running across epochs */
    accel__gen epoch_gen; /* its value at the start of the current epoch */

    /* Epoch state. */
    int64_t epoch;     /* in progress, or next to start */
    int in_epoch;      /* an epoch has started and has not returned EOF yet */
    int64_t k;         /* next batch number of the epoch (dispatch: of the base stream) */
    int64_t dk;        /* dispatch: steps handed out (or skipped) this epoch */
    int64_t skip;      /* batches to skip when the next epoch starts */
    int64_t n_batches; /* map-style: batches in the plan of this epoch */
    int64_t *order;    /* sampler order */
    int64_t cap_order;
    accel__plan inner, plan;

    /* Building batches. */
    accel_sample *samples; /* the caller thread's samples (batch length) */
    int64_t n_samples;
    accel__slot *slots; /* 1 (sync), 2 (iterable look-ahead) or workers' ring */
    int n_slots;
    int cur_slot; /* slot handed out, -1 none */
    accel__workers *workers;
    accel__dispatch *disp;

    /* Iterable streams. */
    accel_sample *ibuf[2]; /* [0]: first full buffer (kept for padding), [1]: current */
    int64_t ibuf_cap[2];
    int64_t first_len; /* valid samples in ibuf[0]; 0 before the first full buffer */
    int stream_done;
    int have_next; /* iterable look-ahead: slot holding the next batch, -1 none yet, -2 ended */

    /* Gradient-state bookkeeping while an epoch of a prepared loader runs. */
    int active;
    int saved_eod, saved_remainder;
    int remainder;
};

/* Ends the epoch in progress (advance: the next one is epoch + 1); nothing when none runs. */
void accel__loader_end_epoch(accel_loader *l, int advance);

/* Prepares `l` as process `rank` of `n_ranks` (accel_prepare uses the accelerator's rank; unit
 * tests call it directly to reproduce every shard without communication). */
accel_status accel__loader_prepare_as(accel_loader *l, int rank, int n_ranks);

/* The loader's state protocol (loader_state.c). */
accel_status accel__loader_state_save(accel__object *self, accel__state_writer *w);
accel_status accel__loader_state_load(accel__object *self, accel__state_reader *r);

/* Builds map-style batch number k of the current plan into `slot` using `samples`. */
void accel__loader_build(accel_loader *l, int64_t k, accel_sample *samples, accel__slot *slot);

/* Worker pool (workers.c). */
accel_status accel__workers_new(accel_loader *l, accel__workers **out);
void accel__workers_free(accel__workers *w);
/* Starts producing batches [k0, n) of the current plan. */
void accel__workers_start(accel__workers *w, int64_t k0, int64_t n);
/* Waits for batch k (releasing the ones before it); returns its slot. */
accel__slot *accel__workers_get(accel__workers *w, int64_t k);
/* Cancels the epoch: waits until no worker is building. */
void accel__workers_stop(accel__workers *w);

/* ceil(n / d) for n >= 0, d >= 1, without the overflow of (n + d - 1) / d: a dataset may
 * report any length up to INT64_MAX. */
static inline int64_t accel__ceil_div(int64_t n, int64_t d)
{
    return n / d + (n % d != 0);
}

/* dispatch_batches (dispatch.c). */
accel_status accel__dispatch_new(accel_loader *l, accel__dispatch **out);
void accel__dispatch_free(accel__dispatch *d);
accel_status accel__dispatch_begin(accel_loader *l);
/* Next batch for this process into *out; *last = 1 on the epoch's last one; ACCEL_EOF when the
 * epoch had no (more) batches. */
accel_status accel__dispatch_next(accel_loader *l, accel_batch **out, int *last);
int64_t accel__dispatch_len(const accel_loader *l);

/* Helpers shared by loader.c and dispatch.c: the unsharded stream of base batches. */
accel_status accel__loader_begin_order(accel_loader *l);
accel_status accel__iter_fill(accel_loader *l, accel_sample *buf, int64_t want, int64_t *got);
int64_t accel__dataset_len(const accel_loader *l); /* samples, or -1 when unknown */
/* At accel_prepare with several processes: ACCEL_EINVAL on every process when their loaders
 * differ (dataset length, batch size, sampler options), naming what (agree.c). A collective. */
accel_status accel__loader_agree(accel_loader *l);
/* One batch of the iterable stream (sharded by IterableDatasetShard unless dispatching). */
accel_status accel__iter_produce(accel_loader *l, accel_batch *out, int *have);
/* The next batch of the unsharded base stream (dispatch: process 0), ACCEL_EOF at its end. */
accel_status accel__base_next(accel_loader *l, accel_batch **out);

#endif /* ACCEL_DATA_INTERNAL_H */
