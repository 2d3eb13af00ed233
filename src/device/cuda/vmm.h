/*
 * Reserved address ranges on a CUDA GPU (vmm.c): the device seam's range operations
 * (device_impl.h) through the driver's virtual memory management, for cuda.c's table. Each
 * call selects nothing: cuda.c has made the GPU current on the calling thread (the runtime's
 * primary context, which the driver calls use).
 */
#ifndef ACCEL_DEVICE_CUDA_VMM_H
#define ACCEL_DEVICE_CUDA_VMM_H

#include <stddef.h>

#include "accel/status.h"

/* The minimum granularity of pinned memory on GPU `ordinal`; ACCEL_EUNSUPPORTED naming the
 * GPU (`name`) when it has no virtual memory management or the driver's entry points are
 * missing. */
accel_status accel__cuda_vmm_granularity(int ordinal, const char *name, size_t *out);
accel_status accel__cuda_vmm_reserve(int ordinal, size_t nbytes, void **base);
void accel__cuda_vmm_release(void *base, size_t nbytes);
/* cuMemCreate of nbytes (a run of granules) on the GPU, cuMemMap at `at`, cuMemSetAccess
 * read-write for it: three driver calls whatever the run's length. */
accel_status accel__cuda_vmm_map(int ordinal, void *at, size_t nbytes, void **phys);
/* cuMemUnmap of exactly the run one accel__cuda_vmm_map mapped, then cuMemRelease of its
 * allocation. */
accel_status accel__cuda_vmm_unmap(void *at, size_t nbytes, void *phys);

#endif /* ACCEL_DEVICE_CUDA_VMM_H */
