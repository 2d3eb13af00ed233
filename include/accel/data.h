/*
 * accel/data.h - datasets, samplers, process sharding and the prefetching loader.
 *
 * The C form of torch's Dataset/DataLoader plus Accelerate's prepare_data_loader:
 *
 *     accel_dataset *ds;
 *     accel_token_dataset_options to = accel_token_dataset_options_default();
 *     to.path = "train.bin"; to.context = 1024;
 *     ACCEL_CHECK(accel_token_dataset_open(&ds, &to));
 *     accel_loader_options lo = accel_loader_options_default();
 *     lo.batch_size = 16; lo.shuffle = 1; lo.num_workers = 2;
 *     accel_loader *dl;
 *     ACCEL_CHECK(accel_loader_new(acc, ds, &lo, &dl));
 *     accel_prepare(acc, model, opt, dl);            // shards dl over the processes
 *     for (int epoch = 0; epoch < 3; epoch++)
 *         for (accel_batch *b; accel_loader_next(dl, &b) == ACCEL_OK;)
 *             train_step(accel_batch_field(b, "input"), accel_batch_field(b, "target"));
 *     accel_loader_free(dl);
 *     accel_dataset_free(ds);
 *
 * Sharding follows Accelerate exactly (BatchSamplerShard, IterableDatasetShard,
 * DataLoaderDispatcher, even_batches, split_batches, drop_last); docs/data.md has the rules and
 * worked index sequences. Shuffles use accel's generator (xoshiro256**, see docs/data.md), not
 * torch's: orders are deterministic and identical on every process, but not torch's orders.
 *
 * Threading: a loader belongs to one thread. With num_workers > 0 the loader calls the
 * dataset's `get` from its worker threads concurrently, so `get` must be thread-safe (the
 * built-in datasets are).
 */
#ifndef ACCEL_DATA_H
#define ACCEL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fields per sample / batch at most. */
#define ACCEL_MAX_FIELDS 8

/*
 * One sample: up to ACCEL_MAX_FIELDS named tensors of any dtype and shape (variable length
 * allowed; the loader pads or rejects at collate time). A dataset fills n_fields, name[] and
 * field[]. The tensors' data may point either into memory the dataset owns and keeps alive
 * until it is freed (zero copy), or into scratch from accel_sample_scratch. Names are borrowed
 * and must live as long as the dataset (use string literals).
 */
typedef struct accel_sample {
    int n_fields;
    const char *name[ACCEL_MAX_FIELDS];
    accel_tensor field[ACCEL_MAX_FIELDS];
    void *priv; /* the loader's scratch buffers; do not touch */
} accel_sample;

/*
 * Scratch memory for field `field` of sample `s`, at least nbytes, 64-byte aligned, owned by
 * the loader and reused for later samples (no allocation once it has grown). Valid until the
 * dataset's next call with the same `s`. Returns NULL with accel_last_error set when out of
 * memory (ACCEL_ENOMEM) or when s was not given by a loader or field is out of range
 * (ACCEL_EINVAL): the callback then returns accel_last_status(NULL).
 */
ACCEL_API void *accel_sample_scratch(accel_sample *s, int field, size_t nbytes);

/*
 * A dataset: callbacks plus a context, either map-style (len + get: random access) or iterable
 * (next: a stream). Fill one of the two sets; the loader copies this struct and borrows ctx,
 * which must outlive every loader over it.
 *
 * Callbacks return ACCEL_OK or an error; set the message with accel's thread error when
 * possible (the loader adds the sample index: "dataset get(index 17): ...").
 */
typedef struct accel_dataset {
    void *ctx;
    /* Map-style: number of samples, >= 0. */
    int64_t (*len)(void *ctx);
    /* Map-style: fill *out with sample `index` (0 <= index < len). Thread-safe if the loader
     * has workers. */
    accel_status (*get)(void *ctx, int64_t index, accel_sample *out);
    /* Iterable: fill *out with the next sample, or return ACCEL_EOF at the end of the stream. */
    accel_status (*next)(void *ctx, accel_sample *out);
    /* Iterable, optional: restart the stream for `epoch` (Accelerate forwards set_epoch to the
     * dataset). NULL: the stream cannot restart and only one epoch is possible. */
    accel_status (*reset)(void *ctx, int64_t epoch);
    /* Iterable, optional: the stream's length when known (Accelerate's total_length), else
     * NULL or a negative value. Gives lengths and gather_for_metrics' remainder. */
    int64_t (*total_length)(void *ctx);
    /* Called by accel_dataset_free (built-in datasets); may be NULL. */
    void (*destroy)(void *ctx);
} accel_dataset;

/* Releases a dataset made by one of the constructors below (calls destroy(ctx), frees the
 * struct). Accepts NULL. Loaders over it must be freed first. */
ACCEL_API void accel_dataset_free(accel_dataset *ds);

/*
 * TensorDataset: sample i holds row i of each tensor (field j named names[j]). Every tensor
 * needs ndim >= 1 and the same shape[0]. The tensors' data is borrowed (zero copy) and must
 * outlive the dataset; names are copied. Returns ACCEL_OK (*out owned: accel_dataset_free) or
 * ACCEL_EINVAL naming the tensor whose length differs, that has a negative dimension or NULL
 * data (with elements).
 */
ACCEL_API accel_status accel_tensor_dataset_new(accel_dataset **out, int n_fields,
                                                const char *const *names,
                                                const accel_tensor *tensors);

/* Token-file layouts. */
typedef enum accel_token_header {
    ACCEL_TOKENS_AUTO = 0, /* llm.c header when the file starts with a known magic, else raw */
    ACCEL_TOKENS_LLMC = 1, /* 256 int32 header: magic, version, token count; then tokens */
    ACCEL_TOKENS_RAW = 2   /* headerless: the whole file is tokens of token_dtype */
} accel_token_header;

#define ACCEL_TOKEN_DATASET_OPTIONS_VERSION 1

/* Options of accel_token_dataset_open; start from accel_token_dataset_options_default(). */
typedef struct accel_token_dataset_options {
    uint32_t size, version;
    const char *path;          /* required; borrowed for the call */
    int64_t context;           /* tokens per window (T), required, >= 1 */
    int64_t stride;            /* tokens between window starts; 0 = context (llm.c) */
    accel_token_header header; /* default ACCEL_TOKENS_AUTO */
    accel_dtype token_dtype;   /* ACCEL_U16 or ACCEL_I32 (read as uint32) for RAW files;
                                  llm.c files take it from the header. Default U16 */
    accel_dtype out_dtype;     /* ACCEL_I32 (default), ACCEL_I64, or the token dtype (zero copy) */
} accel_token_dataset_options;

ACCEL_API accel_token_dataset_options accel_token_dataset_options_default(void);

/*
 * Opens a flat binary file of tokens and serves windows: sample i has fields "input"
 * (tokens [i*stride, i*stride + T)) and "target" (the same shifted by one), both of shape [T].
 * Windows = (n_tokens - 1 - T) / stride + 1 (0 if the file holds fewer than T + 1 tokens).
 * llm.c layout: 256 little-endian int32 = {20240520, 1 (uint16 tokens), n_tokens} (GPT-2) or
 * {20240801, 7 (uint32 tokens), n_tokens} (Llama 3), then the tokens.
 * Returns ACCEL_OK; ACCEL_EIO naming the file when it cannot be opened or mapped;
 * ACCEL_ECORRUPT naming the file when its size is not a multiple of the token size, the header's
 * magic or version is unknown (explicit LLMC), or the header's token count does not match the
 * size; ACCEL_EINVAL for bad options. Thread-safe reads; *out owned: accel_dataset_free.
 * The file stays open: a loader's windows are read from it (pread), so a window past the end
 * of a file another process has since truncated is ACCEL_EIO from get, naming the file and
 * both sizes. A zero-copy window taken without a loader is a view of the file's mapping,
 * valid until the dataset is freed and only while the file keeps its size (docs/data.md).
 */
ACCEL_API accel_status accel_token_dataset_open(accel_dataset **out,
                                                const accel_token_dataset_options *opts);

/* Tokens in a token dataset (its `ctx` must come from accel_token_dataset_open), or -1. */
ACCEL_API int64_t accel_token_dataset_num_tokens(const accel_dataset *ds);

/*
 * A byte-level corpus for character/byte language models: the bytes of `path`, or when `path`
 * is a folder, of its regular files concatenated in name order (not recursive). Sample i has
 * "input" and "target" fields (U8 by default, or out_dtype ACCEL_I32/ACCEL_I64) of `context`
 * bytes, windows every `stride` bytes (0 = context), as the token dataset.
 * Returns ACCEL_OK, ACCEL_EIO naming the file, ACCEL_EINVAL for bad options or an empty
 * corpus. *out owned: accel_dataset_free.
 */
ACCEL_API accel_status accel_bytes_dataset_open(accel_dataset **out, const char *path,
                                                int64_t context, int64_t stride,
                                                accel_dtype out_dtype);

/* ---- Loader ---- */

/*
 * A collated batch. Field j is `field[j]`, shaped [rows, ...] (stacked samples, or padded to the
 * longest sample along dim 0 for fields with a pad value). Everything, data included, is owned
 * by the loader and valid until the next accel_loader_next / _set_epoch / _free on it.
 */
typedef struct accel_batch {
    int n_fields;
    const char *name[ACCEL_MAX_FIELDS];
    accel_tensor field[ACCEL_MAX_FIELDS];
    int64_t rows;           /* samples in the batch */
    int64_t index;          /* batch number in this epoch on this process (skipped ones count) */
    int64_t epoch;          /* the epoch it belongs to */
    const int64_t *indices; /* map-style: dataset index of each row; NULL for iterable data */
    void *priv;             /* the loader's buffers; do not touch */
} accel_batch;

/* The field named `name`, or NULL. */
ACCEL_API const accel_tensor *accel_batch_field(const accel_batch *b, const char *name);

/* Scratch for a user collate function: data memory for field `field` of `b`, >= nbytes,
 * 64-byte aligned, owned and recycled by the loader. NULL with accel_last_error set when out of
 * memory (ACCEL_ENOMEM) or when b was not given by a loader or field is out of range
 * (ACCEL_EINVAL). */
ACCEL_API void *accel_batch_scratch(accel_batch *b, int field, size_t nbytes);

/*
 * User collate: build *out from samples[0..n) (n >= 1): set n_fields, name[], field[] (data
 * from accel_batch_scratch(out, j, ...)); rows, index, epoch and indices are filled by the loader.
 * Called from worker threads when num_workers > 0 (must be thread-safe then).
 */
typedef accel_status (*accel_collate_fn)(void *ctx, const accel_sample *samples, int64_t n,
                                         accel_batch *out);

/* A per-field pad value: fields named `field` may differ in length (dim 0) inside a batch and
 * are padded to the longest with `value` (converted to the field's dtype). */
typedef struct accel_pad_value {
    const char *field;
    double value;
} accel_pad_value;

#define ACCEL_LOADER_OPTIONS_VERSION 1

/* Loader options; start from accel_loader_options_default(). */
typedef struct accel_loader_options {
    uint32_t size, version;
    int64_t batch_size;       /* default 1. Per process, or global when split_batches */
    int shuffle;              /* 0 (default): sequential sampler; 1: random sampler */
    int seed_set;             /* 1: use `seed`; 0 (default): draw it from accel's generator */
    uint64_t seed;            /* sampler seed (Accelerate's data_seed for the seedable sampler) */
    int drop_last;            /* default 0 */
    int num_workers;          /* threads building batches ahead; 0 (default): on the caller */
    int prefetch_factor;      /* batches in flight per worker; default 2 */
    accel_collate_fn collate; /* NULL: stack / pad */
    void *collate_ctx;
    const accel_pad_value *pad; /* n_pad entries, copied at creation */
    int n_pad;
    /* Per-loader overrides of the accelerator's data options; -1 (default) = the accelerator's
     * (split_batches, even_batches, dispatch_batches, use_seedable_sampler). */
    int split_batches, even_batches, dispatch_batches, use_seedable_sampler;
} accel_loader_options;

ACCEL_API accel_loader_options accel_loader_options_default(void);

typedef struct accel_loader accel_loader;

/*
 * Creates a loader over `ds` (copied; ds->ctx borrowed) on `acc`. Until accel_prepare(acc,
 * loader) it iterates the whole dataset on every process; accel_prepare shards it (Accelerate's
 * prepare_data_loader).
 *   opts: borrowed; NULL = defaults; else made by accel_loader_options_default().
 *   out:  receives the loader on success only; free with accel_loader_free (or released by
 *         accel_free / accel_free_memory).
 * Returns ACCEL_OK; ACCEL_EINVAL naming the bad option (batch_size < 1, a dataset with neither
 * get nor next, ...); ACCEL_ENOMEM.
 */
ACCEL_API accel_status accel_loader_new(accel *acc, const accel_dataset *ds,
                                        const accel_loader_options *opts, accel_loader **out);

/* Stops the workers and releases the loader. Accepts NULL. */
ACCEL_API void accel_loader_free(accel_loader *l);

/*
 * The next batch of the current epoch into *out (valid until the next call on l). At the end of
 * the epoch returns ACCEL_EOF once; the following call starts the next epoch (epoch + 1) unless
 * accel_loader_set_epoch chose another. On a prepared loader the first call of an epoch is a
 * collective when shuffling with several processes (process 0's generator is broadcast), and
 * every call is one with dispatch_batches.
 * Returns ACCEL_OK, ACCEL_EOF, or the failure: ACCEL_EINVAL / ACCEL_ECORRUPT naming the sample
 * index (a failing dataset callback, a field whose dtype or trailing shape differs inside a batch
 * without a pad value), a communication error. After a failure the epoch is over: the next call
 * starts the next epoch.
 */
ACCEL_API accel_status accel_loader_next(accel_loader *l, accel_batch **out);

/* Batches per epoch on this process, in the loader's current mode (sharded once prepared), or
 * -1 for an iterable dataset of unknown length. */
ACCEL_API int64_t accel_loader_len(const accel_loader *l);

/* Sets the epoch the next epoch will be (ends the current one if in progress). Seedable
 * samplers derive their order from (seed, epoch); the random sampler's generator does not
 * rewind (as in Accelerate). Returns ACCEL_OK or ACCEL_EINVAL (epoch < 0 or > 2^53). */
ACCEL_API accel_status accel_loader_set_epoch(accel_loader *l, int64_t epoch);

/* The epoch being iterated (or the next one to start). */
ACCEL_API int64_t accel_loader_epoch(const accel_loader *l);

/*
 * skip_first_batches: the next epoch started (or the current one, if no batch has been handed
 * out yet) begins with batch `n`; later epochs are whole again. Map-style data skips indices
 * only (no sample is read); iterable data reads and discards. Returns ACCEL_OK or ACCEL_EINVAL.
 */
ACCEL_API accel_status accel_loader_skip_first_batches(accel_loader *l, int64_t n);

/*
 * The loader position for checkpoints: restoring it on a loader built the same way makes the
 * next batches equal to those an uninterrupted run would have produced.
 */
typedef struct accel_loader_position {
    int64_t epoch;                       /* the epoch in progress or next to start */
    int64_t batches;                     /* batches of that epoch already handed out */
    uint64_t seed;                       /* sampler seed */
    uint64_t rng[ACCEL_RNG_STATE_WORDS]; /* random sampler generator at the start of `epoch` */
} accel_loader_position;

ACCEL_API accel_status accel_loader_get_position(const accel_loader *l, accel_loader_position *out);
/* Ends the epoch in progress; the next accel_loader_next resumes at `pos`. ACCEL_EINVAL for
 * counts outside 0..2^53 or an all-zero generator state. */
ACCEL_API accel_status accel_loader_set_position(accel_loader *l, const accel_loader_position *pos);

/* ---- gather_for_metrics ---- */

/*
 * Gathers `in` (shape [rows, ...], rows may differ between processes) from every process,
 * concatenated on dim 0 in process order, and on the last batch of a prepared loader drops the
 * duplicated tail samples that even_batches / dispatch added (keeps the first `remainder` rows).
 * *out is a view of memory owned by acc, valid until the next gather_for_metrics call on acc.
 * A collective. Returns ACCEL_OK, ACCEL_EINVAL (dtype or trailing shape differs between
 * processes, naming the process), or a communication failure.
 */
ACCEL_API accel_status accel_gather_for_metrics(accel *acc, const accel_tensor *in,
                                                accel_tensor *out);

/* One object as bytes. */
typedef struct accel_blob_ref {
    const void *data;
    size_t nbytes;
} accel_blob_ref;

/*
 * The same for objects (gather_for_metrics with use_gather_object): each process passes n items;
 * *out receives *n_out items (all processes' in order, then truncated to the remainder on the
 * last batch), their bytes owned by acc and valid until the next gather_for_metrics call.
 */
ACCEL_API accel_status accel_gather_for_metrics_objects(accel *acc, const accel_blob_ref *items,
                                                        size_t n, const accel_blob_ref **out,
                                                        size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_DATA_H */
