/*
 * The simulated GPU (sim.c): a testing aid that lets the device code paths (the reducer with
 * the model in device memory, staging, checkpoints through pinned buffers, the user-kernel API)
 * run in CI on machines without a GPU. In a build without CUDA, once enabled (core does it at
 * accel_init when ACCEL_SIM_GPU=n is set; unit tests call accel__device_sim_enable), the CUDA
 * device type opens a simulated GPU: device memory is host memory of its own that host code
 * cannot touch (page-protected except while queued work runs), copies check that their kind
 * matches where the pointers live, fresh memory is poisoned (0xFF bytes: NaN in every float
 * dtype), and work on a stream is deferred until something waits for it (a sync, an event, a
 * copy to the host on the default order), so a missing synchronisation gives a wrong result in
 * a test instead of passing by luck. Kernels are the CPU device's.
 *
 * Never for training: users get it only by setting ACCEL_SIM_GPU, which a CUDA build refuses.
 */
#ifndef ACCEL_DEVICE_SIM_H
#define ACCEL_DEVICE_SIM_H

#include "device.h"

/* Most simulated GPUs one process may have. */
#define ACCEL__SIM_MAX_GPUS 8

/* From now on the process has n_gpus (1..ACCEL__SIM_MAX_GPUS) simulated GPUs; 0 turns the
 * simulation off for later opens (handles already open stay valid). Thread-safe. */
void accel__device_sim_enable(int n_gpus);
/* The simulated GPUs enabled (0: none). */
int accel__device_sim_count(void);
/* The simulated GPU `index` (one process-wide handle each, made on first open).
 * ACCEL_EUNSUPPORTED when the simulation is off or there is no such GPU. */
accel_status accel__device_sim_open(accel__device **out, int index);
/* 1 when d is a simulated GPU. */
int accel__device_is_sim(const accel__device *d);
/*
 * A host-written "kernel": fn(arg) runs in the order of stream s (NULL: the compute stream),
 * when that stream's work is executed, with device memory readable and writable by plain
 * loads and stores. fn must not call the device seam. ACCEL_EUNSUPPORTED when d is not
 * simulated.
 */
accel_status accel__sim_launch(accel__device *d, accel__stream *s, void (*fn)(void *arg),
                               void *arg);

#endif /* ACCEL_DEVICE_SIM_H */
