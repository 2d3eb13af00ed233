/*
 * Small helpers the trackers share: number formatting, JSON string escaping, and the
 * rate-limited non-finite-value warning (a NaN loss logged every step must not flood stderr).
 * Paths, folders and atomic file writes come from base/fs.h.
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

#include "base/fs.h"
#include "core/internal.h"
#include "track_internal.h"

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

int accel__utf8_len(const unsigned char *p)
{
    if (p[0] < 0x80) {
        return 1;
    }
    int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (n == 0 || p[0] > 0xf4) {
        return 0;
    }
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
    }
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90)) {
        return 0;
    }
    return n;
}

void accel__json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = accel__utf8_len(p);
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
            /* Control characters (C0, DEL, C1) are escaped, which JSON allows and YAML's
             * readers need (the YAML files reuse this quoting). A byte that is not part of
             * well-formed UTF-8 is written as the character of the same number (its Latin-1
             * reading): raw, it would make Python's json / yaml reject the whole file, and
             * U+FFFD would lose the byte. */
            if (n == 0 || *p < 0x20 || *p == 0x7f || (*p == 0xc2 && p[1] < 0xa0)) {
                unsigned v = n == 2 ? (unsigned)(p[1] & 0x3f) | 0x80u : *p;
                fprintf(f, "\\u%04x", v);
                n = n == 0 ? 1 : n;
            } else {
                fwrite(p, 1, (size_t)n, f);
            }
            p += n;
            continue;
        }
        p++;
    }
    fputc('"', f);
}

char *accel__utf8_dup(const char *s)
{
    size_t n = 0, extra = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        extra += *p >= 0x80 && accel__utf8_len(p) == 0;
    }
    char *out = accel__malloc(n + extra + 1);
    if (out == NULL) {
        return NULL;
    }
    char *o = out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80 && accel__utf8_len(p) == 0) {
            *o++ = (char)(0xc0 | (*p >> 6));
            *o++ = (char)(0x80 | (*p & 0x3f));
        } else {
            *o++ = (char)*p;
        }
    }
    *o = '\0';
    return out;
}

FILE *accel__track_reopen_at(FILE *f, const char *path, long long good, const char *mode)
{
    if (f != NULL) {
        /* This may try the buffered bytes once more and fail again: they are cut below. */
        fclose(f);
    }
    if (good >= 0 && truncate(path, (off_t)good) != 0) {
        return NULL;
    }
    return fopen(path, mode);
}

int accel__track_file_gone(FILE *f, const char *path)
{
    struct stat a, b;
    if (fstat(fileno(f), &a) != 0) {
        return 0; /* cannot tell: keep writing where we were */
    }
    return stat(path, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino;
}

/* A process-wide budget: the first few non-finite values are reported individually, then one
 * line says further ones are silenced. Atomic so trackers on any thread may call it. */
static int nonfinite_warned;
#define NONFINITE_WARN_MAX 5

void accel__track_warn_nonfinite(const char *tracker, const char *key, double v)
{
    int k = __atomic_fetch_add(&nonfinite_warned, 1, __ATOMIC_RELAXED);
    if (k < NONFINITE_WARN_MAX) {
        accel__log(accel__track_log(), ACCEL__LOG_WARN,
                   "tracker %s: value of \"%s\" is %g (not finite)%s", tracker, key, v,
                   k == NONFINITE_WARN_MAX - 1 ? "; further non-finite warnings are silenced" : "");
    }
}

accel_status accel__track_lock(accel__lockfile *l, const char *path, const char *what,
                               const char *advice)
{
    accel_status st =
        accel__lockfile_take_named(l, path, advice, "%s is being written by another job", what);
    /* The message goes to the tracker's own channel, which the caller of the hook reports. */
    return st == ACCEL_OK ? st : accel_tracker_seterr(st, "%s", accel_last_error(NULL));
}
