/*
 * The simulated GPU (sim.h): the CUDA device's contract (device.h) kept strictly, on host
 * memory and the CPU device's kernels, so the device code paths run and fail in CI.
 *
 * Invariants: device memory is its own mmap'ed blocks, registered here and PROT_NONE except
 * while queued work runs (a stray host read or write faults, and the fault handler names the
 * block); every copy, memset and kernel checks that its pointers are where its kind says
 * (device memory of this GPU, within one block) when it is issued; work on a stream is queued
 * and runs only when something waits for it (stream or event sync, an event query, a
 * default-order copy touching host memory, a free), in issue order, a wait on an event first
 * running the event's stream up to the point recorded. One mutex serialises the whole
 * simulation (work runs on whichever thread waits for it); queued "kernels" must not call back
 * into the device seam.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim_impl.h"

typedef struct accel__sim_stream sim_stream;
typedef struct sim_gpu sim_gpu;
typedef accel__sim_op sim_op;

struct accel__sim_stream {
    sim_gpu *gpu;
    sim_op *head, *tail;
    uint64_t issued, done; /* operations issued and run so far */
    accel_status err;      /* the first failure of a queued operation, reported by the next sync */
    char msg[256];
    sim_stream *next_live; /* streams of accel__stream_new, for the stream's release */
};

struct sim_gpu {
    accel__device dev;
    sim_stream compute; /* the NULL stream */
    int ready;
};

typedef struct sim_event {
    sim_stream *on; /* NULL: never recorded, or its stream is gone (complete) */
    uint64_t seq;
    struct sim_event *next_live;
} sim_event;

typedef struct sim_block {
    char *base;
    size_t nbytes, mapped;
    int gpu;
    unsigned char *on; /* a reserved range: which granules are mapped (else NULL) */
} sim_block;

/* The granule of reserved ranges: smaller than a GPU's 2 MiB, so that tests' small models
 * span several. */
#define SIM_GRANULE ((size_t)65536)

static struct {
    pthread_mutex_t lock;
    int n_gpus;
    sim_gpu gpus[ACCEL__SIM_MAX_GPUS];
    sim_block *blocks;
    int n_blocks, cap_blocks;
    sim_stream *streams;
    sim_event *events;
    sim_op *free_ops;
    int open_depth; /* > 0 while queued work runs: device memory is accessible */
    int handler;
    struct sigaction old_segv;
} sim = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const accel__device_ops sim_ops;

static sim_gpu *gpu_of(const accel__device *d)
{
    return d->impl;
}

static int index_of(const accel__device *d)
{
    return d->which.index;
}

/* ---- device memory: blocks, protection, the fault handler ---- */

static void set_access(int open)
{
    for (int i = 0; i < sim.n_blocks; i++) {
        const sim_block *b = &sim.blocks[i];
        for (size_t g = 0; b->on != NULL && g < b->mapped / SIM_GRANULE; g++) {
            /* The unmapped granules of a range stay inaccessible even to queued work. */
            (void)mprotect(b->base + g * SIM_GRANULE, SIM_GRANULE,
                           open && b->on[g] ? PROT_READ | PROT_WRITE : PROT_NONE);
        }
        if (b->on == NULL) {
            (void)mprotect(b->base, b->mapped, open ? PROT_READ | PROT_WRITE : PROT_NONE);
        }
    }
}

static void open_memory(void)
{
    if (sim.open_depth++ == 0) {
        set_access(1);
    }
}

static void close_memory(void)
{
    if (--sim.open_depth == 0) {
        set_access(0);
    }
}

/* The block whose pages hold p, or NULL (host memory). */
static sim_block *find_block(const void *p)
{
    const char *c = p;
    for (int i = 0; i < sim.n_blocks; i++) {
        if (c >= sim.blocks[i].base && c < sim.blocks[i].base + sim.blocks[i].mapped) {
            return &sim.blocks[i];
        }
    }
    return NULL;
}

/* Host code touched device memory: say which block before the fault takes its course (the
 * previous handler, or the default crash, when the access is retried). snprintf is not
 * async-signal-safe; the process is dying of a bug either way, and the line is the point. */
static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    const sim_block *b = find_block(si->si_addr); /* racy, but the process is going down */
    if (b != NULL) {
        char msg[400];
        int n = snprintf(msg, sizeof(msg),
                         "accel: host code touched simulated device memory at %p (%zu bytes at "
                         "%p on simulated cuda:%d, ACCEL_SIM_GPU): on a GPU this reads garbage "
                         "or crashes; reach device memory through copies or queued kernels%s\n",
                         si->si_addr, b->nbytes, (void *)b->base, b->gpu,
                         b->on != NULL && !b->on[((char *)si->si_addr - b->base) / SIM_GRANULE]
                             ? " (or: it touched an UNMAPPED granule of a reserved range: "
                               "unmapped before the queued work that reads it had run)"
                             : "");
        if (n > 0 && write(2, msg, (size_t)n) < 0) {
            n = 0; /* nothing more to do */
        }
    }
    sigaction(SIGSEGV, &sim.old_segv, NULL);
}

static void install_handler(void)
{
    if (sim.handler) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sim.handler = sigaction(SIGSEGV, &sa, &sim.old_segv) == 0;
}

/* p .. p + nbytes must be device memory of d, inside one block. */
accel_status accel__sim_need_dev(accel__device *d, const char *who, const char *what, const void *p,
                                 size_t nbytes)
{
    const sim_block *b = find_block(p);
    if (b == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s %p is host memory, not device memory",
                             index_of(d), who, what, p);
    }
    if (b->gpu != index_of(d)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s %p is memory of cuda:%d, not this GPU's",
                             index_of(d), who, what, p, b->gpu);
    }
    size_t off = (size_t)((const char *)p - b->base);
    if (off > b->nbytes || nbytes > b->nbytes - off) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s: %zu bytes at %p run past the end of its "
                             "device allocation (%zu bytes at %p)",
                             index_of(d), who, what, nbytes, p, b->nbytes, (void *)b->base);
    }
    for (size_t g = off / SIM_GRANULE; b->on != NULL && g * SIM_GRANULE < off + nbytes; g++) {
        if (!b->on[g]) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "simulated cuda:%d: %s: %s: %zu bytes at %p reach an unmapped "
                                 "granule (%zu) of a reserved range",
                                 index_of(d), who, what, nbytes, p, g);
        }
    }
    return ACCEL_OK;
}

/* p .. p + nbytes must be host memory. */
static accel_status need_host(accel__device *d, const char *who, const char *what, const void *p,
                              size_t nbytes)
{
    const sim_block *b = find_block(p);
    if (b == NULL && nbytes > 0) {
        b = find_block((const char *)p + nbytes - 1);
    }
    if (b != NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: %s: %s %p is device memory of cuda:%d, but the "
                             "copy's kind says host memory",
                             index_of(d), who, what, p, b->gpu);
    }
    return ACCEL_OK;
}

/* ---- queues ---- */

static void run_op(sim_stream *s, sim_op *op);

/* Runs s's queued work until `upto` operations have run. */
static void flush(sim_stream *s, uint64_t upto)
{
    open_memory();
    while (s->done < upto && s->head != NULL) {
        sim_op *op = s->head;
        s->head = op->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        run_op(s, op);
        s->done++;
        op->next = sim.free_ops;
        sim.free_ops = op;
    }
    close_memory();
}

/* Every queue of every GPU, run to its end (what cudaFree and cudaFreeHost do). */
static void flush_all(void)
{
    for (int g = 0; g < ACCEL__SIM_MAX_GPUS; g++) {
        if (sim.gpus[g].ready) {
            flush(&sim.gpus[g].compute, sim.gpus[g].compute.issued);
        }
    }
    for (sim_stream *s = sim.streams; s != NULL; s = s->next_live) {
        flush(s, s->issued);
    }
}

/* The first failure of s's work, reported once (as CUDA reports an asynchronous error). */
static accel_status take_error(sim_stream *s)
{
    accel_status st = s->err;
    if (st != ACCEL_OK) {
        s->err = ACCEL_OK;
        return accel__seterr(NULL, st, "simulated cuda:%d: queued work failed: %s",
                             (int)(s->gpu - sim.gpus), s->msg);
    }
    return ACCEL_OK;
}

static sim_stream *stream_of(accel__device *d, accel__stream *s)
{
    return s != NULL ? s->impl : &gpu_of(d)->compute;
}

accel_status accel__sim_enqueue(accel__device *d, accel__stream *s, const sim_op *tmpl)
{
    if (s != NULL && s->dev != d) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: a stream of another device was passed",
                             index_of(d));
    }
    sim_stream *ss = stream_of(d, s);
    sim_op *op = sim.free_ops;
    if (op != NULL) {
        sim.free_ops = op->next;
    } else if ((op = accel__malloc(sizeof(*op))) == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "simulated cuda:%d: out of memory for a queue",
                             index_of(d));
    }
    *op = *tmpl;
    op->next = NULL;
    if (ss->tail != NULL) {
        ss->tail->next = op;
    } else {
        ss->head = op;
    }
    ss->tail = op;
    ss->issued++;
    return ACCEL_OK;
}

/* The locked body of an operation: lock, run `call` (an accel_status expression), unlock. */
#define LOCKED(call)                                                                               \
    do {                                                                                           \
        pthread_mutex_lock(&sim.lock);                                                             \
        accel_status locked_st_ = (call);                                                          \
        pthread_mutex_unlock(&sim.lock);                                                           \
        return locked_st_;                                                                         \
    } while (0)

void accel__sim_lock(void)
{
    pthread_mutex_lock(&sim.lock);
}

void accel__sim_unlock(void)
{
    pthread_mutex_unlock(&sim.lock);
}

/* ---- handles ---- */

void accel__device_sim_enable(int n_gpus)
{
    pthread_mutex_lock(&sim.lock);
    sim.n_gpus = n_gpus < 0 ? 0 : n_gpus > ACCEL__SIM_MAX_GPUS ? ACCEL__SIM_MAX_GPUS : n_gpus;
    pthread_mutex_unlock(&sim.lock);
}

int accel__device_sim_count(void)
{
    pthread_mutex_lock(&sim.lock);
    int n = sim.n_gpus;
    pthread_mutex_unlock(&sim.lock);
    return n;
}

int accel__device_is_sim(const accel__device *d)
{
    return d != NULL && d->ops == &sim_ops;
}

static accel_status open_locked(accel__device **out, int index)
{
    if (sim.n_gpus == 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "device cuda:%d: no simulated GPU", index);
    }
    if (index < 0 || index >= sim.n_gpus) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "device cuda:%d does not exist (%d simulated GPU%s, ACCEL_SIM_GPU)",
                             index, sim.n_gpus, sim.n_gpus == 1 ? "" : "s");
    }
    sim_gpu *g = &sim.gpus[index];
    if (!g->ready) {
        install_handler();
        g->dev.ops = &sim_ops;
        g->dev.which = (accel_device){ACCEL_DEVICE_CUDA, index};
        g->dev.impl = g;
        g->compute.gpu = g;
        g->ready = 1;
    }
    *out = &g->dev;
    return ACCEL_OK;
}

accel_status accel__device_sim_open(accel__device **out, int index)
{
    LOCKED(open_locked(out, index));
}

static void sim_describe(const accel__device *d, char *buf, size_t nbytes)
{
    snprintf(buf, nbytes,
             "simulated GPU %d (ACCEL_SIM_GPU, a testing aid: page-protected host memory, "
             "streams deferred until synchronised, the CPU's kernels)",
             index_of(d));
}

/* ---- memory ---- */

static accel_status alloc_locked(accel__device *d, size_t nbytes, int zero, void **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (nbytes > SIZE_MAX / 2 || (sim.n_blocks == sim.cap_blocks && sim.cap_blocks > (1 << 24))) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "simulated cuda:%d: out of memory allocating %zu bytes", index_of(d),
                             nbytes);
    }
    if (sim.n_blocks == sim.cap_blocks) {
        int cap = sim.cap_blocks ? 2 * sim.cap_blocks : 64;
        sim_block *nb = accel__realloc(sim.blocks, (size_t)cap * sizeof(*nb));
        if (nb == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM,
                                 "simulated cuda:%d: out of memory allocating %zu bytes",
                                 index_of(d), nbytes);
        }
        sim.blocks = nb;
        sim.cap_blocks = cap;
    }
    size_t mapped = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "simulated cuda:%d: out of memory allocating %zu bytes", index_of(d),
                             nbytes);
    }
    /* Fresh memory is poison (NaN in every float dtype) unless asked for zeros. */
    memset(p, zero ? 0 : 0xFF, mapped);
    if (sim.open_depth == 0) {
        (void)mprotect(p, mapped, PROT_NONE);
    }
    sim.blocks[sim.n_blocks++] = (sim_block){p, nbytes, mapped, index_of(d), NULL};
    *out = p;
    return ACCEL_OK;
}

static accel_status sim_alloc(accel__device *d, size_t nbytes, int zero, void **out)
{
    LOCKED(alloc_locked(d, nbytes, zero, out));
}

static void sim_free(accel__device *d, void *p)
{
    pthread_mutex_lock(&sim.lock);
    flush_all(); /* cudaFree waits for the device */
    int i = 0;
    while (i < sim.n_blocks && (sim.blocks[i].base != p || sim.blocks[i].on != NULL)) {
        i++;
    }
    if (i == sim.n_blocks) {
        accel__log(NULL, ACCEL__LOG_ERROR,
                   "simulated cuda:%d: free of %p, which is not the start of a device allocation",
                   index_of(d), p);
    } else {
        (void)munmap(sim.blocks[i].base, sim.blocks[i].mapped);
        sim.blocks[i] = sim.blocks[--sim.n_blocks];
    }
    pthread_mutex_unlock(&sim.lock);
}

static accel_status sim_host_alloc(accel__device *d, size_t nbytes, void **out)
{
    void *p = accel__aligned_alloc(nbytes > 0 ? nbytes : 1);
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "simulated cuda:%d: out of memory allocating %zu pinned bytes",
                             index_of(d), nbytes);
    }
    memset(p, 0xFF, nbytes); /* cudaHostAlloc's memory is not initialised */
    *out = p;
    return ACCEL_OK;
}

static void sim_host_free(accel__device *d, void *p)
{
    (void)d;
    pthread_mutex_lock(&sim.lock);
    flush_all(); /* cudaFreeHost waits for the device */
    pthread_mutex_unlock(&sim.lock);
    accel__aligned_free(p);
}

static accel_status holds_locked(accel__device *d, const void *p, int *out)
{
    const sim_block *b = find_block(p);
    *out = 0;
    if (b != NULL && b->gpu != index_of(d)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "pointer %p is memory of cuda:%d, but this process computes on "
                             "cuda:%d",
                             p, b->gpu, index_of(d));
    }
    *out = b != NULL;
    return ACCEL_OK;
}

static accel_status sim_holds(accel__device *d, const void *p, int *out)
{
    LOCKED(holds_locked(d, p, out));
}

static accel_status memset_locked(accel__device *d, void *p, int byte, size_t nbytes,
                                  accel__stream *s)
{
    ACCEL_TRY(accel__sim_need_dev(d, "memset", "the destination", p, nbytes));
    sim_op op = {.kind = ACCEL__SIM_MEMSET, .dst = p, .byte = byte, .nbytes = nbytes};
    return accel__sim_enqueue(d, s, &op);
}

static accel_status sim_memset(accel__device *d, void *p, int byte, size_t nbytes, accel__stream *s)
{
    LOCKED(memset_locked(d, p, byte, nbytes, s));
}

static const char *const kind_names[] = {"H2H", "H2D", "D2H", "D2D"};

static accel_status copy_locked(accel__device *d, void *dst, const void *src, size_t nbytes,
                                accel__copy_kind kind, accel__stream *s)
{
    char who[32];
    snprintf(who, sizeof(who), "copy %s", kind_names[kind]);
    int dst_dev = kind == ACCEL__COPY_H2D || kind == ACCEL__COPY_D2D;
    int src_dev = kind == ACCEL__COPY_D2H || kind == ACCEL__COPY_D2D;
    ACCEL_TRY(dst_dev ? accel__sim_need_dev(d, who, "the destination", dst, nbytes)
                      : need_host(d, who, "the destination", dst, nbytes));
    ACCEL_TRY(src_dev ? accel__sim_need_dev(d, who, "the source", src, nbytes)
                      : need_host(d, who, "the source", src, nbytes));
    sim_op op = {.kind = ACCEL__SIM_COPY, .dst = dst, .src = src, .nbytes = nbytes};
    ACCEL_TRY(accel__sim_enqueue(d, s, &op));
    if (s == NULL && kind != ACCEL__COPY_D2D) {
        /* The default order's promise: host memory may be read or reused on return. */
        sim_stream *cs = &gpu_of(d)->compute;
        flush(cs, cs->issued);
        return take_error(cs);
    }
    return ACCEL_OK;
}

static accel_status sim_copy(accel__device *d, void *dst, const void *src, size_t nbytes,
                             accel__copy_kind kind, accel__stream *s)
{
    LOCKED(copy_locked(d, dst, src, nbytes, kind, s));
}

/* ---- streams and events ---- */

static accel_status sim_stream_new(accel__device *d, accel__stream *s)
{
    sim_stream *ss = accel__calloc(1, sizeof(*ss));
    if (ss == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "simulated cuda:%d: out of memory for a stream",
                             index_of(d));
    }
    pthread_mutex_lock(&sim.lock);
    ss->gpu = gpu_of(d);
    ss->next_live = sim.streams;
    sim.streams = ss;
    pthread_mutex_unlock(&sim.lock);
    s->impl = ss;
    return ACCEL_OK;
}

/* The queued ops from head on stop pointing at ss (freed). */
static void forget_stream(sim_op *head, const sim_stream *ss)
{
    for (sim_op *op = head; op != NULL; op = op->next) {
        op->on = op->on == ss ? NULL : op->on;
    }
}

/* (The front end synchronised s first.) Events and waits that point at s are complete. */
static void sim_stream_free(accel__device *d, accel__stream *s)
{
    (void)d;
    sim_stream *ss = s->impl;
    pthread_mutex_lock(&sim.lock);
    flush(ss, ss->issued);
    for (sim_stream **at = &sim.streams; *at != NULL; at = &(*at)->next_live) {
        if (*at == ss) {
            *at = ss->next_live;
            break;
        }
    }
    for (sim_event *e = sim.events; e != NULL; e = e->next_live) {
        if (e->on == ss) {
            e->on = NULL;
        }
    }
    for (int g = 0; g < ACCEL__SIM_MAX_GPUS; g++) {
        forget_stream(sim.gpus[g].compute.head, ss);
    }
    for (sim_stream *o = sim.streams; o != NULL; o = o->next_live) {
        forget_stream(o->head, ss);
    }
    pthread_mutex_unlock(&sim.lock);
    accel__free(ss);
}

static accel_status sync_locked(accel__device *d, accel__stream *s)
{
    sim_stream *ss = stream_of(d, s);
    flush(ss, ss->issued);
    return take_error(ss);
}

static accel_status sim_stream_sync(accel__device *d, accel__stream *s)
{
    LOCKED(sync_locked(d, s));
}

static accel_status sim_event_new(accel__device *d, accel__event *e)
{
    sim_event *ev = accel__calloc(1, sizeof(*ev));
    if (ev == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "simulated cuda:%d: out of memory for an event",
                             index_of(d));
    }
    pthread_mutex_lock(&sim.lock);
    ev->next_live = sim.events;
    sim.events = ev;
    pthread_mutex_unlock(&sim.lock);
    e->impl = ev;
    return ACCEL_OK;
}

static void sim_event_free(accel__device *d, accel__event *e)
{
    (void)d;
    sim_event *ev = e->impl;
    pthread_mutex_lock(&sim.lock);
    for (sim_event **at = &sim.events; *at != NULL; at = &(*at)->next_live) {
        if (*at == ev) {
            *at = ev->next_live;
            break;
        }
    }
    pthread_mutex_unlock(&sim.lock);
    accel__free(ev);
}

static accel_status record_locked(accel__device *d, accel__event *e, accel__stream *s)
{
    if (s != NULL && s->dev != d) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "simulated cuda:%d: event_record: a stream of another device",
                             index_of(d));
    }
    sim_event *ev = e->impl;
    ev->on = stream_of(d, s);
    ev->seq = ev->on->issued;
    return ACCEL_OK;
}

static accel_status sim_event_record(accel__device *d, accel__event *e, accel__stream *s)
{
    LOCKED(record_locked(d, e, s));
}

/* The event's position is taken now: re-recording it later does not move this wait. */
static accel_status wait_locked(accel__device *d, accel__stream *s, accel__event *e)
{
    const sim_event *ev = e->impl;
    if (ev->on == NULL || ev->on == stream_of(d, s) || ev->on->done >= ev->seq) {
        return ACCEL_OK;
    }
    sim_op op = {.kind = ACCEL__SIM_WAIT, .on = ev->on, .seq = ev->seq};
    return accel__sim_enqueue(d, s, &op);
}

static accel_status sim_stream_wait_event(accel__device *d, accel__stream *s, accel__event *e)
{
    LOCKED(wait_locked(d, s, e));
}

/* A query is the GPU making progress: the event's work runs now. */
static int sim_event_query(accel__device *d, accel__event *e)
{
    (void)d;
    pthread_mutex_lock(&sim.lock);
    const sim_event *ev = e->impl;
    if (ev->on != NULL) {
        flush(ev->on, ev->seq);
    }
    pthread_mutex_unlock(&sim.lock);
    return 1;
}

static accel_status event_sync_locked(const accel__event *e)
{
    const sim_event *ev = e->impl;
    if (ev->on == NULL) {
        return ACCEL_OK;
    }
    flush(ev->on, ev->seq);
    return take_error(ev->on);
}

static accel_status sim_event_sync(accel__device *d, accel__event *e)
{
    (void)d;
    LOCKED(event_sync_locked(e));
}

static void *sim_native_stream(accel__device *d, accel__stream *s)
{
    return stream_of(d, s); /* opaque, distinct per stream */
}

static void run_op(sim_stream *s, sim_op *op)
{
    accel_status st = ACCEL_OK;
    switch (op->kind) {
    case ACCEL__SIM_COPY:
        memcpy(op->dst, op->src, op->nbytes);
        break;
    case ACCEL__SIM_MEMSET:
        memset(op->dst, op->byte, op->nbytes);
        break;
    case ACCEL__SIM_WAIT:
        if (op->on != NULL) {
            flush(op->on, op->seq);
        }
        break;
    case ACCEL__SIM_HOST:
        op->fn(op->arg);
        break;
    default:
        accel__sim_run_kernel(op, &st);
        break;
    }
    if (st != ACCEL_OK && s->err == ACCEL_OK) {
        s->err = st;
        snprintf(s->msg, sizeof(s->msg), "%s", accel_last_error(NULL));
    }
}

static accel_status sim_zero(accel__device *d, accel__dspan x, accel__stream *s)
{
    LOCKED(memset_locked(d, x.data, 0, x.count * accel_dtype_nbytes(x.dtype), s));
}

accel_status accel__sim_launch(accel__device *d, accel__stream *s, void (*fn)(void *arg), void *arg)
{
    if (!accel__device_is_sim(d) || fn == NULL) {
        return accel__seterr(NULL, fn == NULL ? ACCEL_EINVAL : ACCEL_EUNSUPPORTED,
                             "accel__sim_launch: %s",
                             fn == NULL ? "fn is NULL" : "the device is not a simulated GPU");
    }
    sim_op op = {.kind = ACCEL__SIM_HOST, .fn = fn, .arg = arg};
    LOCKED(accel__sim_enqueue(d, s, &op));
}

/* ---- reserved ranges: a block whose granules are mapped one by one ---- */

static accel_status sim_range_granularity(accel__device *d, size_t *out)
{
    (void)d;
    *out = SIM_GRANULE;
    return ACCEL_OK;
}

static accel_status sim_range_reserve(accel__device *d, size_t nbytes, void **base)
{
    unsigned char *on = accel__calloc(nbytes / SIM_GRANULE + 1, 1);
    pthread_mutex_lock(&sim.lock);
    /* An ordinary block (poisoned), all of it unmapped at once. */
    accel_status st = on != NULL ? alloc_locked(d, nbytes, 0, base) : ACCEL_ENOMEM;
    if (st == ACCEL_OK) {
        sim_block *b = &sim.blocks[sim.n_blocks - 1];
        b->on = on;
        (void)mprotect(b->base, b->mapped, PROT_NONE);
        (void)madvise(b->base, b->mapped, MADV_DONTNEED);
    }
    pthread_mutex_unlock(&sim.lock);
    if (st != ACCEL_OK) {
        accel__free(on);
        return on == NULL ? accel__seterr(NULL, st, "simulated cuda: out of memory") : st;
    }
    return ACCEL_OK;
}

static void sim_range_release(accel__device *d, void *base, size_t nbytes)
{
    (void)d, (void)nbytes;
    pthread_mutex_lock(&sim.lock);
    flush_all(); /* as cudaFree */
    sim_block *b = find_block(base);
    if (b != NULL) {
        (void)munmap(b->base, b->mapped);
        accel__free(b->on);
        *b = sim.blocks[--sim.n_blocks];
    }
    pthread_mutex_unlock(&sim.lock);
}

/* Maps (on) or unmaps a run of granules. Unmapping runs no queued work: work still queued that
 * reads it then faults, as a GPU would read unmapped memory, instead of passing by luck. */
static void set_granules(void *at, size_t nbytes, int on)
{
    pthread_mutex_lock(&sim.lock);
    sim_block *b = find_block(at);
    memset(b->on + ((char *)at - b->base) / SIM_GRANULE, on, nbytes / SIM_GRANULE);
    if (on) { /* fresh physical memory is garbage on a GPU: poison */
        (void)mprotect(at, nbytes, PROT_READ | PROT_WRITE);
        memset(at, 0xFF, nbytes);
    } else {
        (void)madvise(at, nbytes, MADV_DONTNEED);
    }
    if (!on || sim.open_depth == 0) {
        (void)mprotect(at, nbytes, PROT_NONE);
    }
    pthread_mutex_unlock(&sim.lock);
}

static accel_status sim_range_map(accel__device *d, void *at, size_t nbytes, void **phys)
{
    (void)d;
    set_granules(at, nbytes, 1);
    *phys = at;
    return ACCEL_OK;
}

static accel_status sim_range_unmap(accel__device *d, void *at, size_t nbytes, void *phys)
{
    (void)d, (void)phys;
    set_granules(at, nbytes, 0);
    return ACCEL_OK;
}

static const accel__device_ops sim_ops = {
    .name = "cuda",
    .describe = sim_describe,
    .alloc = sim_alloc,
    .free = sim_free,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .holds = sim_holds,
    .memset = sim_memset,
    .copy = sim_copy,
    .stream_new = sim_stream_new,
    .stream_free = sim_stream_free,
    .stream_sync = sim_stream_sync,
    .event_new = sim_event_new,
    .event_free = sim_event_free,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait_event,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .native_stream = sim_native_stream,
    .sgd_step = accel__sim_sgd_step,
    .adam_step = accel__sim_adam_step,
    .convert = accel__sim_convert,
    .zero = sim_zero,
    .scale = accel__sim_scale,
    .clamp = accel__sim_clamp,
    .pow_sum = accel__sim_pow_sum,
    .abs_max = accel__sim_abs_max,
    .nonfinite = accel__sim_nonfinite,
    .unscale_check = accel__sim_unscale_check,
    .range_granularity = sim_range_granularity,
    .range_reserve = sim_range_reserve,
    .range_release = sim_range_release,
    .range_map = sim_range_map,
    .range_unmap = sim_range_unmap,
};
