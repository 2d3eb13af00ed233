/*
 * A counting allocator for accel_replace_allocator, shared by the programs that measure what
 * accel allocates (tests/progs/gpt_memory.c, bench/zero_step.c): count_alloc_install() before
 * any other accel call, then count_alloc_live() is the bytes accel holds, and
 * count_alloc_owns(p) tells whether p lies in a block of 64 KiB or more that came through it
 * (a buffer accel maps itself does not: the shm backend's shared gradients, ZeRO-2/3's page
 * buffers), and count_alloc_resident(p, n) is how many bytes of such a mapping are resident.
 * Each block carries a 16-byte header holding its size. Thread-safe.
 */
#ifndef ACCEL_TESTS_COUNT_ALLOC_H
#define ACCEL_TESTS_COUNT_ALLOC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "accel/accel.h"

static atomic_size_t count_alloc_bytes;

#define COUNT_ALLOC_BIG 65536
#define COUNT_ALLOC_MAX_BIG 4096
static struct {
    char *p;
    size_t n;
} count_alloc_big[COUNT_ALLOC_MAX_BIG];
static pthread_mutex_t count_alloc_lock = PTHREAD_MUTEX_INITIALIZER;

static void count_alloc_track(char *p, size_t n, int add)
{
    if (n < COUNT_ALLOC_BIG) {
        return;
    }
    pthread_mutex_lock(&count_alloc_lock);
    for (int i = 0; i < COUNT_ALLOC_MAX_BIG; i++) {
        if (add ? count_alloc_big[i].p == NULL : count_alloc_big[i].p == p) {
            count_alloc_big[i].p = add ? p : NULL;
            count_alloc_big[i].n = n;
            break;
        }
    }
    pthread_mutex_unlock(&count_alloc_lock);
}

static inline int count_alloc_owns(const void *q)
{
    int found = 0;
    pthread_mutex_lock(&count_alloc_lock);
    for (int i = 0; i < COUNT_ALLOC_MAX_BIG && !found; i++) {
        const char *p = count_alloc_big[i].p;
        found = p != NULL && (const char *)q >= p && (const char *)q < p + count_alloc_big[i].n;
    }
    pthread_mutex_unlock(&count_alloc_lock);
    return found;
}

/* Resident bytes of the mapped range [p, p + nbytes), by whole pages (mincore); 0 for NULL. */
static inline size_t count_alloc_resident(const void *p, size_t nbytes)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), total = 0;
    if (p == NULL || nbytes == 0) {
        return 0;
    }
    uintptr_t lo = (uintptr_t)p / pg * pg, hi = ((uintptr_t)p + nbytes + pg - 1) / pg * pg;
    size_t n_pages = (hi - lo) / pg;
    unsigned char *vec = malloc(n_pages);
    if (vec != NULL && mincore((void *)lo, hi - lo, vec) == 0) {
        for (size_t i = 0; i < n_pages; i++) {
            total += (vec[i] & 1) ? pg : 0;
        }
    }
    free(vec);
    return total;
}

static inline size_t count_alloc_live(void)
{
    return atomic_load(&count_alloc_bytes);
}

static void *count_alloc_malloc(size_t n)
{
    size_t *h = malloc(n + 16);
    if (h == NULL) {
        return NULL;
    }
    h[0] = n;
    atomic_fetch_add(&count_alloc_bytes, n);
    count_alloc_track((char *)h + 16, n, 1);
    return (char *)h + 16;
}

static void count_alloc_free(void *p)
{
    if (p != NULL) {
        size_t *h = (size_t *)((char *)p - 16);
        atomic_fetch_sub(&count_alloc_bytes, h[0]);
        count_alloc_track(p, h[0], 0);
        free(h);
    }
}

static void *count_alloc_realloc(void *p, size_t n)
{
    if (p == NULL) {
        return count_alloc_malloc(n);
    }
    size_t *h = (size_t *)((char *)p - 16), old = h[0];
    count_alloc_track(p, old, 0);
    size_t *g = realloc(h, n + 16);
    if (g == NULL) {
        count_alloc_track(p, old, 1);
        return NULL;
    }
    g[0] = n;
    atomic_fetch_add(&count_alloc_bytes, n);
    atomic_fetch_sub(&count_alloc_bytes, old);
    count_alloc_track((char *)g + 16, n, 1);
    return (char *)g + 16;
}

static void *count_alloc_calloc(size_t count, size_t n)
{
    if (n != 0 && count > (SIZE_MAX - 16) / n) {
        return NULL;
    }
    void *p = count_alloc_malloc(count * n);
    if (p != NULL) {
        memset(p, 0, count * n);
    }
    return p;
}

static inline accel_status count_alloc_install(void)
{
    return accel_replace_allocator(count_alloc_malloc, count_alloc_realloc, count_alloc_calloc,
                                   count_alloc_free);
}

/* Resident bytes of model m's full weights (and compute copy) when accel maps them itself
 * (ZeRO-3's pages: the units gathered at the time; stages 1-2 under mixed precision: the
 * buckets widened to fp32, the compute copy being counted memory), else 0 (they are counted
 * memory). */
static inline size_t count_alloc_gathered(accel_model *m)
{
    const accel_param *p0 = accel_model_param(m, 0);
    size_t nbytes = 4 * accel_model_numel(m), total = 0;
    const float *w = p0->data - p0->offset; /* the weights parameters see */
    const char *c = p0->compute_view.data;
    if (!count_alloc_owns(w)) {
        total = count_alloc_resident(w, nbytes);
        if (c != NULL && c != (const char *)p0->data && !count_alloc_owns(c)) {
            c -= p0->offset * accel_dtype_nbytes(p0->compute_view.dtype);
            total +=
                count_alloc_resident(c, nbytes / 4 * accel_dtype_nbytes(p0->compute_view.dtype));
        }
    }
    return total;
}

/* Resident bytes of model m's gradient buffer when accel maps it itself (the shm backend's
 * shared buffer, ZeRO-2/3's pages), else 0 (counted memory). */
static inline size_t count_alloc_mapped_grad(accel_model *m)
{
    const float *g = accel_model_grad(m);
    return count_alloc_owns(g) ? 0 : count_alloc_resident(g, 4 * accel_model_numel(m));
}

#endif /* ACCEL_TESTS_COUNT_ALLOC_H */
