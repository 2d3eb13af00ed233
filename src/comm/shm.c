/*
 * The shm transport: the sync point, liveness, the job-wide abort, and the per-call
 * declarations every rank checks (the segment's setup is in shm_setup.c).
 *
 * Segment: header (magic, settings, job, attach counter, job-wide abort word), a control line
 * per rank (first cache line: progress sequence number = futex word, sleeper count, pid, the
 * call declarations; then exit marks, allocation/zero-copy words and an abort's status and
 * message), then two data slots per rank.
 *
 * Sync: each rank's progress word counts the sync points it has passed; waiting means "peer's
 * progress >= mine". Stores are release/seq_cst, loads acquire (never volatile). A waiter spins
 * briefly, then sleeps on the peer's word with a short futex timeout, checking every ~50 ms
 * whether the ranks it waits for are still alive; a dead rank, a rank that left the job (its
 * exit mark) or an expired deadline is written into the abort word so every other rank fails at
 * once with the same diagnosis.
 *
 * Declarations: every call declares (kind, count, dtype, op, root) as two words, which its first
 * sync writes into this rank's first line together with the progress word that peers read
 * anyway; after that sync every rank compares all declarations with its own before any data is
 * touched. All earlier calls matched, so they took the same number of syncs: the first differing
 * call is found at the same sync on every rank, and every rank reports the same pair (rank 0's
 * call and the first that differs from it).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "shm.h"

#define POLL_S 0.05 /* liveness check period while sleeping */

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

/* ---- liveness ---- */

/* Reads /proc/<pid>/stat: its state letter and start time (field 22). Returns 0, or -1 with
 * errno when unreadable. */
static int proc_stat(int pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        errno = EIO;
        return -1;
    }
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may contain spaces and parens */
    if (p == NULL || p[1] != ' ') {
        errno = EIO;
        return -1;
    }
    *state = p[2];
    p += 2;
    for (int field = 3; field < 22 && p != NULL; field++) {
        p = strchr(p, ' ');
        p = p != NULL ? p + 1 : NULL;
    }
    *start = p != NULL ? strtoull(p, NULL, 10) : 0;
    return 0;
}

uint64_t accel__shm_pid_start(int pid)
{
    char state;
    uint64_t start = 0;
    return proc_stat(pid, &state, &start) == 0 ? start : 0;
}

int accel__shm_pid_gone(int pid, uint64_t start)
{
    if (pid <= 0) {
        return 0;
    }
    if (kill(pid, 0) == -1 && errno == ESRCH) {
        return 1;
    }
    char state;
    uint64_t now_start;
    if (proc_stat(pid, &state, &now_start) != 0) {
        return errno == ENOENT;
    }
    return state == 'Z' || state == 'X' || (start != 0 && now_start != start);
}

int accel__shm_pid_stopped(int pid)
{
    char state;
    uint64_t start;
    return pid > 0 && proc_stat(pid, &state, &start) == 0 && (state == 'T' || state == 't');
}

static void wake_all(accel__shm *s)
{
    for (int r = 0; r < s->n_ranks; r++) {
        futex(&s->lines[r].progress, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* ---- the job-wide abort ---- */

void accel__shm_abort(accel__shm *s, accel__shm_why why, int rank, int pid)
{
    /* seq_cst CAS below: whatever this thread wrote before (an aborting rank's line) is visible
     * to whoever reads the word with acquire. */
    if (pid == 0) {
        pid = atomic_load_explicit(&s->lines[rank].pid, memory_order_relaxed);
    }
    uint64_t word =
        (uint64_t)why | ((uint64_t)(rank & 0xffffff) << 8) | (uint64_t)(uint32_t)pid << 32;
    uint64_t expected = 0;
    atomic_compare_exchange_strong(&s->hdr->abort_word, &expected, word);
    wake_all(s);
}

int accel__shm_aborted(const accel__shm *s)
{
    return atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire) != 0;
}

/* A rank claimed twice: see accel__shm_clash_error. */
static accel_status clash_text(const accel__shm *s, int rank, int pid, char *msg, size_t nbytes)
{
    rank += s->process_base; /* for messages */
    if (s->rdv[0] != '\0') {
        snprintf(msg, nbytes,
                 "shm: another process (pid %d) also joined this job as rank %d through the "
                 "store at %s: two jobs use the same MASTER_ADDR and MASTER_PORT, and both stop "
                 "(give each job its own MASTER_PORT, or start it with accel launch)",
                 pid, rank, s->rdv);
    } else {
        snprintf(msg, nbytes,
                 "shm: another process (pid %d) also joined this job as rank %d: two jobs use the "
                 "same ACCEL_JOB_ID (%s), and both stop (give each job its own ACCEL_JOB_ID, or "
                 "start it with accel launch)",
                 pid, rank, s->job_id);
    }
    return ACCEL_EINVAL;
}

accel_status accel__shm_clash_error(const accel__shm *s, int rank, int pid)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    return accel__seterr(NULL, clash_text(s, rank, pid, msg, sizeof(msg)), "%s", msg);
}

accel_status accel__shm_check_abort(accel__shm *s)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    accel_status st = accel__shm_abort_text(s, msg, sizeof(msg));
    return st == ACCEL_OK ? st : accel__seterr(NULL, st, "%s", msg);
}

accel_status accel__shm_abort_text(const accel__shm *s, char *msg, size_t nbytes)
{
    msg[0] = '\0';
    uint64_t w = atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire);
    if (w == 0) {
        return ACCEL_OK;
    }
    int rank = (int)((w >> 8) & 0xffffff), pid = (int)(uint32_t)(w >> 32);
    const int me = s->process_base + s->rank, who = s->process_base + rank; /* for messages */
    switch ((accel__shm_why)(w & 0xff)) {
    case ACCEL__SHM_DIED:
        snprintf(msg, nbytes,
                 "%s: process %d (pid %d) died (killed or exited) during a collective; process "
                 "%d cannot continue",
                 s->what, who, pid, me);
        return ACCEL_EPEER;
    case ACCEL__SHM_OTHER_CALL:
        snprintf(msg, nbytes,
                 "%s: process %d (pid %d) called a different collective (or allocation) at this "
                 "point; process %d cannot continue",
                 s->what, who, pid, me);
        return ACCEL_EINVAL;
    case ACCEL__SHM_EXITED: {
        const accel__shm_line *l = &s->lines[rank];
        char how[48];
        if (atomic_load_explicit(&l->left, memory_order_acquire) == ACCEL__SHM_LEFT_EXITED) {
            snprintf(how, sizeof(how), "status %d", l->exit_status);
        } else {
            snprintf(how, sizeof(how), "accel_free");
        }
        snprintf(msg, nbytes,
                 "%s #%llu: rank %d (pid %d) exited (%s) while rank %d waits for it in this "
                 "call: the processes made different numbers of collective calls",
                 s->what, (unsigned long long)s->n_calls, who, pid, how, me);
        return ACCEL_EPEER;
    }
    case ACCEL__SHM_CLASH:
        return clash_text(s, rank, pid, msg, nbytes);
    case ACCEL__SHM_ABORTED: {
        const accel__shm_line *l = &s->lines[rank];
        accel_status st = (accel_status)l->abort_status;
        snprintf(msg, nbytes, "%s: process %d (pid %d) aborted the communicator: %.*s", s->what,
                 who, pid, (int)sizeof(l->abort_msg), l->abort_msg);
        return st < 0 ? st : ACCEL_EPEER;
    }
    case ACCEL__SHM_TIMEOUT:
        break;
    }
    snprintf(msg, nbytes,
             "%s: process %d (pid %d) did not arrive within the %g s timeout (stopped, hung, or "
             "calling a different collective); process %d gives up",
             s->what, who, pid, s->timeout_s, me);
    return ACCEL_ETIMEDOUT;
}

/* ---- call declarations ---- */

void accel__shm_begin_call(accel__shm *s, int kind, size_t count, int dtype, int op, int wire,
                           int root)
{
    /* Kept here until the sync publishes it: written into the line just before the progress
     * word, a peer spinning on that line loses its copy once per call, not twice. */
    s->pending.count = count;
    s->pending.what = (uint64_t)(uint8_t)kind | (uint64_t)(uint8_t)dtype << 8 |
                      (uint64_t)(uint8_t)op << 16 | (uint64_t)(uint8_t)wire << 24 |
                      (uint64_t)(uint32_t)root << 32;
    s->n_calls++;
    s->check_call = 1;
}

void accel__shm_declare_next(accel__shm *s, int kind, size_t count, int dtype, int op, int wire,
                             int root)
{
    s->declare_as.count = count;
    s->declare_as.what = (uint64_t)(uint8_t)kind | (uint64_t)(uint8_t)dtype << 8 |
                         (uint64_t)(uint8_t)op << 16 | (uint64_t)(uint8_t)wire << 24 |
                         (uint64_t)(uint32_t)root << 32;
    s->has_declare_as = 1;
}

void accel__shm_declare_clear(accel__shm *s)
{
    s->has_declare_as = 0;
}

/* "allreduce(count=1000, f32, sum) #17": the declared call as the user wrote it. */
static void call_str(const accel__shm_call *c, uint64_t seq, char *buf, size_t nbytes)
{
    const int kind = (int)(c->what & 0xff);
    int k;
    if (kind == ACCEL__SHM_CALL_ALLOC) {
        /* shm's own allocation declares no size (it compares sizes apart); hier's does. */
        k = c->count != 0 ? snprintf(buf, nbytes, "accel_alloc_shared(nbytes=%llu)",
                                     (unsigned long long)c->count)
                          : snprintf(buf, nbytes, "accel_alloc_shared()");
    } else {
        /* The declared count of reduce_scatter / allgather is the whole array: pass it as the
         * total, which is what the front end's formatter shows for them. */
        accel__coll op = ACCEL__COLL(
            (accel__coll_kind)kind, NULL, NULL, c->count, (accel_dtype)((c->what >> 8) & 0xff),
            (accel_reduce_op)((c->what >> 16) & 0xff), (int)(int32_t)(c->what >> 32));
        op.wire = (accel_dtype)((c->what >> 24) & 0xff);
        op.total = c->count;
        accel__coll_str(&op, 1, buf, nbytes);
        k = (int)strlen(buf);
    }
    if (k > 0 && (size_t)k < nbytes) {
        snprintf(buf + k, nbytes - (size_t)k, " #%llu", (unsigned long long)seq);
    }
}

/* An allocation matches any allocation: sizes are compared apart, without breaking the
 * communicator (shm_sym.c's check_peers; hier after the exchange its allocation declares). */
static int same_call(const accel__shm_call *a, const accel__shm_call *b)
{
    if ((a->what & 0xff) == ACCEL__SHM_CALL_ALLOC && (b->what & 0xff) == ACCEL__SHM_CALL_ALLOC) {
        return 1;
    }
    return a->count == b->count && a->what == b->what;
}

/* A rank declared another call: names rank 0's and the first rank's that differs from it (the
 * same pair on every rank), and aborts the job so that waits still to come fail at once. */
static accel_status call_mismatch(accel__shm *s, unsigned par)
{
    const accel__shm_call *ref = &s->lines[0].call[par];
    int q = 1;
    while (q < s->n_ranks - 1 && same_call(&s->lines[q].call[par], ref)) {
        q++;
    }
    char a[128], b[128];
    call_str(ref, s->n_calls, a, sizeof(a));
    call_str(&s->lines[q].call[par], s->n_calls, b, sizeof(b));
    accel__shm_abort(s, ACCEL__SHM_OTHER_CALL, q, 0);
    /* Job-wide numbers, as the other messages give them (hier: a machine's segment). */
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "collective mismatch: rank %d called %s, rank %d called %s (every "
                         "process must make the same collective calls in the same order, with "
                         "the same count, dtype, op and root)",
                         s->process_base, a, s->process_base + q, b);
}

/* After the first sync of a declared call: every rank's declaration against this rank's. */
static accel_status check_calls(accel__shm *s)
{
    s->check_call = 0;
    const unsigned par = (unsigned)(s->n_calls & 1);
    for (int q = 0; q < s->n_ranks; q++) {
        if (!same_call(&s->lines[q].call[par], &s->pending)) {
            return call_mismatch(s, par);
        }
    }
    return ACCEL_OK;
}

/* ---- leaving the job ---- */

/* The communicators open in this process, for the exit handler. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static accel__shm *live;
static int exit_handler_set;

/* Marks this rank as gone and wakes whoever waits on its progress word: a peer still waiting
 * for it then fails at once ("exited"), while peers it had already met are not disturbed. */
static void mark_left(accel__shm *s, int how, int status)
{
    accel__shm_line *me = &s->lines[s->rank];
    me->exit_status = status;
    atomic_store_explicit(&me->left, how, memory_order_seq_cst);
    futex(&me->progress, FUTEX_WAKE, INT_MAX, NULL);
}

/* on_exit (glibc) rather than atexit: it receives the exit status, which peers then report. */
static void on_process_exit(int status, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&live_mu);
    for (accel__shm *s = live; s != NULL; s = s->next_live) {
        if (s->owner_pid == (int)getpid()) { /* not in a forked child */
            mark_left(s, ACCEL__SHM_LEFT_EXITED, status);
            accel__shm_drop_name(s); /* exit without accel_free leaves nothing either */
        }
    }
    pthread_mutex_unlock(&live_mu);
}

void accel__shm_register(accel__shm *s)
{
    s->owner_pid = (int)getpid();
    s->attached = 1;
    pthread_mutex_lock(&live_mu);
    if (!exit_handler_set) {
        exit_handler_set = on_exit(on_process_exit, NULL) == 0;
    }
    s->next_live = live;
    live = s;
    pthread_mutex_unlock(&live_mu);
}

void accel__shm_leave(accel__shm *s)
{
    if (!s->attached) {
        return;
    }
    pthread_mutex_lock(&live_mu);
    for (accel__shm **link = &live; *link != NULL; link = &(*link)->next_live) {
        if (*link == s) {
            *link = s->next_live;
            break;
        }
    }
    pthread_mutex_unlock(&live_mu);
    if (s->owner_pid == (int)getpid()) {
        mark_left(s, ACCEL__SHM_LEFT_FREED, 0);
    }
    s->attached = 0;
}

/* ---- descriptor and allocation words ---- */

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

/* The first rank not at `step` that is gone, or -1: it left the job (*why EXITED) or its
 * process is dead (DIED). */
static int find_gone(accel__shm *s, uint32_t step, accel__shm_why *why)
{
    for (int r = 0; r < s->n_ranks; r++) {
        if (r == s->rank ||
            reached(atomic_load_explicit(&s->lines[r].progress, memory_order_acquire), step)) {
            continue;
        }
        if (atomic_load_explicit(&s->lines[r].left, memory_order_acquire) != 0) {
            *why = ACCEL__SHM_EXITED;
            return r;
        }
        if (accel__shm_pid_gone(atomic_load_explicit(&s->lines[r].pid, memory_order_relaxed), 0)) {
            *why = ACCEL__SHM_DIED;
            return r;
        }
    }
    return -1;
}

/* Whether rank q, which has not reached `step`, left the job: it never will. The left mark is
 * stored after its last progress, so progress is re-read after seeing it. */
static int left_behind(accel__shm *s, int q, uint32_t step)
{
    return atomic_load_explicit(&s->lines[q].left, memory_order_acquire) != 0 &&
           !reached(atomic_load_explicit(&s->lines[q].progress, memory_order_acquire), step);
}

/* With s->defer_s (hier's shm level): a process this one waits for that is alive and not
 * stopped may itself be waiting at another level (hier: process 1 waits across for a stopped
 * process 3 while process 0 waits here for process 1). Its own diagnosis, which names the
 * culprit, lands in the abort word once its wait has run out; so before claiming its own,
 * this one waits up to defer_s for that, for the late ones to arrive, or for one of them to
 * stop or die (the culprit is then here). Returns ACCEL_OK to go on, else the adopted abort. */
static accel_status defer(accel__shm *s, uint32_t step)
{
    const double until = accel__now() + s->defer_s;
    for (;;) {
        ACCEL_TRY(accel__shm_check_abort(s));
        int alive = 0;
        for (int r = 0; r < s->n_ranks; r++) {
            if (r == s->rank ||
                reached(atomic_load_explicit(&s->lines[r].progress, memory_order_acquire), step)) {
                continue;
            }
            int pid = (int)atomic_load_explicit(&s->lines[r].pid, memory_order_relaxed);
            if (accel__shm_pid_stopped(pid) || accel__shm_pid_gone(pid, 0)) {
                return ACCEL_OK;
            }
            alive = 1;
        }
        if (!alive || accel__now() >= until) {
            return ACCEL_OK;
        }
        struct timespec ts = {0, 5000000}; /* 5 ms: a few hundred /proc reads at most */
        nanosleep(&ts, NULL);
    }
}

static accel_status timed_out(accel__shm *s, uint32_t step)
{
    if (s->defer_s > 0) {
        ACCEL_TRY(defer(s, step));
    }
    char list[512];
    size_t len = 0;
    int first = -1;
    list[0] = '\0';
    for (int r = 0; r < s->n_ranks && len < sizeof(list) - 40; r++) {
        if (r != s->rank &&
            !reached(atomic_load_explicit(&s->lines[r].progress, memory_order_acquire), step)) {
            first = first < 0 ? r : first;
            len +=
                (size_t)snprintf(list + len, sizeof(list) - len, "%sprocess %d (pid %d)",
                                 len ? ", " : "", s->process_base + r,
                                 (int)atomic_load_explicit(&s->lines[r].pid, memory_order_relaxed));
        }
    }
    if (first < 0) {
        return ACCEL_OK; /* they arrived just now */
    }
    accel__shm_abort(s, ACCEL__SHM_TIMEOUT, first, 0);
    uint64_t w = atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire);
    if ((w & 0xff) != ACCEL__SHM_TIMEOUT || (int)((w >> 8) & 0xffffff) != first) {
        return accel__shm_check_abort(s); /* someone else's diagnosis came first */
    }
    return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                         "%s: process %d timed out after %g s waiting for %s "
                         "(stopped, hung, or calling a different collective)",
                         s->what, s->process_base + s->rank, s->timeout_s, list);
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
            if (left_behind(s, q, step)) {
                accel__shm_abort(s, ACCEL__SHM_EXITED, q, 0);
                return accel__shm_check_abort(s);
            }
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
        if (left_behind(s, q, step)) { /* it woke us on leaving */
            accel__shm_abort(s, ACCEL__SHM_EXITED, q, 0);
            return accel__shm_check_abort(s);
        }
        double now = accel__now();
        if (now >= next_check) {
            accel__shm_why why;
            int gone = find_gone(s, step, &why);
            if (gone >= 0) {
                accel__shm_abort(s, why, gone, 0);
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
    if (s->check_call) {
        me->call[s->n_calls & 1] = s->pending;
    }
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
    /* Every rank has published this sync, so every declaration of the call is visible. */
    return s->check_call ? check_calls(s) : ACCEL_OK;
}
