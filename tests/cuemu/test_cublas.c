/*
 * Self-test of the emulated cuBLASLt / cuBLAS (cublas.c, cublas_matmul.c), in the CUDA
 * emulator build only: products set up as src/nn/cuda/lt_gpu.c sets them up (descriptor,
 * layouts, preference with the pointers' alignment, heuristic, matmul), and legacy
 * cublasGemmEx as bench/cuda_step.cu calls it, against a naive triple loop in double: every
 * transpose pair, fp32 / bf16 / fp16, leading dimensions larger than the rows, alpha / beta,
 * C apart from D and C == D, each epilogue accel uses. Then the mistakes the emulator must
 * refuse with the real library's status and a "cuemu: <function>: ..." line naming the culprit,
 * leaving D untouched.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

static int g_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            g_failures++;                                                                          \
        }                                                                                          \
    } while (0)

/* ---- stderr capture: every emulated failure must say what went wrong ---- */

static char g_err[8192];
static FILE *g_tmp;
static int g_saved_fd = -1;

static void capture_begin(void)
{
    fflush(stderr);
    g_tmp = tmpfile();
    g_saved_fd = dup(2);
    if (g_tmp == NULL || g_saved_fd < 0 || dup2(fileno(g_tmp), 2) < 0) {
        fprintf(stderr, "test_cublas: cannot capture stderr\n");
        exit(1);
    }
}

static void capture_end(void)
{
    fflush(stderr);
    dup2(g_saved_fd, 2);
    close(g_saved_fd);
    rewind(g_tmp);
    size_t n = fread(g_err, 1, sizeof g_err - 1, g_tmp);
    g_err[n] = '\0';
    fclose(g_tmp);
}

/* ---- values: inputs exactly representable in bf16 and fp16, so every type sees the same
 * numbers and the reference needs no rounding of its own ---- */

static unsigned g_seed = 12345;

static double next_value(int exact)
{
    g_seed = g_seed * 1103515245u + 12345u;
    unsigned r = (g_seed >> 8) & 0xFFFF;
    if (exact) {
        return ((int)(r % 33) - 16) / 16.0; /* k / 16, |k| <= 16 */
    }
    return (double)(float)(r / 65535.0 * 4.0 - 2.0);
}

static size_t elem_nbytes(int32_t type)
{
    return type == CUDA_R_32F ? 4 : 2;
}

/* v (exact in type) as its 2-byte pattern. */
static uint16_t half_bits(float v, int32_t type)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if (type == CUDA_R_16BF || (u & 0x7FFFFFFFu) == 0) {
        return type == CUDA_R_16BF ? (uint16_t)(u >> 16) : (uint16_t)((u >> 16) & 0x8000u);
    }
    uint32_t e = ((u >> 23) & 0xFFu) - 127 + 15;
    return (uint16_t)(((u >> 16) & 0x8000u) | (e << 10) | ((u & 0x7FFFFFu) >> 13));
}

static double from_half_bits(uint16_t h, int32_t type)
{
    if (type == CUDA_R_16BF) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    int e = (h >> 10) & 0x1F, man = h & 0x3FF;
    double v = e == 0    ? ldexp(man, -24)
               : e == 31 ? (man ? NAN : INFINITY)
                         : ldexp(1024 + man, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void *dev_alloc(size_t nbytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, nbytes) != cudaSuccess) {
        fprintf(stderr, "test_cublas: cudaMalloc(%zu) failed\n", nbytes);
        exit(1);
    }
    return p;
}

/* count values into a fresh device buffer of type with `slack` spare bytes. */
static void *upload(const double *v, size_t count, int32_t type, size_t slack)
{
    size_t nbytes = count * elem_nbytes(type);
    unsigned char *h = malloc(nbytes + 1);
    for (size_t i = 0; i < count; i++) {
        if (type == CUDA_R_32F) {
            float f = (float)v[i];
            memcpy(h + 4 * i, &f, 4);
        } else {
            uint16_t b = half_bits((float)v[i], type);
            memcpy(h + 2 * i, &b, 2);
        }
    }
    void *d = dev_alloc(nbytes + slack);
    cudaMemcpy(d, h, nbytes, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

static void download(double *v, const void *d, size_t count, int32_t type)
{
    size_t nbytes = count * elem_nbytes(type);
    unsigned char *h = malloc(nbytes + 1);
    cudaMemcpy(h, d, nbytes, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count; i++) {
        if (type == CUDA_R_32F) {
            float f;
            memcpy(&f, h + 4 * i, 4);
            v[i] = f;
        } else {
            uint16_t b;
            memcpy(&b, h + 2 * i, 2);
            v[i] = from_half_bits(b, type);
        }
    }
    free(h);
}

/* ---- the reference ---- */

static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_ref(double x)
{
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

/* The error allowed for a value v stored in type (half an ulp: 8 and 11 significant bits in
 * bf16 and fp16), on top of an absolute `err`. */
static double tolerance(double v, int32_t type, double err)
{
    double rel = type == CUDA_R_16BF  ? ldexp(1, -8)
                 : type == CUDA_R_16F ? ldexp(1, -11)
                                      : ldexp(1, -20);
    return err + fabs(v) * rel + (type == CUDA_R_16F ? ldexp(1, -24) : 0) + 1e-30;
}

/* ---- one product ---- */

enum {
    BAD_NONE,
    BAD_DIMS,
    BAD_LD,
    BAD_NULL_A,
    BAD_HOST_B,
    BAD_PINNED_A,
    BAD_SHORT_D,
    BAD_NO_BIAS,
    BAD_AUX_LD,
    BAD_RELU,
    BAD_COMPUTE,
    BAD_ALIGN,
    BAD_ATTR,
    BAD_ATTR_SIZE,
    BAD_TYPES,
    BAD_BIAS_TYPE,
    BAD_COUNT,
    BAD_WORKSPACE,
    BAD_OBJECT,
    BAD_BGRAD_TRANS /* BGRADA with op(A) = T, BGRADB with op(B) = N */
};

typedef struct tcase {
    const char *name;
    int ta, tb, m, n, k, pad;
    int32_t in_type, out_type;
    float alpha, beta;
    int c_is_d;        /* C and D one matrix, as linear_gpu.c accumulates */
    uint32_t epilogue; /* 0: none set (the default) */
    int legacy;        /* through cublasGemmEx instead of cuBLASLt */
    int bad;           /* BAD_*: the mistake, want / says: what it must give */
    cublasStatus_t want;
    const char *says;
} tcase;

typedef struct ep_use {
    int bias_in, bias_out, aux_out, aux_in, gelu, bgrad_b;
} ep_use;

static ep_use uses(uint32_t ep)
{
    ep_use u = {0, 0, 0, 0, 0, 0};
    u.bias_in = ep == CUBLASLT_EPILOGUE_BIAS || ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                ep == CUBLASLT_EPILOGUE_GELU_BIAS;
    u.bias_out = ep == CUBLASLT_EPILOGUE_DGELU_BGRAD || ep == CUBLASLT_EPILOGUE_BGRADA ||
                 ep == CUBLASLT_EPILOGUE_BGRADB;
    u.aux_out = ep == CUBLASLT_EPILOGUE_GELU_AUX || ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    u.aux_in = ep == CUBLASLT_EPILOGUE_DGELU || ep == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    u.gelu = u.aux_out || ep == CUBLASLT_EPILOGUE_GELU_BIAS;
    u.bgrad_b = ep == CUBLASLT_EPILOGUE_BGRADB;
    return u;
}

#define LT(call)                                                                                   \
    do {                                                                                           \
        if (st == CUBLAS_STATUS_SUCCESS) {                                                         \
            st = (call);                                                                           \
        }                                                                                          \
    } while (0)

static uint32_t alignment_of(const void *p)
{
    uint32_t al = 1;
    while (al < 256 && ((uintptr_t)p & (2 * (uintptr_t)al - 1)) == 0) {
        al *= 2;
    }
    return al;
}

typedef struct operands {
    const void *A, *B, *C;
    void *D, *bias, *aux, *workspace;
    int64_t lda, ldb, ldc, ldd, aux_ld;
    size_t workspace_nbytes;
} operands;

/* The cuBLASLt calls of lt_gpu.c's lt_run, with c's mistake made; the first failure. */
static cublasStatus_t lt_product(const tcase *c, const operands *o)
{
    ep_use u = uses(c->epilogue);
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = c->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = c->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int a_rows = c->ta ? c->k : c->m, a_cols = c->ta ? c->m : c->k;
    int b_rows = c->tb ? c->n : c->k, b_cols = c->tb ? c->k : c->n;
    cublasStatus_t st = cublasLtCreate(&lt);
    LT(cublasLtMatmulDescCreate(
        &op, c->bad == BAD_COMPUTE ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (c->bad == BAD_ATTR_SIZE) {
        int64_t wide = ta;
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide));
    }
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (c->bad == BAD_ATTR) {
        int32_t v = 0;
        LT(cublasLtMatmulDescSetAttribute(op, (cublasLtMatmulDescAttributes_t)999, &v, sizeof v));
    }
    uint32_t ep = c->bad == BAD_RELU ? CUBLASLT_EPILOGUE_RELU : c->epilogue;
    if (ep != 0) {
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    }
    if ((u.bias_in || u.bias_out) && c->bad != BAD_NO_BIAS) {
        int32_t bias_type = c->bad == BAD_BIAS_TYPE ? CUDA_R_16BF : c->out_type;
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o->bias,
                                          sizeof o->bias));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                          sizeof bias_type));
    }
    if (u.aux_in || u.aux_out) {
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &o->aux,
                                          sizeof o->aux));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &o->aux_ld,
                                          sizeof o->aux_ld));
    }
    int32_t b_type =
        c->bad == BAD_TYPES ? (c->in_type == CUDA_R_32F ? CUDA_R_16BF : CUDA_R_32F) : c->in_type;
    LT(cublasLtMatrixLayoutCreate(&la, c->in_type, (uint64_t)a_rows + (c->bad == BAD_DIMS),
                                  (uint64_t)a_cols, o->lda));
    LT(cublasLtMatrixLayoutCreate(&lb, b_type, (uint64_t)b_rows, (uint64_t)b_cols, o->ldb));
    LT(cublasLtMatrixLayoutCreate(&lc, c->out_type, (uint64_t)c->m, (uint64_t)c->n, o->ldc));
    LT(cublasLtMatrixLayoutCreate(&ld, c->out_type, (uint64_t)c->m, (uint64_t)c->n, o->ldd));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = o->workspace_nbytes;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
    const void *ptrs[4] = {o->A, o->B, o->C, o->D};
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t al = alignment_of(ptrs[i]);
        if (!(c->bad == BAD_ALIGN && i == 3)) { /* D: the default, 256 */
            LT(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al));
        }
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (c->bad == BAD_OBJECT) { /* a layout where the descriptor belongs */
        LT(cublasLtMatmulAlgoGetHeuristic(lt, (cublasLtMatmulDesc_t)la, la, lb, lc, ld, pref, 1,
                                          &res, &found));
    }
    LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, ld, pref, c->bad == BAD_COUNT ? 0 : 1,
                                      &res, &found));
    CHECK(st != CUBLAS_STATUS_SUCCESS || (found == 1 && res.state == CUBLAS_STATUS_SUCCESS),
          "%s: the heuristic found %d algorithms", c->name, found);
    void *D = c->bad == BAD_ALIGN ? (char *)o->D + elem_nbytes(c->out_type) : o->D;
    LT(cublasLtMatmul(lt, op, &c->alpha, c->bad == BAD_NULL_A ? NULL : o->A, la, o->B, lb, &c->beta,
                      o->C, lc, D, ld, &res.algo, o->workspace, o->workspace_nbytes,
                      (cudaStream_t)0));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    return st;
}

static cublasStatus_t legacy_product(const tcase *c, const operands *o)
{
    cublasHandle_t h = NULL;
    cublasStatus_t st = cublasCreate(&h);
    LT(cublasSetStream(h, (cudaStream_t)0));
    LT(cublasGemmEx(h, c->ta ? CUBLAS_OP_T : CUBLAS_OP_N, c->tb ? CUBLAS_OP_T : CUBLAS_OP_N, c->m,
                    c->n, c->k, &c->alpha, o->A, c->in_type, (int)o->lda, o->B, c->in_type,
                    (int)o->ldb, &c->beta, o->D, c->out_type, (int)o->ldd, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
    cublasDestroy(h);
    return st;
}

/* Runs c against the reference (or, for a mistake, checks its refusal). */
static void run_case(const tcase *c)
{
    ep_use u = uses(c->epilogue);
    int exact = c->in_type != CUDA_R_32F || c->out_type != CUDA_R_32F || u.aux_in;
    int m = c->m, n = c->n, k = c->k;
    int a_rows = c->ta ? k : m, a_cols = c->ta ? m : k, b_rows = c->tb ? n : k,
        b_cols = c->tb ? k : n;
    operands o = {0};
    o.lda = a_rows + c->pad;
    o.ldb = c->bad == BAD_LD ? b_rows - 1 : b_rows + c->pad;
    o.ldd = m + c->pad;
    o.ldc = c->c_is_d ? o.ldd : m + c->pad + 1;
    o.aux_ld = (m + 7) / 8 * 8 + (c->pad ? 8 : 0) + (c->bad == BAD_AUX_LD);
    size_t na = (size_t)(o.lda * a_cols), nb = (size_t)(o.ldb * b_cols), nc = (size_t)(o.ldc * n),
           nd = (size_t)(o.ldd * n), naux = (size_t)(o.aux_ld * n), nbias = (size_t)(m > n ? m : n);
    double *A = malloc((na + 1) * 8), *B = malloc((nb + 1) * 8), *C = malloc((nc + 1) * 8),
           *D0 = malloc((nd + 1) * 8), *D = malloc((nd + 1) * 8), *bias = malloc((nbias + 1) * 8),
           *aux = malloc((naux + 1) * 8), *bias_got = malloc((nbias + 1) * 8),
           *aux_got = malloc((naux + 1) * 8);
    for (size_t i = 0; i < na; i++) {
        A[i] = next_value(exact);
    }
    for (size_t i = 0; i < nb; i++) {
        B[i] = next_value(exact);
    }
    for (size_t i = 0; i < nc; i++) {
        C[i] = next_value(exact);
    }
    for (size_t i = 0; i < nd; i++) {
        D0[i] = c->c_is_d ? C[i] : next_value(exact);
    }
    for (size_t i = 0; i < nbias; i++) {
        bias[i] = next_value(exact);
    }
    for (size_t i = 0; i < naux; i++) {
        aux[i] = 3.0 * next_value(1); /* GELU inputs over [-3, 3] */
    }
    size_t slack = 64;
    o.A = upload(A, na, c->in_type, slack);
    if (c->bad == BAD_PINNED_A) {
        void *p = NULL;
        cudaMallocHost(&p, na * elem_nbytes(c->in_type));
        o.A = p;
    }
    o.B = upload(B, nb, c->in_type, slack);
    if (c->bad == BAD_HOST_B) {
        o.B = malloc(nb * elem_nbytes(c->in_type));
    }
    o.D = upload(D0, nd, c->out_type, c->bad == BAD_SHORT_D ? 0 : slack);
    if (c->bad == BAD_SHORT_D) { /* one element less than D's span */
        cudaFree(o.D);
        o.D = upload(D0, nd - (size_t)c->pad - 1, c->out_type, 0);
        nd -= (size_t)c->pad + 1;
    }
    o.C = c->c_is_d ? o.D : upload(C, nc, c->out_type, slack);
    o.bias = upload(bias, nbias, c->out_type, slack);
    o.aux = upload(aux, naux, c->out_type, slack);
    o.workspace_nbytes = 1 << 20;
    o.workspace =
        c->bad == BAD_WORKSPACE ? malloc(o.workspace_nbytes) : dev_alloc(o.workspace_nbytes);

    capture_begin();
    cublasStatus_t st = c->legacy ? legacy_product(c, &o) : lt_product(c, &o);
    capture_end();
    download(D, o.D, nd, c->out_type);
    download(bias_got, o.bias, nbias, c->out_type);
    download(aux_got, o.aux, naux, c->out_type);

    if (c->bad != BAD_NONE) {
        CHECK(st == c->want, "%s: status %s, expected %s", c->name, cublasGetStatusName(st),
              cublasGetStatusName(c->want));
        CHECK(strstr(g_err, "cuemu: cublas") != NULL && strstr(g_err, c->says) != NULL,
              "%s: stderr should name the mistake (\"%s\"), said: %s", c->name, c->says, g_err);
        int same = 1;
        for (size_t i = 0; i < nd; i++) {
            same &= D[i] == D0[i] || (isnan(D[i]) && isnan(D0[i]));
        }
        CHECK(same, "%s: D was written by a refused product", c->name);
    } else {
        CHECK(st == CUBLAS_STATUS_SUCCESS, "%s: %s; stderr: %s", c->name, cublasGetStatusString(st),
              g_err);
        CHECK(g_err[0] == '\0', "%s: a valid product printed: %s", c->name, g_err);
    }
    if (c->bad == BAD_NONE && st == CUBLAS_STATUS_SUCCESS) {
        double *bgrad = calloc(nbias + 1, 8), *bgrad_tol = calloc(nbias + 1, 8);
        int bad_d = 0, bad_aux = 0, bad_pad = 0;
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) {
                double s = 0, sabs = 0;
                for (int p = 0; p < k; p++) {
                    double a = c->ta ? A[i * o.lda + p] : A[p * o.lda + i];
                    double b = c->tb ? B[p * o.ldb + j] : B[j * o.ldb + p];
                    s += a * b;
                    sabs += fabs(a * b);
                    if (c->epilogue == CUBLASLT_EPILOGUE_BGRADA && j == 0) {
                        bgrad[i] += a;
                        bgrad_tol[i] += fabs(a) * ldexp(1, -22);
                    }
                    if (c->epilogue == CUBLASLT_EPILOGUE_BGRADB && i == 0) {
                        bgrad[j] += b;
                        bgrad_tol[j] += fabs(b) * ldexp(1, -22);
                    }
                }
                /* fp32 accumulation: at most k roundings of partial sums bounded by sabs. */
                double err = (k + 2) * ldexp(1, -24) * (fabs(c->alpha) * sabs + 1e-30);
                double v = c->alpha * s + (c->beta != 0 ? c->beta * C[j * o.ldc + i] : 0);
                if (u.bias_in) {
                    v += bias[i];
                }
                if (u.aux_out) {
                    double got = aux_got[j * o.aux_ld + i];
                    bad_aux += !(fabs(got - v) <= tolerance(v, c->out_type, err));
                }
                /* GELU and its derivative in fp32: terms of order 1 cancel (1 + tanh for
                 * negative inputs), so their error is absolute, relative to the input. */
                if (u.gelu) {
                    err = err * 1.2 + fabs(v) * ldexp(1, -21); /* |gelu'| < 1.13 */
                    v = gelu_ref(v);
                }
                if (u.aux_in) {
                    double g = gelu_grad_ref(aux[j * o.aux_ld + i]);
                    err = err * fabs(g) + fabs(v) * ldexp(1, -21);
                    v *= g;
                }
                if (c->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
                    bgrad[i] += v;
                    bgrad_tol[i] += err + fabs(v) * ldexp(1, -20);
                }
                double got = D[j * o.ldd + i];
                if (!(fabs(got - v) <= tolerance(v, c->out_type, err))) {
                    if (bad_d++ < 3) {
                        fprintf(stderr, "%s: D(%d, %d) = %.9g, expected %.9g\n", c->name, i, j, got,
                                v);
                    }
                }
            }
            for (int i = m; i < o.ldd; i++) { /* rows past m within the leading dimension */
                bad_pad += D[j * o.ldd + i] != D0[j * o.ldd + i];
            }
        }
        CHECK(bad_d == 0, "%s: %d elements of D are wrong", c->name, bad_d);
        CHECK(bad_aux == 0, "%s: %d elements of the GELU input (aux) are wrong", c->name, bad_aux);
        CHECK(bad_pad == 0, "%s: %d padding elements of D were written", c->name, bad_pad);
        for (int i = 0; u.bias_out && i < (u.bgrad_b ? n : m); i++) {
            CHECK(fabs(bias_got[i] - bgrad[i]) <= tolerance(bgrad[i], c->out_type, bgrad_tol[i]),
                  "%s: bias gradient %d = %.9g, expected %.9g", c->name, i, bias_got[i], bgrad[i]);
        }
        free(bgrad_tol);
        free(bgrad);
    }
    if (c->bad == BAD_HOST_B) {
        free((void *)o.B);
    } else {
        cudaFree((void *)o.B);
    }
    if (c->bad == BAD_WORKSPACE) {
        free(o.workspace);
    } else {
        cudaFree(o.workspace);
    }
    if (!c->c_is_d) {
        cudaFree((void *)o.C);
    }
    if (c->bad == BAD_PINNED_A) {
        cudaFreeHost((void *)o.A);
    } else {
        cudaFree((void *)o.A);
    }
    cudaFree(o.D);
    cudaFree(o.bias);
    cudaFree(o.aux);
    free(A);
    free(B);
    free(C);
    free(D0);
    free(D);
    free(bias);
    free(aux);
    free(bias_got);
    free(aux_got);
}

/* ---- the cases ---- */

static void test_products(void)
{
    static const int32_t in_types[3] = {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F};
    char names[64][96];
    int count = 0;
    for (int t = 0; t < 3; t++) {
        for (int tr = 0; tr < 4; tr++) {
            for (int beta = 0; beta < 2; beta++) {
                int32_t out = t == 0 || beta == 0 ? CUDA_R_32F : in_types[t];
                tcase c = {names[count],
                           tr & 1,
                           tr >> 1,
                           5,
                           7,
                           9,
                           tr == 3 ? 0 : 3,
                           in_types[t],
                           out,
                           beta ? 0.75f : 1.0f,
                           beta ? 0.5f : 0.0f,
                           beta && (tr & 1),
                           0,
                           0,
                           BAD_NONE,
                           CUBLAS_STATUS_SUCCESS,
                           NULL};
                snprintf(names[count], sizeof names[count],
                         "plain ta=%d tb=%d in=%d out=%d beta=%g", c.ta, c.tb, (int)c.in_type,
                         (int)c.out_type, c.beta);
                run_case(&c);
                count++;
            }
        }
    }
    /* The epilogues accel uses (lt_gpu.c), and the bias-gradient ones of the contract. */
    static const struct {
        uint32_t ep;
        const char *name;
    } eps[] = {{CUBLASLT_EPILOGUE_BIAS, "BIAS"},
               {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX"},
               {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS"},
               {CUBLASLT_EPILOGUE_DGELU, "DGELU"},
               {CUBLASLT_EPILOGUE_DGELU_BGRAD, "DGELU_BGRAD"},
               {CUBLASLT_EPILOGUE_BGRADA, "BGRADA"},
               {CUBLASLT_EPILOGUE_BGRADB, "BGRADB"}};
    for (size_t e = 0; e < sizeof eps / sizeof eps[0]; e++) {
        for (int t = 0; t < 3; t++) {
            for (int tr = 0; tr < 4; tr++) {
                /* BGRADA only with op(A) = N, BGRADB only with op(B) = T (the others are
                 * refused: test_mistakes). */
                if ((eps[e].ep == CUBLASLT_EPILOGUE_BGRADA && (tr & 1)) ||
                    (eps[e].ep == CUBLASLT_EPILOGUE_BGRADB && !(tr >> 1))) {
                    continue;
                }
                tcase c = {names[0],
                           tr & 1,
                           tr >> 1,
                           13,
                           6,
                           11,
                           tr & 1 ? 2 : 0,
                           in_types[t],
                           t == 2 && tr == 3 ? CUDA_R_16F : CUDA_R_32F,
                           1.0f,
                           0.0f,
                           0,
                           eps[e].ep,
                           0,
                           BAD_NONE,
                           CUBLAS_STATUS_SUCCESS,
                           NULL};
                snprintf(names[0], sizeof names[0], "%s ta=%d tb=%d in=%d out=%d", eps[e].name,
                         c.ta, c.tb, (int)c.in_type, (int)c.out_type);
                run_case(&c);
            }
        }
    }
    /* bench/cuda_step.cu: bf16 inputs, bf16 output (beta 0) or fp32 accumulated (beta 1). */
    for (int tr = 0; tr < 4; tr++) {
        for (int f32 = 0; f32 < 2; f32++) {
            tcase c = {names[0],
                       tr & 1,
                       tr >> 1,
                       6,
                       4,
                       10,
                       0,
                       CUDA_R_16BF,
                       f32 ? CUDA_R_32F : CUDA_R_16BF,
                       1.0f,
                       f32 ? 1.0f : 0.0f,
                       1,
                       0,
                       1,
                       BAD_NONE,
                       CUBLAS_STATUS_SUCCESS,
                       NULL};
            snprintf(names[0], sizeof names[0], "cublasGemmEx ta=%d tb=%d C=%s", c.ta, c.tb,
                     f32 ? "f32" : "bf16");
            run_case(&c);
        }
    }
}

static void test_mistakes(void)
{
    static const struct {
        int bad;
        uint32_t ep;
        cublasStatus_t want;
        const char *says;
    } cases[] = {
        {BAD_DIMS, 0, CUBLAS_STATUS_INVALID_VALUE, "dimensions do not match"},
        {BAD_LD, 0, CUBLAS_STATUS_INVALID_VALUE, "B's leading dimension"},
        {BAD_NULL_A, 0, CUBLAS_STATUS_INVALID_VALUE, "A is NULL"},
        {BAD_HOST_B, 0, CUBLAS_STATUS_INVALID_VALUE, "B ("},
        {BAD_PINNED_A, 0, CUBLAS_STATUS_INVALID_VALUE, "pinned host memory"},
        {BAD_SHORT_D, 0, CUBLAS_STATUS_INVALID_VALUE, "D ("},
        {BAD_NO_BIAS, CUBLASLT_EPILOGUE_BIAS, CUBLAS_STATUS_INVALID_VALUE, "is not set"},
        {BAD_NO_BIAS, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLAS_STATUS_INVALID_VALUE, "bias gradient"},
        {BAD_AUX_LD, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLAS_STATUS_INVALID_VALUE, "multiple of 8"},
        {BAD_RELU, 0, CUBLAS_STATUS_NOT_SUPPORTED, "not emulated"},
        {BAD_COMPUTE, 0, CUBLAS_STATUS_NOT_SUPPORTED, "compute type"},
        {BAD_ALIGN, 0, CUBLAS_STATUS_INVALID_VALUE, "the algorithm was chosen for 256-byte"},
        {BAD_ATTR, 0, CUBLAS_STATUS_INVALID_VALUE, "unknown attribute 999"},
        {BAD_ATTR_SIZE, 0, CUBLAS_STATUS_INVALID_VALUE, "TRANSA takes 4 bytes"},
        {BAD_TYPES, 0, CUBLAS_STATUS_NOT_SUPPORTED, "A type"},
        {BAD_BIAS_TYPE, CUBLASLT_EPILOGUE_BIAS, CUBLAS_STATUS_INVALID_VALUE, "bias data type"},
        {BAD_COUNT, 0, CUBLAS_STATUS_INVALID_VALUE, "requested 0"},
        {BAD_WORKSPACE, 0, CUBLAS_STATUS_INVALID_VALUE, "workspace"},
        {BAD_OBJECT, 0, CUBLAS_STATUS_INVALID_VALUE, "not a live one"},
        {BAD_NO_BIAS, CUBLASLT_EPILOGUE_BGRADB, CUBLAS_STATUS_INVALID_VALUE, "bias gradient"},
        {BAD_BIAS_TYPE, CUBLASLT_EPILOGUE_BGRADA, CUBLAS_STATUS_INVALID_VALUE, "bias data type"},
        {BAD_BGRAD_TRANS, CUBLASLT_EPILOGUE_BGRADA, CUBLAS_STATUS_NOT_SUPPORTED,
         "BGRADA with op(A) = T"},
        {BAD_BGRAD_TRANS, CUBLASLT_EPILOGUE_BGRADB, CUBLAS_STATUS_NOT_SUPPORTED,
         "BGRADB with op(B) = N"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "mistake %zu (\"%s\")", i, cases[i].says);
        /* ta 0, tb 1 but where the mistake is a transpose the epilogue refuses. */
        int bad_trans = cases[i].bad == BAD_BGRAD_TRANS;
        tcase c = {name,
                   bad_trans && cases[i].ep == CUBLASLT_EPILOGUE_BGRADA,
                   !(bad_trans && cases[i].ep == CUBLASLT_EPILOGUE_BGRADB),
                   5,
                   4,
                   3,
                   1,
                   CUDA_R_32F,
                   CUDA_R_32F,
                   1.0f,
                   0.0f,
                   0,
                   cases[i].ep,
                   0,
                   cases[i].bad,
                   cases[i].want,
                   cases[i].says};
        run_case(&c);
    }
}

static void test_misc(void)
{
    CHECK(strstr(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "NOT_SUPPORTED") != NULL &&
              strstr(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE), "INVALID_VALUE") != NULL,
          "status strings should name the status");
    CHECK(cublasLtDestroy(NULL) == CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy(NULL)");
    /* Attributes read back as set; size 0 asks for the size. */
    cublasLtMatmulDesc_t op = NULL;
    uint32_t ep = CUBLASLT_EPILOGUE_DGELU_BGRAD, got = 0;
    size_t nbytes = 0;
    CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, NULL, 0, &nbytes) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &got, sizeof got,
                                             NULL) == CUBLAS_STATUS_SUCCESS,
          "descriptor attributes");
    CHECK(nbytes == sizeof ep && got == ep, "epilogue read back as %u (%zu bytes)", (unsigned)got,
          nbytes);
    cublasLtMatmulDescDestroy(op);
}

int main(void)
{
    test_misc();
    test_products();
    test_mistakes();
    if (g_failures > 0) {
        fprintf(stderr, "test_cublas: %d failures\n", g_failures);
        return 1;
    }
    printf("test_cublas: ok\n");
    return 0;
}
