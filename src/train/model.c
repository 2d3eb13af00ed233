/*
 * Models as flat buffers: parameter registration, the flat geometry and the device buffers it
 * lays out (master, gradients, compute copy), per-parameter views, freezing, and preparation
 * (process 0's weights broadcast, the reducer's buckets completed). Invariant: once allocated,
 * every buffer follows the geometry fixed at alloc (flat.h), so a bucket (consecutive
 * parameters in backward order) is one contiguous slice and a parameter's grad is a view into
 * its bucket; padding elements are zero.
 * Buffers live on the model's device: the accelerator's (a GPU when it has one) unless
 * accel_model_set_device chose another before alloc. With several processes on the shm backend
 * and host buffers the gradient buffer is symmetric shared memory (accel__comm_alloc), so the
 * in-place bucket all-reduces read peers' gradients directly; that makes the allocation
 * collective (every process allocates its model, as every process prepares it). GPU buffers
 * reach the host communicators through host copies (here for the weights' broadcast, in
 * reducer.c for gradient buckets).
 */
#include <string.h>

#include "comm/comm.h"
#include "train_internal.h"

/* The gradient buffer: symmetric shared memory where the backend reads it in place (the
 * zero-copy bucket all-reduces), else plain aligned memory. A failure every process sees alike
 * (no room in /dev/shm) falls back to plain memory on every process. */
static float *grad_alloc(accel_model *m, size_t nbytes)
{
    accel *acc = m->acc;
    m->grad_shared = 0;
    m->grad_pages = m->zero_stage >= 2 && accel__model_on_host(m);
    if (m->grad_pages) {
        /* ZeRO-2/3: pages, so the parts a process does not own are given back once
         * reduce-scattered (reducer.c) and zero_grad gives back everything. */
        return accel__pages_alloc(nbytes);
    }
    if (acc->n_ranks > 1 && accel__comm_zero_copy(acc->comm) && !accel__model_staged(m)) {
        void *p = NULL;
        accel_status st = accel__comm_alloc(acc->comm, nbytes, &p);
        if (st == ACCEL_OK) {
            m->grad_shared = 1;
            return p;
        }
        accel__log(&acc->log, ACCEL__LOG_WARN,
                   "accel_model_alloc: gradients in plain memory (all-reduces copy them): %s",
                   accel_last_error(NULL));
    }
    void *p = NULL;
    return accel__dev_alloc(m->dev, nbytes, 1, &p) == ACCEL_OK ? p : NULL;
}

static void grad_free(accel_model *m)
{
    if (m->grad_pages) {
        accel__pages_free(m->grad, m->flat.padded_numel * sizeof(float));
    } else if (m->grad_shared) {
        (void)accel__comm_dealloc(m->acc->comm, m->grad);
    } else {
        accel__dev_free(m->dev, m->grad);
    }
    m->grad = NULL;
    m->grad_shared = 0;
}

static accel_status model_prepare(accel__object *self);
static void model_destroy(accel__object *self);
static accel_status model_state_save(accel__object *self, accel__state_writer *w);
static accel_status model_state_load(accel__object *self, accel__state_reader *r);

/* Checkpoints: the fp32 master weights by parameter name in model[_<i>].safetensors (loads
 * in PyTorch), and inside an open accumulation window each process's gradients in
 * gradients_rank<r>.safetensors. */
static const accel__object_class model_class = {
    .prepare = model_prepare,
    .destroy = model_destroy,
    .state_save = model_state_save,
    .state_load = model_state_load,
    .name = "model",
    .store = ACCEL__STORE_TENSORS,
    .format = "pt",
    .rank_name = "gradients_rank",
    .rank_store = ACCEL__STORE_TENSORS,
};

accel_status accel_model_new(accel *acc, accel_model **out)
{
    if (acc == NULL || out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_model_new: acc and out must not be NULL");
    }
    accel__device *dev;
    accel_status st = accel__device_open(&dev, acc->device);
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(acc, st);
    }
    accel_model *m = accel__calloc(1, sizeof(*m));
    if (m == NULL) {
        accel__device_close(dev);
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_model_new: out of memory");
    }
    m->acc = acc;
    m->dev = dev;
    m->accum_allows = 1;
    accel__object_register(acc, &m->obj, ACCEL__OBJ_MODEL, &model_class);
    *out = m;
    return ACCEL_OK;
}

accel_status accel_model_set_device(accel_model *m, accel_device device)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_set_device: model is NULL");
    }
    if (m->allocated) {
        return accel__seterr(m->acc, ACCEL_ESTATE,
                             "accel_model_set_device: the model is already allocated (on %s)",
                             accel__device_name(m->dev));
    }
    accel__device *dev;
    accel_status st = accel__device_open(&dev, device);
    if (st != ACCEL_OK) {
        return accel__seterr(m->acc, st, "accel_model_set_device: %s", accel_last_error(NULL));
    }
    accel__device_close(m->dev);
    m->dev = dev;
    return ACCEL_OK;
}

/* Releases the buffers of an allocated model (or of a failed allocation). */
static void free_buffers(accel_model *m)
{
    if (m->join_master_shard != NULL) { /* freed inside a ZeRO join region */
        m->master = m->join_master_shard;
        m->master_shard = 1;
        m->zero_stage = m->join_saved_stage;
    }
    if (m->master_shard) {
        accel__zero3_free(m); /* the page buffers: weights (and stage 3's compute copy) */
    }
    if (m->compute != NULL && m->compute != m->master && m->compute != m->weights) {
        accel__dev_free(m->dev, m->compute);
    }
    accel__dev_free(m->dev, m->master);
    grad_free(m);
    accel__dev_free(m->dev, m->dev_sum);
    accel__dev_free(m->dev, m->dev_flag);
    accel__free(m->flat_bucket);
    accel__flat_free(&m->flat);
    m->master = m->grad = m->weights = NULL;
    m->compute = NULL;
    m->master_shard = 0;
    m->dev_sum = NULL;
    m->dev_flag = NULL;
    m->flat_bucket = NULL;
}

void accel_model_free(accel_model *m)
{
    if (m == NULL) {
        return;
    }
    accel__reducer_free(m);
    accel__zero_groups_free(m);
    for (int i = 0; i < m->n_params; i++) {
        accel__free((void *)m->params[i].name);
    }
    accel__free(m->params);
    accel__free(m->unit_mark);
    free_buffers(m);
    accel__device_close(m->dev);
    accel__object_unregister(&m->obj);
    accel__free(m);
}

static void model_destroy(accel__object *self)
{
    accel_model_free((accel_model *)self);
}

int accel_model_find(const accel_model *m, const char *name)
{
    if (m == NULL || name == NULL) {
        return -1;
    }
    for (int i = 0; i < m->n_params; i++) {
        if (strcmp(m->params[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

accel_status accel_model_add_param(accel_model *m, const char *name, int ndim, const int64_t *shape,
                                   int *index_out)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_add_param: model is NULL");
    }
    accel *acc = m->acc;
    if (name == NULL || name[0] == '\0') {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_model_add_param: empty parameter name");
    }
    size_t len = strlen(name);
    if (len > ACCEL_PARAM_NAME_MAX) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_model_add_param: name \"%.40s...\" is %zu bytes, over the "
                             "limit of %d",
                             name, len, ACCEL_PARAM_NAME_MAX);
    }
    if (m->allocated || m->obj.prepared) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_model_add_param: parameter \"%s\" registered after the model "
                             "was %s",
                             name, m->obj.prepared ? "prepared" : "allocated");
    }
    if (accel_model_find(m, name) >= 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_model_add_param: parameter \"%s\" registered twice", name);
    }
    if (ndim < 1 || ndim > ACCEL_MAX_DIMS || shape == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_model_add_param: parameter \"%s\": ndim %d is not in 1..%d",
                             name, ndim, ACCEL_MAX_DIMS);
    }
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_model_add_param: parameter \"%s\": dimension %d is %lld "
                                 "(must be positive)",
                                 name, d, (long long)shape[d]);
        }
        if ((uint64_t)shape[d] > SIZE_MAX / 4 / numel) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_model_add_param: parameter \"%s\" is too large", name);
        }
        numel *= (size_t)shape[d];
    }
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 16;
        accel_param *p = accel__realloc(m->params, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            return accel__seterr(acc, ACCEL_ENOMEM, "accel_model_add_param: out of memory");
        }
        m->params = p;
        m->cap_params = cap;
    }
    char *copy = accel__strdup(name);
    if (copy == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_model_add_param: out of memory");
    }
    accel_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof(*p));
    p->name = copy;
    p->index = m->n_params;
    p->dtype = ACCEL_F32;
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof(int64_t));
    p->numel = numel;
    p->bucket = -1;
    m->numel += numel;
    if (index_out != NULL) {
        *index_out = m->n_params;
    }
    m->n_params++;
    return ACCEL_OK;
}

/* A typed view of `p` over a flat buffer of dtype dt (NULL base: no memory yet). */
static accel_tensor param_view(const accel_model *m, const accel_param *p, void *base,
                               accel_dtype dt)
{
    accel_tensor t = accel_tensor_view(NULL, dt, p->ndim, p->shape);
    t.device = accel__device_which(m->dev);
    if (base != NULL) {
        t.data = (char *)base + p->offset * accel_dtype_nbytes(dt);
    }
    return t;
}

/* The geometry: buckets by size over the parameters trainable now. Sharded stages split every
 * bucket over the processes in equal 64-byte-aligned pieces; DDP shards nothing (a group of
 * one, no padding), so parameters are packed end to end as in version 1. */
static accel_status build_geometry(accel_model *m)
{
    accel *acc = m->acc;
    const accel__train_settings *ts = &acc->settings->train;
    accel__flat_param *fp = accel__calloc((size_t)m->n_params, sizeof(*fp));
    size_t *offsets = accel__calloc((size_t)m->n_params, sizeof(*offsets));
    m->flat_bucket = accel__calloc((size_t)m->n_params, sizeof(int));
    accel_status st = ACCEL_ENOMEM;
    if (fp == NULL || offsets == NULL || m->flat_bucket == NULL) {
        accel__seterr(acc, st, "accel_model_alloc: out of memory for the geometry");
    } else {
        for (int i = 0; i < m->n_params; i++) {
            fp[i].numel = m->params[i].numel;
            fp[i].frozen = m->params[i].frozen;
        }
        m->zero_stage = ts->zero_stage > 0 ? ts->zero_stage : 0;
        /* Sharded over the process's group (hybrid sharding), every process by default. */
        int n = m->zero_stage > 0 ? accel__zero_group_size(acc) : 1;
        m->rank = acc->rank % n;
        m->replica = m->zero_stage > 0 ? acc->rank / n : 0;
        size_t unit = m->zero_stage > 0 ? (size_t)n * 16 : 1;
        if (m->zero_stage == 3) {
            /* One bucket per unit: a unit's gather and its gradients' reduce-scatter are one
             * equal-count collective each. */
            int *unit_of = accel__calloc((size_t)m->n_params, sizeof(int));
            st = ACCEL_ENOMEM;
            if (unit_of != NULL) {
                accel__zero3_units(m, unit_of);
                st = accel__flat_build_units(&m->flat, fp, m->n_params, unit_of, n, unit, offsets,
                                             m->flat_bucket);
                accel__free(unit_of);
            }
        } else {
            st = accel__flat_build(&m->flat, fp, m->n_params, ts->first_bucket_mb * 1048576.0,
                                   ts->bucket_cap_mb * 1048576.0, n, unit, offsets, m->flat_bucket);
        }
        if (st == ACCEL_OK) {
            for (int i = 0; i < m->n_params; i++) {
                m->params[i].offset = offsets[i];
            }
        } else {
            accel__adopt_thread_error(acc, st);
        }
    }
    accel__free(fp);
    accel__free(offsets);
    if (st != ACCEL_OK) {
        accel__free(m->flat_bucket);
        m->flat_bucket = NULL;
    }
    return st;
}

accel_status accel_model_alloc(accel_model *m)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_alloc: model is NULL");
    }
    if (m->allocated) {
        return ACCEL_OK;
    }
    if (m->n_params == 0) {
        return accel__seterr(m->acc, ACCEL_EINVAL, "accel_model_alloc: the model has no parameter");
    }
    ACCEL_TRY(build_geometry(m));
    size_t n = m->flat.padded_numel, nbytes = n * sizeof(float);
    m->compute_dtype = accel__compute_dtype(m->acc);
    size_t cbytes = n * accel_dtype_nbytes(m->compute_dtype);
    void *master = NULL, *compute = NULL, *sum = NULL, *flag = NULL;
    /* Stage 3, and stages 1-2 under mixed precision when there is something to shard, keep
     * only this process's shard of the fp32 master; the full weights are pages (zero3.c).
     * Stages 1-2 compute from the full compute copy every process keeps (DeepSpeed's bf16
     * model), all-gathered after each step. (Host memory only: the full fp32 weights that
     * parameters view are then pages holding the gathered units; in device memory they would
     * have to be a reserved range as at stage 3, which stages 1-2 do not use, so a sharded
     * master would save nothing there. On a GPU stages 1-2 keep the full fp32 master,
     * all-gathered in place on a device communicator, through host staging on a host one:
     * zero.c. Stage 3 on a GPU maps its units into reserved device ranges: zero3.c.) */
    m->master_shard =
        m->zero_stage == 3 || (m->zero_stage >= 1 && m->flat.n_ranks > 1 &&
                               m->compute_dtype != ACCEL_F32 && accel__model_on_host(m));
    size_t master_nbytes =
        m->master_shard ? accel__flat_shard_numel(&m->flat) * sizeof(float) : nbytes;
    int ok = accel__dev_alloc(m->dev, master_nbytes, 1, &master) == ACCEL_OK;
    m->master = master;
    ok = ok && (m->grad = grad_alloc(m, nbytes)) != NULL;
    if (m->zero_stage != 3 && ok && m->compute_dtype != ACCEL_F32) {
        ok = accel__dev_alloc(m->dev, cbytes, 1, &compute) == ACCEL_OK;
    }
    m->compute = m->compute_dtype == ACCEL_F32 ? m->master : compute;
    if (!m->master_shard) {
        m->weights = m->master;
    } else if (!ok) {
        m->master_shard = 0; /* nothing of zero3.c's made: free_buffers must not free it */
    } else {
        accel_status zst = accel__zero3_alloc(m);
        if (zst != ACCEL_OK) {   /* its own message (a GPU without reserved ranges, say) */
            m->master_shard = 0; /* zero3.c has released what it made */
            free_buffers(m);
            return zst;
        }
    }
    ok = ok && accel__dev_alloc(m->dev, sizeof(double), 1, &sum) == ACCEL_OK &&
         accel__dev_alloc(m->dev, sizeof(int32_t), 1, &flag) == ACCEL_OK;
    m->dev_sum = sum;
    m->dev_flag = flag;
    if (!ok) {
        free_buffers(m);
        return accel__seterr(m->acc, ACCEL_ENOMEM,
                             "accel_model_alloc: out of memory for %zu parameters (%zu bytes x 2 "
                             "+ %zu for the compute copy)",
                             m->numel, nbytes, m->compute_dtype == ACCEL_F32 ? 0 : cbytes);
    }
    /* A separate working copy is only meaningful once the weights are final (prepare
     * refreshes it); in fp32 it is the master itself. */
    m->compute_valid = m->compute_dtype == ACCEL_F32;
    int host = accel__device_which(m->dev).type == ACCEL_DEVICE_CPU;
    for (int i = 0; i < m->n_params; i++) {
        accel_param *p = &m->params[i];
        p->data_view = param_view(m, p, m->weights, ACCEL_F32);
        p->grad_view = param_view(m, p, m->grad, ACCEL_F32);
        p->compute_view = param_view(m, p, m->compute_valid ? m->compute : NULL, m->compute_dtype);
        p->data = host ? p->data_view.data : NULL;
        p->grad = host ? p->grad_view.data : NULL;
    }
    m->allocated = 1;
    return ACCEL_OK;
}

int accel_model_num_params(const accel_model *m)
{
    return m ? m->n_params : 0;
}

size_t accel_model_numel(const accel_model *m)
{
    return m ? m->numel : 0;
}

const accel_param *accel_model_param(accel_model *m, int i)
{
    if (m == NULL || i < 0 || i >= m->n_params) {
        accel__seterr(m ? m->acc : NULL, ACCEL_EINVAL,
                      "accel_model_param: index %d out of range (%d parameters)", i,
                      m ? m->n_params : 0);
        return NULL;
    }
    if (!m->allocated && accel_model_alloc(m) != ACCEL_OK) {
        return NULL;
    }
    return &m->params[i];
}

/* A flat buffer as a float pointer, where the host can read it. */
static float *host_f32(accel_model *m, float *buf, const char *who)
{
    if (m == NULL || buf == NULL) {
        return NULL;
    }
    if (accel__device_which(m->dev).type != ACCEL_DEVICE_CPU) {
        accel__seterr(m->acc, ACCEL_ESTATE, "%s: the buffer is in %s memory, not the host's", who,
                      accel__device_name(m->dev));
        return NULL;
    }
    return buf;
}

float *accel_model_master(accel_model *m)
{
    if (m != NULL && m->master_shard) {
        accel__seterr(m->acc, ACCEL_ESTATE,
                      "accel_model_master: under ZeRO stage %d%s each process holds a shard of "
                      "the fp32 master; parameters' data are valid while their unit is gathered "
                      "(accel_model_gather_all)%s; accel_save_model writes the master",
                      m->zero_stage, m->zero_stage == 3 ? "" : " with mixed precision",
                      m->zero_stage == 3 ? "" : " and hold the compute copy widened to fp32");
        return NULL;
    }
    return host_f32(m, m ? m->master : NULL, "accel_model_master");
}

float *accel_model_grad(accel_model *m)
{
    return host_f32(m, m ? m->grad : NULL, "accel_model_grad");
}

accel_status accel__model_zero_grad(accel_model *m)
{
    m->grad_reduced = 0;
    if (m->grad_pages) {
        accel__pages_drop_all(m->grad, m->flat.padded_numel * sizeof(float));
        return ACCEL_OK;
    }
    accel_status st = accel__dev_zero(m->dev, accel__grad_span(m, 0, m->flat.padded_numel), NULL);
    return st == ACCEL_OK ? st : accel__adopt_thread_error(m->acc, st);
}

accel_status accel__model_read_sum(accel_model *m, double *out)
{
    accel_status st = accel__dev_copy(m->dev, out, m->dev_sum, sizeof(*out), ACCEL__COPY_D2H, NULL);
    return st == ACCEL_OK ? st : accel__adopt_thread_error(m->acc, st);
}

accel_status accel__model_read_flag(accel_model *m, int32_t *out)
{
    accel_status st =
        accel__dev_copy(m->dev, out, m->dev_flag, sizeof(*out), ACCEL__COPY_D2H, NULL);
    return st == ACCEL_OK ? st : accel__adopt_thread_error(m->acc, st);
}

accel_status accel_model_freeze(accel_model *m, int index, int frozen)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_freeze: model is NULL");
    }
    if (index < 0 || index >= m->n_params) {
        return accel__seterr(m->acc, ACCEL_EINVAL,
                             "accel_model_freeze: index %d out of range (%d parameters)", index,
                             m->n_params);
    }
    if (m->obj.prepared) {
        return accel__seterr(m->acc, ACCEL_ESTATE,
                             "accel_model_freeze: parameter \"%s\": the model is already "
                             "prepared (buckets are fixed); freeze before accel_prepare",
                             m->params[index].name);
    }
    m->params[index].frozen = frozen ? 1 : 0;
    return ACCEL_OK;
}

accel_status accel_model_freeze_by_name(accel_model *m, const char *name, int frozen)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_freeze_by_name: model is NULL");
    }
    int i = accel_model_find(m, name);
    if (i < 0) {
        return accel__seterr(m ? m->acc : NULL, ACCEL_EINVAL,
                             "accel_model_freeze_by_name: no parameter called \"%s\"",
                             name ? name : "(null)");
    }
    return accel_model_freeze(m, i, frozen);
}

accel_status accel__model_broadcast_master(accel_model *m, int root)
{
    return accel__model_broadcast_flat(m, m->weights, root, "the weights");
}

accel_status accel__model_broadcast_flat(accel_model *m, float *buf, int root, const char *what)
{
    accel *acc = m->acc;
    size_t nbytes = m->flat.padded_numel * sizeof(float);
    if (!accel__model_staged(m)) {
        accel_status st = accel__broadcast(acc->comm, buf, m->flat.padded_numel, ACCEL_F32, root);
        return st == ACCEL_OK ? st : accel__adopt_thread_error(acc, st);
    }
    /* The communicator reads host memory only: through a pinned host copy. */
    void *host = NULL;
    accel_status st = accel__dev_host_alloc(m->dev, nbytes, &host);
    if (st != ACCEL_OK) {
        return accel__seterr(acc, st, "broadcasting %s from %s: %s", what,
                             accel__device_name(m->dev), accel_last_error(NULL));
    }
    accel_status cst = ACCEL_OK;
    if (acc->rank == root) {
        cst = accel__dev_copy(m->dev, host, buf, nbytes, ACCEL__COPY_D2H, NULL);
        if (cst != ACCEL_OK) {
            memset(host, 0, nbytes); /* still broadcast, so no peer waits in vain */
        }
    }
    st = accel__broadcast(acc->comm, host, m->flat.padded_numel, ACCEL_F32, root);
    if (st == ACCEL_OK && cst == ACCEL_OK && acc->rank != root) {
        cst = accel__dev_copy(m->dev, buf, host, nbytes, ACCEL__COPY_H2D, NULL);
    }
    if (cst != ACCEL_OK && st == ACCEL_OK) {
        st = accel__seterr(NULL, cst, "broadcasting %s: %s", what, accel_last_error(NULL));
    }
    accel__dev_host_free(m->dev, host);
    return st == ACCEL_OK ? st : accel__adopt_thread_error(acc, st);
}

static accel_status model_prepare(accel__object *self)
{
    accel_model *m = (accel_model *)self;
    accel *acc = m->acc;
    ACCEL_TRY(accel__comm_dtype_check(acc));
    ACCEL_TRY(accel__precision_install(acc));
    ACCEL_TRY(accel_model_alloc(m));
    ACCEL_TRY(accel__zero_groups_new(m));
    ACCEL_TRY(accel__reducer_prepare(m));
    if (acc->n_ranks > 1) {
        /* Every process starts from process 0's weights (DDP's sync_module_states). */
        ACCEL_TRY(accel__model_broadcast_master(m, 0));
    }
    if (m->master_shard) {
        return accel__zero3_take_shard(m); /* the full weights go; units come back on use */
    }
    return accel__model_refresh_compute(m);
}

/* ---- the state protocol ---- */

/* Parameter i's part owned by `rank` under ZeRO (this process's m->rank, or -1 for none: a
 * later replica saving; a 1-D view of the master) and where it lies in the parameter
 * (whole->offset); an empty view when it owns none of it. */
static accel_tensor master_part(const accel_model *m, int i, int rank, accel__state_piece *whole)
{
    const accel_param *p = &m->params[i];
    size_t flat_off, shard_off, count;
    accel__zero_param_part(m, i, rank, &flat_off, &shard_off, &count);
    whole->ndim = p->ndim;
    memcpy(whole->shape, p->shape, sizeof whole->shape);
    whole->offset = count > 0 ? (int64_t)(flat_off - p->offset) : 0;
    float *at = count > 0 ? accel__zero_master_at(m, flat_off, shard_off) : m->master;
    accel_tensor t = accel_tensor_view(at, ACCEL_F32, 1, (int64_t[]){(int64_t)count});
    t.device = p->data_view.device;
    return t;
}

/* The geometry a sharded checkpoint was saved with (docs/checkpoint.md): informative, the
 * pieces themselves say where they belong. */
static accel_status put_geometry(const accel_model *m, accel__state_writer *w)
{
    ACCEL_TRY(accel__state_begin(w, "zero", 0));
    ACCEL_TRY(accel__state_put_i64(w, "stage", m->zero_stage));
    ACCEL_TRY(accel__state_put_i64(w, "num_processes", m->flat.n_ranks));
    ACCEL_TRY(accel__state_put_i64(w, "replicas", m->acc->n_ranks / m->flat.n_ranks));
    ACCEL_TRY(accel__state_put_i64(w, "numel", (int64_t)m->flat.numel));
    ACCEL_TRY(accel__state_put_i64(w, "padded_numel", (int64_t)m->flat.padded_numel));
    ACCEL_TRY(accel__state_put_i64(w, "pad_unit", (int64_t)m->flat.pad_unit));
    ACCEL_TRY(accel__state_begin(w, "buckets", 1)); /* [offset, count, padded] */
    for (int b = 0; b < m->flat.n_buckets; b++) {
        const accel__flat_bucket *bk = &m->flat.buckets[b];
        ACCEL_TRY(accel__state_begin(w, NULL, 1));
        ACCEL_TRY(accel__state_put_i64(w, NULL, (int64_t)bk->offset));
        ACCEL_TRY(accel__state_put_i64(w, NULL, (int64_t)bk->count));
        ACCEL_TRY(accel__state_put_i64(w, NULL, (int64_t)bk->padded));
        ACCEL_TRY(accel__state_end(w));
    }
    ACCEL_TRY(accel__state_end(w));
    ACCEL_TRY(accel__state_begin(w, "flat_offsets", 0));
    for (int i = 0; i < m->n_params; i++) {
        ACCEL_TRY(accel__state_put_i64(w, m->params[i].name, (int64_t)m->params[i].offset));
    }
    ACCEL_TRY(accel__state_end(w));
    return accel__state_end(w);
}

static accel_status model_state_save(accel__object *self, accel__state_writer *w)
{
    accel_model *m = (accel_model *)self;
    int shared = accel__state_writer_part(w) == ACCEL__STATE_SHARED;
    if (!shared && !accel__grad_state_window_open(m->acc)) {
        return ACCEL_OK; /* after a step the gradients hold nothing a resume needs */
    }
    if (!shared && m->grad_reduced) {
        /* sync_each_batch at ZeRO-2/3: the next backward would first scale the reduced pieces
         * (sync.c); done now, the same operation on the same values, so the saved gradients
         * need no flag and a resume continues bit for bit. */
        ACCEL_TRY(accel__model_rescale_reduced(m));
    }
    /* Under ZeRO every process puts the master pieces it owns (written in parallel, one shard
     * file each; a sharded master holds nothing else, even alone); the gradients of an open
     * window are full at every stage. */
    int pieces = shared && (m->master_shard || (m->zero_stage >= 1 && m->flat.n_ranks > 1));
    for (int i = 0; i < m->n_params; i++) {
        const accel_param *p = &m->params[i];
        if (pieces) {
            accel__state_piece whole;
            accel_tensor t = master_part(m, i, accel__zero_save_rank(m), &whole);
            ACCEL_TRY(accel__state_put_piece(w, p->name, t, &whole));
        } else {
            ACCEL_TRY(accel__state_put_tensor(w, p->name, shared ? p->data_view : p->grad_view));
        }
    }
    return pieces && m->flat.n_ranks > 1 ? put_geometry(m, w) : ACCEL_OK;
}

static void model_loaded(accel__object *self, void *unused)
{
    (void)unused;
    accel_model *m = (accel_model *)self;
    if (m->master_shard) {
        /* Gathered units hold the old weights: dropped, the next use gathers the new master
         * (nothing is in flight between steps, so this cannot fail). At stages 1-2 the
         * compute copy follows the master pieces at the next collective use (materialize,
         * gather_all, the step): a load cannot communicate here. */
        (void)accel__zero3_release_all(m);
        m->compute_stale = m->zero_stage != 3;
        return;
    }
    /* The working copy follows the loaded master (a host conversion: cannot fail). */
    (void)accel__model_refresh_compute(m);
}

static accel_status model_state_load(accel__object *self, accel__state_reader *r)
{
    accel_model *m = (accel_model *)self;
    int shared = accel__state_reader_part(r) == ACCEL__STATE_SHARED;
    /* Whatever the saved layout (ckpt maps it): a full master reads every weight on every
     * process; a sharded one only its pieces. */
    int pieces = shared && m->master_shard;
    for (int i = 0; i < m->n_params; i++) {
        const accel_param *p = &m->params[i];
        if (pieces) {
            accel__state_piece whole;
            accel_tensor t = master_part(m, i, m->rank, &whole);
            ACCEL_TRY(accel__state_get_piece(r, p->name, t, &whole));
        } else {
            ACCEL_TRY(accel__state_get_tensor(r, p->name, shared ? p->data_view : p->grad_view));
        }
    }
    if (shared && accel__state_stage(r, 0, model_loaded) == NULL) {
        return ACCEL_ENOMEM;
    }
    return ACCEL_OK;
}

int accel_model_num_buckets(const accel_model *m)
{
    return m ? m->red.n_buckets : 0;
}

accel_status accel_model_bucket_info(const accel_model *m, int b, accel_bucket_info *info)
{
    if (m == NULL || info == NULL || b < 0 || b >= m->red.n_buckets) {
        return accel__seterr(m ? m->acc : NULL, ACCEL_EINVAL,
                             "accel_model_bucket_info: bucket %d out of range (%d buckets)", b,
                             m ? m->red.n_buckets : 0);
    }
    const accel__bucket *bk = &m->red.buckets[b];
    info->offset = bk->offset;
    info->count = bk->count;
    info->n_params = bk->n_params;
    info->launch_time = bk->launch_time;
    info->done_time = bk->done_time;
    return ACCEL_OK;
}
