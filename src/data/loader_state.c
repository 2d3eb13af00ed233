/*
 * A loader's checkpoint (the state protocol, core/state_proto.h): its position, per process,
 * as element i of "loaders" in dl_state_dict_rank<r>.json: the epoch, the batches already
 * handed out, the sampler's seed and its generator at the start of the epoch, and the epoch's
 * length. Invariant: a loaded position is in range for the live loader, and setting it (the
 * staged apply) cannot fail.
 */
#include "data_internal.h"

accel_status accel__loader_state_save(accel__object *self, accel__state_writer *w)
{
    accel_loader *l = (accel_loader *)self;
    accel_loader_position pos;
    ACCEL_TRY(accel_loader_get_position(l, &pos));
    ACCEL_TRY(accel__state_put_i64(w, "epoch", pos.epoch));
    ACCEL_TRY(accel__state_put_i64(w, "batches", pos.batches));
    ACCEL_TRY(accel__state_put_u64(w, "seed", pos.seed));
    ACCEL_TRY(accel__state_put_gen(w, "generator", pos.rng));
    return accel__state_put_i64(w, "length", accel_loader_len(l)); /* -1: unknown (a stream) */
}

static void loader_apply(accel__object *self, void *data)
{
    /* Validated by the load (non-negative, generator not all zero): cannot fail. */
    (void)accel_loader_set_position((accel_loader *)self, data);
}

accel_status accel__loader_state_load(accel__object *self, accel__state_reader *r)
{
    accel_loader *l = (accel_loader *)self;
    accel_loader_position *pos = accel__state_stage(r, sizeof(*pos), loader_apply);
    if (pos == NULL) {
        return ACCEL_ENOMEM;
    }
    int64_t len;
    ACCEL_TRY(accel__state_get_i64(r, "epoch", 0, ACCEL__STATE_COUNT_MAX, &pos->epoch));
    ACCEL_TRY(accel__state_get_i64(r, "batches", 0, ACCEL__STATE_COUNT_MAX, &pos->batches));
    ACCEL_TRY(accel__state_get_u64(r, "seed", &pos->seed));
    ACCEL_TRY(accel__state_get_gen(r, "generator", pos->rng));
    ACCEL_TRY(accel__state_get_i64(r, "length", -1, ACCEL__STATE_COUNT_MAX, &len));
    int i = accel__state_index(r);
    if (len >= 0 && pos->batches > len) {
        return accel__state_fail(r, ACCEL_ECORRUPT,
                                 "loader %d is at batch %lld of an epoch of %lld batches", i,
                                 (long long)pos->batches, (long long)len);
    }
    int n_old = accel__state_saved_processes(r), n_new = l->acc->n_ranks;
    if (n_old != n_new) {
        /* Same number of samples seen overall, in whole batches of the new layout. A product
         * that overflows is past any live epoch: the check below refuses it. */
        int64_t seen;
        pos->batches =
            __builtin_mul_overflow(pos->batches, (int64_t)n_old, &seen) ? INT64_MAX : seen / n_new;
    }
    int64_t live = accel_loader_len(l);
    if (live >= 0 && pos->batches > live) {
        return accel__state_fail(r, ACCEL_EINVAL,
                                 "loader %d resumes at batch %lld, past the end of the live "
                                 "loader's epoch (%lld batches): is it built as when saving "
                                 "(dataset, batch size, processes)?",
                                 i, (long long)pos->batches, (long long)live);
    }
    return accel__state_resume_at(r, pos->epoch, pos->batches, live);
}
