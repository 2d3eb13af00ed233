/*
 * Named user loggers (accelerate.logging.get_logger): levels, "[rank r/N] name LEVEL: msg"
 * lines, main-process-only by default, every process, or every process in rank order with a
 * barrier after each turn. Loggers are owned by the accelerator (ACCEL__MOD_LOGGER slot) and
 * the same name returns the same handle.
 *
 * Each line is formatted into one buffer and written with a single write(2) on stderr (or one
 * fputs + fflush on a caller's stream), so lines of processes sharing a terminal never mix.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "accel/track.h"
#include "core/internal.h"
#include "core/settings.h"

#define ONCE_MAX 64

struct accel_logger {
    accel *acc;
    char name[64];
    accel_log_level level;
    FILE *stream;            /* NULL = stderr */
    uint64_t once[ONCE_MAX]; /* hashes of messages warning_once has printed */
    int n_once;
    struct accel_logger *next;
};

typedef struct logger_set {
    accel_logger *head;
} logger_set;

static void set_free(accel *acc, void *state)
{
    (void)acc;
    logger_set *ls = state;
    while (ls->head != NULL) {
        accel_logger *n = ls->head->next;
        accel__free(ls->head);
        ls->head = n;
    }
    accel__free(ls);
}

accel_logger *accel_get_logger(accel *acc, const char *name)
{
    if (acc == NULL || name == NULL || strlen(name) >= 64) {
        accel__seterr(acc, ACCEL_EINVAL,
                      "accel_get_logger: acc or name is NULL, or the name is "
                      "longer than 63 characters");
        return NULL;
    }
    logger_set *ls = accel__module(acc, ACCEL__MOD_LOGGER);
    if (ls == NULL) {
        ls = accel__calloc(1, sizeof(*ls));
        if (ls == NULL) {
            accel__seterr(acc, ACCEL_ENOMEM, "accel_get_logger: out of memory");
            return NULL;
        }
        accel__module_set(acc, ACCEL__MOD_LOGGER, ls, set_free);
    }
    for (accel_logger *lg = ls->head; lg != NULL; lg = lg->next) {
        if (strcmp(lg->name, name) == 0) {
            return lg;
        }
    }
    accel_logger *lg = accel__calloc(1, sizeof(*lg));
    if (lg == NULL) {
        accel__seterr(acc, ACCEL_ENOMEM, "accel_get_logger: out of memory");
        return NULL;
    }
    lg->acc = acc;
    snprintf(lg->name, sizeof(lg->name), "%s", name);
    /* ACCELERATE_LOG_LEVEL > ACCEL_LOG_LEVEL > info, resolved by accel_init. */
    lg->level = (accel_log_level)acc->settings->track.logger_level;
    lg->next = ls->head;
    ls->head = lg;
    return lg;
}

void accel_logger_set_level(accel_logger *lg, accel_log_level level)
{
    if (lg != NULL && level >= ACCEL_LOG_DEBUG && level <= ACCEL_LOG_OFF) {
        lg->level = level;
    }
}

accel_log_level accel_logger_level(const accel_logger *lg)
{
    return lg != NULL ? lg->level : ACCEL_LOG_OFF;
}

void accel_logger_set_stream(accel_logger *lg, FILE *stream)
{
    if (lg != NULL) {
        lg->stream = stream;
    }
}

static void emit(accel_logger *lg, accel_log_level level, const char *fmt, va_list ap)
{
    static const char *const tags[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    char line[4096];
    int n = snprintf(line, sizeof(line), "[rank %d/%d] %s %s: ", lg->acc->rank, lg->acc->n_ranks,
                     lg->name, tags[level]);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2) {
        len = sizeof(line) - 2;
    }
    line[len++] = '\n';
    line[len] = '\0';
    if (lg->stream == NULL || lg->stream == stderr) {
        ssize_t w = write(STDERR_FILENO, line, len);
        (void)w; /* nowhere to report a lost stderr */
    } else {
        fputs(line, lg->stream);
        fflush(lg->stream);
    }
}

static int enabled(const accel_logger *lg, accel_log_level level)
{
    return level >= ACCEL_LOG_DEBUG && level < ACCEL_LOG_OFF && level >= lg->level;
}

static void vlog(accel_logger *lg, accel_log_level level, accel_log_scope scope, const char *fmt,
                 va_list ap)
{
    accel *acc = lg->acc;
    if (scope == ACCEL_LOG_IN_ORDER) {
        /* Every process takes part in every turn's barrier, whether or not it prints, so the
         * call stays a well-formed collective even when levels differ between processes. */
        for (int r = 0; r < acc->n_ranks; r++) {
            if (r == acc->rank && enabled(lg, level)) {
                va_list cp;
                va_copy(cp, ap);
                emit(lg, level, fmt, cp);
                va_end(cp);
            }
            if (acc->n_ranks > 1 && accel_wait_for_everyone(acc) != ACCEL_OK) {
                accel__log(&lg->acc->log, ACCEL__LOG_ERROR, "logger %s: in_order barrier failed: %s", lg->name,
                           accel_last_error(acc));
                return;
            }
        }
        return;
    }
    if (!enabled(lg, level) || (scope == ACCEL_LOG_MAIN_ONLY && acc->rank != 0)) {
        return;
    }
    emit(lg, level, fmt, ap);
}

void accel_logger_log(accel_logger *lg, accel_log_level level, accel_log_scope scope,
                      const char *fmt, ...)
{
    if (lg == NULL || fmt == NULL) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vlog(lg, level, scope, fmt, ap);
    va_end(ap);
}

#define SHORTHAND(fn, level)                                                                       \
    void fn(accel_logger *lg, const char *fmt, ...)                                                \
    {                                                                                              \
        if (lg == NULL || fmt == NULL) {                                                           \
            return;                                                                                \
        }                                                                                          \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        vlog(lg, level, ACCEL_LOG_MAIN_ONLY, fmt, ap);                                             \
        va_end(ap);                                                                                \
    }
SHORTHAND(accel_logger_debug, ACCEL_LOG_DEBUG)
SHORTHAND(accel_logger_info, ACCEL_LOG_INFO)
SHORTHAND(accel_logger_warning, ACCEL_LOG_WARNING)
SHORTHAND(accel_logger_error, ACCEL_LOG_ERROR)
#undef SHORTHAND

void accel_logger_warning_once(accel_logger *lg, const char *fmt, ...)
{
    if (lg == NULL || fmt == NULL || lg->acc->rank != 0 || !enabled(lg, ACCEL_LOG_WARNING)) {
        return;
    }
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uint64_t h = accel__fnv1a_str(msg); /* the formatted message: "the same warning" */
    for (int i = 0; i < lg->n_once; i++) {
        if (lg->once[i] == h) {
            return;
        }
    }
    if (lg->n_once < ONCE_MAX) {
        lg->once[lg->n_once++] = h;
    }
    accel_logger_log(lg, ACCEL_LOG_WARNING, ACCEL_LOG_MAIN_ONLY, "%s", msg);
}
