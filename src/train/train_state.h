/*
 * Checkpoint access to state that lives in file-private structures of src/train (the
 * scheduler). Used by src/ckpt/state*.c; the structures themselves stay private.
 */
#ifndef ACCEL_TRAIN_STATE_H
#define ACCEL_TRAIN_STATE_H

#include "accel/accel.h"

/* Everything a scheduler needs to continue exactly where it was (torch's state_dict). */
typedef struct accel__sched_state {
    int kind; /* accel_schedule_kind */
    int n_groups;
    long long last_epoch; /* ticks taken */
    long long step_count; /* torch _step_count */
    double base_lr[ACCEL_OPTIM_MAX_GROUPS];
    double last_lr[ACCEL_OPTIM_MAX_GROUPS];
} accel__sched_state;

void accel__scheduler_get_state(const accel_scheduler *s, accel__sched_state *out);
/* Restores the counters and lrs (and writes last_lr into the optimizer's groups). The caller
 * has checked kind and n_groups. */
void accel__scheduler_set_state(accel_scheduler *s, const accel__sched_state *in);

#endif /* ACCEL_TRAIN_STATE_H */
