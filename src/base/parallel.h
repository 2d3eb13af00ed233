/*
 * A parallel loop for bulk memory work (checksums of checkpoint files, copies of loaded state):
 * threads started for the call and joined before it returns, so nothing outlives it and a fork
 * never inherits a pool (OpenMP's pool hangs a forked child that uses it).
 */
#ifndef ACCEL_BASE_PARALLEL_H
#define ACCEL_BASE_PARALLEL_H

#include <stddef.h>

/* Runs fn(ctx, i) for every i in [0, n), each exactly once, on the calling thread and up to 7
 * more: one per CPU this process may run on (its affinity mask, which accel launch sets per
 * process), but only when the work is worth a thread (nbytes, the bytes the loop touches, over
 * 32 MiB). Never fails: a thread that cannot start leaves its share to the others. */
void accel__parallel_for(size_t n, size_t nbytes, void (*fn)(void *ctx, size_t i), void *ctx);

#endif /* ACCEL_BASE_PARALLEL_H */
