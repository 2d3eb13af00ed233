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

/* ---- sharded folders ---- */

/* Is `name` "<prefix>-NNNNN-of-NNNNN.safetensors"? */
static int is_shard_name(const char *name, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) {
        return 0;
    }
    const char *p = name + pl;
    static const char pattern[] = "-#####-of-#####.safetensors";
    for (size_t i = 0; i < sizeof pattern - 1; i++) {
        if (pattern[i] == '#' ? !isdigit((unsigned char)p[i]) : p[i] != pattern[i]) {
            return 0;
        }
    }
    return p[sizeof pattern - 1] == '\0';
}

/* Deletes files of an earlier save that the new one does not contain. */
static accel_status remove_stale(const char *dir, const char *prefix, char **keep, size_t n_keep,
                                 int sharded)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot list %s: %s", dir, strerror(errno));
    }
    char single[300], index[320];
    snprintf(single, sizeof single, "%s.safetensors", prefix);
    snprintf(index, sizeof index, "%s.safetensors.index.json", prefix);
    accel_status st = ACCEL_OK;
    for (struct dirent *e; st == ACCEL_OK && (e = readdir(d)) != NULL;) {
        int stale = 0;
        if (is_shard_name(e->d_name, prefix)) {
            stale = 1;
            for (size_t i = 0; i < n_keep; i++) {
                stale &= strcmp(keep[i], e->d_name) != 0;
            }
        } else if (sharded) {
            /* A leftover single file would shadow the shards for loaders that look for it
             * first (transformers does). */
            stale = strcmp(e->d_name, single) == 0;
        } else {
            stale = strcmp(e->d_name, index) == 0;
        }
        if (stale) {
            char *p = accel__path_join(dir, e->d_name);
            st = p ? accel__rmtree(p) : ACCEL_ENOMEM;
            accel__free(p);
        }
    }
    closedir(d);
    return st;
}

static accel_status write_index(const char *dir, const char *prefix,
                                const accel_named_tensor *tensors, const size_t *shard_of, size_t n,
                                char **files, uint64_t total)
{
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    if (!root || !meta || !map) {
        json_decref(root);
        json_decref(meta);
        json_decref(map);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    for (size_t i = 0; i < n; i++) {
        json_object_set_new(map, tensors[i].name, json_string(files[shard_of[i]]));
    }
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", map);
    /* Python's json.dumps(indent=2, sort_keys=True) + "\n", as save_model writes it. */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    char name[320];
    snprintf(name, sizeof name, "%s.safetensors.index.json", prefix);
    char *path = accel__path_join(dir, name);
    size_t tl = text ? strlen(text) : 0;
    char *buf = text ? accel__malloc(tl + 2) : NULL;
    accel_status st = (text && path && buf) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    if (st == ACCEL_OK) {
        memcpy(buf, text, tl);
        buf[tl] = '\n';
        st = accel__write_file_atomic(path, buf, tl + 1);
    }
    free(text);
    accel__free(buf);
    accel__free(path);
    return st;
}

/*
 * huggingface_hub's split, in the given tensor order: a tensor larger than the limit becomes a
 * shard of its own at once; otherwise the open shard is closed (numbered) when adding the
 * tensor would overflow it. Shard numbers follow the order shards are closed. Returns the
 * number of shards (at least 1: an empty set still writes one empty file).
 */
#define SHARD_PENDING SIZE_MAX
static size_t plan_shards(const accel_named_tensor *tensors, size_t n, uint64_t max,
                          size_t *shard_of, uint64_t *total)
{
    size_t n_shards = 0, open_start = 0;
    uint64_t open_nbytes = 0;
    int open_nonempty = 0;
    *total = 0;
    for (size_t i = 0; i <= n; i++) {
        uint64_t nb = i < n ? accel_tensor_nbytes(&tensors[i].tensor) : 0;
        *total += nb;
        if (i < n && nb > max) {
            shard_of[i] = n_shards++;
            continue;
        }
        if (open_nonempty && (i == n || open_nbytes + nb > max)) {
            for (size_t j = open_start; j < i; j++) {
                if (shard_of[j] == SHARD_PENDING) {
                    shard_of[j] = n_shards;
                }
            }
            n_shards++;
            open_nbytes = 0;
            open_nonempty = 0;
        }
        if (i < n) {
            if (!open_nonempty) {
                open_start = i;
            }
            shard_of[i] = SHARD_PENDING;
            open_nbytes += nb;
            open_nonempty = 1;
        }
    }
    return n_shards ? n_shards : 1;
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
    prefix = prefix ? prefix : "model";
    if (prefix[0] == '\0' || strchr(prefix, '/') != NULL || strlen(prefix) > 200) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_save_sharded: bad prefix \"%s\"", prefix);
    }
    if (max_shard_nbytes == 0) {
        max_shard_nbytes = UINT64_MAX;
    }
    ACCEL_TRY(accel__mkdirs(dir));

    size_t *shard_of = accel__calloc(n ? n : 1, sizeof(size_t));
    if (shard_of == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    uint64_t total = 0;
    size_t n_shards = plan_shards(tensors, n, max_shard_nbytes, shard_of, &total);

    char **files = accel__calloc(n_shards, sizeof(char *));
    accel_named_tensor *sel = accel__calloc(n ? n : 1, sizeof *sel);
    accel_status st = (files && sel) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    for (size_t s = 0; st == ACCEL_OK && s < n_shards; s++) {
        char name[320];
        if (n_shards == 1) {
            snprintf(name, sizeof name, "%s.safetensors", prefix);
        } else {
            snprintf(name, sizeof name, "%s-%05zu-of-%05zu.safetensors", prefix, s + 1, n_shards);
        }
        files[s] = accel__strdup(name);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (shard_of[i] == s) {
                sel[k++] = tensors[i];
            }
        }
        char *path = accel__path_join(dir, name);
        st = (files[s] && path) ? accel_safetensors_write(path, sel, k, metadata, n_metadata)
                                : ACCEL_ENOMEM;
        accel__free(path);
    }
    if (st == ACCEL_OK && n_shards > 1) {
        st = write_index(dir, prefix, tensors, shard_of, n, files, total);
    }
    if (st == ACCEL_OK) {
        st = remove_stale(dir, prefix, files, n_shards, n_shards > 1);
    }
    if (st == ACCEL_OK) {
        st = accel__fsync_dir(dir);
    }
    for (size_t s = 0; files && s < n_shards; s++) {
        accel__free(files[s]);
    }
    accel__free(files);
    accel__free(sel);
    accel__free(shard_of);
    return st;
}
