/*
 * The base layer: a replaced allocator sees every allocation accel makes (and balanced frees),
 * aligned buffers come from it too, bad arguments are refused; an error message may wrap the
 * previous one (its own buffer as an argument); two log contexts keep their own levels.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "check.h"

static long n_alloc, n_free;

static void *count_malloc(size_t n)
{
    n_alloc++;
    return malloc(n);
}

static void *count_realloc(void *p, size_t n)
{
    if (p == NULL) {
        n_alloc++;
    }
    return realloc(p, n);
}

static void *count_calloc(size_t n, size_t size)
{
    n_alloc++;
    return calloc(n, size);
}

static void count_free(void *p)
{
    if (p != NULL) {
        n_free++;
    }
    free(p);
}

int main(void)
{
    CHECK(accel_replace_allocator(NULL, count_realloc, count_calloc, count_free) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "accel_replace_allocator") != NULL);
    CHECK_OK(NULL, accel_replace_allocator(count_malloc, count_realloc, count_calloc, count_free));

    /* Aligned buffers are carved from the replaced malloc. */
    long before = n_alloc;
    void *p = accel__aligned_alloc(1000);
    CHECK(p != NULL && ((uintptr_t)p % 64) == 0 && n_alloc == before + 1);
    memset(p, 1, 1000);
    accel__aligned_free(p);
    CHECK(n_free >= 1);

    /* A whole accelerator lives on the replaced allocator and gives everything back. */
    n_alloc = n_free = 0;
    accel *acc = NULL;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    float x = 1.0f;
    CHECK_OK(acc, accel_allreduce(acc, &x, &x, 1, ACCEL_F32, ACCEL_SUM, NULL));
    accel_free(acc);
    CHECK_MSG(n_alloc > 0 && n_alloc == n_free, "%ld allocations, %ld frees", n_alloc, n_free);

    /* A message that wraps the previous one (the thread's own buffer as an argument). */
    accel__seterr(NULL, ACCEL_EPEER, "rank 1 died");
    accel__seterr(NULL, ACCEL_EPEER, "backward: all-reduce failed: %s", accel_last_error(NULL));
    CHECK_MSG(strcmp(accel_last_error(NULL), "backward: all-reduce failed: rank 1 died") == 0,
              "got \"%s\"", accel_last_error(NULL));
    CHECK(accel_last_status(NULL) == ACCEL_EPEER);

    /* Log contexts are independent. */
    accel__log_ctx quiet = {0, 2, ACCEL__LOG_ERROR}, loud = {1, 2, ACCEL__LOG_DEBUG};
    CHECK(!accel__log_enabled(&quiet, ACCEL__LOG_WARN));
    CHECK(accel__log_enabled(&loud, ACCEL__LOG_DEBUG));
    CHECK(!accel__log_enabled(&loud, ACCEL__LOG_OFF));
    return 0;
}
