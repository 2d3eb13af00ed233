/*
 * Crash-safe checkpoint folders (private to src/ckpt); the atomic file writes they build on
 * are in base/fs.h.
 *
 * Checkpoint folders: built in a staging sibling "<parent>/.<name>.partial", every file fsynced
 * by its writer; commit writes the completion marker ACCEL__CKPT_MARKER (the list of files with
 * their sizes and checksums, verify.h) last, fsyncs the staging folder, renames it over
 * <parent>/<name> (an atomic exchange when a folder of that name exists) and fsyncs the parent.
 * A folder is "complete" when its marker is valid and every file it lists has the recorded
 * size (accel__ckpt_check_complete); loading also verifies the checksums.
 *
 * All functions report failures through accel__seterr(NULL, ...) naming the path.
 */
#ifndef ACCEL_CKPT_ATOMIC_H
#define ACCEL_CKPT_ATOMIC_H

#include <stddef.h>
#include <stdint.h>

#include "accel/status.h"
#include "base/fs.h"
#include "ckpt/verify.h"

/* ---- checkpoint folders ---- */

typedef struct accel__stage {
    char *final_dir;      /* owned */
    char *stage_dir;      /* owned: "<parent>/.<name>.partial" */
    char *lock_path;      /* owned: "<parent>/.<name>.lock" */
    accel__lockfile lock; /* the folder's save lock, while held (accel__stage_lock) */
} accel__stage;

/* Computes the paths for building `final_dir`; touches nothing on disk. Every process of a
 * save computes the same paths. Release with accel__stage_release. */
accel_status accel__stage_init(accel__stage *s, const char *final_dir);
/*
 * (The writing process, before it looks at the target or creates the staging folder.) Takes
 * the folder's save lock: the lock file "<parent>/.<name>.lock" (base/fs.h), creating the
 * parent folders, so that two jobs saving the same folder at once cannot remove or mix each
 * other's staging folders or replace each other's checkpoint. Returns ACCEL_OK (also, after a
 * warning, on a file system that has no locks), ACCEL_ESTATE when another process holds the lock
 * (the message names the folder and the holder), ACCEL_EIO, ACCEL_ENOMEM. Released (and the
 * lock file removed) by accel__stage_unlock or accel__stage_release.
 */
accel_status accel__stage_lock(accel__stage *s);
void accel__stage_unlock(accel__stage *s);
/* (The writing process, holding the save lock: accel__stage_lock, which also made the parent
 * folders.) Creates an empty staging folder, removing (with a warning naming it) a stale one
 * left by a crashed save. */
accel_status accel__stage_create(const accel__stage *s);
/* (One process, after every writer has finished.) Writes the marker listing the staging
 * folder's files, fsyncs, renames into place replacing an older folder of the same name, and
 * fsyncs the parent. `extra` (may be NULL): a JSON object text merged into the marker. */
accel_status accel__stage_commit(const accel__stage *s, const char *extra);
/* Removes the staging folder (after a failed save). */
void accel__stage_discard(const accel__stage *s);
/* Unlocks (accel__stage_unlock) and frees the paths; accepts a zeroed or released stage. */
void accel__stage_release(accel__stage *s);

/* Parses "checkpoint_<n>" (digits only). Returns 1 and *n, else 0. */
int accel__ckpt_parse_name(const char *name, int64_t *n);

/* The complete checkpoints "checkpoint_<n>" in `base`, ascending n, as a new array (free with
 * accel__free; NULL when none). A missing `base` gives 0 checkpoints. */
accel_status accel__ckpt_list(const char *base, int64_t **iters, size_t *count);
/* As accel__ckpt_list, but every "checkpoint_<n>" folder, complete or not (damaged ones too). */
accel_status accel__ckpt_list_all(const char *base, int64_t **iters, size_t *count);

/*
 * Keeps the newest `total_limit` complete checkpoints in `base` and deletes older ones (each
 * first renamed to a hidden ".<name>.deleting" so it stops counting as complete, then removed);
 * also removes leftovers of interrupted deletions. Call only after the new checkpoint is in
 * place: the newest complete checkpoint is never deleted. total_limit <= 0: keep all.
 */
accel_status accel__ckpt_rotate(const char *base, int total_limit);
/* As accel__ckpt_rotate, but checkpoint_<keep> (the one just saved; -1: none) is never deleted
 * and counts toward total_limit; the others are deleted oldest first. */
accel_status accel__ckpt_rotate_keep(const char *base, int total_limit, int64_t keep);

/* ---- writes done by the main process ---- */

/* The main process wrote `path` with outcome `st`; every process returns that outcome (the
 * others wait for it, a collective), and a non-main process gets ACCEL_EIO naming `what` and
 * `path` when the main process failed. Implemented in save.c. */
typedef struct accel accel;
accel_status accel__ckpt_share_main_status(accel *acc, accel_status st, const char *what,
                                           const char *path);

#endif /* ACCEL_CKPT_ATOMIC_H */
