/*
 * Communicator front end, part 3: the calls that need the communicator idle: split into
 * sub-communicators, and symmetric memory.
 *
 * Split: every member contributes (color, key, node) through one allgather over the parent, so
 * every member computes the same membership (children ranked by key, then parent rank), then
 * the backend builds the children collectively over the parent and agrees on the outcome there,
 * so either every member gets its child or every member fails.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "comm_impl.h"

/* Members of `color` (parent ranks) ranked by (key, parent rank), from the gathered triples. */
static int members_of(const int32_t *all, int n, int color, int *members)
{
    int m = 0;
    for (int q = 0; q < n; q++) {
        if (color >= 0 && all[3 * q] == color) {
            /* Insertion keeps equal keys in parent-rank order (q grows). */
            int i = m++;
            while (i > 0 && all[3 * members[i - 1] + 1] > all[3 * q + 1]) {
                members[i] = members[i - 1];
                i--;
            }
            members[i] = q;
        }
    }
    return m;
}

/* The child's config: rank and size in the child; local_* over members on this machine. */
static void child_config(const accel__comm *c, const int32_t *all, const int *members, int m,
                         accel__comm_config *out)
{
    const int me = c->cfg.rank;
    const int32_t node = all[3 * me + 2];
    *out = c->cfg;
    out->job_id = "";
    out->process_base = 0;
    out->local_n_ranks = 0;
    for (int i = 0; i < m; i++) {
        if (members[i] == me) {
            out->rank = i;
            out->local_rank = out->local_n_ranks;
        }
        out->local_n_ranks += all[3 * members[i] + 2] == node;
    }
    out->n_ranks = m;
}

accel_status accel__comm_split(accel__comm *c, int color, int key, accel__comm **child)
{
    if (c == NULL || child == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__comm_split: %s is NULL",
                             c == NULL ? "communicator" : "child");
    }
    *child = NULL;
    if (c->be->ops->split == NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "backend %s cannot split communicators",
                             c->be->name);
    }
    const int n = c->cfg.n_ranks, me = c->cfg.rank;
    int32_t *all = accel__calloc((size_t)n * 3, sizeof(*all));
    int *members = accel__calloc((size_t)n, sizeof(*members));
    if (all == NULL || members == NULL) {
        accel__free(all);
        accel__free(members);
        /* The peers are entering the exchange: make them fail rather than wait for us. */
        accel__comm_abort(c, ACCEL_ENOMEM, "out of memory in accel__comm_split");
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel__comm_split: out of memory");
    }
    /* The node of a process: the first rank of its machine (accel launch numbers the processes
     * of a machine consecutively). */
    all[3 * me] = color < 0 ? -1 : color;
    all[3 * me + 1] = key;
    all[3 * me + 2] = me - c->cfg.local_rank;
    accel__coll ex =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, all + 3 * me, all, 3, ACCEL_I32, ACCEL_SUM, 0);
    accel_status st = accel__comm_run(c, &ex);
    accel__comm_config cfg;
    int m = 0;
    if (st == ACCEL_OK) {
        m = members_of(all, n, color, members);
        child_config(c, all, members, m, &cfg);
        st = accel__comm_claim_idle(c, "accel__comm_split", 1);
    }
    void *impl = NULL;
    if (st == ACCEL_OK) {
        accel__comm_split_info how = {color, key, color >= 0 ? &cfg : NULL,
                                      color >= 0 ? members : NULL};
        st = c->be->ops->split(c->impl, &how, &impl);
        if (st == ACCEL_EPEER || st == ACCEL_ETIMEDOUT) {
            pthread_mutex_lock(&c->mu);
            accel__comm_mark_broken(c, st, accel_last_error(NULL));
            pthread_mutex_unlock(&c->mu);
        }
        accel__comm_release(c);
    }
    if (st == ACCEL_OK && impl != NULL) {
        char name[64];
        snprintf(name, sizeof(name), "%.40s/%d", c->name, color);
        st = accel__comm_wrap(child, &cfg, c->be, impl, name);
    }
    accel__free(all);
    accel__free(members);
    return st;
}

/* ---- symmetric memory ---- */

accel_status accel__comm_alloc(accel__comm *c, size_t nbytes, void **out)
{
    if (c == NULL || out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_alloc_shared: %s is NULL",
                             c == NULL ? "communicator" : "out");
    }
    if (c->be->ops->mem_alloc == NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "accel_alloc_shared: backend %s has no shared memory", c->be->name);
    }
    ACCEL_TRY(accel__comm_claim_idle(c, "accel_alloc_shared", 1));
    accel_status st = c->be->ops->mem_alloc(c->impl, nbytes, out);
    /* A lost peer breaks the communicator; failures every process saw alike (no memory,
     * different sizes) do not. Processes at different calls abort the job in the backend. */
    if (st == ACCEL_EPEER || st == ACCEL_ETIMEDOUT) {
        pthread_mutex_lock(&c->mu);
        accel__comm_mark_broken(c, st, accel_last_error(NULL));
        pthread_mutex_unlock(&c->mu);
    }
    accel__comm_release(c);
    return st;
}

accel_status accel__comm_dealloc(accel__comm *c, void *p)
{
    if (c == NULL || p == NULL || c->be->ops->mem_free == NULL) {
        return c == NULL && p != NULL
                   ? accel__seterr(NULL, ACCEL_EINVAL, "accel_free_shared: communicator is NULL")
                   : ACCEL_OK;
    }
    ACCEL_TRY(accel__comm_claim_idle(c, "accel_free_shared", 0));
    accel_status st = c->be->ops->mem_free(c->impl, p);
    accel__comm_release(c);
    return st;
}
