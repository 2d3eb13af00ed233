/*
 * cuBLAS and cuBLASLt of the emulator build (cuemu.h): the functions of cublasLt.h and
 * cublas_api.h that accel calls (src/nn/cuda, bench/cuda_step.cu), with the real headers'
 * signatures. This file owns handles, descriptors and their attributes, the one-algorithm
 * heuristic, and the translation of a call into one cuemu_gemm, which cublas_matmul.c checks
 * against NVIDIA's documented contract and computes.
 *
 * Attributes take exactly the size the documentation gives (else INVALID_VALUE, as the real
 * library); known attributes accel never sets are refused with NOT_SUPPORTED and a message
 * naming them, so a new use shows up here instead of being silently ignored. Streams are
 * stored and ignored: every product runs synchronously when issued (cuemu.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "cublas_impl.h"
#include "cuemu.h"

enum {
    LT_HANDLE = 0x4C54484Eu,
    BLAS_HANDLE = 0x424C4153u,
    DESC = 0x44455343u,
    LAYOUT = 0x4C41594Fu,
    PREF = 0x50524546u,
    ALGO = 0x414C474Fu
};

struct cublasLtContext {
    uint32_t magic;
};

struct cublasContext {
    uint32_t magic;
    cudaStream_t stream; /* stored, ignored */
};

typedef struct lt_desc {
    uint32_t magic;
    int32_t compute_type, scale_type, pointer_mode, transa, transb;
    uint32_t epilogue;
    const void *bias;
    void *aux;
    int64_t aux_ld;
    int32_t aux_type, bias_type;
} lt_desc;

typedef struct lt_layout {
    uint32_t magic;
    uint32_t type;
    uint64_t rows, cols;
    int64_t ld;
} lt_layout;

typedef struct lt_pref {
    uint32_t magic;
    uint32_t search_mode;
    uint64_t max_workspace_nbytes;
    uint32_t min_align[4]; /* A, B, C, D */
} lt_pref;

/* ---- attributes: one table per descriptor kind ---- */

typedef struct attr_info {
    int id;
    const char *name;
    size_t offset, nbytes; /* nbytes 0: known, not emulated */
} attr_info;

#define ATTR(id, type, field)                                                                      \
    {                                                                                              \
        id, #id, offsetof(type, field), sizeof(((type *)0)->field)                                 \
    }
#define NOT_EMULATED(id)                                                                           \
    {                                                                                              \
        id, #id, 0, 0                                                                              \
    }

static const attr_info desc_attrs[] = {
    ATTR(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, lt_desc, compute_type),
    ATTR(CUBLASLT_MATMUL_DESC_SCALE_TYPE, lt_desc, scale_type),
    ATTR(CUBLASLT_MATMUL_DESC_POINTER_MODE, lt_desc, pointer_mode),
    ATTR(CUBLASLT_MATMUL_DESC_TRANSA, lt_desc, transa),
    ATTR(CUBLASLT_MATMUL_DESC_TRANSB, lt_desc, transb),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE, lt_desc, epilogue),
    ATTR(CUBLASLT_MATMUL_DESC_BIAS_POINTER, lt_desc, bias),
    ATTR(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, lt_desc, bias_type),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, lt_desc, aux),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, lt_desc, aux_ld),
    ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, lt_desc, aux_type),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_TRANSC),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_FILL_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_FAST_ACCUM),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_B_SCALE_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_C_SCALE_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_D_SCALE_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE),
    NOT_EMULATED(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR),
};

static const attr_info pref_attrs[] = {
    ATTR(CUBLASLT_MATMUL_PREF_SEARCH_MODE, lt_pref, search_mode),
    ATTR(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, lt_pref, max_workspace_nbytes),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, lt_pref, min_align[0]),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, lt_pref, min_align[1]),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, lt_pref, min_align[2]),
    ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, lt_pref, min_align[3]),
    NOT_EMULATED(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK),
    NOT_EMULATED(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT),
    NOT_EMULATED(CUBLASLT_MATMUL_PREF_IMPL_MASK),
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The entry of attribute id in tab, or NULL after the message and status the real library
 * would give (INVALID_VALUE for an unknown attribute) or ours (NOT_SUPPORTED for one we do
 * not emulate). */
static const attr_info *find_attr(const char *fn, const attr_info *tab, size_t n, int id,
                                  cublasStatus_t *st)
{
    for (size_t i = 0; i < n; i++) {
        if (tab[i].id != id) {
            continue;
        }
        if (tab[i].nbytes == 0) {
            *st = cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                                  "%s is not emulated: accel does not set it", tab[i].name);
            return NULL;
        }
        return &tab[i];
    }
    *st = cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute %d", id);
    return NULL;
}

static cublasStatus_t set_attr(const char *fn, void *obj, const attr_info *tab, size_t n, int id,
                               const void *buf, size_t nbytes)
{
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const attr_info *a = find_attr(fn, tab, n, id, &st);
    if (a == NULL) {
        return st;
    }
    if (buf == NULL || nbytes != a->nbytes) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                               "%s takes %zu bytes, was given %zu at %p", a->name, a->nbytes,
                               nbytes, buf);
    }
    memcpy((char *)obj + a->offset, buf, nbytes);
    return CUBLAS_STATUS_SUCCESS;
}

/* The documented GetAttribute contract: sizeInBytes 0 asks for the size. */
static cublasStatus_t get_attr(const char *fn, const void *obj, const attr_info *tab, size_t n,
                               int id, void *buf, size_t nbytes, size_t *written)
{
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const attr_info *a = find_attr(fn, tab, n, id, &st);
    if (a == NULL) {
        return st;
    }
    if (nbytes == 0 && written != NULL) {
        *written = a->nbytes;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == NULL || nbytes != a->nbytes) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                               "%s is %zu bytes, a buffer of %zu at %p was given", a->name,
                               a->nbytes, nbytes, buf);
    }
    memcpy(buf, (const char *)obj + a->offset, nbytes);
    if (written != NULL) {
        *written = nbytes;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* obj is a live object of the kind magic says (handles and descriptors are often confused:
 * they are all pointers). */
static int live(const void *obj, uint32_t magic)
{
    return obj != NULL && *(const uint32_t *)obj == magic;
}

static cublasStatus_t bad_object(const char *fn, const char *what, const void *obj)
{
    return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%s %p is %s", what, obj,
                           obj == NULL ? "NULL" : "not a live one (destroyed, or another kind)");
}

/* A copy of init in *obj (NULL on failure); no_out: the caller's out-pointer is NULL. */
static cublasStatus_t new_object(const char *fn, int no_out, const void *init, size_t nbytes,
                                 void **obj)
{
    *obj = NULL;
    if (no_out) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the out-pointer is NULL");
    }
    if ((*obj = malloc(nbytes)) == NULL) {
        return cuemu_blas_fail(CUBLAS_STATUS_ALLOC_FAILED, fn, "no host memory");
    }
    memcpy(*obj, init, nbytes);
    return CUBLAS_STATUS_SUCCESS;
}

/* Creates *out as a copy of init (out's object type). */
#define NEW_OBJECT(fn, out, init)                                                                  \
    do {                                                                                           \
        void *obj_;                                                                                \
        cublasStatus_t st_ = new_object(fn, (out) == NULL, &(init), sizeof(init), &obj_);          \
        if (st_ == CUBLAS_STATUS_SUCCESS) {                                                        \
            *(out) = obj_;                                                                         \
        }                                                                                          \
        return st_;                                                                                \
    } while (0)

static cublasStatus_t free_object(const char *fn, const char *what, void *obj, uint32_t magic)
{
    if (obj == NULL) {
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!live(obj, magic)) {
        return bad_object(fn, what, obj);
    }
    *(uint32_t *)obj = 0;
    free(obj);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- handles ---- */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    struct cublasLtContext init = {LT_HANDLE};
    NEW_OBJECT("cublasLtCreate", handle, init);
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    if (handle == NULL) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return free_object("cublasLtDestroy", "handle", handle, LT_HANDLE);
}

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    struct cublasContext init = {BLAS_HANDLE, NULL};
    NEW_OBJECT("cublasCreate", handle, init);
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (handle == NULL) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return free_object("cublasDestroy", "handle", handle, BLAS_HANDLE);
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!live(handle, BLAS_HANDLE)) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- descriptors ---- */

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    lt_desc init = {.magic = DESC,
                    .compute_type = (int32_t)compute,
                    .scale_type = (int32_t)scale,
                    .pointer_mode = CUBLASLT_POINTER_MODE_HOST,
                    .transa = CUBLAS_OP_N,
                    .transb = CUBLAS_OP_N,
                    .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                    .aux_type = -1, /* the documented default: D's type */
                    .bias_type = -1};
    NEW_OBJECT("cublasLtMatmulDescCreate", desc, init);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    return free_object("cublasLtMatmulDescDestroy", "descriptor", desc, DESC);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t nbytes)
{
    static const char fn[] = "cublasLtMatmulDescSetAttribute";
    if (!live(desc, DESC)) {
        return bad_object(fn, "descriptor", desc);
    }
    if ((attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) &&
        buf != NULL && nbytes == sizeof(int32_t)) {
        int32_t op;
        memcpy(&op, buf, sizeof op);
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                                   "transpose %d is not CUBLAS_OP_N, _T or _C", (int)op);
        }
    }
    return set_attr(fn, desc, desc_attrs, COUNT(desc_attrs), attr, buf, nbytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t nbytes, size_t *written)
{
    static const char fn[] = "cublasLtMatmulDescGetAttribute";
    if (!live(desc, DESC)) {
        return bad_object(fn, "descriptor", desc);
    }
    return get_attr(fn, desc, desc_attrs, COUNT(desc_attrs), attr, buf, nbytes, written);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    lt_layout init = {LAYOUT, (uint32_t)type, rows, cols, ld};
    NEW_OBJECT("cublasLtMatrixLayoutCreate", layout, init);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    return free_object("cublasLtMatrixLayoutDestroy", "layout", layout, LAYOUT);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    /* Documented defaults: no workspace, 256-byte alignment of every matrix. */
    lt_pref init = {PREF, CUBLASLT_SEARCH_BEST_FIT, 0, {256, 256, 256, 256}};
    NEW_OBJECT("cublasLtMatmulPreferenceCreate", pref, init);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    return free_object("cublasLtMatmulPreferenceDestroy", "preference", pref, PREF);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t nbytes)
{
    static const char fn[] = "cublasLtMatmulPreferenceSetAttribute";
    if (!live(pref, PREF)) {
        return bad_object(fn, "preference", pref);
    }
    return set_attr(fn, pref, pref_attrs, COUNT(pref_attrs), attr, buf, nbytes);
}

/* ---- cublasLt products ---- */

/* One layout's fields in g (column-major, one matrix: accel sets no layout attribute, so the
 * emulation has no setter for the order or batch count). */
static cublasStatus_t take_layout(const char *fn, const char *which, cublasLtMatrixLayout_t l,
                                  int32_t *type, uint64_t *rows, uint64_t *cols, int64_t *ld)
{
    if (!live(l, LAYOUT)) {
        char what[32];
        snprintf(what, sizeof what, "%s's layout", which);
        return bad_object(fn, what, l);
    }
    const lt_layout *x = (const lt_layout *)l;
    *type = (int32_t)x->type;
    *rows = x->rows;
    *cols = x->cols;
    *ld = x->ld;
    return CUBLAS_STATUS_SUCCESS;
}

/* g from a descriptor and four layouts; pointers and alpha / beta are the caller's. */
static cublasStatus_t lt_gemm(const char *fn, cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cuemu_gemm *g)
{
    if (!live(handle, LT_HANDLE)) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle %p is not live",
                               (void *)handle);
    }
    if (!live(desc, DESC)) {
        return bad_object(fn, "matmul descriptor", desc);
    }
    const lt_desc *x = (const lt_desc *)desc;
    memset(g, 0, sizeof *g);
    g->fn = fn;
    g->compute_type = x->compute_type;
    g->scale_type = x->scale_type;
    g->pointer_mode = x->pointer_mode;
    g->ta = x->transa != CUBLAS_OP_N;
    g->tb = x->transb != CUBLAS_OP_N;
    g->epilogue = x->epilogue;
    g->bias = (void *)(uintptr_t)x->bias;
    g->bias_type = x->bias_type;
    g->aux = x->aux;
    g->aux_ld = x->aux_ld;
    g->aux_type = x->aux_type;
    cublasStatus_t st = take_layout(fn, "A", a, &g->a_type, &g->a_rows, &g->a_cols, &g->lda);
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = take_layout(fn, "B", b, &g->b_type, &g->b_rows, &g->b_cols, &g->ldb);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = take_layout(fn, "C", c, &g->c_type, &g->c_rows, &g->c_cols, &g->ldc);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = take_layout(fn, "D", d, &g->d_type, &g->d_rows, &g->d_cols, &g->ldd);
    }
    return st;
}

/* The algorithm's record (cublasLtMatmulAlgo_t is "semi-opaque": ours to fill): the
 * alignments the heuristic was told A, B, C and D have, and the alignment of the bias and aux
 * pointers it saw ("Routines that don't dereference this pointer, like
 * cublasLtMatmulAlgoGetHeuristic() depend on its value to determine expected pointer
 * alignment"). An algorithm relies on them; a product whose pointers are less aligned would
 * fault or be wrong on a GPU, so cublasLtMatmul refuses it. */
enum {
    ALGO_MAGIC,
    ALGO_ALIGN_A,
    ALGO_ALIGN_B,
    ALGO_ALIGN_C,
    ALGO_ALIGN_D,
    ALGO_ALIGN_BIAS,
    ALGO_ALIGN_AUX
};

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned)
{
    static const char fn[] = "cublasLtMatmulAlgoGetHeuristic";
    if (requested <= 0 || results == NULL || returned == NULL) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                               "requested %d results into %p, count to %p", requested,
                               (void *)results, (void *)returned);
    }
    *returned = 0;
    if (pref != NULL && !live(pref, PREF)) {
        return bad_object(fn, "preference", pref);
    }
    cuemu_gemm g;
    cublasStatus_t st = lt_gemm(fn, handle, desc, a, b, c, d, &g);
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cuemu_gemm_check(&g, 0);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    static const lt_pref defaults = {PREF, CUBLASLT_SEARCH_BEST_FIT, 0, {256, 256, 256, 256}};
    const lt_pref *p = pref != NULL ? (const lt_pref *)pref : &defaults;
    if (p->search_mode != CUBLASLT_SEARCH_BEST_FIT) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                               "search mode %u: only CUBLASLT_SEARCH_BEST_FIT is emulated",
                               (unsigned)p->search_mode);
    }
    /* One algorithm, which needs no workspace: it fits any CUBLASLT_MATMUL_PREF_MAX_
     * WORKSPACE_BYTES. */
    memset(&results[0], 0, sizeof results[0]);
    uint64_t *rec = results[0].algo.data;
    rec[ALGO_MAGIC] = ALGO;
    for (int i = 0; i < 4; i++) {
        rec[ALGO_ALIGN_A + i] = p->min_align[i];
    }
    rec[ALGO_ALIGN_BIAS] = cuemu_alignment(g.bias);
    rec[ALGO_ALIGN_AUX] = cuemu_alignment(g.aux);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* p (when the product reads or writes it) is at least as aligned as the algorithm assumed. */
static cublasStatus_t check_aligned(const char *fn, const char *which, const void *p,
                                    uint64_t assumed, int used)
{
    if (used && p != NULL && cuemu_alignment(p) < assumed) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                               "%s (%p) is %u-byte aligned, but the algorithm was chosen for "
                               "%llu-byte alignment (the preference's MIN_ALIGNMENT, or the "
                               "pointer the heuristic saw in the descriptor)",
                               which, p, cuemu_alignment(p), (unsigned long long)assumed);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B,
                              cublasLtMatrixLayout_t b, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_nbytes, cudaStream_t stream)
{
    static const char fn[] = "cublasLtMatmul";
    (void)stream; /* synchronous at issue (cuemu.h) */
    cuemu_gemm g;
    cublasStatus_t st = lt_gemm(fn, handle, desc, a, b, c, d, &g);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    if (alpha == NULL || beta == NULL) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha (%p) or beta (%p) is NULL",
                               alpha, beta);
    }
    g.A = A;
    g.B = B;
    g.C = C;
    g.D = D;
    /* Host scalars of the scale type (CUDA_R_32F; cuemu_gemm_check refuses others). */
    memcpy(&g.alpha, alpha, sizeof g.alpha);
    memcpy(&g.beta, beta, sizeof g.beta);
    st = cuemu_gemm_check(&g, 1);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    /* "algo: if NULL, an implicit heuristic query with default search preferences will be
     * performed": the pointers are known then, nothing to hold them to. */
    if (algo != NULL) {
        const uint64_t *rec = algo->data;
        if (rec[ALGO_MAGIC] != ALGO) {
            return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                                   "the algorithm was not filled by "
                                   "cublasLtMatmulAlgoGetHeuristic");
        }
        int has_d = g.d_rows * g.d_cols > 0;
        const char *aux_name = "the epilogue aux (EPILOGUE_AUX_POINTER)";
        if ((st = check_aligned(fn, "A", A, rec[ALGO_ALIGN_A], has_d)) != CUBLAS_STATUS_SUCCESS ||
            (st = check_aligned(fn, "B", B, rec[ALGO_ALIGN_B], has_d)) != CUBLAS_STATUS_SUCCESS ||
            (st = check_aligned(fn, "C", C, rec[ALGO_ALIGN_C], has_d && g.beta != 0.0f)) !=
                CUBLAS_STATUS_SUCCESS ||
            (st = check_aligned(fn, "D", D, rec[ALGO_ALIGN_D], has_d)) != CUBLAS_STATUS_SUCCESS ||
            (st = check_aligned(fn, "the bias (BIAS_POINTER)", g.bias, rec[ALGO_ALIGN_BIAS], 1)) !=
                CUBLAS_STATUS_SUCCESS ||
            (st = check_aligned(fn, aux_name, g.aux, rec[ALGO_ALIGN_AUX], 1)) !=
                CUBLAS_STATUS_SUCCESS) {
            return st;
        }
    }
    if (workspace_nbytes > 0 && !cuemu_is_device(workspace, workspace_nbytes)) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                               "the workspace (%p, %zu bytes) is not device memory of that size",
                               workspace, workspace_nbytes);
    }
    return cuemu_gemm_run(&g);
}

/* ---- the legacy cuBLAS product (bench/cuda_step.cu) ---- */

/* 1 / 0 for a transposing / plain op, -1 for a value that is neither. */
static int transposes(cublasOperation_t op)
{
    return op == CUBLAS_OP_N ? 0 : op == CUBLAS_OP_T || op == CUBLAS_OP_C ? 1 : -1;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    static const char fn[] = "cublasGemmEx";
    if (!live(handle, BLAS_HANDLE)) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle %p is not live",
                               (void *)handle);
    }
    int ta = transposes(transa), tb = transposes(transb);
    if (ta < 0 || tb < 0 || m < 0 || n < 0 || k < 0 || alpha == NULL || beta == NULL) {
        return cuemu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                               "transa %d, transb %d, m %d, n %d, k %d, alpha %p, beta %p",
                               (int)transa, (int)transb, m, n, k, alpha, beta);
    }
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) {
        return cuemu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                               "algorithm %d: only CUBLAS_GEMM_DEFAULT(_TENSOR_OP) is emulated",
                               (int)algo);
    }
    cuemu_gemm g = {0};
    g.fn = fn;
    g.compute_type = compute;
    g.scale_type = CUDA_R_32F; /* the scale type CUBLAS_COMPUTE_32F implies */
    g.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    g.ta = ta;
    g.tb = tb;
    g.a_type = Atype;
    g.b_type = Btype;
    g.c_type = g.d_type = Ctype;
    g.a_rows = (uint64_t)(ta ? k : m);
    g.a_cols = (uint64_t)(ta ? m : k);
    g.b_rows = (uint64_t)(tb ? n : k);
    g.b_cols = (uint64_t)(tb ? k : n);
    g.c_rows = g.d_rows = (uint64_t)m;
    g.c_cols = g.d_cols = (uint64_t)n;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = g.ldd = ldc;
    g.A = A;
    g.B = B;
    g.C = C;
    g.D = C;
    memcpy(&g.alpha, alpha, sizeof g.alpha);
    memcpy(&g.beta, beta, sizeof g.beta);
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias_type = g.aux_type = -1;
    return cuemu_gemm_run(&g);
}

/* ---- status strings ---- */

static const char *status_name(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
        return "CUBLAS_STATUS_UNKNOWN";
    }
}

/* What accel prints after "failed: ": the name says it to anyone who knows cuBLAS, the words
 * to anyone else; an emulated failure has printed its culprit on stderr before. */
static const char *status_string(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS (no error)";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED (no live handle)";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED (out of memory)";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE (an argument or attribute is invalid)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED (the configuration is not supported)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED (a kernel failed)";
    default:
        return status_name(st);
    }
}

const char *cublasGetStatusName(cublasStatus_t st)
{
    return status_name(st);
}

const char *cublasGetStatusString(cublasStatus_t st)
{
    return status_string(st);
}

const char *cublasLtGetStatusString(cublasStatus_t st)
{
    return status_string(st);
}
