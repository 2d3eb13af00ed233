/* ACCEL_TEST_NPROCS: 2 3
 * ACCEL_TEST_LABELS: gpu sim
 *
 * accel_allreduce and the other buffer collectives on GPU memory (processes sharing one GPU, or
 * one each): the cases of coll_stage_cases.h, each call on device buffers bit-identical to the
 * same call on host buffers, a device send with a host recv, and a work handle refused. Exits
 * 77 without a GPU.
 */
#include "coll_stage_cases.h"

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    if (accel_device_of(acc).type != ACCEL_DEVICE_CUDA) {
        fprintf(stderr, "test_cuda_collectives: skipped: this process runs on %s (no CUDA GPU)\n",
                accel_device_name(acc));
        accel_free(acc);
        return 77;
    }
    cs_run(acc, 0);
    accel_free(acc);
    printf("test_cuda_collectives: ok\n");
    return 0;
}
