/*
 * The shm backend's operations (accel__comm_ops): setup and teardown (shm_setup.c), one
 * collective (shm_coll.c), symmetric memory (shm_sym.c), abort, and split.
 *
 * Split: each child gets its own segment, named from a fresh random nonce that its rank 0 makes
 * and hands to the other members through an allgather over the parent, so no outsider can
 * predict or plant the name. Every step that could fail on one rank only is followed by an
 * allgather of statuses over the parent, so every member of the parent takes the same branch:
 * either all of them leave with their child (or none, for color < 0), or all fail, naming the
 * process at fault. Nobody ever waits for a segment that will not appear.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "shm.h"

static accel_status shm_init(const accel__comm_config *cfg, void **impl)
{
    accel__shm *s;
    ACCEL_TRY(accel__shm_open(&s, cfg));
    *impl = s;
    return ACCEL_OK;
}

static accel_status shm_run(void *impl, const accel__coll *op)
{
    return accel__shm_run(impl, op);
}

static void shm_destroy(void *impl)
{
    accel__shm_close(impl);
}

static accel_status shm_alloc(void *impl, size_t nbytes, void **out)
{
    return accel__shm_alloc(impl, nbytes, out);
}

static accel_status shm_free(void *impl, void *p)
{
    return accel__shm_free(impl, p);
}

/* The job-wide abort word of this communicator's segment, naming this rank, with the status
 * and message in its line for the peers' messages. */
static void shm_abort(void *impl, accel_status st, const char *msg)
{
    accel__shm *s = impl;
    accel__shm_line *l = &s->lines[s->rank];
    l->abort_status = (int32_t)st;
    snprintf(l->abort_msg, sizeof(l->abort_msg), "%s", msg);
    accel__shm_abort(s, ACCEL__SHM_ABORTED, s->rank, 0);
}

/* ---- split ---- */

/* What each process tells the parent during a split: its child's nonce (from the child's rank
 * 0; empty elsewhere) and the status of its last step. */
typedef struct split_rec {
    char nonce[40];
    int32_t status;
    int32_t pad;
} split_rec;

static accel_status exchange(accel__shm *s, split_rec *all, const split_rec *mine)
{
    all[s->rank] = *mine;
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLGATHER, &all[s->rank], all, sizeof(*mine), ACCEL_U8,
                                 ACCEL_SUM, 0);
    return accel__shm_run(s, &op);
}

/* After an exchange: ACCEL_OK when every process's step succeeded, else the failure (this
 * process's own, whose message is set, or the first other's, named). */
static accel_status agreed(const accel__shm *s, const split_rec *all, accel_status mine,
                           const char *step)
{
    for (int q = 0; q < s->n_ranks; q++) {
        if (all[q].status != ACCEL_OK) {
            if (q == s->rank) {
                return mine;
            }
            return accel__seterr(NULL, (accel_status)all[q].status,
                                 "accel__comm_split: process %d could not %s its group's "
                                 "segment (%s)",
                                 q, step, accel_status_name((accel_status)all[q].status));
        }
    }
    return ACCEL_OK;
}

static accel_status shm_split(void *impl, const accel__comm_split_info *how, void **child)
{
    accel__shm *s = impl;
    *child = NULL;
    split_rec *all = accel__calloc((size_t)s->n_ranks, sizeof(*all));
    if (all == NULL) {
        /* The others are entering the exchange: fail them rather than let them wait. */
        shm_abort(s, ACCEL_ENOMEM, "out of memory in accel__comm_split");
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel__comm_split: out of memory");
    }
    split_rec mine;
    memset(&mine, 0, sizeof(mine));
    accel__shm *cs = NULL;
    accel_status st = ACCEL_OK;
    const int in_child = how->cfg != NULL, leader = in_child && how->cfg->rank == 0;
    if (leader) {
        st = accel__shm_nonce(mine.nonce, sizeof(mine.nonce));
        if (st == ACCEL_OK) {
            st = accel__shm_child(&cs, s, how->cfg, mine.nonce);
        }
        mine.status = (int32_t)st;
    }
    accel_status ex = exchange(s, all, &mine);
    st = ex != ACCEL_OK ? ex : agreed(s, all, st, "create");
    if (st == ACCEL_OK) {
        /* Every child's segment exists: the others open their rank 0's. */
        const split_rec created_by = in_child ? all[how->members[0]] : mine;
        memset(&mine, 0, sizeof(mine));
        if (in_child && !leader) {
            st = accel__shm_child(&cs, s, how->cfg, created_by.nonce);
        }
        if (st == ACCEL_OK && cs != NULL) {
            (void)accel__shm_attach_child(cs);
        }
        mine.status = (int32_t)st;
        ex = exchange(s, all, &mine);
        st = ex != ACCEL_OK ? ex : agreed(s, all, st, "join");
    }
    accel__free(all);
    if (st != ACCEL_OK) {
        accel__shm_close(cs); /* removes a name nobody will attach to */
        return st;
    }
    *child = cs;
    return ACCEL_OK;
}

const accel__comm_ops accel__shm_ops = {
    .init = shm_init,
    .split = shm_split,
    .run = shm_run,
    .abort = shm_abort,
    .mem_alloc = shm_alloc,
    .mem_free = shm_free,
    .destroy = shm_destroy,
};
