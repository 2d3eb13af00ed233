/*
 * Reserved address ranges (device.h): the front end that counts, per granule, how many mapped
 * byte ranges cover it, and asks the backend to map a granule when its count leaves 0 and to
 * unmap it when the count returns to 0. Each granule is one physical allocation of its own
 * (CUDA: one cuMemCreate handle), so any granule can go back alone. Invariant: handle[g] is
 * non-NULL exactly when count[g] > 0, and `mapped` is the bytes of those granules.
 */
#include <string.h>

#include "device_impl.h"

struct accel__dev_range {
    accel__device *dev;
    char *base;
    size_t nbytes, granule, n_granules;
    size_t mapped, peak;
    unsigned *count;
    void **handle;
};

accel_status accel__dev_range_granularity(accel__device *d, size_t *out)
{
    if (d == NULL || out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__dev_range_granularity: NULL argument");
    }
    if (d->ops->range_granularity == NULL) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "%s: no reserved address ranges (virtual memory mapping)",
                             d->ops->name);
    }
    return d->ops->range_granularity(d, out);
}

accel_status accel__dev_range_reserve(accel__device *d, size_t nbytes, accel__dev_range **out)
{
    size_t g = 0;
    ACCEL_TRY(accel__dev_range_granularity(d, &g));
    if (nbytes == 0 || nbytes > SIZE_MAX - g) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel__dev_range_reserve: %zu bytes", nbytes);
    }
    accel__dev_range *r = accel__calloc(1, sizeof(*r));
    size_t n = (nbytes + g - 1) / g;
    if (r != NULL) {
        r->count = accel__calloc(n, sizeof(*r->count));
        r->handle = accel__calloc(n, sizeof(*r->handle));
    }
    if (r == NULL || r->count == NULL || r->handle == NULL) {
        if (r != NULL) {
            accel__free(r->count);
            accel__free(r->handle);
        }
        accel__free(r);
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel__dev_range_reserve: out of memory");
    }
    r->dev = d;
    r->granule = g;
    r->n_granules = n;
    r->nbytes = n * g;
    void *base = NULL;
    accel_status st = d->ops->range_reserve(d, r->nbytes, &base);
    if (st != ACCEL_OK) {
        accel__free(r->count);
        accel__free(r->handle);
        accel__free(r);
        return st;
    }
    r->base = base;
    *out = r;
    return ACCEL_OK;
}

void *accel__dev_range_base(const accel__dev_range *r)
{
    return r->base;
}

/* The granules [*first, *end) covering bytes [offset, offset + nbytes). */
static accel_status span(const accel__dev_range *r, const char *who, size_t offset, size_t nbytes,
                         size_t *first, size_t *end)
{
    if (offset > r->nbytes || nbytes > r->nbytes - offset) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "%s: bytes [%zu, %zu + %zu) are past the end of the range (%zu "
                             "bytes reserved)",
                             who, offset, offset, nbytes, r->nbytes);
    }
    *first = offset / r->granule;
    *end = nbytes == 0 ? *first : (offset + nbytes + r->granule - 1) / r->granule;
    return ACCEL_OK;
}

static void unmap_granule(accel__dev_range *r, size_t g)
{
    /* The backend reports its own failure in the thread's error; the granule is lost to this
     * range either way (CUDA cannot fail an unmap of what it mapped, short of a dead GPU). */
    (void)r->dev->ops->range_unmap(r->dev, r->base + g * r->granule, r->granule, r->handle[g]);
    r->handle[g] = NULL;
    r->mapped -= r->granule;
}

accel_status accel__dev_range_map(accel__dev_range *r, size_t offset, size_t nbytes)
{
    size_t first, end;
    ACCEL_TRY(span(r, "accel__dev_range_map", offset, nbytes, &first, &end));
    for (size_t g = first; g < end; g++) {
        if (r->count[g] == 0) {
            accel_status st =
                r->dev->ops->range_map(r->dev, r->base + g * r->granule, r->granule, &r->handle[g]);
            if (st != ACCEL_OK) {
                for (size_t k = first; k < g; k++) { /* undo: nothing changes */
                    if (--r->count[k] == 0) {
                        unmap_granule(r, k);
                    }
                }
                r->handle[g] = NULL;
                return st;
            }
            r->mapped += r->granule;
        }
        r->count[g]++;
    }
    r->peak = r->mapped > r->peak ? r->mapped : r->peak;
    return ACCEL_OK;
}

accel_status accel__dev_range_unmap(accel__dev_range *r, size_t offset, size_t nbytes)
{
    size_t first, end;
    ACCEL_TRY(span(r, "accel__dev_range_unmap", offset, nbytes, &first, &end));
    for (size_t g = first; g < end; g++) {
        if (r->count[g] == 0) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel__dev_range_unmap: bytes [%zu, %zu + %zu) were not mapped "
                                 "(granule %zu)",
                                 offset, offset, nbytes, g);
        }
    }
    for (size_t g = first; g < end; g++) {
        if (--r->count[g] == 0) {
            unmap_granule(r, g);
        }
    }
    return ACCEL_OK;
}

size_t accel__dev_range_mapped(const accel__dev_range *r)
{
    return r ? r->mapped : 0;
}

size_t accel__dev_range_peak(const accel__dev_range *r)
{
    return r ? r->peak : 0;
}

void accel__dev_range_reset_peak(accel__dev_range *r)
{
    r->peak = r->mapped;
}

int accel__dev_range_is_mapped(const accel__dev_range *r, size_t offset)
{
    return offset < r->nbytes && r->count[offset / r->granule] > 0;
}

void accel__dev_range_release(accel__dev_range *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t g = 0; g < r->n_granules; g++) {
        if (r->count[g] > 0) {
            unmap_granule(r, g);
        }
    }
    r->dev->ops->range_release(r->dev, r->base, r->nbytes);
    accel__free(r->count);
    accel__free(r->handle);
    accel__free(r);
}
