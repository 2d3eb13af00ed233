/*
 * nn_linear on CUDA through cuBLASLt. Row-major [M, in] x weight is computed as the
 * column-major product Y^T = W' X^T, so no operand is ever copied or transposed. In fp32 the
 * product is plain fp32 (CUBLAS_COMPUTE_32F: no TF32); under autocast bf16 / fp16 the inputs
 * are rounded into 2-byte copies and multiplied with fp32 accumulation into an fp32 output,
 * as the CPU's autocast does: the bias is added in fp32 by cuBLASLt's bias epilogue (a plain
 * product plus a bias kernel where cuBLASLt offers no algorithm with the epilogue), and in
 * backward each gradient contribution is rounded to the dtype before it is added. One
 * exception: nn_linear_gelu_linear's hidden tensor, read only rounded, is written in 2 bytes
 * by the GELU epilogue under autocast, and its gradient too (by default a plain 2-byte product
 * and one kernel for GELU's derivative and the bias gradient; or the DGELU epilogue).
 */
#include <pthread.h>
#include <string.h>

#include "gpu_internal.h"

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
    /* A GELU epilogue (linear_gelu_linear): ACT_GELU D = gelu(product + bias) with aux = the
     * product + bias; ACT_DGELU D = product * gelu'(aux), and with dbias the column sums of D
     * (before D is rounded to its type) into m values. aux: m x n, column-major with leading
     * dimension m; aux and dbias of d_type, as cuBLASLt requires. */
    int act;
    void *aux;
    void *dbias;
    /* D's type: fp32, or under autocast in_type for the fused MLP's two epilogue products (h
     * and dZ are only ever read rounded). */
    cudaDataType_t d_type;
} lt_mm;

enum { ACT_NONE = 0, ACT_GELU, ACT_DGELU };

/* The largest power of two up to 256 that divides the address (cuBLASLt's alignment unit). */
static uint32_t alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    while (al < 256 && (a & (2 * (uintptr_t)al - 1)) == 0) {
        al *= 2;
    }
    return al;
}

/* The epilogue lt_run asks for when it uses p's bias / activation. */
static cublasLtEpilogue_t epilogue_of(const lt_mm *p)
{
    if (p->act == ACT_GELU) {
        return p->bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    }
    if (p->act == ACT_DGELU) {
        return p->dbias != NULL ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    }
    return CUBLASLT_EPILOGUE_BIAS;
}

static const char *epilogue_name(cublasLtEpilogue_t ep)
{
    switch (ep) {
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX:
        return "GELU_AUX";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_DGELU:
        return "DGELU";
    default:
        return "BIAS";
    }
}

/* One cuBLASLt product of p; with_epilogue: with p's bias / GELU epilogue (epilogue_of). */
static cublasStatus_t lt_run(nn_gpu_state *s, const lt_mm *p, int with_epilogue)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    }
    if (st == CUBLAS_STATUS_SUCCESS && with_epilogue) {
        cublasLtEpilogue_t ep = epilogue_of(p);
        /* The bias is read (BIAS, GELU_AUX_BIAS) or its gradient written (DGELU_BGRAD) in
         * the type of D: cuBLASLt's rule outside integer and fp8 kernels. */
        const void *bias = p->act == ACT_DGELU ? (const void *)p->dbias : p->bias;
        int32_t bias_type = p->d_type;
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep));
        if (st == CUBLAS_STATUS_SUCCESS && bias != NULL) {
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias));
        }
        if (st == CUBLAS_STATUS_SUCCESS && bias != NULL) {
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof(bias_type));
        }
        /* The GELU input: written by GELU_AUX*, read by DGELU*, in D's type (the default
         * aux type; another is allowed only with an fp8 D), leading dimension m (a multiple
         * of 8: the caller checks). */
        if (st == CUBLAS_STATUS_SUCCESS && p->act != ACT_NONE) {
            int64_t ld_aux = p->m;
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &p->aux, sizeof(p->aux));
            if (st == CUBLAS_STATUS_SUCCESS) {
                st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ld_aux, sizeof(ld_aux));
            }
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatrixLayoutCreate(&la, p->in_type, p->ta ? p->k : p->m, p->ta ? p->m : p->k,
                                        p->lda);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatrixLayoutCreate(&lb, p->in_type, p->tb ? p->n : p->k, p->tb ? p->k : p->n,
                                        p->ldb);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatrixLayoutCreate(&ld, p->d_type, p->m, p->n, p->ldd);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulPreferenceCreate(&pref);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st =
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &s->workspace_nbytes, sizeof(s->workspace_nbytes));
    }
    /* The heuristic assumes 256-byte aligned operands unless told otherwise; arena memory is
     * 64-byte aligned and parameter views sit at any element offset of the flat buffers, and
     * an algorithm picked for alignment the pointers lack may fault (a sticky error that loses
     * the context) rather than fail. So it is told each pointer's actual alignment. */
    const void *ptrs[4] = {p->A, p->B, p->D, p->D};
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++) {
        uint32_t al = alignment_of(ptrs[i]);
        st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof(al));
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulAlgoGetHeuristic(s->lt, op, la, lb, ld, ld, pref, 1, &res, &found);
    }
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) {
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        float alpha = 1.0f;
        st = cublasLtMatmul(s->lt, op, &alpha, p->A, la, p->B, lb, &p->beta, p->D, ld, p->D, ld,
                            &res.algo, s->workspace, s->workspace_nbytes, s->stream);
    }
    if (pref) {
        cublasLtMatmulPreferenceDestroy(pref);
    }
    if (ld) {
        cublasLtMatrixLayoutDestroy(ld);
    }
    if (lb) {
        cublasLtMatrixLayoutDestroy(lb);
    }
    if (la) {
        cublasLtMatrixLayoutDestroy(la);
    }
    if (op) {
        cublasLtMatmulDescDestroy(op);
    }
    return st;
}

/* Said once per process and epilogue: the fused path is slower without it, not wrong.
 * instead: what runs in its place. */
static void note_fallback(cublasLtEpilogue_t ep, const lt_mm *p, cublasStatus_t st,
                          const char *instead)
{
    static int said[4];
    int k = ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || ep == CUBLASLT_EPILOGUE_GELU_AUX ? 1
            : ep == CUBLASLT_EPILOGUE_DGELU_BGRAD                                     ? 2
            : ep == CUBLASLT_EPILOGUE_DGELU                                           ? 3
                                                                                      : 0;
    if (k > 0 && !said[k]) {
        said[k] = 1;
        accel__log(NULL, ACCEL__LOG_INFO,
                   "nn (CUDA): cuBLASLt's %s epilogue is not available for a %lld x %lld x %lld "
                   "%s product (%s): %s instead",
                   epilogue_name(ep), (long long)p->m, (long long)p->n, (long long)p->k,
                   p->d_type == CUDA_R_32F ? "fp32" : "2-byte", cublasGetStatusString(st), instead);
    }
}

/* The kernels' rounding mode (1 bf16, 2 fp16) of a 2-byte cuBLASLt type. */
static int rnd_of(cudaDataType_t t)
{
    return t == CUDA_R_16BF ? 1 : 2;
}

/* What a GELU epilogue with a 2-byte D does, after the plain product t (m x n fp32, column-
 * major, ld m): as cuBLASLt's, GELU and its derivative in fp32 from the fp32 product and only
 * the results rounded (h and its input; dZ and the bias gradient, summed before rounding). */
static int epilogue_kernels_half(nn_ctx *g, const lt_mm *p, float *t, const char *what)
{
    cudaStream_t cs = nn__cu_stream(g);
    int64_t n = p->m * p->n;
    int dt = rnd_of(p->d_type);
    if (p->act == ACT_GELU) {
        return accel__nn_cu_ok(g, nn_cu_bias_gelu_half(cs, t, p->bias, p->m, n, p->aux, p->D, dt),
                               what);
    }
    if (!accel__nn_cu_ok(g, nn_cu_dgelu_half(cs, t, p->aux, n, dt), what) ||
        !accel__nn_cu_ok(g, nn_cu_to_half(cs, t, p->D, n, dt), what)) {
        return 0;
    }
    if (p->dbias == NULL) {
        return 1;
    }
    float *sum = accel__nn_dtmp_alloc(g, (size_t)p->m * sizeof(float)), *part = NULL;
    return sum != NULL && accel__nn_cu_sum_parts(g, p->n, p->m, 1, &part) &&
           accel__nn_cu_ok(g, nn_cu_col_sum(cs, t, 0, p->n, p->m, sum, 1, 0, part), what) &&
           accel__nn_cu_ok(g, nn_cu_to_half(cs, sum, p->dbias, p->m, dt), what);
}

/* What an epilogue does, after a plain product in D: the bias, GELU (keeping its input in
 * aux) or GELU's derivative (and the bias gradient). 0 and the ctx error on failure. */
static int epilogue_kernels(nn_ctx *g, const lt_mm *p, const char *what)
{
    cudaStream_t cs = nn__cu_stream(g);
    int64_t n = p->m * p->n;
    if (p->act == ACT_NONE) {
        /* The bias adds to every column of the column-major D (m x n, ldd == m here). */
        return p->bias == NULL ||
               accel__nn_cu_ok(g, nn_cu_add(cs, p->D, n, p->bias, p->m, p->D), what);
    }
    if (p->act == ACT_GELU) {
        cudaError_t e = p->bias != NULL ? nn_cu_add(cs, p->D, n, p->bias, p->m, p->aux)
                                        : cudaMemcpyAsync(p->aux, p->D, (size_t)n * sizeof(float),
                                                          cudaMemcpyDeviceToDevice, cs);
        return accel__nn_cu_ok(g, e, what) &&
               accel__nn_cu_ok(g, nn_cu_gelu(cs, p->aux, p->D, n, 1), what);
    }
    /* D (the product) times gelu'(aux) in place; the bias gradient sums D's columns, that is
     * the rows of the row-major [n, m] it also is. */
    float *part = NULL;
    return accel__nn_cu_ok(g, nn_cu_gelu_bwd(cs, p->aux, p->D, p->D, n, 1, 1), what) &&
           (p->dbias == NULL ||
            (accel__nn_cu_sum_parts(g, p->n, p->m, 1, &part) &&
             accel__nn_cu_ok(g, nn_cu_col_sum(cs, p->D, 0, p->n, p->m, p->dbias, 1, 0, part),
                             what)));
}

/* Which epilogues products may ask cuBLASLt for (accel__nn_cu_lt_epilogues, a test hook):
 * 2 all, 1 all but DGELU_BGRAD, 0 none. */
static int lt_epilogues = 2;

void accel__nn_cu_lt_epilogues(int level)
{
    lt_epilogues = level;
}

static cublasStatus_t lt_try(nn_gpu_state *s, const lt_mm *p)
{
    int allowed =
        lt_epilogues >= 2 || (lt_epilogues == 1 && epilogue_of(p) != CUBLASLT_EPILOGUE_DGELU_BGRAD);
    return allowed ? lt_run(s, p, 1) : CUBLAS_STATUS_NOT_SUPPORTED;
}

/* A 2-byte DGELU_BGRAD's first fallback: DGELU alone into the 2-byte D, and the bias gradient
 * summed from D as it was rounded (the CPU's definition: the sum of the rounded dZ, itself
 * rounded), one read of 2 bytes per element. 1 done, 0 with the ctx error, -1 when cuBLASLt
 * has no DGELU either (nothing was queued). */
static int dgelu_then_sum(nn_ctx *g, const lt_mm *p, const char *what)
{
    lt_mm q = *p;
    q.dbias = NULL;
    cublasStatus_t st = lt_try(g->gpu, &q);
    if (st != CUBLAS_STATUS_SUCCESS) {
        note_fallback(CUBLASLT_EPILOGUE_DGELU, &q, st, "a plain product and GELU kernels");
        return -1;
    }
    cudaStream_t cs = nn__cu_stream(g);
    int dt = rnd_of(p->d_type);
    float *sum = accel__nn_dtmp_alloc(g, (size_t)p->m * sizeof(float)), *part = NULL;
    return sum != NULL && accel__nn_cu_sum_parts(g, p->n, p->m, 1, &part) &&
           accel__nn_cu_ok(g, nn_cu_col_sum(cs, p->D, dt, p->n, p->m, sum, 1, 0, part), what) &&
           accel__nn_cu_ok(g, nn_cu_to_half(cs, sum, p->dbias, p->m, dt), what);
}

/* Runs p: its bias / GELU through the epilogue, or a plain product and the epilogue's kernels
 * where cuBLASLt offers no algorithm with it; 0 and the ctx error on failure. */
static int lt_matmul(nn_ctx *g, const lt_mm *p, const char *what)
{
    nn_gpu_state *s = g->gpu;
    /* An overwritten output (beta 0) is fresh arena memory and is not cleared first: as in
     * BLAS, cuBLASLt does not read C when beta is 0 (PyTorch and llm.c rely on it too), and a
     * memset would add a full write of every product's output. */
    /* No preference covers the bias pointer, and epilogue kernels may read it in 16-byte
     * vectors: a less aligned bias (a parameter view at an odd offset) takes the plain
     * product and the bias kernel. Aux and bias-gradient buffers come from the arena. */
    int want = p->act != ACT_NONE || p->bias != NULL;
    if (want && (p->bias == NULL || alignment_of(p->bias) >= 16)) {
        cublasStatus_t st = lt_try(s, p);
        if (st == CUBLAS_STATUS_SUCCESS) {
            return 1;
        }
        int half_bgrad = p->act == ACT_DGELU && p->dbias != NULL && p->d_type != CUDA_R_32F;
        note_fallback(epilogue_of(p), p, st,
                      half_bgrad ? "DGELU and a bias-gradient kernel"
                                 : "a plain product and GELU kernels");
        int r = half_bgrad ? dgelu_then_sum(g, p, what) : -1;
        if (r >= 0) {
            return r;
        }
    }
    lt_mm q = *p;
    /* A plain product stores a 2-byte D itself (the gradient products under autocast). */
    int half_epilogue = p->d_type != CUDA_R_32F && p->act != ACT_NONE;
    if (half_epilogue) {
        /* A 2-byte GELU epilogue's fallback: the product in fp32 (GELU and its derivative
         * read it unrounded), in the arena in forward (ops take no scratch marks there), in
         * per-op scratch in backward. */
        size_t nbytes = (size_t)(p->m * p->n) * sizeof(float);
        q.D = p->act == ACT_DGELU ? accel__nn_dtmp_alloc(g, nbytes) : accel__nn_dalloc(g, nbytes);
        q.d_type = CUDA_R_32F;
        q.ldd = p->m;
        if (q.D == NULL) {
            return 0;
        }
    }
    cublasStatus_t st = lt_run(s, &q, 0);
    if (st != CUBLAS_STATUS_SUCCESS) {
        accel__nn_fail(g, ACCEL_EIO, "%s: cuBLASLt matmul (%lld x %lld x %lld) failed: %s", what,
                       (long long)p->m, (long long)p->n, (long long)p->k,
                       cublasGetStatusString(st));
        return 0;
    }
    return half_epilogue ? epilogue_kernels_half(g, p, q.D, what) : epilogue_kernels(g, p, what);
}

/* A shell output's product (p: D 2-byte, with the bias rounded in 2 bytes, or NULL): cuBLASLt
 * rounds the fp32 sum + bias once. Where it offers no BIAS epilogue with a 2-byte D, the fp32
 * product with the bias in fp32 (bias_f, the same values) and one rounding pass: the same
 * bits. 0 and the ctx error on failure. */
static int shell_matmul(nn_ctx *g, const lt_mm *p, const float *bias_f, const char *what)
{
    if (p->bias == NULL) {
        return lt_matmul(g, p, what); /* a plain product stores a 2-byte D itself */
    }
    cublasStatus_t st =
        alignment_of(p->bias) >= 16 ? lt_try(g->gpu, p) : CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
        return 1;
    }
    note_fallback(epilogue_of(p), p, st, "an fp32 product and a rounding pass");
    lt_mm q = *p;
    q.D = accel__nn_dalloc(g, (size_t)(p->m * p->n) * sizeof(float));
    q.d_type = CUDA_R_32F;
    q.bias = NULL;
    float *br = accel__nn_dalloc(g, (size_t)p->m * sizeof(float));
    cudaStream_t cs = nn__cu_stream(g);
    return q.D != NULL && br != NULL &&
           accel__nn_cu_ok(g, nn_cu_acc(cs, br, bias_f, p->m, rnd_of(p->d_type), 1), what) &&
           ((q.bias = br), lt_matmul(g, &q, what)) &&
           accel__nn_cu_ok(g, nn_cu_to_half(cs, q.D, p->D, p->m * p->n, rnd_of(p->d_type)), what);
}

static cudaDataType_t in_type(int rnd)
{
    return rnd == 1 ? CUDA_R_16BF : rnd == 2 ? CUDA_R_16F : CUDA_R_32F;
}

int accel__nn_cu_matmul(nn_ctx *g, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                        int64_t lda, const void *B, int64_t ldb, float beta, float *D, int64_t ldd,
                        int rnd, const char *what)
{
    lt_mm p = {ta,   tb,           m,    n,        k,    A,    lda,       B, ldb, D, ldd,
               beta, in_type(rnd), NULL, ACT_NONE, NULL, NULL, CUDA_R_32F};
    return lt_matmul(g, &p, what);
}

/* grad (+)= the product of p, rounded under autocast: p->D is set here. t: the tensor whose
 * gradient grad is (an input's), or NULL (a weight's). */
static int grad_matmul(nn_ctx *g, lt_mm *p, float *grad, nn_tensor *t, int fresh, int rnd,
                       const char *what)
{
    if (rnd == 0) {
        p->D = grad;
        p->beta = fresh ? 0.0f : 1.0f;
        return lt_matmul(g, p, what);
    }
    /* The product stored rounded, in 2 bytes (the rounding rnd_dt would do on its fp32 copy),
     * then widened into grad: 2 + 2 bytes an element in between instead of 4 + 4. A fresh
     * gradient is then exactly those 2-byte values widened: when t's consumer asked for its
     * gradient's shadow, they are it (kept in the arena instead of per-op scratch). */
    int64_t n = p->m * p->n;
    int keep = fresh && t != NULL && t->base == NULL && t->grad_shadow_rnd == rnd;
    p->D = keep ? accel__nn_cu_grad_shadow_alloc(g, t) : accel__nn_dtmp_alloc(g, (size_t)n * 2);
    p->d_type = in_type(rnd);
    p->beta = 0.0f;
    if (p->D == NULL && keep && g->first_err == ACCEL_OK) { /* shadows off */
        keep = 0;
        p->D = accel__nn_dtmp_alloc(g, (size_t)n * 2);
    }
    if (p->D == NULL || !lt_matmul(g, p, what) ||
        !accel__nn_cu_ok(g, nn_cu_acc_half(nn__cu_stream(g), grad, p->D, n, rnd, fresh), what)) {
        return 0;
    }
    if (keep) {
        t->grad_shadow = p->D;
    }
    return 1;
}

/* What a linear node is (n->i[5]): a plain nn_linear, or one of the two products of
 * nn_linear_gelu_linear. FUSED_GELU (the first): y = gelu(x W1 + b1) with the GELU input kept
 * (n->p[3]); its output gradient arrives already through GELU's derivative (dZ, written by the
 * second node) and its bias gradient may too (n->p[2]). FUSED_DGELU (the second, reading the
 * first's private output): its input gradient is the product through the DGELU(_BGRAD)
 * epilogue with the first node's GELU input (n->p[3] is that node).
 * Under autocast the first node's output is only ever read rounded (by the second product),
 * and its gradient too (by the first node's products), so both are kept in the 2-byte dtype:
 * y->data holds h as 2-byte values (its first half) and y->grad dZ likewise, with the GELU
 * input (aux) and the first bias's gradient (n->p[2]) also 2-byte, as cuBLASLt requires of an
 * epilogue's aux and bias with a 2-byte D. The tensor is private to the op, so nothing else
 * reads them as fp32. */
enum { LIN_PLAIN = 0, LIN_FUSED_DGELU = 1, LIN_FUSED_GELU = 2 };

/* How the fused MLP makes its hidden gradient under autocast (ACCEL_NN_DGELU, read once; the
 * test hook accel__nn_cu_dgelu_kernel): 1 "kernel" (the default), the product stored plain in
 * 2 bytes, then nn_cu_dgelu_bgrad_half for GELU's derivative and the bias gradient in one pass
 * (2 + 2 bytes read and 2 written an element; the CPU's definition: the hidden gradient
 * rounded before the derivative, the bias gradient summed from the rounded dZ); 0 "epilogue",
 * cuBLASLt's DGELU_BGRAD (from the fp32 product; a separate kernel of its own on Hopper) and
 * its fallbacks. fp32 always takes the epilogue. */
static int dgelu_kernel = 1;
static pthread_once_t dgelu_once = PTHREAD_ONCE_INIT;

static void dgelu_read_env(void)
{
    const char *v;
    if (accel__env_string("ACCEL_NN_DGELU", &v) != ACCEL_OK) {
        return;
    }
    if (strcmp(v, "epilogue") == 0) {
        dgelu_kernel = 0;
    } else if (strcmp(v, "kernel") != 0) {
        accel__log(NULL, ACCEL__LOG_WARN, "ACCEL_NN_DGELU=%s ignored: kernel or epilogue", v);
    }
}

void accel__nn_cu_dgelu_kernel(int on)
{
    pthread_once(&dgelu_once, dgelu_read_env);
    dgelu_kernel = on;
}

static int use_dgelu_kernel(void)
{
    pthread_once(&dgelu_once, dgelu_read_env);
    return dgelu_kernel;
}

/* The input gradient of a FUSED_DGELU node n: dZ = (dY op(W2)) * gelu'(Z) into gx (the first
 * node's output gradient) and the first bias's gradient into an arena buffer the first node
 * then adds. p: the input-gradient product, D unset. */
static int dgelu_grad(nn_ctx *g, nn_node *n, lt_mm *p, void *gx, int fresh, const char *what)
{
    nn_node *a = n->p[3];
    const nn_tensor *b1 = a->in[2];
    /* The first node's mode decides the types of its aux and of h's gradient (the two nodes
     * differ only if NN_AUTOCAST_AUTO learned the dtype from the second weight). */
    int rnd = (int)a->i[4];
    int want_db = b1 != NULL && b1->requires_grad;
    p->d_type = in_type(rnd);
    if (rnd != 0 && use_dgelu_kernel()) {
        /* gx is the 2-byte, always fresh hidden gradient (half_grad): the product lands there
         * and the kernel turns it into dZ in place; the bias gradient is stored, not added. */
        float *part = NULL;
        void *db = want_db ? accel__nn_dalloc(g, (size_t)p->m * 2) : NULL;
        if (want_db && (db == NULL || !accel__nn_cu_sum_parts(g, p->n, p->m, 1, &part))) {
            return 0;
        }
        if (want_db) {
            a->p[2] = db;
        }
        p->D = gx;
        p->beta = 0.0f;
        return lt_matmul(g, p, what) &&
               accel__nn_cu_ok(
                   g,
                   nn_cu_dgelu_bgrad_half(nn__cu_stream(g), gx, a->p[3], p->n, p->m, db, part, rnd),
                   what);
    }
    p->act = ACT_DGELU;
    p->aux = a->p[3];
    size_t elem_nbytes = rnd ? 2 : sizeof(float);
    if (want_db) {
        /* Zeroed, so the sums are right whether the epilogue stores them (as documented) or
         * adds them. */
        p->dbias = accel__nn_dzalloc(g, (size_t)p->m * elem_nbytes);
        if (p->dbias == NULL) {
            return 0;
        }
        a->p[2] = p->dbias;
    }
    /* The first node's output is private to the op, so its gradient is always fresh here; an
     * epilogue never accumulates (beta would enter before the derivative), so anything else
     * would go through scratch (fp32 only: a 2-byte gradient is always fresh, half_grad). */
    int64_t count = p->m * p->n;
    p->D = fresh ? gx : accel__nn_dtmp_alloc(g, (size_t)count * sizeof(float));
    p->beta = 0.0f;
    return p->D != NULL && lt_matmul(g, p, what) &&
           (fresh || accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), gx, p->D, count, 0, 0), what));
}

/* The 2-byte gradient (dZ) of the fused MLP's private hidden tensor x under autocast: its
 * first and only contribution, written by the DGELU epilogue and read by the first node's
 * products as they are. NULL and the ctx error on failure. */
static void *half_grad(nn_ctx *g, nn_tensor *x, int64_t count, const char *what)
{
    if (x->base != NULL || x->grad != NULL || x->grad_reserved != NULL) {
        accel__nn_fail(g, ACCEL_ESTATE, "%s: the hidden tensor's gradient was already taken", what);
        return NULL;
    }
    x->grad = accel__nn_dalloc(g, (size_t)count * 2);
    return x->grad;
}

static void linear_backward(nn_ctx *g, nn_node *n)
{
    const char *what =
        n->i[5] != LIN_PLAIN ? "nn_linear_gelu_linear (backward)" : "nn_linear (backward)";
    nn_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    int64_t M = n->i[0], in = n->i[1], out = n->i[2];
    int in_out = n->i[3] == NN_LAYOUT_IN_OUT, rnd = (int)n->i[4];
    const void *xd = rnd ? n->p[0] : x->data, *wd = rnd ? n->p[1] : w->data;
    const float *gy = n->out->grad;
    /* The first fused node's gradient (dZ) is 2-byte already under autocast (half_grad). */
    int half_gy = rnd != 0 && n->i[5] == LIN_FUSED_GELU;
    /* The rounded dY: the shadow its writer made (the residual add's backward), else a copy. */
    const nn_tensor *yt = n->out;
    const void *gyd = !rnd || half_gy ? (const void *)gy
                      : yt->grad_shadow != NULL && yt->grad_shadow_rnd == rnd
                          ? yt->grad_shadow
                          : accel__nn_cu_half_copy(g, gy, M * out, rnd, 1, what);
    if (gyd == NULL) {
        return;
    }
    cudaDataType_t ty = in_type(rnd);
    int fx = 1;
    int half_gx = n->i[5] == LIN_FUSED_DGELU && ((const nn_node *)n->p[3])->i[4] != 0;
    void *gx = in <= 0   ? NULL
               : half_gx ? half_grad(g, x, M * in, what)
                         : accel__nn_grad_w(g, x, &fx);
    if (gx == NULL && g->first_err != ACCEL_OK) {
        return;
    }
    if (gx != NULL && M > 0) {
        lt_mm p = {in_out, 0,  in,   M,        out,  wd,   in_out ? out : in, gyd, out, NULL, in,
                   0.0f,   ty, NULL, ACT_NONE, NULL, NULL, CUDA_R_32F};
        if (n->i[5] == LIN_FUSED_DGELU) {
            if (!dgelu_grad(g, n, &p, gx, fx, what)) {
                return;
            }
        } else if (out == 0) {
            if (fx) {
                accel__nn_cu_ok(
                    g, cudaMemsetAsync(gx, 0, (size_t)(M * in) * sizeof(float), nn__cu_stream(g)),
                    what);
            }
        } else if (!grad_matmul(g, &p, gx, x, fx, rnd, what)) {
            return;
        }
    }
    /* Fetched after gx was written, so x == w (however odd) adds rather than overwrites. */
    int fw;
    float *gw = in * out > 0 ? accel__nn_grad_w(g, w, &fw) : NULL;
    if (gw != NULL) {
        lt_mm p;
        if (in_out) { /* dW [in, out] = X^T dY: column-major out x in = dY X^T */
            lt_mm q = {0,    1,   out,  in, M,    gyd,      out,  xd,   in,
                       NULL, out, 0.0f, ty, NULL, ACT_NONE, NULL, NULL, CUDA_R_32F};
            p = q;
        } else { /* dW [out, in] = dY^T X: column-major in x out = X dY^T */
            lt_mm q = {0,    1,  in,   out, M,    xd,       in,   gyd,  out,
                       NULL, in, 0.0f, ty,  NULL, ACT_NONE, NULL, NULL, CUDA_R_32F};
            p = q;
        }
        if (M == 0) {
            if (fw) {
                accel__nn_cu_ok(
                    g, cudaMemsetAsync(gw, 0, (size_t)(in * out) * sizeof(float), nn__cu_stream(g)),
                    what);
            }
        } else if (!grad_matmul(g, &p, gw, NULL, fw, rnd, what)) {
            return;
        }
    }
    float *gb = b && out > 0 ? accel__nn_grad(g, b) : NULL;
    if (gb != NULL && n->p[2] != NULL) { /* summed by the second node's DGELU_BGRAD */
        /* Under autocast the epilogue stored the sum already rounded, in 2 bytes. */
        accel__nn_cu_ok(g,
                        half_gy ? nn_cu_acc_half(nn__cu_stream(g), gb, n->p[2], out, rnd, 0)
                                : nn_cu_acc(nn__cu_stream(g), gb, n->p[2], out, rnd, 0),
                        what);
        return;
    }
    if (half_gy && gb != NULL) {
        /* dgelu_grad sums the first bias's gradient whenever it needs one. */
        accel__nn_fail(g, ACCEL_ESTATE, "%s: the first bias's gradient was not summed", what);
        return;
    }
    float *part = NULL;
    if (gb != NULL && accel__nn_cu_sum_parts(g, M, out, 1, &part)) {
        /* Under autocast the bias gradient of a low-precision kernel: the rounded dY (the
         * 2-byte copy the products read, half the bytes of dY) summed, then rounded. */
        accel__nn_cu_ok(g, nn_cu_col_sum(nn__cu_stream(g), gyd, rnd, M, out, gb, 0, rnd, part),
                        what);
    }
}

/* y = x W (+ bias) recorded as a node of `kind`: for LIN_FUSED_GELU y = gelu(...) with the GELU
 * input kept for backward (under autocast y->data holds h in 2 bytes); for LIN_FUSED_DGELU
 * `first` is the LIN_FUSED_GELU node that made x. x_op: the operand the product reads for x
 * when the caller has it (the fused MLP's 2-byte h), else NULL. *rec: the node (NULL when
 * nothing was recorded). NULL on failure, the ctx error set. */
static nn_tensor *linear_fwd(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                             nn_layout layout, int kind, nn_node *first, const void *x_op,
                             const char *what, nn_node **rec, int shell)
{
    *rec = NULL;
    if (x == NULL || w == NULL) {
        return NULL;
    }
    nn_tensor *ins[3] = {x, w, bias};
    if (!accel__nn_cu_product_inputs(g, what, ins, 3)) {
        return NULL;
    }
    int64_t in, out, M;
    int rnd = accel__nn_cu_rnd(nn__autocast(g));
    /* Under autocast the fused first product writes h in 2 bytes, and cuBLASLt then takes
     * its bias, its GELU input (aux) and, in backward, its bias gradient in that type too;
     * h's data is allocated at 2 bytes an element (only this file reads it). */
    int half_out = rnd != 0 && kind == LIN_FUSED_GELU;
    /* shell (LIN_PLAIN, rnd != 0, a non-empty product): y only as its 2-byte shadow. */
    nn_tensor *y = accel__nn_linear_out(g, x, w, bias, layout, shell ? 2 : half_out, &in, &out, &M);
    if (y == NULL || (shell && accel__nn_cu_shadow_alloc(g, y, rnd) == NULL)) {
        return NULL;
    }
    int in_out = layout == NN_LAYOUT_IN_OUT;
    if (in == 0) { /* no input features: y is the bias (or zeros) for every row */
        M = nn_numel(y) / (out ? out : 1);
    }
    const void *xd = x_op != NULL ? x_op : accel__nn_cu_operand(g, x, rnd, 0, what);
    const void *wd = accel__nn_cu_operand(g, w, rnd, 0, what);
    const void *bd = bias ? bias->data : NULL;
    if (xd == NULL || wd == NULL) {
        return NULL;
    }
    if (bias != NULL && (half_out || shell)) { /* the CPU's rounded bias, exactly, in 2 bytes */
        /* (the working copy when the model keeps one, aligned as the epilogue needs) */
        bd = accel__nn_cu_operand(g, bias, rnd, 0, what);
        if (bd != NULL && alignment_of(bd) < 16) {
            bd = accel__nn_cu_half_copy(g, bias->data, out, rnd, 0, what);
        }
        if (bd == NULL) {
            return NULL;
        }
    } else if (bias != NULL && rnd != 0) { /* the CPU's autocast rounds the bias too */
        float *br = accel__nn_dalloc(g, (size_t)out * sizeof(float));
        if (br == NULL ||
            (out > 0 &&
             !accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), br, bias->data, out, rnd, 1), what))) {
            return NULL;
        }
        bd = br;
    } else if (bd != NULL && alignment_of(bd) < 16 && in > 0 && M * out > 0) {
        /* Epilogues may read the bias in 16-byte vectors, and a parameter view can sit at any
         * offset: an aligned copy keeps the fused epilogue (lt_matmul would go without it). */
        float *ba = accel__nn_dalloc(g, (size_t)out * sizeof(float));
        if (ba == NULL ||
            !accel__nn_cu_ok(g,
                             cudaMemcpyAsync(ba, bd, (size_t)out * sizeof(float),
                                             cudaMemcpyDeviceToDevice, nn__cu_stream(g)),
                             what)) {
            return NULL;
        }
        bd = ba;
    }
    void *aux = NULL; /* the GELU input, for backward */
    if (kind == LIN_FUSED_GELU &&
        (aux = accel__nn_dalloc(g, (size_t)(M * out) * (half_out ? 2 : sizeof(float)))) == NULL) {
        return NULL;
    }
    if (M * out > 0) {
        if (in == 0) {
            if (!accel__nn_cu_ok(g,
                                 cudaMemsetAsync(y->data, 0, (size_t)(M * out) * sizeof(float),
                                                 nn__cu_stream(g)),
                                 what) ||
                (bd != NULL &&
                 !accel__nn_cu_ok(
                     g, nn_cu_add(nn__cu_stream(g), y->data, M * out, bd, out, y->data), what))) {
                return NULL;
            }
        } else {
            /* Y^T (out x M) = op(W) (out x in) X^T (in x M). */
            lt_mm p = {!in_out,           0,  out,      M,       in,   wd,
                       in_out ? out : in, xd, in,       y->data, out,  0.0f,
                       in_type(rnd),      bd, ACT_NONE, NULL,    NULL, CUDA_R_32F};
            if (kind == LIN_FUSED_GELU) {
                p.act = ACT_GELU;
                p.aux = aux;
                p.d_type = half_out ? in_type(rnd) : CUDA_R_32F;
            }
            if (shell) {
                p.D = y->shadow;
                p.d_type = in_type(rnd);
            }
            if (!(shell ? shell_matmul(g, &p, bias != NULL ? bias->data : NULL, what)
                        : lt_matmul(g, &p, what))) {
                return NULL;
            }
        }
    }
    if (accel__nn_needs_grad(g, ins, 3)) {
        /* Backward reads dY only rounded (but the fused first product's, 2-byte already):
         * its writers are asked for a shadow. */
        y->grad_shadow_rnd = kind != LIN_FUSED_GELU && accel__nn_cu_shadows_on() ? rnd : 0;
        static const char *const names[] = {"linear", "linear_dgelu", "linear_gelu"};
        nn_node *n = accel__nn_record(g, names[kind], y, ins, 3, linear_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = M;
        n->i[1] = in;
        n->i[2] = out;
        n->i[3] = layout;
        n->i[4] = rnd;
        n->i[5] = kind;
        n->p[0] = (void *)xd;
        n->p[1] = (void *)wd;
        n->p[3] = kind == LIN_FUSED_GELU ? (void *)aux : (void *)first;
        *rec = n;
    }
    return y;
}

nn_tensor *accel__nn_cu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                               nn_layout layout)
{
    nn_node *n;
    return linear_fwd(g, x, w, bias, layout, LIN_PLAIN, NULL, NULL, "nn_linear", &n, 0);
}

nn_tensor *accel__nn_cu_linear_shell(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                                     nn_layout layout, int rnd)
{
    nn_node *n;
    int shell = rnd != 0 && rnd == accel__nn_cu_rnd(nn__autocast(g)) && x != NULL && x->ndim >= 1 &&
                x->shape[x->ndim - 1] > 0 && nn_numel(x) > 0;
    return linear_fwd(g, x, w, bias, layout, LIN_PLAIN, NULL, NULL, "nn_linear", &n, shell);
}

nn_tensor *accel__nn_cu_linear_gelu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w1, nn_tensor *b1,
                                           nn_tensor *w2, nn_tensor *b2, nn_layout layout)
{
    static const char what[] = "nn_linear_gelu_linear";
    if (x == NULL || w1 == NULL || w2 == NULL) {
        return NULL;
    }
    /* cuBLASLt's GELU input (aux) needs a leading dimension, the hidden width, that is a
     * multiple of 8; empty products have nothing to fuse. Those take the three ops. */
    int64_t hidden = w1->ndim == 2 ? w1->shape[layout == NN_LAYOUT_IN_OUT ? 1 : 0] : 0;
    int64_t in = x->ndim >= 1 ? x->shape[x->ndim - 1] : 0;
    if (hidden <= 0 || hidden % 8 != 0 || in == 0 || nn_numel(x) == 0 || nn_numel(w2) == 0) {
        nn_tensor *h = accel__nn_cu_gelu(g, accel__nn_cu_linear(g, x, w1, b1, layout), 1);
        return accel__nn_cu_linear(g, h, w2, b2, layout);
    }
    nn_node *first, *second;
    nn_tensor *h = linear_fwd(g, x, w1, b1, layout, LIN_FUSED_GELU, NULL, NULL, what, &first, 0);
    /* Under autocast h holds its 2-byte values: the second product reads them as they are. */
    const void *h_op = h != NULL && accel__nn_cu_rnd(nn__autocast(g)) != 0 ? h->data : NULL;
    /* Without a first node (nothing before needs a gradient) the second is a plain linear. */
    return linear_fwd(g, h, w2, b2, layout, first ? LIN_FUSED_DGELU : LIN_PLAIN, first, h_op, what,
                      &second, 0);
}
