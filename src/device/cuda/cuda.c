/*
 * The CUDA device behind the seam (device.h): one handle per visible GPU, device memory
 * (cudaMalloc) and pinned host memory (cudaHostAlloc), copies and memsets queued on streams,
 * streams and events, and the dispatch of the kernels in kernels.cu.
 *
 * Invariants: every CUDA call's status is checked (CUDA_TRY: the thread error names the call,
 * the CUDA error and file:line; allocation failures are ACCEL_ENOMEM, other CUDA failures
 * ACCEL_EIO); every operation first selects the handle's GPU on the calling thread, so any
 * thread (the communication thread too) may use a handle; the NULL stream is the handle's
 * compute stream, created with the handle and never destroyed while the process runs (users
 * hold it through accel_cuda_stream), and a copy on it that touches host memory has finished
 * when the call returns; every stream owns the scratch its reductions use, so reductions on
 * different streams never share memory.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/device_impl.h"
#include "kernels.h"
#include "vmm.h"

/* GPUs one process can address (CUDA ordinals are small; more is refused by name). */
#define MAX_GPUS 64

typedef struct cuda_stream {
    cudaStream_t stream;
    double *scratch; /* ACCEL__CU_SCRATCH_DOUBLES doubles for reductions on this stream */
} cuda_stream;

typedef struct cuda_gpu {
    int ordinal;
    cuda_stream compute; /* the NULL stream of every call on this GPU */
    char about[256];     /* accel__device_describe */
} cuda_gpu;

typedef struct cuda_slot {
    accel__device dev; /* dev.impl points at gpu */
    cuda_gpu gpu;
    int ready;
} cuda_slot;

static cuda_slot slots[MAX_GPUS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static accel_status cuda_fail(cudaError_t e, const char *call, const char *file, int line)
{
    accel_status st = (e == cudaErrorMemoryAllocation) ? ACCEL_ENOMEM : ACCEL_EIO;
    /* Reported here, so consumed: the runtime keeps a failed call's error as the thread's "last
     * error", and the next launch's cudaGetLastError would blame that kernel for it. */
    (void)cudaGetLastError();
    return accel__seterr(NULL, st, "CUDA: %s failed: %s (%s) [%s:%d]", call, cudaGetErrorString(e),
                         cudaGetErrorName(e), base_name(file), line);
}

/* A CUDA runtime call that must succeed; on failure the function returns its accel status. */
#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t cuda_e_ = (call);                                                              \
        if (cuda_e_ != cudaSuccess) {                                                              \
            return cuda_fail(cuda_e_, #call, __FILE__, __LINE__);                                  \
        }                                                                                          \
    } while (0)

/* For functions without a status (frees): the failure is logged, never dropped. */
#define CUDA_WARN(call)                                                                            \
    do {                                                                                           \
        cudaError_t cuda_e_ = (call);                                                              \
        if (cuda_e_ != cudaSuccess) {                                                              \
            accel__log(NULL, ACCEL__LOG_WARN, "CUDA: %s failed: %s (%s) [%s:%d]", #call,           \
                       cudaGetErrorString(cuda_e_), cudaGetErrorName(cuda_e_),                     \
                       base_name(__FILE__), __LINE__);                                             \
        }                                                                                          \
    } while (0)

static cuda_gpu *gpu_of(const accel__device *d)
{
    return d->impl;
}

/* Selects d's GPU on the calling thread (cheap when it already is). */
static accel_status use(const accel__device *d)
{
    CUDA_TRY(cudaSetDevice(gpu_of(d)->ordinal));
    return ACCEL_OK;
}

static cuda_stream *stream_of(accel__device *d, accel__stream *s)
{
    return s != NULL ? s->impl : &gpu_of(d)->compute;
}

static accel_status stream_init(cuda_stream *cs, unsigned flags)
{
    CUDA_TRY(cudaStreamCreateWithFlags(&cs->stream, flags));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, ACCEL__CU_SCRATCH_DOUBLES * sizeof(double));
    if (e != cudaSuccess) {
        CUDA_WARN(cudaStreamDestroy(cs->stream));
        return cuda_fail(e, "cudaMalloc(reduction scratch)", __FILE__, __LINE__);
    }
    cs->scratch = p;
    return ACCEL_OK;
}

/* ---- handles ---- */

accel_status accel__device_cuda_count(int *n)
{
    *n = 0;
    int k = 0;
    cudaError_t e = cudaGetDeviceCount(&k);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        /* Nothing is wrong: this machine (or CUDA_VISIBLE_DEVICES) has no GPU for us. */
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "no CUDA device: %s (%s)",
                             cudaGetErrorString(e), cudaGetErrorName(e));
    }
    CUDA_TRY(e);
    if (k == 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "no CUDA device: the runtime sees none");
    }
    *n = k;
    return ACCEL_OK;
}

static void describe_gpu(cuda_gpu *g)
{
    struct cudaDeviceProp prop;
    int driver = 0, runtime = 0;
    if (cudaGetDeviceProperties(&prop, g->ordinal) != cudaSuccess ||
        cudaDriverGetVersion(&driver) != cudaSuccess ||
        cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
        snprintf(g->about, sizeof(g->about), "cuda:%d (properties unavailable: %s)", g->ordinal,
                 cudaGetErrorString(cudaGetLastError()));
        return;
    }
    unsigned gib10 = (unsigned)(prop.totalGlobalMem * 10 / ((size_t)1 << 30)); /* GiB x 10 */
    snprintf(g->about, sizeof(g->about),
             "%.120s, compute capability %d.%d, %u.%u GiB, driver %d.%d, runtime %d.%d", prop.name,
             prop.major, prop.minor, gib10 / 10, gib10 % 10, driver / 1000, driver % 1000 / 10,
             runtime / 1000, runtime % 1000 / 10);
}

static const accel__device_ops cuda_ops;

static accel_status slot_init(cuda_slot *sl, int index)
{
    CUDA_TRY(cudaSetDevice(index));
    sl->gpu.ordinal = index;
    /* cudaStreamDefault: the legacy default stream (stream 0) stays ordered with it, so a
     * user kernel launched without a stream still sees accel's work in order. */
    ACCEL_TRY(stream_init(&sl->gpu.compute, cudaStreamDefault));
    describe_gpu(&sl->gpu);
    sl->dev.ops = &cuda_ops;
    sl->dev.which.type = ACCEL_DEVICE_CUDA;
    sl->dev.which.index = index;
    sl->dev.impl = &sl->gpu;
    sl->ready = 1;
    return ACCEL_OK;
}

accel_status accel__device_cuda_open(accel__device **out, int index)
{
    int n = 0;
    if (accel__device_cuda_count(&n) != ACCEL_OK) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "device cuda:%d: %s", index,
                             accel_last_error(NULL));
    }
    if (index >= n || index >= MAX_GPUS) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "device cuda:%d does not exist (%d CUDA device%s visible%s%s%s)",
                             index, n, n == 1 ? "" : "s", vis ? ", CUDA_VISIBLE_DEVICES=\"" : "",
                             vis ? vis : "", vis ? "\"" : "");
    }
    pthread_mutex_lock(&slots_lock);
    accel_status st = slots[index].ready ? ACCEL_OK : slot_init(&slots[index], index);
    pthread_mutex_unlock(&slots_lock);
    if (st == ACCEL_OK) {
        st = use(&slots[index].dev); /* the opener's thread computes on this GPU from now on */
    }
    if (st != ACCEL_OK) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "device cuda:%d: %s", index,
                             accel_last_error(NULL));
    }
    *out = &slots[index].dev;
    return ACCEL_OK;
}

static void cuda_describe(const accel__device *d, char *buf, size_t nbytes)
{
    snprintf(buf, nbytes, "%s", gpu_of(d)->about);
}

/* ---- memory ---- */

static accel_status cuda_alloc(accel__device *d, size_t nbytes, int zero, void **out)
{
    ACCEL_TRY(use(d));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, nbytes > 0 ? nbytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* consumed: see cuda_fail */
        return accel__seterr(NULL, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                             "cuda:%d: cudaMalloc of %zu bytes failed: %s (%s)", gpu_of(d)->ordinal,
                             nbytes, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (zero) {
        /* Zeroed for every stream, not only the compute stream: wait for the fill. */
        cudaStream_t cs = gpu_of(d)->compute.stream;
        e = cudaMemsetAsync(p, 0, nbytes, cs);
        if (e == cudaSuccess) {
            e = cudaStreamSynchronize(cs);
        }
        if (e != cudaSuccess) {
            CUDA_WARN(cudaFree(p));
            return cuda_fail(e, "zero-filling a new allocation", __FILE__, __LINE__);
        }
    }
    *out = p;
    return ACCEL_OK;
}

static void cuda_free(accel__device *d, void *p)
{
    if (use(d) != ACCEL_OK) {
        accel__log(NULL, ACCEL__LOG_WARN, "cuda free: %s", accel_last_error(NULL));
        return;
    }
    CUDA_WARN(cudaFree(p));
}

static accel_status cuda_host_alloc(accel__device *d, size_t nbytes, void **out)
{
    ACCEL_TRY(use(d));
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, nbytes > 0 ? nbytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* consumed: see cuda_fail */
        return accel__seterr(NULL, e == cudaErrorMemoryAllocation ? ACCEL_ENOMEM : ACCEL_EIO,
                             "cuda:%d: cudaHostAlloc of %zu pinned bytes failed: %s (%s)",
                             gpu_of(d)->ordinal, nbytes, cudaGetErrorString(e),
                             cudaGetErrorName(e));
    }
    *out = p;
    return ACCEL_OK;
}

static void cuda_host_free(accel__device *d, void *p)
{
    if (use(d) != ACCEL_OK) {
        accel__log(NULL, ACCEL__LOG_WARN, "cuda host free: %s", accel_last_error(NULL));
        return;
    }
    CUDA_WARN(cudaFreeHost(p));
}

static accel_status cuda_holds(accel__device *d, const void *p, int *out)
{
    ACCEL_TRY(use(d));
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e == cudaErrorInvalidValue) {
        (void)cudaGetLastError(); /* older runtimes: host memory CUDA never saw */
        *out = 0;
        return ACCEL_OK;
    }
    CUDA_TRY(e);
    if (a.type != cudaMemoryTypeDevice) {
        *out = 0; /* pageable, pinned or managed: the host reads it */
        return ACCEL_OK;
    }
    if (a.device != gpu_of(d)->ordinal) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "pointer %p is memory of cuda:%d, but this process computes on cuda:%d",
                             (void *)(uintptr_t)p, a.device, gpu_of(d)->ordinal);
    }
    *out = 1;
    return ACCEL_OK;
}

static accel_status cuda_memset(accel__device *d, void *p, int byte, size_t nbytes,
                                accel__stream *s)
{
    ACCEL_TRY(use(d));
    CUDA_TRY(cudaMemsetAsync(p, byte, nbytes, stream_of(d, s)->stream));
    return ACCEL_OK;
}

static accel_status cuda_copy(accel__device *d, void *dst, const void *src, size_t nbytes,
                              accel__copy_kind kind, accel__stream *s)
{
    static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToHost, cudaMemcpyHostToDevice,
                                                cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    ACCEL_TRY(use(d));
    cudaStream_t cs = stream_of(d, s)->stream;
    CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, kinds[kind], cs));
    if (s == NULL && kind != ACCEL__COPY_D2D) {
        /* The default order's promise: host memory may be read or reused on return. */
        CUDA_TRY(cudaStreamSynchronize(cs));
    }
    return ACCEL_OK;
}

/* ---- streams and events ---- */

static accel_status cuda_stream_new(accel__device *d, accel__stream *s)
{
    ACCEL_TRY(use(d));
    cuda_stream *cs = accel__calloc(1, sizeof(*cs));
    if (cs == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "cuda stream: out of memory");
    }
    /* Non-blocking: a user's work on the legacy default stream never waits for it. */
    accel_status st = stream_init(cs, cudaStreamNonBlocking);
    if (st != ACCEL_OK) {
        accel__free(cs);
        return st;
    }
    s->impl = cs;
    return ACCEL_OK;
}

static void cuda_stream_free(accel__device *d, accel__stream *s)
{
    cuda_stream *cs = s->impl;
    if (use(d) == ACCEL_OK) {
        CUDA_WARN(cudaStreamDestroy(cs->stream));
        CUDA_WARN(cudaFree(cs->scratch));
    } else {
        accel__log(NULL, ACCEL__LOG_WARN, "cuda stream free: %s", accel_last_error(NULL));
    }
    accel__free(cs);
}

static accel_status cuda_stream_sync(accel__device *d, accel__stream *s)
{
    ACCEL_TRY(use(d));
    CUDA_TRY(cudaStreamSynchronize(stream_of(d, s)->stream));
    return ACCEL_OK;
}

static accel_status cuda_event_new(accel__device *d, accel__event *e)
{
    ACCEL_TRY(use(d));
    cudaEvent_t ev;
    CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e->impl = ev;
    return ACCEL_OK;
}

static void cuda_event_free(accel__device *d, accel__event *e)
{
    if (use(d) == ACCEL_OK) {
        CUDA_WARN(cudaEventDestroy((cudaEvent_t)e->impl));
    } else {
        accel__log(NULL, ACCEL__LOG_WARN, "cuda event free: %s", accel_last_error(NULL));
    }
}

static accel_status cuda_event_record(accel__device *d, accel__event *e, accel__stream *s)
{
    ACCEL_TRY(use(d));
    CUDA_TRY(cudaEventRecord((cudaEvent_t)e->impl, stream_of(d, s)->stream));
    return ACCEL_OK;
}

static accel_status cuda_stream_wait_event(accel__device *d, accel__stream *s, accel__event *e)
{
    ACCEL_TRY(use(d));
    CUDA_TRY(cudaStreamWaitEvent(stream_of(d, s)->stream, (cudaEvent_t)e->impl, 0));
    return ACCEL_OK;
}

/* A failed query counts as complete (so no caller polls forever) with the error set; the
 * next synchronisation reports it again. */
static int cuda_event_query(accel__device *d, accel__event *e)
{
    if (use(d) != ACCEL_OK) {
        return 1;
    }
    cudaError_t r = cudaEventQuery((cudaEvent_t)e->impl);
    if (r == cudaErrorNotReady) {
        return 0;
    }
    if (r != cudaSuccess) {
        (void)cuda_fail(r, "cudaEventQuery", __FILE__, __LINE__);
    }
    return 1;
}

static accel_status cuda_event_sync(accel__device *d, accel__event *e)
{
    ACCEL_TRY(use(d));
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)e->impl));
    return ACCEL_OK;
}

static void *cuda_native_stream(accel__device *d, accel__stream *s)
{
    return stream_of(d, s)->stream;
}

/* ---- kernels ---- */

static accel_status unsupported(const char *who, accel_dtype dt)
{
    const char *name = accel_dtype_name(dt);
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "cuda device: %s does not support dtype %s", who,
                         name ? name : "?");
}

static int is_float(accel_dtype dt)
{
    return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16;
}

/* The status of a launch (kernels.h): OK, or the CUDA error named after the kernel. */
static accel_status launched(cudaError_t e, const char *kernel)
{
    return e == cudaSuccess ? ACCEL_OK : cuda_fail(e, kernel, __FILE__, __LINE__);
}

static accel_status cuda_convert(accel__device *d, accel__dspan dst, accel__dspan src,
                                 accel__stream *s)
{
    if (!is_float(src.dtype)) {
        return unsupported("convert (source)", src.dtype);
    }
    if (!is_float(dst.dtype)) {
        return unsupported("convert (destination)", dst.dtype);
    }
    ACCEL_TRY(use(d));
    return launched(accel__cu_convert(dst.data, dst.dtype, src.data, src.dtype, src.count,
                                      stream_of(d, s)->stream),
                    "convert");
}

static accel_status cuda_zero(accel__device *d, accel__dspan x, accel__stream *s)
{
    return cuda_memset(d, x.data, 0, x.count * accel_dtype_nbytes(x.dtype), s);
}

static accel_status cuda_scale(accel__device *d, accel__dspan x, float factor, accel__stream *s)
{
    if (x.dtype != ACCEL_F32) {
        return unsupported("scale", x.dtype);
    }
    ACCEL_TRY(use(d));
    return launched(accel__cu_scale(x.data, x.count, factor, stream_of(d, s)->stream), "scale");
}

static accel_status cuda_clamp(accel__device *d, accel__dspan x, float lo, float hi,
                               accel__stream *s)
{
    if (x.dtype != ACCEL_F32) {
        return unsupported("clamp", x.dtype);
    }
    ACCEL_TRY(use(d));
    return launched(accel__cu_clamp(x.data, x.count, lo, hi, stream_of(d, s)->stream), "clamp");
}

static accel_status cuda_pow_sum(accel__device *d, accel__dspan x, double p, double *acc,
                                 accel__stream *s)
{
    if (!is_float(x.dtype)) {
        return unsupported("pow_sum", x.dtype);
    }
    ACCEL_TRY(use(d));
    cuda_stream *cs = stream_of(d, s);
    return launched(accel__cu_pow_sum(x.data, x.dtype, x.count, p, acc, cs->scratch, cs->stream),
                    "pow_sum");
}

static accel_status cuda_abs_max(accel__device *d, accel__dspan x, double *acc, accel__stream *s)
{
    if (!is_float(x.dtype)) {
        return unsupported("abs_max", x.dtype);
    }
    ACCEL_TRY(use(d));
    cuda_stream *cs = stream_of(d, s);
    return launched(accel__cu_abs_max(x.data, x.dtype, x.count, acc, cs->scratch, cs->stream),
                    "abs_max");
}

static accel_status cuda_nonfinite(accel__device *d, accel__dspan x, int32_t *flag,
                                   accel__stream *s)
{
    if (!is_float(x.dtype)) {
        return unsupported("nonfinite", x.dtype);
    }
    ACCEL_TRY(use(d));
    return launched(accel__cu_nonfinite(x.data, x.dtype, x.count, flag, stream_of(d, s)->stream),
                    "nonfinite");
}

static accel_status cuda_unscale_check(accel__device *d, accel__dspan x, float factor,
                                       int32_t *flag, accel__stream *s)
{
    if (x.dtype != ACCEL_F32) {
        return unsupported("unscale_check", x.dtype);
    }
    ACCEL_TRY(use(d));
    return launched(accel__cu_unscale_check(x.data, x.count, factor, flag, stream_of(d, s)->stream),
                    "unscale_check");
}

static accel_status cuda_sgd_step(accel__device *d, const accel__sgd_args *a, accel__stream *s)
{
    ACCEL_TRY(use(d));
    /* The constants as cpu_optim.c derives them (fp32, on the host). */
    accel__cu_sgd k = {a->param,
                       a->grad,
                       a->momentum != 0 ? a->momentum_buf : NULL,
                       a->count,
                       a->lr,
                       a->weight_decay,
                       a->momentum,
                       1.0f - a->dampening,
                       a->maximize ? -1.0f : 1.0f,
                       a->nesterov,
                       a->first_step};
    return launched(accel__cu_sgd_step(&k, stream_of(d, s)->stream), "sgd_step");
}

static accel_status cuda_adam_step(accel__device *d, const accel__adam_args *a, accel__stream *s)
{
    ACCEL_TRY(use(d));
    accel__adam_coef c =
        accel__adam_coef_make(a->lr, a->weight_decay, a->decoupled, a->beta1, a->beta2, a->eps,
                              a->bias_correction1, a->bias_correction2_sqrt, a->maximize);
    return launched(accel__cu_adam_step(&c, a->param, a->grad, a->exp_avg, a->exp_avg_sq,
                                        a->max_exp_avg_sq, a->compute, a->compute_dtype, a->count,
                                        stream_of(d, s)->stream),
                    "adam_step");
}

/* ---- reserved ranges: the driver's virtual memory management (vmm.c) ---- */

static accel_status cuda_range_granularity(accel__device *d, size_t *out)
{
    ACCEL_TRY(use(d));
    return accel__cuda_vmm_granularity(gpu_of(d)->ordinal, gpu_of(d)->about, out);
}

static accel_status cuda_range_reserve(accel__device *d, size_t nbytes, void **base)
{
    ACCEL_TRY(use(d));
    return accel__cuda_vmm_reserve(gpu_of(d)->ordinal, nbytes, base);
}

static void cuda_range_release(accel__device *d, void *base, size_t nbytes)
{
    if (use(d) == ACCEL_OK) {
        accel__cuda_vmm_release(base, nbytes);
    }
}

static accel_status cuda_range_map(accel__device *d, void *at, size_t nbytes, void **phys)
{
    ACCEL_TRY(use(d));
    return accel__cuda_vmm_map(gpu_of(d)->ordinal, at, nbytes, phys);
}

static accel_status cuda_range_unmap(accel__device *d, void *at, size_t nbytes, void *phys)
{
    ACCEL_TRY(use(d));
    return accel__cuda_vmm_unmap(at, nbytes, phys);
}

static const accel__device_ops cuda_ops = {
    .name = "cuda",
    .describe = cuda_describe,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .holds = cuda_holds,
    .memset = cuda_memset,
    .copy = cuda_copy,
    .stream_new = cuda_stream_new,
    .stream_free = cuda_stream_free,
    .stream_sync = cuda_stream_sync,
    .event_new = cuda_event_new,
    .event_free = cuda_event_free,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .native_stream = cuda_native_stream,
    .sgd_step = cuda_sgd_step,
    .adam_step = cuda_adam_step,
    .convert = cuda_convert,
    .zero = cuda_zero,
    .scale = cuda_scale,
    .clamp = cuda_clamp,
    .pow_sum = cuda_pow_sum,
    .abs_max = cuda_abs_max,
    .nonfinite = cuda_nonfinite,
    .unscale_check = cuda_unscale_check,
    .range_granularity = cuda_range_granularity,
    .range_reserve = cuda_range_reserve,
    .range_release = cuda_range_release,
    .range_map = cuda_range_map,
    .range_unmap = cuda_range_unmap,
};
