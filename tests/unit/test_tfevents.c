/*
 * TensorBoard event files: CRC32C and protobuf encoder against known vectors, then a run
 * written by the tensorboard tracker read back with our strict decoder (values, steps, tags,
 * text, hparams records), and a flipped byte detected as corruption.
 */
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "track/track_internal.h"

static void test_crc(void)
{
    CHECK(accel__crc32c("123456789", 9) == 0xE3069283u); /* the CRC-32C check value */
    CHECK(accel__crc32c("", 0) == 0);
    uint32_t c = accel__crc32c("123456789", 9);
    CHECK(accel__crc32c_masked("123456789", 9) == (((c >> 15) | (c << 17)) + 0xa282ead8u));
    /* 32 zero bytes: the iSCSI (RFC 3720) test vector. */
    unsigned char z[32] = {0};
    CHECK(accel__crc32c(z, 32) == 0x8A9136AAu);
}

static void test_pb(void)
{
    accel__pb b = {0};
    accel__pb_varint(&b, 1, 150); /* the protobuf documentation's example: 08 96 01 */
    CHECK(b.len == 3 && b.data[0] == 0x08 && b.data[1] == 0x96 && b.data[2] == 0x01);
    accel__pb_reset(&b);
    accel__pb_varint(&b, 2, (uint64_t)-1LL); /* negative int64: ten bytes */
    CHECK(b.len == 11 && b.data[0] == 0x10 && b.data[10] == 0x01);
    accel__pb_reset(&b);
    accel__pb_string(&b, 2, "testing"); /* 12 07 74 65 73 74 69 6e 67 */
    CHECK(b.len == 9 && b.data[0] == 0x12 && b.data[1] == 7 &&
          memcmp(b.data + 2, "testing", 7) == 0);
    accel__pb_reset(&b);
    accel__pb_double(&b, 1, 1.5);
    accel__pb_float(&b, 2, -2.25f);
    accel__pb_varint(&b, 300, 300);
    accel__pb inner = {0};
    accel__pb_string(&inner, 1, "x");
    accel__pb_message(&b, 5, &inner);
    CHECK(!b.failed);

    const uint8_t *p = b.data, *end = b.data + b.len;
    accel__pb_field f;
    CHECK(accel__pb_next(&p, end, &f) == 1 && f.field == 1 && f.wire == ACCEL__PB_I64);
    CHECK(accel__pb_as_double(&f) == 1.5);
    CHECK(accel__pb_next(&p, end, &f) == 1 && f.field == 2 && accel__pb_as_float(&f) == -2.25f);
    CHECK(accel__pb_next(&p, end, &f) == 1 && f.field == 300 && f.u == 300);
    CHECK(accel__pb_next(&p, end, &f) == 1 && f.field == 5 && f.nbytes == inner.len);
    CHECK(memcmp(f.data, inner.data, inner.len) == 0);
    CHECK(accel__pb_next(&p, end, &f) == 0);
    /* Truncated input is malformed, never read past the end. */
    p = b.data;
    CHECK(accel__pb_next(&p, b.data + 5, &f) == -1);
    p = b.data + b.len - 2;        /* inside the nested message's length-prefixed bytes */
    uint8_t bad[2] = {0x2a, 0x05}; /* field 5 LEN claiming 5 bytes, none present */
    p = bad;
    CHECK(accel__pb_next(&p, bad + 2, &f) == -1);
    accel__pb_free(&inner);
    accel__pb_free(&b);
}

typedef struct seen {
    int version;
    int n_events; /* values and session starts, in file order */
    int n_starts;
    long long start_step; /* of the last SessionLog START */
    int start_at;         /* n_events when it came */
    int n_scalar, n_text, n_hparams;
    long long steps[16];
    float loss[16];
    int n_loss;
    int nan_seen;
    char text[64];
    long long text_step;
} seen;

static int visit(void *ctx, const char *file_version, const accel__tf_value *v)
{
    seen *s = ctx;
    if (file_version != NULL) {
        CHECK(strcmp(file_version, "brain.Event:2") == 0);
        CHECK(s->n_scalar == 0); /* the version record comes first */
        s->version++;
        return 0;
    }
    CHECK(v->wall_time > 1.5e9);
    s->n_events++;
    if (v->session_start) {
        s->n_starts++;
        s->start_step = v->step;
        s->start_at = s->n_events;
    } else if (strcmp(v->tag, "train/loss") == 0) {
        CHECK(v->has_simple && v->plugin[0] == '\0');
        CHECK(s->n_loss < 16);
        s->steps[s->n_loss] = v->step;
        s->loss[s->n_loss++] = v->simple_value;
        s->n_scalar++;
    } else if (strcmp(v->tag, "lr") == 0) {
        CHECK(v->has_simple);
        s->n_scalar++;
    } else if (strcmp(v->tag, "bad") == 0) {
        CHECK(v->has_simple && isnan(v->simple_value));
        s->nan_seen++;
    } else if (strcmp(v->tag, "note") == 0) {
        CHECK(strcmp(v->plugin, "text") == 0 && v->text != NULL);
        snprintf(s->text, sizeof(s->text), "%s", v->text);
        s->text_step = v->step;
        s->n_text++;
    } else if (strncmp(v->tag, "_hparams_/", 10) == 0) {
        CHECK(strcmp(v->plugin, "hparams") == 0);
        s->n_hparams++;
    } else {
        CHECK_MSG(0, "unexpected tag %s", v->tag);
    }
    return 0;
}

static void find_event_file(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    struct dirent *e;
    out[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            CHECK(out[0] == '\0'); /* exactly one */
            snprintf(out, cap, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    CHECK(out[0] != '\0');
}

static void test_tracker_roundtrip(void)
{
    char tmpl[] = "/tmp/accel_tfevents_XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    accel_options o = accel_options_default();
    o.project_dir = tmpl;
    o.log_with = "tensorboard";
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4), ACCEL_TEXT("model", "gpt2 'tiny'")};
    CHECK_OK(acc, accel_init_trackers(acc, "run1", cfg, 2));
    accel_tracker *t = accel_get_tracker(acc, "tensorboard");
    CHECK(t != NULL && strcmp(accel_tracker_name(t), "tensorboard") == 0);
    char run_dir[512];
    snprintf(run_dir, sizeof(run_dir), "%s", accel_tracker_run_dir(t));
    char expect[512];
    snprintf(expect, sizeof(expect), "%s/run1", tmpl);
    CHECK(strcmp(run_dir, expect) == 0);
    for (int s = 0; s < 5; s++) {
        accel_value v[] = {ACCEL_SCALAR("train/loss", 2.0 - 0.25 * s), ACCEL_SCALAR("lr", 1e-3)};
        CHECK_OK(acc, accel_log(acc, v, 2, 10 * s));
    }
    accel_value tv[] = {ACCEL_TEXT("note", "hello \"board\"\n")};
    CHECK_OK(acc, accel_log(acc, tv, 1, 7));
    accel_value nv[] = {ACCEL_SCALAR("bad", NAN)};
    CHECK_OK(acc, accel_log(acc, nv, 1, 8)); /* a warning, still written */
    CHECK_OK(acc, accel_end_training(acc));
    CHECK(accel_get_tracker(acc, "tensorboard") == NULL); /* finished */

    char path[1024];
    find_event_file(run_dir, path, sizeof(path));
    seen s;
    memset(&s, 0, sizeof(s));
    CHECK_OK(NULL, accel__tfevents_read(path, visit, &s));
    CHECK(s.version == 1);
    CHECK(s.n_loss == 5);
    for (int i = 0; i < 5; i++) {
        CHECK(s.steps[i] == 10 * i);
        CHECK(s.loss[i] == (float)(2.0 - 0.25 * i));
    }
    CHECK(s.n_scalar == 10);
    CHECK(s.n_text == 1 && strcmp(s.text, "hello \"board\"\n") == 0 && s.text_step == 7);
    CHECK(s.nan_seen == 1);
    CHECK(s.n_hparams == 3); /* experiment, session start, session end */
    /* The session's START comes first, at step 0, ahead of the hparams summaries (TensorBoard
     * takes the first START of a run as its start, later ones as restarts). */
    CHECK(s.n_starts == 1 && s.start_step == 0 && s.start_at == 1);

    /* hparams.yml for people who grep. */
    char yml[1024];
    snprintf(yml, sizeof(yml), "%s/hparams.yml", run_dir);
    FILE *f = fopen(yml, "r");
    CHECK(f != NULL);
    char buf[256];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    CHECK(strstr(buf, "\"lr\": 0.0003") != NULL);
    CHECK(strstr(buf, "\"model\": \"gpt2 'tiny'\"") != NULL);

    /* Flip one byte in the middle: the CRC catches it. */
    f = fopen(path, "r+b");
    CHECK(f != NULL);
    CHECK(fseek(f, 60, SEEK_SET) == 0);
    int c = fgetc(f);
    CHECK(fseek(f, 60, SEEK_SET) == 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    memset(&s, 0, sizeof(s));
    accel_status st = accel__tfevents_read(path, visit, &s);
    CHECK(st == ACCEL_ECORRUPT);
    CHECK(strstr(accel_last_error(NULL), "CRC") != NULL);
    accel_free(acc);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
}

/* A resumed run's event file opens with a START at the resumed step (TensorBoard then drops
 * what the earlier files hold at steps >= it), with the hparams summaries behind it. */
static void test_resume_start(void)
{
    char tmpl[] = "/tmp/accel_tfevents_XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    accel_options o = accel_options_default();
    o.project_dir = tmpl;
    o.log_with = "tensorboard";
    accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4)};
    char run_dir[512], path[1024];
    snprintf(run_dir, sizeof(run_dir), "%s/run", tmpl);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* set the first run's file aside: the second one is checked */
            char cmd[2048];
            snprintf(cmd, sizeof(cmd), "mkdir %s/old && mv %s/events.* %s/old/", run_dir, run_dir,
                     run_dir);
            CHECK(system(cmd) == 0);
        }
        accel *acc;
        CHECK_OK(NULL, accel_init(&acc, &o));
        CHECK_OK(acc, accel_init_trackers(acc, "run", cfg, 1));
        if (pass == 1) {
            CHECK_OK(acc, accel_trackers_resume(acc, 6));
        }
        for (int step = pass ? 6 : 0; step < (pass ? 12 : 9); step++) {
            accel_value v[] = {ACCEL_SCALAR("train/loss", step)};
            CHECK_OK(acc, accel_log(acc, v, 1, step));
        }
        accel_free(acc);
    }
    find_event_file(run_dir, path, sizeof(path));
    seen s;
    memset(&s, 0, sizeof(s));
    CHECK_OK(NULL, accel__tfevents_read(path, visit, &s));
    CHECK(s.n_starts == 1 && s.start_step == 6 && s.start_at == 1);
    CHECK(s.n_hparams == 3 && s.n_loss == 6 && s.steps[0] == 6);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    test_crc();
    test_pb();
    test_tracker_roundtrip();
    test_resume_start();
    printf("test_tfevents: ok\n");
    return 0;
}
