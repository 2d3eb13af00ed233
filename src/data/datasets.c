/*
 * Built-in datasets: TensorDataset (rows of borrowed tensors), the token-file dataset (an mmap of
 * llm.c .bin files or headerless token files, served as (input, target) windows) and the bytes
 * dataset (a file or a folder of files as one byte corpus). All are read-only after creation,
 * so `get` is thread-safe. Invariant: every size read from a file is validated against the
 * file's length before any window is served.
 */
#include <stdio.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "data_internal.h"

void accel_dataset_free(accel_dataset *ds)
{
    if (ds == NULL) {
        return;
    }
    if (ds->destroy != NULL) {
        ds->destroy(ds->ctx);
    }
    accel__free(ds);
}

/* ---- TensorDataset ---- */

typedef struct tensor_ds {
    int n;
    char *name[ACCEL_MAX_FIELDS];
    accel_tensor t[ACCEL_MAX_FIELDS];
} tensor_ds;

static int64_t tensor_len(void *ctx)
{
    tensor_ds *d = ctx;
    return d->t[0].shape[0];
}

static accel_status tensor_get(void *ctx, int64_t i, accel_sample *out)
{
    tensor_ds *d = ctx;
    out->n_fields = d->n;
    for (int f = 0; f < d->n; f++) {
        const accel_tensor *t = &d->t[f];
        accel_tensor *o = &out->field[f];
        size_t row = accel_tensor_nbytes(t) / (size_t)(t->shape[0] > 0 ? t->shape[0] : 1);
        o->data = (char *)t->data + (size_t)i * row;
        o->dtype = t->dtype;
        o->device = t->device;
        o->ndim = t->ndim - 1;
        for (int k = 1; k < t->ndim; k++) {
            o->shape[k - 1] = t->shape[k];
        }
        out->name[f] = d->name[f];
    }
    return ACCEL_OK;
}

static void tensor_destroy(void *ctx)
{
    tensor_ds *d = ctx;
    for (int f = 0; f < d->n; f++) {
        accel__free(d->name[f]);
    }
    accel__free(d);
}

accel_status accel_tensor_dataset_new(accel_dataset **out, int n_fields, const char *const *names,
                                      const accel_tensor *tensors)
{
    if (out == NULL || names == NULL || tensors == NULL || n_fields < 1 ||
        n_fields > ACCEL_MAX_FIELDS) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_tensor_dataset_new: need 1..%d fields with names and tensors",
                             ACCEL_MAX_FIELDS);
    }
    for (int f = 0; f < n_fields; f++) {
        if (tensors[f].ndim < 1 || tensors[f].ndim > ACCEL_MAX_DIMS || names[f] == NULL) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_tensor_dataset_new: tensor %d needs a name and ndim >= 1",
                                 f);
        }
        /* Rows are views at data + i * row: NULL data would hand out small non-NULL pointers,
         * and a negative dimension a negative length. */
        int empty = 0;
        for (int d = 0; d < tensors[f].ndim; d++) {
            if (tensors[f].shape[d] < 0) {
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "accel_tensor_dataset_new: tensor %d (\"%s\") has dimension "
                                     "%d = %lld",
                                     f, names[f], d, (long long)tensors[f].shape[d]);
            }
            empty |= tensors[f].shape[d] == 0;
        }
        if (tensors[f].data == NULL && !empty) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_tensor_dataset_new: tensor %d (\"%s\") has NULL data", f,
                                 names[f]);
        }
        if (tensors[f].shape[0] != tensors[0].shape[0]) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_tensor_dataset_new: tensor %d (\"%s\") has %lld rows, "
                                 "tensor 0 has %lld",
                                 f, names[f], (long long)tensors[f].shape[0],
                                 (long long)tensors[0].shape[0]);
        }
    }
    tensor_ds *d = accel__calloc(1, sizeof(*d));
    accel_dataset *ds = accel__calloc(1, sizeof(*ds));
    if (d == NULL || ds == NULL) {
        accel__free(d);
        accel__free(ds);
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_tensor_dataset_new: out of memory");
    }
    for (int f = 0; f < n_fields; f++) {
        d->t[f] = tensors[f];
        d->name[f] = accel__strdup(names[f]);
        d->n = f + 1;
        if (d->name[f] == NULL) {
            tensor_destroy(d);
            accel__free(ds);
            return accel__seterr(NULL, ACCEL_ENOMEM, "accel_tensor_dataset_new: out of memory");
        }
    }
    ds->ctx = d;
    ds->len = tensor_len;
    ds->get = tensor_get;
    ds->destroy = tensor_destroy;
    *out = ds;
    return ACCEL_OK;
}

/* ---- windows over a token / byte array ---- */

#define LLMC_HEADER_INTS 256
#define LLMC_MAGIC_GPT2 20240520
#define LLMC_MAGIC_LLAMA3 20240801

typedef struct window_ds {
    uint32_t magic; /* identifies token datasets for accel_token_dataset_num_tokens */
    void *map;      /* mmap of the file, or a heap buffer (bytes folder) */
    size_t map_nbytes;
    int heap;
    const unsigned char *tokens;
    size_t tok_nbytes; /* 1, 2 or 4 */
    int64_t n_tokens, context, stride, n_windows;
    accel_dtype tok_dtype, out_dtype;
} window_ds;

#define WINDOW_MAGIC 0x746f6b73u

static int64_t window_len(void *ctx)
{
    return ((window_ds *)ctx)->n_windows;
}

static int64_t token_at(const window_ds *d, int64_t i)
{
    const unsigned char *p = d->tokens + (size_t)i * d->tok_nbytes;
    if (d->tok_nbytes == 1) {
        return p[0];
    }
    if (d->tok_nbytes == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static accel_status window_get(void *ctx, int64_t i, accel_sample *out)
{
    static const char *const names[2] = {"input", "target"};
    window_ds *d = ctx;
    if (i < 0 || i >= d->n_windows) {
        return accel__seterr(NULL, ACCEL_EINVAL, "window %lld out of range (%lld windows)",
                             (long long)i, (long long)d->n_windows);
    }
    int64_t start = i * d->stride;
    out->n_fields = 2;
    for (int f = 0; f < 2; f++) {
        accel_tensor *o = &out->field[f];
        int64_t s = start + f;
        o->dtype = d->out_dtype;
        o->ndim = 1;
        o->shape[0] = d->context;
        o->device.type = ACCEL_DEVICE_CPU;
        o->device.index = 0;
        out->name[f] = names[f];
        if (d->out_dtype == d->tok_dtype) {
            o->data = (void *)(d->tokens + (size_t)s * d->tok_nbytes); /* zero copy */
            continue;
        }
        void *dst = accel_sample_scratch(out, f, (size_t)d->context * 8);
        if (dst == NULL) {
            return accel_last_status(NULL); /* set by accel_sample_scratch */
        }
        if (d->out_dtype == ACCEL_I64) {
            int64_t *q = dst;
            for (int64_t t = 0; t < d->context; t++) {
                q[t] = token_at(d, s + t);
            }
        } else if (d->tok_nbytes == 2) {
            /* The hot case (GPT-2 tokens to int32): a tight loop the compiler vectorises. */
            int32_t *q = dst;
            const uint16_t *src = (const uint16_t *)(d->tokens + (size_t)s * 2);
            for (int64_t t = 0; t < d->context; t++) {
                q[t] = src[t];
            }
        } else {
            int32_t *q = dst;
            for (int64_t t = 0; t < d->context; t++) {
                q[t] = (int32_t)token_at(d, s + t);
            }
        }
        o->data = dst;
    }
    return ACCEL_OK;
}

static void window_destroy(void *ctx)
{
    window_ds *d = ctx;
    if (d->heap) {
        accel__free(d->map);
    } else if (d->map != NULL) {
        munmap(d->map, d->map_nbytes);
    }
    accel__free(d);
}

static accel_status window_finish(window_ds *d, int64_t context, int64_t stride, const char *what,
                                  const char *path, accel_dataset **out)
{
    d->magic = WINDOW_MAGIC;
    d->context = context;
    d->stride = stride > 0 ? stride : context;
    /* n_tokens > context, not >= context + 1: context may be INT64_MAX. */
    d->n_windows = d->n_tokens > context ? (d->n_tokens - 1 - context) / d->stride + 1 : 0;
    if (d->n_windows == 0) {
        /* An empty (or too short) file would make an epoch of no batch: say so now. */
        int64_t n = d->n_tokens;
        window_destroy(d);
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "%s \"%s\" holds %lld tokens, too few for one window of context "
                             "%lld (%llu needed)",
                             what, path, (long long)n, (long long)context,
                             (unsigned long long)context + 1);
    }
    accel_dataset *ds = accel__calloc(1, sizeof(*ds));
    if (ds == NULL) {
        window_destroy(d);
        return accel__seterr(NULL, ACCEL_ENOMEM, "dataset: out of memory");
    }
    ds->ctx = d;
    ds->len = window_len;
    ds->get = window_get;
    ds->destroy = window_destroy;
    *out = ds;
    return ACCEL_OK;
}

accel_token_dataset_options accel_token_dataset_options_default(void)
{
    accel_token_dataset_options o;
    memset(&o, 0, sizeof(o));
    o.size = sizeof(o);
    o.version = ACCEL_TOKEN_DATASET_OPTIONS_VERSION;
    o.header = ACCEL_TOKENS_AUTO;
    o.token_dtype = ACCEL_U16;
    o.out_dtype = ACCEL_I32;
    return o;
}

static accel_status map_file(const char *path, void **map, size_t *nbytes)
{
    /* O_NONBLOCK: a FIFO must not block the open (it is refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot open \"%s\": %s", path, strerror(errno));
    }
    struct stat stbuf;
    if (fstat(fd, &stbuf) != 0) {
        close(fd);
        return accel__seterr(NULL, ACCEL_EIO, "cannot stat \"%s\": %s", path, strerror(errno));
    }
    if (!S_ISREG(stbuf.st_mode)) {
        close(fd);
        return accel__seterr(NULL, ACCEL_EINVAL, "\"%s\" is %s, not a data file", path,
                             accel__file_kind(stbuf.st_mode));
    }
    *nbytes = (size_t)stbuf.st_size;
    *map = NULL;
    if (*nbytes > 0) {
        *map = mmap(NULL, *nbytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            close(fd);
            return accel__seterr(NULL, ACCEL_EIO, "cannot map \"%s\": %s", path, strerror(errno));
        }
    }
    close(fd);
    return ACCEL_OK;
}

accel_status accel_token_dataset_open(accel_dataset **out, const accel_token_dataset_options *opts)
{
    accel_token_dataset_options od = accel_token_dataset_options_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(NULL, "accel_token_dataset_open", accel_token_dataset_options,
                                  &od, opts, out_dtype));
    const accel_token_dataset_options *o = &od;
    if (out == NULL || opts == NULL || o->path == NULL || o->context < 1 || o->stride < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_token_dataset_open: need out, a path and context >= 1");
    }
    if (o->header != ACCEL_TOKENS_AUTO && o->header != ACCEL_TOKENS_LLMC &&
        o->header != ACCEL_TOKENS_RAW) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_token_dataset_open: header %d is not ACCEL_TOKENS_AUTO, _LLMC "
                             "or _RAW",
                             (int)o->header);
    }
    size_t tb = o->token_dtype == ACCEL_U16 ? 2 : o->token_dtype == ACCEL_I32 ? 4 : 0;
    if (o->header == ACCEL_TOKENS_RAW && tb == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_token_dataset_open: token_dtype must be U16 or I32");
    }
    window_ds *d = accel__calloc(1, sizeof(*d));
    if (d == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_token_dataset_open: out of memory");
    }
    accel_status st = map_file(o->path, &d->map, &d->map_nbytes);
    if (st != ACCEL_OK) {
        accel__free(d);
        return st;
    }
    const unsigned char *base = d->map;
    size_t nbytes = d->map_nbytes;
    int32_t hdr[3] = {0, 0, 0};
    if (nbytes >= sizeof(hdr)) {
        memcpy(hdr, base, sizeof(hdr));
    }
    /* In auto mode the magic alone decides: a file that starts with llm.c's magic is an llm.c
     * file, and a bad version or a short header is an error, never raw tokens. */
    int magic = nbytes >= 4 && (hdr[0] == LLMC_MAGIC_GPT2 || hdr[0] == LLMC_MAGIC_LLAMA3);
    int known = nbytes >= LLMC_HEADER_INTS * 4 && ((hdr[0] == LLMC_MAGIC_GPT2 && hdr[1] == 1) ||
                                                   (hdr[0] == LLMC_MAGIC_LLAMA3 && hdr[1] == 7));
    int llmc = o->header == ACCEL_TOKENS_LLMC || (o->header == ACCEL_TOKENS_AUTO && magic);
    if (llmc) {
        if (magic && nbytes < LLMC_HEADER_INTS * 4) {
            window_destroy(d);
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "token file \"%s\": llm.c header truncated (%zu bytes; the "
                                 "header is %d)",
                                 o->path, nbytes, LLMC_HEADER_INTS * 4);
        }
        if (magic && !known) {
            window_destroy(d);
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "token file \"%s\": llm.c magic %d with version %d (expected "
                                 "%d)",
                                 o->path, (int)hdr[0], (int)hdr[1],
                                 hdr[0] == LLMC_MAGIC_GPT2 ? 1 : 7);
        }
        if (!known) {
            window_destroy(d);
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "token file \"%s\": not an llm.c token file (magic %d version "
                                 "%d; expected 20240520/1 or 20240801/7)",
                                 o->path, (int)hdr[0], (int)hdr[1]);
        }
        tb = hdr[1] == 1 ? 2 : 4;
        size_t payload = nbytes - LLMC_HEADER_INTS * 4;
        if (hdr[2] < 0 || payload % tb != 0 || (size_t)hdr[2] != payload / tb) {
            window_destroy(d);
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "token file \"%s\": header says %d tokens but the file holds "
                                 "%zu bytes of %zu-byte tokens",
                                 o->path, (int)hdr[2], payload, tb);
        }
        d->tokens = base + LLMC_HEADER_INTS * 4;
        d->n_tokens = hdr[2];
    } else {
        if (nbytes % tb != 0) {
            window_destroy(d);
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "token file \"%s\": %zu bytes is not a multiple of the %zu-byte "
                                 "token size",
                                 o->path, nbytes, tb);
        }
        d->tokens = base;
        d->n_tokens = (int64_t)(nbytes / tb);
    }
    d->tok_nbytes = tb;
    d->tok_dtype = tb == 2 ? ACCEL_U16 : ACCEL_I32;
    d->out_dtype = o->out_dtype;
    if (d->out_dtype != ACCEL_I32 && d->out_dtype != ACCEL_I64 && d->out_dtype != d->tok_dtype) {
        window_destroy(d);
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_token_dataset_open: out_dtype must be I32, I64 or the token "
                             "dtype");
    }
    return window_finish(d, o->context, o->stride, "token file", o->path, out);
}

int64_t accel_token_dataset_num_tokens(const accel_dataset *ds)
{
    if (ds == NULL || ds->ctx == NULL || ds->get != window_get) {
        return -1;
    }
    const window_ds *d = ds->ctx;
    return d->magic == WINDOW_MAGIC ? d->n_tokens : -1;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Concatenates the regular files of a folder, in name order, into one heap buffer. */
static accel_status read_folder(const char *path, unsigned char **out, size_t *nbytes)
{
    DIR *dir = opendir(path);
    if (dir == NULL) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot open folder \"%s\": %s", path,
                             strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    accel_status st = ACCEL_OK;
    for (struct dirent *e; st == ACCEL_OK && (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.') {
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = accel__realloc(names, cap * sizeof(*names));
            if (nn == NULL) {
                st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
                break;
            }
            names = nn;
        }
        names[n] = accel__strdup(e->d_name);
        if (names[n] == NULL) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(dir);
    if (st == ACCEL_OK && n > 0) {
        qsort(names, n, sizeof(*names), cmp_names);
    }
    unsigned char *buf = NULL;
    size_t len = 0;
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        char full[4096];
        snprintf(full, sizeof(full), "%s/%s", path, names[i]);
        struct stat sb;
        if (stat(full, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            continue;
        }
        void *m;
        size_t mn;
        st = map_file(full, &m, &mn);
        if (st != ACCEL_OK) {
            break;
        }
        unsigned char *nb = accel__realloc(buf, len + mn + 1);
        if (nb == NULL) {
            if (m != NULL) {
                munmap(m, mn);
            }
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory reading \"%s\"", full);
            break;
        }
        buf = nb;
        if (mn > 0) {
            memcpy(buf + len, m, mn);
            munmap(m, mn);
        }
        len += mn;
    }
    for (size_t i = 0; i < n; i++) {
        accel__free(names[i]);
    }
    accel__free(names);
    if (st != ACCEL_OK) {
        accel__free(buf);
        return st;
    }
    *out = buf;
    *nbytes = len;
    return ACCEL_OK;
}

accel_status accel_bytes_dataset_open(accel_dataset **out, const char *path, int64_t context,
                                      int64_t stride, accel_dtype out_dtype)
{
    if (out == NULL || path == NULL || context < 1 || stride < 0 ||
        (out_dtype != ACCEL_U8 && out_dtype != ACCEL_I32 && out_dtype != ACCEL_I64)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_bytes_dataset_open: need a path, context >= 1 and out_dtype "
                             "U8, I32 or I64");
    }
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot open \"%s\": %s", path, strerror(errno));
    }
    window_ds *d = accel__calloc(1, sizeof(*d));
    if (d == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_bytes_dataset_open: out of memory");
    }
    accel_status st;
    if (S_ISDIR(sb.st_mode)) {
        unsigned char *buf = NULL;
        st = read_folder(path, &buf, &d->map_nbytes);
        d->map = buf;
        d->heap = 1;
    } else {
        st = map_file(path, &d->map, &d->map_nbytes);
    }
    if (st != ACCEL_OK) {
        accel__free(d);
        return st;
    }
    d->tokens = d->map;
    d->n_tokens = (int64_t)d->map_nbytes;
    d->tok_nbytes = 1;
    d->tok_dtype = ACCEL_U8;
    d->out_dtype = out_dtype;
    return window_finish(d, context, stride, "bytes dataset", path, out);
}
