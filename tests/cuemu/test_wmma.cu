/*
 * The emulator's nvcuda::wmma (tests/cuemu/wmma.h) against a host product: D = A B + C with
 * A, B bf16 and fp16 in every layout pair, C loaded and D stored row- and column-major, the
 * sum in fp32 with k ascending (exact on small integers; on random values the same bits as a
 * host sum c + a0 b0 + a1 b1 + ... in that order, so the order itself is checked), and an
 * element-wise loop over a fragment (scaling, as a kernel's softmax rescale would).
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

using namespace nvcuda;

static int g_failures;

template <typename T> __host__ __device__ T from_f(float v);
template <typename T> __host__ __device__ float to_f(T v);
template <> __host__ __device__ __nv_bfloat16 from_f<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __host__ __device__ __half from_f<__half>(float v)
{
    return __float2half_rn(v);
}
template <> __host__ __device__ float to_f<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
template <> __host__ __device__ float to_f<__half>(__half v)
{
    return __half2float(v);
}

/* One warp: d = 2 * (a b + c), a and b in layouts LA / LB, c and d in memory layout ml. */
template <typename T, typename LA, typename LB>
__global__ void k_mma(const T *a, const T *b, const float *c, float *d, int ml)
{
    wmma::layout_t l = ml ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, l);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int i = 0; i < fc.num_elements; i++) {
        fc.x[i] *= 2.0f;
    }
    wmma::store_matrix_sync(d, fc, 16, l);
}

/* rnd: random values (A and B representable in T) instead of small integers. */
template <typename T, typename LA, typename LB>
static void check_mma(const char *name, int ml, int rnd)
{
    bool ra = std::is_same<LA, wmma::row_major>::value,
         rb = std::is_same<LB, wmma::row_major>::value;
    float A[256], B[256], C[256], want[256], got[256];
    T ha[256], hb[256];
    for (int i = 0; i < 256; i++) {
        A[i] = (float)(i % 7 - 3);
        B[i] = (float)(i % 5 - 2);
        C[i] = (float)(i % 3);
        if (rnd) {
            A[i] = to_f<T>(from_f<T>((float)rand() / (float)RAND_MAX - 0.5f));
            B[i] = to_f<T>(from_f<T>((float)rand() / (float)RAND_MAX * 3.0f - 1.0f));
            C[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        }
    }
    /* A[m][k], B[k][n], C[m][n] logical; stored per layout. */
    for (int r = 0; r < 16; r++) {
        for (int q = 0; q < 16; q++) {
            ha[ra ? r * 16 + q : q * 16 + r] = from_f<T>(A[r * 16 + q]);
            hb[rb ? r * 16 + q : q * 16 + r] = from_f<T>(B[r * 16 + q]);
        }
    }
    float hc[256];
    for (int m = 0; m < 16; m++) {
        for (int n = 0; n < 16; n++) {
            float s = C[m * 16 + n];
            for (int k = 0; k < 16; k++) {
                s += A[m * 16 + k] * B[k * 16 + n];
            }
            want[ml ? n * 16 + m : m * 16 + n] = 2.0f * s;
            hc[ml ? n * 16 + m : m * 16 + n] = C[m * 16 + n];
        }
    }
    T *da, *db;
    float *dc, *dd;
    if (cudaMalloc((void **)&da, sizeof(ha)) != cudaSuccess ||
        cudaMalloc((void **)&db, sizeof(hb)) != cudaSuccess ||
        cudaMalloc((void **)&dc, sizeof(hc)) != cudaSuccess ||
        cudaMalloc((void **)&dd, sizeof(got)) != cudaSuccess) {
        fprintf(stderr, "test_wmma: cudaMalloc failed\n");
        exit(1);
    }
    cudaMemcpy(da, ha, sizeof(ha), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, sizeof(hb), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc, sizeof(hc), cudaMemcpyHostToDevice);
    k_mma<T, LA, LB><<<1, 32>>>(da, db, dc, dd, ml);
    cudaMemcpy(got, dd, sizeof(got), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 256; i++) {
        bad += got[i] != want[i];
    }
    if (bad) {
        fprintf(stderr, "FAIL %s (%s%s): %d of 256 elements differ, first want %.9g got %.9g\n",
                name, ml ? "col-major C/D" : "row-major C/D", rnd ? ", random" : "", bad, want[0],
                got[0]);
        g_failures++;
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
}

int main(void)
{
    for (int v = 0; v < 4; v++) {
        int ml = v & 1, rnd = v >> 1;
        check_mma<__nv_bfloat16, wmma::row_major, wmma::row_major>("bf16 row x row", ml, rnd);
        check_mma<__nv_bfloat16, wmma::row_major, wmma::col_major>("bf16 row x col", ml, rnd);
        check_mma<__nv_bfloat16, wmma::col_major, wmma::row_major>("bf16 col x row", ml, rnd);
        check_mma<__half, wmma::col_major, wmma::col_major>("fp16 col x col", ml, rnd);
        check_mma<__half, wmma::row_major, wmma::col_major>("fp16 row x col", ml, rnd);
    }
    if (g_failures) {
        fprintf(stderr, "test_wmma: %d failures\n", g_failures);
        return 1;
    }
    printf("test_wmma: ok\n");
    return 0;
}
