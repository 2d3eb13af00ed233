/* Config file: locations, Accelerate's keys, precedence (argument > env > config > default),
 * each key policy (used, accepted, ignored with a warning naming it, refused), and every kind
 * of bad file rejected with a message naming the file and key. Files as each Accelerate
 * version writes them: test_config_versions.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char dir[256];

/* stderr (the library's warnings) is captured into this file. */
static check_capture captured;
static char err_path[300];

/* Returns the path; each call gets its own slot so earlier paths stay valid. */
static const char *write_file(const char *name, const char *text)
{
    static char paths[64][512];
    static int n_paths;
    CHECK(n_paths < 64);
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
    unsetenv("ACCEL_LOG_LEVEL");
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("CUDA_VISIBLE_DEVICES");
    snprintf(dir, sizeof(dir), "/tmp/accel-test-config-%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(err_path, sizeof(err_path), "%s/stderr.txt", dir);

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

    /* Keys accel does not act on: a warning naming each one whose value asks for something
     * (neutral values such as false, 'no', {} and [] stay silent), never a failure. */
    static const char *const ignored[][2] = {
        {"num_gpus: 3\n", "line 2: ignoring unknown key \"num_gpus\""},
        {"deepspeed_config:\n  zero_stage: 2\n", "ignoring deepspeed_config: {zero_stage: 2} (used "
                                               "with distributed_type DEEPSPEED only)"},
        {"ipex_config:\n  ipex: true\n", "ipex_config: {ipex: true}"},
        {"dynamo_config:\n  dynamo_backend: INDUCTOR\n",
         "dynamo_config: {dynamo_backend: INDUCTOR}"},
        {"dynamo_backend: INDUCTOR\n", "dynamo_backend: INDUCTOR"},
        {"fp8_config:\n  backend: TE\n", "fp8_config"},
        {"fsdp_config:\n  fsdp_version: 2\n", "fsdp_config"},
        {"megatron_lm_config:\n  megatron_lm_tp_degree: 2\n", "megatron_lm_config"},
#ifdef ACCEL_HAVE_CUDA /* a program started directly: accel launch would apply it */
        {"gpu_ids: 0,1\n", "gpu_ids 0,1 is applied by accel launch (CUDA_VISIBLE_DEVICES)"},
#else
        {"gpu_ids: 0,1\n", "ignoring gpu_ids: 0,1 (this build of accel has no CUDA"},
#endif
        {"downcast_bf16: 'yes'\n", "downcast_bf16: yes"},
        {"tpu_name: pod\n", "tpu_name: pod"},
        {"tpu_env:\n- A=1\n", "tpu_env: [A=1]"},
        {"commands:\n- ls\n", "commands"},
    };
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
        char name[32], text[512];
        snprintf(name, sizeof(name), "ignored%zu.yaml", i);
        snprintf(text, sizeof(text), "distributed_type: MULTI_CPU\n%s", ignored[i][0]);
        const char *path = write_file(name, text);
        check_capture_begin(&captured, err_path);
        accel *a = init_with(path, ACCEL_OK, NULL);
        char *err = check_capture_end(&captured);
        CHECK_MSG(strstr(err, "WARN") && strstr(err, path) && strstr(err, ignored[i][1]), "%s: %s",
                  text, err);
        accel_free(a);
    }
    check_capture_begin(&captured, err_path);
    accel_free(init_with(write_file("quiet.yaml",
                                    "distributed_type: MULTI_CPU\nipex_config:\n  ipex: false\n"
                                    "dynamo_config: {}\ndeepspeed_config: {}\ntpu_env: []\n"
                                    "downcast_bf16: 'no'\nenable_cpu_affinity: false\n"
                                    "gpu_ids: all\nmain_process_ip: 10.0.0.1\n"
                                    "rdzv_backend: c10d\nsame_network: false\n"
                                    "main_training_function: train\nnum_machines: 1\n"
                                    "machine_rank: 0\nnum_processes: 1\n"),
                         ACCEL_OK, NULL));
    char *quiet = check_capture_end(&captured);
    CHECK_MSG(quiet[0] == '\0', "%s", quiet);

    /* ZeRO stage 0 under DEEPSPEED / FSDP is DDP; DEEPSPEED's accumulation is the env's
     * default (argument > env > file > 1). */
    const char *ds = write_file("ds.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                           "  zero_stage: 0\n  gradient_accumulation_steps: 4\n"
                                           "  offload_optimizer_device: none\n"
                                           "  zero3_init_flag: false\n");
    check_capture_begin(&captured, err_path);
    acc = init_with(ds, ACCEL_OK, NULL);
    CHECK(accel_gradient_accumulation_steps(acc) == 4);
    CHECK(accel_resolved_options(acc)->zero_stage == 0);
    accel_free(acc);
    setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3", 1);
    acc = init_with(ds, ACCEL_OK, NULL);
    CHECK(accel_gradient_accumulation_steps(acc) == 3);
    accel_free(acc);
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    setenv("ACCEL_ZERO_STAGE", "0", 1); /* the env wins over the file's stage */
    accel_free(init_with(write_file("ds2.yaml", "distributed_type: DEEPSPEED\n"), ACCEL_OK, NULL));
    unsetenv("ACCEL_ZERO_STAGE");
    accel_free(init_with(write_file("fsdp0.yaml", "distributed_type: FSDP\nfsdp_config:\n"
                                                  "  fsdp_sharding_strategy: NO_SHARD\n"
                                                  "  fsdp_state_dict_type: FULL_STATE_DICT\n"),
                         ACCEL_OK, NULL));
    /* HYBRID_SHARD: stage 3, sharded inside each machine; ACCEL_ZERO_SHARD_SIZE wins. */
    const char *hy = write_file("fsdph.yaml", "distributed_type: FSDP\nfsdp_config:\n"
                                              "  fsdp_sharding_strategy: HYBRID_SHARD\n");
    acc = init_with(hy, ACCEL_OK, NULL);
    CHECK(accel_resolved_options(acc)->zero_stage == 3);
    CHECK(accel_resolved_options(acc)->zero_shard_size == ACCEL_SHARD_MACHINE);
    accel_free(acc);
    setenv("ACCEL_ZERO_SHARD_SIZE", "0", 1);
    acc = init_with(hy, ACCEL_OK, NULL);
    CHECK(accel_resolved_options(acc)->zero_shard_size == 0);
    accel_free(acc);
    setenv("ACCEL_ZERO_SHARD_SIZE", "two", 1);
    accel_free(init_with(hy, ACCEL_EINVAL, "ACCEL_ZERO_SHARD_SIZE=\"two\""));
    setenv("ACCEL_ZERO_SHARD_SIZE", "2", 1); /* a group larger than the one process */
    accel_free(init_with(hy, ACCEL_EINVAL, "zero_shard_size=2 does not divide the 1 processes"));
    unsetenv("ACCEL_ZERO_SHARD_SIZE");
    char *quiet_ds = check_capture_end(&captured);
    CHECK_MSG(quiet_ds[0] == '\0', "%s", quiet_ds);

    /* Launcher keys in a program started directly: one process, and a warning saying how to
     * start the rest (accel launch reads the file); under a launcher, silence. */
    const char *machines = write_file("machines.yaml", "distributed_type: MULTI_CPU\n"
                                                       "num_machines: 2\nmachine_rank: 1\n"
                                                       "num_processes: 4\n"
                                                       "main_process_ip: 10.1.2.3\n"
                                                       "mpirun_config:\n  mpirun_hostfile: /h\n");
    check_capture_begin(&captured, err_path);
    accel_free(init_with(machines, ACCEL_OK, NULL));
    char *err = check_capture_end(&captured);
    CHECK_MSG(strstr(err, "asks for 4 processes on 2 machines, but this program was started "
                          "directly") &&
                  strstr(err, "accel launch"),
              "%s", err);
    setenv("LOCAL_RANK", "0", 1);
    check_capture_begin(&captured, err_path);
    accel_free(init_with(write_file("machines2.yaml", "distributed_type: MULTI_CPU\n"
                                                      "num_processes: 4\n"),
                         ACCEL_OK, NULL));
    err = check_capture_end(&captured);
    CHECK_MSG(err[0] == '\0', "%s", err);
    unsetenv("LOCAL_RANK");

    /* accel launch printed the notes of the file it passes on: accel_init does not repeat
     * them (another file's notes are printed). */
    const char *noted = write_file("noted.yaml", "distributed_type: NO\nfuture: 1\n");
    setenv("ACCEL_CONFIG_CHECKED", noted, 1);
    check_capture_begin(&captured, err_path);
    accel_free(init_with(noted, ACCEL_OK, NULL));
    err = check_capture_end(&captured);
    CHECK_MSG(err[0] == '\0', "%s", err);
    check_capture_begin(&captured, err_path);
    accel_free(init_with(write_file("noted2.yaml", "distributed_type: NO\nfuture2: 1\n"),
                         ACCEL_OK, NULL));
    err = check_capture_end(&captured);
    CHECK_MSG(strstr(err, "future2"), "%s", err);
    unsetenv("ACCEL_CONFIG_CHECKED");

    /* What accel cannot do is refused, naming the file, the key and the value. */
    static const char *const refused[][2] = {
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n",
         "line 3: deepspeed_config.deepspeed_config_file: ds.json is not supported"},
        {"distributed_type: MEGATRON_LM\n", "distributed_type: MEGATRON_LM"},
        {"distributed_type: XLA\n", "distributed_type: XLA"},
        {"distributed_type: MULTI_NPU\n", "distributed_type: MULTI_NPU"},
        {"compute_environment: AMAZON_SAGEMAKER\ndistributed_type: NO\n", "AMAZON_SAGEMAKER"},
        {"distributed_type: MULTI_CPU\nparallelism_config:\n  parallelism_config_tp_size: 2\n",
         "parallelism_config: {parallelism_config_tp_size: 2}"},
        {"distributed_type: MULTI_CPU\ntp_config:\n  tp_size: 2\n", "tp_config"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "refused%zu.yaml", i);
        const char *path = write_file(name, refused[i][0]);
        init_with(path, ACCEL_EUNSUPPORTED, refused[i][1]);
        CHECK_MSG(strstr(accel_last_error(NULL), path) != NULL, "%s", accel_last_error(NULL));
    }

    /* ZeRO stages come from the DEEPSPEED / FSDP sections (DeepSpeed's default stage 2,
     * FSDP's FULL_SHARD = 3, FSDP2's reshard_after_forward false = SHARD_GRAD_OP = 2). */
    static const struct {
        const char *yaml;
        int stage;
    } stages[] = {
        {"distributed_type: DEEPSPEED\n", 2},
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 1\n", 1},
        {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n", 3},
        {"distributed_type: FSDP\n", 3},
        {"distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
         "  fsdp_reshard_after_forward: false\n",
         2},
    };
    for (size_t i = 0; i < sizeof(stages) / sizeof(stages[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "stage%zu.yaml", i);
        accel *zacc = init_with(write_file(name, stages[i].yaml), ACCEL_OK, NULL);
        CHECK_MSG(accel_resolved_options(zacc)->zero_stage == stages[i].stage, "%s",
                  stages[i].yaml);
        accel_free(zacc);
    }

    /* Bad values of the keys accel uses, and bad files: errors naming the file and culprit. */
    init_with(write_file("badtype.yaml", "distributed_type: MULTI_CPUS\n"), ACCEL_EINVAL,
              "distributed_type: \"MULTI_CPUS\"");
    init_with(write_file("badenv.yaml", "compute_environment: MOON\ndistributed_type: NO\n"),
              ACCEL_EINVAL, "compute_environment: \"MOON\"");
    init_with(write_file("badmachines.yaml", "distributed_type: NO\nnum_machines: two\n"),
              ACCEL_EINVAL, "num_machines: \"two\"");
    init_with(write_file("mpmap.yaml", "distributed_type: NO\nmixed_precision: {a: b}\n"),
              ACCEL_EINVAL, "mixed_precision: \"{a: b}\"");
    init_with(write_file("alias.yaml", "distributed_type: &x NO\nmixed_precision: *x\n"),
              ACCEL_EINVAL, "aliases");

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

    init_with(write_file("missing.yaml", "mixed_precision: bf16\n"), ACCEL_EINVAL,
              "distributed_type is required");
    init_with(write_file("badmp.yaml", "distributed_type: NO\nmixed_precision: fp12\n"),
              ACCEL_EINVAL, "mixed_precision: \"fp12\"");
    init_with(write_file("badint.yaml", "distributed_type: NO\nnum_processes: many\n"),
              ACCEL_EINVAL, "num_processes: \"many\"");
    init_with(write_file("badbool.yaml", "distributed_type: NO\nuse_cpu: perhaps\n"), ACCEL_EINVAL,
              "use_cpu");
    init_with(write_file("syntax.yaml", "distributed_type: NO\nuse_cpu: [true\n"), ACCEL_EINVAL,
              "YAML error at line ");
    init_with(write_file("list.yaml", "- a\n- b\n"), ACCEL_EINVAL, "mapping");
    /* A second document used to be dropped silently (its keys lost). */
    init_with(write_file("twodocs.yaml", "distributed_type: NO\n---\nmixed_precision: fp16\n"),
              ACCEL_EINVAL, "line 2: a second YAML document");
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
