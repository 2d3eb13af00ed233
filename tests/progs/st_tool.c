/*
 * st_tool: safetensors helper for the interop test (tests/ckpt/test_interop.sh).
 *   st_tool write <all.safetensors> <np.safetensors>
 *       all: every accel dtype (shape [4, d+1], byte i of dtype d = (31 i + 7 d + 1) & 0xff,
 *       BOOL masked to 0/1), a scalar I64, a zero-sized F32, metadata {"format": "pt",
 *       "writer": "accel"}; np: only the dtypes numpy has, metadata {"format": "pt"}.
 *   st_tool dump <file>
 *       one line per tensor in name order: "name dtype [d0,d1] fnv1a64-hex", then
 *       "meta key=value" lines in key order. Exit 1 (message on stderr) when the file is
 *       rejected, printing the status name first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

static unsigned long long fnv1a(const unsigned char *p, size_t n)
{
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 1099511628211ULL;
    }
    return h;
}

static int numpy_has(accel_dtype d)
{
    return d != ACCEL_BF16 && !(accel_dtype_is_float(d) && accel_dtype_bits(d) <= 8);
}

static int write_files(const char *all_path, const char *np_path)
{
    accel_named_tensor all[ACCEL_DTYPE_COUNT + 2], np[ACCEL_DTYPE_COUNT + 2];
    size_t n_all = 0, n_np = 0;
    static unsigned char bufs[ACCEL_DTYPE_COUNT][8 * 4 * (ACCEL_DTYPE_COUNT + 1)];
    static char names[ACCEL_DTYPE_COUNT][32];
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        /* 4 rows: the 6-bit dtypes fill whole bytes */
        size_t nb = accel_dtype_bits((accel_dtype)d) * 4 * (size_t)(d + 1) / 8;
        for (size_t i = 0; i < nb; i++) {
            bufs[d][i] = (unsigned char)((31 * i + 7 * (size_t)d + 1) & 0xff);
            if (d == ACCEL_BOOL) {
                bufs[d][i] &= 1;
            }
        }
        snprintf(names[d], sizeof names[d], "t.%s", accel_dtype_name((accel_dtype)d));
        accel_named_tensor t = {
            names[d], accel_tensor_view(bufs[d], (accel_dtype)d, 2, (int64_t[]){4, d + 1})};
        all[n_all++] = t;
        if (numpy_has((accel_dtype)d)) {
            np[n_np++] = t;
        }
    }
    static long long scalar = -1234567890123LL;
    accel_named_tensor s = {"scalar", accel_tensor_view(&scalar, ACCEL_I64, 0, NULL)};
    accel_named_tensor e = {"empty", accel_tensor_view(NULL, ACCEL_F32, 3, (int64_t[]){4, 0, 2})};
    all[n_all++] = s;
    all[n_all++] = e;
    np[n_np++] = s;
    np[n_np++] = e;
    accel_kv meta_all[] = {{"format", "pt"}, {"writer", "accel"}};
    accel_kv meta_np[] = {{"format", "pt"}};
    if (accel_safetensors_write(all_path, all, n_all, meta_all, 2) != ACCEL_OK ||
        accel_safetensors_write(np_path, np, n_np, meta_np, 1) != ACCEL_OK) {
        fprintf(stderr, "st_tool: %s\n", accel_last_error(NULL));
        return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int dump(const char *path)
{
    accel_safetensors *st;
    accel_status rc = accel_safetensors_open(&st, path);
    if (rc != ACCEL_OK) {
        printf("%s\n", accel_status_name(rc));
        fprintf(stderr, "st_tool: %s\n", accel_last_error(NULL));
        return 1;
    }
    size_t n = accel_safetensors_count(st);
    const char **names = malloc((n + 1) * sizeof *names);
    for (size_t i = 0; i < n; i++) {
        names[i] = accel_safetensors_name(st, i);
    }
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        accel_tensor t;
        accel_safetensors_get(st, names[i], &t);
        printf("%s %s [", names[i], accel_dtype_name(t.dtype));
        for (int d = 0; d < t.ndim; d++) {
            printf("%s%lld", d ? "," : "", (long long)t.shape[d]);
        }
        printf("] %016llx\n", fnv1a(t.data, accel_tensor_nbytes(&t)));
    }
    size_t m = accel_safetensors_metadata_count(st);
    const char **keys = malloc((m + 1) * sizeof *keys);
    for (size_t i = 0; i < m; i++) {
        accel_safetensors_metadata_at(st, i, &keys[i], NULL);
    }
    qsort(keys, m, sizeof *keys, cmp_str);
    for (size_t i = 0; i < m; i++) {
        printf("meta %s=%s\n", keys[i], accel_safetensors_metadata(st, keys[i]));
    }
    free(keys);
    free(names);
    accel_safetensors_close(st);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "write") == 0) {
        return write_files(argv[2], argv[3]);
    }
    if (argc == 3 && strcmp(argv[1], "dump") == 0) {
        return dump(argv[2]);
    }
    fprintf(stderr, "usage: st_tool write ALL NP | st_tool dump FILE\n");
    return 2;
}
