/*
 * safetensors memory-mapped reader (format: include/accel/ckpt.h; the writer is safetensors.c).
 *
 * The reader accepts exactly what the reference reader accepts: a file that opens here has
 * every tensor's bytes inside the mapping, contiguous from offset 0, and sized shape x dtype;
 * anything else is ACCEL_ECORRUPT naming the file and the tensor or field.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/ckpt.h"
#include "base/fs.h"
#include "ckpt/safetensors.h"
#include "core/internal.h"

typedef struct st_entry {
    char *name;
    accel_dtype dtype;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    uint64_t begin, end; /* relative to the data section */
    void *data;          /* into the mapping, or `copy` when the mapping is misaligned */
    void *copy;          /* aligned private copy (accel__aligned_alloc) or NULL */
} st_entry;

struct accel_safetensors {
    char *path;
    void *map;
    size_t map_nbytes;
    st_entry *entries; /* file order (by begin offset) */
    size_t n;
    size_t *by_name; /* entry indices sorted by name, for find */
    char **meta_keys, **meta_values;
    size_t n_meta;
};

/* Strict UTF-8 check (no overlongs, no surrogates, <= U+10FFFF), as Rust's from_utf8. */
static int valid_utf8(const unsigned char *s, size_t n, size_t *bad_at)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned min, cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, min = 0x80, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, min = 0x800, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, min = 0x10000, cp = c & 0x07;
        } else {
            *bad_at = i;
            return 0;
        }
        if (i + len > n) {
            *bad_at = i;
            return 0;
        }
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                *bad_at = i;
                return 0;
            }
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            *bad_at = i;
            return 0;
        }
        i += len;
    }
    return 1;
}

static accel_status corrupt(const accel_safetensors *st, const char *fmt, const char *a,
                            const char *b)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, b);
    return accel__seterr(NULL, ACCEL_ECORRUPT, "%s: %s", st->path, msg);
}

/* A JSON value as a non-negative integer that fits int64. */
static int json_nonneg(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return 0;
    }
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static accel_status parse_entry(accel_safetensors *st, const char *name, json_t *info, st_entry *e)
{
    if (!json_is_object(info)) {
        return corrupt(st, "tensor '%s': entry is not a JSON object%s", name, "");
    }
    json_t *jd = json_object_get(info, "dtype"), *js = json_object_get(info, "shape");
    json_t *jo = json_object_get(info, "data_offsets");
    if (!json_is_string(jd)) {
        return corrupt(st, "tensor '%s': field \"dtype\" is missing or not a string%s", name, "");
    }
    const char *dname = json_string_value(jd);
    if (accel_dtype_from_name(dname, &e->dtype) != ACCEL_OK) {
        return corrupt(st, "tensor '%s': unknown dtype \"%s\"", name, dname);
    }
    if (!json_is_array(js)) {
        return corrupt(st, "tensor '%s': field \"shape\" is missing or not an array%s", name, "");
    }
    if (json_array_size(js) > ACCEL_MAX_DIMS) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "%s: tensor '%s' has %zu dimensions; "
                             "accel supports up to %d",
                             st->path, name, json_array_size(js), ACCEL_MAX_DIMS);
    }
    e->ndim = (int)json_array_size(js);
    for (int d = 0; d < e->ndim; d++) {
        uint64_t v;
        if (!json_nonneg(json_array_get(js, (size_t)d), &v)) {
            return corrupt(st,
                           "tensor '%s': field \"shape\" holds a value that is not a "
                           "non-negative integer%s",
                           name, "");
        }
        e->shape[d] = (int64_t)v;
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_nonneg(json_array_get(jo, 0), &e->begin) ||
        !json_nonneg(json_array_get(jo, 1), &e->end)) {
        return corrupt(st,
                       "tensor '%s': field \"data_offsets\" is not [begin, end] with "
                       "non-negative integers%s",
                       name, "");
    }
    if (e->end < e->begin) {
        return corrupt(st, "tensor '%s': data_offsets end before they begin%s", name, "");
    }
    /* Size from shape x dtype, checked as the reference does. */
    uint64_t nbytes = 0;
    int fits = accel__st_tensor_bytes(e->dtype, e->ndim, e->shape, &nbytes);
    if (fits == 0) {
        return corrupt(st, "tensor '%s': shape x dtype size overflows (field \"shape\")%s", name,
                       "");
    }
    if (fits < 0) {
        return corrupt(st, "tensor '%s': its %s elements do not fill whole bytes", name, dname);
    }
    if (e->end - e->begin != nbytes) {
        char buf[128];
        snprintf(buf, sizeof buf, "%llu bytes but shape x %s needs %llu",
                 (unsigned long long)(e->end - e->begin), dname, (unsigned long long)nbytes);
        return corrupt(st, "tensor '%s': field \"data_offsets\" spans %s", name, buf);
    }
    e->name = accel__strdup(name);
    return e->name ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
}

static accel_status parse_metadata(accel_safetensors *st, json_t *meta)
{
    if (!json_is_object(meta)) {
        return corrupt(st, "field \"__metadata__\" is not a JSON object%s%s", "", "");
    }
    size_t n = json_object_size(meta);
    st->meta_keys = accel__calloc(n ? n : 1, sizeof(char *));
    st->meta_values = accel__calloc(n ? n : 1, sizeof(char *));
    if (st->meta_keys == NULL || st->meta_values == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v)
    {
        if (!json_is_string(v)) {
            return corrupt(st, "field \"__metadata__\": value of key '%s' is not a string%s", k,
                           "");
        }
        st->meta_keys[st->n_meta] = accel__strdup(k);
        st->meta_values[st->n_meta] = accel__strdup(json_string_value(v));
        st->n_meta++;
        if (!st->meta_keys[st->n_meta - 1] || !st->meta_values[st->n_meta - 1]) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
    }
    return ACCEL_OK;
}

static int cmp_entry_offset(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) {
        return x->begin < y->begin ? -1 : 1;
    }
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
    const st_entry *e = ctx;
    return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

/* Parses and validates the header at map[8, 8 + hlen); fills entries and metadata. */
static accel_status parse_header(accel_safetensors *st, uint64_t hlen)
{
    const unsigned char *hdr = (const unsigned char *)st->map + 8;
    size_t bad;
    if (!valid_utf8(hdr, (size_t)hlen, &bad)) {
        char at[32];
        snprintf(at, sizeof at, "%zu", bad);
        return corrupt(st, "header is not valid UTF-8 (byte %s of the JSON)%s", at, "");
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        char where[64];
        snprintf(where, sizeof where, "line %d column %d", jerr.line, jerr.column);
        return corrupt(st, "header is not valid JSON (%s: %s)", where, jerr.text);
    }
    accel_status rc = ACCEL_OK;
    if (!json_is_object(root)) {
        rc = corrupt(st, "header is not a JSON object%s%s", "", "");
        goto out;
    }
    size_t cap = json_object_size(root);
    st->entries = accel__calloc(cap ? cap : 1, sizeof *st->entries);
    if (st->entries == NULL) {
        rc = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(st, val);
        } else {
            rc = parse_entry(st, key, val, &st->entries[st->n]);
            st->n += rc == ACCEL_OK;
        }
        if (rc != ACCEL_OK) {
            goto out;
        }
    }
    /* Offsets may come in any order in the JSON (older writers sorted by name): validate them
     * in offset order, which must tile [0, data size) exactly. */
    qsort(st->entries, st->n, sizeof *st->entries, cmp_entry_offset);
    uint64_t expect = 0;
    for (size_t i = 0; i < st->n; i++) {
        st_entry *e = &st->entries[i];
        if (e->begin != expect) {
            char buf[160];
            if (e->begin < expect) {
                snprintf(buf, sizeof buf, "begin %llu overlaps '%.100s', which ends at %llu",
                         (unsigned long long)e->begin, i ? st->entries[i - 1].name : "",
                         (unsigned long long)expect);
            } else {
                snprintf(buf, sizeof buf, "begin %llu leaves a hole after offset %llu",
                         (unsigned long long)e->begin, (unsigned long long)expect);
            }
            rc = corrupt(st, "tensor '%s': field \"data_offsets\" %s", e->name, buf);
            goto out;
        }
        expect = e->end;
    }
    uint64_t covered;
    if (__builtin_add_overflow(expect, 8 + hlen, &covered) || covered != st->map_nbytes) {
        char buf[128];
        snprintf(buf, sizeof buf, "file has %zu bytes but header and tensor data cover %llu",
                 st->map_nbytes, (unsigned long long)(8 + hlen) + (unsigned long long)expect);
        rc = corrupt(st, "%s (%s)", buf,
                     covered > st->map_nbytes ? "tensor data runs past the end of the file"
                                              : "trailing bytes after the last tensor");
        goto out;
    }
out:
    json_decref(root);
    return rc;
}

/* Points every entry at its bytes; copies the ones the mapping leaves misaligned (files from
 * writers that do not sort by alignment) so views can be dereferenced as their type. */
static accel_status bind_data(accel_safetensors *st, uint64_t hlen)
{
    char *base = (char *)st->map + 8 + hlen;
    for (size_t i = 0; i < st->n; i++) {
        st_entry *e = &st->entries[i];
        e->data = base + e->begin;
        size_t align = accel_dtype_nbytes(e->dtype);
        if (align > 1 && ((uintptr_t)e->data % align) != 0 && e->end > e->begin) {
            e->copy = accel__aligned_alloc((size_t)(e->end - e->begin));
            if (e->copy == NULL) {
                return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory reading %s", st->path);
            }
            memcpy(e->copy, e->data, (size_t)(e->end - e->begin));
            e->data = e->copy;
        }
    }
    st->by_name = accel__malloc((st->n ? st->n : 1) * sizeof(size_t));
    if (st->by_name == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < st->n; i++) {
        st->by_name[i] = i;
    }
    qsort_r(st->by_name, st->n, sizeof(size_t), cmp_by_name, st->entries);
    return ACCEL_OK;
}

/* Opens `path`, or, with `map`, takes over that private writable mapping of its `map_nbytes`
 * bytes (owned from here, whatever the result). */
static accel_status open_st(accel_safetensors **out, const char *path, void *map,
                            size_t map_nbytes)
{
    if (out == NULL || path == NULL) {
        if (map != NULL) {
            munmap(map, map_nbytes);
        }
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_safetensors_open: NULL %s",
                             out ? "path" : "out");
    }
    accel_safetensors *st = accel__calloc(1, sizeof *st);
    if (st == NULL || (st->path = accel__strdup(path)) == NULL) {
        accel__free(st);
        if (map != NULL) {
            munmap(map, map_nbytes);
        }
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory opening %s", path);
    }
    accel_status rc = ACCEL_OK;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below). */
    int fd = map != NULL ? -1 : open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (map != NULL) {
        st->map = map; /* checked by the caller: a regular file, at least 8 bytes */
        st->map_nbytes = map_nbytes;
    } else if (fd < 0) {
        rc = accel__seterr(NULL, errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
                           "cannot open %s: %s", path, strerror(errno));
    } else if (fstat(fd, &sb) != 0) {
        rc = accel__seterr(NULL, ACCEL_EIO, "cannot stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        rc = accel__seterr(NULL, ACCEL_EINVAL, "%s is %s, not a safetensors file", path,
                           accel__file_kind(sb.st_mode));
    } else if (sb.st_size < 8) {
        char sz[32];
        snprintf(sz, sizeof sz, "%lld", (long long)sb.st_size);
        rc = corrupt(st, "truncated: %s bytes, shorter than the 8-byte header length%s", sz, "");
    } else {
        st->map_nbytes = (size_t)sb.st_size;
        /* Private and writable: views can be modified in place without touching the file. */
        st->map = mmap(NULL, st->map_nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (st->map == MAP_FAILED) {
            st->map = NULL;
            rc = accel__seterr(NULL, ACCEL_EIO, "cannot map %s: %s", path, strerror(errno));
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    uint64_t hlen = 0;
    if (rc == ACCEL_OK) {
        const unsigned char *p = st->map;
        for (int b = 7; b >= 0; b--) {
            hlen = (hlen << 8) | p[b];
        }
        char a[32], b2[32];
        snprintf(a, sizeof a, "%llu", (unsigned long long)hlen);
        snprintf(b2, sizeof b2, "%zu", st->map_nbytes);
        if (hlen > ACCEL__ST_MAX_HEADER_NBYTES) {
            rc = corrupt(st, "header length %s exceeds the 100000000-byte limit%s", a, "");
        } else if (hlen > st->map_nbytes - 8) {
            rc = corrupt(st, "header length %s runs past the end of the file (%s bytes)", a, b2);
        }
    }
    if (rc == ACCEL_OK) {
        rc = parse_header(st, hlen);
    }
    if (rc == ACCEL_OK) {
        rc = bind_data(st, hlen);
    }
    if (rc != ACCEL_OK) {
        accel_safetensors_close(st);
        return rc;
    }
    *out = st;
    return ACCEL_OK;
}

accel_status accel_safetensors_open(accel_safetensors **out, const char *path)
{
    return open_st(out, path, NULL, 0);
}

accel_status accel__safetensors_open_map(accel_safetensors **out, const char *path, void *map,
                                         size_t map_nbytes)
{
    if (map_nbytes < 8) { /* too short to be one: the file's own open says why */
        munmap(map, map_nbytes);
        return open_st(out, path, NULL, 0);
    }
    return open_st(out, path, map, map_nbytes);
}

void accel_safetensors_close(accel_safetensors *st)
{
    if (st == NULL) {
        return;
    }
    for (size_t i = 0; i < st->n; i++) {
        accel__free(st->entries[i].name);
        accel__aligned_free(st->entries[i].copy);
    }
    for (size_t i = 0; i < st->n_meta; i++) {
        accel__free(st->meta_keys[i]);
        accel__free(st->meta_values[i]);
    }
    accel__free(st->meta_keys);
    accel__free(st->meta_values);
    accel__free(st->entries);
    accel__free(st->by_name);
    if (st->map != NULL) {
        munmap(st->map, st->map_nbytes);
    }
    accel__free(st->path);
    accel__free(st);
}

size_t accel_safetensors_count(const accel_safetensors *st)
{
    return st ? st->n : 0;
}

const char *accel_safetensors_name(const accel_safetensors *st, size_t i)
{
    return (st && i < st->n) ? st->entries[i].name : NULL;
}

const char *accel_safetensors_path(const accel_safetensors *st)
{
    return st ? st->path : NULL;
}

long accel_safetensors_find(const accel_safetensors *st, const char *name)
{
    if (st == NULL || name == NULL) {
        return -1;
    }
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->entries[st->by_name[mid]].name, name);
        if (c == 0) {
            return (long)st->by_name[mid];
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return -1;
}

accel_status accel_safetensors_tensor(const accel_safetensors *st, size_t i, accel_tensor *out)
{
    if (st == NULL || out == NULL || i >= st->n) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_safetensors_tensor: index %zu out of "
                             "range",
                             i);
    }
    const st_entry *e = &st->entries[i];
    *out = accel_tensor_view(e->data, e->dtype, e->ndim, e->shape);
    return ACCEL_OK;
}

accel_status accel_safetensors_get(const accel_safetensors *st, const char *name, accel_tensor *out)
{
    if (st == NULL || name == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_safetensors_get: NULL %s",
                             st == NULL ? "file" : "name");
    }
    long i = accel_safetensors_find(st, name);
    if (i < 0) {
        return accel__seterr(NULL, ACCEL_ENOTFOUND, "%s: no tensor named '%s'", st->path, name);
    }
    return accel_safetensors_tensor(st, (size_t)i, out);
}

size_t accel_safetensors_metadata_count(const accel_safetensors *st)
{
    return st ? st->n_meta : 0;
}

accel_status accel_safetensors_metadata_at(const accel_safetensors *st, size_t i, const char **key,
                                           const char **value)
{
    if (st == NULL || i >= st->n_meta) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_safetensors_metadata_at: index %zu out "
                             "of range",
                             i);
    }
    if (key) {
        *key = st->meta_keys[i];
    }
    if (value) {
        *value = st->meta_values[i];
    }
    return ACCEL_OK;
}

const char *accel_safetensors_metadata(const accel_safetensors *st, const char *key)
{
    for (size_t i = 0; st && key && i < st->n_meta; i++) {
        if (strcmp(st->meta_keys[i], key) == 0) {
            return st->meta_values[i];
        }
    }
    return NULL;
}
