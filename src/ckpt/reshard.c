/*
 * Resharding (reshard.h): which saved pieces fill a wanted element range. Invariant: the
 * pieces handed to accel__reshard are sorted and tile their tensor (the loader checks with
 * accel__pieces_tile before any copy is planned), so a range maps to consecutive pieces.
 */
#include <stdlib.h>

#include "ckpt/reshard.h"

static int cmp_piece(const void *a, const void *b)
{
    const accel__piece *x = a, *y = b;
    if (x->count == 0 || y->count == 0) {
        return (x->count != 0) - (y->count != 0); /* empty pieces first */
    }
    return (x->offset > y->offset) - (x->offset < y->offset);
}

void accel__pieces_sort(accel__piece *p, size_t n)
{
    if (n > 1) {
        qsort(p, n, sizeof(*p), cmp_piece);
    }
}

int accel__pieces_tile(const accel__piece *p, size_t n, int64_t total, int64_t *bad_at,
                       int *overlap)
{
    int64_t next = 0; /* the first element not yet covered */
    for (size_t i = 0; i < n; i++) {
        if (p[i].count == 0) {
            continue;
        }
        if (p[i].offset != next) {
            *bad_at = p[i].offset < next ? p[i].offset : next;
            *overlap = p[i].offset < next;
            return 0;
        }
        next += p[i].count;
    }
    if (next != total) {
        *bad_at = next < total ? next : total;
        *overlap = next > total;
        return 0;
    }
    return 1;
}

accel_status accel__reshard(const accel__piece *p, size_t n, int64_t want, int64_t count,
                            accel_status (*emit)(void *ctx, const accel__piece_copy *c), void *ctx)
{
    if (count == 0) {
        return ACCEL_OK;
    }
    /* The first piece ending after `want` (binary search over the sorted, tiling pieces). */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p[mid].count == 0 || p[mid].offset + p[mid].count <= want) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    int64_t at = want, end = want + count;
    for (size_t i = lo; i < n && at < end; i++) {
        if (p[i].offset > at) {
            return ACCEL_EINVAL; /* a hole: not a tiling */
        }
        int64_t stop = p[i].offset + p[i].count < end ? p[i].offset + p[i].count : end;
        accel__piece_copy c = {i, at - p[i].offset, at - want, stop - at};
        accel_status st = emit(ctx, &c);
        if (st != ACCEL_OK) {
            return st;
        }
        at = stop;
    }
    return at == end ? ACCEL_OK : ACCEL_EINVAL;
}
