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

/* Element types: every dtype of the safetensors format. The order is part of the ABI: append
 * only. Training and reductions work with the first thirteen (F32 to BOOL); the others are for
 * files: collectives move the whole-byte ones without reducing them, and accel_convert says
 * which conversions exist (docs/checkpoint.md has the table). */
typedef enum accel_dtype {
    ACCEL_F32 = 0,
    ACCEL_F64,
    ACCEL_F16,
    ACCEL_BF16,
    ACCEL_F8_E4M3, /* OCP FP8 E4M3 (PyTorch float8_e4m3fn): no inf, max 448 */
    ACCEL_F8_E5M2, /* OCP FP8 E5M2 (float8_e5m2) */
    ACCEL_I8,
    ACCEL_U8,
    ACCEL_I16,
    ACCEL_U16,
    ACCEL_I32,
    ACCEL_I64,
    ACCEL_BOOL,
    ACCEL_U32,
    ACCEL_U64,
    ACCEL_C64,         /* complex: two F32, real then imaginary */
    ACCEL_F8_E8M0,     /* OCP MX scale: 2^(bits - 127), 0xff = NaN; no sign, no zero */
    ACCEL_F8_E4M3FNUZ, /* FP8 E4M3, bias 8, no inf, no -0, NaN = 0x80 (float8_e4m3fnuz) */
    ACCEL_F8_E5M2FNUZ, /* FP8 E5M2, bias 16, no inf, no -0, NaN = 0x80 (float8_e5m2fnuz) */
    ACCEL_F4,          /* OCP MX FP4 E2M1, 4 bits per element, packed */
    ACCEL_F6_E2M3,     /* OCP MX FP6, 6 bits per element, packed */
    ACCEL_F6_E3M2,     /* OCP MX FP6, 6 bits per element, packed */
    ACCEL_DTYPE_COUNT
} accel_dtype;

/* Bytes per element (4 for ACCEL_F32), or 0 for a value that is not a dtype and for the
 * sub-byte dtypes (F4, F6_*), whose size is accel_dtype_bits. */
ACCEL_API size_t accel_dtype_nbytes(accel_dtype dt);

/* Bits per element (32 for ACCEL_F32, 4 for ACCEL_F4), or 0 for a value that is not a dtype. */
ACCEL_API size_t accel_dtype_bits(accel_dtype dt);

/* The safetensors name ("F32", "BF16", "F8_E4M3", "BOOL"), or NULL for a value that is not a
 * dtype. Returns a static string. */
ACCEL_API const char *accel_dtype_name(accel_dtype dt);

/* Parses a safetensors dtype name (exact, case-sensitive) into *out. Returns ACCEL_OK, or
 * ACCEL_EINVAL when `name` is NULL or unknown (*out untouched). */
ACCEL_API accel_status accel_dtype_from_name(const char *name, accel_dtype *out);

/* 1 for real floating-point types (F64, F32, F16, BF16, F8_*, F6_*, F4), else 0 (integers,
 * BOOL, C64). */
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

/* numel * element size in bytes (sub-byte dtypes: numel * bits / 8, rounded up). */
ACCEL_API size_t accel_tensor_nbytes(const accel_tensor *t);

/* Builds a CPU view over `data` with the given shape (ndim <= ACCEL_MAX_DIMS, else ndim is
 * clamped to 0). Borrows `data` and copies `shape`. */
ACCEL_API accel_tensor accel_tensor_view(void *data, accel_dtype dt, int ndim,
                                         const int64_t *shape);

/*
 * Converts `count` elements from src (dtype src_dt) to dst (dtype dst_dt): any pair of the real
 * and integer dtypes.
 *  - Float -> float rounds to nearest, ties to even, once (F64 sources narrower than F32 go
 *    through a round-to-odd f32, which keeps the single rounding exact). Subnormals are kept,
 *    signed zeros keep their sign, f16 overflow gives +-inf. NaN stays NaN and is quietened
 *    (payload truncated to its top bits). The FP8 formats saturate as the OCP FP8 spec's SAT
 *    mode: finite values past the largest and +-inf become +-448 (E4M3), +-57344 (E5M2 and
 *    E5M2FNUZ), +-240 (E4M3FNUZ); the FNUZ formats have no -0 (it becomes +0) and one NaN.
 *    F8_E8M0 takes the magnitude to the nearest power of two (a tie, 1.5 x 2^k, rounds up),
 *    clamped to [2^-127, 2^127]; NaN and +-inf give its NaN.
 *  - Widening (f16/bf16/f8 -> f32/f64) is exact.
 *  - Float -> integer truncates toward zero and saturates to the type's range; NaN -> 0.
 *    -> BOOL: nonzero (NaN included) -> 1. Integer -> integer saturates (U64 included).
 *    Integer -> float rounds to nearest even, once.
 *  - dst_dt == src_dt copies the bytes (memmove; NaN payloads untouched), for every dtype.
 *  - C64 and the packed sub-byte formats (F4, F6_*) convert to nothing else: ACCEL_EUNSUPPORTED
 *    (a complex value has no real counterpart; safetensors does not fix how sub-byte values are
 *    packed, so their elements cannot be addressed). A same-dtype copy of a sub-byte dtype
 *    needs count * bits to be a multiple of 8.
 * f32 <-> f16 and f32 <-> bf16 use AVX2/F16C or AVX-512 when the CPU has them (chosen at run
 * time), with bits identical to the scalar path.
 * Buffers are borrowed and, for different dtypes, must not overlap.
 * Returns ACCEL_OK; ACCEL_EINVAL naming a NULL buffer (count > 0), an invalid dtype or
 * overlapping buffers; ACCEL_EUNSUPPORTED naming a pair without a conversion (message in
 * accel_last_error(NULL)). Thread-safe.
 */
ACCEL_API accel_status accel_convert(void *dst, accel_dtype dst_dt, const void *src,
                                     accel_dtype src_dt, size_t count);

/*
 * f32 -> bf16 with stochastic rounding: each value rounds up with probability equal to the
 * fraction of a bf16 step that truncation would drop, so the expected result equals the input
 * (useful for bf16 weights updated by small increments). The result is always one of the two
 * bf16 neighbours of the input (+-inf past the largest finite; NaN -> quiet NaN; inf stays).
 * rng_state: the caller's 64-bit generator state (splitmix64), advanced in place; seed it with
 * any value. Same state and input give the same output.
 * Returns ACCEL_OK, or ACCEL_EINVAL naming a NULL argument when count > 0. Thread-safe for
 * distinct rng_state.
 */
ACCEL_API accel_status accel_f32_to_bf16_stochastic(uint16_t *dst, const float *src, size_t count,
                                                    uint64_t *rng_state);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_TENSOR_H */
