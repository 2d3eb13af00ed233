/*
 * The one-process backend: every collective is a copy (or nothing when in place), so code
 * written for N processes runs unchanged with N = 1.
 */
#include <string.h>

#include "comm.h"
#include "core/internal.h"

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
    if (op->kind == ACCEL__COLL_BARRIER || op->recv == NULL || op->send == op->recv ||
        nbytes == 0) {
        return ACCEL_OK;
    }
    memmove(op->recv, op->send, nbytes);
    return ACCEL_OK;
}

static void self_destroy(accel__comm *c, void *impl)
{
    (void)c;
    (void)impl;
}

const accel__comm_backend accel__backend_self = {"self", self_init, self_run, self_destroy};
