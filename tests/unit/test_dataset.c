/*
 * Built-in datasets: TensorDataset rows, the token-file dataset on llm.c files (uint16 and
 * uint32) and headerless files generated here, corrupt token files (odd size, lying header,
 * unknown magic), the bytes dataset over a file and a folder, and a token file truncated while
 * a loader reads it.
 */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/data.h"
#include "check.h"

static char dir[] = "/tmp/accel_test_dataset_XXXXXX";

static void write_file(const char *path, const void *a, size_t na, const void *b, size_t nb)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(a, 1, na, f) == na);
    if (nb > 0) {
        CHECK(fwrite(b, 1, nb, f) == nb);
    }
    fclose(f);
}

static void check_windows(accel_dataset *ds, int64_t ntok, int64_t T, int64_t (*tok)(int64_t))
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    accel_loader_options o = accel_loader_options_default();
    o.batch_size = 2;
    accel_loader *l;
    CHECK_OK(acc, accel_loader_new(acc, ds, &o, &l));
    int64_t windows = (ntok - 1 - T) / T + 1;
    CHECK(accel_loader_len(l) == (windows + 1) / 2);
    accel_batch *b;
    int64_t w = 0;
    while (accel_loader_next(l, &b) == ACCEL_OK) {
        const accel_tensor *in = accel_batch_field(b, "input");
        const accel_tensor *tg = accel_batch_field(b, "target");
        CHECK(in && tg && in->dtype == ACCEL_I32 && in->ndim == 2 && in->shape[1] == T);
        for (int64_t r = 0; r < b->rows; r++, w++) {
            for (int64_t t = 0; t < T; t++) {
                CHECK(((int32_t *)in->data)[r * T + t] == tok(w * T + t));
                CHECK(((int32_t *)tg->data)[r * T + t] == tok(w * T + t + 1));
            }
        }
    }
    CHECK(w == windows);
    accel_loader_free(l);
    accel_free(acc);
}

static int64_t tok16(int64_t i)
{
    return (i * 7919) % 50257;
}

static int64_t tok32(int64_t i)
{
    return (i * 104729) % 128256 + 70000;
}

/*
 * A token file truncated by another process while a loader reads it (with 0 and 2 workers,
 * converting and zero copy), and under a zero-copy view taken without a loader: ACCEL_EIO naming
 * the file and both sizes. Before, the loader read windows out of its mapping and the process
 * died of SIGBUS.
 */
static void truncated_file(void)
{
    enum { T = 64, NTOK = 64 * 1024 + 1 };
    static uint16_t tok[NTOK];
    for (int i = 0; i < NTOK; i++) {
        tok[i] = (uint16_t)tok16(i);
    }
    int32_t hdr[256] = {20240520, 1, NTOK};
    const size_t full = sizeof(hdr) + sizeof(tok), kept = sizeof(hdr) + 4096;
    char path[600], want[1024];
    snprintf(path, sizeof(path), "%s/shrinks.bin", dir);
    snprintf(want, sizeof(want), "token file \"%s\" is %zu bytes now, %zu when it was opened", path,
             kept, full);
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    for (int workers = 0; workers <= 2; workers += 2) {
        for (int zero_copy = 0; zero_copy < 2; zero_copy++) {
            write_file(path, hdr, sizeof(hdr), tok, sizeof(tok));
            accel_token_dataset_options o = accel_token_dataset_options_default();
            o.path = path;
            o.context = T;
            o.out_dtype = zero_copy ? ACCEL_U16 : ACCEL_I32;
            accel_dataset *ds;
            CHECK_OK(NULL, accel_token_dataset_open(&ds, &o));
            accel_loader_options lo = accel_loader_options_default();
            lo.batch_size = 4;
            lo.num_workers = workers;
            accel_loader *l;
            CHECK_OK(acc, accel_loader_new(acc, ds, &lo, &l));
            accel_batch *b;
            CHECK_OK(acc, accel_loader_next(l, &b));
            CHECK(truncate(path, (off_t)kept) == 0);
            /* Batches built before the truncation (workers prefetch) still come, then EIO. */
            accel_status st;
            int64_t n = 1;
            while ((st = accel_loader_next(l, &b)) == ACCEL_OK) {
                n++;
            }
            CHECK_MSG(st == ACCEL_EIO && strstr(accel_last_error(acc), want) != NULL,
                      "workers %d, zero copy %d, after %lld batches: %s \"%s\"", workers, zero_copy,
                      (long long)n, accel_status_name(st), accel_last_error(acc));
            accel_loader_free(l);
            if (zero_copy && workers == 2) {
                /* A zero-copy view for a caller without a loader: fstat first. */
                accel_sample bare;
                memset(&bare, 0, sizeof(bare));
                CHECK(ds->get(ds->ctx, 1000, &bare) == ACCEL_EIO);
                CHECK_MSG(strstr(accel_last_error(NULL), want) != NULL, "%s",
                          accel_last_error(NULL));
            }
            accel_dataset_free(ds);
        }
    }
    accel_free(acc);
    unlink(path);
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    char path[1024];
    enum { N = 1001, T = 16 };
    uint16_t t16[N];
    uint32_t t32[N];
    for (int i = 0; i < N; i++) {
        t16[i] = (uint16_t)tok16(i);
        t32[i] = (uint32_t)tok32(i);
    }
    int32_t hdr[256] = {20240520, 1, N};

    /* llm.c GPT-2 file (auto-detected). */
    snprintf(path, sizeof(path), "%s/gpt2.bin", dir);
    write_file(path, hdr, sizeof(hdr), t16, sizeof(t16));
    accel_token_dataset_options o = accel_token_dataset_options_default();
    o.path = path;
    o.context = T;
    accel_dataset *ds;
    CHECK_OK(NULL, accel_token_dataset_open(&ds, &o));
    CHECK(accel_token_dataset_num_tokens(ds) == N);
    check_windows(ds, N, T, tok16);
    /* zero-copy u16 windows and a stride */
    accel_dataset_free(ds);
    o.out_dtype = ACCEL_U16;
    o.stride = 5;
    CHECK_OK(NULL, accel_token_dataset_open(&ds, &o));
    CHECK(ds->len(ds->ctx) == (N - 1 - T) / 5 + 1);
    accel_dataset_free(ds);
    o.out_dtype = ACCEL_I32;
    o.stride = 0;

    /* llm.c Llama-3 file: uint32 tokens. */
    int32_t hdr3[256] = {20240801, 7, N};
    snprintf(path, sizeof(path), "%s/llama3.bin", dir);
    write_file(path, hdr3, sizeof(hdr3), t32, sizeof(t32));
    CHECK_OK(NULL, accel_token_dataset_open(&ds, &o));
    check_windows(ds, N, T, tok32);
    accel_dataset_free(ds);

    /* Headerless uint16. */
    snprintf(path, sizeof(path), "%s/raw.bin", dir);
    write_file(path, t16, sizeof(t16), NULL, 0);
    o.header = ACCEL_TOKENS_RAW;
    CHECK_OK(NULL, accel_token_dataset_open(&ds, &o));
    check_windows(ds, N, T, tok16);
    accel_dataset_free(ds);

    /* Corrupt: odd size for uint16 tokens. */
    snprintf(path, sizeof(path), "%s/odd.bin", dir);
    write_file(path, t16, sizeof(t16) - 1, NULL, 0);
    CHECK(accel_token_dataset_open(&ds, &o) == ACCEL_ECORRUPT);
    CHECK(strstr(accel_last_error(NULL), "odd.bin") != NULL);
    /* Corrupt: the header lies about the token count. */
    hdr[2] = N + 5;
    snprintf(path, sizeof(path), "%s/lies.bin", dir);
    write_file(path, hdr, sizeof(hdr), t16, sizeof(t16));
    o.header = ACCEL_TOKENS_AUTO;
    CHECK(accel_token_dataset_open(&ds, &o) == ACCEL_ECORRUPT);
    CHECK_MSG(strstr(accel_last_error(NULL), "lies.bin") != NULL &&
                  strstr(accel_last_error(NULL), "header") != NULL,
              "%s", accel_last_error(NULL));
    /* Truncated payload (odd byte after the header). */
    hdr[2] = N;
    snprintf(path, sizeof(path), "%s/trunc.bin", dir);
    write_file(path, hdr, sizeof(hdr), t16, sizeof(t16) - 1);
    CHECK(accel_token_dataset_open(&ds, &o) == ACCEL_ECORRUPT);
    /* Unknown magic when the llm.c layout is demanded. */
    hdr[0] = 12345;
    snprintf(path, sizeof(path), "%s/magic.bin", dir);
    write_file(path, hdr, sizeof(hdr), t16, sizeof(t16));
    o.header = ACCEL_TOKENS_LLMC;
    CHECK(accel_token_dataset_open(&ds, &o) == ACCEL_ECORRUPT);
    CHECK(strstr(accel_last_error(NULL), "magic.bin") != NULL);
    /* Auto mode: llm.c's magic with a bad version, or a header cut short, is an llm.c file
     * with an error, never raw tokens (issue 11, item 7). */
    o.header = ACCEL_TOKENS_AUTO;
    char want[1200];
    int32_t badv[256] = {20240520, 3, N};
    snprintf(path, sizeof(path), "%s/badversion.bin", dir);
    write_file(path, badv, sizeof(badv), t16, sizeof(t16));
    snprintf(want, sizeof want,
             "token file \"%s\": llm.c magic 20240520 with version 3 (expected 1)", path);
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_ECORRUPT, want);
    snprintf(path, sizeof(path), "%s/shortheader.bin", dir);
    write_file(path, hdr3, 100, NULL, 0);
    snprintf(want, sizeof want,
             "token file \"%s\": llm.c header truncated (100 bytes; the header is 1024)", path);
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_ECORRUPT, want);
    /* An empty file, or one too short for a single window: an error, not 0 windows. */
    snprintf(path, sizeof(path), "%s/empty.bin", dir);
    write_file(path, t16, 0, NULL, 0);
    snprintf(want, sizeof want,
             "token file \"%s\" holds 0 tokens, too few for one window of context 16 (17 "
             "needed)",
             path);
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_EINVAL, want);
    snprintf(path, sizeof(path), "%s/short.bin", dir);
    write_file(path, t16, 16 * sizeof(uint16_t), NULL, 0);
    snprintf(want, sizeof want,
             "token file \"%s\" holds 16 tokens, too few for one window of context 16 (17 "
             "needed)",
             path);
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_EINVAL, want);
    /* The largest context: "context + 1 tokens needed" overflowed (UBSan) before the refusal. */
    o.context = INT64_MAX;
    snprintf(want, sizeof want,
             "token file \"%s\" holds 16 tokens, too few for one window of context "
             "9223372036854775807 (9223372036854775808 needed)",
             path);
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_EINVAL, want);
    snprintf(want, sizeof want,
             "bytes dataset \"%s\" holds 32 tokens, too few for one window of context "
             "9223372036854775807 (9223372036854775808 needed)",
             path);
    CHECK_ERR(NULL, accel_bytes_dataset_open(&ds, path, INT64_MAX, 0, ACCEL_U8), ACCEL_EINVAL,
              want);
    o.context = 16;
    /* A header layout outside the enum was read as raw tokens. */
    o.header = (accel_token_header)7;
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_EINVAL,
              "accel_token_dataset_open: header 7 is not ACCEL_TOKENS_AUTO, _LLMC or _RAW");
    o.header = ACCEL_TOKENS_AUTO;
    /* A FIFO is refused at once (it used to block), naming what it is. */
    snprintf(path, sizeof(path), "%s/pipe.bin", dir);
    CHECK(mkfifo(path, 0600) == 0);
    alarm(20);
    snprintf(want, sizeof want, "\"%s\" is a FIFO, not a data file", path);
    CHECK_ERR(NULL, accel_token_dataset_open(&ds, &o), ACCEL_EINVAL, want);
    alarm(0);
    /* A sample not given by a loader has no scratch: EINVAL saying so, not ENOMEM. */
    snprintf(path, sizeof(path), "%s/gpt2.bin", dir);
    o.out_dtype = ACCEL_I64; /* converts into scratch */
    CHECK_OK(NULL, accel_token_dataset_open(&ds, &o));
    accel_sample bare;
    memset(&bare, 0, sizeof bare);
    CHECK_ERR(NULL, ds->get(ds->ctx, 0, &bare), ACCEL_EINVAL,
              "accel_sample_scratch: the sample has no scratch memory (it was not given by a "
              "loader)");
    accel_dataset_free(ds);
    o.out_dtype = ACCEL_I32;

    /* Missing file, bad options. */
    o.path = "/nonexistent/x.bin";
    CHECK(accel_token_dataset_open(&ds, &o) == ACCEL_EIO);
    o.context = 0;
    CHECK(accel_token_dataset_open(&ds, &o) == ACCEL_EINVAL);

    /* TensorDataset. */
    float xs[6] = {0, 1, 2, 3, 4, 5};
    int64_t ys[3] = {10, 11, 12};
    int64_t sx[2] = {3, 2}, sy[1] = {3};
    accel_tensor ts[2] = {accel_tensor_view(xs, ACCEL_F32, 2, sx),
                          accel_tensor_view(ys, ACCEL_I64, 1, sy)};
    const char *names[2] = {"x", "y"};
    CHECK_OK(NULL, accel_tensor_dataset_new(&ds, 2, names, ts));
    CHECK(ds->len(ds->ctx) == 3);
    accel_sample smp = {0};
    CHECK_OK(NULL, ds->get(ds->ctx, 2, &smp));
    CHECK(smp.n_fields == 2 && ((float *)smp.field[0].data)[1] == 5.0f && smp.field[0].ndim == 1 &&
          smp.field[0].shape[0] == 2);
    CHECK(*(int64_t *)smp.field[1].data == 12 && smp.field[1].ndim == 0);
    accel_dataset_free(ds);
    sy[0] = 4;
    ts[1] = accel_tensor_view(ys, ACCEL_I64, 1, sy);
    CHECK(accel_tensor_dataset_new(&ds, 2, names, ts) == ACCEL_EINVAL);
    /* Fault sweep: rows of NULL data were pointers 8, 16, ... (a crash in collate), and a
     * negative row count made a dataset that no loader could take. */
    sy[0] = 3;
    ts[1] = accel_tensor_view(NULL, ACCEL_I64, 1, sy);
    CHECK_ERR(NULL, accel_tensor_dataset_new(&ds, 2, names, ts), ACCEL_EINVAL,
              "accel_tensor_dataset_new: tensor 1 (\"y\") has NULL data");
    sx[0] = sy[0] = -3;
    ts[0] = accel_tensor_view(xs, ACCEL_F32, 2, sx);
    ts[1] = accel_tensor_view(ys, ACCEL_I64, 1, sy);
    CHECK_ERR(NULL, accel_tensor_dataset_new(&ds, 2, names, ts), ACCEL_EINVAL,
              "accel_tensor_dataset_new: tensor 0 (\"x\") has dimension 0 = -3");
    sx[0] = sy[0] = 0; /* an empty dataset, NULL data included, is a dataset */
    ts[0] = accel_tensor_view(NULL, ACCEL_F32, 2, sx);
    ts[1] = accel_tensor_view(NULL, ACCEL_I64, 1, sy);
    CHECK_OK(NULL, accel_tensor_dataset_new(&ds, 2, names, ts));
    accel_dataset_free(ds);

    /* Bytes dataset: a folder of two files, concatenated in name order. */
    char sub[600];
    snprintf(sub, sizeof(sub), "%s/corpus", dir);
    CHECK(mkdir(sub, 0700) == 0);
    snprintf(path, sizeof(path), "%s/b.txt", sub);
    write_file(path, "world", 5, NULL, 0);
    snprintf(path, sizeof(path), "%s/a.txt", sub);
    write_file(path, "hello ", 6, NULL, 0);
    CHECK_OK(NULL, accel_bytes_dataset_open(&ds, sub, 4, 1, ACCEL_U8));
    CHECK(ds->len(ds->ctx) == 11 - 4);
    CHECK_OK(NULL, ds->get(ds->ctx, 6, &smp));
    CHECK(memcmp(smp.field[0].data, "worl", 4) == 0 && memcmp(smp.field[1].data, "orld", 4) == 0);
    accel_dataset_free(ds);
    CHECK_OK(NULL, accel_bytes_dataset_open(&ds, path, 2, 0, ACCEL_U8));
    CHECK(ds->len(ds->ctx) == 2); /* "hello " : windows at 0 and 2 */
    accel_dataset_free(ds);

    /* Clean up. */
    const char *files[] = {"gpt2.bin", "llama3.bin", "raw.bin",  "odd.bin",
                           "lies.bin", "trunc.bin",  "magic.bin"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/a.txt", sub);
    unlink(path);
    snprintf(path, sizeof(path), "%s/b.txt", sub);
    unlink(path);
    rmdir(sub);
    truncated_file();
    rmdir(dir);
    printf("test_dataset: ok\n");
    return 0;
}
