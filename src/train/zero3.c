/*
 * ZeRO stage 3 (FSDP FULL_SHARD): parameters sharded too. Each process keeps only its shard of
 * the fp32 master; the full-size flat weights that parameters view (and the compute copy under
 * mixed precision) are page buffers (base/pages.c) in which units are gathered on demand,
 * before an op reads them, forward and backward (accel_model_materialize, which nn calls
 * through its param sink), and released after. A unit is one bucket of the geometry (built by
 * accel__flat_build_units), so its gather is one equal-count allgather of the owners' pieces
 * and its gradients one reduce-scatter.
 *
 * Stages 1-2 under mixed precision with several processes (master_shard) use the same unit
 * machinery with the size-based buckets as units: the fp32 master is the shard too, the full
 * compute copy (bf16 / fp16) is what every process keeps, and "gathering" a unit widens its
 * compute copy into the fp32 weight pages (no communication): nn's fp32 reads of parameters
 * (layer norm, embedding, bias adds) then see exactly the values the model computes with, as
 * DeepSpeed's bf16 model does.
 *
 * With the model in device memory (stage 3 only) the full weights and the compute copy are
 * reserved address ranges (device.h: CUDA virtual memory) instead of pages: a unit's gather
 * maps physical memory under its bytes first, then all-gathers into it (in place on the
 * compute stream on a device communicator; through a pinned buffer of one unit otherwise;
 * with one process, a copy of the shard on the compute stream). A unit leaving the window is not
 * unmapped at once: work queued on the compute stream may still read it, so it records an event
 * there and stays mapped ("deferred") until the event has completed (queried without waiting at the
 * next unit change), and the host waits for the event only when mapping another unit would exceed
 * Z3_MAX_MAPPED units (the GPU is that far behind) and at release_all (an optimizer step). Units
 * share granules at their edges; the range counts mappings per granule, so the CPU's layout is kept
 * (the same shards and checkpoints on either device).
 *
 * Invariants: every process materializes the same units in the same order (a forward is the
 * same program everywhere), so gathers are issued identically (which units are deferred or
 * unmapped may differ between processes, with the GPU's progress, but only decides mapping,
 * never a collective); at most three units are resident between calls (the one in use, the
 * one before it, the prefetched next one); a unit's weights are valid exactly while it is
 * resident, and an optimizer step releases all. On a device a unit is mapped exactly while it
 * is resident, its gather is in flight or it is deferred (and everything is, from alloc until
 * the weights were taken apart into the shard); at most Z3_MAX_MAPPED units are mapped after
 * each materialize.
 */
#include <ctype.h>
#include <string.h>

#include "core/profile.h"
#include "train_internal.h"

/* Units mapped at most on a device: the window's three and one that left it. */
#define Z3_MAX_MAPPED 4

typedef struct z3_unit {
    int resident;       /* weights (and compute copy) hold the gathered values */
    int mapped;         /* device ranges: its bytes are mapped */
    int deferred;       /* device ranges: left the window, unmapped once `left` completes */
    uint64_t seq;       /* deferred: when it left (oldest first) */
    accel__event *left; /* device ranges: recorded on the compute stream when it left */
    accel_work *work;   /* gather in flight */
} z3_unit;

struct accel__zero3 {
    int widen; /* stages 1-2: units are widened from the full compute copy */
    /* The model in device memory: the weights' and the compute copy's reserved ranges (cr
     * NULL when the compute copy is the weights); all_mapped: the whole weights are mapped
     * (from alloc until take_shard); stage: a pinned buffer of the largest unit where the
     * communicator reads host memory only and there are several processes. */
    accel__dev_range *wr, *cr;
    int all_mapped;
    float *stage;
    int n_units;
    z3_unit *units;   /* per bucket */
    int cur, prev;    /* the unit materialized last and the one before, or -1 */
    int used;         /* a unit was materialized (or all gathered) since the last release_all */
    uint64_t n_left;  /* units deferred so far (their seq) */
    uint64_t n_waits; /* deferred units the host had to wait for (the memory bound) */
};

/* ---- units ---- */

/* Length of the unit key of `name`: the prefix through its first all-digit dotted component
 * ("transformer.h.3"), or 0 when it has none. */
static size_t unit_key(const char *name)
{
    for (const char *c = name;;) {
        const char *dot = strchr(c, '.');
        size_t len = dot ? (size_t)(dot - c) : strlen(c), k = 0;
        while (k < len && isdigit((unsigned char)c[k])) {
            k++;
        }
        if (len > 0 && k == len) {
            return (size_t)(c - name) + len;
        }
        if (dot == NULL) {
            return 0;
        }
        c = dot + 1;
    }
}

void accel__zero3_units(const accel_model *m, int *unit_of)
{
    int u = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (i > 0) {
            int mi = m->unit_mark ? m->unit_mark[i] : 0,
                mp = m->unit_mark ? m->unit_mark[i - 1] : 0;
            const char *ni = m->params[i].name, *np = m->params[i - 1].name;
            size_t ki = unit_key(ni), kp = unit_key(np);
            int same = mi == mp && (mi != 0 || (ki == kp && strncmp(ni, np, ki) == 0));
            u += !same;
        }
        unit_of[i] = u;
    }
}

accel_status accel_model_set_unit(accel_model *m, int first, int count)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_set_unit: model is NULL");
    }
    if (m->allocated) {
        return accel__seterr(m->acc, ACCEL_ESTATE,
                             "accel_model_set_unit: the model is already allocated (units are "
                             "fixed); call it before accel_model_alloc / accel_prepare");
    }
    if (first < 0 || count < 1 || first > m->n_params - count) {
        return accel__seterr(m->acc, ACCEL_EINVAL,
                             "accel_model_set_unit: parameters [%d, %d + %d) are not within the "
                             "%d registered",
                             first, first, count, m->n_params);
    }
    if (m->n_unit_marks < m->n_params) {
        int *mark = accel__realloc(m->unit_mark, (size_t)m->n_params * sizeof(int));
        if (mark == NULL) {
            return accel__seterr(m->acc, ACCEL_ENOMEM, "accel_model_set_unit: out of memory");
        }
        memset(mark + m->n_unit_marks, 0, (size_t)(m->n_params - m->n_unit_marks) * sizeof(int));
        m->unit_mark = mark;
        m->n_unit_marks = m->n_params;
    }
    /* A fresh id per call (only equality between neighbours matters). */
    int id = ++m->unit_calls;
    for (int i = first; i < first + count; i++) {
        m->unit_mark[i] = id;
    }
    return ACCEL_OK;
}

int accel_model_num_units(const accel_model *m)
{
    return m && m->allocated ? m->flat.n_buckets : 0;
}

/* ---- buffers ---- */

/* Stage 3 with the model in device memory: the weights and the compute copy as reserved
 * ranges, the weights mapped whole and zeroed (parameters are initialised through them, and
 * padding is zero), and the staging buffer where needed. */
static accel_status device_alloc(accel_model *m)
{
    struct accel__zero3 *z = m->z3;
    size_t n = m->flat.padded_numel, g = 0;
    accel_status st = accel__dev_range_granularity(m->dev, &g);
    if (st != ACCEL_OK) {
        return accel__seterr(m->acc, st,
                             "accel_model_alloc: ZeRO stage 3 with the model in %s memory maps its "
                             "units into reserved virtual memory, which this device cannot: %s",
                             accel__device_name(m->dev), accel_last_error(NULL));
    }
    st = accel__dev_range_reserve(m->dev, n * sizeof(float), &z->wr);
    if (st == ACCEL_OK && m->compute_dtype != ACCEL_F32) {
        st = accel__dev_range_reserve(m->dev, n * accel_dtype_nbytes(m->compute_dtype), &z->cr);
    }
    if (st == ACCEL_OK) {
        st = accel__dev_range_map(z->wr, 0, n * sizeof(float));
        z->all_mapped = st == ACCEL_OK;
    }
    m->weights = z->wr ? accel__dev_range_base(z->wr) : NULL;
    m->compute = z->cr ? accel__dev_range_base(z->cr) : m->weights;
    if (st == ACCEL_OK) {
        st = accel__dev_memset(m->dev, m->weights, 0, n * sizeof(float), NULL);
    }
    for (int b = 0; b < z->n_units && st == ACCEL_OK; b++) {
        st = accel__event_new(m->dev, &z->units[b].left);
    }
    if (st == ACCEL_OK && accel__model_staged(m) && m->flat.n_ranks > 1) {
        size_t most = 0;
        for (int b = 0; b < m->flat.n_buckets; b++) {
            most = m->flat.buckets[b].padded > most ? m->flat.buckets[b].padded : most;
        }
        void *p = NULL;
        st = accel__dev_host_alloc(m->dev, most * sizeof(float), &p);
        z->stage = p;
    }
    if (st != ACCEL_OK) {
        return accel__seterr(m->acc, st, "accel_model_alloc: ZeRO stage 3 on %s: %s",
                             accel__device_name(m->dev), accel_last_error(NULL));
    }
    return ACCEL_OK;
}

accel_status accel__zero3_alloc(accel_model *m)
{
    size_t n = m->flat.padded_numel;
    m->z3 = accel__calloc(1, sizeof(*m->z3));
    if (m->z3 != NULL) {
        m->z3->units = accel__calloc((size_t)m->flat.n_buckets, sizeof(z3_unit));
        m->z3->n_units = m->flat.n_buckets;
        m->z3->cur = m->z3->prev = -1;
    }
    if (m->z3 != NULL && m->z3->units != NULL && !accel__model_on_host(m)) {
        accel_status st = device_alloc(m); /* stage 3 only (model.c) */
        if (st != ACCEL_OK) {
            accel__zero3_free(m);
        }
        return st;
    }
    m->weights = accel__pages_alloc(n * sizeof(float));
    if (m->zero_stage == 3) {
        m->compute = m->weights;
        if (m->compute_dtype != ACCEL_F32) {
            m->compute = accel__pages_alloc(n * accel_dtype_nbytes(m->compute_dtype));
        }
    } else if (m->z3 != NULL) {
        m->z3->widen = 1; /* the caller allocates the full compute copy */
    }
    if (m->z3 == NULL || m->z3->units == NULL || m->weights == NULL ||
        (m->zero_stage == 3 && m->compute == NULL)) {
        accel__zero3_free(m);
        return accel__seterr(m->acc, ACCEL_ENOMEM,
                             "accel_model_alloc: out of memory for the gathered weights of a "
                             "sharded master (%zu elements)",
                             n);
    }
    return ACCEL_OK;
}

/* The compute copy is a page buffer of its own (stage 3 under mixed precision). */
static int compute_pages(const accel_model *m)
{
    return !m->z3->widen && m->compute != m->weights;
}

void accel__zero3_free(accel_model *m)
{
    size_t n = m->flat.padded_numel;
    int own_compute = m->zero_stage == 3; /* stage 3's compute copy: pages, or the weights */
    if (m->z3 != NULL) {
        (void)accel__zero3_release_all(m);
    }
    if (m->z3 != NULL && !accel__model_on_host(m)) { /* device ranges (perhaps not made) */
        for (int b = 0; b < m->z3->n_units; b++) {
            if (m->z3->units[b].left != NULL) {
                accel__event_free(m->dev, m->z3->units[b].left);
            }
        }
        accel__dev_range_release(m->z3->cr);
        accel__dev_range_release(m->z3->wr);
        accel__dev_host_free(m->dev, m->z3->stage);
        accel__free(m->z3->units);
        accel__free(m->z3);
        m->z3 = NULL;
        m->weights = m->compute = NULL;
        return;
    }
    if (own_compute && m->compute != NULL && m->compute != m->weights) {
        accel__pages_free(m->compute, n * accel_dtype_nbytes(m->compute_dtype));
    }
    if (m->z3 != NULL) {
        accel__free(m->z3->units);
        accel__free(m->z3);
        m->z3 = NULL;
    }
    accel__pages_free(m->weights, n * sizeof(float));
    m->weights = NULL;
    if (own_compute) {
        m->compute = NULL;
    }
}

/* ---- gathering and releasing ---- */

/* Maps (on = 1) or unmaps unit b's bytes of the device ranges. */
static accel_status map_unit(accel_model *m, int b, int on)
{
    struct accel__zero3 *z = m->z3;
    const accel__flat_bucket *fb = &m->flat.buckets[b];
    size_t es = accel_dtype_nbytes(m->compute_dtype);
    accel_status (*fn)(accel__dev_range *, size_t, size_t) =
        on ? accel__dev_range_map : accel__dev_range_unmap;
    accel_status st = fn(z->wr, fb->offset * sizeof(float), fb->padded * sizeof(float));
    if (st == ACCEL_OK && z->cr != NULL) {
        st = fn(z->cr, fb->offset * es, fb->padded * es);
        if (st != ACCEL_OK && on) {
            (void)accel__dev_range_unmap(z->wr, fb->offset * sizeof(float),
                                         fb->padded * sizeof(float));
        }
    }
    if (st != ACCEL_OK) {
        return accel__seterr(m->acc, st, "ZeRO stage 3: %s unit %d (%zu parameters) on %s: %s",
                             on ? "mapping" : "unmapping", b, fb->count, accel__device_name(m->dev),
                             accel_last_error(NULL));
    }
    z->units[b].mapped = on;
    return ACCEL_OK;
}

/* Device ranges: before unmapping, the compute stream's queued work (which may read any
 * resident unit) has finished. One wait for every unit released at once. */
static accel_status drain(accel_model *m)
{
    accel_status st = accel__stream_sync(m->dev, NULL);
    return st == ACCEL_OK ? st : accel__adopt_thread_error(m->acc, st);
}

static void release(accel_model *m, int b)
{
    z3_unit *u = &m->z3->units[b];
    const accel__flat_bucket *fb = &m->flat.buckets[b];
    if (!accel__model_on_host(m)) {
        /* The caller made sure the compute stream is done with it (its event, or a drain).
         * An unmap of what was mapped cannot fail (device.h); if the device is gone, the next
         * call says so. */
        if (u->mapped) {
            (void)map_unit(m, b, 0);
        }
        u->resident = 0;
        u->deferred = 0;
        return;
    }
    if (!u->resident) {
        return;
    }
    accel__pages_drop(m->weights + fb->offset, fb->padded * sizeof(float));
    if (compute_pages(m)) {
        size_t es = accel_dtype_nbytes(m->compute_dtype);
        accel__pages_drop((char *)m->compute + fb->offset * es, fb->padded * es);
    }
    u->resident = 0;
}

/* Unit b gathered through the pinned staging buffer (a device model, a host communicator):
 * this process's piece out, the allgather in place there, the unit back into its mapped
 * memory, then its compute copy. Done when it returns. A local failure still joins the
 * collective (with poison), so no peer waits in vain. */
static accel_status staged_gather(accel_model *m, int b)
{
    const accel__flat_bucket *fb = &m->flat.buckets[b];
    size_t piece = fb->padded / (size_t)m->flat.n_ranks;
    float *mine = m->z3->stage + (size_t)m->rank * piece;
    accel_status cst = accel__dev_copy(m->dev, mine, m->master + fb->shard_offset,
                                       piece * sizeof(float), ACCEL__COPY_D2H, NULL);
    if (cst != ACCEL_OK) {
        memset(mine, 0xFF, piece * sizeof(float));
    }
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, mine, m->z3->stage, piece, ACCEL_F32, ACCEL_SUM, 0);
    accel_work *w = NULL;
    accel_status st = accel__comm_post(accel__zero_comm(m), &op, NULL, &w);
    if (st == ACCEL_OK) {
        st = accel__work_wait(w, accel__comm_deadline(accel__zero_comm(m)));
        accel__work_free(w);
    }
    if (st == ACCEL_OK && cst == ACCEL_OK) {
        cst = accel__dev_copy(m->dev, m->weights + fb->offset, m->z3->stage,
                              fb->padded * sizeof(float), ACCEL__COPY_H2D, NULL);
    }
    if (st != ACCEL_OK || cst != ACCEL_OK) {
        return accel__seterr(m->acc, st != ACCEL_OK ? st : cst,
                             "ZeRO stage 3: gathering unit %d through host memory: %s", b,
                             accel_last_error(NULL));
    }
    m->z3->units[b].resident = 1;
    return accel__model_refresh_compute_range(m, fb->offset, fb->padded);
}

/* Posts the allgather of unit b's pieces into the weights, unless resident or in flight; at
 * stages 1-2 widens its compute copy into them instead (no communication). */
static accel_status post_gather(accel_model *m, int b)
{
    z3_unit *u = &m->z3->units[b];
    if (u->resident || u->work != NULL) {
        return ACCEL_OK;
    }
    const accel__flat_bucket *fb = &m->flat.buckets[b];
    if (m->z3->widen) {
        size_t es = accel_dtype_nbytes(m->compute_dtype);
        accel_status st = accel__dev_convert(
            m->dev, accel__dspan_f32(m->weights + fb->offset, fb->padded),
            accel__dspan_of((char *)m->compute + fb->offset * es, m->compute_dtype, fb->padded),
            NULL);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
        u->resident = 1;
        return ACCEL_OK;
    }
    size_t piece = fb->padded / (size_t)m->flat.n_ranks;
    u->deferred = 0; /* gathered again into its memory: the gather is ordered after its readers */
    if (m->z3->wr != NULL && !u->mapped) {
        ACCEL_TRY(map_unit(m, b, 1));
    }
    if (m->z3->wr != NULL && m->flat.n_ranks == 1) {
        /* One process: its shard is the unit, copied on the compute stream (no host round
         * trip, which would wait for the stream, whatever the backend). */
        accel_status st =
            accel__dev_copy(m->dev, m->weights + fb->offset, m->master + fb->shard_offset,
                            fb->padded * sizeof(float), ACCEL__COPY_D2D, NULL);
        if (st != ACCEL_OK) {
            return accel__seterr(m->acc, st, "ZeRO stage 3: gathering unit %d: %s", b,
                                 accel_last_error(NULL));
        }
        u->resident = 1;
        return accel__model_refresh_compute_range(m, fb->offset, fb->padded);
    }
    if (m->z3->stage != NULL) {
        return staged_gather(m, b);
    }
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLGATHER, m->master + fb->shard_offset,
                                 m->weights + fb->offset, piece, ACCEL_F32, ACCEL_SUM, 0);
    accel_status st = accel__comm_post(accel__zero_comm(m), &op, NULL, &u->work);
    if (st != ACCEL_OK) {
        u->work = NULL;
        return accel__seterr(m->acc, st, "ZeRO stage 3: gathering unit %d: %s", b,
                             accel_last_error(NULL));
    }
    return ACCEL_OK;
}

/* Waits for unit b's gather and makes its compute copy. */
static accel_status finish_gather(accel_model *m, int b)
{
    z3_unit *u = &m->z3->units[b];
    if (u->work != NULL) {
        accel_status st = accel__work_wait(u->work, accel__comm_deadline(accel__zero_comm(m)));
        accel__work_free(u->work);
        u->work = NULL;
        if (st != ACCEL_OK) {
            return accel__seterr(m->acc, st, "ZeRO stage 3: gathering unit %d: %s", b,
                                 accel_last_error(NULL));
        }
        const accel__flat_bucket *fb = &m->flat.buckets[b];
        u->resident = 1;
        return accel__model_refresh_compute_range(m, fb->offset, fb->padded);
    }
    return ACCEL_OK;
}

/* 1 when unit k is in the window that materializing b opens: b, the unit materialized before
 * it (z->cur, not yet updated) and the prefetched next. */
static int in_window(const struct accel__zero3 *z, int k, int b, int next)
{
    return k == b || k == z->cur || k == next;
}

/* Device ranges, before units b and next are gathered: the units leaving the window (all but
 * b, next and the current one) are deferred behind an event on the compute stream, and
 * deferred ones whose event has completed are unmapped, without waiting. */
static accel_status leave_window(accel_model *m, int b, int next)
{
    struct accel__zero3 *z = m->z3;
    for (int k = 0; k < z->n_units; k++) {
        z3_unit *u = &z->units[k];
        if (in_window(z, k, b, next)) {
            u->deferred = 0; /* back in the window: gathered into its memory again */
        } else if (u->deferred && accel__event_query(m->dev, u->left)) {
            release(m, k);
        } else if (!u->deferred && u->work == NULL && (u->resident || u->mapped)) {
            accel_status st = accel__event_record(m->dev, u->left, NULL);
            if (st != ACCEL_OK) {
                return accel__adopt_thread_error(m->acc, st);
            }
            u->resident = 0;
            u->deferred = 1;
            u->seq = ++z->n_left;
        }
    }
    return ACCEL_OK;
}

/* Device ranges, before unit b is gathered: while mapping it would make more than
 * Z3_MAX_MAPPED units mapped, the oldest deferred unit goes, the host waiting for its event
 * only when the GPU has not finished with it yet (it is more than a unit behind). */
static accel_status make_room(accel_model *m, int b)
{
    struct accel__zero3 *z = m->z3;
    if (z->wr == NULL || b < 0 || b >= z->n_units) {
        return ACCEL_OK;
    }
    int mapped = 0;
    for (int k = 0; k < z->n_units; k++) {
        mapped += z->units[k].mapped;
    }
    while (mapped + !z->units[b].mapped > Z3_MAX_MAPPED) {
        int old = -1;
        for (int k = 0; k < z->n_units; k++) {
            if (z->units[k].deferred && (old < 0 || z->units[k].seq < z->units[old].seq)) {
                old = k;
            }
        }
        if (old < 0) {
            break; /* the window alone */
        }
        if (!accel__event_query(m->dev, z->units[old].left)) {
            double t0 = accel__now();
            accel_status st = accel__event_sync(m->dev, z->units[old].left);
            if (st != ACCEL_OK) {
                return accel__adopt_thread_error(m->acc, st);
            }
            accel__prof_span(m->acc, "unit release wait", ACCEL__PROF_COMM, t0, accel__now(),
                             "unit", old);
            z->n_waits++;
        }
        release(m, old);
        mapped--;
    }
    return ACCEL_OK;
}

accel_status accel_model_materialize(accel_model *m, int index)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_materialize: model is NULL");
    }
    if (index < 0 || index >= m->n_params) {
        return accel__seterr(m->acc, ACCEL_EINVAL,
                             "accel_model_materialize: parameter %d out of range (%d parameters)",
                             index, m->n_params);
    }
    struct accel__zero3 *z = m->z3;
    if (z == NULL || !m->obj.prepared || m->zero_stage == 0) {
        return ACCEL_OK; /* a full master, or a join region (all gathered, run as DDP) */
    }
    if (m->compute_stale) {
        ACCEL_TRY(accel__zero_gather_compute(m, 1)); /* after a load: collective, as this */
    }
    int b = m->flat_bucket[index];
    z->used = 1;
    if (b == z->cur && z->units[b].resident) {
        return ACCEL_OK; /* the common case: the unit in use */
    }
    double t0 = accel__now();
    /* Forward runs in registration order, which is decreasing bucket order (memory is reverse
     * registration order); backward the other way. */
    int next = m->in_backward ? b + 1 : b - 1;
    /* Released first (the same units either way): on a device the memory goes back (or is
     * deferred) before the next unit's comes. */
    if (z->wr != NULL) {
        ACCEL_TRY(leave_window(m, b, next));
    } else {
        for (int u = 0; u < z->n_units; u++) {
            if (!in_window(z, u, b, next) && z->units[u].work == NULL && z->units[u].resident) {
                release(m, u);
            }
        }
    }
    ACCEL_TRY(make_room(m, b));
    ACCEL_TRY(post_gather(m, b));
    ACCEL_TRY(finish_gather(m, b));
    if (next >= 0 && next < z->n_units) {
        ACCEL_TRY(make_room(m, next)); /* after b's gather: the GPU had time to finish more */
        ACCEL_TRY(post_gather(m, next));
    }
    if (b != z->cur) {
        z->prev = z->cur;
        z->cur = b;
    }
    accel__prof_span(m->acc, "unit gather", ACCEL__PROF_COMM, t0, accel__now(), "unit", b);
    return ACCEL_OK;
}

int accel__zero3_unit_state(const accel_model *m, int b)
{
    const z3_unit *u = &m->z3->units[b];
    return u->work != NULL ? 1 : u->resident ? 2 : 0;
}

accel_status accel_model_gather_all(accel_model *m)
{
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_model_gather_all: model is NULL");
    }
    if (m->z3 == NULL || !m->obj.prepared || m->zero_stage == 0) {
        return ACCEL_OK;
    }
    if (m->compute_stale) {
        ACCEL_TRY(accel__zero_gather_compute(m, 1));
    }
    accel_status st = ACCEL_OK;
    for (int b = 0; b < m->z3->n_units && st == ACCEL_OK; b++) {
        st = post_gather(m, b);
    }
    for (int b = 0; b < m->z3->n_units; b++) {
        accel_status wst = finish_gather(m, b);
        st = st != ACCEL_OK ? st : wst;
    }
    m->z3->cur = m->z3->prev = -1;
    m->z3->used = 1;
    return st;
}

accel_status accel__zero3_release_all(accel_model *m)
{
    struct accel__zero3 *z = m->z3;
    accel_status st = ACCEL_OK;
    for (int b = 0; z != NULL && b < z->n_units; b++) {
        accel_status wst = finish_gather(m, b);
        st = st != ACCEL_OK ? st : wst;
    }
    int any = z != NULL && z->all_mapped;
    for (int b = 0; z != NULL && b < z->n_units; b++) {
        any |= z->units[b].mapped;
    }
    if (any && !accel__model_on_host(m)) {
        accel_status dst = drain(m);
        st = st != ACCEL_OK ? st : dst;
    }
    for (int b = 0; z != NULL && b < z->n_units; b++) {
        release(m, b);
    }
    if (z != NULL && !accel__model_on_host(m)) {
        if (z->all_mapped) {
            (void)accel__dev_range_unmap(z->wr, 0, m->flat.padded_numel * sizeof(float));
            z->all_mapped = 0;
        }
        z->cur = z->prev = -1;
        z->used = 0;
    } else if (z != NULL) {
        /* The pages units share at their edges go too: nothing of the full weights stays. */
        size_t n = m->flat.padded_numel;
        accel__pages_drop_all(m->weights, n * sizeof(float));
        if (compute_pages(m)) {
            accel__pages_drop_all(m->compute, n * accel_dtype_nbytes(m->compute_dtype));
        }
        z->cur = z->prev = -1;
        z->used = 0;
    }
    return st;
}

int accel__zero3_used(const accel_model *m)
{
    return m->z3 == NULL || m->z3->used;
}

accel_status accel__zero3_take_shard(accel_model *m)
{
    for (int b = 0; b < m->flat.n_buckets; b++) {
        size_t po, pc;
        accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
        accel_status st =
            accel__dev_copy(m->dev, m->master + m->flat.buckets[b].shard_offset, m->weights + po,
                            pc * sizeof(float), ACCEL__COPY_D2D, NULL);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
    }
    if (m->z3->widen) {
        ACCEL_TRY(accel__model_refresh_compute(m)); /* the full weights are still here */
        m->compute_stale = 0;
    }
    accel_status st = accel__zero3_release_all(m);
    if (m->z3->wr != NULL) {
        accel__dev_range_reset_peak(m->z3->wr); /* from here on: units only */
        if (m->z3->cr != NULL) {
            accel__dev_range_reset_peak(m->z3->cr);
        }
    }
    return st;
}

void accel__zero3_calls(const accel_model *m, size_t *maps, size_t *unmaps, uint64_t *waits)
{
    const struct accel__zero3 *z = m->z3;
    size_t wm = 0, wu = 0, cm = 0, cu = 0;
    accel__dev_range_calls(z ? z->wr : NULL, &wm, &wu);
    accel__dev_range_calls(z ? z->cr : NULL, &cm, &cu);
    *maps = wm + cm;
    *unmaps = wu + cu;
    *waits = z ? z->n_waits : 0;
}

void accel__zero3_mapped(const accel_model *m, size_t *now, size_t *peak)
{
    const struct accel__zero3 *z = m->z3;
    *now = z ? accel__dev_range_mapped(z->wr) + accel__dev_range_mapped(z->cr) : 0;
    *peak = z ? accel__dev_range_peak(z->wr) + accel__dev_range_peak(z->cr) : 0;
}

int accel__zero3_is_mapped(const accel_model *m, size_t flat_index)
{
    const struct accel__zero3 *z = m->z3;
    return z != NULL && z->wr != NULL &&
           accel__dev_range_is_mapped(z->wr, flat_index * sizeof(float));
}
