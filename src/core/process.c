/*
 * What a program asks the accelerator after accel_init: its process state (index, layout,
 * device, backend, precision; Accelerate's state repr stays in accel.c) and process control (print on the main
 * process, barriers, main-process-first regions, run-on-process helpers). Every query is a
 * cheap read of fields accel_init set.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "device/device.h"
#include "internal.h"

/* ---- state queries ---- */

/* A NULL handle reads as "no process" (index -1, counts and flags 0, "" for names), as the
 * other getters of the API answer for NULL (accel_loader_len -1, accel_model_numel 0): a
 * query has no status to fail with, and must not crash. */

int accel_process_index(const accel *acc)
{
    return acc ? acc->rank : -1;
}
int accel_local_process_index(const accel *acc)
{
    return acc ? acc->local_rank : -1;
}
int accel_num_processes(const accel *acc)
{
    return acc ? acc->n_ranks : 0;
}
int accel_local_num_processes(const accel *acc)
{
    return acc ? acc->local_n_ranks : 0;
}
int accel_is_main_process(const accel *acc)
{
    return acc && acc->rank == 0;
}
int accel_is_local_main_process(const accel *acc)
{
    return acc && acc->local_rank == 0;
}
int accel_is_last_process(const accel *acc)
{
    return acc && acc->rank == acc->n_ranks - 1;
}
int accel_use_distributed(const accel *acc)
{
    return acc && acc->dist_type != ACCEL_DIST_NO && acc->n_ranks > 1;
}
accel_distributed_type accel_distributed_type_of(const accel *acc)
{
    return acc ? acc->dist_type : ACCEL_DIST_NO;
}
const char *accel_distributed_type_name(accel_distributed_type t)
{
    switch (t) {
    case ACCEL_DIST_NO:
        return "NO";
    case ACCEL_DIST_MULTI_CPU:
        return "MULTI_CPU";
    case ACCEL_DIST_MULTI_GPU:
        return "MULTI_GPU";
    }
    return "UNKNOWN";
}
accel_device accel_device_of(const accel *acc)
{
    accel_device cpu = {ACCEL_DEVICE_CPU, 0};
    return acc ? acc->device : cpu;
}
const char *accel_device_name(const accel *acc)
{
    return acc ? acc->device_name : "";
}
const char *accel_backends_built(void)
{
    return accel__comm_backends_built();
}

const char *accel_backend_name(const accel *acc)
{
    return acc ? acc->backend : "";
}
accel_precision accel_mixed_precision(const accel *acc)
{
    return acc ? acc->opt.mixed_precision : ACCEL_PRECISION_UNSET;
}
const char *accel_precision_name(accel_precision p)
{
    switch (p) {
    case ACCEL_PRECISION_NO:
        return "no";
    case ACCEL_PRECISION_FP16:
        return "fp16";
    case ACCEL_PRECISION_BF16:
        return "bf16";
    case ACCEL_PRECISION_FP8:
        return "fp8";
    case ACCEL_PRECISION_UNSET:
        break;
    }
    return "unset";
}
int accel_gradient_accumulation_steps(const accel *acc)
{
    return acc ? acc->opt.gradient_accumulation_steps : 0;
}
const accel_options *accel_resolved_options(const accel *acc)
{
    return acc ? &acc->opt : NULL;
}

/* ---- process control ---- */

void accel_print(const accel *acc, const char *fmt, ...)
{
    if (acc == NULL || fmt == NULL || acc->rank != 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* A NULL handle is an argument error, as everywhere else in the API: never a crash. */
static accel_status null_acc(const char *who)
{
    return accel__seterr(NULL, ACCEL_EINVAL, "%s: acc is NULL", who);
}

accel_status accel_wait_for_everyone(accel *acc)
{
    if (acc == NULL) {
        return null_acc("accel_wait_for_everyone");
    }
    return accel__adopt_thread_error(acc, accel__barrier(acc->comm));
}

/* The "goes first" pattern: followers wait at a barrier the leader reaches on leaving. */
static accel_status first_begin(accel *acc, int leader)
{
    return leader ? ACCEL_OK : accel_wait_for_everyone(acc);
}
static accel_status first_end(accel *acc, int leader)
{
    return leader ? accel_wait_for_everyone(acc) : ACCEL_OK;
}

accel_status accel_main_process_first_begin(accel *acc)
{
    return acc ? first_begin(acc, acc->rank == 0) : null_acc("accel_main_process_first_begin");
}
accel_status accel_main_process_first_end(accel *acc)
{
    return acc ? first_end(acc, acc->rank == 0) : null_acc("accel_main_process_first_end");
}
accel_status accel_local_main_process_first_begin(accel *acc)
{
    return acc ? first_begin(acc, acc->local_rank == 0)
               : null_acc("accel_local_main_process_first_begin");
}
accel_status accel_local_main_process_first_end(accel *acc)
{
    return acc ? first_end(acc, acc->local_rank == 0)
               : null_acc("accel_local_main_process_first_end");
}

accel_status accel_on_process(accel *acc, int process_index, accel_process_fn fn, void *ctx)
{
    if (acc == NULL) {
        return null_acc("accel_on_process");
    }
    if (fn == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_on_process: fn is NULL");
    }
    /* As Accelerate: a program that is not distributed runs every process's work itself. */
    return (acc->rank == process_index || !accel_use_distributed(acc)) ? fn(ctx) : ACCEL_OK;
}
accel_status accel_on_local_process(accel *acc, int local_process_index, accel_process_fn fn,
                                    void *ctx)
{
    if (acc == NULL) {
        return null_acc("accel_on_local_process");
    }
    if (fn == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_on_local_process: fn is NULL");
    }
    return (acc->local_rank == local_process_index || !accel_use_distributed(acc)) ? fn(ctx)
                                                                                   : ACCEL_OK;
}
accel_status accel_on_main_process(accel *acc, accel_process_fn fn, void *ctx)
{
    return accel_on_process(acc, 0, fn, ctx);
}
accel_status accel_on_local_main_process(accel *acc, accel_process_fn fn, void *ctx)
{
    return accel_on_local_process(acc, 0, fn, ctx);
}
accel_status accel_on_last_process(accel *acc, accel_process_fn fn, void *ctx)
{
    return acc ? accel_on_process(acc, acc->n_ranks - 1, fn, ctx)
               : null_acc("accel_on_last_process");
}
