/* ACCEL_TEST_LABELS: gpu
 *
 * nn_causal_attention on CUDA (src/nn/cuda/: the warp-per-row kernels, and the tensor-core
 * forward of attn_tc.cu and backward of attn_tc_bwd.cu under bf16 / fp16 autocast) against the
 * CPU op, through tests/nn_cuda_check.h (the output and the qkv gradient for a random output
 * gradient, NaN-poisoned GPU arena): fp32 1e-5 forward, 1e-4 gradients (each element is a
 * difference of row sums, which cancellation amplifies); bf16 / fp16 autocast 1e-2 (both sides
 * round the same operands, but a product's rounding to bf16 can fall either side of a tie on
 * the other device's sum). Shapes: partial and whole tiles, both tile shapes of each kernel
 * (head sizes up to 64 and up to 128, the smallest 16; several whole tiles before a partial
 * one, which the backward runs unmasked), fp16, one row (fp16 and bf16), the warp kernels'
 * cases (head 160, dropout, whose mask is the CPU's counter-based one), a gradient that adds up
 * over two attentions, and the tensor-core backward's scratch path (the other cases take its
 * register path) at both tile shapes. Then the tensor-core kernels against the warp kernels in
 * the same process, and the tensor-core backward from 2-byte copies of qkv and dy against it
 * from the fp32 tensors, bit for bit (below). Exits 77 (skipped) where the build has no CUDA or no
 * GPU can be used.
 */
#include "nn_cuda_check.h"

#ifdef ACCEL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "nn/cuda/nn_kernels.h" /* the launchers, for the 2-byte copy's test */
#endif

typedef struct attn_arg {
    int n_head;
    float p;
} attn_arg;

static nn_tensor *f_attention(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const attn_arg *a = arg;
    return nn_causal_attention(g, in[0], a->n_head, a->p);
}

/* Two attentions over the same qkv: the second backward adds to the first's gradient. */
static nn_tensor *f_attention_twice(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const attn_arg *a = arg;
    nn_tensor *y1 = nn_causal_attention(g, in[0], a->n_head, a->p);
    return nn_add(g, y1, nn_causal_attention(g, in[0], a->n_head, a->p));
}

static void test_attention(void)
{
    static const struct {
        const char *name;
        int64_t B, T, C;
        int H;
        float p;
        int autocast;
        double tol_fwd, tol_grad;
    } cases[] = {
        {"attention B2 T37 H3 hd16", 2, 37, 48, 3, 0.0f, ACCEL_F32, 1e-5, 1e-4},
        {"attention B1 T64 H2 hd64", 1, 64, 128, 2, 0.0f, ACCEL_F32, 1e-5, 1e-4},
        {"attention hd40 dropout 0.2", 2, 20, 80, 2, 0.2f, ACCEL_F32, 1e-5, 1e-4},
        /* Autocast without dropout, hd a multiple of 16 up to 128: the tensor-core forward
         * and backward (partial query and key tiles, whole tiles, both tile shapes, fp16, one
         * row); hd 160 and dropout: the warp kernels. */
        {"attention bf16 T37 H3 hd16", 2, 37, 48, 3, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T33 H4 hd32", 2, 33, 128, 4, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 B2 H3 T70 hd64", 2, 70, 192, 3, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T128 hd64", 1, 128, 128, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T130 hd32", 1, 130, 64, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 T90 hd128", 1, 90, 256, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        /* The forward's tile loads with a head narrower than the tile (hd 96 in the hd-128
         * shape); many key tiles per query tile (O rescaled on the later ones) and several
         * whole tiles before a partial one (the backward's unmasked element-wise path beside
         * its masked one), for both tile shapes. */
        {"attention bf16 T75 hd96", 1, 75, 192, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 B2 H2 T200 hd64", 2, 200, 128, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention fp16 T100 hd128", 1, 100, 256, 2, 0.0f, ACCEL_F16, 1e-2, 1e-2},
        {"attention fp16 T70 hd48", 2, 70, 96, 2, 0.0f, ACCEL_F16, 1e-2, 1e-2},
        {"attention bf16 T1 hd32", 1, 1, 64, 2, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        /* The last tensor-core case is fp16 (its backward's path is checked below). */
        {"attention fp16 T1 hd64", 2, 1, 128, 2, 0.0f, ACCEL_F16, 1e-2, 1e-2},
        {"attention bf16 T20 hd160 (warp)", 1, 20, 160, 1, 0.0f, ACCEL_BF16, 1e-2, 1e-2},
        {"attention bf16 dropout 0.1 (warp)", 2, 24, 64, 2, 0.1f, ACCEL_BF16, 1e-2, 1e-2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        in_spec s[1] = {{3, {cases[i].B, cases[i].T, 3 * cases[i].C}, 1.5f, 0.0f, 1}};
        attn_arg a = {cases[i].H, cases[i].p};
        check_case(cases[i].name, s, 1, f_attention, &a, cases[i].autocast, 0, cases[i].tol_fwd,
                   cases[i].tol_grad);
    }
#ifdef ACCEL_HAVE_CUDA
    int mode_f16 = nn_cu_attn_bwd_mode(); /* the last tensor-core case: fp16 T1 */
#endif
    in_spec s[1] = {{3, {1, 70, 3 * 128}, 1.5f, 0.0f, 1}};
    attn_arg a = {2, 0.0f};
    check_case("attention bf16 twice (grads add up)", s, 1, f_attention_twice, &a, ACCEL_BF16, 0,
               1e-2, 1e-2);
#ifdef ACCEL_HAVE_CUDA
    /* Which element-wise path the backward took: the register path, for bf16 with its A
     * operands in registers where the device's layouts allow (sm_80 on, and the emulator). */
    int mode_bf16 = nn_cu_attn_bwd_mode();
    printf("  tensor-core backward paths: bf16 %d, fp16 %d (2: A operands in registers)\n",
           mode_bf16, mode_f16);
    CHECK_MSG((mode_bf16 == 1 || mode_bf16 == 2) && mode_f16 == 1,
              "tensor-core backward path: bf16 %d (want 1 or 2), fp16 %d (want 1)", mode_bf16,
              mode_f16);
    /* The tensor-core backward's scratch path (ACCEL_NN_ATTN_FAST=0; the cases above take the
     * register path): masked, unmasked and partial tiles of both tile shapes, bf16 and fp16
     * (attn_tc_bwd2.cu's kernels, which would take the bf16 case, off). */
    nn_cu_attn_bwd_set_fast(0);
    nn_cu_attn_bwd2_allow(0);
    in_spec s2[1] = {{3, {2, 200, 3 * 128}, 1.5f, 0.0f, 1}};
    check_case("attention bf16 B2 H2 T200 hd64 (scratch path)", s2, 1, f_attention, &a, ACCEL_BF16,
               0, 1e-2, 1e-2);
    in_spec s3[1] = {{3, {1, 100, 3 * 256}, 1.5f, 0.0f, 1}};
    check_case("attention fp16 T100 hd128 (scratch path)", s3, 1, f_attention, &a, ACCEL_F16, 0,
               1e-2, 1e-2);
    CHECK_MSG(nn_cu_attn_bwd_mode() == 0 && nn_cu_attn_bwd_kernel() == 1,
              "the scratch path ran as path %d of kernel %d", nn_cu_attn_bwd_mode(),
              nn_cu_attn_bwd_kernel());
    nn_cu_attn_bwd_set_fast(1);
    nn_cu_attn_bwd2_allow(1);
#endif
}

#ifdef ACCEL_HAVE_CUDA

/* The attention forward, then the kernel its backward will take (arg: attn_kind_arg). */
typedef struct attn_kind_arg {
    attn_arg attn;
    int bwd_kind;
} attn_kind_arg;

static nn_tensor *f_attention_then(nn_ctx *g, nn_tensor **in, const void *arg)
{
    const attn_kind_arg *a = arg;
    nn_tensor *y = nn_causal_attention(g, in[0], a->attn.n_head, a->attn.p);
    nn_cu_attn_set_kernel(a->bwd_kind);
    return y;
}
#endif

/* The tensor-core kernels against the warp kernels on the same GPU and inputs, four runs:
 * both directions on tensor cores (tc), the tensor-core forward with the warp backward (mixed),
 * both warp (warp), and tc without its register paths (slow: NN_CU_ATTN_TC_SLOW, both
 * directions). The kernels' counters say which ran (results alone cannot: every sum is rounded
 * to bf16 / fp16, so the two kernels can agree bit for bit). tc and mixed share their forward
 * bit for bit, so their gradients differ only by the backward: dq, dk and dv within 2e-3 each
 * (both backwards round the same operands and sum in fp32; in the emulator they differ by
 * ~1e-4 in bf16, where the register path's exp2f rounds a P the other way; 2e-3 still fails a
 * 1% error in any one of them). tc and slow differ only where the register paths run (the
 * forward's: the sm_80+ fragment layout, a GPU's bf16 or the emulator's default build; the
 * backward's: wherever its probe allows; exp2f for expf, per-lane sums, so a P can round the
 * other way): forward and gradients within 2e-3. Otherwise 1e-2 as against the CPU. */
static void test_attention_kernels(void)
{
#ifdef ACCEL_HAVE_CUDA
    static const struct {
        const char *name;
        int64_t B, T, C;
        int H;
        int autocast;
    } cases[] = {
        {"bf16 B2 H3 T70 hd64", 2, 70, 192, 3, ACCEL_BF16},
        {"bf16 T128 hd64", 1, 128, 128, 2, ACCEL_BF16},
        {"bf16 T200 hd64", 1, 200, 128, 2, ACCEL_BF16},
        {"bf16 T90 hd128", 1, 90, 256, 2, ACCEL_BF16},
        {"fp16 T70 hd48", 1, 70, 96, 2, ACCEL_F16},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t B = cases[i].B, T = cases[i].T, C = cases[i].C, n = B * T * 3 * C;
        in_spec s[1] = {{3, {B, T, 3 * C}, 1.5f, 0.0f, 1}};
        attn_kind_arg tc_arg = {{cases[i].H, 0.0f}, 0}, mixed_arg = {{cases[i].H, 0.0f}, 1};
        attn_kind_arg slow_arg = {{cases[i].H, 0.0f}, 2};
        float *data[1] = {xmalloc((size_t)n * sizeof(float))};
        float *gout = xmalloc((size_t)(B * T * C) * sizeof(float));
        for (int64_t k = 0; k < n; k++) {
            data[0][k] = 1.5f * frand();
        }
        for (int64_t k = 0; k < B * T * C; k++) {
            gout[k] = frand();
        }
        int ac = cases[i].autocast;
        unsigned long f0, b0, f1, b1, f2, b2, f3, b3, f4, b4;
        nn_cu_attn_tc_counts(&f0, &b0);
        nn_cu_attn_set_kernel(0);
        run_out tc = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &tc_arg, gout, 0);
        nn_cu_attn_tc_counts(&f1, &b1);
        nn_cu_attn_set_kernel(0);
        run_out mixed = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &mixed_arg, gout, 0);
        nn_cu_attn_tc_counts(&f2, &b2);
        nn_cu_attn_set_kernel(1);
        run_out warp = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &mixed_arg, gout, 0);
        nn_cu_attn_tc_counts(&f3, &b3);
        nn_cu_attn_set_kernel(2);
        run_out slow = run_one(ggpu, 1, ac, s, 1, data, f_attention_then, &slow_arg, gout, 0);
        nn_cu_attn_tc_counts(&f4, &b4);
        nn_cu_attn_set_kernel(0);
        CHECK_MSG(f1 - f0 == 1 && b1 - b0 == 1 && f2 - f1 == 1 && b2 - b1 == 0 && f3 == f2 &&
                      b3 == b2 && f4 - f3 == 1 && b4 - b3 == 1,
                  "attention %s: tensor-core forwards / backwards queued per run: tc %lu / %lu "
                  "(want 1 / 1), mixed %lu / %lu (1 / 0), warp %lu / %lu (0 / 0), slow %lu / "
                  "%lu (1 / 1)",
                  cases[i].name, f1 - f0, b1 - b0, f2 - f1, b2 - b1, f3 - f2, b3 - b2, f4 - f3,
                  b4 - b3);
        double ey = rel_err(tc.y, warp.y, tc.ny), ey_mixed = rel_err(tc.y, mixed.y, tc.ny);
        double ey_slow = rel_err(tc.y, slow.y, tc.ny);
        double eg_slow = rel_err(tc.grads[0], slow.grads[0], n);
        double eb[3], eg = rel_err(tc.grads[0], warp.grads[0], n);
        for (int part = 0; part < 3; part++) { /* dq, dk, dv */
            eb[part] = rel_err_cols(tc.grads[0], mixed.grads[0], B * T, 3 * C, part * C, C);
        }
        printf("  attention %-19s tensor cores vs warp: forward %.3g, backward dq %.3g dk %.3g "
               "dv %.3g, both %.3g; with vs without register paths: y %.3g, gradient %.3g\n",
               cases[i].name, ey, eb[0], eb[1], eb[2], eg, ey_slow, eg_slow);
        CHECK_MSG(ey_mixed == 0.0, "attention %s: the same forward differs between runs (%g)",
                  cases[i].name, ey_mixed);
        CHECK_MSG(eb[0] <= 2e-3 && eb[1] <= 2e-3 && eb[2] <= 2e-3,
                  "attention %s: tensor-core backward vs warp backward (same forward): dq %g, "
                  "dk %g, dv %g > 2e-3",
                  cases[i].name, eb[0], eb[1], eb[2]);
        CHECK_MSG(ey_slow <= 2e-3 && eg_slow <= 2e-3,
                  "attention %s: tensor-core forward, fast path vs not: y %g, gradient %g > 2e-3",
                  cases[i].name, ey_slow, eg_slow);
        CHECK_MSG(ey <= 1e-2 && eg <= 1e-2,
                  "attention %s: tensor cores vs warp: forward %g, forward and backward %g",
                  cases[i].name, ey, eg);
        free_run(&tc, 1);
        free_run(&mixed, 1);
        free_run(&warp, 1);
        free_run(&slow, 1);
        free(gout);
        free(data[0]);
    }
#endif
}

#ifdef ACCEL_HAVE_CUDA
static void *dev_alloc(size_t nbytes)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, nbytes) == cudaSuccess);
    return p;
}

/* A backward's inputs on the device, for the tests that call the launchers directly: random
 * qkv and dy, their 2-byte copies (nn_cu_to_half), y and lse by the forward, room for D and
 * the gradient, and n_out host buffers of the gradient's size. */
typedef struct bwd_inputs {
    nn_cu_attn a;
    size_t n_qkv, n_y;
    float *qkv, *y, *gy, *lse, *D, *g;
    void *qh, *gh;
    float *out[5];
    int n_out;
} bwd_inputs;

static void bwd_inputs_init(bwd_inputs *d, int64_t B, int64_t T, int64_t H, int64_t hd, int rnd,
                            int n_out)
{
    memset(d, 0, sizeof(*d));
    nn_cu_attn *a = &d->a;
    a->B = B, a->T = T, a->H = H, a->hd = hd;
    a->C = H * hd;
    a->scale = 1.0f / sqrtf((float)hd);
    a->rnd = rnd;
    d->n_qkv = (size_t)(B * T * 3 * a->C), d->n_y = (size_t)(B * T * a->C);
    size_t n_bht = (size_t)(B * H * T);
    float *hq = xmalloc(d->n_qkv * sizeof(float)), *hg = xmalloc(d->n_y * sizeof(float));
    d->n_out = n_out;
    for (int k = 0; k < n_out; k++) {
        d->out[k] = xmalloc(d->n_qkv * sizeof(float));
    }
    for (size_t k = 0; k < d->n_qkv; k++) {
        hq[k] = 1.5f * frand();
    }
    for (size_t k = 0; k < d->n_y; k++) {
        hg[k] = frand();
    }
    d->qkv = dev_alloc(d->n_qkv * 4), d->y = dev_alloc(d->n_y * 4), d->gy = dev_alloc(d->n_y * 4);
    d->lse = dev_alloc(n_bht * 4), d->D = dev_alloc(n_bht * 4), d->g = dev_alloc(d->n_qkv * 4);
    d->qh = dev_alloc(d->n_qkv * 2), d->gh = dev_alloc(d->n_y * 2);
    CHECK(cudaMemcpy(d->qkv, hq, d->n_qkv * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(d->gy, hg, d->n_y * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(nn_cu_to_half(NULL, d->qkv, d->qh, (int64_t)d->n_qkv, rnd) == cudaSuccess);
    CHECK(nn_cu_to_half(NULL, d->gy, d->gh, (int64_t)d->n_y, rnd) == cudaSuccess);
    CHECK(nn_cu_attn_fwd(NULL, a, d->qkv, d->y, d->lse) == cudaSuccess);
    free(hq);
    free(hg);
}

static void bwd_inputs_free(bwd_inputs *d)
{
    void *bufs[8] = {d->qkv, d->y, d->gy, d->lse, d->D, d->g, d->qh, d->gh};
    for (int k = 0; k < 8; k++) {
        CHECK(cudaFree(bufs[k]) == cudaSuccess);
    }
    for (int k = 0; k < d->n_out; k++) {
        free(d->out[k]);
    }
}
#endif

/* The tensor-core backward reading the 2-byte copies of qkv and dy (nn_cu_attn's qkv_h, dy_h,
 * made by nn_cu_to_half) against it rounding the fp32 tiles itself (NULL copies), and with 32
 * rows a warp and 128 a block (the default on path 2 up to head size 64) against 32 and 64,
 * and 16 and 64, called directly on the same inputs: the same rounded values go into the same
 * products summed in the same order, so the gradients must agree bit for bit, written and
 * added (write 0) alike. Both tile shapes, a partial tile, bf16 and fp16 (the register path
 * with A operands in registers, and without). */
static void test_attention_bwd_copies(void)
{
#ifdef ACCEL_HAVE_CUDA
    static const struct {
        int64_t B, T, H, hd;
        int rnd;
    } cases[] = {{1, 130, 2, 64, 1}, {1, 90, 2, 128, 1}, {1, 70, 2, 48, 2}, {2, 37, 3, 16, 1}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bwd_inputs in;
        bwd_inputs_init(&in, cases[i].B, cases[i].T, cases[i].H, cases[i].hd, cases[i].rnd, 5);
        nn_cu_attn a = in.a;
        size_t n_qkv = in.n_qkv;
        float *qkv = in.qkv, *y = in.y, *gy = in.gy, *lse = in.lse, *D = in.D, *g = in.g;
        float **out = in.out;
        unsigned long f0, b0, f1, b1;
        nn_cu_attn_tc_counts(&f0, &b0);
        /* 0: fp32 tiles, written; 1: the copies, written; 2: the copies, added to run 1's;
         * 3: fp32 tiles, 16 rows a warp and 64 a block; 4: 32 and 64. attn_tc_bwd2.cu's
         * kernels (which would take the copies at head 64) are off here: test_attention_bwd2
         * compares them. */
        nn_cu_attn_bwd2_allow(0);
        static const int shape[5][2] = {{32, 128}, {32, 128}, {32, 128}, {16, 64}, {32, 64}};
        int got[5][2];
        for (int run = 0; run < 5; run++) {
            a.qkv_h = run == 1 || run == 2 ? in.qh : NULL;
            a.dy_h = a.qkv_h != NULL ? in.gh : NULL;
            nn_cu_attn_bwd_set_rows(shape[run][0], shape[run][1]);
            CHECK(nn_cu_attn_bwd(NULL, &a, qkv, y, lse, gy, D, g, run != 2) == cudaSuccess);
            nn_cu_attn_bwd_rows(&got[run][0], &got[run][1]);
            CHECK(cudaMemcpy(out[run], g, n_qkv * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
        }
        nn_cu_attn_bwd_set_rows(32, 128);
        nn_cu_attn_bwd2_allow(1);
        nn_cu_attn_tc_counts(&f1, &b1);
        size_t diff = 0, diff_add = 0, diff_16 = 0, diff_64 = 0;
        for (size_t k = 0; k < n_qkv; k++) {
            diff += memcmp(&out[0][k], &out[1][k], sizeof(float)) != 0;
            float twice = out[0][k] + out[0][k];
            diff_add += memcmp(&twice, &out[2][k], sizeof(float)) != 0;
            diff_16 += memcmp(&out[0][k], &out[3][k], sizeof(float)) != 0;
            diff_64 += memcmp(&out[0][k], &out[4][k], sizeof(float)) != 0;
        }
        printf("  attention backward %s B%lld T%lld hd%lld (path %d, rows a warp / block %d / %d): "
               "from 2-byte copies %zu and %zu (added), at %d / %d %zu, at %d / %d %zu, of %zu "
               "values differ\n",
               a.rnd == 1 ? "bf16" : "fp16", (long long)a.B, (long long)a.T, (long long)a.hd,
               nn_cu_attn_bwd_mode(), got[0][0], got[0][1], diff, diff_add, got[3][0], got[3][1],
               diff_16, got[4][0], got[4][1], diff_64, n_qkv);
        /* 32 rows a warp where path 2 runs at head sizes up to 64 (bf16 on sm_80 on, and the
         * emulator), 16 elsewhere and when asked. */
        int r2 = nn_cu_attn_bwd_mode() == 2 && a.hd <= 64;
        CHECK_MSG(b1 - b0 == 5 && diff == 0 && diff_add == 0 && diff_16 == 0 && diff_64 == 0,
                  "attention backward (case %zu): %lu tensor-core backwards (want 5), %zu / %zu / "
                  "%zu / %zu values differ (copies, added, 16 / 64 rows, 32 / 64 rows)",
                  i, b1 - b0, diff, diff_add, diff_16, diff_64);
        CHECK_MSG(!r2 || (got[0][0] == 32 && got[0][1] == 128 && got[3][0] == 16 &&
                          got[3][1] == 64 && got[4][0] == 32 && got[4][1] == 64),
                  "attention backward (case %zu): rows a warp / block %d / %d, %d / %d, %d / %d "
                  "(want 32 / 128, 16 / 64, 32 / 64)",
                  i, got[0][0], got[0][1], got[3][0], got[3][1], got[4][0], got[4][1]);
        bwd_inputs_free(&in);
    }
#endif
}

#ifdef ACCEL_HAVE_CUDA
/* Whether the WMMA fragments have the sm_80+ layouts (accel__nn_cu_attn_f2_layout's probe
 * answers yes): a GPU from sm_80 on, the emulator with per-lane fragments. *emu: the emulator. */
static int f2_layout_expected(int *emu)
{
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    int layout = prop.major >= 8;
    *emu = strstr(prop.name, "emulator") != NULL;
#ifndef ACCEL_CUEMU_WMMA_LANES
    if (*emu) {
        layout = 0; /* ACCEL_CUEMU_WMMA=whole */
    }
#endif
    return layout;
}

/* Whether the n bytes of 2-byte copy h (device) are exactly those nn_cu_to_half writes of the n
 * / 2 fp32 values at src (device): the copies the kernels write in their epilogues
 * (nn_cu_attn.y_h, gqkv_h) or their launchers' passes. */
static int half_copy_exact(const float *src, const void *h, size_t nh)
{
    void *ref = dev_alloc(nh);
    unsigned char *a = xmalloc(nh), *b = xmalloc(nh);
    CHECK(nn_cu_to_half(NULL, src, ref, (int64_t)(nh / 2), 1) == cudaSuccess);
    CHECK(cudaMemcpy(a, ref, nh, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(b, h, nh, cudaMemcpyDeviceToHost) == cudaSuccess);
    int same = memcmp(a, b, nh) == 0;
    CHECK(cudaFree(ref) == cudaSuccess);
    free(a);
    free(b);
    return same;
}

/* The backward of attn_tc_bwd2.cu (bf16, head 64, from the 2-byte copies; nn_cu_attn_bwd_kernel
 * 2) against attn_tc_bwd.cu's (nn_cu_attn_bwd2_allow(0); kernel 1) on the same inputs, called
 * directly, the gradient poisoned (0xFF) before each written run: within 2e-3 of the largest
 * value (the register paths' tolerance; only the exponential differs, ex2.approx on the GPU),
 * and bit for bit in the emulator (exp2f there, every sum in the same order). Written, then
 * added to its own result (write 0: twice the written values, bit for bit); without the copies
 * kernel 1 runs. Shapes: more (batch, head) pairs than a block group (32), T not a multiple of
 * the 64-row tiles with several tiles, one row, whole tiles. Every run also writes the
 * gradient's 2-byte copy (gqkv_h, poisoned before): kernel 2 in its epilogue when it writes
 * the gradient, else the launcher's pass; each byte as nn_cu_to_half of the fp32 gradient. */
static void test_attention_bwd2(void)
{
    int emu = 0, layout = f2_layout_expected(&emu);
    static const struct {
        int64_t B, T, H;
    } cases[] = {{3, 24, 12}, {1, 130, 2}, {1, 1, 2}, {2, 128, 1}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bwd_inputs in;
        bwd_inputs_init(&in, cases[i].B, cases[i].T, cases[i].H, 64, 1, 4);
        nn_cu_attn a = in.a;
        size_t n_qkv = in.n_qkv;
        float *qkv = in.qkv, *y = in.y, *gy = in.gy, *lse = in.lse, *D = in.D, *g = in.g;
        float **out = in.out;
        void *gc = dev_alloc(n_qkv * 2);
        /* 0: kernel 1 from the copies; 1: kernel 2, written; 2: kernel 2 added to run 1's;
         * 3: no copies (kernel 1). */
        int kern[4], copy[4];
        for (int run = 0; run < 4; run++) {
            a.qkv_h = run < 3 ? in.qh : NULL;
            a.dy_h = run < 3 ? in.gh : NULL;
            a.gqkv_h = gc;
            nn_cu_attn_bwd2_allow(run != 0);
            if (run != 2) {
                CHECK(cudaMemset(g, 0xFF, n_qkv * 4) == cudaSuccess);
            }
            CHECK(cudaMemset(gc, 0xFF, n_qkv * 2) == cudaSuccess);
            CHECK(nn_cu_attn_bwd(NULL, &a, qkv, y, lse, gy, D, g, run != 2) == cudaSuccess);
            CHECK(cudaDeviceSynchronize() == cudaSuccess);
            kern[run] = nn_cu_attn_bwd_kernel();
            copy[run] = half_copy_exact(g, gc, n_qkv * 2);
            CHECK(cudaMemcpy(out[run], g, n_qkv * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
        }
        nn_cu_attn_bwd2_allow(1);
        /* Per part (q, k, v) of each row: the largest difference over the largest value. */
        double worst = 0.0;
        size_t diff = 0, diff_add = 0, diff_null = 0;
        for (int part = 0; part < 3; part++) {
            double mx = 0.0, md = 0.0;
            for (size_t k = 0; k < n_qkv; k++) {
                if ((int64_t)(k % (size_t)(3 * a.C)) / a.C != part) {
                    continue;
                }
                double d = fabs((double)out[1][k] - (double)out[0][k]);
                mx = fmax(mx, fabs((double)out[0][k]));
                md = d == d ? fmax(md, d) : INFINITY; /* NaN: unwritten */
            }
            double rel = md / (mx > 0.0 ? mx : 1.0);
            worst = worst > rel ? worst : rel;
        }
        for (size_t k = 0; k < n_qkv; k++) {
            diff += memcmp(&out[0][k], &out[1][k], sizeof(float)) != 0;
            float twice = out[1][k] + out[1][k];
            diff_add += memcmp(&twice, &out[2][k], sizeof(float)) != 0;
            diff_null += memcmp(&out[0][k], &out[3][k], sizeof(float)) != 0;
        }
        int want = layout ? 2 : 1;
        printf("  attention backward bf16 B%lld T%lld H%lld hd64: kernel %d (want %d) vs kernel "
               "%d: %.3g of the largest, %zu of %zu values differ; added %zu differ; without "
               "copies kernel %d, %zu differ\n",
               (long long)a.B, (long long)a.T, (long long)a.H, kern[1], want, kern[0], worst, diff,
               n_qkv, diff_add, kern[3], diff_null);
        printf("  the gradient's 2-byte copy (kernels %d %d %d %d): %s\n", kern[0], kern[1],
               kern[2], kern[3],
               copy[0] && copy[1] && copy[2] && copy[3] ? "nn_cu_to_half's bytes" : "DIFFERS");
        CHECK_MSG(copy[0] && copy[1] && copy[2] && copy[3],
                  "attention backward 2 (case %zu): gradient copy differs (runs %d %d %d %d)", i,
                  copy[0], copy[1], copy[2], copy[3]);
        CHECK_MSG(kern[0] == 1 && kern[1] == want && kern[2] == want && kern[3] == 1 &&
                      worst <= 2e-3 && (!emu || diff == 0) && diff_add == 0 && diff_null == 0,
                  "attention backward 2 (case %zu): kernels %d %d %d %d, %.3g relative, %zu / "
                  "%zu / %zu values differ",
                  i, kern[0], kern[1], kern[2], kern[3], worst, diff, diff_add, diff_null);
        CHECK(cudaFree(gc) == cudaSuccess);
        bwd_inputs_free(&in);
    }
}

/* The tensor-core forward through its launcher on device buffers, with qkv's 2-byte copy
 * (qkv_h, as nn_causal_attention passes it) and without it (the kernel rounds the fp32
 * tiles): y and lse bit for bit the same, as the copy holds the same rounded values. bf16 at
 * head 64 takes the kernel of 32 query rows a warp (nn_cu_attn_fwd_mode 2) where the WMMA
 * layouts are sm_80+'s: here with more (batch, head) pairs than its block group of 32,
 * several query and key tiles, and one row; head 32 (and head 64 elsewhere) the kernel of 16
 * rows a warp (1), which reads fp32 either way. Then kernel 2 writing the copy itself
 * (nn_cu_attn_fwd_tc_half, as nn_causal_attention runs it): the same y and lse, and the same
 * bytes as nn_cu_to_half's copy over the whole of qkv (poisoned before). */
static void test_attention_half_copy(void)
{
    int emu = 0, layout = f2_layout_expected(&emu);
    static const struct {
        int64_t B, T, H, hd;
    } cases[] = {{3, 40, 12, 64}, {1, 200, 2, 64}, {1, 1, 2, 64}, {2, 70, 3, 32}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t B = cases[i].B, T = cases[i].T, H = cases[i].H, C = H * cases[i].hd;
        int64_t n = B * T * 3 * C, ny = B * T * C, nl = B * H * T;
        float *qkv = xmalloc((size_t)n * sizeof(float));
        float *y[2] = {xmalloc((size_t)ny * sizeof(float)), xmalloc((size_t)ny * sizeof(float))};
        float *l[2] = {xmalloc((size_t)nl * sizeof(float)), xmalloc((size_t)nl * sizeof(float))};
        for (int64_t k = 0; k < n; k++) {
            qkv[k] = 1.5f * frand();
        }
        void *d_qkv = NULL, *d_h = NULL, *d_y[2] = {NULL, NULL}, *d_l[2] = {NULL, NULL};
        CHECK(cudaMalloc(&d_qkv, (size_t)n * sizeof(float)) == cudaSuccess);
        CHECK(cudaMalloc(&d_h, (size_t)n * 2) == cudaSuccess);
        CHECK(cudaMemcpy(d_qkv, qkv, (size_t)n * sizeof(float), cudaMemcpyHostToDevice) ==
              cudaSuccess);
        CHECK(nn_cu_to_half(0, d_qkv, d_h, n, 1) == cudaSuccess);
        nn_cu_attn a;
        memset(&a, 0, sizeof a);
        a.B = B, a.T = T, a.C = C, a.H = H, a.hd = cases[i].hd;
        a.scale = 1.0f / sqrtf((float)a.hd);
        a.rnd = 1;
        int mode[2], ycopy[3] = {0, 0, 1};
        void *d_yh = dev_alloc((size_t)ny * 2);
        a.y_h = d_yh;
        for (int k = 0; k < 2; k++) {
            CHECK(cudaMalloc(&d_y[k], (size_t)ny * sizeof(float)) == cudaSuccess);
            CHECK(cudaMalloc(&d_l[k], (size_t)nl * sizeof(float)) == cudaSuccess);
            a.qkv_h = k ? d_h : NULL;
            CHECK(cudaMemset(d_yh, 0xFF, (size_t)ny * 2) == cudaSuccess);
            CHECK(nn_cu_attn_fwd(0, &a, d_qkv, d_y[k], d_l[k]) == cudaSuccess);
            mode[k] = nn_cu_attn_fwd_mode();
            ycopy[k] = half_copy_exact(d_y[k], d_yh, (size_t)ny * 2);
            CHECK(cudaMemcpy(y[k], d_y[k], (size_t)ny * sizeof(float), cudaMemcpyDeviceToHost) ==
                  cudaSuccess);
            CHECK(cudaMemcpy(l[k], d_l[k], (size_t)nl * sizeof(float), cudaMemcpyDeviceToHost) ==
                  cudaSuccess);
        }
        /* The forward that writes the copy itself (where kernel 2 runs): the same y and lse,
         * and every byte of the copy nn_cu_to_half wrote. */
        size_t nh = (size_t)n * 2;
        void *d_h2 = NULL;
        CHECK(cudaMalloc(&d_h2, nh) == cudaSuccess);
        CHECK(cudaMemset(d_h2, 0xFF, nh) == cudaSuccess);
        CHECK(cudaMemset(d_y[1], 0xFF, (size_t)ny * sizeof(float)) == cudaSuccess);
        CHECK(cudaMemset(d_l[1], 0xFF, (size_t)nl * sizeof(float)) == cudaSuccess);
        CHECK(cudaMemset(d_yh, 0xFF, (size_t)ny * 2) == cudaSuccess);
        a.qkv_h = NULL;
        cudaError_t err = cudaErrorUnknown;
        int wrote = nn_cu_attn_fwd_tc_half(0, &a, d_qkv, d_y[1], d_l[1], d_h2, &err);
        if (wrote) {
            ycopy[2] = half_copy_exact(d_y[1], d_yh, (size_t)ny * 2);
        }
        int same_h = 0, same_yl = 0;
        if (wrote) {
            unsigned char *h1 = xmalloc(nh), *h2 = xmalloc(nh);
            float *y3 = xmalloc((size_t)ny * sizeof(float)),
                  *l3 = xmalloc((size_t)nl * sizeof(float));
            CHECK(err == cudaSuccess);
            CHECK(cudaMemcpy(h1, d_h, nh, cudaMemcpyDeviceToHost) == cudaSuccess);
            CHECK(cudaMemcpy(h2, d_h2, nh, cudaMemcpyDeviceToHost) == cudaSuccess);
            CHECK(cudaMemcpy(y3, d_y[1], (size_t)ny * sizeof(float), cudaMemcpyDeviceToHost) ==
                  cudaSuccess);
            CHECK(cudaMemcpy(l3, d_l[1], (size_t)nl * sizeof(float), cudaMemcpyDeviceToHost) ==
                  cudaSuccess);
            same_h = memcmp(h1, h2, nh) == 0;
            same_yl = memcmp(y3, y[0], (size_t)ny * sizeof(float)) == 0 &&
                      memcmp(l3, l[0], (size_t)nl * sizeof(float)) == 0;
            free(h1);
            free(h2);
            free(y3);
            free(l3);
        }
        cudaFree(d_h2);
        int want = cases[i].hd == 64 && layout ? 2 : 1;
        printf("  attention bf16 B%lld T%lld H%lld hd%lld: the forward writing the copy: %s%s\n",
               (long long)B, (long long)T, (long long)H, (long long)cases[i].hd,
               wrote ? "ran" : "did not apply",
               wrote ? (same_h && same_yl ? ", copy, y and lse the same" : ", DIFFERS") : "");
        CHECK(wrote == (want == 2));
        CHECK(!wrote || (same_h && same_yl));
        printf("  attention bf16 B%lld T%lld H%lld hd%lld: forward kernel %d / %d (want %d), "
               "2-byte copy vs fp32: y %s, lse %s\n",
               (long long)B, (long long)T, (long long)H, (long long)cases[i].hd, mode[0], mode[1],
               want, memcmp(y[0], y[1], (size_t)ny * sizeof(float)) ? "differ" : "same",
               memcmp(l[0], l[1], (size_t)nl * sizeof(float)) ? "differ" : "same");
        printf("  y's 2-byte copy (forward kernel %d, from the copy, writing qkv's): %s\n",
               mode[0], ycopy[0] && ycopy[1] && ycopy[2] ? "nn_cu_to_half's bytes" : "DIFFERS");
        CHECK(ycopy[0] && ycopy[1] && ycopy[2]);
        CHECK(cudaFree(d_yh) == cudaSuccess);
        CHECK(mode[0] == want && mode[1] == want);
        CHECK(memcmp(y[0], y[1], (size_t)ny * sizeof(float)) == 0);
        CHECK(memcmp(l[0], l[1], (size_t)nl * sizeof(float)) == 0);
        for (int k = 0; k < 2; k++) {
            cudaFree(d_y[k]);
            cudaFree(d_l[k]);
            free(y[k]);
            free(l[k]);
        }
        cudaFree(d_h);
        cudaFree(d_qkv);
        free(qkv);
    }
}
#endif

int main(void)
{
    if (nn_cuda_check_init("test_nn_cuda_attn") != 0) {
        return 77;
    }
    test_attention();
    test_attention_kernels();
    test_attention_bwd_copies();
#ifdef ACCEL_HAVE_CUDA
    test_attention_half_copy();
    test_attention_bwd2();
#endif
    nn_cuda_check_done("test_nn_cuda_attn");
    return 0;
}
