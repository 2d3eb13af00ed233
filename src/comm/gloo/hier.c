/*
 * The hier composition's setup (its collectives are in hier_coll.c): a communicator's two
 * levels, shm over this machine's processes (a segment named with the job's key and the
 * machine) and gloo over the processes of this local rank on every machine (keys under the
 * job's key, the restart count and the local rank); the store served for the life of the
 * communicator by process 0 when no launcher serves it; and split into children that are grids
 * of machines x local ranks. A failure at any step of the setup aborts the level already made,
 * so every process fails, naming the process at fault.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "comm/shm.h"
#include "hier.h"

/* ---- setup ---- */

static void hier_destroy(void *impl)
{
    hier *h = impl;
    if (h == NULL) {
        return;
    }
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    if (h->shm != NULL) {
        accel__shm_ops.destroy(h->shm);
    }
    accel__gloo_close(h->cross);
    accel__store_close(h->store);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    accel__free(h->work);
    accel__free(h->process);
    accel__free(h);
}

static _Atomic unsigned n_worlds; /* hier communicators made by this process */

/* The job's key: ACCEL_JOB_ID, else a nonce process 0 publishes in the store. */
static accel_status job_key(hier *h, const accel__comm_config *cfg, const char *id, char *key,
                            size_t key_nbytes)
{
    if (cfg->job_id != NULL && cfg->job_id[0] != '\0') {
        snprintf(key, key_nbytes, "%s", cfg->job_id);
        return ACCEL_OK;
    }
    char name[96];
    snprintf(name, sizeof(name), "hier/%d/%s/nonce", cfg->restart_count, id);
    accel__store *st = h->store;
    accel__store_config sc = {
        .addr = cfg->master_addr, .port = cfg->master_port, .timeout_s = cfg->timeout_s};
    if (st == NULL) {
        ACCEL_TRY(accel__store_open(&st, &sc));
    }
    accel_status r;
    if (cfg->rank == 0) {
        r = accel__shm_nonce(key, key_nbytes);
        r = r != ACCEL_OK ? r : accel__store_set(st, name, key, strlen(key));
    } else {
        size_t n = 0;
        r = accel__store_get(st, name, key, key_nbytes - 1, &n, cfg->timeout_s);
        key[r == ACCEL_OK ? n : 0] = '\0';
    }
    if (st != h->store) {
        accel__store_close(st);
    }
    return r;
}

/* The keys' prefix of local rank k's gloo communicator across the machines. */
static void across_prefix(const hier *h, const accel__comm_config *cfg, const char *id, int k,
                          char *out, size_t out_nbytes)
{
    snprintf(out, out_nbytes, "%.200s/%d/hier/%s/l%d/", h->key, cfg->restart_count, id, k);
}

/* A process of this machine that a shm wait here times out on may be alive and waiting across
 * (for a stopped process of another machine): the shm level then waits for its diagnosis,
 * which comes after the gloo wait's grace and record, before claiming its own (shm.c, defer).
 * Without this, the processes of that machine would name their live neighbour. */
static void defer_inside(void *shm, double timeout_s)
{
    ((accel__shm *)shm)->defer_s = ACCEL__GLOO_GRACE_S(timeout_s) + ACCEL__STORE_RECORD_S + 0.5;
}

/* A communicator of cfg's layout whose shm segment and gloo keys are named with the job's key
 * and `id` (unique in the job). serve: this process runs the store (a world's process 0 without
 * a launcher's store). */
static accel_status hier_new(const accel__comm_config *cfg, const char *id, int serve, hier **out)
{
    const int L = cfg->local_n_ranks, l = cfg->local_rank;
    if (L < 1 || cfg->n_ranks % L != 0 || cfg->rank % L != l) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "hier: process %d (local rank %d of %d, %d processes) is not laid out "
                             "as machine * LOCAL_WORLD_SIZE + LOCAL_RANK with the same "
                             "LOCAL_WORLD_SIZE on every machine",
                             cfg->rank, l, L, cfg->n_ranks);
    }
    hier *h = accel__calloc(1, sizeof(*h));
    if (h == NULL || pthread_mutex_init(&h->mu, NULL) != 0) {
        accel__free(h);
        return accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory");
    }
    pthread_cond_init(&h->cv, NULL);
    h->rank = cfg->rank;
    h->n_ranks = cfg->n_ranks;
    h->l = l;
    h->L = L;
    h->node = cfg->rank / L;
    h->n_nodes = cfg->n_ranks / L;
    h->process = accel__calloc((size_t)h->n_ranks, sizeof(int));
    int *across_process = accel__calloc((size_t)h->n_nodes, sizeof(int));
    accel_status st = ACCEL_OK;
    if (h->process == NULL || across_process == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory");
    }
    for (int r = 0; st == ACCEL_OK && r < h->n_ranks; r++) {
        h->process[r] = cfg->process_base + r;
    }
    /* Without a launcher's store, process 0 serves it for the life of the communicator. */
    if (st == ACCEL_OK && serve) {
        accel__store_config sc = {.addr = cfg->master_addr,
                                  .port = cfg->master_port,
                                  .serve = 1,
                                  .timeout_s = cfg->timeout_s};
        st = accel__store_open(&h->store, &sc);
    }
    if (st == ACCEL_OK) {
        st = job_key(h, cfg, id, h->key, sizeof(h->key));
    }
    /* Across: local rank l of every machine, under prefix (one per local rank). */
    char prefix[400] = "";
    accel__comm_config x = *cfg;
    x.rank = h->node;
    x.n_ranks = h->n_nodes;
    x.local_rank = 0;
    x.local_n_ranks = 1;
    if (st == ACCEL_OK) {
        across_prefix(h, cfg, id, l, prefix, sizeof(prefix));
    }
    int across_tried = 0;
    if (st == ACCEL_OK) {
        /* Inside: this machine's processes, the segment named with the machine. */
        char inner_id[256];
        snprintf(inner_id, sizeof(inner_id), "%.100s-n%d-%s", h->key, h->node, id);
        accel__comm_config in = *cfg;
        in.rank = l;
        in.n_ranks = L;
        in.job_id = inner_id;
        in.process_base = h->process[h->node * L];
        st = accel__shm_ops.init(&in, &h->shm);
    }
    if (st == ACCEL_OK) {
        defer_inside(h->shm, cfg->timeout_s);
    }
    if (st == ACCEL_OK) {
        for (int m = 0; m < h->n_nodes; m++) {
            across_process[m] = h->process[m * L + l];
        }
        across_tried = 1;
        st = accel__gloo_open(&h->cross, &x, prefix, 0, across_process);
    }
    accel__free(across_process);
    if (st != ACCEL_OK) {
        if (h->shm != NULL) {
            accel__shm_ops.abort(h->shm, st, accel_last_error(NULL));
        }
        if (!across_tried && prefix[0] != '\0') {
            /* The other machines' processes of this local rank wait in its rendezvous. */
            accel__gloo_refuse(&x, prefix, st);
        }
        char msg[ACCEL__ERRMSG_NBYTES];
        snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL));
        if (h->store != NULL) {
            /* Every local rank's rendezvous polls this store: await each member's word. */
            const double until = accel__now() + ACCEL__GLOO_SEEN_WAIT(cfg->timeout_s);
            for (int k = 0; k < L && prefix[0] != '\0'; k++) {
                char other[sizeof(prefix)];
                across_prefix(h, cfg, id, k, other, sizeof(other));
                accel__gloo_await_seen(h->store, other, h->n_nodes, k == l ? h->node : -1, until);
            }
            accel__store_abandon(h->store); /* the others read their failures there */
            h->store = NULL;
        }
        hier_destroy(h);
        return accel__seterr(NULL, st, "%s", msg);
    }
    accel__log(&cfg->log, ACCEL__LOG_INFO,
               "hier: machine %d of %d, local rank %d of %d: shm inside, gloo across", h->node,
               h->n_nodes, l, L);
    *out = h;
    return ACCEL_OK;
}

static accel_status hier_init(const accel__comm_config *cfg, void **impl)
{
    char id[32];
    snprintf(id, sizeof(id), "w%u", atomic_fetch_add(&n_worlds, 1));
    return hier_new(cfg, id, !cfg->store_served && cfg->rank == 0, (hier **)impl);
}

static void hier_abort(void *impl, accel_status st, const char *msg)
{
    hier *h = impl;
    accel__shm_ops.abort(h->shm, st, msg);
    accel__gloo_abort(h->cross, st, msg);
}

static void hier_describe(void *impl, char *buf, size_t nbytes)
{
    hier *h = impl;
    char across[160];
    accel__gloo_describe(h->cross, across, sizeof(across));
    snprintf(buf, nbytes,
             "shm within a machine (%d processes), %s (one per machine, local rank %d)", h->L,
             across, h->l);
}

/* ---- split ---- */

/* Whether a child's members (parent ranks in child rank order) form a grid of machines x local
 * ranks: the same local ranks, in the same order, on each of its machines, ranked machine by
 * machine (in any order of the machines), so that the child is itself laid out as machine * L'
 * + local rank. Its machines and local ranks (in child order) go to nodes / locals. A machine
 * cannot come twice: its members would repeat. */
static int grid_of(const hier *h, const int *members, int n, int *nodes, int *n_nodes, int *locals,
                   int *n_locals)
{
    int nn = 0, nl = 0;
    for (int i = 0; i < n && members[i] / h->L == members[0] / h->L; i++) {
        locals[nl++] = members[i] % h->L;
    }
    if (n % nl != 0) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (i % nl == 0) {
            nodes[nn++] = members[i] / h->L;
        }
        if (members[i] != nodes[nn - 1] * h->L + locals[i % nl]) {
            return 0;
        }
    }
    *n_nodes = nn;
    *n_locals = nl;
    return 1;
}

/*
 * A child that is a grid of machines x local ranks (a machine's processes, the processes of one
 * local rank on every machine, or any such product) is a hier communicator of its own: its shm
 * level split from this machine's segment, its gloo level from this local rank's. Every process
 * first agrees (over the parent) that every child is such a grid, so either all split or all
 * refuse.
 */
static accel_status hier_split(void *impl, const accel__comm_split_info *how, void **child)
{
    hier *h = impl, *c = NULL;
    *child = NULL;
    const int n = how->cfg != NULL ? how->cfg->n_ranks : 0;
    int *nodes = accel__calloc((size_t)h->n_nodes + 1, sizeof(int));
    int *locals = accel__calloc((size_t)h->L + 1, sizeof(int));
    int32_t ok = nodes != NULL && locals != NULL, all_ok = 0;
    int nn = 0, nl = 0;
    if (ok && n > 0) {
        ok = grid_of(h, how->members, n, nodes, &nn, locals, &nl);
    }
    accel__coll agree =
        ACCEL__COLL(ACCEL__COLL_ALLREDUCE, &ok, &all_ok, 1, ACCEL_I32, ACCEL_MIN, 0);
    accel_status st = accel__hier_run(h, &agree);
    if (st == ACCEL_OK && !all_ok) {
        st = accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                           "backend hier splits only into grids of machines x local ranks (the "
                           "same local ranks on each of the child's machines, ranked machine by "
                           "machine); use ACCEL_BACKEND=gloo for other groups");
    }
    accel__comm_config in_cfg, x_cfg;
    void *in_child = NULL;
    accel__gloo *x_child = NULL;
    int me = -1;
    for (int i = 0; i < n; i++) {
        me = how->members[i] == h->rank ? i : me;
    }
    /* The shm level: this machine's members (local ranks = the parent segment's ranks). */
    if (st == ACCEL_OK) {
        accel__comm_split_info in = {how->color, me, NULL, NULL};
        if (n > 0) {
            in_cfg = *how->cfg;
            in_cfg.rank = me % nl;
            in_cfg.n_ranks = nl;
            in.cfg = &in_cfg;
            in.members = locals;
        }
        st = accel__shm_ops.split(h->shm, &in, &in_child);
    }
    /* The gloo level: this local rank's members (machines = the parent's gloo ranks). */
    if (st == ACCEL_OK) {
        accel__comm_split_info x = {how->color, me, NULL, NULL};
        if (n > 0) {
            x_cfg = *how->cfg;
            x_cfg.rank = me / nl;
            x_cfg.n_ranks = nn;
            x_cfg.local_rank = 0;
            x_cfg.local_n_ranks = 1;
            x.cfg = &x_cfg;
            x.members = nodes;
        }
        st = accel__gloo_split(h->cross, &x, &x_child);
    }
    if (st == ACCEL_OK && n > 0) {
        c = accel__calloc(1, sizeof(*c));
        int *process = accel__calloc((size_t)n, sizeof(int));
        if (c == NULL || process == NULL || pthread_mutex_init(&c->mu, NULL) != 0) {
            accel__free(c);
            accel__free(process);
            c = NULL;
            st = accel__seterr(NULL, ACCEL_ENOMEM, "hier: out of memory");
        } else {
            for (int i = 0; i < n; i++) {
                process[i] = h->process[how->members[i]];
            }
            c->process = process;
            pthread_cond_init(&c->cv, NULL);
            c->rank = me;
            c->n_ranks = n;
            c->l = me % nl;
            c->L = nl;
            c->node = me / nl;
            c->n_nodes = nn;
            c->shm = in_child;
            defer_inside(in_child, how->cfg->timeout_s);
            c->cross = x_child;
            in_child = NULL;
            x_child = NULL;
        }
    }
    if (in_child != NULL) {
        accel__shm_ops.destroy(in_child);
    }
    accel__gloo_close(x_child);
    accel__free(nodes);
    accel__free(locals);
    if (st != ACCEL_OK) {
        return st;
    }
    *child = c;
    return ACCEL_OK;
}

const accel__comm_ops accel__hier_ops = {
    .init = hier_init,
    .split = hier_split,
    .run = accel__hier_run,
    .abort = hier_abort,
    .mem_alloc = accel__hier_mem_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = hier_destroy,
    .describe = hier_describe,
};
