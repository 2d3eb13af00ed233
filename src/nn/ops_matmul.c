/*
 * The sgemm-backed ops: matmul (batched), linear in both weight layouts, and fused causal
 * self-attention over GPT-2's packed qkv.
 *
 * Every product goes to cblas_sgemm with leading dimensions that address the operands in
 * place (parameters are never copied or transposed; q, k and v are read straight out of the
 * packed [B, T, 3C] tensor). Backward accumulates with beta = 1, which is what makes
 * parameter gradients sum across uses and across micro-steps. Attention keeps only the
 * per-row log-sum-exp: backward recomputes each head's scores into per-thread scratch.
 * Under autocast, parameters read from a bf16 / fp16 working copy are widened into per-op
 * scratch (released when the op returns; backward widens them again), and backward's
 * rounding buffers are per-op scratch too, so none of them stays in the arena for the step.
 */
#include <cblas.h>

#include "nn_gpu.h"

void accel__nn_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/*
 * C += op(A) op(B) for a gradient contribution (C = op(A) op(B) when `write`: C is a fresh
 * gradient, see accel__nn_grad_w). In fp32 that is sgemm with beta = 1 (0); under autocast
 * the product goes to scratch and is rounded to dt before the fp32 add, as the output of a
 * bf16 / fp16 kernel would be. Returns 0 on OOM (ctx error set).
 */
static int gemm_acc(nn_ctx *g, accel_dtype dt, int write, int ta, int tb, int64_t M, int64_t N,
                    int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc)
{
    if (dt == ACCEL_F32) {
        accel__nn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, write ? 0.0f : 1.0f, C, ldc);
        return 1;
    }
    float *tmp = accel__nn_tmp_scratch(g, M * N, 0);
    if (tmp == NULL) {
        return 0;
    }
    accel__nn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, tmp, N);
    if (ldc == N) { /* contiguous: one call, so the conversion can use its threads */
        N *= M;
        M = 1;
    }
    for (int64_t r = 0; r < M; r++) {
        if (write) {
            accel__nn_round(dt, C + r * ldc, tmp + r * N, N);
        } else {
            accel__nn_add_rounded(dt, C + r * ldc, tmp + r * N, N);
        }
    }
    return 1;
}

/* The incoming gradient as an autocast kernel reads it: rounded to dt (a per-op copy), or as
 * is. */
static const float *grad_in(nn_ctx *g, accel_dtype dt, const float *gy, int64_t n)
{
    if (dt == ACCEL_F32) {
        return gy;
    }
    float *r = accel__nn_tmp_scratch(g, n, 0);
    if (r != NULL) {
        accel__nn_round(dt, r, gy, n);
    }
    return r;
}

/* Operand k of node n (tensor t) as the forward's kernel read it: t itself in fp32, else the
 * forward's rounded arena copy (n->p[k]) or, when the forward widened t from a working copy
 * into per-op scratch (p[k] NULL), the same values widened again. NULL on OOM. */
static const float *operand(nn_ctx *g, const nn_node *n, int k, const nn_tensor *t, accel_dtype dt)
{
    if (dt == ACCEL_F32) {
        return t->data;
    }
    return n->p[k] != NULL ? n->p[k] : accel__nn_cast(g, t, dt, NULL);
}

/* What a node keeps of a cast operand: the arena copy, or NULL for per-op scratch. */
static void *keep(const float *cast, int per_op)
{
    return per_op ? NULL : (void *)cast;
}

/* ---- linear ---- */

/* sum[j] += gy[r, j] over rows (the bias gradient), rows in order. */
NN_KERNEL static void col_sum(const float *restrict gy, int64_t M, int64_t N, float *restrict sum)
{
    for (int64_t r = 0; r < M; r++) {
        const float *gr = gy + r * N;
        NN_SIMD
        for (int64_t j = 0; j < N; j++) {
            sum[j] += gr[j];
        }
    }
}

static void linear_backward(nn_ctx *g, nn_node *n)
{
    nn_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    int64_t M = n->i[0], in = n->i[1], out = n->i[2];
    int in_out = n->i[3] == NN_LAYOUT_IN_OUT;
    accel_dtype dt = (accel_dtype)n->i[4];
    /* Under autocast the forward's rounded operands are what the kernel saw. */
    const float *xd = operand(g, n, 0, x, dt), *wd = operand(g, n, 1, w, dt);
    const float *gy = grad_in(g, dt, n->out->grad, M * out);
    if (xd == NULL || wd == NULL || gy == NULL) {
        return;
    }
    int fx;
    float *gx = accel__nn_grad_w(g, x, &fx);
    if (gx != NULL) {
        if (in_out) {
            gemm_acc(g, dt, fx, 0, 1, M, in, out, 1.0f, gy, out, wd, out, gx, in);
        } else {
            gemm_acc(g, dt, fx, 0, 0, M, in, out, 1.0f, gy, out, wd, in, gx, in);
        }
    }
    /* Fetched after gx was written, so x == w (however odd) adds rather than overwrites. */
    int fw;
    float *gw = accel__nn_grad_w(g, w, &fw);
    if (gw != NULL) {
        if (in_out) {
            gemm_acc(g, dt, fw, 1, 0, in, out, M, 1.0f, xd, in, gy, out, gw, out);
        } else {
            gemm_acc(g, dt, fw, 1, 0, out, in, M, 1.0f, gy, out, xd, in, gw, in);
        }
    }
    float *gb = b ? accel__nn_grad(g, b) : NULL;
    if (gb != NULL) {
        float *sum = dt == ACCEL_F32 ? gb : accel__nn_tmp_scratch(g, out, 1);
        if (sum == NULL) {
            return;
        }
        col_sum(gy, M, out, sum);
        if (dt != ACCEL_F32) {
            accel__nn_add_rounded(dt, gb, sum, out);
        }
    }
}

nn_tensor *accel__nn_linear_out(nn_ctx *g, const nn_tensor *x, const nn_tensor *w,
                                const nn_tensor *bias, nn_layout layout, int half, int64_t *in,
                                int64_t *out, int64_t *M)
{
    if (w->ndim != 2 || x->ndim < 1) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_linear: weight must be 2-D, input >= 1-D");
    }
    int in_out = layout == NN_LAYOUT_IN_OUT;
    *in = in_out ? w->shape[0] : w->shape[1];
    *out = in_out ? w->shape[1] : w->shape[0];
    if (x->shape[x->ndim - 1] != *in || (bias != NULL && nn_numel(bias) != *out)) {
        char s1[64], s2[64];
        return accel__nn_fail(
            g, ACCEL_EINVAL, "nn_linear: input %s does not match weight %s (%s layout)%s",
            accel__nn_shape_str(x, s1, sizeof(s1)), accel__nn_shape_str(w, s2, sizeof(s2)),
            in_out ? "[in, out]" : "[out, in]",
            bias != NULL && nn_numel(bias) != *out ? " or bias size" : "");
    }
    *M = *in ? nn_numel(x) / *in : 0;
    int64_t shape[NN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(shape));
    shape[x->ndim - 1] = *out;
    return half == 2 ? accel__nn_new_shell(g, x->ndim, shape)
           : half    ? accel__nn_new_half(g, x->ndim, shape)
                     : accel__nn_new(g, x->ndim, shape);
}

static nn_tensor *linear_impl(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                              nn_layout layout)
{
    if (x == NULL || w == NULL) {
        return NULL;
    }
    nn_tensor *bias_in = bias;
    x = accel__nn_contig(g, x, "nn_linear", 0);
    /* The first refusal's message stands: the later inputs are not checked after it. */
    w = x != NULL ? accel__nn_contig(g, w, "nn_linear", 1) : NULL;
    bias = bias != NULL && w != NULL ? accel__nn_contig(g, bias, "nn_linear", 2) : NULL;
    if (x == NULL || w == NULL || (bias_in != NULL && bias == NULL)) {
        return NULL;
    }
    int64_t in, out, M;
    nn_tensor *y = accel__nn_linear_out(g, x, w, bias, layout, 0, &in, &out, &M);
    if (y == NULL) {
        return NULL;
    }
    if (in == 0) {
        /* No input features: y is the bias (or zeros) in every row, as on a GPU; M = 0 here
         * left y unwritten. (sgemm with K = 0 writes beta C.) */
        M = out ? nn_numel(y) / out : 0;
    }
    int in_out = layout == NN_LAYOUT_IN_OUT;
    accel_dtype dt = nn__autocast(g);
    const float *xd = x->data, *wd = w->data, *bd = bias ? bias->data : NULL;
    int x_op = 0, w_op = 0;
    if (dt != ACCEL_F32) {
        xd = accel__nn_cast(g, x, dt, &x_op);
        wd = accel__nn_cast(g, w, dt, &w_op);
        bd = bias ? accel__nn_cast(g, bias, dt, NULL) : NULL;
        if (xd == NULL || wd == NULL || (bias != NULL && bd == NULL)) {
            return NULL;
        }
    }
    float beta = 0.0f;
    if (bias != NULL) {
        for (int64_t r = 0; r < M; r++) {
            memcpy(y->data + r * out, bd, (size_t)out * sizeof(float));
        }
        beta = 1.0f;
    }
    if (in_out) {
        accel__nn_gemm(0, 0, M, out, in, 1.0f, xd, in, wd, out, beta, y->data, out);
    } else {
        accel__nn_gemm(0, 1, M, out, in, 1.0f, xd, in, wd, in, beta, y->data, out);
    }
    nn_tensor *ins[3] = {x, w, bias};
    if (accel__nn_needs_grad(g, ins, 3)) {
        nn_node *n = accel__nn_record(g, "linear", y, ins, 3, linear_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = M;
        n->i[1] = in;
        n->i[2] = out;
        n->i[3] = layout;
        n->i[4] = dt;
        n->p[0] = dt != ACCEL_F32 ? keep(xd, x_op) : NULL;
        n->p[1] = dt != ACCEL_F32 ? keep(wd, w_op) : NULL;
    }
    return y;
}

nn_tensor *nn_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias, nn_layout layout)
{
    if (g == NULL) {
        return accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", "nn_linear");
    }
    if (nn__use_gpu(g, x, w, bias)) {
        return accel__nn_gpu->linear(g, x, w, bias, layout);
    }
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    nn_tensor *y = linear_impl(g, x, w, bias, layout);
    accel__nn_tmp_release(g, tm);
    accel__nn_fp_leave(g, &fs);
    return y;
}

nn_tensor *accel__nn_linear_qkv(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *bias,
                                nn_layout layout, int n_head, float attn_dropout)
{
    if (g != NULL && nn__use_gpu(g, x, w, bias)) {
        return accel__nn_gpu->linear_qkv(g, x, w, bias, layout, n_head, attn_dropout);
    }
    return nn_linear(g, x, w, bias, layout);
}

nn_tensor *nn_linear_gelu_linear(nn_ctx *g, nn_tensor *x, nn_tensor *w1, nn_tensor *b1,
                                 nn_tensor *w2, nn_tensor *b2, nn_layout layout, int approximate)
{
    if (g == NULL) {
        return accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", "nn_linear_gelu_linear");
    }
    /* cuBLASLt's GELU epilogues are the tanh form: the erf form takes the three ops. */
    if (approximate && (nn__use_gpu(g, x, w1, w2) || nn__on_gpu(b1) || nn__on_gpu(b2))) {
        return accel__nn_gpu->linear_gelu_linear(g, x, w1, b1, w2, b2, layout);
    }
    /* Checked as this op's inputs (the three ops would name themselves and number w2, b2 as
     * their inputs 1, 2). */
    if (!accel__nn_inputs_ok(g, "nn_linear_gelu_linear", (nn_tensor *[]){x, w1, b1, w2, b2}, 5)) {
        return NULL;
    }
    nn_tensor *h = nn_gelu(g, nn_linear(g, x, w1, b1, layout), approximate);
    return nn_linear(g, h, w2, b2, layout);
}

/* ---- matmul: a [..., M, K] x b [K, N] or [..., K, N] ---- */

static void matmul_backward(nn_ctx *g, nn_node *n)
{
    nn_tensor *a = n->in[0], *b = n->in[1];
    int64_t batch = n->i[0], M = n->i[1], K = n->i[2], N = n->i[3];
    int b2d = (int)n->i[4];
    accel_dtype dt = (accel_dtype)n->i[5];
    const float *ad = operand(g, n, 0, a, dt), *bd = operand(g, n, 1, b, dt);
    const float *gy = grad_in(g, dt, n->out->grad, batch * M * N);
    if (ad == NULL || bd == NULL || gy == NULL) {
        return;
    }
    /* Every product below covers its whole destination once, so a fresh gradient is written.
     * b's gradient is fetched after a's is complete (a == b adds). */
    int fa, fb;
    float *ga = accel__nn_grad_w(g, a, &fa);
    if (b2d) {
        /* One product over all batch rows at once. */
        if (ga != NULL) {
            gemm_acc(g, dt, fa, 0, 1, batch * M, K, N, 1.0f, gy, N, bd, N, ga, K);
        }
        float *gb = accel__nn_grad_w(g, b, &fb);
        if (gb != NULL) {
            gemm_acc(g, dt, fb, 1, 0, K, N, batch * M, 1.0f, ad, K, gy, N, gb, N);
        }
        return;
    }
    for (int64_t i = 0; ga != NULL && i < batch; i++) {
        if (!gemm_acc(g, dt, fa, 0, 1, M, K, N, 1.0f, gy + i * M * N, N, bd + i * K * N, N,
                      ga + i * M * K, K)) {
            return;
        }
    }
    float *gb = accel__nn_grad_w(g, b, &fb);
    for (int64_t i = 0; gb != NULL && i < batch; i++) {
        if (!gemm_acc(g, dt, fb, 1, 0, K, N, M, 1.0f, ad + i * M * K, K, gy + i * M * N, N,
                      gb + i * K * N, N)) {
            return;
        }
    }
}

static nn_tensor *matmul_impl(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    if (a == NULL || b == NULL) {
        return NULL;
    }
    a = accel__nn_contig(g, a, "nn_matmul", 0);
    b = a != NULL ? accel__nn_contig(g, b, "nn_matmul", 1) : NULL;
    if (a == NULL || b == NULL) {
        return NULL;
    }
    char s1[64], s2[64];
    int ok = a->ndim >= 2 && b->ndim >= 2;
    int b2d = b->ndim == 2;
    if (ok && !b2d) {
        ok = a->ndim == b->ndim;
        for (int d = 0; ok && d < a->ndim - 2; d++) {
            ok = a->shape[d] == b->shape[d];
        }
    }
    if (ok) {
        ok = a->shape[a->ndim - 1] == b->shape[b->ndim - 2];
    }
    if (!ok) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_matmul: shapes %s and %s do not multiply",
                              accel__nn_shape_str(a, s1, sizeof(s1)),
                              accel__nn_shape_str(b, s2, sizeof(s2)));
    }
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    int64_t batch = (M * K != 0) ? nn_numel(a) / (M * K) : 0;
    int64_t shape[NN_MAX_DIMS];
    memcpy(shape, a->shape, sizeof(shape));
    shape[a->ndim - 1] = N;
    nn_tensor *y = accel__nn_new(g, a->ndim, shape);
    if (y == NULL) {
        return NULL;
    }
    accel_dtype dt = nn__autocast(g);
    const float *ad = a->data, *bd = b->data;
    int a_op = 0, b_op = 0;
    if (dt != ACCEL_F32) {
        ad = accel__nn_cast(g, a, dt, &a_op);
        bd = accel__nn_cast(g, b, dt, &b_op);
        if (ad == NULL || bd == NULL) {
            return NULL;
        }
    }
    if (b2d) {
        accel__nn_gemm(0, 0, batch * M, N, K, 1.0f, ad, K, bd, N, 0.0f, y->data, N);
    } else {
        for (int64_t i = 0; i < batch; i++) {
            accel__nn_gemm(0, 0, M, N, K, 1.0f, ad + i * M * K, K, bd + i * K * N, N, 0.0f,
                           y->data + i * M * N, N);
        }
    }
    nn_tensor *ins[2] = {a, b};
    if (accel__nn_needs_grad(g, ins, 2)) {
        nn_node *n = accel__nn_record(g, "matmul", y, ins, 2, matmul_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = batch;
        n->i[1] = M;
        n->i[2] = K;
        n->i[3] = N;
        n->i[4] = b2d;
        n->i[5] = dt;
        n->p[0] = dt != ACCEL_F32 ? keep(ad, a_op) : NULL;
        n->p[1] = dt != ACCEL_F32 ? keep(bd, b_op) : NULL;
    }
    return y;
}

nn_tensor *nn_matmul(nn_ctx *g, nn_tensor *a, nn_tensor *b)
{
    NN_CPU_ONLY(g, "nn_matmul", a, b);
    if (g == NULL) {
        return accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", "nn_matmul");
    }
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    nn_tensor *y = matmul_impl(g, a, b);
    accel__nn_tmp_release(g, tm);
    accel__nn_fp_leave(g, &fs);
    return y;
}

/* ---- fused causal self-attention ---- */

typedef struct attn_dims {
    int64_t B, T, C, H, hd;
    float scale, p;
    uint64_t key;
} attn_dims;

/*
 * Causal block skipping. Queries are taken in blocks of attn_block(T) rows; block [i0, i1)
 * only multiplies keys [0, i1), so the products never touch the all-zero upper-right blocks of
 * the T x T score matrix (T = 128: four blocks of 32, 10/16 of the full products; measured
 * ~1% of the GPT step faster than two blocks of 64, whose products are 3/4). Keys are taken in
 * the same blocks for dV and dK, whose rows t < j0 contribute nothing.
 */
static int64_t attn_block(int64_t T)
{
    return T <= 128 ? (T + 3) / 4 : 64;
}

/* S[i0:i1, 0:i1] = alpha * A[i0:i1] B[0:i1]^T for each query block (rows of A and B hd long,
 * lda / ldb apart; S is T x T). Entries right of i1 are left unwritten. */
static void causal_abt(int64_t T, int64_t hd, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float *S)
{
    int64_t tb = attn_block(T);
    for (int64_t i0 = 0; i0 < T; i0 += tb) {
        int64_t i1 = i0 + tb < T ? i0 + tb : T;
        accel__nn_gemm(0, 1, i1 - i0, i1, hd, alpha, A + i0 * lda, lda, B, ldb, 0.0f, S + i0 * T,
                       T);
    }
}

/* Y[i0:i1] = alpha * P[i0:i1, 0:i1] V[0:i1] (+ beta Y) per query block; P is causal T x T. */
static void causal_pv(int64_t T, int64_t hd, float alpha, const float *P, const float *V,
                      int64_t ldv, float beta, float *Y, int64_t ldy)
{
    int64_t tb = attn_block(T);
    for (int64_t i0 = 0; i0 < T; i0 += tb) {
        int64_t i1 = i0 + tb < T ? i0 + tb : T;
        accel__nn_gemm(0, 0, i1 - i0, hd, i1, alpha, P + i0 * T, T, V, ldv, beta, Y + i0 * ldy,
                       ldy);
    }
}

/* Y[j0:j1] = alpha * P[j0:T, j0:j1]^T X[j0:T] (+ beta Y) per key block: P^T X without the rows
 * t < j0, where a causal P is zero. */
static void causal_ptx(int64_t T, int64_t hd, float alpha, const float *P, const float *X,
                       int64_t ldx, float beta, float *Y, int64_t ldy)
{
    int64_t tb = attn_block(T);
    for (int64_t j0 = 0; j0 < T; j0 += tb) {
        int64_t j1 = j0 + tb < T ? j0 + tb : T;
        accel__nn_gemm(1, 0, j1 - j0, hd, T - j0, alpha, P + j0 * T + j0, T, X + j0 * ldx, ldx,
                       beta, Y + j0 * ldy, ldy);
    }
}

/* Dropout multiplier of probability (bh, t, s): counter-based, so backward regenerates it. */
static inline float attn_keep(const attn_dims *d, int64_t bh, int64_t t, int64_t s)
{
    uint64_t i = (uint64_t)((bh * d->T + t) * d->T + s);
    return nn__uniform(d->key, i) >= d->p ? 1.0f / (1.0f - d->p) : 0.0f;
}

/* Causal softmax of the T x T scores S in place (zero above the diagonal); lse[t] gets each
 * row's log-sum-exp, the one statistic backward keeps. */
NN_KERNEL static void causal_softmax(float *restrict S, int64_t T, float *restrict lse)
{
    for (int64_t t = 0; t < T; t++) {
        float *row = S + t * T;
        float m = accel__nn_row_max(row, t + 1), s = 0.0f;
        NN_SIMD_SUM(s)
        for (int64_t j = 0; j <= t; j++) {
            row[j] = nn__expf(row[j] - m);
            s += row[j];
        }
        float inv = 1.0f / s;
        NN_SIMD
        for (int64_t j = 0; j <= t; j++) {
            row[j] *= inv;
        }
        for (int64_t j = t + 1; j < T; j++) {
            row[j] = 0.0f;
        }
        lse[t] = m + logf(s);
    }
}

/* Backward, first half: P = exp(S - lse) from the recomputed scores, and D[t] = dO[t] . O[t]
 * (rows of dO and O are hd long, ld apart). */
NN_KERNEL static void attn_probs(float *restrict P, int64_t T, const float *restrict lse,
                                 const float *restrict dO, const float *restrict O, int64_t hd,
                                 int64_t ld, float *restrict D)
{
    for (int64_t t = 0; t < T; t++) {
        float *row = P + t * T, l = lse[t], acc = 0.0f;
        NN_SIMD
        for (int64_t j = 0; j <= t; j++) {
            row[j] = nn__expf(row[j] - l);
        }
        for (int64_t j = t + 1; j < T; j++) {
            row[j] = 0.0f;
        }
        NN_SIMD_SUM(acc)
        for (int64_t j = 0; j < hd; j++) {
            acc += dO[t * ld + j] * O[t * ld + j];
        }
        D[t] = acc;
    }
}

/* dS = P' .* dP' - P .* D in place of dP' (the dropout mask is folded into P'). */
NN_KERNEL static void attn_dscores(float *restrict dP, const float *restrict P,
                                   const float *restrict Pu, const float *restrict D, int64_t T)
{
    for (int64_t t = 0; t < T; t++) {
        float *ds = dP + t * T;
        const float *pr = P + t * T, *pu = Pu + t * T;
        float Dt = D[t];
        NN_SIMD
        for (int64_t j = 0; j <= t; j++) {
            ds[j] = pu[j] * ds[j] - pr[j] * Dt;
        }
        for (int64_t j = t + 1; j < T; j++) {
            ds[j] = 0.0f;
        }
    }
}

static void attn_backward(nn_ctx *g, nn_node *n)
{
    attn_dims d = {n->i[0], n->i[1], n->i[2], n->i[3],
                   n->i[4], n->f[0], n->f[1], (uint64_t)n->i[5]};
    accel_dtype dt = (accel_dtype)n->i[6];
    const float *qkv = operand(g, n, 2, n->in[0], dt), *out = n->out->data;
    const float *lse = n->p[0];
    float *scratch = n->p[1];
    int fresh;
    float *gqkv = accel__nn_grad_w(g, n->in[0], &fresh);
    if (gqkv == NULL) {
        return;
    }
    int64_t T = d.T, C3 = 3 * d.C, per = 3 * T * T + T;
    int64_t nbh = d.B * d.H;
    /* Autocast: dO is read rounded, and the q/k/v gradients (one product each per head, so
     * disjoint) go to a zeroed buffer first, rounded into gqkv after the loop. */
    const float *gy = grad_in(g, dt, n->out->grad, d.B * T * d.C);
    float *gdst = dt == ACCEL_F32 ? gqkv : accel__nn_tmp_scratch(g, d.B * T * C3, 1);
    /* Each head's dq, dk and dv are one product each into disjoint columns, and together they
     * cover [B, T, 3C]: a fresh gradient (or the zeroed scratch) is written with beta 0. */
    float beta = (dt != ACCEL_F32 || fresh) ? 0.0f : 1.0f;
    if (qkv == NULL || gy == NULL || gdst == NULL) {
        return;
    }
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (nbh > 1 && T * T * d.hd > 32768)
#endif
    for (int64_t bh = 0; bh < nbh; bh++) {
        int64_t b = bh / d.H, h = bh % d.H;
        float *P = scratch + nn__thread() * per, *Pd = P + T * T, *dP = Pd + T * T;
        float *D = dP + T * T;
        const float *q = qkv + b * T * C3 + h * d.hd, *k = q + d.C, *v = q + 2 * d.C;
        float *gq = gdst + b * T * C3 + h * d.hd, *gk = gq + d.C, *gv = gq + 2 * d.C;
        const float *dO = gy + b * T * d.C + h * d.hd, *O = out + b * T * d.C + h * d.hd;
        causal_abt(T, d.hd, d.scale, q, C3, k, C3, P);
        attn_probs(P, T, lse + bh * T, dO, O, d.hd, d.C, D);
        const float *Pused = P;
        if (d.p > 0.0f) {
            for (int64_t t = 0; t < T; t++) {
                for (int64_t j = 0; j < T; j++) {
                    Pd[t * T + j] = j <= t ? P[t * T + j] * attn_keep(&d, bh, t, j) : 0.0f;
                }
            }
            Pused = Pd;
        }
        if (dt != ACCEL_F32) {
            /* P (and P' as the forward rounded it) enter the products in low precision. */
            accel__nn_round(dt, P, P, T * T);
            if (d.p > 0.0f) {
                accel__nn_round(dt, Pd, Pd, T * T);
            }
        }
        /* dP' = dO V^T; dV += P'^T dO. */
        causal_abt(T, d.hd, 1.0f, dO, d.C, v, C3, dP);
        causal_ptx(T, d.hd, 1.0f, Pused, dO, d.C, beta, gv, C3);
        attn_dscores(dP, P, Pused, D, T);
        if (dt != ACCEL_F32) {
            accel__nn_round(dt, dP, dP, T * T);
        }
        causal_pv(T, d.hd, d.scale, dP, k, C3, beta, gq, C3);
        causal_ptx(T, d.hd, d.scale, dP, q, C3, beta, gk, C3);
    }
    if (dt != ACCEL_F32) {
        if (fresh) {
            accel__nn_round(dt, gqkv, gdst, d.B * T * C3);
        } else {
            accel__nn_add_rounded(dt, gqkv, gdst, d.B * T * C3);
        }
    }
}

int accel__nn_attention_args(nn_ctx *g, const nn_tensor *qkv, int n_head, float attn_dropout)
{
    if (qkv->ndim != 3 || n_head <= 0 || qkv->shape[2] % (3 * (int64_t)n_head) != 0 ||
        !(attn_dropout >= 0.0f && attn_dropout < 1.0f)) {
        char s1[64];
        accel__nn_fail(g, ACCEL_EINVAL,
                       "nn_causal_attention: qkv %s must be [B, T, 3C] with C divisible by n_head "
                       "%d, dropout in [0, 1)",
                       accel__nn_shape_str(qkv, s1, sizeof(s1)), n_head);
        return 0;
    }
    return 1;
}

static nn_tensor *attention_impl(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout)
{
    if (qkv == NULL) {
        return NULL;
    }
    uint64_t op_index = g->op_counter++;
    qkv = accel__nn_contig(g, qkv, "nn_causal_attention", 0);
    if (qkv == NULL) {
        return NULL;
    }
    if (!accel__nn_attention_args(g, qkv, n_head, attn_dropout)) {
        return NULL;
    }
    attn_dims d;
    d.B = qkv->shape[0];
    d.T = qkv->shape[1];
    d.C = qkv->shape[2] / 3;
    d.H = n_head;
    d.hd = d.C / n_head;
    d.scale = 1.0f / sqrtf((float)d.hd);
    d.p = g->training ? attn_dropout : 0.0f;
    d.key = nn__key3(g->seed, g->step, op_index);
    int64_t T = d.T, C3 = 3 * d.C, nbh = d.B * d.H;
    int64_t shape[3] = {d.B, d.T, d.C};
    nn_tensor *y = accel__nn_new(g, 3, shape);
    float *lse = accel__nn_alloc(g, (size_t)(nbh * T) * sizeof(float));
    /* Per-thread scratch sized for backward (P, P', dP, D) and shared with forward. */
    int64_t per = 3 * T * T + T;
    float *scratch = accel__nn_alloc(g, (size_t)(nn__max_threads() * per) * sizeof(float));
    if (y == NULL || lse == NULL || scratch == NULL) {
        return NULL;
    }
    accel_dtype dt = nn__autocast(g);
    int qkv_op = 0;
    const float *qkvd = dt == ACCEL_F32 ? qkv->data : accel__nn_cast(g, qkv, dt, &qkv_op);
    if (qkvd == NULL) {
        return NULL;
    }
#ifdef ACCEL_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (nbh > 1 && T * T * d.hd > 32768)
#endif
    for (int64_t bh = 0; bh < nbh; bh++) {
        int64_t b = bh / d.H, h = bh % d.H;
        float *S = scratch + nn__thread() * per;
        const float *q = qkvd + b * T * C3 + h * d.hd, *k = q + d.C, *v = q + 2 * d.C;
        causal_abt(T, d.hd, d.scale, q, C3, k, C3, S);
        causal_softmax(S, T, lse + bh * T);
        for (int64_t t = 0; d.p > 0.0f && t < T; t++) {
            for (int64_t j = 0; j <= t; j++) {
                S[t * T + j] *= attn_keep(&d, bh, t, j);
            }
        }
        if (dt != ACCEL_F32) {
            accel__nn_round(dt, S, S, T * T); /* probabilities enter P V in low precision */
        }
        causal_pv(T, d.hd, 1.0f, S, v, C3, 0.0f, y->data + b * T * d.C + h * d.hd, d.C);
    }
    if (accel__nn_needs_grad(g, &qkv, 1)) {
        nn_node *n = accel__nn_record(g, "causal_attention", y, &qkv, 1, attn_backward);
        if (n == NULL) {
            return NULL;
        }
        n->i[0] = d.B;
        n->i[1] = d.T;
        n->i[2] = d.C;
        n->i[3] = d.H;
        n->i[4] = d.hd;
        n->i[5] = (int64_t)d.key;
        n->f[0] = d.scale;
        n->f[1] = d.p;
        n->p[0] = lse;
        n->p[1] = scratch;
        n->i[6] = dt;
        n->p[2] = dt != ACCEL_F32 ? keep(qkvd, qkv_op) : NULL;
    }
    return y;
}

nn_tensor *nn_causal_attention(nn_ctx *g, nn_tensor *qkv, int n_head, float attn_dropout)
{
    if (g == NULL) {
        return accel__nn_fail(NULL, ACCEL_EINVAL, "%s: ctx is NULL", "nn_causal_attention");
    }
    if (nn__use_gpu(g, qkv, NULL, NULL)) {
        return accel__nn_gpu->attention(g, qkv, n_head, attn_dropout);
    }
    nn_fpscope fs;
    accel__nn_fp_enter(g, &fs);
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    nn_tensor *y = attention_impl(g, qkv, n_head, attn_dropout);
    accel__nn_tmp_release(g, tm);
    accel__nn_fp_leave(g, &fs);
    return y;
}
