/*
 * The simulated GPU's device memory (sim.h): the block table of its mmap'ed allocations, their
 * page protection and the fault handler that names a block host code touched, the checks that a
 * pointer is device (or host) memory, and the reserved ranges whose granules are mapped and
 * unmapped in runs (CUDA VMM).
 *
 * Invariant: every block is PROT_NONE except while queued work runs (open_depth > 0, sim.c's
 * flush opens it), and an unmapped granule of a range stays PROT_NONE even then. The state here
 * is guarded by the simulation's one lock (sim.c).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim_impl.h"

typedef struct sim_block {
    char *base;
    size_t nbytes, mapped;
    int gpu;
    unsigned char *on; /* a reserved range: which granules are mapped (else NULL) */
} sim_block;

/* The granule of reserved ranges: smaller than a GPU's 2 MiB, so that tests' small models
 * span several. */
#define SIM_GRANULE ((size_t)65536)

static struct {
    sim_block *blocks;
    int n_blocks, cap_blocks;
    int open_depth; /* > 0 while queued work runs: device memory is accessible */
    int handler;
    struct sigaction old_segv;
} mem;

/* ---- blocks, protection, the fault handler, pointer checks ---- */

static void set_access(int open)
{
    for (int i = 0; i < mem.n_blocks; i++) {
        const sim_block *b = &mem.blocks[i];
        for (size_t g = 0; b->on != NULL && g < b->mapped / SIM_GRANULE; g++) {
            /* The unmapped granules of a range stay inaccessible even to queued work. */
            (void)mprotect(b->base + g * SIM_GRANULE, SIM_GRANULE,
                           open && b->on[g] ? PROT_READ | PROT_WRITE : PROT_NONE);
        }
        if (b->on == NULL) {
            (void)mprotect(b->base, b->mapped, open ? PROT_READ | PROT_WRITE : PROT_NONE);
        }
    }
}

void accel__sim_open_memory(void)
{
    if (mem.open_depth++ == 0) {
        set_access(1);
    }
}

void accel__sim_close_memory(void)
{
    if (--mem.open_depth == 0) {
        set_access(0);
    }
}

/* The block whose pages hold p, or NULL (host memory). */
static sim_block *find_block(const void *p)
{
    const char *c = p;
    for (int i = 0; i < mem.n_blocks; i++) {
        if (c >= mem.blocks[i].base && c < mem.blocks[i].base + mem.blocks[i].mapped) {
            return &mem.blocks[i];
        }
    }
    return NULL;
}

/* Host code touched device memory: say which block before the fault takes its course (the
 * previous handler, or the default crash, when the access is retried). snprintf is not
 * async-signal-safe; the process is dying of a bug either way, and the line is the point. */
static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    const sim_block *b = find_block(si->si_addr); /* racy, but the process is going down */
    if (b != NULL) {
        char msg[400];
        int n = snprintf(msg, sizeof(msg),
                         "accel: host code touched simulated device memory at %p (%zu bytes at "
                         "%p on simulated cuda:%d, ACCEL_SIM_GPU): on a GPU this reads garbage "
                         "or crashes; reach device memory through copies or queued kernels%s\n",
                         si->si_addr, b->nbytes, (void *)b->base, b->gpu,
                         b->on != NULL && !b->on[((char *)si->si_addr - b->base) / SIM_GRANULE]
                             ? " (or: it touched an UNMAPPED granule of a reserved range: "
                               "unmapped before the queued work that reads it had run)"
                             : "");
        if (n > 0 && write(2, msg, (size_t)n) < 0) {
            n = 0; /* nothing more to do */
        }
    }
    sigaction(SIGSEGV, &mem.old_segv, NULL);
}

void accel__sim_install_handler(void)
{
    if (mem.handler) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    mem.handler = sigaction(SIGSEGV, &sa, &mem.old_segv) == 0;
}

/* p .. p + nbytes must be device memory of d, inside one block. */
accel_status accel__sim_need_dev(accel__device *d, const char *who, const char *what, const void *p,
                                 size_t nbytes)
{
    const sim_block *b = find_block(p);
    if (b == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s %p is host memory, not device memory",
                             accel__sim_index(d), who, what, p);
    }
    if (b->gpu != accel__sim_index(d)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s %p is memory of cuda:%d, not this GPU's",
                             accel__sim_index(d), who, what, p, b->gpu);
    }
    size_t off = (size_t)((const char *)p - b->base);
    if (off > b->nbytes || nbytes > b->nbytes - off) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s: %zu bytes at %p run past the end of its "
                             "device allocation (%zu bytes at %p)",
                             accel__sim_index(d), who, what, nbytes, p, b->nbytes, (void *)b->base);
    }
    for (size_t g = off / SIM_GRANULE; b->on != NULL && g * SIM_GRANULE < off + nbytes; g++) {
        if (!b->on[g]) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "simulated cuda:%d: %s: %s: %zu bytes at %p reach an unmapped "
                                 "granule (%zu) of a reserved range",
                                 accel__sim_index(d), who, what, nbytes, p, g);
        }
    }
    return ACCEL_OK;
}

/* p .. p + nbytes must be host memory. */
accel_status accel__sim_need_host(accel__device *d, const char *who, const char *what,
                                  const void *p, size_t nbytes)
{
    const sim_block *b = find_block(p);
    if (b == NULL && nbytes > 0) {
        b = find_block((const char *)p + nbytes - 1);
    }
    if (b != NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s %p is device memory of cuda:%d, but the "
                             "copy's kind says host memory",
                             accel__sim_index(d), who, what, p, b->gpu);
    }
    return ACCEL_OK;
}

/* ---- allocations ---- */

static accel_status alloc_locked(accel__device *d, size_t nbytes, int zero, void **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (nbytes > SIZE_MAX / 2 || (mem.n_blocks == mem.cap_blocks && mem.cap_blocks > (1 << 24))) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "simulated cuda:%d: out of memory allocating %zu bytes",
                             accel__sim_index(d), nbytes);
    }
    if (mem.n_blocks == mem.cap_blocks) {
        int cap = mem.cap_blocks ? 2 * mem.cap_blocks : 64;
        sim_block *nb = accel__realloc(mem.blocks, (size_t)cap * sizeof(*nb));
        if (nb == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM,
                                 "simulated cuda:%d: out of memory allocating %zu bytes",
                                 accel__sim_index(d), nbytes);
        }
        mem.blocks = nb;
        mem.cap_blocks = cap;
    }
    size_t mapped = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "simulated cuda:%d: out of memory allocating %zu bytes",
                             accel__sim_index(d), nbytes);
    }
    /* Fresh memory is poison (NaN in every float dtype) unless asked for zeros. */
    memset(p, zero ? 0 : 0xFF, mapped);
    if (mem.open_depth == 0) {
        (void)mprotect(p, mapped, PROT_NONE);
    }
    mem.blocks[mem.n_blocks++] = (sim_block){p, nbytes, mapped, accel__sim_index(d), NULL};
    *out = p;
    return ACCEL_OK;
}

accel_status accel__sim_alloc(accel__device *d, size_t nbytes, int zero, void **out)
{
    ACCEL__SIM_LOCKED(alloc_locked(d, nbytes, zero, out));
}

void accel__sim_free(accel__device *d, void *p)
{
    accel__sim_lock();
    accel__sim_flush_all(); /* cudaFree waits for the device */
    int i = 0;
    while (i < mem.n_blocks && (mem.blocks[i].base != p || mem.blocks[i].on != NULL)) {
        i++;
    }
    if (i == mem.n_blocks) {
        accel__log(NULL, ACCEL__LOG_ERROR,
                   "simulated cuda:%d: free of %p, which is not the start of a device allocation",
                   accel__sim_index(d), p);
    } else {
        (void)munmap(mem.blocks[i].base, mem.blocks[i].mapped);
        mem.blocks[i] = mem.blocks[--mem.n_blocks];
    }
    accel__sim_unlock();
}

accel_status accel__sim_host_alloc(accel__device *d, size_t nbytes, void **out)
{
    void *p = accel__aligned_alloc(nbytes > 0 ? nbytes : 1);
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "simulated cuda:%d: out of memory allocating %zu pinned bytes",
                             accel__sim_index(d), nbytes);
    }
    memset(p, 0xFF, nbytes); /* cudaHostAlloc's memory is not initialised */
    *out = p;
    return ACCEL_OK;
}

void accel__sim_host_free(accel__device *d, void *p)
{
    (void)d;
    accel__sim_lock();
    accel__sim_flush_all(); /* cudaFreeHost waits for the device */
    accel__sim_unlock();
    accel__aligned_free(p);
}

static accel_status holds_locked(accel__device *d, const void *p, int *out)
{
    const sim_block *b = find_block(p);
    *out = 0;
    if (b != NULL && b->gpu != accel__sim_index(d)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "pointer %p is memory of cuda:%d, but this process computes on "
                             "cuda:%d",
                             p, b->gpu, accel__sim_index(d));
    }
    *out = b != NULL;
    return ACCEL_OK;
}

accel_status accel__sim_holds(accel__device *d, const void *p, int *out)
{
    ACCEL__SIM_LOCKED(holds_locked(d, p, out));
}

/* ---- reserved ranges: a block whose granules are mapped in runs (range.c) ---- */

accel_status accel__sim_range_granularity(accel__device *d, size_t *out)
{
    (void)d;
    *out = SIM_GRANULE;
    return ACCEL_OK;
}

accel_status accel__sim_range_reserve(accel__device *d, size_t nbytes, void **base)
{
    unsigned char *on = accel__calloc(nbytes / SIM_GRANULE + 1, 1);
    accel__sim_lock();
    /* An ordinary block (poisoned), all of it unmapped at once. */
    accel_status st = on != NULL ? alloc_locked(d, nbytes, 0, base) : ACCEL_ENOMEM;
    if (st == ACCEL_OK) {
        sim_block *b = &mem.blocks[mem.n_blocks - 1];
        b->on = on;
        (void)mprotect(b->base, b->mapped, PROT_NONE);
        (void)madvise(b->base, b->mapped, MADV_DONTNEED);
    }
    accel__sim_unlock();
    if (st != ACCEL_OK) {
        accel__free(on);
        return on == NULL ? accel__seterr(NULL, st, "simulated cuda: out of memory") : st;
    }
    return ACCEL_OK;
}

void accel__sim_range_release(accel__device *d, void *base, size_t nbytes)
{
    (void)d, (void)nbytes;
    accel__sim_lock();
    accel__sim_flush_all(); /* as cudaFree */
    sim_block *b = find_block(base);
    if (b != NULL) {
        (void)munmap(b->base, b->mapped);
        accel__free(b->on);
        *b = mem.blocks[--mem.n_blocks];
    }
    accel__sim_unlock();
}

/* Maps (on) or unmaps a run of granules. Unmapping runs no queued work: work still queued that
 * reads it then faults, as a GPU would read unmapped memory, instead of passing by luck. */
static void set_granules(void *at, size_t nbytes, int on)
{
    accel__sim_lock();
    sim_block *b = find_block(at);
    memset(b->on + ((char *)at - b->base) / SIM_GRANULE, on, nbytes / SIM_GRANULE);
    if (on) { /* fresh physical memory is garbage on a GPU: poison */
        (void)mprotect(at, nbytes, PROT_READ | PROT_WRITE);
        memset(at, 0xFF, nbytes);
    } else {
        (void)madvise(at, nbytes, MADV_DONTNEED);
    }
    if (!on || mem.open_depth == 0) {
        (void)mprotect(at, nbytes, PROT_NONE);
    }
    accel__sim_unlock();
}

accel_status accel__sim_range_map(accel__device *d, void *at, size_t nbytes, void **phys)
{
    (void)d;
    set_granules(at, nbytes, 1);
    *phys = at;
    return ACCEL_OK;
}

accel_status accel__sim_range_unmap(accel__device *d, void *at, size_t nbytes, void *phys)
{
    (void)d, (void)phys;
    set_granules(at, nbytes, 0);
    return ACCEL_OK;
}
