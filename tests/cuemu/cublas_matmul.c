/*
 * The arithmetic of the emulated cuBLAS (cuemu.h, cublas_impl.h): one column-major product
 * D = epilogue(alpha op(A) op(B) + beta C + bias), checked against NVIDIA's documented
 * contract before anything is touched, so that accel's CUDA code is tested against what the
 * real library promises rather than against our own reading of it.
 *
 * Numerics: inputs widened to fp32, each element of the product accumulated in fp32 in a
 * fixed order (k ascending, no FMA contraction), alpha / beta / bias / epilogue in fp32, the
 * result rounded once to D's type (round to nearest even). A real GPU sums in another order
 * (tiles, split-k, tensor cores), so tests compare with a tolerance, as they do on a GPU.
 *
 * The epilogue semantics are quoted from the documentation of cublasLtEpilogue_t and
 * cublasLtMatmulDescAttributes_t (cublasLt.h of CUDA 13.1, the same text as the cuBLAS
 * guide's section on them); where that text is ambiguous the comment says so.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_impl.h"
#include "cuemu.h"

cublasStatus_t cuemu_blas_fail(cublasStatus_t st, const char *fn, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuemu: %s: %s\n", fn, msg);
    return st;
}

uint32_t cuemu_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    while (al < 256 && (a & (2 * (uintptr_t)al - 1)) == 0) {
        al *= 2;
    }
    return al;
}

/* ---- element types ---- */

static size_t elem_nbytes(int32_t type)
{
    return type == CUDA_R_32F ? 4 : 2;
}

static const char *type_name(int32_t type)
{
    switch (type) {
    case CUDA_R_32F:
        return "CUDA_R_32F";
    case CUDA_R_16F:
        return "CUDA_R_16F";
    case CUDA_R_16BF:
        return "CUDA_R_16BF";
    default:
        return "a type this emulator lacks";
    }
}

static int known_type(int32_t type)
{
    return type == CUDA_R_32F || type == CUDA_R_16F || type == CUDA_R_16BF;
}

static float load(const void *p, int32_t type, int64_t i)
{
    if (type == CUDA_R_32F) {
        return ((const float *)p)[i];
    }
    return cuemu_from_half(((const uint16_t *)p)[i], type == CUDA_R_16BF);
}

static void store(void *p, int32_t type, int64_t i, float v)
{
    if (type == CUDA_R_32F) {
        ((float *)p)[i] = v;
    } else {
        ((uint16_t *)p)[i] = cuemu_to_half(v, type == CUDA_R_16BF);
    }
}

/* ---- the epilogue's pieces ---- */

enum {
    EP_BIAS = 1,
    EP_GELU = 2,
    EP_AUX_OUT = 4,
    EP_DGELU = 8,
    EP_BGRAD = 16,
    EP_BGRADA = 32,
    EP_BGRADB = 64
};

/* What epilogue ep does (EP_* bits); 0 with *st set when it is not emulated or unknown. */
static unsigned epilogue_parts(uint32_t ep, cublasStatus_t *st)
{
    *st = CUBLAS_STATUS_SUCCESS;
    switch (ep) {
    case CUBLASLT_EPILOGUE_DEFAULT:
        return 0;
    /* "Bias vector length must match matrix D rows ... Bias vector is broadcasted to all
     * columns and added before applying final postprocessing." */
    case CUBLASLT_EPILOGUE_BIAS:
        return EP_BIAS;
    /* GELU_BIAS: "apply Bias and then GELU transform"; the *_AUX forms: "outputs GELU input
     * as a separate matrix" (so the input after the bias). */
    case CUBLASLT_EPILOGUE_GELU:
        return EP_GELU;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        return EP_GELU | EP_BIAS;
    case CUBLASLT_EPILOGUE_GELU_AUX:
        return EP_GELU | EP_AUX_OUT;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return EP_GELU | EP_AUX_OUT | EP_BIAS;
    /* DGELU: "Apply GELU gradient to matmul output. Store GELU gradient in the output
     * matrix"; DGELU_BGRAD: "Apply independently GELU and Bias gradient to matmul output.
     * Store GELU gradient in the output matrix, and Bias gradient in the auxiliary output
     * (see CUBLASLT_MATMUL_DESC_BIAS_POINTER)". */
    case CUBLASLT_EPILOGUE_DGELU:
        return EP_DGELU;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return EP_DGELU | EP_BGRAD;
    /* BGRADA: "The bias size corresponds to the number of rows of the matrix D. The
     * reduction happens over the GEMM's "k" dimension."; BGRADB: the same with "columns".
     * The sums of op(A)'s rows / op(B)'s columns as stored (not scaled by alpha), in fp32,
     * rounded once to the bias type; only some transposes (check_epilogue). */
    case CUBLASLT_EPILOGUE_BGRADA:
        return EP_BGRADA;
    case CUBLASLT_EPILOGUE_BGRADB:
        return EP_BGRADB;
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
        *st = CUBLAS_STATUS_NOT_SUPPORTED;
        return 0;
    default:
        *st = CUBLAS_STATUS_INVALID_VALUE;
        return 0;
    }
}

/* The documentation only says "x:=GELU(x)" and never names the approximation. cuBLASLt's
 * GELU is taken to be the tanh form, as accel assumes (nn_linear_gelu_linear sends only the
 * tanh form to the epilogue, and the fallback kernels compute it); the fused-MLP cases of
 * test_nn_cuda compare the CPU with a real GPU. An assumption, not a quote. */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static float gelu(float x)
{
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
}

static float gelu_grad(float x)
{
    float x2 = x * x;
    float t = tanhf(GELU_K * (x + GELU_C * x2 * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x2);
}

/* ---- checks ---- */

/* Leading dimension: "must be large enough so that matrix memory locations are not
 * overlapping (e.g. greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of
 * CUBLASLT_ORDER_COL)". */
static cublasStatus_t check_ld(const cuemu_gemm *g, const char *which, uint64_t rows, int64_t ld)
{
    if (ld < 1 || (uint64_t)ld < rows) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                               "%s's leading dimension %lld is less than max(1, its %llu rows)",
                               which, (long long)ld, (unsigned long long)rows);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The bytes a rows x cols column-major matrix with leading dimension ld spans. */
static size_t span_nbytes(uint64_t rows, uint64_t cols, int64_t ld, int32_t type)
{
    if (rows == 0 || cols == 0) {
        return 0;
    }
    return (size_t)(((cols - 1) * (uint64_t)ld + rows) * elem_nbytes(type));
}

/* p must be device memory (cudaMalloc) holding nbytes from p, aligned to its element. */
static cublasStatus_t check_ptr(const cuemu_gemm *g, const char *which, const void *p,
                                size_t nbytes, int32_t type)
{
    if (nbytes == 0) {
        return CUBLAS_STATUS_SUCCESS;
    }
    if (p == NULL) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn, "%s is NULL", which);
    }
    const void *base = NULL;
    size_t have = 0;
    cuemu_kind kind = cuemu_lookup(p, &base, &have, NULL);
    if (kind != CUEMU_DEVICE) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                               "%s (%p) is %s, not device memory from cudaMalloc", which, p,
                               kind == CUEMU_PINNED ? "pinned host memory" : "host memory");
    }
    size_t off = (size_t)((const char *)p - (const char *)base);
    if (off + nbytes > have) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                               "%s (%p) needs %zu bytes but its allocation (%p, %zu bytes) "
                               "ends %zu bytes after it",
                               which, p, nbytes, base, have, have - off);
    }
    if (cuemu_alignment(p) < elem_nbytes(type)) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                               "%s (%p) is not aligned to its %zu-byte elements", which, p,
                               elem_nbytes(type));
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Two spans overlap (D may be C itself, never part of it). */
static int overlap(const void *p, size_t np, const void *q, size_t nq)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return np > 0 && nq > 0 && a < b + nq && b < a + np;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

static cublasStatus_t check_types(const cuemu_gemm *g)
{
    if (g->compute_type != CUBLAS_COMPUTE_32F && g->compute_type != CUBLAS_COMPUTE_32F_PEDANTIC) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "compute type %d: only CUBLAS_COMPUTE_32F is emulated",
                               (int)g->compute_type);
    }
    if (g->scale_type != CUDA_R_32F) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "scale type %d: only CUDA_R_32F is emulated", (int)g->scale_type);
    }
    if (g->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "pointer mode %d: only alpha / beta on the host are emulated",
                               (int)g->pointer_mode);
    }
    /* With CUBLAS_COMPUTE_32F the documented type table pairs A and B of one type (32F, 16F
     * or 16BF) with C = D of that type or 32F. */
    if (!known_type(g->a_type) || g->b_type != g->a_type) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "A type %d and B type %d: A and B must both be CUDA_R_32F, "
                               "CUDA_R_16F or CUDA_R_16BF",
                               (int)g->a_type, (int)g->b_type);
    }
    if (g->c_type != g->d_type || (g->d_type != g->a_type && g->d_type != CUDA_R_32F)) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "C type %d and D type %d with A and B in %s: C and D must be "
                               "of one type, A's or CUDA_R_32F",
                               (int)g->c_type, (int)g->d_type, type_name(g->a_type));
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t check_dims(const cuemu_gemm *g)
{
    uint64_t m = g->d_rows, n = g->d_cols, k = g->ta ? g->a_rows : g->a_cols;
    uint64_t am = g->ta ? g->a_cols : g->a_rows;
    uint64_t bk = g->tb ? g->b_cols : g->b_rows, bn = g->tb ? g->b_rows : g->b_cols;
    if (am != m || bk != k || bn != n || g->c_rows != m || g->c_cols != n) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                               "dimensions do not match: op(A) is %llu x %llu, op(B) %llu x "
                               "%llu, C %llu x %llu, D %llu x %llu",
                               (unsigned long long)am, (unsigned long long)k,
                               (unsigned long long)bk, (unsigned long long)bn,
                               (unsigned long long)g->c_rows, (unsigned long long)g->c_cols,
                               (unsigned long long)m, (unsigned long long)n);
    }
    TRY(check_ld(g, "A", g->a_rows, g->lda));
    TRY(check_ld(g, "B", g->b_rows, g->ldb));
    TRY(check_ld(g, "C", g->c_rows, g->ldc));
    return check_ld(g, "D", g->d_rows, g->ldd);
}

static cublasStatus_t check_epilogue(const cuemu_gemm *g, unsigned parts)
{
    /* Bias and bias gradient: "Bias vector elements are the same type as the elements of
     * output matrix (Dtype)", "Bias gradient vector elements are the same type as the output
     * elements (Ctype)" (exceptions only for integer and fp8 kernels). */
    if ((parts & (EP_BIAS | EP_BGRAD | EP_BGRADA | EP_BGRADB)) && g->bias_type != -1 &&
        g->bias_type != g->d_type) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                               "bias data type %d differs from D's type %s", (int)g->bias_type,
                               type_name(g->d_type));
    }
    /* BGRADA / BGRADB sum the operand as it is stored along k: cuBLASLt (12.x and 13.x, on
     * sm_80 and sm_90) offers BGRADA only with op(A) = N and BGRADB only with op(B) = T, and
     * refuses the other transposes with CUBLAS_STATUS_NOT_SUPPORTED in the heuristic and the
     * matmul alike. The header's text does not say so; it is the library's behaviour (a probe
     * of both transposes of each on a GPU; Transformer Engine's weight-gradient products ask
     * for BGRADB with B = dY transposed). Refused here the same way, so that a layout the
     * real library has no algorithm for takes accel's fallback in the emulator too. */
    if ((parts & EP_BGRADA) && g->ta) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "epilogue BGRADA with op(A) = T: cuBLASLt offers it only with "
                               "A not transposed");
    }
    if ((parts & EP_BGRADB) && !g->tb) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, g->fn,
                               "epilogue BGRADB with op(B) = N: cuBLASLt offers it only with "
                               "B transposed");
    }
    if (parts & (EP_AUX_OUT | EP_DGELU)) {
        /* EPILOGUE_AUX_LD: "GELU input matrix leading dimension in elements ... Must be
         * divisible by 8 and be no less than the number of rows in the output matrix."
         * EPILOGUE_AUX_DATA_TYPE: "GELU input matrix elements type is the same as the type
         * of elements of the output matrix" (exceptions for fp8 outputs only). */
        if (g->aux_ld < 0 || (uint64_t)g->aux_ld < g->d_rows || g->aux_ld % 8 != 0) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                                   "epilogue aux leading dimension %lld: must be a multiple "
                                   "of 8 and at least D's %llu rows",
                                   (long long)g->aux_ld, (unsigned long long)g->d_rows);
        }
        if (g->aux_type != -1 && g->aux_type != g->d_type) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                                   "epilogue aux data type %d differs from D's type %s",
                                   (int)g->aux_type, type_name(g->d_type));
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t check_pointers(const cuemu_gemm *g, unsigned parts)
{
    uint64_t m = g->d_rows, n = g->d_cols;
    size_t d_nbytes = span_nbytes(g->d_rows, g->d_cols, g->ldd, g->d_type);
    TRY(check_ptr(g, "A", g->A, span_nbytes(g->a_rows, g->a_cols, g->lda, g->a_type), g->a_type));
    TRY(check_ptr(g, "B", g->B, span_nbytes(g->b_rows, g->b_cols, g->ldb, g->b_type), g->b_type));
    TRY(check_ptr(g, "D", g->D, d_nbytes, g->d_type));
    if (g->beta != 0.0f) { /* as in BLAS, C is not read when beta is 0 */
        size_t c_nbytes = span_nbytes(g->c_rows, g->c_cols, g->ldc, g->c_type);
        TRY(check_ptr(g, "C", g->C, c_nbytes, g->c_type));
        if (g->C == g->D ? g->ldc != g->ldd : overlap(g->C, c_nbytes, g->D, d_nbytes)) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn,
                                   "C (%p, ld %lld) and D (%p, ld %lld) overlap without being "
                                   "the same matrix",
                                   g->C, (long long)g->ldc, g->D, (long long)g->ldd);
        }
    }
    int32_t bias_type = g->bias_type == -1 ? g->d_type : g->bias_type;
    uint64_t bias_count = (parts & EP_BGRADB) ? n : m;
    if ((parts & (EP_BIAS | EP_BGRAD | EP_BGRADA | EP_BGRADB)) && bias_count > 0) {
        const char *what = (parts & EP_BIAS)
                               ? "the bias (CUBLASLT_MATMUL_DESC_BIAS_POINTER)"
                               : "the bias gradient (CUBLASLT_MATMUL_DESC_BIAS_POINTER)";
        if (g->bias == NULL) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn, "%s is not set", what);
        }
        TRY(check_ptr(g, what, g->bias, bias_count * elem_nbytes(bias_type), bias_type));
    }
    if ((parts & (EP_AUX_OUT | EP_DGELU)) && m * n > 0) {
        const char *what = "the epilogue aux (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER)";
        int32_t aux_type = g->aux_type == -1 ? g->d_type : g->aux_type;
        if (g->aux == NULL) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, g->fn, "%s is not set", what);
        }
        TRY(check_ptr(g, what, g->aux, span_nbytes(m, n, g->aux_ld, aux_type), aux_type));
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cuemu_gemm_check(const cuemu_gemm *g, int with_pointers)
{
    cublasStatus_t st;
    unsigned parts = epilogue_parts(g->epilogue, &st);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
        return cuemu_blas_fail(st, g->fn,
                               "epilogue %u (a ReLU one) is not emulated: accel does "
                               "not use it",
                               (unsigned)g->epilogue);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        return cuemu_blas_fail(st, g->fn, "unknown epilogue %u", (unsigned)g->epilogue);
    }
    TRY(check_types(g));
    TRY(check_dims(g));
    TRY(check_epilogue(g, parts));
    return with_pointers ? check_pointers(g, parts) : CUBLAS_STATUS_SUCCESS;
}

/* ---- the product ---- */

/* op(X) as fp32 rows of k: out[r * k + p] = op(X)(r, p) when by_row, else the columns of op(X)
 * (out[c * k + p] = op(X)(p, c)), so that every dot product reads two contiguous rows. */
static void widen(const void *x, int32_t type, int64_t ld, int trans, int by_row, uint64_t count,
                  uint64_t k, float *out)
{
    for (uint64_t r = 0; r < count; r++) {
        for (uint64_t p = 0; p < k; p++) {
            /* Element (r, p) of op(X) for A (by_row), (p, r) of op(X) for B. */
            uint64_t row = by_row ? (trans ? p : r) : (trans ? r : p);
            uint64_t col = by_row ? (trans ? r : p) : (trans ? p : r);
            out[r * k + p] = load(x, type, (int64_t)(col * (uint64_t)ld + row));
        }
    }
}

/* D(i, j) from its dot product: alpha, beta * C, the epilogue, the bias gradient (bgrad[i] gets
 * column j after every column before it). */
static void finish(const cuemu_gemm *g, unsigned parts, uint64_t i, uint64_t j, float acc,
                   float *bgrad)
{
    int32_t bias_type = g->bias_type == -1 ? g->d_type : g->bias_type;
    int32_t aux_type = g->aux_type == -1 ? g->d_type : g->aux_type;
    float v = g->alpha * acc;
    if (g->beta != 0.0f) {
        v += g->beta * load(g->C, g->c_type, (int64_t)(j * (uint64_t)g->ldc + i));
    }
    if (parts & EP_BIAS) {
        v += load(g->bias, bias_type, (int64_t)i);
    }
    if (parts & EP_AUX_OUT) {
        store(g->aux, aux_type, (int64_t)(j * (uint64_t)g->aux_ld + i), v);
    }
    if (parts & EP_GELU) {
        v = gelu(v);
    }
    if (parts & EP_DGELU) {
        v *= gelu_grad(load(g->aux, aux_type, (int64_t)(j * (uint64_t)g->aux_ld + i)));
    }
    /* "Bias gradient" of DGELU_BGRAD: the text says both gradients are applied
     * "independently ... to matmul output", which could be read as the sums of the
     * raw product. The bias in question is the forward GELU_AUX_BIAS bias, added
     * before the GELU, so its gradient is the sum of the DGELU output over the
     * columns (the n dimension) per row of D; this is what is emulated. */
    if (parts & EP_BGRAD) {
        bgrad[i] += v;
    }
    store(g->D, g->d_type, (int64_t)(j * (uint64_t)g->ldd + i), v);
}

/* Products in blocks of k_mb rows by k_nb columns: the block's dot products are independent
 * chains that the CPU overlaps (one chain waits on its adds' latency). Each one still sums
 * p = 0..k-1 in order, one rounding per product and per add, so D is the same bit for bit. */
enum { k_mb = 4, k_nb = 2 };

static void compute(const cuemu_gemm *g, unsigned parts, const float *at, const float *bt,
                    float *bgrad)
{
    uint64_t m = g->d_rows, n = g->d_cols, k = g->ta ? g->a_rows : g->a_cols;
    int32_t bias_type = g->bias_type == -1 ? g->d_type : g->bias_type;
    for (uint64_t j0 = 0; j0 < n; j0 += k_nb) {
        uint64_t nj = n - j0 < k_nb ? n - j0 : k_nb;
        for (uint64_t i0 = 0; i0 < m; i0 += k_mb) {
            uint64_t mi = m - i0 < k_mb ? m - i0 : k_mb;
            float acc[k_mb][k_nb] = {{0.0f}};
            if (mi == k_mb && nj == k_nb) {
                const float *a0 = at + i0 * k, *a1 = a0 + k, *a2 = a1 + k, *a3 = a2 + k;
                const float *b0 = bt + j0 * k, *b1 = b0 + k;
                float c00 = 0, c10 = 0, c20 = 0, c30 = 0, c01 = 0, c11 = 0, c21 = 0, c31 = 0;
                for (uint64_t p = 0; p < k; p++) {
                    float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p], y0 = b0[p], y1 = b1[p];
                    c00 += x0 * y0;
                    c10 += x1 * y0;
                    c20 += x2 * y0;
                    c30 += x3 * y0;
                    c01 += x0 * y1;
                    c11 += x1 * y1;
                    c21 += x2 * y1;
                    c31 += x3 * y1;
                }
                acc[0][0] = c00, acc[1][0] = c10, acc[2][0] = c20, acc[3][0] = c30;
                acc[0][1] = c01, acc[1][1] = c11, acc[2][1] = c21, acc[3][1] = c31;
            } else {
                for (uint64_t jj = 0; jj < nj; jj++) {
                    for (uint64_t ii = 0; ii < mi; ii++) {
                        const float *a = at + (i0 + ii) * k, *b = bt + (j0 + jj) * k;
                        float s = 0.0f;
                        for (uint64_t p = 0; p < k; p++) {
                            s += a[p] * b[p];
                        }
                        acc[ii][jj] = s;
                    }
                }
            }
            for (uint64_t jj = 0; jj < nj; jj++) {
                for (uint64_t ii = 0; ii < mi; ii++) {
                    finish(g, parts, i0 + ii, j0 + jj, acc[ii][jj], bgrad);
                }
            }
        }
    }
    for (uint64_t r = 0; (parts & EP_BGRADA) && r < m; r++) {
        for (uint64_t p = 0; p < k; p++) {
            bgrad[r] += at[r * k + p];
        }
    }
    for (uint64_t c = 0; (parts & EP_BGRADB) && c < n; c++) {
        for (uint64_t p = 0; p < k; p++) {
            bgrad[c] += bt[c * k + p];
        }
    }
    uint64_t bias_count = (parts & EP_BGRADB) ? n : m;
    for (uint64_t r = 0; (parts & (EP_BGRAD | EP_BGRADA | EP_BGRADB)) && r < bias_count; r++) {
        store(g->bias, bias_type, (int64_t)r, bgrad[r]); /* stored, not added */
    }
}

cublasStatus_t cuemu_gemm_run(const cuemu_gemm *g)
{
    cublasStatus_t st = cuemu_gemm_check(g, 1);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    unsigned parts = epilogue_parts(g->epilogue, &st);
    uint64_t m = g->d_rows, n = g->d_cols, k = g->ta ? g->a_rows : g->a_cols;
    float *at = malloc((m * k + 1) * sizeof(float));
    float *bt = malloc((n * k + 1) * sizeof(float));
    float *bgrad = calloc((m > n ? m : n) + 1, sizeof(float));
    if (at == NULL || bt == NULL || bgrad == NULL) {
        st = cuemu_blas_fail(CUBLAS_STATUS_ALLOC_FAILED, g->fn,
                             "no host memory for a %llu x %llu x %llu product",
                             (unsigned long long)m, (unsigned long long)n, (unsigned long long)k);
    } else {
        /* Everything runs at issue, one emulated operation at a time (cuemu.h). */
        cuemu_lock();
        widen(g->A, g->a_type, g->lda, g->ta, 1, m, k, at);
        widen(g->B, g->b_type, g->ldb, g->tb, 0, n, k, bt);
        compute(g, parts, at, bt, bgrad);
        cuemu_unlock();
    }
    free(bgrad);
    free(bt);
    free(at);
    return st;
}
