/*
 * The state protocol's writer (core/state_proto.h): what an object's state_save puts is
 * collected here (tensors as borrowed views under their full names, JSON values in a jansson
 * tree, raw bytes) until ckpt writes the file (accel__state_writer_write). Invariant: a writer
 * accepts only what its part's container holds, and every misuse fails the save naming the file.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "ckpt/devio.h"
#include "ckpt/state.h"

/* ---- writer ---- */

void accel__state_writer_init(accel__state_writer *w, const char *file, accel__state_store store,
                              accel__state_part part)
{
    memset(w, 0, sizeof(*w));
    snprintf(w->file, sizeof w->file, "%s", file);
    w->store = store;
    w->part = part;
    w->open[0] = json_object();
    w->depth = w->floor = 1;
}

void accel__state_writer_release(accel__state_writer *w)
{
    for (size_t i = 0; w->names != NULL && i < w->n_ts; i++) {
        accel__free(w->names[i]);
    }
    accel__free(w->names);
    accel__free(w->ts);
    accel__free(w->offs);
    accel__free(w->counts);
    accel__free(w->bytes);
    json_decref(w->open[0]);
    memset(w, 0, sizeof(*w));
}

accel__state_part accel__state_writer_part(const accel__state_writer *w)
{
    return w->part;
}

/* A save error naming the file being filled. */
static accel_status wfail(const accel__state_writer *w, accel_status st, const char *fmt, ...)
    ACCEL_PRINTF(3, 4);
static accel_status wfail(const accel__state_writer *w, accel_status st, const char *fmt, ...)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return accel__seterr(NULL, st, "accel_save_state: %s: %s", w->file, msg);
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= shape[d];
    }
    return n;
}

accel_status accel__state_put_piece(accel__state_writer *w, const char *name, accel_tensor piece,
                                    const accel__state_piece *whole)
{
    if (w->store != ACCEL__STORE_TENSORS) {
        return wfail(w, ACCEL_EINVAL, "tensor %s: this part of the state holds no tensors",
                     name ? name : "(null)");
    }
    if (name == NULL || name[0] == '\0' || whole == NULL || whole->ndim < 0 ||
        whole->ndim > ACCEL_MAX_DIMS) {
        return wfail(w, ACCEL_EINVAL, "a tensor without a name or shape");
    }
    if (piece.device.type != ACCEL_DEVICE_CPU) {
        /* Device memory is copied out through staging when the file is written (devio.h). */
        accel_status st = accel__devio_check(piece.device);
        if (st != ACCEL_OK) {
            return wfail(w, st, "tensor %s: %s", name, accel_last_error(NULL));
        }
    }
    if (piece.data == NULL && accel_tensor_numel(&piece) > 0) {
        return wfail(w, ACCEL_EINVAL, "tensor %s has no data", name);
    }
    int64_t total = numel_of(whole->ndim, whole->shape), n = accel_tensor_numel(&piece);
    if (whole->offset < 0 || n > total - whole->offset) {
        return wfail(w, ACCEL_EINVAL, "tensor %s: elements %lld to %lld are not a piece of %lld",
                     name, (long long)whole->offset, (long long)(whole->offset + n),
                     (long long)total);
    }
    if (n != total && w->part == ACCEL__STATE_RANK) {
        return wfail(w, ACCEL_EUNSUPPORTED,
                     "tensor %s: a per-process part holds whole tensors only (a piece of "
                     "elements %lld to %lld of %lld was put)",
                     name, (long long)whole->offset, (long long)(whole->offset + n),
                     (long long)total);
    }
    if (w->n_ts == w->cap_ts) {
        size_t cap = w->cap_ts ? 2 * w->cap_ts : 16;
        accel_named_tensor *ts = accel__realloc(w->ts, cap * sizeof(*ts));
        if (ts != NULL) {
            w->ts = ts;
        }
        char **names = ts ? accel__realloc(w->names, cap * sizeof(*names)) : NULL;
        if (names != NULL) {
            w->names = names;
        }
        int64_t *offs = names ? accel__realloc(w->offs, cap * sizeof(*offs)) : NULL;
        if (offs != NULL) {
            w->offs = offs;
        }
        int64_t *counts = offs ? accel__realloc(w->counts, cap * sizeof(*counts)) : NULL;
        if (counts == NULL) {
            return wfail(w, ACCEL_ENOMEM, "out of memory");
        }
        w->counts = counts;
        w->cap_ts = cap;
    }
    size_t len = strlen(w->prefix) + strlen(name) + 1;
    char *full = accel__malloc(len);
    if (full == NULL) {
        return wfail(w, ACCEL_ENOMEM, "out of memory");
    }
    snprintf(full, len, "%s%s", w->prefix, name);
    accel_tensor t = accel_tensor_view(piece.data, piece.dtype, whole->ndim, whole->shape);
    t.device = piece.device; /* where the writer copies it from */
    w->names[w->n_ts] = full;
    w->offs[w->n_ts] = whole->offset;
    w->counts[w->n_ts] = n;
    w->n_true_pieces += n != total;
    w->ts[w->n_ts++] = (accel_named_tensor){full, t};
    return ACCEL_OK;
}

accel_status accel__state_put_tensor(accel__state_writer *w, const char *name, accel_tensor view)
{
    accel__state_piece whole = {view.ndim, {0}, 0};
    if (view.ndim >= 0 && view.ndim <= ACCEL_MAX_DIMS) {
        memcpy(whole.shape, view.shape, (size_t)view.ndim * sizeof(int64_t));
    }
    return accel__state_put_piece(w, name, view, &whole);
}

/* Adds v (consumed) under key to the current container. */
static accel_status put_value(accel__state_writer *w, const char *key, json_t *v)
{
    accel_status st = ACCEL_OK;
    json_t *c = w->open[w->depth - 1];
    if (v == NULL || c == NULL) {
        st = wfail(w, ACCEL_ENOMEM, "out of memory");
    } else if (w->store == ACCEL__STORE_BYTES ||
               (w->store == ACCEL__STORE_TENSORS && w->part == ACCEL__STATE_RANK)) {
        st = wfail(w, ACCEL_EINVAL, "%s: this part of the state holds no JSON values",
                   key ? key : "(array element)");
    } else if (json_is_array(c) ? key != NULL : key == NULL || key[0] == '\0') {
        st = wfail(w, ACCEL_EINVAL, "a JSON value %s",
                   key ? "with a key inside an array" : "without a key inside an object");
    } else if (key != NULL && json_object_get(c, key) != NULL) {
        st = wfail(w, ACCEL_EINVAL, "JSON key %s put twice", key);
    } else if ((key ? json_object_set_new(c, key, v) : json_array_append_new(c, v)) != 0) {
        return wfail(w, ACCEL_ENOMEM, "out of memory"); /* v already released */
    } else {
        return ACCEL_OK;
    }
    json_decref(v);
    return st;
}

accel_status accel__state_put_i64(accel__state_writer *w, const char *key, int64_t v)
{
    return put_value(w, key, json_integer((json_int_t)v));
}

accel_status accel__state_put_f64(accel__state_writer *w, const char *key, double v)
{
    if (!isfinite(v)) {
        return wfail(w, ACCEL_EINVAL, "%s is %g: JSON has no such number", key ? key : "value", v);
    }
    return put_value(w, key, json_real(v));
}

accel_status accel__state_put_bool(accel__state_writer *w, const char *key, int v)
{
    return put_value(w, key, json_boolean(v));
}

accel_status accel__state_put_str(accel__state_writer *w, const char *key, const char *v)
{
    return put_value(w, key, v ? json_string(v) : NULL);
}

static json_t *u64_json(uint64_t v)
{
    char h[19];
    snprintf(h, sizeof h, "0x%016" PRIx64, v);
    return json_string(h);
}

accel_status accel__state_put_u64(accel__state_writer *w, const char *key, uint64_t v)
{
    return put_value(w, key, u64_json(v));
}

accel_status accel__state_put_gen(accel__state_writer *w, const char *key,
                                  const uint64_t s[ACCEL_RNG_STATE_WORDS])
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < ACCEL_RNG_STATE_WORDS; i++) {
        if (json_array_append_new(a, u64_json(s[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    }
    return put_value(w, key, a);
}

accel_status accel__state_put_f64s(accel__state_writer *w, const char *key, const double *v,
                                   size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++) {
        if (!isfinite(v[i]) || json_array_append_new(a, json_real(v[i])) != 0) {
            json_decref(a);
            return isfinite(v[i]) ? wfail(w, ACCEL_ENOMEM, "out of memory")
                                  : wfail(w, ACCEL_EINVAL,
                                          "%s[%zu] is %g: JSON has no such "
                                          "number",
                                          key ? key : "value", i, v[i]);
        }
    }
    return put_value(w, key, a);
}

accel_status accel__state_begin(accel__state_writer *w, const char *key, int array)
{
    if (w->depth == ACCEL__STATE_DEPTH) {
        return wfail(w, ACCEL_EINVAL, "JSON nested deeper than %d levels", ACCEL__STATE_DEPTH);
    }
    json_t *c = array ? json_array() : json_object();
    ACCEL_TRY(put_value(w, key, c));
    w->open[w->depth++] = c; /* owned by its parent */
    return ACCEL_OK;
}

accel_status accel__state_end(accel__state_writer *w)
{
    if (w->depth <= w->floor) {
        return wfail(w, ACCEL_EINVAL, "accel__state_end without a matching accel__state_begin");
    }
    w->depth--;
    return ACCEL_OK;
}

accel_status accel__state_put_bytes(accel__state_writer *w, const void *data, size_t n)
{
    if (w->store != ACCEL__STORE_BYTES) {
        return wfail(w, ACCEL_EINVAL, "this part of the state holds no raw bytes");
    }
    if (n > SIZE_MAX / 4 - w->n_bytes) {
        /* No allocator has it, and doubling towards a wrapped size looped forever (a
         * registered object's accel_state_write(w, data, (size_t)-1) hung the save). */
        return wfail(w, ACCEL_ENOMEM, "%zu bytes after %zu do not fit in memory", n, w->n_bytes);
    }
    if (w->n_bytes + n > w->cap_bytes) {
        size_t cap = w->cap_bytes ? w->cap_bytes : 256;
        while (cap < w->n_bytes + n) {
            cap *= 2;
        }
        char *p = accel__realloc(w->bytes, cap);
        if (p == NULL) {
            return wfail(w, ACCEL_ENOMEM, "out of memory");
        }
        w->bytes = p;
        w->cap_bytes = cap;
    }
    if (n > 0) {
        memcpy(w->bytes + w->n_bytes, data, n);
    }
    w->n_bytes += n;
    return ACCEL_OK;
}

accel_status accel__state_writer_save(accel__state_writer *w, accel__object *obj)
{
    int floor = w->floor;
    w->floor = w->depth;
    accel_status st = obj->cls->state_save(obj, w);
    if (st == ACCEL_OK && w->depth != w->floor) {
        st = wfail(w, ACCEL_EINVAL, "a state_save left %d JSON containers open",
                   w->depth - w->floor);
    }
    w->depth = w->floor;
    w->floor = floor;
    return st;
}

accel_status accel__state_writer_write(const accel__state_writer *w, const char *dir,
                                       const char *format, const char *meta_key)
{
    if (w->open[0] == NULL) {
        return wfail(w, ACCEL_ENOMEM, "out of memory");
    }
    if (w->store == ACCEL__STORE_JSON) {
        return accel__st_write_json(dir, w->file, json_incref(w->open[0]));
    }
    char *path = accel__path_join(dir, w->file);
    if (path == NULL) {
        return wfail(w, ACCEL_ENOMEM, "out of memory");
    }
    accel_status st;
    if (w->store == ACCEL__STORE_BYTES) {
        st = accel__write_file_atomic(path, w->bytes ? w->bytes : "", w->n_bytes);
    } else {
        /* Compact, in the order put (objects decide it): the metadata value is one string. */
        char *meta = json_object_size(w->open[0]) > 0 && meta_key != NULL
                         ? json_dumps(w->open[0], JSON_COMPACT | JSON_REAL_PRECISION(17))
                         : NULL;
        accel_kv kv[2];
        size_t n_kv = 0;
        if (format != NULL) {
            kv[n_kv++] = (accel_kv){"format", format};
        }
        if (meta != NULL) {
            kv[n_kv++] = (accel_kv){meta_key, meta};
        }
        st = json_object_size(w->open[0]) > 0 && meta == NULL
                 ? wfail(w, ACCEL_ENOMEM, "out of memory")
                 : accel_safetensors_write(path, w->ts, w->n_ts, n_kv ? kv : NULL, n_kv);
        free(meta); /* json_dumps: the C allocator */
    }
    accel__free(path);
    return st;
}
