/*
 * Accelerate's GradientState: whether this micro-step synchronises gradients, the micro-step
 * counter of accel_accumulate, and what the loaders being iterated report (the end of the
 * active loader, its duplicated tail). Owned and written only by src/train (gstate.c: the
 * accumulation rule lives there once); declared in core for the modules above that read it
 * or report to it without seeing train's internals: data's loaders, ckpt.
 *
 * It lives in the accelerator's ACCEL__MOD_GSTATE slot, created on first write
 * (accel__grad_state_open); accel_free_memory drops it, so the next run starts afresh. Before
 * it exists the getters return the initial state: sync 1, step 0, no active loader,
 * remainder -1.
 */
#ifndef ACCEL_CORE_GSTATE_H
#define ACCEL_CORE_GSTATE_H

#include "accel/status.h"

typedef struct accel accel;

int accel__grad_state_sync(const accel *acc);
long long accel__grad_state_step(const accel *acc);
int accel__grad_state_active_loaders(const accel *acc);
int accel__grad_state_end_of_dataloader(const accel *acc);
int accel__grad_state_remainder(const accel *acc);

/* Creates the state if needed: ACCEL_OK or ACCEL_ENOMEM. The writers below need it first
 * (a loader at prepare, load_state while validating), so that they cannot fail later. */
accel_status accel__grad_state_open(accel *acc);

/* A loader starts iterating an epoch: it becomes the active one (end 0, its remainder), and
 * what it replaced goes into *saved_end / *saved_remainder for accel__grad_state_loader_leave. */
void accel__grad_state_loader_enter(accel *acc, int remainder, int *saved_end,
                                    int *saved_remainder);
/* The active loader handed out a batch: `last` when it was its final one. */
void accel__grad_state_loader_batch(accel *acc, int last, int remainder);
/* It stopped iterating: the state it replaced comes back (the outer loader's, or none). */
void accel__grad_state_loader_leave(accel *acc, int saved_end, int saved_remainder);

/* A checkpoint's micro-step counter and sync flag (load_state's apply). */
void accel__grad_state_restore(accel *acc, long long step, int sync);

#endif /* ACCEL_CORE_GSTATE_H */
