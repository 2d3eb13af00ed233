/*
 * Setting up and tearing down the shm backend's segment: settings, the job key, the segment's
 * name, creation, verification and attachment.
 *
 * Who may use a segment: it is named "/accel-<euid>-<job key>", where the key is secret and
 * random (accel launch's ACCEL_JOB_ID, or a nonce agreed through the job's store, shm_rdv.c),
 * so nobody else can predict the name and plant it in advance. Whatever the name, a segment is
 * used only after fstat shows it is a regular file of this euid with mode 0600, and its header
 * carries this job's key hash, this job's settings and a live creator; anything else is refused
 * at once with a message naming the file. The creator builds the segment under a temporary
 * name and link()s it to the final name, which fails if the name exists, so a joiner never sees
 * a half-made segment and a stale one (its creator gone) is never reused: the creator replaces
 * it, and the others wait for that.
 *
 * Two jobs with one ACCEL_JOB_ID: each process claims its rank in the segment (its line's pid,
 * by CAS), and a second claimant of a rank stops the job (ACCEL__SHM_CLASH), so that every
 * process of both fails. With an id accel generates (32 hex digits) that cannot happen, and the
 * name goes once every rank attached, so a SIGKILL leaves nothing. A user's id may be reused by
 * two jobs started together, so its name stays for the job's life (until the first rank leaves):
 * every process of a second job meets the first job's segment, and a second creator claims rank
 * 0 in it. After a clash the name stays too, so that processes of the clashing jobs that come
 * late (started before the clash) fail on it; a job started afterwards replaces it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "shm.h"
#include "store.h"

#define SHM_DIR "/dev/shm" /* where glibc's shm_open keeps POSIX shared memory on Linux */
#define KEY_MAX 100        /* characters of the job key in the name (the hash covers all) */

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

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

/* "/accel-<euid>-<key>", the key's odd characters replaced and its length capped. */
static void make_name(char *out, size_t nbytes, const char *key)
{
    int n = snprintf(out, nbytes, "/accel-%u-", (unsigned)geteuid());
    size_t len = (size_t)n;
    for (const char *p = key; *p != '\0' && len + 1 < nbytes && p - key < KEY_MAX; p++) {
        char ch = *p;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == '-';
        out[len++] = ok ? ch : '_';
    }
    out[len] = '\0';
}

accel_status accel__shm_nonce(char *out, size_t nbytes)
{
    if (accel__random_hex(out, nbytes) != 0) {
        return accel__seterr(NULL, ACCEL_EIO,
                             "shm: no random source for the job nonce "
                             "(getrandom failed)");
    }
    return ACCEL_OK;
}

/* ---- verification ---- */

static accel_status foreign(const char *name, const struct stat *st)
{
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "shm: segment " SHM_DIR "%s belongs to uid %u with mode %04o, not to "
                         "this process's uid %u with mode 0600: refusing it (someone else "
                         "created it under this job's name; remove it, and give every job an "
                         "unpredictable ACCEL_JOB_ID, as accel launch does)",
                         name, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
                         (unsigned)geteuid());
}

/* Now, in the unit of /proc start times: clock ticks after boot. */
static uint64_t now_ticks(void)
{
    struct timespec ts;
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * (uint64_t)hz +
           (uint64_t)ts.tv_nsec / (1000000000ull / (uint64_t)hz);
}

/* Removes `name` if it still names the segment (dev, ino) whose header is h, and no live
 * process took that on before (h->unlinked: its pid). Only the name's own segment can lose it
 * this way: a later segment under the name is another file, and the CAS lets one process at a
 * time past the check. A remover that died before finishing is taken over, so its segment is
 * not left in the way of the next job. Returns 1 when this call took it on. */
static int take_name(const char *name, accel__shm_header *h, uint64_t dev, uint64_t ino)
{
    int32_t seen = 0, me = (int32_t)getpid();
    while (!atomic_compare_exchange_strong(&h->unlinked, &seen, me)) {
        if (seen == me || !accel__shm_pid_gone(seen, 0)) {
            return 0;
        }
    }
    char path[200];
    struct stat st;
    snprintf(path, sizeof(path), SHM_DIR "%s", name);
    if (stat(path, &st) == 0 && (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino) {
        shm_unlink(name);
    }
    return 1;
}

static void remove_name(accel__shm *s)
{
    if (s->own_name && s->hdr != NULL) {
        take_name(s->name, s->hdr, s->seg_dev, s->seg_ino);
    }
}

/* Whether the job was stopped because two jobs met in it. */
static int clashed(const accel__shm *s)
{
    return s->hdr != NULL && (atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire) &
                              0xff) == ACCEL__SHM_CLASH;
}

void accel__shm_drop_name(accel__shm *s)
{
    /* A clashed segment keeps its name: late processes of the clashing jobs meet it and stop. */
    if (!(s->keep_name && clashed(s))) {
        remove_name(s);
    }
}

/* What verify found under the job's name. */
typedef enum seg_state {
    SEG_LIVE,   /* this job's, with a live creator: usable */
    SEG_STALE,  /* this job's, its creator gone: local rank 0 replaces it */
    SEG_REFUSED /* the error is set */
} seg_state;

/* Checks the segment open (read-write) as fd against this job: another user's or not private,
 * not an accel segment, another job's or settings, stopped on a clash that concerns this
 * process, or (without keep_name) already complete: refused, naming the file. A segment whose
 * creator is gone is stale; with `replace`, this process takes on removing its name (logged).
 * *creator: its creator's pid. A job that was aborted otherwise passes: claiming reports it. */
static seg_state verify(const accel__shm *s, int fd, uint64_t job_hash, int replace, int *creator,
                        accel_status *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = accel__seterr(NULL, ACCEL_EIO, "shm: cannot stat segment " SHM_DIR "%s: %s", s->name,
                             strerror(errno));
        return SEG_REFUSED;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != 0600) {
        *err = foreign(s->name, &st);
        return SEG_REFUSED;
    }
    if ((size_t)st.st_size < sizeof(accel__shm_header)) {
        *err = accel__seterr(NULL, ACCEL_EINVAL,
                             "shm: " SHM_DIR "%s is not an accel segment (%lld bytes)", s->name,
                             (long long)st.st_size);
        return SEG_REFUSED;
    }
    accel__shm_header *h = mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        *err = accel__seterr(NULL, ACCEL_EIO, "shm: cannot map segment " SHM_DIR "%s: %s", s->name,
                             strerror(errno));
        return SEG_REFUSED;
    }
    seg_state r = SEG_REFUSED;
    uint64_t w = atomic_load_explicit(&h->abort_word, memory_order_acquire);
    const int clash = (w & 0xff) == ACCEL__SHM_CLASH;
    const int clash_rank = (int)((w >> 8) & 0xffffff), clash_pid = (int)(uint32_t)(w >> 32);
    *creator = h->creator_pid;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != ACCEL__SHM_MAGIC ||
        h->version != ACCEL__SHM_VERSION) {
        *err = accel__seterr(NULL, ACCEL_EINVAL,
                             "shm: " SHM_DIR "%s is not an accel segment of this version", s->name);
    } else if (h->job_hash != job_hash) {
        *err = accel__seterr(NULL, ACCEL_EINVAL,
                             "shm: segment " SHM_DIR "%s belongs to another job (its job id "
                             "differs from this one's)",
                             s->name);
    } else if (accel__shm_pid_gone(h->creator_pid, h->creator_start)) {
        /* A clash's record stops the processes of the clashing jobs that come late (started
         * before it was seen); a job started afterwards replaces it, like any leftover. */
        uint64_t at = atomic_load_explicit(&h->clash_ticks, memory_order_relaxed);
        if (clash && s->keep_name && s->start_ticks != 0 && s->start_ticks <= at) {
            *err = accel__shm_clash_error(s, clash_rank, clash_pid);
        } else {
            r = SEG_STALE;
            if (replace && take_name(s->name, h, (uint64_t)st.st_dev, (uint64_t)st.st_ino)) {
                accel__log(&s->log, ACCEL__LOG_WARN,
                           "shm: removed " SHM_DIR "%s, left by %s (its creator, pid %d, is "
                           "gone)",
                           s->name,
                           clash ? "two jobs that used the same ACCEL_JOB_ID"
                                 : "a job that was killed",
                           (int)h->creator_pid);
            }
        }
    } else if (clash) {
        *err = accel__shm_clash_error(s, clash_rank, clash_pid);
    } else if (h->n_ranks != s->n_ranks || h->slot_nbytes != s->slot_nbytes ||
               h->map_nbytes != s->map_nbytes || h->oneshot_nbytes != s->oneshot_nbytes ||
               h->zc_nbytes != s->zc_nbytes || (size_t)st.st_size != s->map_nbytes) {
        *err =
            accel__seterr(NULL, ACCEL_EINVAL,
                          "shm: segment " SHM_DIR "%s was created for other settings (process "
                          "count or ACCEL_SHM_* variables differ between processes%s)",
                          s->name, s->keep_name ? ", or another job uses this ACCEL_JOB_ID" : "");
    } else if (!s->keep_name &&
               atomic_load_explicit(&h->attached, memory_order_acquire) >= s->n_ranks) {
        *err = accel__seterr(NULL, ACCEL_EINVAL,
                             "shm: segment " SHM_DIR "%s is in use by a running job (created by "
                             "pid %d) with the same ACCEL_JOB_ID: give each job its own",
                             s->name, (int)h->creator_pid);
    } else {
        r = SEG_LIVE;
    }
    munmap((void *)h, sizeof(*h));
    return r;
}

/* ---- creation and opening ---- */

/* Maps the segment open as fd (s->map_nbytes, verified) and finds its parts. */
static accel_status map_segment(accel__shm *s, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        return accel__seterr(NULL, ACCEL_EIO, "shm: cannot stat segment " SHM_DIR "%s: %s", s->name,
                             strerror(errno));
    }
    s->base = mmap(NULL, s->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return accel__seterr(NULL, ACCEL_ENOMEM, "shm: cannot map segment %s (%zu bytes): %s",
                             s->name, s->map_nbytes, strerror(errno));
    }
    s->seg_dev = (uint64_t)st.st_dev;
    s->seg_ino = (uint64_t)st.st_ino;
    s->hdr = s->base;
    s->lines = (accel__shm_line *)((char *)s->base + align_up(sizeof(accel__shm_header), 64));
    s->data = (char *)s->base + (s->map_nbytes - (size_t)s->n_ranks * 2 * s->slot_nbytes);
    return ACCEL_OK;
}

static void unmap_segment(accel__shm *s)
{
    if (s->base != NULL) {
        munmap(s->base, s->map_nbytes);
    }
    s->base = NULL;
    s->hdr = NULL;
    s->lines = NULL;
    s->data = NULL;
}

/* What stands under the name that create() could not take. Returns 1 when it was stale (or
 * went meanwhile): try again. Else 0 and *r: an error naming it, or, with keep_name, ACCEL_OK
 * for a live segment of this job, mapped instead of ours (claiming rank 0 in it then stops both
 * jobs); without keep_name a live one is an error (a second local rank 0 of the same job). */
static int existing(accel__shm *s, uint64_t job_hash, accel_status *r)
{
    char path[sizeof(s->name) + sizeof(SHM_DIR)];
    snprintf(path, sizeof(path), SHM_DIR "%s", s->name);
    int other = shm_open(s->name, O_RDWR | O_CLOEXEC, 0), creator = 0;
    struct stat st;
    if (other < 0) {
        if (errno == ENOENT) {
            return 1;
        }
        *r = errno == EACCES && stat(path, &st) == 0
                 ? foreign(s->name, &st)
                 : accel__seterr(NULL, ACCEL_EIO, "shm: cannot open segment %s: %s", path,
                                 strerror(errno));
        return 0;
    }
    seg_state v = verify(s, other, job_hash, 1, &creator, r);
    if (v == SEG_LIVE && s->keep_name) {
        unmap_segment(s);
        *r = map_segment(s, other);
        s->own_name = *r == ACCEL_OK; /* this job's: it goes if the job fails */
    } else if (v == SEG_LIVE) {
        *r = accel__seterr(NULL, ACCEL_EINVAL,
                           "shm: segment %s already exists (is another process local rank 0 of "
                           "this job?)",
                           path);
    }
    close(other);
    return v == SEG_STALE;
}

/* Local rank 0: a fresh segment, initialised under a temporary name (with this rank claimed)
 * and then linked to the final name, which must not exist: a stale segment there is replaced,
 * anything else is for existing() to judge. On success s->base maps the job's segment and
 * s->own_name is set. */
static accel_status create(accel__shm *s, uint64_t job_hash, double deadline)
{
    uint64_t rnd[2];
    if (accel__os_random(rnd, sizeof(rnd)) != 0) {
        return accel__seterr(NULL, ACCEL_EIO, "shm: no random source (getrandom failed)");
    }
    char tmp[sizeof(s->name) + 32];
    snprintf(tmp, sizeof(tmp), "%s.init-%016llx", s->name, (unsigned long long)rnd[0]);
    int fd = shm_open(tmp, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        return accel__seterr(NULL, ACCEL_EIO, "shm: cannot create segment " SHM_DIR "%s: %s", tmp,
                             strerror(errno));
    }
    accel_status r = ACCEL_OK;
    /* posix_fallocate, not ftruncate: the pages are reserved now, so a full /dev/shm (64 MiB in
     * a default container) is an error here instead of a SIGBUS in the middle of a collective.
     * fchmod: the mode must not depend on the umask (joiners insist on 0600). */
    int err = fchmod(fd, 0600) != 0 ? errno : posix_fallocate(fd, 0, (off_t)s->map_nbytes);
    if (err != 0) {
        r = accel__seterr(NULL, ACCEL_ENOMEM,
                          "shm: cannot allocate %zu bytes for segment " SHM_DIR "%s: %s "
                          "(lower ACCEL_SHM_CHUNK_NBYTES or enlarge /dev/shm)",
                          s->map_nbytes, s->name, strerror(err));
        goto out;
    }
    if ((r = map_segment(s, fd)) != ACCEL_OK) {
        goto out;
    }
    accel__shm_header *h = s->hdr;
    h->version = ACCEL__SHM_VERSION;
    h->n_ranks = s->n_ranks;
    h->slot_nbytes = s->slot_nbytes;
    h->map_nbytes = s->map_nbytes;
    h->oneshot_nbytes = s->oneshot_nbytes;
    h->zc_nbytes = s->zc_nbytes;
    h->job_hash = job_hash;
    h->secret = rnd[1];
    h->creator_pid = (int32_t)getpid();
    h->creator_start = accel__shm_pid_start((int)getpid());
    atomic_store_explicit(&s->lines[s->rank].pid, (int32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&h->magic, ACCEL__SHM_MAGIC, memory_order_release);

    char from[sizeof(tmp) + sizeof(SHM_DIR)], to[sizeof(s->name) + sizeof(SHM_DIR)];
    snprintf(from, sizeof(from), SHM_DIR "%s", tmp);
    snprintf(to, sizeof(to), SHM_DIR "%s", s->name);
    for (;;) {
        if (link(from, to) == 0) {
            s->own_name = 1;
            break;
        }
        if (errno != EEXIST) {
            r = accel__seterr(NULL, ACCEL_EIO, "shm: cannot name segment %s: %s", to,
                              strerror(errno));
            break;
        }
        if (!existing(s, job_hash, &r)) {
            break;
        }
        if (accel__now() >= deadline) {
            r = accel__seterr(NULL, ACCEL_ETIMEDOUT,
                              "shm: segment %s, left over from a job that was killed, could not "
                              "be replaced within %g s: remove it",
                              to, s->timeout_s);
            break;
        }
        sleep_s(200e-6); /* another process removes it: the name goes at once */
    }
out:
    if (r != ACCEL_OK) {
        unmap_segment(s);
    }
    shm_unlink(tmp);
    close(fd);
    return r;
}

/* Other ranks: opens the segment, verifies it and maps it. With `wait`, waits until deadline
 * for local rank 0 to create it, or to replace one whose creator is gone. */
static accel_status join(accel__shm *s, uint64_t job_hash, double deadline, int wait)
{
    char path[sizeof(s->name) + sizeof(SHM_DIR)];
    snprintf(path, sizeof(path), SHM_DIR "%s", s->name);
    int stale = 0; /* the pid of a stale segment's creator */
    for (;;) {
        int fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0), creator = 0;
        struct stat st;
        if (fd >= 0) {
            accel_status r = ACCEL_OK;
            seg_state v = verify(s, fd, job_hash, 0, &creator, &r);
            if (v == SEG_LIVE) {
                r = map_segment(s, fd);
                s->own_name = r == ACCEL_OK; /* this job's: it goes if the job fails */
            }
            close(fd);
            if (v != SEG_STALE) {
                return r;
            }
            stale = creator;
            if (!wait) {
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "shm: segment %s is left over from a job that was killed "
                                     "(its creator, pid %d, is gone): remove it, or start this "
                                     "job with another ACCEL_JOB_ID",
                                     path, stale);
            }
        } else if (errno == EACCES && stat(path, &st) == 0) {
            return foreign(s->name, &st); /* not ours: we may not even open it */
        } else if (errno != ENOENT) {
            return accel__seterr(NULL, ACCEL_EIO, "shm: cannot open segment %s: %s", path,
                                 strerror(errno));
        } else {
            stale = 0;
        }
        if (!wait) {
            return accel__seterr(NULL, ACCEL_EIO,
                                 "shm: process %d cannot find the segment %s that process 0 "
                                 "created",
                                 s->rank, path);
        }
        if (accel__now() >= deadline) {
            char why[128] = "";
            if (stale != 0) {
                snprintf(why, sizeof(why),
                         " (one left over from a job that was killed is there: its creator, "
                         "pid %d, is gone)",
                         stale);
            }
            return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                                 "shm: process %d waited in vain for local process 0 to create "
                                 "segment %s%s",
                                 s->rank, path, why);
        }
        sleep_s(stale != 0 ? 1e-3 : 200e-6);
    }
}

/* Claims this rank: its line's pid, 0 until then (the creator claimed its own before the name
 * appeared). A rank claimed already means that two jobs met in this segment (or two processes
 * were given one rank): the later claimant cannot tell which is the impostor, so it stops the
 * job, and the holder fails too. A job aborted meanwhile reports its own diagnosis. */
static accel_status claim(accel__shm *s)
{
    ACCEL_TRY(accel__shm_check_abort(s));
    int32_t holder = 0, me = (int32_t)getpid();
    if (atomic_compare_exchange_strong(&s->lines[s->rank].pid, &holder, me) || holder == me) {
        return ACCEL_OK;
    }
    uint64_t unset = 0;
    atomic_compare_exchange_strong(&s->hdr->clash_ticks, &unset, now_ticks());
    accel__shm_abort(s, ACCEL__SHM_CLASH, s->rank, me);
    if (s->rdv[0] != '\0') {
        return accel__shm_clash_error(s, s->rank, holder); /* the other process */
    }
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "shm: rank %d of the job in " SHM_DIR "%s was already taken by another "
                         "process (pid %d): two jobs use the same ACCEL_JOB_ID (%s), and both "
                         "stop (give each job its own ACCEL_JOB_ID, or start it with accel "
                         "launch)",
                         s->process_base + s->rank, s->name, (int)holder, s->job_id);
}

/* Counts this rank in; without keep_name the last one removes the name. Returns 1 for the
 * last. */
static int attach(accel__shm *s)
{
    atomic_store_explicit(&s->hdr_ready, 1, memory_order_seq_cst);
    if (atomic_fetch_add_explicit(&s->hdr->attached, 1, memory_order_acq_rel) + 1 < s->n_ranks) {
        return 0;
    }
    if (!s->keep_name) {
        remove_name(s);
    }
    return 1;
}

/* With ACCEL_JOB_ID: waits in the segment until every rank has attached, failing at once when
 * an attached process (or the creator) is gone. */
static accel_status wait_attached(accel__shm *s, double deadline)
{
    double next_check = accel__now() + 0.05;
    while (atomic_load_explicit(&s->hdr->attached, memory_order_acquire) < s->n_ranks) {
        ACCEL_TRY(accel__shm_check_abort(s));
        double now = accel__now();
        if (now >= deadline) {
            return accel__seterr(
                NULL, ACCEL_ETIMEDOUT, "shm: only %d of %d processes attached to %s within %g s",
                (int)atomic_load(&s->hdr->attached), s->n_ranks, s->name, s->timeout_s);
        }
        if (now >= next_check) {
            next_check = now + 0.05;
            for (int r = 0; r < s->n_ranks; r++) {
                int pid = atomic_load_explicit(&s->lines[r].pid, memory_order_relaxed);
                if (pid == 0 && r == 0) {
                    pid = s->hdr->creator_pid;
                }
                if (accel__shm_pid_gone(pid, 0)) {
                    accel__shm_abort(s, ACCEL__SHM_DIED, r, pid);
                    return accel__shm_check_abort(s);
                }
            }
        }
        sleep_s(100e-6);
    }
    return ACCEL_OK;
}

/* ---- open and close ---- */

/* The segment's size for s->n_ranks ranks and s->slot_nbytes slots. */
static void size_segment(accel__shm *s)
{
    size_t lines_off = align_up(sizeof(accel__shm_header), 64);
    size_t data_off = align_up(lines_off + (size_t)s->n_ranks * sizeof(accel__shm_line), 4096);
    s->map_nbytes = data_off + (size_t)s->n_ranks * 2 * s->slot_nbytes;
}

/* Reads the ACCEL_SHM_* settings into s and sizes the segment. */
static accel_status settings(accel__shm *s, const accel__comm_config *cfg)
{
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
    s->rank = cfg->rank;
    s->n_ranks = cfg->n_ranks;
    s->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1800;
    s->log = cfg->log;
    s->process_base = cfg->process_base;
    s->spin_s = (double)spin_us * 1e-6;
    s->oneshot_nbytes = (size_t)oneshot;
    s->nt_nbytes = (size_t)nt;
    s->zc_nbytes = zc < 0 ? SIZE_MAX : (size_t)zc; /* -1: never */
    s->slot_nbytes = align_up((size_t)(oneshot > chunk ? oneshot : chunk), 4096);
    size_segment(s);
    s->what = "shm setup";
    return ACCEL_OK;
}

/* A zeroed endpoint with its input-pointer array for n ranks, or NULL. */
static accel__shm *endpoint_new(int n_ranks)
{
    accel__shm *s = accel__calloc(1, sizeof(*s));
    const void **in = accel__calloc((size_t)n_ranks, sizeof(*in));
    if (s == NULL || in == NULL) {
        accel__free(s);
        accel__free(in);
        return NULL;
    }
    s->in = in;
    return s;
}

accel_status accel__shm_open(accel__shm **out, const accel__comm_config *cfg)
{
    if (cfg->local_n_ranks != cfg->n_ranks) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "backend shm needs every process on one machine, but only %d of "
                             "%d are local",
                             cfg->local_n_ranks, cfg->n_ranks);
    }
    accel__shm *s = endpoint_new(cfg->n_ranks);
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "shm: out of memory");
    }
    accel_status st = settings(s, cfg);
    double deadline = accel__now() + s->timeout_s;
    char key[KEY_MAX + 1] = "";
    const int have_id = cfg->job_id != NULL && cfg->job_id[0] != '\0';
    const int by_store = !have_id && cfg->n_ranks > 1;
    if (have_id) {
        snprintf(s->job_id, sizeof(s->job_id), "%s", cfg->job_id);
        /* A user's id may be two jobs' (one process alone has nobody to mix with). */
        s->keep_name = cfg->n_ranks > 1 && !accel__shm_generated(cfg->job_id);
    }
    s->start_ticks = accel__shm_pid_start((int)getpid());
    if (st == ACCEL_OK) {
        if (by_store) {
            st = accel__shm_rdv_begin(s, cfg, key, sizeof(key), deadline);
        } else if (have_id) {
            snprintf(key, sizeof(key), "%s", cfg->job_id);
        } else {
            st = accel__shm_nonce(key, sizeof(key)); /* one process: nobody to agree with */
        }
    }
    /* The hash covers the whole key, the name only its first KEY_MAX characters. */
    uint64_t job_hash = accel__fnv1a_str(have_id ? cfg->job_id : key);
    make_name(s->name, sizeof(s->name), key);
    snprintf(s->root_name, sizeof(s->root_name), "%s", s->name);
    /* The creator: local process 0, which with the store is process 0, the one serving it. */
    const int creator = by_store ? cfg->rank == 0 : cfg->local_rank == 0;
    if (st == ACCEL_OK) {
        if (creator) {
            accel__shm_sweep(s); /* once per job: what killed jobs left, before adding to it */
            st = create(s, job_hash, deadline);
            if (by_store) {
                st = accel__shm_rdv_created(s, st, deadline);
            }
        } else if (by_store) {
            st = accel__shm_rdv_created(s, ACCEL_OK, deadline);
            if (st == ACCEL_OK) {
                st = join(s, job_hash, deadline, 0);
            }
        } else {
            st = join(s, job_hash, deadline, 1);
        }
    }
    if (st == ACCEL_OK) {
        st = claim(s);
    }
    if (st == ACCEL_OK) {
        int last = attach(s);
        st = by_store ? accel__shm_rdv_attached(s, last, deadline) : wait_attached(s, deadline);
    }
    if (st == ACCEL_OK) {
        st = accel__shm_check_abort(s); /* e.g. a clash reported while we were setting up */
    }
    if (st != ACCEL_OK) {
        if (by_store) {
            st = accel__shm_rdv_fail(s, st);
        }
        accel__shm_drop_name(s); /* ours: nobody may join a failed setup (but a clash) */
        s->own_name = 0;
        /* Process 0 serves the store: it stays up for the others to read the failure. */
        accel__shm_rdv_close(s, 1);
        accel__shm_close(s);
        return st;
    }
    accel__shm_rdv_end(s);
    accel__shm_register(s);
    accel__log(&s->log, ACCEL__LOG_DEBUG,
               "shm: segment %s, %d processes, one-shot <= %zu bytes, slot %zu bytes, spin %g us",
               s->name, s->n_ranks, s->oneshot_nbytes, s->slot_nbytes, s->spin_s * 1e6);
    *out = s;
    return ACCEL_OK;
}

accel_status accel__shm_child(accel__shm **out, const accel__shm *parent,
                              const accel__comm_config *cfg, const char *nonce)
{
    accel__shm *s = endpoint_new(cfg->n_ranks);
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "shm: out of memory");
    }
    /* The parent's settings, which every rank verified to be the same. */
    s->rank = cfg->rank;
    s->n_ranks = cfg->n_ranks;
    s->timeout_s = parent->timeout_s;
    s->log = parent->log;
    s->spin_s = parent->spin_s;
    s->oneshot_nbytes = parent->oneshot_nbytes;
    s->nt_nbytes = parent->nt_nbytes;
    s->zc_nbytes = parent->zc_nbytes;
    s->slot_nbytes = parent->slot_nbytes;
    size_segment(s);
    s->what = "accel__comm_split";
    snprintf(s->root_name, sizeof(s->root_name), "%s", parent->root_name);
    if (snprintf(s->name, sizeof(s->name), "%s-c%s", s->root_name, nonce) >= (int)sizeof(s->name)) {
        accel__shm_close(s);
        return accel__seterr(NULL, ACCEL_EINTERNAL, "shm: segment name too long");
    }
    uint64_t job_hash = accel__fnv1a_str(nonce);
    accel_status st =
        cfg->rank == 0 ? create(s, job_hash, accel__now() + s->timeout_s) : join(s, job_hash, 0, 0);
    if (st != ACCEL_OK) {
        remove_name(s);
        s->own_name = 0;
        accel__shm_close(s);
        return st;
    }
    *out = s;
    return ACCEL_OK;
}

int accel__shm_attach_child(accel__shm *s)
{
    atomic_store_explicit(&s->lines[s->rank].pid, (int32_t)getpid(), memory_order_relaxed);
    int last = attach(s);
    accel__shm_register(s);
    return last;
}

void accel__shm_close(accel__shm *s)
{
    if (s == NULL) {
        return;
    }
    accel__shm_rdv_close(s, 0); /* first: its hook uses s */
    accel__shm_leave(s);
    accel__shm_free_all(s);
    if (s->base != NULL) {
        /* Normally the name went already (the last rank to attach, or with keep_name the
         * first to leave, removed it): the CAS in remove_name makes this a no-op then, and the
         * inode check keeps a later job's segment under the name safe. A forked child leaves
         * the name to its parent. */
        if (s->owner_pid == 0 || s->owner_pid == (int)getpid()) {
            accel__shm_drop_name(s);
        }
        unmap_segment(s);
    }
    accel__free(s->in);
    accel__free(s);
}
