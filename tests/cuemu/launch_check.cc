/*
 * The emulator's launch checks (kernel.h): what a GPU refuses before a kernel runs. A grid or
 * block with a zero dimension or past the limits, more dynamic shared memory than the kernel may
 * use (48 KiB, or what cudaFuncSetAttribute's MaxDynamicSharedMemorySize allowed it, at most
 * sm_90's 227 KiB), or host memory among the pointer arguments is recorded as the runtime's last
 * error (cuemu_set_error), and the launch does not run; kernel.cc runs the launches that pass.
 *
 * Invariant: the per-kernel shared memory limits are read and written under g_attr_lock, not
 * cuemu_lock (the checks run before a launch takes it).
 */
#include "cuemu/kernel.h"

#include <stdio.h>

#include <mutex>

namespace cuemu
{

namespace
{

/* cudaFuncSetAttribute's MaxDynamicSharedMemorySize per kernel (a few kernels ask). */
struct smem_attr {
    const void *func;
    size_t nbytes;
};
std::mutex g_attr_lock;
smem_attr g_attrs[64];
int g_n_attrs;

size_t max_dynamic_shared(const void *func)
{
    std::lock_guard<std::mutex> hold(g_attr_lock);
    for (int i = 0; i < g_n_attrs; i++) {
        if (g_attrs[i].func == func) {
            return g_attrs[i].nbytes;
        }
    }
    return 48 * 1024;
}

} // namespace

int launch_check(const launch_site &s)
{
    kernel_name name(s.kernel);
    const char *k = name.s;
    const dim3 &g = s.grid, &b = s.block;
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0) {
        cuemu_set_error(cudaErrorInvalidConfiguration,
                        "kernel %s (%s:%d): grid (%u,%u,%u), block (%u,%u,%u): a zero dimension", k,
                        s.file, s.line, g.x, g.y, g.z, b.x, b.y, b.z);
        return 1;
    }
    if (threads > 1024 || b.z > 64) {
        cuemu_set_error(cudaErrorInvalidConfiguration,
                        "kernel %s (%s:%d): block (%u,%u,%u) has %llu threads (at most 1024, "
                        "z at most 64)",
                        k, s.file, s.line, b.x, b.y, b.z, threads);
        return 1;
    }
    if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        cuemu_set_error(cudaErrorInvalidConfiguration,
                        "kernel %s (%s:%d): grid (%u,%u,%u) exceeds (2^31-1, 65535, 65535)", k,
                        s.file, s.line, g.x, g.y, g.z);
        return 1;
    }
    size_t smem_max = max_dynamic_shared(s.func);
    if (s.smem > smem_max) {
        cuemu_set_error(
            cudaErrorInvalidValue,
            "kernel %s (%s:%d): %zu bytes of dynamic shared memory (at most %zu: 48 KiB "
            "unless cudaFuncSetAttribute's MaxDynamicSharedMemorySize allows more)",
            k, s.file, s.line, s.smem, smem_max);
        return 1;
    }
    return 0;
}

int check_pointer_arg(const launch_site &s, int index, const void *p)
{
    if (p == nullptr || cuemu_lookup(p, nullptr, nullptr, nullptr) != CUEMU_UNKNOWN) {
        return 0;
    }
    /* One past the end of an allocation (an empty span at its end) is a device pointer too. */
    if (cuemu_lookup(static_cast<const char *>(p) - 1, nullptr, nullptr, nullptr) == CUEMU_DEVICE) {
        return 0;
    }
    cuemu_set_error(cudaErrorInvalidValue,
                    "kernel %s (%s:%d): argument %d (%p) is host memory, not device memory "
                    "(cudaMalloc); the kernel did not run",
                    kernel_name(s.kernel).s, s.file, s.line, index, p);
    return 1;
}

} // namespace cuemu

/* sm_90's limit: 227 KiB a block, with the block's static shared memory (not counted here). */
extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                            int value)
{
    if (func == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > CUEMU_SMEM_OPTIN) {
        cuemu_set_error(cudaErrorInvalidValue,
                        "cudaFuncSetAttribute(%p, %d, %d): the emulator takes only "
                        "MaxDynamicSharedMemorySize, 0 to %d bytes",
                        func, (int)attr, value, CUEMU_SMEM_OPTIN);
        return cudaErrorInvalidValue;
    }
    std::lock_guard<std::mutex> hold(cuemu::g_attr_lock);
    for (int i = 0; i < cuemu::g_n_attrs; i++) {
        if (cuemu::g_attrs[i].func == func) {
            cuemu::g_attrs[i].nbytes = (size_t)value;
            return cudaSuccess;
        }
    }
    if (cuemu::g_n_attrs == (int)(sizeof(cuemu::g_attrs) / sizeof(cuemu::g_attrs[0]))) {
        cuemu_set_error(cudaErrorMemoryAllocation,
                        "cudaFuncSetAttribute: more kernels than the emulator's table holds");
        return cudaErrorMemoryAllocation;
    }
    cuemu::g_attrs[cuemu::g_n_attrs++] = {func, (size_t)value};
    return cudaSuccess;
}
