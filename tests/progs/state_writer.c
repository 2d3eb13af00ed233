/*
 * Helper for tests/ckpt/test_checksum_interop.sh: accel_save_state of a model of 16 Mi + 12345
 * fp32 weights with AdamW (files of several 16 MiB checksum blocks) and a registered object of
 * exactly 16 MiB (a file that ends on a block boundary) into DIR.
 *   state_writer DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

#define BLOB (16u << 20)

static accel_status blob_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, ctx, BLOB);
}

static accel_status blob_load(void *ctx, const void *data, size_t n)
{
    (void)ctx, (void)data;
    return n == BLOB ? ACCEL_OK : ACCEL_ECORRUPT;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: state_writer DIR\n");
        return 2;
    }
    accel *acc;
    accel_model *m;
    unsigned char *blob = malloc(BLOB);
    if (blob == NULL || accel_init(&acc, NULL) != ACCEL_OK || accel_model_new(acc, &m) != ACCEL_OK) {
        fprintf(stderr, "state_writer: %s\n", accel_last_error(NULL));
        return 1;
    }
    for (size_t i = 0; i < BLOB; i++) {
        blob[i] = (unsigned char)(i * 2654435761u >> 13);
    }
    accel_model_add_param(m, "a", 2, (int64_t[]){1024, 4096}, NULL);
    accel_model_add_param(m, "b", 1, (int64_t[]){12345}, NULL);
    accel_optimizer *o = accel_adamw(acc, m, NULL);
    if (o == NULL || accel_prepare(acc, m, o) != ACCEL_OK ||
        accel_register_for_checkpointing(acc, blob_save, blob_load, blob) != ACCEL_OK) {
        fprintf(stderr, "state_writer: %s\n", accel_last_error(acc));
        return 1;
    }
    float *w = accel_model_master(m);
    for (size_t i = 0; i < accel_model_numel(m); i++) {
        w[i] = (float)i * 1e-3f;
    }
    if (accel_save_state(acc, argv[1]) != ACCEL_OK || accel_load_state(acc, argv[1]) != ACCEL_OK) {
        fprintf(stderr, "state_writer: %s\n", accel_last_error(acc));
        return 1;
    }
    accel_free(acc);
    free(blob);
    return 0;
}
