/*
 * Staging of device-memory buffers for the public buffer collectives (coll_stage.c): on a
 * process that computes on a GPU, buffers in its memory go through pinned host memory, since
 * the host backends read host memory only.
 */
#ifndef ACCEL_CORE_COLL_STAGE_H
#define ACCEL_CORE_COLL_STAGE_H

#include "comm/comm.h"
#include "internal.h"

/* One staged call: the host region and where its result goes back to. */
typedef struct accel__coll_staging {
    void *host;      /* the pinned region, NULL when nothing is staged */
    int pooled;      /* host is acc's cached buffer */
    void *recv_dev;  /* the caller's recv in device memory, NULL when recv is not staged */
    void *recv_host; /* its stand-in in host */
    size_t recv_n;   /* bytes this process receives */
} accel__coll_staging;

/*
 * Before the call `fn` (kind, count, dtype, root as the public function's arguments): when
 * *send or *recv is device memory, copies what the call reads to host memory and replaces the
 * pointers by their host stand-ins; otherwise changes nothing. async: a work handle was asked
 * for (refused with ACCEL_EUNSUPPORTED for device buffers). Errors are set on acc; sg is then
 * empty.
 */
accel_status accel__coll_stage_begin(accel *acc, const char *fn, accel__coll_kind kind,
                                     size_t count, accel_dtype dt, int root, int async,
                                     const void **send, void **recv, accel__coll_staging *sg);
/* After the call, whose status is st: when it succeeded, copies the result back to the
 * caller's device recv. Releases the host region; returns st or the copy's failure. */
accel_status accel__coll_stage_end(accel *acc, const char *fn, accel__coll_staging *sg,
                                   accel_status st);
/* Tests: treat every buffer as device memory, so the CPU runs the staging path (copies are
 * memcpy there). */
void accel__coll_force_staging(int on);

#endif /* ACCEL_CORE_COLL_STAGE_H */
