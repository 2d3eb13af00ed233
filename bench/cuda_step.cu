/*
 * cuda_step: the cost of accel's gradient reducer on a GPU training step (issue 14's
 * benchmark). A synthetic model in the llm.c style: `layers` square Linear(H, H) layers with
 * ReLU, no bias, the bf16 compute copy of the weights in cuBLAS GEMMs (bf16 inputs, fp32
 * accumulation; weight gradients accumulated in fp32 into accel's gradient buffer), AdamW on
 * the GPU. Each parameter's gradient is reported ready (accel_grad_ready) as soon as its GEMM is
 * queued, so buckets leave while the rest of backward runs.
 *
 *     build-cuda/bench/cuda_step                                      (1 process)
 *     build-cuda/accel launch --num_processes 2 build-cuda/bench/cuda_step
 *                          (2 processes sharing the GPU: gradients staged through host memory)
 *
 * Two configurations of the same step, alternated over --rounds R (3) rounds of --steps N (10)
 * timed steps after --warmup W (3), each keeping its best round (the slowest process's time):
 *   no comm   inside accel_no_sync (the reducer does not communicate),
 *   reducer   the usual step: every bucket averaged over the processes.
 * overhead = reducer / no comm - 1 (target <= 2%). With one process the reducer has nothing to
 * send, so the figure is its bookkeeping alone. Defaults: --hidden 4096 --layers 6 (100.7 M
 * parameters) --batch 4096 (rows per process). Prints a table, then a summary row for
 * bench/cuda_all.sh. Exits 77 when this process has no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuda_bench.h"

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_);  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__device__ static float hash_uniform(uint64_t seed, uint64_t i) /* [-1, 1) */
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1p-23f - 1.0f;
}

__global__ void k_init_f32(float *w, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        w[i] = scale * hash_uniform(seed, i);
    }
}

__global__ void k_init_bf16(__nv_bfloat16 *x, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = __float2bfloat16(scale * hash_uniform(seed, i));
    }
}

__global__ void k_relu(__nv_bfloat16 *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = __bfloat162float(x[i]) > 0.0f ? x[i] : __float2bfloat16(0.0f);
    }
}

/* dy = relu'(y) * dy, where y is the layer's output after ReLU. */
__global__ void k_relu_bwd(__nv_bfloat16 *dy, const __nv_bfloat16 *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        dy[i] = __bfloat162float(y[i]) > 0.0f ? dy[i] : __float2bfloat16(0.0f);
    }
}

static const unsigned GRID = 1024, BLOCK = 256;

typedef struct bench {
    accel *acc;
    accel_model *model;
    accel_optimizer *opt;
    cublasHandle_t blas;
    cudaStream_t stream;
    int hidden, layers, batch;
    __nv_bfloat16 **x;      /* layers + 1 activations, [batch][hidden] each */
    __nv_bfloat16 *dtop;    /* the seed gradient of the output */
    __nv_bfloat16 *d[2];    /* ping-pong input gradients */
} bench;

/* C[m x n] = op(A) op(B) (column-major), bf16 inputs, fp32 accumulation; C is fp32 when
 * c_f32 (beta 1: accumulate) else bf16 (beta 0). */
static void gemm(bench *b, cublasOperation_t ta, cublasOperation_t tb, const void *A,
                 const void *B, void *C, int c_f32, int m, int n, int k)
{
    const float alpha = 1.0f, beta = c_f32 ? 1.0f : 0.0f;
    int lda = ta == CUBLAS_OP_N ? m : k, ldb = tb == CUBLAS_OP_N ? k : n;
    CUBLAS_CHECK(cublasGemmEx(b->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B,
                              CUDA_R_16BF, ldb, &beta, C, c_f32 ? CUDA_R_32F : CUDA_R_16BF, m,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void step(bench *b)
{
    const int H = b->hidden, B = b->batch;
    const size_t act = (size_t)H * B;
    ACCEL_CHECK(accel_accumulate(b->acc, b->model));
    for (int l = 0; l < b->layers; l++) { /* x[l+1] = relu(W_l x[l]) */
        const accel_param *p = accel_model_param(b->model, l);
        gemm(b, CUBLAS_OP_N, CUBLAS_OP_N, p->compute_view.data, b->x[l], b->x[l + 1], 0, H, B, H);
        k_relu<<<GRID, BLOCK, 0, b->stream>>>(b->x[l + 1], act);
    }
    (void)accel_backward_begin(b->acc); /* the seed is 1: no accumulation, no loss scale */
    CUDA_CHECK(cudaMemcpyAsync(b->d[0], b->dtop, act * sizeof(__nv_bfloat16),
                               cudaMemcpyDeviceToDevice, b->stream));
    int cur = 0;
    for (int l = b->layers - 1; l >= 0; l--) {
        const accel_param *p = accel_model_param(b->model, l);
        k_relu_bwd<<<GRID, BLOCK, 0, b->stream>>>(b->d[cur], b->x[l + 1], act);
        /* grad W_l += d x[l]^T (fp32), then the bucket holding it may leave */
        gemm(b, CUBLAS_OP_N, CUBLAS_OP_T, b->d[cur], b->x[l], p->grad_view.data, 1, H, H, B);
        ACCEL_CHECK(accel_grad_ready(b->model, l));
        if (l > 0) { /* d x[l] = W_l^T d */
            gemm(b, CUBLAS_OP_T, CUBLAS_OP_N, p->compute_view.data, b->d[cur], b->d[1 - cur], 0,
                 H, B, H);
            cur = 1 - cur;
        }
    }
    ACCEL_CHECK(accel_backward_end(b->acc));
    ACCEL_CHECK(accel_optimizer_step(b->opt));
    ACCEL_CHECK(accel_optimizer_zero_grad(b->opt));
}

/* Seconds per step, the slowest process's. */
static double time_steps(bench *b, int warmup, int steps)
{
    for (int i = 0; i < warmup; i++) {
        step(b);
    }
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    ACCEL_CHECK(accel_wait_for_everyone(b->acc));
    double t0 = bench_now();
    for (int i = 0; i < steps; i++) {
        step(b);
    }
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    double dt = (bench_now() - t0) / steps;
    ACCEL_CHECK(accel_allreduce(b->acc, &dt, &dt, 1, ACCEL_F64, ACCEL_MAX, NULL));
    return dt;
}

int main(int argc, char **argv)
{
    int hidden = 4096, layers = 6, batch = 4096, steps = 10, warmup = 3, rounds = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--hidden") == 0) {
            hidden = v;
        } else if (strcmp(argv[i], "--layers") == 0) {
            layers = v;
        } else if (strcmp(argv[i], "--batch") == 0) {
            batch = v;
        } else if (strcmp(argv[i], "--steps") == 0) {
            steps = v;
        } else if (strcmp(argv[i], "--warmup") == 0) {
            warmup = v;
        } else if (strcmp(argv[i], "--rounds") == 0) {
            rounds = v;
        } else {
            fprintf(stderr, "cuda_step: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (hidden < 1 || layers < 1 || batch < 1 || steps < 1 || warmup < 0 || rounds < 1) {
        fprintf(stderr, "cuda_step: sizes and counts must be positive\n");
        return 2;
    }
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_BF16;
    bench b;
    memset(&b, 0, sizeof(b));
    b.acc = bench_cuda_init("cuda_step", &o);
    b.hidden = hidden, b.layers = layers, b.batch = batch;
    b.stream = accel_cuda_stream(b.acc);
    const int n = accel_num_processes(b.acc), rank = accel_process_index(b.acc);

    ACCEL_CHECK(accel_model_new(b.acc, &b.model));
    for (int l = 0; l < layers; l++) {
        char name[32];
        snprintf(name, sizeof(name), "layers.%d.weight", l);
        const int64_t shape[2] = {hidden, hidden};
        ACCEL_CHECK(accel_model_add_param(b.model, name, 2, shape, NULL));
    }
    ACCEL_CHECK(accel_model_alloc(b.model));
    const size_t per_layer = (size_t)hidden * hidden;
    for (int l = 0; l < layers; l++) { /* U(-1, 1) / sqrt(fan_in) * sqrt(3): unit-ish activations */
        const accel_param *p = accel_model_param(b.model, l);
        k_init_f32<<<GRID, BLOCK, 0, b.stream>>>((float *)p->data_view.data, per_layer,
                                                 (uint64_t)l + 1, 1.7f / sqrtf((float)hidden));
    }
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(b.stream));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 1e-5;
    b.opt = accel_adamw(b.acc, b.model, &ao);
    ACCEL_CHECK(b.opt ? ACCEL_OK : accel_last_status(b.acc));
    ACCEL_CHECK(accel_prepare(b.acc, b.model, b.opt));
    if (accel_model_param(b.model, 0)->compute_view.dtype != ACCEL_BF16) {
        fprintf(stderr, "cuda_step: the compute copy is not bf16\n");
        return 1;
    }

    const size_t act = (size_t)hidden * batch;
    b.x = (__nv_bfloat16 **)calloc((size_t)layers + 1, sizeof(*b.x));
    for (int l = 0; l <= layers; l++) {
        CUDA_CHECK(cudaMalloc(&b.x[l], act * sizeof(__nv_bfloat16)));
    }
    CUDA_CHECK(cudaMalloc(&b.dtop, act * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&b.d[0], act * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&b.d[1], act * sizeof(__nv_bfloat16)));
    k_init_bf16<<<GRID, BLOCK, 0, b.stream>>>(b.x[0], act, 1000u + (uint64_t)rank, 1.0f);
    k_init_bf16<<<GRID, BLOCK, 0, b.stream>>>(b.dtop, act, 2000u + (uint64_t)rank,
                                              1.0f / (float)batch);
    CUDA_CHECK(cudaGetLastError());
    CUBLAS_CHECK(cublasCreate(&b.blas));
    CUBLAS_CHECK(cublasSetStream(b.blas, b.stream));

    double t_local = 1e30, t_sync = 1e30;
    for (int r = 0; r < rounds; r++) {
        ACCEL_CHECK(accel_no_sync_begin(b.acc, b.model));
        double t = time_steps(&b, warmup, steps);
        t_local = t < t_local ? t : t_local;
        ACCEL_CHECK(accel_no_sync_end(b.acc, b.model));
        t = time_steps(&b, warmup, steps);
        t_sync = t < t_sync ? t : t_sync;
    }

    const double params = (double)accel_model_numel(b.model);
    const double flops = 6.0 * params * batch; /* forward 2, backward 4 per weight and row */
    const double overhead = 100.0 * (t_sync / t_local - 1.0);
    char config[96];
    snprintf(config, sizeof(config), "%d process%s, %.1f M params, %s", n, n > 1 ? "es" : "",
             params / 1e6, n > 1 ? "staged" : "no peers");
    accel_print(b.acc,
                "cuda_step: %s; %d x Linear(%d, %d) + ReLU, %d rows/process, bf16 compute copy, "
                "AdamW, %d process%s, %d buckets, best of %d rounds x %d steps\n",
                bench_gpu_name(b.acc), layers, hidden, hidden, batch, n, n > 1 ? "es" : "",
                accel_model_num_buckets(b.model), rounds, steps);
    accel_print(b.acc, "  no comm   %9.3f ms/step  %7.1f TFLOP/s per process\n", t_local * 1e3,
                flops / t_local / 1e12);
    accel_print(b.acc, "  reducer   %9.3f ms/step  %7.1f TFLOP/s per process  overhead %+.2f%%\n",
                t_sync * 1e3, flops / t_sync / 1e12, overhead);
    if (n > 1) { /* the last step communicated: when its buckets left and came back */
        double first = 1e30, last = 0;
        for (int k = 0; k < accel_model_num_buckets(b.model); k++) {
            accel_bucket_info bi;
            ACCEL_CHECK(accel_model_bucket_info(b.model, k, &bi));
            if (bi.n_params > 0) {
                first = bi.launch_time < first ? bi.launch_time : first;
                last = bi.done_time > last ? bi.done_time : last;
            }
        }
        accel_print(b.acc, "  last step: first bucket launched to last bucket done %.3f ms\n",
                    (last - first) * 1e3);
    }
    accel_print(b.acc, "| training step, reducer vs no comm | %s | %.3f vs %.3f ms, %+.2f%% | <= 2%% |\n",
                config, t_sync * 1e3, t_local * 1e3, overhead);

    cublasDestroy(b.blas);
    for (int l = 0; l <= layers; l++) {
        CUDA_CHECK(cudaFree(b.x[l]));
    }
    free(b.x);
    CUDA_CHECK(cudaFree(b.dtop));
    CUDA_CHECK(cudaFree(b.d[0]));
    CUDA_CHECK(cudaFree(b.d[1]));
    accel_free(b.acc);
    return 0;
}
