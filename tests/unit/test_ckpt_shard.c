/*
 * The shard files of a sharded object (src/ckpt/state_shard.c), written as two processes would
 * write them and committed as a checkpoint folder: the good folder opens and every tensor's
 * pieces come back in element order in the index's (put) order; a folder whose pieces overlap,
 * leave a hole, hold a tensor the index does not list, or whose index has another format or
 * version is ACCEL_ECORRUPT naming the file and the tensor or field.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/atomic.h"
#include "ckpt/state.h"

static float data[16];
static char g_dir[256];

enum { GOOD, OVERLAP, HOLE, UNLISTED, FORMAT, VERSION };

/* Piece [off, off + n) of a tensor of shape `shape` (ndim 1 or 2). */
static void put(accel__state_writer *w, const char *name, int ndim, int64_t d0, int64_t d1,
                int64_t off, int64_t n)
{
    accel__state_piece whole = {ndim, {d0, d1}, off};
    CHECK_OK(NULL,
             accel__state_put_piece(
                 w, name, accel_tensor_view(data + off, ACCEL_F32, 1, (int64_t[]){n}), &whole));
}

/* Folder `dir`: tensors a [2, 5] and b [3]; process 0 owns a[0:4], process 1 a[4:10], b. */
static void build(const char *dir, int variant)
{
    accel__stage s;
    CHECK_OK(NULL, accel__stage_init(&s, dir));
    CHECK_OK(NULL, accel__stage_lock(&s)); /* as a save does: it also makes the parents */
    CHECK_OK(NULL, accel__stage_create(&s));
    accel__state_writer w0, w1;
    accel__state_writer_init(&w0, "model.safetensors", ACCEL__STORE_TENSORS, ACCEL__STATE_SHARED);
    accel__state_writer_init(&w1, "model.safetensors", ACCEL__STORE_TENSORS, ACCEL__STATE_SHARED);
    put(&w0, "a", 2, 2, 5, 0, 4);
    put(&w0, "b", 1, 3, 0, 0, 0);
    put(&w1, "a", 2, 2, 5,
        variant == OVERLAP ? 3
        : variant == HOLE  ? 5
                           : 4,
        variant == OVERLAP ? 7
        : variant == HOLE  ? 5
                           : 6);
    put(&w1, "b", 1, 3, 0, 0, 3);
    if (variant == UNLISTED) {
        put(&w1, "c", 1, 2, 0, 0, 2);
    }
    CHECK_OK(NULL, accel__state_put_i64(&w0, "answer", 42));
    CHECK_OK(NULL, accel__state_shard_write(&w0, s.stage_dir, "model", 0, 2));
    CHECK_OK(NULL, accel__state_shard_write(&w1, s.stage_dir, "model", 1, 2));
    CHECK_OK(NULL, accel__state_shard_write_index(&w0, s.stage_dir, "model", "accel_model", 2));
    if (variant == FORMAT || variant == VERSION) {
        char path[400];
        snprintf(path, sizeof path, "%s/model.index.json", s.stage_dir);
        char *text = NULL;
        CHECK_OK(NULL, accel__read_file(path, &text, NULL));
        char *at = strstr(text, variant == FORMAT ? "accel-sharded" : "\"version\": 1");
        CHECK(at != NULL);
        at[variant == FORMAT ? 0 : 11] = variant == FORMAT ? 'x' : '7';
        CHECK_OK(NULL, accel__write_file_atomic(path, text, strlen(text)));
        accel__free(text);
    }
    CHECK_OK(NULL, accel__stage_commit(&s, NULL));
    accel__stage_release(&s);
    accel__state_writer_release(&w0);
    accel__state_writer_release(&w1);
}

typedef struct seen {
    char text[256];
} seen;

static accel_status record(void *ctx, int64_t offset, const void *d, int64_t count)
{
    seen *s = ctx;
    size_t len = strlen(s->text);
    snprintf(s->text + len, sizeof s->text - len, "[%lld+%lld:%g]", (long long)offset,
             (long long)count, (double)*(const float *)d);
    return ACCEL_OK;
}

/* Opens dir's sharded "model": status, and the message when it fails. */
static accel_status open_dir(const char *dir, accel__state_file *f)
{
    accel__ckpt_marker marker;
    CHECK_OK(NULL, accel__ckpt_verify(dir, 0, 1, &marker));
    memset(f, 0, sizeof(*f));
    accel_status st = accel__state_shard_open(f, dir, "model", "accel_model", &marker);
    accel__ckpt_marker_release(&marker);
    return st;
}

static void expect_corrupt(int variant, const char *text)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/v%d", g_dir, variant);
    build(dir, variant);
    accel__state_file f;
    accel_status st = open_dir(dir, &f);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(msg, text) != NULL, "variant %d: %s: %s", variant,
              accel_status_name(st), msg);
    accel__state_file_close(&f);
}

int main(void)
{
    for (int i = 0; i < 16; i++) {
        data[i] = (float)(100 + i);
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_test_ckpt_shard_%d", (int)getpid());
    char dir[300];
    snprintf(dir, sizeof dir, "%s/good", g_dir);
    build(dir, GOOD);
    accel__state_file f;
    CHECK_OK(NULL, open_dir(dir, &f));
    CHECK(accel__state_shard_n_tensors(f.sh) == 2);
    accel_named_tensor a = accel__state_shard_desc(f.sh, 0), b = accel__state_shard_desc(f.sh, 1);
    CHECK(strcmp(a.name, "a") == 0 && a.tensor.ndim == 2 && a.tensor.shape[1] == 5);
    CHECK(strcmp(b.name, "b") == 0 && b.tensor.ndim == 1 && b.tensor.shape[0] == 3);
    seen s = {""};
    CHECK_OK(NULL, accel__state_shard_pieces(f.sh, 0, record, &s));
    CHECK_OK(NULL, accel__state_shard_pieces(f.sh, 1, record, &s));
    CHECK_MSG(strcmp(s.text, "[0+4:100][4+6:104][0+3:100]") == 0, "%s", s.text);
    CHECK(json_integer_value(json_object_get(f.root, "answer")) == 42); /* the values */
    accel__state_file_close(&f);

    expect_corrupt(OVERLAP, "do not hold tensor a exactly: element 3 of 10 is in two shards");
    expect_corrupt(HOLE, "do not hold tensor a exactly: element 4 of 10 is in none");
    expect_corrupt(UNLISTED, "model.shard-1-of-2.safetensors is malformed: tensor c is not a "
                             "piece of a tensor of the index");
    expect_corrupt(FORMAT, "model.index.json is malformed: \"format\" is not \"accel-sharded\"");
    expect_corrupt(VERSION, "model.index.json is malformed: \"version\" is not 1");
    accel__rmtree(g_dir);
    printf("shard files: open, pieces in order, 5 kinds of damage named\n");
    return 0;
}
