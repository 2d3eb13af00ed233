/*
 * The fused load's checksums (verify.h): the deferred .safetensors files of a marker are
 * checked either on their own, before anything is written (accel__ckpt_verify_rest), or in the
 * same pass as the loader's copies out of them (accel__ckpt_copy_verified), block by block on
 * the process's CPUs, with the checksum of verify.c (XXH3-64 of the 16 MiB blocks' XXH3-64s).
 *
 * Invariant: every deferred file of this process's share is checked by one of the two, over
 * the bytes of the mapping its loader reads (fused: in the pass that copies them, hashcopy.h),
 * and a copy out of a fused file is made by that pass or, when it overlaps another, after the
 * verdict.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include "base/parallel.h"
#include "ckpt/hashcopy.h"
#include "ckpt/verify.h"
#include "core/internal.h"

/* One 16 MiB block of a file and the copies out of it. */
typedef struct block {
    const unsigned char *p; /* NULL for an empty file */
    size_t nbytes;
    accel__copy_seg *segs;
    size_t n_segs;
    uint64_t sum;
} block;

/* One file to check: its bytes, and the indices of the copies out of it (by source). */
typedef struct target {
    const accel__ckpt_file *f;
    const unsigned char *p;
    size_t nbytes;
    size_t *copies;
    size_t n_copies;
} target;

static void run_block(void *ctx, size_t i)
{
    /* No MADV_WILLNEED here (unlike verify.c's pass): the copy faults its way through the
     * file exactly as the unverified load's copies do, with the same read-ahead. */
    block *b = &((block *)ctx)[i];
    b->sum = accel__xxh3_copy(b->p ? (const void *)b->p : "", b->nbytes, b->segs, b->n_segs);
}

static size_t n_blocks(size_t nbytes)
{
    return nbytes / ACCEL__CKPT_BLOCK + 1; /* an empty file has one empty block */
}

/* A copy by its source, for sorting. */
typedef struct by_src {
    const unsigned char *src;
    size_t k;
} by_src;

static int cmp_src(const void *a, const void *b)
{
    const unsigned char *x = ((const by_src *)a)->src, *y = ((const by_src *)b)->src;
    return (x > y) - (x < y);
}

/* Cuts target t's copies (sorted by source) into segments of its blocks bs; a copy whose
 * source overlaps the previous one's is left out (done stays 0: the caller copies it after
 * the verdict). segs has room for every piece. */
static size_t cut(const target *t, const accel__ckpt_copy *copies, block *bs, accel__copy_seg *segs,
                  unsigned char *done)
{
    size_t used = 0;
    const unsigned char *covered = t->p; /* sources below this are taken */
    for (size_t k = 0; k < t->n_copies; k++) {
        const accel__ckpt_copy *c = &copies[t->copies[k]];
        const unsigned char *src = c->src;
        if (src < covered) {
            continue;
        }
        size_t off = (size_t)(src - t->p), left = c->nbytes;
        unsigned char *dst = c->dst;
        while (left > 0) {
            size_t b = off / ACCEL__CKPT_BLOCK, in = off - b * ACCEL__CKPT_BLOCK;
            size_t n = ACCEL__CKPT_BLOCK - in < left ? ACCEL__CKPT_BLOCK - in : left;
            if (bs[b].segs == NULL) {
                bs[b].segs = &segs[used];
            }
            segs[used++] = (accel__copy_seg){in, n, dst};
            bs[b].n_segs++;
            off += n;
            dst += n;
            left -= n;
        }
        covered = src + c->nbytes;
        if (done != NULL) {
            done[t->copies[k]] = 1;
        }
    }
    return used;
}

/* Checks the n targets: their blocks hashed (and their copies made) on the process's CPUs. */
static accel_status check_targets(const char *dir, target *ts, size_t n,
                                  const accel__ckpt_copy *copies, unsigned char *done)
{
    size_t nb = 0, n_pieces = 0, nbytes = 0;
    for (size_t i = 0; i < n; i++) {
        nb += n_blocks(ts[i].nbytes);
        nbytes += ts[i].nbytes;
        for (size_t k = 0; k < ts[i].n_copies; k++) {
            n_pieces += copies[ts[i].copies[k]].nbytes / ACCEL__CKPT_BLOCK + 2;
        }
    }
    block *bs = accel__calloc(nb + 1, sizeof(*bs));
    accel__copy_seg *segs = accel__calloc(n_pieces + 1, sizeof(*segs));
    unsigned char *sums = accel__calloc(nb + 1, 8);
    if (bs == NULL || segs == NULL || sums == NULL) {
        accel__free(bs);
        accel__free(segs);
        accel__free(sums);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory checking checkpoint %s", dir);
    }
    size_t at = 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < n_blocks(ts[i].nbytes); k++) {
            size_t off = k * ACCEL__CKPT_BLOCK, rest = ts[i].nbytes - off;
            bs[at + k].p = ts[i].p ? ts[i].p + off : NULL;
            bs[at + k].nbytes = rest < ACCEL__CKPT_BLOCK ? rest : ACCEL__CKPT_BLOCK;
        }
        used += cut(&ts[i], copies, &bs[at], &segs[used], done);
        at += n_blocks(ts[i].nbytes);
    }
    accel__parallel_for(nb, nbytes, run_block, bs);
    accel_status st = ACCEL_OK;
    at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = n_blocks(ts[i].nbytes);
        for (size_t j = 0; j < k; j++) {
            for (int byte = 0; byte < 8; byte++) {
                sums[8 * j + (size_t)byte] = (unsigned char)(bs[at + j].sum >> (8 * byte));
            }
        }
        at += k;
        uint64_t sum = XXH3_64bits(sums, 8 * k);
        if (st == ACCEL_OK && sum != ts[i].f->xxh3) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "checkpoint %s: file %s is damaged: its checksum is %016llx, the "
                               "marker says %016llx",
                               dir, ts[i].f->name, (unsigned long long)sum,
                               (unsigned long long)ts[i].f->xxh3);
        }
    }
    accel__free(bs);
    accel__free(segs);
    accel__free(sums);
    return st;
}

/* The bytes file f is loaded from: the mapping lent to its loader, else the one kept. */
static const unsigned char *bytes_of(const accel__ckpt_file *f, size_t *nbytes)
{
    *nbytes = f->lent ? f->lent_nbytes : f->map_nbytes;
    return f->lent ? f->lent : f->map;
}

/* The targets for the files of m that `want` selects, with the copies out of each (sorted by
 * source) when copies is not NULL. *ts and its index arrays are owned (free_targets). */
static accel_status collect(const accel__ckpt_marker *m, const accel__ckpt_copy *copies,
                            size_t n_copies, int (*want)(const accel__ckpt_file *f, void *ctx),
                            void *ctx, target **out, size_t *n_out)
{
    target *ts = accel__calloc(m->n_files + 1, sizeof(*ts));
    if (ts == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < m->n_files; i++) {
        if (!want(&m->files[i], ctx)) {
            continue;
        }
        target *t = &ts[n++];
        t->f = &m->files[i];
        t->p = bytes_of(t->f, &t->nbytes);
        if (copies == NULL || t->p == NULL) {
            continue;
        }
        by_src *order = accel__calloc(n_copies + 1, sizeof(*order));
        t->copies = accel__calloc(n_copies + 1, sizeof(size_t));
        if (order == NULL || t->copies == NULL) {
            accel__free(order);
            *out = ts;
            *n_out = n;
            return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
        for (size_t k = 0; k < n_copies; k++) {
            const unsigned char *s = copies[k].src;
            size_t room = s >= t->p && s < t->p + t->nbytes ? t->nbytes - (size_t)(s - t->p) : 0;
            if (copies[k].nbytes > 0 && copies[k].nbytes <= room) {
                order[t->n_copies++] = (by_src){s, k};
            }
        }
        qsort(order, t->n_copies, sizeof(*order), cmp_src);
        for (size_t k = 0; k < t->n_copies; k++) {
            t->copies[k] = order[k].k;
        }
        accel__free(order);
    }
    *out = ts;
    *n_out = n;
    return ACCEL_OK;
}

static void free_targets(target *ts, size_t n)
{
    for (size_t i = 0; ts != NULL && i < n; i++) {
        accel__free(ts[i].copies);
    }
    accel__free(ts);
}

/* ---- before anything is written ---- */

void accel__ckpt_keep_apart(accel__ckpt_marker *m, const char *name)
{
    /* The entries are the marker's own (non-const) array. */
    accel__ckpt_file *f = (accel__ckpt_file *)accel__ckpt_marker_find(m, name);
    if (f != NULL) {
        f->apart = 1;
    }
}

typedef struct rest_ctx {
    const accel__ckpt_marker *m;
    const accel__ckpt_copy *copies;
    size_t n_copies;
    int share, n_shares;
} rest_ctx;

/* A deferred file lent to a loader that copies out of it. */
static int copied_from(const accel__ckpt_file *f, const rest_ctx *c)
{
    for (size_t k = 0; f->lent != NULL && k < c->n_copies; k++) {
        const unsigned char *s = c->copies[k].src;
        if (s >= f->lent && s < f->lent + f->lent_nbytes) {
            return 1;
        }
    }
    return 0;
}

static int want_now(const accel__ckpt_file *f, void *ctx)
{
    const rest_ctx *c = ctx;
    size_t i = (size_t)(f - c->m->files);
    return f->deferred && !f->fused && (int)(i % (size_t)c->n_shares) == c->share;
}

accel_status accel__ckpt_verify_rest(const char *dir, accel__ckpt_marker *m, int share,
                                     int n_shares, const accel__ckpt_copy *copies, size_t n)
{
    rest_ctx c = {m, copies, n, share, n_shares > 0 ? n_shares : 1};
    for (size_t i = 0; i < m->n_files; i++) {
        const accel__ckpt_file *f = &m->files[i];
        m->files[i].fused = f->deferred && !f->apart && copied_from(f, &c);
    }
    target *ts = NULL;
    size_t n_ts = 0;
    accel_status st = collect(m, NULL, 0, want_now, &c, &ts, &n_ts);
    if (st == ACCEL_OK) {
        st = check_targets(dir, ts, n_ts, NULL, NULL);
    }
    free_targets(ts, n_ts);
    return st;
}

/* ---- while copying ---- */

static int want_fused(const accel__ckpt_file *f, void *ctx)
{
    (void)ctx;
    return f->fused;
}

accel_status accel__ckpt_copy_verified(const char *dir, const accel__ckpt_marker *m,
                                       const accel__ckpt_copy *copies, size_t n,
                                       unsigned char *done)
{
    target *ts = NULL;
    size_t n_ts = 0;
    accel_status st = collect(m, copies, n, want_fused, NULL, &ts, &n_ts);
    if (st == ACCEL_OK) {
        st = check_targets(dir, ts, n_ts, copies, done);
    }
    free_targets(ts, n_ts);
    return st;
}
