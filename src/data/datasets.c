/*
 * Built-in datasets: TensorDataset (rows of borrowed tensors), the token-file dataset (llm.c
 * .bin files or headerless token files, served as (input, target) windows) and the bytes
 * dataset (a file or a folder of files as one byte corpus). All are read-only after creation,
 * so `get` is thread-safe. Invariant: every size read from a file is validated against the
 * file's length before any window is served, and a loader's windows are read with pread, so a
 * file that another process truncates is a short read (ACCEL_EIO naming the file and both
 * sizes), never a SIGBUS from a mapping; only zero-copy views handed to a caller without a
 * loader come from the mapping (checked with fstat first: docs/data.md says what is left).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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
    int fd;           /* the file (windows are read from it), or -1 for a heap buffer */
    size_t data_off;  /* where the tokens start in the file (after an llm.c header) */
    char *path;       /* for messages */
    const char *what; /* "token file" or "bytes dataset", for messages */
    const unsigned char *tokens;
    size_t tok_nbytes; /* 1, 2 or 4 */
    int64_t n_tokens, context, stride, n_windows;
    accel_dtype tok_dtype, out_dtype;
} window_ds;

#define WINDOW_MAGIC 0x746f6b73u
/* The sample scratch a converting window reads its raw tokens into (the two fields are 0, 1). */
#define RAW_FIELD 2

static int64_t window_len(void *ctx)
{
    return ((window_ds *)ctx)->n_windows;
}

static int64_t token_at(const unsigned char *tokens, size_t tok_nbytes, int64_t i)
{
    const unsigned char *p = tokens + (size_t)i * tok_nbytes;
    if (tok_nbytes == 1) {
        return p[0];
    }
    if (tok_nbytes == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Reads nbytes at off, all of them unless the file ends first (*got says how many). */
static accel_status read_at(int fd, void *buf, size_t nbytes, off_t off, size_t *got,
                            const char *path)
{
    *got = 0;
    while (*got < nbytes) {
        ssize_t n = pread(fd, (char *)buf + *got, nbytes - *got, off + (off_t)*got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return accel__seterr(NULL, ACCEL_EIO, "cannot read \"%s\": %s", path, strerror(errno));
        }
        if (n == 0) {
            break;
        }
        *got += (size_t)n;
    }
    return ACCEL_OK;
}

/* Window i (tokens from `start`) lies past the end of a file that shrank since it was opened. */
static accel_status window_gone(const window_ds *d, int64_t i, int64_t start)
{
    struct stat sb;
    long long now = fstat(d->fd, &sb) == 0 ? (long long)sb.st_size : -1;
    unsigned long long first = d->data_off + (size_t)start * d->tok_nbytes;
    unsigned long long end = first + (size_t)(d->context + 1) * d->tok_nbytes;
    return accel__seterr(NULL, ACCEL_EIO,
                         "%s \"%s\" is %lld bytes now, %zu when it was opened (truncated by "
                         "another process?): window %lld (bytes %llu..%llu) is gone",
                         d->what, d->path, now, d->map_nbytes, (long long)i, first, end);
}

/* The context + 1 tokens of window i into raw, read from the file: a file truncated meanwhile is
 * a short read, never a SIGBUS. */
static accel_status read_window(const window_ds *d, int64_t i, int64_t start, void *raw)
{
    const size_t nbytes = (size_t)(d->context + 1) * d->tok_nbytes;
    size_t got = 0;
    ACCEL_TRY(read_at(d->fd, raw, nbytes, (off_t)(d->data_off + (size_t)start * d->tok_nbytes),
                      &got, d->path));
    return got == nbytes ? ACCEL_OK : window_gone(d, i, start);
}

static accel_status window_get(void *ctx, int64_t i, accel_sample *out)
{
    static const char *const names[2] = {"input", "target"};
    window_ds *d = ctx;
    if (i < 0 || i >= d->n_windows) {
        return accel__seterr(NULL, ACCEL_EINVAL, "window %lld out of range (%lld windows)",
                             (long long)i, (long long)d->n_windows);
    }
    const int64_t start = i * d->stride;
    const size_t tb = d->tok_nbytes;
    const int zero_copy = d->out_dtype == d->tok_dtype;
    /* The window's tokens: in the heap buffer, read from the file into the sample's scratch (a
     * loader's sample, or any converting one), or, for a zero-copy view handed to a caller
     * without a loader, in the mapping once fstat says the file still holds them. */
    const unsigned char *src = d->tokens + (size_t)start * tb;
    if (d->fd >= 0 && (out->priv != NULL || !zero_copy)) {
        void *raw =
            accel_sample_scratch(out, zero_copy ? 0 : RAW_FIELD, (size_t)(d->context + 1) * tb);
        if (raw == NULL) {
            return accel_last_status(NULL); /* set by accel_sample_scratch */
        }
        ACCEL_TRY(read_window(d, i, start, raw));
        src = raw;
    } else if (d->fd >= 0) {
        struct stat sb;
        if (fstat(d->fd, &sb) != 0 || (size_t)sb.st_size < d->map_nbytes) {
            return window_gone(d, i, start);
        }
    }
    out->n_fields = 2;
    for (int f = 0; f < 2; f++) {
        accel_tensor *o = &out->field[f];
        const unsigned char *p = src + (size_t)f * tb;
        o->dtype = d->out_dtype;
        o->ndim = 1;
        o->shape[0] = d->context;
        o->device.type = ACCEL_DEVICE_CPU;
        o->device.index = 0;
        out->name[f] = names[f];
        if (zero_copy) {
            o->data = (void *)p;
            continue;
        }
        void *dst = accel_sample_scratch(out, f, (size_t)d->context * 8);
        if (dst == NULL) {
            return accel_last_status(NULL); /* set by accel_sample_scratch */
        }
        if (d->out_dtype == ACCEL_I64) {
            int64_t *q = dst;
            for (int64_t t = 0; t < d->context; t++) {
                q[t] = token_at(p, tb, t);
            }
        } else if (tb == 2) {
            /* The hot case (GPT-2 tokens to int32): a tight loop the compiler vectorises. */
            int32_t *q = dst;
            const uint16_t *s16 = (const uint16_t *)p;
            for (int64_t t = 0; t < d->context; t++) {
                q[t] = s16[t];
            }
        } else {
            int32_t *q = dst;
            for (int64_t t = 0; t < d->context; t++) {
                q[t] = (int32_t)token_at(p, tb, t);
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
    if (d->fd >= 0) {
        close(d->fd);
    }
    accel__free(d->path);
    accel__free(d);
}

static accel_status window_finish(window_ds *d, int64_t context, int64_t stride, const char *what,
                                  const char *path, accel_dataset **out)
{
    d->magic = WINDOW_MAGIC;
    d->what = what;
    d->path = accel__strdup(path);
    if (d->path == NULL) {
        window_destroy(d);
        return accel__seterr(NULL, ACCEL_ENOMEM, "dataset: out of memory");
    }
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

/* Opens a regular file for reading: *fd (owned by the caller) and its size. */
static accel_status open_regular(const char *path, int *fd, size_t *nbytes)
{
    /* O_NONBLOCK: a FIFO must not block the open (it is refused below). */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot open \"%s\": %s", path, strerror(errno));
    }
    struct stat stbuf;
    if (fstat(f, &stbuf) != 0) {
        close(f);
        return accel__seterr(NULL, ACCEL_EIO, "cannot stat \"%s\": %s", path, strerror(errno));
    }
    if (!S_ISREG(stbuf.st_mode)) {
        close(f);
        return accel__seterr(NULL, ACCEL_EINVAL, "\"%s\" is %s, not a data file", path,
                             accel__file_kind(stbuf.st_mode));
    }
    *fd = f;
    *nbytes = (size_t)stbuf.st_size;
    return ACCEL_OK;
}

/* The file open (*fd, owned by the caller) and mapped, for zero-copy views (the loader's
 * windows are read with pread). */
static accel_status map_file(const char *path, void **map, size_t *nbytes, int *fd)
{
    ACCEL_TRY(open_regular(path, fd, nbytes));
    *map = NULL;
    if (*nbytes > 0) {
        *map = mmap(NULL, *nbytes, PROT_READ, MAP_PRIVATE, *fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            close(*fd);
            *fd = -1;
            return accel__seterr(NULL, ACCEL_EIO, "cannot map \"%s\": %s", path, strerror(errno));
        }
    }
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
    accel_status st = map_file(o->path, &d->map, &d->map_nbytes, &d->fd);
    if (st != ACCEL_OK) {
        accel__free(d);
        return st;
    }
    const unsigned char *base = d->map;
    size_t nbytes = d->map_nbytes;
    int32_t hdr[3] = {0, 0, 0};
    if (nbytes >= sizeof(hdr)) {
        /* Read, not taken from the mapping: the file may already be shorter. */
        size_t got = 0;
        st = read_at(d->fd, hdr, sizeof(hdr), 0, &got, o->path);
        if (st == ACCEL_OK && got < sizeof(hdr)) {
            st = accel__seterr(NULL, ACCEL_EIO,
                               "token file \"%s\" shrank from %zu bytes while it was opened",
                               o->path, nbytes);
        }
        if (st != ACCEL_OK) {
            window_destroy(d);
            return st;
        }
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
        d->data_off = LLMC_HEADER_INTS * 4;
        d->tokens = base + d->data_off;
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
        int fd = -1;
        size_t mn = 0, got = 0;
        st = open_regular(full, &fd, &mn);
        if (st != ACCEL_OK) {
            break;
        }
        unsigned char *nb = accel__realloc(buf, len + mn + 1);
        if (nb == NULL) {
            close(fd);
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory reading \"%s\"", full);
            break;
        }
        buf = nb;
        /* Read, not mapped: a file truncated meanwhile is a short read, not a SIGBUS. */
        st = read_at(fd, buf + len, mn, 0, &got, full);
        close(fd);
        if (st == ACCEL_OK && got < mn) {
            st = accel__seterr(NULL, ACCEL_EIO,
                               "\"%s\" shrank from %zu to %zu bytes while it was read (truncated "
                               "by another process?)",
                               full, mn, got);
        }
        len += got;
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
    d->fd = -1;
    accel_status st;
    if (S_ISDIR(sb.st_mode)) {
        unsigned char *buf = NULL;
        st = read_folder(path, &buf, &d->map_nbytes);
        d->map = buf;
        d->heap = 1;
    } else {
        st = map_file(path, &d->map, &d->map_nbytes, &d->fd);
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
