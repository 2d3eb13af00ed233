/*
 * accel__xxh3_copy (src/ckpt/hashcopy.c), its AVX2 path and its portable one: the checksum
 * fused with the copy equals libxxhash's XXH3_64bits for every length around the algorithm's
 * edges (240-byte short inputs, 64-byte stripes, 1024-byte scramble blocks, a 16 MiB
 * checkpoint block), at odd source offsets, with no segment, one whole segment, and many
 * segments of odd sizes and gaps; every segment's bytes reach their destination and nothing
 * around them is written.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "check.h"
#include "ckpt/hashcopy.h"

/* The portable path too, compiled here under another name (the library takes the AVX2 path
 * wherever the CPU has it). */
#define ACCEL_HASHCOPY_PORTABLE 1
#define accel__xxh3_copy portable_xxh3_copy
#include "ckpt/hashcopy.c"
#undef accel__xxh3_copy

typedef uint64_t (*hash_copy_fn)(const void *, size_t, const accel__copy_seg *, size_t);
static hash_copy_fn fns[2] = {accel__xxh3_copy, portable_xxh3_copy};

#define MAX_N ((size_t)16 << 20)
#define GUARD 64

static unsigned char *src, *dst;

/* Segments of layout `kind` over [0, n): 0 none, 1 all (to a 64-byte-aligned place), 2 many
 * of odd sizes with gaps, 3 all to a place 5 bytes past alignment. */
static size_t make_segs(int kind, size_t n, accel__copy_seg *segs, size_t max)
{
    size_t k = 0;
    if (kind == 1 || kind == 3) {
        segs[k++] = (accel__copy_seg){0, n, dst + GUARD + (kind == 3 ? 5 : 0)};
    } else if (kind == 2) {
        size_t off = 3, len = 1;
        while (off < n && k < max) {
            size_t m = off + len <= n ? len : n - off;
            segs[k] = (accel__copy_seg){off, m, dst + GUARD + off + 7}; /* a shifted place */
            k++;
            off += m + len % 5; /* gaps of 0 to 4 bytes */
            len = len * 3 + 1;  /* 1, 4, 13, ... past the stripes and blocks */
        }
    }
    return k;
}

static void check_one(size_t n, size_t at, int kind, int fn)
{
    accel__copy_seg segs[64];
    size_t k = make_segs(kind, n, segs, 64);
    size_t lim = n + 2 * GUARD + 64; /* every destination lies below */
    memset(dst, 0xa5, lim);
    uint64_t got = fns[fn](src + at, n, segs, k);
    uint64_t want = XXH3_64bits(src + at, n);
    CHECK_MSG(got == want, "%s: n %zu at %zu layout %d: %016llx, XXH3_64bits %016llx",
              fn ? "portable" : "library", n, at, kind, (unsigned long long)got,
              (unsigned long long)want);
    size_t covered = 0;
    for (size_t i = 0; i < k; i++) {
        CHECK_MSG(memcmp(segs[i].dst, src + at + segs[i].off, segs[i].nbytes) == 0,
                  "n %zu layout %d: segment %zu (%zu bytes at %zu) not copied", n, kind, i,
                  segs[i].nbytes, segs[i].off);
        covered += segs[i].nbytes;
    }
    /* Bytes written are exactly the segments' (the rest keeps its 0xa5 filling). */
    size_t changed = 0;
    for (size_t i = 0; i < lim; i++) {
        changed += dst[i] != 0xa5;
    }
    size_t same = 0;
    for (size_t i = 0; i < k; i++) {
        for (size_t j = 0; j < segs[i].nbytes; j++) {
            same += src[at + segs[i].off + j] == 0xa5;
        }
    }
    CHECK_MSG(changed + same == covered, "n %zu layout %d: %zu bytes written, %zu copied", n, kind,
              changed + same, covered);
}

int main(void)
{
    src = malloc(MAX_N + 64);
    dst = aligned_alloc(64, MAX_N + 2 * GUARD + 64);
    CHECK(src != NULL && dst != NULL);
    uint64_t x = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < MAX_N + 64; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (unsigned char)(x >> 56);
    }
    static const size_t sizes[] = {0,    1,    17,   64,   129,       239,    240,  241,
                                   255,  256,  257,  1023, 1024,      1025,   1087, 1088,
                                   1089, 2048, 4096, 4097, 65536 + 3, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t at = 0; at < 3; at++) {
            for (int kind = 0; kind < 4; kind++) {
                check_one(sizes[i], at * 13, kind, 0);
                check_one(sizes[i], at * 13, kind, 1);
            }
        }
    }
    /* A whole checkpoint block and one a stripe short (the large, streamed copies). */
    for (int kind = 0; kind < 4; kind++) {
        for (int fn = 0; fn < 2; fn++) {
            check_one(MAX_N, 0, kind, fn);
            check_one(MAX_N - 64, 64, kind, fn);
        }
    }
    free(src);
    free(dst);
    printf("test_ckpt_hashcopy: ok\n");
    return 0;
}
