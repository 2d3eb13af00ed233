/*
 * The completion marker of a checkpoint folder and the verification of the folder against it
 * (private to src/ckpt): one place that decides whether a folder may be loaded, so that
 * save_state's loader (and, later, whatever speaks the state protocol) only asks.
 *
 * Marker version 2 (written now) lists every file with its size and checksum (XXH3-64 over
 * 16 MiB blocks, docs/checkpoint.md) and carries its own checksum; version 1 (written before
 * checksums existed) lists sizes only and still loads, without content verification. Every
 * field is range-checked on read.
 *
 * All functions report failures through accel__seterr(NULL, ...) naming the folder and file.
 */
#ifndef ACCEL_CKPT_VERIFY_H
#define ACCEL_CKPT_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "accel/status.h"

/* The completion marker written last into every checkpoint folder. */
#define ACCEL__CKPT_MARKER "accel_checkpoint.json"
/* The marker version this library writes; it reads 1 and 2. */
#define ACCEL__CKPT_VERSION 2
/* A file's checksum is the XXH3-64 of the XXH3-64s of its blocks of this size. */
#define ACCEL__CKPT_BLOCK ((size_t)16 << 20)

typedef struct accel__ckpt_file {
    char *name; /* a plain file name inside the folder */
    int64_t nbytes;
    uint64_t xxh3; /* valid when the marker has checksums (version >= 2) */
    /* The private, writable mapping whose bytes were checksummed (NULL: none kept), owned
     * until accel__ckpt_marker_take_map hands it over: loading from it reads the disk once. */
    void *map;
    size_t map_nbytes;
    /* The mapping handed over (by accel__ckpt_marker_take_map; NULL: none), still alive in its
     * loader: loads copy from it, so a copy's source tells which file it reads. */
    const unsigned char *lent;
    size_t lent_nbytes;
    int deferred; /* its checksum is not checked yet (accel__ckpt_verify_deferred) */
    int fused;    /* it is checked while its bytes are copied (accel__ckpt_copy_verified) */
    int apart;    /* never fused: checked before anything is written (accel__ckpt_keep_apart) */
} accel__ckpt_file;

typedef struct accel__ckpt_marker {
    int version;
    int has_checksums;
    accel__ckpt_file *files; /* n_files >= 1, sorted by name */
    size_t n_files;
} accel__ckpt_marker;

/* The marker text for folder `dir`: every regular file but the marker and hidden or temporary
 * ones, with size and checksum, plus `extra` (a JSON object text merged in; may be NULL).
 * *text is owned: free() (jansson's allocator). */
accel_status accel__ckpt_marker_build(const char *dir, const char *extra, char **text);

/* Reads and range-checks dir's marker (format, version, a non-empty file list of plain names
 * with sizes, and checksums from version 2 on). ACCEL_ECORRUPT naming the folder and what is
 * wrong; ACCEL_ENOTFOUND when `dir` does not exist. Release with accel__ckpt_marker_release. */
accel_status accel__ckpt_marker_read(const char *dir, accel__ckpt_marker *m);
void accel__ckpt_marker_release(accel__ckpt_marker *m);
/* The entry for `name`, or NULL when the marker does not list it. */
const accel__ckpt_file *accel__ckpt_marker_find(const accel__ckpt_marker *m, const char *name);
/* Hands over the kept mapping of `name` (its bytes are the verified ones): 1 and *map, *nbytes
 * (owned: munmap) when accel__ckpt_verify kept one, else 0. */
int accel__ckpt_marker_take_map(const accel__ckpt_marker *m, const char *name, void **map,
                                size_t *nbytes);

/* The marker is valid and every listed file is a regular file of the recorded size (cheap: no
 * file is read). ACCEL_ECORRUPT naming the folder and file, ACCEL_ENOTFOUND: no folder. */
accel_status accel__ckpt_check_complete(const char *dir);

/* As accel__ckpt_check_complete, then the checksums of the listed files i with
 * i % n_shares == share (processes of one machine share the reading); a version-1 marker has
 * none to check. ACCEL_ECORRUPT naming the folder and the first file whose bytes differ. The
 * marker read is returned in *m when m is not NULL (release it); it then keeps the mappings
 * of the files checksummed here, so that loading them reads the bytes verified, while they are
 * in the page cache (accel__ckpt_marker_take_map). */
accel_status accel__ckpt_verify(const char *dir, int share, int n_shares, accel__ckpt_marker *m);

/*
 * The fused load (docs/checkpoint.md, "Fast verified loads"): checksums checked while the bytes
 * are copied into the live buffers, so that a verified load reads memory once. Only for a live
 * state that has nothing to lose: a damaged file is found after some bytes were written.
 *
 * accel__ckpt_verify_deferred is accel__ckpt_verify with the checksums of the .safetensors
 * files deferred: every one is mapped (kept in *m for the loader: take_map) and marked
 * deferred; the other files of this process's share are checked now.
 */
accel_status accel__ckpt_verify_deferred(const char *dir, int share, int n_shares,
                                         accel__ckpt_marker *m);

/* Keeps file `name` of m out of the fused pass (its checksum is then checked before anything
 * is written): for state a later successful load might not overwrite (per-process gradients
 * saved inside an accumulation window). No-op for a name m does not list. */
void accel__ckpt_keep_apart(accel__ckpt_marker *m, const char *name);

/* A copy a loader plans: nbytes from src (inside a file's mapping or elsewhere) to dst. */
typedef struct accel__ckpt_copy {
    void *dst;
    const void *src;
    size_t nbytes;
} accel__ckpt_copy;

/* Once the loader planned its copies (after accel__ckpt_verify_deferred): every deferred file
 * whose lent mapping holds the source of one of the n copies is marked fused (checked by
 * accel__ckpt_copy_verified); the other deferred files of this process's share are checked
 * now. Nothing is written. ACCEL_ECORRUPT naming the folder and the first damaged file. */
accel_status accel__ckpt_verify_rest(const char *dir, accel__ckpt_marker *m, int share,
                                     int n_shares, const accel__ckpt_copy *copies, size_t n);

/* Runs every copy whose source lies in a fused file of m (sets done[i] = 1 for those), each
 * fused file hashed in the same pass (hashcopy.h), blocks spread over the process's CPUs; the
 * other copies are left to the caller. ACCEL_ECORRUPT naming the folder and the first damaged
 * file: the copies were made all the same (the caller must treat the live state as partly
 * loaded). */
accel_status accel__ckpt_copy_verified(const char *dir, const accel__ckpt_marker *m,
                                       const accel__ckpt_copy *copies, size_t n,
                                       unsigned char *done);

#endif /* ACCEL_CKPT_VERIFY_H */
