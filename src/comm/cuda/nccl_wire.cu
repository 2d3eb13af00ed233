/*
 * The nccl backend's wire conversions (nccl_wire.h): grid-stride element-wise kernels.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "nccl_wire.h"

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxGrid = 4096;

unsigned grid_for(size_t n)
{
    size_t g = (n + kThreads - 1) / kThreads;
    return g == 0 ? 1u : g > kMaxGrid ? kMaxGrid : (unsigned)g;
}

template <bool BF16> __global__ void pack_kernel(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (BF16) {
            __nv_bfloat16 h = __float2bfloat16_rn(src[i]);
            dst[i] = *reinterpret_cast<const uint16_t *>(&h);
        } else {
            __half h = __float2half_rn(src[i]);
            dst[i] = *reinterpret_cast<const uint16_t *>(&h);
        }
    }
}

template <bool BF16> __global__ void unpack_kernel(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint16_t b = src[i];
        if (BF16) {
            dst[i] = __uint_as_float((uint32_t)b << 16);
        } else {
            dst[i] = __half2float(*reinterpret_cast<const __half *>(&b));
        }
    }
}

} // namespace

extern "C" {

cudaError_t accel__nccl_wire_pack(uint16_t *dst, const float *src, size_t n, int bf16,
                                  cudaStream_t s)
{
    if (bf16) {
        pack_kernel<true><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    } else {
        pack_kernel<false><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    }
    return cudaGetLastError();
}

cudaError_t accel__nccl_wire_unpack(float *dst, const uint16_t *src, size_t n, int bf16,
                                    cudaStream_t s)
{
    if (bf16) {
        unpack_kernel<true><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    } else {
        unpack_kernel<false><<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    }
    return cudaGetLastError();
}

} /* extern "C" */
