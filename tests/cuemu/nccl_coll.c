/*
 * The emulated NCCL's data path (nccl_emu.h): a collective moves its data through the slots of
 * the communicator's segment in chunks of a slot, each chunk between two barriers, and reduces
 * in rank order in the dtype's own arithmetic (16-bit floats rounded after each combine, as
 * NCCL's reductions round at each hop).
 */
#include <stdint.h>
#include <string.h>

#include "cuemu.h"
#include "nccl_emu.h"

/* ---- reductions, in rank order, in the dtype's arithmetic ---- */

#define COMBINE(acc, v, op)                                                                        \
    ((op) == ncclProd  ? (acc) * (v)                                                               \
     : (op) == ncclMax ? ((v) > (acc) ? (v) : (acc))                                               \
     : (op) == ncclMin ? ((v) < (acc) ? (v) : (acc))                                               \
                       : (acc) + (v))

#define REDUCE_AS(T)                                                                               \
    do {                                                                                           \
        T *d = dst;                                                                                \
        for (size_t i = 0; i < len; i++) {                                                         \
            T acc = ((const T *)(void *)slot(c, 0))[at + i];                                       \
            for (int r = 1; r < c->n; r++) {                                                       \
                T v = ((const T *)(void *)slot(c, r))[at + i];                                     \
                acc = (T)COMBINE(acc, v, op);                                                      \
            }                                                                                      \
            d[i] = op == ncclAvg ? (T)(acc / (T)c->n) : acc;                                       \
        }                                                                                          \
    } while (0)

/* dst[0, len) = the reduction of the slots' elements [at, at + len). */
static void reduce_slots(ncclComm_t c, void *dst, size_t at, size_t len, ncclDataType_t t,
                         ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8:
        REDUCE_AS(int8_t);
        break;
    case ncclUint8:
        REDUCE_AS(uint8_t);
        break;
    case ncclInt32:
        REDUCE_AS(int32_t);
        break;
    case ncclUint32:
        REDUCE_AS(uint32_t);
        break;
    case ncclInt64:
        REDUCE_AS(int64_t);
        break;
    case ncclUint64:
        REDUCE_AS(uint64_t);
        break;
    case ncclFloat32:
        REDUCE_AS(float);
        break;
    case ncclFloat64:
        REDUCE_AS(double);
        break;
    default: { /* fp16 / bf16: each combine rounded to the format */
        int bf16 = t == ncclBfloat16;
        uint16_t *d = dst;
        for (size_t i = 0; i < len; i++) {
            float acc = cuemu_from_half(((const uint16_t *)(void *)slot(c, 0))[at + i], bf16);
            for (int r = 1; r < c->n; r++) {
                float v = cuemu_from_half(((const uint16_t *)(void *)slot(c, r))[at + i], bf16);
                acc = cuemu_from_half(cuemu_to_half(COMBINE(acc, v, op), bf16), bf16);
            }
            d[i] = cuemu_to_half(op == ncclAvg ? acc / (float)c->n : acc, bf16);
        }
    }
    }
}

/* ---- the collectives, each in chunks of a slot ---- */

ncclResult_t cuemu_nccl_run_coll(const coll *k)
{
    ncclComm_t c = k->c;
    const size_t es = cuemu_nccl_type_nbytes(k->t), per = SLOT_NBYTES / es, me = (size_t)c->rank;
    /* The elements every rank writes to its slot: the input (reduce_scatter: all of it). */
    const size_t total = k->kind == K_REDUCE_SCATTER ? k->count * (size_t)c->n : k->count;
    ncclResult_t r = ncclSuccess;
    for (size_t off = 0; r == ncclSuccess && off < total; off += per) {
        size_t len = total - off < per ? total - off : per;
        if (k->kind != K_BROADCAST || c->rank == k->root) {
            memcpy(slot(c, c->rank), k->send + off * es, len * es);
        }
        if ((r = cuemu_nccl_barrier(c, k->fn)) != ncclSuccess) {
            break;
        }
        switch (k->kind) {
        case K_ALLREDUCE:
            reduce_slots(c, k->recv + off * es, 0, len, k->t, k->op);
            break;
        case K_REDUCE:
            if (c->rank == k->root) {
                reduce_slots(c, k->recv + off * es, 0, len, k->t, k->op);
            }
            break;
        case K_REDUCE_SCATTER: { /* the part of [off, off + len) that is this rank's */
            size_t lo = me * k->count, hi = lo + k->count;
            size_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
            if (a < b) {
                reduce_slots(c, k->recv + (a - lo) * es, a - off, b - a, k->t, k->op);
            }
            break;
        }
        case K_ALLGATHER:
            for (int q = 0; q < c->n; q++) {
                memcpy(k->recv + ((size_t)q * k->count + off) * es, slot(c, q), len * es);
            }
            break;
        case K_BROADCAST:
            memcpy(k->recv + off * es, slot(c, k->root), len * es);
            break;
        }
        r = cuemu_nccl_barrier(c, k->fn); /* the slots are free again */
    }
    return r;
}
