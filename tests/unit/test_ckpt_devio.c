/*
 * Checkpoints through staging (ckpt/devio.h), forced on the CPU so that the chunking and
 * double buffering run on every machine (a model on a GPU takes the same path).
 *  1. The layer itself: to_host hands a sink every byte in order, in chunks of the forced size;
 *     from_host fills in chunks that are multiples of the alignment, contiguous, and the
 *     destination ends equal to the source; a failing sink or fill stops the transfer with its
 *     status; without staging, host memory is passed through in one call.
 *  2. accel_save_state / accel_save_model (one file and sharded) written through staging are
 *     byte for byte the files of an unstaged save; accel_load_state and accel_load_model (a bf16
 *     file converted to the F32 weights) through staging restore exactly what was saved, the
 *     optimizer state included (a save after the load is again the same files).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/devio.h"

static const accel_device cpu = {ACCEL_DEVICE_CPU, 0};

/* ---- 1. the layer ---- */

typedef struct sink_log {
    char *out;
    size_t n, calls, fail_at; /* fail_at: the call that fails (0: none) */
    size_t biggest;
} sink_log;

static accel_status log_sink(void *ctx, const void *data, size_t n)
{
    sink_log *l = ctx;
    if (++l->calls == l->fail_at) {
        return accel__seterr(NULL, ACCEL_EIO, "sink refused call %zu", l->calls);
    }
    memcpy(l->out + l->n, data, n);
    l->n += n;
    l->biggest = n > l->biggest ? n : l->biggest;
    return ACCEL_OK;
}

typedef struct fill_log {
    const char *src;
    size_t next, calls, fail_at, align;
    int bad; /* a chunk out of order or misaligned */
} fill_log;

static accel_status log_fill(void *ctx, void *buf, size_t off, size_t n)
{
    fill_log *l = ctx;
    if (++l->calls == l->fail_at) {
        return accel__seterr(NULL, ACCEL_EIO, "fill refused call %zu", l->calls);
    }
    l->bad |= off != l->next || n % l->align != 0 || n == 0;
    memcpy(buf, l->src + off, n);
    l->next = off + n;
    return ACCEL_OK;
}

static void layer_cases(void)
{
    enum { MAX = 1000 };
    char src[MAX], dst[MAX], out[MAX];
    for (int i = 0; i < MAX; i++) {
        src[i] = (char)(i * 37 + 11);
    }
    const size_t sizes[] = {0, 1, 6, 7, 8, 100, 996};
    const size_t chunks[] = {7, 64, 4096};
    accel__devio *io = NULL;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        accel__devio_force_staging(chunks[c]);
        CHECK(accel__devio_staged(cpu));
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k], want_calls = (n + chunks[c] - 1) / chunks[c];
            sink_log s = {out, 0, 0, 0, 0};
            CHECK_OK(NULL, accel__devio_to_host(&io, cpu, src, n, log_sink, &s));
            CHECK_MSG(s.n == n && memcmp(out, src, n) == 0 && s.calls == want_calls &&
                          s.biggest <= chunks[c],
                      "to_host %zu bytes in chunks of %zu: %zu bytes in %zu calls", n, chunks[c],
                      s.n, s.calls);
            /* from_host: 4-byte elements; a chunk of 7 bytes holds one (4 bytes). */
            size_t m = n - n % 4, per = chunks[c] - chunks[c] % 4;
            memset(dst, 0, sizeof dst);
            fill_log f = {src, 0, 0, 0, 4, 0};
            CHECK_OK(NULL, accel__devio_from_host(&io, cpu, dst, m, 4, log_fill, &f));
            CHECK_MSG(!f.bad && f.next == m && memcmp(dst, src, m) == 0 &&
                          f.calls == (m + per - 1) / per,
                      "from_host %zu bytes in chunks of %zu: %zu calls%s", m, per, f.calls,
                      f.bad ? ", out of order" : "");
        }
        if (chunks[c] * 3 <= 996) { /* failures stop the transfer, status and message kept */
            sink_log s = {out, 0, 0, 3, 0};
            CHECK_ERR(NULL, accel__devio_to_host(&io, cpu, src, 996, log_sink, &s), ACCEL_EIO,
                      "sink refused call 3");
            CHECK(s.calls == 3);
            fill_log f = {src, 0, 0, 2, 1, 0};
            CHECK_ERR(NULL, accel__devio_from_host(&io, cpu, dst, 996, 1, log_fill, &f), ACCEL_EIO,
                      "fill refused call 2");
            CHECK(f.calls == 2);
        }
    }
    /* Elements larger than the buffers are refused, naming both sizes. */
    accel__devio_force_staging(7);
    fill_log f = {src, 0, 0, 0, 8, 0};
    CHECK_ERR(NULL, accel__devio_from_host(&io, cpu, dst, 16, 8, log_fill, &f), ACCEL_EINVAL,
              "accel__devio_from_host: elements of 8 bytes do not fit the 7-byte staging "
              "buffers");
    accel__devio_free(io);

    /* Unforced: host memory is handed over as it is, in one call. */
    accel__devio_force_staging(0);
    CHECK(!accel__devio_staged(cpu));
    CHECK(accel__devio_staged((accel_device){ACCEL_DEVICE_CUDA, 0}));
    io = NULL;
    sink_log s = {out, 0, 0, 0, 0};
    CHECK_OK(NULL, accel__devio_to_host(&io, cpu, src, 996, log_sink, &s));
    CHECK(s.calls == 1 && s.n == 996 && io == NULL);
    fill_log g = {src, 0, 0, 0, 4, 0};
    CHECK_OK(NULL, accel__devio_from_host(&io, cpu, dst, 996, 4, log_fill, &g));
    CHECK(g.calls == 1 && io == NULL);
}

/* ---- 2. checkpoints ---- */

static char root[128];

typedef struct job {
    accel *acc;
    accel_model *m;
    accel_optimizer *opt;
} job;

static void start(job *j)
{
    memset(j, 0, sizeof(*j));
    CHECK_OK(NULL, accel_init(&j->acc, NULL));
    CHECK_OK(j->acc, accel_model_new(j->acc, &j->m));
    CHECK_OK(j->acc, accel_model_add_param(j->m, "a.weight", 2, (int64_t[]){37, 29}, NULL));
    CHECK_OK(j->acc, accel_model_add_param(j->m, "a.bias", 1, (int64_t[]){37}, NULL));
    CHECK_OK(j->acc, accel_model_add_param(j->m, "b", 1, (int64_t[]){3}, NULL));
    CHECK_OK(j->acc, accel_model_alloc(j->m));
    float *w = accel_model_master(j->m);
    for (size_t i = 0; i < accel_model_numel(j->m); i++) {
        w[i] = (float)i / 100.0f - 3.0f;
    }
    CHECK((j->opt = accel_adamw(j->acc, j->m, NULL)) != NULL);
    CHECK_OK(j->acc, accel_prepare(j->acc, j->m, j->opt));
}

/* Steps with gradients from `key`, so the weights and the optimizer state hold bits. */
static void train(job *j, int steps, int key)
{
    for (int t = 0; t < steps; t++) {
        CHECK_OK(j->acc, accel_accumulate(j->acc, j->m));
        float *g = accel_model_grad(j->m);
        for (size_t i = 0; i < accel_model_numel(j->m); i++) {
            g[i] = (float)((i * 7 + (size_t)t * 13 + (size_t)key) % 17) / 8.0f - 1.0f;
        }
        CHECK_OK(j->acc, accel_optimizer_step(j->opt));
        CHECK_OK(j->acc, accel_optimizer_zero_grad(j->opt));
    }
}

/* File `name` is the same in folders a and b. */
static void same_file(const char *a, const char *b, const char *name)
{
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    check_same_file(pa, pb);
}

/* Folders a and b hold the same files (a sharded save: at least 3). */
static void same_dir(const char *a, const char *b)
{
    DIR *d = opendir(a);
    CHECK(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] != '.') {
            same_file(a, b, e->d_name);
            n++;
        }
    }
    closedir(d);
    CHECK_MSG(n >= 3, "%s holds %d files", a, n);
}

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", root, name);
}

static void state_cases(void)
{
    char plain[300], staged[300], again[300], mplain[300], mstaged[300];
    path_of(plain, sizeof plain, "plain");
    path_of(staged, sizeof staged, "staged");
    path_of(again, sizeof again, "again");
    path_of(mplain, sizeof mplain, "model_plain");
    path_of(mstaged, sizeof mstaged, "model_staged");
    job j;
    start(&j);
    train(&j, 3, 1);
    size_t n = accel_model_numel(j.m);
    float *saved = malloc(n * sizeof(float));
    memcpy(saved, accel_model_master(j.m), n * sizeof(float));

    /* Saves: the same bytes through staging (chunks of 24 bytes: many per tensor). */
    CHECK_OK(j.acc, accel_save_state(j.acc, plain));
    accel__devio_force_staging(24);
    CHECK_OK(j.acc, accel_save_state(j.acc, staged));
    same_file(plain, staged, "model.safetensors");
    same_file(plain, staged, "optimizer.safetensors");
    CHECK_OK(j.acc, accel_save_model(j.acc, j.m, mstaged, "1KB")); /* sharded */
    accel__devio_force_staging(0);
    CHECK_OK(j.acc, accel_save_model(j.acc, j.m, mplain, "1KB"));
    same_dir(mplain, mstaged);

    /* Loads: train on (weights and optimizer state change), then load through staging. */
    train(&j, 2, 5);
    CHECK(memcmp(saved, accel_model_master(j.m), n * sizeof(float)) != 0);
    accel__devio_force_staging(40);
    CHECK_OK(j.acc, accel_load_state(j.acc, staged));
    accel__devio_force_staging(0);
    CHECK(memcmp(saved, accel_model_master(j.m), n * sizeof(float)) == 0);
    CHECK_OK(j.acc, accel_save_state(j.acc, again));
    same_file(plain, again, "model.safetensors");
    same_file(plain, again, "optimizer.safetensors");

    /* accel_load_model through staging converts chunk by chunk: a bf16 file (written through
     * staging too) loads as the unstaged load does. */
    uint16_t *half = malloc(n * sizeof(uint16_t));
    CHECK_OK(NULL, accel_convert(half, ACCEL_BF16, saved, ACCEL_F32, n));
    accel_named_tensor ts[3];
    for (int i = 0; i < 3; i++) {
        const accel_param *p = accel_model_param(j.m, i);
        ts[i].name = p->name;
        ts[i].tensor = accel_tensor_view(half + (p->data - accel_model_master(j.m)), ACCEL_BF16,
                                         p->ndim, p->shape);
    }
    char bf[300];
    path_of(bf, sizeof bf, "bf16.safetensors");
    accel__devio_force_staging(24);
    CHECK_OK(NULL, accel_safetensors_write(bf, ts, 3, NULL, 0));
    CHECK_OK(j.acc, accel_load_model(j.acc, j.m, bf, 1));
    accel__devio_force_staging(0);
    float *via = malloc(n * sizeof(float));
    memcpy(via, accel_model_master(j.m), n * sizeof(float));
    train(&j, 1, 9);
    CHECK_OK(j.acc, accel_load_model(j.acc, j.m, bf, 1));
    CHECK(memcmp(via, accel_model_master(j.m), n * sizeof(float)) == 0);
    CHECK(memcmp(via, saved, n * sizeof(float)) != 0); /* rounded to bf16 */

    free(via);
    free(half);
    free(saved);
    accel_free(j.acc);
}

int main(void)
{
    unsetenv("ACCELERATE_RESUME_FROM_CHECKPOINT");
    unsetenv("ACCELERATE_CONFIG_FILE");
    setenv("HF_HOME", "/nonexistent/accel-test", 1);
    snprintf(root, sizeof root, "/tmp/accel_test_ckpt_devio_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
    CHECK(system(cmd) == 0);
    layer_cases();
    state_cases();
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
    printf("test_ckpt_devio: ok\n");
    return 0;
}
