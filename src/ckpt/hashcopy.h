/*
 * XXH3-64 of a buffer computed in the same pass that copies parts of it elsewhere (private to
 * src/ckpt): each 64-byte stripe is read from memory once, hashed in registers and stored, so
 * verifying bytes while loading them costs no second read of memory (docs/performance.md,
 * "Checkpoint checksums"). The result is bit-identical to libxxhash's XXH3_64bits of the whole
 * buffer.
 */
#ifndef ACCEL_CKPT_HASHCOPY_H
#define ACCEL_CKPT_HASHCOPY_H

#include <stddef.h>
#include <stdint.h>

/* Bytes [off, off + nbytes) of the hashed buffer go to dst. */
typedef struct accel__copy_seg {
    size_t off;
    size_t nbytes;
    void *dst;
} accel__copy_seg;

/* XXH3_64bits(src, n), copying src[seg.off .. seg.off + seg.nbytes) to seg.dst for each of the
 * n_segs segments on the way (sorted by off, not overlapping each other, inside [0, n), their
 * destinations not overlapping src). Thread-safe. */
uint64_t accel__xxh3_copy(const void *src, size_t n, const accel__copy_seg *segs, size_t n_segs);

#endif /* ACCEL_CKPT_HASHCOPY_H */
