/*
 * The fused verified load (issue 11 item 4; docs/checkpoint.md "Fast verified loads"): a load
 * into a live state with nothing to lose (no optimizer step, no load since accel_init) checks
 * the .safetensors checksums while copying.
 *  - it loads bit-exactly what was saved (save after load == the saved files), for files of
 *    one and of several 16 MiB checksum blocks;
 *  - a byte flipped in a tensor file (first, middle, last block) is ACCEL_ECORRUPT naming the
 *    file and saying the state is partly loaded; then accel_optimizer_step and
 *    accel_save_state refuse with ACCEL_ESTATE and that message, until a valid checkpoint
 *    loads, after which both work and the state is the valid checkpoint's;
 *  - a damaged non-tensor file (scheduler, generators) is refused before anything is written:
 *    nothing modified, nothing marked;
 *  - after an optimizer step the load is the two-pass one: a damaged tensor file modifies
 *    nothing and marks nothing;
 *  - gradients saved inside an accumulation window are checked before anything is written.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

typedef struct fixture {
    accel *acc;
    accel_model *m;
    accel_optimizer *opt;
    accel_scheduler *sch;
} fixture;

/* A model "w" of rows x 16 floats and "b" of 16, AdamW, a linear schedule; prepared; with
 * `accum` gradient accumulation steps (0: none). */
static void fx_init_accum(fixture *f, int64_t rows, int accum)
{
    memset(f, 0, sizeof(*f));
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = accum;
    CHECK_OK(NULL, accel_init(&f->acc, &o));
    CHECK_OK(f->acc, accel_model_new(f->acc, &f->m));
    CHECK_OK(f->acc, accel_model_add_param(f->m, "w", 2, (int64_t[]){rows, 16}, NULL));
    CHECK_OK(f->acc, accel_model_add_param(f->m, "b", 1, (int64_t[]){16}, NULL));
    CHECK((f->opt = accel_adamw(f->acc, f->m, NULL)) != NULL);
    CHECK((f->sch = accel_linear_schedule(f->acc, f->opt, 2, 100)) != NULL);
    CHECK_OK(f->acc, accel_prepare(f->acc, f->m, f->opt, f->sch));
}

static void fx_init(fixture *f, int64_t rows)
{
    fx_init_accum(f, rows, 0);
}

static void fx_set(fixture *f, float v)
{
    float *w = accel_model_master(f->m);
    for (size_t i = 0; i < accel_model_numel(f->m); i++) {
        w[i] = v + (float)(i % 1000) * 1e-3f;
    }
}

static int fx_holds(fixture *f, float v)
{
    const float *w = accel_model_master(f->m);
    for (size_t i = 0; i < accel_model_numel(f->m); i++) {
        if (w[i] != v + (float)(i % 1000) * 1e-3f) {
            return 0;
        }
    }
    return 1;
}

static void sh(const char *cmd)
{
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
}

static void flip_byte(const char *dir, const char *name, long at)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_RDWR);
    CHECK_MSG(fd >= 0, "%s", p);
    struct stat sb;
    CHECK(fstat(fd, &sb) == 0 && sb.st_size > 0);
    off_t off = at >= 0 ? at : sb.st_size + at; /* negative: from the end */
    unsigned char c;
    CHECK(pread(fd, &c, 1, off) == 1);
    c ^= 0x10;
    CHECK(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

/* The files a and b hold the same bytes. */
static int same_file(const char *a, const char *b)
{
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

static void expect_same_tensors(const char *a, const char *b)
{
    static const char *names[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[700], pb[700];
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        CHECK_MSG(same_file(pa, pb), "%s and %s differ", pa, pb);
    }
}

/* Saves a checkpoint of weights v after one optimizer step (non-zero moments), from a
 * fixture of its own. */
static void save_reference(const char *dir, int64_t rows, float v)
{
    fixture f;
    fx_init(&f, rows);
    CHECK_OK(f.acc, accel_optimizer_step(f.opt));
    CHECK_OK(f.acc, accel_scheduler_step(f.sch));
    fx_set(&f, v);
    CHECK_OK(f.acc, accel_save_state(f.acc, dir));
    accel_free(f.acc);
}

/* A fresh fixture loads `dir`, refused: ECORRUPT naming `file`, marked partly loaded. */
static void expect_partial(const char *dir, const char *good, const char *file, int64_t rows,
                           const char *root)
{
    fixture f;
    fx_init(&f, rows);
    fx_set(&f, 9.0f);
    accel_status st = accel_load_state(f.acc, dir);
    const char *msg = accel_last_error(f.acc);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(msg, file) != NULL && strstr(msg, "damaged") &&
                  strstr(msg, "partly loaded") != NULL,
              "damaged %s: %s: %s", file, accel_status_name(st), msg);
    /* Training and saving refuse, naming the folder. */
    st = accel_optimizer_step(f.opt);
    msg = accel_last_error(f.acc);
    CHECK_MSG(st == ACCEL_ESTATE && strstr(msg, "accel_optimizer_step: refused") != NULL &&
                  strstr(msg, dir) != NULL,
              "optimizer_step after a partial load: %s: %s", accel_status_name(st), msg);
    char after[400];
    snprintf(after, sizeof after, "%s/after_partial", root);
    st = accel_save_state(f.acc, after);
    msg = accel_last_error(f.acc);
    CHECK_MSG(st == ACCEL_ESTATE && strstr(msg, "partly loaded") != NULL,
              "save_state after a partial load: %s: %s", accel_status_name(st), msg);
    CHECK(access(after, F_OK) != 0);
    /* A valid checkpoint clears it: the state is that checkpoint's, and training goes on. */
    CHECK_OK(f.acc, accel_load_state(f.acc, good));
    CHECK(fx_holds(&f, 5.0f));
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf %s", after);
    sh(cmd);
    CHECK_OK(f.acc, accel_save_state(f.acc, after));
    expect_same_tensors(good, after);
    CHECK_OK(f.acc, accel_optimizer_step(f.opt));
    sh(cmd);
    accel_free(f.acc);
}

/* A fresh fixture refuses `dir` before writing anything: nothing modified, nothing marked. */
static void expect_untouched(const char *dir, const char *needle, int64_t rows, int step_first)
{
    fixture f;
    fx_init(&f, rows);
    if (step_first) {
        CHECK_OK(f.acc, accel_optimizer_step(f.opt)); /* something to lose: two passes */
    }
    fx_set(&f, 9.0f);
    accel_status st = accel_load_state(f.acc, dir);
    const char *msg = accel_last_error(f.acc);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(msg, needle) != NULL &&
                  strstr(msg, "partly loaded") == NULL,
              "damaged %s: %s: %s", needle, accel_status_name(st), msg);
    CHECK_MSG(fx_holds(&f, 9.0f), "a load refused before writing modified the weights (%s)",
              needle);
    CHECK_OK(f.acc, accel_optimizer_step(f.opt)); /* not marked */
    accel_free(f.acc);
}

static void test_rows(const char *root, int64_t rows)
{
    char good[400], bad[400], again[400], cmd[1300];
    snprintf(good, sizeof good, "%s/good_%lld", root, (long long)rows);
    snprintf(bad, sizeof bad, "%s/bad_%lld", root, (long long)rows);
    snprintf(again, sizeof again, "%s/again_%lld", root, (long long)rows);
    save_reference(good, rows, 5.0f);

    /* A fresh load is the fused one and loads bit-exactly. */
    fixture f;
    fx_init(&f, rows);
    CHECK_OK(f.acc, accel_load_state(f.acc, good));
    CHECK(fx_holds(&f, 5.0f));
    CHECK_OK(f.acc, accel_save_state(f.acc, again));
    expect_same_tensors(good, again);
    accel_free(f.acc);

    /* A flipped byte in either tensor file: in the middle of its tensor data and in its last
     * byte, found while copying; in its header, found before anything is written (the parser
     * fails, the checksum names the damage). */
    static const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) {
            snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", bad, good, bad);
            sh(cmd);
            char p[700];
            snprintf(p, sizeof p, "%s/%s", bad, files[i]);
            FILE *fp = fopen(p, "rb");
            unsigned char len8[8];
            CHECK(fp != NULL && fread(len8, 1, 8, fp) == 8 && fseek(fp, 0, SEEK_END) == 0);
            long size = ftell(fp), data = 8;
            fclose(fp);
            for (int b = 0; b < 8; b++) {
                data += (long)len8[b] << (8 * b);
            }
            CHECK(data < size);
            if (k == 2) {
                flip_byte(bad, files[i], 8 + 2); /* the header's JSON */
                expect_untouched(bad, "damaged", rows, 0);
                continue;
            }
            flip_byte(bad, files[i], k == 0 ? data + (size - data) / 2 : -1);
            expect_partial(bad, good, files[i], rows, root);
        }
    }
    /* Files that are not tensors are checked before anything is written. */
    static const char *others[] = {"scheduler.json", "random_states_0.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", bad, good, bad);
        sh(cmd);
        flip_byte(bad, others[i], 12);
        expect_untouched(bad, others[i], rows, 0);
    }
    /* With something to lose, a damaged tensor file modifies nothing either. */
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", bad, good, bad);
    sh(cmd);
    flip_byte(bad, "model.safetensors", -1);
    expect_untouched(bad, "model.safetensors", rows, 1);
}

/* Gradients saved inside an accumulation window (gradients_rank0.safetensors) are never
 * fused: a later load saved outside a window would leave them as a refused load wrote them.
 * Damaged, they are refused before anything is written. */
static void test_gradients(const char *root)
{
    char good[400], cmd[900];
    snprintf(good, sizeof good, "%s/grads", root);
    fixture f;
    fx_init_accum(&f, 16, 2);
    CHECK_OK(f.acc, accel_accumulate(f.acc, f.m)); /* the first of two micro-steps */
    float *g = accel_model_grad(f.m);
    for (size_t i = 0; i < accel_model_numel(f.m); i++) {
        g[i] = 3.0f;
    }
    fx_set(&f, 5.0f);
    CHECK_OK(f.acc, accel_save_state(f.acc, good));
    accel_free(f.acc);
    snprintf(cmd, sizeof cmd, "test -f %s/gradients_rank0.safetensors", good);
    sh(cmd);
    flip_byte(good, "gradients_rank0.safetensors", -1);

    fx_init_accum(&f, 16, 2);
    fx_set(&f, 9.0f);
    accel_status st = accel_load_state(f.acc, good);
    const char *msg = accel_last_error(f.acc);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(msg, "gradients_rank0.safetensors") != NULL &&
                  strstr(msg, "partly loaded") == NULL,
              "damaged gradients: %s: %s", accel_status_name(st), msg);
    CHECK(fx_holds(&f, 9.0f));
    g = accel_model_grad(f.m);
    for (size_t i = 0; g != NULL && i < accel_model_numel(f.m); i++) {
        CHECK_MSG(g[i] == 0.0f, "gradient %zu written by a refused load", i);
    }
    accel_free(f.acc);
}

int main(void)
{
    char root[] = "/tmp/accel_test_ckpt_fused_XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_rows(root, 16);     /* every file one checksum block */
    test_rows(root, 300000); /* 19.2 MB of weights: two blocks, moments three */
    test_gradients(root);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    sh(cmd);
    printf("test_ckpt_fused: ok\n");
    return 0;
}
