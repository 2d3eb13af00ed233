/*
 * The flat geometry (src/train/flat.c) and the model's typed buffers:
 *  - random models (odd sizes, frozen parameters) on 1-4 ranks: buckets tile the buffers, each
 *    padded to a multiple of 16 x ranks and split into equal pieces; the shard <-> flat
 *    mapping is a bijection; bucket membership is DDP's size rule (an independent copy of
 *    version 1's algorithm); without padding the layout is version 1's, offset for offset;
 *  - the model's views: data / grad / compute as accel_tensor, the compute copy stored in
 *    bf16 (2 bytes per element) and valid from prepare, the fp32 conveniences' ESTATE;
 *  - zero_stage: 0-3 are taken (option and ACCEL_ZERO_STAGE), others refused;
 *  - stage 3's units: one bucket each (accel__flat_build_units), by layer name by default,
 *    accel_model_set_unit's ranges, bad ranges refused;
 *  - a bucket whose parameters were all frozen after alloc is never sent.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "train/train_internal.h"

static unsigned long long rng = 7;
static unsigned urand(unsigned n)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((rng >> 33) % n);
}

/* Version 1's bucket assignment (model.c before the geometry): backward order, frozen
 * parameters skipped (inside a bucket they count towards its size), closing at first / cap
 * bytes. bucket[i] = -1 for frozen. */
static int v1_buckets(const accel__flat_param *p, int n, double first, double cap, int *bucket)
{
    int nb = 0, open = 0;
    size_t off = 0, start = 0;
    for (int i = n - 1; i >= 0; i--) {
        bucket[i] = -1;
        if (!p[i].frozen) {
            if (!open) {
                nb++;
                open = 1;
                start = off;
            }
            bucket[i] = nb - 1;
            if ((double)(off + p[i].numel - start) * 4 >= (nb == 1 ? first : cap)) {
                open = 0;
            }
        }
        off += p[i].numel;
    }
    return nb;
}

static void check_geometry(const accel__flat_param *p, int n, double first, double cap, int n_ranks,
                           size_t unit)
{
    accel__flat f;
    size_t *off = malloc((size_t)n * sizeof(size_t));
    int *bk = malloc((size_t)n * sizeof(int)), *ref = malloc((size_t)n * sizeof(int));
    CHECK_OK(NULL, accel__flat_build(&f, p, n, first, cap, n_ranks, unit, off, bk));
    int nb_ref = v1_buckets(p, n, first, cap, ref);
    CHECK(f.n_buckets == (nb_ref > 0 ? nb_ref : 1) && f.n_ranks == n_ranks);
    /* Trainable parameters are where version 1 put them; a frozen one joins the bucket of
     * the next trainable parameter in memory (lower index), else the last bucket. */
    for (int i = 0; i < n; i++) {
        int want = ref[i];
        for (int j = i - 1; want < 0 && j >= 0; j--) {
            want = ref[j];
        }
        if (want < 0) {
            want = f.n_buckets - 1;
        }
        CHECK_MSG(bk[i] == want, "param %d in bucket %d, expected %d", i, bk[i], want);
    }
    /* Buckets tile [0, padded_numel); parameters are packed in reverse registration order
     * inside their bucket. */
    size_t numel = 0, end = 0;
    for (int b = 0; b < f.n_buckets; b++) {
        const accel__flat_bucket *x = &f.buckets[b];
        CHECK(x->offset == end && x->padded % unit == 0 && x->padded >= x->count &&
              x->padded - x->count < unit);
        size_t sum = 0, at = x->offset;
        for (int i = n - 1; i >= 0; i--) {
            if (bk[i] == b) {
                CHECK_MSG(off[i] == at, "param %d at %zu, expected %zu", i, off[i], at);
                at += p[i].numel;
                sum += p[i].numel;
            }
        }
        CHECK(sum == x->count);
        numel += sum;
        end = x->offset + x->padded;
    }
    CHECK(f.numel == numel && f.padded_numel == end && end % (size_t)n_ranks == 0);
    /* Pieces and shards: equal pieces, a bijection between (rank, shard index) and flat. */
    size_t shard = accel__flat_shard_numel(&f);
    CHECK(shard * (size_t)n_ranks == f.padded_numel);
    unsigned char *seen = calloc(f.padded_numel, 1);
    for (int r = 0; r < n_ranks; r++) {
        for (int b = 0; b < f.n_buckets; b++) {
            size_t po, pc;
            accel__flat_piece(&f, b, r, &po, &pc);
            CHECK(pc * (size_t)n_ranks == f.buckets[b].padded);
            CHECK(po == f.buckets[b].offset + (size_t)r * pc);
            CHECK(unit == 1 || pc % 16 == 0); /* 64-byte pieces when sharded */
        }
        for (size_t s = 0; s < shard; s++) {
            size_t x = accel__flat_from_shard(&f, r, s);
            CHECK(x < f.padded_numel && !seen[x]);
            seen[x] = 1;
            int rr;
            size_t ss;
            accel__flat_to_shard(&f, x, &rr, &ss);
            CHECK_MSG(rr == r && ss == s, "flat %zu -> rank %d index %zu, from %d %zu", x, rr, ss,
                      r, s);
            int b = accel__flat_bucket_of(&f, x);
            CHECK(x >= f.buckets[b].offset && x < f.buckets[b].offset + f.buckets[b].padded);
        }
    }
    free(seen);
    accel__flat_free(&f);
    free(off), free(bk), free(ref);
}

static void test_geometry(void)
{
    for (int trial = 0; trial < 200; trial++) {
        int n = 1 + (int)urand(12);
        accel__flat_param p[12];
        for (int i = 0; i < n; i++) {
            p[i].numel = 1 + urand(trial % 3 == 0 ? 7 : 90); /* odd sizes, some tiny */
            p[i].frozen = urand(4) == 0 || trial % 17 == 0;  /* sometimes all frozen */
        }
        double first = 4.0 * (1 + urand(40)), cap = 4.0 * (1 + urand(200));
        int n_ranks = 1 + trial % 4;
        check_geometry(p, n, first, cap, n_ranks, (size_t)n_ranks * 16);
        check_geometry(p, n, first, cap, 1, 1); /* DDP: no padding */
    }
    /* Version 1's test_model layout, exactly, without padding; padded for 2 ranks. */
    accel__flat_param p[6] = {{30, 0}, {8, 0}, {40, 0}, {40, 0}, {10, 1}, {10, 0}};
    size_t off[6];
    int bk[6];
    accel__flat f;
    CHECK_OK(NULL, accel__flat_build(&f, p, 6, 64, 256, 1, 1, off, bk));
    CHECK(f.n_buckets == 2 && f.buckets[0].count == 60 && f.buckets[1].offset == 60);
    CHECK(off[5] == 0 && off[4] == 10 && off[3] == 20 && off[2] == 60 && off[1] == 100 &&
          off[0] == 108 && f.padded_numel == 138);
    accel__flat_free(&f);
    CHECK_OK(NULL, accel__flat_build(&f, p, 6, 64, 256, 2, 32, off, bk));
    CHECK(f.buckets[0].padded == 64 && f.buckets[1].offset == 64 && f.buckets[1].padded == 96);
    CHECK(off[2] == 64 && off[0] == 112 && f.padded_numel == 160);
    CHECK(accel__flat_shard_numel(&f) == 80 && accel__flat_from_shard(&f, 1, 32) == 64 + 48);
    accel__flat_free(&f);
    /* Bad arguments. */
    CHECK(accel__flat_build(&f, p, 0, 64, 256, 1, 1, off, bk) == ACCEL_EINVAL);
    CHECK(accel__flat_build(&f, p, 6, 64, 256, 3, 32, off, bk) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "pad unit 32") != NULL);
    p[3].numel = 0;
    CHECK(accel__flat_build(&f, p, 6, 64, 256, 1, 1, off, bk) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "parameter 3 is empty") != NULL);
}

static accel *new_acc(accel_precision mp)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    accel_options o = accel_options_default();
    o.mixed_precision = mp;
    o.first_bucket_mb = 64.0 / 1048576.0;
    o.bucket_cap_mb = 256.0 / 1048576.0;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    return acc;
}

static void test_views(void)
{
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        accel *acc = new_acc(bf16 ? ACCEL_PRECISION_BF16 : ACCEL_PRECISION_NO);
        accel_model *m;
        CHECK_OK(acc, accel_model_new(acc, &m));
        accel_tensor cv;
        CHECK(accel_model_compute_view(m, &cv) == ACCEL_ESTATE);
        CHECK(strstr(accel_last_error(acc), "not allocated") != NULL);
        CHECK_OK(acc, accel_model_add_param(m, "w", 2, (int64_t[]){3, 5}, NULL));
        CHECK_OK(acc, accel_model_add_param(m, "b", 1, (int64_t[]){3}, NULL));
        const accel_param *w = accel_model_param(m, 0), *b = accel_model_param(m, 1);
        CHECK(w->data_view.data == w->data && w->grad_view.data == w->grad);
        CHECK(w->data_view.dtype == ACCEL_F32 && w->grad_view.dtype == ACCEL_F32);
        CHECK(w->data_view.ndim == 2 && w->data_view.shape[0] == 3 && w->data_view.shape[1] == 5);
        CHECK(w->data_view.device.type == ACCEL_DEVICE_CPU);
        CHECK(accel_tensor_numel(&w->grad_view) == 15 && b->offset == 0 && w->offset == 3);
        for (int j = 0; j < 15; j++) {
            w->data[j] = 1.0f + (float)j / 1024; /* not all exact in bf16 */
        }
        if (!bf16) {
            /* fp32: the working copy is the master, valid from alloc. */
            CHECK(w->compute_view.data == w->data && w->compute_view.dtype == ACCEL_F32);
            CHECK(accel_model_compute(m) == accel_model_master(m));
            CHECK_OK(acc, accel_model_compute_view(m, &cv));
            CHECK(cv.data == accel_model_master(m) && cv.shape[0] == 18);
        } else {
            CHECK(w->compute_view.data == NULL && w->compute_view.dtype == ACCEL_BF16);
            CHECK(accel_model_compute_view(m, &cv) == ACCEL_ESTATE);
            CHECK(strstr(accel_last_error(acc), "not prepared") != NULL);
        }
        CHECK_OK(acc, accel_prepare(acc, m));
        CHECK_OK(acc, accel_model_compute_view(m, &cv));
        CHECK(cv.ndim == 1 && cv.shape[0] == 18 && cv.dtype == accel_model_compute_dtype(m));
        CHECK((char *)w->compute_view.data == (char *)cv.data + 3 * accel_dtype_nbytes(cv.dtype));
        if (bf16) {
            /* Stored in bf16, 2 bytes per element, rounded to nearest even. */
            CHECK(cv.dtype == ACCEL_BF16 && accel_tensor_nbytes(&cv) == 36);
            CHECK(accel_model_compute(m) == NULL && accel_last_status(acc) == ACCEL_ESTATE);
            CHECK(strstr(accel_last_error(acc), "accel_model_compute_view") != NULL);
            for (int j = 0; j < 15; j++) {
                uint16_t h;
                CHECK_OK(NULL, accel_convert(&h, ACCEL_BF16, &w->data[j], ACCEL_F32, 1));
                CHECK(((const uint16_t *)w->compute_view.data)[j] == h);
            }
        }
        CHECK(accel_model_compute_view(NULL, &cv) == ACCEL_EINVAL);
        accel_free(acc);
    }
}

static void test_zero_stage(void)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    accel *acc;
    for (int stage = 1; stage <= 3; stage++) {
        accel_options o = accel_options_default();
        o.zero_stage = stage;
        CHECK_OK(NULL, accel_init(&acc, &o));
        CHECK(accel_resolved_options(acc)->zero_stage == stage);
        accel_free(acc);
    }
    accel_options o = accel_options_default();
    o.zero_stage = 4;
    CHECK(accel_init(&acc, &o) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "zero_stage=4") != NULL);
    setenv("ACCEL_ZERO_STAGE", "3", 1);
    o = accel_options_default();
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK(accel_resolved_options(acc)->zero_stage == 3);
    accel_free(acc);
    o.zero_stage = 0; /* the argument wins */
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK(accel_resolved_options(acc)->zero_stage == 0);
    accel_free(acc);
    setenv("ACCEL_ZERO_STAGE", "9", 1);
    o = accel_options_default();
    CHECK(accel_init(&acc, &o) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "ACCEL_ZERO_STAGE=9") != NULL);
    unsetenv("ACCEL_ZERO_STAGE");
    /* A program built before the field existed passes a shorter struct: unset, so 0. */
    o = accel_options_default();
    o.zero_stage = 3; /* beyond the size the old program knew: ignored */
    o.size = (uint32_t)offsetof(accel_options, zero_stage);
    o.version = 1;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK(accel_resolved_options(acc)->zero_stage == 0);
    accel_free(acc);
}

/* Every trainable parameter of bucket 1 frozen after alloc: the bucket stays in the geometry
 * but is never sent, and the backward protocol, clipping and the optimizer still work. */
static void test_late_freeze(void)
{
    accel *acc = new_acc(ACCEL_PRECISION_NO);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    /* Memory: p3 | p2 p1 | p0 (a 16-float first bucket, then 64-float ones). */
    int64_t sizes[4] = {40, 40, 40, 20};
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "p%d", i);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, &sizes[i], NULL));
    }
    CHECK_OK(acc, accel_model_alloc(m));
    CHECK_OK(acc, accel_model_freeze(m, 3, 1));
    accel_optimizer *opt = accel_sgd(acc, m, NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    CHECK(accel_model_num_buckets(m) == 3);
    accel_bucket_info bi;
    CHECK_OK(acc, accel_model_bucket_info(m, 0, &bi));
    CHECK(bi.n_params == 0 && bi.count == 0);
    CHECK(accel_model_param(m, 3)->bucket == -1 && accel_model_param(m, 2)->bucket == 1);
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < sizes[i]; j++) {
            accel_model_param(m, i)->data[j] = 1.0f;
        }
    }
    (void)accel_backward_begin(acc);
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < sizes[i]; j++) {
            accel_model_param(m, i)->grad[j] += 1.0f;
        }
        CHECK_OK(acc, accel_grad_ready(m, i));
    }
    CHECK_OK(acc, accel_backward_end(acc));
    double norm;
    CHECK_OK(acc, accel_clip_grad_norm(acc, m, 100.0, 2.0, &norm));
    CHECK(norm == sqrt(120.0)); /* the frozen parameter does not count */
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK(accel_model_param(m, 3)->data[0] == 1.0f && accel_model_param(m, 2)->data[0] < 1.0f);
    accel_free(acc);
}

/* Stage 3 on one process: units by name (GPT-2 names), one bucket each, in reverse order. */
static void test_units(void)
{
    static const char *const names[] = {
        "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight", "transformer.h.1.ln_1.weight",
        "transformer.h.1.mlp.c_fc.weight", "transformer.h.10.ln_1.weight",
        "transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"};
    /* expected units: [wte, wpe] [h.0 x2] [h.1 x2] [h.10] [ln_f x2, lm_head] */
    static const int want_unit[] = {0, 0, 1, 1, 2, 2, 3, 4, 4, 4};
    const int n = (int)(sizeof(names) / sizeof(names[0]));
    for (int wrap = 0; wrap <= 1; wrap++) {
        accel_options o = accel_options_default();
        o.zero_stage = 3;
        accel *acc;
        CHECK_OK(NULL, accel_init(&acc, &o));
        accel_model *m;
        CHECK_OK(acc, accel_model_new(acc, &m));
        for (int i = 0; i < n; i++) {
            int64_t shape[1] = {3 + i};
            CHECK_OK(acc, accel_model_add_param(m, names[i], 1, shape, NULL));
        }
        CHECK(accel_model_set_unit(m, 5, 6) == ACCEL_EINVAL);
        CHECK(strstr(accel_last_error(acc), "[5, 5 + 6)") != NULL);
        CHECK(accel_model_set_unit(m, -1, 2) == ACCEL_EINVAL);
        if (wrap) {
            CHECK_OK(acc, accel_model_set_unit(m, 8, 2)); /* ln_f.bias + lm_head wrapped alone */
        }
        CHECK_OK(acc, accel_model_alloc(m));
        CHECK(accel_model_set_unit(m, 0, 1) == ACCEL_ESTATE);
        int n_units = wrap ? 6 : 5;
        CHECK(accel_model_num_units(m) == n_units);
        /* One bucket per unit, the last unit first in memory: parameter i's offset lies in
         * bucket (n_units - 1 - unit), and parameters of one unit are adjacent. */
        for (int i = 0; i < n; i++) { /* the weights prepare takes the shard from */
            const accel_param *p = accel_model_param(m, i);
            for (size_t k = 0; k < p->numel; k++) {
                p->data[k] = (float)(100 * i + (int)k);
            }
        }
        accel_optimizer *opt = accel_sgd(acc, m, NULL);
        CHECK_OK(acc, accel_prepare(acc, m, opt));
        CHECK(accel_model_num_buckets(m) == n_units);
        for (int i = 0; i < n; i++) {
            int u = wrap && i >= 8 ? 5 : want_unit[i];
            accel_bucket_info bi;
            CHECK_OK(acc, accel_model_bucket_info(m, n_units - 1 - u, &bi));
            const accel_param *p = accel_model_param(m, i);
            CHECK_MSG(p->offset >= bi.offset && p->offset + p->numel <= bi.offset + bi.count,
                      "%s: unit %d", names[i], u);
        }
        /* Stage 3 holds a shard of the master; the weights come back through gather_all. */
        CHECK(accel_model_master(m) == NULL);
        CHECK(accel_last_status(acc) == ACCEL_ESTATE);
        CHECK(accel_model_param(m, 5)->data[1] == 0.0f); /* released at prepare */
        CHECK_OK(acc, accel_model_gather_all(m));
        for (int b = 0; b < n_units; b++) {
            CHECK(accel__zero3_unit_state(m, b) == 2);
        }
        for (int i = 0; i < n; i++) {
            const accel_param *p = accel_model_param(m, i);
            for (size_t k = 0; k < p->numel; k++) {
                CHECK(p->data[k] == (float)(100 * i + (int)k));
            }
        }
        /* A forward's first use: unit 0 (the last bucket) gathered, unit 1 prefetched, the rest
         * released; then unit 1 in use, unit 0 kept, unit 2 prefetched. */
        CHECK_OK(acc, accel__zero3_release_all(m)); /* as after a step */
        CHECK_OK(acc, accel_model_materialize(m, 0));
        CHECK(accel__zero3_unit_state(m, n_units - 1) == 2);
        CHECK(accel__zero3_unit_state(m, n_units - 2) == 1);
        for (int b = 0; b < n_units - 2; b++) {
            CHECK(accel__zero3_unit_state(m, b) == 0);
        }
        CHECK_OK(acc, accel_model_materialize(m, 3));
        CHECK(accel__zero3_unit_state(m, n_units - 1) == 2);
        CHECK(accel__zero3_unit_state(m, n_units - 2) == 2);
        CHECK(accel__zero3_unit_state(m, n_units - 3) == 1);
        CHECK(accel__zero3_unit_state(m, 0) == 0);
        /* A backward after a forward that gathered nothing (it read released zeros) fails. */
        CHECK_OK(acc, accel__zero3_release_all(m));
        (void)accel_backward_begin(acc);
        CHECK(accel_backward_end(acc) == ACCEL_EINVAL);
        CHECK(strstr(accel_last_error(acc), "accel_model_materialize") != NULL);
        CHECK_OK(acc, accel_model_materialize(m, 0));
        (void)accel_backward_begin(acc);
        CHECK_OK(acc, accel_backward_end(acc));

        CHECK(accel_model_materialize(m, n) == ACCEL_EINVAL);
        accel_free(acc);
    }
    /* The geometry itself: units must be consecutive runs numbered from 0. */
    accel__flat_param fp[3] = {{4, 0}, {5, 0}, {6, 0}};
    size_t off[3];
    int bucket[3];
    accel__flat f;
    const int bad[3] = {0, 2, 2}, good[3] = {0, 0, 1};
    CHECK(accel__flat_build_units(&f, fp, 3, bad, 2, 32, off, bucket) == ACCEL_EINVAL);
    CHECK_OK(NULL, accel__flat_build_units(&f, fp, 3, good, 2, 32, off, bucket));
    CHECK(f.n_buckets == 2 && bucket[0] == 1 && bucket[1] == 1 && bucket[2] == 0);
    CHECK(off[2] == 0 && off[1] == 32 && off[0] == 37 && f.padded_numel == 64);
    accel__flat_free(&f);
}

int main(void)
{
    unsetenv("ACCEL_ZERO_STAGE");
    unsetenv("ACCELERATE_MIXED_PRECISION");
    test_geometry();
    test_views();
    test_zero_stage();
    test_late_freeze();
    test_units();
    return 0;
}
