/*
 * Saving named tensor sets: size strings ("10GB"), accelerator.save (main process writes,
 * everyone returns its status) and huggingface_hub-style sharded folders with an index.
 *
 * Invariant of a sharded save: every new file is complete (atomic write) before the index
 * naming it is written, and stale files of an earlier save are deleted only after both.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/ckpt.h"
#include "ckpt/atomic.h"
#include "ckpt/devio.h"
#include "ckpt/stset.h"
#include "comm/comm.h"
#include "core/internal.h"

accel_status accel_parse_size(const char *s, uint64_t *nbytes)
{
    if (s == NULL || nbytes == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_parse_size: NULL argument");
    }
    const char *p = s;
    while (isspace((unsigned char)*p)) {
        p++;
    }
    /* Number: digits with an optional fraction (Accelerate parses float(size[:-2])). */
    const char *num = p;
    while (isdigit((unsigned char)*p)) {
        p++;
    }
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) {
            p++;
        }
    }
    if (p == num || (p == num + 1 && *num == '.')) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "size \"%s\": expected a number followed by "
                             "an optional unit (\"10GB\", \"500MiB\")",
                             s);
    }
    char numbuf[64];
    size_t nlen = (size_t)(p - num);
    if (nlen >= sizeof numbuf) {
        return accel__seterr(NULL, ACCEL_EINVAL, "size \"%s\": number too long", s);
    }
    memcpy(numbuf, num, nlen);
    numbuf[nlen] = '\0';
    /* Unit, trimmed of trailing spaces. */
    const char *u = p;
    size_t ulen = strlen(u);
    while (ulen > 0 && isspace((unsigned char)u[ulen - 1])) {
        ulen--;
    }
    char up[8] = {0};
    if (ulen >= sizeof up) {
        return accel__seterr(NULL, ACCEL_EINVAL, "size \"%s\": unknown unit", s);
    }
    for (size_t i = 0; i < ulen; i++) {
        up[i] = (char)toupper((unsigned char)u[i]);
    }
    double mult = 1.0;
    int bits = 0;
    static const struct {
        const char *unit;
        double mult;
        int decimal;
    } units[] = {{"", 1, 0},
                 {"B", 1, 0},
                 {"KB", 1e3, 1},
                 {"MB", 1e6, 1},
                 {"GB", 1e9, 1},
                 {"TB", 1e12, 1},
                 {"KIB", 1024.0, 0},
                 {"MIB", 1048576.0, 0},
                 {"GIB", 1073741824.0, 0},
                 {"TIB", 1099511627776.0, 0}};
    size_t k;
    for (k = 0; k < sizeof units / sizeof units[0]; k++) {
        if (strcmp(up, units[k].unit) == 0) {
            break;
        }
    }
    if (k == sizeof units / sizeof units[0]) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "size \"%s\": unknown unit \"%.*s\" (use KB, "
                             "MB, GB, TB, KiB, MiB, GiB, TiB)",
                             s, (int)ulen, u);
    }
    mult = units[k].mult;
    /* Accelerate's convert_file_size_to_int: "Gb" (lower-case b on a decimal unit) is bits. */
    bits = units[k].decimal && u[ulen - 1] == 'b';
    double v = strtod(numbuf, NULL) * mult;
    if (!(v < 1.8e19)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "size \"%s\" overflows 64 bits", s);
    }
    uint64_t r = (uint64_t)v; /* truncates as Python's int(float(...) * unit) */
    if (bits) {
        r /= 8;
    }
    if (r == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "size \"%s\" must be positive", s);
    }
    *nbytes = r;
    return ACCEL_OK;
}

accel_status accel__ckpt_share_main_status(accel *acc, accel_status st, const char *what,
                                           const char *path)
{
    int32_t status = st;
    if (accel_num_processes(acc) > 1) {
        /* Everyone learns the writer's outcome, which also makes the others wait for it. */
        accel_status cst = accel__broadcast(acc->comm, &status, 1, ACCEL_I32, 0);
        if (cst != ACCEL_OK) {
            return accel__adopt_thread_error(acc, cst);
        }
        if (status != ACCEL_OK && !accel_is_main_process(acc)) {
            return accel__seterr(acc, ACCEL_EIO,
                                 "%s: the main process failed to write %s (%s); see its log", what,
                                 path ? path : "(null)", accel_status_name((accel_status)status));
        }
    }
    return (accel_status)status;
}

accel_status accel_save(accel *acc, const accel_named_tensor *tensors, size_t n,
                        const accel_kv *metadata, size_t n_metadata, const char *path)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_save: acc is NULL");
    }
    accel_status st = ACCEL_OK;
    if (accel_is_main_process(acc)) {
        st = accel_safetensors_write(path, tensors, n, metadata, n_metadata);
        if (st != ACCEL_OK) {
            accel__adopt_thread_error(acc, st);
        }
    }
    return accel__ckpt_share_main_status(acc, st, "accel_save", path);
}

/* ---- sharded folders (the writing itself: stset.c) ---- */

/* Tensor i of a shard set, written in order from byte `at`. */
typedef struct stset_sink {
    accel__stset *set;
    size_t i;
    uint64_t at;
} stset_sink;

static accel_status write_to(void *ctx, const void *data, size_t n)
{
    stset_sink *s = ctx;
    accel_status st = accel__stset_write(s->set, s->i, s->at, data, n);
    s->at += n;
    return st;
}

accel_status accel_save_sharded(const char *dir, const char *prefix,
                                const accel_named_tensor *tensors, size_t n,
                                const accel_kv *metadata, size_t n_metadata,
                                uint64_t max_shard_nbytes)
{
    if (dir == NULL || (n > 0 && tensors == NULL)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_save_sharded: NULL %s",
                             dir ? "tensors" : "dir");
    }
    for (size_t i = 0; i < n; i++) {
        if (tensors[i].tensor.data == NULL && accel_tensor_nbytes(&tensors[i].tensor) > 0) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_save_sharded: tensor '%s' has NULL data",
                                 tensors[i].name ? tensors[i].name : "(null)");
        }
    }
    accel__stset *set;
    ACCEL_TRY(
        accel__stset_open(&set, dir, prefix, tensors, n, metadata, n_metadata, max_shard_nbytes));
    accel_status st = ACCEL_OK;
    accel__devio *io = NULL; /* device memory comes through staging (devio.h) */
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        stset_sink sink = {set, i, 0};
        st = accel__devio_to_host(&io, tensors[i].tensor.device, tensors[i].tensor.data,
                                  accel_tensor_nbytes(&tensors[i].tensor), write_to, &sink);
    }
    accel__devio_free(io);
    if (st != ACCEL_OK) {
        accel__stset_abort(set);
        return st;
    }
    return accel__stset_commit(set);
}
