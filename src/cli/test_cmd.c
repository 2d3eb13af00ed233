/*
 * `accel test`: runs the built-in end-to-end check (worker/test_worker.c, installed as
 * libexec/accel/test_worker) under the launch the config file describes, exactly as
 * `accel launch [--config_file F]` would start a program, and ends with Accelerate's success
 * line or a line naming the failing check (which the worker leaves in $ACCEL_TEST_REPORT).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static int run_test(const cli_verb *verb, int argc, char **argv);

static const cli_option test_options[] = {
    {"config_file", 0, 1, NULL, "FILE",
     "the config file to launch with (default: $ACCELERATE_CONFIG_FILE, else Accelerate's "
     "default_config.yaml)",
     NULL, NULL},
    {0},
};

const cli_verb cli_verb_test = {
    .name = "test",
    .summary = "check that accel works under your configuration",
    .positional = NULL,
    .description =
        "Launches accel's own check with the config file's settings (processes, precision,\n"
        "...): initialisation, every collective, the random generator, data sharding and\n"
        "gather_for_metrics, a short training run with gradient accumulation in the configured\n"
        "precision against a reference, and a checkpoint with an exact resume. Ends with\n"
        "\"Test is a success!\" or names the check that failed. Test hook:\n"
        "ACCEL_TEST_FAIL_CHECK=<init|collectives|rng|gather_for_metrics|training|checkpoint>\n"
        "makes that check fail on purpose.",
    .options = test_options,
    .run = run_test,
};

static int run_test(const cli_verb *verb, int argc, char **argv)
{
    cli_args a;
    int status;
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status;
    }
    /* The worker beside this binary: build/libexec/accel/ in the build tree, the install's
     * libexec/accel/ (ACCEL_LIBEXEC_FROM_BIN, relative to the bin folder) once installed. */
    char exe[4096], worker[4200] = "";
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[k > 0 ? k : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL) {
        *slash = '\0';
        const char *const where[] = {"libexec/accel", ACCEL_LIBEXEC_FROM_BIN "/accel"};
        for (int i = 0; i < 2 && (worker[0] == '\0' || access(worker, X_OK) != 0); i++) {
            snprintf(worker, sizeof(worker), "%s/%s/test_worker", exe, where[i]);
        }
    }
    if (worker[0] == '\0' || access(worker, X_OK) != 0) {
        fprintf(stderr, "accel test: error: its program %s is missing: %s\n",
                worker[0] ? worker : "libexec/accel/test_worker", strerror(errno));
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    char report[4200];
    snprintf(report, sizeof(report), "%s/accel-test-report-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(report);
    if (fd < 0 || setenv("ACCEL_TEST_REPORT", report, 1) != 0) {
        fprintf(stderr, "accel test: error: cannot create %s: %s\n", report, strerror(errno));
        return 1;
    }
    close(fd);
    const char *config = cli_value(verb, &a, "config_file");
    char *largv[5];
    int largc = 0;
    largv[largc++] = "launch";
    if (config != NULL) {
        largv[largc++] = "--config_file";
        largv[largc++] = (char *)config;
    }
    largv[largc++] = worker;
    largv[largc] = NULL;
    fflush(stdout);
    int rc = cli_verb_launch.run(&cli_verb_launch, largc, largv);
    if (rc == 0) {
        printf("Test is a success! You are ready for your distributed training!\n");
    } else {
        char line[2400] = "";
        FILE *f = fopen(report, "r");
        if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
            snprintf(line, sizeof(line), "the check did not run to its end (exit status %d; "
                                         "see above)\n", rc);
        }
        if (f != NULL) {
            fclose(f);
        }
        fprintf(stderr, "accel test: FAILED: %s", line);
    }
    unlink(report);
    return rc;
}
