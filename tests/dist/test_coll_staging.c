/* ACCEL_TEST_NPROCS: 2 3
 *
 * The staging of device-memory buffers by the buffer collectives (src/core/coll_stage.c),
 * forced on the CPU so that its logic runs on every machine: the cases of coll_stage_cases.h,
 * each staged call bit-identical to the same call on host buffers.
 */
#include "coll_stage_cases.h"

int main(void)
{
    accel_options o = accel_options_default();
    o.cpu = 1; /* forced staging copies with the CPU device's memcpy */
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    cs_run(acc, 1);
    accel_free(acc);
    printf("test_coll_staging: ok\n");
    return 0;
}
