/* ACCEL_TEST_NPROCS: 1 2 3
 * ACCEL_TEST_LABELS: gpu nccl
 *
 * The nccl backend through comm v2 (src/comm/comm.h), one GPU per process: every collective
 * on device buffers (out of place and in place) and on host buffers (staged through the GPU),
 * for each dtype NCCL reduces and each reduction, against a reference computed here from every
 * process's input; a wire dtype (DDP compression); groups; a split; what it refuses (reducing
 * I16) and the broken state after an abort; a collective posted and left untested for twice
 * the timeout is no stall for the liveness watch (its result is right). Inputs are small integers,
 * so every sum is exact in every dtype whatever order NCCL combines them in; averages are compared
 * with a tolerance. Exits 77 without a CUDA build or GPU, and when processes would share a GPU
 * (NCCL refuses two ranks on one GPU; tests/dist/test_cuda_staging covers that case).
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "check.h"

#ifndef ACCEL_HAVE_CUDA
int main(void)
{
    fprintf(stderr, "test_nccl: skipped: this build has no CUDA (configure with -DACCEL_CUDA=ON)\n");
    return 77;
}
#else
#include <cuda_runtime_api.h>

#include "base/half.h"
#include "comm/comm.h"

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                     \
    } while (0)

static int rank, n_ranks;
static cudaStream_t stream;
static int cases;

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? atoi(v) : dflt;
}

static void *native(void *arg, accel__stream *s)
{
    (void)arg;
    (void)s;
    return stream;
}

static accel__comm *comm_new(int device, double timeout_s)
{
    accel__comm_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = "nccl";
    cfg.rank = rank;
    cfg.n_ranks = n_ranks;
    cfg.local_rank = env_int("LOCAL_RANK", 0);
    cfg.local_n_ranks = env_int("LOCAL_WORLD_SIZE", 1);
    cfg.job_id = getenv("ACCEL_JOB_ID");
    cfg.master_addr = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1";
    cfg.master_port = env_int("MASTER_PORT", 29500);
    cfg.timeout_s = timeout_s;
    cfg.log.rank = rank;
    cfg.log.n_ranks = n_ranks;
    cfg.log.level = ACCEL__LOG_WARN;
    cfg.stream_native = native;
    cfg.device_ordinal = device;
    accel__comm *c;
    CHECK_OK(NULL, accel__comm_new(&c, &cfg));
    return c;
}

/* Element i of process r's input: a small integer (0..7), as dtype dt. */
static double val(int r, size_t i, unsigned salt)
{
    return (double)((i * 7u + (unsigned)r * 3u + salt) % 8u);
}

static void put(accel_dtype dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case ACCEL_F32: ((float *)buf)[i] = (float)v; break;
    case ACCEL_F64: ((double *)buf)[i] = v; break;
    case ACCEL_F16: ((uint16_t *)buf)[i] = accel__f32_to_f16((float)v); break;
    case ACCEL_BF16: ((uint16_t *)buf)[i] = accel__f32_to_bf16((float)v); break;
    case ACCEL_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ACCEL_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ACCEL_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: CHECK_MSG(0, "dtype %d", (int)dt);
    }
}

static double get(accel_dtype dt, const void *buf, size_t i)
{
    switch (dt) {
    case ACCEL_F32: return ((const float *)buf)[i];
    case ACCEL_F64: return ((const double *)buf)[i];
    case ACCEL_F16: return accel__f16_to_f32(((const uint16_t *)buf)[i]);
    case ACCEL_BF16: return accel__bf16_to_f32(((const uint16_t *)buf)[i]);
    case ACCEL_I32: return ((const int32_t *)buf)[i];
    case ACCEL_I64: return (double)((const int64_t *)buf)[i];
    case ACCEL_U8: return ((const uint8_t *)buf)[i];
    default: CHECK_MSG(0, "dtype %d", (int)dt); return 0;
    }
}

static int is_int(accel_dtype dt)
{
    return dt == ACCEL_I32 || dt == ACCEL_I64 || dt == ACCEL_U8;
}

/* The reduction of element i over every process. */
static double reduced(accel_dtype dt, accel_reduce_op op, size_t i, unsigned salt)
{
    double acc = val(0, i, salt);
    for (int r = 1; r < n_ranks; r++) {
        double v = val(r, i, salt);
        acc = op == ACCEL_MAX ? fmax(acc, v) : op == ACCEL_MIN ? fmin(acc, v) : acc + v;
    }
    if (op == ACCEL_AVG) {
        acc /= n_ranks;
        if (is_int(dt)) {
            acc = trunc(acc);
        }
    }
    return acc;
}

static void expect(accel_dtype dt, accel_reduce_op op, const void *got, size_t i, double want,
                   const char *what)
{
    double g = get(dt, got, i);
    double tol = op == ACCEL_AVG && !is_int(dt)
                     ? (dt == ACCEL_BF16 ? 1e-2 : dt == ACCEL_F16 ? 1e-3 : 1e-6) * fmax(1, want)
                     : 0;
    CHECK_MSG(fabs(g - want) <= tol, "%s: element %zu is %g, want %g (rank %d of %d)", what, i, g,
              want, rank, n_ranks);
}

/* Copies between host and a buffer that is device memory when dev. */
static void *buf_new(size_t nbytes, int dev)
{
    void *p = NULL;
    if (dev) {
        CU(cudaMalloc(&p, nbytes > 0 ? nbytes : 1));
        CU(cudaMemset(p, 0xA5, nbytes)); /* poisoned: every element must be written */
        CU(cudaDeviceSynchronize()); /* before the collective's stream (non-blocking) runs */
    } else {
        p = malloc(nbytes > 0 ? nbytes : 1);
        CHECK(p != NULL);
        memset(p, 0xA5, nbytes);
    }
    return p;
}

static void buf_free(void *p, int dev)
{
    if (dev) {
        CU(cudaFree(p));
    } else {
        free(p);
    }
}

static void to_buf(void *dst, const void *src, size_t nbytes, int dev)
{
    if (dev) {
        /* From pageable memory cudaMemcpy may return before the DMA lands, and the collective's
         * stream is non-blocking (not ordered after the legacy stream): wait for it. */
        CU(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
        CU(cudaDeviceSynchronize());
    } else {
        memcpy(dst, src, nbytes);
    }
}

static void from_buf(void *dst, const void *src, size_t nbytes, int dev)
{
    if (dev) {
        CU(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
    } else {
        memcpy(dst, src, nbytes);
    }
}

/* One collective of `kind` on count elements (per rank where the kind says so). */
static void one_case(accel__comm *c, accel__coll_kind kind, accel_dtype dt, accel_reduce_op op,
                     size_t count, int dev, int in_place)
{
    const size_t es = accel_dtype_nbytes(dt), n = (size_t)n_ranks;
    const int root = n_ranks - 1;
    const unsigned salt = (unsigned)cases * 5u;
    size_t in_n = count, out_n = count;
    if (kind == ACCEL__COLL_REDUCE_SCATTER) {
        in_n = count * n;
    } else if (kind == ACCEL__COLL_ALLGATHER || kind == ACCEL__COLL_GATHER) {
        out_n = count * n;
    }
    char *hin = malloc(in_n * es + 1), *hout = malloc(out_n * es + 1);
    CHECK(hin != NULL && hout != NULL);
    for (size_t i = 0; i < in_n; i++) {
        put(dt, hin, i, val(rank, i, salt));
    }
    char *out = buf_new(out_n * es, dev), *in;
    if (in_place) { /* the input where the call reads it inside the output buffer */
        in = kind == ACCEL__COLL_ALLGATHER ? out + (size_t)rank * count * es : out;
        if (kind == ACCEL__COLL_REDUCE_SCATTER) {
            buf_free(out, dev);
            in = buf_new(in_n * es, dev);
            out = in + (size_t)rank * count * es;
        }
    } else {
        in = buf_new(in_n * es, dev);
    }
    to_buf(in, hin, in_n * es, dev);
    accel__coll call = ACCEL__COLL(kind, in, out, count, dt, op, root);
    if (kind == ACCEL__COLL_BROADCAST) {
        call.send = call.recv = in; /* in place by definition */
        buf_free(out, dev);
        out = in;
    }
    char what[160];
    accel__coll_str(&call, n_ranks, what, sizeof(what));
    snprintf(what + strlen(what), sizeof(what) - strlen(what), " on %s%s", dev ? "GPU" : "host",
             in_place ? ", in place" : "");
    CHECK_OK(NULL, accel__comm_run(c, &call));
    CU(cudaStreamSynchronize(stream));
    int has_out = !((kind == ACCEL__COLL_REDUCE || kind == ACCEL__COLL_GATHER) && rank != root);
    if (has_out) {
        from_buf(hout, out, out_n * es, dev);
    }
    for (size_t i = 0; has_out && i < out_n; i++) {
        double want;
        switch (kind) {
        case ACCEL__COLL_ALLREDUCE:
        case ACCEL__COLL_REDUCE: want = reduced(dt, op, i, salt); break;
        case ACCEL__COLL_REDUCE_SCATTER: want = reduced(dt, op, (size_t)rank * count + i, salt); break;
        case ACCEL__COLL_ALLGATHER:
        case ACCEL__COLL_GATHER: want = val((int)(i / count), i % count, salt); break;
        default: want = val(root, i, salt); break; /* broadcast */
        }
        expect(dt, op, hout, i, want, what);
    }
    if (kind == ACCEL__COLL_REDUCE_SCATTER && in_place) {
        buf_free(in, dev);
    } else {
        buf_free(out, dev);
        if (!in_place && kind != ACCEL__COLL_BROADCAST) {
            buf_free(in, dev);
        }
    }
    free(hin);
    free(hout);
    cases++;
}

static void collectives(accel__comm *c)
{
    static const accel_dtype dts[] = {ACCEL_F32, ACCEL_F64, ACCEL_F16, ACCEL_BF16,
                                      ACCEL_I32, ACCEL_I64, ACCEL_U8};
    static const accel_reduce_op ops[] = {ACCEL_SUM, ACCEL_AVG, ACCEL_MAX, ACCEL_MIN};
    static const size_t counts[] = {1, 1000, (1u << 20) + 3};
    static const accel__coll_kind reducing[] = {ACCEL__COLL_ALLREDUCE, ACCEL__COLL_REDUCE_SCATTER,
                                                ACCEL__COLL_REDUCE};
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            for (size_t k = 0; k < 3; k++) {
                for (int dev = 1; dev >= 0; dev--) {
                    one_case(c, reducing[k], dts[d], ops[o], 1000, dev, 0);
                }
            }
        }
        for (size_t n = 0; n < sizeof(counts) / sizeof(counts[0]); n++) {
            for (int dev = 1; dev >= 0; dev--) {
                one_case(c, ACCEL__COLL_ALLGATHER, dts[d], ACCEL_SUM, counts[n], dev, 0);
                one_case(c, ACCEL__COLL_BROADCAST, dts[d], ACCEL_SUM, counts[n], dev, 0);
                one_case(c, ACCEL__COLL_GATHER, dts[d], ACCEL_SUM, counts[n], dev, 0);
                one_case(c, ACCEL__COLL_ALLREDUCE, dts[d], ACCEL_SUM, counts[n], dev, 0);
            }
        }
    }
    for (int dev = 1; dev >= 0; dev--) { /* in place, as the reducer and ZeRO call them */
        one_case(c, ACCEL__COLL_ALLREDUCE, ACCEL_F32, ACCEL_AVG, 1u << 20, dev, 1);
        one_case(c, ACCEL__COLL_REDUCE_SCATTER, ACCEL_BF16, ACCEL_SUM, 4099, dev, 1);
        one_case(c, ACCEL__COLL_ALLGATHER, ACCEL_F32, ACCEL_SUM, 4099, dev, 1);
    }
    CHECK_OK(NULL, accel__barrier(c));
}

/* Two all-reduces posted in a group, waited for after it ends; the second on the stream. */
static void grouped(accel__comm *c)
{
    const size_t count = 1 << 16;
    float *h = malloc(count * 4), *g[2];
    CHECK(h != NULL);
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < count; i++) {
            h[i] = (float)val(rank, i, (unsigned)k);
        }
        g[k] = buf_new(count * 4, 1);
        to_buf(g[k], h, count * 4, 1);
    }
    accel_work *w[2];
    CHECK_OK(NULL, accel__comm_group_begin(c));
    for (int k = 0; k < 2; k++) {
        accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, g[k], g[k], count, ACCEL_F32,
                                     ACCEL_SUM, 0);
        CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w[k]));
    }
    CHECK(accel__work_wait(w[0], accel__comm_deadline(c)) == ACCEL_ESTATE);
    CHECK_OK(NULL, accel__comm_group_end(c));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(NULL, accel__work_wait(w[k], accel__comm_deadline(c)));
        accel__work_free(w[k]);
        from_buf(h, g[k], count * 4, 1);
        for (size_t i = 0; i < count; i++) {
            expect(ACCEL_F32, ACCEL_SUM, h, i, reduced(ACCEL_F32, ACCEL_SUM, i, (unsigned)k),
                   "grouped allreduce");
        }
        buf_free(g[k], 1);
    }
    free(h);
}

/* What the backend refuses, by name, and the communicator staying usable after it. */
static void refusals(accel__comm *c)
{
    int16_t *g = buf_new(64 * 2, 1);
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, g, g, 64, ACCEL_I16, ACCEL_SUM, 0);
    CHECK(accel__comm_run(c, &op) == ACCEL_EUNSUPPORTED);
    CHECK_MSG(strstr(accel_last_error(NULL), "NCCL cannot reduce dtype") != NULL, "%s",
              accel_last_error(NULL));
    buf_free(g, 1);
}

/* Input element i of process r for the wire cases: fractions below bf16's (and fp16's)
 * precision, so rounding the inputs and the result both matter. */
static float wire_val(int r, size_t i)
{
    return 1.0f + (float)(i % 97) * 0x1p-13f + (float)r * 0x1p-9f - (float)(i % 5) * 0.75f;
}

static float round_to(accel_dtype wire, float v)
{
    return wire == ACCEL_BF16 ? accel__bf16_to_f32(accel__f32_to_bf16(v))
                              : accel__f16_to_f32(accel__f32_to_f16(v));
}

/* DDP compression (a wire dtype): each input rounded, combined in fp32 in rank order, the
 * result rounded. NCCL reduces in the 16-bit format, which gives exactly that on 1 or 2
 * processes (one rounded addition); on more it rounds partial sums, so a tolerance. */
static void wire(accel__comm *c)
{
    const size_t count = 3000;
    const accel_dtype wires[2] = {ACCEL_BF16, ACCEL_F16};
    const accel_reduce_op ops[2] = {ACCEL_SUM, ACCEL_AVG};
    float *h = malloc(count * 4), *got = malloc(count * 4);
    CHECK(h != NULL && got != NULL);
    for (int w = 0; w < 2; w++) {
        for (int o = 0; o < 2; o++) {
            for (int dev = 0; dev < 2; dev++) {
                for (int in_place = 0; in_place < 2; in_place++) {
                    for (size_t i = 0; i < count; i++) {
                        h[i] = wire_val(rank, i);
                    }
                    float *in = buf_new(count * 4, dev);
                    float *out = in_place ? in : buf_new(count * 4, dev);
                    to_buf(in, h, count * 4, dev);
                    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, in, out, count,
                                                 ACCEL_F32, ops[o], 0);
                    op.wire = wires[w];
                    CHECK_OK(NULL, accel__comm_run(c, &op));
                    from_buf(got, out, count * 4, dev);
                    for (size_t i = 0; i < count; i++) {
                        float acc = round_to(wires[w], wire_val(0, i));
                        for (int r = 1; r < n_ranks; r++) {
                            acc += round_to(wires[w], wire_val(r, i));
                        }
                        if (ops[o] == ACCEL_AVG) {
                            acc /= (float)n_ranks;
                        }
                        float want = round_to(wires[w], acc);
                        float tol = n_ranks <= 2 ? 0.0f
                                                 : (wires[w] == ACCEL_BF16 ? 0x1p-7f : 0x1p-10f) *
                                                       (float)n_ranks * fabsf(want);
                        CHECK_MSG(fabsf(got[i] - want) <= tol,
                                  "allreduce %s through %s (%s, %s): element %zu is %.9g, want "
                                  "%.9g (rank %d of %d)",
                                  ops[o] == ACCEL_SUM ? "sum" : "avg", accel_dtype_name(wires[w]),
                                  dev ? "device" : "host", in_place ? "in place" : "out of place",
                                  i, got[i], want, rank, n_ranks);
                    }
                    if (!in_place) {
                        buf_free(out, dev);
                    }
                    buf_free(in, dev);
                    cases++;
                }
            }
        }
    }
    free(h);
    free(got);
}

/* NCCL's ncclCommSplit returns ncclSuccess on a non-blocking parent while the split still runs
 * (the child NULL until then): the parent must be usable at once after accel__comm_split
 * (NCCL refuses a call on a parent still in progress), the child too, and a process without a
 * color gets no child and leaves the parent usable. */
static void split(accel__comm *c)
{
    accel__comm *child = NULL;
    CHECK_OK(NULL, accel__comm_split(c, rank % 2, rank, &child));
    CHECK(child != NULL);
    CHECK_OK(NULL, accel__barrier(c));
    int cn = accel__comm_n_ranks(child);
    CHECK(cn == (n_ranks + 1 - rank % 2) / 2);
    int32_t v = rank, *d = buf_new(4, 1);
    to_buf(d, &v, 4, 1);
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, d, d, 1, ACCEL_I32, ACCEL_SUM, 0);
    CHECK_OK(NULL, accel__comm_run(child, &op));
    from_buf(&v, d, 4, 1);
    int want = 0;
    for (int r = rank % 2; r < n_ranks; r += 2) {
        want += r;
    }
    CHECK_MSG(v == want, "split allreduce: %d, want %d", v, want);
    buf_free(d, 1);
    accel__comm_free(child);
    child = c;
    CHECK_OK(NULL, accel__comm_split(c, rank == 0 ? 0 : -1, rank, &child));
    CHECK(rank == 0 ? child != NULL && accel__comm_n_ranks(child) == 1 : child == NULL);
    CHECK_OK(NULL, accel__barrier(c));
    if (child != NULL) {
        CHECK_OK(NULL, accel__barrier(child));
        accel__comm_free(child);
    }
    cases += 2;
}

/* Posted, complete, and waited for only after twice the timeout: the watch must not call the
 * untested operation a stall (it asks the backend which posted ones are complete). */
static void untested(int device)
{
    accel__comm *c = comm_new(device, 1);
    int32_t v = rank + 1, *d = buf_new(4, 1);
    to_buf(d, &v, 4, 1);
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, d, d, 1, ACCEL_I32, ACCEL_SUM, 0);
    accel_work *w = NULL;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    struct timespec ts = {2, 500000000};
    nanosleep(&ts, NULL);
    CHECK_OK(NULL, accel__work_wait(w, accel__comm_deadline(c)));
    accel__work_free(w);
    from_buf(&v, d, 4, 1);
    CHECK_MSG(v == n_ranks * (n_ranks + 1) / 2, "untested allreduce: %d", v);
    CHECK_OK(NULL, accel__barrier(c));
    buf_free(d, 1);
    accel__comm_free(c);
    cases++;
}

int main(void)
{
    rank = env_int("RANK", 0);
    n_ranks = env_int("WORLD_SIZE", 1);
    int n_gpus = 0;
    if (cudaGetDeviceCount(&n_gpus) != cudaSuccess || n_gpus == 0) {
        fprintf(stderr, "test_nccl: skipped: no CUDA GPU\n");
        return 77;
    }
    int local_n = env_int("LOCAL_WORLD_SIZE", 1);
    if (local_n > n_gpus) {
        fprintf(stderr, "test_nccl: skipped: %d processes, %d GPU%s (NCCL needs one each)\n",
                local_n, n_gpus, n_gpus == 1 ? "" : "s");
        return 77;
    }
    int device = env_int("LOCAL_RANK", 0);
    CU(cudaSetDevice(device));
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    accel__comm *c = comm_new(device, 60);
    collectives(c);
    grouped(c);
    refusals(c);
    wire(c);
    split(c);
    /* After an abort every call fails at once, naming the abort. */
    accel__comm_abort(c, ACCEL_EPEER, "test abort");
    CHECK(accel__barrier(c) == ACCEL_EPEER);
    CHECK_MSG(strstr(accel_last_error(NULL), "test abort") != NULL, "%s", accel_last_error(NULL));
    accel__comm_free(c);
    untested(device);
    CU(cudaStreamDestroy(stream));
    printf("test_nccl: %d cases on %d process%s: ok\n", cases, n_ranks, n_ranks == 1 ? "" : "es");
    return 0;
}
#endif
