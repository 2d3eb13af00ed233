/*
 * The operands that products read under bf16 / fp16 autocast (accel__nn_cu_operand): a
 * tensor's half shadow when its producer wrote one (nn_tensor.shadow, grad_shadow: the 2-byte
 * values written in the producer's own pass), a parameter's working copy, else a rounding pass
 * of their own (accel__nn_cu_half_copy, counted for the tests). Also the switch that turns
 * shadows off (ACCEL_NN_SHADOW) and their allocation. Invariant: a shadow holds exactly the
 * values a rounding pass would make from the fp32 values, so reading it changes no bit.
 * Also whether a GPT block's qkv is made as a shell (accel__nn_cu_linear_qkv).
 */
#include <stdatomic.h>

#include "gpu_internal.h"

/* Rounding passes queued by accel__nn_cu_half_copy (accel__nn_cu_half_copies; ctxs may run
 * on several threads). */
static atomic_ulong n_half_copies;

unsigned long accel__nn_cu_half_copies(void)
{
    return n_half_copies;
}

/* Whether producers write half shadows (ACCEL_NN_SHADOW, read once; the test hook
 * accel__nn_cu_set_shadows): 1 (the default) or 0, every product operand rounded by its own
 * pass as before them (A/B timing, and the tests' reference for bit-identical results). */
void accel__nn_cu_set_shadows(int on)
{
    accel__nn_switch_set(ACCEL__NN_SW_SHADOW, on);
}

int accel__nn_cu_shadows_on(void)
{
    return accel__nn_switch(ACCEL__NN_SW_SHADOW);
}

int accel__nn_cu_shadow_rnd(const nn_ctx *g)
{
    return accel__nn_cu_shadows_on() ? accel__nn_cu_rnd(nn__autocast(g)) : 0;
}

void *accel__nn_cu_shadow_alloc(nn_ctx *g, nn_tensor *t, int rnd)
{
    void *h = accel__nn_dalloc(g, (size_t)nn_numel(t) * 2);
    if (h != NULL) {
        t->shadow = h;
        t->shadow_rnd = rnd;
    }
    return h;
}

void *accel__nn_cu_grad_shadow_alloc(nn_ctx *g, nn_tensor *t)
{
    if (t->base != NULL || t->grad_shadow_rnd == 0 || !accel__nn_cu_shadows_on()) {
        return NULL;
    }
    /* Memory a segment set aside (recompute.c), so the shadow outlives the segment's rewind. */
    if (t->grad_shadow_reserved != NULL) {
        return t->grad_shadow_reserved;
    }
    return accel__nn_dalloc(g, (size_t)nn_numel(t) * 2);
}

void *accel__nn_cu_half_copy(nn_ctx *g, const float *src, int64_t n, int rnd, int scratch,
                             const char *what)
{
    n_half_copies++;
    void *h = scratch ? accel__nn_dtmp_alloc(g, (size_t)n * 2) : accel__nn_dalloc(g, (size_t)n * 2);
    if (h == NULL ||
        (n > 0 && !accel__nn_cu_ok(g, nn_cu_to_half(nn__cu_stream(g), src, h, n, rnd), what))) {
        return NULL;
    }
    return h;
}

/* The operand as the product reads it: t itself in fp32; under autocast the shadow its
 * producer wrote (of t's owner: a contiguous view reads it at its offset), or a parameter's
 * working copy on the GPU when the model keeps one in that dtype (the master rounded, the
 * same values a copy would hold, valid from accel_prepare to the next optimizer step), else a
 * rounded 2-byte copy (in the arena; per-op scratch with `scratch`). */
const void *accel__nn_cu_operand(nn_ctx *g, const nn_tensor *t, int rnd, int scratch,
                                 const char *what)
{
    const nn_tensor *owner = t->base != NULL ? t->base : t;
    if (rnd != 0 && owner->shadow != NULL && owner->shadow_rnd == rnd) {
        return (const uint16_t *)owner->shadow + t->offset;
    }
    if (owner->data == NULL && nn_numel(owner) > 0) { /* a shell read in another dtype */
        accel__nn_fail(g, ACCEL_EINVAL,
                       "%s: the input holds only its %s copy (a GPT block's LayerNorm output) "
                       "and the product reads %s",
                       what, owner->shadow_rnd == 1 ? "bf16" : "fp16",
                       rnd == 1 ? "bf16" : rnd == 2 ? "fp16" : "fp32");
        return NULL;
    }
    if (rnd == 0) {
        return t->data;
    }
    if (t->sink_compute != NULL && t->base == NULL && t->param_index >= 0) {
        accel_tensor c;
        t->sink_compute(t->sink_ctx, t->param_index, &c);
        if (c.data != NULL && c.device.type == ACCEL_DEVICE_CUDA &&
            c.dtype == (rnd == 1 ? ACCEL_BF16 : ACCEL_F16)) {
            return c.data;
        }
    }
    return accel__nn_cu_half_copy(g, t->data, nn_numel(t), rnd, scratch, what);
}

/* The attention's own arguments are checked by nn_causal_attention (accel__nn_attention_args):
 * here only what decides the shell, with that op's arithmetic (B, T, C = 3C / 3, head size,
 * scale, the dropout in training), so the attention finds the kernels that read qkv only
 * rounded whenever qkv is a shell. Anything else (CPU-shaped or odd arguments included) takes
 * nn_linear, whose output the attention reads as today. */
nn_tensor *accel__nn_cu_linear_qkv(nn_ctx *g, nn_tensor *x, nn_tensor *w, nn_tensor *b,
                                   nn_layout layout, int n_head, float attn_dropout)
{
    accel__nn_cu_attn_env(); /* ACCEL_NN_ATTN(_FAST), read before the first attention's */
    int rnd = accel__nn_cu_shadow_rnd(g);
    int64_t out = w != NULL && w->ndim == 2 ? w->shape[layout == NN_LAYOUT_IN_OUT ? 1 : 0] : 0;
    if (rnd == 1 && x != NULL && x->ndim == 3 && x->shape[2] > 0 && nn_numel(x) > 0 &&
        n_head > 0 && out > 0 && out % (3 * (int64_t)n_head) == 0) {
        nn_cu_attn a = accel__nn_cu_attn_of(g, x->shape[0], x->shape[1], out / 3, n_head,
                                            attn_dropout);
        float *scratch = a.hd == 64 && a.p <= 0.0f ? accel__nn_dalloc(g, sizeof(float)) : NULL;
        if (scratch != NULL && nn_cu_attn_half_only(nn__cu_stream(g), &a, scratch)) {
            return accel__nn_cu_linear_shell(g, x, w, b, layout, rnd);
        }
    }
    return accel__nn_cu_linear(g, x, w, b, layout);
}
