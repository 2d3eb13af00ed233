/* ACCEL_TEST_NPROCS: 2 3
 *
 * ZeRO stages 1-2 under mixed precision (bf16 and fp16) keep only this process's shard of the
 * fp32 master; the full weights are the working copy. On a hand-made model (no nn) with exact
 * values, per stage and precision:
 *  - before prepare the weights are written through accel_param.data (fp32, process 0's
 *    values win); prepare keeps only the shard (master bytes = 1/N of the padded model), gives
 *    the full fp32 pages back and fills the working copy with round(weights);
 *  - after prepare accel_model_master is NULL with ACCEL_ESTATE, data reads zeros until
 *    gathered, accel_model_gather_all makes every data the working copy widened, and a backward
 *    after a forward that materialized nothing fails with ACCEL_EINVAL;
 *  - an SGD step on hand-set gradients updates the fp32 master pieces exactly (w - lr * mean g)
 *    and the all-gathered working copy is round(new master) on every process;
 *  - a checkpoint load writes the master pieces: the working copy is stale (compute_view
 *    refuses) until the next materialize, which all-gathers it from the loaded pieces (stage
 *    2), or a join region, which gathers the fp32 master and rounds it (stage 1);
 *  - accel_load_model on the prepared model is refused (the weights would be dropped).
 */
#include <string.h>

#include "check.h"
#include "train/train_internal.h"
#include "zero_master.h"

#define N_PARAMS 3
static const int64_t numels[N_PARAMS] = {300, 41, 517};

/* Initial weight k of parameter i (bf16 / fp16 round them: not all are representable). */
static float init_value(int i, int64_t k)
{
    return (float)((k * 37 + i * 11) % 101) / 33.0f - 1.5f;
}

/* x rounded to dt and widened back. */
static float rounded(float x, accel_dtype dt)
{
    uint16_t h;
    float y;
    CHECK_OK(NULL, accel_convert(&h, dt, &x, ACCEL_F32, 1));
    CHECK_OK(NULL, accel_convert(&y, ACCEL_F32, &h, dt, 1));
    return y;
}

/* Every parameter's data (gathered) equals round(master[...]) and the working copy matches. */
static void check_gathered(accel *acc, accel_model *m, const float *master, accel_dtype dt)
{
    CHECK_OK(acc, accel_model_gather_all(m));
    size_t at = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            float want = rounded(master[at + k], dt), got_c;
            CHECK_OK(NULL, accel_convert(&got_c, ACCEL_F32,
                                         (const uint16_t *)p->compute_view.data + k, dt, 1));
            CHECK_MSG(p->data[k] == want && got_c == want, "param %d [%zu]: %g / %g, want %g", i, k,
                      (double)p->data[k], (double)got_c, (double)want);
        }
        at += p->numel;
    }
}

static void run(int stage, accel_precision mp, const char *dir)
{
    accel_options o = accel_options_default();
    o.zero_stage = stage;
    o.mixed_precision = mp;
    o.first_bucket_mb = 0.001; /* several buckets, so pieces cut parameters */
    o.bucket_cap_mb = 0.002;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_dtype dt = mp == ACCEL_PRECISION_BF16 ? ACCEL_BF16 : ACCEL_F16;
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    for (int i = 0; i < N_PARAMS; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d.weight", i);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, &numels[i], NULL));
    }
    CHECK_OK(acc, accel_model_alloc(m));
    CHECK(m->master_shard);
    size_t numel = accel_model_numel(m), full = m->flat.padded_numel * sizeof(float);
    float *want = malloc(numel * sizeof(float)), *got = malloc(numel * sizeof(float));
    size_t at = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        const accel_param *p = accel_model_param(m, i);
        for (int64_t k = 0; k < numels[i]; k++) {
            want[at + (size_t)k] = init_value(i, k);
            p->data[k] = rank == 0 ? init_value(i, k) : -7.0f; /* prepare broadcasts process 0's */
        }
        at += p->numel;
    }
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = 0.5;
    accel_optimizer *opt = accel_sgd(acc, m, &so);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));

    /* The shard only; the full fp32 pages given back; the master refused. */
    CHECK(accel__flat_shard_numel(&m->flat) * sizeof(float) * (size_t)n == full);
    CHECK(accel__pages_resident(m->weights, full) == 0);
    CHECK(accel_model_master(m) == NULL && accel_last_status(acc) == ACCEL_ESTATE);
    CHECK(strstr(accel_last_error(acc), "mixed precision") != NULL);
    CHECK(accel_model_param(m, 2)->data[5] == 0.0f); /* not gathered: zeros, documented */
    zero_read_master(acc, m, got);
    CHECK(memcmp(got, want, numel * sizeof(float)) == 0);
    check_gathered(acc, m, want, dt);

    /* A backward after a forward that read nothing through materialize is refused. */
    CHECK_OK(acc, accel__zero3_release_all(m));
    (void)accel_backward_begin(acc);
    CHECK(accel_backward_end(acc) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "accel_model_materialize") != NULL);

    /* One step: gradient 1 on process 0, 3 on the others, so every element gets the mean
     * (1 + 3 (n - 1)) / n; lr 0.5. */
    CHECK_OK(acc, accel_model_materialize(m, 0));
    CHECK_OK(acc, accel_accumulate(acc, m));
    float scale = (float)accel_backward_begin(acc);
    for (int i = 0; i < N_PARAMS; i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            p->grad[k] = (rank == 0 ? 1.0f : 3.0f) * scale; /* fp16: the loss scale */
        }
        CHECK_OK(acc, accel_grad_ready(m, i));
    }
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK(accel__pages_resident(m->weights, full) == 0); /* released after the backward */
    CHECK_OK(acc, accel_optimizer_step(opt));
    float mean = (1.0f + 3.0f * (float)(n - 1)) / (float)n;
    for (size_t k = 0; k < numel; k++) {
        want[k] = want[k] - 0.5f * mean;
    }
    zero_read_master(acc, m, got);
    double worst = 0;
    for (size_t k = 0; k < numel; k++) {
        worst = fmax(worst, fabs((double)got[k] - want[k]));
    }
    CHECK_MSG(worst <= 1e-6, "master after the step: %g from expected", worst);
    memcpy(want, got, numel * sizeof(float)); /* the step's own rounding of the mean */
    check_gathered(acc, m, want, dt);
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));

    /* Save, change the master by a second step, load: the pieces come back, the working copy
     * follows at the next materialize. */
    CHECK_OK(acc, accel_save_state(acc, dir));
    CHECK_OK(acc, accel_accumulate(acc, m));
    CHECK_OK(acc, accel_model_materialize(m, 0));
    scale = (float)accel_backward_begin(acc);
    for (int i = 0; i < N_PARAMS; i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            p->grad[k] = 2.0f * scale;
        }
        CHECK_OK(acc, accel_grad_ready(m, i));
    }
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK_OK(acc, accel_optimizer_step(opt));
    zero_read_master(acc, m, got);
    CHECK(memcmp(got, want, numel * sizeof(float)) != 0);
    CHECK_OK(acc, accel_load_state(acc, dir));
    accel_tensor view;
    CHECK(accel_model_compute_view(m, &view) == ACCEL_ESTATE);
    zero_read_master(acc, m, got);
    CHECK(memcmp(got, want, numel * sizeof(float)) == 0);
    if (stage == 1) {
        /* A join region right after the load runs as DDP on the gathered fp32 master: the
         * working copy follows it there. */
        CHECK_OK(acc, accel_join_begin(acc, m, 0));
        CHECK_OK(acc, accel_model_compute_view(m, &view));
        at = 0;
        for (int i = 0; i < N_PARAMS; i++) {
            const accel_param *p = accel_model_param(m, i);
            CHECK(memcmp(p->data, want + at, p->numel * sizeof(float)) == 0);
            for (size_t k = 0; k < p->numel; k++) {
                float c;
                CHECK_OK(NULL, accel_convert(&c, ACCEL_F32,
                                             (const uint16_t *)view.data + p->offset + k, dt, 1));
                CHECK(c == rounded(want[at + k], dt));
            }
            at += p->numel;
        }
        CHECK_OK(acc, accel_join_end(acc, m));
    } else {
        CHECK_OK(acc, accel_model_materialize(m, 1));
        CHECK_OK(acc, accel_model_compute_view(m, &view));
    }
    check_gathered(acc, m, want, dt);

    /* Weights loaded into a prepared sharded model would land in pages that are dropped:
     * refused, naming the way that works. */
    char model_dir[600];
    snprintf(model_dir, sizeof(model_dir), "%s/saved_model", dir);
    CHECK_OK(acc, accel_save_model(acc, m, model_dir, NULL));
    CHECK(accel_load_model(acc, m, model_dir, 1) == ACCEL_EUNSUPPORTED);
    CHECK_MSG(strstr(accel_last_error(acc), "load the weights before accel_prepare") != NULL, "%s",
              accel_last_error(acc));
    zero_read_master(acc, m, got);
    CHECK(memcmp(got, want, numel * sizeof(float)) == 0);

    free(want);
    free(got);
    accel_free(acc);
}

int main(void)
{
    char root[64] = "/tmp/accel-zero-mixed-XXXXXX";
    accel *probe;
    CHECK_OK(NULL, accel_init(&probe, NULL));
    int rank = accel_process_index(probe);
    /* One folder for every process: process 0 makes it and broadcasts the name. */
    if (rank == 0) {
        CHECK(mkdtemp(root) != NULL);
    }
    CHECK_OK(probe, accel_broadcast(probe, root, root, sizeof root, ACCEL_U8, 0, NULL));
    int k = 0;
    for (int stage = 1; stage <= 2; stage++) {
        for (int p = 0; p < 2; p++) {
            char dir[96];
            snprintf(dir, sizeof dir, "%s/c%d", root, k++);
            run(stage, p == 0 ? ACCEL_PRECISION_BF16 : ACCEL_PRECISION_FP16, dir);
            printf("stage %d %s: ok\n", stage, p == 0 ? "bf16" : "fp16");
        }
    }
    CHECK_OK(probe, accel_wait_for_everyone(probe));
    if (rank == 0) {
        char cmd[96];
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        CHECK(system(cmd) == 0);
    }
    accel_free(probe);
    return 0;
}
