/*
 * Lock files between jobs (fs.h, "Lock files"): flock, the holder's note, and removal by the
 * holder. Invariant: at most one process holds a lock path at a time, even though the file is
 * removed and created again; a taker keeps its lock only when the file it locked is still the
 * one under the name after locking.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/fs.h"

/* The note of the process holding the lock file fd, or a placeholder when it has not written
 * it yet. */
static void read_holder(int fd, char *buf, size_t cap)
{
    ssize_t n = cap > 1 ? pread(fd, buf, cap - 1, 0) : 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\0')) {
        n--;
    }
    if (n <= 0) {
        snprintf(buf, cap, "holder not recorded yet");
        return;
    }
    buf[n] = '\0';
}

/* Takes the lock; ACCEL_ESTATE (no message set) with the holder's note in holder[cap] when
 * another process has it. */
static accel_status take(accel__lockfile *l, const char *path, char *holder, size_t cap)
{
    memset(l, 0, sizeof(*l));
    l->fd = -1;
    /* The holder removes the file before it lets go, so a file opened just before that is no
     * longer the lock. The loop always makes progress; the bound only guards against a
     * pathological file system. */
    for (int attempt = 0; attempt < 1000; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
            return accel__seterr(NULL, ACCEL_EIO, "cannot open the lock file %s: %s", path,
                                 strerror(errno));
        }
        int r;
        while ((r = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
        }
        if (r != 0 && errno == EWOULDBLOCK) {
            read_holder(fd, holder, cap);
            close(fd);
            return ACCEL_ESTATE;
        }
        if (r != 0) {
            int err = errno;
            close(fd);
            unlink(path);
            static atomic_int warned;
            if (atomic_exchange(&warned, 1) == 0) {
                accel__log(NULL, ACCEL__LOG_WARN,
                           "the file system of %s has no file locks (%s): nothing stops another "
                           "job from using the same files at the same time",
                           path, strerror(err));
            }
            return ACCEL_OK;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            l->path = accel__strdup(path);
            if (l->path == NULL) {
                close(fd);
                return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
            }
            /* The note only feeds another process's message: failing to write it changes
             * nothing about the lock. */
            char note[160], host[64] = "?";
            if (gethostname(host, sizeof host - 1) != 0) {
                snprintf(host, sizeof host, "?");
            }
            host[sizeof host - 1] = '\0';
            int len = snprintf(note, sizeof note, "pid %d on host %s, since %lld\n", (int)getpid(),
                               host, (long long)time(NULL));
            if (ftruncate(fd, 0) != 0 || pwrite(fd, note, (size_t)len, 0) != len) {
                accel__log(NULL, ACCEL__LOG_DEBUG, "cannot record the holder in %s: %s", path,
                           strerror(errno));
            }
            l->fd = fd;
            l->held = 1;
            return ACCEL_OK;
        }
        close(fd); /* a released lock's file, already removed: take the new one */
    }
    return accel__seterr(NULL, ACCEL_EIO, "cannot take the lock %s: it keeps being replaced", path);
}

accel_status accel__lockfile_take_named(accel__lockfile *l, const char *path, const char *advice,
                                        const char *what_fmt, ...)
{
    char holder[256];
    accel_status st = take(l, path, holder, sizeof holder);
    if (st == ACCEL_ESTATE) {
        /* Every refusal reads the same way: what is locked, who holds it, which file, and
         * what to do; the caller only says what and what to do. */
        char what[ACCEL__ERRMSG_NBYTES];
        va_list ap;
        va_start(ap, what_fmt);
        vsnprintf(what, sizeof what, what_fmt, ap);
        va_end(ap);
        return accel__seterr(NULL, st, "%s (%s; lock %s)%s", what, holder, path,
                             advice != NULL ? advice : "");
    }
    return st;
}

void accel__lockfile_release(accel__lockfile *l)
{
    if (l->held) {
        /* Removed while still held: see take. Only when the name is still this file: a
         * folder deleted and made again holds another process's lock now. */
        struct stat a, b;
        if (fstat(l->fd, &a) == 0 && stat(l->path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            unlink(l->path);
        }
        close(l->fd);
    }
    accel__free(l->path);
    l->path = NULL;
    l->fd = -1;
    l->held = 0;
}
