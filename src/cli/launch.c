/*
 * `accel launch`: checks the options and the program, sets the job's environment (the names
 * torchrun and Accelerate use, and a random ACCEL_JOB_ID), hands the processes to the
 * supervisor and, whatever happened, removes shared-memory segments the job left in /dev/shm.
 * Usage errors (bad flag, missing or non-executable program, unusable log directory) are
 * reported before anything is started and exit 2.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "cli.h"
#include "launch.h"

static const cli_option launch_options[] = {
    {"num_processes", 'n', 1, "1", "N", "number of processes to start on this machine"},
    {"main_process_port", 0, 1, "29500", "PORT",
     "MASTER_PORT given to the processes; 0 picks a free port"},
    {"tee", 't', 1, "0", "0|1|2|3",
     "also write stdout (1), stderr (2) or both (3) of each process to files in --log_dir"},
    {"log_dir", 0, 1, NULL, "DIR",
     "directory (created if missing) for DIR/rank<r>.stdout and .stderr; alone means --tee 3"},
    {"num_cpu_threads_per_process", 0, 1, NULL, "N",
     "OMP_NUM_THREADS of each process (default: $OMP_NUM_THREADS, else cores / processes)"},
    {"cpu_affinity", 0, 1, "auto", "auto|none",
     "auto: when there are no more processes than CPUs, bind each process to its own equal share "
     "of them (as mpirun does), so processes that synchronise often never share a CPU; none: "
     "leave placement to the scheduler"},
    {"grace_period", 0, 1, "3", "SECONDS",
     "after one process fails, wait this long between SIGTERM and SIGKILL to the others"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

static int run_launch(const cli_verb *verb, int argc, char **argv);

const cli_verb cli_verb_launch = {
    .name = "launch",
    .summary = "run a program as N processes on this machine",
    .positional = "[--] PROGRAM [ARGS...]",
    .description =
        "Starts N copies of PROGRAM with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
        "MASTER_ADDR, MASTER_PORT and ACCEL_JOB_ID set. With N > 1 each output line is\n"
        "prefixed with \"[rank<r>]: \". SIGINT/SIGTERM/SIGHUP are forwarded to all processes.\n"
        "If one process fails the others get SIGTERM, then SIGKILL after the grace period;\n"
        "the launcher prints which rank failed and why and exits with that process's status\n"
        "(its exit code, or 128 + signal).",
    .options = launch_options,
    .run = run_launch,
};

/* Checks that `path` is an executable regular file: 0, or the errno explaining why not. */
static int check_exec(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        return errno;
    }
    if (S_ISDIR(st.st_mode)) {
        return EISDIR;
    }
    if (!S_ISREG(st.st_mode) || access(path, X_OK) != 0) {
        return EACCES;
    }
    return 0;
}

/* Finds the program as execvp would: a name with a '/' is used as is, otherwise each PATH
 * directory is tried in order. Returns 0 with the path in out, or -1 after a usage error. */
static int resolve_program(const cli_verb *verb, const char *prog, char *out, size_t n)
{
    if (prog[0] == '\0') {
        cli_usage_error(verb, "empty program name");
        return -1;
    }
    if (strchr(prog, '/') != NULL) {
        int e = check_exec(prog);
        if (e != 0) {
            cli_usage_error(verb, "program '%s' %s", prog,
                            e == ENOENT ? "not found" : "is not an executable file");
            return -1;
        }
        snprintf(out, n, "%s", prog);
        return 0;
    }
    const char *path = getenv("PATH");
    if (path == NULL) {
        path = "/usr/local/bin:/usr/bin:/bin";
    }
    int saw_non_exec = 0;
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        /* An empty PATH entry means the current directory, as in execvp. */
        int k = len == 0 ? snprintf(out, n, "%s", prog)
                         : snprintf(out, n, "%.*s/%s", (int)len, p, prog);
        if (k > 0 && (size_t)k < n) {
            int e = check_exec(out);
            if (e == 0) {
                return 0;
            }
            saw_non_exec |= (e == EACCES || e == EISDIR);
        }
        if (end == NULL) {
            break;
        }
        p = end;
    }
    cli_usage_error(verb, "program '%s' %s", prog,
                    saw_non_exec ? "is not executable" : "not found in PATH");
    return -1;
}

/* Creates dir and its missing parents (mkdir -p). */
static int make_dirs(const char *dir)
{
    char buf[4096];
    int n = snprintf(buf, sizeof(buf), "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        return -1;
    }
    return 0;
}

/* Asks the kernel for a free TCP port on the loopback interface (--main_process_port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

/* Removes /dev/shm/accel-<uid>-<job id>*: the shm backend unlinks its segments itself, but a
 * process killed with SIGKILL cannot. */
static void remove_job_shm(const char *job_id)
{
    char prefix[128];
    int n = snprintf(prefix, sizeof(prefix), "accel-%u-%s", (unsigned)geteuid(), job_id);
    DIR *d = opendir("/dev/shm");
    if (d == NULL || n <= 0) {
        if (d != NULL) {
            closedir(d);
        }
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)n) == 0 && unlinkat(dirfd(d), e->d_name, 0) == 0) {
            fprintf(stderr, "accel launch: removed leftover shared memory /dev/shm/%s\n",
                    e->d_name);
        }
    }
    closedir(d);
}

/* Splits the CPUs this launcher may use into n_procs equal, contiguous shares (in CPU id
 * order, so neighbouring ranks get neighbouring cores). Returns NULL when there are fewer CPUs
 * than processes (binding would stack processes) or on allocation failure: no binding. */
static cpu_set_t *cpu_shares(long n_procs)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        return NULL;
    }
    int n_cpus = CPU_COUNT(&allowed);
    if (n_procs > n_cpus) {
        return NULL;
    }
    cpu_set_t *sets = calloc((size_t)n_procs, sizeof(cpu_set_t));
    if (sets == NULL) {
        return NULL;
    }
    int share = n_cpus / (int)n_procs, seen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && seen < share * n_procs; cpu++) {
        if (CPU_ISSET(cpu, &allowed)) {
            CPU_SET(cpu, &sets[seen / share]);
            seen++;
        }
    }
    return sets;
}

static int set_env_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%ld", v);
    return setenv(name, buf, 1);
}

static int run_launch(const cli_verb *verb, int argc, char **argv)
{
    cli_args a;
    if (cli_parse(verb, argc, argv, &a) != 0) {
        return CLI_EXIT_USAGE;
    }
    if (a.help) {
        cli_print_help(verb, stdout);
        return 0;
    }

    long n_procs, port, tee, threads = 0;
    if (cli_int_value(verb, "num_processes", cli_value(verb, &a, "num_processes"), 1, 4096,
                      &n_procs) != 0 ||
        cli_int_value(verb, "main_process_port", cli_value(verb, &a, "main_process_port"), 0, 65535,
                      &port) != 0 ||
        cli_int_value(verb, "tee", cli_value(verb, &a, "tee"), 0, 3, &tee) != 0) {
        return CLI_EXIT_USAGE;
    }
    const char *threads_s = cli_value(verb, &a, "num_cpu_threads_per_process");
    if (threads_s != NULL &&
        cli_int_value(verb, "num_cpu_threads_per_process", threads_s, 1, 1 << 16, &threads) != 0) {
        return CLI_EXIT_USAGE;
    }
    const char *grace_s = cli_value(verb, &a, "grace_period");
    char *end;
    double grace = strtod(grace_s, &end);
    if (end == grace_s || *end != '\0' || !(grace >= 0 && grace <= 86400)) {
        cli_usage_error(verb, "--grace_period expects seconds in [0, 86400], got '%s'", grace_s);
        return CLI_EXIT_USAGE;
    }

    const char *affinity = cli_value(verb, &a, "cpu_affinity");
    if (strcmp(affinity, "auto") != 0 && strcmp(affinity, "none") != 0) {
        cli_usage_error(verb, "--cpu_affinity expects auto or none, got '%s'", affinity);
        return CLI_EXIT_USAGE;
    }

    const char *log_dir = cli_value(verb, &a, "log_dir");
    if (cli_given(verb, &a, "tee") && tee != 0 && log_dir == NULL) {
        cli_usage_error(verb, "--tee %ld needs --log_dir DIR for the log files", tee);
        return CLI_EXIT_USAGE;
    }
    if (log_dir != NULL && !cli_given(verb, &a, "tee")) {
        tee = LAUNCH_TEE_STDOUT | LAUNCH_TEE_STDERR;
    }
    if (log_dir != NULL && tee != 0 && (make_dirs(log_dir) != 0 || access(log_dir, W_OK) != 0)) {
        cli_usage_error(verb, "log directory '%s' is not writable: %s", log_dir, strerror(errno));
        return CLI_EXIT_USAGE;
    }

    if (a.first_positional >= argc) {
        cli_usage_error(verb, "no program given");
        return CLI_EXIT_USAGE;
    }
    char path[4096];
    if (resolve_program(verb, argv[a.first_positional], path, sizeof(path)) != 0) {
        return CLI_EXIT_USAGE;
    }

    if (port == 0) {
        if ((port = free_port()) < 0) {
            fprintf(stderr, "accel launch: error: could not find a free port: %s\n",
                    strerror(errno));
            return 1;
        }
        fprintf(stderr, "accel launch: main process port %ld\n", port);
    }
    /* Random per launch (also for launches nested in a job, which inherit an ACCEL_JOB_ID): it
     * names the job's shared memory, which nobody must be able to guess and create first. */
    char job_id[64];
    if (accel__random_hex(job_id, sizeof(job_id)) != 0) {
        fprintf(stderr, "accel launch: error: no random source for the job id: %s\n",
                strerror(errno));
        return 1;
    }

    if (threads == 0) {
        const char *omp = getenv("OMP_NUM_THREADS");
        if (omp == NULL || omp[0] == '\0') {
            /* Accelerate's rule: share the cores among the local processes so N processes
             * do not each start a thread per core. */
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            threads = n_procs > 1 ? (cores / n_procs > 1 ? cores / n_procs : 1) : 0;
        }
    }
    if (set_env_int("WORLD_SIZE", n_procs) != 0 || set_env_int("LOCAL_WORLD_SIZE", n_procs) != 0 ||
        setenv("MASTER_ADDR", "127.0.0.1", 1) != 0 || set_env_int("MASTER_PORT", port) != 0 ||
        setenv("ACCEL_JOB_ID", job_id, 1) != 0 ||
        (threads > 0 && set_env_int("OMP_NUM_THREADS", threads) != 0)) {
        fprintf(stderr, "accel launch: error: setenv: %s\n", strerror(errno));
        return 1;
    }

    cpu_set_t *cpusets = strcmp(affinity, "auto") == 0 ? cpu_shares(n_procs) : NULL;

    launch_config cfg = {
        .n_procs = (int)n_procs,
        .path = path,
        .argv = argv + a.first_positional,
        .tee = (int)tee,
        .log_dir = log_dir,
        .grace_s = grace,
        .cpusets = cpusets,
    };
    int rc = launch_supervise(&cfg);
    free(cpusets);
    remove_job_shm(job_id);
    return rc;
}
