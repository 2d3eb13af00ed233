/*
 * The shm transport: the job's POSIX shared-memory segment and the sync point.
 *
 * Segment: header (magic, settings, attach counter, job-wide abort word), one cache line per
 * rank (progress sequence number = futex word, sleeper count, pid), then two data slots per
 * rank. Local rank 0 creates it, the others open it; once all have attached the name is
 * unlinked, so a SIGKILL at any later point leaves nothing in /dev/shm.
 *
 * Sync: each rank's progress word counts the sync points it has passed; waiting means "peer's
 * progress >= mine". Stores are release/seq_cst, loads acquire (never volatile). A waiter spins
 * briefly, then sleeps on the peer's word with a short futex timeout, checking every ~50 ms
 * whether the ranks it waits for are still alive; a dead rank or an expired deadline is written
 * into the abort word so every other rank fails at once with the same diagnosis.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "shm.h"

#define SHM_MAGIC 0x316d6873636361ull /* "accshm1" */
#define SHM_VERSION 2u
#define POLL_S 0.05 /* liveness check period while sleeping */

struct accel__shm_header {
    _Atomic uint64_t magic; /* stored last by the creator (release) */
    uint32_t version;
    int32_t n_ranks;
    uint64_t slot_nbytes;
    uint64_t map_nbytes;
    uint64_t oneshot_nbytes, zc_nbytes; /* the algorithm choice must agree on every rank */
    _Atomic int32_t attached;
    _Atomic int32_t unlinked; /* the last rank to attach removed the name */
    /* status | rank << 8 | pid << 32, 0 while the job is healthy; written once (CAS). */
    _Alignas(64) _Atomic uint64_t abort_word;
};

/* Plain fields below are written by their rank before it publishes a sync point and read by
 * peers after they see it (release/acquire on progress), never while they can change. */
struct accel__shm_line {
    _Alignas(64) _Atomic uint32_t progress;
    _Atomic int32_t sleepers;
    _Atomic int32_t pid;
    _Atomic int32_t cpu; /* where this rank last published a sync point */
    int16_t alloc_status[2];
    uint64_t desc[2][3]; /* zero-copy descriptors (id, off, count), by call parity */
    uint64_t alloc_seq, alloc_nbytes;
};

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- liveness and the job-wide abort ---- */

/* Dead = gone (ESRCH) or a zombie not yet reaped by its parent. Stopped counts as alive. */
static int pid_dead(int pid)
{
    if (pid <= 0) {
        return 0;
    }
    if (kill(pid, 0) == -1 && errno == ESRCH) {
        return 1;
    }
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno == ENOENT;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* the command name may contain spaces */
    return paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

static void wake_all(accel__shm *s)
{
    for (int r = 0; r < s->n_ranks; r++) {
        futex(&s->lines[r].progress, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* Records the first diagnosis for the whole job (later ones lose the CAS) and wakes sleepers. */
void accel__shm_abort(accel__shm *s, accel_status st, int rank)
{
    uint64_t pid = (uint32_t)atomic_load_explicit(&s->lines[rank].pid, memory_order_relaxed);
    uint64_t word = (uint64_t)(-(int)st & 0xff) | ((uint64_t)(rank & 0xffffff) << 8) | pid << 32;
    uint64_t expected = 0;
    atomic_compare_exchange_strong(&s->hdr->abort_word, &expected, word);
    wake_all(s);
}

accel_status accel__shm_check_abort(accel__shm *s)
{
    uint64_t w = atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire);
    if (w == 0) {
        return ACCEL_OK;
    }
    accel_status st = (accel_status)(-(int)(w & 0xff));
    int rank = (int)((w >> 8) & 0xffffff), pid = (int)(uint32_t)(w >> 32);
    if (st == ACCEL_EPEER) {
        return accel__seterr(NULL, st,
                             "%s: process %d (pid %d) died (killed or exited) during a "
                             "collective; process %d cannot continue",
                             s->what, rank, pid, s->rank);
    }
    if (st == ACCEL_EINVAL) {
        return accel__seterr(NULL, st,
                             "%s: process %d (pid %d) called a different collective (or "
                             "allocation) at this point; process %d cannot continue",
                             s->what, rank, pid, s->rank);
    }
    return accel__seterr(NULL, st,
                         "%s: process %d (pid %d) did not arrive within the %g s timeout "
                         "(stopped, hung, or calling a different collective); process %d "
                         "gives up",
                         s->what, rank, pid, s->timeout_s, s->rank);
}

void accel__shm_put_desc(accel__shm *s, const accel__shm_desc *d)
{
    uint64_t *w = s->lines[s->rank].desc[++s->n_descs & 1];
    w[0] = d->id;
    w[1] = d->off;
    w[2] = d->count;
}

void accel__shm_get_desc(const accel__shm *s, int rank, accel__shm_desc *d)
{
    const uint64_t *w = s->lines[rank].desc[s->n_descs & 1];
    d->id = w[0];
    d->off = w[1];
    d->count = w[2];
}

void accel__shm_put_alloc(accel__shm *s, uint64_t seq, uint64_t nbytes, int phase, int status)
{
    accel__shm_line *l = &s->lines[s->rank];
    if (phase == 0) {
        l->alloc_seq = seq;
        l->alloc_nbytes = nbytes;
    }
    l->alloc_status[phase & 1] = (int16_t)status;
}

void accel__shm_get_alloc(const accel__shm *s, int rank, uint64_t *seq, uint64_t *nbytes,
                          int status[2])
{
    const accel__shm_line *l = &s->lines[rank];
    *seq = l->alloc_seq;
    *nbytes = l->alloc_nbytes;
    status[0] = l->alloc_status[0];
    status[1] = l->alloc_status[1];
}

static int reached(uint32_t progress, uint32_t step)
{
    return (int32_t)(progress - step) >= 0; /* wrap-safe */
}

/* The first rank not at `step` that is dead, or -1. */
static int find_dead(accel__shm *s, uint32_t step)
{
    for (int r = 0; r < s->n_ranks; r++) {
        if (r == s->rank ||
            reached(atomic_load_explicit(&s->lines[r].progress, memory_order_acquire), step)) {
            continue;
        }
        if (pid_dead(atomic_load_explicit(&s->lines[r].pid, memory_order_relaxed))) {
            return r;
        }
    }
    return -1;
}

static accel_status timed_out(accel__shm *s, uint32_t step)
{
    char list[512];
    size_t len = 0;
    int first = -1;
    list[0] = '\0';
    for (int r = 0; r < s->n_ranks && len < sizeof(list) - 40; r++) {
        if (r != s->rank &&
            !reached(atomic_load_explicit(&s->lines[r].progress, memory_order_acquire), step)) {
            first = first < 0 ? r : first;
            len += (size_t)snprintf(
                list + len, sizeof(list) - len, "%sprocess %d (pid %d)", len ? ", " : "", r,
                (int)atomic_load_explicit(&s->lines[r].pid, memory_order_relaxed));
        }
    }
    if (first < 0) {
        return ACCEL_OK; /* they arrived just now */
    }
    accel__shm_abort(s, ACCEL_ETIMEDOUT, first);
    uint64_t w = atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire);
    if ((w & 0xff) != (uint64_t)(-(int)ACCEL_ETIMEDOUT) || (int)((w >> 8) & 0xffffff) != first) {
        return accel__shm_check_abort(s); /* someone else's diagnosis came first */
    }
    return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                         "%s: process %d timed out after %g s waiting for %s "
                         "(stopped, hung, or calling a different collective)",
                         s->what, s->rank, s->timeout_s, list);
}

/* ---- waiting ---- */

/* Two processes on one CPU while another CPU is free (the scheduler put a woken process next
 * to its waker, and processes that yield to each other never look idle enough to be balanced
 * apart): every sync then costs a context switch, ~5 us instead of ~0.5. Move this thread off
 * the peer's CPU by excluding it from the affinity mask and restoring the mask at once: the
 * first call migrates the thread, the second leaves it where it is. At most every 10 ms, and
 * never when the user's mask is one CPU. */
static void nudge_off(accel__shm *s, int q)
{
    int me_cpu = sched_getcpu(),
        peer_cpu = atomic_load_explicit(&s->lines[q].cpu, memory_order_relaxed);
    double now = accel__now();
    if (me_cpu < 0 || me_cpu != peer_cpu || now < s->next_nudge) {
        return;
    }
    s->next_nudge = now + 0.01;
    cpu_set_t mask, other;
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2 ||
        !CPU_ISSET(me_cpu, &mask)) {
        return;
    }
    other = mask;
    CPU_CLR(me_cpu, &other);
    if (sched_setaffinity(0, sizeof(other), &other) == 0) {
        sched_setaffinity(0, sizeof(mask), &mask);
    }
}

static accel_status wait_slow(accel__shm *s, int q, uint32_t step)
{
    _Atomic uint32_t *word = &s->lines[q].progress;
    /* Spin: a few microseconds flat out, then yielding between checks. The yields matter when
     * the peer shares this CPU (oversubscribed or busy machine): spinning would only keep it
     * from running, costing a whole spin period per sync. */
    double t0 = accel__now(), spin_end = t0 + s->spin_s;
    int nudged = 0;
    for (unsigned it = 1;; it++) {
        cpu_relax();
        if (reached(atomic_load_explicit(word, memory_order_acquire), step)) {
            return ACCEL_OK;
        }
        if ((it & 63) == 0) {
            ACCEL_TRY(accel__shm_check_abort(s));
            double t = accel__now();
            if (t >= spin_end) {
                break;
            }
            if (t - t0 > 2e-6) {
                if (!nudged) {
                    nudged = 1;
                    nudge_off(s, q);
                }
                sched_yield();
            }
        }
    }
    double deadline = t0 + s->timeout_s, next_check = t0 + POLL_S;
    for (;;) {
        /* Announce the sleep before re-reading: the publisher stores progress and then reads
         * the sleeper count (both seq_cst), so either it sees us or we see its store. */
        atomic_fetch_add_explicit(&s->lines[q].sleepers, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(word, memory_order_seq_cst);
        if (!reached(v, step)) {
            double until = next_check < deadline ? next_check : deadline;
            double left = until - accel__now();
            if (left > 0) {
                struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
                futex(word, FUTEX_WAIT, v, &ts);
            }
        }
        atomic_fetch_sub_explicit(&s->lines[q].sleepers, 1, memory_order_relaxed);
        if (reached(atomic_load_explicit(word, memory_order_acquire), step)) {
            return ACCEL_OK;
        }
        ACCEL_TRY(accel__shm_check_abort(s));
        double now = accel__now();
        if (now >= next_check) {
            int dead = find_dead(s, step);
            if (dead >= 0) {
                accel__shm_abort(s, ACCEL_EPEER, dead);
                return accel__shm_check_abort(s);
            }
            next_check = now + POLL_S;
        }
        if (now >= deadline) {
            ACCEL_TRY(timed_out(s, step));
        }
    }
}

accel_status accel__shm_sync(accel__shm *s)
{
    uint32_t step = ++s->step;
    accel__shm_line *me = &s->lines[s->rank];
    atomic_store_explicit(&me->cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store_explicit(&me->progress, step, memory_order_seq_cst);
    if (atomic_load_explicit(&me->sleepers, memory_order_seq_cst) > 0) {
        futex(&me->progress, FUTEX_WAKE, INT_MAX, NULL);
    }
    for (int i = 1; i < s->n_ranks; i++) {
        int q = (s->rank + i) % s->n_ranks;
        if (!reached(atomic_load_explicit(&s->lines[q].progress, memory_order_acquire), step)) {
            ACCEL_TRY(wait_slow(s, q, step));
        }
    }
    return ACCEL_OK;
}

/* ---- setup ---- */

/* An ACCEL_SHM_* knob: the environment, else the default declared in the env table. */
static accel_status knob(const char *name, long long lo, long long hi, long long *out, int *set)
{
    for (const accel__env_var *v = accel__env_table(); v->name != NULL; v++) {
        if (strcmp(v->name, name) == 0 && v->dflt != NULL) {
            *out = strtoll(v->dflt, NULL, 10);
        }
    }
    accel_status st = accel__env_int(name, out);
    if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
        return st;
    }
    if (set != NULL) {
        *set = st == ACCEL_OK;
    }
    if (*out < lo || *out > hi) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "environment variable %s=%lld must be between %lld and %lld", name,
                             *out, lo, hi);
    }
    return ACCEL_OK;
}

static void make_name(char *out, size_t nbytes, const char *job_id)
{
    int n = snprintf(out, nbytes, "/accel-%u-", (unsigned)getuid());
    const char *id = (job_id != NULL && job_id[0] != '\0') ? job_id : "job";
    size_t len = (size_t)n;
    for (const char *p = id; *p != '\0' && len + 1 < nbytes; p++) {
        char ch = *p;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == '-';
        out[len++] = ok ? ch : '_';
    }
    out[len] = '\0';
}

/* Local rank 0: a fresh segment, initialised before the magic is published. */
static accel_status create_segment(accel__shm *s, int *fd)
{
    for (int attempt = 0;; attempt++) {
        *fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (*fd >= 0) {
            break;
        }
        if (errno == EEXIST && attempt == 0) {
            accel__log(&s->log, ACCEL__LOG_WARN, "removing stale shared-memory segment %s", s->name);
            shm_unlink(s->name);
            continue;
        }
        return accel__seterr(NULL, ACCEL_EIO, "shm: cannot create segment %s: %s", s->name,
                             strerror(errno));
    }
    /* posix_fallocate, not ftruncate: the pages are reserved now, so a full /dev/shm (64 MiB in
     * a default container) is an error here instead of a SIGBUS in the middle of a collective. */
    int err = posix_fallocate(*fd, 0, (off_t)s->map_nbytes);
    if (err != 0) {
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "shm: cannot allocate %zu bytes for segment %s in /dev/shm: %s "
                             "(lower ACCEL_SHM_CHUNK_NBYTES or enlarge /dev/shm)",
                             s->map_nbytes, s->name, strerror(err));
    }
    s->base = mmap(NULL, s->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return accel__seterr(NULL, ACCEL_ENOMEM, "shm: cannot map segment %s (%zu bytes): %s",
                             s->name, s->map_nbytes, strerror(errno));
    }
    accel__shm_header *h = s->base;
    h->version = SHM_VERSION;
    h->n_ranks = s->n_ranks;
    h->slot_nbytes = s->slot_nbytes;
    h->map_nbytes = s->map_nbytes;
    h->oneshot_nbytes = s->oneshot_nbytes;
    h->zc_nbytes = s->zc_nbytes;
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    return ACCEL_OK;
}

/* Other ranks: open (retrying until local rank 0 has created it), check the settings, map. */
static accel_status open_segment(accel__shm *s, int *fd, double deadline)
{
    struct stat st;
    for (;;) {
        *fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0);
        if (*fd >= 0 && fstat(*fd, &st) == 0 && (size_t)st.st_size >= sizeof(accel__shm_header)) {
            accel__shm_header *h = mmap(NULL, sizeof(*h), PROT_READ, MAP_SHARED, *fd, 0);
            if (h != MAP_FAILED) {
                int ready = atomic_load_explicit(&h->magic, memory_order_acquire) == SHM_MAGIC;
                int same = ready && h->version == SHM_VERSION && h->n_ranks == s->n_ranks &&
                           h->slot_nbytes == s->slot_nbytes && h->map_nbytes == s->map_nbytes &&
                           h->oneshot_nbytes == s->oneshot_nbytes && h->zc_nbytes == s->zc_nbytes;
                munmap(h, sizeof(*h));
                if (ready && !same) {
                    return accel__seterr(NULL, ACCEL_EINVAL,
                                         "shm: segment %s was created for other settings (process "
                                         "count or ACCEL_SHM_* variables differ between processes)",
                                         s->name);
                }
                if (ready) {
                    break;
                }
            }
        } else if (*fd < 0 && errno != ENOENT) {
            return accel__seterr(NULL, ACCEL_EIO, "shm: cannot open segment %s: %s", s->name,
                                 strerror(errno));
        }
        if (*fd >= 0) {
            close(*fd);
            *fd = -1;
        }
        if (accel__now() >= deadline) {
            return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                                 "shm: process %d waited %g s for local process 0 to create "
                                 "segment %s",
                                 s->rank, s->timeout_s, s->name);
        }
        sleep_s(200e-6);
    }
    s->base = mmap(NULL, s->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return accel__seterr(NULL, ACCEL_ENOMEM, "shm: cannot map segment %s (%zu bytes): %s",
                             s->name, s->map_nbytes, strerror(errno));
    }
    return ACCEL_OK;
}

accel_status accel__shm_open(accel__shm **out, const accel__comm_config *cfg)
{
    if (cfg->local_n_ranks != cfg->n_ranks) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "backend shm needs every process on one machine, but only %d of "
                             "%d are local",
                             cfg->local_n_ranks, cfg->n_ranks);
    }
    long long oneshot, chunk, spin_us, nt, zc;
    int spin_set = 0;
    ACCEL_TRY(knob("ACCEL_SHM_NT_NBYTES", 0, LLONG_MAX, &nt, NULL));
    ACCEL_TRY(knob("ACCEL_SHM_ONESHOT_NBYTES", 0, 64ll << 20, &oneshot, NULL));
    ACCEL_TRY(knob("ACCEL_SHM_CHUNK_NBYTES", 4096, 1ll << 30, &chunk, NULL));
    ACCEL_TRY(knob("ACCEL_SHM_SPIN_US", 0, 10000000, &spin_us, &spin_set));
    ACCEL_TRY(knob("ACCEL_SHM_ZEROCOPY_NBYTES", -1, LLONG_MAX, &zc, NULL));
    /* More processes than CPUs: a spinning waiter only delays the peer it waits for, so sleep
     * almost at once unless the user asked otherwise. */
    cpu_set_t cpus;
    if (!spin_set && sched_getaffinity(0, sizeof(cpus), &cpus) == 0 &&
        CPU_COUNT(&cpus) < cfg->local_n_ranks && spin_us > 2) {
        accel__log(&cfg->log, ACCEL__LOG_DEBUG, "shm: %d processes on %d CPUs, spinning 2 us",
                   cfg->local_n_ranks, CPU_COUNT(&cpus));
        spin_us = 2;
    }

    accel__shm *s = accel__calloc(1, sizeof(*s));
    const void **in = accel__calloc((size_t)cfg->n_ranks, sizeof(*in));
    if (s == NULL || in == NULL) {
        accel__free(s);
        accel__free(in);
        return accel__seterr(NULL, ACCEL_ENOMEM, "shm: out of memory");
    }
    s->rank = cfg->rank;
    s->n_ranks = cfg->n_ranks;
    s->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1800;
    s->log = cfg->log;
    s->spin_s = (double)spin_us * 1e-6;
    s->oneshot_nbytes = (size_t)oneshot;
    s->nt_nbytes = (size_t)nt;
    s->zc_nbytes = zc < 0 ? SIZE_MAX : (size_t)zc; /* -1: never */
    s->slot_nbytes = align_up((size_t)(oneshot > chunk ? oneshot : chunk), 4096);
    s->in = in;
    make_name(s->name, sizeof(s->name), cfg->job_id);
    size_t lines_off = align_up(sizeof(accel__shm_header), 64);
    size_t data_off = align_up(lines_off + (size_t)s->n_ranks * sizeof(accel__shm_line), 4096);
    s->map_nbytes = data_off + (size_t)s->n_ranks * 2 * s->slot_nbytes;
    s->what = "shm setup";

    double deadline = accel__now() + s->timeout_s;
    int fd = -1;
    accel_status st =
        cfg->local_rank == 0 ? create_segment(s, &fd) : open_segment(s, &fd, deadline);
    if (fd >= 0) {
        close(fd); /* the mapping keeps the segment alive */
    }
    if (st != ACCEL_OK) {
        goto fail;
    }
    s->hdr = s->base;
    s->lines = (accel__shm_line *)((char *)s->base + lines_off);
    s->data = (char *)s->base + data_off;

    atomic_store_explicit(&s->lines[s->rank].pid, (int32_t)getpid(), memory_order_relaxed);
    if (atomic_fetch_add_explicit(&s->hdr->attached, 1, memory_order_acq_rel) + 1 == s->n_ranks) {
        /* Everyone has it mapped: the name is no longer needed. */
        if (shm_unlink(s->name) == 0 || errno == ENOENT) {
            atomic_store_explicit(&s->hdr->unlinked, 1, memory_order_release);
        }
    }
    while (atomic_load_explicit(&s->hdr->attached, memory_order_acquire) < s->n_ranks) {
        if ((st = accel__shm_check_abort(s)) != ACCEL_OK) {
            goto fail;
        }
        if (accel__now() >= deadline) {
            st = accel__seterr(
                NULL, ACCEL_ETIMEDOUT, "shm: only %d of %d processes attached to %s within %g s",
                (int)atomic_load(&s->hdr->attached), s->n_ranks, s->name, s->timeout_s);
            goto fail;
        }
        sleep_s(100e-6);
    }
    accel__log(&s->log, ACCEL__LOG_DEBUG,
               "shm: segment %s, %d processes, one-shot <= %zu bytes, slot %zu bytes, spin %g us",
               s->name, s->n_ranks, s->oneshot_nbytes, s->slot_nbytes, s->spin_s * 1e6);
    *out = s;
    return ACCEL_OK;

fail:
    shm_unlink(s->name);
    accel__shm_close(s);
    return st;
}

void accel__shm_close(accel__shm *s)
{
    if (s == NULL) {
        return;
    }
    accel__shm_free_all(s);
    if (s->base != NULL) {
        /* Normally the last rank to attach removed the name already, and unlinking it again
         * could remove the segment of a restarted job that reuses the job id: only retry when
         * that first unlink did not happen. */
        if (s->hdr != NULL && !atomic_load_explicit(&s->hdr->unlinked, memory_order_acquire)) {
            shm_unlink(s->name);
        }
        munmap(s->base, s->map_nbytes);
    }
    accel__free(s->in);
    accel__free(s);
}
