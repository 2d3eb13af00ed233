/*
 * User-level collectives (Accelerate's gather, gather_object, reduce, broadcast,
 * broadcast_object, pad_across_processes, split_between_processes, set/check_trigger), built
 * only on the public buffer collectives of collectives.h.
 *
 * Invariant: every decision that could make processes disagree on the collectives to issue
 * (a shape mismatch, an empty blob) is taken from data all processes have exchanged, so either
 * every process runs the same sequence of buffer collectives or every process fails with the
 * same ACCEL_EINVAL. Nothing here can leave one process waiting on a collective that the others
 * skipped.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "accel/collectives.h"
#include "base/half.h"
#include "core/internal.h"

/* ---- shape descriptors: what the processes compare before exchanging tensor bytes ---- */

/* One process's (dtype, ndim, shape) as int64s, so it travels through one I64 allgather. */
#define DESC_LEN (2 + ACCEL_MAX_DIMS)

static void desc_fill(int64_t *d, const accel_tensor *t)
{
    memset(d, 0, DESC_LEN * sizeof *d);
    d[0] = (int64_t)t->dtype;
    d[1] = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        d[2 + i] = t->shape[i];
    }
}

/* "F32[3, 4]" into buf. */
static const char *desc_str(const int64_t *d, char *buf, size_t nbytes)
{
    const char *name = accel_dtype_name((accel_dtype)d[0]);
    int n = snprintf(buf, nbytes, "%s[", name ? name : "?");
    for (int i = 0; i < d[1] && n > 0 && (size_t)n < nbytes; i++) {
        n += snprintf(buf + n, nbytes - (size_t)n, "%s%" PRId64, i ? ", " : "", d[2 + i]);
    }
    if (n > 0 && (size_t)n < nbytes) {
        snprintf(buf + n, nbytes - (size_t)n, "]");
    }
    return buf;
}

/* Validates a tensor argument: known dtype, ndim in range, non-negative dims, data present
 * whenever there are bytes. `fn` and `arg` name the call and argument in the message. */
static accel_status check_tensor(accel *acc, const char *fn, const char *arg, const accel_tensor *t)
{
    if (t == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: %s is NULL", fn, arg);
    }
    if (accel_dtype_bits(t->dtype) == 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: %s->dtype %d is not a dtype", fn, arg,
                             (int)t->dtype);
    }
    if (accel_dtype_nbytes(t->dtype) == 0) {
        return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                             "%s: %s is %s, a packed sub-byte dtype; collectives need whole-byte "
                             "elements",
                             fn, arg, accel_dtype_name(t->dtype));
    }
    if (t->ndim < 0 || t->ndim > ACCEL_MAX_DIMS) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: %s->ndim %d is outside [0, %d]", fn, arg,
                             t->ndim, ACCEL_MAX_DIMS);
    }
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) {
            return accel__seterr(acc, ACCEL_EINVAL, "%s: %s->shape[%d] is negative (%" PRId64 ")",
                                 fn, arg, i, t->shape[i]);
        }
    }
    if (t->data == NULL && accel_tensor_nbytes(t) > 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: %s->data is NULL", fn, arg);
    }
    return ACCEL_OK;
}

static accel_status check_acc(accel *acc, const char *fn)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: acc is NULL", fn);
    }
    return ACCEL_OK;
}

/* Lockstep success check before a large exchange: every process learns whether all of them
 * could prepare (allocate) and, if not, all fail with the same status instead of some waiting
 * in a collective the others never enter. */
static accel_status agree(accel *acc, int ok, const char *fn, const char *what)
{
    int32_t all_ok = ok ? 1 : 0;
    ACCEL_TRY(accel_allreduce(acc, &all_ok, &all_ok, 1, ACCEL_I32, ACCEL_MIN, NULL));
    if (!all_ok) {
        return accel__seterr(acc, ACCEL_ENOMEM, "%s: %s could not be allocated on %s", fn, what,
                             ok ? "another process" : "this process");
    }
    return ACCEL_OK;
}

/* Gathers `each` bytes from every process into all[rank * each ...] on every process. `mine`
 * may alias its own slot. */
static accel_status allgather_bytes(accel *acc, const void *mine, void *all, size_t each)
{
    unsigned char *slot = (unsigned char *)all + (size_t)acc->rank * each;
    if (each > 0 && slot != mine) {
        memcpy(slot, mine, each);
    }
    return accel_allgather(acc, slot, all, each * (size_t)acc->n_ranks, ACCEL_U8, NULL);
}

/*
 * Exchanges shape descriptors. On return descs holds n_ranks * DESC_LEN int64s. When
 * `skip_dim` >= 0 that dim may differ (pad_across_processes); everything else must match the
 * descriptor of process 0, else every process returns the same EINVAL.
 */
static accel_status exchange_descs(accel *acc, const char *fn, const accel_tensor *t, int skip_dim,
                                   int64_t **descs_out)
{
    int n = acc->n_ranks;
    int64_t *descs = accel__malloc((size_t)n * DESC_LEN * sizeof *descs);
    if (descs == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "%s: out of memory for shape exchange", fn);
    }
    int64_t mine[DESC_LEN];
    desc_fill(mine, t);
    accel_status st = allgather_bytes(acc, mine, descs, sizeof mine);
    if (st != ACCEL_OK) {
        accel__free(descs);
        return st;
    }
    int bad = -1;
    for (int r = 1; r < n && bad < 0; r++) {
        for (int k = 0; k < DESC_LEN; k++) {
            if (k != 2 + skip_dim && descs[r * DESC_LEN + k] != descs[k]) {
                bad = r;
                break;
            }
        }
    }
    if (bad >= 0) {
        char a[160], b[160];
        if (acc->opt.debug) {
            /* Debug mode lists every process, as Accelerate's DistributedOperationException. */
            char all[1024];
            size_t used = 0;
            all[0] = '\0';
            for (int r = 0; r < n && used < sizeof all; r++) {
                int w = snprintf(all + used, sizeof all - used, "%sprocess %d: %s", r ? "; " : "",
                                 r, desc_str(descs + r * DESC_LEN, a, sizeof a));
                used += w > 0 ? (size_t)w : 0;
            }
            st = accel__seterr(acc, ACCEL_EINVAL, "%s: tensors differ across processes (%s)", fn,
                               all);
        } else {
            st = accel__seterr(acc, ACCEL_EINVAL,
                               "%s: process %d passed %s but process 0 passed %s; every process "
                               "must pass the same dtype and shape%s",
                               fn, bad, desc_str(descs + bad * DESC_LEN, a, sizeof a),
                               desc_str(descs, b, sizeof b),
                               skip_dim >= 0 ? " (except along the padded dim)" : "");
        }
        accel__free(descs);
        return st;
    }
    *descs_out = descs;
    return ACCEL_OK;
}

/* Debug-mode-only variant for reduce and broadcast, where the check costs a collective. */
static accel_status debug_check_same(accel *acc, const char *fn, const accel_tensor *t)
{
    if (!acc->opt.debug) {
        return ACCEL_OK;
    }
    int64_t *descs = NULL;
    ACCEL_TRY(exchange_descs(acc, fn, t, -1, &descs));
    accel__free(descs);
    return ACCEL_OK;
}

/* ---- gather ---- */

accel_status accel_gather(accel *acc, const accel_tensor *in, accel_tensor *out)
{
    ACCEL_TRY(check_acc(acc, "accel_gather"));
    ACCEL_TRY(check_tensor(acc, "accel_gather", "in", in));
    if (out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_gather: out is NULL");
    }
    size_t nbytes = accel_tensor_nbytes(in);
    if (out->data == NULL && nbytes > 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_gather: out->data is NULL");
    }
    /* Always compare shapes first: a mismatch would otherwise garble or hang the exchange, the
     * most reported Accelerate gather bug, and the check costs one tiny allgather. */
    int64_t *descs = NULL;
    ACCEL_TRY(exchange_descs(acc, "accel_gather", in, -1, &descs));
    accel__free(descs);

    ACCEL_TRY(
        accel_allgather(acc, in->data, out->data, nbytes * (size_t)acc->n_ranks, ACCEL_U8, NULL));
    accel_tensor r = *in;
    r.data = out->data;
    if (r.ndim == 0) {
        r.ndim = 1;
        r.shape[0] = 1;
    }
    r.shape[0] *= acc->n_ranks;
    *out = r;
    return ACCEL_OK;
}

/* ---- gather_object ---- */

struct accel_blobs {
    int count;
    size_t stride;  /* bytes between consecutive blobs in data */
    size_t *nbytes; /* count sizes */
    unsigned char *data;
};

/* Blobs are stored at a stride rounded up to this, so each one is aligned for any struct. */
#define BLOB_ALIGN 16

accel_status accel_gather_object(accel *acc, const void *blob, size_t nbytes, accel_blobs **out)
{
    ACCEL_TRY(check_acc(acc, "accel_gather_object"));
    if (out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_gather_object: out is NULL");
    }
    if (blob == NULL && nbytes > 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_gather_object: blob is NULL but nbytes is %zu", nbytes);
    }
    int n = acc->n_ranks;
    accel_status st = ACCEL_OK;
    accel_blobs *b = accel__calloc(1, sizeof *b);
    int64_t *sizes = accel__calloc((size_t)n, sizeof *sizes);
    if (b == NULL || sizes == NULL) {
        st = accel__seterr(acc, ACCEL_ENOMEM, "accel_gather_object: out of memory");
        goto fail;
    }
    int64_t my_size = (int64_t)nbytes;
    ACCEL_TRY_GOTO(allgather_bytes(acc, &my_size, sizes, sizeof my_size), st, fail);

    /* Every process now knows every size, so all pick the same stride: pad each blob to the
     * largest and exchange them with one equal-chunk allgather. */
    int64_t max = 0;
    for (int r = 0; r < n; r++) {
        max = sizes[r] > max ? sizes[r] : max;
    }
    size_t stride = ((size_t)max + BLOB_ALIGN - 1) / BLOB_ALIGN * BLOB_ALIGN;
    if (max < 0 || stride > SIZE_MAX / (size_t)n / 2) {
        st = accel__seterr(acc, ACCEL_EINVAL,
                           "accel_gather_object: blobs too large (%" PRId64
                           " bytes each on %d processes)",
                           max, n);
        goto fail;
    }
    b->count = n;
    b->stride = stride;
    b->nbytes = accel__malloc((size_t)n * sizeof *b->nbytes);
    b->data = accel__aligned_alloc(stride > 0 ? stride * (size_t)n : BLOB_ALIGN);
    /* The receive buffer can be large: agree on success first, so one process running out of
     * memory fails all of them instead of leaving them in the allgather. */
    ACCEL_TRY_GOTO(agree(acc, b->nbytes != NULL && b->data != NULL, "accel_gather_object",
                         "memory for the gathered blobs"),
                   st, fail);
    for (int r = 0; r < n; r++) {
        b->nbytes[r] = (size_t)sizes[r];
    }
    unsigned char *slot = b->data + (size_t)acc->rank * b->stride;
    if (nbytes > 0) {
        memcpy(slot, blob, nbytes);
    }
    memset(slot + nbytes, 0, b->stride - nbytes); /* no uninitialised bytes on the wire */
    if (stride > 0) {
        ACCEL_TRY_GOTO(allgather_bytes(acc, slot, b->data, b->stride), st, fail);
    }
    accel__free(sizes);
    *out = b;
    return ACCEL_OK;
fail:
    accel__free(sizes);
    accel_blobs_free(b);
    return st;
}

int accel_blobs_count(const accel_blobs *b)
{
    return b ? b->count : 0;
}

const void *accel_blobs_data(const accel_blobs *b, int i, size_t *nbytes)
{
    if (b == NULL || i < 0 || i >= b->count) {
        return NULL;
    }
    if (nbytes != NULL) {
        *nbytes = b->nbytes[i];
    }
    return b->data + (size_t)i * b->stride;
}

void accel_blobs_free(accel_blobs *b)
{
    if (b == NULL) {
        return;
    }
    accel__free(b->nbytes);
    accel__aligned_free(b->data);
    accel__free(b);
}

/* ---- reduce ---- */

/* t *= scale for a float dtype, computed in double and rounded once to the dtype. */
static void scale_floats(accel_tensor *t, double scale)
{
    size_t n = (size_t)accel_tensor_numel(t);
    switch (t->dtype) {
    case ACCEL_F32: {
        float *p = t->data;
        for (size_t i = 0; i < n; i++) {
            p[i] = (float)((double)p[i] * scale);
        }
        break;
    }
    case ACCEL_F64: {
        double *p = t->data;
        for (size_t i = 0; i < n; i++) {
            p[i] *= scale;
        }
        break;
    }
    case ACCEL_F16: {
        uint16_t *p = t->data;
        for (size_t i = 0; i < n; i++) {
            p[i] = accel__f32_to_f16((float)((double)accel__f16_to_f32(p[i]) * scale));
        }
        break;
    }
    case ACCEL_BF16: {
        uint16_t *p = t->data;
        for (size_t i = 0; i < n; i++) {
            p[i] = accel__f32_to_bf16((float)((double)accel__bf16_to_f32(p[i]) * scale));
        }
        break;
    }
    case ACCEL_F8_E4M3: {
        uint8_t *p = t->data;
        for (size_t i = 0; i < n; i++) {
            p[i] = accel__f32_to_f8e4m3((float)((double)accel__f8e4m3_to_f32(p[i]) * scale));
        }
        break;
    }
    case ACCEL_F8_E5M2: {
        uint8_t *p = t->data;
        for (size_t i = 0; i < n; i++) {
            p[i] = accel__f32_to_f8e5m2((float)((double)accel__f8e5m2_to_f32(p[i]) * scale));
        }
        break;
    }
    default:
        ACCEL_ASSERT(0 && "scale_floats called for an integer dtype");
    }
}

accel_status accel_allreduce_tensor(accel *acc, accel_tensor *t, accel_reduce_op op, double scale)
{
    ACCEL_TRY(check_acc(acc, "accel_allreduce_tensor"));
    ACCEL_TRY(check_tensor(acc, "accel_allreduce_tensor", "t", t));
    if ((int)op < (int)ACCEL_SUM || (int)op > (int)ACCEL_PROD) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_allreduce_tensor: op %d is not a reduce op",
                             (int)op);
    }
    if (scale != 1.0 && !accel_dtype_is_float(t->dtype)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_allreduce_tensor: scale %g needs a float dtype, t is %s", scale,
                             accel_dtype_name(t->dtype));
    }
    ACCEL_TRY(debug_check_same(acc, "accel_allreduce_tensor", t));
    size_t count = (size_t)accel_tensor_numel(t);
    ACCEL_TRY(accel_allreduce(acc, t->data, t->data, count, t->dtype, op, NULL));
    if (scale != 1.0) {
        scale_floats(t, scale);
    }
    return ACCEL_OK;
}

/* ---- broadcast ---- */

static accel_status check_root(accel *acc, const char *fn, int from_process)
{
    if (from_process < 0 || from_process >= acc->n_ranks) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: from_process %d is outside [0, %d)", fn,
                             from_process, acc->n_ranks);
    }
    return ACCEL_OK;
}

accel_status accel_broadcast_tensor(accel *acc, accel_tensor *t, int from_process)
{
    ACCEL_TRY(check_acc(acc, "accel_broadcast_tensor"));
    ACCEL_TRY(check_tensor(acc, "accel_broadcast_tensor", "t", t));
    ACCEL_TRY(check_root(acc, "accel_broadcast_tensor", from_process));
    ACCEL_TRY(debug_check_same(acc, "accel_broadcast_tensor", t));
    return accel_broadcast(acc, t->data, t->data, accel_tensor_nbytes(t), ACCEL_U8, from_process,
                           NULL);
}

accel_status accel_broadcast_object(accel *acc, void **blob, size_t *nbytes, int from_process)
{
    ACCEL_TRY(check_acc(acc, "accel_broadcast_object"));
    if (blob == NULL || nbytes == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_broadcast_object: %s is NULL",
                             blob == NULL ? "blob" : "nbytes");
    }
    ACCEL_TRY(check_root(acc, "accel_broadcast_object", from_process));
    int root = acc->rank == from_process;
    /* The root's pointer is validated but the size still goes out first: a root that fails
     * validation after others entered the size broadcast would leave them hanging. */
    int64_t size = root ? (int64_t)*nbytes : 0;
    if (root && ((*blob == NULL && size > 0) || size < 0)) {
        size = -1; /* tells everyone the root's arguments are bad */
    }
    ACCEL_TRY(accel_broadcast(acc, &size, &size, 1, ACCEL_I64, from_process, NULL));
    if (size < 0) {
        return accel__seterr(
            acc, ACCEL_EINVAL,
            "accel_broadcast_object: process %d passed a NULL blob with nbytes > 0", from_process);
    }
    if (root) {
        ACCEL_TRY(agree(acc, 1, "accel_broadcast_object", "memory for the blob"));
        return size > 0
                   ? accel_broadcast(acc, *blob, *blob, (size_t)size, ACCEL_U8, from_process, NULL)
                   : ACCEL_OK;
    }
    void *copy = accel__malloc(size > 0 ? (size_t)size : 1);
    accel_status st = agree(acc, copy != NULL, "accel_broadcast_object", "memory for the blob");
    if (st != ACCEL_OK) {
        accel__free(copy);
        return st;
    }
    if (size > 0) {
        st = accel_broadcast(acc, copy, copy, (size_t)size, ACCEL_U8, from_process, NULL);
        if (st != ACCEL_OK) {
            accel__free(copy);
            return st;
        }
    }
    *blob = copy;
    *nbytes = (size_t)size;
    return ACCEL_OK;
}

void accel_blob_free(void *blob)
{
    accel__free(blob);
}

/* ---- pad_across_processes ---- */

static accel_status pad_prepare(accel *acc, const char *fn, const accel_tensor *in, int *dim,
                                int64_t *max_size)
{
    ACCEL_TRY(check_acc(acc, fn));
    ACCEL_TRY(check_tensor(acc, fn, "in", in));
    int d = *dim < 0 ? *dim + in->ndim : *dim;
    if (d < 0 || d >= in->ndim) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: dim %d is out of range for a %d-d tensor", fn,
                             *dim, in->ndim);
    }
    /* The descriptor exchange yields the maximum and rejects tensors that differ elsewhere
     * (which would make the padded gathers that usually follow fail anyway). */
    int64_t *descs = NULL;
    ACCEL_TRY(exchange_descs(acc, fn, in, d, &descs));
    int64_t max = 0;
    for (int r = 0; r < acc->n_ranks; r++) {
        max = descs[r * DESC_LEN + 2 + d] > max ? descs[r * DESC_LEN + 2 + d] : max;
    }
    accel__free(descs);
    *dim = d;
    *max_size = max;
    return ACCEL_OK;
}

accel_status accel_pad_across_processes_size(accel *acc, const accel_tensor *in, int dim,
                                             int64_t *max_size)
{
    if (max_size == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_pad_across_processes_size: max_size is NULL");
    }
    return pad_prepare(acc, "accel_pad_across_processes_size", in, &dim, max_size);
}

accel_status accel_pad_across_processes(accel *acc, const accel_tensor *in, int dim,
                                        const void *pad_value, int pad_first, accel_tensor *out)
{
    const char *fn = "accel_pad_across_processes";
    if (out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: out is NULL", fn);
    }
    int64_t max = 0;
    ACCEL_TRY(pad_prepare(acc, fn, in, &dim, &max));
    accel_tensor r = *in;
    r.shape[dim] = max;
    size_t out_nbytes = accel_tensor_nbytes(&r);
    if (out->data == NULL && out_nbytes > 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: out->data is NULL", fn);
    }
    r.data = out->data;

    /* View the tensor as [outer, rows, inner]: each of the `outer` slabs gets its rows copied
     * and (max - rows) pad rows before or after them. */
    size_t esize = accel_dtype_nbytes(in->dtype);
    size_t outer = 1, inner = esize;
    for (int i = 0; i < dim; i++) {
        outer *= (size_t)in->shape[i];
    }
    for (int i = dim + 1; i < in->ndim; i++) {
        inner *= (size_t)in->shape[i];
    }
    size_t rows = (size_t)in->shape[dim], pad_rows = (size_t)max - rows;
    const unsigned char *src = in->data;
    unsigned char *dst = out->data;
    static const unsigned char zero[8];
    const unsigned char *pv = pad_value ? pad_value : zero;
    for (size_t o = 0; o < outer; o++) {
        unsigned char *slab = dst + o * (size_t)max * inner;
        unsigned char *data_at = slab + (pad_first ? pad_rows * inner : 0);
        unsigned char *pad_at = slab + (pad_first ? 0 : rows * inner);
        memcpy(data_at, src + o * rows * inner, rows * inner);
        for (size_t k = 0; k < pad_rows * inner; k += esize) {
            memcpy(pad_at + k, pv, esize);
        }
    }
    *out = r;
    return ACCEL_OK;
}

/* ---- split_between_processes ---- */

accel_status accel_split_between_processes(const accel *acc, size_t n_items, int apply_padding,
                                           size_t *start, size_t *count, size_t *n_padding)
{
    const char *fn = "accel_split_between_processes";
    if (acc == NULL || start == NULL || count == NULL) {
        return accel__seterr((accel *)acc, ACCEL_EINVAL, "%s: %s is NULL", fn,
                             acc == NULL     ? "acc"
                             : start == NULL ? "start"
                                             : "count");
    }
    size_t n = (size_t)acc->n_ranks, p = (size_t)acc->rank;
    size_t q = n_items / n, r = n_items % n;
    *start = p * q + (p < r ? p : r);
    *count = q + (p < r ? 1 : 0);
    if (n_padding != NULL) {
        /* Accelerate pads every process to q + (r > 0) items; with no items there is no last
         * item to repeat and nothing to pad. */
        *n_padding = apply_padding ? q + (r > 0 ? 1 : 0) - *count : 0;
    }
    return ACCEL_OK;
}

/* ---- triggers ---- */

typedef struct coll_state {
    int32_t trigger; /* this process's raised flag */
} coll_state;

static void coll_state_free(accel *acc, void *state)
{
    (void)acc;
    accel__free(state);
}

static coll_state *get_state(accel *acc)
{
    coll_state *s = accel__module(acc, ACCEL__MOD_COLL);
    if (s == NULL) {
        s = accel__calloc(1, sizeof *s);
        if (s != NULL) {
            accel__module_set(acc, ACCEL__MOD_COLL, s, coll_state_free);
        }
    }
    return s;
}

accel_status accel_set_trigger(accel *acc)
{
    ACCEL_TRY(check_acc(acc, "accel_set_trigger"));
    coll_state *s = get_state(acc);
    if (s == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_set_trigger: out of memory");
    }
    s->trigger = 1;
    return ACCEL_OK;
}

accel_status accel_check_trigger(accel *acc, int *triggered)
{
    ACCEL_TRY(check_acc(acc, "accel_check_trigger"));
    if (triggered == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_check_trigger: triggered is NULL");
    }
    /* A process without state has never raised its flag; it still joins the all-reduce. */
    coll_state *s = accel__module(acc, ACCEL__MOD_COLL);
    int32_t flag = s ? s->trigger : 0;
    ACCEL_TRY(accel_allreduce(acc, &flag, &flag, 1, ACCEL_I32, ACCEL_MAX, NULL));
    if (flag && s != NULL) {
        s->trigger = 0;
    }
    *triggered = flag != 0;
    return ACCEL_OK;
}
