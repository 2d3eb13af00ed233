/*
 * The flat geometry of a model (DESIGN.md §3): where each parameter lives in the flat buffers
 * (master, gradients, compute copy, optimizer state all share it), how the buffers are cut
 * into gradient buckets, and which piece of each bucket a rank owns once state is sharded.
 *
 * Fixed at accel_model_alloc. Parameters are laid out in reverse registration order (the
 * order a backward pass finishes them). Buckets are consecutive runs of parameters, closed by
 * size (DDP's compute_bucket_assignment_by_size: the first at first_nbytes, later ones at
 * cap_nbytes, counting from the first trainable parameter of the bucket); every parameter
 * belongs to exactly one bucket (a frozen one to the bucket of the next trainable parameter,
 * or the last bucket). Each bucket is padded with zeros to a multiple of `pad_unit` elements
 * (n_ranks * 16 for sharded stages: every bucket then splits into n_ranks equal pieces of a
 * multiple of 64 bytes; 1 for DDP, which needs no pieces), so the buffers hold padded_numel
 * elements. Rank r owns piece r of every bucket; its shard is the concatenation of its pieces
 * in bucket order (padded_numel / n_ranks elements), so a per-bucket reduce-scatter lands
 * exactly in the owners' shards and a per-bucket allgather restores the full buffer.
 * Padding elements are zero in every buffer and stay zero.
 */
#ifndef ACCEL_TRAIN_FLAT_H
#define ACCEL_TRAIN_FLAT_H

#include <stddef.h>

#include "accel/status.h"

typedef struct accel__flat_bucket {
    size_t offset;       /* first element of the bucket in the flat buffers */
    size_t count;        /* elements of its parameters */
    size_t padded;       /* count rounded up to the pad unit: it spans [offset, offset+padded) */
    size_t shard_offset; /* where each rank's piece of it starts in that rank's shard */
} accel__flat_bucket;

typedef struct accel__flat {
    size_t numel;        /* parameter elements */
    size_t padded_numel; /* elements of every flat buffer (numel + padding) */
    size_t pad_unit;
    int n_ranks;
    int n_buckets;
    accel__flat_bucket *buckets; /* in flat (= launch) order */
} accel__flat;

/* What the geometry needs to know about one parameter. */
typedef struct accel__flat_param {
    size_t numel;
    int frozen; /* not trainable when the geometry is built */
} accel__flat_param;

/*
 * Builds the geometry of n_params parameters given in REGISTRATION order (n_params >= 1,
 * every numel >= 1). first_nbytes / cap_nbytes: bucket closing sizes in bytes of fp32;
 * n_ranks >= 1; pad_unit >= 1 and a multiple of n_ranks. Writes each parameter's flat offset
 * into offsets[i] and its bucket into bucket[i] (registration index). Returns ACCEL_OK,
 * ACCEL_EINVAL for bad arguments (named), ACCEL_ENOMEM; *f is untouched on failure. Release
 * with accel__flat_free.
 */
accel_status accel__flat_build(accel__flat *f, const accel__flat_param *params, int n_params,
                               double first_nbytes, double cap_nbytes, int n_ranks, size_t pad_unit,
                               size_t *offsets, int *bucket);
/* The same with one bucket per unit (ZeRO stage 3, FSDP's FlatParameter per wrapped module):
 * unit_of[i] is parameter i's unit, runs of consecutive parameters numbered 0, 1, ... in
 * registration order (ACCEL_EINVAL otherwise); the last unit is bucket 0. */
accel_status accel__flat_build_units(accel__flat *f, const accel__flat_param *params, int n_params,
                                     const int *unit_of, int n_ranks, size_t pad_unit,
                                     size_t *offsets, int *bucket);
void accel__flat_free(accel__flat *f);

/* Elements of one rank's shard: padded_numel / n_ranks. */
size_t accel__flat_shard_numel(const accel__flat *f);
/* Piece `rank` of bucket b: flat range [*offset, *offset + *count). */
void accel__flat_piece(const accel__flat *f, int b, int rank, size_t *offset, size_t *count);
/* Flat index of element `shard_index` (< shard numel) of rank's shard. */
size_t accel__flat_from_shard(const accel__flat *f, int rank, size_t shard_index);
/* The rank owning flat index `flat_index` (< padded_numel), and its index in that shard. */
void accel__flat_to_shard(const accel__flat *f, size_t flat_index, int *rank, size_t *shard_index);
/* The bucket holding flat index `flat_index` (< padded_numel). */
int accel__flat_bucket_of(const accel__flat *f, size_t flat_index);

#endif /* ACCEL_TRAIN_FLAT_H */
