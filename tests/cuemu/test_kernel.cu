/*
 * The emulator's kernel scheduler (tests/cuemu/kernel.cc), tested with kernels of its own in
 * CUDA syntax (this file goes through scripts/cuemu-launch.sed like every .cu): block
 * reductions with __syncthreads and warp shuffles, every shuffle mode and width, votes, 2D
 * blocks, dynamic shared memory (past 48 KiB only as cudaFuncSetAttribute allows), grid-stride
 * loops, atomics, launch errors, host pointers given to a kernel; in child processes (this program
 * run again with a mode argument): a missing barrier that ACCEL_CUEMU_ORDER=reverse exposes, and
 * the launches that must abort with a message naming the kernel, block and threads: a barrier an
 * exited thread never reaches, a divergent barrier, a warp deadlock, a fiber stack overflow.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

static int g_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_failures++;                                                                          \
        }                                                                                          \
    } while (0)

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- kernels ---- */

__device__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

/* Per block: the sum of its elements (warp shuffles, then the warps' sums through shared
 * memory), written by thread 0. */
__global__ void k_block_sum(const float *x, int n, float *out)
{
    __shared__ float sh[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = warp_sum(i < n ? x[i] : 0.0f);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    if (lane == 0) {
        sh[w] = v;
    }
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? sh[lane] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = v;
    }
}

/* out[8 * t + k]: broadcast of lane 3, down by 1 (width 32), up by 2 (width 16), xor 5 (width 8),
 * a down-reduction's lane-0 total, a ballot, any, all. */
__global__ void k_shuffles(int *out)
{
    int t = threadIdx.x, lane = t % 32;
    int *o = out + 8 * t;
    o[0] = __shfl_sync(0xffffffffu, 100 + lane, 3);
    o[1] = __shfl_down_sync(0xffffffffu, lane, 1);
    o[2] = __shfl_up_sync(0xffffffffu, lane, 2, 16);
    o[3] = __shfl_xor_sync(0xffffffffu, lane, 5, 8);
    int s = lane;
    for (int d = 16; d > 0; d /= 2) {
        s += __shfl_down_sync(0xffffffffu, s, d);
    }
    o[4] = s;
    o[5] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[6] = __any_sync(0xffffffffu, lane == 7);
    o[7] = __all_sync(0xffffffffu, lane < 31);
}

/* Lanes 16..31 exit; 0..15 shuffle with the full mask (CUDA waits for live lanes only). */
__global__ void k_half_warp(double *out)
{
    int lane = threadIdx.x;
    if (lane >= 16) {
        return;
    }
    double v = lane;
    for (int o = 8; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    out[lane] = v;
}

/* A 32 x 32 tile transposed through shared memory by a dim3(32, 32) block. */
__global__ void k_transpose(const int *in, int *out, int n)
{
    __shared__ int tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    if (x < n && y < n) {
        tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    }
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x;
    y = blockIdx.x * 32 + threadIdx.y;
    if (x < n && y < n) {
        out[y * n + x] = tile[threadIdx.x][threadIdx.y];
    }
}

/* Each block reverses its slice through dynamic shared memory; out2 gets what a slot held before
 * the block wrote it (0xFF bytes: a NaN). */
__global__ void k_reverse_dyn(const float *in, float *out, float *out2)
{
    extern __shared__ float dyn[];
    int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    out2[base + t] = dyn[t];
    __syncthreads();
    dyn[t] = in[base + t];
    __syncthreads();
    out[base + t] = dyn[blockDim.x - 1 - t];
}

__global__ void k_axpb(const float *x, float *y, size_t n, float a, float b)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        y[i] = a * x[i] + b;
    }
}

__global__ void k_atomics(unsigned *count, int *max, float *sum)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1u);
    atomicMax(max, g);
    atomicAdd(sum, 0.5f);
}

/* __syncthreads_count / _and / _or over a block of 100. */
__global__ void k_block_votes(int *out)
{
    int t = threadIdx.x;
    int c = __syncthreads_count(t % 4 == 0);
    int a = __syncthreads_and(t < 100);
    int o = __syncthreads_or(t == 57);
    int z = __syncthreads_or(0);
    if (t == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
        out[3] = z;
    }
}

/* Reads its neighbour's shared slot: with the barrier right in both orders; without it the
 * result depends on which thread ran first (a real race on a GPU). */
__global__ void k_neighbour(int *out, int with_barrier)
{
    __shared__ int sh[64];
    int t = threadIdx.x;
    sh[t] = 1000 * blockIdx.x + t;
    if (with_barrier) {
        __syncthreads();
    }
    out[blockIdx.x * 64 + t] = sh[(t + 1) % 64];
}

/* Thread 5 of block 1 leaves before a barrier the others wait at. */
__global__ void k_deadlock(int *out)
{
    if (blockIdx.x == 1 && threadIdx.x == 5) {
        return;
    }
    __syncthreads();
    out[threadIdx.x] = 1;
}

/* Half the block at one barrier, half at another. */
__global__ void k_divergent(int *out)
{
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

/* Lane 0 shuffles with the whole warp while the others wait at the block's barrier. */
__global__ void k_warp_deadlock(int *out)
{
    int v = (int)threadIdx.x;
    if (threadIdx.x == 0) {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    }
    __syncthreads();
    out[threadIdx.x] = v;
}

/* 40 KB of locals: more than a 16 KiB fiber stack. */
__global__ void k_big_locals(int *out)
{
    volatile char buf[40000];
    for (int i = 0; i < (int)sizeof buf; i++) {
        buf[i] = (char)i;
    }
    out[threadIdx.x] = buf[threadIdx.x];
}

__global__ void k_touch(int *p)
{
    p[threadIdx.x] = 7;
}

/* ---- host side ---- */

template <class T> static T *dev_alloc(size_t count)
{
    void *p = nullptr;
    CUDA_OK(cudaMalloc(&p, count * sizeof(T)));
    return static_cast<T *>(p);
}

template <class T> static void to_host(T *dst, const T *src, size_t count)
{
    CUDA_OK(cudaMemcpy(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost));
}

template <class T> static void to_dev(T *dst, const T *src, size_t count)
{
    CUDA_OK(cudaMemcpy(dst, src, count * sizeof(T), cudaMemcpyHostToDevice));
}

static void test_block_sum(void)
{
    const int n = 1000, threads = 256, blocks = (n + threads - 1) / threads;
    float h[n], sums[blocks];
    for (int i = 0; i < n; i++) {
        h[i] = (float)i;
    }
    float *x = dev_alloc<float>(n), *out = dev_alloc<float>(blocks);
    to_dev(x, h, n);
    k_block_sum<<<blocks, threads>>>(x, n, out);
    CUDA_OK(cudaGetLastError());
    to_host(sums, out, blocks);
    for (int b = 0; b < blocks; b++) {
        double want = 0;
        for (int i = b * threads; i < n && i < (b + 1) * threads; i++) {
            want += i;
        }
        CHECK(sums[b] == (float)want, "block %d: %g, want %g", b, (double)sums[b], want);
    }
    cudaFree(x);
    cudaFree(out);
}

static void test_shuffles(void)
{
    const int n = 64; /* two warps */
    int h[8 * n];
    int *out = dev_alloc<int>(8 * n);
    k_shuffles<<<1, n>>>(out);
    CUDA_OK(cudaGetLastError());
    to_host(h, out, 8 * n);
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3) {
        ballot |= 1u << l;
    }
    for (int t = 0; t < n; t++) {
        int lane = t % 32, seg = lane & ~15, *o = h + 8 * t;
        CHECK(o[0] == 103, "thread %d: broadcast %d", t, o[0]);
        CHECK(o[1] == (lane < 31 ? lane + 1 : lane), "thread %d: down %d", t, o[1]);
        CHECK(o[2] == (lane - seg >= 2 ? lane - 2 : lane), "thread %d: up %d", t, o[2]);
        CHECK(o[3] == (lane ^ 5), "thread %d: xor %d", t, o[3]);
        if (lane == 0) {
            CHECK(o[4] == 31 * 32 / 2, "thread %d: down-reduction %d", t, o[4]);
        }
        CHECK((unsigned)o[5] == ballot, "thread %d: ballot 0x%x, want 0x%x", t, o[5], ballot);
        CHECK(o[6] == 1 && o[7] == 0, "thread %d: any %d, all %d", t, o[6], o[7]);
    }
    cudaFree(out);

    double hd[16];
    double *d = dev_alloc<double>(16);
    k_half_warp<<<1, 32>>>(d);
    CUDA_OK(cudaGetLastError());
    to_host(hd, d, 16);
    for (int l = 0; l < 16; l++) {
        CHECK(hd[l] == 120.0, "half warp, lane %d: %g", l, hd[l]);
    }
    cudaFree(d);
}

static void test_transpose(void)
{
    const int n = 40; /* a partial second tile */
    static int h[n * n], t[n * n];
    for (int i = 0; i < n * n; i++) {
        h[i] = i;
    }
    int *in = dev_alloc<int>(n * n), *out = dev_alloc<int>(n * n);
    to_dev(in, h, n * n);
    k_transpose<<<dim3(2, 2), dim3(32, 32)>>>(in, out, n);
    CUDA_OK(cudaGetLastError());
    to_host(t, out, n * n);
    for (int y = 0; y < n; y++) {
        for (int x = 0; x < n; x++) {
            CHECK(t[y * n + x] == h[x * n + y], "(%d,%d): %d", x, y, t[y * n + x]);
        }
    }
    cudaFree(in);
    cudaFree(out);
}

static void test_dynamic_shared(void)
{
    const int n = 96;
    float h[n], r[n], before[n];
    for (int i = 0; i < n; i++) {
        h[i] = (float)i;
    }
    float *in = dev_alloc<float>(n), *out = dev_alloc<float>(n), *out2 = dev_alloc<float>(n);
    to_dev(in, h, n);
    k_reverse_dyn<<<3, 32, 32 * sizeof(float)>>>(in, out, out2);
    CUDA_OK(cudaGetLastError());
    to_host(r, out, n);
    to_host(before, out2, n);
    for (int i = 0; i < n; i++) {
        int b = i / 32, t = i % 32;
        CHECK(r[i] == h[b * 32 + 31 - t], "dynamic shared: out[%d] = %g", i, (double)r[i]);
        CHECK(before[i] != before[i], "block %d saw %g in fresh shared memory", b,
              (double)before[i]);
    }
    cudaFree(in);
    cudaFree(out);
    cudaFree(out2);
}

/* Past 48 KiB of dynamic shared memory a kernel needs cudaFuncSetAttribute's
 * MaxDynamicSharedMemorySize (up to sm_90's 227 KiB): refused before, run after. */
static void test_dynamic_shared_optin(void)
{
    const int n = 32;
    const size_t big = 200 << 10;
    float h[n], r[n];
    for (int i = 0; i < n; i++) {
        h[i] = (float)i;
    }
    float *in = dev_alloc<float>(n), *out = dev_alloc<float>(n), *out2 = dev_alloc<float>(n);
    to_dev(in, h, n);
    k_reverse_dyn<<<1, n, big>>>(in, out, out2);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "200 KiB accepted without the attribute");
    CHECK(cudaFuncSetAttribute((const void *)k_reverse_dyn,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (228 << 10)) == cudaErrorInvalidValue,
          "228 KiB allowed (sm_90: at most 227 KiB)");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "the attribute's error was not recorded");
    CUDA_OK(cudaFuncSetAttribute((const void *)k_reverse_dyn,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big));
    k_reverse_dyn<<<1, n, big>>>(in, out, out2);
    CUDA_OK(cudaGetLastError());
    to_host(r, out, n);
    for (int i = 0; i < n; i++) {
        CHECK(r[i] == h[n - 1 - i], "opted-in shared memory: out[%d] = %g", i, (double)r[i]);
    }
    k_reverse_dyn<<<1, n, big + 4>>>(in, out, out2);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "more than the attribute accepted");
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    CHECK(prop.sharedMemPerBlockOptin == (227 << 10), "sharedMemPerBlockOptin %zu",
          prop.sharedMemPerBlockOptin);
    cudaFree(in);
    cudaFree(out);
    cudaFree(out2);
}

static void test_grid_stride_and_atomics(void)
{
    const size_t n = 1000;
    static float h[n], y[n];
    for (size_t i = 0; i < n; i++) {
        h[i] = (float)i;
    }
    float *dx = dev_alloc<float>(n), *dy = dev_alloc<float>(n);
    to_dev(dx, h, n);
    k_axpb<<<3, 64>>>(dx, dy, n, 2.0f, 1.0f); /* 192 threads, 6 rounds */
    CUDA_OK(cudaGetLastError());
    to_host(y, dy, n);
    for (size_t i = 0; i < n; i++) {
        CHECK(y[i] == 2.0f * (float)i + 1.0f, "y[%zu] = %g", i, (double)y[i]);
    }
    cudaFree(dx);
    cudaFree(dy);

    unsigned *count = dev_alloc<unsigned>(1);
    int *max = dev_alloc<int>(1);
    float *sum = dev_alloc<float>(1);
    CUDA_OK(cudaMemset(count, 0, sizeof *count));
    CUDA_OK(cudaMemset(max, 0, sizeof *max));
    CUDA_OK(cudaMemset(sum, 0, sizeof *sum));
    k_atomics<<<dim3(3, 2), 96>>>(count, max, sum);
    CUDA_OK(cudaGetLastError());
    unsigned hc;
    int hm;
    float hs;
    to_host(&hc, count, 1);
    to_host(&hm, max, 1);
    to_host(&hs, sum, 1);
    CHECK(hc == 576 && hm == 287 && hs == 288.0f, "count %u, max %d, sum %g", hc, hm, (double)hs);
    cudaFree(count);
    cudaFree(max);
    cudaFree(sum);

    int hv[4], *votes = dev_alloc<int>(4);
    k_block_votes<<<1, 100>>>(votes);
    CUDA_OK(cudaGetLastError());
    to_host(hv, votes, 4);
    CHECK(hv[0] == 25 && hv[1] == 1 && hv[2] == 1 && hv[3] == 0, "count %d, and %d, or %d, %d",
          hv[0], hv[1], hv[2], hv[3]);
    cudaFree(votes);
}

static void test_launch_errors(void)
{
    int *p = dev_alloc<int>(64);
    CUDA_OK(cudaMemset(p, 0, 64 * sizeof(int)));
    k_touch<<<1, 1025>>>(p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads accepted");
    CHECK(cudaGetLastError() == cudaSuccess, "the error was not cleared");
    k_touch<<<0, 32>>>(p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "an empty grid accepted");
    k_touch<<<dim3(1, 65536), 32>>>(p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 65536 accepted");
    k_touch<<<1, dim3(32, 32, 2)>>>(p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads accepted");
    int h[64];
    to_host(h, p, 64);
    CHECK(h[0] == 0, "a refused launch ran");

    static int host[64];
    k_touch<<<1, 64>>>(host);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "a host pointer accepted");
    CHECK(host[0] == 0, "the kernel ran on host memory");
    k_touch<<<1, 64>>>(p);
    CUDA_OK(cudaGetLastError());
    to_host(h, p, 64);
    CHECK(h[63] == 7, "the kernel did not run: %d", h[63]);
    cudaFree(p);
}

/* Child: k_neighbour's output sum (with or without barrier) on stdout. */
static int child_neighbour(int with_barrier)
{
    int h[128], *out = dev_alloc<int>(128);
    k_neighbour<<<2, 64>>>(out, with_barrier);
    CUDA_OK(cudaGetLastError());
    to_host(h, out, 128);
    long long sum = 0;
    for (int i = 0; i < 128; i++) {
        sum = sum * 31 + h[i];
    }
    printf("%lld\n", sum);
    return 0;
}

/* Child: a launch that must abort (which: 0 exit before a barrier, 1 divergent barrier, 2 warp
 * deadlock, 3 stack overflow). */
static int child_deadlock(int which)
{
    int *out = dev_alloc<int>(64);
    if (which == 0) {
        k_deadlock<<<2, 64>>>(out);
    } else if (which == 1) {
        k_divergent<<<1, 32>>>(out);
    } else if (which == 2) {
        k_warp_deadlock<<<1, 64>>>(out);
    } else {
        k_big_locals<<<1, 2>>>(out);
    }
    printf("returned\n");
    return 0;
}

static char g_self[4096];

/* Runs this program with `mode` (env: VAR=value, stderr into stdout); its output and status. */
static int run_child(const char *mode, const char *env, char *buf, size_t cap)
{
    char cmd[5000];
    snprintf(cmd, sizeof cmd, "%s '%s' %s 2>&1", env, g_self, mode);
    FILE *f = popen(cmd, "r");
    if (f == nullptr) {
        perror("popen");
        exit(1);
    }
    size_t len = fread(buf, 1, cap - 1, f);
    buf[len] = '\0';
    return pclose(f);
}

static void test_order(void)
{
    char fwd[256], rev[256];
    int s1 = run_child("neighbour-barrier", "ACCEL_CUEMU_ORDER=forward", fwd, sizeof fwd);
    int s2 = run_child("neighbour-barrier", "ACCEL_CUEMU_ORDER=reverse", rev, sizeof rev);
    CHECK(s1 == 0 && s2 == 0 && strcmp(fwd, rev) == 0, "with a barrier: %s vs %s", fwd, rev);
    s1 = run_child("neighbour-race", "ACCEL_CUEMU_ORDER=forward", fwd, sizeof fwd);
    s2 = run_child("neighbour-race", "ACCEL_CUEMU_ORDER=reverse", rev, sizeof rev);
    CHECK(s1 == 0 && s2 == 0 && strcmp(fwd, rev) != 0,
          "without a barrier the orders agree (%s): the race is not exposed", fwd);
    s1 = run_child("neighbour-race", "ACCEL_CUEMU_ORDER=sideways", fwd, sizeof fwd);
    CHECK(s1 != 0 && strstr(fwd, "ACCEL_CUEMU_ORDER=sideways") != nullptr,
          "a bad order accepted: %s", fwd);
}

/* Runs a child that must abort; its message must hold every one of `want`. The child runs
 * threads in forward order whatever ACCEL_CUEMU_ORDER this test runs under: which thread a
 * report names first depends on the order. */
static void expect_abort(const char *mode, const char *env, const char *const *want, int n_want)
{
    char out[4096], fwd_env[256];
    snprintf(fwd_env, sizeof fwd_env, "ACCEL_CUEMU_ORDER=forward %s", env);
    int st = run_child(mode, fwd_env, out, sizeof out);
    CHECK(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0), "%s: status %d", mode, st);
    CHECK(strstr(out, "returned") == nullptr, "%s: the launch returned", mode);
    for (int i = 0; i < n_want; i++) {
        CHECK(strstr(out, want[i]) != nullptr, "%s: no \"%s\" in: %s", mode, want[i], out);
    }
    fprintf(stderr, "expected report (%s): %s", mode, out);
}

static void test_deadlock(void)
{
    const char *exited[] = {"k_deadlock", "block (1,0,0)", "thread (5,0,0) has exited",
                            "waits at __syncthreads"};
    expect_abort("deadlock", "", exited, 4);
    const char *divergent[] = {"k_divergent", "divergent barrier", "thread (0,0,0)",
                               "thread (31,0,0)"};
    expect_abort("divergent", "", divergent, 4);
    const char *warp[] = {"k_warp_deadlock", "no thread can go on",
                          "waits at __shfl_xor_sync(mask 0xffffffff)", "waits at __syncthreads"};
    expect_abort("warp-deadlock", "", warp, 4);
    const char *stack[] = {"k_big_locals", "thread (0,0,0)", "overflowed the fiber stack of 16 KiB",
                           "ACCEL_CUEMU_STACK_KIB"};
    expect_abort("stack", "ACCEL_CUEMU_STACK_KIB=16", stack, 4);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        if (strcmp(argv[1], "neighbour-barrier") == 0) {
            return child_neighbour(1);
        }
        if (strcmp(argv[1], "neighbour-race") == 0) {
            return child_neighbour(0);
        }
        if (strcmp(argv[1], "deadlock") == 0) {
            return child_deadlock(0);
        }
        if (strcmp(argv[1], "divergent") == 0) {
            return child_deadlock(1);
        }
        if (strcmp(argv[1], "warp-deadlock") == 0) {
            return child_deadlock(2);
        }
        if (strcmp(argv[1], "stack") == 0) {
            return child_deadlock(3);
        }
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (len <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    g_self[len] = '\0';
    test_block_sum();
    test_shuffles();
    test_transpose();
    test_dynamic_shared();
    test_dynamic_shared_optin();
    test_grid_stride_and_atomics();
    test_launch_errors();
    test_order();
    test_deadlock();
    if (g_failures != 0) {
        fprintf(stderr, "test_kernel: %d failures\n", g_failures);
        return 1;
    }
    printf("test_kernel: ok\n");
    return 0;
}
