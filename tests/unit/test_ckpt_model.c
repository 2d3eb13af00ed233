/*
 * save_model / load_model on one process: bit-exact round trips through a single file, shards
 * (folder, index path, one shard non-strict), dtype conversion from BF16/F16/F64 files, strict
 * and non-strict name matching, and a shape mismatch rejected naming the tensor with the model
 * left untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/half.h"

static char g_dir[256];

typedef struct spec {
    const char *name;
    int ndim;
    int64_t shape[2];
} spec;

static const spec k_specs[] = {
    {"h.0.attn.weight", 2, {4, 3}}, {"h.0.attn.bias", 1, {4}}, {"lm_head.weight", 2, {2, 4}}};

static accel_model *build(accel *acc, const spec *specs, int n, float seed)
{
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    for (int i = 0; i < n; i++) {
        CHECK_OK(acc, accel_model_add_param(m, specs[i].name, specs[i].ndim, specs[i].shape, NULL));
    }
    CHECK_OK(acc, accel_model_alloc(m));
    for (int i = 0; i < n; i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            p->data[k] = seed + (float)i * 0.25f + (float)k * 0.0078125f;
        }
    }
    return m;
}

static int same_weights(accel_model *a, accel_model *b)
{
    size_t n = accel_model_numel(a);
    return n == accel_model_numel(b) &&
           memcmp(accel_model_master(a), accel_model_master(b), n * sizeof(float)) == 0;
}

static void path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static void test_round_trips(accel *acc)
{
    accel_model *src = build(acc, k_specs, 3, 1.0f);
    char dir[400], p[500];
    path(dir, sizeof dir, "single");
    CHECK_OK(acc, accel_save_model(acc, src, dir, NULL));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK(strcmp(accel_safetensors_metadata(st, "format"), "pt") == 0);
    CHECK(accel_safetensors_count(st) == 3);
    accel_safetensors_close(st);

    accel_model *dst = build(acc, k_specs, 3, -5.0f);
    CHECK(!same_weights(src, dst));
    CHECK_OK(acc, accel_load_model(acc, dst, dir, 1)); /* folder */
    CHECK(same_weights(src, dst));
    accel_model_free(dst);
    dst = build(acc, k_specs, 3, -5.0f);
    CHECK_OK(acc, accel_load_model(acc, dst, p, 1)); /* file */
    CHECK(same_weights(src, dst));
    accel_model_free(dst);

    /* Sharded: 48 + 16 + 32 bytes with a 40-byte limit -> [weight] [bias] [lm_head]. */
    path(dir, sizeof dir, "sharded");
    CHECK_OK(acc, accel_save_model(acc, src, dir, "40B"));
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(access(p, F_OK) == 0);
    dst = build(acc, k_specs, 3, -5.0f);
    CHECK_OK(acc, accel_load_model(acc, dst, dir, 1));
    CHECK(same_weights(src, dst));
    accel_model_free(dst);
    dst = build(acc, k_specs, 3, -5.0f);
    CHECK_OK(acc, accel_load_model(acc, dst, p, 1)); /* the index itself */
    CHECK(same_weights(src, dst));
    /* An index that is not JSON says where (it said only "no weight_map object"). */
    char bad_index[700], want[900];
    snprintf(bad_index, sizeof bad_index, "%s/broken.index.json", dir);
    FILE *bf = fopen(bad_index, "w");
    CHECK(bf != NULL && fputs("{\"weight_map\": {\"a\": }", bf) >= 0);
    fclose(bf);
    snprintf(want, sizeof want,
             "%s: not a safetensors index: not valid JSON (line 1 column 22: unexpected token "
             "near '}')",
             bad_index);
    CHECK_ERR(acc, accel_load_model(acc, dst, bad_index, 1), ACCEL_ECORRUPT, want);
    CHECK(same_weights(src, dst));
    accel_model_free(dst);
    /* One shard: strict fails naming a missing parameter; non-strict loads just that one. */
    dst = build(acc, k_specs, 3, -5.0f);
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", dir);
    CHECK(accel_load_model(acc, dst, p, 1) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "missing") != NULL);
    CHECK_OK(acc, accel_load_model(acc, dst, p, 0));
    const accel_param *b = accel_model_param(dst, 1);
    CHECK(b->data[0] == accel_model_param(src, 1)->data[0]);
    CHECK(accel_model_param(dst, 0)->data[0] == -5.0f); /* not in that shard: untouched */
    accel_model_free(dst);

    /* A path that is a file is refused as a save folder. */
    snprintf(p, sizeof p, "%s/single/model.safetensors", g_dir);
    CHECK(accel_save_model(acc, src, p, NULL) == ACCEL_EINVAL);
    CHECK(accel_save_model(acc, src, dir, "12XB") == ACCEL_EINVAL);
    accel_model_free(src);
}

static void test_mismatch(accel *acc)
{
    accel_model *src = build(acc, k_specs, 3, 1.0f);
    char dir[400];
    path(dir, sizeof dir, "mismatch");
    CHECK_OK(acc, accel_save_model(acc, src, dir, NULL));

    spec other[3] = {k_specs[0], {"h.0.attn.bias", 1, {5}}, k_specs[2]};
    accel_model *dst = build(acc, other, 3, -5.0f);
    float before = accel_model_param(dst, 0)->data[0];
    CHECK(accel_load_model(acc, dst, dir, 0) == ACCEL_EINVAL);
    CHECK_MSG(strstr(accel_last_error(acc), "'h.0.attn.bias'") != NULL, "%s",
              accel_last_error(acc));
    CHECK(strstr(accel_last_error(acc), "[4]") && strstr(accel_last_error(acc), "[5]"));
    CHECK(accel_model_param(dst, 0)->data[0] == before); /* nothing written */
    accel_model_free(dst);

    /* Extra parameter in the model: strict names it; non-strict leaves it alone. */
    spec more[4] = {k_specs[0], k_specs[1], k_specs[2], {"extra.scale", 1, {2}}};
    dst = build(acc, more, 4, -5.0f);
    CHECK(accel_load_model(acc, dst, dir, 1) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "'extra.scale'") != NULL);
    CHECK_OK(acc, accel_load_model(acc, dst, dir, 0));
    CHECK(accel_model_param(dst, 3)->data[0] == -5.0f + 3 * 0.25f);
    CHECK(accel_model_param(dst, 0)->data[1] == accel_model_param(src, 0)->data[1]);
    accel_model_free(dst);
    /* Fewer parameters in the model: strict names the unexpected tensor. */
    dst = build(acc, k_specs, 2, -5.0f);
    CHECK(accel_load_model(acc, dst, dir, 1) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "'lm_head.weight'") != NULL);
    accel_model_free(dst);
    char p[500];
    path(p, sizeof p, "nowhere");
    CHECK(accel_load_model(acc, src, p, 1) == ACCEL_ENOTFOUND);
    accel_model_free(src);
}

/* Files in other dtypes (as PyTorch writes bf16/fp16 checkpoints) convert on load. */
static void test_dtypes(accel *acc)
{
    uint16_t w_bf16[12], b_f16[4];
    double head[8];
    float want_w[12], want_b[4];
    for (int i = 0; i < 12; i++) {
        want_w[i] = (float)i * 0.5f - 3.0f; /* exact in bf16 */
        w_bf16[i] = (uint16_t)(accel__f32_bits(want_w[i]) >> 16);
    }
    for (int i = 0; i < 4; i++) {
        want_b[i] = (float)i * 0.25f + 1.0f; /* exact in f16: 1.0 = 0x3c00, step 2^-2 */
        b_f16[i] = (uint16_t)(0x3c00 + i * 0x100);
    }
    for (int i = 0; i < 8; i++) {
        head[i] = 1.0 / 3.0 + i;
    }
    accel_named_tensor ts[] = {
        {"h.0.attn.weight", accel_tensor_view(w_bf16, ACCEL_BF16, 2, (int64_t[]){4, 3})},
        {"h.0.attn.bias", accel_tensor_view(b_f16, ACCEL_F16, 1, (int64_t[]){4})},
        {"lm_head.weight", accel_tensor_view(head, ACCEL_F64, 2, (int64_t[]){2, 4})},
    };
    char p[400];
    path(p, sizeof p, "mixed.safetensors");
    CHECK_OK(NULL, accel_safetensors_write(p, ts, 3, NULL, 0));
    accel_model *m = build(acc, k_specs, 3, 0.0f);
    CHECK_OK(acc, accel_load_model(acc, m, p, 1));
    CHECK(memcmp(accel_model_param(m, 0)->data, want_w, sizeof want_w) == 0);
    CHECK(memcmp(accel_model_param(m, 1)->data, want_b, sizeof want_b) == 0);
    for (int i = 0; i < 8; i++) {
        CHECK(accel_model_param(m, 2)->data[i] == (float)head[i]);
    }

    /* U32 converts like any integer; a C64 tensor has no conversion to the F32 weights: the
     * load is refused naming it, before any weight changes. */
    uint32_t u[4] = {0, 1, 2, 4000000000u};
    float cplx[16] = {0};
    ts[1].tensor = accel_tensor_view(u, ACCEL_U32, 1, (int64_t[]){4});
    path(p, sizeof p, "u32.safetensors");
    CHECK_OK(NULL, accel_safetensors_write(p, ts, 3, NULL, 0));
    CHECK_OK(acc, accel_load_model(acc, m, p, 1));
    CHECK(accel_model_param(m, 1)->data[3] == 4e9f);
    ts[2].tensor = accel_tensor_view(cplx, ACCEL_C64, 2, (int64_t[]){2, 4});
    u[3] = 5; /* must not reach the model */
    path(p, sizeof p, "c64.safetensors");
    CHECK_OK(NULL, accel_safetensors_write(p, ts, 3, NULL, 0));
    CHECK(accel_load_model(acc, m, p, 1) == ACCEL_EUNSUPPORTED);
    CHECK_MSG(strstr(accel_last_error(acc), "'lm_head.weight' is C64") != NULL, "%s",
              accel_last_error(acc));
    CHECK(accel_model_param(m, 1)->data[3] == 4e9f && accel_model_param(m, 0)->data[0] == -3.0f);
    accel_model_free(m);
}

int main(void)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    unsetenv("ACCELERATE_CONFIG_FILE");
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_test_ckpt_model_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    test_round_trips(acc);
    test_mismatch(acc);
    test_dtypes(acc);
    /* A folder whose model.safetensors is a FIFO: named as such, not "holds neither". */
    char d[300], fifo[340];
    path(d, sizeof d, "fifo_model");
    CHECK(mkdir(d, 0700) == 0);
    snprintf(fifo, sizeof fifo, "%s/model.safetensors", d);
    CHECK(mkfifo(fifo, 0600) == 0);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){4}, NULL));
    alarm(20);
    char want[400];
    snprintf(want, sizeof want, "%s is a FIFO, not a safetensors file", fifo);
    CHECK_ERR(acc, accel_load_model(acc, m, d, 1), ACCEL_EINVAL, want);
    alarm(0);
    accel_free(acc);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    printf("test_ckpt_model: ok\n");
    return 0;
}
