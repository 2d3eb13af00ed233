/*
 * The one-process backend: every collective is a copy (or nothing when in place), so code
 * written for N processes runs unchanged with N = 1. Reductions still go through the kernels
 * (with one input) so that BOOL results are normalised to 0/1 exactly as with N processes.
 */
#include <string.h>

#include "comm.h"
#include "base/base.h"
#include "reduce.h"

/* A non-NULL endpoint (the front end treats impl as opaque; NULL would read as "no child"). */
static char endpoint;

static accel_status self_init(const accel__comm_config *cfg, void **impl)
{
    if (cfg->n_ranks != 1) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "backend \"self\" runs one process, but the job has %d", cfg->n_ranks);
    }
    *impl = &endpoint;
    return ACCEL_OK;
}

/* The one process is alone in its child, or in none. */
static accel_status self_split(void *impl, const accel__comm_split_info *how, void **child)
{
    *child = how->cfg != NULL ? impl : NULL;
    return ACCEL_OK;
}

static accel_status self_run(void *impl, const accel__coll *op)
{
    (void)impl;
    size_t nbytes = op->count * accel_dtype_nbytes(op->dtype);
    if (op->kind == ACCEL__COLL_BARRIER || op->recv == NULL || nbytes == 0) {
        return ACCEL_OK;
    }
    switch (op->kind) {
    case ACCEL__COLL_ALLREDUCE:
    case ACCEL__COLL_REDUCE_SCATTER:
    case ACCEL__COLL_REDUCE: {
        const void *in[1] = {op->send};
        if (op->wire != ACCEL_F32) {
            accel__reduce_wire(op->wire, op->op, op->recv, NULL, in, 1, op->count, 1);
        } else {
            accel__reduce(op->dtype, op->op, op->recv, NULL, in, 1, op->count, 1);
        }
        return ACCEL_OK;
    }
    default:
        if (op->send != op->recv) {
            memmove(op->recv, op->send, nbytes);
        }
        return ACCEL_OK;
    }
}

static void self_destroy(void *impl)
{
    (void)impl;
}

/* Symmetric memory of one process is plain memory. */
accel_status accel__comm_plain_alloc(void *impl, size_t nbytes, void **out)
{
    (void)impl;
    void *p = accel__aligned_alloc(nbytes > 0 ? nbytes : 64);
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_alloc_shared: out of memory for %zu bytes",
                             nbytes);
    }
    memset(p, 0, nbytes);
    *out = p;
    return ACCEL_OK;
}

accel_status accel__comm_plain_free(void *impl, void *p)
{
    (void)impl;
    accel__aligned_free(p);
    return ACCEL_OK;
}

const accel__comm_ops accel__self_ops = {
    .init = self_init,
    .split = self_split,
    .run = self_run,
    .mem_alloc = accel__comm_plain_alloc,
    .mem_free = accel__comm_plain_free,
    .destroy = self_destroy,
};
