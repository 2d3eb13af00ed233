/*
 * The public face of symmetric shared memory (accel_alloc_shared / accel_free_shared in
 * accel/collectives.h): argument checks and error adoption around accel__comm_alloc, which
 * orders the allocation with the collectives and hands it to the backend (shm_sym.c, self.c).
 */
#include "accel/collectives.h"
#include "comm/comm.h"
#include "internal.h"

accel_status accel_alloc_shared(accel *acc, size_t nbytes, void **out)
{
    if (acc == NULL || out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_alloc_shared: %s is NULL",
                             acc == NULL ? "accelerator" : "out");
    }
    void *p = NULL;
    accel_status st = accel__comm_alloc(acc->comm, nbytes, &p);
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(acc, st);
    }
    *out = p;
    return ACCEL_OK;
}

accel_status accel_free_shared(accel *acc, void *p)
{
    if (p == NULL) {
        return ACCEL_OK;
    }
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_free_shared: accelerator is NULL");
    }
    return accel__adopt_thread_error(acc, accel__comm_dealloc(acc->comm, p));
}
