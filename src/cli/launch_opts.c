/*
 * The options of `accel launch`, with Accelerate's names, groups and config keys, and their
 * resolution: a flag given on the command line wins, the config file (read with the library's
 * reader, base/config.h) fills what was not given, the defaults the rest. The table is the
 * single source of the parser, --help and the config-file mapping, so a new flag is a row
 * here plus its use in launch_resolve. Every error names where the bad value came from: the
 * flag, or the file and line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "comm/store.h"
#include "launch.h"

static const cli_group hardware = {"Hardware Selection Arguments",
                                   "Arguments for selecting the hardware to be used."};
static const cli_group resource = {"Resource Selection Arguments",
                                   "Arguments for fine-tuning how available hardware should be "
                                   "used."};
static const cli_group paradigm = {"Training Paradigm Arguments",
                                   "Arguments for selecting which training paradigm to be used."};
static const cli_group distributed = {"Distributed GPUs",
                                      "Arguments related to distributed training (GPUs or CPUs)."};
static const cli_group deepspeed = {"DeepSpeed Arguments",
                                    "Arguments related to DeepSpeed (accel: the ZeRO stage)."};
static const cli_group fsdp = {"FSDP Arguments",
                               "Arguments related to Fully Sharded Data Parallelism (accel: the "
                               "ZeRO stage)."};
static const cli_group mpi = {"MPI Arguments", "Arguments related to mpirun for Multi-CPU"};
static const cli_group accel_own = {"accel Arguments",
                                    "accel's own: process placement and teardown."};

const cli_option launch_options[] = {
    {"config_file", 0, 1, NULL, "FILE",
     "the config file to use for the default values (default: $ACCELERATE_CONFIG_FILE, else "
     "Accelerate's default_config.yaml)",
     NULL, NULL},
    {"debug", 0, 0, NULL, NULL,
     "check collectives across processes and print the resolved configuration with the source "
     "of each value (ACCELERATE_DEBUG_MODE=true in every process)",
     NULL, "debug"},
    {"no_python", 0, 0, NULL, NULL,
     "accepted: accel always runs the program itself (there is no Python to skip)", NULL, NULL},

    {"cpu", 0, 0, NULL, NULL, "force the training on the CPU (ACCELERATE_USE_CPU=true)", &hardware,
     "use_cpu"},
    {"multi_gpu", 0, 0, NULL, NULL,
     "a distributed GPU training: accepted; each process uses the GPU of its local rank when the "
     "build has CUDA and the machine GPUs, else the CPU",
     &hardware, NULL},

    {"mixed_precision", 0, 1, NULL, "no|fp16|bf16|fp8",
     "mixed precision of every process (ACCELERATE_MIXED_PRECISION; default no)", &resource,
     "mixed_precision"},
    {"num_processes", 'n', 1, NULL, "N",
     "the total number of processes to start, over all machines (default 1); -n 2, -n2, -n=2 "
     "work too",
     &resource, "num_processes"},
    {"num_machines", 0, 1, NULL, "N",
     "the number of machines (default 1); start one accel launch per machine", &resource,
     "num_machines"},
    {"num_cpu_threads_per_process", 0, 1, NULL, "N",
     "OMP_NUM_THREADS of each process (default: $OMP_NUM_THREADS, else max(1, CPUs / processes "
     "on this machine))",
     &resource, NULL},
    {"enable_cpu_affinity", 0, 0, NULL, NULL,
     "bind each process to its own CPUs: what --cpu_affinity auto (the default) does", &resource,
     NULL},
    {"dynamo_backend", 0, 1, NULL, "BACKEND",
     "accepted; anything but no gets a note: there is no graph compiler in C", &resource, NULL},

    {"use_deepspeed", 0, 0, NULL, NULL,
     "DeepSpeed's ZeRO: accel shards with its own ZeRO stages (--zero_stage, default 2)", &paradigm,
     NULL},
    {"use_fsdp", 0, 0, NULL, NULL,
     "FSDP: accel shards with its own ZeRO stages (--fsdp_sharding_strategy, default "
     "FULL_SHARD = stage 3)",
     &paradigm, NULL},

    {"gpu_ids", 0, 1, NULL, "IDS",
     "the GPUs (by id) of this machine to use, comma-separated (CUDA_VISIBLE_DEVICES; default "
     "all)",
     &distributed, "gpu_ids"},
    {"same_network", 0, 0, NULL, NULL,
     "all machines are on the same local network: accepted (the launchers always meet at "
     "--main_process_ip:--main_process_port)",
     &distributed, "same_network"},
    {"machine_rank", 0, 1, NULL, "R",
     "the rank of this machine, 0 .. num_machines-1 (default 0; machine 0 serves the "
     "rendezvous)",
     &distributed, "machine_rank"},
    {"main_process_ip", 0, 1, NULL, "ADDR",
     "MASTER_ADDR given to the processes (default 127.0.0.1); on several machines the address "
     "of machine 0, where its launcher serves the rendezvous (required)",
     &distributed, "main_process_ip"},
    {"main_process_port", 0, 1, NULL, "PORT",
     "MASTER_PORT given to the processes (default 29500); 0 picks a free port and prints it "
     "(the other machines then need that port)",
     &distributed, "main_process_port"},
    {"tee", 't', 1, "0", "0|1|2|3",
     "also write stdout (1), stderr (2) or both (3) of each process to files in --log_dir",
     &distributed, NULL},
    {"log_dir", 0, 1, NULL, "DIR",
     "directory (created if missing) for DIR/rank<r>.stdout and .stderr; alone means --tee 3",
     &distributed, NULL},
    {"role", 0, 1, "default", "NAME",
     "the workers' role, as torchrun's: ROLE_NAME of every process (accel has one role)",
     &distributed, NULL},
    {"rdzv_backend", 0, 1, NULL, "NAME",
     "the rendezvous of several machines: static (default) or c10d; both meet at machine 0's "
     "launcher",
     &distributed, "rdzv_backend"},
    {"rdzv_conf", 0, 1, NULL, "KEY=VALUE,...",
     "rendezvous settings, torchrun's syntax: timeout=SECONDS (or join_timeout) is how long a "
     "launcher waits for the other machines (default 600)",
     &distributed, NULL},
    {"max_restarts", 0, 1, "0", "N",
     "when a process fails, stop the job, say why, and start every process again, up to N times "
     "(ACCEL_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT tell the processes which start this "
     "is); on several machines every machine restarts together",
     &distributed, NULL},
    {"monitor_interval", 0, 1, "0.1", "SECONDS",
     "the pause between a failed attempt's teardown and the restart (accel's supervisor sees a "
     "failure at once; it never polls)",
     &distributed, NULL},

    {"zero_stage", 0, 1, NULL, "0|1|2|3",
     "the ZeRO stage (ACCEL_ZERO_STAGE): 0 DDP, 1 optimizer state, 2 + gradients, 3 + parameters",
     &deepspeed, NULL},
    {"gradient_accumulation_steps", 0, 1, NULL, "N",
     "micro-steps per optimizer step (ACCELERATE_GRADIENT_ACCUMULATION_STEPS; accel: any run, "
     "not only DeepSpeed)",
     &deepspeed, "deepspeed_config.gradient_accumulation_steps"},

    {"fsdp_sharding_strategy", 0, 1, NULL, "STRATEGY",
     "FULL_SHARD or HYBRID_SHARD (ZeRO stage 3), SHARD_GRAD_OP or HYBRID_SHARD_ZERO2 (2), "
     "NO_SHARD (0); HYBRID_* shard inside each machine (ACCEL_ZERO_SHARD_SIZE=machine)",
     &fsdp, NULL},

    {"mpirun_hostfile", 0, 1, NULL, "FILE",
     "run the job through mpirun with this hostfile (mpirun --hostfile FILE --npernode "
     "N/machines -n N --bind-to socket, as Accelerate)",
     &mpi, "mpirun_config.mpirun_hostfile"},
    {"mpirun_ccl", 0, 1, NULL, "N",
     "CCL_WORKER_COUNT of the processes under mpirun (oneCCL workers; Accelerate's config key)",
     &mpi, "mpirun_config.mpirun_ccl"},

    {"cpu_affinity", 0, 1, "auto", "auto|none",
     "auto: when there are no more processes than CPUs, bind each process to its own equal share "
     "of them (as mpirun does), so processes that synchronise often never share a CPU (unless "
     "several machines' launchers share this host's CPUs: then nothing is bound); none: leave "
     "placement to the scheduler",
     &accel_own, NULL},
    {"preflight", 0, 0, NULL, NULL,
     "several machines: before starting the program, connect every rank to the rendezvous "
     "and to every machine's launcher, and name each hop that fails",
     &accel_own, NULL},
    {"grace_period", 0, 1, "3", "SECONDS",
     "after one process fails, wait this long between SIGTERM and SIGKILL to the others",
     &accel_own, NULL},
    {0},
};

/* "accel launch: error: ..." for a bad value, naming where it came from. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int
fail_value(const cli_verb *verb, const cli_args *a, const char *name, const char *fmt, ...)
{
    char src[1400], msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cli_usage_error(verb, "%s: %s", cli_source(verb, a, name, src, sizeof(src)), msg);
    return -1;
}

static int get_long(const cli_verb *verb, const cli_args *a, const char *name, long lo, long hi,
                    long dflt, long *out)
{
    const char *s = cli_value(verb, a, name);
    *out = dflt;
    if (s == NULL) {
        return 0;
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return fail_value(verb, a, name, "expected an integer in [%ld, %ld]", lo, hi);
    }
    *out = v;
    return 0;
}

static int get_seconds(const cli_verb *verb, const cli_args *a, const char *name, double hi,
                       double *out)
{
    const char *s = cli_value(verb, a, name);
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= 0 && v <= hi)) {
        return fail_value(verb, a, name, "expected seconds in [0, %g]", hi);
    }
    *out = v;
    return 0;
}

/* A flag (given: "1") or the file's boolean; 0 when neither. */
static int get_bool(const cli_verb *verb, const cli_args *a, const char *name, int *out)
{
    const char *s = cli_value(verb, a, name);
    int b = s == NULL ? 0 : accel__parse_bool(s);
    if (b < 0) {
        return fail_value(verb, a, name, "expected true or false");
    }
    *out = b;
    return 0;
}

/* The config file named by --config_file, else the library's search; its notes printed. */
static int read_config(const cli_verb *verb, const cli_args *a, accel__config *cfg)
{
    if (accel__config_load(cli_value(verb, a, "config_file"), cfg) != ACCEL_OK) {
        fprintf(stderr, "accel launch: error: %s\n", accel_last_error(NULL));
        return -1;
    }
    for (int i = 0; i < cfg->n_notes; i++) {
        fprintf(stderr, "accel launch: warning: %s\n", cfg->notes[i]);
    }
    return 0;
}

/* The ZeRO stage: --zero_stage, else --fsdp_sharding_strategy, else the file's section
 * (DEEPSPEED / FSDP), else the paradigm flag's default; -1 when nothing asks for one. */
static int resolve_zero(const cli_verb *verb, const cli_args *a, const accel__config *cfg,
                        int *stage, const char **shard_size)
{
    long z;
    *stage = -1;
    *shard_size = NULL;
    if (cli_given(verb, a, "zero_stage")) {
        if (get_long(verb, a, "zero_stage", 0, 3, -1, &z) != 0) {
            return -1;
        }
        *stage = (int)z;
    } else if (cli_given(verb, a, "fsdp_sharding_strategy")) {
        *stage = accel__config_fsdp_stage(cli_value(verb, a, "fsdp_sharding_strategy"));
        if (*stage < 0) {
            return fail_value(verb, a, "fsdp_sharding_strategy",
                              "expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, "
                              "HYBRID_SHARD_ZERO2 (or 1-5)");
        }
        /* The flag's strategy replaces the file's, hybrid or not (ACCEL_ZERO_SHARD_SIZE). */
        *shard_size = accel__config_fsdp_hybrid(cli_value(verb, a, "fsdp_sharding_strategy"))
                          ? "machine"
                          : "0";
    } else if (cfg->zero_stage >= 0) {
        *stage = cfg->zero_stage;
    } else if (cli_given(verb, a, "use_deepspeed")) {
        *stage = 2; /* DeepSpeedPlugin's default */
    } else if (cli_given(verb, a, "use_fsdp")) {
        *stage = 3; /* FULL_SHARD */
    }
    return 0;
}

/* One "VAR\taccel launch: <where option `name` came from>" line of s->sources. */
static void add_source(const cli_verb *verb, const cli_args *a, launch_settings *s, const char *var,
                       const char *name)
{
    char src[1400];
    size_t k = strlen(s->sources);
    if (!cli_given(verb, a, name) && a->config_line[cli_option_index(verb, name)] <= 0) {
        snprintf(src, sizeof(src), "default of --%s", name);
    } else {
        cli_source(verb, a, name, src, sizeof(src));
    }
    snprintf(s->sources + k, sizeof(s->sources) - k, "%s\taccel launch: %s\n", var, src);
}

/* Where each variable set_job_env passes on came from (ACCEL_LAUNCH_SOURCES). */
static void record_sources(const cli_verb *verb, const cli_args *a, const accel__config *cfg,
                           launch_settings *s)
{
    s->sources[0] = '\0';
    add_source(verb, a, s, "ACCELERATE_MIXED_PRECISION", "mixed_precision");
    add_source(verb, a, s, "WORLD_SIZE", "num_processes");
    add_source(verb, a, s, "LOCAL_WORLD_SIZE", "num_processes");
    add_source(verb, a, s, "MASTER_ADDR", "main_process_ip");
    add_source(verb, a, s, "MASTER_PORT", "main_process_port");
    if (s->cpu) {
        add_source(verb, a, s, "ACCELERATE_USE_CPU", "cpu");
    }
    if (s->debug) {
        add_source(verb, a, s, "ACCELERATE_DEBUG_MODE", "debug");
    }
    if (s->gradient_accumulation_steps > 0) {
        add_source(verb, a, s, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                   "gradient_accumulation_steps");
    }
    if (s->gpu_ids != NULL) {
        add_source(verb, a, s, "CUDA_VISIBLE_DEVICES", "gpu_ids");
    }
    if (s->threads > 0) {
        /* Not given: the launcher's share of the cores (resolve_process_options). */
        add_source(verb, a, s, "OMP_NUM_THREADS", "num_cpu_threads_per_process");
    }
    /* The ZeRO stage, in resolve_zero's order. */
    if (s->zero_stage < 0) {
        return;
    }
    size_t k = strlen(s->sources);
    if (cli_given(verb, a, "zero_stage")) {
        add_source(verb, a, s, "ACCEL_ZERO_STAGE", "zero_stage");
    } else if (cli_given(verb, a, "fsdp_sharding_strategy")) {
        add_source(verb, a, s, "ACCEL_ZERO_STAGE", "fsdp_sharding_strategy");
        add_source(verb, a, s, "ACCEL_ZERO_SHARD_SIZE", "fsdp_sharding_strategy");
    } else if (cfg->zero_stage >= 0) {
        snprintf(s->sources + k, sizeof(s->sources) - k,
                 "ACCEL_ZERO_STAGE\taccel launch: config file %s:%s\n", cfg->path,
                 cfg->zero_stage_key);
    } else {
        snprintf(s->sources + k, sizeof(s->sources) - k,
                 "ACCEL_ZERO_STAGE\taccel launch: --%s (its default stage %d)\n",
                 cli_given(verb, a, "use_deepspeed") ? "use_deepspeed" : "use_fsdp", s->zero_stage);
    }
}

/* Accelerate's _validate_launch_command checks, and what accel cannot do yet. */
static int check_paradigm(const cli_verb *verb, const cli_args *a, const launch_settings *s)
{
    static const char *const exclusive[] = {"cpu", "multi_gpu", "use_deepspeed", "use_fsdp"};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        n += cli_given(verb, a, exclusive[i]);
    }
    if (n > 1) {
        cli_usage_error(verb, "use only one of --cpu, --multi_gpu, --use_deepspeed, --use_fsdp");
        return -1;
    }
    if (cli_given(verb, a, "multi_gpu") && s->n_procs * s->num_machines < 2) {
        return fail_value(verb, a, "num_processes", "--multi_gpu needs at least 2 processes");
    }
    const char *dyn = cli_value(verb, a, "dynamo_backend");
    if (dyn != NULL && strcasecmp(dyn, "no") != 0) {
        fprintf(stderr,
                "accel launch: note: --dynamo_backend %s ignored: torch.compile has no "
                "counterpart in C\n",
                dyn);
    }
    return 0;
}

/* The pairs of --rdzv_conf, in buf (modified). */
static int parse_rdzv_pairs(const cli_verb *verb, const cli_args *a, char *buf, double *timeout_s)
{
    static const char *const ignored[] = {"read_timeout",
                                          "last_call_timeout",
                                          "close_timeout",
                                          "keep_alive_interval",
                                          "keep_alive_max_attempt",
                                          "heartbeat",
                                          "is_host",
                                          "store_type",
                                          "use_libuv"};
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv != NULL; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL) {
            return fail_value(verb, a, "rdzv_conf", "expected KEY=VALUE pairs, got '%s'", kv);
        }
        *eq = '\0';
        const char *v = eq + 1;
        if (strcmp(kv, "timeout") == 0 || strcmp(kv, "join_timeout") == 0) {
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end != '\0' || !(t > 0 && t <= 86400 * 7)) {
                return fail_value(verb, a, "rdzv_conf", "%s=%s: expected seconds in (0, 604800]",
                                  kv, v);
            }
            *timeout_s = t;
            continue;
        }
        int known = 0;
        for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
            known |= strcmp(kv, ignored[i]) == 0;
        }
        if (!known) {
            return fail_value(verb, a, "rdzv_conf",
                              "unknown key '%s' (accel honours timeout and join_timeout)", kv);
        }
        fprintf(stderr,
                "accel launch: note: --rdzv_conf %s ignored (accel's rendezvous has no "
                "such setting)\n",
                kv);
    }
    return 0;
}

/* torchrun's --rdzv_conf "key=value,...": the keys that set how long the launchers wait for
 * each other are honoured; torchrun's other keys are noted and ignored. */
static int parse_rdzv_conf(const cli_verb *verb, const cli_args *a, double *timeout_s)
{
    const char *conf = cli_value(verb, a, "rdzv_conf");
    *timeout_s = 600; /* torchrun's default for both the static and the c10d rendezvous */
    if (conf == NULL) {
        return 0;
    }
    /* A copy of the whole value: a fixed buffer cut long ones, and the cut pair was then
     * misreported ("expected KEY=VALUE") or the pairs after it silently dropped. */
    char *buf = accel__strdup(conf);
    if (buf == NULL) {
        return fail_value(verb, a, "rdzv_conf", "out of memory");
    }
    int rc = parse_rdzv_pairs(verb, a, buf, timeout_s);
    accel__free(buf);
    return rc;
}

/* addr is a numeric IPv6 link-local address (fe80::/10), with or without a "%scope" id. */
static int link_local(const char *addr)
{
    char ip[INET6_ADDRSTRLEN];
    struct in6_addr a;
    size_t n = strcspn(addr, "%");
    if (n >= sizeof(ip)) {
        return 0;
    }
    memcpy(ip, addr, n);
    ip[n] = '\0';
    return inet_pton(AF_INET6, ip, &a) == 1 && IN6_IS_ADDR_LINKLOCAL(&a);
}

const char *cli_address_problem(const char *addr)
{
    /* The address is resolved later (rdzv.c); "host:port" would be looked up as a host name
     * and fail as "cannot resolve" without saying why. */
    const char *colon = strchr(addr, ':');
    if (addr[0] == '\0') {
        return "expected a host name or an address";
    } else if (colon != NULL && strchr(colon + 1, ':') == NULL) { /* one colon: not IPv6 */
        return "give the address alone and the port with --main_process_port "
               "(main_process_port in the config file)";
    } else if (strlen(addr) > 253) { /* RFC 1035's longest name; IPv6 addresses are shorter */
        return "longer than a host name can be (253 characters)";
    } else if (addr[0] == '[') {
        return "give an IPv6 address without brackets (::1, not [::1])";
    } else if (link_local(addr)) {
        return ACCEL__LINK_LOCAL_REFUSED;
    }
    return NULL;
}

/* --main_process_ip (or the key), named with its source when it cannot be an address. */
static int check_address(const cli_verb *verb, const cli_args *a, const char *addr)
{
    const char *problem = cli_address_problem(addr);
    return problem == NULL ? 0 : fail_value(verb, a, "main_process_ip", "%s", problem);
}

/* The flags of several machines: the rendezvous, its timeout, mpirun, --preflight. */
static int resolve_machines(const cli_verb *verb, const cli_args *a, launch_settings *s)
{
    s->rdzv_backend = cli_value(verb, a, "rdzv_backend");
    s->rdzv_backend = s->rdzv_backend ? s->rdzv_backend : "static";
    s->role = cli_value(verb, a, "role");
    s->role = s->role ? s->role : "default";
    if (strcasecmp(s->rdzv_backend, "static") != 0 && strcasecmp(s->rdzv_backend, "c10d") != 0) {
        return fail_value(verb, a, "rdzv_backend", "expected static or c10d");
    }
    if (parse_rdzv_conf(verb, a, &s->rdzv_timeout_s) != 0) {
        return -1;
    }
    s->preflight = cli_given(verb, a, "preflight");
    s->mpirun_hostfile = cli_value(verb, a, "mpirun_hostfile");
    s->mpirun_ccl = cli_value(verb, a, "mpirun_ccl");
    struct stat st;
    if (s->mpirun_hostfile != NULL &&
        (access(s->mpirun_hostfile, R_OK) != 0 || stat(s->mpirun_hostfile, &st) != 0)) {
        return fail_value(verb, a, "mpirun_hostfile", "cannot read the hostfile: %s",
                          strerror(errno));
    }
    if (s->mpirun_hostfile != NULL && S_ISDIR(st.st_mode)) {
        /* access() passes a folder, which mpirun would be handed and refuse far less clearly.
         * (A pipe, as from <(...), is a hostfile mpirun can read.) */
        return fail_value(verb, a, "mpirun_hostfile",
                          "cannot read the hostfile: it is a directory");
    }
    char mpirun[4096];
    if (s->mpirun_hostfile != NULL && mpirun_find(mpirun, sizeof(mpirun)) != 0) {
        return fail_value(verb, a, "mpirun_hostfile",
                          "mpirun or mpiexec not found in PATH "
                          "(install Open MPI: apt-get install openmpi-bin)");
    }
    if (s->mpirun_ccl != NULL && (s->mpirun_ccl[0] == '\0' ||
                                  strspn(s->mpirun_ccl, "0123456789") != strlen(s->mpirun_ccl))) {
        return fail_value(verb, a, "mpirun_ccl", "expected a number of workers");
    }
    if (s->num_machines > 1 && s->mpirun_hostfile == NULL &&
        cli_value(verb, a, "main_process_ip") == NULL) {
        cli_usage_error(verb,
                        "several machines (--num_machines %d) need --main_process_ip, the "
                        "address of machine 0",
                        s->num_machines);
        return -1;
    }
    if (s->num_machines > 1 && s->mpirun_hostfile == NULL && s->machine_rank > 0 && s->port == 0) {
        return fail_value(verb, a, "main_process_port",
                          "only machine 0 picks a free port: give machine %d the port machine 0 "
                          "printed",
                          s->machine_rank);
    }
    if (s->preflight && (s->num_machines == 1 || s->mpirun_hostfile != NULL)) {
        fprintf(stderr,
                "accel launch: note: --preflight checks the hops between the launchers "
                "of several machines; %s: nothing to check\n",
                s->mpirun_hostfile != NULL ? "mpirun connects its own processes"
                                           : "this job has one machine");
        s->preflight = 0;
    }
    return 0;
}

/* Output, placement and teardown: the options of accel launch that are not Accelerate's
 * config keys. */
static int resolve_process_options(const cli_verb *verb, const cli_args *a, launch_settings *s)
{
    long tee, restarts;
    if (get_long(verb, a, "tee", 0, 3, 0, &tee) != 0 ||
        get_long(verb, a, "num_cpu_threads_per_process", 1, 1 << 16, 0, &s->threads) != 0 ||
        get_long(verb, a, "max_restarts", 0, 1000000, 0, &restarts) != 0 ||
        get_seconds(verb, a, "grace_period", 86400, &s->grace_s) != 0 ||
        get_seconds(verb, a, "monitor_interval", 3600, &s->monitor_interval_s) != 0) {
        return -1;
    }
    s->max_restarts = (int)restarts;
    const char *affinity = cli_value(verb, a, "cpu_affinity");
    if (strcmp(affinity, "auto") != 0 && strcmp(affinity, "none") != 0) {
        cli_usage_error(verb, "--cpu_affinity expects auto or none, got '%s'", affinity);
        return -1;
    }
    s->bind_cpus = strcmp(affinity, "auto") == 0;
    if (!s->bind_cpus && cli_given(verb, a, "enable_cpu_affinity")) {
        cli_usage_error(verb, "--enable_cpu_affinity contradicts --cpu_affinity none");
        return -1;
    }
    s->log_dir = cli_value(verb, a, "log_dir");
    if (cli_given(verb, a, "tee") && tee != 0 && s->log_dir == NULL) {
        cli_usage_error(verb, "--tee %ld needs --log_dir DIR for the log files", tee);
        return -1;
    }
    s->tee = s->log_dir != NULL && !cli_given(verb, a, "tee")
                 ? LAUNCH_TEE_STDOUT | LAUNCH_TEE_STDERR
                 : (int)tee;
    if (s->threads == 0) {
        /* One rule, Accelerate's: the cores shared among this machine's processes, unless the
         * caller chose OMP_NUM_THREADS. */
        const char *omp = getenv("OMP_NUM_THREADS");
        if (omp == NULL || omp[0] == '\0') {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            s->threads = cores / s->n_procs > 1 ? cores / s->n_procs : 1;
        }
    }
    return 0;
}

int launch_resolve(const cli_verb *verb, int argc, char **argv, launch_settings *s,
                   accel__config *cfg)
{
    cli_args a;
    int status;
    memset(s, 0, sizeof(*s));
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status == 0 ? 1 : -1;
    }
    if (read_config(verb, &a, cfg) != 0) {
        return -1;
    }
    cli_fill_from_config(verb, &a, cfg->root, cfg->path);

    long procs, machines, rank, port, accum;
    if (get_long(verb, &a, "num_processes", -1, 4096, 1, &procs) != 0 ||
        get_long(verb, &a, "num_machines", 1, 4096, 1, &machines) != 0 ||
        get_long(verb, &a, "machine_rank", 0, 4095, 0, &rank) != 0 ||
        get_long(verb, &a, "main_process_port", 0, 65535, 29500, &port) != 0 ||
        get_long(verb, &a, "gradient_accumulation_steps", 1, 1 << 30, 0, &accum) != 0 ||
        get_bool(verb, &a, "cpu", &s->cpu) != 0 || get_bool(verb, &a, "debug", &s->debug) != 0 ||
        get_bool(verb, &a, "same_network", &s->same_network) != 0 ||
        resolve_zero(verb, &a, cfg, &s->zero_stage, &s->zero_shard_size) != 0) {
        goto fail;
    }
    if (procs < 1) { /* -1 in the file: Accelerate's "pass --num_processes" */
        fail_value(verb, &a, "num_processes",
                   procs == -1 && !cli_given(verb, &a, "num_processes")
                       ? "give the number of processes with --num_processes"
                       : "expected an integer in [1, 4096]");
        goto fail;
    }
    s->num_machines = (int)machines;
    s->machine_rank = (int)rank;
    if (procs % machines != 0) {
        char src[1400];
        cli_source(verb, &a, "num_machines", src, sizeof(src));
        if (cli_value(verb, &a, "num_processes") == NULL) {
            /* Forgetting -n is the likely slip of a first multi-machine launch: the default's
             * single process is what cannot be shared, which "--num_processes  (default)" hid. */
            cli_usage_error(verb,
                            "--num_processes not given: its default, 1 process, cannot be shared "
                            "by %ld machines (%s): give the total over all machines "
                            "(Accelerate's meaning), e.g. --num_processes %ld",
                            machines, src, machines);
        } else {
            fail_value(verb, &a, "num_processes",
                       "%ld processes cannot be shared equally by %s (num_processes is the "
                       "total over all machines, Accelerate's meaning)",
                       procs, src);
        }
        goto fail;
    }
    if (rank >= machines && machines == 1 && !cli_given(verb, &a, "machine_rank")) {
        /* The file's rank among its machines means nothing on one: --num_machines 1 runs a
         * machine's config file alone (Accelerate's one-machine launch ignores it too). */
        rank = 0;
        s->machine_rank = 0;
    } else if (rank >= machines) {
        fail_value(verb, &a, "machine_rank", "must be below the number of machines (%ld)",
                   machines);
        goto fail;
    }
    s->n_procs = (int)(procs / machines);
    s->port = (int)port;
    s->gradient_accumulation_steps = (int)accum;
    s->master_addr = cli_value(verb, &a, "main_process_ip");
    s->master_addr = s->master_addr ? s->master_addr : "127.0.0.1";
    if (check_address(verb, &a, s->master_addr) != 0) {
        goto fail;
    }
    if (resolve_machines(verb, &a, s) != 0) {
        goto fail;
    }
    s->gpu_ids = cli_value(verb, &a, "gpu_ids");
    if (s->gpu_ids != NULL && (strcasecmp(s->gpu_ids, "all") == 0 || s->gpu_ids[0] == '\0')) {
        s->gpu_ids = NULL;
    } else if (s->gpu_ids != NULL && !accel__config_gpu_ids_valid(s->gpu_ids)) {
        fail_value(verb, &a, "gpu_ids", "expected all or comma-separated device ids");
        goto fail;
    }
    s->mixed_precision = cli_value(verb, &a, "mixed_precision");
    s->mixed_precision = s->mixed_precision ? s->mixed_precision : "no";
    static const char *const precisions[] = {"no", "fp16", "bf16", "fp8"};
    int known = 0;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s->mixed_precision, precisions[i]) == 0) {
            s->mixed_precision = precisions[i]; /* lower-cased, as Accelerate passes it */
            known = 1;
        }
    }
    if (!known) {
        fail_value(verb, &a, "mixed_precision", "expected no, fp16, bf16 or fp8");
        goto fail;
    }
    if (check_paradigm(verb, &a, s) != 0 || resolve_process_options(verb, &a, s) != 0) {
        goto fail;
    }
    if (s->mpirun_hostfile != NULL && (s->max_restarts > 0 || s->log_dir != NULL)) {
        /* mpirun supervises and relays the processes itself. */
        cli_usage_error(verb,
                        "%s cannot be used with --mpirun_hostfile (mpirun runs the processes)",
                        s->max_restarts > 0 ? "--max_restarts" : "--log_dir / --tee");
        goto fail;
    }
    if (a.first_positional >= argc) {
        cli_usage_error(verb, "no program given");
        goto fail;
    }
    s->program = argv[a.first_positional];
    s->program_argv = argv + a.first_positional;
    record_sources(verb, &a, cfg, s);
    return 0;
fail:
    accel__config_free(cfg);
    return -1;
}
