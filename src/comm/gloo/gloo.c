/*
 * The gloo backend: processes on many machines over TCP, through Gloo (gloo_cxx.cc wraps it).
 * Rendezvous through the job's store at MASTER_ADDR:MASTER_PORT (served by the launcher under
 * a multi-machine accel launch, else by process 0), listening on ACCEL_SOCKET_IFNAME /
 * GLOO_SOCKET_IFNAME or the interface of the route to MASTER_ADDR.
 *
 * Reductions never use Gloo's ring allreduce, whose combination order depends on the rank and
 * chunk: every reduction sends block r of every rank to rank r, which reduces them with accel's
 * kernels in rank order (fp32 accumulation for the 16-bit dtypes, the wire dtype's rounding);
 * an allreduce then sends the reduced blocks to every rank (from 4 MiB as point-to-point
 * messages pipelined in segments: pipelined() below), reduce_scatter keeps them. That moves what a
 * ring moves (2 (n-1)/n of the message per rank) and gives results bit-identical to every other
 * backend. Every call begins with one exchange of envelopes declaring it (exchange() below),
 * which checks that every member makes the same call, serves as the barrier, and carries a small
 * allreduce's inputs (all together <= 64 KiB): one round trip, every rank reducing them in rank
 * order. Reduce is the allreduce, kept at the root; the rest are Gloo's own.
 *
 * Failures: the first process that sees one (a connection closed by a dead peer, a deadline)
 * records its diagnosis in the store ("<prefix>abort"), then resets all its connections, so
 * every peer waiting on it fails at once and, reading the record, names the original culprit
 * rather than its messenger.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/convert.h"
#include "comm/comm.h"
#include "comm/reduce.h"
#include "comm/store.h"
#include "gloo.h"
#include "gloo_cxx.h"

struct accel__gloo {
    int rank, n_ranks;
    int *process; /* the job-wide process index of each rank, for messages */
    double timeout_s;
    accel__log_ctx log;
    accel__store *store;
    pthread_mutex_t mu; /* the failure record and the store (abort may come from any thread) */
    char prefix[400];
    char listen[96]; /* "eth0" or "10.0.0.2 (route to MASTER_ADDR)", for describe */
    accel__gloo_ctx *g;
    uint64_t n_splits;
    /* Grow-only scratch (no allocation per step once warm) and per-rank tables. */
    void *scratch[3];
    size_t scratch_nbytes[3];
    size_t *cnt, *send_nbytes, *recv_nbytes; /* elements, bytes to and bytes from each rank */
    const void **in;
    /* The envelopes of call env_seq land in table env[env_seq % 2] (exchange()). */
    char *env[2];
    uint64_t env_seq;
    /* The first failure: every later call repeats it. */
    _Atomic int broken;
    accel_status broken_st;
    char broken_msg[ACCEL__ERRMSG_NBYTES];
};

/* ---- setup ---- */

/* The local numeric address of the route to addr:port (where a connect would leave from). */
static accel_status route_to(const char *addr, int port, char *out, size_t out_nbytes)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_DGRAM;
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", port > 0 ? port : 29500);
    int rc = getaddrinfo(addr, ports, &hints, &res);
    if (rc != 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "gloo: cannot resolve MASTER_ADDR=%s: %s", addr,
                             gai_strerror(rc));
    }
    accel_status st = ACCEL_EIO;
    for (struct addrinfo *a = res; a != NULL && st != ACCEL_OK; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        /* A UDP connect sends nothing: it only asks the kernel for the route. */
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            const void *ip = ss.ss_family == AF_INET6
                                 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                 : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
            if (inet_ntop(ss.ss_family, ip, out, (socklen_t)out_nbytes) != NULL) {
                st = ACCEL_OK;
            }
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    freeaddrinfo(res);
    if (st != ACCEL_OK) {
        return accel__seterr(NULL, ACCEL_EIO,
                             "gloo: no route to MASTER_ADDR=%s from this machine (set "
                             "ACCEL_SOCKET_IFNAME to the interface to use)",
                             addr);
    }
    return ACCEL_OK;
}

void accel__gloo_close(accel__gloo *e)
{
    if (e == NULL) {
        return;
    }
    accel__gloo_free(e->g);
    accel__store_close(e->store);
    pthread_mutex_destroy(&e->mu);
    for (int i = 0; i < 3; i++) {
        accel__free(e->scratch[i]);
    }
    accel__free(e->process);
    accel__free(e->cnt);
    accel__free(e->send_nbytes);
    accel__free(e->recv_nbytes);
    accel__free(e->in);
    accel__free(e->env[0]);
    accel__free(e);
}

/* Gloo writes to its sockets with plain writev: a write to a peer that just died raises
 * SIGPIPE, whose default action ends this process before Gloo can report the peer (PyTorch
 * never sees it: Python ignores SIGPIPE). A program that left SIGPIPE at its default gets it
 * ignored, as Python does, so the write fails with EPIPE and the dead peer is an ACCEL_EPEER
 * naming it; a handler or disposition the program set is kept. */
static void ignore_sigpipe(void)
{
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
        sa.sa_handler == SIG_DFL) {
        signal(SIGPIPE, SIG_IGN);
    }
}

accel_status accel__gloo_open(accel__gloo **out, const accel__comm_config *cfg, const char *prefix,
                              int serve, const int *process)
{
    ignore_sigpipe();
    accel__gloo *e = accel__calloc(1, sizeof(*e));
    const size_t n = (size_t)cfg->n_ranks;
    if (e == NULL || pthread_mutex_init(&e->mu, NULL) != 0) {
        accel__free(e);
        return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory");
    }
    e->process = accel__calloc(n, sizeof(int));
    e->cnt = accel__calloc(n, sizeof(size_t));
    e->send_nbytes = accel__calloc(n, sizeof(size_t));
    e->recv_nbytes = accel__calloc(n, sizeof(size_t));
    e->in = accel__calloc(n, sizeof(void *));
    if (e->process == NULL || e->cnt == NULL || e->send_nbytes == NULL || e->recv_nbytes == NULL ||
        e->in == NULL) {
        accel__gloo_close(e);
        return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory");
    }
    e->rank = cfg->rank;
    e->n_ranks = cfg->n_ranks;
    e->timeout_s = cfg->timeout_s;
    e->log = cfg->log;
    for (size_t q = 0; q < n; q++) {
        e->process[q] = process != NULL ? process[q] : cfg->process_base + (int)q;
    }
    snprintf(e->prefix, sizeof(e->prefix), "%s", prefix);

    char host[64] = "";
    accel__store_config sc = {.addr = cfg->master_addr,
                              .port = cfg->master_port,
                              .serve = serve,
                              .timeout_s = cfg->timeout_s};
    accel_status st = accel__store_open(&e->store, &sc);
    if (st == ACCEL_OK && cfg->socket_ifname == NULL) {
        st = route_to(cfg->master_addr, cfg->master_port, host, sizeof(host));
    }
    if (st == ACCEL_OK) {
        accel__gloo_err err;
        st = accel__gloo_connect(&e->g, e->store, e->prefix, e->rank, e->n_ranks,
                                 cfg->socket_ifname, host, cfg->timeout_s, &err);
        if (st == ACCEL_EPEER && err.peer < 0) {
            st = accel__seterr(NULL, st, "%s", err.msg); /* another process's published failure */
        } else if (st != ACCEL_OK) {
            st = accel__seterr(NULL, st,
                               "gloo: process %d could not connect to the other %d processes "
                               "through the store at %s:%d (listening on %s): %s",
                               e->process[e->rank], e->n_ranks - 1, cfg->master_addr,
                               cfg->master_port,
                               cfg->socket_ifname != NULL ? cfg->socket_ifname : host, err.msg);
        }
    }
    if (st != ACCEL_OK && st != ACCEL_EPEER && e->store != NULL) {
        /* The others are waiting for this process: end their wait with the reason. */
        char key[sizeof(e->prefix) + 16], why[ACCEL__ERRMSG_NBYTES];
        snprintf(key, sizeof(key), "%ssetup_failed", e->prefix);
        snprintf(why, sizeof(why), "%s", accel_last_error(NULL));
        (void)accel__store_set(e->store, key, why, strlen(why));
        accel__seterr(NULL, st, "%s", why);
    }
    if (st != ACCEL_OK) {
        /* Process 0's server stays up so that the others fail on their own deadline with a
         * message, not on a vanished store. */
        if (serve) {
            accel__store_abandon(e->store);
            e->store = NULL;
        }
        accel__gloo_close(e);
        return st;
    }
    snprintf(e->listen, sizeof(e->listen), "%s",
             cfg->socket_ifname != NULL ? cfg->socket_ifname : host);
    accel__log(&e->log, ACCEL__LOG_INFO, "gloo: %d processes connected, listening on %s, store %s",
               e->n_ranks, cfg->socket_ifname != NULL ? cfg->socket_ifname : host,
               accel__store_name(e->store));
    *out = e;
    return ACCEL_OK;
}

/* ---- failures ---- */

/* Records the first failure of this communicator job-wide (first to the store wins) or adopts
 * the one recorded there, resets every connection so peers waiting on this rank fail at once,
 * and returns it with the message set. */
static accel_status fail(accel__gloo *e, accel_status st, const char *msg)
{
    pthread_mutex_lock(&e->mu);
    if (atomic_load(&e->broken)) {
        pthread_mutex_unlock(&e->mu);
        return accel__seterr(NULL, e->broken_st, "%s", e->broken_msg);
    }
    char rec[ACCEL__ERRMSG_NBYTES + 16];
    snprintf(rec, sizeof(rec), "%d|%s", (int)st, msg);
    char key[sizeof(e->prefix) + 8], mkey[sizeof(key) + 8];
    snprintf(key, sizeof(key), "%sabort", e->prefix);
    snprintf(mkey, sizeof(mkey), "%s/msg", key);
    int64_t first = 0;
    if (e->store != NULL && accel__store_add(e->store, key, 1, &first) == ACCEL_OK) {
        if (first == 1) {
            (void)accel__store_set(e->store, mkey, rec, strlen(rec));
        } else {
            /* Someone else saw it first: its record is the cause (written before the connection
             * resets that woke us, so a short wait is enough). */
            size_t got = 0;
            if (accel__store_get(e->store, mkey, rec, sizeof(rec) - 1, &got, 5.0) == ACCEL_OK) {
                rec[got] = '\0';
            }
        }
    }
    char *bar = strchr(rec, '|');
    e->broken_st = bar != NULL ? (accel_status)atoi(rec) : st;
    snprintf(e->broken_msg, sizeof(e->broken_msg), "%s", bar != NULL ? bar + 1 : msg);
    atomic_store(&e->broken, 1);
    pthread_mutex_unlock(&e->mu);
    accel__gloo_break(e->g);
    return accel__seterr(NULL, e->broken_st, "%s", e->broken_msg);
}

/* A failed Gloo call: the diagnosis naming the process at fault, recorded by fail(). */
static accel_status failed(accel__gloo *e, accel_status st, const accel__gloo_err *err,
                           const char *what)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    const int me = e->process[e->rank];
    if (err->peer >= 0 && st == ACCEL_EPEER) {
        snprintf(msg, sizeof(msg),
                 "gloo: process %d died or closed its connection to process %d during %s (%s)",
                 e->process[err->peer], me, what, err->msg);
    } else if (st == ACCEL_ETIMEDOUT) {
        snprintf(msg, sizeof(msg),
                 "gloo: %s on process %d timed out after %g s waiting for %s%d (%s)", what, me,
                 e->timeout_s, err->peer >= 0 ? "process " : "a peer, ",
                 err->peer >= 0 ? e->process[err->peer] : -1, err->msg);
    } else {
        snprintf(msg, sizeof(msg), "gloo: %s failed on process %d: %s", what, me, err->msg);
    }
    return fail(e, st, msg);
}

void accel__gloo_abort(accel__gloo *e, accel_status st, const char *msg)
{
    if (e == NULL) {
        return;
    }
    char m[ACCEL__ERRMSG_NBYTES];
    snprintf(m, sizeof(m), "gloo: process %d aborted the communicator: %s", e->process[e->rank],
             msg);
    (void)fail(e, st, m);
}

/* ---- the collectives ---- */

/* Scratch buffer i of at least nbytes. */
static accel_status scratch(accel__gloo *e, int i, size_t nbytes, void **out)
{
    if (e->scratch_nbytes[i] < nbytes) {
        void *p = accel__realloc(e->scratch[i], nbytes);
        if (p == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory for %zu bytes", nbytes);
        }
        e->scratch[i] = p;
        e->scratch_nbytes[i] = nbytes;
    }
    *out = e->scratch[i];
    return ACCEL_OK;
}

/* Calls a gloo_cxx function (its error out-parameter appended) and turns a failure into the
 * communicator's failure, returned from the caller. */
#define GLOO_CALL(what, fn, ...)                                                                   \
    do {                                                                                           \
        accel__gloo_err err_;                                                                      \
        accel_status st_ = fn(__VA_ARGS__, &err_);                                                 \
        if (st_ != ACCEL_OK) {                                                                     \
            return failed(e, st_, &err_, (what));                                                  \
        }                                                                                          \
    } while (0)

/* The reduction at the heart of allreduce / reduce_scatter / reduce: `data` holds n blocks (rank
 * q's at off[q], cnt[q] elements of dtype dt); rank q receives block q of every rank, reduces
 * them in rank order and writes its block to out_block. */
static accel_status reduce_blocks(accel__gloo *e, const accel__coll *op, accel_dtype dt,
                                  const void *data, const size_t *cnt, void *out_block,
                                  const char *what)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t es = accel_dtype_nbytes(dt), mine = cnt[me] * es;
    void *blocks = NULL;
    ACCEL_TRY(scratch(e, 0, mine * (size_t)n + 1, &blocks));
    for (int q = 0; q < n; q++) {
        e->send_nbytes[q] = cnt[q] * es;
        e->recv_nbytes[q] = mine;
        e->in[q] = (const char *)blocks + (size_t)q * mine;
    }
    GLOO_CALL(what, accel__gloo_alltoallv, e->g, data, e->send_nbytes, blocks, e->recv_nbytes);
    accel__reduce(dt, op->op, out_block, NULL, e->in, n, cnt[me], n);
    return ACCEL_OK;
}

/* Small allreduces (every input together at most this) travel whole in the call's envelope
 * (exchange() below): one round trip, every rank reducing all the inputs in rank order.
 * (Latency, not bandwidth, is what they cost.) */
#define ONESHOT_NBYTES ((size_t)64 << 10)

static int travels_inline(const accel__gloo *e, const accel__coll *op)
{
    return (op->kind == ACCEL__COLL_ALLREDUCE || op->kind == ACCEL__COLL_REDUCE) &&
           op->count * accel_dtype_nbytes(op->dtype) * (size_t)e->n_ranks <= ONESHOT_NBYTES;
}

/* The inputs that came in the envelopes (stride bytes apart, after each declaration). */
static void allreduce_inline(accel__gloo *e, const accel__coll *op, void *out, const char *env,
                             size_t stride, size_t head)
{
    const int n = e->n_ranks;
    for (int q = 0; q < n; q++) {
        e->in[q] = q == e->rank ? op->send : env + (size_t)q * stride + head;
    }
    if (op->wire != ACCEL_F32) {
        accel__reduce_wire(op->wire, op->op, out, NULL, e->in, n, op->count, n);
    } else {
        accel__reduce(op->dtype, op->op, out, NULL, e->in, n, op->count, n);
    }
}

/* Large allreduces: rank q owns chunk q; every rank sends chunk q of its input to q, q reduces
 * the n inputs in rank order and sends the reduced chunk to every rank (what a ring moves,
 * 2 (n-1)/n of the message per rank). The chunks travel as point-to-point messages in segments
 * of SEG_NBYTES, every receive posted first: segment k is reduced and sent on while k + 1
 * arrives, so the connections stay busy in both directions. (Gloo's alltoallv then allgatherv,
 * one message per peer each with a ready-notice round trip and an idle link between them,
 * reached 0.7 of Gloo's own ring over a 1 Gbit/s link: docs/performance.md.) */
#define SEG_NBYTES ((size_t)1 << 20)
/* Below 4 MiB, Gloo's alltoallv then allgatherv: on one host (TCP loopback) the point-to-point
 * messages cost 2-3x more per call from 64 KiB to 1 MiB, while over a 1 Gbit/s link they
 * gained from 1 MiB up (docs/performance.md, "gloo's allreduce over an emulated network"). */
#define PIPELINE_NBYTES ((size_t)4 << 20)
#define MAX_SEGS 64 /* segments per chunk at most (larger segments beyond): bounded messages */
enum { MSG_IN, MSG_OUT, MSG_IN_SEND, MSG_OUT_SEND, N_MSG }; /* per segment and peer */

static size_t seg_len(size_t cnt, size_t seg, size_t k)
{
    return k * seg >= cnt ? 0 : cnt - k * seg < seg ? cnt - k * seg : seg;
}

static accel_status pipelined(accel__gloo *e, const accel__coll *op, accel_dtype dt,
                              const char *data, char *result, const size_t *off, const char *what)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t es = accel_dtype_nbytes(dt), *cnt = e->cnt, mine = cnt[me];
    size_t per = 0;
    for (int q = 0; q < n; q++) {
        per = cnt[q] > per ? cnt[q] : per;
    }
    size_t seg = SEG_NBYTES / es;
    seg = (per + seg - 1) / seg > MAX_SEGS ? (per + MAX_SEGS - 1) / MAX_SEGS : seg;
    const size_t n_seg = (per + seg - 1) / seg;
    char *in = NULL;
    size_t *ix = NULL; /* message index of (segment, peer, kind); SIZE_MAX: none */
    ACCEL_TRY(scratch(e, 0, mine * es * (size_t)n + 1, (void **)&in));
    ACCEL_TRY(scratch(e, 2, n_seg * (size_t)n * N_MSG * sizeof(size_t), (void **)&ix));
    accel__gloo_msgs_begin(e->g);
#define IX(k, q, kind) ix[((k) * (size_t)n + (size_t)(q)) * N_MSG + (kind)]
#define POST(k, q, kind, buf, len)                                                                 \
    do {                                                                                           \
        IX(k, q, kind) = SIZE_MAX;                                                                 \
        if ((len) > 0) {                                                                           \
            GLOO_CALL(what, accel__gloo_post, e->g, (kind) >= MSG_IN_SEND, q,                      \
                      (uint32_t)((k)*2 + ((kind) == MSG_OUT || (kind) == MSG_OUT_SEND)),           \
                      (void *)(buf), (len)*es, &IX(k, q, kind));                                   \
        }                                                                                          \
    } while (0)
#define WAIT(k, q, kind)                                                                           \
    do {                                                                                           \
        if (IX(k, q, kind) != SIZE_MAX) {                                                          \
            GLOO_CALL(what, accel__gloo_wait, e->g, IX(k, q, kind));                               \
        }                                                                                          \
    } while (0)
    for (size_t k = 0; k < n_seg; k++) {
        for (int q = 0; q < n; q++) {
            IX(k, q, MSG_OUT_SEND) = SIZE_MAX;
            if (q != me) {
                POST(k, q, MSG_IN, in + ((size_t)q * mine + k * seg) * es, seg_len(mine, seg, k));
                POST(k, q, MSG_OUT, result + (off[q] + k * seg) * es, seg_len(cnt[q], seg, k));
            }
        }
    }
    for (size_t k = 0; k < n_seg; k++) {
        for (int q = 0; q < n; q++) {
            if (q != me) {
                POST(k, q, MSG_IN_SEND, data + (off[q] + k * seg) * es, seg_len(cnt[q], seg, k));
            }
        }
    }
    for (size_t k = 0; k < n_seg && k * seg < mine; k++) {
        const size_t len = seg_len(mine, seg, k);
        for (int q = 0; q < n; q++) {
            e->in[q] =
                q == me ? data + (off[me] + k * seg) * es : in + ((size_t)q * mine + k * seg) * es;
            if (q != me) {
                WAIT(k, q, MSG_IN);
            }
        }
        char *to = result + (off[me] + k * seg) * es;
        accel__reduce(dt, op->op, to, NULL, e->in, n, len, n);
        for (int q = 0; q < n; q++) {
            if (q != me) {
                POST(k, q, MSG_OUT_SEND, to, len);
            }
        }
    }
    for (size_t k = 0; k < n_seg; k++) {
        for (int q = 0; q < n; q++) {
            if (q != me) {
                WAIT(k, q, MSG_OUT);
                WAIT(k, q, MSG_IN_SEND);
                WAIT(k, q, MSG_OUT_SEND);
            }
        }
    }
#undef WAIT
#undef POST
#undef IX
    return ACCEL_OK;
}

/* Allreduce into out (the user's recv, or scratch for a non-root reduce), of inputs too large
 * to travel inline. */
static accel_status allreduce(accel__gloo *e, const accel__coll *op, void *out, const char *what)
{
    const int n = e->n_ranks;
    size_t *off = e->send_nbytes; /* here: the chunks' offsets, in elements */
    for (int q = 0; q < n; q++) {
        accel__chunk_range(op->count, n, q, &off[q], &e->cnt[q]);
    }
    /* A wire dtype: every input is rounded to it first, and the 16-bit blocks travel and reduce
     * (accel__reduce accumulates them in fp32 and rounds once: what accel__reduce_wire is). */
    const accel_dtype dt = op->wire != ACCEL_F32 ? op->wire : op->dtype;
    const size_t es = accel_dtype_nbytes(dt);
    const void *data = op->send;
    void *result = out;
    if (op->wire != ACCEL_F32) {
        void *w = NULL;
        ACCEL_TRY(scratch(e, 1, op->count * es + 1, &w));
        (op->wire == ACCEL_BF16 ? accel__f32_to_bf16_n : accel__f32_to_f16_n)(w, op->send,
                                                                              op->count);
        data = result = w;
    }
    if (op->count * es >= PIPELINE_NBYTES) {
        ACCEL_TRY(pipelined(e, op, dt, data, result, off, what));
    } else {
        char *mine = (char *)result + off[e->rank] * es; /* reduce_blocks reuses off's table */
        ACCEL_TRY(reduce_blocks(e, op, dt, data, e->cnt, mine, what));
        for (int q = 0; q < n; q++) {
            e->recv_nbytes[q] = e->cnt[q] * es;
        }
        GLOO_CALL(what, accel__gloo_allgatherv, e->g, NULL, result, e->recv_nbytes);
    }
    if (op->wire != ACCEL_F32) {
        (op->wire == ACCEL_BF16 ? accel__bf16_to_f32_n : accel__f16_to_f32_n)(out, result,
                                                                              op->count);
    }
    return ACCEL_OK;
}

/* ---- the envelope: every call's first exchange ---- */

/* A collective as every member declares it; fields that do not apply to the kind are 0. */
typedef struct call_desc {
    uint64_t count, total;
    int32_t kind, dtype, op, root, wire, pad;
} call_desc;

static call_desc describe(const accel__coll *op)
{
    const int reducing = op->kind == ACCEL__COLL_ALLREDUCE ||
                         op->kind == ACCEL__COLL_REDUCE_SCATTER || op->kind == ACCEL__COLL_REDUCE;
    const int rooted = op->kind == ACCEL__COLL_BROADCAST || op->kind == ACCEL__COLL_REDUCE ||
                       op->kind == ACCEL__COLL_GATHER;
    call_desc d;
    memset(&d, 0, sizeof(d));
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

static accel__coll undescribe(const call_desc *d)
{
    return (accel__coll){.kind = (accel__coll_kind)d->kind,
                         .count = d->count,
                         .total = d->total,
                         .dtype = (accel_dtype)d->dtype,
                         .op = (accel_reduce_op)d->op,
                         .root = d->root,
                         .wire = (accel_dtype)d->wire};
}

/* Every member sends every other an envelope: its declaration of the call, and for a small
 * allreduce (travels_inline) its input. The declarations are compared before any other data
 * moves: Gloo's transport aborts the process when a message is larger than the buffer posted
 * for it, so a mismatched call must never reach it. Envelopes are received into buffers of the
 * largest envelope's size, which a mismatched one fits too. Every member sees the same table
 * and fails alike (ACCEL_EINVAL, naming two calls), the connections untouched. One round trip
 * that is also the barrier, and a small allreduce's whole data movement; *env receives the
 * table (stride bytes per member). */
/* Posts the receives of call seq's envelopes (table seq % 2, stride st). */
static accel_status post_envelopes(accel__gloo *e, uint64_t seq, size_t st, const char *what)
{
    for (int q = 0; q < e->n_ranks; q++) {
        if (q != e->rank) {
            GLOO_CALL(what, accel__gloo_env_recv, e->g, seq, q, e->env[seq & 1] + (size_t)q * st,
                      st);
        }
    }
    return ACCEL_OK;
}

static accel_status exchange(accel__gloo *e, const accel__coll *op, const char *what, char **env,
                             size_t *stride)
{
    const int n = e->n_ranks, me = e->rank;
    const size_t head = sizeof(call_desc);
    const size_t st = (head + ONESHOT_NBYTES / (size_t)n + 7) & ~(size_t)7;
    const size_t payload = travels_inline(e, op) ? op->count * accel_dtype_nbytes(op->dtype) : 0;
    const uint64_t seq = e->env_seq;
    size_t *ix = NULL;
    ACCEL_TRY(scratch(e, 2, sizeof(size_t) * (size_t)n, (void **)&ix));
    if (e->env[0] == NULL) { /* the first call: later ones find their receives posted */
        e->env[0] = accel__malloc(2 * (size_t)n * st);
        if (e->env[0] == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "gloo: out of memory for envelopes");
        }
        e->env[1] = e->env[0] + (size_t)n * st;
        ACCEL_TRY(post_envelopes(e, seq, st, what));
    }
    char *all = e->env[seq & 1];
    call_desc mine = describe(op);
    memcpy(all + (size_t)me * st, &mine, head);
    if (payload > 0) {
        memcpy(all + (size_t)me * st + head, op->send, payload);
    }
    accel__gloo_msgs_begin(e->g);
    for (int q = 0; q < n; q++) {
        if (q != me) {
            GLOO_CALL(what, accel__gloo_env_send, e->g, seq, q, all + (size_t)me * st,
                      head + payload, &ix[q]);
        }
    }
    for (int q = 0; q < n; q++) {
        if (q != me) {
            GLOO_CALL(what, accel__gloo_env_wait, e->g, seq, q);
            GLOO_CALL(what, accel__gloo_wait, e->g, ix[q]);
        }
    }
    e->env_seq = seq + 1;
    ACCEL_TRY(post_envelopes(e, seq + 1, st, what));
    call_desc first;
    memcpy(&first, all, head);
    for (int q = 1; q < n; q++) {
        call_desc dq;
        memcpy(&dq, all + (size_t)q * st, head);
        if (memcmp(&dq, &first, head) != 0) {
            char a[160], b[160];
            accel__coll c0 = undescribe(&first), cq = undescribe(&dq);
            accel__coll_str(&c0, n, a, sizeof(a));
            accel__coll_str(&cq, n, b, sizeof(b));
            pthread_mutex_lock(&e->mu);
            e->broken_st = ACCEL_EINVAL;
            snprintf(e->broken_msg, sizeof(e->broken_msg),
                     "gloo: collective mismatch: process %d called %s, process %d called %s "
                     "(every process must make the same collective calls in the same order)",
                     e->process[0], a, e->process[q], b);
            atomic_store(&e->broken, 1);
            pthread_mutex_unlock(&e->mu);
            return accel__seterr(NULL, ACCEL_EINVAL, "%s", e->broken_msg);
        }
    }
    *env = all;
    *stride = st;
    return ACCEL_OK;
}

accel_status accel__gloo_run(accel__gloo *e, const accel__coll *op)
{
    if (atomic_load(&e->broken)) {
        return accel__seterr(NULL, e->broken_st, "%s", e->broken_msg);
    }
    char what[160];
    accel__coll_str(op, e->n_ranks, what, sizeof(what));
    char *env = NULL;
    size_t stride = 0;
    ACCEL_TRY(exchange(e, op, what, &env, &stride));
    const int n = e->n_ranks, me = e->rank;
    const size_t nb = op->count * accel_dtype_nbytes(op->dtype);
    if (travels_inline(e, op)) { /* the data came with the envelopes */
        if (op->kind == ACCEL__COLL_ALLREDUCE || me == op->root) {
            allreduce_inline(e, op, op->recv, env, stride, sizeof(call_desc));
        }
        return ACCEL_OK;
    }
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
        return allreduce(e, op, op->recv, what);
    case ACCEL__COLL_REDUCE: {
        void *out = op->recv;
        if (me != op->root) {
            ACCEL_TRY(scratch(e, 1, nb + 1, &out));
        }
        accel__coll ar = *op;
        ar.kind = ACCEL__COLL_ALLREDUCE;
        return allreduce(e, &ar, out, what);
    }
    case ACCEL__COLL_REDUCE_SCATTER: {
        for (int q = 0; q < n; q++) {
            e->cnt[q] = op->count;
        }
        return reduce_blocks(e, op, op->dtype, op->send, e->cnt, op->recv, what);
    }
    case ACCEL__COLL_ALLGATHER: {
        for (int q = 0; q < n; q++) {
            e->recv_nbytes[q] = nb;
        }
        const int in_place = op->send == (const char *)op->recv + (size_t)me * nb;
        GLOO_CALL(what, accel__gloo_allgatherv, e->g, in_place ? NULL : op->send, op->recv,
                  e->recv_nbytes);
        return ACCEL_OK;
    }
    case ACCEL__COLL_BROADCAST:
        if (me == op->root && op->send != op->recv && nb > 0) {
            memcpy(op->recv, op->send, nb);
        }
        GLOO_CALL(what, accel__gloo_broadcast, e->g, op->recv, nb, op->root);
        return ACCEL_OK;
    case ACCEL__COLL_GATHER: {
        const void *send = op->send;
        if (me == op->root && send == (const char *)op->recv + (size_t)me * nb) {
            void *copy =
                NULL; /* Gloo copies the root's own block with memcpy: no overlap allowed */
            ACCEL_TRY(scratch(e, 1, nb + 1, &copy));
            memcpy(copy, send, nb);
            send = copy;
        }
        GLOO_CALL(what, accel__gloo_gather, e->g, send, nb, op->recv, op->root);
        return ACCEL_OK;
    }
    case ACCEL__COLL_BARRIER: /* the exchange was one */
        return ACCEL_OK;
    }
    return accel__seterr(NULL, ACCEL_EINTERNAL, "gloo: unknown collective %d", (int)op->kind);
}

/* ---- the backend ---- */

/* World communicators made by this process: each gets its own keys in the store. */
static _Atomic unsigned n_worlds;

static accel_status gloo_init(const accel__comm_config *cfg, void **impl)
{
    char prefix[400];
    snprintf(prefix, sizeof(prefix), "%.300s/%d/gloo/w%u/", cfg->job_id != NULL ? cfg->job_id : "",
             cfg->restart_count, atomic_fetch_add(&n_worlds, 1));
    return accel__gloo_open((accel__gloo **)impl, cfg, prefix, !cfg->store_served && cfg->rank == 0,
                            NULL);
}

/* Each child connects its members under its own keys; then every member of the parent learns
 * every child's outcome (an allgather of statuses over the parent), so all fail or none. */
static accel_status gloo_split(void *impl, const accel__comm_split_info *how, void **child)
{
    accel__gloo *e = impl, *c = NULL;
    *child = NULL;
    const unsigned long long k = ++e->n_splits;
    int32_t *all = accel__calloc((size_t)e->n_ranks, sizeof(int32_t));
    int *process = how->cfg != NULL ? accel__calloc((size_t)how->cfg->n_ranks, sizeof(int)) : NULL;
    accel_status st =
        all == NULL || (how->cfg != NULL && process == NULL) ? ACCEL_ENOMEM : ACCEL_OK;
    if (st != ACCEL_OK) {
        accel__free(all);
        accel__free(process);
        return fail(e, st, "gloo: out of memory in accel__comm_split");
    }
    if (how->cfg != NULL) {
        char prefix[sizeof(e->prefix) + 48];
        snprintf(prefix, sizeof(prefix), "%ss%llu.%d/", e->prefix, k, how->color);
        for (int i = 0; i < how->cfg->n_ranks; i++) {
            process[i] = e->process[how->members[i]];
        }
        st = accel__gloo_open(&c, how->cfg, prefix, 0, process);
    }
    char mine[ACCEL__ERRMSG_NBYTES] = "";
    if (st != ACCEL_OK) {
        snprintf(mine, sizeof(mine), "%s", accel_last_error(NULL));
    }
    all[e->rank] = (int32_t)st;
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, &all[e->rank], all, 1, ACCEL_I32, ACCEL_SUM, 0);
    accel_status ex = accel__gloo_run(e, &op);
    for (int q = 0; q < e->n_ranks && ex == ACCEL_OK; q++) {
        if (all[q] != ACCEL_OK) {
            ex = q == e->rank ? accel__seterr(NULL, st, "%s", mine)
                              : accel__seterr(NULL, (accel_status)all[q],
                                              "accel__comm_split: process %d could not connect "
                                              "its group over gloo (%s)",
                                              e->process[q], accel_status_name(all[q]));
        }
    }
    accel__free(all);
    accel__free(process);
    if (ex != ACCEL_OK) {
        accel__gloo_close(c);
        return ex;
    }
    *child = c;
    return ACCEL_OK;
}

accel_status accel__gloo_split(accel__gloo *e, const accel__comm_split_info *how,
                               accel__gloo **child)
{
    void *c = NULL;
    accel_status st = gloo_split(e, how, &c);
    *child = c;
    return st;
}

void accel__gloo_describe(const accel__gloo *e, char *buf, size_t nbytes)
{
    snprintf(buf, nbytes, "gloo across %d processes, listening on %s", e->n_ranks, e->listen);
}

static void gloo_describe(void *impl, char *buf, size_t nbytes)
{
    accel__gloo_describe(impl, buf, nbytes);
}

static accel_status gloo_run(void *impl, const accel__coll *op)
{
    return accel__gloo_run(impl, op);
}

static void gloo_abort(void *impl, accel_status st, const char *msg)
{
    accel__gloo_abort(impl, st, msg);
}

static void gloo_destroy(void *impl)
{
    accel__gloo_close(impl);
}

const accel__comm_ops accel__gloo_ops = {
    .init = gloo_init,
    .split = gloo_split,
    .run = gloo_run,
    .abort = gloo_abort,
    .mem_alloc = accel__comm_plain_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = gloo_destroy,
    .describe = gloo_describe,
};
