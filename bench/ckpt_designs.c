/*
 * The designs evaluated for checksum verification on load (issue 11, docs/performance.md
 * "Checkpoint checksums"), each loading one file into an existing buffer of its size:
 *   plain          map the file, copy it (16 MiB pieces, as the loader does): the baseline
 *   hash, copy     map, XXH3 every 16 MiB block, then copy (the two-pass verified load)
 *   fused          map, for each 256 KiB chunk XXH3 it and copy it at once (writes the
 *                  destination before the verdict, as every fused design)
 *   fused 1-pass   map, each 16 MiB block hashed in the copy loop itself (accel__xxh3_copy:
 *                  every 64-byte stripe read from memory once, hashed, stored)
 *   plain, streaming stores   plain with non-temporal stores (accel__copy_nt), as the loader
 *                  copies now: the baseline for what the hash costs
 *   hash, streaming copy   hash, then copy with streaming stores (the two-pass verified load
 *                  as the loader does it now)
 *   remap 4K/2M    map, copy each chunk into new anonymous pages and XXH3 it there, then mremap
 *                  the new pages over the destination (safe: nothing is written before all
 *                  hashes are known; 2M: the new pages with MADV_HUGEPAGE)
 *   populate       as "hash, copy" / "plain" with MADV_POPULATE_READ first (no fault traps)
 * Every round runs each design once, the order rotating from round to round (so drift in the
 * machine's load hits all alike); each design's time is its median over the rounds with the
 * range, and "kept" is plain's median / its median (1.00 = as fast as the unverified load).
 * Warm (default): the file stays in the page cache, CPU time of the process (all threads; the
 * steadier measure on a shared machine). --cold 1: the file is evicted (POSIX_FADV_DONTNEED)
 * before every load, wall time. --threads 0: the 16 MiB pieces spread over the process's CPUs
 * (accel__parallel_for, as the loader), default 1: one thread. --skew B: the destination starts
 * B bytes past a page (the loader's buffers are not aligned with the file's tensor data).
 *   usage: bench/ckpt_designs [--mb MB] [--dir DIR] [--reps N] [--cold 0|1] [--threads 0|1]
 *          [--skew B] [--designs LIST]   (default 300 MB in ., 9 rounds; LIST: design numbers
 *          as printed, comma-separated, plain always included)
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

#include "base/parallel.h"
#include "bench.h"
#include "ckpt/hashcopy.h"
#include "comm/reduce.h"
#include "core/internal.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older headers lack it */
#endif

#define PIECE ((size_t)16 << 20)
#define CHUNK ((size_t)256 << 10)
#define MAX_REPS 64

enum {
    PLAIN,
    HASH_COPY,
    FUSED,
    FUSED_1PASS,
    REMAP_4K,
    REMAP_2M,
    POP_HASH_COPY,
    POP_PLAIN,
    PLAIN_NT,
    HASH_COPY_NT,
    N_DESIGNS
};

static const char *names[N_DESIGNS] = {
    "plain (map, copy)",       "hash, then copy",      "fused 256K chunks",    "fused 1-pass",
    "remap 4K pages",          "remap 2M pages",       "populate, hash, copy", "populate, copy",
    "plain, streaming stores", "hash, streaming copy",
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

/* One load: the 16 MiB pieces of src (n bytes) into dst, by design. */
typedef struct job {
    int design;
    const char *src;
    char *dst;
    size_t n;
    uint64_t *sums; /* per piece */
} job;

static void piece(void *ctx, size_t i)
{
    const job *j = ctx;
    size_t o = i * PIECE, len = min_sz(PIECE, j->n - o);
    const char *p = j->src + o;
    char *d = j->dst + o;
    uint64_t h = 0;
    switch (j->design) {
    case HASH_COPY:
    case HASH_COPY_NT:
    case POP_HASH_COPY:
        h = XXH3_64bits(p, len); /* the copy waits for every piece: second pass below */
        break;
    case FUSED: {
        XXH3_state_t *st = XXH3_createState();
        XXH3_64bits_reset(st);
        for (size_t c = 0; c < len; c += CHUNK) {
            XXH3_64bits_update(st, p + c, min_sz(CHUNK, len - c));
            memcpy(d + c, p + c, min_sz(CHUNK, len - c));
        }
        h = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        break;
    }
    case PLAIN_NT:
        accel__copy_nt(d, p, len);
        break;
    case FUSED_1PASS: {
        accel__copy_seg seg = {0, len, d};
        h = accel__xxh3_copy(p, len, &seg, 1);
        break;
    }
    default:
        memcpy(d, p, len);
    }
    j->sums[i] = h;
}

static void copy_piece(void *ctx, size_t i)
{
    const job *j = ctx;
    size_t o = i * PIECE;
    if (j->design == HASH_COPY_NT) {
        accel__copy_nt(j->dst + o, j->src + o, min_sz(PIECE, j->n - o));
    } else {
        memcpy(j->dst + o, j->src + o, min_sz(PIECE, j->n - o));
    }
}

static void run(size_t n_pieces, size_t nbytes, int threads, void (*fn)(void *, size_t), job *j)
{
    if (threads == 1) {
        for (size_t i = 0; i < n_pieces; i++) {
            fn(j, i);
        }
    } else {
        accel__parallel_for(n_pieces, nbytes, fn, j);
    }
}

/* Loads the n bytes of fd into dst by `design`; 0 on success. The remap designs replace the
 * pages of dst (same address); they run on one thread. */
static int load(int design, int fd, char *dst, size_t n, int threads, uint64_t *sums)
{
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    (void)madvise(p, n, MADV_SEQUENTIAL); /* as the loader's mapping */
    static int populate_failed;
    if ((design == POP_HASH_COPY || design == POP_PLAIN) && !populate_failed &&
        madvise(p, n, MADV_POPULATE_READ) != 0) {
        populate_failed = 1; /* a kernel before 5.14 */
        fprintf(stderr,
                "bench/ckpt_designs: MADV_POPULATE_READ: %s (the populate rows are the "
                "rows without it)\n",
                strerror(errno));
    }
    size_t n_pieces = (n + PIECE - 1) / PIECE;
    job j = {design, p, dst, n, sums};
    if (design == REMAP_4K || design == REMAP_2M) {
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
    } else {
        run(n_pieces, n, threads, piece, &j);
        if (design == HASH_COPY || design == HASH_COPY_NT || design == POP_HASH_COPY) {
            run(n_pieces, n, threads, copy_piece, &j);
        }
    }
    for (size_t i = 0; i < n_pieces; i++) {
        sink += sums[i];
    }
    munmap(p, n);
    return 0;
}

static void evict(int fd)
{
    (void)fdatasync(fd);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

int main(int argc, char **argv)
{
    size_t mb = 300, skew = 0;
    const char *dir = ".", *list = NULL;
    int reps = 9, cold = 0, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mb") == 0) {
            mb = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--dir") == 0) {
            dir = argv[i + 1];
        } else if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--cold") == 0) {
            cold = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--threads") == 0) {
            threads = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--skew") == 0) {
            skew = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--designs") == 0) {
            list = argv[i + 1];
        } else {
            fprintf(stderr, "bench/ckpt_designs: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    int on[N_DESIGNS] = {0}, n_on = 0, order[N_DESIGNS];
    for (int d = 0; d < N_DESIGNS; d++) {
        on[d] = list == NULL || d == PLAIN;
    }
    for (const char *c = list; c != NULL && *c != '\0'; c++) {
        if (*c >= '0' && *c <= '9' && *c - '0' < N_DESIGNS) {
            on[*c - '0'] = 1;
        }
    }
    for (int d = 0; d < N_DESIGNS; d++) {
        if (on[d]) {
            order[n_on++] = d;
        }
    }
    size_t n = (mb ? mb : 1) << 20;
    char path[600];
    snprintf(path, sizeof path, "%s/bench_ckpt_designs.bin", dir);
    /* The destination: page-aligned anonymous memory (+ skew), touched, as the model's flat
     * buffers. */
    char *mem = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *sums = calloc(n / PIECE + 1, sizeof(uint64_t));
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (mem == MAP_FAILED || fd < 0 || sums == NULL || skew >= 4096) {
        fprintf(stderr, "bench/ckpt_designs: cannot set up %s (or --skew past 4095)\n", path);
        return 1;
    }
    char *dst = mem + skew;
    for (size_t i = 0; i < n; i++) {
        dst[i] = (char)(i * 2654435761u >> 13); /* real pages, not zero pages */
    }
    if (write(fd, dst, n) != (ssize_t)n) {
        fprintf(stderr, "bench/ckpt_designs: cannot write %s\n", path);
        return 1;
    }
    static double t[N_DESIGNS][MAX_REPS];
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < n_on; k++) {
            int d = order[(r + k) % n_on];
            if (cold) {
                evict(fd);
            }
            double c0 = cold ? accel__now() : cpu_seconds();
            if (load(d, fd, dst, n, threads, sums) != 0) {
                return 1;
            }
            t[d][r] = (cold ? accel__now() : cpu_seconds()) - c0;
        }
    }
    close(fd);
    unlink(path);
    printf("%zu MB, page cache %s, %s, %s, destination skew %zu B, median [min-max] of %d "
           "rounds (order rotating):\n",
           mb, cold ? "evicted before every load" : "warm", cold ? "wall time" : "CPU time",
           threads == 1 ? "one thread" : "the process's CPUs", skew, reps);
    double med[N_DESIGNS];
    for (int k = 0; k < n_on; k++) {
        int d = order[k];
        med[d] = bench_median(t[d], reps); /* sorts: t[d][0] is the min */
        printf("  %d %-22s %8.1f ms [%.1f-%.1f]  kept %.2f [%.2f-%.2f]\n", d, names[d],
               med[d] * 1e3, t[d][0] * 1e3, t[d][reps - 1] * 1e3, med[PLAIN] / med[d],
               med[PLAIN] / t[d][reps - 1], med[PLAIN] / t[d][0]);
    }
    return 0;
}
