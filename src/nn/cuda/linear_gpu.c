/*
 * nn_linear on CUDA through cuBLASLt. Row-major [M, in] x weight is computed as the
 * column-major product Y^T = W' X^T, so no operand is ever copied or transposed. In fp32 the
 * product is plain fp32 (CUBLAS_COMPUTE_32F: no TF32); under autocast bf16 / fp16 the inputs
 * are rounded into 2-byte copies and multiplied with fp32 accumulation into an fp32 output,
 * as the CPU's autocast does: the bias is added in fp32 by cuBLASLt's bias epilogue (a plain
 * product plus a bias kernel where cuBLASLt offers no algorithm with the epilogue), and in
 * backward each gradient contribution is rounded to the dtype before it is added.
 */
#include "gpu_internal.h"

typedef struct lt_mm {
    int ta, tb;      /* transpose A / B (column-major) */
    int64_t m, n, k; /* D (m x n) = op(A) (m x k) op(B) (k x n) */
    const void *A;
    int64_t lda;
    const void *B;
    int64_t ldb;
    float *D;
    int64_t ldd;
    float beta; /* D = op(A) op(B) + beta D */
    cudaDataType_t in_type;
    const float *bias; /* m floats added to every column (epilogue), or NULL */
} lt_mm;

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

static cublasStatus_t lt_run(nn_gpu_state *s, const lt_mm *p, int with_bias)
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
    if (st == CUBLAS_STATUS_SUCCESS && with_bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        int32_t bias_type = CUDA_R_32F;
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep));
        if (st == CUBLAS_STATUS_SUCCESS) {
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                                sizeof(p->bias));
        }
        if (st == CUBLAS_STATUS_SUCCESS) {
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof(bias_type));
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
        st = cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, p->m, p->n, p->ldd);
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

/* Runs p (its bias through the epilogue, or a bias kernel after a plain product); 0 and the
 * ctx error on failure. */
static int lt_matmul(nn_ctx *g, const lt_mm *p, const char *what)
{
    nn_gpu_state *s = g->gpu;
    /* Overwritten outputs are fresh arena memory: zero them, so no algorithm can turn stale
     * NaNs into 0 * NaN even if it reads D when beta is 0 (ldd == m in every call here). */
    if (p->beta == 0.0f &&
        !accel__nn_cu_ok(g, cudaMemsetAsync(p->D, 0, (size_t)(p->m * p->n) * sizeof(float), nn__cu_stream(g)),
                         what)) {
        return 0;
    }
    /* No preference covers the bias pointer, and epilogue kernels may read it in 16-byte
     * vectors: a less aligned bias (a parameter view at an odd offset) takes the plain
     * product and the bias kernel. */
    if (p->bias != NULL && alignment_of(p->bias) >= 16 &&
        lt_run(s, p, 1) == CUBLAS_STATUS_SUCCESS) {
        return 1;
    }
    cublasStatus_t st = lt_run(s, p, 0);
    if (st != CUBLAS_STATUS_SUCCESS) {
        accel__nn_fail(g, ACCEL_EIO, "%s: cuBLASLt matmul (%lld x %lld x %lld) failed: %s", what,
                       (long long)p->m, (long long)p->n, (long long)p->k,
                       cublasGetStatusString(st));
        return 0;
    }
    /* The bias adds to every column of the column-major D (m x n, ldd == m here). */
    return p->bias == NULL ||
           accel__nn_cu_ok(g, nn_cu_add(nn__cu_stream(g), p->D, p->m * p->n, p->bias, p->m, p->D), what);
}

static cudaDataType_t in_type(int rnd)
{
    return rnd == 1 ? CUDA_R_16BF : rnd == 2 ? CUDA_R_16F : CUDA_R_32F;
}

/* n values rounded into a 2-byte copy (dtype of rnd): in the device arena (kept for the
 * step), or in per-op scratch (scratch: backward's transients); NULL on failure. */
static void *half_copy(nn_ctx *g, const float *src, int64_t n, int rnd, int scratch,
                       const char *what)
{
    void *h = scratch ? accel__nn_dtmp_alloc(g, (size_t)n * 2) : accel__nn_dalloc(g, (size_t)n * 2);
    if (h == NULL || (n > 0 && !accel__nn_cu_ok(g, nn_cu_to_half(nn__cu_stream(g), src, h, n, rnd), what))) {
        return NULL;
    }
    return h;
}

/* The operand as the product reads it: t itself in fp32; under autocast a parameter's
 * working copy on the GPU when the model keeps one in that dtype (the master rounded, the
 * same values a copy would hold, valid from accel_prepare to the next optimizer step), else a
 * rounded 2-byte copy. */
static const void *operand(nn_ctx *g, const nn_tensor *t, int rnd, const char *what)
{
    if (rnd == 0) {
        return t->data;
    }
    if (t->sink_compute != NULL && t->base == NULL && t->param_index >= 0) {
        accel_tensor c;
        t->sink_compute(t->sink_ctx, t->param_index, &c);
        if (c.data != NULL && c.device.type == ACCEL_DEVICE_CUDA &&
            c.dtype == (rnd == 1 ? ACCEL_BF16 : ACCEL_F16)) {
            return c.data;
        }
    }
    return half_copy(g, t->data, nn_numel(t), rnd, 0, what);
}

/* grad (+)= the product of p, rounded under autocast: p->D is set here. */
static int grad_matmul(nn_ctx *g, lt_mm *p, float *grad, int fresh, int rnd, const char *what)
{
    if (rnd == 0) {
        p->D = grad;
        p->beta = fresh ? 0.0f : 1.0f;
        return lt_matmul(g, p, what);
    }
    int64_t n = p->m * p->n;
    p->D = accel__nn_dtmp_alloc(g, (size_t)n * sizeof(float));
    p->beta = 0.0f;
    return p->D != NULL && lt_matmul(g, p, what) &&
           accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), grad, p->D, n, rnd, fresh), what);
}

static void linear_backward(nn_ctx *g, nn_node *n)
{
    static const char what[] = "nn_linear (backward)";
    nn_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    int64_t M = n->i[0], in = n->i[1], out = n->i[2];
    int in_out = n->i[3] == NN_LAYOUT_IN_OUT, rnd = (int)n->i[4];
    const void *xd = rnd ? n->p[0] : x->data, *wd = rnd ? n->p[1] : w->data;
    const float *gy = n->out->grad;
    const void *gyd = rnd ? half_copy(g, gy, M * out, rnd, 1, what) : gy;
    if (gyd == NULL) {
        return;
    }
    cudaDataType_t ty = in_type(rnd);
    int fx;
    float *gx = in > 0 ? accel__nn_grad_w(g, x, &fx) : NULL;
    if (gx != NULL && M > 0) {
        lt_mm p = {in_out, 0,   in,   M,  out,  wd, in_out ? out : in,
                   gyd,    out, NULL, in, 0.0f, ty, NULL};
        if (out == 0) {
            if (fx) {
                accel__nn_cu_ok(g, cudaMemsetAsync(gx, 0, (size_t)(M * in) * sizeof(float), nn__cu_stream(g)),
                                what);
            }
        } else if (!grad_matmul(g, &p, gx, fx, rnd, what)) {
            return;
        }
    }
    /* Fetched after gx was written, so x == w (however odd) adds rather than overwrites. */
    int fw;
    float *gw = in * out > 0 ? accel__nn_grad_w(g, w, &fw) : NULL;
    if (gw != NULL) {
        lt_mm p;
        if (in_out) { /* dW [in, out] = X^T dY: column-major out x in = dY X^T */
            lt_mm q = {0, 1, out, in, M, gyd, out, xd, in, NULL, out, 0.0f, ty, NULL};
            p = q;
        } else { /* dW [out, in] = dY^T X: column-major in x out = X dY^T */
            lt_mm q = {0, 1, in, out, M, xd, in, gyd, out, NULL, in, 0.0f, ty, NULL};
            p = q;
        }
        if (M == 0) {
            if (fw) {
                accel__nn_cu_ok(g, cudaMemsetAsync(gw, 0, (size_t)(in * out) * sizeof(float), nn__cu_stream(g)),
                                what);
            }
        } else if (!grad_matmul(g, &p, gw, fw, rnd, what)) {
            return;
        }
    }
    float *gb = b && out > 0 ? accel__nn_grad(g, b) : NULL;
    if (gb != NULL) {
        if (rnd == 0) {
            accel__nn_cu_ok(g, nn_cu_col_sum(nn__cu_stream(g), gy, M, out, gb, 0), what);
            return;
        }
        /* The bias gradient of a low-precision kernel: the rounded dY summed, then rounded. */
        float *gyr = accel__nn_dtmp_alloc(g, (size_t)(M * out) * sizeof(float));
        float *sum = accel__nn_dtmp_alloc(g, (size_t)out * sizeof(float));
        if (gyr == NULL || sum == NULL ||
            (M > 0 && !accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), gyr, gy, M * out, rnd, 1), what))) {
            return;
        }
        if (accel__nn_cu_ok(g, nn_cu_col_sum(nn__cu_stream(g), gyr, M, out, sum, 1), what)) {
            accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), gb, sum, out, rnd, 0), what);
        }
    }
}

nn_tensor *accel__nn_cu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                               nn_layout layout)
{
    static const char what[] = "nn_linear";
    if (x == NULL || w == NULL) {
        return NULL;
    }
    nn_tensor *ins[3] = {x, w, bias};
    if (!accel__nn_cu_inputs(g, what, ins, 3)) {
        return NULL;
    }
    int64_t in, out, M;
    nn_tensor *y = accel__nn_linear_out(g, x, w, bias, layout, &in, &out, &M);
    if (y == NULL) {
        return NULL;
    }
    int in_out = layout == NN_LAYOUT_IN_OUT;
    if (in == 0) { /* no input features: y is the bias (or zeros) for every row */
        M = nn_numel(y) / (out ? out : 1);
    }
    int rnd = accel__nn_cu_rnd(nn__autocast(g));
    const void *xd = operand(g, x, rnd, what), *wd = operand(g, w, rnd, what);
    const float *bd = bias ? bias->data : NULL;
    if (xd == NULL || wd == NULL) {
        return NULL;
    }
    if (bias != NULL && rnd != 0) { /* the CPU's autocast rounds the bias too */
        float *br = accel__nn_dalloc(g, (size_t)out * sizeof(float));
        if (br == NULL ||
            (out > 0 && !accel__nn_cu_ok(g, nn_cu_acc(nn__cu_stream(g), br, bias->data, out, rnd, 1), what))) {
            return NULL;
        }
        bd = br;
    }
    if (M * out > 0) {
        if (in == 0) {
            if (!accel__nn_cu_ok(
                    g, cudaMemsetAsync(y->data, 0, (size_t)(M * out) * sizeof(float), nn__cu_stream(g)), what) ||
                (bd != NULL &&
                 !accel__nn_cu_ok(g, nn_cu_add(nn__cu_stream(g), y->data, M * out, bd, out, y->data), what))) {
                return NULL;
            }
        } else {
            /* Y^T (out x M) = op(W) (out x in) X^T (in x M). */
            lt_mm p = {!in_out, 0,  out,     M,   in,   wd,           in_out ? out : in,
                       xd,      in, y->data, out, 0.0f, in_type(rnd), bd};
            if (!lt_matmul(g, &p, what)) {
                return NULL;
            }
        }
    }
    if (accel__nn_needs_grad(g, ins, 3)) {
        nn_node *n = accel__nn_record(g, "linear", y, ins, 3, linear_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = M;
        n->i[1] = in;
        n->i[2] = out;
        n->i[3] = layout;
        n->i[4] = rnd;
        n->p[0] = (void *)xd;
        n->p[1] = (void *)wd;
    }
    return y;
}
