/*
 * cuda_attn: nn's causal attention kernels alone on a GPU (issue 15), at GPT-2 124M's shape by
 * default (one layer: B 32, H 12, T 1024, head 64, bf16 autocast): the tensor-core kernels
 * (src/nn/cuda/attn_tc.cu; also with the forward off its register fast path, as
 * ACCEL_NN_ATTN_FAST=0 runs it) against the warp-per-row ones (nn_kernels.cu), forward and
 * backward, called through nn's kernel launchers on random packed qkv and output gradients.
 *
 *     build-cuda/bench/cuda_attn [--batch 32 --heads 12 --context 1024 --head 64]
 *                                [--iters 5] [--dtype bf16|fp16]
 *
 * Each direction is timed over --iters calls after one untimed call, each synchronised; the
 * median call is reported in ms and in TFLOP/s of the causal products (forward 4 B H hd
 * T (T + 1) / 2: S and P V; backward 2.5 times that: S recomputed, dP, dV, dK, dQ, the usual
 * FlashAttention count; the dK/dV kernel's second S is not counted). Then the two kernels'
 * outputs are compared (relative L2 error of y and of the qkv gradient), so a kernel that is
 * fast but wrong at this shape shows here too; with and without their register paths (the
 * third row, ACCEL_NN_ATTN_FAST=0) they must agree within 2e-3 (tests/unit/test_nn_cuda_attn.c).
 * Then the backward from 2-byte copies of qkv and dy (as the step runs it): attn_tc_bwd.cu's
 * kernels, and the one that runs by default (attn_tc_bwd2.cu's at head 64 in bf16), within 2e-3.
 * Prints a table, then a summary row for bench/cuda_all.sh. Exits 77 when there is no GPU, 1 when
 * the kernels disagree by more than 1e-2 (the tolerance of tests/unit/test_nn_cuda.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cuda_bench.h"
#include "nn/cuda/nn_kernels.h"

__device__ static float hash_uniform(uint64_t seed, uint64_t i) /* [-1, 1) */
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1p-23f - 1.0f;
}

__global__ void k_init(float *x, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = scale * hash_uniform(seed, i);
    }
}

/* The buffers of one layer's attention. */
typedef struct bufs {
    float *qkv, *y, *lse, *gy, *D, *gqkv;
} bufs;

/* Median ms of `iters` calls of one direction (after one untimed call), each synchronised:
 * the host clock times the GPU's work (a launch costs microseconds, a call milliseconds). */
static float time_dir(const nn_cu_attn *a, const bufs *b, int backward, int iters)
{
    double ms[64];
    for (int i = -1; i < iters; i++) {
        CUDA_CHECK(cudaDeviceSynchronize());
        double t0 = bench_now();
        if (backward) {
            CUDA_CHECK(nn_cu_attn_bwd(0, a, b->qkv, b->y, b->lse, b->gy, b->D, b->gqkv, 1));
        } else {
            CUDA_CHECK(nn_cu_attn_fwd(0, a, b->qkv, b->y, b->lse));
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        if (i >= 0) {
            ms[i] = 1e3 * (bench_now() - t0);
        }
    }
    return (float)bench_median(ms, iters);
}

/* The forward as nn_causal_attention runs it under bf16 autocast, median ms of `iters` calls
 * each: ms[0] the forward writing qkv's 2-byte copy itself (nn_cu_attn_fwd_tc_half; 0 where it
 * does not apply), ms[1] the copy's own pass (nn_cu_to_half), ms[2] the forward reading that
 * copy (qkv_h): ms[0] against ms[1] + ms[2] is what writing the copy in the forward saves. */
static void time_fwd_copy(const nn_cu_attn *a0, const bufs *b, int iters, float ms[3])
{
    nn_cu_attn a = *a0;
    size_t n = (size_t)(a.B * a.T * 3 * a.C);
    void *h = NULL;
    CUDA_CHECK(cudaMalloc(&h, n * 2));
    for (int part = 0; part < 3; part++) {
        double t[64];
        ms[part] = 0.0f;
        for (int i = -1; i < iters; i++) {
            CUDA_CHECK(cudaDeviceSynchronize());
            double t0 = bench_now();
            cudaError_t err = cudaSuccess;
            a.qkv_h = part == 2 ? h : NULL;
            if (part == 0 && !nn_cu_attn_fwd_tc_half(0, &a, b->qkv, b->y, b->lse, h, &err)) {
                break;
            }
            CUDA_CHECK(part == 1   ? nn_cu_to_half(0, b->qkv, h, (int64_t)n, a.rnd)
                       : part == 2 ? nn_cu_attn_fwd(0, &a, b->qkv, b->y, b->lse)
                                   : err);
            CUDA_CHECK(cudaDeviceSynchronize());
            if (i >= 0) {
                t[i] = 1e3 * (bench_now() - t0);
            }
            if (i == iters - 1) {
                ms[part] = (float)bench_median(t, iters);
            }
        }
    }
    cudaFree(h);
}

static double rel_err(const float *out, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv)
{
    int B = 32, H = 12, T = 1024, hd = 64, iters = 5, rnd = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--batch") == 0) {
            B = v;
        } else if (strcmp(argv[i], "--heads") == 0) {
            H = v;
        } else if (strcmp(argv[i], "--context") == 0) {
            T = v;
        } else if (strcmp(argv[i], "--head") == 0) {
            hd = v;
        } else if (strcmp(argv[i], "--iters") == 0) {
            iters = v;
        } else if (strcmp(argv[i], "--dtype") == 0 &&
                   (strcmp(argv[i + 1], "bf16") == 0 || strcmp(argv[i + 1], "fp16") == 0)) {
            rnd = strcmp(argv[i + 1], "bf16") == 0 ? 1 : 2;
        } else {
            fprintf(stderr, "cuda_attn: unknown option %s %s\n", argv[i], argv[i + 1]);
            return 2;
        }
    }
    if (B < 1 || H < 1 || T < 1 || hd < 16 || hd % 16 != 0 || hd > 128 || iters < 1 || iters > 64) {
        fprintf(stderr, "cuda_attn: sizes positive, --head a multiple of 16 up to 128 (where "
                        "the tensor-core kernels apply), --iters 1 to 64\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "cuda_attn: skipped: no CUDA GPU\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    nn_cu_attn a;
    memset(&a, 0, sizeof(a));
    a.B = B, a.T = T, a.H = H, a.hd = hd, a.C = (int64_t)H * hd;
    a.scale = 1.0f / sqrtf((float)hd);
    a.rnd = rnd;
    size_t n_qkv = (size_t)B * T * 3 * a.C, n_y = (size_t)B * T * a.C, n_bht = (size_t)B * H * T;
    bufs b;
    CUDA_CHECK(cudaMalloc((void **)&b.qkv, n_qkv * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&b.gqkv, n_qkv * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&b.y, n_y * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&b.gy, n_y * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&b.lse, n_bht * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&b.D, n_bht * sizeof(float)));
    k_init<<<1024, 256>>>(b.qkv, n_qkv, 1, 1.5f);
    k_init<<<1024, 256>>>(b.gy, n_y, 2, 1.0f);
    CUDA_CHECK(cudaGetLastError());

    double fwd_flop = 4.0 * B * H * hd * (double)T * (T + 1) / 2.0, bwd_flop = 2.5 * fwd_flop;
    const char *names[3] = {"tensor cores", "warp", "tensor cores, no register paths"};
    const int kinds[3] = {NN_CU_ATTN_AUTO, NN_CU_ATTN_WARP, NN_CU_ATTN_TC_SLOW};
    float ms[3][2];
    float *y_host[3], *g_host[3];
    int bwd_mode = -1; /* the tensor-core backward's path (the first row's) */
    for (int k = 0; k < 3; k++) {
        nn_cu_attn_set_kernel(kinds[k]);
        ms[k][0] = time_dir(&a, &b, 0, iters);
        ms[k][1] = time_dir(&a, &b, 1, iters);
        if (k == 0) {
            bwd_mode = nn_cu_attn_bwd_mode();
        }
        y_host[k] = (float *)malloc(n_y * sizeof(float));
        g_host[k] = (float *)malloc(n_qkv * sizeof(float));
        if (y_host[k] == NULL || g_host[k] == NULL) {
            fprintf(stderr, "cuda_attn: out of host memory\n");
            return 1;
        }
        CUDA_CHECK(cudaMemcpy(y_host[k], b.y, n_y * sizeof(float), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(g_host[k], b.gqkv, n_qkv * sizeof(float), cudaMemcpyDeviceToHost));
    }
    nn_cu_attn_set_kernel(NN_CU_ATTN_AUTO);
    /* y and lse as the first row's backward read them (the last row's forward, without the
     * register paths, wrote its own, different in the last bits): the runs below compare
     * their gradients with that row's. */
    CUDA_CHECK(nn_cu_attn_fwd(0, &a, b.qkv, b.y, b.lse));
    /* The tensor-core backward from 2-byte copies of qkv and dy (nn_cu_attn's qkv_h, dy_h, as
     * the step makes them; not timed: the dy copy costs the step one pass, ~0.03 ms here on
     * an H200): the same gradient bit for bit, faster. */
    nn_cu_attn ah = a;
    void *qkv_h, *dy_h;
    CUDA_CHECK(cudaMalloc(&qkv_h, n_qkv * 2));
    CUDA_CHECK(cudaMalloc(&dy_h, n_y * 2));
    CUDA_CHECK(nn_cu_to_half(0, b.qkv, qkv_h, (int64_t)n_qkv, rnd));
    CUDA_CHECK(nn_cu_to_half(0, b.gy, dy_h, (int64_t)n_y, rnd));
    ah.qkv_h = qkv_h;
    ah.dy_h = dy_h;
    nn_cu_attn_bwd2_allow(0); /* attn_tc_bwd.cu's kernels from the copies; bwd2 below */
    float ms_h = time_dir(&ah, &b, 1, iters);
    int rows_h, block_h;
    nn_cu_attn_bwd_rows(&rows_h, &block_h);
    float *g_h = (float *)malloc(n_qkv * sizeof(float));
    if (g_h == NULL) {
        fprintf(stderr, "cuda_attn: out of host memory\n");
        return 1;
    }
    CUDA_CHECK(cudaMemcpy(g_h, b.gqkv, n_qkv * sizeof(float), cudaMemcpyDeviceToHost));
    int same_h = memcmp(g_h, g_host[0], n_qkv * sizeof(float)) == 0;
    /* The same at 32 rows a warp and 64 a block, and 16 and 64 (nn_cu_attn_bwd_set_rows; the
     * same gradient bit for bit). */
    float ms_h64[2];
    for (int k = 0; k < 2; k++) {
        nn_cu_attn_bwd_set_rows(k == 0 ? 32 : 16, 64);
        ms_h64[k] = time_dir(&ah, &b, 1, iters);
        CUDA_CHECK(cudaMemcpy(g_h, b.gqkv, n_qkv * sizeof(float), cudaMemcpyDeviceToHost));
        same_h = same_h && memcmp(g_h, g_host[0], n_qkv * sizeof(float)) == 0;
    }
    nn_cu_attn_bwd_set_rows(32, 128);
    /* attn_tc_bwd2.cu's backward (bf16 at head 64, from the copies, as the step runs it):
     * kernel 2 where it applies (nn_cu_attn_bwd_kernel), within 2e-3 of kernel 1. */
    nn_cu_attn_bwd2_allow(1);
    float ms_b2 = time_dir(&ah, &b, 1, iters);
    int kern_b2 = nn_cu_attn_bwd_kernel();
    CUDA_CHECK(cudaMemcpy(g_h, b.gqkv, n_qkv * sizeof(float), cudaMemcpyDeviceToHost));
    double eg_b2 = rel_err(g_h, g_host[0], n_qkv);
    unsigned long tc_fwd, tc_bwd;
    nn_cu_attn_tc_counts(&tc_fwd, &tc_bwd);
    double ey = rel_err(y_host[0], y_host[1], n_y), eg = rel_err(g_host[0], g_host[1], n_qkv);
    double ey_slow = rel_err(y_host[0], y_host[2], n_y);
    double eg_slow = rel_err(g_host[0], g_host[2], n_qkv);

    const char *dt = rnd == 1 ? "bf16" : "fp16";
    printf("cuda_attn: %s; B %d, H %d, T %d, head %d, %s autocast, median of %d calls\n", prop.name,
           B, H, T, hd, dt, iters);
    printf("| kernels | forward ms | TFLOP/s | backward ms | TFLOP/s |\n|---|---|---|---|---|\n");
    for (int k = 0; k < 3; k++) {
        printf("| %s | %.3f | %.1f | %.3f | %.1f |\n", names[k], ms[k][0],
               fwd_flop / (ms[k][0] * 1e9), ms[k][1], bwd_flop / (ms[k][1] * 1e9));
    }
    printf("speed-up of the tensor cores: forward %.1fx, backward %.1fx\n", ms[1][0] / ms[0][0],
           ms[1][1] / ms[0][1]);
    printf("tensor cores vs warp: y rel err %.3g, qkv gradient rel err %.3g (tolerance 1e-2); "
           "tensor-core forwards / backwards queued: %lu / %lu\n",
           ey, eg, tc_fwd, tc_bwd);
    printf("tensor cores with vs without their register paths: y rel err %.3g, qkv gradient rel "
           "err %.3g (tolerance 2e-3); forward %.2fx, backward %.2fx faster; backward path %d (0 "
           "scratch; 1 registers; 2 registers and A operands built in them)\n",
           ey_slow, eg_slow, ms[2][0] / ms[0][0], ms[2][1] / ms[0][1], bwd_mode);
    printf("tensor-core backward from 2-byte copies of qkv and dy: %.3f ms, %.1f TFLOP/s "
           "(%.2fx), %d rows a warp, %d a block; at 32 / 64 %.3f ms, at 16 / 64 %.3f ms; qkv "
           "gradients %s\n",
           ms_h, bwd_flop / (ms_h * 1e9), ms[0][1] / ms_h, rows_h, block_h, ms_h64[0], ms_h64[1],
           same_h ? "bit-identical" : "DIFFER from the fp32 tiles' (must be identical)");
    printf("backward that ran from the copies: kernel %d (2 attn_tc_bwd2.cu's, 1 attn_tc_bwd.cu's): "
           "%.3f ms, %.1f TFLOP/s (%.2fx kernel 1 from the copies); qkv gradient rel err vs "
           "kernel 1 %.3g (tolerance 2e-3)\n",
           kern_b2, ms_b2, bwd_flop / (ms_b2 * 1e9), ms_h / ms_b2, eg_b2);
    float mc[3];
    time_fwd_copy(&a, &b, iters, mc);
    printf("forward with qkv's 2-byte copy, as nn_causal_attention runs it: written by the "
           "forward %.3f ms (0: does not apply); else the copy's pass %.3f ms + the forward "
           "reading it %.3f ms\n",
           mc[0], mc[1], mc[2]);
    printf("| attention | B %d H %d T %d hd %d %s, one layer | forward %.3f ms, backward %.3f ms "
           "(%.1fx, %.1fx the warp kernels) | below the warp kernels |\n",
           B, H, T, hd, dt, ms[0][0], ms[0][1], ms[1][0] / ms[0][0], ms[1][1] / ms[0][1]);
    int bad = !(ey <= 1e-2 && eg <= 1e-2 && ey_slow <= 2e-3 && eg_slow <= 2e-3) || tc_fwd == 0 ||
              tc_bwd == 0 || !same_h || !(eg_b2 <= 2e-3);
    if (bad) {
        fprintf(stderr, "cuda_attn: the tensor-core kernels %s\n",
                tc_fwd == 0 || tc_bwd == 0 ? "did not run"
                                           : "disagree with the warp kernels beyond 1e-2, or "
                                             "with their register paths with those "
                                             "without beyond 2e-3");
    }
    for (int k = 0; k < 3; k++) {
        free(y_host[k]);
        free(g_host[k]);
    }
    free(g_h);
    cudaFree(qkv_h);
    cudaFree(dy_h);
    cudaFree(b.qkv);
    cudaFree(b.gqkv);
    cudaFree(b.y);
    cudaFree(b.gy);
    cudaFree(b.lse);
    cudaFree(b.D);
    return bad;
}
