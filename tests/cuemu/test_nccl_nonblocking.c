/*
 * The emulator's non-blocking NCCL communicators (tests/cuemu/nccl.c), as accel's nccl backend
 * uses them: ncclCommInitRankConfig with blocking = 0 returns ncclInProgress and the
 * communicator at once, ncclCommGetAsyncError says ncclInProgress until the call is done, a
 * call issued meanwhile is refused (ncclInvalidArgument, as NCCL's ncclCommEnsureReady),
 * collectives, groups and finalize complete the same way with the right results; a split
 * (inheriting the mode) returns ncclSuccess as NCCL's does, with the child NULL until the
 * PARENT is polled out of ncclInProgress (a child without a color stays NULL); the blocking
 * default still completes at once; ncclCommAbort stops a call that waits for a peer that never comes
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
    ncclResult_t r = ncclInProgress;
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

    /* A split inherits the mode. As NCCL's: ncclSuccess, the child NULL while the parent is
     * in progress (here until it is polled), polling a NULL child is an invalid argument (what
     * accel's backend did on the H200), a call on the parent meanwhile is refused. */
    ncclComm_t child = NULL;
    CHECK(ncclCommSplit(c, 0, 0, &child, NULL) == ncclSuccess);
    CHECK(__atomic_load_n(&child, __ATOMIC_ACQUIRE) == NULL); /* held until c is polled */
    CHECK(ncclCommGetAsyncError(NULL, &r) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(c), "before the previous operation") != NULL);
    CHECK(ncclCommGetAsyncError(c, &r) == ncclSuccess && r == ncclInProgress);
    CHECK(settle(c) == ncclSuccess && child != NULL && settle(child) == ncclSuccess);
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, child, NULL) == ncclInProgress);
    CHECK(settle(child) == ncclSuccess);
    CHECK(ncclCommAbort(child) == ncclSuccess);
    /* no color: no child, the parent still takes part */
    child = c;
    CHECK(ncclCommSplit(c, NCCL_SPLIT_NOCOLOR, 0, &child, NULL) == ncclSuccess);
    CHECK(settle(c) == ncclSuccess && child == NULL);

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
    r = ncclInProgress;
    while (now_s() - t0 < 0.3) {
        CHECK(ncclCommGetAsyncError(c, &r) == ncclSuccess && r == ncclInProgress);
    }
    /* a call before the previous one is done is refused */
    CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(c), "before the previous operation") != NULL);
    t0 = now_s();
    CHECK(ncclCommAbort(c) == ncclSuccess);
    CHECK(now_s() - t0 < 2);
    CHECK(cudaFree(d) == cudaSuccess);
    printf("cuemu nccl non-blocking: ok\n");
    return 0;
}
