/*
 * Resharding (src/ckpt/reshard.h) between two flat geometries (src/train/flat.h): a model
 * saved by N1 processes at stage s1 (each process's pieces of each parameter, as the model's
 * state_save puts them) loads on N2 processes at stage s2, for N1, N2 in 1..4, stage 0 (one
 * whole piece per parameter) and sharded (pieces of every bucket), parameters with odd element
 * counts and buckets of several parameters: every element of every process's new part comes
 * from the right element of the right saved piece. Also the refusals: a gap, an overlap, a
 * range outside the tensor.
 */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "ckpt/reshard.h"
#include "train/flat.h"

#define MAX_PARAMS 8

typedef struct geometry {
    accel__flat flat;
    size_t offset[MAX_PARAMS];
    int bucket[MAX_PARAMS];
    int n_ranks; /* processes */
    int sharded;
} geometry;

static void build(geometry *g, const size_t *numel, int n, int n_ranks, int sharded)
{
    accel__flat_param fp[MAX_PARAMS];
    for (int i = 0; i < n; i++) {
        fp[i] = (accel__flat_param){numel[i], 0};
    }
    int groups = sharded ? n_ranks : 1;
    /* Small buckets (in fp32 bytes), so buckets hold one to a few parameters. */
    CHECK_OK(NULL, accel__flat_build(&g->flat, fp, n, 40.0, 96.0, groups,
                                     sharded ? (size_t)groups * 16 : 1, g->offset, g->bucket));
    g->n_ranks = n_ranks;
    g->sharded = sharded;
}

/* The part of parameter i a process owns: as accel__zero_param_part defines it (stage 0: the
 * whole parameter, held by process 0 for saving). Returns the element offset in the
 * parameter; *count 0 when it owns none. *shard_index: where it starts in the process's shard
 * (sharded) or flat buffer (stage 0). */
static int64_t part(const geometry *g, int i, const size_t *numel, int rank, int64_t *count,
                    size_t *shard_index)
{
    if (!g->sharded) {
        *count = rank == 0 ? (int64_t)numel[i] : 0;
        *shard_index = g->offset[i];
        return 0;
    }
    size_t off, cnt;
    accel__flat_piece(&g->flat, g->bucket[i], rank, &off, &cnt);
    size_t lo = off > g->offset[i] ? off : g->offset[i];
    size_t hi = off + cnt < g->offset[i] + numel[i] ? off + cnt : g->offset[i] + numel[i];
    if (lo >= hi) {
        *count = 0;
        *shard_index = 0;
        return 0;
    }
    *count = (int64_t)(hi - lo);
    int r;
    accel__flat_to_shard(&g->flat, lo, &r, shard_index);
    CHECK(r == rank);
    return (int64_t)(lo - g->offset[i]);
}

static float value(int i, int64_t e)
{
    return (float)(i * 100000 + e);
}

typedef struct copy_ctx {
    float *dst;
    float *const *src_bufs; /* per saving process: its shard (or flat buffer) */
    const accel__piece *pieces;
} copy_ctx;

static accel_status emit(void *ctx, const accel__piece_copy *c)
{
    copy_ctx *x = ctx;
    const accel__piece *p = &x->pieces[c->piece];
    memcpy(x->dst + c->dst_elem, x->src_bufs[p->src] + p->src_index + c->src_elem,
           (size_t)c->count * sizeof(float));
    return ACCEL_OK;
}

static void check_move(const size_t *numel, int n, int n1, int s1, int n2, int s2)
{
    geometry a, b;
    build(&a, numel, n, n1, s1);
    build(&b, numel, n, n2, s2);
    /* The saving processes' buffers, filled through the geometry. */
    size_t len_a = s1 ? accel__flat_shard_numel(&a.flat) : a.flat.padded_numel;
    float *bufs[4];
    for (int r = 0; r < n1; r++) {
        bufs[r] = calloc(len_a, sizeof(float));
        for (int i = 0; i < n; i++) {
            int64_t cnt;
            size_t at;
            int64_t e0 = part(&a, i, numel, r, &cnt, &at);
            for (int64_t e = 0; e < cnt; e++) {
                bufs[r][at + (size_t)e] = value(i, e0 + e);
            }
        }
    }
    for (int i = 0; i < n; i++) {
        /* The pieces the folder holds for parameter i (empty ones included, as saved). */
        accel__piece pieces[4];
        int covered = 0;
        for (int r = 0; r < n1; r++) {
            int64_t cnt;
            size_t at;
            int64_t e0 = part(&a, i, numel, r, &cnt, &at);
            pieces[r] = (accel__piece){e0, cnt, r, at};
            covered += cnt > 0;
        }
        CHECK(covered >= 1);
        accel__pieces_sort(pieces, (size_t)n1);
        int64_t bad;
        int overlap;
        CHECK(accel__pieces_tile(pieces, (size_t)n1, (int64_t)numel[i], &bad, &overlap));
        /* Every loading process's part (stage 0: every process loads the whole parameter). */
        for (int r = 0; r < n2; r++) {
            int64_t cnt = (int64_t)numel[i];
            size_t at;
            int64_t e0 = s2 ? part(&b, i, numel, r, &cnt, &at) : 0;
            float *dst = calloc((size_t)cnt + 1, sizeof(float));
            copy_ctx x = {dst, bufs, pieces};
            CHECK_OK(NULL, accel__reshard(pieces, (size_t)n1, e0, cnt, emit, &x));
            for (int64_t e = 0; e < cnt; e++) {
                CHECK_MSG(dst[e] == value(i, e0 + e),
                          "N %d stage %d -> N %d stage %d: param %d element %lld on rank %d", n1,
                          s1, n2, s2, i, (long long)(e0 + e), r);
            }
            free(dst);
        }
    }
    for (int r = 0; r < n1; r++) {
        free(bufs[r]);
    }
    accel__flat_free(&a.flat);
    accel__flat_free(&b.flat);
}

static accel_status never(void *ctx, const accel__piece_copy *c)
{
    (void)ctx, (void)c;
    return ACCEL_OK;
}

int main(void)
{
    static const size_t sets[][MAX_PARAMS] = {
        {7, 13, 1, 33, 5}, {3}, {101, 1, 17, 9, 64, 2, 31}, {1, 1, 1}};
    static const int counts[] = {5, 1, 7, 3};
    int moves = 0;
    for (int s = 0; s < 4; s++) {
        for (int n1 = 1; n1 <= 4; n1++) {
            for (int n2 = 1; n2 <= 4; n2++) {
                for (int s1 = 0; s1 <= 1; s1++) {
                    for (int s2 = 0; s2 <= 1; s2++) {
                        check_move(sets[s], counts[s], n1, s1, n2, s2);
                        moves++;
                    }
                }
            }
        }
    }
    /* Refusals: a gap, an overlap, too few or too many elements, a range outside. */
    int64_t bad;
    int overlap;
    accel__piece gap[] = {{0, 4, 0, 0}, {5, 3, 1, 0}};
    CHECK(!accel__pieces_tile(gap, 2, 8, &bad, &overlap) && bad == 4 && !overlap);
    accel__piece twice[] = {{0, 4, 0, 0}, {3, 5, 1, 0}};
    CHECK(!accel__pieces_tile(twice, 2, 8, &bad, &overlap) && bad == 3 && overlap);
    accel__piece shortp[] = {{0, 0, 1, 0}, {0, 4, 0, 0}};
    CHECK(!accel__pieces_tile(shortp, 2, 8, &bad, &overlap) && bad == 4 && !overlap);
    CHECK(!accel__pieces_tile(shortp, 2, 3, &bad, &overlap) && bad == 3 && overlap);
    CHECK(accel__pieces_tile(shortp, 2, 4, &bad, &overlap));
    CHECK(accel__reshard(shortp, 2, 2, 3, never, NULL) == ACCEL_EINVAL);
    CHECK(accel__reshard(gap, 2, 2, 4, never, NULL) == ACCEL_EINVAL);
    CHECK(accel__reshard(gap, 2, 5, 3, never, NULL) == ACCEL_OK);
    printf("reshard: %d moves between geometries checked\n", moves);
    return 0;
}
