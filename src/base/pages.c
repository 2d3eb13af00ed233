/*
 * Page-granular host memory (base.h): anonymous private mappings, whose untouched pages cost
 * nothing and whose released pages go back to the kernel and read as zeros. ZeRO stage 3 keeps
 * the full-size flat weights this way, so that only the gathered units are resident while
 * every parameter keeps one fixed address. Invariant: a drop never touches bytes outside the
 * range it was given (partial pages at the ends stay).
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base.h"

static size_t page_nbytes(void)
{
    long n = sysconf(_SC_PAGESIZE);
    return n > 0 ? (size_t)n : 4096;
}

void *accel__pages_alloc(size_t nbytes)
{
    void *p =
        mmap(NULL, nbytes ? nbytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void accel__pages_free(void *p, size_t nbytes)
{
    if (p != NULL) {
        (void)munmap(p, nbytes ? nbytes : 1);
    }
}

void accel__pages_drop(void *p, size_t nbytes)
{
    size_t pg = page_nbytes();
    uintptr_t lo = ((uintptr_t)p + pg - 1) / pg * pg, hi = ((uintptr_t)p + nbytes) / pg * pg;
    if (hi > lo) {
        /* Advice cannot fail on a private anonymous mapping we own; if it did, the pages would
         * merely stay resident. */
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}

void accel__pages_clear(void *p, size_t nbytes)
{
    size_t pg = page_nbytes();
    uintptr_t a = (uintptr_t)p, e = a + nbytes;
    uintptr_t lo = (a + pg - 1) / pg * pg, hi = e / pg * pg;
    if (hi <= lo) { /* inside one or two partial pages */
        memset(p, 0, nbytes);
        return;
    }
    memset(p, 0, lo - a);
    memset((void *)hi, 0, e - hi);
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void accel__pages_drop_all(void *p, size_t nbytes)
{
    size_t pg = page_nbytes();
    if (p != NULL && nbytes > 0) {
        (void)madvise(p, (nbytes + pg - 1) / pg * pg, MADV_DONTNEED);
    }
}

int accel__pages_populate(void *p, size_t nbytes)
{
#ifdef MADV_POPULATE_WRITE
    size_t pg = page_nbytes();
    uintptr_t lo = (uintptr_t)p / pg * pg, hi = ((uintptr_t)p + nbytes + pg - 1) / pg * pg;
    /* One call maps every page writable: no fault per page, and none of the two faults
     * (zero page on read, copy on write) a read-modify-write of an untouched page takes. */
    return hi > lo && madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) != 0 ? -1 : 0;
#else
    (void)p;
    (void)nbytes;
    return -1;
#endif
}

size_t accel__pages_resident(const void *p, size_t nbytes)
{
    size_t pg = page_nbytes(), n_pages = (nbytes + pg - 1) / pg, resident = 0;
    unsigned char vec[256];
    for (size_t first = 0; first < n_pages; first += sizeof vec) {
        size_t n = n_pages - first < sizeof vec ? n_pages - first : sizeof vec;
        if (mincore((char *)p + first * pg, n * pg, vec) != 0) {
            return 0;
        }
        for (size_t k = 0; k < n; k++) {
            resident += (vec[k] & 1) ? pg : 0;
        }
    }
    return resident;
}
