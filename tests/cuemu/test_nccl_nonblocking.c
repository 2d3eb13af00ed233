/*
 * The emulator's non-blocking NCCL communicators (tests/cuemu/nccl.c), as accel's nccl backend
 * uses them: ncclCommInitRankConfig with blocking = 0 returns ncclInProgress and the
 * communicator at once, ncclCommGetAsyncError says ncclInProgress until the call is done, a
 * call issued meanwhile is refused (ncclInvalidUsage), collectives, groups, splits (inheriting
 * the mode) and finalize complete the same way with the right results; the blocking default
 * still completes at once; ncclCommAbort stops a call that waits for a peer that never comes
 * (2 ranks, one absent) promptly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls c until its call is done (at most 10 s); returns the result. */
static ncclResult_t settle(ncclComm_t c)
{
    ncclResult_t r = ncclInProgress;
    double t0 = now_s();
    while (r == ncclInProgress && now_s() - t0 < 10) {
        CHECK(ncclCommGetAsyncError(c, &r) == ncclSuccess);
    }
    return r;
}

int main(void)
{
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = NULL;
    CHECK(ncclCommInitRankConfig(&c, 1, id, 0, &cfg) == ncclInProgress && c != NULL);
    CHECK(settle(c) == ncclSuccess);

    float *d = NULL, h[4] = {1, 2, 3, 4};
    CHECK(cudaMalloc((void **)&d, sizeof(h)) == cudaSuccess);
    CHECK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInProgress);
    CHECK(settle(c) == ncclSuccess);
    /* a group: queued calls succeed, the end is in progress */
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclMax, c, NULL) == ncclSuccess);
    CHECK(ncclBroadcast(d, d, 4, ncclFloat32, 0, c, NULL) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInProgress);
    CHECK(settle(c) == ncclSuccess);
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 1 && h[3] == 4);

    /* a split inherits the mode; the child is set up in progress */
    ncclComm_t child = NULL;
    CHECK(ncclCommSplit(c, 0, 0, &child, NULL) == ncclInProgress && child != NULL);
    CHECK(settle(c) == ncclSuccess && settle(child) == ncclSuccess);
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, child, NULL) == ncclInProgress);
    CHECK(settle(child) == ncclSuccess);
    CHECK(ncclCommAbort(child) == ncclSuccess);

    CHECK(ncclCommFinalize(c) == ncclInProgress);
    CHECK(settle(c) == ncclSuccess);
    CHECK(ncclCommDestroy(c) == ncclSuccess);

    /* the blocking default: done at once */
    ncclConfig_t dflt = NCCL_CONFIG_INITIALIZER;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(ncclCommInitRankConfig(&c, 1, id, 0, &dflt) == ncclSuccess);
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclSuccess);
    CHECK(ncclCommDestroy(c) == ncclSuccess);

    /* 2 ranks, rank 1 never comes: init stays in progress; the abort ends it promptly */
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(ncclCommInitRankConfig(&c, 2, id, 0, &cfg) == ncclInProgress);
    double t0 = now_s();
    ncclResult_t r = ncclInProgress;
    while (now_s() - t0 < 0.3) {
        CHECK(ncclCommGetAsyncError(c, &r) == ncclSuccess && r == ncclInProgress);
    }
    /* a call before the previous one is done is refused */
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(c), "still in progress") != NULL);
    t0 = now_s();
    CHECK(ncclCommAbort(c) == ncclSuccess);
    CHECK(now_s() - t0 < 2);
    CHECK(cudaFree(d) == cudaSuccess);
    printf("cuemu nccl non-blocking: ok\n");
    return 0;
}
