/*
 * A hub-style set of safetensors files written piece by piece (private to src/ckpt): the
 * split into files (huggingface_hub's rule), every header and every tensor's place are fixed
 * when the set is opened from the tensors' names, dtypes and shapes alone, so their bytes can
 * then arrive in any order and any number of pieces (streaming: a gathered unit at a time, a
 * shard file at a time) and the result is byte for byte what accel_save_sharded writes.
 *
 * Files: "<prefix>.safetensors", or "<prefix>-0000i-of-0000k.safetensors" plus
 * "<prefix>.safetensors.index.json"; each is written to a temporary sibling and only commit
 * fsyncs and renames them into place, writes the index last and removes stale files of an
 * earlier save in the folder.
 */
#ifndef ACCEL_CKPT_STSET_H
#define ACCEL_CKPT_STSET_H

#include <stddef.h>
#include <stdint.h>

#include "accel/ckpt.h"

typedef struct accel__stset accel__stset;

/* The header of a safetensors file of `tensors` (their data unused) as accel_safetensors_write
 * writes it (owned: accel__free), and where each tensor's bytes start in the file
 * (data_start[i], input order). Implemented in safetensors.c (the writer). */
accel_status accel__safetensors_header(const char *path, const accel_named_tensor *tensors,
                                       size_t n, const accel_kv *metadata, size_t n_metadata,
                                       char **header, size_t *hlen, uint64_t *data_start);

/* Opens the set of `tensors` (names and shapes borrowed until commit or abort; data unused) in
 * `dir` (created): max_shard_nbytes 0 means one file. Writes the headers. */
accel_status accel__stset_open(accel__stset **out, const char *dir, const char *prefix,
                               const accel_named_tensor *tensors, size_t n,
                               const accel_kv *metadata, size_t n_metadata,
                               uint64_t max_shard_nbytes);
/* Writes nbytes of tensor i's bytes starting at its byte `offset`. */
accel_status accel__stset_write(accel__stset *s, size_t i, uint64_t offset, const void *data,
                                size_t nbytes);
/* Puts every file in place (fsync, rename), writes the index, removes stale files, fsyncs the
 * folder; releases s. On failure the temporary files are removed. */
accel_status accel__stset_commit(accel__stset *s);
/* Removes the temporary files; releases s. Accepts NULL. */
void accel__stset_abort(accel__stset *s);

#endif /* ACCEL_CKPT_STSET_H */
