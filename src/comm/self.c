/*
 * The one-process backend: every collective is a copy (or nothing when in place), so code
 * written for N processes runs unchanged with N = 1. Reductions still go through the kernels
 * (with one input) so that BOOL results are normalised to 0/1 exactly as with N processes.
 */
#include <string.h>

#include "comm.h"
#include "base/base.h"
#include "reduce.h"

static accel_status self_init(accel__comm *c, void **impl)
{
    (void)c;
    *impl = NULL;
    return ACCEL_OK;
}

static accel_status self_run(accel__comm *c, void *impl, const accel__coll *op)
{
    (void)c;
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
        accel__reduce(op->dtype, op->op, op->recv, NULL, in, 1, op->count, 1);
        return ACCEL_OK;
    }
    default:
        if (op->send != op->recv) {
            memmove(op->recv, op->send, nbytes);
        }
        return ACCEL_OK;
    }
}

static void self_destroy(accel__comm *c, void *impl)
{
    (void)c;
    (void)impl;
}

/* Symmetric memory of one process is plain memory. */
static accel_status self_alloc(accel__comm *c, void *impl, size_t nbytes, void **out)
{
    (void)c;
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

static accel_status self_dealloc(accel__comm *c, void *impl, void *p)
{
    (void)c;
    (void)impl;
    accel__aligned_free(p);
    return ACCEL_OK;
}

const accel__comm_backend accel__backend_self = {"self",     self_init,    self_run, self_destroy,
                                                 self_alloc, self_dealloc, 0};
