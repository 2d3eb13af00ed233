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

typedef struct accel__ckpt_file {
    char *name; /* a plain file name inside the folder */
    int64_t nbytes;
    uint64_t xxh3; /* valid when the marker has checksums (version >= 2) */
    /* The private, writable mapping whose bytes were checksummed (NULL: none kept), owned
     * until accel__ckpt_marker_take_map hands it over: loading from it reads the disk once. */
    void *map;
    size_t map_nbytes;
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

#endif /* ACCEL_CKPT_VERIFY_H */
