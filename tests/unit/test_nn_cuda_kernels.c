/* ACCEL_TEST_LABELS: gpu
 *
 * The nn toolkit's element-wise and column-sum kernels (src/nn/cuda/ew_kernels.cu and
 * sum_kernels.cu), called through their launchers (nn_kernels.h) on device buffers at every offset
 * of a 16-byte vector (0 to 3 floats) and lengths around multiples of 4, so both the vector path
 * (aligned pointers) and the scalar one (the tail, unaligned pointers) run:
 *  - acc, acc_half, add, scale_acc and to_half (bf16) against the same arithmetic on the host,
 *    bit for bit (they add, multiply and round: nothing the host computes differently);
 *  - to_half (fp16), gelu and its backward: every offset gives the bits of offset 0 (the
 *    vector and scalar paths run the same per-element code);
 *  - the column sum over fp32 and bf16 input, accumulating or writing, rounding or not, over
 *    1 to 1500 rows (one chunk of 512 rows and several): bit for bit against the order
 *    nn_kernels.h documents, replayed on the host;
 *  - the partial-row pass alone (sum_parts), 1 to 600 partial rows (one tile of 256 and
 *    several): bit for bit against the rows added in order;
 *  - the fused MLP's hidden gradient from a 2-byte product (dgelu_bgrad_half): dZ against the
 *    GELU backward kernel (the same code), its bias gradient bit for bit against the column
 *    sum's order over that dZ.
 * Exits 77 (skipped) without a CUDA build or a GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#ifdef ACCEL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "nn/cuda/nn_kernels.h"

#define MAXN 5000

static uint64_t state = 88172645463325252ull;

static float frand(void) /* xorshift64, uniform in [-2, 2) */
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (float)((double)(state >> 11) * 0x1p-51 - 2.0);
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round to nearest even bf16 (finite inputs), as __float2bfloat16_rn. */
static uint16_t bf16_bits(float f)
{
    uint32_t u = bits(f);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_round(float f)
{
    uint32_t u = (uint32_t)bf16_bits(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static void *dev_alloc(size_t nbytes)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, nbytes) == cudaSuccess);
    return p;
}

static void to_dev(void *d, const void *h, size_t nbytes)
{
    CHECK(cudaMemcpy(d, h, nbytes, cudaMemcpyHostToDevice) == cudaSuccess);
}

static void to_host(void *h, const void *d, size_t nbytes)
{
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaMemcpy(h, d, nbytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

static float *da, *db, *dc, *dseed;
static float ha[MAXN], hb[MAXN], hc[MAXN], ref[MAXN], out[MAXN];
static uint16_t h16[MAXN], r16[MAXN];

static const int64_t lengths[] = {0, 1, 3, 4, 5, 7, 8, 1003, 4099};
#define NLEN (sizeof(lengths) / sizeof(lengths[0]))

static void fill(void)
{
    for (int i = 0; i < MAXN; i++) {
        ha[i] = frand();
        hb[i] = frand();
        hc[i] = frand();
    }
    to_dev(da, ha, sizeof(ha));
    to_dev(db, hb, sizeof(hb));
    to_dev(dc, hc, sizeof(hc));
}

static void check_floats(const char *what, int off, int64_t n, const float *want)
{
    to_host(out, dc, sizeof(out));
    for (int64_t i = 0; i < n; i++) {
        CHECK_MSG(bits(out[off + i]) == bits(want[i]), "%s: offset %d n %lld: [%lld] %g, want %g",
                  what, off, (long long)n, (long long)i, (double)out[off + i], (double)want[i]);
    }
    /* Nothing past the end was written. */
    for (int64_t i = off + n; i < MAXN && i < off + n + 8; i++) {
        CHECK_MSG(bits(out[i]) == bits(hc[i]), "%s: offset %d n %lld: wrote [%lld]", what, off,
                  (long long)n, (long long)(i - off));
    }
}

static void test_elementwise(void)
{
    for (int off = 0; off < 4; off++) {
        for (size_t k = 0; k < NLEN; k++) {
            int64_t n = lengths[k];
            for (int rnd = 0; rnd < 2; rnd++) {
                for (int write = 0; write < 2; write++) {
                    fill();
                    CHECK(nn_cu_acc(NULL, dc + off, da + off, n, rnd, write) == cudaSuccess);
                    for (int64_t i = 0; i < n; i++) {
                        float v = rnd ? bf16_round(ha[off + i]) : ha[off + i];
                        ref[i] = write ? v : hc[off + i] + v;
                    }
                    check_floats("acc", off, n, ref);
                    fill();
                    float f = 0.37f;
                    to_dev(dseed, &f, sizeof(f));
                    CHECK(nn_cu_scale_acc(NULL, dc + off, da + off, n, dseed, rnd, write) ==
                          cudaSuccess);
                    for (int64_t i = 0; i < n; i++) {
                        float v = f * ha[off + i];
                        v = rnd ? bf16_round(v) : v;
                        ref[i] = write ? v : hc[off + i] + v;
                    }
                    check_floats("scale_acc", off, n, ref);
                }
            }
            /* y = a + b broadcast: b of 4 (vectors), 12 and 1 (scalars: not a multiple of 4
             * where n is not). */
            static const int64_t nbs[] = {4, 12, 1};
            for (size_t j = 0; j < 3; j++) {
                int64_t nb = nbs[j];
                if (n == 0 || n % nb != 0) {
                    continue;
                }
                fill();
                CHECK(nn_cu_add(NULL, da + off, n, db, nb, dc + off) == cudaSuccess);
                for (int64_t i = 0; i < n; i++) {
                    ref[i] = ha[off + i] + hb[i % nb];
                }
                check_floats("add", off, n, ref);
            }
            /* Widening 2-byte values (8-byte loads where aligned): bf16 of the inputs, and fp16
             * 1 + k / 1024 (exact). */
            for (int dt = 1; dt <= 2; dt++) {
                for (int write = 0; write < 2; write++) {
                    fill();
                    for (int64_t i = 0; i < n; i++) {
                        r16[off + i] = dt == 1 ? bf16_bits(ha[i]) : (uint16_t)(0x3C00 + i % 1024);
                        float v = dt == 1 ? bf16_round(ha[i]) : 1.0f + (float)(i % 1024) / 1024.0f;
                        ref[i] = write ? v : hc[off + i] + v;
                    }
                    to_dev(db, r16, sizeof(r16));
                    CHECK(nn_cu_acc_half(NULL, dc + off, (uint16_t *)db + off, n, dt, write) ==
                          cudaSuccess);
                    check_floats("acc_half", off, n, ref);
                }
            }
            /* bf16 copies at 2-byte offsets 0..3 (8-byte stores where aligned). */
            fill();
            memset(r16, 0xAB, sizeof(r16));
            to_dev(dc, r16, sizeof(r16));
            CHECK(nn_cu_to_half(NULL, da + off, (uint16_t *)dc + off, n, 1) == cudaSuccess);
            to_host(h16, dc, sizeof(h16));
            for (int64_t i = 0; i < n; i++) {
                CHECK_MSG(h16[off + i] == bf16_bits(ha[off + i]),
                          "to_half: offset %d n %lld [%lld]", off, (long long)n, (long long)i);
            }
            CHECK(h16[off + n] == 0xABAB);
        }
    }
}

/* Kernels checked against themselves at offset 0 (the vector path for n >= 4). */
static void test_same_bits(void)
{
    const int64_t n = 1003;
    float base[3][MAXN], x[MAXN], g[MAXN];
    uint16_t base16[MAXN];
    fill();
    memcpy(x, ha, sizeof(x));
    memcpy(g, hb, sizeof(g));
    for (int off = 0; off < 4; off++) {
        float got[3][MAXN];
        /* One input for every offset: the same values at da + off. */
        to_dev(da + off, x, (size_t)n * sizeof(float));
        to_dev(db + off, g, (size_t)n * sizeof(float));
        CHECK(nn_cu_gelu(NULL, da + off, dc + off, n, 1) == cudaSuccess);
        to_host(got[0], dc + off, (size_t)n * sizeof(float));
        CHECK(nn_cu_gelu(NULL, da + off, dc + off, n, 0) == cudaSuccess);
        to_host(got[1], dc + off, (size_t)n * sizeof(float));
        to_dev(dc + off, hc, (size_t)n * sizeof(float));
        CHECK(nn_cu_gelu_bwd(NULL, da + off, db + off, dc + off, n, 1, 0) == cudaSuccess);
        to_host(got[2], dc + off, (size_t)n * sizeof(float));
        CHECK(nn_cu_to_half(NULL, da + off, (uint16_t *)dc + off, n, 2) == cudaSuccess);
        to_host(h16, (uint16_t *)dc + off, (size_t)n * 2);
        if (off == 0) {
            memcpy(base, got, sizeof(base));
            memcpy(base16, h16, sizeof(base16));
            continue;
        }
        for (int k = 0; k < 3; k++) {
            CHECK_MSG(memcmp(base[k], got[k], (size_t)n * sizeof(float)) == 0,
                      "gelu kernel %d: offset %d differs from offset 0", k, off);
        }
        CHECK_MSG(memcmp(base16, h16, (size_t)n * 2) == 0, "to_half fp16: offset %d differs", off);
    }
}

/* The column sum's documented order: chunks of 512 rows; in a chunk lane l (0..31) sums rows
 * l, l + 32, ...; the lanes in order; then the chunks in order. */
static float col_ref(const float *src, int64_t rows, int64_t cols, int64_t c)
{
    int64_t chunks = rows <= 512 ? 1 : (rows + 511) / 512;
    float total = 0.0f, chunk_sum = 0.0f;
    for (int64_t k = 0; k < chunks; k++) {
        int64_t r1 = (k + 1) * 512 < rows ? (k + 1) * 512 : rows;
        chunk_sum = 0.0f;
        for (int l = 0; l < 32; l++) {
            float s = 0.0f;
            for (int64_t r = k * 512 + l; r < r1; r += 32) {
                s += src[r * cols + c];
            }
            chunk_sum += s;
        }
        total += chunk_sum;
    }
    return chunks == 1 ? chunk_sum : total;
}

/* Against the documented order, bit for bit: one chunk and several, a column a thread (odd
 * widths; or src one element off 16-byte alignment) and 16-byte vectors of columns (widths a
 * multiple of 8, including a partial block of 256 bf16 / 128 fp32 columns). */
static void test_col_sum(void)
{
    static const int64_t shapes[][3] = {{1, 5, 0},     {31, 33, 0},   {512, 3, 0},  {513, 7, 0},
                                        {1500, 3, 0},  {40, 70, 0},   {1, 8, 0},    {31, 16, 0},
                                        {1500, 40, 0}, {513, 264, 0}, {600, 24, 1}, {40, 64, 3}};
    enum { MAXE = 513 * 264 + 8 };
    float *src = malloc(MAXE * sizeof(float)), *srcr = malloc(MAXE * sizeof(float));
    uint16_t *src16 = malloc(MAXE * 2);
    float *dsrc = dev_alloc(MAXE * sizeof(float)), *part = dev_alloc(3 * 264 * sizeof(float));
    CHECK(src != NULL && srcr != NULL && src16 != NULL);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], off = shapes[s][2];
        CHECK(rows * cols + off <= MAXE && cols <= MAXN);
        CHECK(nn_cu_col_sum_part_count(rows, cols) <= 3 * cols);
        for (int64_t i = 0; i < rows * cols; i++) {
            src[i] = frand();
            src16[i] = bf16_bits(src[i]);
            srcr[i] = bf16_round(src[i]);
        }
        for (int dt = 0; dt < 2; dt++) {
            for (int mode = 0; mode < 4; mode++) { /* write, rnd */
                int write = mode & 1, rnd = mode >> 1;
                fill();
                void *d = dt ? (void *)((uint16_t *)dsrc + off) : (void *)(dsrc + off);
                to_dev(d, dt ? (const void *)src16 : (const void *)src,
                       (size_t)(rows * cols) * (dt ? 2 : 4));
                CHECK(nn_cu_col_sum(NULL, d, dt, rows, cols, dc, write, rnd, part) == cudaSuccess);
                for (int64_t c = 0; c < cols; c++) {
                    float v = col_ref(dt ? srcr : src, rows, cols, c);
                    v = rnd ? bf16_round(v) : v;
                    ref[c] = write ? v : hc[c] + v;
                }
                char what[80];
                snprintf(what, sizeof(what), "col_sum %lldx%lld+%lld dt %d write %d rnd %d",
                         (long long)rows, (long long)cols, (long long)off, dt, write, rnd);
                check_floats(what, 0, cols, ref);
            }
        }
    }
    CHECK(cudaFree(dsrc) == cudaSuccess && cudaFree(part) == cudaSuccess);
    free(src);
    free(srcr);
    free(src16);
}

/* The partial-row pass alone (nn_cu_sum_parts): column c's nparts partial rows added in row
 * order from 0, then rounded (rnd) and stored or added (write), bit for bit. Up to 600
 * partial rows: one tile of 256 rows a block and several (a full last one and a partial one),
 * 1 to 70 columns (a partial block of 32 and several blocks). */
static void test_sum_parts(void)
{
    static const int64_t shapes[][2] = {{1, 1},   {3, 5},    {64, 33}, {255, 32},
                                        {256, 7}, {257, 64}, {512, 3}, {600, 70}};
    enum { MAXE = 600 * 70 };
    float *hp = malloc(MAXE * sizeof(float)), *dp = dev_alloc(MAXE * sizeof(float));
    CHECK(hp != NULL);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int64_t nparts = shapes[s][0], cols = shapes[s][1];
        CHECK(nparts * cols <= MAXE && cols <= MAXN);
        for (int64_t i = 0; i < nparts * cols; i++) {
            hp[i] = frand();
        }
        to_dev(dp, hp, (size_t)(nparts * cols) * sizeof(float));
        for (int mode = 0; mode < 4; mode++) { /* write, rnd */
            int write = mode & 1, rnd = mode >> 1;
            fill();
            CHECK(nn_cu_sum_parts(NULL, dp, nparts, cols, dc, write, rnd) == cudaSuccess);
            for (int64_t c = 0; c < cols; c++) {
                float v = 0.0f;
                for (int64_t k = 0; k < nparts; k++) {
                    v += hp[k * cols + c];
                }
                v = rnd ? bf16_round(v) : v;
                ref[c] = write ? v : hc[c] + v;
            }
            char what[80];
            snprintf(what, sizeof(what), "sum_parts %lldx%lld write %d rnd %d", (long long)nparts,
                     (long long)cols, write, rnd);
            check_floats(what, 0, cols, ref);
        }
    }
    CHECK(cudaFree(dp) == cudaSuccess);
    free(hp);
}

/* The fused MLP's hidden gradient from a 2-byte product (nn_cu_dgelu_bgrad_half, bf16):
 * dZ = rnd(P * gelu_tanh'(aux)) against nn_cu_gelu_bwd on the widened inputs, rounded on the
 * host. Both kernels run the same gelu_grad with -fmad=false, so the bits should agree; the
 * check still allows 1 bf16 ulp in 1 value of 1000 (a tie moved by a compiler that schedules
 * the two differently is not what this test is about). The bias gradient is checked bit for
 * bit against the column sum's documented order over the kernel's own dZ, then rounded. Over
 * 1 to 1500 rows (one chunk and several), 8 to 264 columns (full and partial blocks of 256),
 * 16-byte accesses (aligned, columns a multiple of 8) and single values (7 columns, or d one
 * element off), with and without the bias gradient. */
static void test_dgelu_bgrad(void)
{
    static const int64_t shapes[][3] = {{1, 8, 0},     {31, 264, 0}, {512, 16, 0}, {513, 264, 0},
                                        {1500, 24, 0}, {40, 7, 0},   {513, 16, 1}, {33, 24, 1}};
    enum { MAXE = 513 * 264 };
    uint16_t *p16 = malloc(MAXE * 2), *a16 = malloc(MAXE * 2), *z16 = malloc((MAXE + 8) * 2);
    uint16_t *db16 = malloc(300 * 2);
    float *pw = malloc(MAXE * sizeof(float)), *aw = malloc(MAXE * sizeof(float));
    float *gz = malloc(MAXE * sizeof(float)), *zf = malloc(MAXE * sizeof(float));
    CHECK(p16 != NULL && a16 != NULL && z16 != NULL && db16 != NULL && pw != NULL && aw != NULL &&
          gz != NULL && zf != NULL);
    uint16_t *dd = dev_alloc((MAXE + 8) * 2), *daux = dev_alloc((MAXE + 8) * 2);
    uint16_t *ddb = dev_alloc(300 * 2);
    float *dpw = dev_alloc(MAXE * sizeof(float)), *daw = dev_alloc(MAXE * sizeof(float));
    float *dgz = dev_alloc(MAXE * sizeof(float)), *part = dev_alloc(3 * 264 * sizeof(float));
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], off = shapes[s][2], n = rows * cols;
        CHECK(n <= MAXE && nn_cu_col_sum_part_count(rows, cols) <= 3 * cols);
        for (int64_t i = 0; i < n; i++) {
            p16[i] = bf16_bits(frand());
            a16[i] = bf16_bits(frand());
            uint32_t u = (uint32_t)p16[i] << 16, v = (uint32_t)a16[i] << 16;
            memcpy(&pw[i], &u, 4);
            memcpy(&aw[i], &v, 4);
        }
        /* The reference: the device's GELU backward over the widened values, rounded here. */
        to_dev(dpw, pw, (size_t)n * sizeof(float));
        to_dev(daw, aw, (size_t)n * sizeof(float));
        CHECK(nn_cu_gelu_bwd(NULL, daw, dpw, dgz, n, 1, 1) == cudaSuccess);
        to_host(gz, dgz, (size_t)n * sizeof(float));
        for (int with_db = 0; with_db < 2; with_db++) {
            memset(z16, 0xAB, (size_t)(n + 8) * 2);
            memcpy(z16 + off, p16, (size_t)n * 2);
            to_dev(dd, z16, (size_t)(n + 8) * 2);
            to_dev(daux + off, a16, (size_t)n * 2);
            memset(db16, 0xAB, 300 * 2);
            to_dev(ddb, db16, 300 * 2);
            CHECK(nn_cu_dgelu_bgrad_half(NULL, dd + off, daux + off, rows, cols,
                                         with_db ? ddb : NULL, part, 1) == cudaSuccess);
            to_host(z16, dd, (size_t)(n + 8) * 2);
            to_host(db16, ddb, 300 * 2);
            int64_t inexact = 0;
            for (int64_t i = 0; i < n; i++) {
                uint16_t want = bf16_bits(gz[i]), got = z16[off + i];
                int d = (int)got - (int)want;
                CHECK_MSG(d >= -1 && d <= 1 && (got ^ want) < 0x8000,
                          "dgelu_bgrad %lldx%lld off %lld: [%lld] %04x, want %04x", (long long)rows,
                          (long long)cols, (long long)off, (long long)i, got, want);
                inexact += d != 0;
                uint32_t u = (uint32_t)got << 16;
                memcpy(&zf[i], &u, 4);
            }
            CHECK_MSG(inexact * 1000 <= n, "dgelu_bgrad %lldx%lld: %lld values 1 ulp off",
                      (long long)rows, (long long)cols, (long long)inexact);
            for (int64_t i = 0; i < off; i++) {
                CHECK(z16[i] == 0xABAB);
            }
            for (int64_t i = off + n; i < n + 8; i++) {
                CHECK_MSG(z16[i] == 0xABAB, "dgelu_bgrad wrote past the end");
            }
            for (int64_t c = 0; c < cols + 1 && c < 300; c++) {
                uint16_t want =
                    with_db && c < cols ? bf16_bits(col_ref(zf, rows, cols, c)) : 0xABAB;
                CHECK_MSG(db16[c] == want, "dgelu_bgrad %lldx%lld bias [%lld]: %04x, want %04x",
                          (long long)rows, (long long)cols, (long long)c, db16[c], want);
            }
        }
    }
    CHECK(cudaFree(dd) == cudaSuccess && cudaFree(daux) == cudaSuccess);
    CHECK(cudaFree(ddb) == cudaSuccess && cudaFree(dpw) == cudaSuccess);
    CHECK(cudaFree(daw) == cudaSuccess && cudaFree(dgz) == cudaSuccess);
    CHECK(cudaFree(part) == cudaSuccess);
    free(p16);
    free(a16);
    free(z16);
    free(db16);
    free(pw);
    free(aw);
    free(gz);
    free(zf);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("test_nn_cuda_kernels: skipped: no GPU\n");
        return 77;
    }
    da = dev_alloc(sizeof(ha));
    db = dev_alloc(sizeof(hb));
    dc = dev_alloc(sizeof(hc));
    dseed = dev_alloc(sizeof(float));
    test_elementwise();
    test_same_bits();
    test_col_sum();
    test_sum_parts();
    test_dgelu_bgrad();
    CHECK(cudaFree(da) == cudaSuccess && cudaFree(db) == cudaSuccess);
    CHECK(cudaFree(dc) == cudaSuccess && cudaFree(dseed) == cudaSuccess);
    printf("test_nn_cuda_kernels: ok\n");
    return 0;
}

#else

int main(void)
{
    printf("test_nn_cuda_kernels: skipped: built without CUDA\n");
    return 77;
}

#endif
