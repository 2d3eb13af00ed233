/* ACCEL_TEST_NPROCS: 1 2
 *
 * nn + accel: a GPT built into an accel_model through nn_model_sink trains data-parallel with
 * accel_backward. N processes x batch b reach the same weights as one process x batch N*b
 * (a standalone nn model trained here with the same SGD) to 1e-5 after 3 steps, with
 * gradient accumulation 2 (each micro-batch is half the process's batch). Also: parameter
 * names/order are the model's, parameters are views into its flat buffers, and every process
 * ends bit-identical.
 */
#include <string.h>

#include "accel/nn.h"
#include "check.h"
#include "small_gpt.h"

#define B 2 /* sequences per process per step */
#define T 8
#define STEPS 3
#define ACCUM 2
#define LR 0.05f

static void tokens(int step, int seq, int32_t *ids, int32_t *tg)
{
    for (int t = 0; t < T; t++) {
        ids[t] = (int32_t)((step * 131 + seq * 17 + t * 7) % 32);
        tg[t] = (int32_t)((step * 29 + seq * 5 + t * 3 + 1) % 32);
    }
}

int main(void)
{
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = ACCUM;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    nn_gpt_config cfg = small_gpt_config(2, 2, 16, T, 32, 1);

    /* The distributed model (prepare broadcasts rank 0's init). */
    accel_model *m;
    nn_params *p;
    nn_gpt *gpt;
    small_gpt_new(acc, &cfg, 11 + (uint64_t)rank, &m, &p, &gpt);
    CHECK(accel_model_num_params(m) == nn_params_count(p));
    for (int i = 0; i < nn_params_count(p); i++) {
        const accel_param *ap = accel_model_param(m, i);
        nn_tensor *t = nn_params_get(p, i);
        CHECK(strcmp(ap->name, nn_params_name(p, i)) == 0 && t->param_index == i);
        CHECK(t->data == ap->data && t->grad == ap->grad);
    }
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    accel_optimizer *opt = accel_sgd(acc, m, &so);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));

    /* The reference: one process, the whole batch of n*B sequences, the same init. */
    nn_gpt *ref;
    nn_params *rp;
    CHECK_OK(NULL, nn_gpt_build(&ref, &rp, &cfg, 11));
    int64_t count;
    float *rw = nn_params_flat_data(rp, &count), *rg = nn_params_flat_grad(rp, NULL);

    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));
    int32_t ids[64 * T], tg[64 * T];
    for (int step = 0; step < STEPS; step++) {
        for (int micro = 0; micro < ACCUM; micro++) {
            int per = B / ACCUM;
            for (int s = 0; s < per; s++) {
                tokens(step, rank * B + micro * per + s, ids + s * T, tg + s * T);
            }
            CHECK_OK(acc, accel_accumulate(acc, m));
            nn_tensor *loss = NULL;
            CHECK_OK(NULL, nn_gpt_forward(g, gpt, ids, tg, per, T, NULL, &loss));
            CHECK_OK(acc, accel_backward(acc, loss));
            CHECK_OK(acc, accel_optimizer_step(opt));
            CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        }
        for (int s = 0; s < n * B; s++) {
            tokens(step, s, ids + s * T, tg + s * T);
        }
        nn_tensor *loss = NULL;
        CHECK_OK(NULL, nn_gpt_forward(g, ref, ids, tg, n * B, T, NULL, &loss));
        nn_params_zero_grad(rp);
        CHECK_OK(NULL, nn_backward(loss, 1.0f, NULL));
        for (int64_t i = 0; i < count; i++) {
            rw[i] -= LR * rg[i];
        }
    }
    double worst = 0.0;
    for (int i = 0; i < nn_params_count(p); i++) {
        nn_tensor *a = nn_params_get(p, i), *b = nn_params_get(rp, i);
        for (int64_t k = 0; k < nn_numel(a); k++) {
            double d = fabs((double)a->data[k] - b->data[k]);
            worst = d > worst ? d : worst;
        }
    }
    printf("rank %d/%d: max |distributed - reference| = %.3g\n", rank, n, worst);
    CHECK(worst <= 1e-5);
    /* Every process holds the same weights, bit for bit. */
    float *flat = accel_model_master(m);
    size_t numel = accel_model_numel(m);
    float *mx = malloc(numel * sizeof(float)), *mn = malloc(numel * sizeof(float));
    memcpy(mx, flat, numel * sizeof(float));
    memcpy(mn, flat, numel * sizeof(float));
    CHECK_OK(acc, accel_allreduce(acc, mx, mx, numel, ACCEL_F32, ACCEL_MAX, NULL));
    CHECK_OK(acc, accel_allreduce(acc, mn, mn, numel, ACCEL_F32, ACCEL_MIN, NULL));
    CHECK(memcmp(mx, mn, numel * sizeof(float)) == 0);
    free(mx);
    free(mn);
    nn_ctx_free(g);
    nn_gpt_free(ref);
    nn_params_free(rp);
    nn_gpt_free(gpt);
    nn_params_free(p);
    accel_free(acc);
    return 0;
}
