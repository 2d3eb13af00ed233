/*
 * Library logging to stderr, one line per call, prefixed "[rank r/N]" once accel_init knows
 * the rank. The level comes from ACCEL_LOG_LEVEL (read at accel_init). Lines are written with
 * a single write(2) so processes sharing a terminal do not interleave mid-line.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static int log_rank = -1, log_n_ranks = 0;
static accel__log_level log_level = ACCEL__LOG_WARN;

void accel__log_set_rank(int rank, int n_ranks)
{
    log_rank = rank;
    log_n_ranks = n_ranks;
}

void accel__log_set_level(accel__log_level level)
{
    log_level = level;
}

int accel__log_enabled(accel__log_level level)
{
    return level >= log_level && level < ACCEL__LOG_OFF;
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

void accel__log(accel__log_level level, const char *fmt, ...)
{
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    if (!accel__log_enabled(level)) {
        return;
    }
    char line[2048];
    int n;
    if (log_rank >= 0) {
        n = snprintf(line, sizeof(line), "[rank %d/%d] accel %s: ", log_rank, log_n_ranks,
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
