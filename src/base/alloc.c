/*
 * The allocator every module goes through, replaceable as a whole (accel_replace_allocator,
 * libuv's uv_replace_allocator), so a program can account or pool accel's memory and a test can
 * count or fail allocations. Aligned buffers (for vectorised kernels) are carved out of the
 * current malloc with the original pointer stored just before the aligned one, so they too go
 * through a replaced allocator.
 */
#include <stdlib.h>
#include <string.h>

#include "base.h"

static struct {
    accel_malloc_fn malloc_fn;
    accel_realloc_fn realloc_fn;
    accel_calloc_fn calloc_fn;
    accel_free_fn free_fn;
} fns = {malloc, realloc, calloc, free};

accel_status accel_replace_allocator(accel_malloc_fn malloc_fn, accel_realloc_fn realloc_fn,
                                     accel_calloc_fn calloc_fn, accel_free_fn free_fn)
{
    if (malloc_fn == NULL || realloc_fn == NULL || calloc_fn == NULL || free_fn == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_replace_allocator: every function must be given");
    }
    fns.malloc_fn = malloc_fn;
    fns.realloc_fn = realloc_fn;
    fns.calloc_fn = calloc_fn;
    fns.free_fn = free_fn;
    return ACCEL_OK;
}

void *accel__malloc(size_t nbytes)
{
    return fns.malloc_fn(nbytes ? nbytes : 1);
}

void *accel__calloc(size_t n, size_t nbytes)
{
    return fns.calloc_fn(n ? n : 1, nbytes ? nbytes : 1);
}

void *accel__realloc(void *p, size_t nbytes)
{
    return fns.realloc_fn(p, nbytes ? nbytes : 1);
}

void accel__free(void *p)
{
    if (p != NULL) {
        fns.free_fn(p);
    }
}

char *accel__strdup(const char *s)
{
    if (s == NULL) {
        return NULL;
    }
    size_t n = strlen(s) + 1;
    char *d = accel__malloc(n);
    if (d != NULL) {
        memcpy(d, s, n);
    }
    return d;
}

#define ALIGN 64

void *accel__aligned_alloc(size_t nbytes)
{
    if (nbytes > SIZE_MAX - ALIGN - sizeof(void *)) {
        return NULL;
    }
    char *raw = accel__malloc(nbytes + ALIGN + sizeof(void *));
    if (raw == NULL) {
        return NULL;
    }
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
    ((void **)p)[-1] = raw;
    return (void *)p;
}

void accel__aligned_free(void *p)
{
    if (p != NULL) {
        accel__free(((void **)p)[-1]);
    }
}
