/*
 * dispatch_batches (Accelerate's DataLoaderDispatcher): process 0 reads, the others receive.
 * Placeholder until the broadcast path lands: preparing a loader with dispatch on several
 * processes is refused with ACCEL_EUNSUPPORTED rather than yielding wrong data.
 */
#include "data_internal.h"

accel_status accel__dispatch_new(accel_loader *l, accel__dispatch **out)
{
    (void)l;
    (void)out;
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                         "loader: dispatch_batches is not implemented yet; set "
                         "dispatch_batches = 0");
}

void accel__dispatch_free(accel__dispatch *d)
{
    (void)d;
}

accel_status accel__dispatch_begin(accel_loader *l)
{
    (void)l;
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "loader: dispatch_batches not implemented");
}

accel_status accel__dispatch_next(accel_loader *l, accel_batch **out, int *last)
{
    (void)l;
    (void)out;
    (void)last;
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "loader: dispatch_batches not implemented");
}

int64_t accel__dispatch_len(const accel_loader *l)
{
    (void)l;
    return -1;
}
