/*
 * safetensors writer (format: include/accel/ckpt.h; the reader is safetensors_read.c).
 *
 * The writer reproduces the reference writer's layout byte for byte (sort order, compact JSON,
 * "__metadata__" first, space padding to 8 bytes) so files are interchangeable.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "accel/ckpt.h"
#include "ckpt/atomic.h"
#include "ckpt/devio.h"
#include "ckpt/safetensors.h"
#include "core/internal.h"

/*
 * Position of each dtype in the reference's Dtype enum, which is declared in increasing
 * alignment order; the writer sorts by it descending.
 */
static int dtype_rank(accel_dtype dt)
{
    switch (dt) {
    case ACCEL_BOOL:
        return 0;
    case ACCEL_F4:
        return 1;
    case ACCEL_F6_E2M3:
        return 2;
    case ACCEL_F6_E3M2:
        return 3;
    case ACCEL_U8:
        return 4;
    case ACCEL_I8:
        return 5;
    case ACCEL_F8_E5M2:
        return 6;
    case ACCEL_F8_E4M3:
        return 7;
    case ACCEL_F8_E8M0:
        return 8;
    case ACCEL_F8_E4M3FNUZ:
        return 9;
    case ACCEL_F8_E5M2FNUZ:
        return 10;
    case ACCEL_I16:
        return 11;
    case ACCEL_U16:
        return 12;
    case ACCEL_F16:
        return 13;
    case ACCEL_BF16:
        return 14;
    case ACCEL_I32:
        return 15;
    case ACCEL_U32:
        return 16;
    case ACCEL_F32:
        return 17;
    case ACCEL_C64:
        return 18;
    case ACCEL_F64:
        return 19;
    case ACCEL_I64:
        return 20;
    case ACCEL_U64:
        return 21;
    default:
        return -1;
    }
}

int accel__st_tensor_bytes(accel_dtype dt, int ndim, const int64_t *shape, uint64_t *nbytes)
{
    uint64_t bits = accel_dtype_bits(dt);
    for (int d = 0; d < ndim; d++) {
        if (__builtin_mul_overflow(bits, (uint64_t)shape[d], &bits)) {
            return 0;
        }
    }
    *nbytes = bits / 8;
    return bits % 8 == 0 ? 1 : -1;
}

typedef struct write_item {
    const accel_named_tensor *t;
    uint64_t nbytes;
} write_item;

static int cmp_write_item(const void *a, const void *b)
{
    const write_item *x = a, *y = b;
    int rx = dtype_rank(x->t->tensor.dtype), ry = dtype_rank(y->t->tensor.dtype);
    if (rx != ry) {
        return ry - rx; /* descending alignment */
    }
    return strcmp(x->t->name, y->t->name);
}

static accel_status check_write_tensor(const char *path, const accel_named_tensor *nt,
                                       uint64_t *nbytes)
{
    const accel_tensor *t = &nt->tensor;
    if (nt->name == NULL || nt->name[0] == '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: a tensor has an empty or NULL name", path);
    }
    if (strcmp(nt->name, "__metadata__") == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "%s: \"__metadata__\" is reserved, not a tensor "
                             "name",
                             path);
    }
    if (dtype_rank(t->dtype) < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: tensor '%s' has unknown dtype %d", path,
                             nt->name, (int)t->dtype);
    }
    if (t->ndim < 0 || t->ndim > ACCEL_MAX_DIMS) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: tensor '%s' has ndim %d", path, nt->name,
                             t->ndim);
    }
    accel_status dst = t->device.type != ACCEL_DEVICE_CPU ? accel__devio_check(t->device) : 0;
    if (dst != ACCEL_OK) {
        return accel__seterr(NULL, dst, "%s: tensor '%s': %s", path, nt->name,
                             accel_last_error(NULL));
    }
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) {
            return accel__seterr(NULL, ACCEL_EINVAL, "%s: tensor '%s' has negative dimension %d",
                                 path, nt->name, d);
        }
    }
    uint64_t n = 0;
    int fits = accel__st_tensor_bytes(t->dtype, t->ndim, t->shape, &n);
    if (fits <= 0) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: tensor '%s' %s", path, nt->name,
                             fits == 0 ? "is too large"
                                       : "has sub-byte elements that do not fill whole bytes");
    }
    if (n > 0 && t->data == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: tensor '%s' has NULL data", path, nt->name);
    }
    *nbytes = n;
    return ACCEL_OK;
}

/* Builds the header JSON text (unpadded) for the sorted items. Returns a malloc'd string. */
static accel_status build_header(const char *path, const write_item *items, size_t n,
                                 const accel_kv *metadata, size_t n_metadata, char **out)
{
    json_t *root = json_object();
    accel_status st = root ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    if (st == ACCEL_OK && n_metadata > 0) {
        json_t *meta = json_object();
        json_object_set_new(root, "__metadata__", meta);
        for (size_t i = 0; st == ACCEL_OK && i < n_metadata; i++) {
            const char *k = metadata[i].key, *v = metadata[i].value;
            if (k == NULL || v == NULL || json_object_get(meta, k) != NULL) {
                st = accel__seterr(NULL, ACCEL_EINVAL,
                                   "%s: metadata entry %zu (key '%s') is "
                                   "NULL or duplicate",
                                   path, i, k ? k : "(null)");
            } else if (json_object_set_new(meta, k, json_string(v)) != 0) {
                /* json_string returns NULL for invalid UTF-8 and set_new then fails. */
                st = accel__seterr(NULL, ACCEL_EINVAL,
                                   "%s: metadata entry '%s' is not valid "
                                   "UTF-8",
                                   path, k);
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        const accel_tensor *t = &items[i].t->tensor;
        json_t *info = json_object(), *shape = json_array(), *offs = json_array();
        if (info == NULL || shape == NULL || offs == NULL) {
            json_decref(info);
            json_decref(shape);
            json_decref(offs);
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
            break;
        }
        for (int d = 0; d < t->ndim; d++) {
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        }
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + items[i].nbytes)));
        off += items[i].nbytes;
        json_object_set_new(info, "dtype", json_string(accel_dtype_name(t->dtype)));
        json_object_set_new(info, "shape", shape);
        json_object_set_new(info, "data_offsets", offs);
        const char *name = items[i].t->name;
        if (json_object_get(root, name) != NULL) {
            json_decref(info);
            st = accel__seterr(NULL, ACCEL_EINVAL, "%s: duplicate tensor name '%s'", path, name);
        } else if (json_object_set_new(root, name, info) != 0) {
            st = accel__seterr(NULL, ACCEL_EINVAL, "%s: tensor name '%s' is not valid UTF-8", path,
                               name);
        }
    }
    char *text = NULL;
    if (st == ACCEL_OK) {
        text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (text == NULL) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "%s: cannot encode the header", path);
        }
    }
    json_decref(root);
    if (st == ACCEL_OK) {
        *out = text;
    }
    return st;
}

/* Checks and sorts the tensors and builds the padded header (owned: accel__free) of the file
 * the writer writes; need_data: every non-empty tensor must have data. */
static accel_status prepare_write(const char *path, const accel_named_tensor *tensors, size_t n,
                                  const accel_kv *metadata, size_t n_metadata, int need_data,
                                  write_item **items_out, char **header_out, size_t *hlen_out)
{
    write_item *items = accel__calloc(n ? n : 1, sizeof *items);
    if (items == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", path);
    }
    accel_status st = ACCEL_OK;
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        items[i].t = &tensors[i];
        accel_named_tensor probe = tensors[i];
        if (!need_data && probe.tensor.data == NULL) {
            probe.tensor.data = (void *)path; /* header only: any non-NULL address */
        }
        st = check_write_tensor(path, &probe, &items[i].nbytes);
    }
    if (st == ACCEL_OK) {
        qsort(items, n, sizeof *items, cmp_write_item);
    }
    char *json = NULL;
    if (st == ACCEL_OK) {
        st = build_header(path, items, n, metadata, n_metadata, &json);
    }
    char *header = NULL;
    size_t hlen = 0;
    if (st == ACCEL_OK) {
        size_t jlen = strlen(json);
        size_t padded = (jlen + 7) & ~(size_t)7;
        if (padded > ACCEL__ST_MAX_HEADER_NBYTES) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "%s: header of %zu bytes exceeds the "
                               "safetensors limit of %llu",
                               path, padded, ACCEL__ST_MAX_HEADER_NBYTES);
        } else if ((header = accel__malloc(8 + padded)) == NULL) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", path);
        } else {
            uint64_t le = padded;
            for (int b = 0; b < 8; b++) {
                header[b] = (char)((le >> (8 * b)) & 0xff);
            }
            memcpy(header + 8, json, jlen);
            memset(header + 8 + jlen, ' ', padded - jlen);
            hlen = 8 + padded;
        }
    }
    free(json); /* allocated by jansson */
    if (st != ACCEL_OK) {
        accel__free(items);
        return st;
    }
    *items_out = items;
    *header_out = header;
    *hlen_out = hlen;
    return ACCEL_OK;
}

accel_status accel__safetensors_header(const char *path, const accel_named_tensor *tensors,
                                       size_t n, const accel_kv *metadata, size_t n_metadata,
                                       char **header, size_t *hlen, uint64_t *data_start)
{
    write_item *items;
    ACCEL_TRY(prepare_write(path, tensors, n, metadata, n_metadata, 0, &items, header, hlen));
    uint64_t at = *hlen;
    for (size_t k = 0; k < n; k++) {
        data_start[items[k].t - tensors] = at;
        at += items[k].nbytes;
    }
    accel__free(items);
    return ACCEL_OK;
}

typedef struct file_sink {
    int fd;
    const char *path;
} file_sink;

static accel_status write_to(void *ctx, const void *data, size_t n)
{
    const file_sink *f = ctx;
    return accel__write_all(f->fd, data, n, f->path);
}

accel_status accel_safetensors_write(const char *path, const accel_named_tensor *tensors, size_t n,
                                     const accel_kv *metadata, size_t n_metadata)
{
    if (path == NULL || (n > 0 && tensors == NULL) || (n_metadata > 0 && metadata == NULL)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_safetensors_write: NULL %s",
                             path == NULL          ? "path"
                             : (n > 0 && !tensors) ? "tensors"
                                                   : "metadata");
    }
    write_item *items = NULL;
    char *header = NULL;
    size_t hlen = 0;
    accel_status st =
        prepare_write(path, tensors, n, metadata, n_metadata, 1, &items, &header, &hlen);
    accel__afile f = {.fd = -1};
    if (st == ACCEL_OK) {
        st = accel__afile_open(&f, path);
        if (st == ACCEL_OK) {
            st = accel__write_all(f.fd, header, hlen, path);
            file_sink sink = {f.fd, path};
            accel__devio *io = NULL; /* device memory comes through staging (devio.h) */
            for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
                const accel_tensor *t = &items[i].t->tensor;
                st = accel__devio_to_host(&io, t->device, t->data, (size_t)items[i].nbytes,
                                          write_to, &sink);
            }
            accel__devio_free(io);
            st = st == ACCEL_OK ? accel__afile_commit(&f) : (accel__afile_abort(&f), st);
        }
    }
    accel__free(header);
    accel__free(items);
    return st;
}
