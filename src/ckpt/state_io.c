/*
 * The files of a save_state checkpoint: how each kind of state (models, optimizers,
 * schedulers, loss scaler, registered objects, per-process generator / counters / loader
 * positions / open-window gradients) is written, and how a folder is validated and applied.
 *
 * Invariant of a load: accel__state_plan_new opens, parses and checks every file this process
 * needs against the live objects and modifies nothing; only accel__state_plan_apply writes,
 * and after the registered objects' callbacks it cannot fail.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/atomic.h"
#include "ckpt/state.h"
#include "core/rng.h"
#include "train/train_internal.h"
#include "train/train_state.h"

/* ---- object collection ---- */

accel_status accel__state_collect(accel *acc, accel__state_objs *o)
{
    memset(o, 0, sizeof(*o));
    int n = 0;
    accel__object *tail = NULL;
    for (accel__object *it = acc->objects; it != NULL; it = it->next) {
        tail = it;
        n++;
    }
    size_t cap = (size_t)(n > 0 ? n : 1);
    o->models = accel__calloc(cap, sizeof(*o->models));
    o->opts = accel__calloc(cap, sizeof(*o->opts));
    o->scheds = accel__calloc(cap, sizeof(*o->scheds));
    o->loaders = accel__calloc(cap, sizeof(*o->loaders));
    if (!o->models || !o->opts || !o->scheds || !o->loaders) {
        accel__state_objs_release(o);
        return accel__seterr(acc, ACCEL_ENOMEM, "save/load_state: out of memory");
    }
    /* The list is newest first: walk it backwards for creation order. */
    for (accel__object *it = tail; it != NULL; it = it->prev) {
        if (!it->prepared) {
            continue;
        }
        switch (it->kind) {
        case ACCEL__OBJ_MODEL:
            if (!accel__model_on_host((accel_model *)it)) { /* issue 14: state protocol */
                accel_device d = accel__device_which(((accel_model *)it)->dev);
                accel__state_objs_release(o);
                return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                                     "save_state / load_state: checkpointing a model on cuda:%d "
                                     "is not supported yet",
                                     d.index);
            }
            o->models[o->n_models++] = (accel_model *)it;
            break;
        case ACCEL__OBJ_OPTIMIZER:
            o->opts[o->n_opts++] = (accel_optimizer *)it;
            break;
        case ACCEL__OBJ_SCHEDULER:
            o->scheds[o->n_scheds++] = (accel_scheduler *)it;
            break;
        case ACCEL__OBJ_LOADER:
            o->loaders[o->n_loaders++] = (accel_loader *)it;
            break;
        default:
            break;
        }
    }
    return ACCEL_OK;
}

void accel__state_objs_release(accel__state_objs *o)
{
    accel__free(o->models);
    accel__free(o->opts);
    accel__free(o->scheds);
    accel__free(o->loaders);
    memset(o, 0, sizeof(*o));
}

/* ---- names and small helpers ---- */

/* Accelerate's indexing: "model.safetensors", "model_1.safetensors", ... */
void accel__st_indexed_name(char *buf, size_t cap, const char *stem, int i, const char *ext)
{
    if (i == 0) {
        snprintf(buf, cap, "%s%s", stem, ext);
    } else {
        snprintf(buf, cap, "%s_%d%s", stem, i, ext);
    }
}

static char *join(const char *dir, const char *name)
{
    return accel__path_join(dir, name);
}

static void u64_hex(char out[19], uint64_t v)
{
    snprintf(out, 19, "0x%016" PRIx64, v);
}

int accel__st_parse_u64(const json_t *j, uint64_t *out)
{
    const char *s = json_string_value(j);
    if (s == NULL || strncmp(s, "0x", 2) != 0 || strlen(s) != 18) {
        return 0;
    }
    char *end = NULL;
    *out = strtoull(s + 2, &end, 16);
    return end != NULL && *end == '\0';
}

static json_t *gen_json(const uint64_t s[ACCEL_RNG_STATE_WORDS])
{
    json_t *a = json_array();
    for (int i = 0; a && i < ACCEL_RNG_STATE_WORDS; i++) {
        char h[19];
        u64_hex(h, s[i]);
        json_array_append_new(a, json_string(h));
    }
    return a;
}

int accel__st_parse_gen(const json_t *a, uint64_t s[ACCEL_RNG_STATE_WORDS])
{
    if (!json_is_array(a) || json_array_size(a) != ACCEL_RNG_STATE_WORDS) {
        return 0;
    }
    uint64_t any = 0;
    for (size_t i = 0; i < ACCEL_RNG_STATE_WORDS; i++) {
        if (!accel__st_parse_u64(json_array_get(a, i), &s[i])) {
            return 0;
        }
        any |= s[i];
    }
    return any != 0;
}

/* Writes `root` (consumed) as indented JSON to dir/name, fsynced. */
static accel_status write_json(const char *dir, const char *name, json_t *root)
{
    if (root == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building %s", name);
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(root);
    char *path = join(dir, name);
    accel_status st = (text && path) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    if (st == ACCEL_OK) {
        size_t n = strlen(text);
        text[n] = '\0';
        st = accel__write_file_atomic(path, text, n);
    }
    free(text);
    accel__free(path);
    return st;
}

/* Reads dir/name as a JSON object; ACCEL_ECORRUPT naming the file when malformed. */
accel_status accel__st_read_json(const char *dir, const char *name, json_t **out)
{
    char *path = join(dir, name);
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

/* Integer / real fields of a parsed object; *bad is set (and the value left) when missing. */
long long accel__st_jint(const json_t *o, const char *key, int *bad)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) {
        *bad = 1;
        return 0;
    }
    return (long long)json_integer_value(v);
}

double accel__st_jreal(const json_t *o, const char *key, int *bad)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) {
        *bad = 1;
        return 0;
    }
    return json_number_value(v);
}

/* ---- the marker's "accel_state" record ---- */

static int has_scaler(accel *acc)
{
    double scale;
    long long tracker;
    return accel__scaler_get(acc, &scale, &tracker);
}

void accel__state_info_now(accel *acc, const accel__state_objs *o, accel__state_info *info)
{
    memset(info, 0, sizeof(*info));
    info->num_processes = acc->n_ranks;
    info->n_models = o->n_models;
    info->n_opts = o->n_opts;
    info->n_scheds = o->n_scheds;
    info->n_loaders = o->n_loaders;
    info->n_custom = o->n_custom;
    info->has_scaler = has_scaler(acc);
    int gas = acc->opt.gradient_accumulation_steps;
    /* Inside an open accumulation window the gradients are part of the state. */
    info->has_grads = o->n_models > 0 && gas > 1 && acc->gstate.step % gas != 0;
}

char *accel__state_info_json(const accel__state_info *info, int64_t iteration)
{
    json_t *s = json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:b,s:I}", "num_processes",
                          info->num_processes, "models", info->n_models, "optimizers", info->n_opts,
                          "schedulers", info->n_scheds, "loaders", info->n_loaders, "custom",
                          info->n_custom, "scaler", info->has_scaler, "gradients", info->has_grads,
                          "iteration", (json_int_t)iteration);
    json_t *root = s ? json_pack("{s:o}", "accel_state", s) : NULL;
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
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
    info->n_models = record_count(s, "models", 0, &bad);
    info->n_opts = record_count(s, "optimizers", 0, &bad);
    info->n_scheds = record_count(s, "schedulers", 0, &bad);
    info->n_loaders = record_count(s, "loaders", 0, &bad);
    info->n_custom = record_count(s, "custom", 0, &bad);
    const json_t *scaler = json_object_get(s, "scaler"), *grads = json_object_get(s, "gradients");
    const json_t *iteration = json_object_get(s, "iteration");
    bad = bad                                                                ? bad
          : !json_is_boolean(scaler)                                         ? "scaler"
          : !json_is_boolean(grads)                                          ? "gradients"
          : !json_is_integer(iteration) || json_integer_value(iteration) < 0 ? "iteration"
                                                                             : NULL;
    info->has_scaler = json_is_true(scaler);
    info->has_grads = json_is_true(grads);
    json_decref(root);
    if (bad != NULL) {
        return accel__seterr(NULL, ACCEL_ECORRUPT,
                             "checkpoint %s: %s: accel_state.%s is missing or out of range", dir,
                             ACCEL__CKPT_MARKER, bad);
    }
    return ACCEL_OK;
}

/* ---- writing ---- */

/* The views of every parameter of m over flat buffer `base` (NULL: the master weights). */
static accel_status param_views(const accel_model *m, const float *base, const char *prefix,
                                accel_named_tensor *ts, char **names)
{
    for (int i = 0; i < m->n_params; i++) {
        const accel_param *p = &m->params[i];
        const float *data = base ? base + p->offset : p->data;
        if (prefix != NULL) {
            size_t n = strlen(prefix) + strlen(p->name) + 1;
            names[i] = accel__malloc(n);
            if (names[i] == NULL) {
                return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
            }
            snprintf(names[i], n, "%s%s", prefix, p->name);
        }
        ts[i].name = prefix ? names[i] : p->name;
        ts[i].tensor = accel_tensor_view((void *)data, ACCEL_F32, p->ndim, p->shape);
    }
    return ACCEL_OK;
}

static accel_status write_model(const accel_model *m, const char *dir, int i)
{
    char name[64];
    accel__st_indexed_name(name, sizeof name, "model", i, ".safetensors");
    accel_named_tensor *ts = accel__calloc((size_t)m->n_params, sizeof(*ts));
    char *path = join(dir, name);
    accel_status st = (ts && path) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    if (st == ACCEL_OK) {
        st = param_views(m, NULL, NULL, ts, NULL);
    }
    accel_kv meta[] = {{"format", "pt"}};
    if (st == ACCEL_OK) {
        st = accel_safetensors_write(path, ts, (size_t)m->n_params, meta, 1);
    }
    accel__free(path);
    accel__free(ts);
    return st;
}

const char *accel__st_optim_kind_name(int kind)
{
    return kind == ACCEL__SGD ? "sgd" : kind == ACCEL__ADAM ? "adam" : "adamw";
}

int accel__st_optim_buffers(const accel_optimizer *opt, const char *names[3], float *bufs[3])
{
    if (opt->kind == ACCEL__SGD) {
        names[0] = "momentum_buffer.";
        bufs[0] = opt->state_a;
        return 1;
    }
    names[0] = "exp_avg.";
    names[1] = "exp_avg_sq.";
    names[2] = "max_exp_avg_sq.";
    bufs[0] = opt->state_a;
    bufs[1] = opt->state_b;
    bufs[2] = opt->state_c;
    return 3;
}

static json_t *optim_meta_json(const accel_optimizer *opt)
{
    json_t *groups = json_array(), *pg = json_object();
    for (int g = 0; groups && g < opt->n_groups; g++) {
        json_array_append_new(groups, json_pack("{s:f,s:f}", "lr", opt->groups[g].lr,
                                                "weight_decay", opt->groups[g].weight_decay));
    }
    const accel_model *m = opt->model;
    for (int i = 0; pg && i < m->n_params; i++) {
        json_object_set_new(pg, m->params[i].name, json_integer(opt->param_group[i]));
    }
    return json_pack("{s:s,s:I,s:b,s:f,s:f,s:f,s:f,s:f,s:b,s:b,s:b,s:o,s:o}", "kind",
                     accel__st_optim_kind_name(opt->kind), "step", (json_int_t)opt->n_steps,
                     "step_was_skipped", opt->step_was_skipped, "momentum", opt->momentum,
                     "dampening", opt->dampening, "beta1", opt->beta1, "beta2", opt->beta2, "eps",
                     opt->eps, "nesterov", opt->nesterov, "maximize", opt->maximize, "amsgrad",
                     opt->amsgrad, "param_groups", groups, "param_group_of", pg);
}

static accel_status write_optimizer(const accel_optimizer *opt, const char *dir, int i)
{
    char name[64];
    accel__st_indexed_name(name, sizeof name, "optimizer", i, ".safetensors");
    const accel_model *m = opt->model;
    const char *bnames[3] = {0};
    float *bufs[3] = {0};
    int nb = accel__st_optim_buffers(opt, bnames, bufs);
    size_t np = (size_t)m->n_params, cap = np * 3 + 1;
    accel_named_tensor *ts = accel__calloc(cap, sizeof(*ts));
    char **names = accel__calloc(cap, sizeof(*names));
    char *path = join(dir, name);
    json_t *meta = optim_meta_json(opt);
    char *meta_text = meta ? json_dumps(meta, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(meta);
    accel_status st =
        (ts && names && path && meta_text) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    size_t n = 0;
    for (int b = 0; st == ACCEL_OK && b < nb; b++) {
        if (bufs[b] != NULL) {
            st = param_views(m, bufs[b], bnames[b], ts + n, names + n);
            n += np;
        }
    }
    accel_kv kv[] = {{"format", "accel-optimizer"}, {"accel_optimizer", meta_text}};
    if (st == ACCEL_OK) {
        st = accel_safetensors_write(path, ts, n, kv, 2);
    }
    for (size_t k = 0; names && k < cap; k++) {
        accel__free(names[k]);
    }
    accel__free(names);
    accel__free(ts);
    accel__free(path);
    free(meta_text);
    return st;
}

static accel_status write_scheduler(const accel_scheduler *s, const char *dir, int i)
{
    char name[64];
    accel__st_indexed_name(name, sizeof name, "scheduler", i, ".json");
    accel__sched_state ss;
    accel__scheduler_get_state(s, &ss);
    json_t *base = json_array(), *last = json_array();
    for (int g = 0; base && last && g < ss.n_groups; g++) {
        json_array_append_new(base, json_real(ss.base_lr[g]));
        json_array_append_new(last, json_real(ss.last_lr[g]));
    }
    return write_json(dir, name,
                      json_pack("{s:i,s:I,s:I,s:o,s:o}", "kind", ss.kind, "last_epoch",
                                (json_int_t)ss.last_epoch, "_step_count", (json_int_t)ss.step_count,
                                "base_lrs", base, "_last_lr", last));
}

static accel_status write_scaler(accel *acc, const char *dir)
{
    double scale = 0;
    long long tracker = 0;
    accel__scaler_get(acc, &scale, &tracker);
    const accel_options *o = &acc->opt;
    return write_json(dir, "scaler.json",
                      json_pack("{s:f,s:f,s:f,s:i,s:I}", "scale", scale, "growth_factor",
                                o->growth_factor, "backoff_factor", o->backoff_factor,
                                "growth_interval", o->growth_interval, "_growth_tracker",
                                (json_int_t)tracker));
}

struct accel_state_writer {
    char *data;
    size_t n, cap;
};

accel_status accel_state_write(accel_state_writer *w, const void *data, size_t nbytes)
{
    if (w == NULL || (data == NULL && nbytes > 0)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_state_write: NULL %s",
                             w ? "data" : "writer");
    }
    if (w->n + nbytes > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + nbytes) {
            cap *= 2;
        }
        char *p = accel__realloc(w->data, cap);
        if (p == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "accel_state_write: out of memory");
        }
        w->data = p;
        w->cap = cap;
    }
    if (nbytes > 0) {
        memcpy(w->data + w->n, data, nbytes);
    }
    w->n += nbytes;
    return ACCEL_OK;
}

static accel_status write_custom(accel *acc, const accel__custom_obj *c, const char *dir, int i)
{
    char name[64];
    snprintf(name, sizeof name, "custom_checkpoint_%d.bin", i);
    accel_state_writer w = {0};
    accel__clear_error();
    accel_status st = c->save(c->ctx, &w);
    if (st != ACCEL_OK) {
        accel__seterr(acc, st, "accel_save_state: registered object %d's save failed: %s", i,
                      accel__cause(st));
    } else {
        char *path = join(dir, name);
        st = path ? accel__write_file_atomic(path, w.data ? w.data : "", w.n) : ACCEL_ENOMEM;
        accel__free(path);
    }
    accel__free(w.data);
    return st;
}

accel_status accel__state_write_shared(accel *acc, const accel__state_objs *o,
                                       const accel__state_info *info, const char *dir)
{
    for (int i = 0; i < o->n_models; i++) {
        ACCEL_TRY(write_model(o->models[i], dir, i));
    }
    for (int i = 0; i < o->n_opts; i++) {
        ACCEL_TRY(write_optimizer(o->opts[i], dir, i));
    }
    for (int i = 0; i < o->n_scheds; i++) {
        ACCEL_TRY(write_scheduler(o->scheds[i], dir, i));
    }
    if (info->has_scaler) {
        ACCEL_TRY(write_scaler(acc, dir));
    }
    for (int i = 0; i < o->n_custom; i++) {
        ACCEL_TRY(write_custom(acc, &o->custom[i], dir, i));
    }
    return ACCEL_OK;
}

static accel_status write_grads(accel *acc, const accel__state_objs *o, const char *dir)
{
    char name[64];
    snprintf(name, sizeof name, "gradients_rank%d.safetensors", acc->rank);
    size_t total = 0;
    for (int i = 0; i < o->n_models; i++) {
        total += (size_t)o->models[i]->n_params;
    }
    accel_named_tensor *ts = accel__calloc(total + 1, sizeof(*ts));
    char **names = accel__calloc(total + 1, sizeof(*names));
    char *path = join(dir, name);
    accel_status st = (ts && names && path) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    size_t n = 0;
    for (int i = 0; st == ACCEL_OK && i < o->n_models; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "%d/", i);
        st = param_views(o->models[i], o->models[i]->grad, prefix, ts + n, names + n);
        n += (size_t)o->models[i]->n_params;
    }
    if (st == ACCEL_OK) {
        st = accel_safetensors_write(path, ts, n, NULL, 0);
    }
    for (size_t k = 0; names && k < total; k++) {
        accel__free(names[k]);
    }
    accel__free(names);
    accel__free(ts);
    accel__free(path);
    return st;
}

accel_status accel__state_write_rank(accel *acc, const accel__state_objs *o,
                                     const accel__state_info *info, const char *dir)
{
    char name[64];
    uint64_t gen[ACCEL_RNG_STATE_WORDS];
    ACCEL_TRY(accel_get_rng_state(acc, gen));
    snprintf(name, sizeof name, "random_states_%d.json", acc->rank);
    ACCEL_TRY(
        write_json(dir, name,
                   json_pack("{s:i,s:i,s:I,s:b,s:o}", "process_index", acc->rank, "num_processes",
                             acc->n_ranks, "step", (json_int_t)acc->gstate.step, "sync_gradients",
                             acc->gstate.sync_gradients, "generator", gen_json(gen))));
    if (o->n_loaders > 0) {
        json_t *arr = json_array();
        for (int i = 0; arr && i < o->n_loaders; i++) {
            accel_loader_position pos;
            ACCEL_TRY(accel_loader_get_position(o->loaders[i], &pos));
            char seed[19];
            u64_hex(seed, pos.seed);
            json_array_append_new(arr,
                                  json_pack("{s:I,s:I,s:s,s:o,s:I}", "epoch", (json_int_t)pos.epoch,
                                            "batches", (json_int_t)pos.batches, "seed", seed,
                                            "generator", gen_json(pos.rng), "length",
                                            (json_int_t)accel_loader_len(o->loaders[i])));
        }
        snprintf(name, sizeof name, "dl_state_dict_rank%d.json", acc->rank);
        ACCEL_TRY(write_json(dir, name,
                             json_pack("{s:i,s:i,s:o}", "process_index", acc->rank, "num_processes",
                                       acc->n_ranks, "loaders", arr)));
    }
    if (info->has_grads) {
        ACCEL_TRY(write_grads(acc, o, dir));
    }
    return ACCEL_OK;
}
