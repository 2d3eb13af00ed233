/*
 * The communication interface (comm v2). Everything above src/comm/ (core, train, data, ckpt)
 * talks to other processes only through these functions; backends (self and shm today; mpi,
 * gloo and nccl later) implement accel__comm_ops and are listed in accel__comm_backends[].
 *
 * Semantics (every backend): every member of a communicator issues the same collectives in the
 * same order with the same count / dtype / op / root / wire. Counts are elements:
 *   ALLREDUCE, BROADCAST, REDUCE: the elements of the buffer;
 *   REDUCE_SCATTER: the per-rank (recv) count; send holds count * n_ranks, rank r's block at
 *     r * count (NCCL's recvcount); in place when recv == send + rank * count elements;
 *   ALLGATHER: the per-rank (send) count; recv holds count * n_ranks; in place when
 *     send == recv + rank * count elements;
 *   GATHER: elements sent per rank; root's recv holds count * n_ranks.
 * Uneven splits are a user-level helper (core/coll_api.c pads). F16 / BF16 / F8 reduce with
 * fp32 accumulation and round once; reductions combine in rank order, so every backend gives
 * bit-identical results (the backend-vs-backend tests hold them to it). Exceptions, each
 * deterministic: hier's association (machines first), gloo's ring over a network
 * (ACCEL_GLOO_RING), NCCL's own order.
 *
 * Asynchronous by contract: accel__comm_post returns a work handle; accel__work_test polls it,
 * accel__work_wait waits for it until an absolute deadline (accel__now() seconds). Every wait
 * in the front end has a deadline: a caller's, or the watchdog's, which aborts the
 * communicator when it passes (native-async backends: the communicator's timeout; host
 * backends, whose every internal wait has that timeout already and names the process at fault:
 * only an operation still running 2 x timeout + 10 s after it started). Ops of one
 * communicator complete in post order. A failure (dead or stuck peer, mismatched call, abort)
 * breaks the communicator: every later call fails fast with the first failure's status and
 * message, on every member.
 *
 * Thread-safety: post/run/group/split/alloc are issued by one thread at a time (the owner of the
 * communicator); accel__work_test/wait/free and accel__comm_abort may be called from any thread.
 *
 * How backends plug in (the ops below; the front end does validation, ordering, deadlines,
 * groups, work handles and the broken state, so a backend does only the data movement):
 *  - Host backends (self, shm; later mpi and gloo) implement `run`: one collective,
 *    synchronously, on the calling thread. The front end's host-progress adapter calls it on the
 *    communicator's progress thread (or inline for a blocking call with nothing queued, the
 *    latency path), ignores the stream (buffers are host memory, ready when posted) and turns a
 *    group into one batch handed to the progress thread.
 *  - Native-async backends (caps NATIVE_ASYNC: nccl) implement `post` and `test`: post enqueues
 *    the collective on the stream (ncclAllReduce on a cudaStream_t) and returns a request (an
 *    event recorded after it); test queries it (cudaEventQuery, then ncclCommGetAsyncError).
 *    The front end calls `group` around the posts of a group (ncclGroupStart / ncclGroupEnd) and
 *    `abort` from its watchdog when a wait passes the communicator's timeout (ncclCommAbort).
 *  - `split` is ncclCommSplit for nccl and MPI_Comm_split for mpi; shm creates a new segment.
 *  - Wire dtype (caps WIRE): shm and self round inside their reduction kernels; mpi and gloo
 *    would convert to the 16-bit format, move half the bytes and reduce with the same fp32
 *    rule; nccl converts on the stream and reduces in the 16-bit format (NCCL rounds partial
 *    sums: exact to the rule on 1-2 processes). A backend without WIRE refuses such a call
 *    (ACCEL_EUNSUPPORTED).
 *  - Rendezvous: a backend that must agree on something before it can talk (shm's segment name
 *    without ACCEL_JOB_ID, nccl's ncclUniqueId) uses the job's store (store.h) at
 *    cfg->master_addr:master_port; mpi needs none (the launcher has wired it).
 */
#ifndef ACCEL_COMM_H
#define ACCEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "accel/collectives.h"
#include "accel/tensor.h"
#include "base/base.h"

typedef struct accel__comm accel__comm;

typedef enum accel__coll_kind {
    ACCEL__COLL_ALLREDUCE,
    ACCEL__COLL_REDUCE_SCATTER,
    ACCEL__COLL_ALLGATHER,
    ACCEL__COLL_BROADCAST,
    ACCEL__COLL_REDUCE,
    ACCEL__COLL_GATHER,
    ACCEL__COLL_BARRIER
} accel__coll_kind;

/* One collective call. Fields after `root` are optional: zero means "none", so
 * ACCEL__COLL(kind, send, recv, count, dtype, op, root) below is a complete call. */
typedef struct accel__coll {
    accel__coll_kind kind;
    const void *send;
    void *recv;
    size_t count; /* see the top of this file */
    accel_dtype dtype;
    accel_reduce_op op;
    int root;
    /* ALLREDUCE of F32 only: ACCEL_BF16 or ACCEL_F16 makes the result exactly what compress ->
     * reduce in fp32 -> round -> decompress gives (each input rounded to `wire`, combined in fp32
     * in rank order, the result rounded to `wire` and written as f32): DDP's bf16 / fp16
     * gradient compression. ACCEL_F32 (0): none. Needs caps WIRE. */
    accel_dtype wire;
    /* REDUCE_SCATTER / ALLGATHER issued by the uneven public helpers: the whole-array count the
     * user passed (count is then its padded per-rank share, ceil(total / n_ranks)). Declared and
     * compared with the call and shown in messages; 0: the call is count * n_ranks. */
    size_t total;
    /* Hooks run by the thread that executes the collective: `pre` right before the data moves,
     * `post` right after (only when it succeeded), both with hook_arg. Host backends: the
     * progress thread for posted work, the caller for an inline blocking call; native-async
     * backends: the posting thread (pre) and the thread that first sees completion (post). A
     * hook must not call into the communicator. */
    void (*pre)(void *arg);
    void (*post)(void *arg);
    void *hook_arg;
} accel__coll;

/* A call with the optional fields zero (designated, so -Wextra accepts it). */
#define ACCEL__COLL(kind_, send_, recv_, count_, dtype_, op_, root_)                               \
    ((accel__coll){.kind = (kind_),                                                                \
                   .send = (send_),                                                                \
                   .recv = (recv_),                                                                \
                   .count = (count_),                                                              \
                   .dtype = (dtype_),                                                              \
                   .op = (op_),                                                                    \
                   .root = (root_)})

typedef struct accel__comm_config {
    const char *backend; /* a name of accel__comm_backends[] */
    int rank, n_ranks;
    int local_rank, local_n_ranks;
    /* The job's secret name (ACCEL_JOB_ID: accel launch makes it random), naming shared
     * resources (shm segments); NULL or "" when none was given: the backend then agrees on one
     * through the job's store (src/comm/store.h) at master_addr:master_port. */
    const char *job_id;
    const char *master_addr; /* MASTER_ADDR */
    int master_port;         /* MASTER_PORT */
    double timeout_s;        /* the backend's deadline for every wait; the front end's default */
    /* Many machines (gloo, hier): the network interface to listen on (ACCEL_SOCKET_IFNAME or
     * GLOO_SOCKET_IFNAME; NULL: the one of the route to master_addr); store_served: the
     * launcher serves the job's store at master_addr:master_port (ACCEL_STORE_SERVED), so no
     * process does; restart_count (ACCEL_RESTART_COUNT) keeps a restart's store keys apart. */
    const char *socket_ifname;
    /* ACCEL_GLOO_RING as given (NULL: auto); the gloo backend checks it once its store is open,
     * so that a bad value on one process fails every process at once. */
    const char *gloo_ring;
    int store_served;
    int restart_count;
    /* ACCELERATE_DEBUG_MODE: a backend whose check that every member makes the same call costs
     * messages makes it only then (mpi: one exchange of declarations per call); shm, gloo and
     * hier check every call anyway. */
    int debug;
    /* Messages name rank r of this communicator "process process_base + r" (hier's machine-local
     * shm communicators use their first process's job-wide index); 0 for the job's own. */
    int process_base;
    /* Device backends (nccl): the process's native handle of a stream (core binds the
     * device's, the compute stream for NULL) and the GPU's ordinal; stream_native NULL: the
     * process runs on the CPU. */
    void *(*stream_native)(void *arg, accel__stream *s);
    void *stream_arg;
    int device_ordinal;
    accel__log_ctx log;         /* rank prefix and level of the communicator's log lines */
    struct accel__trace *trace; /* profiler recorder for the progress thread's ranges, or NULL */
} accel__comm_config;

/* ---- the backend side ---- */

/* Capabilities (accel__comm_backend.caps). */
enum {
    ACCEL__COMM_NATIVE_ASYNC = 1u << 0, /* implements post/test (else run, host-progress adapter) */
    ACCEL__COMM_DEVICE_MEM = 1u << 1,   /* buffers may be device memory */
    ACCEL__COMM_ZERO_COPY = 1u << 2,    /* collectives on mem_alloc'd buffers skip copies */
    ACCEL__COMM_WIRE = 1u << 3          /* allreduce with accel__coll.wire */
};

/* How a split divides a communicator (accel__comm_split computes it and hands it to every
 * member of the parent, including those in no child). */
typedef struct accel__comm_split_info {
    int color, key; /* as the caller passed them; color < 0: in no child */
    const accel__comm_config
        *cfg;           /* the child's config (its rank, n_ranks, local_*); NULL if none */
    const int *members; /* cfg->n_ranks parent ranks in child rank order; NULL if none */
} accel__comm_split_info;

/*
 * A backend's operations. Every function reports a failure through accel__seterr(NULL, ...) and
 * returns its status; none validates arguments (the front end did). `impl` is what init/split
 * made. Unless said otherwise the front end calls them from one thread at a time.
 */
typedef struct accel__comm_ops {
    /* This process's endpoint of a new communicator: collective over cfg->n_ranks processes. */
    accel_status (*init)(const accel__comm_config *cfg, void **impl);
    /* A sub-communicator: collective over every member of the parent (impl), each with its own
     * split info; *child = NULL for a member in no child. Called with the parent idle. Either
     * every member succeeds or every member fails (agreed over the parent). */
    accel_status (*split)(void *impl, const accel__comm_split_info *how, void **child);
    /* Host backends: runs op to completion on the calling thread. */
    accel_status (*run)(void *impl, const accel__coll *op);
    /* Native-async backends: launches op ordered on `stream` (NULL: the backend's own) and
     * returns a request in *req; ACCEL_EUNSUPPORTED refuses op before anything is launched
     * (the same on every member: it depends on op alone), which leaves the communicator
     * usable, any other failure breaks it. test: 1 when req is complete (*st its status, the
     * message set when it failed), 0 if not yet; never blocks. req_free: releases a complete
     * request. */
    accel_status (*post)(void *impl, const accel__coll *op, accel__stream *stream, void **req);
    int (*test)(void *impl, void *req, accel_status *st);
    void (*req_free)(void *impl, void *req);
    /* Around the posts of a group (begin 1, then 0); NULL: nothing to do. */
    accel_status (*group)(void *impl, int begin);
    /* Breaks the communicator on every member: every wait in the backend, here and on the
     * peers, returns promptly with an error naming this rank and `msg`. Thread-safe; called at
     * most once. NULL: nothing waits inside the backend. */
    void (*abort)(void *impl, accel_status st, const char *msg);
    /* Symmetric memory, with the communicator idle. alloc is collective (same nbytes
     * everywhere), zero-filled and 64-byte aligned; free is local and fails with EINVAL for a
     * pointer alloc did not return. NULL: plain memory is all there is. */
    accel_status (*mem_alloc)(void *impl, size_t nbytes, void **out);
    accel_status (*mem_free)(void *impl, void *p);
    /* Leaves the communicator (peers waiting for this member fail at once) and frees impl. */
    void (*destroy)(void *impl);
    /* Optional: one line for accel_state_summary naming the levels and, where known, the
     * network interface ("shm within a machine, gloo across on eth0 (10.0.0.2)"). NULL: the
     * backend's name says it all. */
    void (*describe)(void *impl, char *buf, size_t nbytes);
    /* Optional: debug mode's call check on or off (cfg.debug), with the communicator idle. NULL:
     * the backend checks every call anyway, or never. */
    void (*set_debug)(void *impl, int on);
    /* Optional: appends to the message in buf (nbytes in all) what the backend knows of the
     * processes that may hold up a collective ("; process 1 (pid 123) is stopped"), for the
     * front end's watchdog's timeout. Any thread, quick. NULL: nothing known. */
    void (*suspects)(void *impl, char *buf, size_t nbytes);
} accel__comm_ops;

/* mem_alloc / mem_free for backends whose symmetric memory is plain memory (collectives copy):
 * zeroed, aligned, impl unused. self, gloo and hier use them. */
accel_status accel__comm_plain_alloc(void *impl, size_t nbytes, void **out);
accel_status accel__comm_plain_free(void *impl, void *p);

typedef struct accel__comm_backend {
    const char *name;
    int built;                  /* 1: in this build (ops set) */
    unsigned caps;              /* ACCEL__COMM_* */
    const accel__comm_ops *ops; /* NULL when not built */
    const char *doc;            /* what it is for, or what building it needs */
} accel__comm_backend;

/* Every backend accel knows, built or not, terminated by an entry with name NULL. */
extern const accel__comm_backend accel__comm_backends[];

/* The table entry named `name`, or NULL. */
const accel__comm_backend *accel__comm_backend_find(const char *name);
/* The built backends' names, comma-separated ("self, shm"). Static string; thread-safe. */
const char *accel__comm_backends_built(void);

/* ---- creating and breaking communicators ---- */

/* Creates this process's member of a communicator (collective over cfg->n_ranks processes) with
 * the backend cfg->backend names. Errors: EINVAL (unknown backend, bad rank), EUNSUPPORTED (a
 * backend not built here, named with what it needs), and whatever the backend's setup reports
 * (EPEER / ETIMEDOUT naming the process). The communicator is named "world" in messages. */
accel_status accel__comm_new(accel__comm **out, const accel__comm_config *cfg);
/* The same with a backend that need not be in the table (tests' mock backends). */
accel_status accel__comm_new_with(accel__comm **out, const accel__comm_config *cfg,
                                  const accel__comm_backend *be);
/* Waits (the watchdog's deadline, aborting the communicator if it passes) for posted work, stops
 * the progress thread and leaves the communicator. Work handles still held stay valid (they
 * are complete) until accel__work_free. Accepts NULL. Children are independent: free them too. */
void accel__comm_free(accel__comm *c);

/* Splits c into sub-communicators (NCCL's ncclCommSplit, MPI_Comm_split): collective over every
 * member of c. Members passing the same color >= 0 form one child, ranked by (key, rank in c);
 * color < 0 joins no child (*child = NULL). Each child is an independent communicator: its
 * own backend resources (on shm its own segment, named from a fresh random nonce), sequence
 * numbers, call checks and broken state; free it with accel__comm_free (before or after c).
 * The child's local_rank / local_n_ranks count the members on the same machine (ranks whose
 * parent rank - local_rank agree, as accel launch lays processes out). Waits for c's posted
 * work first. Errors on every member alike. */
accel_status accel__comm_split(accel__comm *c, int color, int key, accel__comm **child);

/* Breaks c from any thread: marks it broken with st and "<name>: aborted by process <rank>:
 * <msg>", wakes every waiter here, and has the backend fail every pending and later call on
 * every member promptly (shm: the segment's abort word). Idempotent; c stays to be freed. */
void accel__comm_abort(accel__comm *c, accel_status st, const char *msg);

/* ---- work ---- */

/* Validates op and launches it: on host backends it is queued for the progress thread (ops run
 * in post order), on native-async backends posted on `stream` (NULL: host order; host backends
 * ignore the stream, so device work producing the buffers must be complete). Inside a group the
 * launch waits for accel__comm_group_end. On success *work receives the handle (free with
 * accel__work_free or accel_work_free). Buffers must stay untouched until it completes. */
accel_status accel__comm_post(accel__comm *c, const accel__coll *op, accel__stream *stream,
                              accel_work **work);
/* Post and wait (the watchdog's deadline): blocking. With nothing queued on a host backend
 * it runs on the calling thread (the latency path). ESTATE inside a group. */
accel_status accel__comm_run(accel__comm *c, const accel__coll *op);

/* 1 if w is complete (its status then in *st when st != NULL, and the thread's error set when it
 * failed), else 0. Never blocks. */
int accel__work_test(accel_work *w, accel_status *st);
/* Waits until w completes or the absolute monotonic `deadline` (accel__now() seconds) passes:
 * then ACCEL_ETIMEDOUT naming the call ("allreduce(count=1000, f32, sum) #5 on communicator
 * world (rank 0 of 2) not complete after 0.2 s"); w stays valid and may be waited for again.
 * ESTATE for work posted in a group that has not ended. Returns w's status. */
accel_status accel__work_wait(accel_work *w, double deadline);
/* The communicator's default deadline: now + its timeout. */
double accel__comm_deadline(const accel__comm *c);
/* Waits (the watchdog's deadline) and frees w. Accepts NULL. */
void accel__work_free(accel_work *w);
/* Hands `mem` (from accel__malloc) to w: freed with it. */
void accel__work_own(accel_work *w, void *mem);

/* Groups (ncclGroupStart / ncclGroupEnd): posts between begin and end are launched together at
 * end (host backends: one batch to the progress thread). They nest; the outermost end launches.
 * Blocking calls, splits and allocations inside a group are ESTATE. end without begin: ESTATE. */
accel_status accel__comm_group_begin(accel__comm *c);
accel_status accel__comm_group_end(accel__comm *c);

/* ---- queries ---- */

int accel__comm_rank(const accel__comm *c);
int accel__comm_n_ranks(const accel__comm *c);
const char *accel__comm_backend_name(const accel__comm *c);
/* "world", or "world/3" for the child of color 3 (messages name communicators this way). */
const char *accel__comm_name(const accel__comm *c);
unsigned accel__comm_caps(const accel__comm *c);
/* What the communicator runs on, for accel_state_summary: the backend's own description
 * (levels, network interface) when it gives one, else its name. */
void accel__comm_describe(const accel__comm *c, char *buf, size_t nbytes);
/* The creation config (its strings point into the communicator; valid until accel__comm_free). */
const accel__comm_config *accel__comm_cfg(const accel__comm *c);
/* Debug mode's call check on or off, with c idle (children split from c later inherit it):
 * accel_init opens the job's communicator without it and turns it on once every process has
 * agreed on the setting, since members that differ in it would not even meet to compare. */
void accel__comm_set_debug(accel__comm *c, int on);

/* "allreduce", "barrier", ...: names used in error messages. Static strings. */
const char *accel__coll_name(accel__coll_kind kind);
/* The call as a user wrote it, for messages: "allreduce(count=1000, f32, sum)",
 * "reduce_scatter(count=400, f32, sum)" (REDUCE_SCATTER / ALLGATHER show the whole array:
 * total, else count * n_ranks), "broadcast(count=10, f32, root=1)", ", wire=bf16" when set. */
void accel__coll_str(const accel__coll *op, int n_ranks, char *buf, size_t nbytes);

/* A call as every member declares it, for the backends that compare the members' declarations
 * (gloo's envelopes, mpi's debug mode): fields that do not apply to the kind are 0, so two
 * declarations of the same call are the same bytes. */
typedef struct accel__coll_decl {
    uint64_t count, total;
    int32_t kind, dtype, op, root, wire, pad;
} accel__coll_decl;
/* The kind of accel_alloc_shared(count bytes): a value no accel__coll_kind takes (backends may
 * define variants above it; they print alike). */
#define ACCEL__COLL_DECL_ALLOC 100
/* op's declaration, and that of accel_alloc_shared(nbytes). */
accel__coll_decl accel__coll_declare(const accel__coll *op);
accel__coll_decl accel__coll_declare_alloc(size_t nbytes);
/* Two members' declarations that differ, as every member reports them: the message (prefixed
 * "<backend>: ", processes pa and pb) in buf; returns 1 when both are allocations (only the
 * sizes differ: nothing moved, so the communicator stays usable), 0 for a collective
 * mismatch (the communicator is broken). */
int accel__coll_decl_mismatch(const char *backend, const accel__coll_decl *a, int pa,
                              const accel__coll_decl *b, int pb, int n_ranks, char *buf,
                              size_t nbytes);

/* The partition of the public uneven reduce_scatter / allgather (accel_chunk_range is its
 * public face) and of the shm two-shot allreduce: rank `rank` owns [*off, *off + *chunk_count)
 * of `count`, the first count % n_ranks ranks one more. */
void accel__chunk_range(size_t count, int n_ranks, int rank, size_t *off, size_t *chunk_count);

/* ---- symmetric memory ---- */

/* Symmetric shared memory (accel_alloc_shared): a collective allocation of nbytes (the same on
 * every process), zero-filled and 64-byte aligned, ordered after every posted collective. In
 * place collectives on buffers at the same offset of one such allocation on every process run
 * without copies on backends with caps ZERO_COPY (shm); elsewhere it is plain memory.
 * accel__comm_dealloc is local (NULL is a no-op). Not thread-safe with other calls. */
accel_status accel__comm_alloc(accel__comm *c, size_t nbytes, void **out);
accel_status accel__comm_dealloc(accel__comm *c, void *p);
int accel__comm_zero_copy(const accel__comm *c);

/* ---- convenience wrappers over accel__comm_run (blocking) ---- */
accel_status accel__allreduce(accel__comm *c, const void *send, void *recv, size_t count,
                              accel_dtype dt, accel_reduce_op op);
accel_status accel__broadcast(accel__comm *c, void *buf, size_t count, accel_dtype dt, int root);
accel_status accel__barrier(accel__comm *c);

#endif /* ACCEL_COMM_H */
