/*
 * What the safetensors writer (safetensors.c) and reader (safetensors_read.c) share (private
 * to src/ckpt).
 */
#ifndef ACCEL_CKPT_SAFETENSORS_H
#define ACCEL_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "accel/ckpt.h"

/* The reference reader's limit on the JSON header. */
#define ACCEL__ST_MAX_HEADER_NBYTES 100000000ull

/* The bytes of `ndim` dims of `dt` into *nbytes, as the reference sizes them: 0 when the
 * product overflows, -1 when sub-byte elements do not fill whole bytes, else 1. */
int accel__st_tensor_bytes(accel_dtype dt, int ndim, const int64_t *shape, uint64_t *nbytes);

/* accel_safetensors_open of `path` from `map`, a private writable mapping of its `map_nbytes`
 * bytes (taken: owned from here, whatever the result), as kept by accel__ckpt_verify. */
accel_status accel__safetensors_open_map(accel_safetensors **out, const char *path, void *map,
                                         size_t map_nbytes);

#endif /* ACCEL_CKPT_SAFETENSORS_H */
