/*
 * The files of a save_state checkpoint: which objects a checkpoint holds, the marker's
 * "accel_state" record, and the writing of every object's parts through the state protocol
 * (the folder layout of docs/checkpoint.md), plus the per-process generator and counters,
 * which are ckpt's own. What each file holds is decided by its objects (state_save); this file
 * decides only where it goes.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/atomic.h"
#include "ckpt/state.h"
#include "comm/comm.h"
#include "core/gstate.h"
#include "core/settings.h"

const accel__state_kind accel__state_kinds[ACCEL__OBJ_KIND_COUNT] = {
    [ACCEL__OBJ_MODEL] = {"models", 0, "model", "models", "gradients"},
    [ACCEL__OBJ_OPTIMIZER] = {"optimizers", 0, "optimizer", "optimizers", NULL},
    [ACCEL__OBJ_SCHEDULER] = {"schedulers", 0, "scheduler", "schedulers", NULL},
    [ACCEL__OBJ_LOADER] = {"loaders", 0, "loader", "loaders", NULL},
    [ACCEL__OBJ_SCALER] = {"scaler", 1, "loss scaler", "loss scalers", NULL},
    [ACCEL__OBJ_CUSTOM] = {"custom", 0, "registered object", "registered objects", NULL},
};

/* ---- object collection ---- */

accel_status accel__state_collect(accel *acc, accel__state_objs *o)
{
    memset(o, 0, sizeof(*o));
    size_t n = 1;
    accel__object *tail = NULL;
    for (accel__object *it = acc->objects; it != NULL; it = it->next) {
        tail = it;
        n++;
    }
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        if ((o->of[k] = accel__calloc(n, sizeof(accel__object *))) == NULL) {
            accel__state_objs_release(o);
            return accel__seterr(acc, ACCEL_ENOMEM, "save/load_state: out of memory");
        }
    }
    /* The list is newest first: walk it backwards for creation order. */
    for (accel__object *it = tail; it != NULL; it = it->prev) {
        if (it->prepared && it->cls->state_save != NULL) {
            o->of[it->kind][o->n[it->kind]++] = it;
        }
    }
    return ACCEL_OK;
}

void accel__state_objs_release(accel__state_objs *o)
{
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        accel__free(o->of[k]);
    }
    memset(o, 0, sizeof(*o));
}

/* ---- names and JSON files ---- */

void accel__st_indexed_name(char *buf, size_t cap, const char *stem, int i, int numbered_from_0,
                            const char *ext)
{
    if (i == 0 && !numbered_from_0) {
        snprintf(buf, cap, "%s%s", stem, ext);
    } else {
        snprintf(buf, cap, "%s_%d%s", stem, i, ext);
    }
}

const char *accel__st_ext(accel__state_store store)
{
    return store == ACCEL__STORE_TENSORS ? ".safetensors"
           : store == ACCEL__STORE_JSON  ? ".json"
                                         : ".bin";
}

accel_status accel__st_write_json(const char *dir, const char *name, json_t *root)
{
    if (root == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building %s", name);
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(root);
    char *path = accel__path_join(dir, name);
    accel_status st = (text && path) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    if (st == ACCEL_OK) {
        st = accel__write_file_atomic(path, text, strlen(text));
    }
    free(text); /* json_dumps: the C allocator */
    accel__free(path);
    return st;
}

accel_status accel__st_read_json(const char *dir, const char *name, json_t **out)
{
    char *path = accel__path_join(dir, name);
    if (path == NULL) {
        return ACCEL_ENOMEM;
    }
    char *text = NULL;
    size_t n = 0;
    accel_status st = accel__read_file(path, &text, &n);
    if (st == ACCEL_ENOTFOUND) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is missing", dir, name);
    }
    if (st == ACCEL_OK) {
        json_error_t jerr;
        json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
        if (root == NULL || !json_is_object(root)) {
            json_decref(root);
            st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: %s is not valid JSON (%s)",
                               dir, name, root ? "not an object" : jerr.text);
        } else {
            *out = root;
        }
    }
    accel__free(text);
    accel__free(path);
    return st;
}

/* ---- the marker's "accel_state" record ---- */

char *accel__state_info_json(const accel__state_info *info, int64_t iteration)
{
    json_t *s = json_object(), *root = json_object();
    int bad = s == NULL || root == NULL;
    bad |= json_object_set_new(s, "num_processes", json_integer(info->num_processes)) != 0;
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        const accel__state_kind *kd = &accel__state_kinds[k];
        json_t *v = kd->boolean ? json_boolean(info->n[k] > 0) : json_integer(info->n[k]);
        bad |= json_object_set_new(s, kd->count_key, v) != 0;
        if (kd->rank_flag != NULL) {
            bad |= json_object_set_new(s, kd->rank_flag, json_boolean(info->rank_tensors[k])) != 0;
        }
    }
    bad |= json_object_set_new(s, "iteration", json_integer((json_int_t)iteration)) != 0;
    char *text = NULL;
    if (!bad && json_object_set(root, "accel_state", s) == 0) {
        text = json_dumps(root, JSON_COMPACT);
    }
    json_decref(s);
    json_decref(root);
    return text;
}

/* A count of the record in [lo, 2^20] (beyond any real job: damage, and it would size
 * allocations); sets *bad_field to `key` otherwise. */
static int record_count(const json_t *s, const char *key, int lo, const char **bad_field)
{
    const json_t *v = json_object_get(s, key);
    json_int_t n = json_is_integer(v) ? json_integer_value(v) : -1;
    if (n < lo || n > (1 << 20)) {
        *bad_field = *bad_field ? *bad_field : key;
        return 0;
    }
    return (int)n;
}

/* A boolean of the record; sets *bad_field to `key` otherwise. */
static int record_bool(const json_t *s, const char *key, const char **bad_field)
{
    const json_t *v = json_object_get(s, key);
    if (!json_is_boolean(v)) {
        *bad_field = *bad_field ? *bad_field : key;
    }
    return json_is_true(v);
}

accel_status accel__state_info_read(const char *dir, accel__state_info *info)
{
    json_t *root = NULL;
    ACCEL_TRY(accel__st_read_json(dir, ACCEL__CKPT_MARKER, &root));
    const json_t *s = json_object_get(root, "accel_state");
    memset(info, 0, sizeof(*info));
    if (!json_is_object(s)) {
        json_decref(root);
        return accel__seterr(NULL, ACCEL_ECORRUPT,
                             "%s is not a save_state checkpoint: %s has no \"accel_state\" record "
                             "(a save_model folder? load it with accel_load_model)",
                             dir, ACCEL__CKPT_MARKER);
    }
    const char *bad = NULL;
    info->num_processes = record_count(s, "num_processes", 1, &bad);
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        const accel__state_kind *kd = &accel__state_kinds[k];
        info->n[k] = kd->boolean ? record_bool(s, kd->count_key, &bad)
                                 : record_count(s, kd->count_key, 0, &bad);
    }
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        if (accel__state_kinds[k].rank_flag != NULL) {
            info->rank_tensors[k] = record_bool(s, accel__state_kinds[k].rank_flag, &bad);
        }
    }
    const json_t *iteration = json_object_get(s, "iteration");
    if (!json_is_integer(iteration) || json_integer_value(iteration) < 0) {
        bad = bad ? bad : "iteration";
    }
    json_decref(root);
    if (bad != NULL) {
        return accel__seterr(NULL, ACCEL_ECORRUPT,
                             "checkpoint %s: %s: accel_state.%s is missing or out of range", dir,
                             ACCEL__CKPT_MARKER, bad);
    }
    return ACCEL_OK;
}

/* ---- writing ---- */

void accel__state_saves_release(accel__state_saves *s)
{
    for (int i = 0; s->w != NULL && i < s->n; i++) {
        accel__state_writer_release(&s->w[i]);
    }
    accel__free(s->w);
    accel__free(s->obj);
    accel__free(s->index);
    accel__free(s->sharded);
    memset(s, 0, sizeof(*s));
}

accel_status accel__state_save_shared(accel *acc, const accel__state_objs *o, int writer,
                                      accel__state_saves *s)
{
    memset(s, 0, sizeof(*s));
    int n = 0;
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        n += o->n[k];
    }
    s->w = accel__calloc((size_t)n + 1, sizeof(*s->w));
    s->obj = accel__calloc((size_t)n + 1, sizeof(*s->obj));
    s->index = accel__calloc((size_t)n + 1, sizeof(*s->index));
    s->sharded = accel__calloc((size_t)n + 1, sizeof(*s->sharded));
    if (s->w == NULL || s->obj == NULL || s->index == NULL || s->sharded == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_save_state: out of memory");
    }
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        for (int i = 0; i < o->n[k]; i++) {
            accel__object *obj = o->of[k][i];
            const accel__object_class *c = obj->cls;
            if (c->store == ACCEL__STORE_NONE) {
                continue;
            }
            char name[ACCEL__STATE_NAME_MAX];
            accel__st_indexed_name(name, sizeof name, c->name, i, c->numbered_from_0,
                                   accel__st_ext(c->store));
            accel__state_writer *w = &s->w[s->n];
            accel__state_writer_init(w, name, c->store, ACCEL__STATE_SHARED);
            s->obj[s->n] = obj;
            s->index[s->n++] = i;
            /* Only tensors can be sharded: the other parts are saved by the writer alone (a
             * registered object's callback runs once). */
            if (writer || c->store == ACCEL__STORE_TENSORS) {
                ACCEL_TRY(accel__state_writer_save(w, obj));
            }
        }
    }
    return ACCEL_OK;
}

/* FNV-1a over the tensors' names, dtypes and shapes: processes that put different tensors
 * into one sharded object disagree on it. */
static uint64_t tensors_hash(const accel__state_writer *w)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < w->n_ts; i++) {
        const accel_tensor *t = &w->ts[i].tensor;
        for (const char *p = w->ts[i].name; *p; p++) {
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        }
        h = (h ^ (uint64_t)t->dtype) * 1099511628211ull;
        for (int d = 0; d < t->ndim; d++) {
            h = (h ^ (uint64_t)t->shape[d]) * 1099511628211ull;
        }
    }
    return h;
}

/* The sum over processes of each tensor's piece, against its size. */
static accel_status check_cover(accel *acc, const accel__state_writer *w)
{
    int64_t *sum = accel__calloc(w->n_ts + 1, sizeof(int64_t));
    if (sum == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_save_state: out of memory");
    }
    accel_status st =
        w->n_ts == 0 ? ACCEL_OK
                     : accel__allreduce(acc->comm, w->counts, sum, w->n_ts, ACCEL_I64, ACCEL_SUM);
    if (st != ACCEL_OK) {
        st = accel__adopt_thread_error(acc, st);
    }
    for (size_t i = 0; st == ACCEL_OK && i < w->n_ts; i++) {
        int64_t total = accel_tensor_numel(&w->ts[i].tensor);
        if (sum[i] != total) {
            st = accel__seterr(acc, ACCEL_EINVAL,
                               "accel_save_state: %s: the processes' pieces of tensor %s hold "
                               "%lld elements of its %lld (each element must be put by exactly "
                               "one process)",
                               w->file, w->ts[i].name, (long long)sum[i], (long long)total);
        }
    }
    accel__free(sum);
    return st;
}

accel_status accel__state_shard_decide(accel *acc, accel__state_saves *s)
{
    /* Sharded: some process put a true piece (a process owning whole tensors, or none of
     * them, cannot tell by itself). */
    int32_t *any = accel__calloc((size_t)s->n + 1, sizeof(int32_t));
    if (any == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_save_state: out of memory");
    }
    for (int i = 0; i < s->n; i++) {
        s->sharded[i] = s->w[i].n_true_pieces > 0;
    }
    accel_status st = ACCEL_OK;
    if (acc->n_ranks > 1 && s->n > 0) {
        st = accel__allreduce(acc->comm, s->sharded, any, (size_t)s->n, ACCEL_I32, ACCEL_MAX);
        st = st != ACCEL_OK ? accel__adopt_thread_error(acc, st) : ACCEL_OK;
        for (int i = 0; st == ACCEL_OK && i < s->n; i++) {
            s->sharded[i] = any[i] != 0;
        }
    }
    accel__free(any);
    for (int i = 0; st == ACCEL_OK && i < s->n; i++) {
        const accel__state_writer *w = &s->w[i];
        if (!s->sharded[i]) {
            continue;
        }
        if (acc->settings->ckpt.save_on_each_node == 1) {
            return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                                 "accel_save_state: %s is sharded over the processes: with "
                                 "save_on_each_node every node's folder would hold only its own "
                                 "processes' shards; save to a file system all nodes share",
                                 w->file);
        }
        /* Every process put the same tensors (else their pieces cannot be matched). */
        int64_t mine[2] = {(int64_t)w->n_ts, (int64_t)(tensors_hash(w) >> 1)}, lo[2], hi[2];
        memcpy(lo, mine, sizeof lo);
        memcpy(hi, mine, sizeof hi);
        if (acc->n_ranks > 1) {
            st = accel__allreduce(acc->comm, mine, lo, 2, ACCEL_I64, ACCEL_MIN);
            if (st == ACCEL_OK) {
                st = accel__allreduce(acc->comm, mine, hi, 2, ACCEL_I64, ACCEL_MAX);
            }
            if (st != ACCEL_OK) {
                return accel__adopt_thread_error(acc, st);
            }
        }
        if (lo[0] != hi[0] || lo[1] != hi[1]) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_save_state: %s: the processes put different tensors "
                                 "(names, dtypes or shapes; %lld to %lld tensors)",
                                 w->file, (long long)lo[0], (long long)hi[0]);
        }
        /* The same tensors everywhere: a refusal below is every process's. */
        for (size_t t = 0; t < w->n_ts; t++) {
            if (accel_dtype_bits(w->ts[t].tensor.dtype) % 8 != 0) {
                return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                                     "accel_save_state: %s: tensor %s: pieces of sub-byte "
                                     "tensors are not supported",
                                     w->file, w->ts[t].name);
            }
        }
        st = check_cover(acc, w);
    }
    return st;
}

accel_status accel__state_write_shared(accel *acc, const accel__state_saves *s, const char *dir,
                                       int writer)
{
    accel_status st = ACCEL_OK;
    for (int i = 0; i < s->n && st == ACCEL_OK; i++) {
        const accel__object_class *c = s->obj[i]->cls;
        char meta_key[ACCEL__STATE_NAME_MAX], stem[ACCEL__STATE_NAME_MAX];
        snprintf(meta_key, sizeof meta_key, "accel_%s", c->name);
        if (s->sharded[i]) {
            accel__state_stem(stem, sizeof stem, c, s->index[i]);
            st = accel__state_shard_write(&s->w[i], dir, stem, acc->rank, acc->n_ranks);
            if (st == ACCEL_OK && writer) {
                st = accel__state_shard_write_index(&s->w[i], dir, stem, meta_key, acc->n_ranks);
            }
        } else if (writer) {
            st = accel__state_writer_write(&s->w[i], dir, c->format, meta_key);
        }
    }
    return st;
}

/* random_states_<rank>.json: the accelerator's generator and the GradientState's counters. */
static accel_status write_random_states(accel *acc, const char *dir)
{
    char name[64];
    snprintf(name, sizeof name, "random_states_%d.json", acc->rank);
    uint64_t gen[ACCEL_RNG_STATE_WORDS];
    ACCEL_TRY(accel_get_rng_state(acc, gen));
    accel__state_writer w;
    accel__state_writer_init(&w, name, ACCEL__STORE_JSON, ACCEL__STATE_RANK);
    accel_status st = accel__state_put_i64(&w, "process_index", acc->rank);
    if (st == ACCEL_OK) {
        st = accel__state_put_i64(&w, "num_processes", acc->n_ranks);
    }
    if (st == ACCEL_OK) {
        st = accel__state_put_i64(&w, "step", accel__grad_state_step(acc));
    }
    if (st == ACCEL_OK) {
        st = accel__state_put_bool(&w, "sync_gradients", accel__grad_state_sync(acc));
    }
    if (st == ACCEL_OK) {
        st = accel__state_put_gen(&w, "generator", gen);
    }
    if (st == ACCEL_OK) {
        st = accel__state_writer_write(&w, dir, NULL, NULL);
    }
    accel__state_writer_release(&w);
    return st;
}

/* The per-process file of kind k's objects (of[0..n), one class). */
static accel_status write_rank_kind(accel *acc, accel__object *const *of, int n, const char *dir,
                                    int *wrote_tensors)
{
    const accel__object_class *c = of[0]->cls;
    char name[ACCEL__STATE_NAME_MAX];
    snprintf(name, sizeof name, "%s%d%s", c->rank_name, acc->rank, accel__st_ext(c->rank_store));
    accel__state_writer w;
    accel__state_writer_init(&w, name, c->rank_store, ACCEL__STATE_RANK);
    int json = c->rank_store == ACCEL__STORE_JSON;
    accel_status st = ACCEL_OK;
    if (json) { /* {"num_processes", "process_index", rank_key: [object 0's part, ...]} */
        st = accel__state_put_i64(&w, "process_index", acc->rank);
        if (st == ACCEL_OK) {
            st = accel__state_put_i64(&w, "num_processes", acc->n_ranks);
        }
        if (st == ACCEL_OK) {
            st = accel__state_begin(&w, c->rank_key, 1);
        }
    }
    for (int i = 0; i < n && st == ACCEL_OK; i++) {
        if (json) {
            st = accel__state_begin(&w, NULL, 0);
        } else {
            snprintf(w.prefix, sizeof w.prefix, "%d/", i);
        }
        if (st == ACCEL_OK) {
            st = accel__state_writer_save(&w, of[i]);
        }
        if (st == ACCEL_OK && json) {
            st = accel__state_end(&w);
        }
    }
    if (st == ACCEL_OK && json) {
        st = accel__state_end(&w);
    }
    /* A tensor part exists only when some object put a tensor (gradients: only inside an
     * open accumulation window). */
    *wrote_tensors = !json && w.n_ts > 0;
    if (st == ACCEL_OK && (json || *wrote_tensors)) {
        st = accel__state_writer_write(&w, dir, NULL, NULL);
    }
    accel__state_writer_release(&w);
    return st;
}

accel_status accel__state_write_rank(accel *acc, const accel__state_objs *o, const char *dir,
                                     accel__state_info *info)
{
    ACCEL_TRY(write_random_states(acc, dir));
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        info->rank_tensors[k] = 0;
        if (o->n[k] > 0 && o->of[k][0]->cls->rank_store != ACCEL__STORE_NONE) {
            ACCEL_TRY(write_rank_kind(acc, o->of[k], o->n[k], dir, &info->rank_tensors[k]));
        }
    }
    return ACCEL_OK;
}
