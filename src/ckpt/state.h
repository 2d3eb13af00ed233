/*
 * Private interface of save_state / load_state. src/ckpt/state.c orchestrates (naming,
 * collectives, commit); state_registry.c keeps the module's state, registered objects and
 * hooks; state_io.c collects the objects and writes their files; state_load.c plans (opens and
 * validates everything) and applies a load; state_writer.c and state_reader.c implement the state
 * protocol's writer and reader (core/state_proto.h). ckpt knows objects only through their class
 * (core/object.h) and this folder protocol.
 */
#ifndef ACCEL_CKPT_STATE_H
#define ACCEL_CKPT_STATE_H

#include "accel/accel.h"
#include "ckpt/safetensors.h"
#include "ckpt/verify.h"
#include "core/internal.h"
#include "core/state_proto.h"

typedef struct json_t json_t;

/* ---- the folder protocol per kind of object ---- */

typedef struct accel__state_kind {
    const char *count_key; /* its count in the marker's "accel_state" record */
    int boolean;           /* at most one object: the count is written as a boolean */
    const char *noun;      /* in messages: "model 1", "3 models" */
    const char *nouns;
    /* The marker's boolean recording that this kind's per-process tensor files exist. */
    const char *rank_flag;
} accel__state_kind;

extern const accel__state_kind accel__state_kinds[ACCEL__OBJ_KIND_COUNT];

/* The objects whose state a checkpoint holds (prepared, with a state_save), per kind in
 * creation order (index i = file suffix _<i>). Arrays owned: accel__state_objs_release. */
typedef struct accel__state_objs {
    accel__object **of[ACCEL__OBJ_KIND_COUNT];
    int n[ACCEL__OBJ_KIND_COUNT];
} accel__state_objs;

accel_status accel__state_collect(accel *acc, accel__state_objs *o);
void accel__state_objs_release(accel__state_objs *o);

/* What the marker of a save_state checkpoint records (its "accel_state" object). */
typedef struct accel__state_info {
    int num_processes;
    int n[ACCEL__OBJ_KIND_COUNT];
    int rank_tensors[ACCEL__OBJ_KIND_COUNT]; /* per-process tensor files written */
} accel__state_info;

/* The marker's "accel_state" object as JSON text (owned: free()). NULL when out of memory. */
char *accel__state_info_json(const accel__state_info *info, int64_t iteration);
/* Reads the marker of `dir` (already checked complete). ACCEL_ECORRUPT when it is not a
 * save_state checkpoint or a field is out of range. */
accel_status accel__state_info_read(const char *dir, accel__state_info *info);

/*
 * Save. Every process runs every object's state_save for the shared part (accel__state_put_*
 * keep views, nothing is copied); an object whose tensors some process put as true pieces is
 * *sharded*: every process writes its pieces to "<stem>.shard-<r>-of-<N>.safetensors" and the
 * writing process "<stem>.index.json" (docs/checkpoint.md, "Sharded checkpoints"); the others'
 * shared parts are written by the writing process as "<stem><ext>", as before.
 */
typedef struct accel__state_saves {
    accel__state_writer *w; /* per object with a shared part: kinds, then creation order */
    accel__object **obj;
    int *index;   /* the object's index among its kind (file suffix) */
    int *sharded; /* decided by accel__state_shard_decide, the same on every process */
    int n;
} accel__state_saves;

/* Runs the shared state_save of every object with tensors, and on the writing process of
 * every object (local; views valid until the release). */
accel_status accel__state_save_shared(accel *acc, const accel__state_objs *o, int writer,
                                      accel__state_saves *s);
/* (Collective, after every process saved.) Marks the sharded objects and checks that every
 * process put the same tensors, every element exactly once in all (ACCEL_EINVAL naming the
 * tensor, the same on every process). */
accel_status accel__state_shard_decide(accel *acc, accel__state_saves *s);
/* Writes the shared files into the staging folder `dir`: this process's shards, and unless
 * `writer` is 0 the unsharded files and the shard indexes. */
accel_status accel__state_write_shared(accel *acc, const accel__state_saves *s, const char *dir,
                                       int writer);
void accel__state_saves_release(accel__state_saves *s);
/* This process's parts (every process), into the staging folder `dir`; info gets
 * rank_tensors. */
accel_status accel__state_write_rank(accel *acc, const accel__state_objs *o, const char *dir,
                                     accel__state_info *info);

/* The stem of object i's shared part: "<name>" or "<name>_<i>". */
void accel__state_stem(char *buf, size_t cap, const accel__object_class *c, int i);
/* Shard r of n_shards of a sharded object's shared part, and its index. */
void accel__state_shard_name(char *buf, size_t cap, const char *stem, int r, int n_shards);
void accel__state_index_name(char *buf, size_t cap, const char *stem);
/* Writes this process's pieces of writer w (rank `rank` of `n_shards`). */
accel_status accel__state_shard_write(const accel__state_writer *w, const char *dir,
                                      const char *stem, int rank, int n_shards);
/* Writes the index of sharded writer w (its tensors' names, dtypes, shapes in put order, the
 * shard files, the object's JSON values under meta_key). */
accel_status accel__state_shard_write_index(const accel__state_writer *w, const char *dir,
                                            const char *stem, const char *meta_key, int n_shards);

/* ---- load: plan, then apply ---- */

/* Verifies the folder (marker, sizes, and this process's share of the checksums) unless
 * `verified` is the marker the caller's accel__ckpt_verify of `dir` returned (taken, whatever
 * the result: its kept mappings are loaded from), then opens and validates everything this
 * process needs from `dir` (only files the marker lists) and has every object validate and
 * stage its part; nothing is modified. With `fused` (and verified NULL), the checksums of the
 * .safetensors files the load copies from are left to accel__state_plan_apply_fused
 * (verify.h: the fused load); every other checksum is checked here. */
typedef struct accel__state_plan accel__state_plan;
accel_status accel__state_plan_new(accel *acc, const accel__state_objs *o, const char *dir,
                                   accel__ckpt_marker *verified, int fused,
                                   accel__state_plan **out);
/* Which loads are fused: AUTO those with nothing to lose (docs/checkpoint.md); NEVER and ALWAYS
 * are for measuring both kinds in one process (bench/ckpt) and for tests. */
typedef enum accel__fused_mode {
    ACCEL__FUSED_AUTO = 0,
    ACCEL__FUSED_NEVER,
    ACCEL__FUSED_ALWAYS
} accel__fused_mode;
void accel__ckpt_set_fused_mode(accel *acc, accel__fused_mode mode);

/* The fused load's first step (a no-op for a plan made without `fused`): the copies out of the
 * deferred files, each file checked in the same pass. ACCEL_ECORRUPT naming the damaged file:
 * the live tensors are then partly written. */
accel_status accel__state_plan_apply_fused(accel__state_plan *p, const char *dir);
/* Where this process resumes, for the check that all processes agree: the accumulation step
 * and sync_gradients, then per resume position (accel__state_resume_at) its epoch, batch and
 * length: 2 + 3 * accel__state_plan_n_positions values, owned by the plan. */
size_t accel__state_plan_n_positions(const accel__state_plan *p);
const int64_t *accel__state_plan_positions(const accel__state_plan *p);
/* Who reported resume position i, for messages: its kind's noun ("loader"), its index, and
 * the stem of its per-process file ("dl_state_dict_rank"). */
void accel__state_plan_position_owner(const accel__state_plan *p, size_t i, const char **noun,
                                      int *index, const char **file);
/* Runs the registered objects' load callbacks, then applies the rest (cannot fail); after
 * accel__state_plan_apply_fused, the copies it made are not made again. */
accel_status accel__state_plan_apply(accel *acc, accel__state_plan *p);
void accel__state_plan_free(accel__state_plan *p);

/* ---- the module's state and registrations (state_registry.c) ---- */

/* One per accelerator, made on first use; the registered objects and hooks are private to
 * state_registry.c. */
typedef struct accel__ckpt_module {
    struct accel__ckpt_custom **custom;
    int n_custom, cap_custom;
    struct accel__ckpt_hook *hooks;
    int n_hooks, cap_hooks, next_handle;
    char *last_dir;
    int iteration;       /* Accelerate's project_configuration.iteration, from the options */
    int warned_auto_dir; /* the ignored `dir` of automatic naming was logged */
    int loaded;          /* a load_state succeeded on this accelerator */
    accel__fused_mode fused_mode;
} accel__ckpt_module;
/* The accelerator's module state, made (iteration from the options) on first use; NULL, with
 * acc's error set, when out of memory. */
accel__ckpt_module *accel__ckpt_module_of(accel *acc);
/* Runs the save (is_load 0) or load pre-hooks in registration order; the first failure stops
 * them and is returned, naming the hook's handle. */
accel_status accel__ckpt_run_hooks(accel *acc, int is_load, const char *dir);
/* Records dir as accel_checkpoint_dir's answer (kept as it was when out of memory). */
void accel__ckpt_set_last_dir(accel *acc, const char *dir);

/* ---- the protocol's writer and reader (state_writer.c, state_reader.c), as ckpt drives them */

#define ACCEL__STATE_DEPTH 8     /* nested JSON containers */
#define ACCEL__STATE_NAME_MAX 96 /* file names */

struct accel__state_writer {
    char file[ACCEL__STATE_NAME_MAX]; /* the file it fills, for messages */
    accel__state_store store;
    accel__state_part part;
    char prefix[24];        /* prepended to tensor names ("<i>/") */
    accel_named_tensor *ts; /* each with its WHOLE shape; data: the piece's first element */
    char **names;           /* owned names of ts */
    int64_t *offs, *counts; /* per tensor: the piece put, elements [offs, offs + counts) */
    size_t n_ts, cap_ts;
    size_t n_true_pieces;             /* tensors put as a true piece (not the whole tensor) */
    json_t *open[ACCEL__STATE_DEPTH]; /* [0]: the root object; then the open containers */
    int depth;                        /* open containers, root included */
    int floor;                        /* the object's own containers start above this depth */
    char *bytes;
    size_t n_bytes, cap_bytes;
};

void accel__state_writer_init(accel__state_writer *w, const char *file, accel__state_store store,
                              accel__state_part part);
void accel__state_writer_release(accel__state_writer *w);
/* Runs obj's state_save on w, inside the current container; checks that it closed what it
 * opened. */
accel_status accel__state_writer_save(accel__state_writer *w, accel__object *obj);
/* Writes w's file into dir: a .safetensors (metadata "format" and, when JSON values were
 * put, meta_key), a .json or a .bin, by w->store. */
accel_status accel__state_writer_write(const accel__state_writer *w, const char *dir,
                                       const char *format, const char *meta_key);

/* The shard files of a sharded object (state_shard.c). */
typedef struct accel__state_sharded accel__state_sharded;

/* An opened file of a checkpoint being loaded (owned by the plan): for a sharded object, its
 * index (name, root) and its shard files (sh). */
typedef struct accel__state_file {
    char name[ACCEL__STATE_NAME_MAX];
    accel__state_store store;
    accel_safetensors *st;
    accel__state_sharded *sh;
    unsigned char *read; /* per tensor of st: an object read it */
    json_t *root;        /* a .json's object, a .safetensors' metadata JSON (NULL: none) */
    char *bytes;         /* a .bin's bytes */
    size_t n_bytes;
} accel__state_file;

struct accel__state_reader {
    accel__state_plan *plan;
    accel__object *obj;
    const char *dir;
    accel__state_file *f;
    const char *noun; /* "model" */
    int index;
    accel__state_part part;
    int saved_processes;
    char prefix[24];                /* of tensor names ("<i>/") */
    json_t *at[ACCEL__STATE_DEPTH]; /* [0]: the object's own JSON object; then entered ones */
    int depth;
    char path[160]; /* the entered keys, for messages ("param_groups[1].") */
    size_t path_len[ACCEL__STATE_DEPTH];
};

/* Opens dir/name (which the marker lists) as a file of `store`; meta_key: the metadata key
 * of a .safetensors' JSON values. A .safetensors whose verified mapping the marker kept is
 * opened from it (the marker hands it over). */
accel_status accel__state_file_open(accel__state_file *f, const char *dir, const char *name,
                                    accel__state_store store, const char *meta_key,
                                    const accel__ckpt_marker *marker);
void accel__state_file_close(accel__state_file *f);
/* ACCEL_EINVAL naming the first tensor of f no object read. */
accel_status accel__state_file_all_read(const accel__state_file *f, const char *dir);
/* Opens sharded object `stem`: its index (listed in `marker`: the caller checked) and every
 * shard file it names (each must be listed too), validating that the pieces tile every tensor
 * (ACCEL_ECORRUPT naming the file and tensor). meta_key: the object's JSON values in the index. */
accel_status accel__state_shard_open(accel__state_file *f, const char *dir, const char *stem,
                                     const char *meta_key, const accel__ckpt_marker *marker);
void accel__state_shard_close(accel__state_sharded *sh);
/* Reader side: a piece of tensor `full` from the shards; every tensor read. */
accel_status accel__state_shard_get(accel__state_reader *r, const char *full, accel_tensor piece,
                                    const accel__state_piece *whole);
accel_status accel__state_shard_all_read(const accel__state_file *f, const char *dir);
/* Offline use (merge.c): the tensors in the order the object put them (desc: name, dtype and
 * shape, data NULL; borrowed until close), and each one's pieces in element order, mapped. */
size_t accel__state_shard_n_tensors(const accel__state_sharded *sh);
accel_named_tensor accel__state_shard_desc(const accel__state_sharded *sh, size_t i);
accel_status accel__state_shard_pieces(const accel__state_sharded *sh, size_t i,
                                       accel_status (*fn)(void *ctx, int64_t offset,
                                                          const void *data, int64_t count),
                                       void *ctx);

/* Runs obj's state_load with r (set up by the caller). */
accel_status accel__state_reader_load(accel__state_reader *r, accel__object *obj);

/* Checks a piece of a saved tensor (dtype, shape, device, range) against the destination,
 * with the reader's messages. */
accel_status accel__state_check_piece(accel__state_reader *r, const char *full, accel_dtype dtype,
                                      int ndim, const int64_t *shape, accel_tensor piece,
                                      const accel__state_piece *whole);

/* The plan's side of the reader (state_load.c). */
/* nbytes from src (a mapped file) to dst, memory of device `where` (staged: devio.h). */
accel_status accel__state_plan_copy(accel__state_plan *p, void *dst, accel_device where,
                                    const void *src, size_t nbytes);
void *accel__state_plan_stage(accel__state_plan *p, accel__object *obj, size_t nbytes,
                              void (*apply)(accel__object *obj, void *data));
accel_status accel__state_plan_position(accel__state_plan *p, const accel__state_reader *r,
                                        const int64_t v[3]);

/* Stages a step that may still fail (a registered object's load callback): applying runs
 * these first, in order, before anything else changes. */
accel_status accel__state_plan_stage_first(accel__state_plan *p, accel__object *obj,
                                           accel_status (*apply)(accel__object *obj,
                                                                 const void *data, size_t n),
                                           const void *data, size_t n);

/* ---- JSON helpers shared by the files above ---- */

/* "stem<ext>" for i == 0 (unless numbered_from_0), else "stem_<i><ext>". */
void accel__st_indexed_name(char *buf, size_t cap, const char *stem, int i, int numbered_from_0,
                            const char *ext);
/* The file extension of a container: ".safetensors", ".json", ".bin". */
const char *accel__st_ext(accel__state_store store);
/* dir/name as a JSON object (owned: json_decref); ACCEL_ECORRUPT naming a missing or
 * malformed file. */
accel_status accel__st_read_json(const char *dir, const char *name, json_t **out);
/* Writes `root` (consumed) as indented, key-sorted JSON to dir/name, fsynced. */
accel_status accel__st_write_json(const char *dir, const char *name, json_t *root);

/* accel_save_model of a sharded model: bytes of whole tensors gathered to the main process per
 * round (src/ckpt/model.c; 64 MiB; tests lower it). */
extern uint64_t accel__ckpt_gather_round_nbytes;

#endif /* ACCEL_CKPT_STATE_H */
