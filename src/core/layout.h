/*
 * The process layout and the job's communicator, as accel_init reads and opens them
 * (core/layout.c): which process this is, on which machine, with which backend, meeting the
 * others where. Private to core: accel_init is the only caller.
 */
#ifndef ACCEL_CORE_LAYOUT_H
#define ACCEL_CORE_LAYOUT_H

#include "internal.h"
#include "settings.h"

typedef struct accel__layout {
    int rank, n_ranks, local_rank, local_n_ranks;
    int launched; /* a launcher set LOCAL_RANK (or equivalent): Accelerate's MULTI_CPU rule */
    int by_mpi;   /* the layout came from an MPI / Slurm launcher's variables */
} accel__layout;

/* Reads the layout from the first family of launcher variables (torchrun, Open MPI, MPICH,
 * MVAPICH, Slurm) whose world size, rank or local rank is set; one process when none is.
 * ACCEL_EINVAL names the variable that is out of range or inconsistent. */
accel_status accel__layout_read(accel__layout *l);

/* Adds the layout's four settings lines to set, each with the variable it came from. */
accel_status accel__layout_record(const accel__layout *l, accel__settings *set);

/* Sets acc->n_machines and acc->machine_rank: ACCEL_NUM_MACHINES and GROUP_RANK (accel
 * launch), else from acc's rank counts as equal machines. */
accel_status accel__layout_machines(accel *acc);

/* Chooses the backend (o->backend, ACCEL_BACKEND, else from l and acc's device) into
 * acc->backend, reads the rendezvous variables, records both in set and opens acc->comm.
 * Needs acc's device set up (accel__device_setup). On failure the thread error names why. */
accel_status accel__layout_comm_open(accel *acc, const accel_options *o, const accel__layout *l,
                                     accel__settings *set);

#endif
