/*
 * The state protocol's reader (core/state_proto.h): the files of a checkpoint being loaded
 * (opened by the plan) and what an object's state_load gets from them, validated field by
 * field, with messages naming the folder, the file and the key path or tensor.
 *
 * Invariant: a reader never writes live memory; a tensor read becomes a planned copy
 * (accel__state_plan_copy) and any other change a staged action, both run by the plan's apply.
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

/* ---- reader: files ---- */

accel_status accel__state_file_open(accel__state_file *f, const char *dir, const char *name,
                                    accel__state_store store, const char *meta_key,
                                    const accel__ckpt_marker *marker)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof f->name, "%s", name);
    f->store = store;
    if (store == ACCEL__STORE_JSON) {
        return accel__st_read_json(dir, name, &f->root);
    }
    char *path = accel__path_join(dir, name);
    if (path == NULL) {
        return ACCEL_ENOMEM;
    }
    void *map = NULL;
    size_t map_nbytes = 0;
    accel_status st =
        store == ACCEL__STORE_BYTES ? accel__read_file(path, &f->bytes, &f->n_bytes)
        : accel__ckpt_marker_take_map(marker, name, &map, &map_nbytes)
            ? accel__safetensors_open_map(&f->st, path, map, map_nbytes)
            : accel_safetensors_open(&f->st, path);
    accel__free(path);
    if (st == ACCEL_ENOTFOUND) {
        return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is missing", dir, name);
    }
    ACCEL_TRY(st);
    if (store != ACCEL__STORE_TENSORS) {
        return ACCEL_OK;
    }
    f->read = accel__calloc(accel_safetensors_count(f->st) + 1, 1);
    if (f->read == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    const char *text = meta_key ? accel_safetensors_metadata(f->st, meta_key) : NULL;
    if (text != NULL) {
        json_error_t jerr;
        f->root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(f->root)) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "checkpoint %s: %s is malformed: its \"%s\" metadata is not a JSON "
                               "object (%s)",
                               dir, name, meta_key, f->root ? "another JSON value" : jerr.text);
            json_decref(f->root);
            f->root = NULL;
        }
    }
    return st;
}

void accel__state_file_close(accel__state_file *f)
{
    accel__state_shard_close(f->sh);
    accel_safetensors_close(f->st);
    json_decref(f->root);
    accel__free(f->read);
    accel__free(f->bytes);
    memset(f, 0, sizeof(*f));
}

accel_status accel__state_file_all_read(const accel__state_file *f, const char *dir)
{
    if (f->sh != NULL) {
        return accel__state_shard_all_read(f, dir);
    }
    size_t n = f->st ? accel_safetensors_count(f->st) : 0;
    for (size_t i = 0; i < n; i++) {
        if (!f->read[i]) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "checkpoint %s: %s holds tensor %s, which no live object has "
                                 "(%zu tensors in the file; are the objects built as when "
                                 "saving?)",
                                 dir, f->name, accel_safetensors_name(f->st, i), n);
        }
    }
    return ACCEL_OK;
}

accel_status accel__state_reader_load(accel__state_reader *r, accel__object *obj)
{
    r->obj = obj;
    r->depth = 1;
    r->path_len[0] = strlen(r->path);
    return obj->cls->state_load(obj, r);
}

/* ---- reader: values ---- */

accel__state_part accel__state_reader_part(const accel__state_reader *r)
{
    return r->part;
}

int accel__state_index(const accel__state_reader *r)
{
    return r->index;
}

int accel__state_saved_processes(const accel__state_reader *r)
{
    return r->saved_processes;
}

accel_status accel__state_fail(accel__state_reader *r, accel_status st, const char *fmt, ...)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return accel__seterr(NULL, st, "checkpoint %s: %s: %s", r->dir, r->f->name, msg);
}

/* ACCEL_ECORRUPT: "checkpoint D: F is malformed: <path><key> <what>". */
static accel_status malformed(const accel__state_reader *r, const char *key, const char *fmt, ...)
    ACCEL_PRINTF(3, 4);
static accel_status malformed(const accel__state_reader *r, const char *key, const char *fmt, ...)
{
    char msg[ACCEL__ERRMSG_NBYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: %s is malformed: %s%s %s", r->dir,
                         r->f->name, r->path, key, msg);
}

/* The value under key in the current object, or NULL (*st: the error). */
static const json_t *value(const accel__state_reader *r, const char *key, accel_status *st)
{
    const json_t *cur = r->at[r->depth - 1];
    const json_t *v = json_is_object(cur) ? json_object_get(cur, key) : NULL;
    *st = v ? ACCEL_OK : malformed(r, key, "is missing");
    return v;
}

int accel__state_has(const accel__state_reader *r, const char *key)
{
    const json_t *cur = r->at[r->depth - 1];
    return json_is_object(cur) && json_object_get(cur, key) != NULL;
}

accel_status accel__state_get_i64(accel__state_reader *r, const char *key, int64_t lo, int64_t hi,
                                  int64_t *out)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    if (v == NULL) {
        return st;
    }
    if (!json_is_integer(v)) {
        return malformed(r, key, "is not an integer");
    }
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        return hi == INT64_MAX
                   ? malformed(r, key, "is %" PRId64 ", expected >= %" PRId64, x, lo)
                   : malformed(r, key, "is %" PRId64 ", expected %" PRId64 " to %" PRId64, x, lo,
                               hi);
    }
    *out = x;
    return ACCEL_OK;
}

/* A finite number in [lo, hi] (st: the error naming `what`). */
static int real_in(const accel__state_reader *r, const json_t *v, const char *what, double lo,
                   double hi, double *out, accel_status *st)
{
    if (!json_is_number(v)) {
        *st = malformed(r, what, "is not a number");
        return 0;
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        *st = malformed(r, what, "is %.17g, expected a finite number in [%.17g, %.17g]", x, lo, hi);
        return 0;
    }
    *out = x;
    return 1;
}

accel_status accel__state_get_f64(accel__state_reader *r, const char *key, double lo, double hi,
                                  double *out)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    return v != NULL && real_in(r, v, key, lo, hi, out, &st) ? ACCEL_OK : st;
}

accel_status accel__state_get_bool(accel__state_reader *r, const char *key, int *out)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    if (v == NULL) {
        return st;
    }
    if (!json_is_boolean(v)) {
        return malformed(r, key, "is not true or false");
    }
    *out = json_is_true(v);
    return ACCEL_OK;
}

accel_status accel__state_get_str(accel__state_reader *r, const char *key, const char **out)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    if (v == NULL) {
        return st;
    }
    if (!json_is_string(v)) {
        return malformed(r, key, "is not a string");
    }
    *out = json_string_value(v);
    return ACCEL_OK;
}

/* "0x" + 16 hex digits. */
static int parse_u64(const json_t *j, uint64_t *out)
{
    const char *s = json_string_value(j);
    if (s == NULL || strncmp(s, "0x", 2) != 0 || strlen(s) != 18 ||
        strspn(s + 2, "0123456789abcdefABCDEF") != 16) {
        return 0;
    }
    *out = strtoull(s + 2, NULL, 16);
    return 1;
}

accel_status accel__state_get_u64(accel__state_reader *r, const char *key, uint64_t *out)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    if (v == NULL) {
        return st;
    }
    return parse_u64(v, out) ? ACCEL_OK
                             : malformed(r, key, "is not \"0x\" and 16 hexadecimal digits");
}

accel_status accel__state_get_gen(accel__state_reader *r, const char *key,
                                  uint64_t s[ACCEL_RNG_STATE_WORDS])
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    if (v == NULL) {
        return st;
    }
    uint64_t any = 0;
    int ok = json_is_array(v) && json_array_size(v) == ACCEL_RNG_STATE_WORDS;
    for (size_t i = 0; ok && i < ACCEL_RNG_STATE_WORDS; i++) {
        ok = parse_u64(json_array_get(v, i), &s[i]);
        any |= s[i];
    }
    if (!ok) {
        return malformed(r, key, "is not %d words of \"0x\" and 16 hexadecimal digits",
                         ACCEL_RNG_STATE_WORDS);
    }
    return any != 0 ? ACCEL_OK : malformed(r, key, "is all zero (not a generator state)");
}

accel_status accel__state_get_len(accel__state_reader *r, const char *key, size_t *n)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    if (v == NULL) {
        return st;
    }
    if (!json_is_array(v)) {
        return malformed(r, key, "is not an array");
    }
    *n = json_array_size(v);
    return ACCEL_OK;
}

accel_status accel__state_get_f64s(accel__state_reader *r, const char *key, double lo, double hi,
                                   double *out, size_t n)
{
    size_t len = 0; /* set on success; initialised for -O3's maybe-uninitialized */
    ACCEL_TRY(accel__state_get_len(r, key, &len));
    if (len != n) {
        return malformed(r, key, "has %zu elements, expected %zu", len, n);
    }
    const json_t *a = json_object_get(r->at[r->depth - 1], key);
    for (size_t i = 0; i < n; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s[%zu]", key, i);
        accel_status st;
        if (!real_in(r, json_array_get(a, i), what, lo, hi, &out[i], &st)) {
            return st;
        }
    }
    return ACCEL_OK;
}

/* Makes j (an object found under `what`) the current object. */
static accel_status enter(accel__state_reader *r, json_t *j, const char *what)
{
    if (!json_is_object(j)) {
        return malformed(r, what, "is not an object");
    }
    if (r->depth == ACCEL__STATE_DEPTH) {
        return malformed(r, what, "is nested too deep");
    }
    size_t len = r->path_len[r->depth - 1];
    snprintf(r->path + len, sizeof r->path - len, "%s.", what);
    r->path_len[r->depth] = strlen(r->path);
    r->at[r->depth++] = j;
    return ACCEL_OK;
}

accel_status accel__state_enter(accel__state_reader *r, const char *key)
{
    accel_status st;
    const json_t *v = value(r, key, &st);
    return v ? enter(r, (json_t *)v, key) : st;
}

accel_status accel__state_enter_item(accel__state_reader *r, const char *key, size_t i)
{
    size_t n = 0;
    ACCEL_TRY(accel__state_get_len(r, key, &n));
    char what[96];
    snprintf(what, sizeof what, "%s[%zu]", key, i);
    if (i >= n) {
        return malformed(r, what, "is missing");
    }
    return enter(r, json_array_get(json_object_get(r->at[r->depth - 1], key), i), what);
}

void accel__state_leave(accel__state_reader *r)
{
    if (r->depth > 1) {
        r->depth--;
        r->path[r->path_len[r->depth - 1]] = '\0';
    }
}

accel_status accel__state_get_bytes(accel__state_reader *r, const void **data, size_t *n)
{
    if (r->f->store != ACCEL__STORE_BYTES) {
        return accel__state_fail(r, ACCEL_EINVAL, "holds no raw bytes");
    }
    *data = r->f->bytes ? r->f->bytes : "";
    *n = r->f->n_bytes;
    return ACCEL_OK;
}

/* ---- reader: tensors ---- */

static int same_shape(int na, const int64_t *a, int nb, const int64_t *b)
{
    if (na != nb) {
        return 0;
    }
    for (int d = 0; d < na; d++) {
        if (a[d] != b[d]) {
            return 0;
        }
    }
    return 1;
}

accel_status accel__state_check_piece(accel__state_reader *r, const char *full, accel_dtype dtype,
                                      int ndim, const int64_t *shape, accel_tensor piece,
                                      const accel__state_piece *whole)
{
    if (dtype != piece.dtype || !same_shape(ndim, shape, whole->ndim, whole->shape)) {
        char a[160], b[160];
        return accel__state_fail(
            r, ACCEL_EINVAL, "tensor %s is %s %s in the checkpoint vs %s %s in the %s", full,
            accel_dtype_name(dtype), accel__shape_str(a, sizeof a, ndim, shape),
            accel_dtype_name(piece.dtype), accel__shape_str(b, sizeof b, whole->ndim, whole->shape),
            r->noun);
    }
    if (piece.device.type != ACCEL_DEVICE_CPU) {
        /* Copied in through staging when the load applies (devio.h): checked now, so that a
         * device that cannot be opened fails the load before anything changes. */
        accel_status st = accel__devio_check(piece.device);
        if (st != ACCEL_OK) {
            return accel__state_fail(r, st, "tensor %s: %s", full, accel_last_error(NULL));
        }
    }
    int64_t total = 1, n = accel_tensor_numel(&piece);
    for (int d = 0; d < ndim; d++) {
        total *= shape[d];
    }
    size_t bits = accel_dtype_bits(dtype);
    if (whole->offset < 0 || n > total - whole->offset || ((size_t)whole->offset * bits) % 8 != 0 ||
        (piece.data == NULL && n > 0)) {
        return accel__state_fail(r, ACCEL_EINVAL,
                                 "tensor %s: elements %lld to %lld of %lld are not a piece of it",
                                 full, (long long)whole->offset, (long long)(whole->offset + n),
                                 (long long)total);
    }
    return ACCEL_OK;
}

/* The piece of tensor `full` (its name in the file) into `piece`. */
static accel_status get_piece(accel__state_reader *r, const char *full, accel_tensor piece,
                              const accel__state_piece *whole)
{
    if (r->f->sh != NULL) {
        return accel__state_shard_get(r, full, piece, whole);
    }
    long i = accel_safetensors_find(r->f->st, full);
    if (i < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "checkpoint %s: %s has no tensor %s (the live %s has it)", r->dir,
                             r->f->name, full, r->noun);
    }
    accel_tensor t;
    ACCEL_TRY(accel_safetensors_tensor(r->f->st, (size_t)i, &t));
    ACCEL_TRY(accel__state_check_piece(r, full, t.dtype, t.ndim, t.shape, piece, whole));
    r->f->read[i] = 1;
    size_t off = (size_t)whole->offset * accel_dtype_bits(t.dtype) / 8;
    return accel__state_plan_copy(r->plan, piece.data, piece.device, (const char *)t.data + off,
                                  accel_tensor_nbytes(&piece));
}

accel_status accel__state_get_piece(accel__state_reader *r, const char *name, accel_tensor piece,
                                    const accel__state_piece *whole)
{
    if (r->f->st == NULL && r->f->sh == NULL) {
        return accel__state_fail(r, ACCEL_EINVAL, "holds no tensors (tensor %s)", name);
    }
    char buf[256];
    size_t len = strlen(r->prefix) + strlen(name) + 1;
    char *full = len <= sizeof buf ? buf : accel__malloc(len);
    if (full == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    snprintf(full, len, "%s%s", r->prefix, name);
    accel_status st = get_piece(r, full, piece, whole);
    if (full != buf) {
        accel__free(full);
    }
    return st;
}

accel_status accel__state_get_tensor(accel__state_reader *r, const char *name, accel_tensor dst)
{
    accel__state_piece whole = {dst.ndim, {0}, 0};
    if (dst.ndim >= 0 && dst.ndim <= ACCEL_MAX_DIMS) {
        memcpy(whole.shape, dst.shape, (size_t)dst.ndim * sizeof(int64_t));
    }
    return accel__state_get_piece(r, name, dst, &whole);
}

/* ---- reader: staging ---- */

void *accel__state_stage(accel__state_reader *r, size_t nbytes,
                         void (*apply)(accel__object *obj, void *data))
{
    return accel__state_plan_stage(r->plan, r->obj, nbytes, apply);
}

accel_status accel__state_resume_at(accel__state_reader *r, int64_t epoch, int64_t batch,
                                    int64_t length)
{
    const int64_t v[3] = {epoch, batch, length};
    return accel__state_plan_position(r->plan, r, v);
}
