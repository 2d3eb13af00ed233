/*
 * Sharded objects in a save_state checkpoint (docs/checkpoint.md, "Sharded checkpoints"): each
 * process writes the pieces of tensors it owns to "<stem>.shard-<r>-of-<N>.safetensors" (1-D
 * tensors under the tensor's name; the metadata "accel_shard" says where each piece starts),
 * the writing process writes "<stem>.index.json" (every tensor's dtype and shape in put order,
 * the shard files, the object's JSON values). A load opens the index and every shard, checks
 * that the pieces tile every tensor, and serves any element range of a tensor from them
 * (reshard.h), so a checkpoint loads on any number of processes and any stage.
 *
 * Invariant: a tensor is served only when its pieces tile it exactly (no hole, no element held
 * twice) and every piece lies inside its mapped, validated shard file.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "ckpt/reshard.h"
#include "ckpt/state.h"

#define SHARD_FORMAT "accel-shard"
#define INDEX_FORMAT "accel-sharded"
#define INDEX_VERSION 1

/* ---- names ---- */

void accel__state_stem(char *buf, size_t cap, const accel__object_class *c, int i)
{
    accel__st_indexed_name(buf, cap, c->name, i, c->numbered_from_0, "");
}

void accel__state_shard_name(char *buf, size_t cap, const char *stem, int r, int n_shards)
{
    snprintf(buf, cap, "%s.shard-%d-of-%d.safetensors", stem, r, n_shards);
}

void accel__state_index_name(char *buf, size_t cap, const char *stem)
{
    snprintf(buf, cap, "%s.index.json", stem);
}

/* ---- save ---- */

accel_status accel__state_shard_write(const accel__state_writer *w, const char *dir,
                                      const char *stem, int rank, int n_shards)
{
    char name[ACCEL__STATE_NAME_MAX];
    accel__state_shard_name(name, sizeof name, stem, rank, n_shards);
    accel_named_tensor *ts = accel__calloc(w->n_ts ? w->n_ts : 1, sizeof(*ts));
    json_t *meta = json_object(), *offs = json_object();
    char *text = NULL, *path = accel__path_join(dir, name);
    accel_status st = ACCEL_OK;
    if (ts == NULL || meta == NULL || offs == NULL || path == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", name);
    }
    size_t n = 0;
    for (size_t i = 0; st == ACCEL_OK && i < w->n_ts; i++) {
        if (w->counts[i] == 0) {
            continue; /* a process owning none of a tensor writes nothing of it */
        }
        int64_t shape[1] = {w->counts[i]};
        ts[n] =
            (accel_named_tensor){w->ts[i].name, accel_tensor_view(w->ts[i].tensor.data,
                                                                  w->ts[i].tensor.dtype, 1, shape)};
        ts[n++].tensor.device = w->ts[i].tensor.device;
        if (json_object_set_new(offs, w->ts[i].name, json_integer((json_int_t)w->offs[i])) != 0) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", name);
        }
    }
    if (st == ACCEL_OK) {
        json_object_set_new(meta, "shard", json_integer(rank));
        json_object_set_new(meta, "num_shards", json_integer(n_shards));
        json_object_set(meta, "offsets", offs);
        text = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
        st = text ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", name);
    }
    if (st == ACCEL_OK) {
        accel_kv kv[2] = {{"format", SHARD_FORMAT}, {"accel_shard", text}};
        st = accel_safetensors_write(path, ts, n, kv, 2);
    }
    free(text); /* json_dumps: the C allocator */
    json_decref(meta);
    json_decref(offs);
    accel__free(path);
    accel__free(ts);
    return st;
}

accel_status accel__state_shard_write_index(const accel__state_writer *w, const char *dir,
                                            const char *stem, const char *meta_key, int n_shards)
{
    json_t *root = json_object(), *shards = json_array(), *tensors = json_array();
    int bad = root == NULL || shards == NULL || tensors == NULL;
    for (int r = 0; !bad && r < n_shards; r++) {
        char name[ACCEL__STATE_NAME_MAX];
        accel__state_shard_name(name, sizeof name, stem, r, n_shards);
        bad = json_array_append_new(shards, json_string(name)) != 0;
    }
    for (size_t i = 0; !bad && i < w->n_ts; i++) {
        const accel_tensor *t = &w->ts[i].tensor;
        json_t *e = json_object(), *shape = json_array();
        bad = e == NULL || shape == NULL;
        for (int d = 0; !bad && d < t->ndim; d++) {
            bad = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0;
        }
        bad = bad || json_object_set_new(e, "name", json_string(w->ts[i].name)) != 0 ||
              json_object_set_new(e, "dtype", json_string(accel_dtype_name(t->dtype))) != 0 ||
              json_object_set(e, "shape", shape) != 0 || json_array_append(tensors, e) != 0;
        json_decref(e);
        json_decref(shape);
    }
    bad = bad || json_object_set_new(root, "format", json_string(INDEX_FORMAT)) != 0 ||
          json_object_set_new(root, "version", json_integer(INDEX_VERSION)) != 0 ||
          json_object_set_new(root, "num_shards", json_integer(n_shards)) != 0 ||
          json_object_set(root, "shards", shards) != 0 ||
          json_object_set(root, "tensors", tensors) != 0;
    if (!bad && meta_key != NULL && json_object_size(w->open[0]) > 0) {
        bad = json_object_set(root, meta_key, w->open[0]) != 0;
    }
    json_decref(shards);
    json_decref(tensors);
    char name[ACCEL__STATE_NAME_MAX];
    accel__state_index_name(name, sizeof name, stem);
    if (bad) {
        json_decref(root);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory writing %s", name);
    }
    return accel__st_write_json(dir, name, root);
}

/* ---- load ---- */

typedef struct shard_tensor {
    const char *name; /* borrowed from the index */
    accel_dtype dtype;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    int64_t numel;
    accel__piece *pieces; /* into the table's array: sorted, tiling */
    size_t n_pieces;
    size_t pos; /* its place in the index (the order the object put it) */
    int read;
} shard_tensor;

struct accel__state_sharded {
    json_t *index;
    int n_shards;
    accel_safetensors **shards;
    shard_tensor *ts; /* sorted by name */
    size_t n_ts;
    size_t *order;        /* order[pos]: the tensor put pos-th */
    accel__piece *pieces; /* all of them, grouped by tensor */
};

void accel__state_shard_close(accel__state_sharded *sh)
{
    if (sh == NULL) {
        return;
    }
    for (int r = 0; sh->shards != NULL && r < sh->n_shards; r++) {
        accel_safetensors_close(sh->shards[r]);
    }
    accel__free(sh->shards);
    accel__free(sh->ts);
    accel__free(sh->order);
    accel__free(sh->pieces);
    json_decref(sh->index);
    accel__free(sh);
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const shard_tensor *)a)->name, ((const shard_tensor *)b)->name);
}

static shard_tensor *find(const accel__state_sharded *sh, const char *name)
{
    shard_tensor key = {.name = name};
    return bsearch(&key, sh->ts, sh->n_ts, sizeof(key), cmp_tensor);
}

static accel_status bad_index(const char *dir, const char *file, const char *what)
{
    return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: %s is malformed: %s", dir, file,
                         what);
}

/* The index's "tensors" into sh->ts (sorted by name, no duplicates). */
static accel_status read_tensors(accel__state_sharded *sh, const char *dir, const char *file)
{
    const json_t *arr = json_object_get(sh->index, "tensors");
    if (!json_is_array(arr)) {
        return bad_index(dir, file, "\"tensors\" is not an array");
    }
    sh->n_ts = json_array_size(arr);
    sh->ts = accel__calloc(sh->n_ts ? sh->n_ts : 1, sizeof(*sh->ts));
    if (sh->ts == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < sh->n_ts; i++) {
        const json_t *e = json_array_get(arr, i), *shape = json_object_get(e, "shape");
        shard_tensor *t = &sh->ts[i];
        t->name = json_string_value(json_object_get(e, "name"));
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        if (t->name == NULL || dt == NULL || accel_dtype_from_name(dt, &t->dtype) != ACCEL_OK ||
            accel_dtype_bits(t->dtype) % 8 != 0 || !json_is_array(shape) ||
            json_array_size(shape) > ACCEL_MAX_DIMS) {
            char what[96];
            snprintf(what, sizeof what, "tensors[%zu] is not {name, dtype, shape}", i);
            return bad_index(dir, file, what);
        }
        t->ndim = (int)json_array_size(shape);
        t->pos = i;
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            const json_t *v = json_array_get(shape, (size_t)d);
            json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
            if (x < 0 || (x > 0 && t->numel > INT64_MAX / 8 / x)) {
                char what[160];
                snprintf(what, sizeof what, "tensor %s has a bad shape", t->name);
                return bad_index(dir, file, what);
            }
            t->shape[d] = x;
            t->numel *= x;
        }
    }
    qsort(sh->ts, sh->n_ts, sizeof(*sh->ts), cmp_tensor);
    sh->order = accel__calloc(sh->n_ts ? sh->n_ts : 1, sizeof(size_t));
    if (sh->order == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < sh->n_ts; i++) {
        sh->order[sh->ts[i].pos] = i;
    }
    for (size_t i = 1; i < sh->n_ts; i++) {
        if (strcmp(sh->ts[i - 1].name, sh->ts[i].name) == 0) {
            char what[160];
            snprintf(what, sizeof what, "tensor %s is listed twice", sh->ts[i].name);
            return bad_index(dir, file, what);
        }
    }
    return ACCEL_OK;
}

/* Shard r's pieces into sh->pieces (at *n_pieces), each checked against the index. */
static accel_status read_shard(accel__state_sharded *sh, const char *dir, int r, size_t *n_pieces)
{
    accel_safetensors *st = sh->shards[r];
    const char *file = accel_safetensors_path(st);
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    const char *text = accel_safetensors_metadata(st, "accel_shard");
    json_t *meta = text ? json_loads(text, JSON_REJECT_DUPLICATES, NULL) : NULL;
    const json_t *offs = json_object_get(meta, "offsets");
    json_t *who = json_object_get(meta, "shard"), *of = json_object_get(meta, "num_shards");
    accel_status st_ = ACCEL_OK;
    if (!json_is_object(offs) || !json_is_integer(who) || json_integer_value(who) != r ||
        !json_is_integer(of) || json_integer_value(of) != sh->n_shards ||
        json_object_size(offs) != accel_safetensors_count(st)) {
        st_ = bad_index(dir, base, "its \"accel_shard\" metadata does not describe this shard");
    }
    for (size_t i = 0; st_ == ACCEL_OK && i < accel_safetensors_count(st); i++) {
        const char *name = accel_safetensors_name(st, i);
        const json_t *o = json_object_get(offs, name);
        shard_tensor *t = find(sh, name);
        accel_tensor v;
        st_ = accel_safetensors_tensor(st, i, &v);
        json_int_t off = json_is_integer(o) ? json_integer_value(o) : -1;
        if (st_ == ACCEL_OK && (t == NULL || v.dtype != t->dtype || v.ndim != 1 || off < 0 ||
                                off > t->numel || v.shape[0] > t->numel - off)) {
            char what[ACCEL__ERRMSG_NBYTES / 2];
            snprintf(what, sizeof what, "tensor %s is not a piece of a tensor of the index", name);
            st_ = bad_index(dir, base, what);
        }
        if (st_ == ACCEL_OK) {
            sh->pieces[(*n_pieces)++] = (accel__piece){off, v.shape[0], r, i};
        }
    }
    json_decref(meta);
    return st_;
}

/* The tensor a piece belongs to (its name in its shard file). */
static shard_tensor *owner(const accel__state_sharded *sh, const accel__piece *p)
{
    return find(sh, accel_safetensors_name(sh->shards[p->src], p->src_index));
}

accel_status accel__state_shard_open(accel__state_file *f, const char *dir, const char *stem,
                                     const char *meta_key, const accel__ckpt_marker *marker)
{
    accel__state_sharded *sh = accel__calloc(1, sizeof(*sh));
    if (sh == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    f->sh = sh;
    f->store = ACCEL__STORE_TENSORS;
    accel__state_index_name(f->name, sizeof f->name, stem);
    ACCEL_TRY(accel__st_read_json(dir, f->name, &sh->index));
    const json_t *fmt = json_object_get(sh->index, "format");
    const json_t *ver = json_object_get(sh->index, "version");
    const json_t *n = json_object_get(sh->index, "num_shards");
    const json_t *names = json_object_get(sh->index, "shards");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), INDEX_FORMAT) != 0) {
        return bad_index(dir, f->name, "\"format\" is not \"" INDEX_FORMAT "\"");
    }
    if (!json_is_integer(ver) || json_integer_value(ver) != INDEX_VERSION) {
        return bad_index(dir, f->name, "\"version\" is not 1 (the only version this accel reads)");
    }
    if (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > (1 << 20) ||
        !json_is_array(names) || json_array_size(names) != (size_t)json_integer_value(n)) {
        return bad_index(dir, f->name, "\"num_shards\" and \"shards\" do not agree");
    }
    sh->n_shards = (int)json_integer_value(n);
    ACCEL_TRY(read_tensors(sh, dir, f->name));
    sh->shards = accel__calloc((size_t)sh->n_shards, sizeof(*sh->shards));
    if (sh->shards == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    size_t total = 0;
    for (int r = 0; r < sh->n_shards; r++) {
        char want[ACCEL__STATE_NAME_MAX];
        accel__state_shard_name(want, sizeof want, stem, r, sh->n_shards);
        const char *name = json_string_value(json_array_get(names, (size_t)r));
        if (name == NULL || strcmp(name, want) != 0) {
            char what[2 * ACCEL__STATE_NAME_MAX];
            snprintf(what, sizeof what, "shards[%d] is not %s", r, want);
            return bad_index(dir, f->name, what);
        }
        if (accel__ckpt_marker_find(marker, name) == NULL) {
            return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is not listed in %s",
                                 dir, name, ACCEL__CKPT_MARKER);
        }
        char *path = accel__path_join(dir, name);
        void *map = NULL;
        size_t map_nbytes = 0;
        accel_status st = path == NULL ? ACCEL_ENOMEM
                          : accel__ckpt_marker_take_map(marker, name, &map, &map_nbytes)
                              ? accel__safetensors_open_map(&sh->shards[r], path, map, map_nbytes)
                              : accel_safetensors_open(&sh->shards[r], path);
        accel__free(path);
        if (st == ACCEL_ENOTFOUND) {
            st =
                accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is missing", dir, name);
        }
        ACCEL_TRY(st);
        total += accel_safetensors_count(sh->shards[r]);
    }
    sh->pieces = accel__calloc(total ? total : 1, sizeof(*sh->pieces));
    if (sh->pieces == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    size_t n_pieces = 0;
    for (int r = 0; r < sh->n_shards; r++) {
        ACCEL_TRY(read_shard(sh, dir, r, &n_pieces));
    }
    /* Group the pieces by tensor (counting sort over the sorted tensor table), then order
     * and check each tensor's. */
    for (size_t i = 0; i < n_pieces; i++) {
        owner(sh, &sh->pieces[i])->n_pieces++;
    }
    accel__piece *grouped = accel__calloc(total ? total : 1, sizeof(*grouped));
    if (grouped == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    size_t at = 0;
    for (size_t t = 0; t < sh->n_ts; t++) {
        sh->ts[t].pieces = grouped + at;
        at += sh->ts[t].n_pieces;
        sh->ts[t].n_pieces = 0;
    }
    for (size_t i = 0; i < n_pieces; i++) {
        shard_tensor *t = owner(sh, &sh->pieces[i]);
        t->pieces[t->n_pieces++] = sh->pieces[i];
    }
    accel__free(sh->pieces);
    sh->pieces = grouped;
    for (size_t t = 0; t < sh->n_ts; t++) {
        shard_tensor *x = &sh->ts[t];
        accel__pieces_sort(x->pieces, x->n_pieces);
        int64_t bad;
        int overlap;
        if (!accel__pieces_tile(x->pieces, x->n_pieces, x->numel, &bad, &overlap)) {
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "checkpoint %s: the shards of %s do not hold tensor %s exactly: "
                                 "element %lld of %lld is %s",
                                 dir, f->name, x->name, (long long)bad, (long long)x->numel,
                                 overlap ? "in two shards" : "in none");
        }
    }
    json_t *values = meta_key ? json_object_get(sh->index, meta_key) : NULL;
    if (values != NULL && !json_is_object(values)) {
        return bad_index(dir, f->name, "the object's values are not a JSON object");
    }
    f->root = json_incref(values);
    return ACCEL_OK;
}

typedef struct shard_copy {
    accel__state_reader *r;
    const shard_tensor *t;
    char *dst;
    accel_device where;
    size_t elem_nbytes;
} shard_copy;

static accel_status plan_one(void *ctx, const accel__piece_copy *c)
{
    shard_copy *x = ctx;
    const accel__piece *p = &x->t->pieces[c->piece];
    accel_tensor v;
    ACCEL_TRY(accel_safetensors_tensor(x->r->f->sh->shards[p->src], p->src_index, &v));
    return accel__state_plan_copy(x->r->plan, x->dst + (size_t)c->dst_elem * x->elem_nbytes,
                                  x->where,
                                  (const char *)v.data + (size_t)c->src_elem * x->elem_nbytes,
                                  (size_t)c->count * x->elem_nbytes);
}

accel_status accel__state_shard_get(accel__state_reader *r, const char *full, accel_tensor piece,
                                    const accel__state_piece *whole)
{
    shard_tensor *t = find(r->f->sh, full);
    if (t == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "checkpoint %s: %s has no tensor %s (the live %s has it)", r->dir,
                             r->f->name, full, r->noun);
    }
    ACCEL_TRY(accel__state_check_piece(r, full, t->dtype, t->ndim, t->shape, piece, whole));
    t->read = 1;
    shard_copy x = {r, t, piece.data, piece.device, accel_dtype_nbytes(t->dtype)};
    accel_status st = accel__reshard(t->pieces, t->n_pieces, whole->offset,
                                     accel_tensor_numel(&piece), plan_one, &x);
    if (st == ACCEL_EINVAL) { /* tiling was checked at open: cannot happen */
        return accel__state_fail(r, ACCEL_ECORRUPT, "tensor %s: its pieces have a hole", full);
    }
    return st;
}

accel_status accel__state_shard_all_read(const accel__state_file *f, const char *dir)
{
    for (size_t i = 0; i < f->sh->n_ts; i++) {
        if (!f->sh->ts[i].read) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "checkpoint %s: %s holds tensor %s, which no live object has "
                                 "(%zu tensors in its shards; are the objects built as when "
                                 "saving?)",
                                 dir, f->name, f->sh->ts[i].name, f->sh->n_ts);
        }
    }
    return ACCEL_OK;
}

/* ---- offline consolidation (merge.c) ---- */

size_t accel__state_shard_n_tensors(const accel__state_sharded *sh)
{
    return sh->n_ts;
}

accel_named_tensor accel__state_shard_desc(const accel__state_sharded *sh, size_t i)
{
    const shard_tensor *t = &sh->ts[sh->order[i]];
    return (accel_named_tensor){t->name, accel_tensor_view(NULL, t->dtype, t->ndim, t->shape)};
}

accel_status accel__state_shard_pieces(const accel__state_sharded *sh, size_t i,
                                       accel_status (*fn)(void *ctx, int64_t offset,
                                                          const void *data, int64_t count),
                                       void *ctx)
{
    const shard_tensor *t = &sh->ts[sh->order[i]];
    for (size_t k = 0; k < t->n_pieces; k++) {
        const accel__piece *p = &t->pieces[k];
        accel_tensor v;
        ACCEL_TRY(accel_safetensors_tensor(sh->shards[p->src], p->src_index, &v));
        ACCEL_TRY(fn(ctx, p->offset, v.data, p->count));
    }
    return ACCEL_OK;
}
