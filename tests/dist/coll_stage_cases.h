/*
 * Buffer collectives on device memory, shared by test_coll_staging.c (staging forced on the CPU,
 * so the logic runs on every machine) and test_cuda_collectives.c (buffers in GPU memory). Each
 * case runs the same call twice from the same starting bytes: once on host buffers (the
 * reference) and once on buffers from the device seam, staged through host memory by
 * accel_allreduce & co.; the two must end bit-identical over the whole arena the buffers live
 * in (so a staged call writes its result and nothing else). Cases: allreduce (f32 sum out of
 * place, bf16 avg in place, a 3 MiB one that grows the cached staging buffer), broadcast in and
 * out of place from a non-zero root, reduce_to and gather_to with NULL recv off the root,
 * allgather and reduce_scatter in and out of place with even and uneven counts, a send in
 * device memory with a host recv; and a work handle with a device buffer, refused with
 * ACCEL_EUNSUPPORTED on every process (where staged: a communicator that reads device memory,
 * nccl, takes the buffers as they are and runs every case unstaged).
 */
#ifndef ACCEL_TEST_COLL_STAGE_CASES_H
#define ACCEL_TEST_COLL_STAGE_CASES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/coll_stage.h"
#include "device/device.h"

enum { CS_ALLREDUCE, CS_BROADCAST, CS_REDUCE, CS_GATHER, CS_ALLGATHER, CS_REDUCE_SCATTER };

static const char *cs_names[] = {"allreduce", "broadcast",  "reduce_to",
                                 "gather_to", "allgather", "reduce_scatter"};

static accel_status cs_call(accel *acc, int kind, const void *send, void *recv, size_t count,
                            accel_dtype dt, accel_reduce_op op, int root, accel_work **work)
{
    switch (kind) {
    case CS_ALLREDUCE:
        return accel_allreduce(acc, send, recv, count, dt, op, work);
    case CS_BROADCAST:
        return accel_broadcast(acc, send, recv, count, dt, root, work);
    case CS_REDUCE:
        return accel_reduce_to(acc, send, recv, count, dt, op, root, work);
    case CS_GATHER:
        return accel_gather_to(acc, send, recv, count, dt, root, work);
    case CS_ALLGATHER:
        return accel_allgather(acc, send, recv, count, dt, work);
    default:
        return accel_reduce_scatter(acc, send, recv, count, dt, op, work);
    }
}

/* Element i of process `rank`'s data for case `key`, as dtype dt: small integers for I32
 * (sums stay exact), bf16 by truncating a float in [-1, 1). */
static void cs_fill(void *buf, size_t nbytes, accel_dtype dt, uint64_t key)
{
    size_t es = accel_dtype_nbytes(dt);
    for (size_t i = 0; i < nbytes / es; i++) {
        uint64_t z = key * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float f = (float)((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if (dt == ACCEL_F32) {
            memcpy((char *)buf + i * 4, &f, 4);
        } else if (dt == ACCEL_BF16) {
            uint16_t h = (uint16_t)(bits >> 16);
            memcpy((char *)buf + i * 2, &h, 2);
        } else {
            int32_t v = (int32_t)(z % 2001) - 1000;
            memcpy((char *)buf + i * 4, &v, 4);
        }
    }
}

/*
 * One case: the buffers live in one arena (send at send_off, recv at recv_off; in place they
 * overlap as the API's in-place form says); recv is NULL off the root for reduce_to and
 * gather_to. The arena starts with the same bytes on the host and the device, the call runs on
 * each, and the two arenas must match byte for byte.
 */
static void cs_case(accel *acc, accel__device *d, int force, int kind, size_t count,
                    accel_dtype dt, accel_reduce_op op, int root, int in_place)
{
    const int n = accel_num_processes(acc), rank = accel_process_index(acc);
    const size_t es = accel_dtype_nbytes(dt);
    size_t off, cnt;
    accel_chunk_range(count, n, rank, &off, &cnt);
    size_t send_len = count * es, recv_len = count * es;
    if (kind == CS_ALLGATHER) {
        send_len = cnt * es;
    } else if (kind == CS_REDUCE_SCATTER) {
        recv_len = cnt * es;
    } else if (kind == CS_GATHER) {
        recv_len = rank == root ? (size_t)n * count * es : 0;
    } else if (kind == CS_REDUCE && rank != root) {
        recv_len = 0;
    }
    size_t send_off = 0, recv_off = 0, arena;
    if (in_place) {
        send_off = kind == CS_ALLGATHER ? off * es : 0;
        recv_off = kind == CS_REDUCE_SCATTER ? off * es : 0;
        arena = count * es;
    } else {
        recv_off = (send_len + 63) / 64 * 64;
        arena = recv_off + recv_len;
    }
    arena = arena > 0 ? arena : 64;
    unsigned char *init = malloc(arena), *host = malloc(arena), *back = malloc(arena);
    CHECK(init && host && back);
    cs_fill(init, arena, dt, (uint64_t)(rank + 1) * 1000003u + (uint64_t)kind * 31u + count);
    memcpy(host, init, arena);
    void *dev;
    CHECK_OK(NULL, accel__dev_alloc(d, arena, 0, &dev));
    CHECK_OK(NULL, accel__dev_copy(d, dev, init, arena, ACCEL__COPY_H2D, NULL));
    const int no_recv = recv_len == 0 && !in_place;

    CHECK_OK(acc, cs_call(acc, kind, host + send_off, no_recv ? NULL : host + recv_off, count, dt,
                          op, root, NULL));
    accel__coll_force_staging(force);
    accel_status st = cs_call(acc, kind, (char *)dev + send_off,
                              no_recv ? NULL : (char *)dev + recv_off, count, dt, op, root, NULL);
    accel__coll_force_staging(0);
    CHECK_MSG(st == ACCEL_OK, "%s on device memory: %s: %s", cs_names[kind], accel_status_name(st),
              accel_last_error(acc));
    CHECK_OK(NULL, accel__dev_copy(d, back, dev, arena, ACCEL__COPY_D2H, NULL));
    for (size_t i = 0; i < arena; i++) {
        CHECK_MSG(host[i] == back[i],
                  "%s(count %zu, %s, %s, root %d): process %d: byte %zu of %zu differs from the "
                  "host call's (0x%02x vs 0x%02x; send at %zu, recv at %zu)",
                  cs_names[kind], count, accel_dtype_name(dt), in_place ? "in place" : "out of place",
                  root, rank, i, arena, back[i], host[i], send_off, recv_off);
    }
    accel__dev_free(d, dev);
    free(init), free(host), free(back);
}

/* A send buffer in device memory, recv in host memory. */
static void cs_mixed(accel *acc, accel__device *d, int force)
{
    enum { N = 1001 };
    const int rank = accel_process_index(acc);
    float in[N], want[N], got[N];
    cs_fill(in, sizeof(in), ACCEL_F32, (uint64_t)rank + 77);
    CHECK_OK(acc, accel_allreduce(acc, in, want, N, ACCEL_F32, ACCEL_SUM, NULL));
    void *dev;
    CHECK_OK(NULL, accel__dev_alloc(d, sizeof(in), 0, &dev));
    CHECK_OK(NULL, accel__dev_copy(d, dev, in, sizeof(in), ACCEL__COPY_H2D, NULL));
    /* Forced staging treats every pointer as device memory, so only the real case is mixed. */
    accel__coll_force_staging(force);
    accel_status st = accel_allreduce(acc, dev, got, N, ACCEL_F32, ACCEL_SUM, NULL);
    accel__coll_force_staging(0);
    CHECK_MSG(st == ACCEL_OK, "mixed allreduce: %s", accel_last_error(acc));
    CHECK_MSG(memcmp(want, got, sizeof(got)) == 0, "mixed allreduce differs from the host call's");
    accel__dev_free(d, dev);
}

/* A work handle with a device buffer: refused on every process, before anything moves (only
 * where the buffer is staged: nccl reads it as it is). */
static void cs_async_refused(accel *acc, accel__device *d, int force)
{
    if (!force && (accel__comm_caps(acc->comm) & ACCEL__COMM_DEVICE_MEM)) {
        return;
    }
    void *dev;
    CHECK_OK(NULL, accel__dev_alloc(d, 64, 1, &dev));
    accel_work *w = NULL;
    accel__coll_force_staging(force);
    accel_status st = accel_allreduce(acc, dev, dev, 16, ACCEL_F32, ACCEL_SUM, &w);
    accel__coll_force_staging(0);
    CHECK_MSG(st == ACCEL_EUNSUPPORTED && w == NULL, "async on device memory: %s: %s",
              accel_status_name(st), accel_last_error(acc));
    CHECK_MSG(strstr(accel_last_error(acc), "accel_allreduce: the send buffer is in ") != NULL &&
                  strstr(accel_last_error(acc), "(pass work = NULL)") != NULL,
              "unexpected message: %s", accel_last_error(acc));
    accel__dev_free(d, dev);
    CHECK_OK(acc, accel_barrier(acc, NULL)); /* the communicator is still usable */
}

/* Every case on acc's device; force: stage even what is host memory (the CPU). */
static void cs_run(accel *acc, int force)
{
    accel__device *d;
    CHECK_OK(NULL, accel__device_open(&d, accel_device_of(acc)));
    const int n = accel_num_processes(acc), last = n - 1;
    const size_t even = (size_t)n * 334, uneven = (size_t)n * 334 + 1;
    cs_case(acc, d, force, CS_ALLREDUCE, 1001, ACCEL_F32, ACCEL_SUM, 0, 0);
    cs_case(acc, d, force, CS_ALLREDUCE, 1001, ACCEL_BF16, ACCEL_AVG, 0, 1);
    cs_case(acc, d, force, CS_ALLREDUCE, 3 << 18, ACCEL_F32, ACCEL_SUM, 0, 1); /* 3 MiB */
    cs_case(acc, d, force, CS_BROADCAST, 999, ACCEL_F32, ACCEL_SUM, last, 0);
    cs_case(acc, d, force, CS_BROADCAST, 999, ACCEL_I32, ACCEL_SUM, last, 1);
    cs_case(acc, d, force, CS_REDUCE, 500, ACCEL_F32, ACCEL_MAX, last, 0);
    cs_case(acc, d, force, CS_GATHER, 77, ACCEL_I32, ACCEL_SUM, 0, 0);
    cs_case(acc, d, force, CS_ALLGATHER, uneven, ACCEL_F32, ACCEL_SUM, 0, 0);
    cs_case(acc, d, force, CS_ALLGATHER, uneven, ACCEL_BF16, ACCEL_SUM, 0, 1);
    cs_case(acc, d, force, CS_ALLGATHER, even, ACCEL_F32, ACCEL_SUM, 0, 1);
    cs_case(acc, d, force, CS_REDUCE_SCATTER, uneven, ACCEL_F32, ACCEL_SUM, 0, 0);
    cs_case(acc, d, force, CS_REDUCE_SCATTER, even, ACCEL_I32, ACCEL_SUM, 0, 1);
    cs_case(acc, d, force, CS_REDUCE_SCATTER, uneven, ACCEL_F32, ACCEL_SUM, 0, 1);
    cs_mixed(acc, d, force);
    cs_async_refused(acc, d, force);
}

#endif
