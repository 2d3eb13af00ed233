/*
 * Models as flat buffers: parameter registration, allocation of the master / gradient buffers,
 * per-parameter views, freezing, and preparation (process 0's weights broadcast, gradient
 * buckets built). Invariant: once allocated, every buffer lays parameters out in reverse
 * registration order, so a bucket (consecutive parameters in backward order) is one contiguous
 * slice and a parameter's grad pointer is a view into its bucket.
 * With several processes on the shm backend the gradient buffer is symmetric shared memory
 * (accel__comm_alloc), so the in-place bucket all-reduces read peers' gradients directly; that
 * makes the allocation collective (every process allocates its model, as every process
 * prepares it).
 */
#include <string.h>

#include "comm/comm.h"
#include "core/profile.h"
#include "train_internal.h"

/* The gradient buffer: symmetric shared memory where the backend reads it in place (the
 * zero-copy bucket all-reduces), else plain aligned memory. A failure every process sees alike
 * (no room in /dev/shm) falls back to plain memory on every process. */
static float *grad_alloc(accel_model *m, size_t nbytes)
{
    accel *acc = m->acc;
    m->grad_shared = 0;
    if (acc->n_ranks > 1 && accel__comm_zero_copy(acc->comm)) {
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
    return accel__aligned_alloc(nbytes);
}

static void grad_free(accel_model *m)
{
    if (m->grad_shared) {
        (void)accel__comm_dealloc(m->acc->comm, m->grad);
    } else {
        accel__aligned_free(m->grad);
    }
    m->grad = NULL;
    m->grad_shared = 0;
}

static accel_status model_prepare(accel__object *self);
static void model_destroy(accel__object *self);

accel_status accel_model_new(accel *acc, accel_model **out)
{
    if (acc == NULL || out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_model_new: acc and out must not be NULL");
    }
    accel_model *m = accel__calloc(1, sizeof(*m));
    if (m == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_model_new: out of memory");
    }
    m->acc = acc;
    m->accum_allows = 1;
    accel__object_register(acc, &m->obj, ACCEL__OBJ_MODEL, model_prepare, model_destroy);
    *out = m;
    return ACCEL_OK;
}

/* Waits for every in-flight bucket; returns the first failure. */
static accel_status wait_buckets(accel_model *m)
{
    accel_status first = ACCEL_OK;
    for (int b = 0; b < m->n_buckets; b++) {
        accel__bucket *bk = &m->buckets[b];
        if (bk->work == NULL) {
            continue;
        }
        accel_status st = accel_work_wait(bk->work);
        if (bk->done_time == 0) {
            bk->done_time = accel__now();
            accel__prof_span(m->acc, "bucket allreduce", ACCEL__PROF_COMM, bk->launch_time,
                             bk->done_time, "bucket", b);
        }
        accel_work_free(bk->work);
        bk->work = NULL;
        if (st == ACCEL_OK && m->comm_buf != NULL) {
            accel__bucket_decompress(m, bk->offset, bk->count);
        }
        if (st != ACCEL_OK && first == ACCEL_OK) {
            first = st;
        }
    }
    return first;
}

void accel_model_free(accel_model *m)
{
    if (m == NULL) {
        return;
    }
    if (m->buckets != NULL) {
        (void)wait_buckets(m);
    }
    for (int i = 0; i < m->n_params; i++) {
        accel__free((void *)m->params[i].name);
    }
    accel__free(m->params);
    if (m->compute != m->master) {
        accel__aligned_free(m->compute);
    }
    accel__aligned_free(m->master);
    grad_free(m);
    accel__aligned_free(m->comm_buf);
    accel__free(m->buckets);
    accel__free(m->ready);
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
    size_t nbytes = m->numel * sizeof(float);
    m->compute_dtype = accel__compute_dtype(m->acc);
    m->master = accel__aligned_alloc(nbytes);
    m->grad = grad_alloc(m, nbytes);
    m->ready = accel__calloc((size_t)m->n_params, 1);
    m->compute = m->compute_dtype == ACCEL_F32 ? m->master : accel__aligned_alloc(nbytes);
    if (m->master == NULL || m->grad == NULL || m->ready == NULL || m->compute == NULL) {
        if (m->compute != m->master) {
            accel__aligned_free(m->compute);
        }
        accel__aligned_free(m->master);
        grad_free(m);
        accel__free(m->ready);
        m->master = m->grad = m->compute = NULL;
        m->ready = NULL;
        return accel__seterr(m->acc, ACCEL_ENOMEM,
                             "accel_model_alloc: out of memory for %zu parameters (%zu bytes x 2)",
                             m->numel, nbytes);
    }
    memset(m->master, 0, nbytes);
    memset(m->grad, 0, nbytes);
    /* The working copy is only meaningful once the weights are final (prepare refreshes it). */
    m->compute_valid = 0;
    /* Reverse registration order: the parameters a backward pass finishes first come first. */
    size_t off = 0;
    for (int i = m->n_params - 1; i >= 0; i--) {
        accel_param *p = &m->params[i];
        p->offset = off;
        p->data = m->master + off;
        p->grad = m->grad + off;
        off += p->numel;
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

float *accel_model_master(accel_model *m)
{
    return m ? m->master : NULL;
}

float *accel_model_grad(accel_model *m)
{
    return m ? m->grad : NULL;
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
    int i = accel_model_find(m, name);
    if (i < 0) {
        return accel__seterr(m ? m->acc : NULL, ACCEL_EINVAL,
                             "accel_model_freeze_by_name: no parameter called \"%s\"",
                             name ? name : "(null)");
    }
    return accel_model_freeze(m, i, frozen);
}

/*
 * DDP's compute_bucket_assignment_by_size, walking parameters in backward (reverse
 * registration) order: bucket 0 closes once it reaches first_bucket_mb, later ones at
 * bucket_cap_mb. We give the small bucket to the gradients that are ready first (where DDP
 * lands after its rebuild) so communication starts as early as possible. Frozen parameters
 * belong to no bucket; one sitting between two trainable ones lies inside the bucket's range
 * and is sent as zeros, which keeps every bucket one contiguous message.
 */
static accel_status build_buckets(accel_model *m)
{
    double first = m->acc->opt.first_bucket_mb * 1048576.0;
    double cap = m->acc->opt.bucket_cap_mb * 1048576.0;
    accel__free(m->buckets);
    m->buckets = accel__calloc((size_t)m->n_params, sizeof(*m->buckets));
    if (m->buckets == NULL) {
        return accel__seterr(m->acc, ACCEL_ENOMEM, "accel_prepare: out of memory for buckets");
    }
    int nb = 0;
    accel__bucket *cur = NULL;
    size_t end = 0; /* end of the open bucket's range */
    for (int i = m->n_params - 1; i >= 0; i--) {
        accel_param *p = &m->params[i];
        p->bucket = -1;
        if (p->frozen) {
            continue;
        }
        if (cur == NULL) {
            cur = &m->buckets[nb++];
            cur->offset = p->offset;
        }
        p->bucket = nb - 1;
        cur->n_params++;
        end = p->offset + p->numel;
        cur->count = end - cur->offset;
        double limit = (nb == 1) ? first : cap;
        if ((double)cur->count * sizeof(float) >= limit) {
            cur = NULL;
        }
    }
    m->n_buckets = nb;
    return ACCEL_OK;
}

static accel_status model_prepare(accel__object *self)
{
    accel_model *m = (accel_model *)self;
    accel *acc = m->acc;
    ACCEL_TRY(accel__comm_dtype_check(acc));
    ACCEL_TRY(accel__precision_install(acc));
    ACCEL_TRY(accel_model_alloc(m));
    ACCEL_TRY(build_buckets(m));
    int dt = acc->opt.comm_dtype;
    if (acc->n_ranks > 1 && (dt == ACCEL_BF16 || dt == ACCEL_F16) && m->comm_buf == NULL) {
        /* Buckets are slices of grad, so one buffer of the same layout serves them all. */
        m->comm_buf = accel__aligned_alloc(m->numel * sizeof(uint16_t));
        if (m->comm_buf == NULL) {
            return accel__seterr(acc, ACCEL_ENOMEM,
                                 "accel_prepare: out of memory for the compressed gradient "
                                 "buffer (%zu elements)",
                                 m->numel);
        }
    }
    if (acc->n_ranks > 1) {
        /* Every process starts from process 0's weights (DDP's sync_module_states). */
        accel_status st = accel__broadcast(acc->comm, m->master, m->numel, ACCEL_F32, 0);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
    }
    accel__model_refresh_compute(m);
    return ACCEL_OK;
}

int accel_model_num_buckets(const accel_model *m)
{
    return m ? m->n_buckets : 0;
}

accel_status accel_model_bucket_info(const accel_model *m, int b, accel_bucket_info *info)
{
    if (m == NULL || info == NULL || b < 0 || b >= m->n_buckets) {
        return accel__seterr(m ? m->acc : NULL, ACCEL_EINVAL,
                             "accel_model_bucket_info: bucket %d out of range (%d buckets)", b,
                             m ? m->n_buckets : 0);
    }
    const accel__bucket *bk = &m->buckets[b];
    info->offset = bk->offset;
    info->count = bk->count;
    info->n_params = bk->n_params;
    info->launch_time = bk->launch_time;
    info->done_time = bk->done_time;
    return ACCEL_OK;
}

accel_status accel__model_wait_buckets(accel_model *m)
{
    return wait_buckets(m);
}
