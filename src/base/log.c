/*
 * Library logging to stderr, one line per call, prefixed "[rank r/N]" by the context of the
 * handle that logs (an accelerator or communicator knows its rank; code without a handle uses
 * the default context, level from ACCEL_LOG_LEVEL). Lines are written with
 * a single write(2) so processes sharing a terminal do not interleave mid-line.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

/* The handle-less context: level from ACCEL_LOG_LEVEL, read once (the variable is part of
 * the environment a program starts with). */
static accel__log_ctx default_ctx = {-1, 0, ACCEL__LOG_WARN};
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void default_init(void)
{
    const char *s;
    if (accel__env_string("ACCEL_LOG_LEVEL", &s) == ACCEL_OK) {
        int level = accel__log_parse_level(s);
        if (level >= 0) {
            default_ctx.level = (accel__log_level)level;
        }
    }
}

const accel__log_ctx *accel__log_default(void)
{
    pthread_once(&default_once, default_init);
    return &default_ctx;
}

int accel__log_enabled(const accel__log_ctx *lc, accel__log_level level)
{
    if (lc == NULL) {
        lc = accel__log_default();
    }
    return level >= lc->level && level < ACCEL__LOG_OFF;
}

int accel__log_parse_level(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    if (s == NULL) {
        return -1;
    }
    if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') {
        return s[0] - '0';
    }
    char low[16];
    size_t n = strlen(s);
    if (n >= sizeof(low)) {
        return -1;
    }
    for (size_t i = 0; i <= n; i++) {
        low[i] = (char)tolower((unsigned char)s[i]);
    }
    if (strcmp(low, "warning") == 0) {
        return ACCEL__LOG_WARN;
    }
    for (int i = 0; i < 5; i++) {
        if (strcmp(low, names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

void accel__log(const accel__log_ctx *lc, accel__log_level level, const char *fmt, ...)
{
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    if (lc == NULL) {
        lc = accel__log_default();
    }
    if (!accel__log_enabled(lc, level)) {
        return;
    }
    char line[2048];
    int n;
    if (lc->rank >= 0) {
        n = snprintf(line, sizeof(line), "[rank %d/%d] accel %s: ", lc->rank, lc->n_ranks,
                     tags[level]);
    } else {
        n = snprintf(line, sizeof(line), "accel %s: ", tags[level]);
    }
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2) {
        len = sizeof(line) - 2;
    }
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* Nothing useful to do if stderr is gone. */
}

double accel__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
