/*
 * accel/ckpt.h - safetensors files, saving and loading named tensors and models.
 *
 * safetensors (https://github.com/huggingface/safetensors) is the tensor file format of the
 * Hugging Face ecosystem: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * describing every tensor ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}}
 * plus an optional "__metadata__" object of string pairs), then the raw little-endian row-major
 * tensor bytes. Files written here load with `safetensors.numpy.load_file` / `safe_open` and in
 * PyTorch; files written by those load here.
 *
 * Writing is crash-safe: every file is written to a temporary sibling, fsynced, renamed into
 * place and the parent directory fsynced, so a reader sees the old file or the new one, never a
 * mix. Reading memory-maps the file and validates it the way the reference reader does (header
 * size limit, well-formed JSON, contiguous offsets, sizes match shape x dtype, nothing past the
 * end); a malformed file is ACCEL_ECORRUPT with a message naming the file and the tensor/field.
 *
 * Functions that take no accel handle report errors through accel_last_error(NULL) (per
 * thread). Included by accel.h.
 */
#ifndef ACCEL_CKPT_H
#define ACCEL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor with its name, as given to the writers. Both borrowed by the callee. */
typedef struct accel_named_tensor {
    const char *name; /* UTF-8, unique in the set, not "__metadata__" */
    accel_tensor tensor;
} accel_named_tensor;

/* One "__metadata__" entry (UTF-8 strings, borrowed). */
typedef struct accel_kv {
    const char *key;
    const char *value;
} accel_kv;

/* ==================================== safetensors ==================================== */

/*
 * Writes `n` tensors and `n_metadata` metadata pairs to `path` as one safetensors file, laid out
 * as the reference writer lays it out: tensors sorted by descending dtype alignment then by
 * name (byte order), data contiguous, compact JSON with "__metadata__" first, padded with
 * spaces to a multiple of 8 bytes. n_metadata == 0 writes no "__metadata__" key. Tensors may
 * have ndim 0 (scalars) or zero elements. Written temp -> fsync -> rename -> fsync(parent dir).
 *   tensors: borrowed (read only), in host memory or in a GPU's (tensor.device: copied
 *   through pinned buffers, after the work queued on the GPU's compute stream).
 *   metadata: borrowed, may be NULL when 0.
 * Returns ACCEL_OK; ACCEL_EINVAL naming the tensor or key at fault (duplicate or reserved name,
 * invalid UTF-8, unknown dtype, negative dimension, sub-byte elements that do not fill whole
 * bytes, NULL data with bytes to write, a path that names no file: "", ".", "dir/");
 * ACCEL_EUNSUPPORTED for a tensor on a device this process cannot open (naming why); ACCEL_EIO
 * naming the path or the device's failure. On failure the
 * previous file at `path`, if any, is untouched. Thread-safe for distinct paths.
 */
ACCEL_API accel_status accel_safetensors_write(const char *path, const accel_named_tensor *tensors,
                                               size_t n, const accel_kv *metadata,
                                               size_t n_metadata);

/* A validated, memory-mapped safetensors file. */
typedef struct accel_safetensors accel_safetensors;

/*
 * Opens and validates `path` (see the top of this header). The mapping is private and
 * writable (copy-on-write): writing through a view changes this process's copy only, never
 * the file.
 *   out: receives the handle on success only; close with accel_safetensors_close.
 * Every dtype of the format is read (accel_dtype has them all); a view of a packed sub-byte
 * dtype (F4, F6_*) covers accel_tensor_nbytes bytes.
 * Returns ACCEL_OK; ACCEL_ENOTFOUND when the file does not exist; ACCEL_EIO naming the path;
 * ACCEL_ECORRUPT naming the file and the tensor or field at fault (an unknown dtype, sub-byte
 * elements that do not fill whole bytes, ...); ACCEL_EUNSUPPORTED for a tensor of more than
 * ACCEL_MAX_DIMS dimensions.
 */
ACCEL_API accel_status accel_safetensors_open(accel_safetensors **out, const char *path);

/* Unmaps the file; every view obtained from it becomes invalid. Accepts NULL. */
ACCEL_API void accel_safetensors_close(accel_safetensors *st);

/* Number of tensors. */
ACCEL_API size_t accel_safetensors_count(const accel_safetensors *st);

/* Name of tensor i (0 <= i < count) in file order (by data offset), or NULL out of range.
 * Borrowed, valid until close. */
ACCEL_API const char *accel_safetensors_name(const accel_safetensors *st, size_t i);

/* Index of the tensor called `name`, or -1. O(log n). */
ACCEL_API long accel_safetensors_find(const accel_safetensors *st, const char *name);

/*
 * Fills *out with a CPU view of tensor i into the mapping (data aligned to the element size,
 * NULL never, even for zero elements). Valid until close.
 * Returns ACCEL_OK or ACCEL_EINVAL for i out of range.
 */
ACCEL_API accel_status accel_safetensors_tensor(const accel_safetensors *st, size_t i,
                                                accel_tensor *out);

/* As accel_safetensors_tensor by name: ACCEL_ENOTFOUND naming the tensor and file when absent,
 * ACCEL_EINVAL for a NULL file or name. */
ACCEL_API accel_status accel_safetensors_get(const accel_safetensors *st, const char *name,
                                             accel_tensor *out);

/* Number of "__metadata__" entries (0 without the key). */
ACCEL_API size_t accel_safetensors_metadata_count(const accel_safetensors *st);

/* Entry i of "__metadata__" in file order: *key / *value borrowed until close. Returns ACCEL_OK
 * or ACCEL_EINVAL for i out of range. */
ACCEL_API accel_status accel_safetensors_metadata_at(const accel_safetensors *st, size_t i,
                                                     const char **key, const char **value);

/* The metadata value for `key`, or NULL when absent. Borrowed until close. */
ACCEL_API const char *accel_safetensors_metadata(const accel_safetensors *st, const char *key);

/* The path the handle was opened with. Borrowed until close. */
ACCEL_API const char *accel_safetensors_path(const accel_safetensors *st);

/* ================================ Saving named tensors ================================ */

/*
 * Parses a shard size the way Accelerate / huggingface_hub do: a plain integer is bytes;
 * "KB"/"MB"/"GB"/"TB" are decimal (10^3...), "KiB"/"MiB"/"GiB"/"TiB" binary (2^10...), units
 * case-insensitive, optional "B" alone; a number may carry a fraction ("1.5GB"); a unit ending
 * in a lower-case "b" after K/M/G/T ("10Gb") means bits (divided by 8), as in Accelerate's
 * convert_file_size_to_int. Surrounding spaces are ignored.
 * Returns ACCEL_OK with *nbytes > 0, or ACCEL_EINVAL quoting the string (empty, negative, zero,
 * unknown unit, overflow).
 */
ACCEL_API accel_status accel_parse_size(const char *s, uint64_t *nbytes);

/*
 * Accelerate's accelerator.save for a named set of tensors: the main process writes `path` as
 * one safetensors file (crash-safe, see accel_safetensors_write); the other processes wait for
 * it and return the same status. A collective: every process must call it (only process 0's
 * arguments are used).
 * Returns ACCEL_OK, the writer's error on the main process, ACCEL_EIO on the others when the
 * main process failed, or a comm failure (ACCEL_EPEER / ACCEL_ETIMEDOUT).
 */
ACCEL_API accel_status accel_save(accel *acc, const accel_named_tensor *tensors, size_t n,
                                  const accel_kv *metadata, size_t n_metadata, const char *path);

/*
 * Writes tensors into folder `dir` (created, parents included) as Accelerate's save_model does:
 * one `<prefix>.safetensors`, or, when the tensors exceed max_shard_nbytes,
 * `<prefix>-00001-of-0000k.safetensors` ... plus `<prefix>.safetensors.index.json`
 * ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}, indent 2, sorted keys).
 * Sharding follows huggingface_hub: tensors in the given order; one larger than the limit gets
 * a shard of its own; otherwise a new shard starts when the current one would overflow.
 * Every file carries `metadata`. Afterwards, stale files of an earlier save with the same
 * prefix are deleted (shards not in the new set, the index when now unsharded, the single file
 * when now sharded). Not a collective: call on the process that writes.
 *   prefix: NULL = "model". max_shard_nbytes: 0 = no limit.
 * Returns as accel_safetensors_write, ACCEL_EIO naming a folder that cannot be created,
 * ACCEL_EINVAL for a folder that holds a save_state checkpoint (accel_checkpoint.json), whose
 * own files this would replace (also for accel_save_model and accel_merge_weights).
 */
ACCEL_API accel_status accel_save_sharded(const char *dir, const char *prefix,
                                          const accel_named_tensor *tensors, size_t n,
                                          const accel_kv *metadata, size_t n_metadata,
                                          uint64_t max_shard_nbytes);

/* ================================== Models ================================== */

/*
 * Accelerate's save_model: the main process writes the model's fp32 master weights, by
 * parameter name in registration order, into folder `dir` as `model.safetensors`, or as shards
 * plus `model.safetensors.index.json` when larger than max_shard_size (see accel_save_sharded,
 * prefix "model"; stale files of an earlier save removed). Every file carries the metadata
 * {"format": "pt"}, so transformers' from_pretrained and safetensors.torch load it. Frozen
 * parameters are saved too. A collective: every process calls it and gets the main process's
 * status (the others wait for the write).
 *   max_shard_size: "10GB", "500MiB", ... (accel_parse_size); NULL = "10GB".
 * Returns ACCEL_OK; ACCEL_EINVAL for a bad size or when `dir` is an existing file; the
 * writer's errors; ACCEL_EIO on the other processes when the main one failed.
 */
ACCEL_API accel_status accel_save_model(accel *acc, accel_model *model, const char *dir,
                                        const char *max_shard_size);

/*
 * Loads weights into model's fp32 master weights from `path`: a safetensors file, an index
 * (".json": every shard it names, relative to its folder), or a folder holding
 * model.safetensors or model.safetensors.index.json. Tensors of any dtype are converted with
 * accel_convert (F16/BF16/F8 widen exactly, F64 rounds to nearest even). Not a collective:
 * every process that holds a copy of the model loads it (the weights then agree).
 *   strict: 1 = the file's names must equal the model's (PyTorch load_state_dict strict);
 *           0 = parameters absent from the file keep their values, extra tensors are ignored
 *           (both counted in an info log line).
 * Everything is validated before the first weight is written: on failure the model is
 * unchanged. acc may be NULL (errors then only in accel_last_error(NULL)).
 * Returns ACCEL_OK; ACCEL_EINVAL naming the tensor whose shape differs from the parameter's,
 * or (strict) the first missing / unexpected name; ACCEL_ENOTFOUND for a missing file or a
 * folder without model files; ACCEL_ECORRUPT naming a malformed file, an index entry whose
 * shard lacks the tensor, or a tensor present in two shards.
 */
ACCEL_API accel_status accel_load_model(accel *acc, accel_model *model, const char *path,
                                        int strict);

/* Flags of accel_merge_weights (Accelerate's merge-weights options). */
#define ACCEL_MERGE_UNSAFE_SERIALIZATION 1  /* pytorch_model.bin: refused (ACCEL_EUNSUPPORTED) */
#define ACCEL_MERGE_REMOVE_CHECKPOINT_DIR 2 /* delete the checkpoint once the output is in place   \
                                             */

/*
 * Accelerate's merge-weights (merge_fsdp_weights), offline: consolidates the weights of model
 * 0 of the save_state folder `checkpoint_dir` (sharded over the processes under ZeRO stages
 * 1-3, or whole) into folder `output_dir` exactly as accel_save_model writes them
 * (model.safetensors, or shards + index beyond max_shard_size; NULL = "10GB"): the same bytes
 * for the same weights. Streaming: each tensor's pieces are copied from the mapped shard files
 * to their place in the output, so no tensor, let alone the model, is held in memory. The
 * folder is verified first (marker, sizes, checksums: ACCEL_ECORRUPT naming the file). With
 * ACCEL_MERGE_REMOVE_CHECKPOINT_DIR the checkpoint is deleted only after the output is
 * fsynced and in place (refused when the output lies inside it). Not a collective; no
 * accelerator needed.
 * Returns ACCEL_OK; ACCEL_EUNSUPPORTED for ACCEL_MERGE_UNSAFE_SERIALIZATION (torch's pickle
 * format is not written: the message says so); ACCEL_EINVAL for a folder that is not a
 * save_state checkpoint with a model, or bad arguments; ACCEL_ENOTFOUND; the writer's errors.
 * The message is in accel_last_error(NULL).
 */
ACCEL_API accel_status accel_merge_weights(const char *checkpoint_dir, const char *output_dir,
                                           const char *max_shard_size, int flags);

/* ============================== Training state (save_state) ============================== */

/*
 * Accelerate's save_state: writes the whole training state into a checkpoint folder so that
 * accel_load_state on freshly built objects continues the run bit-identically (docs/checkpoint.md
 * lists the files):
 *   - every prepared model's fp32 master weights (model.safetensors, model_<i>.safetensors),
 *   - every prepared optimizer's state and hyper-parameters (optimizer[_<i>].safetensors),
 *   - every prepared scheduler (scheduler[_<i>].json), the fp16 loss scaler (scaler.json),
 *   - per process: the accelerator's generator and step counters (random_states_<rank>.json),
 *     every prepared loader's position (dl_state_dict_rank<rank>.json) and, when saved inside
 *     an open accumulation window, the gradients accumulated so far
 *     (gradients_rank<rank>.safetensors),
 *   - objects registered with accel_register_for_checkpointing (custom_checkpoint_<i>.bin).
 * Objects are numbered in creation order among the prepared ones of their kind.
 *   dir: the folder (created; an existing one is replaced atomically), or NULL for automatic
 *        naming. With automatic_checkpoint_naming the folder is always
 *        project_dir/checkpoints/checkpoint_<iteration> (a `dir` argument is ignored with a
 *        warning, as in Accelerate); after the save the iteration counter advances and, with
 *        total_limit, only the newest total_limit complete checkpoints are kept.
 * Crash safety: the folder is built in a hidden staging sibling, every file fsynced, the
 * completion marker accel_checkpoint.json written last, the folder renamed into place and its
 * parent fsynced; rotation deletes older checkpoints only afterwards. A process killed at any
 * moment leaves every earlier checkpoint complete.
 * Save pre-hooks run on every process first. A collective: every process calls it.
 * Returns ACCEL_OK; ACCEL_EINVAL (dir NULL without automatic naming, a dir that names no
 * folder that can be created: "", ".", "..", "/", automatic naming without project_dir, the
 * automatic target already exists); ACCEL_ESTATE after a refused load left
 * the state partly loaded (accel_load_state), or while another process (another job) is
 * saving the same folder (the message names it; docs/checkpoint.md, "Two jobs, one folder");
 * ACCEL_EIO naming the file; the first
 * failure of a hook or registered object; ACCEL_EPEER / ACCEL_ETIMEDOUT. Every process
 * returns an error when any process failed, and the checkpoint is then not created.
 */
ACCEL_API accel_status accel_save_state(accel *acc, const char *dir);

/*
 * Accelerate's load_state: restores everything accel_save_state wrote into the objects alive
 * now (built the same way as when saving, prepared), so that the next batch of every loader is
 * the next unseen batch of the saved epoch and the run continues bit-identically.
 *   dir: the folder, or NULL with automatic_checkpoint_naming: the newest complete
 *        checkpoint in project_dir/checkpoints. Loading an automatic checkpoint_<n> sets the
 *        iteration counter to at least n + 1, so the next save does not collide (Accelerate
 *        leaves it and the next save fails).
 * Load pre-hooks run on every process first. Then every file is validated on every process
 * (the marker complete, every file's checksum, each file's header, sizes, names and shapes,
 * the numbers of models, optimizers, schedulers, loaders and registered objects) before
 * anything is modified: on failure no object changes. Except when the live state has nothing
 * to lose (no optimizer step and no successful load since accel_init, as when resuming at the
 * start of a run): the .safetensors checksums are then checked while their tensors are copied
 * in (docs/checkpoint.md, "Fast verified loads"), so a damaged tensor file can leave the
 * tensors partly loaded; the error says so, and accel_optimizer_step and accel_save_state
 * return ACCEL_ESTATE until a load succeeds. Registered objects' load callbacks run before
 * accel's own state is applied. Saved with another number of processes: weights, optimizer, schedulers, scaler
 * and registered objects load; loader positions are rescaled and the resume is not exact
 * (a warning says so). A collective.
 * Returns ACCEL_OK; ACCEL_ENOTFOUND (no such folder, no checkpoint yet); ACCEL_ECORRUPT naming
 * the folder and the file (incomplete or malformed); ACCEL_EINVAL naming what differs from
 * the live objects (counts, names, shapes, optimizer kind); a hook's or callback's failure;
 * ACCEL_EPEER / ACCEL_ETIMEDOUT. When any process fails validation every process fails.
 */
ACCEL_API accel_status accel_load_state(accel *acc, const char *dir);

/* The folder the last successful accel_save_state / accel_load_state on acc used, or NULL.
 * Borrowed, valid until the next of those calls or accel_free. */
ACCEL_API const char *accel_checkpoint_dir(const accel *acc);

/* Accelerate's project_configuration.iteration: the number of the next automatic checkpoint. */
ACCEL_API int accel_checkpoint_iteration(const accel *acc);

/* Collects the bytes of a registered object's state (see accel_register_for_checkpointing). */
typedef struct accel_state_writer accel_state_writer;

/* Appends nbytes of `data` (borrowed) to the object's state. Returns ACCEL_OK, ACCEL_EINVAL,
 * ACCEL_ENOMEM. Only inside a save callback. */
ACCEL_API accel_status accel_state_write(accel_state_writer *w, const void *data, size_t nbytes);

/* save(ctx, w): write the object's state with accel_state_write. load(ctx, data, nbytes):
 * restore it from the bytes save wrote (borrowed for the call). Return ACCEL_OK or an error
 * (which fails the save / load; set a message with the thread's error when possible). */
typedef accel_status (*accel_state_save_fn)(void *ctx, accel_state_writer *w);
typedef accel_status (*accel_state_load_fn)(void *ctx, const void *data, size_t nbytes);

/*
 * Accelerate's register_for_checkpointing: the object (ctx, borrowed until accel_free) becomes
 * custom_checkpoint_<i>.bin of every later save_state (i = registration order; the main
 * process calls save) and is restored by load_state on every process. The folder must hold
 * exactly as many custom checkpoints as objects are registered. Returns ACCEL_OK, ACCEL_EINVAL
 * (acc, save or load NULL), ACCEL_ENOMEM. Register in the same order on every process.
 */
ACCEL_API accel_status accel_register_for_checkpointing(accel *acc, accel_state_save_fn save,
                                                        accel_state_load_fn load, void *ctx);

/*
 * Pre-hooks (register_save_state_pre_hook / register_load_state_pre_hook). A save hook runs on
 * every process at the start of accel_save_state with the folder being built (the staging
 * folder; files it writes there, from one process, become part of the checkpoint). A load hook
 * runs on every process at the start of accel_load_state with the folder to load. A failing
 * hook fails the call. Hooks run in registration order.
 *   handle: receives an id for accel_remove_state_pre_hook (may be NULL).
 * Return ACCEL_OK, ACCEL_EINVAL, ACCEL_ENOMEM.
 */
typedef accel_status (*accel_state_hook)(accel *acc, const char *dir, void *ctx);
ACCEL_API accel_status accel_register_save_state_pre_hook(accel *acc, accel_state_hook hook,
                                                          void *ctx, int *handle);
ACCEL_API accel_status accel_register_load_state_pre_hook(accel *acc, accel_state_hook hook,
                                                          void *ctx, int *handle);
/* Removes a hook by handle (RemovableHandle.remove). ACCEL_ENOTFOUND for an unknown handle. */
ACCEL_API accel_status accel_remove_state_pre_hook(accel *acc, int handle);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_CKPT_H */
