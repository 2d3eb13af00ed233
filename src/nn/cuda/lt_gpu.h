/*
 * The cuBLASLt runner of the nn toolkit's products (lt_gpu.c), shared by nn_linear's forward
 * and backward (linear_gpu.c): one product with an optional fused epilogue (bias, GELU, GELU's
 * derivative and the bias gradient), and where cuBLASLt offers no algorithm with that
 * epilogue, a plain product and kernels that do what the epilogue would (said once at level
 * info). Internal to src/nn/cuda.
 */
#ifndef ACCEL_NN_CUDA_LT_GPU_H
#define ACCEL_NN_CUDA_LT_GPU_H

#include "gpu_internal.h"

/* One column-major product and its epilogue. */
typedef struct lt_mm {
    int ta, tb;      /* transpose A / B (column-major) */
    int64_t m, n, k; /* D (m x n) = op(A) (m x k) op(B) (k x n) */
    const void *A;
    int64_t lda;
    const void *B;
    int64_t ldb;
    void *D; /* of d_type */
    int64_t ldd;
    float beta; /* D = op(A) op(B) + beta D */
    cudaDataType_t in_type;
    const void *bias; /* m values of d_type added to every column (epilogue), or NULL */
    /* A GELU epilogue (linear_gelu_linear): LT_ACT_GELU D = gelu(product + bias) with aux =
     * the product + bias; LT_ACT_DGELU D = product * gelu'(aux), and with dbias the column
     * sums of D (before D is rounded to its type) into m values. aux: m x n, column-major with
     * leading dimension m; aux and dbias of d_type, as cuBLASLt requires. Or a bias gradient
     * from an operand (a linear's weight-gradient product, which reads dY): LT_ACT_BGRADA
     * dbias = the m sums over k of A (not transposed, lda m), LT_ACT_BGRADB the n sums over k
     * of B (transposed, ldb n), in fp32 from the operand's values, stored (not added) in
     * d_type; D is the plain product. */
    int act;
    void *aux;
    void *dbias;
    /* D's type: fp32, or under autocast in_type for the fused MLP's two epilogue products (h
     * and dZ are only ever read rounded). */
    cudaDataType_t d_type;
} lt_mm;

enum { LT_ACT_NONE = 0, LT_ACT_GELU, LT_ACT_DGELU, LT_ACT_BGRADA, LT_ACT_BGRADB };

/* The largest power of two up to 256 that divides the address (cuBLASLt's alignment unit). */
static inline uint32_t lt_alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    while (al < 256 && (a & (2 * (uintptr_t)al - 1)) == 0) {
        al *= 2;
    }
    return al;
}

/* The cuBLASLt type of a product's operands: fp32, or (rnd 1 / 2) bf16 / fp16. */
static inline cudaDataType_t lt_in_type(int rnd)
{
    return rnd == 1 ? CUDA_R_16BF : rnd == 2 ? CUDA_R_16F : CUDA_R_32F;
}

/* Runs p: its bias / GELU through the epilogue, or a plain product and the epilogue's kernels
 * where cuBLASLt offers no algorithm with it; 0 and the ctx error (naming `what`) on
 * failure. */
int accel__nn_lt_matmul(nn_ctx *g, const lt_mm *p, const char *what);

/* A shell output's product (p: D 2-byte, with the bias rounded in 2 bytes, or NULL; bias_f:
 * the same bias in fp32): cuBLASLt rounds the fp32 sum + bias once, or where it offers no
 * BIAS epilogue with a 2-byte D, the fp32 product with the bias and one rounding pass (the
 * same bits). 0 and the ctx error on failure. */
int accel__nn_lt_shell_matmul(nn_ctx *g, const lt_mm *p, const float *bias_f, const char *what);

#endif /* ACCEL_NN_CUDA_LT_GPU_H */
