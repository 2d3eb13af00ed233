/* ACCEL_TEST_NPROCS: 2 4
 *
 * Per-process memory of parameters + gradients + optimizer state under ZeRO stages 0-3, measured
 * (not computed): the bytes accel's allocator holds for the model and its AdamW optimizer (a
 * counting allocator installed with accel_replace_allocator, live bytes after prepare minus
 * before the model's buffers), plus the resident pages of the page buffers stages 2-3 use
 * (mincore: gradients, stage 3's gathered weights), plus the symmetric gradient buffer of stages
 * 0-1 (shared memory the communicator maps, counted by its size). A GPT of about 0.9M
 * parameters, fp32, one training step. Checks the targets: stage 1's optimizer state and
 * stage 2's kept gradients are 1/N of stage 0's (within page rounding), and stage 3's total after
 * the step is at most stage 0's / N plus one unit's full size; during a forward stage 3 holds at
 * most three units' weights. Prints the table (docs/training.md quotes it).
 * Then stages 0-2 under bf16: the fp32 master a process holds (the allocator's bytes less the
 * optimizer state and the full bf16 compute copy, plus the resident fp32 weight pages) is 1/N
 * of stage 0's at stages 1-2 (within bookkeeping and page rounding), and during a forward at
 * most three buckets are widened into fp32 pages.
 */
#include <stdatomic.h>
#include <string.h>

#include "accel/nn.h"
#include "check.h"
#include "small_gpt.h"
#include "train/train_internal.h"

#define B 2
#define T 16

static _Atomic long long live; /* bytes held through accel's allocator */

/* During a backward: the most gradient bytes resident at any parameter's grad_ready. */
typedef struct grad_probe {
    accel *acc;
    accel_model *m;
    size_t full_nbytes, peak;
} grad_probe;

static accel_status probe_ready(void *ctx, const nn_tensor *param)
{
    grad_probe *pr = ctx;
    if (pr->m->grad_pages) {
        size_t r = accel__pages_resident(pr->m->grad, pr->full_nbytes);
        pr->peak = r > pr->peak ? r : pr->peak;
    }
    return accel_grad_ready(pr->m, param->param_index);
}

static void *count_malloc(size_t n)
{
    size_t *p = malloc(n + 16);
    if (p == NULL) {
        return NULL;
    }
    p[0] = n;
    live += (long long)n;
    return (char *)p + 16;
}
static void count_free(void *q)
{
    if (q != NULL) {
        size_t *p = (size_t *)(void *)((char *)q - 16);
        live -= (long long)p[0];
        free(p);
    }
}
static void *count_realloc(void *q, size_t n)
{
    if (q == NULL) {
        return count_malloc(n);
    }
    size_t *p = (size_t *)(void *)((char *)q - 16), old = p[0];
    size_t *np = realloc(p, n + 16);
    if (np == NULL) {
        return NULL;
    }
    np[0] = n;
    live += (long long)n - (long long)old;
    return (char *)np + 16;
}
static void *count_calloc(size_t c, size_t n)
{
    void *q = count_malloc(c * n);
    if (q != NULL) {
        memset(q, 0, c * n);
    }
    return q;
}

typedef struct usage {
    long long alloc_nbytes;    /* allocator: master, optimizer state (+ small bookkeeping) */
    size_t grad_nbytes;        /* gradients kept after the step */
    size_t weights_nbytes;     /* stage 3: gathered weights resident after the step */
    size_t backward_grad_peak; /* gradient bytes resident during the backward, at most */
    size_t forward_weights;    /* stage 3: gathered weights resident after a forward */
    size_t state_nbytes;       /* optimizer state (exp_avg + exp_avg_sq) */
    size_t full_nbytes;        /* one fp32 copy of the padded model */
    size_t largest_unit;       /* bytes of the largest unit (stage 3) */
    long long total;
    long long master_nbytes; /* bf16: the fp32 master held (+ bookkeeping), after the step */
} usage;

static void run(int stage, int bf16, usage *u)
{
    accel_options o = accel_options_default();
    o.zero_stage = stage;
    o.mixed_precision = bf16 ? ACCEL_PRECISION_BF16 : ACCEL_PRECISION_NO;
    if (bf16) {
        o.bucket_cap_mb = 0.5; /* several buckets: the widened window is a few of them */
    }
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc);
    nn_gpt_config cfg = small_gpt_config(4, 4, 128, T, 1024, 1);
    accel_model *m;
    nn_params *p;
    nn_gpt *gpt;
    small_gpt_declare(acc, &cfg, &m, &p, &gpt);
    long long before = live;
    CHECK_OK(NULL, nn_params_bind(p)); /* allocates the model's buffers */
    CHECK_OK(NULL, nn_params_init(p, 5));
    accel_optimizer *opt = accel_adamw(acc, m, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    u->alloc_nbytes = live - before;
    u->full_nbytes = m->flat.padded_numel * sizeof(float);
    u->state_nbytes = 2 * accel__zero_state_numel(m) * sizeof(float);
    for (int b = 0; b < m->flat.n_buckets; b++) {
        size_t nb = m->flat.buckets[b].padded * sizeof(float);
        u->largest_unit = nb > u->largest_unit ? nb : u->largest_unit;
    }

    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    int32_t ids[B * T], tg[B * T];
    for (int k = 0; k < B * T; k++) {
        ids[k] = (int32_t)((k * 37 + rank * 11) % 1024);
        tg[k] = (int32_t)((k * 53 + 7) % 1024);
    }
    CHECK_OK(acc, accel_accumulate(acc, m));
    nn_tensor *loss = NULL;
    CHECK_OK(NULL, nn_gpt_forward(g, gpt, ids, tg, B, T, NULL, &loss));
    if (m->master_shard) {
        u->forward_weights = accel__pages_resident(m->weights, u->full_nbytes);
    }
    /* accel_backward by hand, sampling the resident gradient pages as parameters get ready. */
    grad_probe probe = {acc, m, u->full_nbytes, 0};
    nn_backward_hooks hooks = {&probe, probe_ready};
    double seed = accel_backward_begin(acc);
    CHECK_OK(NULL, nn_backward(loss, (float)seed, &hooks));
    CHECK_OK(acc, accel_backward_end(acc));
    u->backward_grad_peak = m->grad_pages ? probe.peak : u->full_nbytes;
    CHECK_OK(acc, accel_optimizer_step(opt));
    /* What a process keeps between steps (before zero_grad gives the gradients back). */
    if (m->grad_pages) {
        u->grad_nbytes = accel__pages_resident(m->grad, u->full_nbytes);
    } else {
        u->grad_nbytes = u->full_nbytes; /* symmetric memory or a plain buffer: all of it */
        if (!m->grad_shared) {
            u->alloc_nbytes -= (long long)u->full_nbytes; /* already counted by the allocator */
        }
    }
    if (m->master_shard) {
        u->weights_nbytes = accel__pages_resident(m->weights, u->full_nbytes);
    }
    u->total = u->alloc_nbytes + (long long)u->grad_nbytes + (long long)u->weights_nbytes;
    u->master_nbytes = u->alloc_nbytes - (long long)u->state_nbytes -
                       (bf16 ? (long long)m->flat.padded_numel * 2 : 0) +
                       (long long)u->weights_nbytes;
    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(p);
    accel_free(acc);
}

int main(void)
{
    CHECK_OK(NULL, accel_replace_allocator(count_malloc, count_realloc, count_calloc, count_free));
    usage u[4];
    memset(u, 0, sizeof u);
    usage h[3]; /* bf16, stages 0-2 */
    memset(h, 0, sizeof h);
    for (int stage = 0; stage <= 3; stage++) {
        run(stage, 0, &u[stage]);
    }
    for (int stage = 0; stage <= 2; stage++) {
        run(stage, 1, &h[stage]);
    }
    int n = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
    if (getenv("RANK") == NULL || strcmp(getenv("RANK"), "0") == 0) {
        printf("per-process bytes, %d processes, GPT %zu padded fp32 bytes, AdamW:\n", n,
               u[0].full_nbytes);
        printf("stage | allocator (master, optimizer, ...) | gradients kept | gathered weights | "
               "total | vs stage 0\n");
        for (int s = 0; s <= 3; s++) {
            printf("%d | %lld | %zu | %zu | %lld | %.3f\n", s, u[s].alloc_nbytes, u[s].grad_nbytes,
                   u[s].weights_nbytes, u[s].total, (double)u[s].total / (double)u[0].total);
        }
        printf("stage 3: %zu bytes of gathered weights after a forward, largest unit %zu\n",
               u[3].forward_weights, u[3].largest_unit);
        printf("gradient bytes resident during the backward, at most: stage 2 %zu, stage 3 %zu "
               "(full %zu)\n",
               u[2].backward_grad_peak, u[3].backward_grad_peak, u[0].full_nbytes);
        printf("bf16: fp32 master bytes held after the step (stages 0 / 1 / 2): %lld / %lld / "
               "%lld; totals %lld / %lld / %lld; stages 1-2: %zu / %zu bytes of widened weights "
               "after a forward (largest bucket %zu)\n",
               h[0].master_nbytes, h[1].master_nbytes, h[2].master_nbytes, h[0].total, h[1].total,
               h[2].total, h[1].forward_weights, h[2].forward_weights, h[1].largest_unit);
    }
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), slack = 64 * pg; /* page rounding, bookkeeping */
    /* Optimizer state: 1/N from stage 1 on (exactly, by construction of the shard). */
    for (int s = 1; s <= 3; s++) {
        CHECK(u[s].state_nbytes * (size_t)n == u[0].state_nbytes);
        CHECK(u[s].alloc_nbytes < u[0].alloc_nbytes);
    }
    /* Stage 2/3 keep 1/N of the gradients. */
    CHECK(u[2].grad_nbytes <= u[0].grad_nbytes / (size_t)n + slack);
    CHECK(u[3].grad_nbytes <= u[0].grad_nbytes / (size_t)n + slack);
    CHECK(u[2].backward_grad_peak <= u[0].full_nbytes + pg &&
          u[3].backward_grad_peak <= u[0].full_nbytes + pg);
    /* Stage 3: <= stage 0 / N + one unit, after the step and ... */
    CHECK_MSG(u[3].total <= u[0].total / n + (long long)(u[3].largest_unit + slack),
              "stage 3 total %lld vs stage 0 %lld / %d + unit %zu", u[3].total, u[0].total, n,
              u[3].largest_unit);
    /* ... at most three units gathered during a forward. */
    CHECK(u[3].forward_weights <= 3 * u[3].largest_unit + 6 * pg);
    /* bf16: stages 1-2 hold 1/N of the fp32 master, and no widened weights between steps. */
    for (int s = 1; s <= 2; s++) {
        CHECK_MSG(h[s].master_nbytes <= h[0].master_nbytes / n + (long long)slack,
                  "bf16 stage %d: %lld bytes of fp32 master, stage 0 %lld / %d", s,
                  h[s].master_nbytes, h[0].master_nbytes, n);
        CHECK(h[s].weights_nbytes == 0);
        CHECK(h[s].forward_weights <= 3 * h[s].largest_unit + 6 * pg);
        CHECK(h[s].total < h[0].total);
    }
    return 0;
}
