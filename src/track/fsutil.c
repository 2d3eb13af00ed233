/*
 * Small helpers the trackers share: creating directories, joining paths, atomic small-file
 * writes (temp + fsync + rename, so a crash never leaves a half-written meta.yaml), JSON string
 * escaping, and the rate-limited non-finite-value warning (a NaN loss logged every step must not
 * flood stderr).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "track_internal.h"

accel_status accel__track_mkdirs(const char *path)
{
    char *p = accel__strdup(path);
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory creating %s", path);
    }
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') {
            continue;
        }
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            accel_status st = accel__seterr(NULL, ACCEL_EIO, "cannot create directory %s: %s", p,
                                            strerror(errno));
            accel__free(p);
            return st;
        }
        p[i] = saved;
    }
    struct stat sb;
    if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        accel__free(p);
        return accel__seterr(NULL, ACCEL_EIO, "%s exists and is not a directory", path);
    }
    /* mkdir succeeds for root on a read-only mode directory, but the tracker would then fail
     * on its first file: test writability now so the error names the directory at init. */
    if (access(p, W_OK | X_OK) != 0) {
        accel_status st = accel__seterr(NULL, ACCEL_EIO, "directory %s is not writable: %s", path,
                                        strerror(errno));
        accel__free(p);
        return st;
    }
    accel__free(p);
    return ACCEL_OK;
}

void accel__track_fmt_double(char *out, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(out, cap, "nan");
    } else if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "inf" : "-inf");
    } else {
        /* The shortest of %.15g..%.17g that reads back exactly: 3e-4 stays "0.0003". */
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(out, cap, "%.*g", prec, v);
            if (strtod(out, NULL) == v) {
                break;
            }
        }
    }
}

double accel__wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *accel__track_path_join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = accel__malloc(na + nb + 2);
    if (s == NULL) {
        return NULL;
    }
    memcpy(s, a, na);
    size_t k = na;
    if (k > 0 && s[k - 1] != '/') {
        s[k++] = '/';
    }
    memcpy(s + k, b, nb + 1);
    return s;
}

accel_status accel__track_write_file(const char *path, const char *text)
{
    size_t n = strlen(path);
    char *tmp = accel__malloc(n + 16);
    if (tmp == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", path);
    }
    snprintf(tmp, n + 16, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    accel_status st = ACCEL_OK;
    if (fd < 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            st = accel__seterr(NULL, ACCEL_EIO, "cannot write %s: %s", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            goto out;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot flush %s: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot rename %s to %s: %s", tmp, path,
                           strerror(errno));
        unlink(tmp);
    }
out:
    accel__free(tmp);
    return st;
}

void accel__json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (*p < 0x20) {
                fprintf(f, "\\u%04x", *p);
            } else {
                fputc(*p, f);
            }
        }
    }
    fputc('"', f);
}

/* A process-wide budget: the first few non-finite values are reported individually, then one
 * line says further ones are silenced. Atomic so trackers on any thread may call it. */
static int nonfinite_warned;
#define NONFINITE_WARN_MAX 5

void accel__track_warn_nonfinite(const char *tracker, const char *key, double v)
{
    int k = __atomic_fetch_add(&nonfinite_warned, 1, __ATOMIC_RELAXED);
    if (k < NONFINITE_WARN_MAX) {
        accel__log(ACCEL__LOG_WARN, "tracker %s: value of \"%s\" is %g (not finite)%s", tracker,
                   key, v,
                   k == NONFINITE_WARN_MAX - 1 ? "; further non-finite warnings are silenced" : "");
    }
}
