/*
 * The "mlflow" tracker: writes MLflow's file store directly, so `mlflow ui` and MLflow's
 * FileStore API list the run without a server or conversion:
 *   <root>/<experiment_id>/meta.yaml             experiment (found by name or created)
 *   <root>/<experiment_id>/<run_id>/meta.yaml    run info; status RUNNING(1) -> FINISHED(3)
 *   .../<run_id>/params/<key>                    run configuration, one value per file
 *   .../<run_id>/metrics/<key>                   lines "<timestamp_ms> <value> <step>"
 *   .../<run_id>/tags/<key>                      mlflow.runName etc., and logged text values
 * <root> is MLFLOW_TRACKING_URI when it is a local path or file: URI, else logging_dir/mlruns,
 * else ./mlruns (MLflow's default). Every YAML string is single-quoted so names such as "123"
 * stay strings. Metric files are opened, appended and closed per call: nothing is lost on a
 * crash, and no descriptor is held per metric. Continuing an existing run (MLFLOW_RUN_ID,
 * resume) and the run lock are in mlflow_run.c.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/settings.h"
#include "mlflow_internal.h"
#include "track_internal.h"

static long long now_ms(void)
{
    return (long long)(accel__wall_time() * 1000.0);
}

/* Appends a single-quoted YAML scalar. YAML readers refuse control characters and bytes
 * outside UTF-8 anywhere in the file (and MLflow then lists no run of the store): control
 * characters become spaces, other stray bytes the UTF-8 of their Latin-1 reading. */
static void yaml_quote(char *out, size_t cap, const char *s)
{
    size_t k = strlen(out);
    if (k + 1 < cap) {
        out[k++] = '\'';
    }
    for (const unsigned char *p = (const unsigned char *)s; *p && k + 3 < cap; p++) {
        if (*p == '\'') {
            out[k++] = '\'';
        }
        if (*p >= 0x80 && accel__utf8_len(p) == 0) {
            out[k++] = (char)(0xc0 | (*p >> 6));
            out[k++] = (char)(0x80 | (*p & 0x3f));
        } else {
            out[k++] = (*p < 0x20 || *p == 0x7f) ? ' ' : (char)*p;
        }
    }
    if (k + 1 < cap) {
        out[k++] = '\'';
    }
    out[k] = '\0';
}

/* MLflow accepts names of [A-Za-z0-9_\-. :/] without "..", not starting with '/'; anything
 * else becomes '_' so a key such as "loss(train)" still lands in a valid file. A name must also
 * make a path of files: no "." folder, no trailing '/', and each part short enough for a file
 * name with the ".tmp-XXXXXX" of an atomic write after it (longer parts are cut: MLflow itself
 * refuses keys over 250 characters). */
#define KEY_PART_MAX 200
static void sanitize_key(const char *key, char *out, size_t cap)
{
    size_t k = 0, part = 0; /* part: characters of the current path component */
    for (const char *p = key; *p && k + 1 < cap; p++) {
        char c = *p;
        int ok = isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.' || c == ' ' ||
                 c == ':' || c == '/';
        if (!ok || (k == 0 && c == '/') || (c == '.' && k > 0 && out[k - 1] == '.') ||
            (c == '/' && k > 0 && out[k - 1] == '/')) {
            c = '_';
        }
        if (c == '/') {
            if (part == 1 && out[k - 1] == '.') {
                out[k - 1] = '_'; /* "a/./b" */
            }
            part = 0;
        } else if (part == KEY_PART_MAX) {
            continue;
        } else {
            part++;
        }
        out[k++] = c;
    }
    if (k > 0 && (out[k - 1] == '/' || (part == 1 && out[k - 1] == '.'))) {
        out[k - 1] = '_'; /* "a/" and "." name folders, not files */
    }
    out[k] = '\0';
    if (k == 0) {
        snprintf(out, cap, "_");
    }
}

static accel_status write_kv(accel__mlflow_state *s, const char *sub, const char *key,
                             const char *value)
{
    char clean[256], rel[300];
    sanitize_key(key, clean, sizeof(clean));
    snprintf(rel, sizeof(rel), "%s/%s", sub, clean);
    char *path = accel__path_join(s->common.run_dir, rel);
    if (path == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    char *slash = strrchr(path, '/');
    *slash = '\0';
    accel_status st = accel__mkdirs(path);
    *slash = '/';
    /* MLflow reads the file as UTF-8 and fails on the whole run otherwise. */
    char *text = st == ACCEL_OK ? accel__utf8_dup(value) : NULL;
    if (st == ACCEL_OK && text == NULL) {
        accel__free(path);
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    if (st == ACCEL_OK) {
        st = accel__write_file_atomic(path, text, strlen(text));
    }
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
    accel__free(text);
    accel__free(path);
    return st;
}

accel_status accel__mlflow_write_run_meta(accel__mlflow_state *s, int status, long long end_ms)
{
    char meta[4096] = "artifact_uri: ";
    yaml_quote(meta, sizeof(meta), s->artifact_uri);
    size_t k = strlen(meta);
    if (end_ms >= 0) {
        k += (size_t)snprintf(meta + k, sizeof(meta) - k, "\nend_time: %lld\n", end_ms);
    } else {
        k += (size_t)snprintf(meta + k, sizeof(meta) - k, "\nend_time: null\n");
    }
    snprintf(meta + k, sizeof(meta) - k,
             "entry_point_name: ''\nexperiment_id: '%s'\nlifecycle_stage: active\n"
             "run_id: '%s'\nrun_name: ",
             s->exp_id, s->run_id);
    yaml_quote(meta, sizeof(meta), s->run_name);
    k = strlen(meta);
    snprintf(meta + k, sizeof(meta) - k,
             "\nrun_uuid: '%s'\nsource_name: ''\nsource_type: 4\nsource_version: ''\n"
             "start_time: %lld\nstatus: %d\ntags: []\nuser_id: ",
             s->run_id, s->start_ms, status);
    yaml_quote(meta, sizeof(meta), s->user);
    strncat(meta, "\n", sizeof(meta) - strlen(meta) - 1);
    char *path = accel__path_join(s->common.run_dir, "meta.yaml");
    if (path == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    accel_status st = accel__write_file_atomic(path, meta, strlen(meta));
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
    accel__free(path);
    return st;
}

/* Reads "<field>: ..." from the meta.yaml in dir into out (unquoted). Returns 0 if found. */
int accel__mlflow_read_meta(const char *dir, const char *field, char *out, size_t cap)
{
    char *path = accel__path_join(dir, "meta.yaml");
    FILE *f = path ? fopen(path, "r") : NULL;
    accel__free(path);
    if (f == NULL) {
        return -1;
    }
    char line[1024];
    int found = -1;
    size_t flen = strlen(field);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, field, flen) != 0 || strncmp(line + flen, ": ", 2) != 0) {
            continue;
        }
        char *v = line + flen + 2;
        v[strcspn(v, "\r\n")] = '\0';
        size_t n = strlen(v);
        size_t k = 0;
        if (n >= 2 && (v[0] == '\'' || v[0] == '"') && v[n - 1] == v[0]) {
            for (size_t i = 1; i + 1 < n && k + 1 < cap; i++) {
                if (v[0] == '\'' && v[i] == '\'' && v[i + 1] == '\'') {
                    i++;
                }
                out[k++] = v[i];
            }
        } else {
            for (size_t i = 0; i < n && k + 1 < cap; i++) {
                out[k++] = v[i];
            }
        }
        out[k] = '\0';
        found = 0;
        break;
    }
    fclose(f);
    return found;
}

static accel_status write_exp_meta(const char *root, const char *id, const char *name)
{
    char *dir = accel__path_join(root, id);
    char *path = dir ? accel__path_join(dir, "meta.yaml") : NULL;
    char *abs = dir ? realpath(root, NULL) : NULL;
    accel_status st = ACCEL_OK;
    if (path == NULL || abs == NULL) {
        st = accel_tracker_seterr(ACCEL_EIO, "cannot resolve MLflow root %s", root);
        goto out;
    }
    st = accel__mkdirs(dir);
    if (st == ACCEL_OK) {
        char meta[2048] = "artifact_location: ";
        char uri[1200];
        snprintf(uri, sizeof(uri), "file://%s/%s", abs, id);
        yaml_quote(meta, sizeof(meta), uri);
        size_t k = strlen(meta);
        long long t = now_ms();
        snprintf(meta + k, sizeof(meta) - k,
                 "\ncreation_time: %lld\nexperiment_id: '%s'\nlast_update_time: %lld\n"
                 "lifecycle_stage: active\nname: ",
                 t, id, t);
        yaml_quote(meta, sizeof(meta), name);
        strncat(meta, "\n", sizeof(meta) - strlen(meta) - 1);
        st = accel__write_file_atomic(path, meta, strlen(meta));
    }
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
out:
    free(abs); /* realpath allocates with the C library */
    accel__free(path);
    accel__free(dir);
    return st;
}

/* Finds the experiment named `name` under root or creates it; writes its id into id. */
static accel_status find_or_create_experiment(const char *root, const char *name, char *id,
                                              size_t cap)
{
    DIR *d = opendir(root);
    if (d == NULL) {
        return accel_tracker_seterr(ACCEL_EIO, "cannot list %s: %s", root, strerror(errno));
    }
    long long max_id = 0;
    int have_default = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *endp;
        long long v = strtoll(e->d_name, &endp, 10);
        if (e->d_name[0] == '\0' || *endp != '\0' || v < 0) {
            continue;
        }
        char *dir = accel__path_join(root, e->d_name);
        char found[512];
        if (dir != NULL && accel__mlflow_read_meta(dir, "name", found, sizeof(found)) == 0) {
            have_default |= v == 0;
            if (strcmp(found, name) == 0) {
                snprintf(id, cap, "%lld", v);
                accel__free(dir);
                closedir(d);
                return ACCEL_OK;
            }
        }
        accel__free(dir);
        max_id = v > max_id ? v : max_id;
    }
    closedir(d);
    /* MLflow's own store creates experiment 0 "Default" in a fresh root; do the same so the
     * tree looks exactly like one MLflow made. */
    if (!have_default) {
        ACCEL_TRY(write_exp_meta(root, "0", "Default"));
    }
    snprintf(id, cap, "%lld", max_id + 1);
    return write_exp_meta(root, id, name);
}

static accel_status random_hex(char *out, size_t nhex)
{
    unsigned char bytes[32];
    size_t n = nhex / 2;
    int fd = open("/dev/urandom", O_RDONLY);
    ssize_t got = fd >= 0 ? read(fd, bytes, n) : -1;
    if (fd >= 0) {
        close(fd);
    }
    if (got != (ssize_t)n) {
        /* No urandom (a sandbox): time and pid still give distinct ids per run. */
        unsigned long long x =
            (unsigned long long)now_ms() * 6364136223846793005ull ^ (unsigned long long)getpid();
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            bytes[i] = (unsigned char)(x >> 56);
        }
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(out + 2 * i, 3, "%02x", bytes[i]);
    }
    return ACCEL_OK;
}

static void free_state(accel__mlflow_state *s)
{
    accel__lockfile_release(&s->lock);
    accel__free(s->root);
    accel__free(s->exp_id);
    accel__free(s->run_id);
    accel__free(s->artifact_uri);
    accel__free(s->run_name);
    accel__free(s->user);
    accel__free(s->common.run_dir);
    accel__free(s);
}

/* The store root: MLFLOW_TRACKING_URI (local only), else logging_dir/mlruns, else ./mlruns. */
static accel_status store_root(const accel__track_settings *set,
                               const accel_tracker_start_info *info, char **out)
{
    const char *uri = set->mlflow_tracking_uri;
    if (uri != NULL) {
        if (strncmp(uri, "file://", 7) == 0) {
            uri += 7;
        } else if (strncmp(uri, "file:", 5) == 0) {
            uri += 5;
        } else if (strstr(uri, "://") != NULL) {
            return accel_tracker_seterr(ACCEL_EUNSUPPORTED,
                                        "MLFLOW_TRACKING_URI=%s: only a local path or file: URI "
                                        "is supported (accel writes MLflow's file store)",
                                        uri);
        }
        *out = accel__strdup(uri);
    } else {
        *out = accel__path_join(info->logging_dir ? info->logging_dir : ".", "mlruns");
    }
    return *out ? ACCEL_OK : accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
}

/* Logs where the run lives, and how MLflow 3 can open the store (the tracker's first line). */
void accel__mlflow_log_run(const accel__mlflow_state *s, const char *how)
{
    accel__log(accel__track_log(), ACCEL__LOG_INFO,
               "tracker mlflow: %s run %s ('%s') of experiment %s in the file store %s; MLflow 3 "
               "opens a file store only with MLFLOW_ALLOW_FILE_STORE=true (e.g. "
               "MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri %s)",
               how, s->run_id, s->run_name, s->exp_id, s->root, s->root);
}

/* user: the accelerator's track settings (tracker.c passes them to built-in trackers). */
static accel_status ml_start(void *user, const accel_tracker_start_info *info, void **state)
{
    const accel__track_settings *set = user;
    accel__mlflow_state *s = accel__calloc(1, sizeof(*s));
    if (s == NULL || (s->user = accel__strdup(set->user)) == NULL) {
        accel__free(s);
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    s->common.magic = ACCEL__TRACK_MAGIC;
    accel_status st = store_root(set, info, &s->root);
    char id[32], run_id[33] = {0};
    if (st != ACCEL_OK) {
        goto fail;
    }
    st = accel__mkdirs(s->root);
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        goto fail;
    }
    const char *env_run = set->mlflow_run_id;
    if (env_run != NULL) {
        /* Accelerate passes MLFLOW_RUN_ID to mlflow.start_run: continue that run. */
        if (!accel__mlflow_find_run(s->root, env_run, id, sizeof(id))) {
            st = accel_tracker_seterr(ACCEL_ENOTFOUND, "MLFLOW_RUN_ID=%s: no such run in %s",
                                      env_run, s->root);
            goto fail;
        }
        ACCEL_TRY_GOTO(
            accel__mlflow_lock_run(s, &s->lock, id, env_run, " (MLFLOW_RUN_ID names it)"), st,
            fail);
        ACCEL_TRY_GOTO(accel__mlflow_continue_run(s, id, env_run), st, fail);
        accel__mlflow_log_run(s, "continuing");
        *state = s;
        return ACCEL_OK;
    }
    const char *exp_name = info->project_name;
    if (set->mlflow_experiment_name != NULL) {
        exp_name = set->mlflow_experiment_name;
    }
    ACCEL_TRY_GOTO(find_or_create_experiment(s->root, exp_name, id, sizeof(id)), st, fail);
    random_hex(run_id, 32);
    char rel[80];
    snprintf(rel, sizeof(rel), "%s/%s", id, run_id);
    s->common.run_dir = accel__path_join(s->root, rel);
    s->exp_id = accel__strdup(id);
    s->run_id = accel__strdup(run_id);
    s->run_name = accel__strdup(info->project_name);
    s->start_ms = (long long)(info->start_time * 1000.0);
    char *abs = realpath(s->root, NULL);
    if (abs != NULL && s->common.run_dir != NULL) {
        size_t n = strlen(abs) + strlen(rel) + 32;
        s->artifact_uri = accel__malloc(n);
        if (s->artifact_uri != NULL) {
            snprintf(s->artifact_uri, n, "file://%s/%s/artifacts", abs, rel);
        }
    }
    free(abs);
    if (s->common.run_dir == NULL || s->exp_id == NULL || s->run_id == NULL ||
        s->run_name == NULL || s->artifact_uri == NULL) {
        st = accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
        goto fail;
    }
    static const char *const subdirs[] = {"metrics", "params", "tags", "artifacts"};
    for (int i = 0; i < 4; i++) {
        char *d = accel__path_join(s->common.run_dir, subdirs[i]);
        st = d ? accel__mkdirs(d) : ACCEL_ENOMEM;
        accel__free(d);
        if (st != ACCEL_OK) {
            accel_tracker_seterr(st, "%s", accel_last_error(NULL));
            goto fail;
        }
    }
    ACCEL_TRY_GOTO(accel__mlflow_lock_run(s, &s->lock, s->exp_id, s->run_id, ""), st, fail);
    ACCEL_TRY_GOTO(accel__mlflow_write_run_meta(s, 1, -1), st, fail);
    const char *prog = program_invocation_name ? program_invocation_name : "";
    ACCEL_TRY_GOTO(write_kv(s, "tags", "mlflow.runName", s->run_name), st, fail);
    ACCEL_TRY_GOTO(write_kv(s, "tags", "mlflow.source.name", prog), st, fail);
    ACCEL_TRY_GOTO(write_kv(s, "tags", "mlflow.source.type", "LOCAL"), st, fail);
    ACCEL_TRY_GOTO(write_kv(s, "tags", "mlflow.user", s->user), st, fail);
    accel__mlflow_log_run(s, "started");
    *state = s;
    return ACCEL_OK;
fail:
    free_state(s);
    return st;
}

static accel_status ml_config(void *state, const accel_value *v, int n)
{
    accel__mlflow_state *s = state;
    for (int i = 0; i < n; i++) {
        char num[40];
        const char *val = v[i].text;
        if (v[i].kind == ACCEL_VALUE_SCALAR) {
            accel__track_fmt_double(num, sizeof(num), v[i].scalar);
            val = num;
        }
        ACCEL_TRY(write_kv(s, "params", v[i].key, val));
    }
    return ACCEL_OK;
}

/* Records one value: a text as a tag, a number as a line of its metric history. */
static accel_status log_value(accel__mlflow_state *s, const accel_value *v, long long ts,
                              long long step)
{
    if (v->kind == ACCEL_VALUE_TEXT) {
        /* MLflow metrics are numeric; text lands as a tag (latest value wins). */
        return write_kv(s, "tags", v->key, v->text);
    }
    if (!isfinite(v->scalar)) {
        accel__track_warn_nonfinite("mlflow", v->key, v->scalar);
    }
    /* Stack buffers and one O_APPEND write: no allocation per logged value, and a line is
     * never split even if another tool appends concurrently. */
    char clean[256], path[4096], line[128], num[40];
    sanitize_key(v->key, clean, sizeof(clean));
    if ((size_t)snprintf(path, sizeof(path), "%s/metrics/%s", s->common.run_dir, clean) >=
        sizeof(path)) {
        return accel_tracker_seterr(ACCEL_EINVAL, "metric path for \"%s\" is too long", v->key);
    }
    if (strchr(clean, '/') != NULL) {
        char *slash = strrchr(path, '/');
        *slash = '\0';
        accel_status st = accel__mkdirs(path);
        *slash = '/';
        if (st != ACCEL_OK) {
            return accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        }
    }
    accel__track_fmt_double(num, sizeof(num), v->scalar);
    int len = snprintf(line, sizeof(line), "%lld %s %lld\n", ts, num, step < 0 ? 0 : step);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0666);
    ssize_t wrote = fd < 0 ? -1 : write(fd, line, (size_t)len);
    int bad = wrote != len;
    int err = wrote < 0 ? errno : ENOSPC; /* a short write sets no errno: the disk is full */
    struct stat sb;
    if (wrote > 0 && wrote < len && fstat(fd, &sb) == 0) {
        /* A line cut short by a full disk: MLflow could not read the history past it. */
        if (ftruncate(fd, sb.st_size - wrote) != 0) {
            err = errno;
        }
    }
    if (fd >= 0 && close(fd) != 0 && !bad) {
        bad = 1;
        err = errno;
    }
    if (bad) {
        return accel_tracker_seterr(ACCEL_EIO, "cannot append to %s: %s", path, strerror(err));
    }
    return ACCEL_OK;
}

static accel_status ml_log(void *state, const accel_value *v, int n, long long step)
{
    accel__mlflow_state *s = state;
    long long ts = now_ms();
    /* One value that cannot be written (its metric file is in the way, say) does not cost
     * the others of the call theirs. */
    accel_status first = ACCEL_OK;
    for (int i = 0; i < n; i++) {
        accel_status st = log_value(s, &v[i], ts, step);
        if (first == ACCEL_OK) {
            first = st;
        }
    }
    return first;
}

static accel_status ml_finish(void *state)
{
    accel__mlflow_state *s = state;
    accel_status st = accel__mlflow_write_run_meta(s, 3, now_ms());
    free_state(s);
    return st;
}

const accel_tracker_ops accel__tracker_mlflow = {
    .size = sizeof(accel_tracker_ops),
    .name = "mlflow",
    .requires_logging_directory = 0,
    .start = ml_start,
    .store_init_configuration = ml_config,
    .log = ml_log,
    .finish = ml_finish,
    .resume = accel__mlflow_resume,
};
