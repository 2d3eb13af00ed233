/*
 * load_state's validation and application. accel__state_plan_new opens every file this
 * process needs, checks it against the live objects (names, shapes, dtypes, counts, kinds)
 * and keeps what it parsed; accel__state_plan_apply then copies it into the objects.
 *
 * Invariant: nothing live is written before every file validated; after the registered
 * objects' load callbacks, applying cannot fail (plain copies of validated data).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parallel.h"
#include "ckpt/atomic.h"
#include "ckpt/state.h"
#include "train/train_internal.h"
#include "train/train_state.h"

/* Tensor bytes copied into live buffers, at most COPY_PIECE at once. */
#define COPY_PIECE ((size_t)16 << 20)
typedef struct copy_job {
    void *dst;
    const void *src;
    size_t nbytes;
} copy_job;

typedef struct opt_plan {
    accel_safetensors *file;
    long long n_steps;
    int step_was_skipped;
    double momentum, dampening, beta1, beta2, eps;
    int n_groups;
    double lr[ACCEL_OPTIM_MAX_GROUPS], wd[ACCEL_OPTIM_MAX_GROUPS];
    int *param_group; /* per live parameter */
} opt_plan;

struct accel__state_plan {
    accel__state_objs o; /* borrowed arrays */
    accel__ckpt_marker marker; /* the files that may be read, verified */
    accel__state_info info;
    int exact;                  /* saved with this number of processes */
    accel_safetensors **models; /* n_models */
    opt_plan *opts;             /* n_opts */
    accel__sched_state *scheds; /* n_scheds */
    int has_scaler;
    double scale;
    long long growth_tracker;
    char **custom; /* n_custom byte buffers */
    size_t *custom_n;
    uint64_t gen[ACCEL_RNG_STATE_WORDS];
    long long step;
    int sync_gradients;
    accel_loader_position *pos; /* n_loaders */
    accel_safetensors *grads;
    copy_job *copies; /* every tensor copy of the apply */
    size_t n_copies, cap_copies, copy_nbytes;
};

void accel__state_plan_free(accel__state_plan *p)
{
    if (p == NULL) {
        return;
    }
    for (int i = 0; p->models && i < p->o.n_models; i++) {
        accel_safetensors_close(p->models[i]);
    }
    for (int i = 0; p->opts && i < p->o.n_opts; i++) {
        accel_safetensors_close(p->opts[i].file);
        accel__free(p->opts[i].param_group);
    }
    for (int i = 0; p->custom && i < p->o.n_custom; i++) {
        accel__free(p->custom[i]);
    }
    accel_safetensors_close(p->grads);
    accel__free(p->models);
    accel__free(p->opts);
    accel__free(p->scheds);
    accel__free(p->custom);
    accel__free(p->custom_n);
    accel__free(p->pos);
    accel__ckpt_marker_release(&p->marker);
    accel__free(p->copies);
    accel__free(p);
}

/* Only files the marker lists (and so verified) are read: a file added to the folder later, or
 * removed from the list, is damage. */
static accel_status listed(const accel__state_plan *p, const char *dir, const char *name)
{
    if (accel__ckpt_marker_find(&p->marker, name) == NULL) {
        return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is not listed in %s",
                             dir, name, ACCEL__CKPT_MARKER);
    }
    return ACCEL_OK;
}

/* A JSON file of the folder that the marker lists. */
static accel_status read_json(const accel__state_plan *p, const char *dir, const char *name,
                              json_t **out)
{
    ACCEL_TRY(listed(p, dir, name));
    return accel__st_read_json(dir, name, out);
}

/* Learning rates, decays, factors: finite and non-negative. */
static int bad_real(double v)
{
    return !isfinite(v) || v < 0;
}

static accel_status open_st(const accel__state_plan *p, const char *dir, const char *name,
                            accel_safetensors **out)
{
    ACCEL_TRY(listed(p, dir, name));
    char *path = accel__path_join(dir, name);
    if (path == NULL) {
        return ACCEL_ENOMEM;
    }
    accel_status st = accel_safetensors_open(out, path);
    if (st == ACCEL_ENOTFOUND) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is missing", dir, name);
    }
    accel__free(path);
    return st;
}

/* The fp32 tensor `name` of st with exactly p's shape; its data in *data. */
static accel_status check_tensor(const accel_safetensors *st, const char *file, const char *name,
                                 const accel_param *p, const float **data)
{
    accel_tensor t;
    if (accel_safetensors_get(st, name, &t) != ACCEL_OK) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s has no tensor %s (the live model has it)",
                             file, name);
    }
    int same = t.ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) {
        same = t.shape[d] == p->shape[d];
    }
    if (!same || t.dtype != ACCEL_F32) {
        char a[160], b[160];
        return accel__seterr(
            NULL, ACCEL_EINVAL, "%s: tensor %s is %s %s in the checkpoint vs F32 %s in the model",
            file, name, accel_dtype_name(t.dtype), accel__shape_str(a, sizeof a, t.ndim, t.shape),
            accel__shape_str(b, sizeof b, p->ndim, p->shape));
    }
    *data = t.data;
    return ACCEL_OK;
}

static accel_status plan_model(accel__state_plan *p, const char *dir, int i)
{
    char name[64];
    accel__st_indexed_name(name, sizeof name, "model", i, ".safetensors");
    ACCEL_TRY(open_st(p, dir, name, &p->models[i]));
    const accel_model *m = p->o.models[i];
    if (accel_safetensors_count(p->models[i]) != (size_t)m->n_params) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s/%s holds %zu tensors; model %d has %d", dir,
                             name, accel_safetensors_count(p->models[i]), i, m->n_params);
    }
    for (int k = 0; k < m->n_params; k++) {
        const float *data;
        ACCEL_TRY(check_tensor(p->models[i], name, m->params[k].name, &m->params[k], &data));
    }
    return ACCEL_OK;
}

static int kind_of(const char *s)
{
    for (int k = ACCEL__SGD; s != NULL && k <= ACCEL__ADAMW; k++) {
        if (strcmp(s, accel__st_optim_kind_name(k)) == 0) {
            return k;
        }
    }
    return -1;
}

/* Parses the optimizer's "accel_optimizer" metadata into op. */
static accel_status plan_optim_meta(opt_plan *op, const accel_optimizer *opt, const char *name)
{
    const char *text = accel_safetensors_metadata(op->file, "accel_optimizer");
    json_error_t jerr;
    json_t *j = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    int bad = !json_is_object(j);
    accel_status st = ACCEL_OK;
    if (!bad) {
        const char *saved = json_string_value(json_object_get(j, "kind"));
        if (kind_of(saved) != (int)opt->kind) {
            st =
                accel__seterr(NULL, ACCEL_EINVAL,
                              "%s: optimizer kind %s in the checkpoint vs %s in the live optimizer",
                              name, saved ? saved : "(none)", accel__st_optim_kind_name(opt->kind));
        }
        op->n_steps = accel__st_jint(j, "step", &bad);
        op->step_was_skipped = json_is_true(json_object_get(j, "step_was_skipped"));
        op->momentum = accel__st_jreal(j, "momentum", &bad);
        op->dampening = accel__st_jreal(j, "dampening", &bad);
        op->beta1 = accel__st_jreal(j, "beta1", &bad);
        op->beta2 = accel__st_jreal(j, "beta2", &bad);
        op->eps = accel__st_jreal(j, "eps", &bad);
        const json_t *groups = json_object_get(j, "param_groups");
        const json_t *pg = json_object_get(j, "param_group_of");
        bad |= !json_is_array(groups) || !json_is_object(pg) || op->n_steps < 0 ||
               bad_real(op->momentum) || bad_real(op->dampening) || bad_real(op->eps) ||
               bad_real(op->beta1) || op->beta1 >= 1 || bad_real(op->beta2) || op->beta2 >= 1;
        if (!bad && st == ACCEL_OK && (int)json_array_size(groups) != opt->n_groups) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "%s has %zu param groups; the live optimizer has %d", name,
                               json_array_size(groups), opt->n_groups);
        }
        for (int g = 0; !bad && st == ACCEL_OK && g < opt->n_groups; g++) {
            const json_t *gj = json_array_get(groups, (size_t)g);
            op->lr[g] = accel__st_jreal(gj, "lr", &bad);
            op->wd[g] = accel__st_jreal(gj, "weight_decay", &bad);
            bad |= bad_real(op->lr[g]) || bad_real(op->wd[g]);
        }
        op->n_groups = opt->n_groups;
        const accel_model *m = opt->model;
        for (int k = 0; !bad && st == ACCEL_OK && k < m->n_params; k++) {
            const json_t *v = json_object_get(pg, m->params[k].name);
            long long g = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
            bad |= g < 0 || g >= opt->n_groups;
            op->param_group[k] = (int)g;
        }
    }
    json_decref(j);
    if (st == ACCEL_OK && bad) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT,
                           "%s: the \"accel_optimizer\" metadata is missing or malformed", name);
    }
    return st;
}

static accel_status plan_optim(accel__state_plan *p, const char *dir, int i)
{
    char name[64];
    accel__st_indexed_name(name, sizeof name, "optimizer", i, ".safetensors");
    opt_plan *op = &p->opts[i];
    const accel_optimizer *opt = p->o.opts[i];
    const accel_model *m = opt->model;
    op->param_group = accel__calloc((size_t)m->n_params + 1, sizeof(int));
    if (op->param_group == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    ACCEL_TRY(open_st(p, dir, name, &op->file));
    ACCEL_TRY(plan_optim_meta(op, opt, name));
    const char *bnames[3] = {0};
    float *bufs[3] = {0};
    int nb = accel__st_optim_buffers(opt, bnames, bufs);
    size_t expect = 0;
    for (int b = 0; b < nb; b++) {
        if (bufs[b] == NULL) {
            continue;
        }
        expect += (size_t)m->n_params;
        for (int k = 0; k < m->n_params; k++) {
            char tname[ACCEL_PARAM_NAME_MAX + 32];
            snprintf(tname, sizeof tname, "%s%s", bnames[b], m->params[k].name);
            const float *data;
            ACCEL_TRY(check_tensor(op->file, name, tname, &m->params[k], &data));
        }
    }
    if (accel_safetensors_count(op->file) != expect) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "%s holds %zu tensors; the live optimizer has %zu state tensors "
                             "(amsgrad or momentum differs?)",
                             name, accel_safetensors_count(op->file), expect);
    }
    return ACCEL_OK;
}

static accel_status plan_sched(accel__state_plan *p, const char *dir, int i)
{
    char name[64];
    accel__st_indexed_name(name, sizeof name, "scheduler", i, ".json");
    json_t *j = NULL;
    ACCEL_TRY(read_json(p, dir, name, &j));
    accel__sched_state live, *s = &p->scheds[i];
    accel__scheduler_get_state(p->o.scheds[i], &live);
    int bad = 0;
    s->kind = (int)accel__st_jint(j, "kind", &bad);
    s->last_epoch = accel__st_jint(j, "last_epoch", &bad);
    s->step_count = accel__st_jint(j, "_step_count", &bad);
    const json_t *base = json_object_get(j, "base_lrs"), *last = json_object_get(j, "_last_lr");
    bad |= !json_is_array(base) || !json_is_array(last) ||
           json_array_size(base) != json_array_size(last) || s->last_epoch < 0 || s->step_count < 0;
    accel_status st = ACCEL_OK;
    if (!bad && (s->kind != live.kind || (int)json_array_size(base) != live.n_groups)) {
        st = accel__seterr(NULL, ACCEL_EINVAL,
                           "%s: scheduler kind %d with %zu groups; the live scheduler %d is kind "
                           "%d with %d groups",
                           name, s->kind, json_array_size(base), i, live.kind, live.n_groups);
    }
    s->n_groups = live.n_groups;
    for (int g = 0; !bad && st == ACCEL_OK && g < live.n_groups; g++) {
        const json_t *b = json_array_get(base, (size_t)g), *l = json_array_get(last, (size_t)g);
        s->base_lr[g] = json_number_value(b);
        s->last_lr[g] = json_number_value(l);
        bad |= !json_is_number(b) || !json_is_number(l) || bad_real(s->base_lr[g]) ||
               bad_real(s->last_lr[g]);
    }
    json_decref(j);
    if (st == ACCEL_OK && bad) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: %s is malformed", dir, name);
    }
    return st;
}

static accel_status plan_scaler(accel *acc, accel__state_plan *p, const char *dir)
{
    if (acc->opt.mixed_precision != ACCEL_PRECISION_FP16) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "checkpoint %s: scaler.json holds an fp16 loss scaler but "
                             "mixed_precision is %s now",
                             dir, accel_precision_name(acc->opt.mixed_precision));
    }
    json_t *j = NULL;
    ACCEL_TRY(read_json(p, dir, "scaler.json", &j));
    int bad = 0;
    p->scale = accel__st_jreal(j, "scale", &bad);
    p->growth_tracker = accel__st_jint(j, "_growth_tracker", &bad);
    json_decref(j);
    if (bad || !(p->scale > 0) || !isfinite(p->scale) || p->growth_tracker < 0) {
        return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: scaler.json is malformed", dir);
    }
    p->has_scaler = 1;
    return ACCEL_OK;
}

static accel_status plan_custom(accel__state_plan *p, const char *dir, int i)
{
    char name[64];
    snprintf(name, sizeof name, "custom_checkpoint_%d.bin", i);
    ACCEL_TRY(listed(p, dir, name));
    char *path = accel__path_join(dir, name);
    if (path == NULL) {
        return ACCEL_ENOMEM;
    }
    accel_status st = accel__read_file(path, &p->custom[i], &p->custom_n[i]);
    accel__free(path);
    if (st == ACCEL_ENOTFOUND) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is missing", dir, name);
    }
    return st;
}

/* random_states_<src>.json and dl_state_dict_rank<src>.json of process `src`. */
static accel_status plan_rank(accel *acc, accel__state_plan *p, const char *dir, int src)
{
    char name[64];
    snprintf(name, sizeof name, "random_states_%d.json", src);
    json_t *j = NULL;
    ACCEL_TRY(read_json(p, dir, name, &j));
    int bad = 0;
    p->step = accel__st_jint(j, "step", &bad);
    const json_t *sg = json_object_get(j, "sync_gradients");
    /* The file says whose it is: a file of another process or job is damage. */
    bad |= !json_is_boolean(sg) || !accel__st_parse_gen(json_object_get(j, "generator"), p->gen) ||
           p->step < 0 || accel__st_jint(j, "process_index", &bad) != src ||
           accel__st_jint(j, "num_processes", &bad) != p->info.num_processes;
    p->sync_gradients = json_is_true(sg);
    json_decref(j);
    if (bad) {
        return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: %s is malformed", dir, name);
    }
    if (p->o.n_loaders == 0) {
        return ACCEL_OK;
    }
    snprintf(name, sizeof name, "dl_state_dict_rank%d.json", src);
    ACCEL_TRY(read_json(p, dir, name, &j));
    const json_t *arr = json_object_get(j, "loaders");
    bad = !json_is_array(arr) || (int)json_array_size(arr) != p->o.n_loaders ||
          accel__st_jint(j, "process_index", &bad) != src ||
          accel__st_jint(j, "num_processes", &bad) != p->info.num_processes;
    int n_old = p->info.num_processes, n_new = acc->n_ranks;
    accel_status st = ACCEL_OK;
    for (int i = 0; !bad && st == ACCEL_OK && i < p->o.n_loaders; i++) {
        const json_t *l = json_array_get(arr, (size_t)i);
        accel_loader_position *pos = &p->pos[i];
        pos->epoch = accel__st_jint(l, "epoch", &bad);
        pos->batches = accel__st_jint(l, "batches", &bad);
        long long len = accel__st_jint(l, "length", &bad); /* -1: unknown (a stream) */
        bad |= !accel__st_parse_u64(json_object_get(l, "seed"), &pos->seed) ||
               !accel__st_parse_gen(json_object_get(l, "generator"), pos->rng) || pos->epoch < 0 ||
               pos->batches < 0 || len < -1;
        if (!bad && len >= 0 && pos->batches > len) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "checkpoint %s: %s: loader %d is at batch %lld of an epoch of "
                               "%lld batches",
                               dir, name, i, (long long)pos->batches, len);
        }
        if (!bad && n_old != n_new) {
            /* Same number of samples seen overall, in whole batches of the new layout. */
            pos->batches = pos->batches * n_old / n_new;
        }
        int64_t live = accel_loader_len(p->o.loaders[i]);
        if (!bad && st == ACCEL_OK && live >= 0 && pos->batches > live) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "checkpoint %s: loader %d resumes at batch %lld, past the end of "
                               "the live loader's epoch (%lld batches): is it built as when "
                               "saving (dataset, batch size, processes)?",
                               dir, i, (long long)pos->batches, (long long)live);
        }
    }
    json_decref(j);
    if (st == ACCEL_OK && bad) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: %s is malformed", dir, name);
    }
    return st;
}

int accel__state_plan_positions(const accel__state_plan *p, int64_t *v)
{
    int n = 0;
    v[n++] = p->step;
    v[n++] = p->sync_gradients;
    for (int i = 0; i < p->o.n_loaders; i++) {
        v[n++] = p->pos[i].epoch;
        v[n++] = p->pos[i].batches;
        v[n++] = accel_loader_len(p->o.loaders[i]);
    }
    return n;
}

static accel_status plan_grads(accel *acc, accel__state_plan *p, const char *dir)
{
    char name[64];
    snprintf(name, sizeof name, "gradients_rank%d.safetensors", acc->rank);
    ACCEL_TRY(open_st(p, dir, name, &p->grads));
    for (int i = 0; i < p->o.n_models; i++) {
        const accel_model *m = p->o.models[i];
        for (int k = 0; k < m->n_params; k++) {
            char tname[ACCEL_PARAM_NAME_MAX + 32];
            snprintf(tname, sizeof tname, "%d/%s", i, m->params[k].name);
            const float *data;
            ACCEL_TRY(check_tensor(p->grads, name, tname, &m->params[k], &data));
        }
    }
    return ACCEL_OK;
}

/* Plans the copy of tensor `prefix + name` of st into base for every parameter of m
 * (validated), in pieces of at most COPY_PIECE bytes so the copies spread over threads. */
static accel_status plan_copies(accel__state_plan *p, const accel_safetensors *st,
                                const char *prefix, const accel_model *m, float *base)
{
    for (int k = 0; k < m->n_params; k++) {
        const accel_param *prm = &m->params[k];
        char tname[ACCEL_PARAM_NAME_MAX + 32];
        snprintf(tname, sizeof tname, "%s%s", prefix, prm->name);
        accel_tensor t;
        if (accel_safetensors_get(st, tname, &t) != ACCEL_OK) {
            continue;
        }
        size_t nbytes = prm->numel * sizeof(float);
        for (size_t off = 0; off < nbytes; off += COPY_PIECE) {
            if (p->n_copies == p->cap_copies) {
                size_t cap = p->cap_copies ? 2 * p->cap_copies : 64;
                copy_job *v = accel__realloc(p->copies, cap * sizeof(*v));
                if (v == NULL) {
                    return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
                }
                p->copies = v;
                p->cap_copies = cap;
            }
            size_t n = nbytes - off < COPY_PIECE ? nbytes - off : COPY_PIECE;
            p->copies[p->n_copies++] =
                (copy_job){(char *)(base + prm->offset) + off, (const char *)t.data + off, n};
            p->copy_nbytes += n;
        }
    }
    return ACCEL_OK;
}

/* Every tensor copy of the load: models, optimizer state, open-window gradients. */
static accel_status plan_all_copies(accel__state_plan *p)
{
    for (int i = 0; i < p->o.n_models; i++) {
        ACCEL_TRY(plan_copies(p, p->models[i], "", p->o.models[i], p->o.models[i]->master));
    }
    for (int i = 0; i < p->o.n_opts; i++) {
        const accel_optimizer *opt = p->o.opts[i];
        const char *names[3] = {0};
        float *bufs[3] = {0};
        int nb = accel__st_optim_buffers(opt, names, bufs);
        for (int b = 0; b < nb; b++) {
            if (bufs[b] != NULL) {
                ACCEL_TRY(plan_copies(p, p->opts[i].file, names[b], opt->model, bufs[b]));
            }
        }
    }
    for (int i = 0; p->grads != NULL && i < p->o.n_models; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "%d/", i);
        ACCEL_TRY(plan_copies(p, p->grads, prefix, p->o.models[i], p->o.models[i]->grad));
    }
    return ACCEL_OK;
}

static void run_copy(void *ctx, size_t i)
{
    const copy_job *c = &((const copy_job *)ctx)[i];
    memcpy(c->dst, c->src, c->nbytes);
}

static accel_status check_counts(const accel__state_plan *p, const char *dir)
{
    const accel__state_info *f = &p->info;
    const accel__state_objs *o = &p->o;
    const char *what = f->n_models != o->n_models     ? "models"
                       : f->n_opts != o->n_opts       ? "optimizers"
                       : f->n_scheds != o->n_scheds   ? "schedulers"
                       : f->n_loaders != o->n_loaders ? "loaders"
                       : f->n_custom != o->n_custom   ? "registered objects"
                                                      : NULL;
    if (what == NULL) {
        return ACCEL_OK;
    }
    int nf = what[0] == 'm'   ? f->n_models
             : what[0] == 'o' ? f->n_opts
             : what[0] == 's' ? f->n_scheds
             : what[0] == 'l' ? f->n_loaders
                              : f->n_custom;
    int nl = what[0] == 'm'   ? o->n_models
             : what[0] == 'o' ? o->n_opts
             : what[0] == 's' ? o->n_scheds
             : what[0] == 'l' ? o->n_loaders
                              : o->n_custom;
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "checkpoint %s holds %d %s; %d are prepared/registered now (prepare the "
                         "same objects as when saving)",
                         dir, nf, what, nl);
}

accel_status accel__state_plan_new(accel *acc, const accel__state_objs *o, const char *dir,
                                   int verified, accel__state_plan **out)
{
    accel__state_plan *p = accel__calloc(1, sizeof(*p));
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    p->o = *o;
    /* The processes of a machine split the checksums between them (agreed on before any
     * file is applied); a folder just verified by the caller is checked for sizes only. */
    accel_status st =
        verified ? accel__ckpt_verify(dir, 0, 0, &p->marker)
                 : accel__ckpt_verify(dir, acc->local_rank, acc->local_n_ranks, &p->marker);
    if (st == ACCEL_OK) {
        st = accel__state_info_read(dir, &p->info);
    }
    if (st == ACCEL_OK) {
        st = check_counts(p, dir);
    }
    if (st == ACCEL_OK) {
        size_t one = 1;
        p->models = accel__calloc((size_t)o->n_models + one, sizeof(*p->models));
        p->opts = accel__calloc((size_t)o->n_opts + one, sizeof(*p->opts));
        p->scheds = accel__calloc((size_t)o->n_scheds + one, sizeof(*p->scheds));
        p->custom = accel__calloc((size_t)o->n_custom + one, sizeof(*p->custom));
        p->custom_n = accel__calloc((size_t)o->n_custom + one, sizeof(*p->custom_n));
        p->pos = accel__calloc((size_t)o->n_loaders + one, sizeof(*p->pos));
        if (!p->models || !p->opts || !p->scheds || !p->custom || !p->custom_n || !p->pos) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
    }
    for (int i = 0; st == ACCEL_OK && i < o->n_models; i++) {
        st = plan_model(p, dir, i);
    }
    for (int i = 0; st == ACCEL_OK && i < o->n_opts; i++) {
        st = plan_optim(p, dir, i);
    }
    for (int i = 0; st == ACCEL_OK && i < o->n_scheds; i++) {
        st = plan_sched(p, dir, i);
    }
    if (st == ACCEL_OK && p->info.has_scaler) {
        st = plan_scaler(acc, p, dir);
    }
    for (int i = 0; st == ACCEL_OK && i < o->n_custom; i++) {
        st = plan_custom(p, dir, i);
    }
    p->exact = p->info.num_processes == acc->n_ranks;
    if (st == ACCEL_OK) {
        st = plan_rank(acc, p, dir, acc->rank < p->info.num_processes ? acc->rank : 0);
    }
    if (st == ACCEL_OK && p->info.has_grads && p->exact) {
        st = plan_grads(acc, p, dir);
    }
    if (st == ACCEL_OK) {
        st = plan_all_copies(p); /* allocates now: applying cannot fail */
    }
    if (st != ACCEL_OK) {
        accel__state_plan_free(p);
        return st;
    }
    *out = p;
    return ACCEL_OK;
}

accel_status accel__state_plan_apply(accel *acc, accel__state_plan *p)
{
    /* User callbacks first: they are the only step that can still fail. */
    for (int i = 0; i < p->o.n_custom; i++) {
        const accel__custom_obj *c = &p->o.custom[i];
        accel__clear_error();
        accel_status st = c->load(c->ctx, p->custom[i], p->custom_n[i]);
        if (st != ACCEL_OK) {
            return accel__seterr(acc, st,
                                 "accel_load_state: registered object %d rejected "
                                 "custom_checkpoint_%d.bin: %s",
                                 i, i, accel__cause(st));
        }
    }
    /* The tensors (planned and validated): on the process's CPUs together. */
    accel__parallel_for(p->n_copies, p->copy_nbytes, run_copy, p->copies);
    for (int i = 0; i < p->o.n_models; i++) {
        accel__model_refresh_compute(p->o.models[i]);
    }
    for (int i = 0; i < p->o.n_opts; i++) {
        accel_optimizer *opt = p->o.opts[i];
        opt_plan *op = &p->opts[i];
        opt->n_steps = op->n_steps;
        opt->step_was_skipped = op->step_was_skipped;
        opt->momentum = op->momentum;
        opt->dampening = op->dampening;
        opt->beta1 = op->beta1;
        opt->beta2 = op->beta2;
        opt->eps = op->eps;
        for (int g = 0; g < op->n_groups; g++) {
            opt->groups[g].lr = op->lr[g];
            opt->groups[g].weight_decay = op->wd[g];
        }
        memcpy(opt->param_group, op->param_group, (size_t)opt->model->n_params * sizeof(int));
        opt->segments_dirty = 1;
    }
    for (int i = 0; i < p->o.n_scheds; i++) {
        accel__scheduler_set_state(p->o.scheds[i], &p->scheds[i]);
    }
    if (p->has_scaler) {
        (void)accel__scaler_set(acc, p->scale, p->growth_tracker); /* checked in plan_scaler */
    }
    if (p->grads == NULL && p->info.has_grads) {
        accel__log(&acc->log, ACCEL__LOG_WARN,
                   "accel_load_state: the checkpoint was saved inside an accumulation window by "
                   "%d processes; its gradients are not loaded on %d",
                   p->info.num_processes, acc->n_ranks);
    }
    for (int i = 0; i < p->o.n_loaders; i++) {
        /* Validated above (non-negative, generator not all zero): cannot fail. */
        (void)accel_loader_set_position(p->o.loaders[i], &p->pos[i]);
    }
    (void)accel_set_rng_state(acc, p->gen);
    acc->gstate.step = p->step;
    acc->gstate.sync_gradients = p->sync_gradients;
    if (!p->exact) {
        accel__log(&acc->log, ACCEL__LOG_WARN,
                   "accel_load_state: the checkpoint was saved by %d processes and is loaded by "
                   "%d: weights and optimizer state are exact, loader positions are rescaled and "
                   "generators come from process 0's file, so the run will not be bit-identical",
                   p->info.num_processes, acc->n_ranks);
    }
    return ACCEL_OK;
}
