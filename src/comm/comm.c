/*
 * Communicator front end, part 1: the backend table, creation and teardown, argument
 * validation, and the names used in messages. Posting, waiting, groups and abort are in
 * work.c; split and symmetric memory in split.c.
 *
 * Invariant: a communicator's backend endpoint (impl) is used only by the thread that holds
 * `running` (the progress thread, an inline blocking call, or an idle-only call), except for
 * the backend's abort, which is thread-safe by contract.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "comm/reduce.h"
#include "comm_impl.h"

extern const accel__comm_ops accel__self_ops;
extern const accel__comm_ops accel__shm_ops;
/* (the entries as written: clang-format would split their messages) */
/* clang-format off */
#ifdef ACCEL_HAVE_MPI
extern const accel__comm_ops accel__mpi_ops;
#define MPI_BACKEND                                                                                \
    {"mpi", 1, ACCEL__COMM_WIRE, &accel__mpi_ops,                                                  \
     "many machines over Open MPI: start the job with mpirun or srun"}
#else
#define MPI_BACKEND                                                                                \
    {"mpi", 0, 0, NULL,                                                                            \
     "this build has no MPI: install libopenmpi-dev (scripts/install-deps.sh) and configure "      \
     "with -DACCEL_MPI=ON"}
#endif
/* clang-format on */

#if ACCEL_HAVE_GLOO
extern const accel__comm_ops accel__gloo_ops;
extern const accel__comm_ops accel__hier_ops;
#define GLOO_BUILT 1, ACCEL__COMM_WIRE, &accel__gloo_ops
#define HIER_BUILT 1, ACCEL__COMM_WIRE, &accel__hier_ops
#define GLOO_MISSING ""
#else
#define GLOO_BUILT 0, 0, NULL
#define HIER_BUILT 0, 0, NULL
#define GLOO_MISSING                                                                               \
    ": not in this build (it needs Debian's libgloo-dev at build time: apt-get install "           \
    "libgloo-dev, then rebuild)"
#endif

/* (the entries as written: clang-format would split their messages) */
/* clang-format off */
#ifdef ACCEL_HAVE_CUDA
extern const accel__comm_ops accel__nccl_ops;
#define NCCL_BACKEND                                                                               \
    {"nccl", 1, ACCEL__COMM_NATIVE_ASYNC | ACCEL__COMM_DEVICE_MEM | ACCEL__COMM_WIRE,             \
     &accel__nccl_ops, "CUDA GPUs over NCCL, one GPU per process"}
#else
#define NCCL_BACKEND                                                                               \
    {"nccl", 0, ACCEL__COMM_NATIVE_ASYNC | ACCEL__COMM_DEVICE_MEM, NULL,                          \
     "CUDA GPUs over NCCL: not in this build (configure with -DACCEL_CUDA=ON)"}
#endif
/* clang-format on */

/* Backends are values in this table (no strcmp chains, no weak symbols): one built in is
 * {name, 1, caps, &ops, doc}; a later one is listed unbuilt until its build option adds it. */
const accel__comm_backend accel__comm_backends[] = {
    {"self", 1, ACCEL__COMM_WIRE, &accel__self_ops, "one process: every collective is a copy"},
    {"shm", 1, ACCEL__COMM_ZERO_COPY | ACCEL__COMM_WIRE, &accel__shm_ops,
     "processes of one machine, through POSIX shared memory (the default under accel launch)"},
    MPI_BACKEND,
    {"gloo", GLOO_BUILT, "many machines over TCP, through Gloo" GLOO_MISSING},
    {"hier", HIER_BUILT,
     "several machines with several processes each: shm inside a machine, gloo "
     "across" GLOO_MISSING},
    NCCL_BACKEND,
    {NULL, 0, 0, NULL, NULL},
};

const accel__comm_backend *accel__comm_backend_find(const char *name)
{
    for (const accel__comm_backend *b = accel__comm_backends; name != NULL && b->name; b++) {
        if (strcmp(b->name, name) == 0) {
            return b;
        }
    }
    return NULL;
}

static char built_names[128];
static pthread_once_t built_once = PTHREAD_ONCE_INIT;

static void list_built(void)
{
    size_t len = 0;
    for (const accel__comm_backend *b = accel__comm_backends; b->name != NULL; b++) {
        if (b->built && len < sizeof(built_names)) {
            len += (size_t)snprintf(built_names + len, sizeof(built_names) - len, "%s%s",
                                    len > 0 ? ", " : "", b->name);
        }
    }
}

const char *accel__comm_backends_built(void)
{
    pthread_once(&built_once, list_built);
    return built_names;
}

/* ---- names ---- */

static const char *const kind_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                         "reduce",    "gather",         "barrier"};

const char *accel__coll_name(accel__coll_kind kind)
{
    return (unsigned)kind < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[kind]
                                                                       : "collective";
}

/* "f32" from "F32": messages write dtypes the way users write them in code comments. */
static void lower_dtype(accel_dtype dt, char *out, size_t nbytes)
{
    const char *name = accel_dtype_name(dt);
    size_t i = 0;
    for (; name != NULL && name[i] != '\0' && i + 1 < nbytes; i++) {
        char ch = name[i];
        out[i] = (char)(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    }
    out[i] = '\0';
}

void accel__coll_str(const accel__coll *op, int n_ranks, char *buf, size_t nbytes)
{
    static const char *const ops[] = {"sum", "avg", "max", "min", "prod"};
    const char *name = accel__coll_name(op->kind);
    const char *opn = (unsigned)op->op < 5 ? ops[op->op] : "?";
    char dt[16], wire[24] = "";
    lower_dtype(op->dtype, dt, sizeof(dt));
    if (op->wire != ACCEL_F32) {
        char w[16];
        lower_dtype(op->wire, w, sizeof(w));
        snprintf(wire, sizeof(wire), ", wire=%s", w);
    }
    unsigned long long n = (unsigned long long)op->count;
    if (op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_ALLGATHER) {
        n = op->total != 0 ? (unsigned long long)op->total : n * (unsigned long long)n_ranks;
    }
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
    case ACCEL__COLL_REDUCE_SCATTER:
        snprintf(buf, nbytes, "%s(count=%llu, %s, %s%s)", name, n, dt, opn, wire);
        break;
    case ACCEL__COLL_REDUCE:
        snprintf(buf, nbytes, "%s(count=%llu, %s, %s, root=%d)", name, n, dt, opn, op->root);
        break;
    case ACCEL__COLL_ALLGATHER:
        snprintf(buf, nbytes, "%s(count=%llu, %s)", name, n, dt);
        break;
    case ACCEL__COLL_BROADCAST:
    case ACCEL__COLL_GATHER:
        snprintf(buf, nbytes, "%s(count=%llu, %s, root=%d)", name, n, dt, op->root);
        break;
    default:
        snprintf(buf, nbytes, "%s()", name);
        break;
    }
}

accel__coll_decl accel__coll_declare_alloc(size_t nbytes)
{
    accel__coll_decl d;
    memset(&d, 0, sizeof(d));
    d.kind = ACCEL__COLL_DECL_ALLOC;
    d.count = nbytes;
    return d;
}

accel__coll_decl accel__coll_declare(const accel__coll *op)
{
    accel__coll_decl d;
    memset(&d, 0, sizeof(d));
    const int reducing = op->kind == ACCEL__COLL_ALLREDUCE ||
                         op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_REDUCE;
    const int rooted = op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_REDUCE ||
                       op->kind == ACCEL__COLL_GATHER;
    d.kind = (int32_t)op->kind;
    if (op->kind != ACCEL__COLL_BARRIER) {
        d.count = op->count;
        d.total = op->total;
        d.dtype = (int32_t)op->dtype;
        d.op = reducing ? (int32_t)op->op : 0;
        d.root = rooted ? op->root : 0;
        d.wire = (int32_t)op->wire;
    }
    return d;
}

static void decl_str(const accel__coll_decl *d, int n_ranks, char *buf, size_t nbytes)
{
    if (d->kind >= ACCEL__COLL_DECL_ALLOC) {
        snprintf(buf, nbytes, "accel_alloc_shared(nbytes=%llu)", (unsigned long long)d->count);
        return;
    }
    const accel__coll c = {.kind = (accel__coll_kind)d->kind,
                           .count = d->count,
                           .total = d->total,
                           .dtype = (accel_dtype)d->dtype,
                           .op = (accel_reduce_op)d->op,
                           .root = d->root,
                           .wire = (accel_dtype)d->wire};
    accel__coll_str(&c, n_ranks, buf, nbytes);
}

int accel__coll_decl_mismatch(const char *backend, const accel__coll_decl *a, int pa,
                              const accel__coll_decl *b, int pb, int n_ranks, char *buf,
                              size_t nbytes)
{
    if (a->kind == ACCEL__COLL_DECL_ALLOC && b->kind == ACCEL__COLL_DECL_ALLOC) {
        snprintf(buf, nbytes,
                 "%s: accel_alloc_shared: process %d asked for %llu bytes, process %d for %llu "
                 "(every process must pass the same size)",
                 backend, pa, (unsigned long long)a->count, pb, (unsigned long long)b->count);
        return 1;
    }
    char sa[160], sb[160];
    decl_str(a, n_ranks, sa, sizeof(sa));
    decl_str(b, n_ranks, sb, sizeof(sb));
    snprintf(buf, nbytes,
             "%s: collective mismatch: process %d called %s, process %d called %s (every process "
             "must make the same collective calls in the same order)",
             backend, pa, sa, pb, sb);
    return 0;
}

void accel__chunk_range(size_t count, int n_ranks, int rank, size_t *off, size_t *chunk_count)
{
    size_t n = (size_t)n_ranks, r = (size_t)rank;
    size_t base = count / n, extra = count % n;
    *off = r * base + (r < extra ? r : extra);
    *chunk_count = base + (r < extra ? 1 : 0);
}

/* ---- creation and teardown ---- */

accel_status accel__comm_wrap(accel__comm **out, const accel__comm_config *cfg,
                              const accel__comm_backend *be, void *impl, const char *name)
{
    accel__comm *c = accel__calloc(1, sizeof(*c));
    pthread_condattr_t ca;
    int ok = c != NULL && pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_mutex_init(&c->mu, NULL) == 0;
        if (ok && (pthread_cond_init(&c->work_cv, NULL) != 0 ||
                   pthread_cond_init(&c->done_cv, &ca) != 0)) {
            ok = 0; /* glibc's condition variables cannot fail to initialise; be tidy anyway */
        }
        pthread_condattr_destroy(&ca);
    }
    if (!ok) {
        accel__free(c);
        be->ops->destroy(impl);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory creating the communicator");
    }
    c->be = be;
    c->impl = impl;
    c->cfg = *cfg;
    c->cfg.backend = be->name;
    snprintf(c->name, sizeof(c->name), "%s", name);
    snprintf(c->job_id, sizeof(c->job_id), "%s", cfg->job_id != NULL ? cfg->job_id : "");
    c->cfg.job_id = c->job_id;
    snprintf(c->master_addr, sizeof(c->master_addr), "%s",
             cfg->master_addr != NULL ? cfg->master_addr : "127.0.0.1");
    c->cfg.master_addr = c->master_addr;
    if (cfg->socket_ifname != NULL) {
        snprintf(c->socket_ifname, sizeof(c->socket_ifname), "%s", cfg->socket_ifname);
        c->cfg.socket_ifname = c->socket_ifname;
    }
    if (cfg->gloo_ring != NULL) {
        snprintf(c->gloo_ring, sizeof(c->gloo_ring), "%s", cfg->gloo_ring);
        c->cfg.gloo_ring = c->gloo_ring;
    }
    *out = c;
    return ACCEL_OK;
}

accel_status accel__comm_new_with(accel__comm **out, const accel__comm_config *cfg,
                                  const accel__comm_backend *be)
{
    if (out == NULL || cfg == NULL || be == NULL || be->ops == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "communicator: %s is NULL",
                             out == NULL   ? "out"
                             : cfg == NULL ? "config"
                                           : "backend");
    }
    if (cfg->n_ranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->n_ranks) {
        return accel__seterr(NULL, ACCEL_EINVAL, "communicator: rank %d of %d processes", cfg->rank,
                             cfg->n_ranks);
    }
    accel__comm_config c2 = *cfg;
    c2.master_addr = cfg->master_addr != NULL ? cfg->master_addr : "127.0.0.1";
    void *impl = NULL;
    ACCEL_TRY(be->ops->init(&c2, &impl));
    return accel__comm_wrap(out, &c2, be, impl, "world");
}

accel_status accel__comm_new(accel__comm **out, const accel__comm_config *cfg)
{
    if (cfg == NULL || cfg->backend == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "communicator: no backend named");
    }
    const accel__comm_backend *be = accel__comm_backend_find(cfg->backend);
    if (be == NULL) {
        char names[128];
        size_t len = 0;
        for (const accel__comm_backend *b = accel__comm_backends; b->name; b++) {
            len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", len ? ", " : "",
                                    b->name);
        }
        return accel__seterr(NULL, ACCEL_EINVAL, "unknown backend \"%s\" (expected one of %s)",
                             cfg->backend, names);
    }
    if (!be->built) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "backend \"%s\" is not built into this library: %s; on one machine "
                             "use \"shm\" (the default under accel launch)",
                             be->name, be->doc);
    }
    return accel__comm_new_with(out, cfg, be);
}

void accel__comm_free(accel__comm *c)
{
    if (c == NULL) {
        return;
    }
    if (!accel__comm_drain(c)) {
        return;
    }
    /* Handles the user still holds outlive us: they are complete, so detach them; the others
     * (orphans nobody will free) go now. */
    for (accel_work *w = c->live, *next; w != NULL; w = next) {
        next = w->next_live;
        if (w->req != NULL) {
            c->be->ops->req_free(c->impl, w->req);
            w->req = NULL;
        }
        w->comm = NULL;
        if (w->orphan || !w->user) {
            accel__free(w->owned);
            accel__free(w);
        }
    }
    while (c->free_list != NULL) {
        accel_work *w = c->free_list;
        c->free_list = w->next;
        accel__free(w);
    }
    c->be->ops->destroy(c->impl);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
    pthread_mutex_destroy(&c->mu);
    accel__free(c);
}

void accel__comm_mark_broken(accel__comm *c, accel_status st, const char *msg)
{
    if (c->broken == ACCEL_OK) {
        c->broken = st;
        snprintf(c->broken_msg, sizeof(c->broken_msg), "%s", msg);
    }
}

/* ---- queries ---- */

int accel__comm_rank(const accel__comm *c)
{
    return c->cfg.rank;
}
int accel__comm_n_ranks(const accel__comm *c)
{
    return c->cfg.n_ranks;
}
const char *accel__comm_backend_name(const accel__comm *c)
{
    return c->be->name;
}
const char *accel__comm_name(const accel__comm *c)
{
    return c->name;
}
void accel__comm_describe(const accel__comm *c, char *buf, size_t nbytes)
{
    if (c->be->ops->describe != NULL) {
        c->be->ops->describe(c->impl, buf, nbytes);
    } else {
        snprintf(buf, nbytes, "%s", c->be->name);
    }
}
unsigned accel__comm_caps(const accel__comm *c)
{
    return c->be->caps;
}
const accel__comm_config *accel__comm_cfg(const accel__comm *c)
{
    return &c->cfg;
}
void accel__comm_set_debug(accel__comm *c, int on)
{
    if (c == NULL) {
        return;
    }
    c->cfg.debug = on;
    if (c->be->ops->set_debug != NULL) {
        c->be->ops->set_debug(c->impl, on);
    }
}
int accel__comm_zero_copy(const accel__comm *c)
{
    return c != NULL && (c->be->caps & ACCEL__COMM_ZERO_COPY) != 0;
}

/* ---- validation ---- */

static int overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

/* Checks buffers of one side: send (send_n bytes) and recv (recv_n bytes) may only overlap as
 * the in-place form, i.e. with send exactly at `inplace_send`. */
static accel_status check_buffers(const accel__coll *op, const char *what, size_t send_n,
                                  size_t recv_n, const void *inplace_send)
{
    if (send_n > 0 && op->send == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: send buffer is NULL with %zu elements", what,
                             op->count);
    }
    if (recv_n > 0 && op->recv == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: recv buffer is NULL with %zu elements", what,
                             op->count);
    }
    if (overlaps(op->send, send_n, op->recv, recv_n) && op->send != inplace_send) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "%s: send and recv buffers overlap but are not the in-place form",
                             what);
    }
    return ACCEL_OK;
}

/* The optional fields: wire dtype and the uneven helpers' total. */
static accel_status check_extras(const accel__comm *c, const accel__coll *op, const char *what)
{
    if (op->wire != ACCEL_F32) {
        if (op->kind != ACCEL__COLL_ALLREDUCE || op->dtype != ACCEL_F32 ||
            (op->wire != ACCEL_BF16 && op->wire != ACCEL_F16)) {
            return accel__seterr(
                NULL, ACCEL_EUNSUPPORTED,
                "%s: a wire dtype (%s) is for allreduce of F32 data through BF16 "
                "or F16",
                what, accel_dtype_name(op->wire) ? accel_dtype_name(op->wire) : "not a dtype");
        }
        if (!(c->be->caps & ACCEL__COMM_WIRE)) {
            return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                                 "%s: backend %s cannot reduce through a %s wire dtype", what,
                                 c->be->name, accel_dtype_name(op->wire));
        }
    }
    if (op->total != 0) {
        size_t n = (size_t)c->cfg.n_ranks;
        if ((op->kind != ACCEL__COLL_REDUCE_SCATTER && op->kind != ACCEL__COLL_ALLGATHER) ||
            op->count != op->total / n + (op->total % n != 0)) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "%s: total %zu does not pad to the per-rank count %zu", what,
                                 op->total, op->count);
        }
    }
    return ACCEL_OK;
}

accel_status accel__coll_validate(const accel__comm *c, const accel__coll *op)
{
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "collective on a NULL communicator");
    }
    if (op == NULL || (unsigned)op->kind > ACCEL__COLL_BARRIER) {
        return accel__seterr(NULL, ACCEL_EINVAL, "collective: invalid operation kind");
    }
    const char *what = accel__coll_name(op->kind);
    if (op->kind == ACCEL__COLL_BARRIER) {
        return ACCEL_OK;
    }
    int n = c->cfg.n_ranks, me = c->cfg.rank;
    if ((unsigned)op->dtype >= ACCEL_DTYPE_COUNT) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: dtype %d is not a valid accel_dtype", what,
                             (int)op->dtype);
    }
    size_t es = accel_dtype_nbytes(op->dtype);
    if (es == 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "%s: %s is a packed sub-byte dtype; collectives need whole-byte "
                             "elements (send the bytes as U8)",
                             what, accel_dtype_name(op->dtype));
    }
    int reducing = op->kind == ACCEL__COLL_ALLREDUCE || op->kind == ACCEL__COLL_REDUCE_SCATTER ||
                   op->kind == ACCEL__COLL_REDUCE;
    if (reducing && !accel__reduce_supported(op->dtype)) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "%s: reducing %s is not implemented", what,
                             accel_dtype_name(op->dtype));
    }
    if (reducing) {
        if ((unsigned)op->op > ACCEL_PROD) {
            return accel__seterr(NULL, ACCEL_EINVAL, "%s: reduce op %d is not valid", what,
                                 (int)op->op);
        }
        if (op->op == ACCEL_AVG && op->dtype == ACCEL_BOOL) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "%s: ACCEL_AVG is not defined for BOOL (use SUM/MAX for "
                                 "'any', MIN/PROD for 'all')",
                                 what);
        }
    }
    ACCEL_TRY(check_extras(c, op, what));
    int rooted = op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_REDUCE ||
                 op->kind == ACCEL__COLL_GATHER;
    if (rooted && (op->root < 0 || op->root >= n)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: root %d is not a process index (0..%d)", what,
                             op->root, n - 1);
    }
    int per_rank = op->kind == ACCEL__COLL_GATHER || op->kind == ACCEL__COLL_REDUCE_SCATTER ||
                   op->kind == ACCEL__COLL_ALLGATHER;
    if (op->count > SIZE_MAX / es / (per_rank ? (size_t)n : 1)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: count %zu overflows the address space", what,
                             op->count);
    }
    const size_t nb = op->count * es, mine = (size_t)me * nb, all = nb * (size_t)n;
    char *r = op->recv;
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return check_buffers(op, what, nb, nb, r);
    case ACCEL__COLL_REDUCE_SCATTER:
        return check_buffers(op, what, all, nb, r != NULL ? r - mine : NULL);
    case ACCEL__COLL_ALLGATHER:
        return check_buffers(op, what, nb, all, r != NULL ? r + mine : NULL);
    case ACCEL__COLL_BROADCAST:
        return check_buffers(op, what, me == op->root ? nb : 0, nb, r);
    case ACCEL__COLL_REDUCE:
        return check_buffers(op, what, nb, me == op->root ? nb : 0, r);
    case ACCEL__COLL_GATHER:
        return check_buffers(op, what, nb, me == op->root ? all : 0, r != NULL ? r + mine : NULL);
    default:
        return ACCEL_OK;
    }
}

/* ---- convenience wrappers ---- */

accel_status accel__allreduce(accel__comm *c, const void *send, void *recv, size_t count,
                              accel_dtype dt, accel_reduce_op op)
{
    accel__coll o = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, send, recv, count, dt, op, 0);
    return accel__comm_run(c, &o);
}

accel_status accel__broadcast(accel__comm *c, void *buf, size_t count, accel_dtype dt, int root)
{
    accel__coll o = ACCEL__COLL(ACCEL__COLL_BROADCAST, buf, buf, count, dt, ACCEL_SUM, root);
    return accel__comm_run(c, &o);
}

accel_status accel__barrier(accel__comm *c)
{
    accel__coll o = ACCEL__COLL(ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0);
    return accel__comm_run(c, &o);
}
