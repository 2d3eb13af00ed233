/*
 * The arithmetic of `accel estimate-memory`: Accelerate's columns (its estimate.py, read for
 * behaviour: sizes are the fp32 size divided by 2, 4 or 8, and "Training using Adam" is the
 * largest of its model, gradient, optimizer and step terms) and the per-process bytes of
 * accel's own training state under ZeRO stages 0-3, following the buffers accel allocates
 * (src/train/model.c, optim.c, zero.c, zero3.c): an fp32 master, fp32 gradients, two fp32
 * AdamW moments, and under mixed precision a 2-byte compute copy. Padding of the flat buffers
 * to the shard size (at most 16 x n_ranks elements per bucket) is left out, and so are the
 * buckets stages 1-2 widen to fp32 during a pass under mixed precision (at most three, given
 * back after each backward: transient, as activations).
 * tests/cli/test_estimate_memory.sh holds these figures against the bytes accel allocates.
 */
#include <string.h>

#include "estimate.h"

static const char *const dtype_names[CLI_MEM_N_DTYPES] = {"float32", "float16", "bfloat16", "int8",
                                                          "int4"};

const char *cli_mem_dtype_name(cli_mem_dtype d)
{
    return dtype_names[d];
}

int cli_mem_dtype_parse(const char *name)
{
    for (int d = 0; d < CLI_MEM_N_DTYPES; d++) {
        if (strcmp(name, dtype_names[d]) == 0) {
            return d;
        }
    }
    return -1;
}

uint64_t cli_mem_nbytes(uint64_t numel, cli_mem_dtype d)
{
    switch (d) {
    case CLI_MEM_FLOAT32:
        return 4 * numel;
    case CLI_MEM_FLOAT16:
    case CLI_MEM_BFLOAT16:
        return 2 * numel;
    case CLI_MEM_INT8:
        return numel;
    default:
        return (numel + 1) / 2;
    }
}

uint64_t cli_mem_accelerate_training(uint64_t fp32_nbytes, cli_mem_dtype d)
{
    if (d == CLI_MEM_FLOAT32) {
        return 4 * fp32_nbytes; /* weights + gradients + two moments, all fp32 ("step") */
    }
    if (d == CLI_MEM_FLOAT16 || d == CLI_MEM_BFLOAT16) {
        /* Accelerate's terms: model fp32, gradients fp32 + fp16 (1.5x), optimizer 2x, step =
         * optimizer; the column shows the largest, not the sum. */
        uint64_t model = fp32_nbytes, grads = fp32_nbytes + fp32_nbytes / 2;
        uint64_t optimizer = 2 * fp32_nbytes;
        uint64_t m = model > grads ? model : grads;
        return m > optimizer ? m : optimizer;
    }
    return 0;
}

static uint64_t shard(uint64_t nbytes, int n_ranks)
{
    return (nbytes + (uint64_t)n_ranks - 1) / (uint64_t)n_ranks;
}

cli_mem_zero cli_mem_zero_stage(const cli_mem_model *m, cli_mem_dtype d, int stage, int n_ranks)
{
    cli_mem_zero z;
    memset(&z, 0, sizeof(z));
    if (d != CLI_MEM_FLOAT32 && d != CLI_MEM_FLOAT16 && d != CLI_MEM_BFLOAT16) {
        return z;
    }
    int mixed = d != CLI_MEM_FLOAT32;
    uint64_t p = m->numel;
    /* Stage 0 (DDP): everything in full. */
    z.master = 4 * p;
    z.compute = mixed ? 2 * p : 0;
    z.grads = 4 * p;
    z.adam = 8 * p;
    /* Stage 1 shards the optimizer state, and under mixed precision the fp32 master too (as
     * DeepSpeed: the full weights are the compute copy); with one process nothing is sharded. */
    if (stage >= 1) {
        z.adam = shard(z.adam, n_ranks);
        if (mixed && n_ranks > 1) {
            z.master = shard(z.master, n_ranks);
        }
    }
    /* Stage 2: gradients are pages; once a bucket is reduce-scattered the pieces of other
     * processes are given back, so between backward and the step a process holds its shard. */
    if (stage >= 2) {
        z.grads = shard(z.grads, n_ranks);
    }
    /* Stage 3 also shards the master; the full weights (and the compute copy) are pages in
     * which at most three adjacent units are gathered at a time. */
    if (stage >= 3) {
        z.master = shard(4 * p, n_ranks);
        z.compute = 0;
        z.gather = m->gather_numel * (mixed ? 6 : 4);
    }
    z.total = z.master + z.compute + z.grads + z.adam + z.gather;
    return z;
}
