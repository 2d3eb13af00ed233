/*
 * save_model / load_model for accel models: the fp32 master weights by parameter name, as
 * model.safetensors or hub-style shards + index (PyTorch/transformers can read them), and back
 * from a file, an index or a folder, with dtype conversion.
 *
 * Invariant of a load: every file is opened and validated and every name, shape and dtype
 * checked before the first weight is written, so a failed load leaves the model untouched.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "ckpt/atomic.h"
#include "ckpt/devio.h"
#include "ckpt/state.h"
#include "ckpt/stset.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "core/profile.h"

/* Bytes of tensor data gathered per round at most (one tensor larger than this is a round of
 * its own): what the writing process holds at once beyond the shard it owns. A variable so a
 * test can show the bound on a small model (state.h). */
uint64_t accel__ckpt_gather_round_nbytes = (uint64_t)64 << 20;

/* Every process's status, the worst wins (a collective). */
static accel_status all_ok(accel *acc, accel_status st)
{
    int32_t v = st, worst = st;
    if (accel_num_processes(acc) > 1) {
        accel_status cst = accel__allreduce(acc->comm, &v, &worst, 1, ACCEL_I32, ACCEL_MIN);
        if (cst != ACCEL_OK) {
            return accel__adopt_thread_error(acc, cst);
        }
    }
    if (st != ACCEL_OK) {
        return st;
    }
    return worst == ACCEL_OK ? ACCEL_OK
                             : accel__seterr(acc, (accel_status)worst,
                                             "accel_save_model: another process failed (%s)",
                                             accel_status_name((accel_status)worst));
}

/* The whole tensors of w, named, as the file holds them (data NULL for pieces). */
static accel_status whole_list(const accel__state_writer *w, accel_named_tensor **out)
{
    accel_named_tensor *ts = accel__calloc(w->n_ts + 1, sizeof(*ts));
    if (ts == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < w->n_ts; i++) {
        ts[i] = w->ts[i];
        if (w->counts[i] != accel_tensor_numel(&ts[i].tensor)) {
            ts[i].tensor.data = NULL;
        }
    }
    *out = ts;
    return ACCEL_OK;
}

/* Appends the bytes at *(char **)ctx. */
static accel_status append_to(void *ctx, const void *data, size_t n)
{
    char **at = ctx;
    memcpy(*at, data, n);
    *at += n;
    return ACCEL_OK;
}

/*
 * A model whose weights are pieces spread over the processes (ZeRO): gathered to the main
 * process a round of tensors at a time (at most accel__ckpt_gather_round_nbytes of whole tensors,
 * or one larger tensor) and written to their places in the output as they arrive, so no process
 * ever holds the model. Per round: the pieces' (offset, count) and then their bytes, padded
 * to the largest process's, in two equal-count gathers.
 */
static accel_status save_gathered(accel *acc, const accel__state_writer *w, const char *dir,
                                  uint64_t max)
{
    int n = accel_num_processes(acc), main = accel_is_main_process(acc);
    size_t nt = w->n_ts;
    /* Rounds, the same on every process (from the whole tensors' sizes). */
    size_t *round_end = accel__calloc(nt + 1, sizeof(size_t));
    int64_t *mine = accel__calloc(nt + 1, sizeof(int64_t)), *cmax = NULL;
    size_t n_rounds = 0;
    accel_status st = round_end && mine ? ACCEL_OK : accel__seterr(acc, ACCEL_ENOMEM, "oom");
    for (size_t i = 0; st == ACCEL_OK && i < nt;) {
        uint64_t bytes = 0;
        int64_t my = 0;
        size_t j = i;
        do {
            size_t esz = accel_dtype_nbytes(w->ts[j].tensor.dtype);
            bytes += accel_tensor_nbytes(&w->ts[j].tensor);
            my += w->counts[j] * (int64_t)esz;
            j++;
        } while (j < nt &&
                 bytes + accel_tensor_nbytes(&w->ts[j].tensor) <= accel__ckpt_gather_round_nbytes);
        mine[n_rounds] = my;
        round_end[n_rounds++] = j;
        i = j;
    }
    if (st == ACCEL_OK) {
        cmax = accel__calloc(n_rounds + 1, sizeof(int64_t));
        st = cmax ? ACCEL_OK : accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
    }
    if (st == ACCEL_OK && n_rounds > 0) {
        st = accel__allreduce(acc->comm, mine, cmax, n_rounds, ACCEL_I64, ACCEL_MAX);
        st = st == ACCEL_OK ? st : accel__adopt_thread_error(acc, st);
    }
    int64_t biggest = 0;
    for (size_t r = 0; st == ACCEL_OK && r < n_rounds; r++) {
        biggest = cmax[r] > biggest ? cmax[r] : biggest;
    }
    size_t max_k = 0;
    for (size_t r = 0, a = 0; r < n_rounds; a = round_end[r++]) {
        max_k = round_end[r] - a > max_k ? round_end[r] - a : max_k;
    }
    /* Buffers for the largest round, allocated once; the output opened (main). */
    int64_t *desc = accel__calloc(2 * max_k + 1, sizeof(int64_t)), *descs = NULL;
    char *send = accel__calloc((size_t)biggest + 1, 1), *recv = NULL; /* padding sent too */
    if (st == ACCEL_OK && (desc == NULL || send == NULL)) {
        st = accel__seterr(acc, ACCEL_ENOMEM, "accel_save_model: out of memory");
    }
    accel__stset *set = NULL;
    accel_named_tensor *ts = NULL;
    if (st == ACCEL_OK && main) {
        descs = accel__calloc(2 * max_k * (size_t)n + 1, sizeof(int64_t));
        recv = accel__malloc((size_t)biggest * (size_t)n + 1);
        st = descs && recv ? ACCEL_OK : accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
        if (st == ACCEL_OK) {
            st = whole_list(w, &ts);
        }
        const accel_kv meta[] = {{"format", "pt"}};
        if (st == ACCEL_OK) {
            st = accel__stset_open(&set, dir, "model", ts, nt, meta, 1, max);
        }
    }
    st = all_ok(acc, st);
    accel_status wst = ACCEL_OK; /* the main process's write failures: it still gathers */
    accel_status cst = ACCEL_OK; /* a device's copy failures: it still gathers */
    accel__devio *io = NULL;     /* pieces in device memory come through staging */
    for (size_t r = 0, a = 0; st == ACCEL_OK && r < n_rounds; a = round_end[r++]) {
        size_t k = round_end[r] - a;
        char *at = send;
        for (size_t i = a; i < round_end[r]; i++) {
            size_t nb = (size_t)w->counts[i] * accel_dtype_nbytes(w->ts[i].tensor.dtype);
            desc[2 * (i - a)] = w->offs[i];
            desc[2 * (i - a) + 1] = w->counts[i];
            if (cst == ACCEL_OK) {
                cst = accel__devio_to_host(&io, w->ts[i].tensor.device, w->ts[i].tensor.data, nb,
                                           append_to, &at);
            }
        }
        accel__coll g1 =
            ACCEL__COLL(ACCEL__COLL_GATHER, desc, descs, 2 * k, ACCEL_I64, ACCEL_SUM, 0);
        accel__coll g2 =
            ACCEL__COLL(ACCEL__COLL_GATHER, send, recv, (size_t)cmax[r], ACCEL_U8, ACCEL_SUM, 0);
        st = accel__comm_run(acc->comm, &g1);
        if (st == ACCEL_OK && cmax[r] > 0) {
            st = accel__comm_run(acc->comm, &g2);
        }
        st = st == ACCEL_OK ? st : accel__adopt_thread_error(acc, st);
        for (int q = 0; main && st == ACCEL_OK && wst == ACCEL_OK && q < n; q++) {
            const int64_t *d = descs + 2 * k * (size_t)q;
            const char *src = recv + (size_t)cmax[r] * (size_t)q;
            for (size_t i = 0; wst == ACCEL_OK && i < k; i++) {
                size_t esz = accel_dtype_nbytes(w->ts[a + i].tensor.dtype);
                size_t nb = (size_t)d[2 * i + 1] * esz;
                if (nb > 0) {
                    wst = accel__stset_write(set, a + i, (uint64_t)d[2 * i] * esz, src, nb);
                }
                src += nb;
            }
        }
    }
    accel__devio_free(io);
    if (st == ACCEL_OK) { /* a failed copy on any process fails the save everywhere */
        st = all_ok(acc, cst);
    }
    if (set != NULL) {
        st = st == ACCEL_OK && wst == ACCEL_OK ? accel__stset_commit(set)
                                               : (accel__stset_abort(set), st ? st : wst);
    }
    if (st != ACCEL_OK && main) {
        accel__adopt_thread_error(acc, st);
    }
    accel__free(ts);
    accel__free(desc);
    accel__free(descs);
    accel__free(send);
    accel__free(recv);
    accel__free(cmax);
    accel__free(mine);
    accel__free(round_end);
    return st;
}

static accel_status save_model(accel *acc, accel_model *model, const char *dir,
                               const char *max_shard_size)
{
    if (acc == NULL || model == NULL || dir == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_save_model: NULL %s",
                             !acc     ? "acc"
                             : !model ? "model"
                                      : "dir");
    }
    uint64_t max = 0;
    accel_status st = accel_parse_size(max_shard_size ? max_shard_size : "10GB", &max);
    if (st == ACCEL_OK && accel__is_file(dir)) {
        st =
            accel__seterr(NULL, ACCEL_EINVAL, "accel_save_model: %s is a file; pass a folder", dir);
    }
    const accel_param *first = st == ACCEL_OK ? accel_model_param(model, 0) : NULL; /* allocates */
    if (st == ACCEL_OK && first == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "accel_save_model: %s", accel_last_error(NULL));
    }
    /* The weights as the model's checkpoint protocol puts them: whole tensors, or under ZeRO
     * each process's pieces (views: nothing is copied). */
    accel__state_writer w;
    accel__state_writer_init(&w, "model.safetensors", ACCEL__STORE_TENSORS, ACCEL__STATE_SHARED);
    if (st == ACCEL_OK) {
        st = accel__state_writer_save(&w, (accel__object *)model);
    }
    int32_t pieces = w.n_true_pieces > 0, any = pieces;
    st = all_ok(acc, st != ACCEL_OK ? accel__adopt_thread_error(acc, st) : st);
    if (st == ACCEL_OK && accel_num_processes(acc) > 1) {
        st = accel__allreduce(acc->comm, &pieces, &any, 1, ACCEL_I32, ACCEL_MAX);
        st = st == ACCEL_OK ? st : accel__adopt_thread_error(acc, st);
    }
    if (st == ACCEL_OK && any) {
        st = save_gathered(acc, &w, dir, max);
        st = accel__ckpt_share_main_status(acc, st, "accel_save_model", dir);
    } else if (st == ACCEL_OK) {
        /* Every process holds every weight: the main process writes its own. */
        if (accel_is_main_process(acc)) {
            accel_kv meta[] = {{"format", "pt"}};
            st = accel_save_sharded(dir, "model", w.ts, w.n_ts, meta, 1, max);
            if (st != ACCEL_OK) {
                accel__adopt_thread_error(acc, st);
            }
        }
        st = accel__ckpt_share_main_status(acc, st, "accel_save_model", dir);
    }
    accel__state_writer_release(&w);
    return st;
}

/* ---- loading ---- */

typedef struct load_ctx {
    accel_safetensors **files;
    size_t n_files;
    const accel_safetensors **src_file; /* per parameter: where its tensor is, or NULL */
    long *src_index;
} load_ctx;

static void load_ctx_free(load_ctx *c)
{
    for (size_t i = 0; i < c->n_files; i++) {
        accel_safetensors_close(c->files[i]);
    }
    accel__free(c->files);
    accel__free(c->src_file);
    accel__free(c->src_index);
}

static accel_status add_file(load_ctx *c, const char *path)
{
    accel_safetensors **nf = accel__realloc(c->files, (c->n_files + 1) * sizeof *nf);
    if (nf == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    c->files = nf;
    ACCEL_TRY(accel_safetensors_open(&c->files[c->n_files], path));
    c->n_files++;
    return ACCEL_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Opens every shard an index names (each once), checking the weight map against them. */
static accel_status open_index(load_ctx *c, const char *index_path)
{
    char *text = NULL;
    ACCEL_TRY(accel__read_file(index_path, &text, NULL));
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    accel__free(text);
    if (root == NULL) { /* say where, as the safetensors reader does for its header */
        return accel__seterr(NULL, ACCEL_ECORRUPT,
                             "%s: not a safetensors index: not valid JSON (line %d column %d: %s)",
                             index_path, jerr.line, jerr.column, jerr.text);
    }
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return accel__seterr(NULL, ACCEL_ECORRUPT,
                             "%s: not a safetensors index (no "
                             "\"weight_map\" object)",
                             index_path);
    }
    /* Shard names are relative to the index's folder. */
    const char *slash = strrchr(index_path, '/');
    size_t dlen = slash ? (size_t)(slash - index_path) : 1;
    char *dir = accel__malloc(dlen + 1);
    accel_status st = dir ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    if (st == ACCEL_OK) {
        memcpy(dir, slash ? index_path : ".", dlen);
        dir[dlen] = '\0';
    }
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v)
    {
        if (st != ACCEL_OK) {
            break;
        }
        const char *file = json_string_value(v);
        if (file == NULL || file[0] == '\0' || file[0] == '/' || strstr(file, "..") != NULL) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "%s: weight_map entry '%s' is not a file "
                               "name in the index's folder",
                               index_path, name);
            break;
        }
        char *p = accel__path_join(dir, file);
        if (p == NULL) {
            st = ACCEL_ENOMEM;
            break;
        }
        size_t k;
        for (k = 0; k < c->n_files; k++) {
            if (strcmp(accel_safetensors_path(c->files[k]), p) == 0) {
                break;
            }
        }
        if (k == c->n_files) {
            st = add_file(c, p);
        }
        if (st == ACCEL_OK && accel_safetensors_find(c->files[k], name) < 0) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "%s: the index puts tensor '%s' in %s, "
                               "which does not hold it",
                               index_path, name, p);
        }
        accel__free(p);
    }
    accel__free(dir);
    json_decref(root);
    return st;
}

/* Matches file tensors to parameters; fills c->src_*; every error before any write. */
static accel_status plan_load(load_ctx *c, accel_model *model, const char *path, int strict)
{
    int n = accel_model_num_params(model);
    c->src_file = accel__calloc(n > 0 ? (size_t)n : 1, sizeof *c->src_file);
    c->src_index = accel__calloc(n > 0 ? (size_t)n : 1, sizeof *c->src_index);
    if (c->src_file == NULL || c->src_index == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    size_t unexpected = 0;
    const char *first_unexpected = NULL;
    for (size_t f = 0; f < c->n_files; f++) {
        const accel_safetensors *st = c->files[f];
        for (size_t i = 0; i < accel_safetensors_count(st); i++) {
            const char *name = accel_safetensors_name(st, i);
            int pi = accel_model_find(model, name);
            if (pi < 0) {
                unexpected++;
                first_unexpected = first_unexpected ? first_unexpected : name;
                continue;
            }
            if (c->src_file[pi] != NULL) {
                return accel__seterr(NULL, ACCEL_ECORRUPT,
                                     "%s: tensor '%s' appears in both %s "
                                     "and %s",
                                     path, name, accel_safetensors_path(c->src_file[pi]),
                                     accel_safetensors_path(st));
            }
            const accel_param *p = accel_model_param(model, pi);
            if (p == NULL) {
                return accel_last_status(NULL);
            }
            accel_tensor t;
            ACCEL_TRY(accel_safetensors_tensor(st, i, &t));
            int same = t.ndim == p->ndim;
            for (int d = 0; same && d < t.ndim; d++) {
                same = t.shape[d] == p->shape[d];
            }
            if (!same) {
                char a[160], b[160];
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "loading %s: tensor '%s' has shape %s "
                                     "in the file but %s in the model",
                                     path, name, accel__shape_str(a, sizeof a, t.ndim, t.shape),
                                     accel__shape_str(b, sizeof b, p->ndim, p->shape));
            }
            /* C64 and the packed sub-byte dtypes have no conversion to F32: refused before any
             * weight is written (a count of 0 only checks the pair). */
            if (accel_convert(NULL, ACCEL_F32, NULL, t.dtype, 0) != ACCEL_OK) {
                return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                                     "loading %s: tensor '%s' is %s, which does not convert to "
                                     "the model's F32",
                                     path, name, accel_dtype_name(t.dtype));
            }
            c->src_file[pi] = st;
            c->src_index[pi] = (long)i;
        }
    }
    size_t missing = 0;
    const char *first_missing = NULL;
    for (int i = 0; i < n; i++) {
        if (c->src_file[i] == NULL) {
            missing++;
            if (first_missing == NULL) {
                first_missing = accel_model_param(model, i)->name;
            }
        }
    }
    if (strict && (missing > 0 || unexpected > 0)) {
        char detail[600];
        snprintf(detail, sizeof detail, "%zu missing (first '%s'), %zu unexpected (first '%s')",
                 missing, first_missing ? first_missing : "-", unexpected,
                 first_unexpected ? first_unexpected : "-");
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "loading %s (strict): names differ from the "
                             "model's: %s",
                             path, detail);
    }
    if (missing > 0 || unexpected > 0) {
        accel__log(NULL, ACCEL__LOG_INFO,
                   "loading %s: %zu model parameters not in the file (first "
                   "'%s'), %zu file tensors not in the model (first '%s')",
                   path, missing, first_missing ? first_missing : "-", unexpected,
                   first_unexpected ? first_unexpected : "-");
    }
    return ACCEL_OK;
}

/* Bytes [off, off + n) of the F32 weights converted from tensor ctx. Validated by plan_load,
 * so conversion cannot fail on arguments; bits as accel_convert documents (widening exact,
 * narrowing RNE). */
static accel_status convert_fill(void *ctx, void *buf, size_t off, size_t n)
{
    const accel_tensor *t = ctx;
    size_t first = off / sizeof(float);
    return accel_convert(buf, ACCEL_F32,
                         (const char *)t->data + first * accel_dtype_nbytes(t->dtype), t->dtype,
                         n / sizeof(float));
}

static accel_status load_model(accel *acc, accel_model *model, const char *path, int strict)
{
    if (model == NULL || path == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_load_model: NULL %s",
                             model ? "path" : "model");
    }
    const accel_param *p0 = accel_model_num_params(model) > 0 ? accel_model_param(model, 0) : NULL;
    accel_status dst = p0 != NULL && p0->data_view.device.type != ACCEL_DEVICE_CPU
                           ? accel__devio_check(p0->data_view.device)
                           : ACCEL_OK;
    if (dst != ACCEL_OK) {
        return accel__seterr(acc, dst, "accel_load_model: %s", accel_last_error(NULL));
    }
    /* A prepared model whose fp32 master is a shard holds full weights only for gathered units,
     * which are dropped on release: weights written there would be lost without a word. */
    if (p0 != NULL && p0->data_view.device.type == ACCEL_DEVICE_CPU &&
        ((const accel__object *)model)->prepared && accel_model_master(model) == NULL) {
        return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                             "accel_load_model: %s: the model is prepared and each process holds "
                             "only its shard of the fp32 master (ZeRO stage 3, or stages 1-2 "
                             "under mixed precision): load the weights before accel_prepare, or "
                             "resume with accel_load_state",
                             path);
    }
    load_ctx c = {0};
    accel_status st = ACCEL_OK;
    if (accel__is_dir(path)) {
        char *single = accel__path_join(path, "model.safetensors");
        char *index = accel__path_join(path, "model.safetensors.index.json");
        if (single == NULL || index == NULL) {
            st = ACCEL_ENOMEM;
        } else if (access(single, F_OK) == 0) {
            st = add_file(&c, single); /* refuses what is not a regular file, saying what */
        } else if (access(index, F_OK) == 0) {
            st = open_index(&c, index);
        } else {
            st = accel__seterr(NULL, ACCEL_ENOTFOUND,
                               "accel_load_model: %s holds neither "
                               "model.safetensors nor "
                               "model.safetensors.index.json",
                               path);
        }
        accel__free(single);
        accel__free(index);
    } else if (ends_with(path, ".json")) {
        st = open_index(&c, path);
    } else {
        st = add_file(&c, path);
    }
    if (st == ACCEL_OK) {
        st = plan_load(&c, model, path, strict);
    }
    int n = accel_model_num_params(model);
    accel__devio *io = NULL; /* a model in device memory is filled through staging */
    for (int i = 0; st == ACCEL_OK && i < n; i++) {
        if (c.src_file[i] == NULL) {
            continue;
        }
        const accel_param *p = accel_model_param(model, i);
        accel_tensor t;
        st = accel_safetensors_tensor(c.src_file[i], (size_t)c.src_index[i], &t);
        if (st == ACCEL_OK) {
            st = accel__devio_from_host(&io, p->data_view.device, p->data_view.data,
                                        p->numel * sizeof(float), sizeof(float), convert_fill, &t);
        }
    }
    accel__devio_free(io);
    load_ctx_free(&c);
    if (st != ACCEL_OK && acc != NULL) {
        accel__adopt_thread_error(acc, st);
    }
    return st;
}

/* The public entry: the whole call as one "save_model" range in the profiler trace. */
accel_status accel_save_model(accel *acc, accel_model *model, const char *dir,
                              const char *max_shard_size)
{
    accel__prof_begin(acc, "save_model", ACCEL__PROF_CKPT);
    accel_status st = save_model(acc, model, dir, max_shard_size);
    accel__prof_end(acc);
    return st;
}

/* The public entry: the whole call as one "load_model" range in the profiler trace. */
accel_status accel_load_model(accel *acc, accel_model *model, const char *path, int strict)
{
    accel__prof_begin(acc, "load_model", ACCEL__PROF_CKPT);
    accel_status st = load_model(acc, model, path, strict);
    accel__prof_end(acc);
    return st;
}
