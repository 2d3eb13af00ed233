/*
 * The emulator's virtual memory management (vmm.c), reached as accel reaches the driver
 * (cudaGetDriverEntryPointByVersion): what the real driver requires is refused
 * (CUDA_ERROR_INVALID_VALUE): misaligned sizes and addresses, a map outside a reservation or
 * over a mapping, an unmap cutting a mapping (or, stricter than the driver, spanning two),
 * freeing a reservation still mapped, a released handle; memory is inaccessible between
 * cuMemMap and cuMemSetAccess and after cuMemUnmap (a read faults: a child dies of SIGSEGV);
 * mapped memory is device memory to the runtime's copies; the mapped-bytes count and the call
 * counts follow.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuemu/cuemu.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "test_vmm: %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c);        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *entry(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess);
    CHECK(q == cudaDriverEntryPointSuccess && fn != NULL);
    return fn;
}

/* 1 when reading p kills a child process with SIGSEGV. */
static int faults(const volatile char *p)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        _exit(p[0] == 42 ? 3 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

int main(void)
{
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
    void *p;
#define LOAD(var, name) (p = entry(name), memcpy(&var, &p, sizeof(p)))
    LOAD(granularity, "cuMemGetAllocationGranularity");
    LOAD(reserve, "cuMemAddressReserve");
    LOAD(address_free, "cuMemAddressFree");
    LOAD(create, "cuMemCreate");
    LOAD(release, "cuMemRelease");
    LOAD(map, "cuMemMap");
    LOAD(set_access, "cuMemSetAccess");
    LOAD(unmap, "cuMemUnmap");
    enum cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &p, 12000, cudaEnableDefault, &q) ==
              cudaSuccess &&
          q == cudaDriverEntryPointSymbolNotFound);

    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    CHECK(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    CHECK(g == (size_t)2 << 20);
    prop.location.id = 7; /* no such device */
    CHECK(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 0;

    CUdeviceptr va;
    CHECK(reserve(&va, g + 4096, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE); /* not a multiple */
    CHECK(reserve(&va, 4 * g, 0, 0, 0) == CUDA_SUCCESS && va % g == 0);
    char *base = (char *)(uintptr_t)va;
    CHECK(faults(base)); /* reserved only */

    CUmemGenericAllocationHandle h, h2;
    CHECK(create(&h, g / 2, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(create(&h, 2 * g, &prop, 0) == CUDA_SUCCESS);
    CHECK(create(&h2, g, &prop, 0) == CUDA_SUCCESS);
    CHECK(map(va + 4096, g, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);      /* misaligned */
    CHECK(map(va + 3 * g, 2 * g, 0, h, 0) == CUDA_ERROR_INVALID_VALUE); /* past the range */
    CHECK(map(va, 3 * g, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);         /* past the allocation */
    CHECK(map(va, 2 * g, 0, h, 0) == CUDA_SUCCESS);
    CHECK(cuemu_vmm_mapped_bytes() == 2 * g);
    CHECK(map(va + g, g, 0, h2, 0) == CUDA_ERROR_INVALID_VALUE); /* over a mapping */
    CHECK(faults(base));                                         /* mapped, no access yet */
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(set_access(va, 3 * g, &a, 1) == CUDA_ERROR_INVALID_VALUE); /* not all mapped */
    CHECK(!cuemu_is_device(base, 16));
    CHECK(set_access(va, 2 * g, &a, 1) == CUDA_SUCCESS);
    CHECK(cuemu_is_device(base, 2 * g) && !cuemu_is_device(base, 2 * g + 1));

    /* Fresh memory is garbage (poison); the runtime copies into and out of it. */
    unsigned char probe[8], data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(cudaMemcpy(probe, base + g - 4, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(probe[0] == 0xFF && probe[7] == 0xFF);
    CHECK(cudaMemcpy(base + g - 4, data, 8, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(probe, base + g - 4, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(probe, data, 8) == 0);

    CHECK(release(h) == CUDA_SUCCESS);                          /* lives on while mapped */
    CHECK(release(h) == CUDA_ERROR_INVALID_VALUE);              /* but only once */
    CHECK(address_free(va, 4 * g) == CUDA_ERROR_INVALID_VALUE); /* still mapped */
    CHECK(unmap(va, g) == CUDA_ERROR_INVALID_VALUE);            /* cuts the mapping */
    CHECK(unmap(va, 2 * g) == CUDA_SUCCESS);
    CHECK(cuemu_vmm_mapped_bytes() == 0 && !cuemu_is_device(base, 16));
    CHECK(faults(base) && faults(base + g));
    CHECK(unmap(va, 2 * g) == CUDA_ERROR_INVALID_VALUE); /* nothing mapped there */

    /* Memory of one allocation stays its own across mappings. */
    CHECK(map(va + 3 * g, g, 0, h2, 0) == CUDA_SUCCESS);
    CHECK(set_access(va + 3 * g, g, &a, 1) == CUDA_SUCCESS);
    CHECK(cudaMemcpy(base + 3 * g, data, 8, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(unmap(va + 3 * g, g) == CUDA_SUCCESS);
    CHECK(map(va, g, 0, h2, 0) == CUDA_SUCCESS);
    CHECK(set_access(va, g, &a, 1) == CUDA_SUCCESS);
    CHECK(cudaMemcpy(probe, base, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(probe, data, 8) == 0);
    CHECK(unmap(va, g) == CUDA_SUCCESS && release(h2) == CUDA_SUCCESS);

    /* One unmap per mapping: two neighbours are two calls, each counted. */
    size_t creates = cuemu_vmm_calls("cuMemCreate"), unmaps = cuemu_vmm_calls("cuMemUnmap");
    CHECK(create(&h, g, &prop, 0) == CUDA_SUCCESS && create(&h2, g, &prop, 0) == CUDA_SUCCESS);
    CHECK(map(va, g, 0, h, 0) == CUDA_SUCCESS && map(va + g, g, 0, h2, 0) == CUDA_SUCCESS);
    CHECK(unmap(va, 2 * g) == CUDA_ERROR_INVALID_VALUE); /* spans two mappings */
    CHECK(cuemu_vmm_mapped_bytes() == 2 * g);
    CHECK(unmap(va, g) == CUDA_SUCCESS && unmap(va + g, g) == CUDA_SUCCESS);
    CHECK(release(h) == CUDA_SUCCESS && release(h2) == CUDA_SUCCESS);
    CHECK(cuemu_vmm_calls("cuMemCreate") == creates + 2 &&
          cuemu_vmm_calls("cuMemUnmap") == unmaps + 3 && cuemu_vmm_calls("cuMemFree") == 0);
    CHECK(address_free(va, 4 * g) == CUDA_SUCCESS);
    (void)cudaGetLastError(); /* the refusals above were recorded */
    printf("test_vmm: ok\n");
    return 0;
}
