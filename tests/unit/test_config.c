/* Config file: locations, Accelerate's keys, precedence (argument > env > config > default),
 * and every kind of bad file rejected with a message naming the file and key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char dir[256];

/* Returns the path; each call gets its own slot so earlier paths stay valid. */
static const char *write_file(const char *name, const char *text)
{
    static char paths[32][512];
    static int n_paths;
    CHECK(n_paths < 32);
    char *path = paths[n_paths++];
    snprintf(path, 512, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

static accel *init_with(const char *config_path, accel_status want, const char *needle)
{
    accel_options o = accel_options_default();
    o.config_file = config_path;
    accel *acc = NULL;
    accel_status st = accel_init(&acc, &o);
    CHECK_MSG(st == want, "%s: got %s (%s)", config_path, accel_status_name(st),
              accel_last_error(NULL));
    if (needle != NULL) {
        CHECK_MSG(strstr(accel_last_error(NULL), needle) != NULL, "\"%s\" lacks \"%s\"",
                  accel_last_error(NULL), needle);
    }
    return acc;
}

int main(void)
{
    unsetenv("ACCELERATE_MIXED_PRECISION");
    unsetenv("ACCELERATE_USE_CPU");
    unsetenv("ACCELERATE_CONFIG_FILE");
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    snprintf(dir, sizeof(dir), "/tmp/accel-test-config-%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);

    /* Accelerate's own example file. */
    const char *good = write_file("good.yaml", "compute_environment: LOCAL_MACHINE\n"
                                               "distributed_type: MULTI_CPU\n"
                                               "mixed_precision: bf16\n"
                                               "num_machines: 1\nnum_processes: 2\n"
                                               "gpu_ids: all\nmachine_rank: 0\n"
                                               "rdzv_backend: static\nsame_network: true\n"
                                               "main_training_function: main\n"
                                               "use_cpu: true\n"
                                               "fsdp_config: {}\n"
                                               "dynamo_config:\n  dynamo_backend: 'NO'\n"
                                               "tpu_env: []\n");
    accel *acc = init_with(good, ACCEL_OK, NULL);
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_BF16);
    CHECK(accel_resolved_options(acc)->cpu == 1);
    accel_free(acc);

    /* env beats the file; the argument beats both. */
    setenv("ACCELERATE_MIXED_PRECISION", "fp16", 1);
    acc = init_with(good, ACCEL_OK, NULL);
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_FP16);
    accel_free(acc);
    accel_options o = accel_options_default();
    o.config_file = good;
    o.mixed_precision = ACCEL_PRECISION_NO;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_NO);
    accel_free(acc);
    unsetenv("ACCELERATE_MIXED_PRECISION");

    /* JSON content (what `accelerate config default` writes) and the legacy fp16 key. */
    const char *json =
        write_file("default.json", "{\"compute_environment\": \"LOCAL_MACHINE\", \"debug\": false, "
                                   "\"distributed_type\": \"NO\", \"fp16\": true, "
                                   "\"num_processes\": 1, \"use_cpu\": false}\n");
    acc = init_with(json, ACCEL_OK, NULL);
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_FP16);
    accel_free(acc);

    /* The default location under HF_HOME, and ACCELERATE_CONFIG_FILE. */
    char hf[512];
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    CHECK(mkdir(hf, 0700) == 0);
    char acc_dir[600];
    snprintf(acc_dir, sizeof(acc_dir), "%s/accelerate", hf);
    CHECK(mkdir(acc_dir, 0700) == 0);
    setenv("HF_HOME", hf, 1);
    CHECK_OK(NULL, accel_init(&acc, NULL)); /* no file there yet: defaults */
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_NO);
    accel_free(acc);
    write_file("hf/accelerate/default_config.yaml",
               "distributed_type: NO\nmixed_precision: bf16\n");
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_BF16);
    accel_free(acc);
    setenv("ACCELERATE_CONFIG_FILE", json, 1);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_FP16);
    accel_free(acc);
    unsetenv("ACCELERATE_CONFIG_FILE");
    setenv("HF_HOME", "/nonexistent/accel-test", 1);

    /* Not files: a folder or a FIFO given as the config file (a FIFO used to block). */
    char fifo[300], want[400];
    snprintf(fifo, sizeof fifo, "%s/pipe.yaml", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    alarm(20);
    snprintf(want, sizeof want, "config file %s is a directory, not a YAML file", dir);
    init_with(dir, ACCEL_EINVAL, want);
    snprintf(want, sizeof want, "config file %s is a FIFO, not a YAML file", fifo);
    init_with(fifo, ACCEL_EINVAL, want);
    alarm(0);

    /* Bad files: each names the file and the culprit. */
    init_with(write_file("unknown.yaml", "distributed_type: NO\nnum_gpus: 3\n"), ACCEL_EINVAL,
              "unknown key \"num_gpus\"");
    init_with(write_file("missing.yaml", "mixed_precision: bf16\n"), ACCEL_EINVAL,
              "distributed_type is required");
    init_with(write_file("badmp.yaml", "distributed_type: NO\nmixed_precision: fp12\n"),
              ACCEL_EINVAL, "mixed_precision: \"fp12\"");
    init_with(write_file("badint.yaml", "distributed_type: NO\nnum_processes: many\n"),
              ACCEL_EINVAL, "num_processes: \"many\"");
    init_with(write_file("badbool.yaml", "distributed_type: NO\nuse_cpu: perhaps\n"), ACCEL_EINVAL,
              "use_cpu");
    init_with(write_file("syntax.yaml", "distributed_type: [NO\n"), ACCEL_EINVAL, "YAML error");
    init_with(write_file("list.yaml", "- a\n- b\n"), ACCEL_EINVAL, "mapping");
    init_with(write_file("fsdp.yaml", "distributed_type: FSDP\n"), ACCEL_EUNSUPPORTED, "FSDP");
    init_with(
        write_file("sm.yaml", "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: NO\n"),
        ACCEL_EUNSUPPORTED, "AMAZON_SAGEMAKER");
    char nothere[600];
    snprintf(nothere, sizeof(nothere), "%s/nothere.yaml", dir);
    init_with(nothere, ACCEL_ENOTFOUND, "nothere.yaml");

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("test_config: ok\n");
    return 0;
}
