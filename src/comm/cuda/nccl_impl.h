/*
 * What the nccl backend's two files share (private): nccl.c (communicators: rendezvous, the
 * liveness watch, abort, split, destroy) and nccl_coll.c (collectives: requests, staging,
 * post, test, groups). See nccl.c's comment for the design.
 */
#ifndef ACCEL_COMM_CUDA_NCCL_IMPL_H
#define ACCEL_COMM_CUDA_NCCL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/base.h"
#include "comm/comm.h"
#include "comm/watch.h"

typedef struct nccl_req nccl_req;

typedef struct nccl_impl {
    ncclComm_t comm;
    int rank, n_ranks, device;
    double timeout_s;
    accel__log_ctx log;
    accel__watch *watch; /* shared with the split children; holds the store client */
    accel__watch_member wm;
    void *(*stream_native)(void *arg, accel__stream *s);
    void *stream_arg;
    pthread_mutex_t mu;      /* the request cache and the abort's claim */
    pthread_mutex_t comm_mu; /* every NCCL call on comm, and its abort (see the top) */
    int group_open;          /* under comm_mu: the owner's groups open on comm */
    int abort_deferred;      /* under comm_mu: an abort left to the owner's ncclGroupEnd */
    nccl_req *spare;         /* a finished request to reuse (its event and staging buffers) */
    nccl_req *flight;        /* posted requests whose event is recorded and not yet seen done */
    nccl_req *grouped;       /* the owner's: posted in the open group, newest first */
    int abort_claimed;       /* under mu: the first abort writes the status and message */
    _Atomic int aborted;     /* released after abort_st and abort_msg are written */
    accel_status abort_st;
    char abort_msg[ACCEL__ERRMSG_NBYTES];
    unsigned n_splits;
    ncclComm_t split_out; /* under comm_mu: ncclCommSplit's *newcomm, written by NCCL's thread */
} nccl_impl;

struct nccl_req {
    cudaEvent_t ev;
    /* Staging of host buffers: device and pinned host scratch, grow-only. */
    void *dbuf, *hbuf;
    size_t nbytes;
    uint16_t *wbuf; /* a wire dtype's 16-bit copy of the data (device), grow-only */
    size_t wnbytes;
    void *recv; /* host destination of the result (NULL: none or not staged) */
    size_t out_off, out_nbytes;
    _Atomic int in_flight; /* counted in the watch's posted, not yet in its done */
    nccl_req *next;        /* in the flight list (under mu) or the group's (the owner's) */
    cudaStream_t stream;   /* posted inside a group: its copy and event wait for the group end */
    accel_status st;       /* the group end's failure, reported by test */
};

/* nccl.c */
/* A CUDA failure of what, as the thread's error (ENOMEM or EIO). */
accel_status accel__nccl_cuda_err(cudaError_t e, const char *what);
/* The abort's status and message, as the thread's error. */
accel_status accel__nccl_aborted_err(nccl_impl *e);
/* NCCL's failure r of what (the abort's cause once aborted), naming this process. */
accel_status accel__nccl_err(nccl_impl *e, ncclResult_t r, const char *what);
/* The communicator's async error (comm_mu taken), ncclSuccess once aborted. */
ncclResult_t accel__nccl_async_error(nccl_impl *e);
/* Polls until the call that returned r is done, at most the timeout (then aborts). */
accel_status accel__nccl_settle(nccl_impl *e, ncclResult_t r, const char *what);
/* The abort left to the owner's ncclGroupEnd (comm_mu held). */
void accel__nccl_abort_deferred(nccl_impl *e);

/* nccl_coll.c: the collectives' backend entries (comm.h) and the requests' end. */
accel_status accel__nccl_post(void *impl, const accel__coll *op, accel__stream *stream,
                              void **out);
int accel__nccl_test(void *impl, void *req, accel_status *st);
void accel__nccl_req_free(void *impl, void *req);
accel_status accel__nccl_group(void *impl, int begin);
void accel__nccl_req_destroy(nccl_req *q);
/* The watch's progress (its thread): posted collectives complete on the GPU count as done. */
void accel__nccl_progress(void *arg);

#endif /* ACCEL_COMM_CUDA_NCCL_IMPL_H */
