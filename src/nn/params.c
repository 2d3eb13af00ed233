/*
 * Parameter sets: named persistent tensors whose memory comes from an nn_param_sink (the
 * training module's flat buffers) or, standalone, from two flat buffers owned here.
 *
 * Invariant: the set goes declared -> bound -> (initialised) in that order; a parameter's
 * data/grad pointers never change after bind, so tensors built on them (layers, views) stay
 * valid for the life of the set. Initialisation is a pure function of (seed, declaration
 * index, element), so it is reproducible whatever the order or thread count.
 */
#include <stdio.h>

#include "nn_gpu.h"

typedef struct param_entry {
    char *name;
    nn_tensor *t;
    nn_init init;
    int64_t flat_offset; /* standalone only */
} param_entry;

struct nn_params {
    nn_param_sink sink;
    int standalone;
    param_entry *v;
    int n, cap;
    int bound;
    float *flat_data, *flat_grad;
    int64_t flat_count;
};

/* ---- the built-in sink: one data and one gradient buffer, parameters back to back ---- */

static int flat_declare(void *ctx, const char *name, int ndim, const int64_t *shape)
{
    (void)name;
    nn_params *p = ctx;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= shape[d];
    }
    /* The entry being declared is p->n (nn_params_declare appends after the sink answers). */
    p->v[p->n].flat_offset = p->flat_count;
    p->flat_count += n;
    return p->n;
}

static accel_status flat_bind(void *ctx, int index, float **data, float **grad)
{
    nn_params *p = ctx;
    if (p->flat_data == NULL) {
        size_t nbytes = (size_t)p->flat_count * sizeof(float);
        p->flat_data = accel__aligned_alloc(nbytes);
        p->flat_grad = accel__aligned_alloc(nbytes);
        if (p->flat_data == NULL || p->flat_grad == NULL) {
            accel__aligned_free(p->flat_data);
            accel__aligned_free(p->flat_grad);
            p->flat_data = p->flat_grad = NULL;
            return accel__seterr(NULL, ACCEL_ENOMEM, "nn_params: cannot allocate %zu bytes",
                                 2 * nbytes);
        }
        memset(p->flat_data, 0, nbytes);
        memset(p->flat_grad, 0, nbytes);
    }
    *data = p->flat_data + p->v[index].flat_offset;
    *grad = p->flat_grad + p->v[index].flat_offset;
    return ACCEL_OK;
}

accel_status nn_params_new(nn_params **out, const nn_param_sink *sink)
{
    if (out == NULL || (sink != NULL && (sink->declare == NULL || sink->bind == NULL))) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_params_new: %s",
                             out == NULL ? "out is NULL" : "sink lacks declare or bind");
    }
    nn_params *p = accel__calloc(1, sizeof(*p));
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nn_params_new: out of memory");
    }
    if (sink != NULL) {
        p->sink = *sink;
    } else {
        p->standalone = 1;
        p->sink.ctx = p;
        p->sink.declare = flat_declare;
        p->sink.bind = flat_bind;
    }
    *out = p;
    return ACCEL_OK;
}

void nn_params_free(nn_params *p)
{
    if (p == NULL) {
        return;
    }
    for (int i = 0; i < p->n; i++) {
        accel__free(p->v[i].name);
        accel__free(p->v[i].t);
    }
    accel__free(p->v);
    accel__aligned_free(p->flat_data);
    accel__aligned_free(p->flat_grad);
    accel__free(p);
}

nn_tensor *nn_params_declare(nn_params *p, const char *name, int ndim, const int64_t *shape,
                             nn_init init)
{
    if (p == NULL || name == NULL || shape == NULL || ndim < 1 || ndim > NN_MAX_DIMS) {
        accel__seterr(NULL, ACCEL_EINVAL,
                      "nn_params_declare(%s): need a set, a name and "
                      "1..%d dims",
                      name ? name : "NULL", NN_MAX_DIMS);
        return NULL;
    }
    if (p->bound) {
        accel__seterr(NULL, ACCEL_ESTATE, "nn_params_declare(%s): the set is already bound", name);
        return NULL;
    }
    /* The set's element count must not wrap (2^40 x 2^40 is 0 mod 2^64): flat buffers sized
     * from a wrapped count would be far smaller than the parameters bound into them. The
     * bound leaves room for data and gradient in one address space. */
    const int64_t max_count = PTRDIFF_MAX / (int64_t)(2 * sizeof(float));
    int64_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) {
            accel__seterr(NULL, ACCEL_EINVAL, "nn_params_declare(%s): dim %d is %lld", name, d,
                          (long long)shape[d]);
            return NULL;
        }
        if (count > max_count / shape[d]) {
            accel__seterr(NULL, ACCEL_EINVAL,
                          "nn_params_declare(%s): dim %d of size %lld overflows the element count",
                          name, d, (long long)shape[d]);
            return NULL;
        }
        count *= shape[d];
    }
    if (count > max_count - nn_params_numel(p)) {
        accel__seterr(NULL, ACCEL_EINVAL,
                      "nn_params_declare(%s): %lld more elements overflow the set's count", name,
                      (long long)count);
        return NULL;
    }
    if ((unsigned)init.kind > NN_INIT_UNIFORM) {
        accel__seterr(NULL, ACCEL_EINVAL, "nn_params_declare(%s): unknown init kind %d", name,
                      (int)init.kind);
        return NULL;
    }
    if (nn_params_find(p, name) != NULL) {
        accel__seterr(NULL, ACCEL_EINVAL, "nn_params_declare: duplicate parameter name '%s'", name);
        return NULL;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 32;
        param_entry *v = accel__realloc(p->v, (size_t)cap * sizeof(*v));
        if (v == NULL) {
            accel__seterr(NULL, ACCEL_ENOMEM, "nn_params_declare(%s): out of memory", name);
            return NULL;
        }
        p->v = v;
        p->cap = cap;
    }
    param_entry *e = &p->v[p->n];
    memset(e, 0, sizeof(*e));
    e->name = accel__strdup(name);
    e->t = accel__calloc(1, sizeof(nn_tensor));
    if (e->name == NULL || e->t == NULL) {
        accel__free(e->name);
        accel__free(e->t);
        accel__seterr(NULL, ACCEL_ENOMEM, "nn_params_declare(%s): out of memory", name);
        return NULL;
    }
    int idx = p->sink.declare(p->sink.ctx, name, ndim, shape);
    if (idx < 0) {
        accel__free(e->name);
        accel__free(e->t);
        if (accel_last_status(NULL) == ACCEL_OK) {
            accel__seterr(NULL, (accel_status)idx, "nn_params_declare(%s): sink refused (%s)", name,
                          accel_status_name((accel_status)idx));
        }
        return NULL;
    }
    nn_tensor *t = e->t;
    t->ndim = ndim;
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->stride[d] = s;
        s *= shape[d];
    }
    t->param_index = idx;
    t->sink_ctx = p->sink.ctx;
    t->sink_declare = p->sink.declare;
    t->sink_compute = p->sink.compute;
    t->sink_materialize = p->sink.materialize;
    e->init = init;
    p->n++;
    return t;
}

accel_status nn_params_bind(nn_params *p)
{
    if (p == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_params_bind: set is NULL");
    }
    if (p->bound) {
        return accel__seterr(NULL, ACCEL_ESTATE, "nn_params_bind: already bound");
    }
    for (int i = 0; i < p->n; i++) {
        nn_tensor *t = p->v[i].t;
        float *data = NULL, *grad = NULL;
        int index = p->standalone ? i : t->param_index;
        ACCEL_TRY(p->sink.bind(p->sink.ctx, index, &data, &grad));
        if (data == NULL) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "nn_params_bind: sink gave no memory for "
                                 "'%s'",
                                 p->v[i].name);
        }
        t->data = data;
        t->grad = grad;
        t->requires_grad = grad != NULL;
        t->device_type = p->standalone ? ACCEL_DEVICE_CPU : accel__nn_sink_device(&p->sink, index);
    }
    p->bound = 1;
    return ACCEL_OK;
}

/* dst[0..n) = parameter `i`'s initial values (a pure function of seed, i and k). */
static void init_values(nn_init in, uint64_t seed, int i, float *dst, int64_t n)
{
    uint64_t key = nn__key3(seed, 0x6e6e696e6974ull /* "nninit" */, (uint64_t)i);
    for (int64_t k = 0; k < n; k++) {
        switch (in.kind) {
        case NN_INIT_ZEROS:
            dst[k] = 0.0f;
            break;
        case NN_INIT_ONES:
            dst[k] = 1.0f;
            break;
        case NN_INIT_UNIFORM:
            dst[k] = in.a * (2.0f * nn__uniform(key, (uint64_t)k) - 1.0f);
            break;
        case NN_INIT_NORMAL: {
            /* Box-Muller on two 53-bit uniforms; u1 in (0, 1] keeps the log finite. */
            double u1 = ((double)(nn__mix64(key + 2 * (uint64_t)k) >> 11) + 1.0) * 0x1p-53;
            double u2 = (double)(nn__mix64(key + 2 * (uint64_t)k + 1) >> 11) * 0x1p-53;
            double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
            dst[k] = (float)(in.a * z);
            break;
        }
        default:
            break;
        }
    }
}

accel_status nn_params_init(nn_params *p, uint64_t seed)
{
    if (p == NULL || !p->bound) {
        return accel__seterr(NULL, p ? ACCEL_ESTATE : ACCEL_EINVAL, "nn_params_init: %s",
                             p ? "bind the set first" : "set is NULL");
    }
    float *host = NULL; /* GPU parameters: the values are made here and copied over */
    accel_status st = ACCEL_OK;
    for (int i = 0; i < p->n && st == ACCEL_OK; i++) {
        nn_tensor *t = p->v[i].t;
        nn_init in = p->v[i].init;
        int64_t n = nn_numel(t);
        if (!nn__on_gpu(t)) {
            init_values(in, seed, i, t->data, n);
            continue;
        }
        if (in.kind == NN_INIT_NONE) {
            continue;
        }
        float *h = accel__realloc(host, (size_t)n * sizeof(float));
        if (h == NULL) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "nn_params_init(%s): out of memory",
                               p->v[i].name);
            break;
        }
        host = h;
        init_values(in, seed, i, host, n);
        st = accel__nn_gpu->to_device(NULL, t->data, host, (size_t)n * sizeof(float));
    }
    accel__free(host);
    return st;
}

int nn_params_count(const nn_params *p)
{
    return p ? p->n : 0;
}

nn_tensor *nn_params_get(const nn_params *p, int i)
{
    return (p && i >= 0 && i < p->n) ? p->v[i].t : NULL;
}

const char *nn_params_name(const nn_params *p, int i)
{
    return (p && i >= 0 && i < p->n) ? p->v[i].name : NULL;
}

nn_tensor *nn_params_find(const nn_params *p, const char *name)
{
    if (p == NULL || name == NULL) {
        return NULL;
    }
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->v[i].name, name) == 0) {
            return p->v[i].t;
        }
    }
    return NULL;
}

int64_t nn_params_numel(const nn_params *p)
{
    int64_t n = 0;
    for (int i = 0; p && i < p->n; i++) {
        n += nn_numel(p->v[i].t);
    }
    return n;
}

float *nn_params_flat_data(const nn_params *p, int64_t *count)
{
    if (count != NULL) {
        *count = (p && p->standalone) ? p->flat_count : 0;
    }
    return (p && p->standalone) ? p->flat_data : NULL;
}

float *nn_params_flat_grad(const nn_params *p, int64_t *count)
{
    if (count != NULL) {
        *count = (p && p->standalone) ? p->flat_count : 0;
    }
    return (p && p->standalone) ? p->flat_grad : NULL;
}

void nn_params_zero_grad(nn_params *p)
{
    for (int i = 0; p && i < p->n; i++) {
        nn_tensor *t = p->v[i].t;
        size_t nbytes = (size_t)nn_numel(t) * sizeof(float);
        if (t->grad != NULL && nn__on_gpu(t)) {
            (void)accel__nn_gpu->zero(NULL, t->grad,
                                      nbytes); /* queued; fails only on a broken GPU */
        } else if (t->grad != NULL) {
            memset(t->grad, 0, nbytes);
        }
    }
}
