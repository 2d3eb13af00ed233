/*
 * The mpi backend (Open MPI, many machines): starting and finishing MPI, communicator endpoints,
 * waits with deadlines, abort, split and plain symmetric memory. The collectives are in
 * mpi_coll.c. It is a host backend: the front end's progress thread runs each collective, which
 * posts nonblocking MPI calls (MPI_Isend, MPI_Irecv) and tests them until they complete, an
 * abort notice arrives or the deadline passes, so the training thread never blocks in MPI.
 *
 * Invariants: accel calls MPI_Init_thread (MPI_THREAD_MULTIPLE) only when the program has not
 * initialised MPI, and finalises only what it initialised, at exit, and only when no peer was
 * lost (a timeout or an MPI error: finalising synchronises with every peer, and a stuck one
 * would keep us forever; mpirun instead reports the process as failed and ends the job). An
 * aborted communicator's requests never complete: its MPI objects are left allocated. Every
 * endpoint owns two private communicators (never the program's MPI_COMM_WORLD) with
 * MPI_ERRORS_RETURN, so MPI failures come back as statuses, and always has a receive posted for a
 * peer's abort notice.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "mpi_impl.h"

#define ABORT_TAG 7301 /* on the ctl communicator, which carries nothing else */

static pthread_mutex_t setup_mu = PTHREAD_MUTEX_INITIALIZER;
static int started;      /* types made (once per process) */
static int serialised;   /* MPI runs below MPI_THREAD_MULTIPLE: one accel MPI call at a time */
static _Atomic int lost; /* a peer may be dead or stuck (a timeout, an MPI error): no finalise */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static MPI_Datatype types[ACCEL_DTYPE_COUNT];

void accel__mpi_lock(void)
{
    if (serialised) {
        pthread_mutex_lock(&call_mu);
    }
}

void accel__mpi_unlock(void)
{
    if (serialised) {
        pthread_mutex_unlock(&call_mu);
    }
}

MPI_Datatype accel__mpi_type(accel_dtype dt)
{
    return (unsigned)dt < ACCEL_DTYPE_COUNT ? types[dt] : MPI_DATATYPE_NULL;
}

/* "allreduce(count=4096, f32, sum) (its all-to-all step)", or `what` outside a collective. */
static const char *call_name(const accel__mpi *m, const char *what, char *buf, size_t nbytes)
{
    if (m->cur == NULL) {
        return what;
    }
    char call[160];
    accel__coll_str(m->cur, m->n_ranks, call, sizeof(call));
    if (strcmp(what, accel__coll_name(m->cur->kind)) == 0) {
        snprintf(buf, nbytes, "%s", call);
    } else {
        snprintf(buf, nbytes, "%s (its %s)", call, what);
    }
    return buf;
}

accel_status accel__mpi_fail(accel__mpi *m, int rc, const char *what)
{
    char name[256];
    what = call_name(m, what, name, sizeof(name));
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
        snprintf(text, sizeof(text), "MPI error %d", rc);
    }
    return accel__seterr(NULL, ACCEL_EPEER, "mpi: %s failed on process %d of %d: %s", what, m->rank,
                         m->n_ranks, text);
}

/* ---- starting and finishing MPI ---- */

static void finish_at_exit(void)
{
    int fin = 1;
    MPI_Finalized(&fin);
    if (fin) {
        return;
    }
    if (atomic_load(&lost)) {
        /* MPI_Finalize synchronises with every peer; one that is stuck would keep us here. */
        accel__log(NULL, ACCEL__LOG_WARN,
                   "mpi: not finalising MPI after a lost peer (mpirun reports this process as "
                   "failed and ends the job)");
        return;
    }
    MPI_Finalize();
}

/* Named types where MPI has them; a contiguous byte type of the element's size for the rest
 * (collectives only move elements: accel's kernels reduce them). */
static accel_status make_types(void)
{
    static const struct {
        accel_dtype dt;
        MPI_Datatype t;
    } named[] = {
        {ACCEL_F32, MPI_FLOAT},    {ACCEL_F64, MPI_DOUBLE},   {ACCEL_I8, MPI_INT8_T},
        {ACCEL_U8, MPI_UINT8_T},   {ACCEL_I16, MPI_INT16_T},  {ACCEL_U16, MPI_UINT16_T},
        {ACCEL_I32, MPI_INT32_T},  {ACCEL_I64, MPI_INT64_T},  {ACCEL_BOOL, MPI_C_BOOL},
        {ACCEL_U32, MPI_UINT32_T}, {ACCEL_U64, MPI_UINT64_T}, {ACCEL_C64, MPI_C_FLOAT_COMPLEX}};
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        types[d] = MPI_DATATYPE_NULL;
    }
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        types[named[i].dt] = named[i].t;
    }
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        size_t es = accel_dtype_nbytes((accel_dtype)d);
        if (types[d] != MPI_DATATYPE_NULL || es == 0) {
            continue; /* named, or a packed sub-byte format (collectives refuse those) */
        }
        if (MPI_Type_contiguous((int)es, MPI_BYTE, &types[d]) != MPI_SUCCESS ||
            MPI_Type_commit(&types[d]) != MPI_SUCCESS) {
            return accel__seterr(NULL, ACCEL_EINTERNAL, "mpi: cannot make the datatype of %s",
                                 accel_dtype_name((accel_dtype)d));
        }
    }
    return ACCEL_OK;
}

/* Initialises MPI if the program has not, and makes the types (once). */
static accel_status start(const accel__comm_config *cfg)
{
    pthread_mutex_lock(&setup_mu);
    accel_status st = ACCEL_OK;
    int inited = 0, fin = 0, level = MPI_THREAD_SINGLE;
    MPI_Finalized(&fin);
    MPI_Initialized(&inited);
    if (fin) {
        st = accel__seterr(NULL, ACCEL_ESTATE,
                           "backend mpi: MPI was already finalised in this process (create "
                           "accel's communicators before MPI_Finalize)");
    } else if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
        if (rc != MPI_SUCCESS) {
            st = accel__seterr(NULL, ACCEL_EINTERNAL, "backend mpi: MPI_Init_thread failed (%d)",
                               rc);
        } else {
            atexit(finish_at_exit);
        }
    } else {
        MPI_Query_thread(&level);
        if (level < MPI_THREAD_MULTIPLE && !started) {
            /* Open MPI treats every level below MULTIPLE alike (no locking), so accel's calls
             * from its communication thread are safe as long as they never overlap another
             * MPI call: ours hold call_mu, and the program must not call MPI while accel work
             * is in flight (docs/comm.md). */
            accel__log(&cfg->log, ACCEL__LOG_WARN,
                       "backend mpi: the program initialised MPI below MPI_THREAD_MULTIPLE "
                       "(level %d): accel serialises its MPI calls; do not call MPI while "
                       "accel collectives are in flight (or use MPI_Init_thread with "
                       "MPI_THREAD_MULTIPLE)",
                       level);
        }
    }
    if (st == ACCEL_OK && !started) {
        serialised = level < MPI_THREAD_MULTIPLE;
        st = make_types();
        started = st == ACCEL_OK;
    }
    pthread_mutex_unlock(&setup_mu);
    return st;
}

/* ---- waiting ---- */

/* The error of a wait that an abort ended (this member's or a peer's notice). */
static accel_status aborted_error(accel__mpi *m, const char *what)
{
    char name[256];
    what = call_name(m, what, name, sizeof(name));
    if (m->peer_note) {
        accel_status st =
            m->rx_note.status != ACCEL_OK ? (accel_status)m->rx_note.status : ACCEL_EPEER;
        m->rx_note.msg[sizeof(m->rx_note.msg) - 1] = '\0';
        return accel__seterr(NULL, st,
                             "mpi: %s on process %d of %d: process %d aborted the "
                             "communicator: %s",
                             what, m->rank, m->n_ranks, (int)m->rx_note.rank, m->rx_note.msg);
    }
    return accel__seterr(NULL, ACCEL_EPEER, "mpi: %s on process %d of %d: aborted here", what,
                         m->rank, m->n_ranks);
}

/* Sends this member's abort notice to every peer (once). Any thread. */
static void notify_peers(accel__mpi *m, accel_status st, const char *msg)
{
    if (atomic_exchange(&m->aborted, 1)) {
        return;
    }
    m->tx_note.rank = m->rank;
    m->tx_note.status = (int32_t)st;
    size_t len = strnlen(msg, sizeof(m->tx_note.msg) - 1); /* cut to the wire message */
    memcpy(m->tx_note.msg, msg, len);
    m->tx_note.msg[len] = '\0';
    accel__mpi_lock();
    for (int q = 0; q < m->n_ranks; q++) {
        if (q != m->rank) {
            (void)MPI_Isend(&m->tx_note, (int)sizeof(m->tx_note), MPI_BYTE, q, ABORT_TAG, m->ctl,
                            &m->abort_tx[q]);
        }
    }
    accel__mpi_unlock();
}

/* Takes a peer's abort notice if one has arrived (the MPI lock held). */
static void poll_notice(accel__mpi *m)
{
    int heard = 0;
    if (!m->peer_note && m->abort_rx != MPI_REQUEST_NULL) {
        (void)MPI_Test(&m->abort_rx, &heard, MPI_STATUS_IGNORE);
    }
    if (heard) {
        m->peer_note = 1;
        atomic_store(&m->aborted, 1);
    }
}

accel_status accel__mpi_check_abandoned(accel__mpi *m, const char *what)
{
    accel__mpi_lock();
    poll_notice(m);
    accel__mpi_unlock();
    if (atomic_load(&m->aborted)) {
        m->stuck = 1;
        return aborted_error(m, what);
    }
    return ACCEL_OK;
}

accel_status accel__mpi_wait(accel__mpi *m, MPI_Request *req, const char *what)
{
    return accel__mpi_waitall(m, 1, req, NULL, what);
}

static int pending(MPI_Request req, int peer)
{
    int done = 1;
    if (peer >= 0) {
        (void)MPI_Request_get_status(req, &done, MPI_STATUS_IGNORE);
    }
    return !done;
}

/* After a timeout: ": nothing arrived from process 1, 3" for the receives still pending (a
 * process named once, though several pieces may be missing from it). */
static void missing_peers(int n, MPI_Request *reqs, const accel__mpi_rx *rx, char *buf,
                          size_t nbytes)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; rx != NULL && k < n && len + 16 < nbytes; k++) {
        int named = 0;
        for (int j = 0; j < k && !named; j++) {
            named = rx[j].peer == rx[k].peer && pending(reqs[j], rx[j].peer);
        }
        if (!named && pending(reqs[k], rx[k].peer)) {
            len +=
                (size_t)snprintf(buf + len, nbytes - len, "%s%d",
                                 len == 0 ? ": nothing arrived from process " : ", ", rx[k].peer);
        }
    }
}

/* A receive got a message of another size than it expects (accel__mpi_check_sizes wrote which
 * in `sizes`): two calls met whose fingerprints collide. Breaks the endpoint and tells the
 * peers, whose waits for this call (or the next) then end at once. Requests of the call may
 * still be posted (the pipelined path's later segments): the endpoint's buffers must stay. */
static accel_status size_mismatch(accel__mpi *m, const char *what, const char *sizes)
{
    char name[256];
    what = call_name(m, what, name, sizeof(name));
    m->stuck = 1;
    atomic_store(&lost, 1);
    m->broken = ACCEL_EINVAL;
    snprintf(m->broken_msg, sizeof(m->broken_msg),
             "mpi: %s on process %d of %d: %s: the processes made different calls "
             "(ACCELERATE_DEBUG_MODE=1 names both)",
             what, m->rank, m->n_ranks, sizes);
    notify_peers(m, ACCEL_EINVAL, m->broken_msg);
    return accel__seterr(NULL, ACCEL_EINVAL, "%s", m->broken_msg);
}

accel_status accel__mpi_waitall(accel__mpi *m, int n, MPI_Request *reqs, const accel__mpi_rx *rx,
                                const char *what)
{
    const double deadline = accel__now() + m->timeout_s;
    for (unsigned spin = 0;; spin++) {
        int done = 0, bad = 0;
        char sizes[128];
        accel__mpi_lock();
        int rc = MPI_Testall(n, reqs, &done, rx != NULL ? m->statuses : MPI_STATUSES_IGNORE);
        if (rc == MPI_SUCCESS && !done && (spin & 15) == 15) {
            poll_notice(m);
        }
        accel__mpi_unlock();
        /* Statuses are written only once every request completed (or with MPI_ERR_IN_STATUS). */
        if (rx != NULL && ((rc == MPI_SUCCESS && done) || rc == MPI_ERR_IN_STATUS)) {
            bad = accel__mpi_check_sizes(m, n, rx, rc, sizes, sizeof(sizes));
        }
        if (bad) {
            return size_mismatch(m, what, sizes);
        }
        if (rc != MPI_SUCCESS) {
            m->stuck = 1;
            atomic_store(&lost, 1);
            return accel__mpi_fail(m, rc, what);
        }
        if (done) {
            return ACCEL_OK;
        }
        if (atomic_load(&m->aborted)) {
            m->stuck = 1;
            return aborted_error(m, what);
        }
        if ((spin & 255) == 255 && accel__now() > deadline) {
            m->stuck = 1;
            atomic_store(&lost, 1);
            char name[256], missing[96], hint[320] = "";
            what = call_name(m, what, name, sizeof(name));
            accel__mpi_lock();
            missing_peers(n, reqs, rx, missing, sizeof(missing));
            if (m->cur != NULL) {
                accel__mpi_foreign_hint(m, hint, sizeof(hint));
            }
            accel__mpi_unlock();
            /* notify_peers cuts the notice to the wire message's size. */
            char msg[sizeof(name) + sizeof(missing) + 64];
            snprintf(msg, sizeof(msg), "%s not complete after %.3g s%s", what, m->timeout_s,
                     missing);
            notify_peers(m, ACCEL_ETIMEDOUT, msg);
            return accel__seterr(NULL, ACCEL_ETIMEDOUT,
                                 "mpi: %s on process %d of %d: not complete after %.3g s%s%s", what,
                                 m->rank, m->n_ranks, m->timeout_s,
                                 missing[0] != '\0' ? missing
                                                    : " (a peer is stuck, dead or at another "
                                                      "call)",
                                 hint);
        }
        if (spin >= 64) {
            sched_yield(); /* a peer sharing this CPU gets to run */
        }
    }
}

char *accel__mpi_scratch(accel__mpi *m, size_t nbytes)
{
    if (nbytes > m->scratch_nbytes) {
        char *p = accel__aligned_alloc(nbytes);
        if (p == NULL) {
            accel__seterr(NULL, ACCEL_ENOMEM, "mpi: out of memory for %zu bytes of scratch",
                          nbytes);
            return NULL;
        }
        accel__aligned_free(m->scratch);
        m->scratch = p;
        m->scratch_nbytes = nbytes;
    }
    return m->scratch;
}

/* ---- endpoints ---- */

static void endpoint_free(accel__mpi *m)
{
    if (m == NULL) {
        return;
    }
    int fin = 1;
    MPI_Finalized(&fin);
    if (!fin) {
        accel__mpi_lock();
        if (!m->stuck && m->abort_rx != MPI_REQUEST_NULL && !m->peer_note) {
            /* Cancelling a receive nobody matched completes at once. */
            MPI_Cancel(&m->abort_rx);
            MPI_Wait(&m->abort_rx, MPI_STATUS_IGNORE);
        }
        for (int q = 0; m->abort_tx != NULL && q < m->n_ranks; q++) {
            int done = 1;
            if (m->abort_tx[q] != MPI_REQUEST_NULL) {
                MPI_Test(&m->abort_tx[q], &done, MPI_STATUS_IGNORE);
            }
            m->stuck |= !done;
        }
        if (!m->stuck) {
            if (m->ctl != MPI_COMM_NULL) {
                MPI_Comm_free(&m->ctl);
            }
            if (m->comm != MPI_COMM_NULL) {
                MPI_Comm_free(&m->comm);
            }
        }
        accel__mpi_unlock();
    }
    if (m->stuck) {
        /* A request never completed: MPI may still write into this endpoint's buffers (the
         * scratch, the notices, symmetric blocks) whenever a peer's data arrives, so all of it
         * stays allocated. Only a broken communicator gets here. */
        return;
    }
    while (m->blocks != NULL) {
        accel__mpi_block *b = m->blocks;
        m->blocks = b->next;
        accel__aligned_free(b->p);
        accel__free(b);
    }
    accel__aligned_free(m->scratch);
    accel__free(m->decls);
    accel__free(m->abort_tx);
    accel__free(m->counts);
    accel__free(m->displs);
    accel__free(m->ins);
    accel__free(m->reqs);
    accel__free(m->req_rx);
    accel__free(m->pipe_reqs);
    accel__free(m->pipe_rx);
    accel__free(m->statuses);
    accel__free(m);
}

/* An endpoint around `comm` (taken: freed with the endpoint): its control communicator, error
 * handlers, and the posted abort receive. cfg gives the timeout and the log context. */
static accel_status endpoint_new(MPI_Comm comm, const accel__comm_config *cfg, accel__mpi **out)
{
    accel__mpi *m = accel__calloc(1, sizeof(*m));
    if (m == NULL) {
        MPI_Comm_free(&comm);
        return accel__seterr(NULL, ACCEL_ENOMEM, "mpi: out of memory");
    }
    m->comm = comm;
    m->ctl = MPI_COMM_NULL;
    m->abort_rx = MPI_REQUEST_NULL;
    m->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 300;
    m->prev_enter = accel__now();
    m->log = cfg->log;
    m->debug = cfg->debug;
    MPI_Comm_rank(comm, &m->rank);
    MPI_Comm_size(comm, &m->n_ranks);
    m->one_node = cfg->local_n_ranks == m->n_ranks;
    const size_t n = (size_t)m->n_ranks;
    m->abort_tx = accel__malloc(n * sizeof(*m->abort_tx));
    m->counts = accel__calloc(n, sizeof(int));
    m->displs = accel__calloc(n, sizeof(int));
    m->ins = accel__calloc(n, sizeof(*m->ins));
    m->reqs = accel__calloc(2 * n, sizeof(*m->reqs));
    m->req_rx = accel__calloc(2 * n, sizeof(*m->req_rx));
    m->statuses = accel__calloc(2 * n, sizeof(*m->statuses));
    m->statuses_n = 2 * n;
    if (m->abort_tx == NULL || m->counts == NULL || m->displs == NULL || m->ins == NULL ||
        m->reqs == NULL || m->req_rx == NULL || m->statuses == NULL) {
        endpoint_free(m);
        return accel__seterr(NULL, ACCEL_ENOMEM, "mpi: out of memory");
    }
    for (size_t q = 0; q < n; q++) {
        m->abort_tx[q] = MPI_REQUEST_NULL;
    }
    accel__mpi_lock();
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Request req = MPI_REQUEST_NULL;
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_idup(comm, &m->ctl, &req);
    }
    accel__mpi_unlock();
    accel_status st = rc == MPI_SUCCESS ? ACCEL_OK : accel__mpi_fail(m, rc, "MPI_Comm_idup");
    if (st == ACCEL_OK) {
        st = accel__mpi_wait(m, &req, "creating the communicator (MPI_Comm_idup)");
    }
    if (st == ACCEL_OK) {
        accel__mpi_lock();
        rc = MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Irecv(&m->rx_note, (int)sizeof(m->rx_note), MPI_BYTE, MPI_ANY_SOURCE,
                           ABORT_TAG, m->ctl, &m->abort_rx);
        }
        accel__mpi_unlock();
        st = rc == MPI_SUCCESS ? ACCEL_OK : accel__mpi_fail(m, rc, "posting the abort receive");
    }
    if (st == ACCEL_OK) {
        st = accel__mpi_check_setup(m);
    }
    if (st != ACCEL_OK) {
        endpoint_free(m);
        return st;
    }
    *out = m;
    return ACCEL_OK;
}

/* MPI knows which processes share a machine (MPI_Comm_split_type): the job's layout must agree,
 * since node groups (split's local ranks, hier) take a machine's processes to be consecutive
 * ranks, as mpirun's default by-slot mapping places them. A disagreement is logged, once. */
static void check_nodes(accel__mpi *m, const accel__comm_config *cfg)
{
    MPI_Comm node = MPI_COMM_NULL;
    int node_rank = 0, node_n = 0, first = 0;
    accel__mpi_lock();
    int rc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) {
        MPI_Comm_rank(node, &node_rank);
        MPI_Comm_size(node, &node_n);
        rc = MPI_Allreduce(&m->rank, &first, 1, MPI_INT, MPI_MIN, node);
        MPI_Comm_free(&node);
    }
    accel__mpi_unlock();
    if (rc != MPI_SUCCESS) {
        return;
    }
    if (node_rank != cfg->local_rank || node_n != cfg->local_n_ranks ||
        first + node_rank != m->rank) {
        accel__log(&cfg->log, ACCEL__LOG_WARN,
                   "backend mpi: MPI puts this process at %d of %d on its machine (first rank "
                   "%d), the job's layout at local rank %d of %d: node groups take a machine's "
                   "processes to be consecutive ranks (mpirun --map-by slot, the default)",
                   node_rank, node_n, first, cfg->local_rank, cfg->local_n_ranks);
    }
}

static accel_status mpi_init(const accel__comm_config *cfg, void **impl)
{
    ACCEL_TRY(start(cfg));
    int world_n = 0, world_rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_n);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_n != cfg->n_ranks || world_rank != cfg->rank) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "backend mpi: MPI_COMM_WORLD has this process as rank %d of %d, "
                             "but the job's layout says rank %d of %d (start the job with "
                             "mpirun or srun, not accel launch, to use mpi)",
                             world_rank, world_n, cfg->rank, cfg->n_ranks);
    }
    /* A private copy of the world: the program's own MPI traffic never meets ours. The copy is
     * nonblocking, so a process that never arrives is a timeout, not a hang. */
    MPI_Comm world = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    accel__mpi probe = {.rank = world_rank, .n_ranks = world_n, .abort_rx = MPI_REQUEST_NULL};
    probe.timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 300;
    accel__mpi_lock();
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &world, &req);
    accel__mpi_unlock();
    if (rc != MPI_SUCCESS) {
        return accel__mpi_fail(&probe, rc, "MPI_Comm_idup of MPI_COMM_WORLD");
    }
    ACCEL_TRY(accel__mpi_wait(&probe, &req, "creating the world communicator (MPI_Comm_idup)"));
    accel__mpi *m;
    ACCEL_TRY(endpoint_new(world, cfg, &m));
    check_nodes(m, cfg);
    *impl = m;
    return ACCEL_OK;
}

static accel_status mpi_split(void *impl, const accel__comm_split_info *how, void **child)
{
    accel__mpi *m = impl;
    *child = NULL;
    MPI_Comm nc = MPI_COMM_NULL;
    /* The front end ranks a child's members by (key, parent rank), as MPI_Comm_split does. Every
     * member reached this call (the front end's exchange over the parent just completed). */
    accel__mpi_lock();
    int rc = MPI_Comm_split(m->comm, how->cfg != NULL ? how->color : MPI_UNDEFINED, how->key, &nc);
    accel__mpi_unlock();
    accel_status st = rc == MPI_SUCCESS ? ACCEL_OK : accel__mpi_fail(m, rc, "MPI_Comm_split");
    accel__mpi *cm = NULL;
    if (st == ACCEL_OK && nc != MPI_COMM_NULL) {
        st = endpoint_new(nc, how->cfg, &cm);
        if (st == ACCEL_OK && cm->rank != how->cfg->rank) {
            st = accel__seterr(NULL, ACCEL_EINTERNAL,
                               "mpi: MPI_Comm_split ranked this process %d, the front end %d",
                               cm->rank, how->cfg->rank);
        }
    }
    /* Every member of the parent takes the same branch: the worst status wins everywhere. */
    int mine = (int)st, worst = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    char msg[ACCEL__ERRMSG_NBYTES];
    snprintf(msg, sizeof(msg), "%s", st != ACCEL_OK ? accel_last_error(NULL) : "");
    accel__mpi_lock();
    rc = MPI_Iallreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, m->comm, &req);
    accel__mpi_unlock();
    accel_status ex = rc == MPI_SUCCESS ? accel__mpi_wait(m, &req, "agreeing on a split")
                                        : accel__mpi_fail(m, rc, "agreeing on a split");
    if (ex == ACCEL_OK && worst != ACCEL_OK && st == ACCEL_OK) {
        st = accel__seterr(NULL, (accel_status)worst,
                           "accel__comm_split: another process could not create its group (%s)",
                           accel_status_name((accel_status)worst));
    } else if (ex != ACCEL_OK) {
        st = ex;
    } else if (st != ACCEL_OK) {
        accel__seterr(NULL, st, "%s", msg);
    }
    if (st != ACCEL_OK) {
        endpoint_free(cm);
        return st;
    }
    *child = cm;
    return ACCEL_OK;
}

static void mpi_abort(void *impl, accel_status st, const char *msg)
{
    notify_peers(impl, st, msg);
}

static void mpi_destroy(void *impl)
{
    endpoint_free(impl);
}

/* Symmetric memory: plain aligned memory (no shared memory across machines; collectives copy).
 * Collective in name only: each process allocates its own, but for debug mode's check that
 * every process makes this call with the same size. */
static accel_status mpi_mem_alloc(void *impl, size_t nbytes, void **out)
{
    accel__mpi *m = impl;
    if (m->broken != ACCEL_OK) {
        return accel__seterr(NULL, m->broken, "%s", m->broken_msg);
    }
    if (m->debug) {
        const accel__coll_decl d = accel__coll_declare_alloc(nbytes);
        ACCEL_TRY(accel__mpi_check_call(m, &d));
    }
    accel__mpi_block *b = accel__malloc(sizeof(*b));
    void *p = b != NULL ? accel__aligned_alloc(nbytes > 0 ? nbytes : 64) : NULL;
    if (p == NULL) {
        accel__free(b);
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_alloc_shared: out of memory for %zu bytes",
                             nbytes);
    }
    memset(p, 0, nbytes);
    b->p = p;
    b->next = m->blocks;
    m->blocks = b;
    *out = p;
    return ACCEL_OK;
}

static accel_status mpi_mem_free(void *impl, void *p)
{
    accel__mpi *m = impl;
    for (accel__mpi_block **pb = &m->blocks; *pb != NULL; pb = &(*pb)->next) {
        if ((*pb)->p == p) {
            accel__mpi_block *b = *pb;
            *pb = b->next;
            accel__aligned_free(b->p);
            accel__free(b);
            return ACCEL_OK;
        }
    }
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "accel_free_shared: %p was not allocated by accel_alloc_shared", p);
}

static void mpi_set_debug(void *impl, int on)
{
    ((accel__mpi *)impl)->debug = on;
}

const accel__comm_ops accel__mpi_ops = {
    .init = mpi_init,
    .split = mpi_split,
    .run = accel__mpi_run,
    .abort = mpi_abort,
    .mem_alloc = mpi_mem_alloc,
    .mem_free = mpi_mem_free,
    .destroy = mpi_destroy,
    .set_debug = mpi_set_debug,
};
