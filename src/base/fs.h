/*
 * Filesystem helpers shared by every module (src/base/fs.c). All report failures through
 * accel__seterr(NULL, ...) naming the path.
 *
 * Atomic files: written to a temporary sibling "<path>.tmp-XXXXXX", fsynced, renamed over
 * <path>, and the parent directory fsynced, so <path> is always either the old or the new
 * content.
 */
#ifndef ACCEL_BASE_FS_H
#define ACCEL_BASE_FS_H

#include <stddef.h>

#include "accel/status.h"

/* A file being written atomically. */
typedef struct accel__afile {
    int fd;         /* open on tmp_path, -1 when closed */
    char *path;     /* final path (owned) */
    char *tmp_path; /* temporary sibling (owned) */
} accel__afile;

/* 1 when the last component of `path` (trailing '/' ignored) is a name that can be created:
 * not "", "." or "..", and `path` is not "/". A file or folder written through a temporary
 * sibling needs one (the sibling of "" or "." would land in the working folder). */
int accel__path_names_entry(const char *path);

/* Creates the temporary sibling of `path` (its folder must exist). ACCEL_EINVAL when `path`
 * names no entry (accel__path_names_entry) or ends with '/'. On failure *f is unusable and
 * needs no abort. */
accel_status accel__afile_open(accel__afile *f, const char *path);
/* fsync, close, rename over the final path, fsync the parent. Releases f (also on failure,
 * when the temporary file is removed). */
accel_status accel__afile_commit(accel__afile *f);
/* Closes and removes the temporary file; releases f. Accepts a released f. */
void accel__afile_abort(accel__afile *f);

/* Writes all nbytes (retrying short writes and EINTR); `what` names the file in errors. */
accel_status accel__write_all(int fd, const void *buf, size_t nbytes, const char *what);

/* Whole-buffer atomic write of `path`. */
accel_status accel__write_file_atomic(const char *path, const void *buf, size_t nbytes);

/* Reads a whole (small) file into a NUL-terminated buffer; free with accel__free.
 * ACCEL_ENOTFOUND when absent, ACCEL_EIO otherwise. */
accel_status accel__read_file(const char *path, char **out, size_t *nbytes);

accel_status accel__fsync_dir(const char *dir);
/* fsyncs the folder that contains `path`. */
accel_status accel__fsync_parent(const char *path);
/* mkdir -p (mode 0777 & umask); also checks the result is a writable directory, so a bad
 * logging or checkpoint folder is reported where it is configured, not at the first write.
 * An empty path is ACCEL_EINVAL. */
accel_status accel__mkdirs(const char *dir);
/* Removes a file or a folder tree; a missing path is not an error. */
accel_status accel__rmtree(const char *path);
/* "a/b" in a new buffer (free with accel__free), or NULL (error set) when out of memory. */
char *accel__path_join(const char *a, const char *b);
/* 1 when `path` is a directory / a regular file. */
int accel__is_dir(const char *path);
int accel__is_file(const char *path);
/* What a stat mode is, for messages: "a directory", "a FIFO", "a socket", ... */
const char *accel__file_kind(unsigned mode);

/*
 * Lock files (src/base/lockfile.c): an exclusive flock on a file, held by one process while it
 * owns something on disk that another job must not touch at the same time (a checkpoint
 * folder being saved, a tracker's run files). The kernel drops the lock when the holder dies,
 * so a SIGKILLed holder never blocks the next one. The holder writes "pid <pid> on host
 * <host>, since <unix time>" into the file for the message of the process it refuses, and
 * removes the file when it lets go (unlinked while still locked; a taker checks after locking
 * that the file it locked is still the one under the name, so the removal is race-free).
 */
typedef struct accel__lockfile {
    char *path; /* owned, while held */
    int fd;     /* open while held */
    int held;
} accel__lockfile;

/* Takes the lock `path` (its folder must exist) without waiting. Returns ACCEL_OK with
 * l->held = 1; ACCEL_OK with l->held = 0 on a file system that has no locks (NFS without a lock
 * manager, Lustre without "flock"; a warning, once per process, says the protection is off);
 * ACCEL_ESTATE when another process holds it, with the message "<what> (<holder's note>; lock
 * <path>)<advice>", where <what> is what_fmt formatted (what is locked, and by whom: "checkpoint
 * folder x is being saved by another process") and advice (may be "" or NULL) says what to do;
 * ACCEL_EIO, ACCEL_ENOMEM, with their message. *l is zeroed first. */
accel_status accel__lockfile_take_named(accel__lockfile *l, const char *path, const char *advice,
                                        const char *what_fmt, ...) ACCEL_PRINTF(4, 5);
/* Removes the file and lets go; accepts a zeroed or released lock. */
void accel__lockfile_release(accel__lockfile *l);

/* Opens each of the standard streams (0, 1, 2) that is closed (a program started with `2>&-`,
 * a daemon's closed descriptors) on /dev/null. Otherwise the next socket, pipe or file accel
 * opens takes its number, and messages written to "stderr" go into a rendezvous connection or
 * a checkpoint. Idempotent; best effort. */
void accel__keep_std_streams(void);

/* Seconds since the epoch (for file names and timestamps; accel__now is monotonic). */
double accel__wall_time(void);

#endif /* ACCEL_BASE_FS_H */
