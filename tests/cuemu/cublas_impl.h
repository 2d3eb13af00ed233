/*
 * Between the two halves of the emulated cuBLAS (cuemu.h): cublas.c turns handles, descriptors
 * and the legacy cublasGemmEx call into one cuemu_gemm; cublas_matmul.c checks it against
 * the documented contract and computes it.
 */
#ifndef ACCEL_CUEMU_CUBLAS_IMPL_H
#define ACCEL_CUEMU_CUBLAS_IMPL_H

#include <stdint.h>

#include <cublasLt.h>

/* One product D = epilogue(alpha op(A) op(B) + beta C), column-major. The rows / cols are
 * those of the stored matrices (as their layouts say), before op(). */
typedef struct cuemu_gemm {
    const char *fn; /* the API function, for messages */
    int32_t compute_type, scale_type, pointer_mode;
    int ta, tb; /* 1: op() transposes */
    int32_t a_type, b_type, c_type, d_type;
    uint64_t a_rows, a_cols, b_rows, b_cols, c_rows, c_cols, d_rows, d_cols;
    int64_t lda, ldb, ldc, ldd;
    const void *A, *B, *C;
    void *D;
    float alpha, beta;
    uint32_t epilogue;
    void *bias;        /* read (BIAS epilogues) or written (BGRAD epilogues) */
    int32_t bias_type; /* -1: the default (D's type) */
    void *aux;         /* the GELU input: written by GELU_AUX*, read by DGELU* */
    int64_t aux_ld;
    int32_t aux_type; /* -1: the default (D's type) */
} cuemu_gemm;

/* g's configuration against the documented contract: types, dimensions, leading dimensions,
 * the epilogue and its attributes; with_pointers: also every pointer the product touches
 * (device memory of the span it needs, aligned to its element). A failure prints
 * "cuemu: <fn>: <what>" on stderr and returns CUBLAS_STATUS_INVALID_VALUE (a configuration
 * the real library rejects) or CUBLAS_STATUS_NOT_SUPPORTED (one this emulator does not
 * implement because accel does not use it). */
cublasStatus_t cuemu_gemm_check(const cuemu_gemm *g, int with_pointers);

/* Checks g (with pointers) and computes it under cuemu_lock(). */
cublasStatus_t cuemu_gemm_run(const cuemu_gemm *g);

/* Prints "cuemu: <fn>: <message>" on stderr and returns st. */
cublasStatus_t cuemu_blas_fail(cublasStatus_t st, const char *fn, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The largest power of two up to 256 that divides p's address (256 for NULL). */
uint32_t cuemu_alignment(const void *p);

#endif /* ACCEL_CUEMU_CUBLAS_IMPL_H */
