/*
 * A config file with keys accel does not act on (Accelerate 1.12's CPU file with IPEX turned
 * on, and a key from the future): every process starts, and only the main process warns, once
 * per key.
 * ACCEL_TEST_NPROCS: 2
 */
#include <string.h>
#include <unistd.h>

#include "check.h"

int main(void)
{
    char path[256], err_path[256];
    snprintf(path, sizeof(path), "/tmp/accel_test_config_warn_%d.yaml", (int)getpid());
    snprintf(err_path, sizeof(err_path), "/tmp/accel_test_config_warn_%d.err", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nipex_config:\n"
          "  ipex: true\nmixed_precision: 'no'\nnum_processes: 2\nuse_cpu: true\n"
          "future_key: 1\n",
          f);
    fclose(f);

    /* Capture this process's stderr around accel_init. */
    static check_capture cap;
    check_capture_begin(&cap, err_path);
    accel_options o = accel_options_default();
    o.config_file = path;
    accel *acc = NULL;
    accel_status st = accel_init(&acc, &o);
    const char *err = check_capture_end(&cap);
    CHECK_OK(NULL, st);
    int warns = 0;
    for (const char *p = strstr(err, "config file"); p != NULL; p = strstr(p + 1, "config file")) {
        warns++;
    }
    if (accel_is_main_process(acc)) {
        CHECK_MSG(warns == 2 && strstr(err, "ignoring ipex_config: {ipex: true}") &&
                      strstr(err, "unknown key \"future_key\""),
                  "%s", err);
    } else {
        CHECK_MSG(warns == 0, "process %d warned:\n%s", accel_process_index(acc), err);
    }
    CHECK_OK(acc, accel_barrier(acc, NULL));
    remove(path);
    remove(err_path);
    accel_free(acc);
    return 0;
}
