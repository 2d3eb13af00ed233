/*
 * accel/check.h - ACCEL_CHECK for programs (examples, tools, training scripts), never the
 * library: on failure it prints file:line, the status name and the last error message, then
 * exits with status 1 (llm.c's cudaCheck idea). The library itself only returns statuses.
 *
 *     #include <accel/accel.h>     (the umbrella includes this header)
 *     ACCEL_CHECK(accel_init(&acc, &o));
 *
 * The message comes from accel_last_error(NULL): every failing accel call records its message
 * on the calling thread, so no handle has to be in scope.
 */
#ifndef ACCEL_CHECK_H
#define ACCEL_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "status.h"

#define ACCEL_CHECK(call)                                                                          \
    do {                                                                                           \
        accel_status accel_check_st_ = (call);                                                     \
        if (accel_check_st_ != ACCEL_OK) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                      \
                    accel_status_name(accel_check_st_), accel_last_error(NULL));                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* ACCEL_CHECK_H */
