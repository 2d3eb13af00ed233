/*
 * The objects of an accelerator: everything accel_prepare accepts (models, optimizers,
 * schedulers, loaders) and the other holders of training state (the fp16 loss scaler, objects
 * registered with accel_register_for_checkpointing). Each starts with accel__object, is listed
 * on its accelerator from creation to release, and has a class: how it is prepared and
 * released, and how its state is saved and loaded through the state protocol
 * (core/state_proto.h), so that src/ckpt knows no object's internals.
 */
#ifndef ACCEL_CORE_OBJECT_H
#define ACCEL_CORE_OBJECT_H

#include <stdint.h>

#include "accel/status.h"

typedef struct accel accel;
typedef struct accel__object accel__object;
typedef struct accel__state_writer accel__state_writer;
typedef struct accel__state_reader accel__state_reader;

#define ACCEL__OBJECT_MAGIC 0x61636365u /* "acce" */

/* Kinds, in the order accel_prepare prepares them and a checkpoint saves and applies them. */
typedef enum accel__object_kind {
    ACCEL__OBJ_MODEL = 0, /* prepared first: weights are broadcast before anything uses them */
    ACCEL__OBJ_OPTIMIZER,
    ACCEL__OBJ_SCHEDULER, /* applied after the optimizer: it writes the groups' lr */
    ACCEL__OBJ_LOADER,
    ACCEL__OBJ_N_PREPARABLE, /* the kinds above are what accel_prepare accepts */
    ACCEL__OBJ_SCALER = ACCEL__OBJ_N_PREPARABLE, /* the fp16 loss scaler (src/train) */
    ACCEL__OBJ_CUSTOM,                           /* registered for checkpointing (src/ckpt) */
    ACCEL__OBJ_KIND_COUNT
} accel__object_kind;

/* The container of one part of an object's state in a checkpoint folder. */
typedef enum accel__state_store {
    ACCEL__STORE_NONE = 0, /* the object has no such part */
    ACCEL__STORE_TENSORS,  /* ".safetensors": tensors (JSON values: metadata "accel_<name>") */
    ACCEL__STORE_JSON,     /* ".json": JSON values only */
    ACCEL__STORE_BYTES     /* ".bin": raw bytes only */
} accel__state_store;

/*
 * What every object of a kind does. An object's state has up to two parts, each saved and
 * loaded by the same two functions (accel__state_writer_part / accel__state_reader_part say
 * which part a call is for):
 *  - the shared part, identical on every process, written once (by the main process) into a
 *    file of its own: "<name><ext>" for the first object of the kind, "<name>_<i><ext>" for
 *    the i-th (Accelerate's numbering; with numbered_from_0 the first is "<name>_0<ext>");
 *  - the per-process part, written by every process into one file per process shared by all
 *    objects of the kind, "<rank_name><process><ext>": with ACCEL__STORE_TENSORS object i's
 *    tensor names are prefixed "<i>/" (and the file exists only when some object put a
 *    tensor); with ACCEL__STORE_JSON object i's values are element i of the array `rank_key`.
 */
typedef struct accel__object_class {
    /* Called once by accel_prepare (NULL: nothing to do). */
    accel_status (*prepare)(accel__object *self);
    /* Releases the object (accel_free_memory, accel_free); must unregister it. NULL: the
     * object belongs to a module, which unregisters and frees it with its module state (it
     * survives accel_free_memory). */
    void (*destroy)(accel__object *self);
    /* The state protocol (NULL: the object holds no state). save puts the part the writer is
     * for; load reads and validates the part the reader is for and modifies nothing live: it
     * stages what to change (accel__state_get_tensor, accel__state_stage). */
    accel_status (*state_save)(accel__object *self, accel__state_writer *w);
    accel_status (*state_load)(accel__object *self, accel__state_reader *r);
    /* The shared part: file stem, container, and the "format" metadata of a .safetensors. */
    const char *name;
    accel__state_store store;
    const char *format;
    int numbered_from_0;
    /* The per-process part (rank_store ACCEL__STORE_NONE: none). */
    const char *rank_name;
    accel__state_store rank_store;
    const char *rank_key;
} accel__object_class;

struct accel__object {
    uint32_t magic;
    accel__object_kind kind;
    accel *acc;
    int prepared; /* by accel_prepare; scaler and registered objects are born prepared */
    const accel__object_class *cls;
    accel__object *next, *prev; /* the accelerator's list of live objects, newest first */
};

/* Links a new object into acc's list (fills magic, kind, acc, cls; prepared = 0). */
void accel__object_register(accel *acc, accel__object *obj, accel__object_kind kind,
                            const accel__object_class *cls);
/* Unlinks it (call from the object's release). Accepts an unregistered object. */
void accel__object_unregister(accel__object *obj);

#endif /* ACCEL_CORE_OBJECT_H */
