/*
 * Resolved settings: accel_init records the value and the source of every setting, one test
 * per kind of source (argument, env NAME, config file PATH:KEY (line N), accel launch's account
 * in ACCEL_LAUNCH_SOURCES, default), precedence between them, the table printed on stderr in
 * debug mode, and values read once at init (a later setenv changes nothing).
 */
#include <fcntl.h>
#include <sys/stat.h>

#include "check.h"

static char dir[256];

static void write_file(const char *name, const char *text, char *path, size_t nbytes)
{
    snprintf(path, nbytes, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void want(const accel *acc, const char *name, const char *value, const char *source)
{
    const char *v = accel_setting_value(acc, name), *s = accel_setting_source(acc, name);
    CHECK_MSG(v != NULL && s != NULL, "no setting %s", name);
    CHECK_MSG(strcmp(v, value) == 0, "%s = \"%s\", expected \"%s\"", name, v, value);
    CHECK_MSG(strcmp(s, source) == 0, "%s: source \"%s\", expected \"%s\"", name, s, source);
}

/* The process's stderr while fn runs, into buf. */
static void capture_stderr(void (*fn)(void), char *buf, size_t nbytes)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/stderr", dir);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    fn();
    fflush(stderr);
    CHECK(dup2(saved, 2) == 2);
    close(saved);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t n = fread(buf, 1, nbytes - 1, f);
    buf[n] = '\0';
    fclose(f);
}

static void init_debug(void)
{
    accel_options o = accel_options_default();
    o.debug = 1;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_free(acc);
}

int main(void)
{
    static const char *const vars[] = {"ACCELERATE_CONFIG_FILE",
                                       "ACCELERATE_MIXED_PRECISION",
                                       "ACCELERATE_USE_CPU",
                                       "ACCELERATE_DEBUG_MODE",
                                       "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                                       "ACCEL_ZERO_STAGE",
                                       "ACCEL_TIMEOUT",
                                       "ACCEL_LAUNCH_SOURCES",
                                       "ACCELERATE_LOG_LEVEL",
                                       "ACCEL_LOG_LEVEL",
                                       "MLFLOW_RUN_ID",
                                       "ACCEL_BACKEND",
                                       "RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "MASTER_PORT",
                                       "ACCEL_SHM_SPIN_US"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        unsetenv(vars[i]);
    }
    snprintf(dir, sizeof(dir), "/tmp/accel-test-settings-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    char hf[300];
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    setenv("HF_HOME", hf, 1); /* no default config file of the machine's user */

    /* Defaults, and the argument. */
    accel *acc;
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = 4;
    o.project_dir = "runs";
    CHECK_OK(NULL, accel_init(&acc, &o));
    want(acc, "gradient_accumulation_steps", "4", "argument");
    want(acc, "project_dir", "runs", "argument");
    want(acc, "logging_dir", "runs", "default (project_dir)");
    want(acc, "mixed_precision", "no", "default");
    want(acc, "timeout_s", "1800", "default");
    want(acc, "backend", "self", "default (from the process layout)");
    want(acc, "num_processes", "1", "default (not launched)");
    want(acc, "logger_level", "info", "default");
    CHECK(accel_setting_source(acc, "no_such_setting") == NULL);
    CHECK(accel_setting_source(NULL, "debug") == NULL);
    CHECK(strstr(accel_settings_summary(acc), "  gradient_accumulation_steps") != NULL);
    /* Read once: the environment after accel_init changes nothing. */
    setenv("ACCELERATE_LOG_LEVEL", "error", 1);
    want(acc, "logger_level", "info", "default");
    unsetenv("ACCELERATE_LOG_LEVEL");
    accel_free(acc);

    /* The config file: each value names the file, the key and its line. */
    char cfg[300];
    write_file("cfg.yaml",
               "compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: fp16\n"
               "use_cpu: true\ndebug: false\n",
               cfg, sizeof(cfg));
    setenv("ACCELERATE_CONFIG_FILE", cfg, 1);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    char src[600];
    snprintf(src, sizeof(src), "config file %s:mixed_precision (line 3)", cfg);
    want(acc, "mixed_precision", "fp16", src);
    snprintf(src, sizeof(src), "config file %s:use_cpu (line 4)", cfg);
    want(acc, "cpu", "1", src);
    snprintf(src, sizeof(src), "config file %s:debug (line 5)", cfg);
    want(acc, "debug", "0", src);
    want(acc, "config_file", cfg, "env ACCELERATE_CONFIG_FILE");
    accel_free(acc);

    /* The environment wins over the file; the argument wins over both. */
    setenv("ACCELERATE_MIXED_PRECISION", "bf16", 1);
    setenv("ACCEL_TIMEOUT", "60", 1);
    setenv("ACCEL_SHM_SPIN_US", "7", 1); /* read by a backend: listed as it is */
    o = accel_options_default();
    o.config_file = cfg;
    o.timeout_s = 30;
    CHECK_OK(NULL, accel_init(&acc, &o));
    want(acc, "mixed_precision", "bf16", "env ACCELERATE_MIXED_PRECISION");
    want(acc, "timeout_s", "30", "argument");
    want(acc, "config_file", cfg, "argument");
    want(acc, "bucket_cap_mb", "25", "default");
    want(acc, "ACCEL_SHM_SPIN_US", "7", "env ACCEL_SHM_SPIN_US");
    accel_free(acc);
    unsetenv("ACCEL_TIMEOUT");
    unsetenv("ACCEL_SHM_SPIN_US");
    unsetenv("ACCELERATE_CONFIG_FILE");

    /* Reals are shown exactly ("%g" would show 25.0000001 as 25), and no longer than "%g"
     * where six digits are exact. */
    o = accel_options_default();
    o.bucket_cap_mb = 25.0000001;
    o.first_bucket_mb = 0.1;
    o.timeout_s = 1e300;
    CHECK_OK(NULL, accel_init(&acc, &o));
    want(acc, "bucket_cap_mb", "25.0000001", "argument");
    want(acc, "first_bucket_mb", "0.1", "argument");
    want(acc, "timeout_s", "1e+300", "argument");
    accel_free(acc);

    /* What accel launch set names the launcher's own source. */
    setenv("ACCEL_LAUNCH_SOURCES",
           "ACCELERATE_MIXED_PRECISION\taccel launch: --mixed_precision bf16\n"
           "ACCELERATE_DEBUG_MODE\taccel launch: --debug\n",
           1);
    setenv("ACCELERATE_DEBUG_MODE", "true", 1);
    setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "2", 1);
    setenv("MLFLOW_RUN_ID", "abc", 1);
    o = accel_options_default();
    o.debug = 0; /* the argument still wins: no table printed */
    CHECK_OK(NULL, accel_init(&acc, &o));
    want(acc, "mixed_precision", "bf16",
         "accel launch: --mixed_precision bf16 (env ACCELERATE_MIXED_PRECISION)");
    want(acc, "gradient_accumulation_steps", "2", "env ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    want(acc, "debug", "0", "argument");
    want(acc, "MLFLOW_RUN_ID", "abc", "env MLFLOW_RUN_ID");
    accel_free(acc);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    want(acc, "debug", "1", "accel launch: --debug (env ACCELERATE_DEBUG_MODE)");
    accel_free(acc);
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        unsetenv(vars[i]);
    }

    /* Debug mode prints the table once, on stderr, with every source. */
    static char err[32768];
    setenv("ACCELERATE_MIXED_PRECISION", "fp16", 1);
    capture_stderr(init_debug, err, sizeof(err));
    CHECK_MSG(strstr(err, "accel: resolved configuration") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "  debug ") != NULL && strstr(err, "= 1  [argument]") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "= fp16  [env ACCELERATE_MIXED_PRECISION]") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "= 1800  [default]") != NULL, "%s", err);
    unsetenv("ACCELERATE_MIXED_PRECISION");
    capture_stderr(init_debug, err, sizeof(err));
    CHECK_MSG(strstr(err, "ACCELERATE_MIXED_PRECISION") == NULL, "%s", err);

    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    printf("test_settings: ok\n");
    return 0;
}
