/*
 * The GradientState (core/gstate.h) and the accumulation rule, the one place that decides
 * which micro-steps synchronise (Accelerate's GradientState._do_sync / _set_sync_gradients).
 * Invariant: this file is the only writer of the state; before the state exists (or after
 * accel_free_memory dropped it) every reader sees the initial values.
 */
#include "core/gstate.h"

#include "train_internal.h"

typedef struct grad_state {
    int sync_gradients;    /* 1 on micro-steps that synchronise and step */
    long long step;        /* micro-step counter of accel_accumulate (persisted) */
    int active_loaders;    /* loaders currently being iterated (nesting depth) */
    int end_of_dataloader; /* the active loader has yielded its last batch */
    int remainder;         /* the active loader's duplicated tail samples, -1 if none */
} grad_state;

static const grad_state initial = {1, 0, 0, 0, -1};

static const grad_state *get(const accel *acc)
{
    const grad_state *g = acc ? accel__module(acc, ACCEL__MOD_GSTATE) : NULL;
    return g != NULL ? g : &initial;
}

static void state_free(accel *acc, void *state)
{
    (void)acc;
    accel__free(state);
}

accel_status accel__grad_state_open(accel *acc)
{
    if (accel__module(acc, ACCEL__MOD_GSTATE) != NULL) {
        return ACCEL_OK;
    }
    grad_state *g = accel__malloc(sizeof(*g));
    if (g == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "out of memory for the gradient state");
    }
    *g = initial;
    accel__module_set(acc, ACCEL__MOD_GSTATE, g, state_free);
    return ACCEL_OK;
}

/* The state to write; accel__grad_state_open succeeded before (the writers' contract). */
static grad_state *put(accel *acc)
{
    grad_state *g = accel__module(acc, ACCEL__MOD_GSTATE);
    ACCEL_ASSERT(g != NULL);
    return g;
}

int accel__grad_state_sync(const accel *acc)
{
    return get(acc)->sync_gradients;
}

long long accel__grad_state_step(const accel *acc)
{
    return get(acc)->step;
}

int accel__grad_state_active_loaders(const accel *acc)
{
    return get(acc)->active_loaders;
}

int accel__grad_state_end_of_dataloader(const accel *acc)
{
    return get(acc)->end_of_dataloader;
}

int accel__grad_state_remainder(const accel *acc)
{
    return get(acc)->remainder;
}

void accel__grad_state_loader_enter(accel *acc, int remainder, int *saved_end, int *saved_remainder)
{
    grad_state *g = put(acc);
    *saved_end = g->end_of_dataloader;
    *saved_remainder = g->remainder;
    g->active_loaders++;
    g->end_of_dataloader = 0;
    g->remainder = remainder;
}

void accel__grad_state_loader_batch(accel *acc, int last, int remainder)
{
    grad_state *g = put(acc);
    g->end_of_dataloader = last;
    g->remainder = remainder;
}

void accel__grad_state_loader_leave(accel *acc, int saved_end, int saved_remainder)
{
    grad_state *g = put(acc);
    g->active_loaders--;
    g->end_of_dataloader = g->active_loaders > 0 ? saved_end : 0;
    g->remainder = g->active_loaders > 0 ? saved_remainder : -1;
}

void accel__grad_state_restore(accel *acc, long long step, int sync)
{
    grad_state *g = put(acc);
    g->step = step;
    g->sync_gradients = sync != 0;
}

/* ---- the accumulation rule (train_internal.h) ---- */

int accel__grad_state_accum_steps(const accel *acc)
{
    int k = acc->settings->train.gradient_accumulation_steps;
    return k > 0 ? k : 1;
}

int accel__grad_state_window_open(const accel *acc)
{
    return get(acc)->step % accel__grad_state_accum_steps(acc) != 0;
}

accel_status accel__grad_state_advance(accel *acc)
{
    ACCEL_TRY(accel__grad_state_open(acc));
    grad_state *g = put(acc);
    if (acc->settings->train.sync_with_dataloader == 1 && g->end_of_dataloader) {
        g->step = 0;
        g->sync_gradients = 1;
    } else {
        g->step += 1;
        g->sync_gradients = g->step % accel__grad_state_accum_steps(acc) == 0;
    }
    return ACCEL_OK;
}
