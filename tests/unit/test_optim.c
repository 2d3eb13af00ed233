/* Optimizers against an independent double-precision reference of torch.optim's formulas
 * (SGD with momentum / dampening / nesterov / weight decay / maximize, Adam with L2, AdamW,
 * amsgrad), param groups (no-decay split), frozen parameters, the no-op on accumulating
 * micro-steps, and bad input. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"

#define NSTEPS 6

static accel *new_acc(int accum_steps)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = accum_steps;
    accel *acc = NULL;
    CHECK_OK(NULL, accel_init(&acc, &o));
    return acc;
}

static unsigned long long rng_state = 12345;
static double urand(void) /* in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

/* A model large enough (> 65536 elements) to take the multithreaded path, plus small params. */
static accel_model *make_model(accel *acc)
{
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "h.0.mlp.weight", 2, (int64_t[]){300, 250}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "h.0.mlp.bias", 1, (int64_t[]){250}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "h.0.ln_1.weight", 1, (int64_t[]){37}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "frozen.emb", 2, (int64_t[]){5, 3}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "head.weight", 2, (int64_t[]){7, 11}, NULL));
    CHECK_OK(acc, accel_model_alloc(m));
    float *w = accel_model_master(m);
    for (size_t i = 0; i < accel_model_numel(m); i++) {
        w[i] = (float)urand();
    }
    CHECK_OK(acc, accel_model_freeze_by_name(m, "frozen.emb", 1));
    return m;
}

typedef struct cfg {
    int kind; /* 0 sgd, 1 adam, 2 adamw */
    double lr, momentum, dampening, wd, beta1, beta2, eps;
    int nesterov, maximize, amsgrad, no_decay;
} cfg;

static void run(const cfg *c)
{
    accel *acc = new_acc(1);
    accel_model *m = make_model(acc);
    accel_optimizer *opt = NULL;
    if (c->kind == 0) {
        accel_sgd_options o = accel_sgd_options_default();
        o.lr = c->lr;
        o.momentum = c->momentum;
        o.dampening = c->dampening;
        o.weight_decay = c->wd;
        o.nesterov = c->nesterov;
        o.maximize = c->maximize;
        opt = accel_sgd(acc, m, &o);
    } else {
        accel_adam_options o =
            c->kind == 1 ? accel_adam_options_default() : accel_adamw_options_default();
        o.lr = c->lr;
        o.beta1 = c->beta1;
        o.beta2 = c->beta2;
        o.eps = c->eps;
        o.weight_decay = c->wd;
        o.amsgrad = c->amsgrad;
        o.maximize = c->maximize;
        opt = c->kind == 1 ? accel_adam(acc, m, &o) : accel_adamw(acc, m, &o);
    }
    CHECK_MSG(opt != NULL, "%s", accel_last_error(acc));
    int nd = -1;
    if (c->no_decay) {
        CHECK_OK(acc, accel_optimizer_no_decay_group(opt, NULL, &nd));
        CHECK(nd == 1 && accel_optimizer_num_groups(opt) == 2);
    }
    CHECK_OK(acc, accel_prepare(acc, m, opt));

    size_t n = accel_model_numel(m);
    float *w = accel_model_master(m), *g = accel_model_grad(m);
    double *p = malloc(n * sizeof(double)), *buf = calloc(n, sizeof(double));
    double *mm = calloc(n, sizeof(double)), *vv = calloc(n, sizeof(double));
    double *vmax = calloc(n, sizeof(double)), *wd = malloc(n * sizeof(double));
    int *frozen = calloc(n, sizeof(int));
    float *frozen_before = malloc(15 * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        p[i] = w[i];
        wd[i] = c->wd;
    }
    for (int k = 0; k < accel_model_num_params(m); k++) {
        const accel_param *pp = accel_model_param(m, k);
        int is_nd = strstr(pp->name, "bias") || strstr(pp->name, "ln_");
        for (size_t j = 0; j < pp->numel; j++) {
            frozen[pp->offset + j] = pp->frozen;
            if (c->no_decay && is_nd) {
                wd[pp->offset + j] = 0.0;
            }
        }
    }
    const accel_param *fz = accel_model_param(m, accel_model_find(m, "frozen.emb"));
    memcpy(frozen_before, fz->data, 15 * sizeof(float));

    for (int t = 1; t <= NSTEPS; t++) {
        for (size_t i = 0; i < n; i++) {
            g[i] = (float)urand();
        }
        for (size_t i = 0; i < n; i++) {
            if (frozen[i]) {
                continue;
            }
            double gr = c->maximize ? -(double)g[i] : (double)g[i];
            if (c->kind == 0) {
                gr += wd[i] * p[i];
                if (c->momentum != 0) {
                    buf[i] = (t == 1) ? gr : c->momentum * buf[i] + (1 - c->dampening) * gr;
                    gr = c->nesterov ? gr + c->momentum * buf[i] : buf[i];
                }
                p[i] -= c->lr * gr;
            } else {
                if (c->kind == 1) {
                    gr += wd[i] * p[i];
                } else {
                    p[i] *= 1 - c->lr * wd[i];
                }
                mm[i] = c->beta1 * mm[i] + (1 - c->beta1) * gr;
                vv[i] = c->beta2 * vv[i] + (1 - c->beta2) * gr * gr;
                double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
                double v = vv[i];
                if (c->amsgrad) {
                    vmax[i] = fmax(vmax[i], vv[i]);
                    v = vmax[i];
                }
                p[i] -= c->lr / bc1 * mm[i] / (sqrt(v) / sqrt(bc2) + c->eps);
            }
        }
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK(!accel_optimizer_step_was_skipped(acc));
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs(w[i] - p[i]) / (fabs(p[i]) + 1e-2);
        if (err > worst) {
            worst = err;
        }
    }
    CHECK_MSG(worst <= 1e-5, "kind %d: worst relative error %g", c->kind, worst);
    CHECK(memcmp(frozen_before, fz->data, 15 * sizeof(float)) == 0);
    CHECK(accel_optimizer_num_steps(opt) == NSTEPS);
    free(p), free(buf), free(mm), free(vv), free(vmax), free(wd), free(frozen);
    free(frozen_before);
    accel_free(acc);
}

static void test_noop_while_accumulating(void)
{
    accel *acc = new_acc(2);
    accel_model *m = make_model(acc);
    accel_optimizer *opt = accel_adamw(acc, m, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, opt, m)); /* any order */
    size_t n = accel_model_numel(m);
    float *before = malloc(n * sizeof(float));
    memcpy(before, accel_model_master(m), n * sizeof(float));
    accel_model_grad(m)[0] = 1.0f;
    CHECK_OK(acc, accel_accumulate(acc, m)); /* step 1 of 2: no sync */
    CHECK(!accel_sync_gradients(acc));
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));
    CHECK(memcmp(before, accel_model_master(m), n * sizeof(float)) == 0);
    CHECK(accel_model_grad(m)[0] == 1.0f && accel_optimizer_num_steps(opt) == 0);
    CHECK_OK(acc, accel_accumulate(acc, m)); /* step 2: sync */
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));
    CHECK(accel_model_grad(m)[0] == 0.0f && accel_optimizer_num_steps(opt) == 1);
    CHECK(memcmp(before, accel_model_master(m), n * sizeof(float)) != 0);
    free(before);
    accel_free(acc);
}

static void expect(accel *acc, int ok, const char *needle)
{
    CHECK_MSG(ok, "call did not fail as expected (%s)", needle);
    CHECK_MSG(accel_last_status(acc) == ACCEL_EINVAL, "status %s",
              accel_status_name(accel_last_status(acc)));
    CHECK_MSG(strstr(accel_last_error(acc), needle) != NULL, "message \"%s\" lacks \"%s\"",
              accel_last_error(acc), needle);
}

static void test_bad_input(void)
{
    accel *acc = new_acc(1);
    accel_model *m = make_model(acc);
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = -0.1;
    expect(acc, accel_sgd(acc, m, &so) == NULL, "lr=-0.1");
    so = accel_sgd_options_default();
    so.nesterov = 1;
    expect(acc, accel_sgd(acc, m, &so) == NULL, "nesterov");
    accel_adam_options ao = accel_adamw_options_default();
    ao.beta1 = 1.0;
    expect(acc, accel_adamw(acc, m, &ao) == NULL, "beta1=1");
    ao = accel_adam_options_default();
    ao.beta2 = -0.5;
    expect(acc, accel_adam(acc, m, &ao) == NULL, "beta2=-0.5");
    ao = accel_adam_options_default();
    ao.size = 0;
    expect(acc, accel_adam(acc, m, &ao) == NULL, "_options_default");

    accel_optimizer *opt = accel_sgd(acc, m, NULL);
    CHECK(opt != NULL);
    expect(acc, accel_optimizer_step(opt) == ACCEL_EINVAL, "not prepared");
    /* An optimizer whose model is not prepared cannot be prepared. */
    expect(acc, accel_prepare(acc, opt) == ACCEL_EINVAL, "model was not prepared");
    expect(acc, accel_optimizer_set_lr(opt, 0, -1) == ACCEL_EINVAL, "lr=-1");
    /* NULL said "group 0 out of range" (fault sweep): the handle is named now. */
    CHECK_ERR(NULL, accel_optimizer_set_lr(NULL, 0, 1), ACCEL_EINVAL,
              "accel_optimizer_set_lr: optimizer is NULL");
    expect(acc, accel_optimizer_set_param_group(opt, 0, 3) == ACCEL_EINVAL, "group 3");
    CHECK(isnan(accel_optimizer_get_lr(opt, 5)));
    accel_optimizer_free(opt);
    accel_free(acc);
}

int main(void)
{
    cfg c[] = {
        {.kind = 0, .lr = 0.1},
        {.kind = 0, .lr = 0.05, .momentum = 0.9, .dampening = 0.1, .wd = 0.01},
        {.kind = 0, .lr = 0.05, .momentum = 0.9, .nesterov = 1, .wd = 0.02, .no_decay = 1},
        {.kind = 0, .lr = 0.01, .momentum = 0.5, .maximize = 1},
        {.kind = 1, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .wd = 0.1},
        {.kind = 2, .lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .wd = 0.1, .no_decay = 1},
        {.kind = 2, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .amsgrad = 1},
        {.kind = 1, .lr = 1e-3, .beta1 = 0.0, .beta2 = 0.5, .eps = 1e-8, .maximize = 1},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        run(&c[i]);
    }
    test_noop_while_accumulating();
    test_bad_input();
    printf("test_optim: ok\n");
    return 0;
}
