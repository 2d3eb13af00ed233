/*
 * libFuzzer harness: any bytes as a .safetensors file must open cleanly or fail with
 * ACCEL_ECORRUPT / ACCEL_EIO, never crash or read out of bounds; every tensor and metadata
 * entry of a file that opens must be readable. Also fuzzes accel_parse_size with the same
 * bytes as a string. Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof(path), "/dev/shm/accel-fuzz-st-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return 0;
    }
    fwrite(data, 1, size, f);
    fclose(f);
    accel_safetensors *st = NULL;
    if (accel_safetensors_open(&st, path) == ACCEL_OK) {
        volatile unsigned sum = 0;
        for (size_t i = 0; i < accel_safetensors_count(st); i++) {
            accel_tensor t;
            const char *name = accel_safetensors_name(st, i);
            if (name == NULL || accel_safetensors_tensor(st, i, &t) != ACCEL_OK) {
                abort(); /* an opened file must serve every tensor it lists */
            }
            size_t nbytes = accel_tensor_nbytes(&t);
            for (size_t k = 0; k < nbytes; k++) {
                sum += ((const unsigned char *)t.data)[k];
            }
        }
        for (size_t i = 0; i < accel_safetensors_metadata_count(st); i++) {
            const char *k, *v;
            if (accel_safetensors_metadata_at(st, i, &k, &v) != ACCEL_OK) {
                abort();
            }
            sum += (unsigned)strlen(k) + (unsigned)strlen(v);
        }
        accel_safetensors_close(st);
    }
    unlink(path);

    char s[64];
    size_t n = size < sizeof(s) - 1 ? size : sizeof(s) - 1;
    memcpy(s, data, n);
    s[n] = '\0';
    uint64_t nbytes;
    (void)accel_parse_size(s, &nbytes);
    return 0;
}
