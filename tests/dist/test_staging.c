/* ACCEL_TEST_NPROCS: 2 3
 *
 * The reducer's staging path (gradients copied to host memory around each bucket's
 * collective, as for a model on a GPU with a host communicator), forced on the accelerator's
 * device so that its logic runs on every machine: the cases of staging_cases.h. On a CPU they
 * also show that staging changes no bit of the result (the reference is the host collective).
 */
#include "staging_cases.h"
#include "train/train_internal.h"

int main(void)
{
    accel__train_force_staging(1);
    sc_allreduce(ACCEL_F32);
    sc_allreduce(ACCEL_BF16);
    float w[SC_DIN];
    for (int stage = 0; stage <= 2; stage++) {
        sc_training(0, stage, w);
    }
    printf("test_staging: ok\n");
    return 0;
}
