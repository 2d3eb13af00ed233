/*
 * Shared by the simulated GPU's files (sim.c: handles, queues, streams and events; sim_mem.c:
 * device memory, its protection and reserved ranges; sim_kernels.c: the kernels): the queued
 * operation, the lock and the checks. Only src/device/sim*.c include it.
 */
#ifndef ACCEL_DEVICE_SIM_IMPL_H
#define ACCEL_DEVICE_SIM_IMPL_H

#include "device_impl.h"
#include "sim.h"

/* What a queued operation is. */
enum { ACCEL__SIM_COPY, ACCEL__SIM_MEMSET, ACCEL__SIM_KERNEL, ACCEL__SIM_WAIT, ACCEL__SIM_HOST };
/* Which kernel (ACCEL__SIM_KERNEL). */
enum {
    ACCEL__SIM_K_SGD,
    ACCEL__SIM_K_ADAM,
    ACCEL__SIM_K_CONVERT,
    ACCEL__SIM_K_SCALE,
    ACCEL__SIM_K_CLAMP,
    ACCEL__SIM_K_POW_SUM,
    ACCEL__SIM_K_ABS_MAX,
    ACCEL__SIM_K_NONFINITE,
    ACCEL__SIM_K_UNSCALE
};

/* One queued operation: the arguments of whatever it is, copied at issue. */
typedef struct accel__sim_op {
    struct accel__sim_op *next;
    int kind, kernel;
    void *dst; /* copy, memset */
    const void *src;
    size_t nbytes;
    int byte;
    accel__dspan x, y; /* kernels: operand (destination), source */
    float f1, f2;
    double p;
    void *out; /* a reduction's accumulator or flag */
    accel__sgd_args sgd;
    accel__adam_args adam;
    struct accel__sim_stream *on; /* wait: run this stream up to seq first (NULL: done) */
    uint64_t seq;
    void (*fn)(void *); /* host kernel */
    void *arg;
} accel__sim_op;

/* The one lock of the simulation; the functions below expect it held unless they say. */
void accel__sim_lock(void);
void accel__sim_unlock(void);
/* The locked body of an operation: lock, run `call` (an accel_status expression), unlock,
 * return its status. */
#define ACCEL__SIM_LOCKED(call)                                                                    \
    do {                                                                                           \
        accel__sim_lock();                                                                         \
        accel_status locked_st_ = (call);                                                          \
        accel__sim_unlock();                                                                       \
        return locked_st_;                                                                         \
    } while (0)

/* The simulated GPU's number (cuda:N), for messages. */
static inline int accel__sim_index(const accel__device *d)
{
    return d->which.index;
}

/* Runs every queue of every GPU to its end (what cudaFree and cudaFreeHost do). */
void accel__sim_flush_all(void);

/* Device memory (sim_mem.c). Opening makes it accessible to the work that runs now (nested:
 * the outermost close protects it again). */
void accel__sim_open_memory(void);
void accel__sim_close_memory(void);
/* Installs, once, the SIGSEGV handler that names the block host code touched. */
void accel__sim_install_handler(void);
/* p .. p + nbytes must be device memory of d, inside one allocation; else ACCEL_EINVAL naming
 * `who` (the operation) and `what` (the operand). */
accel_status accel__sim_need_dev(accel__device *d, const char *who, const char *what, const void *p,
                                 size_t nbytes);
/* p .. p + nbytes must be host memory; else ACCEL_EINVAL naming `who` and `what`. */
accel_status accel__sim_need_host(accel__device *d, const char *who, const char *what,
                                  const void *p, size_t nbytes);
/* Queues a copy of op on stream s of d (NULL: the compute stream). */
accel_status accel__sim_enqueue(accel__device *d, accel__stream *s, const accel__sim_op *op);
/* Runs a queued kernel on the CPU device; a failure in *st. */
void accel__sim_run_kernel(const accel__sim_op *op, accel_status *st);

/* The kernels of the operations table (sim_kernels.c). */
accel_status accel__sim_sgd_step(accel__device *d, const accel__sgd_args *a, accel__stream *s);
accel_status accel__sim_adam_step(accel__device *d, const accel__adam_args *a, accel__stream *s);
accel_status accel__sim_convert(accel__device *d, accel__dspan dst, accel__dspan src,
                                accel__stream *s);
accel_status accel__sim_scale(accel__device *d, accel__dspan x, float factor, accel__stream *s);
accel_status accel__sim_clamp(accel__device *d, accel__dspan x, float lo, float hi,
                              accel__stream *s);
accel_status accel__sim_pow_sum(accel__device *d, accel__dspan x, double p, double *acc,
                                accel__stream *s);
accel_status accel__sim_abs_max(accel__device *d, accel__dspan x, double *acc, accel__stream *s);
accel_status accel__sim_nonfinite(accel__device *d, accel__dspan x, int32_t *flag,
                                  accel__stream *s);
accel_status accel__sim_unscale_check(accel__device *d, accel__dspan x, float factor, int32_t *flag,
                                      accel__stream *s);

/* The memory entries of the operations table (sim_mem.c); each takes the lock itself. */
accel_status accel__sim_alloc(accel__device *d, size_t nbytes, int zero, void **out);
void accel__sim_free(accel__device *d, void *p);
accel_status accel__sim_host_alloc(accel__device *d, size_t nbytes, void **out);
void accel__sim_host_free(accel__device *d, void *p);
accel_status accel__sim_holds(accel__device *d, const void *p, int *out);
accel_status accel__sim_range_granularity(accel__device *d, size_t *out);
accel_status accel__sim_range_reserve(accel__device *d, size_t nbytes, void **base);
void accel__sim_range_release(accel__device *d, void *base, size_t nbytes);
accel_status accel__sim_range_map(accel__device *d, void *at, size_t nbytes, void **phys);
accel_status accel__sim_range_unmap(accel__device *d, void *at, size_t nbytes, void *phys);

#endif /* ACCEL_DEVICE_SIM_IMPL_H */
