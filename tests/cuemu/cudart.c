/*
 * The CUDA runtime of the emulator build (cuemu.h): the functions of cuda_runtime_api.h that
 * accel calls, with their documented behaviour on host memory.
 *
 * Devices: ACCEL_CUEMU_DEVICES of them (default 1), narrowed by CUDA_VISIBLE_DEVICES as the
 * real runtime does (a list of ordinals, ending at the first invalid entry). Device memory is
 * host memory registered with its size and device, poisoned with 0xFF bytes (NaN as floats)
 * so reads of memory nobody wrote show up; pinned memory is registered as such. Copies check
 * their direction against where the pointers live, and device spans against their
 * allocation, as the real runtime would fail (cudaErrorInvalidValue), printing the culprit.
 * Streams and events are handles; everything has completed when the call returns.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuemu.h"

#define EMU_TOTAL_MEM ((size_t)16 << 30) /* what each emulated device claims to have */

/* ---- the lock, the last error, the current device ---- */

static pthread_mutex_t g_mu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Thread_local cudaError_t t_last = cudaSuccess;
static _Thread_local int t_device;

static void init_lock(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_mu, &a);
    pthread_mutexattr_destroy(&a);
}

void cuemu_lock(void)
{
    pthread_once(&g_once, init_lock);
    pthread_mutex_lock(&g_mu);
}

void cuemu_unlock(void)
{
    pthread_mutex_unlock(&g_mu);
}

void cuemu_set_error(int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuemu: %s\n", msg);
    t_last = (cudaError_t)err;
}

/* Fails the calling function with err, recording it. */
#define FAIL(err, ...)                                                                             \
    do {                                                                                           \
        cuemu_set_error((err), __VA_ARGS__);                                                       \
        return (err);                                                                              \
    } while (0)

/* ---- devices ---- */

static int g_n_devices = -1;
static int g_visible[64]; /* emulated ordinal of each visible device */

static int n_devices(void)
{
    cuemu_lock();
    if (g_n_devices < 0) {
        const char *s = getenv("ACCEL_CUEMU_DEVICES");
        int total = s != NULL && *s ? atoi(s) : 1;
        total = total < 0 ? 0 : total > 64 ? 64 : total;
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        int n = 0;
        if (vis == NULL) {
            for (; n < total; n++) {
                g_visible[n] = n;
            }
        } else {
            const char *p = vis;
            while (*p != '\0' && n < 64) {
                char *end = NULL;
                long v = strtol(p, &end, 10);
                if (end == p || v < 0 || v >= total) {
                    break; /* the real runtime stops at the first invalid entry */
                }
                g_visible[n++] = (int)v;
                p = *end == ',' ? end + 1 : end;
                if (*end != ',' && *end != '\0') {
                    break;
                }
            }
        }
        g_n_devices = n;
    }
    int n = g_n_devices;
    cuemu_unlock();
    return n;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    int n = n_devices();
    *count = n;
    if (n == 0) {
        FAIL(cudaErrorNoDevice, "cudaGetDeviceCount: no emulated device visible "
                                "(ACCEL_CUEMU_DEVICES, CUDA_VISIBLE_DEVICES)");
    }
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= n_devices()) {
        FAIL(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d device(s) visible", device,
             n_devices());
    }
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (prop == NULL || device < 0 || device >= n_devices()) {
        FAIL(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): %d device(s) visible", device,
             n_devices());
    }
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "accel CUDA emulator %d", g_visible[device]);
    prop->totalGlobalMem = EMU_TOTAL_MEM;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = 48 << 10;
    prop->sharedMemPerBlockOptin = CUEMU_SMEM_OPTIN;
    prop->pciBusID = g_visible[device];
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    return cudaSuccess;
}

/* ---- the allocation table, sorted by address ---- */

typedef struct alloc {
    char *base;
    size_t nbytes;
    cuemu_kind kind;
    int device;
} alloc;

static alloc *g_allocs;
static size_t g_n, g_cap;
static size_t g_device_bytes[64];

/* Index of the last allocation starting at or below p, or -1. Under the lock. */
static long find_below(const void *p)
{
    long lo = 0, hi = (long)g_n - 1, best = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if ((uintptr_t)g_allocs[mid].base <= (uintptr_t)p) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

cuemu_kind cuemu_lookup(const void *p, const void **base, size_t *nbytes, int *device)
{
    cuemu_kind k = CUEMU_UNKNOWN;
    cuemu_lock();
    long i = p != NULL ? find_below(p) : -1;
    /* A pointer one past the end belongs to no allocation (as an empty span it is harmless). */
    if (i >= 0 && (uintptr_t)p < (uintptr_t)g_allocs[i].base + g_allocs[i].nbytes) {
        k = g_allocs[i].kind;
        if (base != NULL) {
            *base = g_allocs[i].base;
        }
        if (nbytes != NULL) {
            *nbytes = g_allocs[i].nbytes;
        }
        if (device != NULL) {
            *device = g_allocs[i].device;
        }
    }
    cuemu_unlock();
    return k;
}

int cuemu_is_device(const void *p, size_t nbytes)
{
    const void *base = NULL;
    size_t n = 0;
    if (cuemu_lookup(p, &base, &n, NULL) != CUEMU_DEVICE) {
        return 0;
    }
    /* Inside a reserved range (vmm.c) only where mapped and accessible. */
    return (size_t)((const char *)p - (const char *)base) + nbytes <= n &&
           cuemu_vmm_accessible(p, nbytes) != 0;
}

/* Inserts a known block into the table (under the lock). */
static void insert(char *p, size_t nbytes, cuemu_kind kind, int dev)
{
    long i = find_below(p) + 1;
    memmove(&g_allocs[i + 1], &g_allocs[i], (g_n - (size_t)i) * sizeof *g_allocs);
    g_allocs[i] = (alloc){p, nbytes, kind, dev};
    g_n++;
}

int cuemu_register_device(void *p, size_t nbytes, int device)
{
    cuemu_lock();
    if (g_n == g_cap && (g_cap = g_cap ? 2 * g_cap : 64,
                         g_allocs = realloc(g_allocs, g_cap * sizeof *g_allocs)) == NULL) {
        cuemu_unlock();
        return -1;
    }
    insert(p, nbytes, CUEMU_DEVICE, device);
    cuemu_unlock();
    return 0;
}

void cuemu_unregister_device(void *p)
{
    cuemu_lock();
    long i = find_below(p);
    if (i >= 0 && g_allocs[i].base == p) {
        memmove(&g_allocs[i], &g_allocs[i + 1], (g_n - (size_t)i - 1) * sizeof *g_allocs);
        g_n--;
    }
    cuemu_unlock();
}

static cudaError_t add_alloc(void **out, size_t nbytes, cuemu_kind kind, const char *fn)
{
    *out = NULL;
    int dev = t_device;
    cuemu_lock();
    if (kind == CUEMU_DEVICE && g_device_bytes[dev] + nbytes > EMU_TOTAL_MEM) {
        cuemu_unlock();
        FAIL(cudaErrorMemoryAllocation, "%s(%zu bytes): device %d has %zu of %zu bytes in use", fn,
             nbytes, dev, g_device_bytes[dev], EMU_TOTAL_MEM);
    }
    /* 256-byte alignment as cudaMalloc guarantees; at least one byte so every allocation has
     * its own address. */
    size_t cap = (nbytes + 255) / 256 * 256;
    char *p = aligned_alloc(256, cap > 0 ? cap : 256);
    if (p == NULL ||
        (g_n == g_cap && (g_cap = g_cap ? 2 * g_cap : 64,
                          g_allocs = realloc(g_allocs, g_cap * sizeof *g_allocs)) == NULL)) {
        free(p);
        cuemu_unlock();
        FAIL(cudaErrorMemoryAllocation, "%s(%zu bytes): host memory exhausted", fn, nbytes);
    }
    if (kind == CUEMU_DEVICE) {
        memset(p, 0xFF, cap > 0 ? cap : 256);
        g_device_bytes[dev] += nbytes;
    }
    insert(p, nbytes, kind, dev);
    cuemu_unlock();
    *out = p;
    return cudaSuccess;
}

static cudaError_t drop_alloc(void *p, cuemu_kind kind, const char *fn)
{
    if (p == NULL) {
        return cudaSuccess;
    }
    cuemu_lock();
    long i = find_below(p);
    if (i < 0 || g_allocs[i].base != p || g_allocs[i].kind != kind) {
        cuemu_unlock();
        FAIL(cudaErrorInvalidValue, "%s(%p): not the start of a live %s allocation", fn, p,
             kind == CUEMU_DEVICE ? "cudaMalloc" : "cudaHostAlloc");
    }
    if (kind == CUEMU_DEVICE) {
        g_device_bytes[g_allocs[i].device] -= g_allocs[i].nbytes;
    }
    memmove(&g_allocs[i], &g_allocs[i + 1], (g_n - (size_t)i - 1) * sizeof *g_allocs);
    g_n--;
    cuemu_unlock();
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t nbytes)
{
    return add_alloc(p, nbytes, CUEMU_DEVICE, "cudaMalloc");
}

cudaError_t cudaFree(void *p)
{
    return drop_alloc(p, CUEMU_DEVICE, "cudaFree");
}

cudaError_t cudaHostAlloc(void **p, size_t nbytes, unsigned int flags)
{
    (void)flags;
    return add_alloc(p, nbytes, CUEMU_PINNED, "cudaHostAlloc");
}

cudaError_t cudaMallocHost(void **p, size_t nbytes)
{
    return add_alloc(p, nbytes, CUEMU_PINNED, "cudaMallocHost");
}

cudaError_t cudaFreeHost(void *p)
{
    return drop_alloc(p, CUEMU_PINNED, "cudaFreeHost");
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    cuemu_lock();
    *free_bytes = EMU_TOTAL_MEM - g_device_bytes[t_device];
    *total = EMU_TOTAL_MEM;
    cuemu_unlock();
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    int dev = 0;
    switch (cuemu_lookup(p, NULL, NULL, &dev)) {
    case CUEMU_DEVICE:
        a->type = cudaMemoryTypeDevice;
        a->device = dev;
        a->devicePointer = (void *)p;
        break;
    case CUEMU_PINNED:
        a->type = cudaMemoryTypeHost;
        a->device = dev;
        a->devicePointer = (void *)p; /* mapped: the same address, as with UVA */
        a->hostPointer = (void *)p;
        break;
    default:
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
        a->hostPointer = (void *)p;
        break;
    }
    return cudaSuccess;
}

/* ---- copies and memsets ---- */

static const char *kind_name(enum cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost:
        return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
        return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
        return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
        return "cudaMemcpyDeviceToDevice";
    default:
        return "cudaMemcpyDefault";
    }
}

/* Checks one end of a copy: on the device iff dev, and then inside its allocation. */
static cudaError_t check_end(const char *fn, const char *which, const void *p, size_t n, int dev,
                             enum cudaMemcpyKind k)
{
    if (n == 0) {
        return cudaSuccess;
    }
    if (p == NULL) {
        FAIL(cudaErrorInvalidValue, "%s: %s is NULL (%zu bytes)", fn, which, n);
    }
    cuemu_kind kind = cuemu_lookup(p, NULL, NULL, NULL);
    if (dev && kind != CUEMU_DEVICE) {
        FAIL(cudaErrorInvalidValue, "%s(%s): %s %p is %s memory, not device memory", fn,
             kind_name(k), which, p, kind == CUEMU_PINNED ? "pinned host" : "host");
    }
    if (!dev && kind == CUEMU_DEVICE) {
        FAIL(cudaErrorInvalidValue, "%s(%s): %s %p is device memory", fn, kind_name(k), which, p);
    }
    if (dev && cuemu_vmm_accessible(p, n) == 0) {
        FAIL(cudaErrorInvalidValue,
             "%s: %s %p + %zu bytes reaches unmapped memory of a reserved address range (no "
             "cuMemMap + cuMemSetAccess there: on a GPU an illegal address)",
             fn, which, p, n);
    }
    if (dev && !cuemu_is_device(p, n)) {
        FAIL(cudaErrorInvalidValue, "%s: %s %p + %zu bytes runs past its cudaMalloc allocation", fn,
             which, p, n);
    }
    return cudaSuccess;
}

static cudaError_t copy(const char *fn, void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    if (k == cudaMemcpyDefault) {
        k = (enum cudaMemcpyKind)((cuemu_lookup(src, NULL, NULL, NULL) == CUEMU_DEVICE ? 2 : 0) +
                                  (cuemu_lookup(dst, NULL, NULL, NULL) == CUEMU_DEVICE ? 1 : 0));
    }
    if ((int)k < 0 || (int)k > 3) {
        FAIL(cudaErrorInvalidMemcpyDirection, "%s: invalid direction %d", fn, (int)k);
    }
    cudaError_t e = check_end(fn, "dst", dst, n,
                              k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice, k);
    if (e == cudaSuccess) {
        e = check_end(fn, "src", src, n,
                      k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice, k);
    }
    if (e != cudaSuccess) {
        return e;
    }
    if (n > 0) {
        cuemu_lock();
        memmove(dst, src, n);
        cuemu_unlock();
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    return copy("cudaMemcpy", dst, src, n, k);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s)
{
    (void)s;
    return copy("cudaMemcpyAsync", dst, src, n, k);
}

static cudaError_t set(const char *fn, void *p, int v, size_t n)
{
    cudaError_t e = check_end(fn, "dst", p, n, 1, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && n > 0) {
        cuemu_lock();
        memset(p, v, n);
        cuemu_unlock();
    }
    return e;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    return set("cudaMemset", p, v, n);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    (void)s;
    return set("cudaMemsetAsync", p, v, n);
}

/* ---- streams and events: handles only (work is done when issued) ---- */

typedef struct emu_handle {
    unsigned magic;
} emu_handle;

#define STREAM_MAGIC 0x5743A11u
#define EVENT_MAGIC 0xE7E47u

static cudaError_t new_handle(void **out, unsigned magic)
{
    emu_handle *h = malloc(sizeof *h);
    if (h == NULL) {
        FAIL(cudaErrorMemoryAllocation, "out of host memory for a handle");
    }
    h->magic = magic;
    *out = h;
    return cudaSuccess;
}

/* The default stream (NULL) is always valid. */
static cudaError_t check_handle(const void *h, unsigned magic, const char *fn)
{
    if (h == NULL ? magic == STREAM_MAGIC : ((const emu_handle *)h)->magic == magic) {
        return cudaSuccess;
    }
    FAIL(cudaErrorInvalidResourceHandle, "%s: %p is not a live %s", fn, h,
         magic == STREAM_MAGIC ? "stream" : "event");
}

static cudaError_t free_handle(void *h, unsigned magic, const char *fn)
{
    cudaError_t e = h != NULL ? check_handle(h, magic, fn) : cudaErrorInvalidResourceHandle;
    if (e == cudaSuccess) {
        ((emu_handle *)h)->magic = 0;
        free(h);
    }
    return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    return new_handle((void **)s, STREAM_MAGIC);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    return free_handle(s, STREAM_MAGIC, "cudaStreamDestroy");
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    return check_handle(s, STREAM_MAGIC, "cudaStreamSynchronize");
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    cudaError_t r = check_handle(s, STREAM_MAGIC, "cudaStreamWaitEvent");
    return r == cudaSuccess ? check_handle(e, EVENT_MAGIC, "cudaStreamWaitEvent") : r;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return new_handle((void **)e, EVENT_MAGIC);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    return new_handle((void **)e, EVENT_MAGIC);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    return free_handle(e, EVENT_MAGIC, "cudaEventDestroy");
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    cudaError_t r = check_handle(s, STREAM_MAGIC, "cudaEventRecord");
    return r == cudaSuccess ? check_handle(e, EVENT_MAGIC, "cudaEventRecord") : r;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    return check_handle(e, EVENT_MAGIC, "cudaEventQuery");
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    return check_handle(e, EVENT_MAGIC, "cudaEventSynchronize");
}

/* ---- errors ---- */

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection:
        return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
        return "cudaErrorNotReady";
    default:
        return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : cudaGetErrorName(e);
}
