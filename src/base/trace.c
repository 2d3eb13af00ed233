/*
 * The trace recorder (trace.h): per-thread stacks of open ranges, the recorder's event list,
 * and the Chrome trace writer. pid = process index, tid = kernel thread id.
 *
 * Invariant: the flag `on` (first member, read inline by every range) is raised only after the
 * session's state is ready and lowered before the events are written; the event list is
 * guarded by the mutex. Open ranges carry the session generation they began in, so a range
 * straddling stop/start is dropped rather than attributed to the wrong session.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "trace.h"

#define NAME_NBYTES 64
#define STACK_DEPTH 32
#define MAX_THREADS 64

typedef struct trace_event {
    double t0, t1; /* accel__now() seconds */
    char name[NAME_NBYTES];
    const char *cat;
    const char *arg_name;
    long long arg;
    int tid;
} trace_event;

typedef struct trace_thread {
    int tid;
    char name[32];
} trace_thread;

struct accel__trace {
    int on; /* first: accel__trace_on reads it inline */
    unsigned generation;
    pthread_mutex_t lock;
    trace_event *events;
    size_t n_events, cap_events;
    trace_thread threads[MAX_THREADS];
    int n_threads;
};

typedef struct open_range {
    double t0;
    const accel__trace *trace;
    unsigned gen;
    char name[NAME_NBYTES];
    const char *cat;
    const char *arg_name;
    long long arg;
} open_range;

_Thread_local int accel__trace_depth;
static _Thread_local open_range stack[STACK_DEPTH];
static _Thread_local int overflow;
static _Thread_local int my_tid;

static int thread_id(void)
{
    if (my_tid == 0) {
        my_tid = (int)syscall(SYS_gettid);
    }
    return my_tid;
}

accel_status accel__trace_new(accel__trace **out)
{
    accel__trace *t = accel__calloc(1, sizeof(*t));
    if (t == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "profiler: out of memory");
    }
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return ACCEL_OK;
}

void accel__trace_free(accel__trace *t)
{
    if (t == NULL) {
        return;
    }
    pthread_mutex_destroy(&t->lock);
    accel__free(t->events);
    accel__free(t);
}

/* Appends under the lock; first sight of a thread records its name for the metadata. */
static void record(accel__trace *t, const trace_event *ev)
{
    pthread_mutex_lock(&t->lock);
    if (!t->on) {
        pthread_mutex_unlock(&t->lock);
        return;
    }
    int known = 0;
    for (int i = 0; i < t->n_threads && !known; i++) {
        known = t->threads[i].tid == ev->tid;
    }
    if (!known && t->n_threads < MAX_THREADS) {
        trace_thread *th = &t->threads[t->n_threads++];
        th->tid = ev->tid;
        if (pthread_getname_np(pthread_self(), th->name, sizeof(th->name)) != 0) {
            snprintf(th->name, sizeof(th->name), "thread %d", ev->tid);
        }
    }
    if (t->n_events == t->cap_events) {
        size_t cap = t->cap_events ? t->cap_events * 2 : 1024;
        trace_event *e = accel__realloc(t->events, cap * sizeof(*e));
        if (e == NULL) {
            pthread_mutex_unlock(&t->lock); /* drop the event: profiling must not fail a run */
            return;
        }
        t->events = e;
        t->cap_events = cap;
    }
    t->events[t->n_events++] = *ev;
    pthread_mutex_unlock(&t->lock);
}

void accel__trace_begin_slow(accel__trace *t, const char *name, const char *cat,
                             const char *arg_name, long long arg)
{
    if (accel__trace_depth == STACK_DEPTH) {
        overflow++; /* too deep: the matching end consumes this instead of a real range */
        return;
    }
    open_range *r = &stack[accel__trace_depth++];
    r->t0 = accel__now();
    r->trace = t;
    r->gen = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE);
    snprintf(r->name, sizeof(r->name), "%s", name ? name : "(null)");
    r->cat = cat;
    r->arg_name = arg_name;
    r->arg = arg;
}

void accel__trace_end_slow(accel__trace *t)
{
    if (overflow > 0) {
        overflow--;
        return;
    }
    if (accel__trace_depth == 0) {
        return;
    }
    open_range *r = &stack[--accel__trace_depth];
    if (t == NULL || r->trace != t || !accel__trace_on(t) ||
        r->gen != __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE)) {
        return;
    }
    trace_event ev;
    ev.t0 = r->t0;
    ev.t1 = accel__now();
    memcpy(ev.name, r->name, sizeof(ev.name));
    ev.cat = r->cat;
    ev.arg_name = r->arg_name;
    ev.arg = r->arg;
    ev.tid = thread_id();
    record(t, &ev);
}

void accel__trace_span_slow(accel__trace *t, const char *name, const char *cat, double t0,
                            double t1, const char *arg_name, long long arg)
{
    trace_event ev;
    ev.t0 = t0;
    ev.t1 = t1;
    snprintf(ev.name, sizeof(ev.name), "%s", name);
    ev.cat = cat;
    ev.arg_name = arg_name;
    ev.arg = arg;
    ev.tid = thread_id();
    record(t, &ev);
}

accel_status accel__trace_start(accel__trace *t)
{
    pthread_mutex_lock(&t->lock);
    if (t->on) {
        pthread_mutex_unlock(&t->lock);
        return accel__seterr(NULL, ACCEL_ESTATE, "a profiler session is already open");
    }
    t->n_events = 0;
    t->n_threads = 0;
    __atomic_fetch_add(&t->generation, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&t->on, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&t->lock);
    return ACCEL_OK;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

/* The Chrome trace of the events in t (caller holds the lock). */
static void write_events(FILE *f, const accel__trace *t, int pid)
{
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
            "\"args\": {\"name\": \"rank %d\"}},\n"
            "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
            "\"args\": {\"sort_index\": %d}}",
            pid, pid, pid, pid);
    for (int i = 0; i < t->n_threads; i++) {
        fprintf(f,
                ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"name\": ",
                pid, t->threads[i].tid);
        json_str(f, t->threads[i].name);
        fputs("}}", f);
    }
    for (size_t i = 0; i < t->n_events; i++) {
        const trace_event *e = &t->events[i];
        fputs(",\n{\"name\": ", f);
        json_str(f, e->name);
        fputs(", \"cat\": ", f);
        json_str(f, e->cat ? e->cat : "accel");
        fprintf(f, ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                e->t0 * 1e6, (e->t1 - e->t0) * 1e6, pid, e->tid);
        if (e->arg_name != NULL) {
            fputs(", \"args\": {", f);
            json_str(f, e->arg_name);
            fprintf(f, ": %lld}", e->arg);
        }
        fputc('}', f);
    }
    fputs("\n]}\n", f);
}

accel_status accel__trace_stop(accel__trace *t, const char *path, int pid)
{
    pthread_mutex_lock(&t->lock);
    if (!t->on) {
        pthread_mutex_unlock(&t->lock);
        return accel__seterr(NULL, ACCEL_ESTATE, "no profiler session is open");
    }
    __atomic_store_n(&t->on, 0, __ATOMIC_RELEASE);
    __atomic_fetch_add(&t->generation, 1, __ATOMIC_RELEASE);
    accel_status st = ACCEL_OK;
    size_t n = strlen(path) + 8;
    char *tmp = accel__malloc(n);
    if (tmp == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "profiler: out of memory");
        goto out;
    }
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot create trace file %s: %s", tmp,
                           strerror(errno));
        goto out;
    }
    write_events(f, t, pid);
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot write trace file %s: %s", tmp,
                           strerror(errno));
    }
    if (fclose(f) != 0 && st == ACCEL_OK) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot close trace file %s: %s", tmp,
                           strerror(errno));
    }
    if (st == ACCEL_OK && rename(tmp, path) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot rename %s to %s: %s", tmp, path,
                           strerror(errno));
    }
    if (st != ACCEL_OK) {
        unlink(tmp);
    }
out:
    accel__free(tmp);
    t->n_events = 0;
    pthread_mutex_unlock(&t->lock);
    return st;
}
