/* ACCEL_TEST_NPROCS: 1 2
 * ACCEL_TEST_LABELS: sim
 *
 * The device code paths on the simulated GPU (ACCEL_SIM_GPU, src/device/sim.h), against the
 * same run with the model on the CPU, bit for bit. A user's llm.c-style loop: host-written
 * "kernels" queued on the compute stream (accel__sim_launch) read the fp16 compute copy and add
 * their gradients into the model's gradient buffer in device memory between
 * accel_backward_begin, accel_grad_ready and accel_backward_end (with 2 processes the buckets
 * are staged through host memory); fp16 mixed precision with the scaler's inf check (the last
 * process's gradient is inf at one step: every process skips it), gradient accumulation 2,
 * several buckets with a frozen parameter inside one, clip_grad_norm that clips, AdamW. Then
 * the checkpoints: save_state from device memory resumed on the CPU, and the CPU's resumed on
 * the device, each continue bit-identically to the uninterrupted runs, and the state's and
 * save_model's tensor files are the same bytes from either device. The sim's page protection
 * makes any host read of device memory crash. Exits 77 where the device is not simulated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "device/device.h"
#include "device/sim.h"

#define NP 4
#define MAXN 520
#define ACC 2
#define STEPS 8
#define SAVE_AT 4  /* optimizer steps done when the state is saved */
#define INF_STEP 2 /* the step whose gradients hold an inf on the last process */
#define FROZEN 1

static const int64_t numel[NP] = {300, 280, 513, 64};

static float gen(uint64_t key, uint64_t i)
{
    uint64_t z = key * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 7;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0);
}

/* One backward "kernel": parameter p's gradient from its compute copy, added in. */
typedef struct kargs {
    float *grad;
    const void *wc;
    accel_dtype dt;
    size_t n;
    int p, t, micro, rank, inf;
    float seed;
} kargs;

static void grad_kernel(void *arg)
{
    const kargs *k = arg;
    float w[MAXN];
    CHECK_OK(NULL, accel_convert(w, ACCEL_F32, k->wc, k->dt, k->n));
    for (size_t j = 0; j < k->n; j++) {
        float g = (w[j] - gen((uint64_t)k->p, j)) * (1.0f + 0.25f * (float)k->rank) +
                  0.05f * gen((uint64_t)(1000 * k->t + 10 * k->micro + k->rank + 100), j);
        k->grad[j] += k->seed * g;
    }
    if (k->inf) {
        k->grad[0] = INFINITY;
    }
}

typedef struct run_spec {
    int on_cpu, from, to;
    const char *load, *save, *model_dir;
} run_spec;

/* Trains steps [from, to) with the model on the CPU or the simulated GPU; the final master
 * weights into out (numel order of the parameters). Returns 77 when there is no sim. */
static int run(const run_spec *rs, float *out)
{
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_FP16;
    o.gradient_accumulation_steps = ACC;
    o.first_bucket_mb = 2048.0 / 1048576.0;
    o.bucket_cap_mb = 4096.0 / 1048576.0;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel__device *d;
    CHECK_OK(NULL, accel__device_open(&d, accel_device_of(acc)));
    if (!rs->on_cpu && !accel__device_is_sim(d)) {
        fprintf(stderr, "test_sim_train: skipped: %s is not a simulated GPU (ACCEL_SIM_GPU=1)\n",
                accel_device_name(acc));
        accel_free(acc);
        return 77;
    }
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    if (rs->on_cpu) {
        CHECK_OK(acc, accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 0}));
        CHECK_OK(NULL, accel__device_open(&d, (accel_device){ACCEL_DEVICE_CPU, 0}));
    }
    for (int i = 0; i < NP; i++) {
        char name[16];
        snprintf(name, sizeof(name), "layer%d.weight", i);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, &numel[i], NULL));
    }
    CHECK_OK(acc, accel_model_freeze(m, FROZEN, 1));
    for (int i = 0; i < NP; i++) {
        float w0[MAXN];
        for (int64_t j = 0; j < numel[i]; j++) {
            w0[j] = 0.5f * gen((uint64_t)(50 + i), (uint64_t)j) + (float)rank; /* prepare: 0's */
        }
        CHECK_OK(NULL, accel__dev_copy(d, accel_model_param(m, i)->data_view.data, w0,
                                       (size_t)numel[i] * 4, ACCEL__COPY_H2D, NULL));
    }
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 1e-2;
    accel_optimizer *opt;
    CHECK_OK(acc, accel_adamw_new(acc, m, &ao, &opt));
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    CHECK(accel_model_num_buckets(m) > 1);
    if (rs->load != NULL) {
        CHECK_OK(acc, accel_load_state(acc, rs->load));
    }
    static kargs ka[ACC][NP];
    for (int t = rs->from; t < rs->to; t++) {
        for (int micro = 0; micro < ACC; micro++) {
            CHECK_OK(acc, accel_accumulate(acc, m));
            float seed = (float)accel_backward_begin(acc);
            for (int i = NP - 1; i >= 0; i--) {
                const accel_param *p = accel_model_param(m, i);
                if (i != FROZEN) {
                    ka[micro][i] = (kargs){p->grad_view.data, p->compute_view.data,
                                           p->compute_view.dtype, p->numel, i, t, micro, rank,
                                           t == INF_STEP && micro == 0 && rank == n - 1 && i == 0,
                                           seed};
                    if (rs->on_cpu) {
                        grad_kernel(&ka[micro][i]);
                    } else {
                        CHECK_OK(NULL, accel__sim_launch(d, NULL, grad_kernel, &ka[micro][i]));
                    }
                }
                CHECK_OK(acc, accel_grad_ready(m, i));
            }
            CHECK_OK(acc, accel_backward_end(acc));
        }
        CHECK(accel_sync_gradients(acc));
        double norm = 0;
        CHECK_OK(acc, accel_clip_grad_norm(acc, m, 0.5, 2.0, &norm));
        CHECK_MSG(t == INF_STEP ? !isfinite(norm) : norm > 0.5 && isfinite(norm),
                  "step %d: norm %g", t, norm);
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_MSG(accel_optimizer_step_was_skipped(acc) == (t == INF_STEP), "step %d", t);
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        if (rs->save != NULL && t + 1 == SAVE_AT) {
            CHECK_OK(acc, accel_save_state(acc, rs->save));
        }
    }
    size_t at = 0;
    for (int i = 0; i < NP; i++) {
        CHECK_OK(NULL, accel__dev_copy(d, out + at, accel_model_param(m, i)->data_view.data,
                                       (size_t)numel[i] * 4, ACCEL__COPY_D2H, NULL));
        at += (size_t)numel[i];
    }
    if (rs->model_dir != NULL) {
        CHECK_OK(acc, accel_save_model(acc, m, rs->model_dir, NULL));
    }
    accel_free(acc);
    return 0;
}

static size_t total(void)
{
    size_t t = 0;
    for (int i = 0; i < NP; i++) {
        t += (size_t)numel[i];
    }
    return t;
}

static void same_weights(const char *what, const float *a, const float *b)
{
    for (size_t j = 0; j < total(); j++) {
        CHECK_MSG(memcmp(&a[j], &b[j], 4) == 0, "%s: w[%zu] %.9g vs %.9g", what, j, a[j], b[j]);
    }
}

static void *slurp(const char *path, size_t *nbytes)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long len = ftell(f);
    CHECK(len >= 0 && fseek(f, 0, SEEK_SET) == 0);
    void *buf = malloc((size_t)len + 1);
    CHECK(buf != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *nbytes = (size_t)len;
    return buf;
}

static void same_file(const char *a, const char *b)
{
    size_t na, nb;
    void *x = slurp(a, &na), *y = slurp(b, &nb);
    CHECK_MSG(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

int main(void)
{
    char root[128], dev_state[160], cpu_state[160], dev_model[160], cpu_model[160];
    snprintf(root, sizeof(root), "/tmp/accel_test_sim_train_%d", (int)getppid());
    snprintf(dev_state, sizeof(dev_state), "%s/dev_state", root);
    snprintf(cpu_state, sizeof(cpu_state), "%s/cpu_state", root);
    snprintf(dev_model, sizeof(dev_model), "%s/dev_model", root);
    snprintf(cpu_model, sizeof(cpu_model), "%s/cpu_model", root);
    (void)mkdir(root, 0700);
    size_t nt = total();
    float *w_dev = malloc(nt * 4), *w_cpu = malloc(nt * 4), *w = malloc(nt * 4);
    CHECK(w_dev && w_cpu && w);

    run_spec dev_full = {0, 0, STEPS, NULL, dev_state, dev_model};
    if (run(&dev_full, w_dev) == 77) {
        return 77;
    }
    run_spec cpu_full = {1, 0, STEPS, NULL, cpu_state, cpu_model};
    (void)run(&cpu_full, w_cpu);
    same_weights("device vs CPU", w_dev, w_cpu);

    run_spec cpu_from_dev = {1, SAVE_AT, STEPS, dev_state, NULL, NULL};
    (void)run(&cpu_from_dev, w);
    same_weights("device checkpoint resumed on the CPU", w, w_cpu);
    run_spec dev_from_cpu = {0, SAVE_AT, STEPS, cpu_state, NULL, NULL};
    (void)run(&dev_from_cpu, w);
    same_weights("CPU checkpoint resumed on the device", w, w_dev);

    const char *files[] = {"model.safetensors", "optimizer.safetensors", "scaler.json"};
    char a[256], b[256];
    for (int k = 0; k < 3; k++) {
        snprintf(a, sizeof(a), "%s/%s", dev_state, files[k]);
        snprintf(b, sizeof(b), "%s/%s", cpu_state, files[k]);
        same_file(a, b);
    }
    snprintf(a, sizeof(a), "%s/model.safetensors", dev_model);
    snprintf(b, sizeof(b), "%s/model.safetensors", cpu_model);
    same_file(a, b);

    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK_OK(acc, accel_barrier(acc, NULL));
    if (accel_process_index(acc) == 0) {
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
        CHECK(system(cmd) == 0);
    }
    accel_free(acc);
    free(w_dev);
    free(w_cpu);
    free(w);
    printf("test_sim_train: ok\n");
    return 0;
}
