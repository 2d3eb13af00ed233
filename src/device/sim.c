/*
 * The simulated GPU (sim.h): the CUDA device's contract (device.h) kept strictly, on host
 * memory (sim_mem.c) and the CPU device's kernels (sim_kernels.c), so the device code paths run
 * and fail in CI. This file holds the handles, the queues, streams and events, copies and
 * memsets, and the operations table.
 *
 * Invariants: every copy, memset and kernel checks that its pointers are where its kind says
 * (device memory of this GPU, within one block) when it is issued; work on a stream is queued
 * and runs only when something waits for it (stream or event sync, an event query, a
 * default-order copy touching host memory, a free), in issue order, with device memory opened
 * only while it runs, a wait on an event first running the event's stream up to the point
 * recorded. One mutex serialises the whole simulation (work runs on whichever thread waits for
 * it); queued "kernels" must not call back into the device seam.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

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

static struct {
    pthread_mutex_t lock;
    int n_gpus;
    sim_gpu gpus[ACCEL__SIM_MAX_GPUS];
    sim_stream *streams;
    sim_event *events;
    sim_op *free_ops;
} sim = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const accel__device_ops sim_ops;

static sim_gpu *gpu_of(const accel__device *d)
{
    return d->impl;
}

/* ---- queues ---- */

static void run_op(sim_stream *s, sim_op *op);

/* Runs s's queued work until `upto` operations have run. */
static void flush(sim_stream *s, uint64_t upto)
{
    accel__sim_open_memory();
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
    accel__sim_close_memory();
}

/* Every queue of every GPU, run to its end (what cudaFree and cudaFreeHost do). */
void accel__sim_flush_all(void)
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
                             accel__sim_index(d));
    }
    sim_stream *ss = stream_of(d, s);
    sim_op *op = sim.free_ops;
    if (op != NULL) {
        sim.free_ops = op->next;
    } else if ((op = accel__malloc(sizeof(*op))) == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "simulated cuda:%d: out of memory for a queue",
                             accel__sim_index(d));
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
        accel__sim_install_handler();
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
    ACCEL__SIM_LOCKED(open_locked(out, index));
}

static void sim_describe(const accel__device *d, char *buf, size_t nbytes)
{
    snprintf(buf, nbytes,
             "simulated GPU %d (ACCEL_SIM_GPU, a testing aid: page-protected host memory, "
             "streams deferred until synchronised, the CPU's kernels)",
             accel__sim_index(d));
}

/* ---- copies and memsets ---- */

static accel_status memset_locked(accel__device *d, void *p, int byte, size_t nbytes,
                                  accel__stream *s)
{
    ACCEL_TRY(accel__sim_need_dev(d, "memset", "the destination", p, nbytes));
    sim_op op = {.kind = ACCEL__SIM_MEMSET, .dst = p, .byte = byte, .nbytes = nbytes};
    return accel__sim_enqueue(d, s, &op);
}

static accel_status sim_memset(accel__device *d, void *p, int byte, size_t nbytes, accel__stream *s)
{
    ACCEL__SIM_LOCKED(memset_locked(d, p, byte, nbytes, s));
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
                      : accel__sim_need_host(d, who, "the destination", dst, nbytes));
    ACCEL_TRY(src_dev ? accel__sim_need_dev(d, who, "the source", src, nbytes)
                      : accel__sim_need_host(d, who, "the source", src, nbytes));
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
    ACCEL__SIM_LOCKED(copy_locked(d, dst, src, nbytes, kind, s));
}

/* ---- streams and events ---- */

static accel_status sim_stream_new(accel__device *d, accel__stream *s)
{
    sim_stream *ss = accel__calloc(1, sizeof(*ss));
    if (ss == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "simulated cuda:%d: out of memory for a stream",
                             accel__sim_index(d));
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
    ACCEL__SIM_LOCKED(sync_locked(d, s));
}

static accel_status sim_event_new(accel__device *d, accel__event *e)
{
    sim_event *ev = accel__calloc(1, sizeof(*ev));
    if (ev == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "simulated cuda:%d: out of memory for an event",
                             accel__sim_index(d));
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
                             accel__sim_index(d));
    }
    sim_event *ev = e->impl;
    ev->on = stream_of(d, s);
    ev->seq = ev->on->issued;
    return ACCEL_OK;
}

static accel_status sim_event_record(accel__device *d, accel__event *e, accel__stream *s)
{
    ACCEL__SIM_LOCKED(record_locked(d, e, s));
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
    ACCEL__SIM_LOCKED(wait_locked(d, s, e));
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
    ACCEL__SIM_LOCKED(event_sync_locked(e));
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
    ACCEL__SIM_LOCKED(memset_locked(d, x.data, 0, x.count * accel_dtype_nbytes(x.dtype), s));
}

accel_status accel__sim_launch(accel__device *d, accel__stream *s, void (*fn)(void *arg), void *arg)
{
    if (!accel__device_is_sim(d) || fn == NULL) {
        return accel__seterr(NULL, fn == NULL ? ACCEL_EINVAL : ACCEL_EUNSUPPORTED,
                             "accel__sim_launch: %s",
                             fn == NULL ? "fn is NULL" : "the device is not a simulated GPU");
    }
    sim_op op = {.kind = ACCEL__SIM_HOST, .fn = fn, .arg = arg};
    ACCEL__SIM_LOCKED(accel__sim_enqueue(d, s, &op));
}

static const accel__device_ops sim_ops = {
    .name = "cuda",
    .describe = sim_describe,
    .alloc = accel__sim_alloc,
    .free = accel__sim_free,
    .host_alloc = accel__sim_host_alloc,
    .host_free = accel__sim_host_free,
    .holds = accel__sim_holds,
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
    .range_granularity = accel__sim_range_granularity,
    .range_reserve = accel__sim_range_reserve,
    .range_release = accel__sim_range_release,
    .range_map = accel__sim_range_map,
    .range_unmap = accel__sim_range_unmap,
};
