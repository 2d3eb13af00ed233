/*
 * Activation recomputation (nn_checkpoint) and the arena marks it stands on.
 *
 * A segment runs once in forward, recorded like any ops; then its tape nodes and everything it
 * allocated are rewound away, leaving one "checkpoint" node whose output is a copy of the
 * segment's. That node's backward runs the segment again on a tape of its own, in the state of
 * the first run (dropout counter, seed, step, training mode, autocast dtype), seeds the new
 * output's gradient with the node's, replays that tape and rewinds again.
 *
 * Invariant: what outlives a segment (its output, the gradients it writes into tensors from
 * outside it) is allocated before the segment's mark, never after it. The tensors from outside
 * are found on the segment's tape: a node's backward writes gradients only into its inputs
 * (n->in), as accel__nn_record takes them. Nothing here depends on the device: the device
 * arena is rewound like the host one and the one copy goes through the GPU table.
 */

#include "nn_gpu.h"

/* The ctx state a run of a segment depends on: the dropout keys (op counter, seed, step),
 * the modes, and autocast's mode and learned dtype (AUTO may learn its dtype inside the
 * segment: it then learns it at the same op again). */
typedef struct run_state {
    uint64_t op_counter, seed, step;
    int training, grad_enabled, autocast_mode;
    accel_dtype autocast_auto;
} run_state;

static run_state get_state(const nn_ctx *g)
{
    run_state r = {g->op_counter,   g->seed,          g->step,         g->training,
                   g->grad_enabled, g->autocast_mode, g->autocast_auto};
    return r;
}

static void set_state(nn_ctx *g, const run_state *r)
{
    g->op_counter = r->op_counter;
    g->seed = r->seed;
    g->step = r->step;
    g->training = r->training;
    g->grad_enabled = r->grad_enabled;
    g->autocast_mode = r->autocast_mode;
    g->autocast_auto = r->autocast_auto;
}

/* What a checkpoint node needs to run its segment again. */
typedef struct nn_segment {
    nn_segment_fn fn;
    void *fn_ctx;
    run_state first;    /* the state when the first run began */
    int n_outer;        /* owners from outside the segment that its ops read and that */
    nn_tensor *outer[]; /* require grad (not parameters): the segment adds to their gradient */
} nn_segment;

nn_arena_mark accel__nn_arena_mark(nn_ctx *g)
{
    nn_arena_mark m;
    m.top = g->blocks;
    m.used = g->blocks != NULL ? g->blocks->used : 0;
    m.dtop = g->dblocks;
    m.dused = g->dblocks != NULL ? g->dblocks->used : 0;
    m.live = g->live;
    m.dlive = g->dlive;
    m.dfloor = g->dfloor;
    m.tape = g->tape;
    m.n_nodes = g->n_nodes;
    if (g->dblocks != NULL) {
        g->dfloor = g->dblocks;
    }
    return m;
}

/* Blocks newer than top are emptied (kept for reuse: a reset coalesces them), top goes back to
 * `used`; older blocks were not touched since the mark (host: newest block only; device: the
 * floor). */
static void rewind_blocks(nn_block *b, nn_block *top, size_t used)
{
    for (; b != NULL && b != top; b = b->next) {
        b->used = 0;
    }
    if (top != NULL) {
        top->used = used;
    }
}

void accel__nn_arena_rewind(nn_ctx *g, const nn_arena_mark *m)
{
    rewind_blocks(g->blocks, m->top, m->used);
    rewind_blocks(g->dblocks, m->dtop, m->dused);
    g->live = m->live;
    g->dlive = m->dlive;
    g->dfloor = m->dfloor;
    g->tape = m->tape;
    g->n_nodes = m->n_nodes;
}

void accel__nn_arena_keep(nn_ctx *g, const nn_arena_mark *m)
{
    g->dfloor = m->dfloor;
}

int accel__nn_arena_after(const nn_ctx *g, const nn_arena_mark *m, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (const nn_block *b = g->blocks; b != NULL; b = b->next) {
        uintptr_t from = (uintptr_t)b->mem + (b == m->top ? m->used : 0);
        if (a >= from && a < (uintptr_t)b->mem + b->cap) {
            return 1;
        }
        if (b == m->top) {
            break;
        }
    }
    return 0;
}

static nn_tensor *owner_of(nn_tensor *t)
{
    return t->base != NULL ? t->base : t;
}

/* dst <- src, nbytes, both in the ctx's tensor memory; they may overlap (the output moved down
 * to where the segment began). */
static accel_status move_data(nn_ctx *g, void *dst, const void *src, size_t nbytes)
{
    if (dst == src || nbytes == 0) {
        return ACCEL_OK;
    }
    if (g->device.type != ACCEL_DEVICE_CUDA) {
        memmove(dst, src, nbytes);
        return ACCEL_OK;
    }
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d + nbytes <= s || s + nbytes <= d) {
        return accel__nn_gpu->copy(g, dst, src, nbytes);
    }
    /* A device copy must not overlap: through per-op scratch. */
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    void *tmp = accel__nn_dtmp_alloc(g, nbytes);
    accel_status st = tmp == NULL ? ACCEL_ENOMEM : accel__nn_gpu->copy(g, tmp, src, nbytes);
    if (st == ACCEL_OK) {
        st = accel__nn_gpu->copy(g, dst, tmp, nbytes);
    }
    accel__nn_tmp_release(g, tm);
    return st;
}

/* Before a segment's backward, for o, an input from outside it: a gradient the segment writes
 * first must outlive its rewind, so its memory (and its 2-byte shadow's, which a product
 * below may read) is set aside now, below the mark (accel__nn_grad, _grad_w, _grad_take and
 * the shadow's writers take it). An enclosing segment's reservation stands; *mine says which
 * ones are this call's (1 the gradient's, 2 the shadow's). 0 and the ctx error on failure. */
static void *res_alloc(nn_ctx *g, nn_rewind_run *run, size_t nbytes)
{
    /* A dead reservation of the segment before the last one (accel__nn_rewind_end) first. */
    for (int k = 0; run != NULL && k < run->n_spare; k++) {
        if (run->spare[k] != NULL && run->spare_nbytes[k] >= nbytes) {
            void *p = run->spare[k];
            run->spare[k] = NULL;
            return p;
        }
    }
    return accel__nn_dalloc(g, nbytes);
}

static int reserve_outer(nn_ctx *g, nn_tensor *o, unsigned char *mine, nn_rewind_run *run)
{
    *mine = 0;
    /* A borrowed gradient gets memory of its own below the mark, before the segment adds to
     * it (that would allocate above the mark, which the rewind frees). */
    if (!accel__nn_grad_own(g, o)) {
        return 0;
    }
    size_t n = (size_t)nn_numel(o);
    if (o->grad == NULL && o->grad_reserved == NULL) {
        o->grad_reserved = res_alloc(g, run, n * sizeof(float));
        if (o->grad_reserved == NULL) {
            return 0;
        }
        *mine |= 1;
    }
    if (o->grad_shadow_rnd != 0 && nn__on_gpu(o) && o->grad_shadow_reserved == NULL) {
        o->grad_shadow_reserved = res_alloc(g, run, n * 2);
        if (o->grad_shadow_reserved == NULL) {
            return 0;
        }
        *mine |= 2;
    }
    return 1;
}

/* After the segment's backward, before its rewind: o's gradient and shadow must not lie above
 * the mark. */
static void release_outer(nn_ctx *g, nn_tensor *o, unsigned char mine)
{
    /* Still borrowing (maybe memory the segment allocated): into the memory set aside. */
    if (o->grad_borrowed && !accel__nn_grad_own(g, o)) {
        o->grad = NULL; /* out of memory: the ctx error stands */
        o->grad_borrowed = 0;
    }
    /* used (the gradient exists now) or ours: an unused one of ours dies with the step */
    if ((mine & 1) || o->grad != NULL) {
        o->grad_reserved = NULL;
    }
    /* A rounded copy not in the memory set aside lies above the mark: it dies with the
     * rewind. */
    if (o->grad_shadow != NULL && o->grad_shadow != o->grad_shadow_reserved) {
        o->grad_shadow = NULL;
    }
    if (mine & 2) {
        o->grad_shadow_reserved = NULL;
    }
}

static void checkpoint_backward(nn_ctx *g, nn_node *n)
{
    nn_segment *s = n->p[0];
    unsigned char *mine = accel__nn_tmp_alloc(g, (size_t)s->n_outer + 1);
    if (mine == NULL) {
        return;
    }
    for (int k = 0; k < s->n_outer; k++) {
        if (!reserve_outer(g, s->outer[k], &mine[k], NULL)) {
            return;
        }
    }
    run_state now = get_state(g);
    nn_arena_mark m = accel__nn_arena_mark(g);
    g->tape = NULL; /* the second run records a tape of its own */
    g->n_nodes = 0;
    set_state(g, &s->first);

    nn_tensor *y = s->fn(g, s->fn_ctx, n->in[0]);
    if (g->first_err != ACCEL_OK) {
        /* an op of the second run failed: its message stands */
    } else if (y == NULL || y->base != NULL || y->grad != NULL || !y->requires_grad ||
               !accel__nn_arena_after(g, &m, y) || !accel__nn_same_shape(y, n->out)) {
        char s1[64], s2[64];
        accel__nn_fail(g, ACCEL_EINVAL,
                       "nn_checkpoint: the segment's second run returned %s, not a new tensor "
                       "%s as the first run did (the function must compute the same thing on "
                       "every run)",
                       y == NULL ? "NULL" : accel__nn_shape_str(y, s1, sizeof(s1)),
                       accel__nn_shape_str(n->out, s2, sizeof(s2)));
    } else {
        y->grad = n->out->grad;
        accel_status st = accel__nn_replay(g, NULL);
        if (st != ACCEL_OK && g->first_err == ACCEL_OK) {
            accel__nn_fail(g, st, "%s", accel_last_error(NULL));
        }
    }

    for (int k = 0; k < s->n_outer; k++) {
        release_outer(g, s->outer[k], mine[k]);
    }
    set_state(g, &now);
    accel__nn_arena_rewind(g, &m);
}

/* ---- segments whose backward rewinds (without recomputation: a GPT block) ---- */

/* Whether GPT blocks' backward rewinds (ACCEL_NN_REWIND: 0 keeps every gradient to the
 * step's end, as before, for A/B runs; the test hook overrides it). */
void accel__nn_set_rewind(int on)
{
    accel__nn_switch_set(ACCEL__NN_SW_REWIND, on);
}

/* On the segment's newest node: the node below the segment and its inputs from outside. */
typedef struct nn_rewind {
    nn_node *stop;
    /* The segment below (the one marked before it), when this one's reservations die once
     * that one is back-propagated (dies_below), else NULL. */
    struct nn_rewind *below;
    int n_outer;
    struct {
        nn_tensor *t;
        unsigned char mine;
        void *mem[2]; /* what reserve_outer set aside (gradient, shadow), this backward */
        size_t nbytes[2];
    } outer[];
} nn_rewind;

static int made_by(const nn_node *top, const nn_node *stop, const nn_tensor *t)
{
    for (const nn_node *n = top; n != stop; n = n->prev) {
        if (n->out == t) {
            return 1;
        }
    }
    return 0;
}

/* Whether r's gradients set aside are dead once the segment below (its newest node
 * below_top) is back-propagated too: r's inputs from outside are made by the nodes between the
 * two or by that segment, and the nodes between read (lend gradients to) only what they or
 * that segment make, whose gradients nothing further down reads. A GPT block's: its input,
 * the residual add's sum, made by the block below (which ends with that add). */
static int dies_below(const nn_rewind *r, const nn_node *below_top)
{
    const nn_node *below_stop = below_top->rewind->stop;
    for (int k = 0; k < r->n_outer; k++) {
        if (!made_by(r->stop, below_top, r->outer[k].t) &&
            !made_by(below_top, below_stop, r->outer[k].t)) {
            return 0;
        }
    }
    for (const nn_node *n = r->stop; n != below_top; n = n->prev) {
        for (int k = 0; k < n->n_in; k++) {
            const nn_tensor *o = n->in[k] != NULL ? owner_of(n->in[k]) : NULL;
            if (o != NULL && o->requires_grad && o->param_index < 0 &&
                !made_by(r->stop, below_top, o) && !made_by(below_top, below_stop, o)) {
                return 0;
            }
        }
    }
    return 1;
}

int accel__nn_rewind_segment(nn_ctx *g, nn_node *top, nn_node *before)
{
    int n_in = 0;
    if (!accel__nn_switch(ACCEL__NN_SW_REWIND)) {
        return 1;
    }
    for (nn_node *n = top; n != before; n = n->prev) {
        if (n == NULL || n->rewind != NULL) {
            /* before is not on the tape, or segments would nest: left as it is */
            return 1;
        }
        n_in += n->n_in;
    }
    if (top == before) {
        return 1;
    }
    nn_rewind *r = accel__nn_alloc(g, sizeof(*r) + (size_t)n_in * sizeof(r->outer[0]));
    if (r == NULL) {
        return 0;
    }
    r->stop = before;
    r->n_outer = 0;
    /* Inputs from outside: gradients wanted, not a parameter's (the model's buffer), not made
     * by a node of the segment (their gradients die with it: nothing below reads them). */
    for (nn_node *n = top; n != before; n = n->prev) {
        for (int k = 0; k < n->n_in; k++) {
            nn_tensor *o = n->in[k] != NULL ? owner_of(n->in[k]) : NULL;
            if (o == NULL || !o->requires_grad || o->param_index >= 0 || made_by(top, before, o)) {
                continue;
            }
            int seen = 0;
            for (int j = 0; j < r->n_outer && !seen; j++) {
                seen = r->outer[j].t == o;
            }
            if (!seen) {
                r->outer[r->n_outer++].t = o;
            }
        }
    }
    r->below = NULL;
    nn_node *n = before;
    while (n != NULL && n->rewind == NULL) {
        n = n->prev;
    }
    if (n != NULL && dies_below(r, n)) {
        r->below = n->rewind;
    }
    top->rewind = r;
    return 1;
}

accel_status accel__nn_rewind_begin(nn_ctx *g, nn_rewind_run *run, nn_node *n)
{
    if (run->seg != NULL) {
        return ACCEL_OK; /* one at a time (accel__nn_rewind_segment does not nest them) */
    }
    nn_rewind *r = n->rewind;
    for (int k = 0; k < r->n_outer; k++) {
        nn_tensor *o = r->outer[k].t;
        int ok = reserve_outer(g, o, &r->outer[k].mine, run);
        size_t nbytes = (size_t)nn_numel(o) * sizeof(float);
        r->outer[k].mem[0] = r->outer[k].mine & 1 ? o->grad_reserved : NULL;
        r->outer[k].mem[1] = r->outer[k].mine & 2 ? o->grad_shadow_reserved : NULL;
        r->outer[k].nbytes[0] = nbytes;
        r->outer[k].nbytes[1] = nbytes / 2;
        if (!ok) {
            accel_status st = g->first_err != ACCEL_OK ? g->first_err : ACCEL_ENOMEM;
            return accel__seterr(NULL, st, "nn_backward: %s", g->first_msg);
        }
    }
    run->seg = r;
    run->m = accel__nn_arena_mark(g);
    return ACCEL_OK;
}

void accel__nn_rewind_end(nn_ctx *g, nn_rewind_run *run, const nn_node *n)
{
    nn_rewind *r = run->seg;
    if (r == NULL || (n != NULL && n != r->stop)) {
        return;
    }
    for (int k = 0; k < r->n_outer; k++) {
        release_outer(g, r->outer[k].t, r->outer[k].mine);
    }
    accel__nn_arena_rewind(g, &run->m);
    run->seg = NULL;
    /* The segment ended before this one set aside memory that is dead now: the next
     * segment's reservations may take it. */
    nn_rewind *above = run->last;
    run->n_spare = 0;
    for (int k = 0; above != NULL && above->below == r && k < above->n_outer; k++) {
        for (int j = 0; j < 2 && run->n_spare < NN_REWIND_SPARE; j++) {
            if (above->outer[k].mem[j] != NULL) {
                run->spare[run->n_spare] = above->outer[k].mem[j];
                run->spare_nbytes[run->n_spare++] = above->outer[k].nbytes[j];
            }
        }
    }
    run->last = r;
}

/* Collects the segment's outer inputs into outer (room for 4 per node; returns how many) and
 * chains the parameters its nodes would hand to grad_ready, newest node first (the order plain
 * backward reports them in), into *ready. */
static int collect(nn_ctx *g, const nn_arena_mark *m, nn_tensor **outer, nn_tensor **ready)
{
    int n_outer = 0;
    nn_tensor *tail = NULL;
    *ready = NULL;
    for (nn_node *n = g->tape; n != m->tape; n = n->prev) {
        if (n->ready != NULL) {
            if (tail != NULL) {
                tail->next_ready = n->ready;
            } else {
                *ready = n->ready;
            }
            for (tail = n->ready; tail->next_ready != NULL; tail = tail->next_ready) {
            }
        }
        for (int k = 0; k < n->n_in; k++) {
            nn_tensor *o = n->in[k] != NULL ? owner_of(n->in[k]) : NULL;
            if (o == NULL || !o->requires_grad || o->param_index >= 0 ||
                accel__nn_arena_after(g, m, o)) {
                continue;
            }
            int seen = 0;
            for (int j = 0; j < n_outer && !seen; j++) {
                seen = outer[j] == o;
            }
            if (!seen) {
                outer[n_outer++] = o;
            }
        }
    }
    return n_outer;
}

/* After the first run: the segment's memory back, a copy of its output and one node. */
static nn_tensor *close_segment(nn_ctx *g, const nn_arena_mark *m, nn_segment *proto, nn_tensor *x,
                                nn_tensor *y)
{
    nn_tmp_mark tm = accel__nn_tmp_mark(g);
    nn_tensor **outer =
        accel__nn_tmp_alloc(g, (size_t)(4 * (g->n_nodes - m->n_nodes) + 1) * sizeof(*outer));
    if (outer == NULL) {
        accel__nn_arena_keep(g, m);
        return NULL;
    }
    nn_tensor *ready;
    int n_outer = collect(g, m, outer, &ready);
    int ndim = y->ndim;
    int64_t shape[NN_MAX_DIMS];
    memcpy(shape, y->shape, sizeof(shape));
    const float *src = y->data;
    accel__nn_arena_rewind(g, m);

    /* The output first: its struct cannot reach the old output's data, which lies above the
     * old output's struct; its data moves down. Then the node, once the data is safe. */
    nn_tensor *out = accel__nn_new(g, ndim, shape);
    accel_status st = out != NULL
                          ? move_data(g, out->data, src, (size_t)nn_numel(out) * sizeof(float))
                          : ACCEL_OK;
    if (out != NULL && st != ACCEL_OK) {
        out = accel__nn_fail(g, st, "nn_checkpoint: %s", accel_last_error(NULL));
    }
    nn_segment *s =
        out != NULL ? accel__nn_alloc(g, sizeof(*s) + (size_t)n_outer * sizeof(nn_tensor *)) : NULL;
    nn_node *n =
        s != NULL ? accel__nn_record(g, "checkpoint", out, &x, 1, checkpoint_backward) : NULL;
    if (n != NULL) {
        *s = *proto;
        s->n_outer = n_outer;
        memcpy(s->outer, outer, (size_t)n_outer * sizeof(*outer));
        n->p[0] = s;
        /* The segment's parameters complete when the whole segment is back-propagated. */
        nn_tensor **end = &n->ready;
        while (*end != NULL) {
            end = &(*end)->next_ready;
        }
        *end = ready;
    }
    accel__nn_tmp_release(g, tm);
    return n != NULL ? out : NULL;
}

nn_tensor *nn_checkpoint(nn_ctx *g, nn_segment_fn fn, void *fn_ctx, nn_tensor *x)
{
    if (g == NULL || fn == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn_checkpoint: %s is NULL", g ? "fn" : "ctx");
    }
    if (x == NULL) {
        return NULL;
    }
    if (g->backward_done) {
        nn_ctx_reset(g); /* as the first allocation would: the mark must be of the new step */
    }
    if (!g->grad_enabled) {
        return fn(g, fn_ctx, x);
    }
    nn_segment proto = {.fn = fn, .fn_ctx = fn_ctx, .first = get_state(g)};
    nn_arena_mark m = accel__nn_arena_mark(g);
    nn_tensor *y = fn(g, fn_ctx, x);
    if (y == NULL || !y->requires_grad || g->tape == m.tape) {
        /* Failed (the op's message stands), or nothing to back-propagate: keep it as is. */
        accel__nn_arena_keep(g, &m);
        return y;
    }
    if (y->base != NULL || !accel__nn_arena_after(g, &m, y)) {
        accel__nn_arena_keep(g, &m);
        return accel__nn_fail(g, ACCEL_EINVAL,
                              "nn_checkpoint: the segment returned %s; it must return a tensor "
                              "one of its ops made (reshape after the checkpoint instead)",
                              y->base != NULL ? "a view" : "a tensor from outside it");
    }
    return close_segment(g, &m, &proto, x, y);
}
