/*
 * accel/tensor.h - element types, devices and tensor views.
 *
 * A tensor here is a *view*: a pointer to contiguous row-major data plus dtype, shape and
 * device. accel never owns the memory of a view; whoever filled in `data` does. The dtype
 * names are the safetensors names ("F32", "BF16", ...), so checkpoints interoperate.
 */
#ifndef ACCEL_TENSOR_H
#define ACCEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. The order is part of the ABI: append only. */
typedef enum accel_dtype {
    ACCEL_F32 = 0,
    ACCEL_F64,
    ACCEL_F16,
    ACCEL_BF16,
    ACCEL_F8_E4M3,
    ACCEL_F8_E5M2,
    ACCEL_I8,
    ACCEL_U8,
    ACCEL_I16,
    ACCEL_U16,
    ACCEL_I32,
    ACCEL_I64,
    ACCEL_BOOL,
    ACCEL_DTYPE_COUNT
} accel_dtype;

/* Bytes per element (4 for ACCEL_F32), or 0 for a value that is not a dtype. */
ACCEL_API size_t accel_dtype_nbytes(accel_dtype dt);

/* The safetensors name ("F32", "BF16", "F8_E4M3", "BOOL"), or NULL for a value that is not a
 * dtype. Returns a static string. */
ACCEL_API const char *accel_dtype_name(accel_dtype dt);

/* Parses a safetensors dtype name (exact, case-sensitive) into *out. Returns ACCEL_OK, or
 * ACCEL_EINVAL when `name` is NULL or unknown (*out untouched). */
ACCEL_API accel_status accel_dtype_from_name(const char *name, accel_dtype *out);

/* 1 for floating-point types (F64, F32, F16, BF16, F8_*), else 0. */
ACCEL_API int accel_dtype_is_float(accel_dtype dt);

typedef enum accel_device_type { ACCEL_DEVICE_CPU = 0, ACCEL_DEVICE_CUDA = 1 } accel_device_type;

typedef struct accel_device {
    accel_device_type type;
    int index; /* CUDA ordinal; 0 for the CPU */
} accel_device;

#define ACCEL_MAX_DIMS 8

/* A contiguous row-major view. ndim == 0 is a scalar (one element). The struct is plain data:
 * copy it freely; the memory behind `data` is borrowed. */
typedef struct accel_tensor {
    void *data;
    accel_dtype dtype;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    accel_device device;
} accel_tensor;

/* Number of elements (product of the shape; 1 for ndim == 0; 0 if any dim is 0). */
ACCEL_API int64_t accel_tensor_numel(const accel_tensor *t);

/* numel * element size in bytes. */
ACCEL_API size_t accel_tensor_nbytes(const accel_tensor *t);

/* Builds a CPU view over `data` with the given shape (ndim <= ACCEL_MAX_DIMS, else ndim is
 * clamped to 0). Borrows `data` and copies `shape`. */
ACCEL_API accel_tensor accel_tensor_view(void *data, accel_dtype dt, int ndim,
                                         const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_TENSOR_H */
