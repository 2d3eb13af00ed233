/*
 * Saving named tensors: size strings as Accelerate / huggingface_hub parse them, the hub's
 * sharding order with a tiny max_shard_size, the index file byte for byte, stale-file removal
 * between saves, and accel_save on one process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char g_dir[256];

static void expect_size(const char *s, uint64_t want)
{
    uint64_t got = 0;
    CHECK_OK(NULL, accel_parse_size(s, &got));
    CHECK_MSG(got == want, "\"%s\" -> %llu, want %llu", s, (unsigned long long)got,
              (unsigned long long)want);
}

static void expect_bad_size(const char *s)
{
    uint64_t got = 7;
    CHECK_MSG(accel_parse_size(s, &got) == ACCEL_EINVAL, "\"%s\" accepted", s);
    CHECK(got == 7);
    CHECK(strstr(accel_last_error(NULL), s) != NULL);
}

static void test_parse_size(void)
{
    expect_size("10GB", 10000000000ULL);
    expect_size("10gb", 1250000000ULL); /* Accelerate: a trailing lower-case b means bits */
    expect_size("10Gb", 1250000000ULL);
    expect_size("500MiB", 500ULL << 20);
    expect_size("500mib", 500ULL << 20);
    expect_size("1KB", 1000);
    expect_size("2KiB", 2048);
    expect_size("3TB", 3000000000000ULL);
    expect_size("1TiB", 1ULL << 40);
    expect_size("1.5GB", 1500000000ULL);
    expect_size("0.5MiB", 524288);
    expect_size("12345", 12345);
    expect_size("64B", 64);
    expect_size(" 5MB ", 5000000);
    expect_bad_size("");
    expect_bad_size("GB");
    expect_bad_size("-5GB");
    expect_bad_size("0GB");
    expect_bad_size("10XB");
    expect_bad_size("10 G B");
    expect_bad_size("99999999999TB");
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1);
    CHECK(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    return b;
}

static int exists(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void touch(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    fclose(f);
}

/* Names of tensors in shard `file`, comma-joined in file order. */
static void shard_names(const char *dir, const char *file, char *out, size_t cap)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK(strcmp(accel_safetensors_metadata(st, "format"), "pt") == 0);
    out[0] = '\0';
    for (size_t i = 0; i < accel_safetensors_count(st); i++) {
        if (i) {
            strncat(out, ",", cap - strlen(out) - 1);
        }
        strncat(out, accel_safetensors_name(st, i), cap - strlen(out) - 1);
    }
    accel_safetensors_close(st);
}

static void test_sharding(void)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/shards/out", g_dir); /* created by the save */
    float a[10], b[10], c[25], d[10], e[2];
    for (int i = 0; i < 25; i++) {
        c[i] = (float)i;
        if (i < 10) {
            a[i] = b[i] = d[i] = (float)-i;
        }
        if (i < 2) {
            e[i] = 0.5f;
        }
    }
    /* Given order a b c d e; a and d are F32 [10] (40 B), c is 100 B (> limit), e is 8 B. */
    accel_named_tensor ts[] = {
        {"a", accel_tensor_view(a, ACCEL_F32, 1, (int64_t[]){10})},
        {"b", accel_tensor_view(b, ACCEL_F32, 1, (int64_t[]){10})},
        {"c", accel_tensor_view(c, ACCEL_F32, 2, (int64_t[]){5, 5})},
        {"d", accel_tensor_view(d, ACCEL_F32, 1, (int64_t[]){10})},
        {"e", accel_tensor_view(e, ACCEL_F32, 1, (int64_t[]){2})},
    };
    accel_kv meta[] = {{"format", "pt"}};
    CHECK_OK(NULL, accel_save_sharded(dir, NULL, ts, 1, meta, 1, 0)); /* single file first */
    CHECK(exists(dir, "model.safetensors"));
    touch(dir, "model-00007-of-00009.safetensors"); /* stale shard of some older save */
    touch(dir, "other-00001-of-00002.safetensors"); /* another prefix: not ours to delete */

    CHECK_OK(NULL, accel_save_sharded(dir, NULL, ts, 5, meta, 1, 64));
    /* The hub's order: [a] closes when b would overflow; c is its own shard at once; [b]
     * closes when d would overflow; [d, e] at the end. */
    char names[64];
    shard_names(dir, "model-00001-of-00004.safetensors", names, sizeof names);
    CHECK_MSG(strcmp(names, "a") == 0, "%s", names);
    shard_names(dir, "model-00002-of-00004.safetensors", names, sizeof names);
    CHECK_MSG(strcmp(names, "c") == 0, "%s", names);
    shard_names(dir, "model-00003-of-00004.safetensors", names, sizeof names);
    CHECK_MSG(strcmp(names, "b") == 0, "%s", names);
    shard_names(dir, "model-00004-of-00004.safetensors", names, sizeof names);
    CHECK_MSG(strcmp(names, "d,e") == 0, "%s", names);
    CHECK(!exists(dir, "model.safetensors"));                /* would shadow the shards */
    CHECK(!exists(dir, "model-00007-of-00009.safetensors")); /* stale */
    CHECK(exists(dir, "other-00001-of-00002.safetensors"));

    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *idx = slurp(p);
    const char *want = "{\n"
                       "  \"metadata\": {\n"
                       "    \"total_size\": 228\n"
                       "  },\n"
                       "  \"weight_map\": {\n"
                       "    \"a\": \"model-00001-of-00004.safetensors\",\n"
                       "    \"b\": \"model-00003-of-00004.safetensors\",\n"
                       "    \"c\": \"model-00002-of-00004.safetensors\",\n"
                       "    \"d\": \"model-00004-of-00004.safetensors\",\n"
                       "    \"e\": \"model-00004-of-00004.safetensors\"\n"
                       "  }\n"
                       "}\n";
    CHECK_MSG(idx && strcmp(idx, want) == 0, "index:\n%s", idx ? idx : "(missing)");
    free(idx);

    /* Fewer shards next time: the extra ones go. Unsharded again: the index goes too. */
    CHECK_OK(NULL, accel_save_sharded(dir, NULL, ts, 5, meta, 1, 150));
    CHECK(exists(dir, "model-00001-of-00002.safetensors"));
    CHECK(exists(dir, "model-00002-of-00002.safetensors"));
    CHECK(!exists(dir, "model-00001-of-00004.safetensors"));
    CHECK(!exists(dir, "model-00004-of-00004.safetensors"));
    CHECK_OK(NULL, accel_save_sharded(dir, NULL, ts, 5, meta, 1, 0));
    CHECK(exists(dir, "model.safetensors"));
    CHECK(!exists(dir, "model.safetensors.index.json"));
    CHECK(!exists(dir, "model-00001-of-00002.safetensors"));
    accel_safetensors *st;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK(accel_safetensors_count(st) == 5);
    accel_tensor t;
    CHECK_OK(NULL, accel_safetensors_get(st, "c", &t));
    CHECK(t.ndim == 2 && ((float *)t.data)[24] == 24.0f);
    accel_safetensors_close(st);

    CHECK(accel_save_sharded(dir, "a/b", ts, 5, NULL, 0, 0) == ACCEL_EINVAL);
}

static void test_accel_save(void)
{
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    unsetenv("ACCELERATE_CONFIG_FILE");
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int64_t v[3] = {1, 2, 3};
    accel_named_tensor t = {"v", accel_tensor_view(v, ACCEL_I64, 1, (int64_t[]){3})};
    char p[400];
    snprintf(p, sizeof p, "%s/saved.safetensors", g_dir);
    CHECK_OK(acc, accel_save(acc, &t, 1, NULL, 0, p));
    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK(accel_safetensors_count(st) == 1);
    accel_safetensors_close(st);
    snprintf(p, sizeof p, "%s/missing/dir/x.safetensors", g_dir);
    CHECK(accel_save(acc, &t, 1, NULL, 0, p) != ACCEL_OK);
    CHECK(strstr(accel_last_error(acc), "missing/dir") != NULL);
    accel_free(acc);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_test_ckpt_save_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    test_parse_size();
    test_sharding();
    test_accel_save();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    printf("test_ckpt_save: ok\n");
    return 0;
}
