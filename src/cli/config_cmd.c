/*
 * `accel config`: Accelerate's questionnaire for the features accel has (compute environment,
 * machines and ranks, processes, CPU or GPU, ZeRO stage and accumulation through DeepSpeed's
 * questions, mixed precision), `accel config default` (a file without questions) and `accel
 * config update` (an old file rewritten with the current keys). Files are written atomically
 * with Accelerate's keys and layout (sorted keys; JSON for a .json path), to --config_file or
 * the default location the library and `accel launch` read (base/config.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/base.h"
#include "base/config.h"
#include "base/fs.h"
#include "cli.h"
#include "prompt.h"

static int run_config(const cli_verb *verb, int argc, char **argv);
static int run_default(const cli_verb *verb, int argc, char **argv);
static int run_update(const cli_verb *verb, int argc, char **argv);

#define CONFIG_FILE_HELP                                                                         \
    "where to write the file (default: default_config.yaml in $HF_HOME/accelerate, else "       \
    "$XDG_CACHE_HOME/huggingface/accelerate, else ~/.cache/huggingface/accelerate)"

static const cli_option config_options[] = {
    {"config_file", 0, 1, NULL, "FILE", CONFIG_FILE_HELP, NULL, NULL},
    {0},
};

const cli_verb cli_verb_config = {
    .name = "config",
    .summary = "write the config file by answering questions (also: config default | update)",
    .positional = "[default | update] [options]",
    .description =
        "Asks how accel should run your programs and writes Accelerate's config file, which\n"
        "`accel launch` and accel_init read. In a terminal, choose with the arrow or number\n"
        "keys and Enter; without one, answer each question with a line on stdin (a number,\n"
        "or empty for the default).\n"
        "  accel config default [--mixed_precision P]  writes a one-process file, no questions\n"
        "  accel config update                         rewrites an old file with current keys",
    .options = config_options,
    .run = run_config,
};

static const cli_option default_options[] = {
    {"config_file", 0, 1, NULL, "FILE", CONFIG_FILE_HELP, NULL, NULL},
    {"mixed_precision", 0, 1, "no", "no|fp16|bf16", "mixed precision of the file", NULL, NULL},
    {0},
};

static const cli_verb config_default = {
    .name = "config default",
    .summary = "write a default config file",
    .positional = NULL,
    .description = "Writes a config file for one process on this machine without asking\n"
                   "anything; an existing file is left as it is.",
    .options = default_options,
    .run = run_default,
};

static const cli_option update_options[] = {
    {"config_file", 0, 1, NULL, "FILE", "the file to update (default: the default location)",
     NULL, NULL},
    {0},
};

static const cli_verb config_update = {
    .name = "config update",
    .summary = "rewrite a config file with the current keys",
    .positional = NULL,
    .description = "Reads a config file written by any Accelerate version (or by accel) and\n"
                   "writes it back with the keys current Accelerate writes, keeping its values.",
    .options = update_options,
    .run = run_update,
};

/* ---- building the file ---- */

/* What PyYAML would read as something else than a string (so it writes it quoted: 'no'). */
static int reads_as_non_string(const char *s)
{
    static const char *const words[] = {"yes", "no", "true", "false", "on", "off", "null", "~"};
    if (s[0] == '\0') {
        return 1;
    }
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (strcasecmp(s, words[i]) == 0) {
            return 1;
        }
    }
    char *end;
    (void)strtod(s, &end);
    return *end == '\0';
}

static int set(accel__ynode *m, const char *key, accel__ynode *v)
{
    return accel__ynode_set(m, key, v) == ACCEL_OK ? 0 : -1;
}

static int set_str(accel__ynode *m, const char *key, const char *v)
{
    return set(m, key, accel__ynode_scalar(v, reads_as_non_string(v)));
}

static int set_plain(accel__ynode *m, const char *key, const char *v)
{
    return set(m, key, accel__ynode_scalar(v, 0));
}

static int set_long(accel__ynode *m, const char *key, long v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%ld", v);
    return set_plain(m, key, buf);
}

static int set_bool(accel__ynode *m, const char *key, int b)
{
    return set_plain(m, key, b ? "true" : "false");
}

/* The keys every ClusterConfig writes whatever the answers (Accelerate's dataclass defaults). */
static int set_fixed(accel__ynode *m)
{
    return set_str(m, "compute_environment", "LOCAL_MACHINE") | set_str(m, "downcast_bf16", "no") |
           set_bool(m, "enable_cpu_affinity", 0) | set_str(m, "main_training_function", "main") |
           set_bool(m, "tpu_use_cluster", 0) | set_bool(m, "tpu_use_sudo", 0) |
           set(m, "tpu_env", accel__ynode_seq());
}

/* The file to write (or update): --config_file, else the default location. Refused before
 * anything is asked or written: an empty path, one too long to be a path (it used to be cut
 * to fit, and the file written elsewhere), a directory. Returns 0, or -1 after saying why. */
static int target(const cli_verb *verb, const char *given, char *out, size_t cap)
{
    size_t len = given != NULL ? (size_t)snprintf(out, cap, "%s", given)
                               : accel__config_default_path(out, cap);
    const char *what = given != NULL ? "--config_file" : "the default config file";
    if (len == 0) {
        fprintf(stderr, "accel %s: error: --config_file is empty: give the path of a file\n",
                verb->name);
        return -1;
    }
    if (len >= cap) {
        fprintf(stderr,
                "accel %s: error: %s %.64s...: the path is %zu bytes long, more than a path can "
                "be (%zu)\n",
                verb->name, what, out, len, cap - 1);
        return -1;
    }
    if (accel__is_dir(out)) {
        fprintf(stderr,
                "accel %s: error: %s %s is a directory: give the path of a file in it (e.g. "
                "%s/default_config.yaml)\n",
                verb->name, what, out, out);
        return -1;
    }
    return 0;
}

/* Creates the missing folders above the file to write. */
static int make_parent(const cli_verb *verb, char *path)
{
    char *slash = strrchr(path, '/');
    if (slash != NULL && slash != path) {
        *slash = '\0';
        accel_status st = accel__mkdirs(path);
        *slash = '/';
        if (st != ACCEL_OK) {
            fprintf(stderr, "accel %s: error: %s\n", verb->name, accel_last_error(NULL));
            return -1;
        }
    }
    return 0;
}

static int is_json(const char *path)
{
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

static int write_config(const cli_verb *verb, const accel__ynode *root, const char *path)
{
    if (accel__ytree_write(root, path, is_json(path)) != ACCEL_OK) {
        fprintf(stderr, "accel %s: error: %s\n", verb->name, accel_last_error(NULL));
        return -1;
    }
    return 0;
}

/* ---- the questionnaire ---- */

enum { TYPE_NO, TYPE_MULTI_CPU, TYPE_MULTI_GPU };

/* The hostfile of mpirun, "~" expanded as Accelerate's os.path.expanduser does (accel launch
 * reads the path as written). A file that is not there yet is only noted: it may be written
 * later, and accel launch names it if it is still missing. Returns 0, or -1 (input ended). */
static int ask_hostfile(prompt *p, char *out, size_t cap)
{
    for (;;) {
        char answer[4096];
        if (prompt_text(p, "Please enter the path to the hostfile to use with mpirun "
                           "[~/hostfile]: ",
                        "~/hostfile", answer, sizeof(answer)) != 0) {
            return -1;
        }
        const char *home = getenv("HOME");
        int tilde = answer[0] == '~' && (answer[1] == '/' || answer[1] == '\0');
        int n = tilde && home != NULL && home[0] != '\0'
                    ? snprintf(out, cap, "%s%s", home, answer + 1)
                    : snprintf(out, cap, "%s", answer);
        if (n < 0 || (size_t)n >= cap) {
            printf("Please enter a shorter path.\n");
            continue;
        }
        if (access(out, R_OK) != 0) {
            printf("Note: cannot read %s yet (%s): accel launch will need it, one line per "
                   "machine (HOST slots=N).\n",
                   out, strerror(errno));
        }
        return 0;
    }
}

/* Accelerate's get_cluster_input for the features accel has. Returns 0, or -1 (input ended,
 * a setup accel refuses) after saying why. */
static int ask(prompt *p, accel__ynode *m)
{
    static const char *const environments[] = {"This machine", "AWS (Amazon SageMaker)"};
    static const char *const types[] = {"No distributed training", "multi-CPU", "multi-GPU"};
    static const char *const type_keys[] = {"NO", "MULTI_CPU", "MULTI_GPU"};
    static const char *const stages[] = {"0", "1", "2", "3"};
    static const char *const precisions[] = {"no", "fp16", "bf16"};
    int env, type, multi_machine = 0, debug = 0, use_cpu, deepspeed, same_network = 1, stage = -1;
    long machines = 1, rank = 0, port = -1, procs = 1, accum = 1;
    char ip[256] = "", rdzv[64] = "static", gpus[256] = "";

    if (prompt_choice(p, "In which compute environment are you running?", environments, 2, 0,
                      &env) != 0) {
        return -1;
    }
    if (env == 1) {
        fprintf(stderr, "accel config: Amazon SageMaker is not supported: accel runs on the "
                        "machines you start it on\n");
        return -1;
    }
    if (prompt_choice(p, "Which type of machine are you using?", types, 3, 0, &type) != 0) {
        return -1;
    }
    if (type != TYPE_NO) {
        if (prompt_int(p, "How many different machines will you use (use more than 1 for "
                          "multi-node training)? [1]: ",
                       1, 1, 4096, &machines) != 0) {
            return -1;
        }
        multi_machine = machines > 1;
    }
    if (multi_machine) {
        char *ranks[64];
        char names[64][16];
        int n_ranks = machines < 64 ? (int)machines : 64, r = 0;
        for (int i = 0; i < n_ranks; i++) {
            snprintf(names[i], sizeof(names[i]), "%d", i);
            ranks[i] = names[i];
        }
        /* A menu up to 64 machines; beyond, a number (the menu used to stop at 63, and the
         * higher ranks could not be chosen at all). */
        long rank_l = 0;
        if (machines <= 64 ? prompt_choice(p, "What is the rank of this machine?",
                                           (const char *const *)ranks, n_ranks, 0, &r) != 0
                           : prompt_int(p, "What is the rank of this machine? [0]: ", 0, 0,
                                        machines - 1, &rank_l) != 0) {
            return -1;
        }
        r = machines <= 64 ? r : (int)rank_l;
        /* The address is checked as accel launch checks it, and asked again. */
        for (const char *problem = "";;) {
            if (prompt_text(p,
                            "What is the IP address of the machine that will host the main "
                            "process? ",
                            NULL, ip, sizeof(ip)) != 0) {
                return -1;
            }
            if ((problem = cli_address_problem(ip)) == NULL) {
                break;
            }
            printf("Please enter a host name or an address: %s.\n", problem);
        }
        if (prompt_int(p, "What is the port you will use to communicate with the main process? ",
                       -1, 0, 65535, &port) != 0 ||
            prompt_yes_no(p,
                          "Are all the machines on the same local network? Answer `no` if "
                          "nodes are on the cloud and/or on different network hosts [YES/no]: ",
                          1, &same_network) != 0) {
            return -1;
        }
        rank = r;
        /* Accelerate takes any of torchrun's backends (etcd, ...); accel launch only these two,
         * so another one is asked again rather than written into a file it would refuse. */
        while (!same_network) {
            if (prompt_text(p, "What rendezvous backend will you use? ('static', 'c10d'): ",
                            "static", rdzv, sizeof(rdzv)) != 0) {
                return -1;
            }
            const char *known = strcasecmp(rdzv, "static") == 0 ? "static"
                                : strcasecmp(rdzv, "c10d") == 0   ? "c10d"
                                                                  : NULL;
            if (known != NULL) {
                snprintf(rdzv, sizeof(rdzv), "%s", known);
                break;
            }
            printf("Please enter static or c10d (both meet at machine 0's launcher; accel has no "
                   "other rendezvous backend).\n");
        }
    }
    if (type != TYPE_NO &&
        prompt_yes_no(p, "Should distributed operations be checked while running for errors? "
                         "This can avoid timeout issues but will be slower. [yes/NO]: ",
                      0, &debug) != 0) {
        return -1;
    }
    use_cpu = type == TYPE_MULTI_CPU;
    if (type == TYPE_NO &&
        prompt_yes_no(p, "Do you want to run your training on CPU only (even if a GPU is "
                         "available)? [yes/NO]: ",
                      0, &use_cpu) != 0) {
        return -1;
    }
    /* Accelerate asks it of every multi-CPU setup, one machine or several; accel launch then
     * runs mpirun itself from the file's mpirun_config. */
    int use_mpirun = 0;
    long ccl = 1;
    char hostfile[4096] = "";
    if (type == TYPE_MULTI_CPU &&
        (prompt_yes_no(p, "Do you want accel to launch mpirun? [yes/NO]: ", 0, &use_mpirun) != 0 ||
         (use_mpirun && ask_hostfile(p, hostfile, sizeof(hostfile)) != 0) ||
         (use_mpirun && prompt_int(p, "Enter the number of oneCCL worker threads [1]: ", 1, 0,
                                   1 << 20, &ccl) != 0))) {
        return -1;
    }
    if (prompt_yes_no(p, "Do you want to use DeepSpeed (accel: its ZeRO stages, on CPUs too)? "
                         "[yes/NO]: ",
                      0, &deepspeed) != 0) {
        return -1;
    }
    if (deepspeed &&
        (prompt_choice(p, "What should be your DeepSpeed's ZeRO optimization stage?", stages, 4,
                       2, &stage) != 0 ||
         prompt_int(p, "How many gradient accumulation steps you're passing in your script? [1]: ",
                    1, 1, 1 << 30, &accum) != 0)) {
        return -1;
    }
    if (type != TYPE_NO || deepspeed) {
        const char *what = use_cpu ? "processes" : "GPU(s)";
        char q[128];
        snprintf(q, sizeof(q), "How many %s should be used for distributed training? [1]:", what);
        /* accel launch's range, and the total over the machines must share equally. */
        for (;;) {
            if (prompt_int(p, q, 1, 1, 4096, &procs) != 0) {
                return -1;
            }
            if (procs % machines == 0) {
                break;
            }
            printf("Please enter a multiple of the number of machines (%ld): it is the total "
                   "over all machines.\n",
                   machines);
        }
    }
    if (type == TYPE_MULTI_GPU && machines == 1 && procs == 1) {
        fprintf(stderr, "accel config: Specified distributed type MULTI_GPU but only using 1 GPU "
                        "on a single machine. Please select `No distributed training` for the "
                        "type of machine you are using.\n");
        return -1;
    }
    if (!use_cpu && prompt_text(p, "What GPU(s) (by id) should be used for training on this "
                                   "machine as a comma-separated list? [all]:",
                                "all", gpus, sizeof(gpus)) != 0) {
        return -1;
    }
    int mp;
    if (prompt_choice(p, "Do you wish to use mixed precision?", precisions, 3, 0, &mp) != 0) {
        return -1;
    }

    int bad = set_fixed(m) | set_bool(m, "debug", debug) |
              set_str(m, "distributed_type", deepspeed ? "DEEPSPEED" : type_keys[type]) |
              set_long(m, "machine_rank", rank) | set_str(m, "mixed_precision", precisions[mp]) |
              set_long(m, "num_machines", machines) | set_long(m, "num_processes", procs) |
              set_str(m, "rdzv_backend", rdzv) | set_bool(m, "same_network", same_network) |
              set_bool(m, "use_cpu", use_cpu);
    if (!use_cpu) {
        bad |= set_str(m, "gpu_ids", gpus);
    }
    if (multi_machine) {
        bad |= set_str(m, "main_process_ip", ip) | set_long(m, "main_process_port", port);
    }
    if (use_mpirun) {
        accel__ynode *mpi = accel__ynode_map();
        bad |= mpi == NULL ||
               set_str(mpi, "mpirun_hostfile", hostfile) | set_long(mpi, "mpirun_ccl", ccl);
        bad |= set(m, "mpirun_config", mpi);
    }
    if (deepspeed) {
        accel__ynode *ds = accel__ynode_map();
        bad |= ds == NULL || set_long(ds, "zero_stage", stage) |
                                 set_long(ds, "gradient_accumulation_steps", accum);
        bad |= set(m, "deepspeed_config", ds);
    }
    if (bad) {
        fprintf(stderr, "accel config: error: %s\n", accel_last_error(NULL));
        return -1;
    }
    return 0;
}

static int run_config(const cli_verb *verb, int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "default") == 0) {
        return config_default.run(&config_default, argc - 1, argv + 1);
    }
    if (argc > 1 && strcmp(argv[1], "update") == 0) {
        return config_update.run(&config_update, argc - 1, argv + 1);
    }
    cli_args a;
    int status;
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status;
    }
    if (a.first_positional < argc) {
        cli_usage_error(verb, "unknown subcommand '%s' (default or update)",
                        argv[a.first_positional]);
        return CLI_EXIT_USAGE;
    }
    char path[4096];
    /* The target is checked before the questions, so that no answer is typed in vain. */
    if (target(verb, cli_value(verb, &a, "config_file"), path, sizeof(path)) != 0) {
        return 1;
    }
    prompt p;
    prompt_init(&p);
    accel__ynode *m = accel__ynode_map();
    int rc = m == NULL || ask(&p, m) != 0 ? (p.interrupted ? 130 : 1) : 0;
    if (rc == 0 && (make_parent(verb, path) != 0 || write_config(verb, m, path) != 0)) {
        rc = 1;
    }
    if (rc == 0) {
        printf("accel configuration saved at %s\n", path);
    }
    accel__ynode_free(m);
    return rc;
}

/* ---- config default ---- */

static int run_default(const cli_verb *verb, int argc, char **argv)
{
    cli_args a;
    int status;
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status;
    }
    const char *mp = cli_value(verb, &a, "mixed_precision");
    if (strcasecmp(mp, "no") != 0 && strcasecmp(mp, "fp16") != 0 && strcasecmp(mp, "bf16") != 0) {
        cli_usage_error(verb, "--mixed_precision expects no, fp16 or bf16, got '%s'", mp);
        return CLI_EXIT_USAGE;
    }
    char path[4096];
    if (target(verb, cli_value(verb, &a, "config_file"), path, sizeof(path)) != 0) {
        return 1;
    }
    if (access(path, F_OK) == 0) {
        printf("Configuration already exists at %s, will not override. Run `accel config` "
               "manually or pass a different `--config_file`.\n",
               path);
        return 0;
    }
    if (make_parent(verb, path) != 0) {
        return 1;
    }
    /* write_basic_config on a machine without accelerators: one process on the CPU. */
    char lower[8];
    snprintf(lower, sizeof(lower), "%s", mp);
    for (char *c = lower; *c; c++) {
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    }
    accel__ynode *m = accel__ynode_map();
    int bad = m == NULL || set_fixed(m) | set_str(m, "mixed_precision", lower) |
                               set_bool(m, "use_cpu", 1) | set_long(m, "num_processes", 1) |
                               set_str(m, "distributed_type", "NO") | set_bool(m, "debug", 0) |
                               set_long(m, "machine_rank", 0) | set_long(m, "num_machines", 1) |
                               set_str(m, "rdzv_backend", "static") |
                               set_bool(m, "same_network", 0);
    int rc = bad ? (fprintf(stderr, "accel %s: error: %s\n", verb->name, accel_last_error(NULL)), 1)
             : write_config(verb, m, path) != 0 ? 1
                                                : 0;
    if (rc == 0) {
        printf("accel configuration saved at %s\n", path);
    }
    accel__ynode_free(m);
    return rc;
}

/* ---- config update ---- */

/* Keys current Accelerate no longer has: neutral ones go quietly, others with a note. */
static const char *const removed_keys[] = {"ipex_config", "tp_config"};

/* Accelerate's process_config + ClusterConfig defaults + to_dict (no None, no empty dict). */
static int normalise(accel__ynode *m, const accel__config *cfg)
{
    int bad = 0;
    accel__ynode *fp16 = accel__ynode_get(m, "fp16");
    if (accel__ynode_get(m, "mixed_precision") == NULL && cfg->mixed_precision[0] != '\0') {
        bad |= set_str(m, "mixed_precision", cfg->mixed_precision);
    }
    if (fp16 != NULL) {
        accel__ynode_remove(m, "fp16");
    }
    accel__ynode *dyn = accel__ynode_get(m, "dynamo_backend");
    if (dyn != NULL && accel__ynode_get(m, "dynamo_config") == NULL &&
        dyn->kind == ACCEL__Y_SCALAR && strcasecmp(dyn->text, "no") != 0) {
        accel__ynode *dc = accel__ynode_map();
        bad |= dc == NULL || set_str(dc, "dynamo_backend", dyn->text) |
                                 set(m, "dynamo_config", dc);
    }
    accel__ynode_remove(m, "dynamo_backend");
    for (size_t i = 0; i < sizeof(removed_keys) / sizeof(removed_keys[0]); i++) {
        if (accel__ynode_get(m, removed_keys[i]) != NULL) {
            printf("note: removed %s, which current Accelerate does not have\n", removed_keys[i]);
            accel__ynode_remove(m, removed_keys[i]);
        }
    }
    static const struct {
        const char *key, *value;
        int quoted;
    } defaults[] = {
        {"compute_environment", "LOCAL_MACHINE", 0}, {"use_cpu", "false", 0},
        {"debug", "false", 0},                       {"enable_cpu_affinity", "false", 0},
        {"machine_rank", "0", 0},                    {"num_machines", "1", 0},
        {"rdzv_backend", "static", 0},               {"same_network", "false", 0},
        {"main_training_function", "main", 0},       {"downcast_bf16", "false", 0},
        {"tpu_use_cluster", "false", 0},             {"tpu_use_sudo", "false", 0},
    };
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        const accel__ynode *v = accel__ynode_get(m, defaults[i].key);
        if (v == NULL || accel__yscalar_is_null(v)) {
            bad |= set(m, defaults[i].key, accel__ynode_scalar(defaults[i].value, 0));
        }
    }
    const accel__ynode *np = accel__ynode_get(m, "num_processes");
    if (np == NULL || accel__yscalar_is_null(np)) {
        bad |= set_long(m, "num_processes", strcmp(cfg->distributed_type, "NO") == 0 ? 1 : -1);
    }
    for (int i = m->n - 1; i >= 0; i--) { /* what to_dict drops */
        const accel__ynode *v = m->items[i];
        if (accel__yscalar_is_null(v) || (v->kind == ACCEL__Y_MAP && v->n == 0)) {
            accel__ynode_remove(m, m->keys[i]);
        }
    }
    return bad ? -1 : 0;
}

static int run_update(const cli_verb *verb, int argc, char **argv)
{
    cli_args a;
    int status;
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status;
    }
    const char *given = cli_value(verb, &a, "config_file");
    char path[4096];
    if (target(verb, given, path, sizeof(path)) != 0) {
        return 1;
    }
    if (!accel__is_file(path)) {
        fprintf(stderr, "accel %s: error: there is no config file at %s%s\n", verb->name, path,
                given ? "" : " (run `accel config` first)");
        return 1;
    }
    accel__config cfg;
    if (accel__config_load(path, &cfg) != ACCEL_OK) {
        fprintf(stderr, "accel %s: error: %s\n", verb->name, accel_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < cfg.n_notes; i++) {
        fprintf(stderr, "accel %s: warning: %s\n", verb->name, cfg.notes[i]);
    }
    int rc = normalise(cfg.root, &cfg) != 0 ? (fprintf(stderr, "accel %s: error: %s\n",
                                                       verb->name, accel_last_error(NULL)),
                                               1)
             : write_config(verb, cfg.root, path) != 0 ? 1
                                                        : 0;
    if (rc == 0) {
        printf("Successfully updated the configuration file at %s.\n", path);
    }
    accel__config_free(&cfg);
    return rc;
}
