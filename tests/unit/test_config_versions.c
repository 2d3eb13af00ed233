/*
 * Config files as `accelerate config` writes them, from Accelerate 0.18 to 1.14, for a CPU, a
 * multi-CPU, a GPU and a multi-GPU machine, plus `accelerate config default` JSON: accel_init
 * takes each setup (a stock file logs no warning, apart from a num_processes this one-process
 * test does not have, and MULTI_GPU's note saying which device the build uses), and a file at
 * the default location no program asked for never stops accel_init for the keys
 * accel does not use (Accelerate 0.19 to 1.12 write ipex_config for CPU setups).
 *
 * What each version writes was read in huggingface/accelerate's commands/config/cluster.py
 * and config_args.py: yaml.safe_dump (keys sorted) of the ClusterConfig fields that are not
 * None and not an empty dict. The files are generated below from those rules.
 */
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

static const char *write_file(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

/* The fields each version adds to a setup's file (others are in every version). */
typedef struct version {
    const char *name;
    const char *ipex_key; /* CPU setups: ipex_config's key, 0.19 ipex_enabled, 0.20-1.12 ipex */
    int debug;            /* 0.22+: debug */
    int cpu_affinity;     /* 0.29+: enable_cpu_affinity */
} version;

static const version versions[] = {
    {"0.18", NULL, 0, 0},   {"0.19", "ipex_enabled", 0, 0}, {"0.20", "ipex", 0, 0},
    {"0.22", "ipex", 1, 0}, {"0.28", "ipex", 1, 0},         {"0.29", "ipex", 1, 1},
    {"0.34", "ipex", 1, 1}, {"1.0", "ipex", 1, 1},          {"1.4", "ipex", 1, 1},
    {"1.10", "ipex", 1, 1}, {"1.12", "ipex", 1, 1},         {"1.13", NULL, 1, 1},
    {"1.14", NULL, 1, 1},
};

enum { CPU, MULTI_CPU, GPU, MULTI_GPU, N_SETUPS };
static const char *const setup_names[] = {"cpu", "multi_cpu", "gpu", "multi_gpu"};

static int cmp_lines(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The YAML `accelerate config` of version v writes for the setup, default answers otherwise
 * (no dynamo, no DeepSpeed/FSDP/Megatron, no mpirun, IPEX no). */
static void yaml_for(const version *v, int setup, char *out, size_t cap)
{
    const char *lines[32];
    int n = 0;
    int cpu = setup == CPU || setup == MULTI_CPU;
    lines[n++] = "compute_environment: LOCAL_MACHINE";
    lines[n++] = setup == CPU || setup == GPU ? "distributed_type: 'NO'"
                 : setup == MULTI_CPU         ? "distributed_type: MULTI_CPU"
                                              : "distributed_type: MULTI_GPU";
    lines[n++] = "downcast_bf16: 'no'";
    lines[n++] = "machine_rank: 0";
    lines[n++] = "main_training_function: main";
    lines[n++] = setup == CPU         ? "mixed_precision: 'no'"
                 : setup == MULTI_CPU ? "mixed_precision: bf16"
                                      : "mixed_precision: fp16";
    lines[n++] = "num_machines: 1";
    lines[n++] = setup == CPU || setup == GPU ? "num_processes: 1" : "num_processes: 2";
    lines[n++] = "rdzv_backend: static";
    lines[n++] = "same_network: true";
    lines[n++] = "tpu_env: []";
    lines[n++] = "tpu_use_cluster: false";
    lines[n++] = "tpu_use_sudo: false";
    lines[n++] = cpu ? "use_cpu: true" : "use_cpu: false";
    if (!cpu) {
        lines[n++] = "gpu_ids: all";
    }
    if (v->debug) {
        lines[n++] = "debug: false";
    }
    if (v->cpu_affinity) {
        lines[n++] = "enable_cpu_affinity: false";
    }
    char ipex[64];
    if (cpu && v->ipex_key != NULL) {
        snprintf(ipex, sizeof(ipex), "ipex_config:\n  %s: false", v->ipex_key);
        lines[n++] = ipex;
    }
    qsort(lines, (size_t)n, sizeof(lines[0]), cmp_lines);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(out + k, cap - k, "%s\n", lines[i]);
    }
    CHECK(k < cap);
}

/* accel_init with the file; returns the status, the captured stderr in *err. */
static accel_status init_with(const char *path, accel **acc, char **err)
{
    accel_options o = accel_options_default();
    o.config_file = path;
    check_capture_begin(&captured, err_path);
    accel_status st = accel_init(acc, &o);
    *err = check_capture_end(&captured);
    return st;
}

static void test_versions(void)
{
    for (size_t vi = 0; vi < sizeof(versions) / sizeof(versions[0]); vi++) {
        const version *v = &versions[vi];
        for (int setup = 0; setup < N_SETUPS; setup++) {
            char text[2048], name[64];
            yaml_for(v, setup, text, sizeof(text));
            snprintf(name, sizeof(name), "accelerate-%s-%s.yaml", v->name, setup_names[setup]);
            const char *path = write_file(name, text);
            accel *acc = NULL;
            char *err;
            accel_status st = init_with(path, &acc, &err);
            CHECK_MSG(st == ACCEL_OK, "%s:\n%s\n%s", name, text, accel_last_error(NULL));
            if (setup == MULTI_CPU || setup == MULTI_GPU) {
                /* The one note: this test runs one process, not two... */
                CHECK_MSG(strstr(err, "asks for 2 processes, but this program was started "
                                      "directly") != NULL,
                          "%s: %s", name, err);
#ifdef ACCEL_HAVE_CUDA /* ...and GPUs run: each process takes its GPU, or the CPU */
                CHECK_MSG(strchr(err, '\n') == strrchr(err, '\n'), "%s: %s", name, err);
#else /* ...and GPUs run on the CPU in a build without CUDA, a note says so */
                CHECK_MSG(setup == MULTI_CPU ||
                              (strstr(err, path) && strstr(err, "distributed_type: MULTI_GPU") &&
                               strstr(err, "has no CUDA (configure with -DACCEL_CUDA=ON), it "
                                           "runs on the CPU")),
                          "%s: %s", name, err);
                CHECK_MSG(setup == MULTI_GPU || strchr(err, '\n') == strrchr(err, '\n'),
                          "%s: %s", name, err);
#endif
            } else {
                CHECK_MSG(err[0] == '\0', "%s: unexpected warnings:\n%s", name, err);
            }
            accel_precision want = setup == CPU         ? ACCEL_PRECISION_NO
                                   : setup == MULTI_CPU ? ACCEL_PRECISION_BF16
                                                        : ACCEL_PRECISION_FP16;
            CHECK_MSG(accel_mixed_precision(acc) == want, "%s", name);
            CHECK(accel_resolved_options(acc)->cpu == (setup == CPU || setup == MULTI_CPU));
            accel_free(acc);
        }
    }
}

/* `accelerate config default` on a CPU machine (write_basic_config: JSON, indent 2, sorted). */
static void test_default_json(void)
{
    const char *path =
        write_file("default-1.12.json", "{\n"
                                        "  \"compute_environment\": \"LOCAL_MACHINE\",\n"
                                        "  \"debug\": false,\n"
                                        "  \"distributed_type\": \"NO\",\n"
                                        "  \"downcast_bf16\": false,\n"
                                        "  \"enable_cpu_affinity\": false,\n"
                                        "  \"machine_rank\": 0,\n"
                                        "  \"main_training_function\": \"main\",\n"
                                        "  \"mixed_precision\": \"bf16\",\n"
                                        "  \"num_machines\": 1,\n"
                                        "  \"num_processes\": 1,\n"
                                        "  \"rdzv_backend\": \"static\",\n"
                                        "  \"same_network\": false,\n"
                                        "  \"tpu_use_cluster\": false,\n"
                                        "  \"tpu_use_sudo\": false,\n"
                                        "  \"use_cpu\": true\n"
                                        "}\n");
    accel *acc;
    char *err;
    CHECK_OK(NULL, init_with(path, &acc, &err));
    CHECK_MSG(err[0] == '\0', "%s", err);
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_BF16);
    accel_free(acc);
}

/*
 * The reported failure: a 1.12 CPU config with IPEX turned on, at the default location, read by
 * a program that never asked for a config. accel_init succeeds with one warning naming the
 * key, printed once however often the process initialises.
 */
static void test_default_location(void)
{
    char hf[300], sub[400];
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    snprintf(sub, sizeof(sub), "%s/accelerate", hf);
    CHECK(mkdir(hf, 0700) == 0 && mkdir(sub, 0700) == 0);
    write_file("hf/accelerate/default_config.yaml",
               "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: 'NO'\n"
               "downcast_bf16: 'no'\nenable_cpu_affinity: false\nipex_config:\n  ipex: true\n"
               "machine_rank: 0\nmain_training_function: main\nmixed_precision: 'no'\n"
               "num_machines: 1\nnum_processes: 1\nrdzv_backend: static\nsame_network: true\n"
               "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: true\n");
    setenv("HF_HOME", hf, 1);
    for (int i = 0; i < 2; i++) {
        accel *acc;
        check_capture_begin(&captured, err_path);
        accel_status st = accel_init(&acc, NULL);
        char *err = check_capture_end(&captured);
        CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error(NULL));
        if (i == 0) {
            CHECK_MSG(strstr(err, "WARN") && strstr(err, "default_config.yaml") &&
                          strstr(err, "ignoring ipex_config: {ipex: true}"),
                      "%s", err);
        } else {
            CHECK_MSG(err[0] == '\0', "warned twice: %s", err); /* once per process */
        }
        accel_free(acc);
    }
    /* A TPU setup there is refused, with a hint that the file was not asked for. */
    write_file("hf/accelerate/default_config.yaml", "distributed_type: XLA\n");
    accel *acc;
    CHECK(accel_init(&acc, NULL) == ACCEL_EUNSUPPORTED);
    CHECK_MSG(strstr(accel_last_error(NULL), "ACCELERATE_CONFIG_FILE") != NULL, "%s",
              accel_last_error(NULL));
    unsetenv("HF_HOME");
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
    snprintf(dir, sizeof(dir), "/tmp/accel-test-config-versions-%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(err_path, sizeof(err_path), "%s/stderr.txt", dir);
    test_versions();
    test_default_json();
    test_default_location();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("test_config_versions: ok\n");
    return 0;
}
