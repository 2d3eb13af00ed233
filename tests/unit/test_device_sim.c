/*
 * The simulated GPU itself (src/device/sim.h), the testing aid the sim-labelled tests run on:
 * it must catch what a GPU would punish.
 *  1. Memory: `holds` is 1 only for its own allocations, another simulated GPU's memory is
 *     EINVAL naming both; fresh memory is poison (0xFF) unless zeroed; pinned memory is poison.
 *  2. Copies and kernels whose pointers are not where their kind says, or that run past the
 *     end of an allocation, fail naming the culprit; unsupported dtypes as on CUDA.
 *  3. Deferral: work on a stream runs only when waited for (a copy reads its host source then,
 *     not at issue); two streams are not ordered without an event, and are with one; a
 *     re-recorded event does not move an earlier wait; host kernels run in stream order.
 *  4. Host code reading device memory crashes (SIGSEGV) with a message naming the block.
 * Runs in every build: the simulation is compiled in all of them (only a build without CUDA
 * lets ACCEL_SIM_GPU put it behind the CUDA device type).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "device/sim.h"

static accel__device *g0, *g1, *cpu;

static void test_memory(void)
{
    float *a, *z, host[4] = {0};
    CHECK_OK(NULL, accel__dev_alloc(g0, 16, 0, (void **)&a));
    CHECK_OK(NULL, accel__dev_alloc(g0, 16, 1, (void **)&z));
    int on = -1;
    CHECK_OK(NULL, accel__dev_holds(g0, a, &on));
    CHECK(on == 1);
    CHECK_OK(NULL, accel__dev_holds(g0, host, &on));
    CHECK(on == 0);
    CHECK_OK(NULL, accel__dev_holds(g1, host, &on));
    CHECK(on == 0);
    CHECK(accel__dev_holds(g1, a, &on) == ACCEL_EINVAL);
    CHECK_MSG(strstr(accel_last_error(NULL), "memory of cuda:0") &&
                  strstr(accel_last_error(NULL), "computes on cuda:1"),
              "%s", accel_last_error(NULL));
    uint32_t bits[4];
    CHECK_OK(NULL, accel__dev_copy(g0, bits, a, 16, ACCEL__COPY_D2H, NULL));
    CHECK(bits[0] == 0xFFFFFFFFu && bits[3] == 0xFFFFFFFFu); /* poison: NaN */
    CHECK_OK(NULL, accel__dev_copy(g0, bits, z, 16, ACCEL__COPY_D2H, NULL));
    CHECK(bits[0] == 0 && bits[3] == 0);
    unsigned char *pinned;
    CHECK_OK(NULL, accel__dev_host_alloc(g0, 8, (void **)&pinned));
    CHECK(pinned[0] == 0xFF && pinned[7] == 0xFF);
    accel__dev_host_free(g0, pinned);
    accel__dev_free(g0, a);
    accel__dev_free(g0, z);
}

#define CHECK_FAILS(call, st, text)                                                                \
    do {                                                                                           \
        CHECK((call) == (st));                                                                     \
        CHECK_MSG(strstr(accel_last_error(NULL), text), "%s", accel_last_error(NULL));             \
    } while (0)

static void test_checks(void)
{
    float *a, *b, host[8] = {0};
    CHECK_OK(NULL, accel__dev_alloc(g0, 32, 1, (void **)&a));
    CHECK_OK(NULL, accel__dev_alloc(g0, 32, 1, (void **)&b));
    CHECK_FAILS(accel__dev_copy(g0, host, host, 32, ACCEL__COPY_H2D, NULL), ACCEL_EINVAL,
                "the destination");
    CHECK_FAILS(accel__dev_copy(g0, a, b, 32, ACCEL__COPY_D2H, NULL), ACCEL_EINVAL,
                "is device memory of cuda:0, but the copy's kind says host memory");
    CHECK_FAILS(accel__dev_copy(g0, a, host, 32, ACCEL__COPY_D2D, NULL), ACCEL_EINVAL,
                "is host memory, not device memory");
    CHECK_FAILS(accel__dev_copy(g0, host, a, 32, ACCEL__COPY_H2H, NULL), ACCEL_EINVAL, "copy H2H");
    CHECK_FAILS(accel__dev_copy(g0, a + 4, host, 32, ACCEL__COPY_H2D, NULL), ACCEL_EINVAL,
                "run past the end of its device allocation (32 bytes");
    CHECK_FAILS(accel__dev_scale(g0, accel__dspan_f32(host, 8), 2.0f, NULL), ACCEL_EINVAL,
                "scale: x");
    CHECK_FAILS(accel__dev_pow_sum(g0, accel__dspan_f32(a, 8), 2.0, (double *)(void *)host, NULL),
                ACCEL_EINVAL, "pow_sum: the result");
    CHECK_FAILS(accel__dev_scale(g0, accel__dspan_of(a, ACCEL_I32, 8), 2.0f, NULL),
                ACCEL_EUNSUPPORTED, "cuda device: scale does not support dtype I32");
    float *other;
    CHECK_OK(NULL, accel__dev_alloc(g1, 32, 1, (void **)&other));
    CHECK_FAILS(accel__dev_copy(g0, a, other, 32, ACCEL__COPY_D2D, NULL), ACCEL_EINVAL,
                "is memory of cuda:1, not this GPU's");
    accel__dev_free(g1, other);
    accel__dev_free(g0, a);
    accel__dev_free(g0, b);
}

typedef struct host_kernel {
    float *x;
    int *log, *n_log, id;
} host_kernel;

static void add_one(void *arg)
{
    host_kernel *k = arg;
    k->x[0] += 1.0f; /* device memory, read and written by the "kernel" */
    k->log[(*k->n_log)++] = k->id;
}

static void test_deferral(void)
{
    accel__stream *s1, *s2;
    accel__event *e;
    CHECK_OK(NULL, accel__stream_new(g0, &s1));
    CHECK_OK(NULL, accel__stream_new(g0, &s2));
    CHECK_OK(NULL, accel__event_new(g0, &e));
    float *x, *pinned, got = 0;
    CHECK_OK(NULL, accel__dev_alloc(g0, 4, 1, (void **)&x));
    CHECK_OK(NULL, accel__dev_host_alloc(g0, 4, (void **)&pinned));

    /* A copy on a stream reads its source when the stream runs. */
    pinned[0] = 1.0f;
    CHECK_OK(NULL, accel__dev_copy(g0, x, pinned, 4, ACCEL__COPY_H2D, s1));
    pinned[0] = 2.0f;
    CHECK_OK(NULL, accel__stream_sync(g0, s1));
    CHECK_OK(NULL, accel__dev_copy(g0, &got, x, 4, ACCEL__COPY_D2H, NULL));
    CHECK(got == 2.0f);

    /* Unordered streams: s2's read does not see s1's unsynchronised scale... */
    CHECK_OK(NULL, accel__dev_scale(g0, accel__dspan_f32(x, 1), 3.0f, s1));
    CHECK_OK(NULL, accel__dev_copy(g0, pinned, x, 4, ACCEL__COPY_D2H, s2));
    CHECK_OK(NULL, accel__stream_sync(g0, s2));
    CHECK(pinned[0] == 2.0f);
    CHECK_OK(NULL, accel__stream_sync(g0, s1));
    /* ... and does with an event (recorded before a later scale, which it must not see). */
    CHECK_OK(NULL, accel__dev_scale(g0, accel__dspan_f32(x, 1), 3.0f, s1));
    CHECK_OK(NULL, accel__event_record(g0, e, s1));
    CHECK_OK(NULL, accel__stream_wait_event(g0, s2, e));
    CHECK_OK(NULL, accel__dev_scale(g0, accel__dspan_f32(x, 1), 10.0f, s1));
    CHECK_OK(NULL, accel__event_record(g0, e, s1)); /* re-recorded: the wait keeps its point */
    CHECK_OK(NULL, accel__dev_copy(g0, pinned, x, 4, ACCEL__COPY_D2H, s2));
    CHECK_OK(NULL, accel__stream_sync(g0, s2));
    CHECK_MSG(pinned[0] == 18.0f, "%g", pinned[0]);
    CHECK_OK(NULL, accel__event_sync(g0, e));
    CHECK_OK(NULL, accel__dev_copy(g0, &got, x, 4, ACCEL__COPY_D2H, NULL));
    CHECK(got == 180.0f);

    /* Host kernels run in stream order, when the stream runs. */
    int log[4], n_log = 0;
    host_kernel k1 = {x, log, &n_log, 1}, k2 = {x, log, &n_log, 2};
    CHECK_OK(NULL, accel__sim_launch(g0, NULL, add_one, &k1));
    CHECK_OK(NULL, accel__dev_scale(g0, accel__dspan_f32(x, 1), 0.5f, NULL));
    CHECK_OK(NULL, accel__sim_launch(g0, NULL, add_one, &k2));
    CHECK(n_log == 0);
    CHECK_OK(NULL, accel__dev_copy(g0, &got, x, 4, ACCEL__COPY_D2H, NULL));
    CHECK(n_log == 2 && log[0] == 1 && log[1] == 2);
    CHECK_MSG(got == (180.0f + 1.0f) * 0.5f + 1.0f, "%g", got);
    CHECK(accel__sim_launch(cpu, NULL, add_one, &k1) == ACCEL_EUNSUPPORTED);

    /* A stream freed with an event and a wait pointing at it. */
    CHECK_OK(NULL, accel__dev_scale(g0, accel__dspan_f32(x, 1), 2.0f, s1));
    CHECK_OK(NULL, accel__event_record(g0, e, s1));
    CHECK_OK(NULL, accel__stream_wait_event(g0, s2, e));
    accel__stream_free(g0, s1);
    CHECK(accel__event_query(g0, e) == 1);
    CHECK_OK(NULL, accel__stream_sync(g0, s2));
    accel__event_free(g0, e);
    accel__stream_free(g0, s2);
    accel__dev_host_free(g0, pinned);
    accel__dev_free(g0, x);
}

/* A child reads device memory from host code: it must die by SIGSEGV, naming the block. */
static void test_fault(void)
{
    float *x;
    CHECK_OK(NULL, accel__dev_alloc(g0, 64, 1, (void **)&x));
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        volatile float v = x[3];
        (void)v;
        _exit(0);
    }
    close(fds[1]);
    char msg[1024] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(msg) - 1 && (r = read(fds[0], msg + n, sizeof(msg) - 1 - n)) > 0) {
        n += (size_t)r;
    }
    close(fds[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(!(WIFEXITED(status) && WEXITSTATUS(status) == 0),
              "reading device memory from host code went unnoticed");
#if !defined(__SANITIZE_ADDRESS__)
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "status %d", status);
    CHECK_MSG(strstr(msg, "host code touched simulated device memory") &&
                  strstr(msg, "64 bytes at"),
              "stderr: %s", msg);
#endif
    accel__dev_free(g0, x);
}

int main(void)
{
    accel__device_sim_enable(2);
    CHECK_OK(NULL, accel__device_open(&cpu, (accel_device){ACCEL_DEVICE_CPU, 0}));
    CHECK_OK(NULL, accel__device_sim_open(&g0, 0));
    CHECK_OK(NULL, accel__device_sim_open(&g1, 1));
    CHECK(accel__device_is_sim(g0) && !accel__device_is_sim(cpu));
    CHECK(accel__device_which(g0).type == ACCEL_DEVICE_CUDA && accel__device_which(g1).index == 1);
    accel__device *none;
    CHECK_FAILS(accel__device_sim_open(&none, 2), ACCEL_EUNSUPPORTED, "does not exist");
    test_memory();
    test_checks();
    test_deferral();
    test_fault();
    printf("test_device_sim: ok\n");
    return 0;
}
