/*
 * NCCL in the emulator build (cuemu.h), for communicators of one rank: every collective of one
 * rank is a copy (a reduction of one input is that input, an average divides by one), and
 * point-to-point messages to oneself pair up inside a group. A communicator of more ranks is
 * refused with ncclInvalidUsage and a message, as the emulated devices of two processes share
 * no memory; the multi-process GPU paths (host staging) need no NCCL.
 *
 * Buffers must be device memory of the size the call implies (cuemu_is_device), as on a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "cuemu.h"

struct ncclComm {
    int dead; /* aborted or destroyed: every later call is ncclInvalidArgument */
    char last[256];
};

/* The pending sends of the open group (to oneself), matched by receives of the same size. */
typedef struct p2p {
    const void *send;
    void *recv;
    size_t nbytes;
} p2p;

static _Thread_local int t_group;
static _Thread_local p2p t_sends[64], t_recvs[64];
static _Thread_local int t_n_sends, t_n_recvs;
static _Thread_local char t_last[256];

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fn, const char *what)
{
    char *dst = c != NULL ? c->last : t_last;
    snprintf(dst, 256, "%s: %s", fn, what);
    fprintf(stderr, "cuemu: %s\n", dst);
    return r;
}

static size_t type_nbytes(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* Checks the communicator, the dtype and the buffers of a call; 0 bytes when invalid. */
static ncclResult_t check(ncclComm_t c, const char *fn, ncclDataType_t t, size_t count,
                          const void *send, const void *recv, size_t *nbytes)
{
    if (c == NULL || c->dead) {
        return fail(NULL, ncclInvalidArgument, fn, "the communicator is NULL or destroyed");
    }
    size_t es = type_nbytes(t);
    if (es == 0) {
        return fail(c, ncclInvalidArgument, fn, "unknown datatype");
    }
    *nbytes = count * es;
    if (*nbytes > 0 && ((send != NULL && !cuemu_is_device(send, *nbytes)) ||
                        (recv != NULL && !cuemu_is_device(recv, *nbytes)))) {
        return fail(c, ncclInvalidArgument, fn,
                    "a buffer is not device memory of the size the call needs");
    }
    return ncclSuccess;
}

static ncclResult_t copy_call(ncclComm_t c, const char *fn, const void *send, void *recv,
                              size_t count, ncclDataType_t t)
{
    size_t nb = 0;
    ncclResult_t r = check(c, fn, t, count, send, recv, &nb);
    if (r == ncclSuccess && nb > 0 && send != recv) {
        cuemu_lock();
        memmove(recv, send, nb);
        cuemu_unlock();
    }
    return r;
}

static ncclResult_t check_op(ncclComm_t c, const char *fn, ncclRedOp_t op)
{
    return (int)op >= (int)ncclSum && (int)op <= (int)ncclAvg
               ? ncclSuccess
               : fail(c, ncclInvalidArgument, fn, "unknown reduction op");
}

static ncclResult_t check_root(ncclComm_t c, const char *fn, int root)
{
    return root == 0 ? ncclSuccess : fail(c, ncclInvalidArgument, fn, "root is not rank 0");
}

ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "cuemu %ld", (long)rand());
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    *comm = NULL;
    if (nranks != 1 || rank != 0) {
        return fail(NULL, ncclInvalidUsage, "ncclCommInitRank",
                    "the CUDA emulator has communicators of one rank only");
    }
    *comm = calloc(1, sizeof **comm);
    return *comm != NULL ? ncclSuccess
                         : fail(NULL, ncclSystemError, "ncclCommInitRank", "out of memory");
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    (void)key;
    (void)config;
    *newcomm = NULL;
    if (comm == NULL || comm->dead) {
        return fail(NULL, ncclInvalidArgument, "ncclCommSplit", "the communicator is NULL");
    }
    if (color == NCCL_SPLIT_NOCOLOR) {
        return ncclSuccess;
    }
    *newcomm = calloc(1, sizeof **newcomm);
    return *newcomm != NULL ? ncclSuccess
                            : fail(comm, ncclSystemError, "ncclCommSplit", "out of memory");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return comm != NULL && !comm->dead
               ? ncclSuccess
               : fail(NULL, ncclInvalidArgument, "ncclCommFinalize", "the communicator is NULL");
}

static ncclResult_t release(ncclComm_t comm, const char *fn)
{
    if (comm == NULL || comm->dead) {
        return fail(NULL, ncclInvalidArgument, fn, "the communicator is NULL or destroyed");
    }
    comm->dead = 1; /* kept allocated: a use after destroy is then reported, not undefined */
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return release(comm, "ncclCommDestroy");
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return release(comm, "ncclCommAbort");
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    *async_error = ncclSuccess;
    return comm != NULL ? ncclSuccess
                        : fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError", "NULL comm");
}

const char *ncclGetErrorString(ncclResult_t r)
{
    static const char *const names[] = {"no error",
                                        "unhandled cuda error",
                                        "unhandled system error",
                                        "internal error",
                                        "invalid argument",
                                        "invalid usage",
                                        "remote process exited or there was a network error",
                                        "NCCL operation in progress"};
    return (int)r >= 0 && (int)r < (int)(sizeof names / sizeof names[0]) ? names[r]
                                                                         : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    return comm != NULL ? comm->last : t_last;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    ncclResult_t r = check_op(comm, "ncclAllReduce", op);
    return r == ncclSuccess ? copy_call(comm, "ncclAllReduce", send, recv, count, t) : r;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    ncclResult_t r = check_op(comm, "ncclReduce", op);
    r = r == ncclSuccess ? check_root(comm, "ncclReduce", root) : r;
    return r == ncclSuccess ? copy_call(comm, "ncclReduce", send, recv, count, t) : r;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    ncclResult_t r = check_op(comm, "ncclReduceScatter", op);
    return r == ncclSuccess ? copy_call(comm, "ncclReduceScatter", send, recv, recvcount, t) : r;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return copy_call(comm, "ncclAllGather", send, recv, sendcount, t);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    ncclResult_t r = check_root(comm, "ncclBroadcast", root);
    return r == ncclSuccess ? copy_call(comm, "ncclBroadcast", send, recv, count, t) : r;
}

/* Pairs the group's sends and receives in order; each pair must have the same size. */
static ncclResult_t match(void)
{
    ncclResult_t r = ncclSuccess;
    if (t_n_sends != t_n_recvs) {
        r = fail(NULL, ncclInvalidUsage, "ncclGroupEnd",
                 "sends to and receives from rank 0 do not pair up in the group");
    }
    for (int i = 0; r == ncclSuccess && i < t_n_sends; i++) {
        if (t_sends[i].nbytes != t_recvs[i].nbytes) {
            r = fail(NULL, ncclInvalidUsage, "ncclGroupEnd",
                     "a send and its receive differ in size");
        } else if (t_sends[i].nbytes > 0) {
            cuemu_lock();
            memmove(t_recvs[i].recv, t_sends[i].send, t_sends[i].nbytes);
            cuemu_unlock();
        }
    }
    t_n_sends = t_n_recvs = 0;
    return r;
}

static ncclResult_t queue(ncclComm_t comm, const char *fn, int is_send, const void *send,
                          void *recv, size_t count, ncclDataType_t t, int peer)
{
    size_t nb = 0;
    ncclResult_t r = check(comm, fn, t, count, send, recv, &nb);
    if (r != ncclSuccess) {
        return r;
    }
    if (peer != 0) {
        return fail(comm, ncclInvalidArgument, fn, "peer is not rank 0");
    }
    if (t_group == 0) {
        return fail(comm, ncclInvalidUsage, fn,
                    "a message to oneself outside a group would wait forever");
    }
    p2p *list = is_send ? t_sends : t_recvs;
    int *n = is_send ? &t_n_sends : &t_n_recvs;
    if (*n == 64) {
        return fail(comm, ncclInvalidUsage, fn, "more than 64 messages in one group");
    }
    list[(*n)++] = (p2p){send, recv, nb};
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    return queue(comm, "ncclSend", 1, send, NULL, count, t, peer);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    return queue(comm, "ncclRecv", 0, NULL, recv, count, t, peer);
}

ncclResult_t ncclGroupStart(void)
{
    t_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group == 0) {
        return fail(NULL, ncclInvalidUsage, "ncclGroupEnd", "no group is open");
    }
    return --t_group == 0 ? match() : ncclSuccess;
}
