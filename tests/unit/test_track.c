/*
 * The tracker flow (registry, log_with parsing, init/log/get/end) with a user-defined tracker,
 * the jsonl and csv files' exact contents, and bad input: unknown names, a tracker needing a
 * directory without one, an unwritable directory, NaN values, and a tracker whose writes fail
 * later (warnings; training goes on). Faults of the built-in trackers' files: a disk full in
 * mid-record, a run folder deleted while the run writes, names that are not UTF-8 or not file
 * names, and two jobs logging into one run folder or MLflow run (the second is refused).
 */
#include <dirent.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "track_check.h"
#include "track/track_internal.h"

static char tmpdir[] = "/tmp/accel_track_XXXXXX";

/* ---- stderr capture: library warnings go to fd 2 ---- */
static check_capture cap;

static void capture_begin(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/stderr.txt", tmpdir);
    check_capture_begin(&cap, path);
}

static char *capture_end(void)
{
    return check_capture_end(&cap);
}

static accel *make(const char *project_dir, const char *log_with)
{
    accel_options o = accel_options_default();
    o.project_dir = project_dir;
    o.log_with = log_with;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    return acc;
}

static int count_lines(const char *text)
{
    int n = 0;
    for (; *text; text++) {
        n += *text == '\n';
    }
    return n;
}

/* ---- a user-defined tracker recording into memory ---- */
typedef struct mem_run {
    char project[64], dir[256];
    int n_config, n_logs, finished;
    double last_loss;
    long long last_step;
    int fail_logs; /* make log fail */
} mem_run;

static mem_run mem; /* one run at a time in this test */
static int mem_starts;

static accel_status mem_start(void *user, const accel_tracker_start_info *info, void **state)
{
    CHECK(user == &mem_starts);
    mem_starts++;
    memset(&mem, 0, sizeof(mem));
    snprintf(mem.project, sizeof(mem.project), "%s", info->project_name);
    snprintf(mem.dir, sizeof(mem.dir), "%s", info->logging_dir ? info->logging_dir : "");
    *state = &mem;
    return ACCEL_OK;
}
static accel_status mem_config(void *state, const accel_value *v, int n)
{
    mem_run *r = state;
    r->n_config = n;
    CHECK(strcmp(v[0].key, "lr") == 0);
    return ACCEL_OK;
}
static accel_status mem_log(void *state, const accel_value *v, int n, long long step)
{
    mem_run *r = state;
    if (r->fail_logs) {
        return accel_tracker_seterr(ACCEL_EIO, "disk full (simulated)");
    }
    r->n_logs++;
    r->last_step = step;
    for (int i = 0; i < n; i++) {
        if (strcmp(v[i].key, "loss") == 0) {
            r->last_loss = v[i].scalar;
        }
    }
    return ACCEL_OK;
}
static accel_status mem_finish(void *state)
{
    ((mem_run *)state)->finished++;
    return ACCEL_OK;
}

static void register_mem(void)
{
    accel_tracker_ops ops = accel_tracker_ops_default();
    ops.name = "mem";
    ops.start = mem_start;
    ops.store_init_configuration = mem_config;
    ops.log = mem_log;
    ops.finish = mem_finish;
    ops.user = &mem_starts;
    CHECK_OK(NULL, accel_register_tracker(&ops));
    /* Bad registrations. */
    accel_tracker_ops bad = ops;
    bad.log = NULL;
    CHECK(accel_register_tracker(&bad) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(NULL), "log") != NULL);
    bad = ops;
    bad.name = "all";
    CHECK(accel_register_tracker(&bad) == ACCEL_EINVAL);
    CHECK(accel_register_tracker(NULL) == ACCEL_EINVAL);
}

static void test_user_tracker(void)
{
    accel *acc = make(tmpdir, " mem , mem ");
    accel_value cfg[] = {ACCEL_SCALAR("lr", 0.1)};
    CHECK_OK(acc, accel_init_trackers(acc, "proj", cfg, 1));
    CHECK(mem_starts == 1); /* deduplicated */
    CHECK(strcmp(mem.project, "proj") == 0 && strcmp(mem.dir, tmpdir) == 0);
    CHECK(mem.n_config == 1);
    accel_value v[] = {ACCEL_SCALAR("loss", 1.5)};
    CHECK_OK(acc, accel_log(acc, v, 1, 3));
    CHECK_OK(acc, accel_log(acc, v, 1, ACCEL_NO_STEP));
    CHECK(mem.n_logs == 2 && mem.last_step == ACCEL_NO_STEP && mem.last_loss == 1.5);
    accel_tracker *t = accel_get_tracker(acc, "mem");
    CHECK(t != NULL && accel_tracker_state(t) == &mem && accel_tracker_run_dir(t) == NULL);
    CHECK(accel_get_tracker(acc, "tensorboard") == NULL);
    CHECK(accel_last_status(acc) == ACCEL_EINVAL);

    /* Bad arguments are errors; a failing tracker is a warning and training goes on. */
    accel_value nokey[] = {{.key = NULL, .kind = ACCEL_VALUE_SCALAR}};
    CHECK(accel_log(acc, nokey, 1, 0) == ACCEL_EINVAL);
    CHECK(accel_log(acc, NULL, 1, 0) == ACCEL_EINVAL);
    CHECK(accel_log(acc, v, 1, -5) == ACCEL_EINVAL);
    accel_value notext[] = {{.key = "t", .kind = ACCEL_VALUE_TEXT}};
    CHECK(accel_log(acc, notext, 1, 0) == ACCEL_EINVAL);
    mem.fail_logs = 1;
    capture_begin();
    for (int i = 0; i < 6; i++) {
        CHECK(accel_log(acc, v, 1, 10 + i) == ACCEL_OK);
    }
    char *err = capture_end();
    CHECK_MSG(strstr(err, "tracker mem: logging step 10 failed: disk full (simulated)") != NULL,
              "%s", err);
    CHECK(strstr(err, "step 13") == NULL); /* rate-limited after 3 */
    mem.fail_logs = 0;
    CHECK_OK(acc, accel_end_training(acc));
    CHECK(mem.finished == 1);
    CHECK_OK(acc, accel_end_training(acc)); /* twice is harmless */
    CHECK(mem.finished == 1);

    /* Not ended: accel_free finishes it. */
    CHECK_OK(acc, accel_init_trackers(acc, "proj2", NULL, 0));
    CHECK(mem_starts == 2 && mem.n_config == 0);
    accel_free(acc);
    CHECK(mem.finished == 1);
}

static void test_bad_input(void)
{
    /* Unknown name: nothing starts, the message names it and lists the known ones. */
    accel *acc = make(tmpdir, "jsonl,wandb");
    CHECK(accel_init_trackers(acc, "bad1", NULL, 0) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "\"wandb\"") != NULL);
    CHECK(strstr(accel_last_error(acc), "tensorboard") != NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/bad1", tmpdir);
    CHECK(access(path, F_OK) != 0);
    accel_free(acc);

    /* A directory tracker without project_dir / logging_dir. */
    acc = make(NULL, "csv");
    CHECK(accel_init_trackers(acc, "x", NULL, 0) == ACCEL_EINVAL);
    CHECK(strstr(accel_last_error(acc), "csv needs a logging directory") != NULL);
    accel_free(acc);

    /* An unwritable directory (a path under a regular file: fails even as root). */
    snprintf(path, sizeof(path), "%s/file", tmpdir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fclose(f);
    char sub[600];
    snprintf(sub, sizeof(sub), "%s/sub", path);
    acc = make(sub, "tensorboard");
    CHECK(accel_init_trackers(acc, "x", NULL, 0) == ACCEL_EIO);
    CHECK_MSG(strstr(accel_last_error(acc), "tracker tensorboard: start failed") != NULL &&
                  strstr(accel_last_error(acc), path) != NULL,
              "%s", accel_last_error(acc));
    accel_free(acc);

    /* Bad project names. */
    acc = make(tmpdir, "jsonl");
    CHECK(accel_init_trackers(acc, "", NULL, 0) == ACCEL_EINVAL);
    CHECK(accel_init_trackers(acc, "a/b", NULL, 0) == ACCEL_EINVAL);
    CHECK(accel_init_trackers(acc, "ok", NULL, 2) == ACCEL_EINVAL);
    accel_free(acc);

    /* No log_with: nothing to do, logging is a no-op. */
    acc = make(tmpdir, NULL);
    CHECK_OK(acc, accel_init_trackers(acc, "none", NULL, 0));
    accel_value v[] = {ACCEL_SCALAR("loss", 1)};
    CHECK_OK(acc, accel_log(acc, v, 1, 0));
    accel_free(acc);
}

static void test_jsonl_csv(void)
{
    accel *acc = make(tmpdir, "jsonl,csv");
    accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4), ACCEL_TEXT("model", "gpt2")};
    CHECK_OK(acc, accel_init_trackers(acc, "tab", cfg, 2));
    accel_value a[] = {ACCEL_SCALAR("loss", 2.5), ACCEL_TEXT("note", "a,\"b\"")};
    CHECK_OK(acc, accel_log(acc, a, 2, 0));
    accel_value b[] = {ACCEL_SCALAR("loss", 2.25), ACCEL_SCALAR("acc", 0.5)}; /* new column */
    CHECK_OK(acc, accel_log(acc, b, 2, 1));
    capture_begin();
    accel_value c[] = {ACCEL_SCALAR("loss", NAN), ACCEL_SCALAR("acc", INFINITY)};
    CHECK_OK(acc, accel_log(acc, c, 2, ACCEL_NO_STEP));
    char *err = capture_end();
    CHECK_MSG(strstr(err, "value of \"loss\" is nan") != NULL, "%s", err);
    char run[512];
    snprintf(run, sizeof(run), "%s/tab", tmpdir);
    CHECK(strcmp(accel_tracker_run_dir(accel_get_tracker(acc, "csv")), run) == 0);

    /* Flushed on every call: readable before the run ends. */
    char path[600];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    char *text = check_slurp(path);
    char *line = strtok(text, "\n");
    json_error_t jerr;
    json_t *j = json_loads(line, 0, &jerr);
    CHECK(j != NULL);
    CHECK(json_integer_value(json_object_get(j, "step")) == 0);
    CHECK(json_real_value(json_object_get(j, "loss")) == 2.5);
    CHECK(strcmp(json_string_value(json_object_get(j, "note")), "a,\"b\"") == 0);
    CHECK(json_real_value(json_object_get(j, "time")) > 1.5e9);
    json_decref(j);
    line = strtok(NULL, "\n");
    j = json_loads(line, 0, &jerr);
    CHECK(j != NULL && json_real_value(json_object_get(j, "acc")) == 0.5);
    json_decref(j);
    line = strtok(NULL, "\n");
    j = json_loads(line, 0, &jerr);
    CHECK_MSG(j != NULL, "%s", line);
    CHECK(json_is_null(json_object_get(j, "step")) && json_is_null(json_object_get(j, "loss")));
    CHECK(json_is_null(json_object_get(j, "acc")));
    json_decref(j);
    CHECK(strtok(NULL, "\n") == NULL);

    snprintf(path, sizeof(path), "%s/metrics.csv", run);
    text = check_slurp(path);
    /* Strip the time column (field 2) for an exact comparison. */
    char rows[4][256];
    int n_rows = 0;
    for (char *l = strtok(text, "\n"); l != NULL && n_rows < 4; l = strtok(NULL, "\n")) {
        char *c1 = strchr(l, ',');
        char *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        CHECK(c2 != NULL);
        snprintf(rows[n_rows++], sizeof(rows[0]), "%.*s%s", (int)(c1 - l), l, c2);
    }
    CHECK(n_rows == 4);
    CHECK_MSG(strcmp(rows[0], "step,loss,note,acc") == 0, "%s", rows[0]);
    CHECK_MSG(strcmp(rows[1], "0,2.5,\"a,\"\"b\"\"\",") == 0, "%s", rows[1]);
    CHECK_MSG(strcmp(rows[2], "1,2.25,,0.5") == 0, "%s", rows[2]);
    CHECK_MSG(strcmp(rows[3], ",nan,,inf") == 0, "%s", rows[3]);

    snprintf(path, sizeof(path), "%s/config.json", run);
    j = json_load_file(path, 0, &jerr);
    CHECK(j != NULL && json_real_value(json_object_get(j, "lr")) == 3e-4);
    CHECK(strcmp(json_string_value(json_object_get(j, "model")), "gpt2") == 0);
    json_decref(j);

    /* The run folder vanishes mid-run: both files are written anew (the csv with every column
     * in its header), with a warning, instead of the later records vanishing with it. */
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", run);
    CHECK(system(cmd) == 0);
    capture_begin();
    accel_value d[] = {ACCEL_SCALAR("brand_new", 1)};
    CHECK(accel_log(acc, d, 1, 5) == ACCEL_OK);
    CHECK(accel_log(acc, d, 1, 6) == ACCEL_OK);
    CHECK_OK(acc, accel_end_training(acc));
    err = capture_end();
    CHECK_MSG(strstr(err, "metrics.csv was deleted or replaced while the run wrote it") != NULL,
              "%s", err);
    CHECK_MSG(strstr(err, "metrics.jsonl was deleted or replaced") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "failed") == NULL, "%s", err);
    accel_free(acc);
    snprintf(path, sizeof(path), "%s/metrics.csv", run);
    text = check_slurp(path);
    CHECK_MSG(strncmp(text, "step,time,loss,note,acc,brand_new\n5,", 36) == 0, "%s", text);
    CHECK(count_lines(text) == 3);
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    text = check_slurp(path);
    CHECK_MSG(strncmp(text, "{\"step\": 5,", 11) == 0 && count_lines(text) == 2, "%s", text);

    /* A resumed run appends under the existing csv header. */
    acc = make(tmpdir, "csv");
    CHECK_OK(acc, accel_init_trackers(acc, "tab2", NULL, 0));
    accel_value e[] = {ACCEL_SCALAR("x", 1), ACCEL_SCALAR("y", 2)};
    CHECK_OK(acc, accel_log(acc, e, 2, 0));
    accel_free(acc);
    acc = make(tmpdir, "csv");
    CHECK_OK(acc, accel_init_trackers(acc, "tab2", NULL, 0));
    accel_value g[] = {ACCEL_SCALAR("y", 3)};
    CHECK_OK(acc, accel_log(acc, g, 1, 1));
    accel_free(acc);
    snprintf(path, sizeof(path), "%s/tab2/metrics.csv", tmpdir);
    text = check_slurp(path);
    CHECK_MSG(strncmp(text, "step,time,x,y\n0,", 16) == 0, "%s", text);
    char *last = strrchr(text, '\n');
    *last = '\0';
    last = strrchr(text, '\n') + 1;
    CHECK_MSG(strncmp(last, "1,", 2) == 0 && strcmp(last + strlen(last) - 3, ",,3") == 0, "%s",
              last);
}

/* A call with no values, then a first key: the earlier row is widened too. */
/* Two jobs, one run folder: the second job's jsonl / csv tracker is refused while the first
 * one writes (their records interleaved in one file before, and a csv rewrite by one dropped
 * the other's rows), the first one is not disturbed, and the folder is free once it ends. */
static void test_two_jobs(void)
{
    accel *first = make(tmpdir, "jsonl,csv");
    CHECK_OK(first, accel_init_trackers(first, "shared", NULL, 0));
    accel_value a[] = {ACCEL_SCALAR("loss", 1.5)};
    CHECK_OK(first, accel_log(first, a, 1, 0));
    accel *second = make(tmpdir, "csv");
    accel_status st2 = accel_init_trackers(second, "shared", NULL, 0);
    CHECK_MSG(st2 == ACCEL_ESTATE, "%s: %s", accel_status_name(st2), accel_last_error(second));
    char want[700];
    snprintf(want, sizeof(want),
             "tracker csv: start failed: %s/shared/metrics.csv is being written by another job "
             "(pid %d on host ",
             tmpdir, (int)getpid());
    const char *err = accel_last_error(second);
    CHECK_MSG(strncmp(err, want, strlen(want)) == 0 &&
                  strstr(err, "give each job its own project_name or logging_dir") != NULL,
              "%s", err);
    accel_value b[] = {ACCEL_SCALAR("acc", 0.5)}; /* a new column: the csv is rewritten */
    CHECK_OK(first, accel_log(first, b, 1, 1));
    CHECK_OK(first, accel_end_training(first));
    accel_free(first);
    char path[600];
    snprintf(path, sizeof(path), "%s/shared/metrics.csv", tmpdir);
    char *text = check_slurp(path);
    CHECK_MSG(count_lines(text) == 3, "%s", text);
    snprintf(path, sizeof(path), "%s/shared/.metrics.csv.lock", tmpdir);
    CHECK(access(path, F_OK) != 0); /* removed at the end */
    CHECK_OK(second, accel_init_trackers(second, "shared", NULL, 0));
    CHECK_OK(second, accel_end_training(second));
    accel_free(second);
}

/* Two jobs, one MLflow experiment and run name: the second job's resume does not take over
 * the first job's live run (it continued it and cut its history before), and MLFLOW_RUN_ID
 * naming a live run is refused; the runs stay apart. */
static void test_two_jobs_mlflow(void)
{
    setenv("MLFLOW_TRACKING_URI", "", 1);
    unsetenv("MLFLOW_RUN_ID");
    accel *first = make(tmpdir, "mlflow");
    CHECK_OK(first, accel_init_trackers(first, "mlshared", NULL, 0));
    char run_a[512], metric[600];
    snprintf(run_a, sizeof(run_a), "%s", accel_tracker_run_dir(accel_get_tracker(first, "mlflow")));
    for (int step = 0; step < 3; step++) {
        accel_value v[] = {ACCEL_SCALAR("loss", step)};
        CHECK_OK(first, accel_log(first, v, 1, step));
    }
    accel *second = make(tmpdir, "mlflow");
    CHECK_OK(second, accel_init_trackers(second, "mlshared", NULL, 0));
    capture_begin();
    CHECK_OK(second, accel_trackers_resume(second, 1));
    char *err = capture_end();
    const char *id_a = strrchr(run_a, '/') + 1;
    char want[300];
    snprintf(want, sizeof(want),
             "tracker mlflow: resuming at step 1 failed: MLflow run %s is being written by "
             "another job (pid %d on host ",
             id_a, (int)getpid());
    CHECK_MSG(strstr(err, want) != NULL && strstr(err, "this run stays a new one") != NULL, "%s",
              err);
    const char *run_b = accel_tracker_run_dir(accel_get_tracker(second, "mlflow"));
    CHECK_MSG(strcmp(run_b, run_a) != 0, "%s", run_b);
    snprintf(metric, sizeof(metric), "%s/metrics/loss", run_a);
    CHECK(count_lines(check_slurp(metric)) == 3); /* the first job's history is whole */
    setenv("MLFLOW_RUN_ID", id_a, 1);
    accel *third = make(tmpdir, "mlflow");
    CHECK(accel_init_trackers(third, "mlshared", NULL, 0) == ACCEL_ESTATE);
    CHECK_MSG(strstr(accel_last_error(third), "(MLFLOW_RUN_ID names it)") != NULL, "%s",
              accel_last_error(third));
    unsetenv("MLFLOW_RUN_ID");
    accel_free(third);
    CHECK_OK(second, accel_end_training(second));
    accel_free(second);
    CHECK_OK(first, accel_end_training(first));
    accel_free(first);
}

static void test_csv_empty_first(void)
{
    accel *acc = make(tmpdir, "csv");
    CHECK_OK(acc, accel_init_trackers(acc, "empty", NULL, 0));
    CHECK_OK(acc, accel_log(acc, NULL, 0, 0));
    accel_value v[] = {ACCEL_SCALAR("x", 1)};
    CHECK_OK(acc, accel_log(acc, v, 1, 1));
    accel_free(acc);
    char path[512];
    snprintf(path, sizeof(path), "%s/empty/metrics.csv", tmpdir);
    char *text = check_slurp(path);
    int commas[3] = {0}, line = 0;
    for (char *p = text; *p && line < 3; p++) {
        if (*p == ',') {
            commas[line]++;
        } else if (*p == '\n') {
            line++;
        }
    }
    CHECK_MSG(line == 3 && commas[0] == 2 && commas[1] == 2 && commas[2] == 2, "%s", text);
    CHECK(strncmp(text, "step,time,x\n0,", 14) == 0);
}

static void test_all(void)
{
    setenv("MLFLOW_TRACKING_URI", "", 1); /* empty = unset: logging_dir/mlruns */
    accel *acc = make(tmpdir, "all");
    accel_value cfg[] = {ACCEL_SCALAR("lr", 0.1)};
    CHECK_OK(acc, accel_init_trackers(acc, "every", cfg, 1));
    const char *names[] = {"tensorboard", "mlflow", "jsonl", "csv", "mem"};
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(accel_get_tracker(acc, names[i]) != NULL, "%s", names[i]);
    }
    accel_value v[] = {ACCEL_SCALAR("loss", 1)};
    CHECK_OK(acc, accel_log(acc, v, 1, 0));
    CHECK(mem.n_logs == 1);
    char ml[512]; /* copied: the tracker's string dies with accel_end_training */
    snprintf(ml, sizeof(ml), "%s", accel_tracker_run_dir(accel_get_tracker(acc, "mlflow")));
    char prefix[512];
    snprintf(prefix, sizeof(prefix), "%s/mlruns/", tmpdir);
    CHECK(strncmp(ml, prefix, strlen(prefix)) == 0);
    char path[700];
    snprintf(path, sizeof(path), "%s/metrics/loss", ml);
    char *text = check_slurp(path);
    long long ts;
    double val;
    long long step;
    CHECK(sscanf(text, "%lld %lf %lld", &ts, &val, &step) == 3 && val == 1 && step == 0);
    snprintf(path, sizeof(path), "%s/params/lr", ml);
    CHECK(strcmp(check_slurp(path), "0.1") == 0);
    CHECK_OK(acc, accel_end_training(acc));
    snprintf(path, sizeof(path), "%s/meta.yaml", ml);
    CHECK(strstr(check_slurp(path), "status: 3\n") != NULL);
    accel_free(acc);

    /* The mlflow tracker's first line (info level) says where the run is and that MLflow 3
     * opens the store only with MLFLOW_ALLOW_FILE_STORE=true. */
    setenv("ACCEL_LOG_LEVEL", "info", 1);
    acc = make(tmpdir, "mlflow");
    capture_begin();
    CHECK_OK(acc, accel_init_trackers(acc, "every", NULL, 0));
    char *err = capture_end();
    CHECK_MSG(strstr(err, "tracker mlflow: started run") != NULL &&
                  strstr(err, "MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri") != NULL,
              "%s", err);
    accel_free(acc);
    setenv("ACCEL_LOG_LEVEL", "warn", 1);
    accel_free(make(tmpdir, NULL)); /* the level is process-wide: back to the default */
    unsetenv("ACCEL_LOG_LEVEL");
}

/* Counts the lines of `text` (each ending in '\n'). */
/*
 * A run interrupted after logging step 9 (its last jsonl record half written) and resumed from
 * a checkpoint taken at step 5, so the resumed run logs from step 6 on: every tracker ends up
 * with each step once, the resumed run's values from step 6. A tracker without a resume
 * callback is named in a warning. Misplaced calls are refused.
 */
static void test_resume(void)
{
    setenv("MLFLOW_TRACKING_URI", "", 1);
    unsetenv("MLFLOW_RUN_ID");
    accel *acc = make(tmpdir, "jsonl");
    CHECK(accel_trackers_resume(acc, 1) == ACCEL_ESTATE); /* before accel_init_trackers */
    CHECK(strstr(accel_last_error(acc), "accel_init_trackers") != NULL);
    CHECK(accel_trackers_resume(acc, -1) == ACCEL_EINVAL);
    accel_free(acc);

    char run[512], ml_first[512], path[1024];
    snprintf(run, sizeof(run), "%s/res", tmpdir);
    for (int pass = 0; pass < 2; pass++) {
        acc = make(tmpdir, "jsonl,csv,mlflow,mem");
        accel_value cfg[] = {ACCEL_SCALAR("lr", 0.1)};
        CHECK_OK(acc, accel_init_trackers(acc, "res", cfg, 1));
        const char *ml = accel_tracker_run_dir(accel_get_tracker(acc, "mlflow"));
        if (pass == 0) {
            snprintf(ml_first, sizeof(ml_first), "%s", ml);
        } else {
            CHECK(strcmp(ml, ml_first) != 0); /* a new run, until resumed */
            capture_begin();
            CHECK_OK(acc, accel_trackers_resume(acc, 6));
            char *err = capture_end();
            CHECK_MSG(strstr(err, "tracker mem cannot resume") != NULL, "%s", err);
            ml = accel_tracker_run_dir(accel_get_tracker(acc, "mlflow"));
            CHECK_MSG(strcmp(ml, ml_first) == 0, "%s vs %s", ml, ml_first); /* the same run */
        }
        for (int step = pass ? 6 : 0; step < (pass ? 12 : 10); step++) {
            accel_value v[] = {ACCEL_SCALAR("loss", 100 * pass + step)};
            CHECK_OK(acc, accel_log(acc, v, 1, step));
        }
        if (pass == 1) {
            CHECK(accel_trackers_resume(acc, 3) == ACCEL_ESTATE); /* after accel_log */
        }
        accel_free(acc);
        if (pass == 0) { /* killed while writing step 10 */
            snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
            FILE *f = fopen(path, "a");
            CHECK(f != NULL);
            fputs("{\"step\": 10, \"ti", f);
            fclose(f);
        }
    }

    /* jsonl and csv: steps 0..11 once each, in order. */
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    char *text = check_slurp(path);
    CHECK_MSG(count_lines(text) == 12, "%s", text);
    int step = 0;
    for (char *l = strtok(text, "\n"); l != NULL; l = strtok(NULL, "\n"), step++) {
        json_error_t jerr;
        json_t *j = json_loads(l, 0, &jerr);
        CHECK_MSG(j != NULL, "%s", l);
        CHECK(json_integer_value(json_object_get(j, "step")) == step);
        CHECK(json_number_value(json_object_get(j, "loss")) == (step < 6 ? step : 100 + step));
        json_decref(j);
    }
    snprintf(path, sizeof(path), "%s/metrics.csv", run);
    text = check_slurp(path);
    CHECK_MSG(count_lines(text) == 13, "%s", text);
    step = 0;
    for (char *l = strtok(text, "\n"); l != NULL; l = strtok(NULL, "\n")) {
        if (step++ == 0) {
            CHECK(strcmp(l, "step,time,loss") == 0);
            continue;
        }
        long long s;
        double t, loss;
        CHECK(sscanf(l, "%lld,%lf,%lf", &s, &t, &loss) == 3 && s == step - 2);
        CHECK(loss == (s < 6 ? s : 100 + s));
    }

    /* mlflow: one run named "res", finished, its history continued. */
    snprintf(path, sizeof(path), "%s/metrics/loss", ml_first);
    text = check_slurp(path);
    CHECK_MSG(count_lines(text) == 12, "%s", text);
    step = 0;
    for (char *l = strtok(text, "\n"); l != NULL; l = strtok(NULL, "\n"), step++) {
        long long ts, s;
        double v;
        CHECK(sscanf(l, "%lld %lf %lld", &ts, &v, &s) == 3 && s == step);
        CHECK(v == (s < 6 ? s : 100 + s));
    }
    snprintf(path, sizeof(path), "%s/meta.yaml", ml_first);
    CHECK(strstr(check_slurp(path), "status: 3\n") != NULL);
    snprintf(path, sizeof(path), "%s/params/lr", ml_first);
    CHECK(strcmp(check_slurp(path), "0.1") == 0);
    char exp_dir[512];
    snprintf(exp_dir, sizeof(exp_dir), "%s", ml_first);
    *strrchr(exp_dir, '/') = '\0';
    DIR *d = opendir(exp_dir);
    CHECK(d != NULL);
    int runs = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        runs += e->d_name[0] != '.' && strcmp(e->d_name, "meta.yaml") != 0;
    }
    closedir(d);
    CHECK_MSG(runs == 1, "%d runs in %s", runs, exp_dir);
}

/* ---- faults: a full disk, odd names ---- */

/* Collects the steps of the "loss" values of an event file. */
typedef struct tb_steps {
    long long steps[64];
    int n;
} tb_steps;

static int visit_loss(void *ctx, const char *file_version, const accel__tf_value *v)
{
    tb_steps *t = ctx;
    if (file_version == NULL && strcmp(v->tag, "loss") == 0 && t->n < 64) {
        t->steps[t->n++] = v->step;
    }
    return 0;
}

/* The steps of the records in `path` (a jsonl, csv or MLflow metric file, or an event file),
 * each record checked whole: a jsonl line parses, a csv row has the header's width, a metric
 * line has its three fields. */
static int read_steps(const char *tracker, const char *path, long long *steps, int max)
{
    if (strcmp(tracker, "tensorboard") == 0) {
        tb_steps t = {.n = 0};
        CHECK_OK(NULL, accel__tfevents_read(path, visit_loss, &t));
        memcpy(steps, t.steps, sizeof(long long) * (size_t)t.n);
        return t.n;
    }
    size_t nbytes;
    char *text = check_read_file(path, &nbytes);
    CHECK_MSG(nbytes > 0 && text[nbytes - 1] == '\n', "%s ends in a partial record", path);
    int n = 0, width = -1;
    for (char *l = strtok(text, "\n"); l != NULL; l = strtok(NULL, "\n")) {
        if (strcmp(tracker, "jsonl") == 0) {
            json_error_t jerr;
            json_t *j = json_loads(l, 0, &jerr);
            CHECK_MSG(j != NULL, "%s: broken record %s", path, l);
            steps[n++] = json_integer_value(json_object_get(j, "step"));
            json_decref(j);
        } else if (strcmp(tracker, "csv") == 0) {
            int w = 1;
            for (const char *c = l; *c; c++) {
                w += *c == ',';
            }
            if (width < 0) { /* the header */
                width = w;
                continue;
            }
            CHECK_MSG(w == width, "%s: row of %d cells under %d columns: %s", path, w, width, l);
            steps[n++] = atoll(l);
        } else {
            long long ts, step;
            double v;
            CHECK_MSG(sscanf(l, "%lld %lf %lld", &ts, &v, &step) == 3, "%s: %s", path, l);
            steps[n++] = step;
        }
        CHECK(n < max);
    }
    free(text);
    return n;
}

/*
 * A disk that fills up in the middle of a record and has room again later: the records logged
 * while it is full are lost, with warnings, and training goes on; the record cut short does
 * not stay in the file, so the records logged once there is room read back whole (before the
 * fix, TensorBoard's reader stopped at the broken record and hid them, and the next jsonl line
 * was glued to the broken one). The csv gains a column while the disk is full: its rewrite
 * fails, leaves no temporary file, and the rows keep the width of the header on disk.
 */
static void check_full_disk(const char *tracker)
{
    setenv("MLFLOW_TRACKING_URI", "", 1);
    unsetenv("MLFLOW_RUN_ID");
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/full_%s", tmpdir, tracker);
    accel *acc = make(dir, tracker);
    CHECK_OK(acc, accel_init_trackers(acc, "run", NULL, 0));
    char run[512], path[1024] = "";
    snprintf(run, sizeof(run), "%s", accel_tracker_run_dir(accel_get_tracker(acc, tracker)));
    char pad[201];
    memset(pad, 'p', 200);
    pad[200] = '\0';
    for (int s = 0; s < 20; s++) {
        accel_value v[] = {ACCEL_SCALAR("loss", s), ACCEL_TEXT("note", pad),
                           ACCEL_SCALAR("extra", 1)};
        int n = (strcmp(tracker, "csv") == 0 && (s == 12 || s >= 17)) ? 3 : 2;
        if (s == 10) {
            long long size = track_record_file_size(run, tracker, path, sizeof(path));
            capture_begin();
            /* The next record stops after 7 bytes. */
            check_file_size_limit(size + 7);
        }
        CHECK_OK(acc, accel_log(acc, v, n, s));
        if (s == 14) {
            check_file_size_limit(0);
            char *err = capture_end();
            CHECK_MSG(strstr(err, "logging step 10 failed") != NULL, "%s", err);
        }
    }
    CHECK_OK(acc, accel_end_training(acc));
    accel_free(acc);
    long long steps[64];
    int n = read_steps(tracker, path, steps, 64);
    int k = 0;
    for (int s = 0; s < 20; s++) {
        if (s < 10 || s >= 15) {
            CHECK_MSG(k < n && steps[k] == s, "%s: record %d has step %lld, not %d", tracker, k,
                      k < n ? steps[k] : -1LL, s);
            k++;
        }
    }
    CHECK_MSG(n == k, "%s: %d records, want %d", tracker, n, k);
    if (strcmp(tracker, "csv") == 0) {
        char *text = check_slurp(path);
        CHECK_MSG(strncmp(text, "step,time,loss,note,extra\n", 26) == 0, "%s", text);
        DIR *d = opendir(run);
        CHECK(d != NULL);
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            CHECK_MSG(strstr(e->d_name, ".tmp") == NULL, "%s/%s left behind", run, e->d_name);
        }
        closedir(d);
    }
}

static void test_full_disk(void)
{
    check_full_disk("jsonl");
    check_full_disk("csv");
    check_full_disk("tensorboard");
    check_full_disk("mlflow");
}

/*
 * Keys and texts that are not UTF-8, or hold newlines, slashes, quotes: the JSON files stay
 * valid JSON (jansson rejects invalid UTF-8), a byte outside UTF-8 becomes the character of
 * its number; MLflow keys that would name a folder ("a/", ".") or a file name too long for the
 * file system still land in files, and one bad value does not cost the others of its call.
 */
static void test_odd_names(void)
{
    setenv("MLFLOW_TRACKING_URI", "", 1);
    unsetenv("MLFLOW_RUN_ID");
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/odd", tmpdir);
    accel *acc = make(dir, "jsonl,mlflow");
    char longk[301];
    memset(longk, 'k', 300);
    longk[300] = '\0';
    accel_value cfg[] = {ACCEL_TEXT("model\xff", "gp\nt\"2\xfe\x01"), ACCEL_SCALAR(longk, 1)};
    CHECK_OK(acc, accel_init_trackers(acc, "run", cfg, 2));
    accel_value v[] = {ACCEL_SCALAR("a/", 1), ACCEL_SCALAR(".", 2), ACCEL_SCALAR("x\xc3", 3),
                       ACCEL_SCALAR("a/./b", 4), ACCEL_TEXT("t\x7f", "\xc2\x85")};
    capture_begin();
    CHECK_OK(acc, accel_log(acc, v, 5, 0));
    char *err = capture_end();
    CHECK_MSG(strstr(err, "failed") == NULL, "%s", err);
    char run[512], ml[512], path[1024];
    snprintf(run, sizeof(run), "%s", accel_tracker_run_dir(accel_get_tracker(acc, "jsonl")));
    snprintf(ml, sizeof(ml), "%s", accel_tracker_run_dir(accel_get_tracker(acc, "mlflow")));
    CHECK_OK(acc, accel_end_training(acc));
    accel_free(acc);

    json_error_t jerr;
    snprintf(path, sizeof(path), "%s/config.json", run);
    json_t *j = json_load_file(path, 0, &jerr);
    CHECK_MSG(j != NULL, "%s: %s", path, jerr.text);
    CHECK(strcmp(json_string_value(json_object_get(j, "model\xc3\xbf")), "gp\nt\"2\xc3\xbe\x01") ==
          0);
    json_decref(j);
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    j = json_loads(check_slurp(path), 0, &jerr);
    CHECK_MSG(j != NULL, "%s: %s", path, jerr.text);
    CHECK(json_number_value(json_object_get(j, "x\xc3\x83")) == 3);
    CHECK(strcmp(json_string_value(json_object_get(j, "t\x7f")), "\xc2\x85") == 0);
    json_decref(j);

    const char *files[] = {"metrics/a_", "metrics/_", "metrics/x_", "metrics/a/_/b", "tags/t_"};
    for (int i = 0; i < 5; i++) {
        struct stat sb;
        snprintf(path, sizeof(path), "%s/%s", ml, files[i]);
        CHECK_MSG(stat(path, &sb) == 0 && S_ISREG(sb.st_mode), "%s is missing", path);
    }
    snprintf(path, sizeof(path), "%s/params/%.200s", ml, longk);
    CHECK_MSG(strcmp(check_slurp(path), "1") == 0, "%s", path);
}

int main(void)
{
    CHECK(mkdtemp(tmpdir) != NULL);
    register_mem();
    test_user_tracker();
    test_bad_input();
    test_jsonl_csv();
    test_two_jobs();
    test_two_jobs_mlflow();
    test_csv_empty_first();
    test_all();
    test_resume();
    test_full_disk();
    test_odd_names();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    CHECK(system(cmd) == 0);
    printf("test_track: ok\n");
    return 0;
}
