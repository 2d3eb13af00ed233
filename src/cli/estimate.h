/*
 * Internal interface of `accel estimate-memory` (src/cli/estimate_*.c). Not installed.
 *
 * A model is described by its parameter count and its "units": the pieces Accelerate's
 * largest-layer column compares, from which ZeRO-3's gather units are formed (estimate_model.c,
 * finish). A unit is a whole transformer block
 * ("transformer.h.3", "model.layers.3": transformers lists those classes as _no_split_modules,
 * and FSDP's auto-wrap makes each one a unit) or any other leaf module ("transformer.wte",
 * "lm_head"). Only parameters count, not buffers; every parameter is trainable.
 */
#ifndef ACCEL_CLI_ESTIMATE_H
#define ACCEL_CLI_ESTIMATE_H

#include <stdint.h>

typedef struct cli_mem_unit {
    char *name;     /* owned */
    uint64_t numel; /* parameter elements of the unit */
} cli_mem_unit;

typedef struct cli_mem_model {
    char what[512]; /* one line: what was read ("GPT-2 config F: 12 layers, width 768, ...") */
    uint64_t numel; /* all parameter elements (tied weights once) */
    int n_units, cap_units;
    cli_mem_unit *units;   /* in model order; owned */
    int *slots, n_slots;   /* hash of the units' names: unit index + 1, 0 empty; owned */
    int largest;           /* index of the largest unit (the first of equal ones) */
    uint64_t gather_numel; /* ZeRO-3: the most parameters gathered at once (estimate_model.c) */
} cli_mem_model;

/* A GPT described by flags, in nn_gpt's layout (accel/nn.h): MLP 4 x n_embd, biases
 * everywhere, learned positions, lm_head shared with the token embedding when tied. */
typedef struct cli_mem_gpt {
    int64_t n_layer, n_embd, n_head, vocab_size, n_positions;
    int tied;
} cli_mem_gpt;

/*
 * Reads `path`: a Hugging Face config.json (GPT-2 or Llama-style fields), a .safetensors file
 * (its header only), a model.safetensors.index.json (and the headers of the shards it names),
 * or a folder holding one of those (weights first: they give exact counts for any
 * architecture). On failure prints "accel estimate-memory: error: ..." naming the file and the
 * field or tensor at fault to stderr and returns -1; 0 on success (free *m with cli_mem_free).
 */
int cli_mem_from_path(cli_mem_model *m, const char *path);

/* Builds the model of a GPT described by flags; -1 after printing an error naming the flag. */
int cli_mem_from_gpt(cli_mem_model *m, const cli_mem_gpt *g);

void cli_mem_free(cli_mem_model *m);

/* ---- The arithmetic (estimate_calc.c) ---- */

/* A dtype row of the tables. */
typedef enum cli_mem_dtype {
    CLI_MEM_FLOAT32,
    CLI_MEM_FLOAT16,
    CLI_MEM_BFLOAT16,
    CLI_MEM_INT8,
    CLI_MEM_INT4,
    CLI_MEM_N_DTYPES
} cli_mem_dtype;

/* "float32", ...; and back (-1 for an unknown name). */
const char *cli_mem_dtype_name(cli_mem_dtype d);
int cli_mem_dtype_parse(const char *name);

/* Bytes of `numel` elements stored in dtype d (int4: two per byte, rounded up). */
uint64_t cli_mem_nbytes(uint64_t numel, cli_mem_dtype d);

/* Accelerate's "Training using Adam" column for a model of fp32 size fp32_nbytes: the largest
 * of its model, gradient, optimizer and step terms; 0 where Accelerate prints N/A (int8, int4:
 * no training in those dtypes). */
uint64_t cli_mem_accelerate_training(uint64_t fp32_nbytes, cli_mem_dtype d);

/* Per-process bytes of accel's training state (weights, gradients, AdamW state) with dtype d's
 * precision (float32: fp32 training; float16/bfloat16: mixed precision) under ZeRO `stage`
 * (0-3) on n_ranks processes, by part; all 0 for int8 / int4. */
typedef struct cli_mem_zero {
    uint64_t master;  /* fp32 master weights (the weights themselves in float32) */
    uint64_t compute; /* the full 2-byte compute copy under mixed precision, else 0 */
    uint64_t grads;   /* fp32 gradients */
    uint64_t adam;    /* AdamW's two fp32 moments */
    uint64_t gather;  /* stage 3: the weights (fp32, and the compute copy) of the units
                         gathered at once */
    uint64_t total;
} cli_mem_zero;
cli_mem_zero cli_mem_zero_stage(const cli_mem_model *m, cli_mem_dtype d, int stage, int n_ranks);

#endif /* ACCEL_CLI_ESTIMATE_H */
