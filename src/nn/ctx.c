/*
 * The nn ctx: the per-step arena, the per-op scratch stack and tensors (the tape and the
 * reverse-mode replay: tape.c).
 *
 * Invariants: every intermediate, tape node and intermediate gradient is carved from the
 * arena; a reset keeps the memory (coalescing blocks into one when the step needed more than
 * the first block), so from the second identical step on nothing is allocated. Per-op scratch
 * is released when the op (or the node's backward) returns; with nothing live it shrinks to
 * one block of the peak need, so steady steps allocate nothing there either.
 */
#include <stdarg.h>
#include <stdio.h>

#include "nn_gpu.h"

#define NN_ALIGN 64
#define NN_FIRST_BLOCK_NBYTES ((size_t)1 << 20)
#define NN_GPU_GROW_MAX ((size_t)1 << 30)

accel_status nn_ctx_new(nn_ctx **out)
{
    if (out == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "nn_ctx_new: out is NULL");
    }
    nn_ctx *g = accel__calloc(1, sizeof(*g));
    if (g == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "nn_ctx_new: out of memory");
    }
    g->grad_enabled = 1;
    g->training = 1;
    g->epoch = 1;
    g->autocast_mode = NN_AUTOCAST_AUTO;
    g->autocast_auto = ACCEL_F32;
    g->flush_denormal = 1;
    *out = g;
    return ACCEL_OK;
}

void accel__nn_free_blocks(nn_block *b, int gpu)
{
    while (b != NULL) {
        nn_block *next = b->next;
        if (gpu) {
            accel__nn_gpu->free(b->mem);
        } else {
            accel__aligned_free(b->mem);
        }
        accel__free(b);
        b = next;
    }
}

void nn_ctx_free(nn_ctx *g)
{
    if (g == NULL) {
        return;
    }
    accel__nn_free_blocks(g->blocks, 0);
    accel__nn_free_blocks(g->tmp.top, 0);
    accel__nn_drop_gpu(g);
    accel__free(g);
}

static nn_block *new_block(size_t cap, int gpu)
{
    nn_block *b = accel__calloc(1, sizeof(*b));
    if (b == NULL) {
        return NULL;
    }
    b->mem = gpu ? accel__nn_gpu->alloc(cap) : accel__aligned_alloc(cap);
    if (b->mem == NULL) {
        accel__free(b);
        return NULL;
    }
    b->cap = cap;
    return b;
}

/* Several blocks mean this step outgrew the arena: replace them by one block holding them
 * all, so the next identical step fits without allocating. */
static void coalesce(nn_ctx *g, nn_block **blocks, size_t total_cap, int gpu)
{
    if (gpu && *blocks != NULL && (*blocks)->next != NULL) {
        /* Device memory is the scarce one: the one block holds what the step used (the same
         * allocations, back to back), and the blocks go before it comes, so the step's need
         * is never held twice. Should it not come, the next step regrows. */
        size_t need = g->dpeak; /* the most live at once: rewound segments reuse memory */
        accel__nn_free_blocks(*blocks, gpu);
        *blocks = need > 0 ? new_block(need, gpu) : NULL;
        g->dtotal_cap = *blocks != NULL ? need : 0;
        g->n_grows++;
        return;
    }
    if (*blocks != NULL && (*blocks)->next != NULL) {
        nn_block *one = new_block(total_cap, gpu);
        if (one != NULL) {
            accel__nn_free_blocks(*blocks, gpu);
            *blocks = one;
            g->n_grows++;
        }
    }
    for (nn_block *b = *blocks; b != NULL; b = b->next) {
        b->used = 0;
    }
}

void nn_ctx_reset(nn_ctx *g)
{
    if (g == NULL) {
        return;
    }
    coalesce(g, &g->blocks, g->total_cap, 0);
    coalesce(g, &g->dblocks, g->dtotal_cap, 1);
    g->tape = NULL;
    g->n_nodes = 0;
    g->live = g->dlive = g->dpeak = g->peak = 0;
    g->dfloor = NULL;
    g->op_counter = 0;
    g->backward_done = 0;
    g->first_err = ACCEL_OK;
    g->first_msg[0] = '\0';
    g->step++;
    g->epoch++;
}

/* The settings below accept a NULL ctx as a no-op (returning 0), like
 * nn_ctx_set_flush_denormal: a failed nn_ctx_new must not turn into a crash here. */
int nn_ctx_set_grad_enabled(nn_ctx *g, int enabled)
{
    if (g == NULL) {
        return 0;
    }
    int prev = g->grad_enabled;
    g->grad_enabled = enabled != 0;
    return prev;
}

int nn_ctx_set_training(nn_ctx *g, int training)
{
    if (g == NULL) {
        return 0;
    }
    int prev = g->training;
    g->training = training != 0;
    return prev;
}

void nn_ctx_set_seed(nn_ctx *g, uint64_t seed)
{
    if (g == NULL) {
        return;
    }
    g->seed = seed;
}

void nn_ctx_set_step(nn_ctx *g, uint64_t step)
{
    if (g == NULL) {
        return;
    }
    g->step = step;
}

uint64_t nn_ctx_step(const nn_ctx *g)
{
    return g != NULL ? g->step : 0;
}

nn_ctx_stats nn_ctx_get_stats(const nn_ctx *g)
{
    nn_ctx_stats s;
    memset(&s, 0, sizeof(s));
    if (g == NULL) {
        return s;
    }
    for (const nn_block *b = g->blocks; b != NULL; b = b->next) {
        s.reserved_nbytes += b->cap;
        s.used_nbytes += b->used;
        s.n_blocks++;
    }
    s.n_grows = g->n_grows;
    s.n_nodes = g->n_nodes;
    for (const nn_block *b = g->tmp.top; b != NULL; b = b->next) {
        s.scratch_nbytes += b->cap;
    }
    s.scratch_peak_nbytes = g->tmp.peak;
    s.peak_nbytes = g->peak;
    return s;
}

/* Bump allocation from an arena of blocks (host, or the device arena when gpu). */
static void *arena_alloc(nn_ctx *g, nn_block **blocks, size_t *total_cap, int gpu, size_t nbytes)
{
    if (g->backward_done) {
        nn_ctx_reset(g);
    }
    nbytes = (nbytes + NN_ALIGN - 1) & ~(size_t)(NN_ALIGN - 1);
    if (nbytes == 0) {
        nbytes = NN_ALIGN;
    }
    nn_block *b = *blocks;
    /* First fit on a GPU (its arena grows in bounded blocks, whose tails are worth filling),
     * down to the floor of the innermost arena mark; the host arena takes the newest block
     * only. */
    while (gpu && b != NULL && b->used + nbytes > b->cap) {
        b = b == g->dfloor ? NULL : b->next;
    }
    if (b == NULL || b->used + nbytes > b->cap) {
        /* Grow geometrically so the first step needs few blocks; on a GPU by at most
         * NN_GPU_GROW_MAX, so what is reserved stays near the need (doubling past half of the
         * GPU's memory would fail where the need fits). */
        size_t cap = *total_cap < NN_FIRST_BLOCK_NBYTES ? NN_FIRST_BLOCK_NBYTES : *total_cap;
        if (gpu && cap > NN_GPU_GROW_MAX) {
            cap = NN_GPU_GROW_MAX;
        }
        if (cap < nbytes) {
            cap = nbytes;
        }
        b = new_block(cap, gpu);
        if (b == NULL) {
            accel__nn_fail(g, ACCEL_ENOMEM, "nn arena%s: out of memory allocating %zu bytes",
                           gpu ? " (GPU)" : "", cap);
            return NULL;
        }
        b->next = *blocks;
        *blocks = b;
        *total_cap += cap;
        g->n_grows++;
    }
    void *p = b->mem + b->used;
    b->used += nbytes;
    size_t *live = gpu ? &g->dlive : &g->live;
    *live += nbytes;
    if (gpu && g->dlive > g->dpeak) {
        g->dpeak = g->dlive;
    }
    if (g->live + g->dlive > g->peak) {
        g->peak = g->live + g->dlive;
    }
    return p;
}

void *accel__nn_alloc(nn_ctx *g, size_t nbytes)
{
    /* Every op allocates its output before it touches the ctx otherwise, so this is where an
     * op given a NULL ctx stops. */
    if (g == NULL) {
        accel__seterr(NULL, ACCEL_EINVAL, "nn op: ctx is NULL");
        return NULL;
    }
    return arena_alloc(g, &g->blocks, &g->total_cap, 0, nbytes);
}

void *accel__nn_zalloc(nn_ctx *g, size_t nbytes)
{
    void *p = accel__nn_alloc(g, nbytes);
    if (p != NULL) {
        memset(p, 0, nbytes);
    }
    return p;
}

void *accel__nn_dalloc(nn_ctx *g, size_t nbytes)
{
    if (g == NULL || g->device.type != ACCEL_DEVICE_CUDA) {
        return accel__nn_alloc(g, nbytes);
    }
    return arena_alloc(g, &g->dblocks, &g->dtotal_cap, 1, nbytes);
}

void *accel__nn_dzalloc(nn_ctx *g, size_t nbytes)
{
    if (g->device.type != ACCEL_DEVICE_CUDA) {
        return accel__nn_zalloc(g, nbytes);
    }
    void *p = accel__nn_dalloc(g, nbytes);
    if (p != NULL) {
        accel_status st = accel__nn_gpu->zero(g, p, nbytes);
        if (st != ACCEL_OK) {
            accel__nn_fail(g, st, "%s", accel_last_error(NULL));
            return NULL;
        }
    }
    return p;
}

nn_tmp_mark accel__nn_tmp_mark(const nn_ctx *g)
{
    nn_tmp_mark m = {g->tmp.top,  g->tmp.top != NULL ? g->tmp.top->used : 0,   g->tmp.live,
                     g->dtmp.top, g->dtmp.top != NULL ? g->dtmp.top->used : 0, g->dtmp.live};
    return m;
}

static void *stack_alloc(nn_ctx *g, nn_stack *s, int gpu, size_t nbytes)
{
    nbytes = (nbytes + NN_ALIGN - 1) & ~(size_t)(NN_ALIGN - 1);
    if (nbytes == 0) {
        nbytes = NN_ALIGN;
    }
    nn_block *b = s->top;
    if (b == NULL || b->used + nbytes > b->cap) {
        /* The first block after a full release holds the peak need, so a steady loop needs
         * one block and no allocation. */
        size_t want = s->live == 0 ? s->peak : NN_FIRST_BLOCK_NBYTES;
        size_t cap = nbytes > want ? nbytes : want;
        b = new_block(cap, gpu);
        if (b == NULL) {
            accel__nn_fail(g, ACCEL_ENOMEM, "nn scratch%s: out of memory allocating %zu bytes",
                           gpu ? " (GPU)" : "", cap);
            return NULL;
        }
        b->next = s->top;
        s->top = b;
    }
    void *p = b->mem + b->used;
    b->used += nbytes;
    s->live += nbytes;
    if (s->live > s->peak) {
        s->peak = s->live;
    }
    return p;
}

void *accel__nn_tmp_alloc(nn_ctx *g, size_t nbytes)
{
    return stack_alloc(g, &g->tmp, 0, nbytes);
}

void *accel__nn_dtmp_alloc(nn_ctx *g, size_t nbytes)
{
    return stack_alloc(g, g->device.type == ACCEL_DEVICE_CUDA ? &g->dtmp : &g->tmp,
                       g->device.type == ACCEL_DEVICE_CUDA, nbytes);
}

static void stack_release(nn_stack *s, int gpu, nn_block *top, size_t used, size_t live)
{
    if (live == 0) {
        /* Nothing outlives this release: keep one block, of the peak need. */
        if (s->top != NULL && (s->top->next != NULL || s->top->cap < s->peak)) {
            accel__nn_free_blocks(s->top, gpu);
            s->top = NULL;
        } else if (s->top != NULL) {
            s->top->used = 0;
        }
        s->live = 0;
        return;
    }
    while (s->top != top) { /* blocks taken after the mark (it had one: live > 0) */
        nn_block *b = s->top;
        s->top = b->next;
        b->next = NULL;
        accel__nn_free_blocks(b, gpu);
    }
    s->top->used = used;
    s->live = live;
}

void accel__nn_tmp_release(nn_ctx *g, nn_tmp_mark mark)
{
    stack_release(&g->tmp, 0, mark.top, mark.used, mark.live);
    if (g->dtmp.top != NULL || mark.dlive != 0) {
        stack_release(&g->dtmp, 1, mark.dtop, mark.dused, mark.dlive);
    }
}

nn_tensor *accel__nn_fail(nn_ctx *g, accel_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (g != NULL && g->first_err == ACCEL_OK) {
        va_list ap2;
        va_copy(ap2, ap);
        vsnprintf(g->first_msg, sizeof(g->first_msg), fmt, ap2);
        va_end(ap2);
        g->first_err = st;
    }
    accel__vseterr(NULL, st, fmt, ap);
    va_end(ap);
    return NULL;
}

static void set_contig_strides(nn_tensor *t)
{
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->stride[d] = s;
        s *= t->shape[d];
    }
}

/* zero: 1 zeroed data, 0 uninitialised, -1 none (data NULL: accel__nn_new_shell). */
static nn_tensor *new_tensor(nn_ctx *g, int ndim, const int64_t *shape, int zero,
                             size_t elem_nbytes)
{
    if (ndim < 0 || ndim > NN_MAX_DIMS) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn tensor: ndim %d out of range 0..%d", ndim,
                              NN_MAX_DIMS);
    }
    if (ndim > 0 && shape == NULL) {
        return accel__nn_fail(g, ACCEL_EINVAL, "nn tensor: shape is NULL for ndim %d", ndim);
    }
    /* The byte count must fit in a ptrdiff_t: a product that wraps (2^40 x 2^40 is 0 mod 2^64)
     * would otherwise make a small buffer for a huge shape and every op would run past it.
     * The product of the nonzero sizes is bounded too, as the strides are made from it. */
    int64_t n = 1, nonzero = 1;
    const int64_t max_count = PTRDIFF_MAX / (int64_t)(elem_nbytes > 0 ? elem_nbytes : 1);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            return accel__nn_fail(g, ACCEL_EINVAL, "nn tensor: negative size in dim %d", d);
        }
        if (shape[d] > 0 && nonzero > max_count / shape[d]) {
            return accel__nn_fail(g, ACCEL_EINVAL,
                                  "nn tensor: shape too large (dim %d of size %lld overflows "
                                  "the element count)",
                                  d, (long long)shape[d]);
        }
        n *= shape[d];
        nonzero *= shape[d] > 0 ? shape[d] : 1;
    }
    nn_tensor *t = accel__nn_zalloc(g, sizeof(*t));
    if (t == NULL) {
        return NULL;
    }
    if (zero >= 0) {
        t->data = zero ? accel__nn_dzalloc(g, (size_t)n * elem_nbytes)
                       : accel__nn_dalloc(g, (size_t)n * elem_nbytes);
        if (t->data == NULL) {
            return NULL;
        }
    }
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
    }
    set_contig_strides(t);
    t->param_index = -1;
    t->device_type = g->device.type;
    /* Whose and which step's: ops refuse a tensor of another ctx or of an earlier step
     * (accel__nn_input_ok). Stamped after the allocations, which may have reset g. */
    t->use_ctx = g;
    t->use_epoch = g->epoch;
    return t;
}

nn_tensor *accel__nn_new(nn_ctx *g, int ndim, const int64_t *shape)
{
    return new_tensor(g, ndim, shape, 0, sizeof(float));
}

nn_tensor *accel__nn_new_half(nn_ctx *g, int ndim, const int64_t *shape)
{
    return new_tensor(g, ndim, shape, 0, 2);
}

nn_tensor *accel__nn_new_shell(nn_ctx *g, int ndim, const int64_t *shape)
{
    return new_tensor(g, ndim, shape, -1, 0);
}

nn_tensor *nn_tensor_new(nn_ctx *g, int ndim, const int64_t *shape)
{
    if (g == NULL) {
        accel__seterr(NULL, ACCEL_EINVAL, "nn_tensor_new: ctx is NULL");
        return NULL;
    }
    return new_tensor(g, ndim, shape, 1, sizeof(float));
}

nn_tensor *nn_tensor_from(nn_ctx *g, const float *data, int ndim, const int64_t *shape)
{
    if (g == NULL || data == NULL) {
        accel__seterr(NULL, ACCEL_EINVAL, "nn_tensor_from: %s is NULL", g ? "data" : "ctx");
        return NULL;
    }
    nn_tensor *t = new_tensor(g, ndim, shape, 0, sizeof(float));
    size_t nbytes = t != NULL ? (size_t)nn_numel(t) * sizeof(float) : 0;
    if (nn__on_gpu(t)) {
        accel_status st = accel__nn_gpu->to_device(g, t->data, data, nbytes);
        return st == ACCEL_OK ? t
                              : accel__nn_fail(g, st, "nn_tensor_from: %s", accel_last_error(NULL));
    }
    if (t != NULL) {
        memcpy(t->data, data, nbytes);
    }
    return t;
}

nn_tensor *nn_tensor_requires_grad(nn_tensor *t, int requires_grad)
{
    if (t != NULL) {
        t->requires_grad = requires_grad != 0;
    }
    return t;
}

int64_t nn_numel(const nn_tensor *t)
{
    if (t == NULL) {
        return 0;
    }
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        n *= t->shape[d];
    }
    return n;
}

int nn_is_contiguous(const nn_tensor *t)
{
    if (t == NULL) {
        return 0;
    }
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != s) {
            return 0;
        }
        s *= t->shape[d];
    }
    return 1;
}

float *nn_tensor_grad(const nn_tensor *t)
{
    if (t == NULL) {
        return NULL;
    }
    const nn_tensor *owner = t->base ? t->base : t;
    return owner->grad ? owner->grad + t->offset : NULL;
}

float nn_item(const nn_tensor *t)
{
    /* Reading element 0 of an empty tensor, or of one whose values exist only as a half
     * shadow, would read past (or through) its memory: NaN with a message instead. */
    if (t == NULL || t->data == NULL) {
        accel__seterr(NULL, ACCEL_EINVAL, "nn_item: %s",
                      t == NULL ? "tensor is NULL" : "tensor has no fp32 values");
        return NAN;
    }
    if (nn__stale(t)) {
        accel__seterr(NULL, ACCEL_ESTATE,
                      "nn_item: the tensor is from before nn_ctx_reset (stale: its memory is "
                      "reused)");
        return NAN;
    }
    if (nn_numel(t) != 1) {
        char b[64];
        accel__seterr(NULL, ACCEL_EINVAL, "nn_item: tensor %s has %lld elements, not 1",
                      accel__nn_shape_str(t, b, sizeof(b)), (long long)nn_numel(t));
        return NAN;
    }
    if (!nn__on_gpu(t)) {
        return t->data[0];
    }
    float v;
    return accel__nn_gpu->to_host(NULL, &v, t->data, sizeof(v)) == ACCEL_OK ? v : NAN;
}

int accel__nn_dim(const nn_tensor *x, int dim)
{
    int d = dim < 0 ? dim + x->ndim : dim;
    return (d >= 0 && d < x->ndim) ? d : -1;
}

const char *accel__nn_shape_str(const nn_tensor *t, char *buf, size_t nbytes)
{
    return accel__shape_str(buf, nbytes, t->ndim, t->shape);
}

int accel__nn_same_shape(const nn_tensor *a, const nn_tensor *b)
{
    if (a->ndim != b->ndim) {
        return 0;
    }
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] != b->shape[d]) {
            return 0;
        }
    }
    return 1;
}
