/*
 * libFuzzer harness for the other files users hand to accel: the config YAML (Accelerate's
 * default_config.yaml) and token files (llm.c .bin with its header, or raw). The first byte
 * picks the target; the rest is the file. Every input must load or fail with a status, never
 * crash, hang or read out of bounds; a token dataset that opens must serve its first and last
 * windows. Built by scripts/fuzz.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "accel/data.h"
#include "base/config.h"

static const char *write_temp(const uint8_t *data, size_t size)
{
    static char path[64];
    snprintf(path, sizeof(path), "/dev/shm/accel-fuzz-in-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return NULL;
    }
    fwrite(data, 1, size, f);
    fclose(f);
    return path;
}

static void token_file(const char *path, accel_token_header header, int64_t context)
{
    accel_token_dataset_options o = accel_token_dataset_options_default();
    o.path = path;
    o.context = context;
    o.header = header;
    o.out_dtype = ACCEL_U16; /* zero copy for uint16 files: no loader scratch needed */
    accel_dataset *ds = NULL;
    if (accel_token_dataset_open(&ds, &o) != ACCEL_OK) {
        return;
    }
    int64_t n = ds->len(ds->ctx);
    volatile unsigned sum = 0;
    for (int64_t i = 0; i < n; i += (n > 1 ? n - 1 : 1)) {
        accel_sample s = {0};
        if (ds->get(ds->ctx, i, &s) == ACCEL_OK) {
            for (int f = 0; f < s.n_fields; f++) {
                const uint16_t *t = s.field[f].data;
                for (int64_t k = 0; k < accel_tensor_numel(&s.field[f]); k++) {
                    sum += t[k];
                }
            }
        }
    }
    accel_dataset_free(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    const char *path = write_temp(data + 1, size - 1);
    if (path == NULL) {
        return 0;
    }
    switch (data[0] % 3) {
    case 0: {
        accel__config cfg;
        if (accel__config_load(path, &cfg) == ACCEL_OK) {
            accel__config_free(&cfg);
        }
        break;
    }
    case 1:
        token_file(path, ACCEL_TOKENS_AUTO, 1 + data[0] / 3 % 8);
        break;
    default:
        token_file(path, ACCEL_TOKENS_LLMC, 1 + data[0] / 3 % 8);
        break;
    }
    unlink(path);
    return 0;
}
