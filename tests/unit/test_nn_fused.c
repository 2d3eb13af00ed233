/*
 * nn_linear_gelu_linear on the CPU is exactly nn_linear -> nn_gelu -> nn_linear: the output and
 * the gradient of every input (x, both weights, both biases) carry the same bits as the three
 * ops', for both GELU forms, both weight layouts, with and without biases, in fp32 and under
 * bf16 autocast. A GPT's MLP (nn_mlp_forward, which takes the fused op for GELU) gives the
 * same bits as the three ops too. The GPU's fused form (cuBLASLt epilogues) is compared with
 * this one in unit/test_nn_cuda. nn_add_layernorm is exactly nn_add -> nn_layernorm (its GPU
 * form, one kernel, is compared in unit/test_nn_cuda_shadow).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "check.h"

enum { N_IN = 5 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) * 0x1p-52 - 1.0);
}

typedef struct result {
    float *y, *grads[N_IN];
    int64_t ny, n[N_IN];
} result;

/* in: x [B, T, in], w1, w2, b1, b2; fused or the three ops; the output gradient gout. */
static result run(nn_ctx *g, int fused, float *const *data, const int64_t (*shapes)[3],
                  const int *ndims, int b1, int b2, nn_layout layout, int approximate, int autocast,
                  const float *gout)
{
    result r;
    memset(&r, 0, sizeof(r));
    nn_ctx_reset(g);
    nn_ctx_set_autocast(g, autocast);
    nn_tensor *in[N_IN];
    for (int k = 0; k < N_IN; k++) {
        in[k] = nn_tensor_requires_grad(nn_tensor_from(g, data[k], ndims[k], shapes[k]), 1);
        CHECK_MSG(in[k] != NULL, "%s", accel_last_error(NULL));
        r.n[k] = nn_numel(in[k]);
    }
    nn_tensor *bias1 = b1 ? in[3] : NULL, *bias2 = b2 ? in[4] : NULL, *y;
    if (fused) {
        y = nn_linear_gelu_linear(g, in[0], in[1], bias1, in[2], bias2, layout, approximate);
    } else {
        y = nn_linear(g, nn_gelu(g, nn_linear(g, in[0], in[1], bias1, layout), approximate), in[2],
                      bias2, layout);
    }
    CHECK_MSG(y != NULL, "%s", accel_last_error(NULL));
    r.ny = nn_numel(y);
    r.y = malloc((size_t)r.ny * sizeof(float));
    CHECK(r.y != NULL);
    memcpy(r.y, y->data, (size_t)r.ny * sizeof(float));
    if (gout != NULL) {
        CHECK_OK(NULL, nn_backward_grad(y, gout, NULL));
        for (int k = 0; k < N_IN; k++) {
            if ((k == 3 && !b1) || (k == 4 && !b2)) {
                continue;
            }
            r.grads[k] = malloc((size_t)r.n[k] * sizeof(float));
            CHECK(r.grads[k] != NULL);
            CHECK_OK(NULL, nn_tensor_grad_to_host(in[k], r.grads[k]));
        }
    }
    return r;
}

static void free_result(result *r)
{
    free(r->y);
    for (int k = 0; k < N_IN; k++) {
        free(r->grads[k]);
    }
}

static void same_bits(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        CHECK_MSG(memcmp(&a[i], &b[i], sizeof(float)) == 0, "%s[%lld]: fused %.9g, three ops %.9g",
                  what, (long long)i, (double)a[i], (double)b[i]);
    }
}

static void check_op(nn_ctx *g, nn_layout layout, int b1, int b2, int approximate, int autocast)
{
    int64_t in = 12, hid = 40, out = 9;
    int io = layout == NN_LAYOUT_IN_OUT;
    const int64_t shapes[N_IN][3] = {{2, 3, in},
                                     {io ? in : hid, io ? hid : in, 0},
                                     {io ? hid : out, io ? out : hid, 0},
                                     {hid, 0, 0},
                                     {out, 0, 0}};
    const int ndims[N_IN] = {3, 2, 2, 1, 1};
    float *data[N_IN];
    for (int k = 0; k < N_IN; k++) {
        int64_t n =
            shapes[k][0] * (ndims[k] > 1 ? shapes[k][1] : 1) * (ndims[k] > 2 ? shapes[k][2] : 1);
        data[k] = malloc((size_t)n * sizeof(float));
        CHECK(data[k] != NULL);
        for (int64_t i = 0; i < n; i++) {
            data[k][i] = 2.0f * frand();
        }
    }
    float gout[2 * 3 * 9];
    for (int i = 0; i < 2 * 3 * 9; i++) {
        gout[i] = frand();
    }
    result f = run(g, 1, data, shapes, ndims, b1, b2, layout, approximate, autocast, gout);
    result u = run(g, 0, data, shapes, ndims, b1, b2, layout, approximate, autocast, gout);
    CHECK(f.ny == u.ny && f.ny == 2 * 3 * out);
    same_bits("y", f.y, u.y, f.ny);
    static const char *const names[N_IN] = {"dx", "dw1", "dw2", "db1", "db2"};
    for (int k = 0; k < N_IN; k++) {
        CHECK((f.grads[k] == NULL) == (u.grads[k] == NULL));
        if (f.grads[k] != NULL) {
            same_bits(names[k], f.grads[k], u.grads[k], f.n[k]);
        }
    }
    printf("  %s, b1 %d b2 %d, %s GELU, %s: same bits\n", io ? "[in,out]" : "[out,in]", b1, b2,
           approximate ? "tanh" : "erf", autocast == ACCEL_BF16 ? "bf16 autocast" : "fp32");
    free_result(&f);
    free_result(&u);
    for (int k = 0; k < N_IN; k++) {
        free(data[k]);
    }
}

/* nn_mlp_forward (fused for GELU) against the three ops on the layer's own tensors. */
static void check_mlp(nn_ctx *g)
{
    nn_params *p;
    CHECK_OK(NULL, nn_params_new(&p, NULL));
    nn_mlp_layer l;
    CHECK_OK(NULL, nn_mlp_declare(&l, p, "mlp", 16, 64, 16, NN_ACT_GELU_TANH, NN_LAYOUT_IN_OUT,
                                  NULL, NULL));
    CHECK_OK(NULL, nn_params_bind(p));
    CHECK_OK(NULL, nn_params_init(p, 7));
    float xs[4 * 16], y0[4 * 16], y1[4 * 16];
    for (int i = 0; i < 4 * 16; i++) {
        xs[i] = frand();
    }
    int64_t shape[2] = {4, 16};
    for (int fused = 0; fused < 2; fused++) {
        nn_ctx_reset(g);
        nn_tensor *x = nn_tensor_from(g, xs, 2, shape);
        nn_tensor *y =
            fused ? nn_mlp_forward(g, &l, x)
                  : nn_linear_forward(g, &l.proj, nn_gelu(g, nn_linear_forward(g, &l.fc, x), 1));
        CHECK_MSG(y != NULL, "%s", accel_last_error(NULL));
        memcpy(fused ? y1 : y0, y->data, sizeof(y0));
    }
    same_bits("mlp y", y1, y0, 4 * 16);
    printf("  nn_mlp_forward (gelu_new): same bits as the three ops\n");
    nn_params_free(p);
}

/* nn_add_layernorm against nn_add + nn_layernorm: the LayerNorm's output, the sum, and the
 * gradients of the two addends and of LayerNorm's weight and bias, through both outputs. */
static void check_add_layernorm(nn_ctx *g)
{
    enum { R = 6, C = 20 };
    float xs[R * C], rs[R * C], ws[C], bs[C], gout[R * C], out[2][5][R * C];
    for (int i = 0; i < R * C; i++) {
        xs[i] = 2.0f * frand();
        rs[i] = frand();
        gout[i] = frand();
    }
    for (int i = 0; i < C; i++) {
        ws[i] = 1.0f + 0.2f * frand();
        bs[i] = 0.2f * frand();
    }
    int64_t shape[2] = {R, C}, cshape[1] = {C};
    for (int fused = 0; fused < 2; fused++) {
        nn_ctx_reset(g);
        nn_tensor *x = nn_tensor_requires_grad(nn_tensor_from(g, xs, 2, shape), 1);
        nn_tensor *r = nn_tensor_requires_grad(nn_tensor_from(g, rs, 2, shape), 1);
        nn_tensor *w = nn_tensor_requires_grad(nn_tensor_from(g, ws, 1, cshape), 1);
        nn_tensor *b = nn_tensor_requires_grad(nn_tensor_from(g, bs, 1, cshape), 1);
        nn_tensor *sum = NULL, *y;
        if (fused) {
            y = nn_add_layernorm(g, x, r, w, b, 1e-5f, &sum);
        } else {
            sum = nn_add(g, x, r);
            y = nn_layernorm(g, sum, w, b, 1e-5f);
        }
        CHECK_MSG(y != NULL && sum != NULL, "%s", accel_last_error(NULL));
        memcpy(out[fused][0], y->data, sizeof(out[0][0]));
        memcpy(out[fused][1], sum->data, sizeof(out[0][0]));
        nn_tensor *z = nn_add(g, y, nn_gelu(g, sum, 1));
        CHECK_OK(NULL, nn_backward_grad(z, gout, NULL));
        CHECK_OK(NULL, nn_tensor_grad_to_host(x, out[fused][2]));
        CHECK_OK(NULL, nn_tensor_grad_to_host(r, out[fused][3]));
        CHECK_OK(NULL, nn_tensor_grad_to_host(w, out[fused][4]));
        CHECK_OK(NULL, nn_tensor_grad_to_host(b, out[fused][4] + C));
    }
    static const char *const names[5] = {"add_layernorm y", "sum", "dx", "dr", "dw | db"};
    for (int k = 0; k < 5; k++) {
        same_bits(names[k], out[1][k], out[0][k], k == 4 ? 2 * C : R * C);
    }
    nn_tensor *none = NULL;
    CHECK(nn_add_layernorm(g, NULL, NULL, NULL, NULL, 1e-5f, NULL) == NULL);
    CHECK(accel_last_status(NULL) == ACCEL_EINVAL);
    CHECK(nn_add_layernorm(g, NULL, NULL, NULL, NULL, 1e-5f, &none) == NULL && none == NULL);
    printf("  nn_add_layernorm: same bits as nn_add + nn_layernorm\n");
}

int main(void)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    for (int layout = 0; layout < 2; layout++) {
        for (int bias = 0; bias < 3; bias++) {
            for (int approximate = 0; approximate < 2; approximate++) {
                check_op(g, (nn_layout)layout, bias != 1, bias != 2, approximate, ACCEL_F32);
            }
        }
        check_op(g, (nn_layout)layout, 1, 1, 1, ACCEL_BF16);
    }
    check_mlp(g);
    check_add_layernorm(g);
    nn_ctx_free(g);
    printf("test_nn_fused: ok\n");
    return 0;
}
