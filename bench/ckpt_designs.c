/*
 * The designs evaluated for checksum verification on load (issue 11, docs/performance.md
 * "Checkpoint checksums"), each loading one file that is in the page cache into an existing
 * buffer of its size, on one thread, timed in CPU time (best of REPS):
 *   plain          map the file, copy it (16 MiB pieces, as the loader does)
 *   hash, copy     map, XXH3 every 16 MiB block, then copy (what accel_load_state does)
 *   fused          map, for each 256 KiB chunk XXH3 it and copy it at once (NOT safe: a damaged
 *                  late chunk would find the early ones written; the ceiling of fusing)
 *   remap 4K/2M    map, copy each chunk into new anonymous pages and XXH3 it there, then mremap
 *                  the new pages over the destination (safe: nothing is written before all
 *                  hashes are known; 2M: the new pages with MADV_HUGEPAGE)
 *   populate       as "hash, copy" / "plain" with MADV_POPULATE_READ first (no fault traps)
 * and prints each one's throughput kept against plain.
 *   usage: bench/ckpt_designs [--mb MB] [--dir DIR] [--reps N]   (default 300 MB in ., 7)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older headers lack it */
#endif

#define PIECE ((size_t)16 << 20)
#define CHUNK ((size_t)256 << 10)

enum { PLAIN, HASH_COPY, FUSED, REMAP_4K, REMAP_2M, POP_HASH_COPY, POP_PLAIN, N_DESIGNS };

static const char *names[N_DESIGNS] = {
    "plain (map, copy)", "hash, then copy",      "fused (unsafe)", "remap 4K pages",
    "remap 2M pages",    "populate, hash, copy", "populate, copy",
};

static volatile uint64_t sink; /* keeps the hashes */

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Loads the n bytes of fd into *dst by `design`; 0 on success. The remap designs replace the
 * pages of *dst (same address). */
static int load(int design, int fd, char *dst, size_t n)
{
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    static int populate_failed;
    if ((design == POP_HASH_COPY || design == POP_PLAIN) && !populate_failed &&
        madvise(p, n, MADV_POPULATE_READ) != 0) {
        populate_failed = 1; /* a kernel before 5.14 */
        fprintf(stderr,
                "bench/ckpt_designs: MADV_POPULATE_READ: %s (the populate rows are the "
                "rows without it)\n",
                strerror(errno));
    }
    if (design == HASH_COPY || design == POP_HASH_COPY) {
        for (size_t o = 0; o < n; o += PIECE) {
            sink += XXH3_64bits(p + o, min_sz(PIECE, n - o));
        }
    }
    if (design == PLAIN || design == HASH_COPY || design == POP_HASH_COPY || design == POP_PLAIN) {
        for (size_t o = 0; o < n; o += PIECE) {
            memcpy(dst + o, p + o, min_sz(PIECE, n - o));
        }
    } else if (design == FUSED) {
        for (size_t o = 0; o < n; o += CHUNK) {
            sink += XXH3_64bits(p + o, min_sz(CHUNK, n - o));
            memcpy(dst + o, p + o, min_sz(CHUNK, n - o));
        }
    } else {
        char *s = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        (void)madvise(s, n, design == REMAP_2M ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        for (size_t o = 0; o < n; o += CHUNK) {
            memcpy(s + o, p + o, min_sz(CHUNK, n - o));
            sink += XXH3_64bits(s + o, min_sz(CHUNK, n - o));
        }
        if (mremap(s, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == MAP_FAILED) {
            perror("mremap");
            return 1;
        }
    }
    munmap(p, n);
    return 0;
}

int main(int argc, char **argv)
{
    size_t mb = 300;
    const char *dir = ".";
    int reps = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mb") == 0) {
            mb = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--dir") == 0) {
            dir = argv[i + 1];
        } else if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[i + 1]);
        }
    }
    size_t n = (mb ? mb : 1) << 20;
    char path[600];
    snprintf(path, sizeof path, "%s/bench_ckpt_designs.bin", dir);
    /* The destination: page-aligned anonymous memory, touched, as the model's flat buffers. */
    char *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (dst == MAP_FAILED || fd < 0) {
        fprintf(stderr, "bench/ckpt_designs: cannot set up %s\n", path);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        dst[i] = (char)(i * 2654435761u >> 13); /* real pages, not zero pages */
    }
    if (write(fd, dst, n) != (ssize_t)n) {
        fprintf(stderr, "bench/ckpt_designs: cannot write %s\n", path);
        return 1;
    }
    double best[N_DESIGNS];
    for (int d = 0; d < N_DESIGNS; d++) {
        best[d] = 1e30;
    }
    for (int r = 0; r < reps; r++) {
        for (int d = 0; d < N_DESIGNS; d++) {
            double c0 = cpu_seconds();
            if (load(d, fd, dst, n) != 0) {
                return 1;
            }
            double c = cpu_seconds() - c0;
            best[d] = c < best[d] ? c : best[d];
        }
    }
    close(fd);
    unlink(path);
    printf("one thread, %zu MB in the page cache, CPU time, best of %d:\n", mb, reps);
    for (int d = 0; d < N_DESIGNS; d++) {
        printf("  %-22s %8.1f ms  kept %.2f\n", names[d], best[d] * 1e3, best[PLAIN] / best[d]);
    }
    return 0;
}
