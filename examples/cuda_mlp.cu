/*
 * cuda_mlp: a small classifier trained with hand-written CUDA kernels through accel's
 * llm.c-style API (accel_backward_begin / accel_grad_ready / accel_backward_end), AdamW and a
 * bf16 compute copy of the weights; and its CPU twin (--cpu), the same program computing the
 * same arithmetic with loops on the host, which the GPU run is compared against
 * (tests/gpu/test_cuda_mlp.sh).
 *
 *     build-cuda/examples/cuda_mlp                                     (1 process, GPU 0)
 *     build-cuda/accel launch --num_processes 2 build-cuda/examples/cuda_mlp
 *                              (2 processes; with one GPU they share it, gradients staged)
 *     build-cuda/examples/cuda_mlp --cpu                               (the CPU twin)
 *     build-cuda/examples/cuda_mlp --steps 100 --save ckpt             (then resume:)
 *     build-cuda/examples/cuda_mlp --steps 200 --resume ckpt
 *
 * Model: Linear(2, H) -> ReLU -> Linear(H, 3), cross entropy, on three noisy spirals in the
 * plane (1536 points, generated here in a fixed shuffled order). Each step takes a global
 * batch of B consecutive points (wrapping); process r of n computes on its B / n of them and
 * accel averages the gradients, so any process count follows the same trajectory. The forward pass
 * reads the weights' compute copy (bf16 unless --precision no), widening each weight as it is used;
 * gradients are accumulated in fp32 into accel's gradient buffer; accel clips them (norm 1) and
 * steps AdamW on the GPU. Every per-element formula below is one __host__ __device__ function used
 * by both the kernels and the CPU twin (softmax in double), and the library's kernels match
 * the CPU's bit for bit, so the two runs differ only where the all-reduce or the clipping
 * norm sum in another order.
 *
 * Options: --steps N (300), --hidden H (64), --batch B (64, global), --lr X (3e-3),
 * --precision no|bf16 (bf16), --log_every N (25), --cpu, --resume DIR (accel_load_state after
 * prepare, then train from the checkpoint's step to step N), --save DIR (accel_save_state after
 * the last step). Prints "step S loss L" every log_every steps (the mean over the global batch)
 * and "final loss L" (none when --resume loads a checkpoint at step N already: a conversion,
 * say GPU to CPU with --save). --help lists the options. Exits 77 when this process has no GPU
 * and --cpu was not given.
 * Checkpoints hold the same files on the GPU and on the CPU (accel copies the weights and the
 * optimizer state through pinned buffers), so a run saved on one resumes on the other.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>
#include <accel/cuda.h>

#include "args.h"

#define HD __host__ __device__
#define N_POINTS 1536
#define N_IN 2
#define N_CLASSES 3

/* A CUDA call or launch that must succeed. */
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- the data (host), the same on every process ---- */

static double uniform(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static void spirals(float *x, int *y, uint64_t seed)
{
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < N_POINTS; i++) {
        int k = i % N_CLASSES;
        double r = (i / N_CLASSES + 1.0) / (N_POINTS / N_CLASSES);
        double u1 = uniform(&seed), u2 = uniform(&seed);
        double noise = 0.15 * sqrt(-2.0 * log(u1 + 1e-12)) * cos(2.0 * pi * u2);
        double a = 4.0 * r + 2.0 * pi * k / N_CLASSES + noise;
        x[2 * i] = (float)(r * sin(a));
        x[2 * i + 1] = (float)(r * cos(a));
        y[i] = k;
    }
    for (int i = N_POINTS - 1; i > 0; i--) { /* one fixed shuffle: every batch is a mix */
        int j = (int)(uniform(&seed) * (i + 1));
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        int y0 = y[i];
        x[2 * i] = x[2 * j], x[2 * i + 1] = x[2 * j + 1], y[i] = y[j];
        x[2 * j] = x0, x[2 * j + 1] = x1, y[j] = y0;
    }
}

/* ---- the arithmetic, shared by the kernels and the CPU twin ---- */

/* The parameters as the step sees them: the compute copy (fp32 or bf16) and fp32 grads. */
struct Net {
    const void *w1, *b1, *w2, *b2; /* [H][2], [H], [3][H], [3] */
    float *gw1, *gb1, *gw2, *gb2;
    int bf16, hidden;
};

/* This process's part of the batch: row (base + i) % N_POINTS of the data, i < n. */
struct Batch {
    const float *x;
    const int *y;
    int base, n;
};

struct Scratch {
    float *hpre, *h, *probs, *dlogits, *dhpre, *loss; /* [n][H] x 2, [n][3] x 2, [n][H], [n] */
};

HD inline float weight(const void *w, int bf16, int i)
{
    if (!bf16) {
        return ((const float *)w)[i];
    }
    uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16; /* bf16 widens exactly */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

HD inline int row(const Batch &b, int i)
{
    return (b.base + i) % N_POINTS;
}

/* h_pre = b1 + W1 x, h = relu(h_pre), for sample i and unit k. */
HD inline void hidden_fwd(const Net &n, const Batch &b, const Scratch &s, int i, int k)
{
    const float *x = b.x + N_IN * row(b, i);
    float a = weight(n.b1, n.bf16, k);
    for (int d = 0; d < N_IN; d++) {
        a = a + weight(n.w1, n.bf16, k * N_IN + d) * x[d];
    }
    s.hpre[i * n.hidden + k] = a;
    s.h[i * n.hidden + k] = a > 0.0f ? a : 0.0f;
}

/* logits = b2 + W2 h, softmax (in double), and sample i's cross entropy. */
HD inline void output_fwd(const Net &n, const Batch &b, const Scratch &s, int i)
{
    float logit[N_CLASSES];
    float mx = -INFINITY;
    for (int c = 0; c < N_CLASSES; c++) {
        float l = weight(n.b2, n.bf16, c);
        for (int k = 0; k < n.hidden; k++) {
            l = l + weight(n.w2, n.bf16, c * n.hidden + k) * s.h[i * n.hidden + k];
        }
        logit[c] = l;
        mx = l > mx ? l : mx;
    }
    double z = 0;
    for (int c = 0; c < N_CLASSES; c++) {
        z += exp((double)logit[c] - (double)mx);
    }
    for (int c = 0; c < N_CLASSES; c++) {
        s.probs[i * N_CLASSES + c] = (float)(exp((double)logit[c] - (double)mx) / z);
    }
    int y = b.y[row(b, i)];
    s.loss[i] = (float)(log(z) + (double)mx - (double)logit[y]);
}

/* d loss / d logits, times the backward seed over the batch (gscale). */
HD inline void logits_bwd(const Batch &b, const Scratch &s, float gscale, int i, int c)
{
    float p = s.probs[i * N_CLASSES + c];
    s.dlogits[i * N_CLASSES + c] = (p - (b.y[row(b, i)] == c ? 1.0f : 0.0f)) * gscale;
}

/* gW2[c][k] += sum_i dlogits[i][c] h[i][k]; k == hidden: gb2[c]. */
HD inline void fc2_grad(const Net &n, const Batch &b, const Scratch &s, int c, int k)
{
    float acc = 0.0f;
    for (int i = 0; i < b.n; i++) {
        float in = k < n.hidden ? s.h[i * n.hidden + k] : 1.0f;
        acc = acc + s.dlogits[i * N_CLASSES + c] * in;
    }
    if (k < n.hidden) {
        n.gw2[c * n.hidden + k] += acc;
    } else {
        n.gb2[c] += acc;
    }
}

/* dh_pre[i][k] = relu'(h_pre) * sum_c dlogits[i][c] W2[c][k]. */
HD inline void hidden_bwd(const Net &n, const Scratch &s, int i, int k)
{
    float d = 0.0f;
    if (s.hpre[i * n.hidden + k] > 0.0f) {
        for (int c = 0; c < N_CLASSES; c++) {
            d = d + s.dlogits[i * N_CLASSES + c] * weight(n.w2, n.bf16, c * n.hidden + k);
        }
    }
    s.dhpre[i * n.hidden + k] = d;
}

/* gW1[k][d] += sum_i dh_pre[i][k] x[i][d]; d == N_IN: gb1[k]. */
HD inline void fc1_grad(const Net &n, const Batch &b, const Scratch &s, int k, int d)
{
    float acc = 0.0f;
    for (int i = 0; i < b.n; i++) {
        float in = d < N_IN ? b.x[N_IN * row(b, i) + d] : 1.0f;
        acc = acc + s.dhpre[i * n.hidden + k] * in;
    }
    if (d < N_IN) {
        n.gw1[k * N_IN + d] += acc;
    } else {
        n.gb1[k] += acc;
    }
}

/* ---- the kernels: one thread per output element ---- */

__global__ void k_hidden_fwd(Net n, Batch b, Scratch s)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < b.n * n.hidden) {
        hidden_fwd(n, b, s, t / n.hidden, t % n.hidden);
    }
}

__global__ void k_output_fwd(Net n, Batch b, Scratch s)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < b.n) {
        output_fwd(n, b, s, i);
    }
}

__global__ void k_logits_bwd(Batch b, Scratch s, float gscale)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < b.n * N_CLASSES) {
        logits_bwd(b, s, gscale, t / N_CLASSES, t % N_CLASSES);
    }
}

__global__ void k_fc2_grad(Net n, Batch b, Scratch s)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < N_CLASSES * (n.hidden + 1)) {
        fc2_grad(n, b, s, t / (n.hidden + 1), t % (n.hidden + 1));
    }
}

__global__ void k_hidden_bwd(Net n, Batch b, Scratch s)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < b.n * n.hidden) {
        hidden_bwd(n, s, t / n.hidden, t % n.hidden);
    }
}

__global__ void k_fc1_grad(Net n, Batch b, Scratch s)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n.hidden * (N_IN + 1)) {
        fc1_grad(n, b, s, t / (N_IN + 1), t % (N_IN + 1));
    }
}

static unsigned blocks(int n)
{
    return (unsigned)((n + 127) / 128);
}

#define LAUNCH(kernel, n, stream, ...)                                                             \
    do {                                                                                           \
        kernel<<<blocks(n), 128, 0, stream>>>(__VA_ARGS__);                                        \
        CUDA_CHECK(cudaGetLastError());                                                            \
    } while (0)

/* ---- one training step ---- */

enum { W1, B1, W2, B2, N_PARAMS }; /* registration order */

struct Run {
    accel *acc;
    accel_model *model;
    int gpu;
    cudaStream_t stream;
    Net net;
    Batch batch;
    Scratch s;
    float *loss_host; /* the batch's losses, read back on logging steps */
};

/* Forward, then backward through accel's protocol: each parameter is reported ready as soon
 * as the last kernel writing its gradient is queued, so its bucket's all-reduce can start
 * while the rest of backward runs. */
static void step(Run *r)
{
    Net &n = r->net;
    Batch &b = r->batch;
    Scratch &s = r->s;
    int nh = b.n * n.hidden, nc = b.n * N_CLASSES, H = n.hidden;
    if (r->gpu) {
        LAUNCH(k_hidden_fwd, nh, r->stream, n, b, s);
        LAUNCH(k_output_fwd, b.n, r->stream, n, b, s);
    } else {
        for (int t = 0; t < nh; t++) {
            hidden_fwd(n, b, s, t / H, t % H);
        }
        for (int i = 0; i < b.n; i++) {
            output_fwd(n, b, s, i);
        }
    }
    /* The seed: 1 / gradient_accumulation_steps (times the loss scale under fp16); the
     * loss is this process's mean, and accel averages over processes. */
    double seed = accel_backward_begin(r->acc);
    float gscale = (float)(seed / b.n);
    if (r->gpu) {
        LAUNCH(k_logits_bwd, nc, r->stream, b, s, gscale);
        LAUNCH(k_fc2_grad, N_CLASSES * (H + 1), r->stream, n, b, s);
    } else {
        for (int t = 0; t < nc; t++) {
            logits_bwd(b, s, gscale, t / N_CLASSES, t % N_CLASSES);
        }
        for (int t = 0; t < N_CLASSES * (H + 1); t++) {
            fc2_grad(n, b, s, t / (H + 1), t % (H + 1));
        }
    }
    ACCEL_CHECK(accel_grad_ready(r->model, W2));
    ACCEL_CHECK(accel_grad_ready(r->model, B2));
    if (r->gpu) {
        LAUNCH(k_hidden_bwd, nh, r->stream, n, b, s);
        LAUNCH(k_fc1_grad, H * (N_IN + 1), r->stream, n, b, s);
    } else {
        for (int t = 0; t < nh; t++) {
            hidden_bwd(n, s, t / H, t % H);
        }
        for (int t = 0; t < H * (N_IN + 1); t++) {
            fc1_grad(n, b, s, t / (N_IN + 1), t % (N_IN + 1));
        }
    }
    ACCEL_CHECK(accel_grad_ready(r->model, W1));
    ACCEL_CHECK(accel_grad_ready(r->model, B1));
    ACCEL_CHECK(accel_backward_end(r->acc));
}

/* The mean loss over the global batch (a collective). */
static double global_loss(Run *r, int global_batch)
{
    const float *l = r->s.loss;
    if (r->gpu) {
        CUDA_CHECK(cudaMemcpyAsync(r->loss_host, r->s.loss, r->batch.n * sizeof(float),
                                   cudaMemcpyDeviceToHost, r->stream));
        CUDA_CHECK(cudaStreamSynchronize(r->stream));
        l = r->loss_host;
    }
    double sum = 0;
    for (int i = 0; i < r->batch.n; i++) {
        sum += l[i];
    }
    ACCEL_CHECK(accel_allreduce(r->acc, &sum, &sum, 1, ACCEL_F64, ACCEL_SUM, NULL));
    return sum / global_batch;
}

/* ---- setup ---- */

static void *alloc_on(int gpu, size_t nbytes)
{
    void *p = NULL;
    if (gpu) {
        CUDA_CHECK(cudaMalloc(&p, nbytes));
    } else if ((p = calloc(1, nbytes)) == NULL) {
        fprintf(stderr, "cuda_mlp: out of memory\n");
        exit(1);
    }
    return p;
}

static void *copy_to(int gpu, const void *src, size_t nbytes)
{
    void *p = alloc_on(gpu, nbytes);
    if (gpu) {
        CUDA_CHECK(cudaMemcpy(p, src, nbytes, cudaMemcpyHostToDevice));
    } else {
        memcpy(p, src, nbytes);
    }
    return p;
}

static void free_on(int gpu, void *p)
{
    if (gpu) {
        CUDA_CHECK(cudaFree(p));
    } else {
        free(p);
    }
}

/* PyTorch's Linear init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a fixed generator, written
 * into the master weights wherever they live. */
static void init_weights(Run *r, uint64_t seed)
{
    static const int fan_in[N_PARAMS] = {N_IN, N_IN, 0, 0};
    for (int i = 0; i < N_PARAMS; i++) {
        const accel_param *p = accel_model_param(r->model, i);
        ACCEL_CHECK(p ? ACCEL_OK : accel_last_status(r->acc));
        int fi = fan_in[i] ? fan_in[i] : r->net.hidden;
        float *w = (float *)malloc(p->numel * sizeof(float));
        uint64_t s = seed + (uint64_t)i;
        for (size_t j = 0; j < p->numel; j++) {
            w[j] = (float)((2.0 * uniform(&s) - 1.0) / sqrt((double)fi));
        }
        if (r->gpu) {
            CUDA_CHECK(
                cudaMemcpy(p->data_view.data, w, p->numel * sizeof(float), cudaMemcpyHostToDevice));
        } else {
            memcpy(p->data, w, p->numel * sizeof(float));
        }
        free(w);
    }
}

static const char usage[] =
    "usage: cuda_mlp [--steps N] [--hidden H] [--batch B] [--lr X] [--precision no|bf16]\n"
    "                [--log_every N] [--cpu] [--resume DIR] [--save DIR]\n"
    "  --steps N          train until step N (default 300)\n"
    "  --hidden H         hidden width, up to 4096 (default 64)\n"
    "  --batch B          global batch, a multiple of the processes, up to 65536 (default 64)\n"
    "  --lr X             AdamW's learning rate (default 3e-3)\n"
    "  --precision P      the compute copy: no (fp32) or bf16 (default)\n"
    "  --log_every N      steps between loss lines (default 25)\n"
    "  --cpu              the CPU twin instead of the GPU\n"
    "  --resume DIR       load the checkpoint DIR, then train from its step to --steps\n"
    "  --save DIR         save the training state to DIR after the last step\n";

int main(int argc, char **argv)
{
    int steps = 300, hidden = 64, batch = 64, log_every = 25, cpu = 0, bf16 = 1;
    double lr = 3e-3;
    const char *resume = NULL, *save = NULL, *precision = "bf16";
    const arg_opt opts[] = {
        {"--steps", ARG_INT, &steps, 1, INT_MAX},
        {"--hidden", ARG_INT, &hidden, 1, 4096},
        {"--batch", ARG_INT, &batch, 1, 65536},
        {"--lr", ARG_REAL, &lr, 1e-9, 10},
        {"--log_every", ARG_INT, &log_every, 1, INT_MAX},
        {"--cpu", ARG_SWITCH, &cpu, 0, 0},
        {"--resume", ARG_STR, &resume, 0, 0},
        {"--save", ARG_STR, &save, 0, 0},
        {"--precision", ARG_STR, &precision, 0, 0},
    };
    int status = args_parse("cuda_mlp", usage, opts, 9, argc, argv);
    if (status != ARGS_GO_ON) {
        return status;
    }
    if (strcmp(precision, "no") != 0 && strcmp(precision, "bf16") != 0) {
        return args_fail("cuda_mlp", usage, "--precision must be no or bf16, not %s", precision);
    }
    bf16 = strcmp(precision, "bf16") == 0;
    /* The state is saved after the whole run: a folder it cannot write is named now. */
    if (save != NULL && args_check_dir("cuda_mlp", "--save", save) != 0) {
        return 1;
    }

    accel_options o = accel_options_default();
    o.mixed_precision = bf16 ? ACCEL_PRECISION_BF16 : ACCEL_PRECISION_NO;
    o.cpu = cpu;
    Run r;
    memset(&r, 0, sizeof(r));
    ACCEL_CHECK(accel_init(&r.acc, &o));
    r.gpu = accel_device_of(r.acc).type == ACCEL_DEVICE_CUDA;
    if (!cpu && !r.gpu) {
        fprintf(stderr,
                "cuda_mlp: no CUDA GPU for this process (it runs on %s); --cpu runs the "
                "CPU twin\n",
                accel_device_name(r.acc));
        accel_free(r.acc);
        return 77;
    }
    int n_procs = accel_num_processes(r.acc), rank = accel_process_index(r.acc);
    if (batch % n_procs != 0) {
        fprintf(stderr, "cuda_mlp: --batch %d is not a multiple of the %d processes\n", batch,
                n_procs);
        accel_free(r.acc);
        return 2;
    }
    r.stream = r.gpu ? accel_cuda_stream(r.acc) : NULL;
    accel_print(r.acc, "cuda_mlp: %d process(es) on %s, %s compute copy, hidden %d, batch %d\n",
                n_procs, r.gpu ? "CUDA" : "the CPU", bf16 ? "bf16" : "fp32", hidden, batch);

    /* The model: registered in forward order; accel lays it out for backward. */
    ACCEL_CHECK(accel_model_new(r.acc, &r.model));
    const int64_t shapes[N_PARAMS][2] = {
        {hidden, N_IN}, {hidden, 0}, {N_CLASSES, hidden}, {N_CLASSES, 0}};
    const char *names[N_PARAMS] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    for (int i = 0; i < N_PARAMS; i++) {
        ACCEL_CHECK(
            accel_model_add_param(r.model, names[i], shapes[i][1] ? 2 : 1, shapes[i], NULL));
    }
    ACCEL_CHECK(accel_model_alloc(r.model));
    r.net.hidden = hidden;
    init_weights(&r, 1234);
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = lr;
    accel_optimizer *opt = accel_adamw(r.acc, r.model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(r.acc));
    ACCEL_CHECK(accel_prepare(r.acc, r.model, opt));

    /* Views of the compute copy and the gradients: device pointers on a GPU. Valid from
     * prepare on, refreshed in place after every step. */
    const void **w[N_PARAMS] = {&r.net.w1, &r.net.b1, &r.net.w2, &r.net.b2};
    float **g[N_PARAMS] = {&r.net.gw1, &r.net.gb1, &r.net.gw2, &r.net.gb2};
    for (int i = 0; i < N_PARAMS; i++) {
        const accel_param *p = accel_model_param(r.model, i);
        *w[i] = p->compute_view.data;
        *g[i] = (float *)p->grad_view.data;
        r.net.bf16 = p->compute_view.dtype == ACCEL_BF16;
    }

    static float x[N_IN * N_POINTS];
    static int y[N_POINTS];
    spirals(x, y, 42);
    int local = batch / n_procs;
    r.batch.x = (const float *)copy_to(r.gpu, x, sizeof(x));
    r.batch.y = (const int *)copy_to(r.gpu, y, sizeof(y));
    r.batch.n = local;
    size_t nh = (size_t)local * hidden * sizeof(float), nc = (size_t)local * N_CLASSES * 4;
    r.s.hpre = (float *)alloc_on(r.gpu, nh);
    r.s.h = (float *)alloc_on(r.gpu, nh);
    r.s.dhpre = (float *)alloc_on(r.gpu, nh);
    r.s.probs = (float *)alloc_on(r.gpu, nc);
    r.s.dlogits = (float *)alloc_on(r.gpu, nc);
    r.s.loss = (float *)alloc_on(r.gpu, (size_t)local * sizeof(float));
    r.loss_host = (float *)alloc_on(0, (size_t)local * sizeof(float));

    /* Resuming: weights, AdamW's moments and step, wherever the checkpoint was written; the
     * data position follows from the step. */
    int first = 0;
    if (resume != NULL) {
        ACCEL_CHECK(accel_load_state(r.acc, resume));
        first = (int)accel_optimizer_num_steps(opt);
        accel_print(r.acc, "resumed from %s at step %d\n", resume, first);
    }

    double loss = 0;
    for (int t = first; t < steps; t++) {
        r.batch.base = (int)(((long long)t * batch + (long long)rank * local) % N_POINTS);
        ACCEL_CHECK(accel_accumulate(r.acc, r.model));
        step(&r);
        ACCEL_CHECK(accel_clip_grad_norm(r.acc, r.model, 1.0, 2.0, NULL));
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        if (t % log_every == 0 || t == steps - 1) {
            loss = global_loss(&r, batch); /* the loss of the weights before this step */
            accel_print(r.acc, "step %d loss %.6f\n", t, loss);
        }
    }
    if (first < steps) {
        accel_print(r.acc, "final loss %.6f\n", loss);
    } else { /* loaded at --steps or beyond: no step taken, no loss computed */
        accel_print(r.acc, "no step to take: the checkpoint is at step %d, --steps %d\n", first,
                    steps);
    }
    if (save != NULL) {
        ACCEL_CHECK(accel_save_state(r.acc, save));
        accel_print(r.acc, "saved %s\n", save);
    }

    free_on(r.gpu, (void *)r.batch.x);
    free_on(r.gpu, (void *)r.batch.y);
    float *bufs[] = {r.s.hpre, r.s.h, r.s.dhpre, r.s.probs, r.s.dlogits, r.s.loss};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        free_on(r.gpu, bufs[i]);
    }
    free(r.loss_host);
    accel_free(r.acc);
    return 0;
}
