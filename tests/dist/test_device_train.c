/* ACCEL_TEST_NPROCS: 1 2 3 4
 * ACCEL_TEST_LABELS: gpu sim nccl
 *
 * Training with the model in device memory against the same run with the model on the CPU, bit
 * for bit: on the simulated GPU (ACCEL_SIM_GPU, src/device/sim.h; with several processes the
 * buckets and allgathers are staged through host memory over shm) and on CUDA (one GPU per
 * process: the nccl backend reduces, scatters and gathers the GPU buffers in place; processes
 * sharing a GPU: staging again). A user's llm.c-style loop: "kernels" (host code queued on the
 * sim's compute stream, or run between copies on a CUDA GPU) read the compute copy and add
 * their gradients into the model's gradient buffer in device memory between
 * accel_backward_begin, accel_grad_ready and accel_backward_end; gradient accumulation 2,
 * several buckets with a frozen parameter inside one, clip_grad_norm that clips (under ZeRO
 * the shards' sums of squares all-reduced), clip_grad_value, AdamW. Configurations: DDP with
 * fp16 (the last process's gradient is inf at one step: every process skips it), ZeRO-1 with
 * fp32 and bf16, ZeRO-2 with fp32, with fp16, with bf16 + sync_each_batch (with and without
 * bf16 compressed all-reduces), ZeRO-3 with fp32 and with bf16 + sync_each_batch (a unit per
 * layer, gathered into reserved device memory: nothing mapped between steps;
 * check_stage3_memory bounds what is mapped with units of several granules), and hybrid
 * sharding (2 groups of 2 on 4 processes, else groups of one process, replicated; on nccl and
 * through staging) at ZeRO-1 and ZeRO-2 with bf16, ZeRO-2 with fp16 + sync_each_batch and
 * ZeRO-3 with bf16. Under ZeRO each process's optimizer state is its shard (device memory).
 * For each, save_state from device memory (at a step and inside the accumulation window)
 * resumed on the CPU, and the CPU's resumed on the device, continue bit-identically to the
 * uninterrupted runs, and the states' and save_model's tensor files are the same bytes from either
 * device. Bit for bit holds because both sides reduce in rank order in fp32 (shm, staging, the
 * emulated NCCL of the cuemu build) and every kernel is element-wise or reduces in a fixed order; a
 * real NCCL sums more than two processes in ring order, so there the test skips (77, saying so).
 * Also: load_model into a device model and a sharded save_model from it; join regions (uneven
 * inputs) at stages 0-3 (stage 3 with hybrid sharding too: the region runs as DDP, the shards
 * gathered and taken again in device memory); (CUDA emulator) the refusal of stage 3 on a GPU
 * without virtual memory management. The sim's page protection makes any host read of device
 * memory crash. Exits 77 where the accelerator has no
 * device (no GPU, ACCEL_SIM_GPU unset).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "device/device.h"
#include "device/sim.h"
#include "train/train_internal.h"

#define NP 4
#define MAXN 520
#define ACC 2
#define STEPS 8
#define SAVE_AT                                                                                    \
    4              /* optimizer steps done when the state is saved (again one micro-step later,    \
                    * inside the accumulation window: with each process's gradients) */
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

static char root[128]; /* the test's folder, shared by the processes */

/* Runs a backward "kernel" where the model lives: on the CPU directly, on the simulated GPU
 * queued on its compute stream (k must outlive the launch), on a CUDA GPU on the host between
 * copies in the compute stream's order (each returns once done). */
static void launch(accel__device *d, int on_cpu, kargs *k)
{
    if (on_cpu) {
        grad_kernel(k);
        return;
    }
    if (accel__device_is_sim(d)) {
        CHECK_OK(NULL, accel__sim_launch(d, NULL, grad_kernel, k));
        return;
    }
    static float grad[MAXN], wc[MAXN];
    kargs h = *k;
    h.grad = grad;
    h.wc = wc;
    CHECK_OK(NULL, accel__dev_copy(d, wc, k->wc, k->n * accel_dtype_nbytes(k->dt), ACCEL__COPY_D2H,
                                   NULL));
    CHECK_OK(NULL, accel__dev_copy(d, grad, k->grad, k->n * 4, ACCEL__COPY_D2H, NULL));
    grad_kernel(&h);
    CHECK_OK(NULL, accel__dev_copy(d, k->grad, grad, k->n * 4, ACCEL__COPY_H2D, NULL));
}

/* A configuration: ZeRO stage and mixed precision (fp16: the scaler's inf check). */
typedef struct config {
    int zero_stage;
    accel_precision precision;
    int sync_each_batch; /* every micro-step reduces (ZeRO-2: later ones add to reduced pieces) */
    int join;            /* uneven inputs: process r trains STEPS - r steps in a join region */
    accel_dtype comm_dtype; /* bf16: compressed all-reduces (ZeRO-2 keeps the all-reduce) */
    int hybrid;             /* hybrid sharding (zero_shard_size: see shard_size) */
} config;

typedef struct run_spec {
    config cfg;
    int on_cpu, from; /* from: the first micro-step (after a load) */
    const char *load, *save, *save_mid, *model_dir;
} run_spec;

/* The hybrid configuration's groups: 2 of 2 processes on 4, else groups of one (replicated;
 * what divides every process count). The launcher's WORLD_SIZE: needed before accel_init. */
static int shard_size(void)
{
    const char *ws = getenv("WORLD_SIZE");
    int n = ws != NULL ? atoi(ws) : 1;
    return n == 4 ? 2 : 1;
}

/* Trains micro-steps [from, STEPS * ACC) with the model on the CPU or the device and writes
 * the final weights with accel_save_model into rs->model_dir (under ZeRO with mixed precision a CPU
 * process holds only its shard of the fp32 master: the file is where the weights are whole).
 * Returns 77 when there is no device, SKIP_CONFIG when this configuration cannot be bit-identical
 * on it (nothing done). */
#define SKIP_CONFIG 2
static int run(const run_spec *rs)
{
    accel_options o = accel_options_default();
    o.mixed_precision = rs->cfg.precision;
    o.zero_stage = rs->cfg.zero_stage;
    o.sync_each_batch = rs->cfg.sync_each_batch;
    o.comm_dtype = rs->cfg.comm_dtype;
    if (rs->cfg.hybrid) {
        o.zero_shard_size = shard_size();
    }
    o.gradient_accumulation_steps = ACC;
    o.first_bucket_mb = 2048.0 / 1048576.0;
    o.bucket_cap_mb = 4096.0 / 1048576.0;
    if (rs->on_cpu) {
        o.cpu = 1; /* the host backend (shm) too, not only the model on the CPU */
    }
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel__device *d;
    CHECK_OK(NULL, accel__device_open(&d, accel_device_of(acc)));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    int nccl = strcmp(accel_backend_name(acc), "nccl") == 0;
    if (!rs->on_cpu && accel_device_of(acc).type == ACCEL_DEVICE_CPU) {
        fprintf(stderr, "test_device_train: skipped: the accelerator's device is the CPU (no GPU; "
                        "ACCEL_SIM_GPU=1 simulates one)\n");
        accel_free(acc); /* the test ends: no accelerator follows */
        return 77;
    }
    if (!rs->on_cpu && n > 2 && nccl && getenv("ACCEL_CUEMU") == NULL) {
        fprintf(stderr,
                "test_device_train: skipped: NCCL sums %d processes in ring order, not "
                "in the CPU run's rank order, so the runs are not bit-identical\n",
                n);
        accel_free(acc); /* the test ends: no accelerator follows */
        return 77;
    }
    if (!rs->on_cpu && n > 2 && nccl && rs->cfg.comm_dtype != ACCEL_F32) {
        /* NCCL reduces a wire dtype in it (nccl.c): rounded at every addition beyond two
         * processes, where the host backends round the fp32 sum once. */
        printf("test_device_train: ZeRO stage %d with comm_dtype %s not compared on nccl with %d "
               "processes (partial sums rounded to the wire dtype)\n",
               rs->cfg.zero_stage, accel_dtype_name(rs->cfg.comm_dtype), n);
        accel_free(acc);
        return SKIP_CONFIG;
    }
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
        if (rs->cfg.zero_stage == 3) {
            CHECK_OK(acc, accel_model_set_unit(m, i, 1)); /* a unit per layer */
        }
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
    if (!rs->on_cpu && n > 1) {
        /* The path under test: a device communicator reads the GPU buffers, a host one
         * stages them; under ZeRO-1/2 the full fp32 master stays (model.c), at stage 3 it is
         * the shard; the optimizer state is this process's shard, in device memory. */
        int held = 0;
        CHECK(m->red.on_device == nccl && m->red.staged == !nccl &&
              m->master_shard == (rs->cfg.zero_stage == 3));
        size_t state = accel__zero_state_numel(m);
        size_t group = rs->cfg.hybrid ? (size_t)shard_size() : (size_t)n;
        CHECK_MSG(rs->cfg.zero_stage == 0 ? state == m->flat.padded_numel
                                          : state * group == m->flat.padded_numel,
                  "stage %d: optimizer state of %zu elements for %zu parameters (padded)",
                  rs->cfg.zero_stage, state, m->flat.padded_numel);
        CHECK_OK(NULL, accel__dev_holds(d, opt->state_a, &held));
        CHECK(held || accel__device_is_sim(d));
    }
    if (rs->load != NULL) {
        CHECK_OK(acc, accel_load_state(acc, rs->load));
    }
    static kargs ka[ACC][NP];
    int fp16 = rs->cfg.precision == ACCEL_PRECISION_FP16;
    int end = STEPS * ACC;
    if (rs->cfg.join) {
        CHECK_OK(acc, accel_join_begin(acc, m, 1));
        end = (STEPS - rank) * ACC;
    }
    for (int ms = rs->from; ms < end; ms++) {
        int t = ms / ACC, micro = ms % ACC;
        {
            CHECK_OK(acc, accel_accumulate(acc, m));
            for (int i = 0; i < NP; i++) { /* the forward's reads (sharded master: a no-op) */
                CHECK_OK(acc, accel_model_materialize(m, i));
            }
            float seed = (float)accel_backward_begin(acc);
            for (int i = NP - 1; i >= 0; i--) {
                const accel_param *p = accel_model_param(m, i);
                CHECK_OK(acc, accel_model_materialize(m, i)); /* stage 3: its unit gathered */
                if (i != FROZEN) {
                    ka[micro][i] =
                        (kargs){p->grad_view.data,
                                p->compute_view.data,
                                p->compute_view.dtype,
                                p->numel,
                                i,
                                t,
                                micro,
                                rank,
                                fp16 && t == INF_STEP && micro == 0 && rank == n - 1 && i == 0,
                                seed};
                    launch(d, rs->on_cpu, &ka[micro][i]);
                }
                CHECK_OK(acc, accel_grad_ready(m, i));
            }
            CHECK_OK(acc, accel_backward_end(acc));
        }
        if (rs->save_mid != NULL && ms == SAVE_AT * ACC) {
            CHECK_OK(acc, accel_save_state(acc, rs->save_mid));
        }
        if (micro < ACC - 1) {
            CHECK(!accel_sync_gradients(acc));
            continue;
        }
        CHECK(accel_sync_gradients(acc));
        double norm = 0;
        CHECK_OK(acc, accel_clip_grad_norm(acc, m, 0.5, 2.0, &norm));
        int inf = fp16 && t == INF_STEP;
        CHECK_MSG(inf ? !isfinite(norm) : norm > 0.5 && isfinite(norm), "step %d: norm %g", t,
                  norm);
        if (t % 3 == 1) {
            CHECK_OK(acc, accel_clip_grad_value(acc, m, 0.01)); /* the clamp kernel */
        }
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_MSG(accel_optimizer_step_was_skipped(acc) == inf, "step %d", t);
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        if (rs->save != NULL && t + 1 == SAVE_AT) {
            CHECK_OK(acc, accel_save_state(acc, rs->save));
        }
    }
    if (rs->cfg.join) {
        CHECK_OK(acc, accel_join_end(acc, m)); /* the joined ones mirror the buckets */
    }
    if (rs->cfg.zero_stage == 3 && !rs->on_cpu) {
        /* Between steps no unit is mapped; at most four ever were (here all in a granule
         * or two: check_stage3_memory measures bigger units). A join region of several
         * processes maps every unit, and its end takes the shard again, counting from there
         * (nothing since). */
        size_t now, peak, g;
        accel__zero3_mapped(m, &now, &peak);
        CHECK_OK(NULL, accel__dev_range_granularity(d, &g));
        int joined = rs->cfg.join && n > 1;
        CHECK_MSG(now == 0 && (joined ? peak == 0 : peak > 0 && peak <= 2 * 4 * 3 * g),
                  "mapped %zu, peak %zu", now, peak);
    }
    CHECK_OK(acc, accel_save_model(acc, m, rs->model_dir, NULL));
    accel_free(acc);
    return 0;
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

/* Files a and b hold the same bytes; what: the comparison, for the message. */
static void same_file(const char *what, const char *a, const char *b)
{
    size_t na, nb, k = 0;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    while (k < na && k < nb && x[k] == y[k]) {
        k++;
    }
    CHECK_MSG(na == nb && k == na, "%s: %s and %s differ (%zu and %zu bytes, first at byte %zu)",
              what, a, b, na, nb, k);
    free(x);
    free(y);
}

/* accel_load_model of the CPU's file into a model on the device, then accel_save_model of it
 * in shards of 2 KiB (an index and several files), against the CPU model's sharded save. */
static void check_model_files(const char *cpu_model)
{
    char dirs[2][256];
    for (int on_cpu = 0; on_cpu < 2; on_cpu++) {
        accel_options o = accel_options_default();
        accel *acc;
        CHECK_OK(NULL, accel_init(&acc, &o));
        accel_model *m;
        CHECK_OK(acc, accel_model_new(acc, &m));
        if (on_cpu) {
            CHECK_OK(acc, accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 0}));
        }
        for (int i = 0; i < NP; i++) {
            char name[16];
            snprintf(name, sizeof(name), "layer%d.weight", i);
            CHECK_OK(acc, accel_model_add_param(m, name, 1, &numel[i], NULL));
        }
        CHECK_OK(acc, accel_model_alloc(m));
        CHECK_OK(acc, accel_load_model(acc, m, cpu_model, 1));
        CHECK_OK(acc, accel_prepare(acc, m));
        snprintf(dirs[on_cpu], sizeof(dirs[on_cpu]), "%s/sharded_%s", root, on_cpu ? "cpu" : "dev");
        CHECK_OK(acc, accel_save_model(acc, m, dirs[on_cpu], "2KiB"));
        accel_free(acc);
    }
    DIR *d = opendir(dirs[1]);
    CHECK_MSG(d != NULL, "cannot open %s", dirs[1]);
    int files = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char a[512], b[512];
        snprintf(a, sizeof(a), "%s/%s", dirs[0], e->d_name);
        snprintf(b, sizeof(b), "%s/%s", dirs[1], e->d_name);
        same_file("sharded save_model after load_model", a, b);
        files++;
    }
    closedir(d);
    CHECK_MSG(files >= 3, "%d files: expected an index and shards", files);
}

/* A join region (uneven inputs): device vs CPU. Under ZeRO the region runs as DDP: the
 * optimizer state (stage 3: the units too) gathered at join_begin, resharded at join_end from
 * the last joiner's. */
static void check_join(config cfg)
{
    char dev[256], cpu[256], a[300], b[300];
    snprintf(dev, sizeof(dev), "%s/join_dev_%d_%d", root, cfg.zero_stage, cfg.hybrid);
    snprintf(cpu, sizeof(cpu), "%s/join_cpu_%d_%d", root, cfg.zero_stage, cfg.hybrid);
    run_spec on_dev = {cfg, 0, 0, NULL, NULL, NULL, dev};
    run_spec on_cpu = {cfg, 1, 0, NULL, NULL, NULL, cpu};
    if (run(&on_dev) == SKIP_CONFIG) {
        return;
    }
    (void)run(&on_cpu);
    snprintf(a, sizeof(a), "%s/model.safetensors", dev);
    snprintf(b, sizeof(b), "%s/model.safetensors", cpu);
    char what[64];
    snprintf(what, sizeof(what), "join region, ZeRO stage %d%s", cfg.zero_stage,
             cfg.hybrid ? ", hybrid sharding" : "");
    same_file(what, a, b);
}

/* The emulator's own count of memory mapped into reserved ranges and of its driver calls
 * (tests/cuemu/vmm.c), in the CUDA emulator build only. */
size_t cuemu_vmm_mapped_bytes(void) __attribute__((weak));
size_t cuemu_vmm_calls(const char *entry) __attribute__((weak));

/* The driver calls of reserved ranges since the last call: accel's count of map and unmap
 * calls (accel__zero3_calls) and, in the emulator build, the emulator's own of each entry
 * point, which must agree (one map: cuMemCreate + cuMemMap + cuMemSetAccess; one unmap:
 * cuMemUnmap + cuMemRelease). */
static void range_calls(const accel_model *m, size_t *maps, size_t *unmaps)
{
    static size_t last_maps, last_unmaps, last_emu[5];
    static int primed; /* the first call only takes the counts (the emulator's count earlier
                        * runs' models too) */
    static const char *const entries[5] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess",
                                           "cuMemUnmap", "cuMemRelease"};
    uint64_t waits;
    size_t total_maps, total_unmaps;
    accel__zero3_calls(m, &total_maps, &total_unmaps, &waits);
    *maps = total_maps - last_maps;
    *unmaps = total_unmaps - last_unmaps;
    last_maps = total_maps;
    last_unmaps = total_unmaps;
    for (int k = 0; k < 5 && cuemu_vmm_calls != NULL; k++) {
        size_t now = cuemu_vmm_calls(entries[k]), want = k < 3 ? *maps : *unmaps;
        CHECK_MSG(!primed || now - last_emu[k] == want, "%s called %zu times, accel counts %zu",
                  entries[k], now - last_emu[k], want);
        last_emu[k] = now;
    }
    primed = 1;
}

/* A simulated kernel reading the first and last float of every unit's weights. */
typedef struct unit_reads {
    const float *at[2 * 8];
    int n;
    float sum;
} unit_reads;

static void read_units(void *arg)
{
    unit_reads *r = arg;
    for (int k = 0; k < r->n; k++) {
        r->sum += *r->at[k];
    }
}

/* ZeRO stage 3 with bf16 on the device, units of several granules: during a forward and a
 * backward at most four units are mapped (weights and compute copy, plus the granules they
 * share with neighbours): the window's three and the one that left it last, whose unmap waits
 * for its event on the compute stream; the unit before that is unmapped (its inner granules),
 * and after the step nothing is. Mapping a unit costs at most three driver allocations per
 * range whatever its granules (the emulator agrees), and on the simulated GPU, a kernel
 * queued to read units that then leave the window runs before they are unmapped. */
#define Z3_UNITS 6
#define Z3_NUMEL 1100000 /* 4.4 MB of fp32: more than two 2 MiB granules */
static void check_stage3_memory(void)
{
    accel_options o = accel_options_default();
    o.zero_stage = 3;
    o.mixed_precision = ACCEL_PRECISION_BF16;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel__device *d;
    CHECK_OK(NULL, accel__device_open(&d, accel_device_of(acc)));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    int64_t n = Z3_NUMEL;
    for (int i = 0; i < Z3_UNITS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "blocks.%d.weight", i); /* a unit each, by name */
        CHECK_OK(acc, accel_model_add_param(m, name, 1, &n, NULL));
    }
    CHECK_OK(acc, accel_model_alloc(m));
    float *w0 = malloc(Z3_NUMEL * sizeof(float));
    CHECK(w0 != NULL);
    for (int i = 0; i < Z3_UNITS; i++) {
        for (size_t j = 0; j < Z3_NUMEL; j++) {
            w0[j] = gen((uint64_t)(70 + i), j);
        }
        CHECK_OK(NULL, accel__dev_copy(d, accel_model_param(m, i)->data_view.data, w0,
                                       Z3_NUMEL * 4, ACCEL__COPY_H2D, NULL));
    }
    accel_optimizer *opt;
    accel_adam_options ao = accel_adamw_options_default();
    CHECK_OK(acc, accel_adamw_new(acc, m, &ao, &opt));
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    CHECK(accel_model_num_units(m) == Z3_UNITS);
    size_t g, now, peak, unit = 0;
    CHECK_OK(NULL, accel__dev_range_granularity(d, &g));
    for (int b = 0; b < m->flat.n_buckets; b++) {
        unit = m->flat.buckets[b].padded > unit ? m->flat.buckets[b].padded : unit;
    }
    /* Four units of fp32 weights and bf16 compute copy, each range's span two granules more
     * than its bytes at most. */
    size_t bound = 4 * (unit * 4 + 2 * g) + 4 * (unit * 2 + 2 * g);
    size_t maps, unmaps, most_maps = 0;
    accel__zero3_mapped(m, &now, &peak);
    CHECK_MSG(now == 0, "%zu bytes mapped after prepare", now);
    range_calls(m, &maps, &unmaps);
    CHECK_OK(acc, accel_accumulate(acc, m));
    for (int i = 0; i < Z3_UNITS; i++) { /* forward */
        CHECK_OK(acc, accel_model_materialize(m, i));
        accel__zero3_mapped(m, &now, &peak);
        CHECK_MSG(now <= bound && now >= unit * 6, "forward at %d: %zu bytes mapped (bound %zu)",
                  i, now, bound);
        if (cuemu_vmm_mapped_bytes != NULL) {
            CHECK_MSG(cuemu_vmm_mapped_bytes() == now, "the emulator maps %zu bytes, accel %zu",
                      cuemu_vmm_mapped_bytes(), now);
        }
        /* Units mapped here: two at the first (it and the next), else the next; at most three
         * allocations each per range (two edge granules, the run between), not one a granule. */
        range_calls(m, &maps, &unmaps);
        CHECK_MSG(maps <= (i == 0 ? 2u : 1u) * 2 * 3,
                  "forward at %d: %zu driver allocations for units of %zu granules", i, maps,
                  unit * 4 / g);
        most_maps = maps > most_maps ? maps : most_maps;
        if (i >= 2) { /* the unit of parameter i - 2 left the window: deferred, still mapped */
            const accel__flat_bucket *fb = &m->flat.buckets[m->flat_bucket[i - 2]];
            CHECK_MSG(accel__zero3_is_mapped(m, fb->offset + fb->padded / 2),
                      "forward at %d: the unit of parameter %d was unmapped at once", i, i - 2);
            CHECK(accel__zero3_unit_state(m, m->flat_bucket[i - 2]) == 0);
        }
        if (i >= 3) { /* the unit of parameter i - 3 left the window before: unmapped */
            const accel__flat_bucket *fb = &m->flat.buckets[m->flat_bucket[i - 3]];
            CHECK_MSG(!accel__zero3_is_mapped(m, fb->offset + fb->padded / 2),
                      "forward at %d: the unit of parameter %d is still mapped", i, i - 3);
            CHECK(accel__zero3_unit_state(m, m->flat_bucket[i - 3]) == 0);
        }
    }
    (void)accel_backward_begin(acc);
    for (int i = Z3_UNITS - 1; i >= 0; i--) {
        CHECK_OK(acc, accel_model_materialize(m, i));
        CHECK_OK(acc, accel_grad_ready(m, i));
    }
    CHECK_OK(acc, accel_backward_end(acc));
    CHECK_OK(acc, accel_optimizer_step(opt));
    accel__zero3_mapped(m, &now, &peak);
    CHECK_MSG(now == 0 && peak <= bound, "after the step: %zu bytes mapped, peak %zu (bound %zu)",
              now, peak, bound);
    size_t step_peak = peak;
    if (cuemu_vmm_mapped_bytes != NULL) {
        CHECK(cuemu_vmm_mapped_bytes() == 0);
    }
    /* The weights came back whole: gathered, they are process 0's. */
    CHECK_OK(acc, accel_model_gather_all(m));
    CHECK_OK(NULL, accel__dev_copy(d, w0, accel_model_param(m, Z3_UNITS - 1)->data_view.data,
                                   Z3_NUMEL * 4, ACCEL__COPY_D2H, NULL));
    float lr = 1e-3f; /* AdamW's first step moves each weight by lr (zero gradients: 0) */
    for (size_t j = 0; j < Z3_NUMEL; j += 4099) {
        float want = gen(70 + Z3_UNITS - 1, j) * (1.0f - lr * 0.01f);
        CHECK_MSG(fabsf(w0[j] - want) <= 1e-6f, "weight %zu: %g, expected %g", j, w0[j], want);
    }
    /* Everything is mapped now. A kernel queued to read every unit, then a materialize that
     * moves the window: the units leaving it stay mapped until their event says the kernel
     * has run (on the simulated GPU it runs only when something waits for it, so an unmap
     * that did not wait would make it fault), and the bound unmaps all but four. */
    static unit_reads reads;
    reads.n = 0;
    for (int i = 0; i < Z3_UNITS; i++) {
        const float *w = accel_model_param(m, i)->data_view.data;
        reads.at[reads.n++] = w;
        reads.at[reads.n++] = w + Z3_NUMEL - 1;
    }
    if (accel__device_is_sim(d)) {
        CHECK_OK(NULL, accel__sim_launch(d, NULL, read_units, &reads));
    }
    uint64_t waits_before, waits;
    accel__zero3_calls(m, &maps, &unmaps, &waits_before);
    CHECK_OK(acc, accel_model_materialize(m, 0));
    CHECK_OK(NULL, accel__stream_sync(d, NULL));
    accel__zero3_calls(m, &maps, &unmaps, &waits);
    int n_mapped = 0;
    for (int b = 0; b < Z3_UNITS; b++) {
        const accel__flat_bucket *fb = &m->flat.buckets[b];
        n_mapped += accel__zero3_is_mapped(m, fb->offset + fb->padded / 2);
    }
    CHECK_MSG(n_mapped == 4 && waits - waits_before <= Z3_UNITS - 4,
              "after gather_all and a materialize: %d units mapped, %llu waits", n_mapped,
              (unsigned long long)(waits - waits_before));
    CHECK_OK(acc, accel__zero3_release_all(m));
    accel__zero3_mapped(m, &now, &peak);
    CHECK(now == 0);
    printf("test_device_train: ZeRO stage 3 on %s: at most %zu bytes mapped (bound %zu; %zu per "
           "unit in fp32, %zu granules of %zu bytes), at most %zu driver allocations per unit "
           "change\n",
           accel__device_name(d), step_peak, bound, unit * 4, unit * 4 / g, g, most_maps);
    free(w0);
    accel_free(acc);
}

/* Device vs CPU, and each one's checkpoint resumed on the other, for one configuration. */
static int check_config(config cfg)
{
    char what[128], dir[10][256];
    snprintf(what, sizeof(what), "ZeRO stage %d, %s%s%s%s", cfg.zero_stage,
             cfg.precision == ACCEL_PRECISION_FP16   ? "fp16"
             : cfg.precision == ACCEL_PRECISION_BF16 ? "bf16"
                                                     : "fp32",
             cfg.sync_each_batch ? ", sync_each_batch" : "",
             cfg.comm_dtype == ACCEL_BF16 ? ", comm_dtype bf16" : "",
             cfg.hybrid ? ", hybrid sharding" : "");
    const char *names[10] = {"dev_state",       "cpu_state",      "dev_model", "cpu_model",
                             "cpu_resumed",     "dev_resumed",    "dev_mid",   "cpu_mid",
                             "cpu_resumed_mid", "dev_resumed_mid"};
    for (int k = 0; k < 10; k++) {
        snprintf(dir[k], sizeof(dir[k]), "%s/%s_%d_%d_%d_%d", root, names[k], cfg.zero_stage,
                 cfg.sync_each_batch, (int)cfg.comm_dtype, cfg.hybrid);
    }
    run_spec dev_full = {cfg, 0, 0, NULL, dir[0], dir[6], dir[2]};
    int st = run(&dev_full);
    if (st != 0) {
        return st == SKIP_CONFIG ? 0 : st;
    }
    run_spec cpu_full = {cfg, 1, 0, NULL, dir[1], dir[7], dir[3]};
    (void)run(&cpu_full);
    run_spec cpu_from_dev = {cfg, 1, SAVE_AT * ACC, dir[0], NULL, NULL, dir[4]};
    (void)run(&cpu_from_dev);
    run_spec dev_from_cpu = {cfg, 0, SAVE_AT * ACC, dir[1], NULL, NULL, dir[5]};
    (void)run(&dev_from_cpu);
    run_spec cpu_from_dev_mid = {cfg, 1, SAVE_AT * ACC + 1, dir[6], NULL, NULL, dir[8]};
    (void)run(&cpu_from_dev_mid);
    run_spec dev_from_cpu_mid = {cfg, 0, SAVE_AT * ACC + 1, dir[7], NULL, NULL, dir[9]};
    (void)run(&dev_from_cpu_mid);

    char a[512], b[512], c[512];
    snprintf(a, sizeof(a), "%s/model.safetensors", dir[2]);
    snprintf(b, sizeof(b), "%s/model.safetensors", dir[3]);
    same_file(what, a, b); /* device vs CPU */
    snprintf(c, sizeof(c), "%s/model.safetensors", dir[4]);
    same_file(what, c, b); /* the device's checkpoint resumed on the CPU */
    snprintf(c, sizeof(c), "%s/model.safetensors", dir[5]);
    same_file(what, c, a); /* the CPU's resumed on the device */
    snprintf(c, sizeof(c), "%s/model.safetensors", dir[8]);
    same_file(what, c, b); /* inside the window: the device's resumed on the CPU */
    snprintf(c, sizeof(c), "%s/model.safetensors", dir[9]);
    same_file(what, c, a); /* and the CPU's on the device */

    /* The states' tensor files: model and optimizer (one file, or each process's shard under
     * ZeRO), each process's gradients inside the window, and the scaler. */
    for (int k = 0; k < 2; k++) {
        const char *cpu_dir = dir[k ? 7 : 1], *dev_dir = dir[k ? 6 : 0];
        DIR *d = opendir(cpu_dir);
        CHECK_MSG(d != NULL, "cannot open %s", cpu_dir);
        int compared = 0, grads = 0;
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (strstr(e->d_name, ".safetensors") == NULL &&
                strcmp(e->d_name, "scaler.json") != 0) {
                continue;
            }
            snprintf(a, sizeof(a), "%.250s/%.250s", dev_dir, e->d_name);
            snprintf(b, sizeof(b), "%.250s/%.250s", cpu_dir, e->d_name);
            same_file(what, a, b);
            compared++;
            grads += strstr(e->d_name, "gradients") != NULL;
        }
        closedir(d);
        CHECK(compared >= 2);
        CHECK_MSG((grads > 0) == (k == 1), "%s: %d gradient files in %s", what, grads, cpu_dir);
    }
    if (cfg.zero_stage == 0) {
        check_model_files(dir[3]);
    }
    return 0;
}

int main(void)
{
    snprintf(root, sizeof(root), "/tmp/accel_test_device_train_%d", (int)getppid());
    (void)mkdir(root, 0700);
    const config configs[] = {
        {0, ACCEL_PRECISION_FP16, 0, 0, ACCEL_F32, 0}, /* DDP */
        {1, ACCEL_PRECISION_NO, 0, 0, ACCEL_F32, 0},   /* ZeRO-1: allreduce, step, allgather */
        {1, ACCEL_PRECISION_BF16, 0, 0, ACCEL_F32, 0},
        {2, ACCEL_PRECISION_NO, 0, 0, ACCEL_F32, 0}, /* ZeRO-2: reduce-scatter, step, allgather */
        {2, ACCEL_PRECISION_FP16, 0, 0, ACCEL_F32, 0},
        {2, ACCEL_PRECISION_BF16, 1, 0, ACCEL_F32, 0},
        {2, ACCEL_PRECISION_BF16, 1, 0, ACCEL_BF16, 0},
        {1, ACCEL_PRECISION_BF16, 0, 0, ACCEL_F32, 1}, /* hybrid sharding */
        {2, ACCEL_PRECISION_BF16, 0, 0, ACCEL_F32, 1},
        {2, ACCEL_PRECISION_FP16, 1, 0, ACCEL_F32, 1},
        {3, ACCEL_PRECISION_NO, 0, 0, ACCEL_F32, 0},   /* ZeRO-3: units gathered, mapped */
        {3, ACCEL_PRECISION_BF16, 1, 0, ACCEL_F32, 0},
        {3, ACCEL_PRECISION_BF16, 0, 0, ACCEL_F32, 1}, /* HYBRID_SHARD */
    };
    for (size_t k = 0; k < sizeof(configs) / sizeof(configs[0]); k++) {
        if (check_config(configs[k]) == 77) {
            (void)rmdir(root); /* made before anything is written */
            return 77;
        }
    }
    const config joins[] = {
        {0, ACCEL_PRECISION_BF16, 0, 1, ACCEL_F32, 0}, /* DDP */
        {1, ACCEL_PRECISION_BF16, 0, 1, ACCEL_F32, 0},
        {2, ACCEL_PRECISION_NO, 0, 1, ACCEL_F32, 0},
        {3, ACCEL_PRECISION_BF16, 0, 1, ACCEL_F32, 0}, /* every unit mapped in the region */
        {3, ACCEL_PRECISION_NO, 0, 1, ACCEL_F32, 1},
    };
    for (size_t k = 0; k < sizeof(joins) / sizeof(joins[0]); k++) {
        check_join(joins[k]);
    }

    check_stage3_memory();
    accel_options o = accel_options_default();
    accel *acc;
    accel_model *m;
    o.zero_stage = 3;
    if (getenv("ACCEL_CUEMU") != NULL) {
        /* The CUDA emulator playing a GPU without virtual memory management: stage 3 refused
         * at alloc, naming the GPU and why. */
        setenv("ACCEL_CUEMU_NO_VMM", "1", 1);
        CHECK_OK(NULL, accel_init(&acc, &o));
        CHECK_OK(acc, accel_model_new(acc, &m));
        CHECK_OK(acc, accel_model_add_param(m, "w", 1, &numel[0], NULL));
        CHECK(accel_model_alloc(m) == ACCEL_EUNSUPPORTED);
        CHECK_MSG(strstr(accel_last_error(acc), "ZeRO stage 3") &&
                      strstr(accel_last_error(acc), "does not support virtual memory") &&
                      strstr(accel_last_error(acc), "accel CUDA emulator"),
                  "%s", accel_last_error(acc));
        accel_free(acc);
        unsetenv("ACCEL_CUEMU_NO_VMM");
    }
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK_OK(acc, accel_barrier(acc, NULL));
    if (accel_process_index(acc) == 0) {
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
        CHECK(system(cmd) == 0);
    }
    accel_free(acc); /* the last: no accelerator follows */
    printf("test_device_train: ok\n");
    return 0;
}
