/*
 * load_state's plan and apply. accel__state_plan_new opens every file this process needs
 * (only files the verified marker lists), hands each object a reader on its parts
 * (state_load validates and stages), and keeps what must happen: tensor copies, staged
 * actions, the registered objects' callbacks, the generator and counters of this process.
 * accel__state_plan_apply then does it.
 *
 * Invariant: nothing live is written before every file validated; after the registered
 * objects' load callbacks, applying cannot fail (copies of validated data into memory sized
 * at plan time, and staged actions that cannot fail) except where a device does: a copy into
 * GPU memory that the GPU fails leaves the load partial, and says so.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parallel.h"
#include "ckpt/atomic.h"
#include "ckpt/devio.h"
#include "ckpt/state.h"
#include "comm/reduce.h"
#include "core/gstate.h"
#include "core/settings.h"

/* Tensor bytes copied into live buffers, at most COPY_PIECE at once. */
#define COPY_PIECE ((size_t)16 << 20)

typedef struct copy_job {
    void *dst;
    const void *src;
    size_t nbytes;
    accel_device where; /* dst's device (staged copies) */
} copy_job;

typedef struct stage {
    accel__object *obj;
    void (*apply)(accel__object *obj, void *data);
    void *data; /* owned */
} stage;

typedef struct first_stage {
    accel__object *obj;
    accel_status (*apply)(accel__object *obj, const void *data, size_t n);
    const void *data; /* borrowed from a file of the plan */
    size_t n;
} first_stage;

typedef struct position_owner {
    const char *noun;
    int index;
    const char *file; /* its per-process file's stem, for messages */
} position_owner;

struct accel__state_plan {
    accel__ckpt_marker marker; /* the files that may be read, verified */
    accel__state_info info;
    int exact; /* saved with this number of processes */
    accel__state_file *files;
    size_t n_files, cap_files; /* sized at the start: readers point into it */
    copy_job *copies;
    size_t n_copies, cap_copies, copy_nbytes;
    copy_job *staged; /* into device memory, through pinned buffers (devio.h) */
    size_t n_staged, cap_staged;
    stage *stages;
    size_t n_stages, cap_stages;
    first_stage *firsts;
    size_t n_firsts, cap_firsts;
    int64_t *pos; /* step, sync, then per resume position: epoch, batch, length */
    position_owner *owners;
    size_t n_pos, cap_pos; /* resume positions */
    uint64_t gen[ACCEL_RNG_STATE_WORDS];
    int64_t step;
    int sync;
    int dropped[ACCEL__OBJ_KIND_COUNT]; /* per-process tensor parts not loaded */
    int fused;                          /* checksums checked while copying (verify.h) */
    unsigned char *copied;              /* per copy: made by accel__state_plan_apply_fused */
};

void accel__state_plan_free(accel__state_plan *p)
{
    if (p == NULL) {
        return;
    }
    for (size_t i = 0; i < p->n_files; i++) {
        accel__state_file_close(&p->files[i]);
    }
    for (size_t i = 0; i < p->n_stages; i++) {
        accel__free(p->stages[i].data);
    }
    accel__free(p->files);
    accel__free(p->copies);
    accel__free(p->copied);
    accel__free(p->staged);
    accel__free(p->stages);
    accel__free(p->firsts);
    accel__free(p->pos);
    accel__free(p->owners);
    accel__ckpt_marker_release(&p->marker);
    accel__free(p);
}

/* The array v of n elements of `size` bytes with room for one more (grown by doubling
 * *cap), or NULL with ACCEL_ENOMEM set (v unchanged). */
static void *grow(void *v, size_t *cap, size_t n, size_t size)
{
    if (n < *cap) {
        return v;
    }
    size_t c = *cap ? 2 * *cap : 16;
    void *nv = accel__realloc(v, c * size);
    if (nv == NULL) {
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        return NULL;
    }
    *cap = c;
    return nv;
}

/* ---- the reader's side: copies, stages, positions ---- */

accel_status accel__state_plan_copy(accel__state_plan *p, void *dst, accel_device where,
                                    const void *src, size_t nbytes)
{
    if (accel__devio_staged(where)) {
        /* Whole: the staging chunks it and overlaps the chunks' copies (devio.h). */
        copy_job *staged = grow(p->staged, &p->cap_staged, p->n_staged, sizeof(*staged));
        if (staged == NULL) {
            return ACCEL_ENOMEM;
        }
        p->staged = staged;
        p->staged[p->n_staged++] = (copy_job){dst, src, nbytes, where};
        return ACCEL_OK;
    }
    /* In pieces, so the copies spread over the process's CPUs. */
    for (size_t off = 0; off < nbytes; off += COPY_PIECE) {
        copy_job *copies = grow(p->copies, &p->cap_copies, p->n_copies, sizeof(*copies));
        if (copies == NULL) {
            return ACCEL_ENOMEM;
        }
        p->copies = copies;
        size_t n = nbytes - off < COPY_PIECE ? nbytes - off : COPY_PIECE;
        p->copies[p->n_copies++] = (copy_job){(char *)dst + off, (const char *)src + off, n, where};
        p->copy_nbytes += n;
    }
    return ACCEL_OK;
}

void *accel__state_plan_stage(accel__state_plan *p, accel__object *obj, size_t nbytes,
                              void (*apply)(accel__object *obj, void *data))
{
    void *data = accel__calloc(1, nbytes ? nbytes : 1);
    stage *stages = data ? grow(p->stages, &p->cap_stages, p->n_stages, sizeof(*stages)) : NULL;
    if (stages == NULL) {
        accel__free(data);
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        return NULL;
    }
    p->stages = stages;
    p->stages[p->n_stages++] = (stage){obj, apply, data};
    return data;
}

accel_status accel__state_plan_stage_first(accel__state_plan *p, accel__object *obj,
                                           accel_status (*apply)(accel__object *obj,
                                                                 const void *data, size_t n),
                                           const void *data, size_t n)
{
    first_stage *firsts = grow(p->firsts, &p->cap_firsts, p->n_firsts, sizeof(*firsts));
    if (firsts == NULL) {
        return ACCEL_ENOMEM;
    }
    p->firsts = firsts;
    p->firsts[p->n_firsts++] = (first_stage){obj, apply, data, n};
    return ACCEL_OK;
}

accel_status accel__state_plan_position(accel__state_plan *p, const accel__state_reader *r,
                                        const int64_t v[3])
{
    position_owner *owners = grow(p->owners, &p->cap_pos, p->n_pos, sizeof(*owners));
    if (owners == NULL) {
        return ACCEL_ENOMEM;
    }
    p->owners = owners;
    int64_t *pos = accel__realloc(p->pos, (2 + 3 * (p->n_pos + 1)) * sizeof(int64_t));
    if (pos == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    p->pos = pos;
    memcpy(pos + 2 + 3 * p->n_pos, v, 3 * sizeof(int64_t));
    p->owners[p->n_pos++] = (position_owner){r->noun, r->index, r->obj->cls->rank_name};
    return ACCEL_OK;
}

size_t accel__state_plan_n_positions(const accel__state_plan *p)
{
    return p->n_pos;
}

const int64_t *accel__state_plan_positions(const accel__state_plan *p)
{
    return p->pos;
}

void accel__state_plan_position_owner(const accel__state_plan *p, size_t i, const char **noun,
                                      int *index, const char **file)
{
    *noun = p->owners[i].noun;
    *index = p->owners[i].index;
    *file = p->owners[i].file ? p->owners[i].file : "";
}

/* ---- planning ---- */

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

/* Opens a listed file of the folder into the plan. */
static accel_status open_file(accel__state_plan *p, const char *dir, const char *name,
                              accel__state_store store, const char *meta_key,
                              accel__state_file **out)
{
    ACCEL_TRY(listed(p, dir, name));
    ACCEL_ASSERT(p->n_files < p->cap_files);
    accel__state_file *f = &p->files[p->n_files++];
    *out = f;
    return accel__state_file_open(f, dir, name, store, meta_key, &p->marker);
}

static accel__state_reader reader(accel__state_plan *p, const char *dir, accel__state_file *f,
                                  int kind, int index, accel__state_part part)
{
    accel__state_reader r;
    memset(&r, 0, sizeof(r));
    r.plan = p;
    r.dir = dir;
    r.f = f;
    r.noun = accel__state_kinds[kind].noun;
    r.index = index;
    r.part = part;
    r.saved_processes = p->info.num_processes;
    r.at[0] = f->root;
    r.depth = 1;
    return r;
}

/* Object i of kind k's shared part. */
static accel_status plan_shared(accel__state_plan *p, const char *dir, int k, int i,
                                accel__object *obj)
{
    const accel__object_class *c = obj->cls;
    char name[ACCEL__STATE_NAME_MAX], meta_key[ACCEL__STATE_NAME_MAX];
    accel__st_indexed_name(name, sizeof name, c->name, i, c->numbered_from_0,
                           accel__st_ext(c->store));
    snprintf(meta_key, sizeof meta_key, "accel_%s", c->name);
    accel__state_file *f;
    char stem[ACCEL__STATE_NAME_MAX], index[ACCEL__STATE_NAME_MAX];
    accel__state_stem(stem, sizeof stem, c, i);
    accel__state_index_name(index, sizeof index, stem);
    if (c->store == ACCEL__STORE_TENSORS && accel__ckpt_marker_find(&p->marker, name) == NULL &&
        accel__ckpt_marker_find(&p->marker, index) != NULL) {
        /* Saved sharded: from its index and shards, whatever the processes and stage now. */
        ACCEL_ASSERT(p->n_files < p->cap_files);
        f = &p->files[p->n_files++];
        ACCEL_TRY(accel__state_shard_open(f, dir, stem, meta_key, &p->marker));
    } else {
        ACCEL_TRY(open_file(p, dir, name, c->store, meta_key, &f));
    }
    accel__state_reader r = reader(p, dir, f, k, i, ACCEL__STATE_SHARED);
    if (c->store == ACCEL__STORE_TENSORS) {
        snprintf(r.path, sizeof r.path, "%s.", meta_key);
    }
    ACCEL_TRY(accel__state_reader_load(&r, obj));
    return accel__state_file_all_read(f, dir);
}

/* random_states_<src>.json: this process's generator and counters (ckpt's own file). */
static accel_status plan_random_states(accel__state_plan *p, const char *dir, int src)
{
    char name[64];
    snprintf(name, sizeof name, "random_states_%d.json", src);
    accel__state_file *f;
    ACCEL_TRY(open_file(p, dir, name, ACCEL__STORE_JSON, NULL, &f));
    accel__state_reader r = reader(p, dir, f, 0, 0, ACCEL__STATE_RANK);
    int64_t who, n;
    /* The file says whose it is: a file of another process or job is damage. */
    ACCEL_TRY(accel__state_get_i64(&r, "process_index", src, src, &who));
    ACCEL_TRY(accel__state_get_i64(&r, "num_processes", p->info.num_processes,
                                   p->info.num_processes, &n));
    ACCEL_TRY(accel__state_get_i64(&r, "step", 0, ACCEL__STATE_COUNT_MAX, &p->step));
    ACCEL_TRY(accel__state_get_bool(&r, "sync_gradients", &p->sync));
    p->pos[0] = p->step;
    p->pos[1] = p->sync;
    return accel__state_get_gen(&r, "generator", p->gen);
}

/* The per-process part of kind k's objects (of[0..n)) from process src's file. */
static accel_status plan_rank(accel *acc, accel__state_plan *p, const char *dir, int k,
                              accel__object *const *of, int n, int src)
{
    const accel__object_class *c = of[0]->cls;
    int json = c->rank_store == ACCEL__STORE_JSON;
    if (!json && !p->info.rank_tensors[k]) {
        return ACCEL_OK; /* saved outside an accumulation window: no gradients */
    }
    if (!json && !p->exact) {
        p->dropped[k] = 1; /* another process's tensors are of no use here */
        return ACCEL_OK;
    }
    char name[ACCEL__STATE_NAME_MAX];
    snprintf(name, sizeof name, "%s%d%s", c->rank_name, json ? src : acc->rank,
             accel__st_ext(c->rank_store));
    accel__state_file *f;
    ACCEL_TRY(open_file(p, dir, name, c->rank_store, NULL, &f));
    if (!json) {
        /* Gradients of an open window: a later load saved outside a window leaves the live
         * ones alone, so a refused fused load must not have written them. */
        accel__ckpt_keep_apart(&p->marker, name);
    }
    accel__state_reader r = reader(p, dir, f, k, 0, ACCEL__STATE_RANK);
    if (json) {
        int64_t who, procs;
        size_t len;
        ACCEL_TRY(accel__state_get_i64(&r, "process_index", src, src, &who));
        ACCEL_TRY(accel__state_get_i64(&r, "num_processes", p->info.num_processes,
                                       p->info.num_processes, &procs));
        ACCEL_TRY(accel__state_get_len(&r, c->rank_key, &len));
        if (len != (size_t)n) {
            return accel__seterr(NULL, ACCEL_ECORRUPT,
                                 "checkpoint %s: %s is malformed: %s has %zu elements for %d %s",
                                 dir, name, c->rank_key, len, n, accel__state_kinds[k].nouns);
        }
    }
    for (int i = 0; i < n; i++) {
        accel__state_reader ri = reader(p, dir, f, k, i, ACCEL__STATE_RANK);
        if (json) {
            ri.at[0] = json_array_get(json_object_get(f->root, c->rank_key), (size_t)i);
            snprintf(ri.path, sizeof ri.path, "%s[%d].", c->rank_key, i);
            if (!json_is_object(ri.at[0])) {
                return accel__seterr(NULL, ACCEL_ECORRUPT,
                                     "checkpoint %s: %s is malformed: %s[%d] is not an object", dir,
                                     name, c->rank_key, i);
            }
        } else {
            snprintf(ri.prefix, sizeof ri.prefix, "%d/", i);
        }
        ACCEL_TRY(accel__state_reader_load(&ri, of[i]));
    }
    return accel__state_file_all_read(f, dir);
}

/* The numbers of objects the marker records against the live ones. */
static accel_status check_counts(accel *acc, const accel__state_plan *p, const accel__state_objs *o,
                                 const char *dir)
{
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        int nf = p->info.n[k], nl = o->n[k];
        if (nf == nl) {
            continue;
        }
        if (k == ACCEL__OBJ_SCALER) {
            if (nl > 0) {
                continue; /* saved without fp16: the live scaler keeps its state */
            }
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "checkpoint %s: scaler.json holds an fp16 loss scaler but "
                                 "mixed_precision is %s now",
                                 dir, accel_precision_name(acc->settings->ckpt.mixed_precision));
        }
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "checkpoint %s holds %d %s; %d are prepared/registered now (prepare "
                             "the same objects as when saving)",
                             dir, nf, accel__state_kinds[k].nouns, nl);
    }
    return ACCEL_OK;
}

static accel_status plan_all(accel *acc, accel__state_plan *p, const accel__state_objs *o,
                             const char *dir)
{
    ACCEL_TRY(accel__state_info_read(dir, &p->info));
    ACCEL_TRY(check_counts(acc, p, o, dir));
    p->exact = p->info.num_processes == acc->n_ranks;
    p->cap_files = 2 + ACCEL__OBJ_KIND_COUNT;
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        p->cap_files += (size_t)o->n[k];
    }
    p->files = accel__calloc(p->cap_files, sizeof(*p->files));
    p->pos = accel__calloc(2, sizeof(int64_t));
    if (p->files == NULL || p->pos == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        for (int i = 0; i < o->n[k]; i++) {
            if (k == ACCEL__OBJ_SCALER && i >= p->info.n[k]) {
                continue; /* saved without fp16 (check_counts): nothing to read, nothing set */
            }
            if (o->of[k][i]->cls->store != ACCEL__STORE_NONE) {
                ACCEL_TRY(plan_shared(p, dir, k, i, o->of[k][i]));
            }
        }
    }
    /* A process the checkpoint has no files of takes process 0's. */
    int src = acc->rank < p->info.num_processes ? acc->rank : 0;
    ACCEL_TRY(plan_random_states(p, dir, src));
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        if (o->n[k] > 0 && o->of[k][0]->cls->rank_store != ACCEL__STORE_NONE) {
            ACCEL_TRY(plan_rank(acc, p, dir, k, o->of[k], o->n[k], src));
        }
    }
    /* The counters' home exists now, so restoring them cannot fail. */
    return accel__grad_state_open(acc);
}

/* The host copies as verify.h sees them (owned: accel__free). */
static accel__ckpt_copy *ckpt_copies(const accel__state_plan *p)
{
    accel__ckpt_copy *c = accel__calloc(p->n_copies + 1, sizeof(*c));
    for (size_t i = 0; c != NULL && i < p->n_copies; i++) {
        c[i] = (accel__ckpt_copy){p->copies[i].dst, p->copies[i].src, p->copies[i].nbytes};
    }
    if (c == NULL) {
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    return c;
}

/* The fused plan: the deferred files no copy reads from (of this process's share) are checked
 * now, before anything is written. */
static accel_status verify_rest(accel *acc, accel__state_plan *p, const char *dir)
{
    accel__ckpt_copy *c = ckpt_copies(p);
    if (c == NULL) {
        return ACCEL_ENOMEM;
    }
    accel_status st = accel__ckpt_verify_rest(dir, &p->marker, acc->local_rank, acc->local_n_ranks,
                                              c, p->n_copies);
    accel__free(c);
    return st;
}

accel_status accel__state_plan_new(accel *acc, const accel__state_objs *o, const char *dir,
                                   accel__ckpt_marker *verified, int fused, accel__state_plan **out)
{
    accel__state_plan *p = accel__calloc(1, sizeof(*p));
    if (p == NULL) {
        if (verified != NULL) {
            accel__ckpt_marker_release(verified);
        }
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    /* The processes of a machine split the checksums between them (agreed on before any
     * file is applied); a folder just verified by the caller keeps that verification. */
    accel_status st = ACCEL_OK;
    if (verified != NULL) {
        p->marker = *verified;
        memset(verified, 0, sizeof(*verified));
    } else if (fused) {
        p->fused = 1;
        st = accel__ckpt_verify_deferred(dir, acc->local_rank, acc->local_n_ranks, &p->marker);
    } else {
        st = accel__ckpt_verify(dir, acc->local_rank, acc->local_n_ranks, &p->marker);
    }
    if (st == ACCEL_OK) {
        st = plan_all(acc, p, o, dir);
    }
    if (st == ACCEL_ECORRUPT && p->fused) {
        /* Damage can fail a tensor file's parsing before its checksum is known: name it as the
         * two-pass load does (checksums of the share, from new mappings: a loader that failed
         * may have released the lent ones), else keep the parser's message. */
        char why[ACCEL__ERRMSG_NBYTES];
        snprintf(why, sizeof why, "%s", accel_last_error(NULL));
        accel_status vst = accel__ckpt_verify(dir, acc->local_rank, acc->local_n_ranks, NULL);
        st = vst != ACCEL_OK ? vst : accel__seterr(NULL, st, "%s", why);
    }
    if (st == ACCEL_OK && p->fused) {
        st = verify_rest(acc, p, dir);
    }
    if (st != ACCEL_OK) {
        accel__state_plan_free(p);
        return st;
    }
    *out = p;
    return ACCEL_OK;
}

/* ---- applying ---- */

static void run_copy(void *ctx, size_t i)
{
    const copy_job *c = &((const copy_job *)ctx)[i];
    /* Streaming stores, as the fused load's copies (hashcopy.h): a load with checksums and one
     * without differ only by the checksums, and the copy does not evict the caches. */
    accel__copy_nt(c->dst, c->src, c->nbytes);
}

accel_status accel__state_plan_apply_fused(accel__state_plan *p, const char *dir)
{
    if (!p->fused) {
        return ACCEL_OK;
    }
    accel__ckpt_copy *c = ckpt_copies(p);
    p->copied = accel__calloc(p->n_copies + 1, 1);
    if (c == NULL || p->copied == NULL) {
        accel__free(c);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    accel_status st = accel__ckpt_copy_verified(dir, &p->marker, c, p->n_copies, p->copied);
    accel__free(c);
    return st;
}

static accel_status fill_from(void *ctx, void *buf, size_t off, size_t n)
{
    memcpy(buf, (const char *)ctx + off, n);
    return ACCEL_OK;
}

/* The copies into device memory, one after the other through the same pinned buffers. */
static accel_status run_staged(accel *acc, const accel__state_plan *p)
{
    accel__devio *io = NULL;
    accel_status st = ACCEL_OK;
    for (size_t i = 0; st == ACCEL_OK && i < p->n_staged; i++) {
        const copy_job *c = &p->staged[i];
        st = accel__devio_from_host(&io, c->where, c->dst, c->nbytes, 1, fill_from, (void *)c->src);
    }
    accel__devio_free(io);
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st,
                             "accel_load_state: copying the checkpoint into device memory "
                             "failed; the live state is partly loaded: %s",
                             accel_last_error(NULL));
    }
    return ACCEL_OK;
}

accel_status accel__state_plan_apply(accel *acc, accel__state_plan *p)
{
    /* Registered objects' callbacks first: they are the only step that can still fail. */
    for (size_t i = 0; i < p->n_firsts; i++) {
        const first_stage *f = &p->firsts[i];
        ACCEL_TRY(f->apply(f->obj, f->data, f->n));
    }
    /* The tensors (planned and validated): on the process's CPUs together; into a device,
     * through staging, which fails only when the device does. */
    if (p->copied != NULL) {
        /* The fused pass made most copies: the rest (sources outside the checked mappings)
         * move to the front. */
        size_t n = 0, nbytes = 0;
        for (size_t i = 0; i < p->n_copies; i++) {
            if (!p->copied[i]) {
                nbytes += p->copies[i].nbytes;
                p->copies[n++] = p->copies[i];
            }
        }
        p->n_copies = n;
        p->copy_nbytes = nbytes;
    }
    accel__parallel_for(p->n_copies, p->copy_nbytes, run_copy, p->copies);
    ACCEL_TRY(run_staged(acc, p));
    for (size_t i = 0; i < p->n_stages; i++) {
        p->stages[i].apply(p->stages[i].obj, p->stages[i].data);
    }
    (void)accel_set_rng_state(acc, p->gen); /* validated: not all zero */
    accel__grad_state_restore(acc, p->step, p->sync);
    for (int k = 0; k < ACCEL__OBJ_KIND_COUNT; k++) {
        if (p->dropped[k]) {
            accel__log(&acc->log, ACCEL__LOG_WARN,
                       "accel_load_state: the checkpoint was saved with %s by %d processes; "
                       "they are not loaded on %d",
                       accel__state_kinds[k].rank_flag, p->info.num_processes, acc->n_ranks);
        }
    }
    if (!p->exact) {
        accel__log(&acc->log, ACCEL__LOG_WARN,
                   "accel_load_state: the checkpoint was saved by %d processes and is loaded by "
                   "%d: weights and optimizer state are exact, loader positions are rescaled and "
                   "generators come from process 0's file, so the run will not be bit-identical; "
                   "schedulers keep their saved count (with adjust_scheduler each optimizer step "
                   "ticks them once per process, as in Accelerate, so a schedule sized by the "
                   "number of processes resumes at another point of it)",
                   p->info.num_processes, acc->n_ranks);
    }
    return ACCEL_OK;
}
