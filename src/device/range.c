/*
 * Reserved address ranges (device.h): the front end that counts, per granule, how many mapped
 * byte ranges cover it, and backs granules with physical allocations of the backend (CUDA: one
 * cuMemCreate + cuMemMap + cuMemSetAccess each). A map backs the granules it needs that are not
 * backed yet with few allocations: the run of granules the byte range covers whole is one
 * allocation (no other disjoint byte range can need those), and each granule it covers only in
 * part is one of its own (a neighbour may share it, and must keep it when this range goes). An
 * allocation goes back in one piece (CUDA: cuMemUnmap of exactly what one cuMemMap mapped) when
 * no mapped byte range covers any of its granules. Invariants: head[g] is the first granule of
 * the allocation backing g (NONE when unbacked); every allocation has a granule with count > 0;
 * `mapped` is the bytes of the backed granules.
 */
#include <string.h>

#include "device_impl.h"

#define NONE ((size_t)-1)

typedef struct range_alloc {
    void *phys;        /* the backend's handle */
    size_t n_granules; /* its length */
} range_alloc;

struct accel__dev_range {
    accel__device *dev;
    char *base;
    size_t nbytes, granule, n_granules;
    size_t mapped, peak;
    size_t n_maps, n_unmaps; /* calls to the backend's map and unmap */
    unsigned *count;         /* per granule: mapped byte ranges covering it */
    size_t *head;            /* per granule: first granule of its allocation, or NONE */
    range_alloc *alloc;      /* at an allocation's first granule */
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

static void free_tables(accel__dev_range *r)
{
    accel__free(r->count);
    accel__free(r->head);
    accel__free(r->alloc);
    accel__free(r);
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
        r->head = accel__malloc(n * sizeof(*r->head));
        r->alloc = accel__calloc(n, sizeof(*r->alloc));
    }
    if (r == NULL || r->count == NULL || r->head == NULL || r->alloc == NULL) {
        if (r != NULL) {
            free_tables(r);
        }
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel__dev_range_reserve: out of memory");
    }
    for (size_t k = 0; k < n; k++) {
        r->head[k] = NONE;
    }
    r->dev = d;
    r->granule = g;
    r->n_granules = n;
    r->nbytes = n * g;
    void *base = NULL;
    accel_status st = d->ops->range_reserve(d, r->nbytes, &base);
    if (st != ACCEL_OK) {
        free_tables(r);
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

/* Backs granules [g, e) with one allocation. */
static accel_status back(accel__dev_range *r, size_t g, size_t e)
{
    void *phys = NULL;
    size_t nbytes = (e - g) * r->granule;
    ACCEL_TRY(r->dev->ops->range_map(r->dev, r->base + g * r->granule, nbytes, &phys));
    r->n_maps++;
    r->alloc[g] = (range_alloc){phys, e - g};
    for (size_t k = g; k < e; k++) {
        r->head[k] = g;
    }
    r->mapped += nbytes;
    return ACCEL_OK;
}

/* Gives back the allocation starting at granule h. */
static void drop(accel__dev_range *r, size_t h)
{
    range_alloc a = r->alloc[h];
    /* The backend reports its own failure in the thread's error; the memory is lost to this
     * range either way (CUDA cannot fail an unmap of what it mapped, short of a dead GPU). */
    (void)r->dev->ops->range_unmap(r->dev, r->base + h * r->granule, a.n_granules * r->granule,
                                   a.phys);
    r->n_unmaps++;
    for (size_t k = h; k < h + a.n_granules; k++) {
        r->head[k] = NONE;
    }
    r->alloc[h] = (range_alloc){NULL, 0};
    r->mapped -= a.n_granules * r->granule;
}

/* 1 when no mapped byte range covers a granule of the allocation starting at h. */
static int unused(const accel__dev_range *r, size_t h)
{
    for (size_t k = h; k < h + r->alloc[h].n_granules; k++) {
        if (r->count[k] > 0) {
            return 0;
        }
    }
    return 1;
}

/* Gives back the allocations touching granules [first, end) that no mapped range uses. */
static void drop_unused(accel__dev_range *r, size_t first, size_t end)
{
    for (size_t g = first; g < end;) {
        size_t h = r->head[g];
        if (h == NONE) {
            g++;
            continue;
        }
        size_t next = h + r->alloc[h].n_granules;
        if (unused(r, h)) {
            drop(r, h);
        }
        g = next;
    }
}

/* 1 when bytes [offset, offset + nbytes) cover granule k whole. */
static int whole(const accel__dev_range *r, size_t k, size_t offset, size_t nbytes)
{
    return k * r->granule >= offset && (k + 1) * r->granule <= offset + nbytes;
}

accel_status accel__dev_range_map(accel__dev_range *r, size_t offset, size_t nbytes)
{
    size_t first, end;
    ACCEL_TRY(span(r, "accel__dev_range_map", offset, nbytes, &first, &end));
    for (size_t g = first; g < end;) {
        if (r->head[g] != NONE) {
            g++;
            continue;
        }
        /* The run of unbacked granules that [offset, offset + nbytes) covers whole, or one
         * granule it covers in part. */
        size_t e = g + 1;
        if (whole(r, g, offset, nbytes)) {
            while (e < end && r->head[e] == NONE && whole(r, e, offset, nbytes)) {
                e++;
            }
        }
        accel_status st = back(r, g, e);
        if (st != ACCEL_OK) {
            drop_unused(r, first, g); /* what this call backed: nothing changes */
            return st;
        }
        g = e;
    }
    for (size_t g = first; g < end; g++) {
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
        r->count[g]--;
    }
    drop_unused(r, first, end);
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
    return offset < r->nbytes && r->head[offset / r->granule] != NONE;
}

void accel__dev_range_calls(const accel__dev_range *r, size_t *maps, size_t *unmaps)
{
    *maps = r ? r->n_maps : 0;
    *unmaps = r ? r->n_unmaps : 0;
}

void accel__dev_range_release(accel__dev_range *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t g = 0; g < r->n_granules; g++) {
        if (r->head[g] == g) {
            drop(r, g);
        }
    }
    r->dev->ops->range_release(r->dev, r->base, r->nbytes);
    free_tables(r);
}
