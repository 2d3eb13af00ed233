/*
 * Private interface of save_state / load_state (src/ckpt/state.c orchestrates: naming,
 * collectives, hooks, commit; src/ckpt/state_io.c serialises and validates each kind of state).
 */
#ifndef ACCEL_CKPT_STATE_H
#define ACCEL_CKPT_STATE_H

#include "accel/accel.h"
#include "accel/data.h"
#include "core/internal.h"

/* A registered object (accel_register_for_checkpointing). */
typedef struct accel__custom_obj {
    accel_state_save_fn save;
    accel_state_load_fn load;
    void *ctx;
} accel__custom_obj;

/* The prepared objects of acc, each kind in creation order (index i = file suffix _<i>). */
typedef struct accel__state_objs {
    accel_model **models;
    accel_optimizer **opts;
    accel_scheduler **scheds;
    accel_loader **loaders;
    int n_models, n_opts, n_scheds, n_loaders;
    const accel__custom_obj *custom;
    int n_custom;
} accel__state_objs;

/* What the marker of a save_state checkpoint records (its "accel_state" object). */
typedef struct accel__state_info {
    int num_processes;
    int n_models, n_opts, n_scheds, n_loaders, n_custom;
    int has_scaler; /* scaler.json present */
    int has_grads;  /* gradients_rank<r>.safetensors present (saved inside an open window) */
} accel__state_info;

/* Fills o with the prepared objects (arrays owned by o: accel__state_objs_release). */
accel_status accel__state_collect(accel *acc, accel__state_objs *o);
void accel__state_objs_release(accel__state_objs *o);

/* The info this process would record for a save of `o` now. */
void accel__state_info_now(accel *acc, const accel__state_objs *o, accel__state_info *info);
/* The marker's "accel_state" object as JSON text (owned: free()). NULL when out of memory. */
char *accel__state_info_json(const accel__state_info *info, int64_t iteration);
/* Reads the marker of `dir` (already checked complete). ACCEL_ECORRUPT when it is not a
 * save_state checkpoint. */
accel_status accel__state_info_read(const char *dir, accel__state_info *info);

/* Save: the files the writing process writes (models, optimizers, schedulers, scaler,
 * registered objects), and the files every process writes (random_states_<r>, loaders,
 * gradients). Both into the staging folder `dir`. */
accel_status accel__state_write_shared(accel *acc, const accel__state_objs *o,
                                       const accel__state_info *info, const char *dir);
accel_status accel__state_write_rank(accel *acc, const accel__state_objs *o,
                                     const accel__state_info *info, const char *dir);

/* Load: verifies the folder (marker, sizes, and unless `verified` this process's share of the
 * checksums), then opens and validates everything this process needs from `dir`, reading only
 * files the marker lists; nothing is modified. */
typedef struct accel__state_plan accel__state_plan;
accel_status accel__state_plan_new(accel *acc, const accel__state_objs *o, const char *dir,
                                   int verified, accel__state_plan **out);
/* Where this process resumes, for the check that all processes agree: the accumulation step,
 * sync_gradients, then per loader epoch, batch and the live loader's length (sampler seeds and
 * generators may differ between processes). Writes ACCEL__STATE_POSITIONS(n_loaders) values
 * into v; returns the count. */
#define ACCEL__STATE_POSITIONS(n_loaders) (2 + 3 * (n_loaders))
int accel__state_plan_positions(const accel__state_plan *p, int64_t *v);
/* Runs the registered objects' load callbacks, then applies the rest (cannot fail). */
accel_status accel__state_plan_apply(accel *acc, accel__state_plan *p);
void accel__state_plan_free(accel__state_plan *p);

/* ---- helpers shared by state_io.c and state_load.c ---- */
typedef struct json_t json_t;
/* "stem<ext>" for i == 0, else "stem_<i><ext>" (Accelerate's numbering). */
void accel__st_indexed_name(char *buf, size_t cap, const char *stem, int i, const char *ext);
/* The optimizer kind (accel__optim_kind) as saved: "sgd", "adam", "adamw". */
const char *accel__st_optim_kind_name(int kind);
/* "0x" + 16 hex digits. */
int accel__st_parse_u64(const json_t *j, uint64_t *out);
/* An array of ACCEL_RNG_STATE_WORDS hex strings, not all zero. */
int accel__st_parse_gen(const json_t *a, uint64_t s[ACCEL_RNG_STATE_WORDS]);
/* dir/name as a JSON object (owned: json_decref); ACCEL_ECORRUPT naming a missing or
 * malformed file. */
accel_status accel__st_read_json(const char *dir, const char *name, json_t **out);
/* The state buffers of opt with their torch name prefixes ("exp_avg."); NULL buffers are
 * absent. Returns how many slots are used (1 for SGD, 3 for Adam). */
int accel__st_optim_buffers(const accel_optimizer *opt, const char *names[3], float *bufs[3]);
/* Fields of an object; *bad = 1 when missing or of another type. */
long long accel__st_jint(const json_t *o, const char *key, int *bad);
double accel__st_jreal(const json_t *o, const char *key, int *bad);

#endif /* ACCEL_CKPT_STATE_H */
