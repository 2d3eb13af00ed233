/*
 * libFuzzer harness for the other files users hand to accel: the config YAML (Accelerate's
 * default_config.yaml), token files (llm.c .bin with its header, or raw), a checkpoint's
 * completion marker (accel_checkpoint.json) and a safetensors index (model.safetensors.
 * index.json, loaded by accel_load_model). The first byte picks the target; the rest is the
 * file. Every input must load or fail with a status, never crash, hang or read out of bounds;
 * a token dataset that opens must serve its first and last windows. Built by scripts/fuzz.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "base/config.h"
#include "ckpt/verify.h"

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

/* A folder of its own per process for the targets that read a folder, removed at exit. */
static char fuzz_dir_path[64];

static void remove_fuzz_dir(void)
{
    static const char *const names[] = {ACCEL__CKPT_MARKER, "s.safetensors",
                                        "model.safetensors.index.json"};
    char p[128];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", fuzz_dir_path, names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir_path);
}

static const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0] == '\0') {
        snprintf(fuzz_dir_path, sizeof(fuzz_dir_path), "/dev/shm/accel-fuzz-dir-%d", (int)getpid());
        mkdir(fuzz_dir_path, 0700);
        atexit(remove_fuzz_dir);
    }
    return fuzz_dir_path;
}

/* The bytes as a checkpoint folder's marker: read (range checks) and the completeness check. */
static void marker(const uint8_t *data, size_t size)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/" ACCEL__CKPT_MARKER, fuzz_dir());
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return;
    }
    fwrite(data, 1, size, f);
    fclose(f);
    accel__ckpt_marker m = {0};
    if (accel__ckpt_marker_read(fuzz_dir(), &m) == ACCEL_OK) {
        accel__ckpt_marker_release(&m);
    }
    (void)accel__ckpt_check_complete(fuzz_dir());
}

/* The bytes as a safetensors index next to a valid shard holding "w" (4 floats), loaded into
 * a model with parameters "w" [4] and "b" [2], not strict. */
static void index_file(const uint8_t *data, size_t size)
{
    static accel *acc;
    static accel_model *model;
    char shard[128], path[128];
    snprintf(shard, sizeof(shard), "%s/s.safetensors", fuzz_dir());
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", fuzz_dir());
    if (acc == NULL) {
        float w[4] = {1, 2, 3, 4};
        accel_named_tensor t = {"w", accel_tensor_view(w, ACCEL_F32, 1, (int64_t[]){4})};
        if (accel_init(&acc, NULL) != ACCEL_OK || accel_model_new(acc, &model) != ACCEL_OK ||
            accel_model_add_param(model, "w", 1, (int64_t[]){4}, NULL) != ACCEL_OK ||
            accel_model_add_param(model, "b", 1, (int64_t[]){2}, NULL) != ACCEL_OK ||
            accel_safetensors_write(shard, &t, 1, NULL, 0) != ACCEL_OK) {
            abort(); /* the harness itself is broken */
        }
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return;
    }
    fwrite(data, 1, size, f);
    fclose(f);
    (void)accel_load_model(acc, model, path, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 1 && data[0] % 5 == 3) {
        marker(data + 1, size - 1);
        return 0;
    }
    if (size >= 1 && data[0] % 5 == 4) {
        index_file(data + 1, size - 1);
        return 0;
    }
    if (size < 1) {
        return 0;
    }
    const char *path = write_temp(data + 1, size - 1);
    if (path == NULL) {
        return 0;
    }
    switch (data[0] % 5) {
    case 0: {
        accel__config cfg;
        if (accel__config_load(path, &cfg) == ACCEL_OK) {
            accel__config_free(&cfg);
        }
        break;
    }
    case 1:
        token_file(path, ACCEL_TOKENS_AUTO, 1 + data[0] / 5 % 8);
        break;
    default:
        token_file(path, ACCEL_TOKENS_LLMC, 1 + data[0] / 5 % 8);
        break;
    }
    unlink(path);
    return 0;
}
