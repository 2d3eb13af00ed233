/*
 * The progress bar: count, percentage, elapsed and remaining time, rate and caller fields
 * (loss, lr). On a terminal it is redrawn in place with '\r' (at most every 0.1 s); elsewhere
 * (CI logs, `accel launch` relaying rank output) it prints a plain line every interval_s or
 * each time another percent_step of the total is done, so logs stay readable, and no line
 * twice.
 *
 * Only the drawing process (global main, or each local main) does any work; on the others the
 * handle is inert, so a loop can update it unconditionally.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "accel/track.h"
#include "core/profile.h"

#define MAX_FIELDS 8
#define TTY_MIN_INTERVAL_S 0.1

struct accel_progress {
    int active; /* this process draws */
    int tty;
    FILE *stream;
    char desc[64];
    long long total, n, initial;
    double t_start, t_last_draw;
    double interval_s, percent_step;
    long long last_bucket; /* percent buckets already reported in plain mode */
    int width;
    size_t last_len; /* tty: length of the previous draw, to blank leftovers */
    int stale;       /* count or fields changed since the last draw (or nothing drawn yet) */
    int n_fields;
    char keys[MAX_FIELDS][32];
    double values[MAX_FIELDS];
};

static double (*clock_fn)(void) = accel__now;

void accel__progress_set_clock(double (*now)(void))
{
    clock_fn = now != NULL ? now : accel__now;
}

accel_progress_options accel_progress_options_default(void)
{
    accel_progress_options o;
    memset(&o, 0, sizeof(o));
    o.size = (uint32_t)sizeof(o);
    o.version = ACCEL_PROGRESS_OPTIONS_VERSION;
    o.tty = -1;
    o.interval_s = 10.0;
    o.percent_step = 10.0;
    o.width = 30;
    return o;
}

accel_status accel_progress_new(accel *acc, const accel_progress_options *opts,
                                accel_progress **out)
{
    const char *who = "accel_progress_new";
    if (acc == NULL || out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: acc and out must not be NULL", who);
    }
    accel_progress_options o = accel_progress_options_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(acc, who, accel_progress_options, &o, opts, width));
    long long initial = o.initial;
    if (o.total < 0 || o.interval_s < 0 || o.percent_step < 0 || o.percent_step > 100 ||
        initial < 0 || (o.total > 0 && initial > o.total)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: total %lld, interval_s %g, percent_step %g or initial %lld is "
                             "out of range",
                             who, o.total, o.interval_s, o.percent_step, initial);
    }
    accel_progress *p = accel__calloc(1, sizeof(*p));
    if (p == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "%s: out of memory", who);
    }
    p->active = o.local_main ? acc->local_rank == 0 : acc->rank == 0;
    p->stream = o.stream != NULL ? o.stream : stderr;
    p->tty = o.tty >= 0 ? o.tty : isatty(fileno(p->stream));
    snprintf(p->desc, sizeof(p->desc), "%s", o.desc ? o.desc : "");
    p->total = o.total;
    p->n = p->initial = initial;
    p->interval_s = o.interval_s;
    p->percent_step = o.percent_step;
    if (p->percent_step > 0 && p->total > 0) {
        /* Percent marks already passed before a resume are not reported again. */
        p->last_bucket =
            (long long)floor((double)initial * 100.0 / (double)p->total / p->percent_step);
    }
    p->width = o.width > 0 && o.width <= 200 ? o.width : 30;
    p->t_start = clock_fn();
    p->t_last_draw = p->t_start;
    p->stale = 1;
    *out = p;
    return ACCEL_OK;
}

static void fmt_time(char *out, size_t cap, double s)
{
    if (!isfinite(s) || s < 0) {
        snprintf(out, cap, "?");
        return;
    }
    long long t = (long long)(s + 0.5);
    if (t >= 3600) {
        snprintf(out, cap, "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
    } else {
        snprintf(out, cap, "%02lld:%02lld", t / 60, t % 60);
    }
}

/* Formats the whole line (without '\r' / '\n') into buf. */
static size_t render(const accel_progress *p, double now, char *buf, size_t cap)
{
    double elapsed = now - p->t_start;
    double rate = elapsed > 0 ? (double)(p->n - p->initial) / elapsed : 0;
    char el[32], rem[32], rate_s[32];
    fmt_time(el, sizeof(el), elapsed);
    if (rate >= 1 || rate == 0) {
        snprintf(rate_s, sizeof(rate_s), "%.2fit/s", rate);
    } else {
        snprintf(rate_s, sizeof(rate_s), "%.2fs/it", 1.0 / rate);
    }
    size_t k = 0;
#define OUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(buf + k, cap - k, __VA_ARGS__);                                          \
        k += w_ > 0 ? (size_t)w_ : 0;                                                              \
        if (k >= cap) {                                                                            \
            k = cap - 1;                                                                           \
        }                                                                                          \
    } while (0)
    if (p->desc[0]) {
        OUT("%s: ", p->desc);
    }
    if (p->total > 0) {
        double frac = (double)p->n / (double)p->total;
        frac = frac > 1 ? 1 : frac;
        OUT("%3d%%", (int)(frac * 100));
        if (p->tty) {
            int fill = (int)(frac * p->width);
            OUT("|");
            for (int i = 0; i < p->width; i++) {
                OUT("%c", i < fill ? '#' : ' ');
            }
            OUT("|");
        }
        fmt_time(rem, sizeof(rem), rate > 0 ? (double)(p->total - p->n) / rate : -1);
        OUT(" %lld/%lld [%s<%s, %s", p->n, p->total, el, rem, rate_s);
    } else {
        OUT("%lldit [%s, %s", p->n, el, rate_s);
    }
    for (int i = 0; i < p->n_fields; i++) {
        OUT(", %s=%.4g", p->keys[i], p->values[i]);
    }
    OUT("]");
#undef OUT
    return k;
}

static void draw(accel_progress *p, double now, int final)
{
    char line[1024];
    size_t len = render(p, now, line, sizeof(line) - 2);
    if (p->tty) {
        /* Blank what a longer previous draw left behind. */
        fputc('\r', p->stream);
        fwrite(line, 1, len, p->stream);
        for (size_t i = len; i < p->last_len; i++) {
            fputc(' ', p->stream);
        }
        if (final) {
            fputc('\n', p->stream);
        }
        p->last_len = len;
    } else {
        line[len++] = '\n';
        fwrite(line, 1, len, p->stream);
    }
    fflush(p->stream);
    p->t_last_draw = now;
    p->stale = 0;
}

void accel_progress_update(accel_progress *p, long long n)
{
    if (p == NULL || !p->active) {
        return;
    }
    p->n += n;
    p->stale |= n != 0;
    double now = clock_fn();
    if (p->tty) {
        if (now - p->t_last_draw >= TTY_MIN_INTERVAL_S || (p->total > 0 && p->n >= p->total)) {
            draw(p, now, 0);
        }
        return;
    }
    int due = p->interval_s > 0 && now - p->t_last_draw >= p->interval_s;
    if (p->percent_step > 0 && p->total > 0) {
        long long bucket =
            (long long)floor((double)p->n * 100.0 / (double)p->total / p->percent_step);
        if (bucket > p->last_bucket) {
            p->last_bucket = bucket;
            due = 1;
        }
    }
    if (due) {
        draw(p, now, 0);
    }
}

void accel_progress_set_field(accel_progress *p, const char *key, double value)
{
    if (p == NULL || !p->active || key == NULL) {
        return;
    }
    for (int i = 0; i < p->n_fields; i++) {
        if (strcmp(p->keys[i], key) == 0) {
            p->stale |= memcmp(&p->values[i], &value, sizeof value) != 0;
            p->values[i] = value;
            return;
        }
    }
    if (p->n_fields < MAX_FIELDS) {
        snprintf(p->keys[p->n_fields], sizeof(p->keys[0]), "%s", key);
        p->values[p->n_fields++] = value;
        p->stale = 1;
    }
}

void accel_progress_close(accel_progress *p)
{
    if (p == NULL) {
        return;
    }
    /* The log ends with the final count and fields, once: plain mode prints a closing line
     * only when the last one shows something older (an update that reaches the total draws
     * already). A terminal's line is redrawn in place and ended. */
    if (p->active && (p->tty || p->stale)) {
        draw(p, clock_fn(), 1);
    }
    accel__free(p);
}
