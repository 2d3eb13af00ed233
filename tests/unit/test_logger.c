/*
 * Named loggers: one handle per name, the "[rank r/N] name LEVEL: msg" format, level filtering
 * (default info, ACCELERATE_LOG_LEVEL read by accel_init, set_level), warning_once, and the scopes
 * on one process (main-only, all, in_order). The 3-process behaviour is tests/dist/test_logging.c.
 */
#include <string.h>
#include <unistd.h>

#include "check.h"

static char out[8192];

static const char *contents(FILE *f)
{
    fflush(f);
    rewind(f);
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    CHECK(ftruncate(fileno(f), 0) == 0);
    rewind(f);
    return out;
}

int main(void)
{
    unsetenv("ACCELERATE_LOG_LEVEL");
    unsetenv("ACCEL_LOG_LEVEL");
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    accel_logger *lg = accel_get_logger(acc, "train");
    CHECK(lg != NULL && accel_get_logger(acc, "train") == lg);
    CHECK(accel_get_logger(acc, "other") != lg);
    CHECK(accel_logger_level(lg) == ACCEL_LOG_INFO);
    FILE *f = tmpfile();
    CHECK(f != NULL);
    accel_logger_set_stream(lg, f);

    accel_logger_info(lg, "step %d loss %.2f", 3, 1.25);
    accel_logger_debug(lg, "hidden");
    CHECK_MSG(strcmp(contents(f), "[rank 0/1] train INFO: step 3 loss 1.25\n") == 0, "%s", out);

    accel_logger_set_level(lg, ACCEL_LOG_DEBUG);
    accel_logger_debug(lg, "now shown");
    accel_logger_warning(lg, "careful");
    accel_logger_error(lg, "bad");
    CHECK_MSG(strcmp(contents(f), "[rank 0/1] train DEBUG: now shown\n"
                                  "[rank 0/1] train WARNING: careful\n"
                                  "[rank 0/1] train ERROR: bad\n") == 0,
              "%s", out);

    accel_logger_set_level(lg, ACCEL_LOG_OFF);
    accel_logger_error(lg, "silenced");
    CHECK(strcmp(contents(f), "") == 0);
    accel_logger_set_level(lg, ACCEL_LOG_INFO);

    for (int i = 0; i < 3; i++) {
        accel_logger_warning_once(lg, "deprecated option %s", "x");
        accel_logger_warning_once(lg, "deprecated option %s", "y");
    }
    CHECK_MSG(strcmp(contents(f), "[rank 0/1] train WARNING: deprecated option x\n"
                                  "[rank 0/1] train WARNING: deprecated option y\n") == 0,
              "%s", out);

    accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_ALL_PROCESSES, "all %d", 1);
    accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "ordered %d", 2);
    accel_logger_log(lg, ACCEL_LOG_DEBUG, ACCEL_LOG_IN_ORDER, "below level");
    CHECK_MSG(strcmp(contents(f), "[rank 0/1] train INFO: all 1\n"
                                  "[rank 0/1] train INFO: ordered 2\n") == 0,
              "%s", out);

    /* Accelerate's variable sets the level of the loggers of accelerators created afterwards:
     * accel_init reads it, once; a change after init does not reach the first accelerator. */
    setenv("ACCELERATE_LOG_LEVEL", "error", 1);
    CHECK(accel_logger_level(accel_get_logger(acc, "late")) == ACCEL_LOG_INFO);
    accel *acc2;
    CHECK_OK(NULL, accel_init(&acc2, NULL));
    CHECK(strcmp(accel_setting_source(acc2, "logger_level"), "env ACCELERATE_LOG_LEVEL") == 0);
    accel_logger *lg2 = accel_get_logger(acc2, "quiet");
    CHECK(accel_logger_level(lg2) == ACCEL_LOG_ERROR);
    accel_logger_set_stream(lg2, f);
    accel_logger_warning(lg2, "no");
    accel_logger_error(lg2, "yes");
    CHECK_MSG(strcmp(contents(f), "[rank 0/1] quiet ERROR: yes\n") == 0, "%s", out);
    unsetenv("ACCELERATE_LOG_LEVEL");
    accel_free(acc2);

    /* Bad input. */
    CHECK(accel_get_logger(acc, NULL) == NULL && accel_last_status(acc) == ACCEL_EINVAL);
    char longname[100];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    CHECK(accel_get_logger(acc, longname) == NULL);
    accel_logger_info(NULL, "ignored"); /* NULL is a no-op */

    fclose(f);
    accel_free(acc);
    printf("test_logger: ok\n");
    return 0;
}
