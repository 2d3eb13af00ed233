/*
 * The profiler timeline: complete ("X") events recorded per thread while a session is open,
 * written at accel_profile_end as a Chrome trace (profile_<rank>.json) with pid = process index
 * and tid = kernel thread id, timestamps in microseconds of CLOCK_MONOTONIC, so the files of the
 * processes of one machine line up when opened together in Perfetto.
 *
 * Invariant: the session pointer in the ACCEL__MOD_PROFILE slot is published before the
 * process-wide flag is raised and freed only by accel_free, so a thread that sees the flag may
 * use it; the event list is guarded by the session mutex. Open ranges live on a thread-local
 * stack tagged with the session generation, so a range straddling begin/end is dropped rather
 * than mismatched.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fs.h"
#include "profile.h"

int accel__prof_on;
static unsigned prof_generation;

#define NAME_NBYTES 64
#define STACK_DEPTH 32
#define MAX_THREADS 64

typedef struct prof_event {
    double t0, t1; /* accel__now() seconds */
    char name[NAME_NBYTES];
    const char *cat;
    const char *arg_name;
    long long arg;
    int tid;
} prof_event;

typedef struct prof_thread {
    int tid;
    char name[32];
} prof_thread;

typedef struct prof_session {
    pthread_mutex_t lock;
    int active;
    char *dir;
    prof_event *events;
    size_t n_events, cap_events;
    prof_thread threads[MAX_THREADS];
    int n_threads;
} prof_session;

typedef struct open_range {
    double t0;
    unsigned gen;
    char name[NAME_NBYTES];
    const char *cat;
    const char *arg_name;
    long long arg;
} open_range;

static _Thread_local open_range stack[STACK_DEPTH];
static _Thread_local int depth, overflow;
static _Thread_local int my_tid;

static int thread_id(void)
{
    if (my_tid == 0) {
        my_tid = (int)syscall(SYS_gettid);
    }
    return my_tid;
}

/* The session most recently begun in this process: what a caller without an accelerator
 * (the communication thread) records into. Cleared before its session is freed. */
static prof_session *process_session;

static prof_session *session_of(accel *acc)
{
    if (acc == NULL) {
        return __atomic_load_n(&process_session, __ATOMIC_ACQUIRE);
    }
    return __atomic_load_n(&acc->modules[ACCEL__MOD_PROFILE].state, __ATOMIC_ACQUIRE);
}

/* Appends under the lock; first sight of a thread records its name for the metadata. */
static void record(prof_session *s, const prof_event *ev)
{
    pthread_mutex_lock(&s->lock);
    if (!s->active) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    int known = 0;
    for (int i = 0; i < s->n_threads && !known; i++) {
        known = s->threads[i].tid == ev->tid;
    }
    if (!known && s->n_threads < MAX_THREADS) {
        prof_thread *t = &s->threads[s->n_threads++];
        t->tid = ev->tid;
        if (pthread_getname_np(pthread_self(), t->name, sizeof(t->name)) != 0) {
            snprintf(t->name, sizeof(t->name), "thread %d", ev->tid);
        }
    }
    if (s->n_events == s->cap_events) {
        size_t cap = s->cap_events ? s->cap_events * 2 : 1024;
        prof_event *e = accel__realloc(s->events, cap * sizeof(*e));
        if (e == NULL) {
            pthread_mutex_unlock(&s->lock); /* drop the event: profiling must not fail a run */
            return;
        }
        s->events = e;
        s->cap_events = cap;
    }
    s->events[s->n_events++] = *ev;
    pthread_mutex_unlock(&s->lock);
}

void accel__prof_begin_slow(accel *acc, const char *name, const char *cat, const char *arg_name,
                            long long arg)
{
    if (depth == STACK_DEPTH) {
        overflow++; /* too deep: the matching end consumes this instead of a real range */
        return;
    }
    open_range *r = &stack[depth++];
    r->t0 = accel__now();
    r->gen = __atomic_load_n(&prof_generation, __ATOMIC_ACQUIRE);
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->cat = cat;
    r->arg_name = arg_name;
    r->arg = arg;
}

void accel__prof_end_slow(accel *acc)
{
    if (overflow > 0) {
        overflow--;
        return;
    }
    if (depth == 0) {
        return;
    }
    open_range *r = &stack[--depth];
    prof_session *s = session_of(acc);
    if (s == NULL || r->gen != __atomic_load_n(&prof_generation, __ATOMIC_ACQUIRE)) {
        return;
    }
    prof_event ev;
    ev.t0 = r->t0;
    ev.t1 = accel__now();
    memcpy(ev.name, r->name, sizeof(ev.name));
    ev.cat = r->cat;
    ev.arg_name = r->arg_name;
    ev.arg = r->arg;
    ev.tid = thread_id();
    record(s, &ev);
}

void accel__prof_span_slow(accel *acc, const char *name, const char *cat, double t0, double t1,
                           const char *arg_name, long long arg)
{
    prof_session *s = session_of(acc);
    if (s == NULL) {
        return;
    }
    prof_event ev;
    ev.t0 = t0;
    ev.t1 = t1;
    snprintf(ev.name, sizeof(ev.name), "%s", name);
    ev.cat = cat;
    ev.arg_name = arg_name;
    ev.arg = arg;
    ev.tid = thread_id();
    record(s, &ev);
}

/* ---- session control ---- */

static accel_status finish(accel *acc, prof_session *s);

static void session_free(accel *acc, void *state)
{
    prof_session *s = state;
    /* A session the program forgot to end still produces its file (no barrier: accel_free is
     * not a collective). */
    if (s->active && finish(acc, s) != ACCEL_OK) {
        accel__log(ACCEL__LOG_WARN, "profiler: %s", accel_last_error(acc));
    }
    prof_session *expected = s;
    __atomic_compare_exchange_n(&process_session, &expected, NULL, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    pthread_mutex_destroy(&s->lock);
    accel__free(s->events);
    accel__free(s->dir);
    accel__free(s);
}

accel_status accel_profile_begin(accel *acc, const char *dir)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_profile_begin: acc is NULL");
    }
    prof_session *s = session_of(acc);
    if (s != NULL && s->active) {
        return accel__seterr(acc, ACCEL_ESTATE,
                             "accel_profile_begin: a profiler session is already open");
    }
    if (dir == NULL) {
        dir = acc->opt.logging_dir ? acc->opt.logging_dir
                                   : (acc->opt.project_dir ? acc->opt.project_dir : ".");
    }
    if (accel__mkdirs(dir) != ACCEL_OK) {
        return accel__adopt_thread_error(acc, ACCEL_EIO);
    }
    char *copy = accel__strdup(dir);
    if (copy == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_profile_begin: out of memory");
    }
    if (s == NULL) {
        s = accel__calloc(1, sizeof(*s));
        if (s == NULL) {
            accel__free(copy);
            return accel__seterr(acc, ACCEL_ENOMEM, "accel_profile_begin: out of memory");
        }
        pthread_mutex_init(&s->lock, NULL);
        accel__module_set(acc, ACCEL__MOD_PROFILE, NULL, session_free);
        __atomic_store_n(&acc->modules[ACCEL__MOD_PROFILE].state, s, __ATOMIC_RELEASE);
    }
    pthread_mutex_lock(&s->lock);
    accel__free(s->dir);
    s->dir = copy;
    s->n_events = 0;
    s->n_threads = 0;
    s->active = 1;
    pthread_mutex_unlock(&s->lock);
    __atomic_store_n(&process_session, s, __ATOMIC_RELEASE);
    __atomic_fetch_add(&prof_generation, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&accel__prof_on, 1, __ATOMIC_RELEASE);
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

static accel_status write_trace(accel *acc, prof_session *s)
{
    char name[64];
    snprintf(name, sizeof(name), "profile_%d.json", acc->rank);
    size_t n = strlen(s->dir) + strlen(name) + 16;
    char *path = accel__malloc(n), *tmp = accel__malloc(n);
    if (path == NULL || tmp == NULL) {
        accel__free(path);
        accel__free(tmp);
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_profile_end: out of memory");
    }
    snprintf(path, n, "%s/%s", s->dir, name);
    snprintf(tmp, n, "%s.tmp", path);
    accel_status st = ACCEL_OK;
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        st = accel__seterr(acc, ACCEL_EIO, "cannot create trace file %s: %s", tmp, strerror(errno));
        goto out;
    }
    int pid = acc->rank;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
            "\"args\": {\"name\": \"rank %d\"}},\n"
            "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
            "\"args\": {\"sort_index\": %d}}",
            pid, pid, pid, pid);
    for (int i = 0; i < s->n_threads; i++) {
        fprintf(f,
                ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"name\": ",
                pid, s->threads[i].tid);
        json_str(f, s->threads[i].name);
        fputs("}}", f);
    }
    for (size_t i = 0; i < s->n_events; i++) {
        const prof_event *e = &s->events[i];
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
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) {
        st = accel__seterr(acc, ACCEL_EIO, "cannot write trace file %s: %s", tmp, strerror(errno));
    }
    if (fclose(f) != 0 && st == ACCEL_OK) {
        st = accel__seterr(acc, ACCEL_EIO, "cannot close trace file %s: %s", tmp, strerror(errno));
    }
    if (st == ACCEL_OK && rename(tmp, path) != 0) {
        st =
            accel__seterr(acc, ACCEL_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    if (st != ACCEL_OK) {
        unlink(tmp);
    }
out:
    accel__free(path);
    accel__free(tmp);
    return st;
}

/* Deactivates the session and writes its trace; the caller decides about the barrier. */
static accel_status finish(accel *acc, prof_session *s)
{
    __atomic_fetch_add(&prof_generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&s->lock);
    s->active = 0;
    accel_status st = write_trace(acc, s);
    s->n_events = 0;
    pthread_mutex_unlock(&s->lock);
    __atomic_fetch_sub(&accel__prof_on, 1, __ATOMIC_RELEASE);
    return st;
}

accel_status accel_profile_end(accel *acc)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_profile_end: acc is NULL");
    }
    prof_session *s = session_of(acc);
    if (s == NULL || !s->active) {
        return accel__seterr(acc, ACCEL_ESTATE, "accel_profile_end: no profiler session is open");
    }
    accel_status st = finish(acc, s);
    /* Accelerate's profile() waits for everyone after writing, so no process moves on (and,
     * say, deletes the folder) while another is still writing. */
    if (acc->n_ranks > 1) {
        accel_status bst = accel_wait_for_everyone(acc);
        if (st == ACCEL_OK) {
            st = bst;
        }
    }
    return st;
}

void accel__profile_finish_local(accel *acc)
{
    prof_session *s = session_of(acc);
    if (s != NULL && s->active && finish(acc, s) != ACCEL_OK) {
        accel__log(ACCEL__LOG_WARN, "profiler: %s", accel_last_error(acc));
    }
}

int accel_profile_active(const accel *acc)
{
    prof_session *s = session_of((accel *)acc);
    return s != NULL && s->active;
}

void accel_profile_push(accel *acc, const char *name)
{
    if (accel__prof_enabled()) {
        accel__prof_begin_slow(acc, name ? name : "(null)", ACCEL__PROF_USER, NULL, 0);
    }
}

void accel_profile_pop(accel *acc)
{
    accel__prof_end(acc);
}
