/*
 * Scratch buffers of samples and batches, and the default collate (stack, or pad along dim 0
 * to the longest sample with a per-field value). Buffers only grow, so once the largest batch
 * has been seen no allocation happens per batch. Invariant: a batch's field j data lives in its
 * bufset buf[j]; the batch struct never owns anything else.
 */
#include <stdint.h>
#include <string.h>

#include "base/half.h"
#include "data_internal.h"

void *accel__bufset_get(accel__bufset *s, int field, size_t nbytes)
{
    if (s == NULL || field < 0 || field >= ACCEL_MAX_FIELDS) {
        return NULL;
    }
    if (nbytes == 0) {
        nbytes = 1;
    }
    if (s->cap[field] < nbytes) {
        if (nbytes > SIZE_MAX / 4) {
            return NULL; /* no allocator has it; doubling towards it would wrap to 0 forever */
        }
        size_t ncap = s->cap[field] > 0 ? s->cap[field] : 64;
        while (ncap < nbytes) {
            ncap *= 2;
        }
        void *nb = accel__aligned_alloc(ncap);
        if (nb == NULL) {
            return NULL;
        }
        accel__aligned_free(s->buf[field]); /* the old contents are scratch: not kept */
        s->buf[field] = nb;
        s->cap[field] = ncap;
    }
    return s->buf[field];
}

void accel__bufset_free(accel__bufset *s)
{
    if (s == NULL) {
        return;
    }
    for (int i = 0; i < ACCEL_MAX_FIELDS; i++) {
        accel__aligned_free(s->buf[i]);
    }
    accel__free(s->indices);
    accel__free(s);
}

/* Scratch of a sample or batch, with the reason when there is none. */
static void *scratch(const char *who, void *priv, int field, size_t nbytes)
{
    if (priv == NULL) {
        accel__seterr(NULL, ACCEL_EINVAL,
                      "%s: the %s has no scratch memory (it was not given by a loader)", who,
                      strstr(who, "sample") ? "sample" : "batch");
        return NULL;
    }
    if (field < 0 || field >= ACCEL_MAX_FIELDS) {
        accel__seterr(NULL, ACCEL_EINVAL, "%s: field %d out of range (0..%d)", who, field,
                      ACCEL_MAX_FIELDS - 1);
        return NULL;
    }
    void *p = accel__bufset_get(priv, field, nbytes);
    if (p == NULL) {
        accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory for %zu bytes", who, nbytes);
    }
    return p;
}

void *accel_sample_scratch(accel_sample *s, int field, size_t nbytes)
{
    return scratch("accel_sample_scratch", s ? s->priv : NULL, field, nbytes);
}

void *accel_batch_scratch(accel_batch *b, int field, size_t nbytes)
{
    return scratch("accel_batch_scratch", b ? b->priv : NULL, field, nbytes);
}

const accel_tensor *accel_batch_field(const accel_batch *b, const char *name)
{
    if (b == NULL || name == NULL) {
        return NULL;
    }
    for (int i = 0; i < b->n_fields; i++) {
        if (b->name[i] != NULL && strcmp(b->name[i], name) == 0) {
            return &b->field[i];
        }
    }
    return NULL;
}

accel_status accel__samples_init(accel_sample *s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        s[i].priv = accel__calloc(1, sizeof(accel__bufset));
        if (s[i].priv == NULL) {
            accel__samples_free(s, i);
            return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for samples");
        }
    }
    return ACCEL_OK;
}

void accel__samples_free(accel_sample *s, int64_t n)
{
    for (int64_t i = 0; s != NULL && i < n; i++) {
        accel__bufset_free(s[i].priv);
        s[i].priv = NULL;
    }
}

accel_status accel__batch_init(accel_batch *b)
{
    memset(b, 0, sizeof(*b));
    b->priv = accel__calloc(1, sizeof(accel__bufset));
    if (b->priv == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for a batch");
    }
    return ACCEL_OK;
}

accel_status accel__batch_check(const accel_batch *b)
{
    if (b->n_fields < 0 || b->n_fields > ACCEL_MAX_FIELDS) {
        return accel__seterr(NULL, ACCEL_EINVAL, "the batch has %d fields (0..%d)", b->n_fields,
                             ACCEL_MAX_FIELDS);
    }
    for (int f = 0; f < b->n_fields; f++) {
        const accel_tensor *t = &b->field[f];
        int ok = accel_dtype_bits(t->dtype) > 0 && t->ndim >= 0 && t->ndim <= ACCEL_MAX_DIMS;
        uint64_t elems = 1;
        for (int d = 0; ok && d < t->ndim; d++) {
            ok = t->shape[d] >= 0 && !__builtin_mul_overflow(elems, (uint64_t)t->shape[d], &elems);
        }
        ok = ok && elems <= SIZE_MAX / 8 && (elems == 0 || t->data != NULL);
        if (!ok) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "field %d (\"%s\") of the batch has an invalid dtype, rank or "
                                 "shape, or NULL data",
                                 f, b->name[f] != NULL ? b->name[f] : "?");
        }
    }
    return ACCEL_OK;
}

void accel__batch_free(accel_batch *b)
{
    if (b != NULL) {
        accel__bufset_free(b->priv);
        b->priv = NULL;
    }
}

void accel__fill_value(void *dst, accel_dtype dt, double v, int64_t count)
{
    size_t es = accel_dtype_nbytes(dt);
    unsigned char one[8] = {0};
    /* accel_convert's rules (saturating integers, RNE floats); C64, which has no conversion
     * from a real, pads with zero bytes. */
    if (dt != ACCEL_C64) {
        (void)accel_convert(one, dt, &v, ACCEL_F64, 1);
    }
    unsigned char *d = dst;
    for (int64_t i = 0; i < count; i++) {
        memcpy(d + (size_t)i * es, one, es);
    }
}

static int pad_of(const accel__padset *pad, const char *name, double *value)
{
    for (int i = 0; pad != NULL && i < pad->n; i++) {
        if (name != NULL && strcmp(pad->field[i], name) == 0) {
            *value = pad->value[i];
            return 1;
        }
    }
    return 0;
}

static long long sample_id(const int64_t *indices, int64_t i)
{
    return indices != NULL ? (long long)indices[i] : (long long)i;
}

accel_status accel__collate_default(const accel__padset *pad, const accel_sample *samples,
                                    int64_t n, const int64_t *indices, accel_batch *out)
{
    const accel_sample *s0 = &samples[0];
    const char *what = indices != NULL ? "index" : "position";
    if (s0->n_fields < 1 || s0->n_fields > ACCEL_MAX_FIELDS) {
        return accel__seterr(NULL, ACCEL_EINVAL, "collate: sample %s %lld has %d fields (1..%d)",
                             what, sample_id(indices, 0), s0->n_fields, ACCEL_MAX_FIELDS);
    }
    out->n_fields = s0->n_fields;
    for (int f = 0; f < s0->n_fields; f++) {
        const accel_tensor *t0 = &s0->field[f];
        size_t es = accel_dtype_nbytes(t0->dtype);
        if (es == 0 || t0->ndim < 0 || t0->ndim >= ACCEL_MAX_DIMS) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "collate: field \"%s\" of sample %s %lld has an invalid dtype "
                                 "or rank",
                                 s0->name[f] ? s0->name[f] : "?", what, sample_id(indices, 0));
        }
        /* What the copy below trusts, for every sample: a dataset's callback is input. */
        for (int64_t i = 0; i < n; i++) {
            const accel_tensor *t = &samples[i].field[f];
            const char *bad = NULL;
            uint64_t elems = 1;
            for (int d = 0; d < t->ndim && d < ACCEL_MAX_DIMS && bad == NULL; d++) {
                if (t->shape[d] < 0) {
                    bad = "a negative dimension";
                } else if (__builtin_mul_overflow(elems, (uint64_t)t->shape[d], &elems) ||
                           elems > SIZE_MAX / 8 / (uint64_t)n) {
                    bad = "a size that overflows";
                }
            }
            if (bad == NULL && elems > 0 && t->data == NULL) {
                bad = "NULL data";
            }
            if (bad != NULL) {
                return accel__seterr(
                    NULL, ACCEL_EINVAL, "collate: field \"%s\" of sample %s %lld has %s",
                    s0->name[f] ? s0->name[f] : "?", what, sample_id(indices, i), bad);
            }
        }
        double pv = 0;
        int padded = pad_of(pad, s0->name[f], &pv) && t0->ndim >= 1;
        /* Validate every sample against the first and find the longest dim 0. */
        int64_t maxlen = t0->ndim >= 1 ? t0->shape[0] : 1;
        for (int64_t i = 1; i < n; i++) {
            const accel_sample *s = &samples[i];
            const accel_tensor *t = &s->field[f];
            int same_name =
                (s->name[f] == s0->name[f]) ||
                (s->name[f] != NULL && s0->name[f] != NULL && strcmp(s->name[f], s0->name[f]) == 0);
            if (s->n_fields != s0->n_fields || !same_name) {
                return accel__seterr(NULL, ACCEL_EINVAL,
                                     "collate: sample %s %lld has different fields than sample "
                                     "%s %lld",
                                     what, sample_id(indices, i), what, sample_id(indices, 0));
            }
            int shape_ok = t->dtype == t0->dtype && t->ndim == t0->ndim;
            for (int d = padded ? 1 : 0; shape_ok && d < t0->ndim; d++) {
                shape_ok = t->shape[d] == t0->shape[d];
            }
            if (!shape_ok) {
                return accel__seterr(
                    NULL, ACCEL_EINVAL,
                    "collate: field \"%s\" of sample %s %lld differs in %s from sample %s %lld%s",
                    s0->name[f] ? s0->name[f] : "?", what, sample_id(indices, i),
                    t->dtype != t0->dtype ? "dtype" : "shape", what, sample_id(indices, 0),
                    padded || t->dtype != t0->dtype ? ""
                                                    : " (give the field a pad value to pad it)");
            }
            if (padded && t->shape[0] > maxlen) {
                maxlen = t->shape[0];
            }
        }
        int64_t row_elems = 1; /* elements per unit of dim 0 */
        for (int d = 1; d < t0->ndim; d++) {
            row_elems *= t0->shape[d];
        }
        int64_t per_sample = t0->ndim >= 1 ? maxlen * row_elems : 1;
        size_t sample_nbytes = (size_t)per_sample * es;
        unsigned char *dst = accel_batch_scratch(out, f, sample_nbytes * (size_t)n);
        if (dst == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "collate: out of memory for field \"%s\"",
                                 s0->name[f] ? s0->name[f] : "?");
        }
        for (int64_t i = 0; i < n; i++) {
            const accel_tensor *t = &samples[i].field[f];
            size_t have = (size_t)accel_tensor_nbytes(t);
            if (have > 0) {
                memcpy(dst + (size_t)i * sample_nbytes, t->data, have);
            }
            if (have < sample_nbytes) {
                accel__fill_value(dst + (size_t)i * sample_nbytes + have, t0->dtype, pv,
                                  (int64_t)((sample_nbytes - have) / es));
            }
        }
        accel_tensor *o = &out->field[f];
        o->data = dst;
        o->dtype = t0->dtype;
        o->device = t0->device;
        o->ndim = t0->ndim + 1;
        o->shape[0] = n;
        for (int d = 0; d < t0->ndim; d++) {
            o->shape[d + 1] = t0->shape[d];
        }
        if (t0->ndim >= 1) {
            o->shape[1] = maxlen;
        }
        out->name[f] = s0->name[f];
    }
    out->rows = n;
    return ACCEL_OK;
}
