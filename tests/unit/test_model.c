/* Training core, one process: parameter registration and its bad input, the flat layout and
 * views, freezing, buckets, accumulation (Accelerate's _do_sync), the backward protocol,
 * clipping against a double reference, and free_memory followed by a second training. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/gstate.h"
#include "core/internal.h"
#include "core/settings.h"

static accel *new_acc(int accum_steps)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = accum_steps;
    o.first_bucket_mb = 64.0 / 1048576.0; /* 64 bytes: 16 floats */
    o.bucket_cap_mb = 256.0 / 1048576.0;  /* 64 floats */
    accel *acc = NULL;
    CHECK_OK(NULL, accel_init(&acc, &o));
    return acc;
}

static void expect(accel *acc, accel_status got, accel_status want, const char *needle)
{
    CHECK_MSG(got == want, "got %s want %s (%s)", accel_status_name(got), accel_status_name(want),
              accel_last_error(acc));
    CHECK_MSG(strstr(accel_last_error(acc), needle) != NULL, "message \"%s\" lacks \"%s\"",
              accel_last_error(acc), needle);
}

static void test_registration(void)
{
    accel *acc = new_acc(1);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    int idx = -1;
    CHECK_OK(acc, accel_model_add_param(m, "fc.weight", 2, (int64_t[]){3, 4}, &idx));
    CHECK(idx == 0);
    CHECK_OK(acc, accel_model_add_param(m, "fc.bias", 1, (int64_t[]){3}, &idx));
    CHECK(idx == 1);
    expect(acc, accel_model_add_param(m, "fc.bias", 1, (int64_t[]){3}, NULL), ACCEL_EINVAL,
           "fc.bias\" registered twice");
    expect(acc, accel_model_add_param(m, "z", 2, (int64_t[]){3, 0}, NULL), ACCEL_EINVAL,
           "dimension 1 is 0");
    expect(acc, accel_model_add_param(m, "neg", 1, (int64_t[]){-2}, NULL), ACCEL_EINVAL,
           "\"neg\": dimension 0 is -2");
    expect(acc, accel_model_add_param(m, "nd", 0, (int64_t[]){1}, NULL), ACCEL_EINVAL, "ndim 0");
    expect(acc, accel_model_add_param(m, "nd9", 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, NULL),
           ACCEL_EINVAL, "ndim 9");
    expect(acc, accel_model_add_param(m, "", 1, (int64_t[]){1}, NULL), ACCEL_EINVAL, "empty");
    char longname[300];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    expect(acc, accel_model_add_param(m, longname, 1, (int64_t[]){1}, NULL), ACCEL_EINVAL,
           "over the limit");
    longname[ACCEL_PARAM_NAME_MAX] = '\0'; /* exactly the limit is fine */
    CHECK_OK(acc, accel_model_add_param(m, longname, 1, (int64_t[]){2}, NULL));
    CHECK(accel_model_num_params(m) == 3);
    CHECK(accel_model_numel(m) == 12 + 3 + 2);
    CHECK(accel_model_find(m, "fc.bias") == 1);
    CHECK(accel_model_find(m, "nope") == -1);

    /* Views: reverse registration order, contiguous, zero-filled. */
    const accel_param *w = accel_model_param(m, 0), *b = accel_model_param(m, 1),
                      *l = accel_model_param(m, 2);
    CHECK(w && b && l);
    CHECK(l->offset == 0 && b->offset == 2 && w->offset == 5);
    CHECK(w->numel == 12 && w->ndim == 2 && w->shape[0] == 3 && w->shape[1] == 4);
    CHECK(strcmp(w->name, "fc.weight") == 0 && w->dtype == ACCEL_F32);
    CHECK(w->data == accel_model_master(m) + 5 && w->grad == accel_model_grad(m) + 5);
    for (size_t i = 0; i < accel_model_numel(m); i++) {
        CHECK(accel_model_master(m)[i] == 0.0f && accel_model_grad(m)[i] == 0.0f);
    }
    CHECK(accel_model_param(m, 3) == NULL);
    expect(acc, accel_model_add_param(m, "late", 1, (int64_t[]){1}, NULL), ACCEL_EINVAL,
           "\"late\" registered after the model was allocated");

    /* Freezing: unknown names, then after prepare. */
    expect(acc, accel_model_freeze_by_name(m, "ghost", 1), ACCEL_EINVAL, "ghost");
    /* A NULL model was "no parameter called ..." / "parameter 0 out of range" (fault sweep). */
    CHECK_ERR(NULL, accel_model_freeze_by_name(NULL, "fc.weight", 1), ACCEL_EINVAL,
              "accel_model_freeze_by_name: model is NULL");
    CHECK_ERR(NULL, accel_model_materialize(NULL, 0), ACCEL_EINVAL,
              "accel_model_materialize: model is NULL");
    expect(acc, accel_model_freeze(m, 7, 1), ACCEL_EINVAL, "index 7");
    CHECK_OK(acc, accel_prepare(acc, m));
    expect(acc, accel_model_freeze(m, 0, 1), ACCEL_ESTATE, "fc.weight");
    expect(acc, accel_model_add_param(m, "late2", 1, (int64_t[]){1}, NULL), ACCEL_EINVAL, "late2");
    accel_free(acc);
}

/* Bucket assignment: bucket 0 closes at 16 floats, later ones at 64, in backward order. */
static void test_buckets(void)
{
    accel *acc = new_acc(1);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    /* registration order p0..p5; memory order p5 p4 p3 p2 p1 p0 */
    int64_t sizes[6] = {30, 8, 40, 40, 10, 10};
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, &sizes[i], NULL));
    }
    CHECK_OK(acc, accel_model_freeze(m, 4, 1)); /* p4, between p5 and p3 in memory */
    CHECK_OK(acc, accel_prepare(acc, m));
    /* p5(10), p4 frozen (inside the range, sent as zeros), p3(40) -> 60 >= 16 closes bucket 0;
     * p2(40) p1(8) p0(30) -> 78 >= 64 closes bucket 1. */
    CHECK_MSG(accel_model_num_buckets(m) == 2, "%d buckets", accel_model_num_buckets(m));
    accel_bucket_info bi;
    CHECK_OK(acc, accel_model_bucket_info(m, 0, &bi));
    CHECK(bi.offset == 0 && bi.count == 60 && bi.n_params == 2);
    CHECK_OK(acc, accel_model_bucket_info(m, 1, &bi));
    CHECK(bi.offset == 60 && bi.count == 78 && bi.n_params == 3);
    CHECK(accel_model_param(m, 4)->bucket == -1 && accel_model_param(m, 0)->bucket == 1);
    CHECK(accel_model_param(m, 5)->bucket == 0 && accel_model_param(m, 3)->bucket == 0);
    CHECK(accel_model_bucket_info(m, 2, &bi) == ACCEL_EINVAL);

    /* The backward protocol. */
    expect(acc, accel_grad_ready(m, 0), ACCEL_ESTATE, "outside");
    double f = accel_backward_begin(acc);
    CHECK(f == 1.0);
    CHECK_OK(acc, accel_grad_ready(m, 5));
    expect(acc, accel_grad_ready(m, 5), ACCEL_EINVAL, "\"p5\" marked ready twice");
    expect(acc, accel_grad_ready(m, 6), ACCEL_EINVAL, "out of range");
    CHECK_OK(acc, accel_grad_ready(m, 4)); /* frozen: accepted */
    /* p0..p3 never marked: backward_end must not hang. */
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK_OK(acc, accel_backward_end(acc)); /* nothing in flight: fine */
    accel_free(acc);
}

/* Accelerate's _do_sync worked example: steps 4, 10 batches, end of loader on the last. */
static void test_accumulate(void)
{
    accel *acc = new_acc(4);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){4}, NULL));
    CHECK_OK(acc, accel_prepare(acc, m));
    /* A loader being iterated, as the data module reports it. */
    int saved_end, saved_remainder;
    CHECK_OK(acc, accel__grad_state_open(acc));
    accel__grad_state_loader_enter(acc, -1, &saved_end, &saved_remainder);
    for (int epoch = 0; epoch < 2; epoch++) {
        for (int b = 1; b <= 10; b++) {
            accel__grad_state_loader_batch(acc, b == 10, -1);
            CHECK_OK(acc, accel_accumulate(acc, m));
            int want = (b == 4 || b == 8 || b == 10);
            CHECK_MSG(accel_sync_gradients(acc) == want, "epoch %d batch %d", epoch, b);
            CHECK(accel_backward_begin(acc) == 0.25); /* always 1/steps, even short windows */
            CHECK_OK(acc, accel_backward_end(acc));
        }
        CHECK(accel_accumulation_step(acc) == 0);
    }
    /* sync_with_dataloader off: the end of the loader does not force a sync. */
    acc->settings->train.sync_with_dataloader = 0;
    accel__grad_state_restore(acc, 0, 1);
    int syncs = 0;
    for (int b = 1; b <= 10; b++) {
        accel__grad_state_loader_batch(acc, b == 10, -1);
        CHECK_OK(acc, accel_accumulate(acc, NULL));
        syncs += accel_sync_gradients(acc);
    }
    CHECK(syncs == 2 && accel_accumulation_step(acc) == 10);
    accel__grad_state_loader_leave(acc, saved_end, saved_remainder);

    /* free_memory: objects gone, counters reset, a second training with another model works. */
    accel_free_memory(acc);
    CHECK(acc->objects == NULL);
    CHECK(accel_accumulation_step(acc) == 0 && accel_sync_gradients(acc) == 1);
    accel_model *m2;
    CHECK_OK(acc, accel_model_new(acc, &m2));
    CHECK_OK(acc, accel_model_add_param(m2, "other", 2, (int64_t[]){2, 2}, NULL));
    accel_optimizer *opt = accel_sgd(acc, m2, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, opt, m2));
    acc->settings->train.sync_with_dataloader = 1;
    for (int s = 0; s < 4; s++) {
        CHECK_OK(acc, accel_accumulate(acc, m2));
        double f = accel_backward_begin(acc);
        for (int j = 0; j < 4; j++) {
            accel_model_param(m2, 0)->grad[j] += (float)f;
        }
        CHECK_OK(acc, accel_grad_ready(m2, 0));
        CHECK_OK(acc, accel_backward_end(acc));
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
    }
    /* One real step with gradient 4 * 0.25 = 1, lr 1e-3. */
    CHECK(accel_optimizer_num_steps(opt) == 1);
    CHECK_NEAR(accel_model_param(m2, 0)->data[0], -1e-3, 1e-9);
    accel_free(acc);
}

static void test_clip(void)
{
    accel *acc = new_acc(1);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "a", 1, (int64_t[]){5}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "b", 1, (int64_t[]){3}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "frozen", 1, (int64_t[]){2}, NULL));
    /* Laid out c, frozen, b, a: clipping's runs are {c} and {b, a}, the frozen one between. */
    CHECK_OK(acc, accel_model_add_param(m, "c", 1, (int64_t[]){2}, NULL));
    CHECK_OK(acc, accel_model_freeze_by_name(m, "frozen", 1));
    CHECK_OK(acc, accel_prepare(acc, m));
    const float ga[5] = {1, -2, 3, -4, 0.5f}, gb[3] = {-6, 0.25f, 2}, gc[2] = {1.5f, -3};
    double norms[3] = {2.0, 3.0, INFINITY};
    for (int k = 0; k < 3; k++) {
        float *a = accel_model_param(m, 0)->grad, *b = accel_model_param(m, 1)->grad;
        float *fz = accel_model_param(m, 2)->grad, *c = accel_model_param(m, 3)->grad;
        memcpy(a, ga, sizeof(ga));
        memcpy(b, gb, sizeof(gb));
        memcpy(c, gc, sizeof(gc));
        fz[0] = 100.0f, fz[1] = NAN; /* never counted nor touched */
        double p = norms[k], s = 0, mx = 0;
        for (int i = 0; i < 5; i++) {
            s += pow(fabs(ga[i]), p == INFINITY ? 1 : p);
            mx = fmax(mx, fabs(ga[i]));
        }
        for (int i = 0; i < 3; i++) {
            s += pow(fabs(gb[i]), p == INFINITY ? 1 : p);
            mx = fmax(mx, fabs(gb[i]));
        }
        for (int i = 0; i < 2; i++) {
            s += pow(fabs(gc[i]), p == INFINITY ? 1 : p);
            mx = fmax(mx, fabs(gc[i]));
        }
        double want = (p == INFINITY) ? mx : pow(s, 1.0 / p);
        double total = 0;
        CHECK_OK(acc, accel_clip_grad_norm(acc, m, 1.5, p, &total));
        CHECK_NEAR(total, want, 1e-9 * want);
        double coef = 1.5 / (want + 1e-6);
        CHECK_NEAR(a[3], -4 * coef, 1e-6);
        CHECK_NEAR(b[0], -6 * coef, 1e-6);
        CHECK_NEAR(c[1], -3 * coef, 1e-6);
        CHECK(fz[0] == 100.0f && isnan(fz[1]));
    }
    /* Below the limit: untouched. */
    float *a = accel_model_param(m, 0)->grad;
    memcpy(a, ga, sizeof(ga));
    CHECK_OK(acc, accel_clip_grad_norm(acc, m, 1000.0, 2.0, NULL));
    CHECK(a[1] == -2.0f);
    CHECK_OK(acc, accel_clip_grad_value(acc, m, 1.0));
    CHECK(a[0] == 1.0f && a[1] == -1.0f && a[4] == 0.5f);
    CHECK(accel_model_param(m, 2)->grad[0] == 100.0f);
    expect(acc, accel_clip_grad_norm(acc, m, 1.0, 0.0, NULL), ACCEL_EINVAL, "norm_type");
    expect(acc, accel_clip_grad_norm(acc, m, -1.0, 2.0, NULL), ACCEL_EINVAL, "max_norm");
    expect(acc, accel_clip_grad_value(acc, m, -1.0), ACCEL_EINVAL, "clip");
    CHECK_OK(acc, accel_unscale_gradients(acc, NULL));
    accel_free(acc);
}

int main(void)
{
    test_registration();
    test_buckets();
    test_accumulate();
    test_clip();
    printf("test_model: ok\n");
    return 0;
}
