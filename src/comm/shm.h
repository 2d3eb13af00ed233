/*
 * The shared-memory transport under the shm backend (private to src/comm): one POSIX segment
 * per communicator (the job's, and one per split child) holding a header, a control line per
 * rank and two data slots per rank, plus the sync point that every algorithm in shm_coll.c is
 * built from.
 */
#ifndef ACCEL_COMM_SHM_H
#define ACCEL_COMM_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

#define ACCEL__SHM_MAGIC 0x326d6873636361ull /* "accshm2" */
#define ACCEL__SHM_VERSION 5u

/* The segment header. Written by the creator before the name appears (shm_setup.c), then
 * only the atomics change. */
typedef struct accel__shm_header {
    _Atomic uint64_t magic;
    uint32_t version;
    int32_t n_ranks;
    uint64_t slot_nbytes;
    uint64_t map_nbytes;
    uint64_t oneshot_nbytes, zc_nbytes; /* the algorithm choice must agree on every rank */
    uint64_t job_hash;   /* of the job key: a process of another job refuses the segment */
    uint64_t secret;     /* random: names the symmetric allocations' segments */
    int32_t creator_pid; /* with its start time, tells a live creator from a reused pid */
    int32_t pad;
    uint64_t creator_start; /* /proc start time of creator_pid (clock ticks after boot) */
    _Atomic int32_t attached;
    /* The pid of the process that took on removing the name, 0 before (CAS: one live remover
     * at a time, and it removes the name only while the name is this segment's, so never a
     * later job's segment). */
    _Atomic int32_t unlinked;
    /* With ACCEL__SHM_CLASH: when the clash was seen, in clock ticks after boot (the unit of
     * /proc start times). A process started before then belongs to one of the clashing jobs. */
    _Atomic uint64_t clash_ticks;
    /* why | rank << 8 | pid << 32 (accel__shm_why), 0 while the job is healthy; written once
     * (CAS). */
    _Alignas(64) _Atomic uint64_t abort_word;
} accel__shm_header;

/* A collective call as every rank declares it before its first sync: count (for reduce_scatter
 * and allgather the whole array: accel__coll.total, else count * n_ranks), and kind | dtype << 8
 * | op << 16 | wire << 24 | root << 32 (kind: accel__coll_kind, or ACCEL__SHM_CALL_ALLOC for an
 * allocation; fields that do not apply to the kind are 0). Two words: comparing them is all a
 * matching call costs. The call's number is the same on every rank as long as all earlier calls
 * matched, so it is not part of it. */
#define ACCEL__SHM_CALL_ALLOC 100
typedef struct accel__shm_call {
    uint64_t count;
    uint64_t what;
} accel__shm_call;

/* One rank's control lines. Plain fields are written by their rank before it publishes a sync
 * point and read by peers after they see it (release/acquire on progress), never while they can
 * change. The first cache line is what every peer reads at every sync. */
typedef struct accel__shm_line {
    _Alignas(64) _Atomic uint32_t progress;
    _Atomic int32_t sleepers;
    _Atomic int32_t pid;
    _Atomic int32_t cpu;               /* where this rank last published a sync point */
    accel__shm_call call[2];           /* by call parity: a peer may be one call ahead, never two */
    _Alignas(64) _Atomic int32_t left; /* ACCEL__SHM_LEFT_* once this rank left the job */
    int32_t exit_status;               /* with ACCEL__SHM_LEFT_EXITED */
    int16_t alloc_status[2];
    uint64_t desc[2][3]; /* zero-copy descriptors (id, off, count), by call parity */
    uint64_t alloc_seq, alloc_nbytes;
    /* accel__comm_abort on this rank: its status and message, written before the abort word
     * names this rank (so a peer that reads the word finds them). */
    int32_t abort_status;
    char abort_msg[196];
} accel__shm_line;

enum { ACCEL__SHM_LEFT_FREED = 1, ACCEL__SHM_LEFT_EXITED = 2 };

/* Why a job was aborted (the abort word's low byte). */
typedef enum accel__shm_why {
    ACCEL__SHM_DIED = 1,   /* EPEER: the rank's process is gone */
    ACCEL__SHM_TIMEOUT,    /* ETIMEDOUT: the rank did not arrive in time */
    ACCEL__SHM_OTHER_CALL, /* EINVAL: the rank was at another call or allocation */
    ACCEL__SHM_EXITED,     /* EPEER: the rank left the job (accel_free or exit): see its line */
    ACCEL__SHM_CLASH,      /* EINVAL: another process (pid) claimed the rank: two jobs met */
    ACCEL__SHM_ABORTED     /* the rank called accel__comm_abort: its line has status and message */
} accel__shm_why;

typedef struct accel__store accel__store;

/* One symmetric allocation (accel__shm_alloc): the same size on every rank, each rank's part in
 * its own segment, every part mapped by every rank. */
typedef struct accel__shm_sym {
    uint64_t id;       /* the same on every rank: the id-th allocation of the communicator */
    size_t nbytes;     /* as requested */
    size_t map_nbytes; /* page-rounded */
    char **base;       /* n_ranks mappings; base[rank] is this rank's (the user's pointer) */
    struct accel__shm_sym *next;
} accel__shm_sym;

typedef struct accel__shm {
    int rank, n_ranks;
    int process_base; /* messages name process process_base + rank (accel__comm_config) */
    double timeout_s;
    /* 0, or (hier's shm level) how long a timeout first waits for the diagnosis of a live,
     * unstopped process it waits for, which may itself wait at another level (shm.c, defer) */
    double defer_s;
    accel__log_ctx log;
    double spin_s;         /* ACCEL_SHM_SPIN_US */
    size_t oneshot_nbytes; /* ACCEL_SHM_ONESHOT_NBYTES */
    size_t slot_nbytes;    /* bytes of one data slot (each rank has two) */
    /* ACCEL_SHM_NT_NBYTES: from this message size on, outputs are written with streaming
     * stores (they exceed the cache anyway; skipping the read-for-ownership saves a third of
     * the memory traffic). */
    size_t nt_nbytes;
    /* ACCEL_SHM_ZEROCOPY_NBYTES: in-place messages larger than this whose buffers lie in one
     * symmetric allocation at the same offset everywhere skip the data slots. */
    size_t zc_nbytes;
    char name[160];      /* "/accel-<euid>-<job key>"; a split's: the world's + "-c<nonce>" */
    char root_name[160]; /* the world communicator's name: its children's prefix */

    void *base;
    size_t map_nbytes;
    accel__shm_header *hdr;
    accel__shm_line *lines;
    char *data;

    uint32_t step;              /* sync points passed by this rank (mirrors its progress word) */
    uint64_t n_slots;           /* slots used so far: slot parity alternates per use */
    const char *what;           /* the running collective, for messages */
    const void **in;            /* n_ranks input pointers for the reduce kernels */
    uint64_t n_calls;           /* calls declared (accel__shm_begin_call) */
    accel__shm_call pending;    /* the declaration the next sync publishes */
    int check_call;             /* the next sync publishes a declaration and compares them all */
    accel__shm_call declare_as; /* accel__shm_declare_next's declaration ... */
    int has_declare_as;         /* ... for the next accel__shm_run (hier) */

    accel__shm_sym *syms; /* live symmetric allocations, newest first */
    uint64_t n_allocs;    /* allocations started: the next id is n_allocs + 1 */
    uint64_t n_descs;     /* zero-copy descriptors published (same count on every rank) */
    double next_nudge;    /* earliest time for the next move off a peer's CPU (shm.c) */

    /* Rendezvous through the job's store (no ACCEL_JOB_ID): process 0 serves it for the life
     * of the communicator; a process that finds its rank claimed twice reports it there, and
     * the store's hook aborts this job (clash: rank << 32 | pid, set from the server thread). */
    accel__store *store;
    char rdv[96];     /* "addr:port" of the store, for messages; "" without one */
    char rdv_key[32]; /* "shm/<n>/": this rendezvous's keys (the n-th of this process) */
    _Atomic uint64_t clash;
    _Atomic int hdr_ready;
    int own_name; /* the name is this job's segment: this rank may remove it */
    /* A user's ACCEL_JOB_ID (not 32 hex digits, so perhaps reused) for several processes:
     * the name stays for the job's life, so that a second job with the id meets this one's
     * processes and both stop, and stays after a clash (see shm_setup.c). Otherwise it goes
     * once every rank attached. */
    int keep_name;
    char job_id[104];             /* ACCEL_JOB_ID, for messages; "" without one */
    uint64_t start_ticks;         /* this process's /proc start time (0: unknown) */
    uint64_t seg_dev, seg_ino;    /* the segment's file, to tell it from a later one */
    int attached;                 /* this rank completed setup: leaving marks its line */
    int owner_pid;                /* the process that opened it (a forked child must not mark it) */
    struct accel__shm *next_live; /* the process's open communicators (shm.c, exit marks) */
} accel__shm;

/* Sets up the job's segment (shm_setup.c): agrees on the job key (cfg->job_id, else through the
 * store at cfg->master_addr:master_port), creates (local rank 0) or opens and verifies (others)
 * the segment, claims this rank in it (a rank claimed twice stops the job: two jobs met), and
 * waits until every rank has attached; then the name is unlinked so nothing remains in
 * /dev/shm whatever happens next, except with a user's ACCEL_JOB_ID (keep_name), whose name
 * stays until the first rank leaves. A segment that is not this user's own, private, of this
 * job, is refused at once, naming it; one whose creator is gone is replaced by local rank 0
 * (the others wait for that). */
accel_status accel__shm_open(accel__shm **out, const accel__comm_config *cfg);
/* Marks this rank as gone (peers waiting for it fail at once), unmaps and frees. Accepts NULL. */
void accel__shm_close(accel__shm *s);
/* Removes the segment's name if this rank may (own_name) and nobody did yet; with keep_name a
 * clashed segment keeps it. On a failed setup, at close, and from the exit handler. */
void accel__shm_drop_name(accel__shm *s);
/* The error of a rank claimed twice (ACCEL__SHM_CLASH, rank and the later claimant's pid),
 * in the words of s's rendezvous (the store's address, or ACCEL_JOB_ID), naming the process
 * s->process_base + rank. Returns ACCEL_EINVAL. */
accel_status accel__shm_clash_error(const accel__shm *s, int rank, int pid);

/* A sub-communicator's segment (shm_setup.c) for cfg's ranks, with the parent's settings, named
 * "<the world's name>-c<nonce>" (nonce: 32 random hex digits, so nobody can predict or plant
 * it; the prefix lets the launcher's sweep of the job's names cover it): child rank 0 creates
 * it, the others open and verify the existing one (no waiting: the caller has agreed over the
 * parent that it exists). Mapped, not yet attached. */
accel_status accel__shm_child(accel__shm **out, const accel__shm *parent,
                              const accel__comm_config *cfg, const char *nonce);
/* Counts this rank in (the last one removes the name) and registers it for the exit marks.
 * Returns 1 for the last. */
int accel__shm_attach_child(accel__shm *s);

/* Whether a segment name's job part (after "accel-<euid>-") is one accel generates: 32 hex
 * digits (accel launch's ACCEL_JOB_ID, a store nonce), with the hier backend's machine part, a
 * split's and a creator's temporary suffix allowed (shm_sweep.c). */
int accel__shm_generated(const char *key);
/* Removes this user's segments with generated names whose creator is gone (shm_sweep.c),
 * logging each through s's log. */
void accel__shm_sweep(const accel__shm *s);

/* Runs one collective (shm_coll.c), the backend's `run`. */
accel_status accel__shm_run(accel__shm *s, const accel__coll *op);

/* 32 random hex digits (+ NUL) into out: a job nonce. */
accel_status accel__shm_nonce(char *out, size_t nbytes);

/* The rendezvous through the job's store (shm_rdv.c), used when there is no ACCEL_JOB_ID, in
 * the order of the calls below; every step has the deadline. begin: process 0 serves the store
 * and publishes a fresh nonce, the others fetch it (key: the nonce), check the process count
 * and claim their rank (a rank claimed twice means two jobs share the address: the later
 * claimant reports it, which aborts the job that has it too). created: process 0 publishes
 * whether it created the segment (st), the others wait for that. attached: after attaching
 * (last: this rank was the last, and removed the name), everyone waits until all have. fail:
 * publishes this rank's failure st (its message) so that no one waits for it, and returns st;
 * when another process published a failure first, that is the cause: it is returned instead
 * (ACCEL_EPEER, with its message). end: the others disconnect; process 0 keeps serving until
 * accel__shm_close. */
accel_status accel__shm_rdv_begin(accel__shm *s, const accel__comm_config *cfg, char *key,
                                  size_t key_nbytes, double deadline);
accel_status accel__shm_rdv_created(accel__shm *s, accel_status st, double deadline);
accel_status accel__shm_rdv_attached(accel__shm *s, int last, double deadline);
accel_status accel__shm_rdv_fail(accel__shm *s, accel_status st);
void accel__shm_rdv_end(accel__shm *s);
/* Closes s->store (if any) when s closes or its setup failed: the clients' farewell names the
 * cause (the setup's failure, the job's abort, or none). After a clash, process 0 first keeps
 * serving (and the port taken) for a few seconds; a setup that failed otherwise leaves its
 * server serving until the process exits (accel__store_abandon). */
void accel__shm_rdv_close(accel__shm *s, int setup_failed);

/* Publishes "this rank passed sync point s->step + 1" and waits until every other rank has too.
 * Spins ACCEL_SHM_SPIN_US, then sleeps on a futex; every ~50 ms checks whether the ranks not yet
 * arrived are alive. Returns ACCEL_EPEER (a rank died or left: the whole job aborts),
 * ACCEL_ETIMEDOUT (naming the ranks not arrived) or, at the first sync of a declared call,
 * ACCEL_EINVAL when the ranks declared different calls, with the message set. */
accel_status accel__shm_sync(accel__shm *s);

/* ACCEL_OK, or the job-wide abort (set by any rank) as an error with its message. */
accel_status accel__shm_check_abort(accel__shm *s);
/* The same without setting the thread's error: its status, and its message into msg ("" and
 * ACCEL_OK while the job is healthy). */
accel_status accel__shm_abort_text(const accel__shm *s, char *msg, size_t nbytes);
/* Whether the job was aborted (no message set). */
int accel__shm_aborted(const accel__shm *s);

/* Records a job-wide failure diagnosed here about `rank` (pid 0: the pid in its line) and wakes
 * every sleeper; the first diagnosis wins. Every rank then fails its current or next call with
 * accel__shm_check_abort. Safe from any thread. */
void accel__shm_abort(accel__shm *s, accel__shm_why why, int rank, int pid);

/* Declares the collective about to run (before its first sync): kind, count, dtype, op, wire
 * and root as the front end validated them (kind ACCEL__SHM_CALL_ALLOC for an allocation). The
 * sync that follows compares every rank's declaration and fails with ACCEL_EINVAL on every
 * rank, naming both calls, when they differ. */
void accel__shm_begin_call(accel__shm *s, int kind, size_t count, int dtype, int op, int wire,
                           int root);
/* The next accel__shm_run declares this call (accel__shm_begin_call's fields) instead of its
 * own: hier runs each user call as several shm calls of its own making, which can agree while
 * the user's calls differ (counts 1000 and 999 both pad to 1000); its first declares the user's
 * call, so processes at different calls fail with it named. Cleared by that run; clear it with
 * accel__shm_declare_clear when no run followed. */
void accel__shm_declare_next(accel__shm *s, int kind, size_t count, int dtype, int op, int wire,
                             int root);
void accel__shm_declare_clear(accel__shm *s);

/* Process bookkeeping for the exit marks (shm.c): registers s as open in this process (setup
 * done), or marks it left and forgets it (teardown). */
void accel__shm_register(accel__shm *s);
void accel__shm_leave(accel__shm *s);

/* 1 when process pid is gone or a zombie, or is another process than the one that started at
 * `start` (/proc start time; 0: unknown). Stopped counts as alive. */
int accel__shm_pid_gone(int pid, uint64_t start);
/* The /proc start time of pid, or 0 if unreadable. */
uint64_t accel__shm_pid_start(int pid);
/* 1 when process pid is stopped (SIGSTOP, SIGTSTP, a debugger's trace stop). */
int accel__shm_pid_stopped(int pid);

/* Zero-copy descriptors in the control lines. put (before a collective's first sync) takes the
 * next of two copies by call parity; get (after that sync) reads `rank`'s copy of the same call.
 * Two copies because a peer may publish its next call's descriptor before this rank has read
 * the current one when the call has a single sync; it cannot get two calls ahead. */
typedef struct accel__shm_desc {
    uint64_t id, off, count; /* zero-copy descriptor: allocation id (0: none), byte offset */
} accel__shm_desc;
void accel__shm_put_desc(accel__shm *s, const accel__shm_desc *d);
void accel__shm_get_desc(const accel__shm *s, int rank, accel__shm_desc *d);
/* Allocation handshake words of the line: seq (allocation id), nbytes, and two phase statuses
 * (0 or a negative accel_status). */
void accel__shm_put_alloc(accel__shm *s, uint64_t seq, uint64_t nbytes, int phase, int status);
void accel__shm_get_alloc(const accel__shm *s, int rank, uint64_t *seq, uint64_t *nbytes,
                          int status[2]);

/* Symmetric allocation (collective; shm_sym.c): every rank calls it with the same nbytes; on
 * success *out is this rank's zero-filled, page-aligned part, and every rank can reach every
 * part through accel__shm_sym_find. Names are unlinked before it returns. */
accel_status accel__shm_alloc(accel__shm *s, size_t nbytes, void **out);
/* Local: unmaps this rank's view of the allocation starting at p. EINVAL if p is not one. */
accel_status accel__shm_free(accel__shm *s, void *p);
/* Unmaps every allocation (communicator teardown). */
void accel__shm_free_all(accel__shm *s);
/* The allocation holding [p, p + nbytes) in this rank's part, or NULL; *off = p - its base. */
accel__shm_sym *accel__shm_sym_find(const accel__shm *s, const void *p, size_t nbytes, size_t *off);

/* Zero-copy collectives run by this process so far (all communicators); for tests. */
uint64_t accel__shm_zero_copy_calls(void);

/* Data slot `parity` (0/1) of `rank`: slot_nbytes bytes, 64-byte aligned. */
static inline char *accel__shm_slot(const accel__shm *s, int rank, uint64_t parity)
{
    return s->data + ((size_t)rank * 2 + (size_t)(parity & 1)) * s->slot_nbytes;
}

#endif /* ACCEL_COMM_SHM_H */
