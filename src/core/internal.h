/*
 * Private core interface shared by every module of libaccel: allocation, error reporting,
 * logging, the environment-variable table, and the accel handle itself.
 *
 * Invariant: a function that fails sets the message with accel__seterr (on the handle when it
 * has one, always on the thread) and returns the same status, so callers only propagate.
 */
#ifndef ACCEL_CORE_INTERNAL_H
#define ACCEL_CORE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "accel/accel.h"

#define ACCEL__ERRMSG_NBYTES 1024

/* ---- Memory: every allocation goes through these (replaceable for tests) ---- */
void *accel__malloc(size_t nbytes);
void *accel__calloc(size_t n, size_t nbytes);
void *accel__realloc(void *p, size_t nbytes);
void accel__free(void *p);
char *accel__strdup(const char *s);
/* 64-byte aligned allocation for vectorised buffers; free with accel__aligned_free. */
void *accel__aligned_alloc(size_t nbytes);
void accel__aligned_free(void *p);

/* ---- Errors ---- */

/* Records status and message on acc (when not NULL) and on the calling thread; returns st so
 * that `return accel__seterr(acc, ACCEL_EINVAL, "...")` reads naturally. */
accel_status accel__seterr(accel *acc, accel_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
accel_status accel__vseterr(accel *acc, accel_status st, const char *fmt, va_list ap);
/* Copies the thread's last error onto acc (after a call into a handle-less layer). */
accel_status accel__adopt_thread_error(accel *acc, accel_status st);

/* Propagate a failure (NCCLCHECK style). The callee has already set the message. */
#define ACCEL_TRY(call)                                                                            \
    do {                                                                                           \
        accel_status accel__st_ = (call);                                                          \
        if (accel__st_ != ACCEL_OK) {                                                              \
            return accel__st_;                                                                     \
        }                                                                                          \
    } while (0)

#define ACCEL_TRY_GOTO(call, st_var, label)                                                        \
    do {                                                                                           \
        (st_var) = (call);                                                                         \
        if ((st_var) != ACCEL_OK) {                                                                \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Internal invariants only, never runtime conditions (ggml's GGML_ASSERT). */
typedef void (*accel__abort_hook)(const char *file, int line, const char *expr);
void accel__set_abort_hook(accel__abort_hook hook);
void accel__assert_fail(const char *file, int line, const char *expr);
#define ACCEL_ASSERT(x)                                                                            \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            accel__assert_fail(__FILE__, __LINE__, #x);                                            \
        }                                                                                          \
    } while (0)

/* ---- Logging: stderr only, "[rank r/N] LEVEL: ..." ---- */
typedef enum accel__log_level {
    ACCEL__LOG_DEBUG = 0,
    ACCEL__LOG_INFO = 1,
    ACCEL__LOG_WARN = 2,
    ACCEL__LOG_ERROR = 3,
    ACCEL__LOG_OFF = 4
} accel__log_level;

void accel__log(accel__log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int accel__log_enabled(accel__log_level level);
/* Set by accel_init so lines carry the rank; -1 before. */
void accel__log_set_rank(int rank, int n_ranks);
void accel__log_set_level(accel__log_level level);
/* Parses "debug|info|warn|warning|error|off" (any case) or 0-4. Returns -1 if not valid. */
int accel__log_parse_level(const char *s);

/* ---- Environment variables: one table (src/core/env.c), read once ---- */
typedef enum accel__env_type {
    ACCEL__ENV_INT,
    ACCEL__ENV_REAL,
    ACCEL__ENV_BOOL,
    ACCEL__ENV_STRING
} accel__env_type;

typedef struct accel__env_var {
    const char *name;
    accel__env_type type;
    const char *dflt; /* NULL: no default */
    const char *doc;
} accel__env_var;

/* The table, terminated by a {NULL} entry; `accel env` prints it. */
const accel__env_var *accel__env_table(void);

/* Typed getters. Each returns ACCEL_OK with *out set, ACCEL_ENOTFOUND when the variable is
 * unset or empty (*out untouched), or ACCEL_EINVAL naming the variable and its value when it
 * does not parse. `name` must be in the table (asserted) so that `accel env` lists it. */
accel_status accel__env_int(const char *name, long long *out);
accel_status accel__env_real(const char *name, double *out);
accel_status accel__env_bool(const char *name, int *out);
/* Borrowed from the environment. */
accel_status accel__env_string(const char *name, const char **out);

/* Parses a boolean the way Accelerate's str_to_bool does ("1/true/yes/y/on" and
 * "0/false/no/n/off", any case). Returns 1, 0 or -1 for invalid. */
int accel__parse_bool(const char *s);

/* ---- The accelerator handle ---- */

/* Module state slots: each module (train, data, ...) keeps its per-accelerator state in its own
 * slot so core needs no knowledge of it. accel_free releases slots in reverse order. */
typedef enum accel__module_id {
    ACCEL__MOD_COLL = 0, /* user-level collectives (triggers) */
    ACCEL__MOD_TRAIN,
    ACCEL__MOD_DATA,
    ACCEL__MOD_PRECISION,
    ACCEL__MOD_CKPT,
    ACCEL__MOD_TRACK,
    ACCEL__MOD_NN,
    ACCEL__MOD_PROFILE, /* profiler timeline (src/core/profile.c) */
    ACCEL__MOD_LOGGER,  /* named user loggers (src/core/logger.c) */
    ACCEL__MOD_COUNT
} accel__module_id;

typedef struct accel__module_slot {
    void *state;
    void (*free_fn)(accel *acc, void *state);
} accel__module_slot;

struct accel__comm;

/*
 * Every object accel_prepare accepts (model, optimizer, scheduler, loader) starts with this
 * header, so accel_prepare can take them in any order and tell them apart. Objects are
 * registered with their accelerator when created; accel_free_memory and accel_free release
 * the ones still registered (newest first), and an object's own _free unregisters it.
 */
#define ACCEL__OBJECT_MAGIC 0x61636365u /* "acce" */
typedef enum accel__object_kind {
    ACCEL__OBJ_MODEL = 0, /* prepared first: weights are broadcast before anything uses them */
    ACCEL__OBJ_OPTIMIZER,
    ACCEL__OBJ_SCHEDULER,
    ACCEL__OBJ_LOADER,
    ACCEL__OBJ_KIND_COUNT
} accel__object_kind;

typedef struct accel__object {
    uint32_t magic;
    accel__object_kind kind;
    accel *acc;
    int prepared;
    /* Called once by accel_prepare (may be NULL). */
    accel_status (*prepare)(struct accel__object *self);
    /* Releases the object (used by accel_free_memory / accel_free); must unregister. */
    void (*destroy)(struct accel__object *self);
    struct accel__object *next, *prev; /* the accelerator's list of live objects */
} accel__object;

/* Links a new object into acc's list (fills magic, kind, acc). */
void accel__object_register(accel *acc, accel__object *obj, accel__object_kind kind,
                            accel_status (*prepare)(accel__object *),
                            void (*destroy)(accel__object *));
/* Unlinks it (call from the object's _free). Accepts an unregistered object. */
void accel__object_unregister(accel__object *obj);

/*
 * Accelerate's GradientState, shared by the data module (which writes the loader fields) and
 * the training module (which owns sync_gradients and the micro-step counter).
 */
typedef struct accel__gradient_state {
    int sync_gradients;    /* 1 on micro-steps that synchronise and step (init 1) */
    long long step;        /* micro-step counter of accel_accumulate (persisted) */
    int active_loaders;    /* loaders currently being iterated (nesting depth) */
    int end_of_dataloader; /* the active loader has yielded its last batch */
    int remainder;         /* the active loader's duplicated tail samples, -1 if none */
} accel__gradient_state;

/* accel's own random generator (xoshiro256**): src/core/rng.c, used through src/core/rng.h. */
typedef struct accel__gen {
    uint64_t s[4];
} accel__gen;

struct accel {
    accel_options opt; /* fully resolved: no field unset */
    int rank, n_ranks;
    int local_rank, local_n_ranks;
    accel_distributed_type dist_type;
    accel_device device;
    char device_name[32];
    char backend[16];
    struct accel__comm *comm;

    accel__module_slot modules[ACCEL__MOD_COUNT];
    accel__object *objects; /* live objects, newest first */
    accel__gradient_state gstate;
    accel__gen rng;  /* the accelerator's generator (src/core/rng.c) */
    int rng_seeded;  /* 0 until accel_set_seed or first use */

    accel_status last_status;
    char errmsg[ACCEL__ERRMSG_NBYTES];
    char *summary; /* accel_state_summary buffer */
};

/* Module slot access: returns the state (NULL if none). */
static inline void *accel__module(const accel *acc, accel__module_id id)
{
    return acc->modules[id].state;
}
void accel__module_set(accel *acc, accel__module_id id, void *state,
                       void (*free_fn)(accel *acc, void *state));

/* Monotonic seconds. */
double accel__now(void);

/* Fills buf with n bytes from the kernel's random source (getrandom), for values that must not
 * be guessable (job nonces, shared-memory names). 0, or -1 if it failed. */
int accel__os_random(void *buf, size_t n);

#endif /* ACCEL_CORE_INTERNAL_H */
