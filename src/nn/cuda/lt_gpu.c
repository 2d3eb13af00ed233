/*
 * The cuBLASLt runner of nn's products (lt_gpu.h): one product of an lt_mm with its bias / GELU
 * / bias-gradient epilogue, told each operand's real alignment; where cuBLASLt offers no
 * algorithm with the epilogue (or a test hook forbids it), a plain product and kernels that
 * do what the epilogue would, said once per process and epilogue at level info. Invariant: a
 * fallback computes what the epilogue documents, in the same types (a 2-byte D's GELU and
 * derivative from the fp32 product, only the results rounded), so callers never see which
 * path ran except in speed.
 */
#include "lt_gpu.h"

/* The epilogue lt_run asks for when it uses p's bias / activation. */
static cublasLtEpilogue_t epilogue_of(const lt_mm *p)
{
    if (p->act == LT_ACT_GELU) {
        return p->bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    }
    if (p->act == LT_ACT_DGELU) {
        return p->dbias != NULL ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    }
    if (p->act == LT_ACT_BGRADA || p->act == LT_ACT_BGRADB) {
        return p->act == LT_ACT_BGRADA ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB;
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
    case CUBLASLT_EPILOGUE_BGRADA:
        return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB:
        return "BGRADB";
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
        /* The bias is read (BIAS, GELU_AUX_BIAS) or its gradient written (DGELU_BGRAD,
         * BGRADA / BGRADB) in the type of D: cuBLASLt's rule outside integer and fp8
         * kernels. */
        const void *bias =
            p->act != LT_ACT_NONE && p->act != LT_ACT_GELU ? (const void *)p->dbias : p->bias;
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
        if (st == CUBLAS_STATUS_SUCCESS && (p->act == LT_ACT_GELU || p->act == LT_ACT_DGELU)) {
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
        uint32_t al = lt_alignment_of(ptrs[i]);
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
    static int said[5];
    int k = ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || ep == CUBLASLT_EPILOGUE_GELU_AUX ? 1
            : ep == CUBLASLT_EPILOGUE_DGELU_BGRAD                                     ? 2
            : ep == CUBLASLT_EPILOGUE_DGELU                                           ? 3
            : ep == CUBLASLT_EPILOGUE_BGRADA || ep == CUBLASLT_EPILOGUE_BGRADB        ? 4
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
    if (p->act == LT_ACT_GELU) {
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

/* What BGRADA / BGRADB do, beside the plain product: the sums over k of the operand that
 * holds the bias's rows (A not transposed, m x k; B transposed, n x k; packed, so each is
 * also the row-major [k, count]), by the column-sum kernel, from the operand's values as they
 * are (2-byte under autocast) in fp32, rounded once to D's type: the epilogue's definition,
 * in the kernel's order. */
static int bgrad_kernels(nn_ctx *g, const lt_mm *p, const char *what)
{
    int a = p->act == LT_ACT_BGRADA;
    const void *src = a ? p->A : p->B;
    int64_t count = a ? p->m : p->n, ld = a ? p->lda : p->ldb;
    if ((a ? p->ta : !p->tb) || ld != count) {
        accel__nn_fail(g, ACCEL_ESTATE, "%s: a bias gradient from a transposed or padded operand",
                       what);
        return 0;
    }
    cudaStream_t cs = nn__cu_stream(g);
    int src_dt = p->in_type == CUDA_R_32F ? 0 : rnd_of(p->in_type);
    float *part = NULL;
    if (p->d_type == CUDA_R_32F) {
        return accel__nn_cu_sum_parts(g, p->k, count, 1, &part) &&
               accel__nn_cu_ok(g, nn_cu_col_sum(cs, src, src_dt, p->k, count, p->dbias, 1, 0, part),
                               what);
    }
    float *sum = accel__nn_dtmp_alloc(g, (size_t)count * sizeof(float));
    return sum != NULL && accel__nn_cu_sum_parts(g, p->k, count, 1, &part) &&
           accel__nn_cu_ok(g, nn_cu_col_sum(cs, src, src_dt, p->k, count, sum, 1, 0, part), what) &&
           accel__nn_cu_ok(g, nn_cu_to_half(cs, sum, p->dbias, count, rnd_of(p->d_type)), what);
}

/* What an epilogue does, after a plain product in D: the bias, GELU (keeping its input in
 * aux), GELU's derivative (and the bias gradient) or a bias gradient from an operand. 0 and
 * the ctx error on failure. */
static int epilogue_kernels(nn_ctx *g, const lt_mm *p, const char *what)
{
    cudaStream_t cs = nn__cu_stream(g);
    int64_t n = p->m * p->n;
    if (p->act == LT_ACT_BGRADA || p->act == LT_ACT_BGRADB) {
        return bgrad_kernels(g, p, what);
    }
    if (p->act == LT_ACT_NONE) {
        /* The bias adds to every column of the column-major D (m x n, ldd == m here). */
        return p->bias == NULL ||
               accel__nn_cu_ok(g, nn_cu_add(cs, p->D, n, p->bias, p->m, p->D), what);
    }
    if (p->act == LT_ACT_GELU) {
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
int accel__nn_lt_matmul(nn_ctx *g, const lt_mm *p, const char *what)
{
    nn_gpu_state *s = g->gpu;
    /* An overwritten output (beta 0) is fresh arena memory and is not cleared first: as in
     * BLAS, cuBLASLt does not read C when beta is 0 (PyTorch and llm.c rely on it too), and a
     * memset would add a full write of every product's output. */
    /* No preference covers the bias pointer, and epilogue kernels may read it in 16-byte
     * vectors: a less aligned bias (a parameter view at an odd offset) takes the plain
     * product and the bias kernel. Aux and bias-gradient buffers come from the arena. */
    int want = p->act != LT_ACT_NONE || p->bias != NULL;
    if (want && (p->bias == NULL || lt_alignment_of(p->bias) >= 16)) {
        cublasStatus_t st = lt_try(s, p);
        if (st == CUBLAS_STATUS_SUCCESS) {
            return 1;
        }
        int half_bgrad = p->act == LT_ACT_DGELU && p->dbias != NULL && p->d_type != CUDA_R_32F;
        int op_bgrad = p->act == LT_ACT_BGRADA || p->act == LT_ACT_BGRADB;
        note_fallback(epilogue_of(p), p, st,
                      half_bgrad ? "DGELU and a bias-gradient kernel"
                      : op_bgrad ? "a plain product and the column-sum kernel"
                                 : "a plain product and GELU kernels");
        int r = half_bgrad ? dgelu_then_sum(g, p, what) : -1;
        if (r >= 0) {
            return r;
        }
    }
    lt_mm q = *p;
    /* A plain product stores a 2-byte D itself (the gradient products under autocast, also
     * with a bias gradient from an operand, which does not touch D). */
    int half_epilogue =
        p->d_type != CUDA_R_32F && (p->act == LT_ACT_GELU || p->act == LT_ACT_DGELU);
    if (half_epilogue) {
        /* A 2-byte GELU epilogue's fallback: the product in fp32 (GELU and its derivative
         * read it unrounded), in the arena in forward (ops take no scratch marks there), in
         * per-op scratch in backward. */
        size_t nbytes = (size_t)(p->m * p->n) * sizeof(float);
        q.D =
            p->act == LT_ACT_DGELU ? accel__nn_dtmp_alloc(g, nbytes) : accel__nn_dalloc(g, nbytes);
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
int accel__nn_lt_shell_matmul(nn_ctx *g, const lt_mm *p, const float *bias_f, const char *what)
{
    if (p->bias == NULL) {
        return accel__nn_lt_matmul(g, p, what); /* a plain product stores a 2-byte D itself */
    }
    cublasStatus_t st =
        lt_alignment_of(p->bias) >= 16 ? lt_try(g->gpu, p) : CUBLAS_STATUS_NOT_SUPPORTED;
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
           ((q.bias = br), accel__nn_lt_matmul(g, &q, what)) &&
           accel__nn_cu_ok(g, nn_cu_to_half(cs, q.D, p->D, p->m * p->n, rnd_of(p->d_type)), what);
}

int accel__nn_cu_matmul(nn_ctx *g, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                        int64_t lda, const void *B, int64_t ldb, float beta, float *D, int64_t ldd,
                        int rnd, const char *what)
{
    lt_mm p = {
        ta,   tb,          m,    n,    k,         A, lda, B, ldb, D, ldd, beta, lt_in_type(rnd),
        NULL, LT_ACT_NONE, NULL, NULL, CUDA_R_32F};
    return accel__nn_lt_matmul(g, &p, what);
}
