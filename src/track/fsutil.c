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
        accel__log(accel__track_log(), ACCEL__LOG_WARN, "tracker %s: value of \"%s\" is %g (not finite)%s", tracker,
                   key, v,
                   k == NONFINITE_WARN_MAX - 1 ? "; further non-finite warnings are silenced" : "");
    }
}
