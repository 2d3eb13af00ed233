/*
 * nn autocast: under bf16 / fp16 the matmul-class ops read their inputs rounded to the compute
 * dtype, accumulate in fp32 and hand back fp32 outputs; each gradient contribution they make
 * is rounded to the dtype (fp16 overflows to inf); AUTO follows a model prepared under mixed
 * precision; accel_autocast_begin/end enable, disable locally and nest.
 *
 * Tolerances. Forward outputs are compared with a double reference computed from the SAME
 * rounded inputs: the only difference is fp32 accumulation over K <= 64 terms, so
 * |y - ref| <= 64 * 2^-24 * sum|terms| (we use 1e-5 * (1 + sum|terms|)). Not rounding the inputs
 * would be off by ~2^-9 relative (bf16), hundreds of times more, so the check discriminates.
 * Gradients start at zero and receive one rounded contribution, so each must be exactly
 * representable in the dtype, and within one dtype ulp of the double reference.
 */
#include <string.h>

#include "accel/nn.h"
#include "check.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static float round_to(accel_dtype dt, float x)
{
    uint16_t h;
    float y;
    CHECK_OK(NULL, accel_convert(&h, dt, &x, ACCEL_F32, 1));
    CHECK_OK(NULL, accel_convert(&y, ACCEL_F32, &h, dt, 1));
    return y;
}

static int representable(accel_dtype dt, float x)
{
    return round_to(dt, x) == x || (x != x);
}

#define M 6
#define K 40
#define NO 5

static void check_linear(accel_dtype dt)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_F32);
    CHECK(nn_ctx_set_autocast(g, dt) == NN_AUTOCAST_AUTO);
    CHECK(nn_ctx_autocast_dtype(g) == dt);
    float xv[M * K], wv[NO * K], bv[NO], cv[M * NO];
    for (int i = 0; i < M * K; i++) {
        xv[i] = frand();
    }
    for (int i = 0; i < NO * K; i++) {
        wv[i] = frand();
    }
    for (int i = 0; i < NO; i++) {
        bv[i] = frand();
    }
    for (int i = 0; i < M * NO; i++) {
        cv[i] = frand();
    }
    nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, xv, 2, (int64_t[]){M, K}), 1);
    nn_tensor *w = nn_tensor_requires_grad(nn_tensor_from(g, wv, 2, (int64_t[]){NO, K}), 1);
    nn_tensor *b = nn_tensor_requires_grad(nn_tensor_from(g, bv, 1, (int64_t[]){NO}), 1);
    nn_tensor *y = nn_linear(g, x, w, b, NN_LAYOUT_OUT_IN);
    CHECK(y != NULL);
    double max_unrounded_diff = 0;
    int not_representable = 0;
    for (int r = 0; r < M; r++) {
        for (int o = 0; o < NO; o++) {
            double ref = round_to(dt, bv[o]), ref_fp32 = bv[o], mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                double t = (double)round_to(dt, xv[r * K + k]) * round_to(dt, wv[o * K + k]);
                ref += t;
                mag += fabs(t);
                ref_fp32 += (double)xv[r * K + k] * wv[o * K + k];
            }
            float got = y->data[r * NO + o];
            CHECK_MSG(fabs(got - ref) <= 1e-5 * (1 + mag), "y[%d,%d] %.9g vs %.9g", r, o, got, ref);
            double du = fabs(got - ref_fp32);
            max_unrounded_diff = du > max_unrounded_diff ? du : max_unrounded_diff;
            not_representable += !representable(dt, got);
        }
    }
    CHECK(max_unrounded_diff > 1e-4); /* the rounding of the inputs is visible */
    CHECK(not_representable > 0);     /* outputs are fp32, not rounded */

    /* Backward: gy = c. */
    CHECK_OK(NULL, nn_backward_grad(y, cv, NULL));
    const float *gx = nn_tensor_grad(x), *gw = nn_tensor_grad(w), *gb = nn_tensor_grad(b);
    double ulp = dt == ACCEL_BF16 ? 0x1p-8 : 0x1p-11;
    for (int o = 0; o < NO; o++) {
        for (int k = 0; k < K; k++) {
            double ref = 0;
            for (int r = 0; r < M; r++) {
                ref += (double)round_to(dt, cv[r * NO + o]) * round_to(dt, xv[r * K + k]);
            }
            float got = gw[o * K + k];
            CHECK(representable(dt, got));
            CHECK_MSG(fabs(got - ref) <= ulp * fabs(ref) + 1e-6, "gw %.9g vs %.9g", got, ref);
        }
        double refb = 0;
        for (int r = 0; r < M; r++) {
            refb += round_to(dt, cv[r * NO + o]);
        }
        CHECK(representable(dt, gb[o]));
        CHECK(fabs(gb[o] - refb) <= ulp * fabs(refb) + 1e-6);
    }
    for (int i = 0; i < M * K; i++) {
        CHECK(representable(dt, gx[i]));
    }
    nn_ctx_free(g);
}

/* Batched matmul and attention: gradients representable, results near fp32. */
static void check_matmul_attention(accel_dtype dt)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    nn_ctx_set_autocast(g, dt);
    enum { BB = 2, T = 8, C = 8 };
    float qv[BB * T * 3 * C];
    for (int i = 0; i < BB * T * 3 * C; i++) {
        qv[i] = frand();
    }
    nn_tensor *qkv =
        nn_tensor_requires_grad(nn_tensor_from(g, qv, 3, (int64_t[]){BB, T, 3 * C}), 1);
    nn_tensor *y = nn_causal_attention(g, qkv, 2, 0.0f);
    nn_tensor *a = nn_tensor_requires_grad(nn_tensor_from(g, qv, 3, (int64_t[]){BB, T, C}), 1);
    nn_tensor *bm = nn_tensor_requires_grad(nn_tensor_from(g, qv + 8, 3, (int64_t[]){BB, C, T}), 1);
    nn_tensor *z = nn_matmul(g, a, bm);
    nn_tensor *loss = nn_add(g, nn_sum_all(g, nn_mul(g, y, y)), nn_sum_all(g, nn_mul(g, z, z)));
    CHECK(loss != NULL);
    CHECK_OK(NULL, nn_backward(loss, 1.0f, NULL));
    const float *gq = nn_tensor_grad(qkv), *ga = nn_tensor_grad(a), *gbm = nn_tensor_grad(bm);
    for (int i = 0; i < BB * T * 3 * C; i++) {
        CHECK(representable(dt, gq[i]));
    }
    for (int i = 0; i < BB * T * C; i++) {
        CHECK(representable(dt, ga[i]) && representable(dt, gbm[i]));
    }
    /* The same forward in fp32 agrees to the dtype's precision. */
    nn_ctx *g2;
    CHECK_OK(NULL, nn_ctx_new(&g2));
    nn_ctx_set_autocast(g2, ACCEL_F32);
    nn_tensor *y2 =
        nn_causal_attention(g2, nn_tensor_from(g2, qv, 3, (int64_t[]){BB, T, 3 * C}), 2, 0.0f);
    double tol = dt == ACCEL_BF16 ? 3e-2 : 4e-3, maxd = 0;
    for (int i = 0; i < BB * T * C; i++) {
        double d = fabs(y->data[i] - y2->data[i]);
        maxd = d > maxd ? d : maxd;
    }
    CHECK_MSG(maxd <= tol && maxd > 0, "attention autocast vs fp32: %g", maxd);
    nn_ctx_free(g2);
    nn_ctx_free(g);
}

/* fp16: a gradient contribution past 65504 becomes inf, as in a real fp16 kernel. */
static void check_fp16_overflow(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    nn_ctx_set_autocast(g, ACCEL_F16);
    float xv[4] = {300, 300, 300, 300}, wv[4] = {1, 1, 1, 1}, c[1] = {300};
    nn_tensor *x = nn_tensor_from(g, xv, 2, (int64_t[]){1, 4});
    nn_tensor *w = nn_tensor_requires_grad(nn_tensor_from(g, wv, 2, (int64_t[]){1, 4}), 1);
    nn_tensor *y = nn_linear(g, x, w, NULL, NN_LAYOUT_OUT_IN);
    CHECK(y != NULL && y->data[0] == 1200.0f);
    CHECK_OK(NULL, nn_backward_grad(y, c, NULL));
    CHECK(isinf(nn_tensor_grad(w)[0])); /* 300 * 300 = 90000 > 65504 */
    nn_ctx_free(g);
}

/* AUTO follows the model's precision; accel_autocast_begin/end. */
static void check_auto(void)
{
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_BF16;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    nn_params *p;
    CHECK_OK(NULL, nn_params_for_model(&p, m));
    nn_linear_layer l;
    CHECK_OK(NULL, nn_linear_declare(&l, p, "fc", K, NO, 1, NN_LAYOUT_OUT_IN));
    CHECK_OK(NULL, nn_params_bind(p));
    CHECK_OK(NULL, nn_params_init(p, 5));
    CHECK_OK(acc, accel_prepare(acc, m));
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_F32);
    float xv[M * K];
    for (int i = 0; i < M * K; i++) {
        xv[i] = frand();
    }
    nn_tensor *x = nn_tensor_from(g, xv, 2, (int64_t[]){M, K});
    nn_tensor *y = nn_linear_forward(g, &l, x);
    CHECK(y != NULL);
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_BF16); /* learned from the model's parameters */
    /* The forward read the working copy (stored in bf16): same as rounding the master weights. */
    const accel_tensor *cv = &accel_model_param(m, 0)->compute_view;
    CHECK(cv->dtype == ACCEL_BF16 && cv->data != NULL);
    float wc[NO * K];
    CHECK_OK(NULL, accel_convert(wc, ACCEL_F32, cv->data, ACCEL_BF16, NO * K));
    for (int i = 0; i < NO * K; i++) {
        CHECK(wc[i] == round_to(ACCEL_BF16, l.weight->data[i]));
    }
    double ref = round_to(ACCEL_BF16, l.bias->data[0]);
    for (int k = 0; k < K; k++) {
        ref += (double)round_to(ACCEL_BF16, xv[k]) * wc[k];
    }
    CHECK(fabs(y->data[0] - ref) <= 1e-5 * (1 + fabs(ref)) + 1e-5);

    /* Local disable, nested enable, unbalanced end. */
    CHECK_OK(acc, accel_autocast_begin(acc, g, 0));
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_F32);
    CHECK_OK(acc, accel_autocast_begin(acc, g, 1));
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_BF16);
    CHECK_OK(acc, accel_autocast_end(acc, g));
    nn_tensor *y2 = nn_linear_forward(g, &l, x);
    double ref32 = l.bias->data[0];
    for (int k = 0; k < K; k++) {
        ref32 += (double)xv[k] * l.weight->data[k];
    }
    CHECK(fabs(y2->data[0] - ref32) <= 1e-5);
    CHECK_OK(acc, accel_autocast_end(acc, g));
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_BF16);
    CHECK(accel_autocast_end(acc, g) == ACCEL_ESTATE);
    nn_ctx_free(g);
    nn_params_free(p);
    accel_free(acc);

    /* Without mixed precision, begin(enabled) changes nothing. */
    o.mixed_precision = ACCEL_PRECISION_NO;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK_OK(NULL, nn_ctx_new(&g));
    CHECK_OK(acc, accel_autocast_begin(acc, g, 1));
    CHECK(nn_ctx_autocast_dtype(g) == ACCEL_F32);
    CHECK_OK(acc, accel_autocast_end(acc, g));
    nn_ctx_free(g);
    accel_free(acc);
}

/*
 * The model's bf16 working copy is widened into per-op scratch, not kept in the arena: a
 * linear layer over a model prepared in bf16 gives the same bits (output and gradients) as the
 * same layer over standalone parameters autocast to bf16 (rounded per use into the arena),
 * while its arena holds no copy of the weight; the per-op scratch held it (and backward's
 * rounding buffers) and is one block reused by every later step.
 */
static void check_scratch(void)
{
    enum { IN = 256, OUT = 192, ROWS = 8 };
    size_t wbytes = (size_t)IN * OUT * sizeof(float);
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_BF16;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    nn_params *pm, *ps;
    CHECK_OK(NULL, nn_params_for_model(&pm, m));
    CHECK_OK(NULL, nn_params_new(&ps, NULL));
    nn_linear_layer lm, ls;
    CHECK_OK(NULL, nn_linear_declare(&lm, pm, "fc", IN, OUT, 1, NN_LAYOUT_OUT_IN));
    CHECK_OK(NULL, nn_linear_declare(&ls, ps, "fc", IN, OUT, 1, NN_LAYOUT_OUT_IN));
    CHECK_OK(NULL, nn_params_bind(pm));
    CHECK_OK(NULL, nn_params_bind(ps));
    CHECK_OK(NULL, nn_params_init(pm, 11));
    CHECK_OK(NULL, nn_params_init(ps, 11));
    CHECK_OK(acc, accel_prepare(acc, m));
    float xv[ROWS * IN];
    for (int i = 0; i < ROWS * IN; i++) {
        xv[i] = frand();
    }
    nn_ctx *gm, *gs;
    CHECK_OK(NULL, nn_ctx_new(&gm));
    CHECK_OK(NULL, nn_ctx_new(&gs));
    nn_ctx_set_autocast(gs, ACCEL_BF16);
    nn_ctx_stats sm, ss, sm_prev = {0};
    for (int step = 0; step < 3; step++) {
        nn_tensor *ym =
            nn_linear_forward(gm, &lm, nn_tensor_from(gm, xv, 2, (int64_t[]){ROWS, IN}));
        nn_tensor *ys =
            nn_linear_forward(gs, &ls, nn_tensor_from(gs, xv, 2, (int64_t[]){ROWS, IN}));
        CHECK(ym != NULL && ys != NULL && nn_ctx_autocast_dtype(gm) == ACCEL_BF16);
        CHECK(memcmp(ym->data, ys->data, sizeof(float) * ROWS * OUT) == 0);
        nn_params_zero_grad(pm);
        nn_params_zero_grad(ps);
        CHECK_OK(NULL, nn_backward(nn_sum_all(gm, ym), 1.0f, NULL));
        CHECK_OK(NULL, nn_backward(nn_sum_all(gs, ys), 1.0f, NULL));
        CHECK(memcmp(lm.weight->grad, ls.weight->grad, wbytes) == 0);
        CHECK(memcmp(lm.bias->grad, ls.bias->grad, sizeof(float) * OUT) == 0);
        sm = nn_ctx_get_stats(gm);
        ss = nn_ctx_get_stats(gs);
        /* From the third step on nothing grows (the arena coalesces at the second). */
        CHECK(step < 2 || (sm.scratch_nbytes == sm_prev.scratch_nbytes &&
                           sm.reserved_nbytes == sm_prev.reserved_nbytes));
        sm_prev = sm;
        nn_tensor *x = nn_tensor_from(gm, xv, 1, (int64_t[]){1}); /* resets both arenas */
        CHECK(x != NULL && nn_tensor_from(gs, xv, 1, (int64_t[]){1}) != NULL);
    }
    /* The standalone run's arena holds the rounded weight; the model run's does not. */
    CHECK_MSG(sm.used_nbytes + wbytes <= ss.used_nbytes, "arena %zu vs %zu", sm.used_nbytes,
              ss.used_nbytes);
    CHECK(sm.scratch_peak_nbytes >= wbytes && sm.scratch_nbytes == sm.scratch_peak_nbytes);
    nn_ctx_free(gm);
    nn_ctx_free(gs);
    nn_params_free(pm);
    nn_params_free(ps);
    accel_free(acc);
}

int main(void)
{
    unsetenv("ACCELERATE_MIXED_PRECISION");
    check_linear(ACCEL_BF16);
    check_linear(ACCEL_F16);
    check_matmul_attention(ACCEL_BF16);
    check_matmul_attention(ACCEL_F16);
    check_fp16_overflow();
    check_auto();
    check_scratch();
    return 0;
}
