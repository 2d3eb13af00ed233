/* ACCEL_TEST_LABELS: gpu
 *
 * Activation recomputation (nn_checkpoint) on a GPU ctx: five segments, each back-propagated
 * plain and checkpointed on the GPU, give the same loss and the same gradients of the input and
 * of every weight the segment reads from outside (the reserved-gradient path): an MLP with
 * dropout (the output copied down on the device), a lone LayerNorm (the output already where
 * the copy would go), a small tensor first (the copy overlaps: through device scratch),
 * attention with dropout (the second run draws the same masks) and nn_linear_gelu_linear under
 * bf16 autocast (its hidden tensor and that tensor's gradient held in 2 bytes). The kernels use no
 * atomics, so the results should be bit-identical; the tolerance is 1e-6 of the largest element in
 * case cuBLASLt picks another algorithm for other operand addresses (each comparison prints its
 * worst difference). Exits 77 (skipped) where the build has no CUDA or no GPU can be used.
 * ACCEL_TEST_ON_CPU=1 runs the same comparisons on a CPU ctx (a check of the test itself).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/nn.h"
#include "check.h"

enum { B = 2, T = 16, C = 32, V = 16, H = 4, N_LEAF = 7 };

typedef struct seg {
    int mode;
    nn_tensor *w1, *b1, *w2, *c, *w3; /* the segment's weights, from outside it */
} seg;

static const char *const mode_name[] = {"mlp + dropout", "layernorm alone", "small tensor first",
                                        "attention + dropout", "fused mlp, bf16 autocast"};

static nn_tensor *seg_fn(nn_ctx *g, void *ctx, nn_tensor *x)
{
    seg *s = ctx;
    switch (s->mode) {
    case 0: {
        nn_tensor *h = nn_gelu(g, nn_linear(g, x, s->w1, s->b1, NN_LAYOUT_IN_OUT), 1);
        h = nn_dropout(g, nn_linear(g, h, s->w2, NULL, NN_LAYOUT_IN_OUT), 0.2f);
        return nn_add(g, x, h);
    }
    case 1:
        return nn_layernorm(g, x, NULL, NULL, 1e-5f);
    case 2:
        return nn_add(g, x, nn_gelu(g, s->c, 1));
    case 3:
        return nn_add(
            g, x, nn_causal_attention(g, nn_linear(g, x, s->w3, NULL, NN_LAYOUT_IN_OUT), H, 0.2f));
    default:
        /* cuBLASLt's GELU epilogues with the hidden tensor and its gradient in 2 bytes. */
        return nn_add(g, x,
                      nn_linear_gelu_linear(g, x, s->w1, s->b1, s->w2, NULL, NN_LAYOUT_IN_OUT, 1));
    }
}

static float *host_data[N_LEAF];
static const int64_t shapes[N_LEAF][3] = {{B, T, C}, {C, 4 * C, 0}, {4 * C, 0, 0}, {4 * C, C, 0},
                                          {C, 0, 0}, {C, 3 * C, 0}, {V, C, 0}};
static const int ndims[N_LEAF] = {3, 2, 1, 2, 1, 2, 2};

static int64_t numel_of(int k)
{
    int64_t n = 1;
    for (int d = 0; d < ndims[k]; d++) {
        n *= shapes[k][d];
    }
    return n;
}

/* loss = cross_entropy(seg(x) Wo); the loss and every leaf's gradient into out (host). */
static int run(int mode, int checkpoint, float *loss, float **grads)
{
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    const char *on_cpu = getenv("ACCEL_TEST_ON_CPU");
    accel_status st = on_cpu != NULL && strcmp(on_cpu, "1") == 0
                          ? ACCEL_OK
                          : nn_ctx_set_device(g, (accel_device){ACCEL_DEVICE_CUDA, 0});
    if (st == ACCEL_EUNSUPPORTED) {
        printf("SKIP: %s\n", accel_last_error(NULL));
        nn_ctx_free(g);
        return 77;
    }
    CHECK_OK(NULL, st);
    nn_ctx_set_seed(g, 11);
    nn_ctx_set_autocast(g, mode == 4 ? ACCEL_BF16 : ACCEL_F32);
    nn_tensor *leaf[N_LEAF];
    for (int k = 0; k < N_LEAF; k++) {
        leaf[k] = nn_tensor_requires_grad(nn_tensor_from(g, host_data[k], ndims[k], shapes[k]), 1);
        CHECK(leaf[k] != NULL);
    }
    seg s = {mode, leaf[1], leaf[2], leaf[3], leaf[4], leaf[5]};
    nn_tensor *y = checkpoint ? nn_checkpoint(g, seg_fn, &s, leaf[0]) : seg_fn(g, &s, leaf[0]);
    int32_t targets[B * T];
    for (int i = 0; i < B * T; i++) {
        targets[i] = (i * 7 + 3) % V;
    }
    nn_tensor *logits = nn_linear(g, y, leaf[6], NULL, NN_LAYOUT_OUT_IN);
    nn_tensor *l = nn_cross_entropy(g, logits, targets, NULL);
    CHECK_MSG(l != NULL, "%s: forward: %s", mode_name[mode], accel_last_error(NULL));
    CHECK_OK(NULL, nn_backward(l, 1.0f, NULL));
    *loss = nn_item(l);
    for (int k = 0; k < N_LEAF; k++) {
        /* leaves the segment does not read have no gradient */
        if (nn_tensor_grad(leaf[k]) == NULL) {
            memset(grads[k], 0, (size_t)numel_of(k) * sizeof(float));
        } else {
            CHECK_OK(NULL, nn_tensor_grad_to_host(leaf[k], grads[k]));
        }
    }
    nn_ctx_free(g);
    return 0;
}

int main(void)
{
    uint64_t s = 12345;
    float *grads[2][N_LEAF];
    for (int k = 0; k < N_LEAF; k++) {
        int64_t n = numel_of(k);
        host_data[k] = malloc((size_t)n * sizeof(float));
        grads[0][k] = malloc((size_t)n * sizeof(float));
        grads[1][k] = malloc((size_t)n * sizeof(float));
        CHECK(host_data[k] && grads[0][k] && grads[1][k]);
        for (int64_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            host_data[k][i] = ((float)(s % 2001) / 1000.0f - 1.0f) * (k == 0 ? 1.0f : 0.2f);
        }
    }
    int rc = 0;
    for (int mode = 0; mode < 5 && rc == 0; mode++) {
        float loss[2];
        for (int cp = 0; cp < 2 && rc == 0; cp++) {
            rc = run(mode, cp, &loss[cp], grads[cp]); /* 77: no GPU */
        }
        if (rc != 0) {
            break;
        }
        double worst = fabs((double)loss[0] - loss[1]) / fmax(1.0, fabs((double)loss[0]));
        int identical = memcmp(&loss[0], &loss[1], sizeof(float)) == 0;
        for (int k = 0; k < N_LEAF; k++) {
            int64_t n = numel_of(k);
            double big = 0.0, d = 0.0;
            for (int64_t i = 0; i < n; i++) {
                big = fmax(big, fabs((double)grads[0][k][i]));
                d = fmax(d, fabs((double)grads[0][k][i] - grads[1][k][i]));
            }
            worst = fmax(worst, big > 0 ? d / big : d);
            identical &= memcmp(grads[0][k], grads[1][k], (size_t)n * sizeof(float)) == 0;
        }
        printf("%s: loss %.6f plain, %.6f checkpointed; gradients %s (worst %.3g of the "
               "largest, <= 1e-6)\n",
               mode_name[mode], (double)loss[0], (double)loss[1],
               identical ? "bit-identical" : "differ", worst);
        CHECK_MSG(worst <= 1e-6, "%s: recomputation on the GPU differs", mode_name[mode]);
    }
    for (int k = 0; k < N_LEAF; k++) {
        free(host_data[k]);
        free(grads[0][k]);
        free(grads[1][k]);
    }
    if (rc == 0) {
        printf("ok\n");
    }
    return rc;
}
