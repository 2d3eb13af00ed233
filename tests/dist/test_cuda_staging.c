/* ACCEL_TEST_NPROCS: 2 3
 * ACCEL_TEST_LABELS: gpu sim
 *
 * Several processes training on one GPU (or on as many as there are): each process's model is
 * in GPU memory and its gradients reach the host communicator (shm) through staging. The cases
 * of staging_cases.h, then the same training run with the model on the CPU (DDP, ZeRO-1,
 * ZeRO-2): the weights must be bit-identical, since every element-wise device kernel (AdamW, the
 * bf16 compute copy) gives the CPU's bits and the all-reduce runs on the same host bytes. Exits 77
 * without a GPU.
 */
#include "staging_cases.h"

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    if (accel_device_of(acc).type != ACCEL_DEVICE_CUDA) {
        fprintf(stderr, "test_cuda_staging: skipped: this process runs on %s (no CUDA GPU)\n",
                accel_device_name(acc));
        accel_free(acc);
        return 77;
    }
    accel_free(acc);
    sc_allreduce(ACCEL_F32);
    sc_allreduce(ACCEL_BF16);
    for (int stage = 0; stage <= 2; stage++) { /* DDP, then ZeRO-1 and 2 through staging */
        float gpu[SC_DIN], cpu[SC_DIN];
        sc_training(0, stage, gpu);
        sc_training(1, stage, cpu);
        for (int k = 0; k < SC_DIN; k++) {
            CHECK_MSG(memcmp(&gpu[k], &cpu[k], 4) == 0, "stage %d: w[%d]: GPU %.9g, CPU %.9g",
                      stage, k, gpu[k], cpu[k]);
        }
    }
    printf("test_cuda_staging: ok\n");
    return 0;
}
