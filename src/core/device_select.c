/*
 * Which device each process computes on (Accelerate's rule): GPU LOCAL_RANK in a CUDA build
 * with a visible GPU (CUDA_VISIBLE_DEVICES applies; more local processes than GPUs share them
 * round-robin, which is how several processes train on one GPU), the CPU when forced (cpu = 1,
 * ACCELERATE_USE_CPU, use_cpu in the config file) or when no GPU is usable, exactly as a build
 * without CUDA. Invariant: after accel__device_setup the handle's device is open, and a GPU
 * that exists but cannot be used fails accel_init instead of training on the CPU unnoticed.
 */
#include <stdio.h>

#include "device/device.h"
#include "device/sim.h"
#include "internal.h"

accel_device accel__choose_device(int force_cpu, int n_gpus, int local_rank)
{
    accel_device d = {ACCEL_DEVICE_CPU, 0};
    if (!force_cpu && n_gpus > 0) {
        d.type = ACCEL_DEVICE_CUDA;
        d.index = local_rank % n_gpus;
    }
    return d;
}

accel_distributed_type accel__choose_dist_type(accel_device device, int launched)
{
    if (!launched) {
        return ACCEL_DIST_NO;
    }
    return device.type == ACCEL_DEVICE_CUDA ? ACCEL_DIST_MULTI_GPU : ACCEL_DIST_MULTI_CPU;
}

accel_status accel__device_setup(accel *acc, int launched)
{
    int n_gpus = 0, n_sim = acc->sim_gpus;
#ifndef ACCEL_HAVE_CUDA
    if (n_sim > 0) {
        accel__device_sim_enable(n_sim); /* the CUDA type opens simulated GPUs (a testing aid) */
    }
#endif
    char why[512] = "cpu = 1 or ACCELERATE_USE_CPU";
    if (!acc->opt.cpu) {
        accel_status st = accel__device_count(ACCEL_DEVICE_CUDA, &n_gpus);
        if (st == ACCEL_EUNSUPPORTED) {
            /* No GPU for this process (none built in, none present): the CPU, as always. */
            snprintf(why, sizeof(why), "%s", accel_last_error(NULL));
            accel__clear_error();
        } else if (st != ACCEL_OK) {
            return accel__seterr(NULL, st,
                                 "accel_init: CUDA is installed but failed: %s (set "
                                 "ACCELERATE_USE_CPU=1 to run on the CPU)",
                                 accel_last_error(NULL));
        }
    }
    acc->n_gpus = n_gpus;
    acc->device = accel__choose_device(acc->opt.cpu, n_gpus, acc->local_rank);
    accel_status st = accel__device_open(&acc->dev, acc->device);
    if (st != ACCEL_OK) {
        return accel__seterr(NULL, st,
                             "accel_init: %s (set ACCELERATE_USE_CPU=1 to run on the CPU)",
                             accel_last_error(NULL));
    }
    acc->dist_type = accel__choose_dist_type(acc->device, launched);
    if (acc->device.type == ACCEL_DEVICE_CUDA) {
        snprintf(acc->device_name, sizeof(acc->device_name), "cuda:%d", acc->device.index);
        char about[256];
        accel__device_describe(acc->dev, about, sizeof(about));
        accel__log(&acc->log, n_sim ? ACCEL__LOG_WARN : ACCEL__LOG_INFO, "device cuda:%d: %s%s",
                   acc->device.index, about, n_sim ? " (not a GPU: unset ACCEL_SIM_GPU)" : "");
        if (acc->local_n_ranks > n_gpus) {
            accel__log(&acc->log, ACCEL__LOG_INFO,
                       "%d processes on this machine share %d GPU%s (process %d -> cuda:%d)",
                       acc->local_n_ranks, n_gpus, n_gpus == 1 ? "" : "s", acc->local_rank,
                       acc->device.index);
        }
    } else {
        snprintf(acc->device_name, sizeof(acc->device_name), "cpu");
        accel__log(&acc->log, ACCEL__LOG_DEBUG, "device cpu: %s", why);
    }
    return ACCEL_OK;
}
