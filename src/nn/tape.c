/*
 * The nn tape and the reverse-mode replay: ops record nodes (carved from the ctx's arena, like
 * the intermediate gradients they write), and nn_backward replays them in reverse.
 *
 * Invariant: a parameter's grad_ready hook fires right after the earliest tape node that uses
 * it is replayed: that node is the last one to contribute to its gradient.
 */
#include <string.h>

#include "nn_gpu.h"

int accel__nn_needs_grad(nn_ctx *g, nn_tensor *const *in, int n_in)
{
    if (g == NULL || !g->grad_enabled) {
        return 0;
    }
    for (int k = 0; k < n_in; k++) {
        if (in[k] != NULL && in[k]->requires_grad) {
            return 1;
        }
    }
    return 0;
}

nn_node *accel__nn_record(nn_ctx *g, const char *op, nn_tensor *out, nn_tensor *const *in, int n_in,
                          nn_backward_fn bw)
{
    nn_node *n = accel__nn_zalloc(g, sizeof(*n));
    if (n == NULL) {
        return NULL;
    }
    n->backward = bw;
    n->op = op;
    n->out = out;
    n->n_in = n_in;
    for (int k = 0; k < n_in; k++) {
        n->in[k] = in[k];
        nn_tensor *owner = in[k] && in[k]->base ? in[k]->base : in[k];
        /* The first node to read a parameter is the last one backward reaches for it. */
        if (owner != NULL && owner->param_index >= 0 && owner->requires_grad &&
            (owner->use_ctx != g || owner->use_epoch != g->epoch)) {
            owner->use_ctx = g;
            owner->use_epoch = g->epoch;
            owner->next_ready = n->ready;
            n->ready = owner;
        }
    }
    n->prev = g->tape;
    g->tape = n;
    g->n_nodes++;
    out->requires_grad = 1;
    /* new_tensor stamped out with g and its epoch already, which lets nn_backward find the
     * tape from its output and tell an output from before a reset; an output made by hand
     * (recompute.c) is stamped here too. */
    out->use_ctx = g;
    out->use_epoch = g->epoch;
    return n;
}

float *accel__nn_grad(nn_ctx *g, nn_tensor *t)
{
    if (t == NULL || !t->requires_grad) {
        return NULL;
    }
    nn_tensor *owner = t->base ? t->base : t;
    /* The caller adds to the gradient: a rounded copy made before would go stale, and a
     * borrowed gradient needs memory of its own first. */
    owner->grad_shadow = NULL;
    if (!accel__nn_grad_own(g, owner)) {
        return NULL;
    }
    if (owner->grad == NULL && owner->grad_reserved != NULL) {
        /* Set aside by a recomputed segment (recompute.c): zero it as a fresh gradient. */
        size_t nbytes = (size_t)nn_numel(owner) * sizeof(float);
        accel_status st = nn__on_gpu(owner) ? accel__nn_gpu->zero(g, owner->grad_reserved, nbytes)
                                            : (memset(owner->grad_reserved, 0, nbytes), ACCEL_OK);
        if (st != ACCEL_OK) {
            accel__nn_fail(g, st, "%s", accel_last_error(NULL));
            return NULL;
        }
        owner->grad = owner->grad_reserved;
    }
    if (owner->grad == NULL) {
        /* Intermediate gradients come from the arena like the values (no reset can happen
         * here: backward_done is set only after the replay). */
        owner->grad = accel__nn_dzalloc(g, (size_t)nn_numel(owner) * sizeof(float));
        if (owner->grad == NULL) {
            return NULL;
        }
    }
    return owner->grad + t->offset;
}

float *accel__nn_grad_w(nn_ctx *g, nn_tensor *t, int *fresh)
{
    *fresh = 0;
    if (t != NULL && t->requires_grad && t->base == NULL && t->grad == NULL) {
        /* Nobody has written this gradient yet and t is its whole owner: the caller's write
         * is the first contribution, so it needs no zeroed buffer to add to. */
        t->grad = t->grad_reserved != NULL
                      ? t->grad_reserved
                      : accel__nn_dalloc(g, (size_t)nn_numel(t) * sizeof(float));
        t->grad_shadow = NULL;
        *fresh = t->grad != NULL;
        return t->grad;
    }
    return accel__nn_grad(g, t);
}

int accel__nn_grad_borrow(nn_ctx *g, nn_tensor *t, float *src)
{
    (void)g;
    if (t == NULL || !t->requires_grad || t->base != NULL || t->grad != NULL) {
        return 0;
    }
    t->grad = src;
    t->grad_borrowed = 1;
    t->grad_shadow = NULL;
    return 1;
}

float *accel__nn_grad_take(nn_ctx *g, nn_tensor *t, int *fresh, const float **base)
{
    *base = NULL;
    if (t != NULL && t->requires_grad && t->base == NULL && t->grad_borrowed) {
        /* Memory of its own: what a segment set aside for it (recompute.c), else new. */
        float *own = t->grad_reserved != NULL
                         ? t->grad_reserved
                         : accel__nn_dalloc(g, (size_t)nn_numel(t) * sizeof(float));
        if (own == NULL) {
            return NULL;
        }
        *base = t->grad;
        t->grad = own;
        t->grad_borrowed = 0;
        t->grad_shadow = NULL;
        *fresh = 1;
        return own;
    }
    return accel__nn_grad_w(g, t, fresh);
}

int accel__nn_grad_own(nn_ctx *g, nn_tensor *t)
{
    if (!t->grad_borrowed) {
        return 1;
    }
    size_t nbytes = (size_t)nn_numel(t) * sizeof(float);
    float *own = t->grad_reserved != NULL ? t->grad_reserved : accel__nn_dalloc(g, nbytes);
    if (own == NULL) {
        return 0;
    }
    accel_status st = nn__on_gpu(t) ? accel__nn_gpu->copy(g, own, t->grad, nbytes)
                                    : (memcpy(own, t->grad, nbytes), ACCEL_OK);
    if (st != ACCEL_OK) {
        accel__nn_fail(g, st, "%s", accel_last_error(NULL));
        return 0;
    }
    t->grad = own;
    t->grad_borrowed = 0;
    return 1;
}

accel_status accel__nn_replay(nn_ctx *g, const nn_backward_hooks *hooks)
{
    nn_fpscope fs;
    accel_status st = ACCEL_OK;
    nn_rewind_run rw;
    memset(&rw, 0, sizeof(rw));
    accel__nn_fp_enter(g, &fs);
    for (nn_node *n = g->tape; n != NULL && st == ACCEL_OK; n = n->prev) {
        accel__nn_rewind_end(g, &rw, n); /* the segment in progress ends above n? */
        if (n->rewind != NULL && (st = accel__nn_rewind_begin(g, &rw, n)) != ACCEL_OK) {
            break;
        }
        if (n->out->grad != NULL) {
            /* Parameters the node read must be present again for its backward (ZeRO-3 gathers
             * them per unit); the sink is the caller's code, run in its FP mode. */
            for (int k = 0; k < n->n_in && st == ACCEL_OK; k++) {
                if (n->in[k] != NULL && n->in[k]->sink_materialize != NULL) {
                    accel__nn_fp_pause(&fs);
                    st = accel__nn_param_use(n->in[k]);
                    accel__nn_fp_resume(&fs);
                }
            }
            if (st != ACCEL_OK) {
                st = accel__seterr(NULL, st, "nn_backward: %s: %s", n->op, accel_last_error(NULL));
                break;
            }
            nn_tmp_mark tm = accel__nn_tmp_mark(g);
            n->backward(g, n);
            accel__nn_tmp_release(g, tm);
            if (g->first_err != ACCEL_OK) {
                st = accel__seterr(NULL, g->first_err, "nn_backward: %s: %s", n->op, g->first_msg);
                break;
            }
        }
        if (n->ready != NULL && hooks != NULL && hooks->grad_ready != NULL) {
            /* Hooks are the caller's code (bucket launches): they run in its FP mode. */
            accel__nn_fp_pause(&fs);
            for (nn_tensor *p = n->ready; p != NULL && st == ACCEL_OK; p = p->next_ready) {
                st = hooks->grad_ready(hooks->ctx, p);
            }
            accel__nn_fp_resume(&fs);
        }
    }
    accel__nn_rewind_end(g, &rw, NULL);
    accel__nn_fp_leave(g, &fs);
    return st;
}

static accel_status backward_common(nn_tensor *out, const float *grad_out, float seed,
                                    const nn_backward_hooks *hooks)
{
    if (out == NULL) {
        /* The thread's message is the failing op's. */
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_backward: loss is NULL (a forward op failed: %s)",
                             accel_last_error(NULL));
    }
    if (out->base != NULL || out->param_index >= 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_backward: the output must be an op result, not a view/param");
    }
    nn_ctx *g = NULL;
    /* The ctx is reachable from the tape only; an output that is not on a tape has no graph. */
    if (!out->requires_grad) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_backward: output does not require grad (no-grad mode, or no "
                             "input requires grad)");
    }
    g = (nn_ctx *)out->use_ctx;
    if (g == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_backward: output has no tape");
    }
    if (out->use_epoch != g->epoch) {
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "nn_backward: the output is from before the ctx was reset (its tape "
                             "is gone; run the forward again)");
    }
    /* Every tensor of g carries its stamp, leaves too: an output is an op result when a node
     * of the tape made it (one walk of the host-side tape, once a backward). */
    const nn_node *made = g->tape;
    while (made != NULL && made->out != out) {
        made = made->prev;
    }
    if (made == NULL && !g->backward_done) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "nn_backward: the output is a leaf (nn_tensor_new / nn_tensor_from), "
                             "not an op result: it has no tape");
    }
    if (g->backward_done) {
        return accel__seterr(NULL, ACCEL_ESTATE,
                             "nn_backward: backward already ran on this tape (reset the ctx "
                             "and run a new forward)");
    }
    if (g->first_err != ACCEL_OK) {
        return accel__seterr(NULL, g->first_err, "nn_backward: forward failed: %s", g->first_msg);
    }
    float *gout = accel__nn_grad(g, out);
    if (gout == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nn_backward: out of memory");
    }
    int64_t n = nn_numel(out);
    if (nn__on_gpu(out)) {
        if (grad_out == NULL && n != 1) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "nn_backward: loss has %lld elements; pass a scalar or use "
                                 "nn_backward_grad",
                                 (long long)n);
        }
        accel_status st = accel__nn_gpu->add_host(g, gout, grad_out ? grad_out : &seed, n);
        if (st != ACCEL_OK) {
            return st;
        }
    } else if (grad_out != NULL) {
        for (int64_t i = 0; i < n; i++) {
            gout[i] += grad_out[i];
        }
    } else {
        if (n != 1) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "nn_backward: loss has %lld elements; pass a scalar or use "
                                 "nn_backward_grad",
                                 (long long)n);
        }
        gout[0] += seed;
    }
    accel_status st = accel__nn_replay(g, hooks);
    g->backward_done = 1;
    return st;
}

accel_status nn_backward(nn_tensor *loss, float seed, const nn_backward_hooks *hooks)
{
    return backward_common(loss, NULL, seed, hooks);
}

accel_status nn_backward_grad(nn_tensor *out, const float *grad_out, const nn_backward_hooks *hooks)
{
    if (grad_out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_backward_grad: grad_out is NULL");
    }
    return backward_common(out, grad_out, 0.0f, hooks);
}
