/*
 * The accelerator's side of accel/cuda.h (built with ACCEL_CUDA only): the device ordinal and
 * compute stream of a handle, and the GPU facts `accel env` and accel_state_summary print
 * (NCCL's version among them). Reads only: opens no device and creates no CUDA context, except
 * accel_cuda_device_stream, which opens the GPU it is asked about (its compute stream is made
 * with the device).
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "accel/cuda.h"
#include "core/internal.h"
#include "device/device.h"

int accel_cuda_device(const accel *acc)
{
    return acc != NULL && acc->device.type == ACCEL_DEVICE_CUDA ? acc->device.index : -1;
}

cudaStream_t accel_cuda_stream(accel *acc)
{
    if (acc == NULL || acc->device.type != ACCEL_DEVICE_CUDA) {
        accel__seterr(acc, ACCEL_ESTATE, "accel_cuda_stream: the accelerator runs on %s, not a GPU",
                      acc ? acc->device_name : "(NULL)");
        return NULL;
    }
    return accel__stream_native(acc->dev, NULL);
}

cudaStream_t accel_cuda_device_stream(int ordinal)
{
    accel__device *d = NULL;
    if (accel__device_open(&d, (accel_device){ACCEL_DEVICE_CUDA, ordinal}) != ACCEL_OK) {
        accel__seterr(NULL, accel_last_status(NULL), "accel_cuda_device_stream(%d): %s", ordinal,
                      accel_last_error(NULL));
        return NULL;
    }
    return accel__stream_native(d, NULL);
}

void accel__nccl_version(char *buf, size_t nbytes)
{
    int v = 0;
    ncclResult_t r = ncclGetVersion(&v);
    if (r != ncclSuccess) {
        snprintf(buf, nbytes, "unknown (%s)", ncclGetErrorString(r));
        return;
    }
    /* NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch */
    snprintf(buf, nbytes, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

/* Appends a formatted line to buf[*k, nbytes). */
static void add(char *buf, size_t nbytes, size_t *k, const char *fmt, ...) ACCEL_PRINTF(4, 5);
static void add(char *buf, size_t nbytes, size_t *k, const char *fmt, ...)
{
    if (*k + 1 >= nbytes) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *k, nbytes - *k, fmt, ap);
    va_end(ap);
    if (w > 0) {
        *k += (size_t)w < nbytes - *k ? (size_t)w : nbytes - *k - 1;
    }
}

static const char *version(int v, char *out, size_t n)
{
    snprintf(out, n, "%d.%d", v / 1000, v % 1000 / 10);
    return out;
}

char *accel_cuda_report(char *buf, size_t nbytes)
{
    if (buf == NULL || nbytes == 0) {
        return buf;
    }
    buf[0] = '\0';
    size_t k = 0;
    char a[32], b[32], nccl[32];
    int runtime = 0, driver = 0;
    cudaError_t e = cudaRuntimeGetVersion(&runtime);
    add(buf, nbytes, &k, "CUDA runtime: %s\n",
        e == cudaSuccess ? version(runtime, a, sizeof(a)) : cudaGetErrorString(e));
    e = cudaDriverGetVersion(&driver);
    add(buf, nbytes, &k, "CUDA driver: %s\n",
        e != cudaSuccess ? cudaGetErrorString(e)
        : driver == 0    ? "none installed"
                         : version(driver, b, sizeof(b)));
    accel__nccl_version(nccl, sizeof(nccl));
    add(buf, nbytes, &k, "NCCL: %s\n", nccl);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    add(buf, nbytes, &k, "CUDA_VISIBLE_DEVICES: %s\n", vis ? vis : "(unset)");
    int n = 0;
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        add(buf, nbytes, &k, "GPUs: none usable (%s)\n",
            e != cudaSuccess ? cudaGetErrorString(e) : "the runtime sees none");
        return buf;
    }
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess) {
            add(buf, nbytes, &k, "GPU %d: properties unavailable (%s)\n", i, cudaGetErrorString(e));
            continue;
        }
        add(buf, nbytes, &k, "GPU %d: %s, compute capability %d.%d, %.1f GiB\n", i, p.name, p.major,
            p.minor, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
    return buf;
}
