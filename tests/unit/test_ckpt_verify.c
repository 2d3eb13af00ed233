/*
 * Checkpoint verification (issue 11, items 4 and 5) on one process:
 *  - a flipped byte in any file of a save_state folder is ACCEL_ECORRUPT naming the file, and
 *    nothing of the state is modified (compared file by file through save_state); a flipped
 *    byte in the marker is detected too; in files of several 16 MiB checksum blocks, a byte
 *    flipped in the last block is found, and nothing is modified either;
 *  - bad markers are refused with a message naming what is wrong (format "x", version 99, an
 *    empty or missing file list, iteration -5, a bad checksum, a path as file name, ...);
 *  - a marker of version 1 (no checksums, as written before them) still loads;
 *  - state JSON fields are range-checked (a negative or infinite learning rate, a loader past
 *    the end of its epoch, a random_states file of another process, a counter past 2^53);
 *  - load_state(NULL) with automatic naming skips a damaged newest checkpoint with a warning
 *    naming the folder, file and reason, loads the previous one, and the next save does not
 *    collide with the damaged folder; when every folder is damaged the result is ACCEL_ECORRUPT
 *    listing them, never ACCEL_ENOTFOUND.
 */
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "accel/data.h"
#include "ckpt/verify.h"
#include "check.h"

#define N_SAMPLES 20

static float xs[N_SAMPLES * 4];

typedef struct fixture {
    accel *acc;
    accel_model *m;
    accel_optimizer *opt;
    accel_scheduler *sch;
    accel_dataset *ds;
    accel_loader *dl;
    int64_t value; /* the registered object */
} fixture;

static accel_status val_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, &((fixture *)ctx)->value, sizeof(int64_t));
}

static accel_status val_load(void *ctx, const void *data, size_t n)
{
    if (n != sizeof(int64_t)) {
        return ACCEL_ECORRUPT;
    }
    memcpy(&((fixture *)ctx)->value, data, n);
    return ACCEL_OK;
}

/* The fixture with a "w" of rows x 16 floats (16 rows: every file is one checksum block). */
static void fx_init_rows(fixture *f, const char *project, int64_t rows)
{
    memset(f, 0, sizeof(*f));
    accel_options o = accel_options_default();
    o.project_dir = project;
    o.automatic_checkpoint_naming = project != NULL;
    CHECK_OK(NULL, accel_init(&f->acc, &o));
    CHECK_OK(f->acc, accel_model_new(f->acc, &f->m));
    CHECK_OK(f->acc, accel_model_add_param(f->m, "w", 2, (int64_t[]){rows, 16}, NULL));
    CHECK_OK(f->acc, accel_model_add_param(f->m, "b", 1, (int64_t[]){16}, NULL));
    CHECK((f->opt = accel_adamw(f->acc, f->m, NULL)) != NULL);
    CHECK((f->sch = accel_linear_schedule(f->acc, f->opt, 2, 100)) != NULL);
    const char *names[1] = {"x"};
    accel_tensor t = accel_tensor_view(xs, ACCEL_F32, 2, (int64_t[]){N_SAMPLES, 4});
    CHECK_OK(f->acc, accel_tensor_dataset_new(&f->ds, 1, names, &t));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 4; /* 5 batches an epoch */
    CHECK_OK(f->acc, accel_loader_new(f->acc, f->ds, &lo, &f->dl));
    CHECK_OK(f->acc, accel_prepare(f->acc, f->m, f->opt, f->sch, f->dl));
    CHECK_OK(f->acc, accel_register_for_checkpointing(f->acc, val_save, val_load, f));
}

static void fx_init(fixture *f, const char *project)
{
    fx_init_rows(f, project, 16);
}

static void fx_free(fixture *f)
{
    accel_free(f->acc);
    accel_dataset_free(f->ds);
}

/* Weights, scheduler, loader position and registered value all derived from v. */
static void fx_set(fixture *f, int64_t v)
{
    f->value = v;
    float *w = accel_model_master(f->m);
    for (size_t i = 0; i < accel_model_numel(f->m); i++) {
        w[i] = (float)v + (float)i * 1e-3f;
    }
    CHECK_OK(f->acc, accel_scheduler_step(f->sch));
    accel_batch *b;
    if (accel_loader_next(f->dl, &b) == ACCEL_EOF) {
        CHECK_OK(f->acc, accel_loader_next(f->dl, &b)); /* the next epoch */
    }
}

static int fx_holds(fixture *f, int64_t v)
{
    const float *w = accel_model_master(f->m);
    for (size_t i = 0; i < accel_model_numel(f->m); i++) {
        if (w[i] != (float)v + (float)i * 1e-3f) {
            return 0;
        }
    }
    return f->value == v;
}

static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
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
    off_t off = at >= 0 ? at : sb.st_size / 2;
    unsigned char c;
    CHECK(pread(fd, &c, 1, off) == 1);
    c ^= 0x01;
    CHECK(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

static json_t *marker_load(const char *dir)
{
    char p[700];
    snprintf(p, sizeof p, "%s/accel_checkpoint.json", dir);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    CHECK_MSG(j != NULL, "%s: %s", p, e.text);
    return j;
}

/* Writes the marker back; a version-2 one with its own checksum recomputed (the XXH3-64 of
 * its text with the 16 digits of marker_xxh3 as '0'), unless `keep_self`. */
static void marker_store_as(const char *dir, json_t *j, int keep_self)
{
    char p[700];
    snprintf(p, sizeof p, "%s/accel_checkpoint.json", dir);
    int self = json_object_get(j, "marker_xxh3") != NULL && !keep_self;
    if (self) {
        json_object_set_new(j, "marker_xxh3", json_string("0000000000000000"));
    }
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    CHECK(text != NULL);
    char *at = strstr(text, "\"marker_xxh3\": \"");
    if (self && at != NULL) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(text, strlen(text)));
        memcpy(at + strlen("\"marker_xxh3\": \""), hex, 16);
    }
    FILE *fp = fopen(p, "wb");
    CHECK(fp != NULL && fputs(text, fp) >= 0);
    fclose(fp);
    free(text);
    json_decref(j);
}

static void marker_store(const char *dir, json_t *j)
{
    marker_store_as(dir, j, 0);
}

/* Rewrites the marker as version 1 (sizes only, from the files as they are now), as a build
 * before checksums wrote it. */
static void make_v1(const char *dir)
{
    json_t *j = marker_load(dir), *files = json_object();
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(j, "files"), name, v)
    {
        char p[700];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, name);
        CHECK(stat(p, &sb) == 0);
        json_object_set_new(files, name, json_integer(sb.st_size));
    }
    json_object_set_new(j, "files", files);
    json_object_set_new(j, "version", json_integer(1));
    json_object_del(j, "checksum");
    json_object_del(j, "marker_xxh3");
    marker_store(dir, j);
}

/* Replaces `text` by `with` in dir/name (same first occurrence; any length). */
static void edit(const char *dir, const char *name, const char *text, const char *with)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *fp = fopen(p, "rb");
    CHECK(fp != NULL);
    static char buf[1 << 16], out[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    char *at = strstr(buf, text);
    CHECK_MSG(at != NULL, "%s has no \"%s\"", p, text);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, with, at + strlen(text));
    fp = fopen(p, "wb");
    CHECK(fp != NULL && fputs(out, fp) >= 0);
    fclose(fp);
}

/* load_state fails with `want`, the message contains `needle`, and nothing was modified. */
static void expect_refused(fixture *f, const char *dir, accel_status want, const char *needle)
{
    fx_set(f, 77);
    accel_status st = accel_load_state(f->acc, dir);
    CHECK_MSG(st == want && strstr(accel_last_error(f->acc), needle) != NULL,
              "expected %s with \"%s\", got %s: %s", accel_status_name(want), needle,
              accel_status_name(st), accel_last_error(f->acc));
    CHECK_MSG(fx_holds(f, 77), "a refused load modified the objects (%s)", needle);
}

/* 1 when files a and b hold the same bytes. */
static int same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa != NULL && fb != NULL;
    static char ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (na == 0) {
            break;
        }
    }
    if (fa) {
        fclose(fa);
    }
    if (fb) {
        fclose(fb);
    }
    return same;
}

/* As expect_refused, and the whole state (every file a save_state writes: weights, optimizer
 * moments, scheduler, loader position, generators, registered object) is byte for byte what
 * it was before the load: saved to root/before and root/after and compared file by file. */
static void expect_refused_whole(fixture *f, const char *dir, const char *needle, const char *root)
{
    char before[400], after[400];
    snprintf(before, sizeof before, "%s/before", root);
    snprintf(after, sizeof after, "%s/after", root);
    sh("rm -rf %s %s", before, after);
    fx_set(f, 77);
    CHECK_OK(f->acc, accel_save_state(f->acc, before));
    accel_status st = accel_load_state(f->acc, dir);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(accel_last_error(f->acc), needle) != NULL,
              "expected ECORRUPT with \"%s\", got %s: %s", needle, accel_status_name(st),
              accel_last_error(f->acc));
    CHECK_OK(f->acc, accel_save_state(f->acc, after));
    json_t *j = marker_load(before);
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(j, "files"), name, v)
    {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/%s", before, name);
        snprintf(b, sizeof b, "%s/%s", after, name);
        CHECK_MSG(same_bytes(a, b), "a refused load (%s) modified the state saved in %s", needle,
                  name);
    }
    json_decref(j);
    CHECK(fx_holds(f, 77));
}

/* Runs load_state(NULL) with stderr captured into `log`. */
static accel_status load_newest_logged(fixture *f, const char *log)
{
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    accel_status st = accel_load_state(f->acc, NULL);
    dup2(saved, 2);
    close(saved);
    return st;
}

static int file_has(const char *path, const char *needle)
{
    static char buf[1 << 16];
    FILE *fp = fopen(path, "rb");
    size_t n = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
    if (fp) {
        fclose(fp);
    }
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void test_flipped_bytes(const char *root)
{
    char dir[300], copy[300];
    snprintf(dir, sizeof dir, "%s/good", root);
    snprintf(copy, sizeof copy, "%s/copy", root);
    fixture f;
    fx_init(&f, NULL);
    fx_set(&f, 5);
    CHECK_OK(f.acc, accel_save_state(f.acc, dir));
    fx_set(&f, 6);
    CHECK_OK(f.acc, accel_load_state(f.acc, dir));
    CHECK(fx_holds(&f, 5));

    /* Every file the marker lists, each flipped in the middle and at its first byte. */
    json_t *j = marker_load(dir);
    CHECK(json_integer_value(json_object_get(j, "version")) == 2);
    CHECK(strcmp(json_string_value(json_object_get(j, "checksum")), "xxh3-64/16MiB") == 0);
    const char *name;
    json_t *v;
    int n = 0;
    json_object_foreach(json_object_get(j, "files"), name, v)
    {
        CHECK(json_is_integer(json_object_get(v, "nbytes")));
        CHECK(strlen(json_string_value(json_object_get(v, "xxh3"))) == 16);
        for (long at = -1; at <= 0; at++) {
            sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
            flip_byte(copy, name, at);
            char needle[200];
            snprintf(needle, sizeof needle, "file %s is damaged: its checksum is", name);
            expect_refused_whole(&f, copy, needle, root);
        }
        n++;
    }
    json_decref(j);
    CHECK(n >= 6); /* model, optimizer, scheduler, custom, random_states, dl_state */
    /* The marker itself: any flipped byte is refused (bad JSON, or a size or checksum that no
     * longer matches its file, or a field out of range). */
    struct stat sb;
    char mp[400];
    snprintf(mp, sizeof mp, "%s/accel_checkpoint.json", dir);
    CHECK(stat(mp, &sb) == 0);
    for (long at = 0; at < sb.st_size; at += 7) {
        sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
        flip_byte(copy, "accel_checkpoint.json", at);
        fx_set(&f, 77);
        accel_status st = accel_load_state(f.acc, copy);
        /* The marker covers itself: counts and iteration are in no other file. */
        CHECK_MSG(st == ACCEL_ECORRUPT, "marker byte %ld flipped: %s: %s", at,
                  accel_status_name(st), accel_last_error(f.acc));
        CHECK(fx_holds(&f, 77));
    }
    fx_free(&f);
}

static void test_bad_markers(const char *root)
{
    char dir[300], copy[300];
    snprintf(dir, sizeof dir, "%s/good", root);
    snprintf(copy, sizeof copy, "%s/copy", root);
    fixture f;
    fx_init(&f, NULL);
    struct {
        const char *key, *value, *needle;
    } cases[] = {
        {"format", "\"x\"", "format is \"x\", expected \"accel-checkpoint\""},
        {"format", NULL, "format is missing"},
        {"version", "99", "version 99 is not one this accel reads (1 to 2)"},
        {"version", "0", "version 0 is not one"},
        {"version", "\"2\"", "version (missing or not an integer)"},
        {"files", "{}", "the file list is empty"},
        {"files", NULL, "the file list is missing"},
        {"files", "[]", "the file list is missing"},
        {"checksum", "\"crc32\"", "checksum algorithm \"crc32\" is not \"xxh3-64/16MiB\""},
        {"checksum", NULL, "checksum algorithm missing"},
        {"accel_state.iteration", "-5", "accel_state.iteration is missing or out of range"},
        {"accel_state.iteration", "1.5", "accel_state.iteration is missing or out of range"},
        {"accel_state.num_processes", "0", "accel_state.num_processes is missing or out of range"},
        {"accel_state.models", "-1", "accel_state.models is missing or out of range"},
        {"accel_state.loaders", "99999999", "accel_state.loaders is missing or out of range"},
        {"accel_state.scaler", "1", "accel_state.scaler is missing or out of range"},
        {"files.model.safetensors.xxh3", "\"12345\"",
         "the checksum of model.safetensors is not 16 hexadecimal digits"},
        {"files.model.safetensors.xxh3", "\"zzzzzzzzzzzzzzzz\"", "is not 16 hexadecimal digits"},
        {"files.model.safetensors.nbytes", "-3",
         "the size of model.safetensors is not a non-negative integer"},
        {"files.model.safetensors", "12", "the entry of model.safetensors is not an object"},
        {"files.../escape", "{\"nbytes\": 1, \"xxh3\": \"0000000000000000\"}",
         "\"../escape\" is not a file name of a checkpoint folder"},
        {"files.accel_checkpoint.json", "{\"nbytes\": 1, \"xxh3\": \"0000000000000000\"}",
         "\"accel_checkpoint.json\" is not a file name"},
        {"files.extra.bin", "{\"nbytes\": 1, \"xxh3\": \"0000000000000000\"}",
         "file extra.bin is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
        json_t *j = marker_load(copy), *obj = j;
        char key[128];
        snprintf(key, sizeof key, "%s", cases[i].key);
        /* "a.b" descends into a (file names contain dots: only the first dot of "files." and
         * the last of an entry's field split). */
        char *leaf = key;
        if (strncmp(key, "accel_state.", 12) == 0 || strncmp(key, "files.", 6) == 0) {
            char *dot = strchr(key, '.');
            *dot = '\0';
            obj = json_object_get(j, key);
            leaf = dot + 1;
            char *last = strrchr(leaf, '.');
            if (strncmp(key, "files", 5) == 0 && last != NULL &&
                (strcmp(last, ".xxh3") == 0 || strcmp(last, ".nbytes") == 0)) {
                *last = '\0';
                obj = json_object_get(obj, leaf);
                leaf = last + 1;
            }
        }
        CHECK_MSG(obj != NULL, "case %zu", i);
        if (cases[i].value == NULL) {
            json_object_del(obj, leaf);
        } else {
            json_error_t e;
            json_t *val = json_loads(cases[i].value, JSON_DECODE_ANY, &e);
            CHECK_MSG(val != NULL, "%s", cases[i].value);
            json_object_set_new(obj, leaf, val);
        }
        marker_store(copy, j);
        expect_refused(&f, copy, ACCEL_ECORRUPT, cases[i].needle);
    }
    /* An edited marker whose own checksum was not updated. */
    sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
    json_t *edited = marker_load(copy);
    json_object_set_new(json_object_get(edited, "accel_state"), "iteration", json_integer(7));
    marker_store_as(copy, edited, 1);
    expect_refused(&f, copy, ACCEL_ECORRUPT, "the marker is damaged: its checksum is");
    /* A file the marker does not list is never read. */
    sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
    json_t *j = marker_load(copy);
    json_object_del(json_object_get(j, "files"), "scheduler.json");
    marker_store(copy, j);
    expect_refused(&f, copy, ACCEL_ECORRUPT, "file scheduler.json is not listed in");
    fx_free(&f);
}

static void test_version1_and_fields(const char *root)
{
    char dir[300], copy[300];
    snprintf(dir, sizeof dir, "%s/good", root);
    snprintf(copy, sizeof copy, "%s/copy", root);
    fixture f;
    fx_init(&f, NULL);
    /* A version-1 marker (no checksums) still loads, the same state. */
    sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
    make_v1(copy);
    fx_set(&f, 9);
    CHECK_OK(f.acc, accel_load_state(f.acc, copy));
    CHECK(fx_holds(&f, 5));
    /* ... its sizes are still checked. */
    sh("truncate -s -1 %s/scheduler.json", copy);
    expect_refused(&f, copy, ACCEL_ECORRUPT, "file scheduler.json has");

    /* Fields of the state files, edited in a version-1 folder (no checksum to stop them). */
    struct {
        const char *file, *text, *with, *needle;
        accel_status st;
    } cases[] = {
        {"scheduler.json", "\"base_lrs\": [\n    ", "\"base_lrs\": [\n    -",
         "scheduler.json is malformed", ACCEL_ECORRUPT},
        {"scheduler.json", "\"_step_count\": ", "\"_step_count\": -", "scheduler.json is malformed",
         ACCEL_ECORRUPT},
        {"dl_state_dict_rank0.json", "\"batches\": 1", "\"batches\": 9",
         "loader 0 is at batch 9 of an epoch of 5 batches", ACCEL_ECORRUPT},
        {"dl_state_dict_rank0.json", "\"epoch\": 0", "\"epoch\": -1",
         "dl_state_dict_rank0.json is malformed", ACCEL_ECORRUPT},
        {"random_states_0.json", "\"process_index\": 0", "\"process_index\": 1",
         "random_states_0.json is malformed", ACCEL_ECORRUPT},
        {"random_states_0.json", "\"step\": 0", "\"step\": -2", "random_states_0.json is malformed",
         ACCEL_ECORRUPT},
        /* Counters past 2^53 (here INT64_MAX or near it): accepted, the next step, epoch or
         * tick overflowed (UBSan's signed overflow; a negative step count in a release build). */
        {"random_states_0.json", "\"step\": 0", "\"step\": 9223372036854775807",
         "step is 9223372036854775807, expected 0 to 9007199254740992", ACCEL_ECORRUPT},
        {"dl_state_dict_rank0.json", "\"epoch\": 0", "\"epoch\": 9223372036854775807",
         "loaders[0].epoch is 9223372036854775807, expected 0 to 9007199254740992", ACCEL_ECORRUPT},
        {"scheduler.json", "\"_step_count\": ", "\"_step_count\": 99999999999999999",
         "scheduler.json is malformed: _step_count is 99999999999999999", ACCEL_ECORRUPT},
        {"scheduler.json", "\"last_epoch\": ", "\"last_epoch\": 99999999999999999",
         "scheduler.json is malformed: last_epoch is 99999999999999999", ACCEL_ECORRUPT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
        edit(copy, cases[i].file, cases[i].text, cases[i].with);
        make_v1(copy);
        expect_refused(&f, copy, cases[i].st, cases[i].needle);
    }
    /* A file consistent in itself (batch 7 of 9) that the live loader (5 batches) cannot
     * resume. */
    sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
    edit(copy, "dl_state_dict_rank0.json", "\"length\": 5", "\"length\": 9");
    edit(copy, "dl_state_dict_rank0.json", "\"batches\": 1", "\"batches\": 7");
    make_v1(copy);
    expect_refused(&f, copy, ACCEL_EINVAL,
                   "loader 0 resumes at batch 7, past the end of the live loader's epoch (5 "
                   "batches)");
    fx_free(&f);
}

static void test_newest_fallback(const char *root)
{
    char project[300], base[340], log[340];
    snprintf(project, sizeof project, "%s/proj", root);
    snprintf(base, sizeof base, "%s/checkpoints", project);
    snprintf(log, sizeof log, "%s/log.txt", root);
    fixture f;
    fx_init(&f, project);
    CHECK(accel_load_state(f.acc, NULL) == ACCEL_ENOTFOUND); /* nothing there yet */
    for (int64_t v = 0; v < 3; v++) {
        fx_set(&f, 100 + v);
        CHECK_OK(f.acc, accel_save_state(f.acc, NULL)); /* checkpoint_0 .. checkpoint_2 */
    }
    fx_free(&f);

    /* The newest damaged: warning naming folder, file and reason; checkpoint_1 loads; the
     * counter is past the damaged folder, so the next save is checkpoint_3. */
    char dir[400];
    snprintf(dir, sizeof dir, "%s/checkpoint_2", base);
    flip_byte(dir, "model.safetensors", -1);
    fx_init(&f, project);
    accel_status st = load_newest_logged(&f, log);
    CHECK_MSG(st == ACCEL_OK, "%s: %s", accel_status_name(st), accel_last_error(f.acc));
    CHECK(strstr(accel_checkpoint_dir(f.acc), "checkpoint_1") != NULL && fx_holds(&f, 101));
    CHECK_MSG(file_has(log, "accel_load_state: skipping damaged checkpoint: checkpoint ") &&
                  file_has(log, "checkpoint_2: file model.safetensors is damaged"),
              "no warning naming the skipped folder and file");
    CHECK(accel_checkpoint_iteration(f.acc) == 3);
    CHECK_OK(f.acc, accel_save_state(f.acc, NULL));
    CHECK(strstr(accel_checkpoint_dir(f.acc), "checkpoint_3") != NULL);
    fx_free(&f);

    /* A missing marker and a truncated file are skipped the same way. */
    snprintf(dir, sizeof dir, "%s/checkpoint_3", base);
    sh("rm %s/accel_checkpoint.json", dir);
    snprintf(dir, sizeof dir, "%s/checkpoint_1", base);
    sh("truncate -s -1 %s/optimizer.safetensors", dir);
    fx_init(&f, project);
    st = load_newest_logged(&f, log);
    CHECK_MSG(st == ACCEL_OK, "%s: %s", accel_status_name(st), accel_last_error(f.acc));
    CHECK(strstr(accel_checkpoint_dir(f.acc), "checkpoint_0") != NULL && fx_holds(&f, 100));
    CHECK(file_has(log, "checkpoint_3 is not a complete checkpoint: marker file") &&
          file_has(log, "checkpoint_2: file model.safetensors is damaged") &&
          file_has(log, "checkpoint_1: file optimizer.safetensors has"));
    CHECK(accel_checkpoint_iteration(f.acc) == 4);
    fx_free(&f);

    /* Every folder damaged: ECORRUPT listing them, never ENOTFOUND. With something to lose
     * (a step taken), nothing is modified. */
    snprintf(dir, sizeof dir, "%s/checkpoint_0", base);
    flip_byte(dir, "random_states_0.json", -1);
    fx_init(&f, project);
    CHECK_OK(f.acc, accel_optimizer_step(f.opt));
    fx_set(&f, 55);
    st = load_newest_logged(&f, log);
    char want[1024];
    snprintf(want, sizeof want,
             "accel_load_state: no valid checkpoint in %s: checkpoint_3, checkpoint_2, "
             "checkpoint_1, checkpoint_0 are all damaged (each named in a warning); the newest: "
             "%s/checkpoint_3 is not a complete checkpoint: marker file accel_checkpoint.json is "
             "missing",
             base, base);
    CHECK_ERR(f.acc, st, ACCEL_ECORRUPT, want);
    CHECK(fx_holds(&f, 55));
    CHECK(file_has(log, "checkpoint_0: file random_states_0.json is damaged"));
    fx_free(&f);
    /* With nothing to lose the candidates load fused: checkpoint_2's damaged weights were
     * partly written, which the error says, and steps refuse (test_ckpt_fused.c). */
    fx_init(&f, project);
    st = load_newest_logged(&f, log);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(accel_last_error(f.acc), want) != NULL &&
                  strstr(accel_last_error(f.acc), "partly loaded from checkpoint ") != NULL,
              "%s: %s", accel_status_name(st), accel_last_error(f.acc));
    CHECK(accel_optimizer_step(f.opt) == ACCEL_ESTATE);
    fx_free(&f);
}

/* Files of several checksum blocks (16 MiB each): a byte flipped in the last, short block of
 * the weights or of the optimizer moments is found, and nothing of the state is modified,
 * although every earlier block verifies. */
static void test_late_block(const char *root)
{
    char dir[300], copy[300];
    snprintf(dir, sizeof dir, "%s/big", root);
    snprintf(copy, sizeof copy, "%s/bigcopy", root);
    fixture f;
    fx_init_rows(&f, NULL, 300000); /* 4.8M weights: 19 MB of weights, 38 MB of moments */
    fx_set(&f, 5);
    CHECK_OK(f.acc, accel_save_state(f.acc, dir));
    fx_set(&f, 6);
    CHECK_OK(f.acc, accel_load_state(f.acc, dir));
    CHECK(fx_holds(&f, 5));
    static const char *names[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char p[400], needle[200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        CHECK(stat(p, &sb) == 0 && sb.st_size > ((off_t)16 << 20));
        sh("rm -rf %s && cp -r %s %s", copy, dir, copy);
        flip_byte(copy, names[i], (long)sb.st_size - 1);
        snprintf(needle, sizeof needle, "file %s is damaged: its checksum is", names[i]);
        expect_refused_whole(&f, copy, needle, root);
    }
    sh("rm -rf %s %s", dir, copy);
    fx_free(&f);
}

/* A verify that returns the marker keeps the mappings it hashed, one per file of its share,
 * holding the file's bytes, handed over once (the loader loads those very bytes). */
static void test_kept_maps(const char *root)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/maps", root);
    fixture f;
    fx_init(&f, NULL);
    fx_set(&f, 5);
    CHECK_OK(f.acc, accel_save_state(f.acc, dir));
    for (int share = 0; share < 2; share++) {
        accel__ckpt_marker m;
        CHECK(accel__ckpt_verify(dir, share, 2, &m) == ACCEL_OK);
        for (size_t i = 0; i < m.n_files; i++) {
            void *map = NULL;
            size_t n = 0;
            int kept = accel__ckpt_marker_take_map(&m, m.files[i].name, &map, &n);
            CHECK(kept == ((int)(i % 2) == share && m.files[i].nbytes > 0));
            if (!kept) {
                continue;
            }
            CHECK(n == (size_t)m.files[i].nbytes);
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, m.files[i].name);
            FILE *fp = fopen(p, "rb");
            unsigned char *buf = malloc(n);
            CHECK(fp != NULL && buf != NULL && fread(buf, 1, n, fp) == n);
            CHECK(memcmp(buf, map, n) == 0);
            fclose(fp);
            free(buf);
            munmap(map, n);
            CHECK(accel__ckpt_marker_take_map(&m, m.files[i].name, &map, &n) == 0);
        }
        accel__ckpt_marker_release(&m);
    }
    fx_free(&f);
}

int main(void)
{
    for (int i = 0; i < N_SAMPLES * 4; i++) {
        xs[i] = (float)i;
    }
    setenv("ACCEL_LOG_LEVEL", "warn", 1);
    char root[128];
    snprintf(root, sizeof root, "/tmp/accel_test_ckpt_verify_%d", (int)getpid());
    sh("rm -rf %s && mkdir -p %s", root, root);
    test_flipped_bytes(root);
    test_late_block(root);
    test_kept_maps(root);
    test_bad_markers(root);
    test_version1_and_fields(root);
    test_newest_fallback(root);
    sh("rm -rf %s", root);
    printf("test_ckpt_verify: ok\n");
    return 0;
}
