/*
 * CUDA's virtual memory management in the emulator build (cuemu.h): the driver entry points
 * accel gets through cudaGetDriverEntryPointByVersion (src/device/cuda/vmm.c), on host memory.
 * A reservation is an inaccessible mapping (PROT_NONE) of its size, registered as device
 * memory so kernels and copies accept pointers into it; cuMemCreate makes a memfd of the size,
 * poisoned (0xFF: fresh GPU memory is garbage); cuMemMap maps it shared at a fixed address of a
 * reservation, still inaccessible until cuMemSetAccess grants read-write; cuMemUnmap puts the
 * inaccessible mapping back, so a later read of unmapped memory faults as it would on a GPU.
 * The granularity is 2 MiB, as on current GPUs. What the driver requires is enforced, with
 * CUDA_ERROR_INVALID_VALUE and a message: addresses and sizes granularity-aligned, a mapping
 * only into unmapped addresses of one reservation, an unmap of exactly one whole mapping (the
 * driver documents "no partial unmap"; one mapping per call is stricter, and what accel does),
 * no reservation freed while mapped, handles valid, properties of pinned device memory. Each
 * entry point counts its calls (cuemu_vmm_calls), so tests can bound the driver calls.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuemu.h"

#define GRANULE ((size_t)2 << 20)
#define MAX_ENTRIES 4096

typedef struct phys {
    int fd, device, released;
    size_t nbytes;
    int n_maps;
} phys;

typedef struct span {
    uintptr_t va;
    size_t nbytes;
    int device;     /* reservations: the device registered for lookups */
    phys *handle;   /* mappings: what is mapped there */
    int accessible; /* mappings: cuMemSetAccess granted read-write */
} span;

static span g_res[MAX_ENTRIES], g_maps[MAX_ENTRIES];
static phys *g_live[MAX_ENTRIES]; /* allocations not yet destroyed: handles are checked here */
static int g_n_live;
static int g_n_res, g_n_maps;
static size_t g_mapped;
/* Calls so far of cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease. */
static const char *const g_counted[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                                        "cuMemRelease"};
enum { N_CREATE, N_MAP, N_SET_ACCESS, N_UNMAP, N_RELEASE, N_COUNTED };
static size_t g_calls[N_COUNTED];
static int g_fail_create; /* > 0: the g_fail_create-th cuMemCreate from now fails */

/* 1 when p is a handle of cuMemCreate not yet destroyed (never dereferenced before). Under the
 * lock. */
static int live(const phys *p)
{
    for (int i = 0; i < g_n_live; i++) {
        if (g_live[i] == p) {
            return 1;
        }
    }
    return 0;
}

/* The driver's errors as the runtime's: recorded and printed (cuemu_set_error). */
#define BAD(...)                                                                                   \
    do {                                                                                           \
        cuemu_set_error(cudaErrorInvalidValue, __VA_ARGS__);                                       \
        cuemu_unlock();                                                                            \
        return CUDA_ERROR_INVALID_VALUE;                                                           \
    } while (0)

static span *reservation_of(uintptr_t va, size_t n);

void cuemu_vmm_fail_create(int n)
{
    cuemu_lock();
    g_fail_create = n;
    cuemu_unlock();
}

size_t cuemu_vmm_calls(const char *entry)
{
    size_t n = 0;
    cuemu_lock();
    for (int k = 0; k < N_COUNTED; k++) {
        n += strcmp(entry, g_counted[k]) == 0 ? g_calls[k] : 0;
    }
    cuemu_unlock();
    return n;
}

size_t cuemu_vmm_mapped_bytes(void)
{
    cuemu_lock();
    size_t n = g_mapped;
    cuemu_unlock();
    return n;
}

int cuemu_vmm_accessible(const void *p, size_t nbytes)
{
    uintptr_t va = (uintptr_t)p, covered = va;
    cuemu_lock();
    int in = reservation_of(va, nbytes) != NULL;
    for (int again = in; again;) { /* mappings need not be in address order */
        again = 0;
        for (int k = 0; k < g_n_maps && covered < va + nbytes; k++) {
            if (g_maps[k].accessible && g_maps[k].va <= covered &&
                covered < g_maps[k].va + g_maps[k].nbytes) {
                covered = g_maps[k].va + g_maps[k].nbytes;
                again = 1;
            }
        }
    }
    cuemu_unlock();
    return !in ? -1 : covered >= va + nbytes;
}

static int check_prop(const CUmemAllocationProp *p)
{
    int n = 0;
    return p != NULL && p->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           p->location.type == CU_MEM_LOCATION_TYPE_DEVICE && p->location.id >= 0 &&
           cudaGetDeviceCount(&n) == cudaSuccess && p->location.id < n;
}

static CUresult emu_granularity(size_t *g, const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option)
{
    cuemu_lock();
    if (g == NULL || !check_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        BAD("cuMemGetAllocationGranularity: not pinned memory of a visible device, or a bad "
            "option");
    }
    *g = GRANULE;
    cuemu_unlock();
    return CUDA_SUCCESS;
}

/* The reservation holding [va, va + n), or NULL. Under the lock. */
static span *reservation_of(uintptr_t va, size_t n)
{
    for (int i = 0; i < g_n_res; i++) {
        if (va >= g_res[i].va && va - g_res[i].va + n <= g_res[i].nbytes) {
            return &g_res[i];
        }
    }
    return NULL;
}

static CUresult emu_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                            unsigned long long flags)
{
    cuemu_lock();
    if (ptr == NULL || size == 0 || size % GRANULE != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0 || g_n_res == MAX_ENTRIES) {
        BAD("cuMemAddressReserve(%zu bytes, alignment %zu, flags %llu): the size must be a "
            "non-zero multiple of the granularity (%zu), the alignment a power of two, flags 0",
            size, alignment, flags, GRANULE);
    }
    (void)addr; /* a hint */
    /* Over-reserved to align the start to the granule, the rest given back. */
    size_t align = alignment > GRANULE ? alignment : GRANULE;
    char *p =
        mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        cuemu_set_error(cudaErrorMemoryAllocation, "cuMemAddressReserve(%zu): no addresses", size);
        cuemu_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t start = ((uintptr_t)p + align - 1) / align * align;
    if (start > (uintptr_t)p) {
        (void)munmap(p, start - (uintptr_t)p);
    }
    (void)munmap((char *)start + size, (uintptr_t)p + size + align - start - size);
    int dev = 0;
    (void)cudaGetDevice(&dev);
    g_res[g_n_res++] = (span){start, size, dev, NULL, 0};
    cuemu_register_device((void *)start, size, dev);
    *ptr = (CUdeviceptr)start;
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static CUresult emu_address_free(CUdeviceptr ptr, size_t size)
{
    cuemu_lock();
    int i = 0;
    while (i < g_n_res && (g_res[i].va != (uintptr_t)ptr || g_res[i].nbytes != size)) {
        i++;
    }
    if (i == g_n_res) {
        BAD("cuMemAddressFree(%p, %zu): not a reservation (address and size as reserved)",
            (void *)(uintptr_t)ptr, size);
    }
    for (int k = 0; k < g_n_maps; k++) {
        if (g_maps[k].va >= g_res[i].va && g_maps[k].va - g_res[i].va < size) {
            BAD("cuMemAddressFree(%p, %zu): memory is still mapped at %p (cuMemUnmap first)",
                (void *)(uintptr_t)ptr, size, (void *)g_maps[k].va);
        }
    }
    cuemu_unregister_device((void *)g_res[i].va);
    (void)munmap((void *)g_res[i].va, size);
    g_res[i] = g_res[--g_n_res];
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static CUresult emu_create(CUmemGenericAllocationHandle *h, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags)
{
    cuemu_lock();
    g_calls[N_CREATE]++;
    if (h == NULL || size == 0 || size % GRANULE != 0 || !check_prop(prop) || flags != 0) {
        BAD("cuMemCreate(%zu bytes): the size must be a non-zero multiple of the granularity "
            "(%zu), the properties those of pinned memory of a visible device, flags 0",
            size, GRANULE);
    }
    if (g_fail_create > 0 && --g_fail_create == 0) {
        /* A driver error, which the runtime's last error does not see (as on a GPU). */
        fprintf(stderr, "cuemu: cuMemCreate(%zu): out of memory (test hook)\n", size);
        cuemu_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    phys *p = calloc(1, sizeof(*p));
    int fd = memfd_create("cuemu-cuMemCreate", MFD_CLOEXEC);
    void *m = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0) {
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (p == NULL || m == MAP_FAILED) {
        free(p);
        if (fd >= 0) {
            close(fd);
        }
        cuemu_set_error(cudaErrorMemoryAllocation, "cuMemCreate(%zu): out of memory", size);
        cuemu_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(m, 0xFF, size); /* garbage, as fresh device memory */
    (void)munmap(m, size);
    if (g_n_live == MAX_ENTRIES) {
        free(p);
        close(fd);
        BAD("cuMemCreate: more than %d live allocations", MAX_ENTRIES);
    }
    *p = (phys){fd, prop->location.id, 0, size, 0};
    g_live[g_n_live++] = p;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)p;
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static void destroy(phys *p)
{
    for (int i = 0; i < g_n_live; i++) {
        if (g_live[i] == p) {
            g_live[i] = g_live[--g_n_live];
            break;
        }
    }
    close(p->fd);
    free(p);
}

static CUresult emu_release(CUmemGenericAllocationHandle h)
{
    cuemu_lock();
    g_calls[N_RELEASE]++;
    phys *p = (phys *)(uintptr_t)h;
    if (!live(p) || p->released) {
        BAD("cuMemRelease(%#llx): not a live allocation handle", (unsigned long long)h);
    }
    /* The memory lives on while mapped (the driver frees it at the last unmap). */
    p->released = 1;
    if (p->n_maps == 0) {
        destroy(p);
    }
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static CUresult emu_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                        unsigned long long flags)
{
    cuemu_lock();
    g_calls[N_MAP]++;
    phys *p = (phys *)(uintptr_t)h;
    uintptr_t va = (uintptr_t)ptr;
    if (!live(p) || p->released) {
        BAD("cuMemMap(%p): handle %#llx is not a live allocation", (void *)va,
            (unsigned long long)h);
    }
    if (va % GRANULE != 0 || size == 0 || size % GRANULE != 0 || offset % GRANULE != 0 ||
        offset > p->nbytes || size > p->nbytes - offset || flags != 0) {
        BAD("cuMemMap(%p, %zu bytes, offset %zu): address, size and offset must be multiples of "
            "the granularity (%zu) within the allocation (%zu bytes), flags 0",
            (void *)va, size, offset, GRANULE, p->nbytes);
    }
    if (reservation_of(va, size) == NULL || g_n_maps == MAX_ENTRIES) {
        BAD("cuMemMap(%p, %zu bytes): not inside one reserved address range", (void *)va, size);
    }
    for (int k = 0; k < g_n_maps; k++) {
        if (va < g_maps[k].va + g_maps[k].nbytes && g_maps[k].va < va + size) {
            BAD("cuMemMap(%p, %zu bytes): overlaps the mapping at %p (unmap it first)", (void *)va,
                size, (void *)g_maps[k].va);
        }
    }
    /* Mapped, but not accessible until cuMemSetAccess. */
    if (mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset) ==
        MAP_FAILED) {
        cuemu_set_error(cudaErrorMemoryAllocation, "cuMemMap(%p, %zu): mmap failed", (void *)va,
                        size);
        cuemu_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->n_maps++;
    g_maps[g_n_maps++] = (span){va, size, p->device, p, 0};
    g_mapped += size;
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static CUresult emu_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    cuemu_lock();
    g_calls[N_SET_ACCESS]++;
    uintptr_t va = (uintptr_t)ptr, covered = va;
    if (desc == NULL || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        BAD("cuMemSetAccess(%p): expected one read-write access descriptor for a device",
            (void *)va);
    }
    /* Every byte of the range must be mapped (mappings are visited in address order). */
    for (int again = 1; again;) {
        again = 0;
        for (int k = 0; k < g_n_maps && covered < va + size; k++) {
            if (g_maps[k].va == covered) {
                covered += g_maps[k].nbytes;
                again = 1;
            }
        }
    }
    if (size == 0 || covered < va + size) {
        BAD("cuMemSetAccess(%p, %zu bytes): the range is not wholly mapped (from %p on)",
            (void *)va, size, (void *)covered);
    }
    if (mprotect((void *)va, size, PROT_READ | PROT_WRITE) != 0) {
        BAD("cuMemSetAccess(%p, %zu bytes): mprotect failed", (void *)va, size);
    }
    for (int k = 0; k < g_n_maps; k++) {
        if (g_maps[k].va >= va && g_maps[k].va < va + size) {
            g_maps[k].accessible = 1;
        }
    }
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static CUresult emu_unmap(CUdeviceptr ptr, size_t size)
{
    cuemu_lock();
    g_calls[N_UNMAP]++;
    uintptr_t va = (uintptr_t)ptr, end = va + size;
    /* Exactly one whole mapping: the range is what one cuMemMap mapped. */
    int n_inside = 0;
    size_t inside = 0;
    for (int k = 0; k < g_n_maps; k++) {
        uintptr_t a = g_maps[k].va, b = a + g_maps[k].nbytes;
        if (a < end && va < b) {
            if (a < va || b > end) {
                BAD("cuMemUnmap(%p, %zu bytes): cuts the mapping at %p (%zu bytes): unmap "
                    "whole mappings",
                    (void *)va, size, (void *)a, g_maps[k].nbytes);
            }
            inside += g_maps[k].nbytes;
            n_inside++;
        }
    }
    if (size == 0 || inside != size) {
        BAD("cuMemUnmap(%p, %zu bytes): only %zu bytes of it are mapped", (void *)va, size, inside);
    }
    if (n_inside != 1) {
        BAD("cuMemUnmap(%p, %zu bytes): spans %d mappings: unmap each as it was mapped (the "
            "emulator is stricter than the driver's documentation here)",
            (void *)va, size, n_inside);
    }
    /* Inaccessible again, and not the allocation's memory any more. */
    (void)mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
               -1, 0);
    for (int k = 0; k < g_n_maps;) {
        if (g_maps[k].va >= va && g_maps[k].va < end) {
            phys *p = g_maps[k].handle;
            g_mapped -= g_maps[k].nbytes;
            if (--p->n_maps == 0 && p->released) {
                destroy(p);
            }
            g_maps[k] = g_maps[--g_n_maps];
        } else {
            k++;
        }
    }
    cuemu_unlock();
    return CUDA_SUCCESS;
}

static CUresult emu_device_get(CUdevice *dev, int ordinal)
{
    int n = 0;
    if (dev == NULL || cudaGetDeviceCount(&n) != cudaSuccess || ordinal < 0 || ordinal >= n) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *dev = ordinal;
    return CUDA_SUCCESS;
}

static CUresult emu_device_attribute(int *v, CUdevice_attribute attr, CUdevice dev)
{
    int n = 0;
    if (v == NULL || cudaGetDeviceCount(&n) != cudaSuccess || dev < 0 || dev >= n) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (attr != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
        cuemu_set_error(cudaErrorInvalidValue, "cuDeviceGetAttribute(%d): not emulated", (int)attr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* ACCEL_CUEMU_NO_VMM=1 plays a GPU without it (tests of the refusal). */
    const char *off = getenv("ACCEL_CUEMU_NO_VMM");
    *v = !(off != NULL && atoi(off) != 0);
    return CUDA_SUCCESS;
}

static CUresult emu_error_string(CUresult e, const char **s)
{
    *s = e == CUDA_SUCCESS                ? "no error"
         : e == CUDA_ERROR_INVALID_VALUE  ? "invalid argument"
         : e == CUDA_ERROR_OUT_OF_MEMORY  ? "out of memory"
         : e == CUDA_ERROR_INVALID_DEVICE ? "invalid device ordinal"
                                          : "unknown error";
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    static const struct {
        const char *name;
        void (*fn)(void); /* any function pointer type: called through the right one */
    } table[] = {
        {"cuMemGetAllocationGranularity", (void (*)(void))emu_granularity},
        {"cuMemAddressReserve", (void (*)(void))emu_reserve},
        {"cuMemAddressFree", (void (*)(void))emu_address_free},
        {"cuMemCreate", (void (*)(void))emu_create},
        {"cuMemRelease", (void (*)(void))emu_release},
        {"cuMemMap", (void (*)(void))emu_map},
        {"cuMemSetAccess", (void (*)(void))emu_set_access},
        {"cuMemUnmap", (void (*)(void))emu_unmap},
        {"cuDeviceGet", (void (*)(void))emu_device_get},
        {"cuDeviceGetAttribute", (void (*)(void))emu_device_attribute},
        {"cuGetErrorString", (void (*)(void))emu_error_string},
    };
    if (symbol == NULL || fn == NULL || flags != cudaEnableDefault || version < 10020) {
        cuemu_set_error(cudaErrorInvalidValue,
                        "cudaGetDriverEntryPointByVersion(%s, version %u, flags %llu): bad "
                        "arguments",
                        symbol ? symbol : "(null)", version, flags);
        return cudaErrorInvalidValue;
    }
    *fn = NULL;
    for (size_t k = 0; k < sizeof(table) / sizeof(table[0]); k++) {
        if (strcmp(table[k].name, symbol) == 0) {
            memcpy(fn, &table[k].fn, sizeof(*fn)); /* as dlsym: a function as a void * */
        }
    }
    if (status != NULL) {
        *status = *fn != NULL ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    }
    return cudaSuccess;
}
