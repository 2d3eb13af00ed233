/*
 * accel/accel.h - the umbrella header: every accel header except the optional nn toolkit
 * (accel/nn.h) and the CUDA interop header (accel/cuda.h). Each header it includes also
 * compiles on its own, with C99 or later (the library itself is C11).
 *
 *   core.h         the Accelerator: options, init, process state and control, prepare, seeds
 *   collectives.h  collectives on buffers and tensors, symmetric shared memory
 *   train.h        models as flat buffers, gradient sync, accumulation, optimizers, schedulers
 *   data.h         datasets, samplers, sharding over processes, the loader
 *   ckpt.h         safetensors, save_model / load_model, save_state / load_state
 *   track.h        trackers, loggers, progress bar, profiler
 *   check.h        ACCEL_CHECK for programs (prints status, message and file:line, exits)
 */
#ifndef ACCEL_ACCEL_H
#define ACCEL_ACCEL_H

#include "status.h"
#include "tensor.h"
#include "core.h"
#include "collectives.h"
#include "train.h"
#include "data.h"
#include "ckpt.h"
#include "track.h"
#include "check.h"

#endif /* ACCEL_ACCEL_H */
