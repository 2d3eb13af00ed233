/*
 * Resharding: pure functions over the pieces a tensor was saved in. A sharded checkpoint holds
 * each tensor as pieces (contiguous element ranges of its row-major flattening, one per
 * process that owned part of it); a load asks for any range (a whole tensor at stage 0, the
 * part a process owns under a stage and process count that may differ from the saver's). These
 * functions check that saved pieces tile the tensor and list the copies that fill a wanted
 * range, so the mapping between any two geometries is one tested place.
 */
#ifndef ACCEL_CKPT_RESHARD_H
#define ACCEL_CKPT_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "accel/status.h"

/* A saved piece: elements [offset, offset + count) of its tensor, from source `src` (a shard
 * file, a process: the caller's index). */
typedef struct accel__piece {
    int64_t offset, count;
    int src;
    size_t src_index; /* the caller's: which tensor of the source */
} accel__piece;

/* One copy of a reshard: `count` elements from element `src_elem` of piece `piece` to element
 * `dst_elem` of the wanted range. */
typedef struct accel__piece_copy {
    size_t piece;
    int64_t src_elem, dst_elem, count;
} accel__piece_copy;

/* Sorts pieces by offset (dropping none; empty pieces sort first). */
void accel__pieces_sort(accel__piece *p, size_t n);

/*
 * Whether sorted pieces tile [0, total) exactly (every element in exactly one piece, empty
 * pieces ignored). Returns 1, else 0 with *bad_at the first element missing or held twice and
 * *overlap 1 when held twice.
 */
int accel__pieces_tile(const accel__piece *p, size_t n, int64_t total, int64_t *bad_at,
                       int *overlap);

/*
 * The copies filling elements [want, want + count) from sorted, tiling pieces, in element
 * order: calls emit(ctx, copy) for each and returns the first failure of emit, or ACCEL_OK.
 * ACCEL_EINVAL (no message) when the range is not inside the pieces. O(log n + copies).
 */
accel_status accel__reshard(const accel__piece *p, size_t n, int64_t want, int64_t count,
                            accel_status (*emit)(void *ctx, const accel__piece_copy *c), void *ctx);

#endif /* ACCEL_CKPT_RESHARD_H */
