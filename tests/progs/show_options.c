/*
 * Launcher test helper: accel_init with no options (so the environment and the config file
 * decide) and one line of what it resolved, for comparing `accel launch --config_file F` with
 * `ACCELERATE_CONFIG_FILE=F` (tests/cli/test_launch_config.sh). Prints the error and exits 1
 * when accel_init fails.
 *   show_options
 */
#include <stdio.h>

#include "accel/accel.h"

int main(void)
{
    accel *acc = NULL;
    if (accel_init(&acc, NULL) != ACCEL_OK) {
        fprintf(stderr, "show_options: %s\n", accel_last_error(NULL));
        return 1;
    }
    const accel_options *o = accel_resolved_options(acc);
    printf("options: mixed_precision=%s cpu=%d debug=%d accumulation=%d zero_stage=%d\n",
           accel_precision_name(accel_mixed_precision(acc)), o->cpu, o->debug,
           accel_gradient_accumulation_steps(acc), o->zero_stage);
    printf("layout: rank %d of %d\n", accel_process_index(acc), accel_num_processes(acc));
    accel_free(acc);
    return 0;
}
