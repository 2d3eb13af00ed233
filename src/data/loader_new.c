/*
 * A loader's life: options, creation (validated options, the sampler's seed, the slots and the
 * worker pool), preparation (Accelerate's prepare_data_loader: the shard this process reads,
 * split / even / dispatch / seedable from the options else the accelerator's settings) and
 * release. Invariant: a loader that accel_loader_new returned has all its slots and, with
 * num_workers > 0, its workers; a failed creation frees everything it made.
 */
#include <string.h>

#include "core/gstate.h"
#include "core/settings.h"
#include "data_internal.h"

accel_loader_options accel_loader_options_default(void)
{
    accel_loader_options o;
    memset(&o, 0, sizeof(o));
    o.size = sizeof(o);
    o.version = ACCEL_LOADER_OPTIONS_VERSION;
    o.batch_size = 1;
    o.prefetch_factor = 2;
    o.split_batches = o.even_batches = o.dispatch_batches = o.use_seedable_sampler = -1;
    return o;
}

/* ---- creation, preparation, release ---- */

static void loader_destroy(accel__object *o)
{
    accel_loader_free((accel_loader *)o);
}

accel_status accel__loader_prepare_as(accel_loader *l, int rank, int n_ranks)
{
    accel *acc = l->acc;
    const accel__data_settings *ao = &acc->settings->data;
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks) {
        return accel__seterr(acc, ACCEL_EINVAL, "loader: process %d of %d is not a process", rank,
                             n_ranks);
    }
    accel__loader_end_epoch(l, 0);
    int split = l->o.split_batches >= 0 ? l->o.split_batches : ao->split_batches;
    int even = l->o.even_batches >= 0 ? l->o.even_batches : ao->even_batches;
    int disp = l->o.dispatch_batches >= 0 ? l->o.dispatch_batches : ao->dispatch_batches;
    int seedable =
        l->o.use_seedable_sampler >= 0 ? l->o.use_seedable_sampler : ao->use_seedable_sampler;
    if (disp < 0) {
        disp = !l->map_style; /* Accelerate: dispatch iterable datasets by default */
    }
    if (split > 0 && l->o.batch_size % n_ranks != 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "loader: split_batches needs batch_size (%lld) to be a multiple of "
                             "the number of processes (%d)",
                             (long long)l->o.batch_size, n_ranks);
    }
    l->split = split > 0;
    l->even = even != 0;
    l->seedable = seedable > 0;
    l->rank = rank;
    l->n_ranks = n_ranks;
    /* Dispatching needs the real processes (it broadcasts); with one process it is a no-op. */
    l->dispatch = disp > 0 && n_ranks > 1 && n_ranks == acc->n_ranks && rank == acc->rank;
    if (l->dispatch && l->disp == NULL) {
        accel_status st = accel__dispatch_new(l, &l->disp);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(acc, st);
        }
    }
    /* The GradientState exists from now on, so the epochs' reports to it cannot fail. */
    ACCEL_TRY(accel__grad_state_open(acc));
    l->track_state = 1;
    return ACCEL_OK;
}

static accel_status loader_prepare(accel__object *o)
{
    accel_loader *l = (accel_loader *)o;
    ACCEL_TRY(accel__loader_prepare_as(l, l->acc->rank, l->acc->n_ranks));
    return l->acc->n_ranks > 1 ? accel__loader_agree(l) : ACCEL_OK;
}

/* Checkpoints: each process's position in dl_state_dict_rank<r>.json (loader_state.c). */
static const accel__object_class loader_class = {
    .prepare = loader_prepare,
    .destroy = loader_destroy,
    .state_save = accel__loader_state_save,
    .state_load = accel__loader_state_load,
    .rank_name = "dl_state_dict_rank",
    .rank_store = ACCEL__STORE_JSON,
    .rank_key = "loaders",
};

accel_status accel_loader_new(accel *acc, const accel_dataset *ds, const accel_loader_options *opts,
                              accel_loader **out)
{
    const char *who = "accel_loader_new";
    if (acc == NULL || out == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: acc and out must not be NULL", who);
    }
    accel_loader_options o = accel_loader_options_default();
    ACCEL_TRY(ACCEL__OPTIONS_COPY(acc, who, accel_loader_options, &o, opts, use_seedable_sampler));
    if (ds == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: dataset is NULL", who);
    }
    int map_style = ds->get != NULL && ds->len != NULL;
    if (!map_style && ds->next == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: the dataset has neither len+get (map-style) nor next "
                             "(iterable)",
                             who);
    }
    if (o.batch_size < 1 || o.num_workers < 0 || o.prefetch_factor < 1 || o.n_pad < 0 ||
        o.n_pad > ACCEL_MAX_FIELDS || (o.n_pad > 0 && o.pad == NULL)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: invalid options (batch_size %lld must be >= 1, "
                             "num_workers %d >= 0, prefetch_factor %d >= 1, n_pad %d in 0..%d)",
                             who, (long long)o.batch_size, o.num_workers, o.prefetch_factor,
                             o.n_pad, ACCEL_MAX_FIELDS);
    }
    /* Limits no real loader reaches, so that batch_size x processes and the batches in flight
     * cannot overflow: 2^30 threads would fail anyway, and 2^31 samples make no batch. */
    if (o.batch_size > INT32_MAX || o.num_workers > 4096 ||
        (int64_t)o.num_workers * o.prefetch_factor > (1 << 20)) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: batch_size %lld, num_workers %d or num_workers x "
                             "prefetch_factor (%d) too large (at most 2^31 - 1, 4096 and 2^20)",
                             who, (long long)o.batch_size, o.num_workers, o.prefetch_factor);
    }
    if (map_style && ds->len(ds->ctx) < 0) {
        return accel__seterr(acc, ACCEL_EINVAL, "%s: dataset len() is negative", who);
    }
    accel_loader *l = accel__calloc(1, sizeof(*l));
    if (l == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "%s: out of memory", who);
    }
    l->acc = acc;
    l->ds = *ds;
    l->map_style = map_style;
    l->o = o;
    l->o.pad = NULL;
    l->rank = 0;
    l->n_ranks = 1;
    l->remainder = -1;
    l->have_next = -1;
    l->seed = o.seed_set ? o.seed : accel__gen_next(accel__rng(acc));
    accel__gen_seed(&l->gen, l->seed);
    l->epoch_gen = l->gen;
    accel_status st = ACCEL_OK;
    for (int i = 0; i < o.n_pad && st == ACCEL_OK; i++) {
        l->pad.field[i] = accel__strdup(o.pad[i].field != NULL ? o.pad[i].field : "");
        l->pad.value[i] = o.pad[i].value;
        l->pad.n = i + 1;
        if (l->pad.field[i] == NULL) {
            st = ACCEL_ENOMEM;
        }
    }
    if (!map_style && o.num_workers > 0) {
        accel__log(&acc->log, ACCEL__LOG_WARN,
                   "loader: iterable datasets are read on the calling thread; "
                   "num_workers is ignored");
        l->o.num_workers = 0;
    }
    int n_slots = l->o.num_workers > 0 ? l->o.num_workers * l->o.prefetch_factor : 2;
    if (n_slots < 2) {
        n_slots = 2;
    }
    l->slots = accel__calloc((size_t)n_slots, sizeof(*l->slots));
    if (st == ACCEL_OK && l->slots == NULL) {
        st = ACCEL_ENOMEM;
    }
    for (int i = 0; st == ACCEL_OK && i < n_slots; i++) {
        st = accel__batch_init(&l->slots[i].batch);
        l->slots[i].ready = -1;
        l->n_slots = i + 1;
    }
    accel__object_register(acc, &l->obj, ACCEL__OBJ_LOADER, &loader_class);
    if (st == ACCEL_OK && l->o.num_workers > 0) {
        st = accel__workers_new(l, &l->workers);
    }
    if (st != ACCEL_OK) {
        accel_loader_free(l);
        return accel__seterr(acc, ACCEL_ENOMEM, "%s: out of memory", who);
    }
    *out = l;
    return ACCEL_OK;
}

void accel_loader_free(accel_loader *l)
{
    if (l == NULL) {
        return;
    }
    accel__loader_end_epoch(l, 0);
    accel__workers_free(l->workers);
    accel__dispatch_free(l->disp);
    accel__object_unregister(&l->obj);
    for (int i = 0; i < l->n_slots; i++) {
        accel__batch_free(&l->slots[i].batch);
    }
    accel__free(l->slots);
    accel__samples_free(l->samples, l->n_samples);
    accel__free(l->samples);
    for (int b = 0; b < 2; b++) {
        accel__samples_free(l->ibuf[b], l->ibuf_cap[b]);
        accel__free(l->ibuf[b]);
    }
    for (int i = 0; i < l->pad.n; i++) {
        accel__free(l->pad.field[i]);
    }
    accel__free(l->order);
    accel__plan_free(&l->inner);
    accel__plan_free(&l->plan);
    accel__free(l);
}
