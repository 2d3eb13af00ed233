/*
 * The allocator every module goes through. Kept in one place so a test can count or fail
 * allocations, and so aligned buffers (for vectorised kernels) have one owner.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void *accel__malloc(size_t nbytes)
{
    return malloc(nbytes ? nbytes : 1);
}

void *accel__calloc(size_t n, size_t nbytes)
{
    return calloc(n ? n : 1, nbytes ? nbytes : 1);
}

void *accel__realloc(void *p, size_t nbytes)
{
    return realloc(p, nbytes ? nbytes : 1);
}

void accel__free(void *p)
{
    free(p);
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

void *accel__aligned_alloc(size_t nbytes)
{
    void *p = NULL;
    /* posix_memalign rather than aligned_alloc: no size-multiple rule to trip over. */
    if (posix_memalign(&p, 64, nbytes ? nbytes : 64) != 0) {
        return NULL;
    }
    return p;
}

void accel__aligned_free(void *p)
{
    free(p);
}
