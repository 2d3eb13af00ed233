/*
 * CUDA virtual memory management for reserved ranges (vmm.h): cuMemAddressReserve,
 * cuMemCreate (pinned device memory of the GPU), cuMemMap, cuMemSetAccess, cuMemUnmap,
 * cuMemRelease, cuMemAddressFree. One map is one run of granules (range.c coalesces the
 * granules that come and go together): one cuMemCreate of its size, one cuMemMap, one
 * cuMemSetAccess; its unmap is one cuMemUnmap of exactly that run, then cuMemRelease.
 *
 * The driver functions come through the runtime (cudaGetDriverEntryPointByVersion, the ABI of
 * CUDA 12.0), not by linking libcuda: libaccel then loads wherever the runtime does (a
 * container or CI machine with the toolkit's runtime but no driver library), and a driver
 * without them refuses stage 3 with a message instead of failing to load. Invariant: the
 * table is filled once (pthread_once); a missing entry leaves `missing` naming it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "base/base.h"
#include "vmm.h"

/* The driver's functions, with the signatures of cuda.h. */
static struct {
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*error_string)(CUresult, const char **);
    const char *missing; /* the first entry point not found, or NULL */
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* Fills the function pointer at `slot` (NULL when missing). */
static void load_one(void *slot, const char *name)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == NULL) {
        (void)cudaGetLastError(); /* consumed: not a later kernel's error */
        fn = NULL;
        drv.missing = drv.missing ? drv.missing : name;
    }
    memcpy(slot, &fn, sizeof(fn)); /* a function as a void * (dlsym's convention) */
}

static void load(void)
{
    load_one(&drv.granularity, "cuMemGetAllocationGranularity");
    load_one(&drv.reserve, "cuMemAddressReserve");
    load_one(&drv.address_free, "cuMemAddressFree");
    load_one(&drv.create, "cuMemCreate");
    load_one(&drv.release, "cuMemRelease");
    load_one(&drv.map, "cuMemMap");
    load_one(&drv.set_access, "cuMemSetAccess");
    load_one(&drv.unmap, "cuMemUnmap");
    load_one(&drv.device_get, "cuDeviceGet");
    load_one(&drv.attribute, "cuDeviceGetAttribute");
    load_one(&drv.error_string, "cuGetErrorString");
}

/* The thread error for a failed driver call (at: the address it was given, or NULL):
 * ACCEL_ENOMEM when out of memory. */
static accel_status fail_at(CUresult r, const char *call, int ordinal, size_t nbytes,
                            const void *at)
{
    const char *s = NULL;
    char where[48] = "";
    if (drv.error_string == NULL || drv.error_string(r, &s) != CUDA_SUCCESS || s == NULL) {
        s = "unknown error";
    }
    if (at != NULL) {
        snprintf(where, sizeof(where), " at %p", at);
    }
    return accel__seterr(NULL, r == CUDA_ERROR_OUT_OF_MEMORY ? ACCEL_ENOMEM : ACCEL_EIO,
                         "CUDA driver: %s (cuda:%d, %zu bytes%s) failed: %s (CUresult %d)", call,
                         ordinal, nbytes, where, s, (int)r);
}

static accel_status fail(CUresult r, const char *call, int ordinal, size_t nbytes)
{
    return fail_at(r, call, ordinal, nbytes, NULL);
}

#define DRV_TRY(call, what, ordinal, nbytes)                                                       \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            return fail(r_, what, ordinal, nbytes);                                                \
        }                                                                                          \
    } while (0)

static CUmemAllocationProp prop_of(int ordinal)
{
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal;
    return p;
}

accel_status accel__cuda_vmm_granularity(int ordinal, const char *name, size_t *out)
{
    pthread_once(&drv_once, load);
    if (drv.missing != NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "cuda:%d (%s): the CUDA driver has no %s (virtual memory "
                             "management needs a driver of CUDA 10.2 or later)",
                             ordinal, name, drv.missing);
    }
    CUdevice dev;
    int vmm = 0;
    DRV_TRY(drv.device_get(&dev, ordinal), "cuDeviceGet", ordinal, 0);
    DRV_TRY(drv.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
            "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", ordinal, 0);
    if (!vmm) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "cuda:%d (%s) does not support virtual memory management "
                             "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
                             ordinal, name);
    }
    CUmemAllocationProp p = prop_of(ordinal);
    DRV_TRY(drv.granularity(out, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity", ordinal, 0);
    return ACCEL_OK;
}

accel_status accel__cuda_vmm_reserve(int ordinal, size_t nbytes, void **base)
{
    CUdeviceptr p = 0;
    DRV_TRY(drv.reserve(&p, nbytes, 0, 0, 0), "cuMemAddressReserve", ordinal, nbytes);
    *base = (void *)(uintptr_t)p;
    return ACCEL_OK;
}

void accel__cuda_vmm_release(void *base, size_t nbytes)
{
    CUresult r = drv.address_free((CUdeviceptr)(uintptr_t)base, nbytes);
    if (r != CUDA_SUCCESS) {
        (void)fail(r, "cuMemAddressFree", -1, nbytes);
        accel__log(NULL, ACCEL__LOG_WARN, "%s", accel_last_error(NULL));
    }
}

accel_status accel__cuda_vmm_map(int ordinal, void *at, size_t nbytes, void **phys)
{
    CUmemAllocationProp p = prop_of(ordinal);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va = (CUdeviceptr)(uintptr_t)at;
    CUresult r = drv.create(&h, nbytes, &p, 0);
    if (r != CUDA_SUCCESS) {
        return fail_at(r, "cuMemCreate", ordinal, nbytes, at);
    }
    const char *call = "cuMemMap";
    r = drv.map(va, nbytes, 0, h, 0);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, ordinal},
                             CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        call = "cuMemSetAccess";
        r = drv.set_access(va, nbytes, &a, 1);
        if (r != CUDA_SUCCESS) {
            (void)drv.unmap(va, nbytes);
        }
    }
    if (r != CUDA_SUCCESS) {
        (void)drv.release(h);
        return fail_at(r, call, ordinal, nbytes, at);
    }
    /* Kept (not released at once) so that unmap hands the same allocation back. */
    *phys = (void *)(uintptr_t)h;
    return ACCEL_OK;
}

accel_status accel__cuda_vmm_unmap(void *at, size_t nbytes, void *phys)
{
    CUresult r = drv.unmap((CUdeviceptr)(uintptr_t)at, nbytes);
    if (r != CUDA_SUCCESS) {
        return fail_at(r, "cuMemUnmap", -1, nbytes, at);
    }
    DRV_TRY(drv.release((CUmemGenericAllocationHandle)(uintptr_t)phys), "cuMemRelease", -1, nbytes);
    return ACCEL_OK;
}
