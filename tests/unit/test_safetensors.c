/*
 * safetensors writer/reader: byte-exact layout of the reference writer, round trip of every
 * dtype (scalars, zero-sized tensors, metadata), and a corpus of malformed files each rejected
 * with ACCEL_ECORRUPT and a message naming the file and the field or tensor.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char g_dir[256];

static char *tpath(const char *name)
{
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* The reference layout: sorted by alignment then name, "__metadata__" first, compact, padded. */
static void test_exact_layout(void)
{
    float b[2] = {1.5f, -2.0f};
    int8_t a[3] = {1, -2, 3};
    double c = 3.25;
    accel_named_tensor ts[] = {
        {"b", accel_tensor_view(b, ACCEL_F32, 1, (int64_t[]){2})},
        {"a", accel_tensor_view(a, ACCEL_I8, 1, (int64_t[]){3})},
        {"c", accel_tensor_view(&c, ACCEL_F64, 0, NULL)},
    };
    accel_kv meta[] = {{"format", "pt"}};
    const char *p = tpath("layout.safetensors");
    CHECK_OK(NULL, accel_safetensors_write(p, ts, 3, meta, 1));
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"c\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                       "\"a\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[16,19]}}";
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8, n;
    unsigned char *f = (unsigned char *)check_read_file(p, &n);
    CHECK(n == 8 + padded + 19);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) {
        hl = hl << 8 | f[i];
    }
    CHECK(hl == padded);
    CHECK_MSG(memcmp(f + 8, json, jl) == 0, "header %.*s", (int)jl, f + 8);
    for (size_t i = jl; i < padded; i++) {
        CHECK(f[8 + i] == ' ');
    }
    CHECK(memcmp(f + 8 + padded, &c, 8) == 0);
    CHECK(memcmp(f + 8 + padded + 8, b, 8) == 0);
    CHECK(memcmp(f + 8 + padded + 16, a, 3) == 0);
    free(f);

    /* An empty set: "{}" padded to 8. */
    p = tpath("empty.safetensors");
    CHECK_OK(NULL, accel_safetensors_write(p, NULL, 0, NULL, 0));
    f = (unsigned char *)check_read_file(p, &n);
    CHECK(n == 16 && f[0] == 8 && memcmp(f + 8, "{}      ", 8) == 0);
    free(f);
    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK(accel_safetensors_count(st) == 0 && accel_safetensors_metadata_count(st) == 0);
    accel_safetensors_close(st);
}

/* Every dtype, a scalar, a zero-sized tensor; values come back bit-exact. */
static void test_round_trip(void)
{
    enum { N = ACCEL_DTYPE_COUNT };
    accel_named_tensor ts[N + 2];
    unsigned char *bufs[N + 2];
    char names[N + 2][32];
    for (int d = 0; d < N; d++) {
        int64_t shape[2] = {4, d + 1}; /* 4 rows: 6-bit elements fill whole bytes */
        ts[d].tensor = accel_tensor_view(NULL, (accel_dtype)d, 2, shape);
        size_t nb = accel_tensor_nbytes(&ts[d].tensor);
        CHECK(nb * 8 == 4 * (size_t)(d + 1) * accel_dtype_bits((accel_dtype)d));
        bufs[d] = malloc(nb);
        for (size_t i = 0; i < nb; i++) {
            bufs[d][i] = (unsigned char)(i * 31 + (size_t)d * 7 + 1);
        }
        if (d == ACCEL_BOOL) {
            for (size_t i = 0; i < nb; i++) {
                bufs[d][i] &= 1;
            }
        }
        snprintf(names[d], sizeof names[d], "t.%s", accel_dtype_name((accel_dtype)d));
        ts[d].name = names[d];
        ts[d].tensor = accel_tensor_view(bufs[d], (accel_dtype)d, 2, shape);
    }
    int64_t scalar = -1234567890123LL;
    bufs[N] = NULL;
    bufs[N + 1] = NULL;
    ts[N].name = "scalar";
    ts[N].tensor = accel_tensor_view(&scalar, ACCEL_I64, 0, NULL);
    ts[N + 1].name = "empty";
    ts[N + 1].tensor = accel_tensor_view(NULL, ACCEL_F32, 3, (int64_t[]){4, 0, 2});
    accel_kv meta[] = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\""}};
    const char *p = tpath("all.safetensors");
    CHECK_OK(NULL, accel_safetensors_write(p, ts, N + 2, meta, 2));

    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK(accel_safetensors_count(st) == N + 2);
    CHECK(strcmp(accel_safetensors_metadata(st, "format"), "pt") == 0);
    CHECK(strcmp(accel_safetensors_metadata(st, "note"), "h\xc3\xa9llo \"quoted\"") == 0);
    CHECK(accel_safetensors_metadata(st, "nope") == NULL);
    CHECK(accel_safetensors_metadata_count(st) == 2);
    for (int i = 0; i < N + 2; i++) {
        accel_tensor t;
        CHECK_OK(NULL, accel_safetensors_get(st, ts[i].name, &t));
        CHECK(t.dtype == ts[i].tensor.dtype && t.ndim == ts[i].tensor.ndim);
        for (int k = 0; k < t.ndim; k++) {
            CHECK(t.shape[k] == ts[i].tensor.shape[k]);
        }
        CHECK(t.data != NULL);
        size_t align = accel_dtype_nbytes(t.dtype);
        CHECK((uintptr_t)t.data % (align ? align : 1) == 0);
        size_t nb = accel_tensor_nbytes(&t);
        CHECK(nb == accel_tensor_nbytes(&ts[i].tensor));
        CHECK(nb == 0 || memcmp(t.data, ts[i].tensor.data, nb) == 0);
    }
    /* File order is by offset: F64/I64 first, BOOL last. */
    CHECK(strcmp(accel_safetensors_name(st, accel_safetensors_count(st) - 1), "t.BOOL") == 0);
    accel_tensor t;
    CHECK(accel_safetensors_get(st, "missing", &t) == ACCEL_ENOTFOUND);
    CHECK(strstr(accel_last_error(NULL), "missing") != NULL);
    /* NULL was ENOTFOUND "(null): no tensor named '(null)'" (fault sweep). */
    CHECK_ERR(NULL, accel_safetensors_get(NULL, "t.F32", &t), ACCEL_EINVAL,
              "accel_safetensors_get: NULL file");
    CHECK_ERR(NULL, accel_safetensors_get(st, NULL, &t), ACCEL_EINVAL,
              "accel_safetensors_get: NULL name");
    /* Views are copy-on-write: writing one must not change the file. */
    CHECK_OK(NULL, accel_safetensors_get(st, "t.F32", &t));
    ((float *)t.data)[0] = 42.0f;
    accel_safetensors_close(st);
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK_OK(NULL, accel_safetensors_get(st, "t.F32", &t));
    CHECK(memcmp(t.data, bufs[ACCEL_F32], 4) == 0);
    accel_safetensors_close(st);
    for (int d = 0; d < N + 2; d++) {
        free(bufs[d]);
    }
}

static void test_write_errors(void)
{
    float x = 1;
    accel_named_tensor dup[] = {{"a", accel_tensor_view(&x, ACCEL_F32, 0, NULL)},
                                {"a", accel_tensor_view(&x, ACCEL_F32, 0, NULL)}};
    const char *p = tpath("bad_write.safetensors");
    CHECK(accel_safetensors_write(p, dup, 2, NULL, 0) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "'a'") != NULL);
    dup[1].name = "__metadata__";
    CHECK(accel_safetensors_write(p, dup, 2, NULL, 0) == ACCEL_EINVAL);
    dup[1].name = "b";
    dup[1].tensor.shape[0] = -1;
    dup[1].tensor.ndim = 1;
    CHECK(accel_safetensors_write(p, dup, 2, NULL, 0) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "'b'") != NULL);
    dup[1].tensor.ndim = 0;
    accel_kv badmeta[] = {{"k", "\xff\xfe"}};
    CHECK(accel_safetensors_write(p, dup, 2, badmeta, 1) == ACCEL_EINVAL);
    CHECK(access(p, F_OK) != 0); /* nothing half-written left behind */
    CHECK(accel_safetensors_write(tpath("no/such/dir/x.safetensors"), dup, 1, NULL, 0) != ACCEL_OK);
}

/* ---- malformed corpus ---- */

/* Writes [hlen (or override)][json][data_nbytes zero bytes][extra]. */
static const char *raw(const char *name, const char *json, size_t data_nbytes,
                       int64_t hlen_override, size_t truncate_to)
{
    const char *p = tpath(name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    size_t jl = strlen(json);
    uint64_t hl = hlen_override >= 0 ? (uint64_t)hlen_override : jl;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) {
        len[i] = (unsigned char)(hl >> (8 * i));
    }
    size_t total = 8 + jl + data_nbytes;
    unsigned char *buf = calloc(1, total);
    memcpy(buf, len, 8);
    memcpy(buf + 8, json, jl);
    if (truncate_to > 0 && truncate_to < total) {
        total = truncate_to;
    }
    CHECK(fwrite(buf, 1, total, f) == total);
    free(buf);
    fclose(f);
    return p;
}

static void expect_bad(const char *path, accel_status want, const char *needle)
{
    accel_safetensors *st = (accel_safetensors *)0x1;
    accel_status got = accel_safetensors_open(&st, path);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(got == want, "%s: got %s (%s)", path, accel_status_name(got), msg);
    CHECK(st == (accel_safetensors *)0x1); /* *out untouched on failure */
    CHECK_MSG(strstr(msg, path) != NULL, "message \"%s\" does not name the file", msg);
    CHECK_MSG(strstr(msg, needle) != NULL, "message \"%s\" lacks \"%s\"", msg, needle);
}

#define T(name, dt, shape, b, e)                                                                   \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_corpus(void)
{
    const char *ok = "{" T("w", "F32", "[2]", 0, 8) "}";
    /* sanity: the generator makes valid files */
    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, raw("ok.st", ok, 8, -1, 0)));
    accel_safetensors_close(st);

    expect_bad(raw("trunc_len.st", ok, 8, -1, 5), ACCEL_ECORRUPT, "truncated");
    expect_bad(raw("trunc_data.st", ok, 8, -1, 8 + strlen(ok) + 3), ACCEL_ECORRUPT, "past the end");
    expect_bad(raw("huge_len.st", ok, 8, 200000000, 0), ACCEL_ECORRUPT, "limit");
    expect_bad(raw("len_past_eof.st", ok, 8, 100000, 0), ACCEL_ECORRUPT, "header length");
    expect_bad(raw("overlap.st", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}",
                   12, -1, 0),
               ACCEL_ECORRUPT, "'b'");
    expect_bad(raw("overlap2.st",
                   "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12, -1, 0),
               ACCEL_ECORRUPT, "overlaps");
    expect_bad(raw("hole.st", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 12, 20) "}",
                   20, -1, 0),
               ACCEL_ECORRUPT, "hole");
    expect_bad(raw("not_at_zero.st", "{" T("a", "F32", "[2]", 8, 16) "}", 16, -1, 0),
               ACCEL_ECORRUPT, "hole");
    expect_bad(raw("wrong_size.st", "{" T("w", "F32", "[3]", 0, 8) "}", 8, -1, 0), ACCEL_ECORRUPT,
               "data_offsets");
    expect_bad(
        raw("overflow.st", "{" T("w", "F32", "[4611686018427387904,16]", 0, 8) "}", 8, -1, 0),
        ACCEL_ECORRUPT, "overflow");
    expect_bad(raw("bad_json.st", "{\"w\": {\"dtype\": ", 0, -1, 0), ACCEL_ECORRUPT,
               "not valid JSON");
    expect_bad(raw("non_object.st", "[1, 2, 3]", 0, -1, 0), ACCEL_ECORRUPT, "not a JSON object");
    expect_bad(
        raw("dup.st", "{" T("w", "F32", "[1]", 0, 4) "," T("w", "F32", "[1]", 4, 8) "}", 8, -1, 0),
        ACCEL_ECORRUPT, "duplicate");
    expect_bad(raw("unknown_dtype.st", "{" T("w", "F17", "[2]", 0, 8) "}", 8, -1, 0),
               ACCEL_ECORRUPT, "F17");
    expect_bad(raw("f4_half_byte.st", "{" T("w", "F4", "[3]", 0, 1) "}", 1, -1, 0), ACCEL_ECORRUPT,
               "whole bytes");
    expect_bad(raw("trailing.st", ok, 9, -1, 0), ACCEL_ECORRUPT, "trailing");
    expect_bad(raw("meta_nonstring.st",
                   "{\"__metadata__\":{\"epoch\":3}," T("w", "F32", "[2]", 0, 8) "}", 8, -1, 0),
               ACCEL_ECORRUPT, "__metadata__");
    expect_bad(raw("meta_nonobject.st", "{\"__metadata__\":[1]}", 0, -1, 0), ACCEL_ECORRUPT,
               "__metadata__");
    expect_bad(raw("bad_utf8.st",
                   "{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, -1,
                   0),
               ACCEL_ECORRUPT, "UTF-8");
    expect_bad(raw("neg_shape.st", "{" T("w", "F32", "[-2]", 0, 8) "}", 8, -1, 0), ACCEL_ECORRUPT,
               "shape");
    expect_bad(raw("float_shape.st", "{" T("w", "F32", "[2.0]", 0, 8) "}", 8, -1, 0),
               ACCEL_ECORRUPT, "shape");
    expect_bad(raw("no_dtype.st", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1, 0),
               ACCEL_ECORRUPT, "dtype");
    expect_bad(raw("three_offsets.st",
                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8, -1, 0),
               ACCEL_ECORRUPT, "data_offsets");
    expect_bad(raw("end_before_begin.st", "{" T("w", "F32", "[0]", 8, 0) "}", 8, -1, 0),
               ACCEL_ECORRUPT, "data_offsets");
    expect_bad(raw("entry_not_object.st", "{\"w\": 3}", 0, -1, 0), ACCEL_ECORRUPT, "'w'");
    expect_bad(raw("empty_file.st", "", 0, -1, 1), ACCEL_ECORRUPT, "truncated");
    expect_bad(tpath("does_not_exist.st"), ACCEL_ENOTFOUND, "does_not_exist");

    /* Accepted as the reference accepts them: offsets listed out of order, an unaligned header
     * (N not a multiple of 8; views are then copied to aligned memory), unknown keys. */
    CHECK_OK(NULL, accel_safetensors_open(
                       &st, raw("any_order.st",
                                "{" T("b", "F32", "[1]", 4, 8) "," T("a", "I8", "[4]", 0, 4) "}", 8,
                                -1, 0)));
    CHECK(strcmp(accel_safetensors_name(st, 0), "a") == 0);
    accel_tensor t;
    CHECK_OK(NULL, accel_safetensors_get(st, "b", &t));
    CHECK((uintptr_t)t.data % 4 == 0 && ((float *)t.data)[0] == 0.0f);
    accel_safetensors_close(st);

    /* A file with a U64 and a U32 tensor (token ids, an index) next to an F32 one: every tensor
     * reads (the whole file used to be refused). */
    unsigned char data[24] = {0};
    const uint64_t big = 0xfedcba9876543210ull;
    const uint32_t ids[2] = {7, 4000000000u};
    const float w = 1.5f;
    memcpy(data, &big, 8);
    memcpy(data + 8, ids, 8);
    memcpy(data + 16, &w, 4);
    const char *hdr = "{" T("index", "U64", "[1]", 0, 8) "," T("ids", "U32", "[2]", 8, 16) "," T(
        "w", "F32", "[1]", 16, 20) "," T("pad", "U8", "[4]", 20, 24) "}";
    const char *p = raw("uints.st", hdr, 0, -1, 0);
    FILE *f = fopen(p, "ab");
    CHECK(f != NULL && fwrite(data, 1, sizeof data, f) == sizeof data);
    fclose(f);
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    CHECK_OK(NULL, accel_safetensors_get(st, "index", &t));
    CHECK(t.dtype == ACCEL_U64 && ((uint64_t *)t.data)[0] == big);
    CHECK_OK(NULL, accel_safetensors_get(st, "ids", &t));
    CHECK(t.dtype == ACCEL_U32 && ((uint32_t *)t.data)[1] == 4000000000u);
    CHECK_OK(NULL, accel_safetensors_get(st, "w", &t));
    CHECK(t.dtype == ACCEL_F32 && ((float *)t.data)[0] == 1.5f);
    accel_safetensors_close(st);
}

/* A FIFO or a folder given as a safetensors file is refused at once, saying what it is (a FIFO
 * used to block the open forever: the alarm fails the test instead of hanging it). */
static void test_not_files(void)
{
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", g_dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    alarm(20);
    expect_bad(fifo, ACCEL_EINVAL, "is a FIFO, not a safetensors file");
    expect_bad(g_dir, ACCEL_EINVAL, "is a directory, not a safetensors file");
    alarm(0);
    unlink(fifo);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_test_st_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    test_exact_layout();
    test_round_trip();
    test_write_errors();
    test_corpus();
    test_not_files();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    printf("test_safetensors: ok\n");
    return 0;
}
