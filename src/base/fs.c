/*
 * Filesystem helpers every module shares (checkpoints, trackers): paths, mkdir -p, removal,
 * whole-buffer reads, and atomic file writes. Invariant of the atomic writer: a reader of
 * <path> sees either the old content or the new one, never a mix, even after a crash: data
 * goes to a temporary sibling, is fsynced, renamed over <path>, and the parent is fsynced.
 */
#include "base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"

char *accel__path_join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = accel__malloc(na + nb + 2);
    if (p == NULL) {
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory joining path %s/%s", a, b);
        return NULL;
    }
    memcpy(p, a, na);
    size_t k = na;
    if (na > 0 && a[na - 1] != '/') {
        p[k++] = '/';
    }
    memcpy(p + k, b, nb + 1);
    return p;
}

int accel__is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int accel__is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

const char *accel__file_kind(unsigned mode)
{
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "a special file";
}

accel_status accel__fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot open folder %s to fsync it: %s", dir,
                             strerror(errno));
    }
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* Some file systems refuse fsync on directories (EINVAL); their metadata is then as durable
     * as they can make it, so this is not an error. */
    if (rc != 0 && err != EINVAL) {
        return accel__seterr(NULL, ACCEL_EIO, "fsync of folder %s failed: %s", dir, strerror(err));
    }
    return ACCEL_OK;
}

accel_status accel__fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        return accel__fsync_dir(".");
    }
    if (slash == path) {
        return accel__fsync_dir("/");
    }
    size_t n = (size_t)(slash - path);
    char *dir = accel__malloc(n + 1);
    if (dir == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    accel_status st = accel__fsync_dir(dir);
    accel__free(dir);
    return st;
}

int accel__path_names_entry(const char *path)
{
    size_t n = strlen(path);
    while (n > 0 && path[n - 1] == '/') {
        n--;
    }
    size_t cut = n;
    while (cut > 0 && path[cut - 1] != '/') {
        cut--;
    }
    size_t len = n - cut;
    return len > 0 && !(len == 1 && path[cut] == '.') &&
           !(len == 2 && path[cut] == '.' && path[cut + 1] == '.');
}

accel_status accel__mkdirs(const char *dir)
{
    if (dir[0] == '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "the folder path is empty");
    }
    char *p = accel__strdup(dir);
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    accel_status st = ACCEL_OK;
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') {
            continue;
        }
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            st = accel__seterr(NULL, ACCEL_EIO, "cannot create folder %s: %s", p, strerror(errno));
            break;
        }
        p[i] = c;
    }
    if (st == ACCEL_OK && !accel__is_dir(dir)) {
        st = accel__seterr(NULL, ACCEL_EIO, "%s exists and is not a folder", dir);
    }
    /* mkdir succeeds for root on a read-only folder, and a writer would then fail on its first
     * file: test writability now so the error names the folder where it was configured. */
    if (st == ACCEL_OK && access(dir, W_OK | X_OK) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "folder %s is not writable: %s", dir, strerror(errno));
    }
    accel__free(p);
    return st;
}

accel_status accel__rmtree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        return errno == ENOENT
                   ? ACCEL_OK
                   : accel__seterr(NULL, ACCEL_EIO, "cannot stat %s: %s", path, strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (d == NULL && errno == ENOENT) {
            return ACCEL_OK; /* removed meanwhile by another process removing the same tree */
        }
        if (d == NULL) {
            return accel__seterr(NULL, ACCEL_EIO, "cannot open folder %s: %s", path,
                                 strerror(errno));
        }
        accel_status st = ACCEL_OK;
        for (struct dirent *e; st == ACCEL_OK && (e = readdir(d)) != NULL;) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
                continue;
            }
            char *child = accel__path_join(path, e->d_name);
            st = child ? accel__rmtree(child) : ACCEL_ENOMEM;
            accel__free(child);
        }
        closedir(d);
        if (st != ACCEL_OK) {
            return st;
        }
        if (rmdir(path) != 0 && errno != ENOENT) {
            return accel__seterr(NULL, ACCEL_EIO, "cannot remove folder %s: %s", path,
                                 strerror(errno));
        }
        return ACCEL_OK;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot remove %s: %s", path, strerror(errno));
    }
    return ACCEL_OK;
}

accel_status accel__write_all(int fd, const void *buf, size_t nbytes, const char *what)
{
    const char *p = buf;
    while (nbytes > 0) {
        /* Large single writes are fine on Linux but capped at ~2 GiB; 256 MiB keeps each call
         * bounded without costing throughput. */
        size_t chunk = nbytes < ((size_t)256 << 20) ? nbytes : ((size_t)256 << 20);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return accel__seterr(NULL, ACCEL_EIO, "write to %s failed: %s", what, strerror(errno));
        }
        p += w;
        nbytes -= (size_t)w;
    }
    return ACCEL_OK;
}

accel_status accel__afile_open(accel__afile *f, const char *path)
{
    f->fd = -1;
    f->path = f->tmp_path = NULL;
    size_t n = strlen(path);
    if (!accel__path_names_entry(path) || path[n - 1] == '/') {
        return accel__seterr(NULL, ACCEL_EINVAL, "\"%s\" does not name a file", path);
    }
    f->path = accel__strdup(path);
    f->tmp_path = accel__malloc(n + 16);
    if (f->path == NULL || f->tmp_path == NULL) {
        accel__free(f->path);
        accel__free(f->tmp_path);
        f->path = f->tmp_path = NULL;
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory opening %s", path);
    }
    snprintf(f->tmp_path, n + 16, "%s.tmp-XXXXXX", path);
    f->fd = mkostemp(f->tmp_path, O_CLOEXEC);
    if (f->fd < 0) {
        accel_status st =
            accel__seterr(NULL, errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
                          "cannot create a temporary file next to %s: %s", path, strerror(errno));
        accel__free(f->path);
        accel__free(f->tmp_path);
        f->path = f->tmp_path = NULL;
        return st;
    }
    /* mkstemp creates 0600; a saved file should get the usual 0666 & ~umask. */
    mode_t um = umask(0);
    umask(um);
    (void)fchmod(f->fd, 0666 & ~um);
    return ACCEL_OK;
}

void accel__afile_abort(accel__afile *f)
{
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
    }
    if (f->tmp_path != NULL) {
        unlink(f->tmp_path);
    }
    accel__free(f->path);
    accel__free(f->tmp_path);
    f->path = f->tmp_path = NULL;
}

accel_status accel__afile_commit(accel__afile *f)
{
    accel_status st = ACCEL_OK;
    if (fsync(f->fd) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "fsync of %s failed: %s", f->tmp_path, strerror(errno));
    } else if (close(f->fd) != 0) {
        f->fd = -1;
        st = accel__seterr(NULL, ACCEL_EIO, "close of %s failed: %s", f->tmp_path, strerror(errno));
    } else {
        f->fd = -1;
        if (rename(f->tmp_path, f->path) != 0) {
            st = accel__seterr(NULL, ACCEL_EIO, "cannot rename %s to %s: %s", f->tmp_path, f->path,
                               strerror(errno));
        } else {
            accel__free(f->tmp_path);
            f->tmp_path = NULL; /* renamed: nothing left to remove */
            st = accel__fsync_parent(f->path);
        }
    }
    accel__afile_abort(f);
    return st;
}

accel_status accel__write_file_atomic(const char *path, const void *buf, size_t nbytes)
{
    accel__afile f;
    ACCEL_TRY(accel__afile_open(&f, path));
    accel_status st = accel__write_all(f.fd, buf, nbytes, path);
    if (st != ACCEL_OK) {
        accel__afile_abort(&f);
        return st;
    }
    return accel__afile_commit(&f);
}

accel_status accel__read_file(const char *path, char **out, size_t *nbytes)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        return accel__seterr(NULL, errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
                             "cannot open %s: %s", path, strerror(errno));
    }
    size_t cap = 4096, n = 0;
    char *buf = accel__malloc(cap);
    accel_status st = buf ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    while (st == ACCEL_OK) {
        if (n + 1 >= cap) {
            char *nb = accel__realloc(buf, cap * 2);
            if (nb == NULL) {
                st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory reading %s", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, fp);
        n += r;
        if (r == 0) {
            if (ferror(fp)) {
                st = accel__seterr(NULL, ACCEL_EIO, "read of %s failed", path);
            }
            break;
        }
    }
    fclose(fp);
    if (st != ACCEL_OK) {
        accel__free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (nbytes != NULL) {
        *nbytes = n;
    }
    return ACCEL_OK;
}

double accel__wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void accel__keep_std_streams(void)
{
    /* In increasing order, so the lowest free number, the one open() returns, is fd itself. */
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            (void)open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        }
    }
}
