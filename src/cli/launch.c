/*
 * `accel launch`: checks the program, sets the job's environment (the names torchrun and
 * Accelerate use, from the flags and the config file resolved in launch_opts.c, and a random
 * ACCEL_JOB_ID), hands the processes to the supervisor and, whatever happened, removes
 * shared-memory segments the job left in /dev/shm; with --max_restarts, starts a failed job
 * again. On several machines it first meets the other machines' launchers (rdzv.c, and
 * preflight.c with --preflight); with --mpirun_hostfile it hands the job to mpirun (mpirun.c).
 * Usage errors (bad flag or config file, missing or non-executable program, unusable log
 * directory, something not supported) are reported before anything is started and exit 2.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cli.h"
#include "launch.h"

static int run_launch(const cli_verb *verb, int argc, char **argv);

const cli_verb cli_verb_launch = {
    .name = "launch",
    .summary = "run a program as N processes on one or several machines (flags or the config "
               "file)",
    .positional = "[--] PROGRAM [ARGS...]",
    .description =
        "Starts N copies of PROGRAM with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
        "MASTER_ADDR, MASTER_PORT, ACCEL_JOB_ID and Accelerate's ACCELERATE_* variables set.\n"
        "Options not given come from the config file (--config_file, ACCELERATE_CONFIG_FILE or\n"
        "the default_config.yaml `accel config` writes). With N > 1 each output line is\n"
        "prefixed with \"[rank<r>]: \". SIGINT, SIGTERM, SIGHUP and every other signal that\n"
        "would end the launcher (but its own faults) are forwarded to all processes, which\n"
        "are then stopped like a failed job's; SIGUSR1/SIGUSR2 are passed on.\n"
        "If one process fails the others get SIGTERM, then SIGKILL after the grace period;\n"
        "the launcher prints which rank failed and why and exits with that process's status\n"
        "(its exit code, or 128 + signal), or starts the job again (--max_restarts).\n"
        "On several machines, start one launcher per machine with the same --num_processes\n"
        "(the total), --num_machines, --main_process_ip and --main_process_port and its own\n"
        "--machine_rank; machine 0's launcher serves the rendezvous, and a failure on any\n"
        "machine stops every machine's processes. --mpirun_hostfile runs the job through\n"
        "mpirun instead.\n"
        "Options may be written with dashes or underscores (--num-processes).",
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

/* A script whose "#!" line names an interpreter that is not there fails in execv with ENOENT,
 * which reads as if the script itself were missing ("cannot run './train.sh': No such file or
 * directory"). Checked here, before anything starts, naming the interpreter. Returns 0, or -1
 * after a usage error. Other formats are the kernel's to judge (binfmt_misc). */
static int check_interpreter(const cli_verb *verb, const char *prog, const char *path)
{
    char line[256];
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return 0; /* execv says why (a file that is executable but not readable runs fine) */
    }
    size_t k = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[k] = '\0';
    if (k < 2 || line[0] != '#' || line[1] != '!') {
        return 0;
    }
    /* The kernel's parse: blanks, then the interpreter up to a blank or the line's end. */
    char *interp = line + 2 + strspn(line + 2, " \t");
    size_t len = strcspn(interp, " \t\r\n");
    if (interp + len == line + sizeof(line) - 1) {
        return 0; /* a name longer than this buffer: the kernel refuses it, execv says so */
    }
    interp[len] = '\0';
    if (len == 0) {
        cli_usage_error(verb, "program '%s' starts with '#!' but names no interpreter", prog);
        return -1;
    }
    int e = check_exec(interp);
    if (e != 0) {
        cli_usage_error(verb, "program '%s': its interpreter '%s' (its '#!' line) %s", prog, interp,
                        e == ENOENT ? "does not exist" : "is not an executable file");
        return -1;
    }
    return 0;
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

static int set_env_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%ld", v);
    return setenv(name, buf, 1);
}

/* The job-wide environment every attempt shares (RANK and LOCAL_RANK are set per child). The
 * config file is passed on, so that a program's accel_init reads the same file (and, told by
 * ACCEL_CONFIG_CHECKED, does not repeat its warnings); what the flags or the file resolved is
 * passed in Accelerate's variables, which win over the file in the program. */
static int set_job_env(const launch_settings *s, const accel__config *cfg, int port)
{
    if (s->mpirun_hostfile != NULL) {
        /* mpirun gives the layout (OMPI_COMM_WORLD_*): none of ours may be inherited, or the
         * processes would read it first. A random job id spares shm a rendezvous. */
        static const char *const layout[] = {"RANK",
                                             "LOCAL_RANK",
                                             "WORLD_SIZE",
                                             "LOCAL_WORLD_SIZE",
                                             "GROUP_RANK",
                                             "GROUP_WORLD_SIZE",
                                             "ROLE_RANK",
                                             "ROLE_WORLD_SIZE",
                                             "ACCEL_NUM_MACHINES",
                                             "ACCEL_STORE_SERVED"};
        char job_id[64];
        for (size_t i = 0; i < sizeof(layout) / sizeof(layout[0]); i++) {
            unsetenv(layout[i]);
        }
        int bad = accel__random_hex(job_id, sizeof(job_id)) != 0 ||
                  setenv("ACCEL_JOB_ID", job_id, 1) != 0 ||
                  (s->mpirun_ccl != NULL && setenv("CCL_WORKER_COUNT", s->mpirun_ccl, 1) != 0);
        if (bad) {
            fprintf(stderr, "accel launch: error: environment: %s\n", strerror(errno));
            return -1;
        }
    }
    if (s->num_machines > 1 && s->mpirun_hostfile == NULL &&
        (set_env_int("GROUP_RANK", s->machine_rank) != 0 ||
         set_env_int("ACCEL_NUM_MACHINES", s->num_machines) != 0 ||
         setenv("ACCEL_STORE_SERVED", "1", 1) != 0)) {
        fprintf(stderr, "accel launch: error: setenv: %s\n", strerror(errno));
        return -1;
    }
    int mpirun = s->mpirun_hostfile != NULL;
    int bad =
        (!mpirun && set_env_int("WORLD_SIZE", (long)s->n_procs * s->num_machines) != 0) ||
        (!mpirun && set_env_int("LOCAL_WORLD_SIZE", s->n_procs) != 0) ||
        /* torchrun's: one role (ROLE_RANK = RANK, set per child), one group per machine. */
        (!mpirun && set_env_int("ROLE_WORLD_SIZE", (long)s->n_procs * s->num_machines) != 0) ||
        (!mpirun && set_env_int("GROUP_WORLD_SIZE", s->num_machines) != 0) ||
        setenv("MASTER_ADDR", s->master_addr, 1) != 0 || set_env_int("MASTER_PORT", port) != 0 ||
        setenv("ROLE_NAME", s->role, 1) != 0 ||
        setenv("ACCELERATE_MIXED_PRECISION", s->mixed_precision, 1) != 0 ||
        (s->threads > 0 && set_env_int("OMP_NUM_THREADS", s->threads) != 0) ||
        (s->cpu && setenv("ACCELERATE_USE_CPU", "true", 1) != 0) ||
        (s->debug && setenv("ACCELERATE_DEBUG_MODE", "true", 1) != 0) ||
        (s->gradient_accumulation_steps > 0 && set_env_int("ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                                                           s->gradient_accumulation_steps) != 0) ||
        (s->zero_stage >= 0 && set_env_int("ACCEL_ZERO_STAGE", s->zero_stage) != 0) ||
        (s->zero_shard_size != NULL &&
         setenv("ACCEL_ZERO_SHARD_SIZE", s->zero_shard_size, 1) != 0) ||
        (s->gpu_ids != NULL && setenv("CUDA_VISIBLE_DEVICES", s->gpu_ids, 1) != 0) ||
        set_env_int("TORCHELASTIC_MAX_RESTARTS", s->max_restarts) != 0 ||
        setenv("TORCHELASTIC_RUN_ID", "none", 1) != 0 || /* torchrun's default rendezvous id */
        setenv("ACCEL_LAUNCH_SOURCES", s->sources, 1) != 0 ||
        (cfg->present && (setenv("ACCELERATE_CONFIG_FILE", cfg->path, 1) != 0 ||
                          setenv("ACCEL_CONFIG_CHECKED", cfg->path, 1) != 0));
    if (bad) {
        fprintf(stderr, "accel launch: error: setenv: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* One attempt: a fresh random ACCEL_JOB_ID (per launch, also for launches nested in a job,
 * which inherit one: it names the job's shared memory, which nobody must be able to guess and
 * create first; on several machines, machine 0's, the same everywhere), the restart count,
 * the processes, the /dev/shm sweep (on several machines only after a failure or on machine 0
 * at the end: the machines may share this host, and another machine's processes may still be
 * setting up). */
static int run_attempt(const launch_config *lc, int restart, launch_rdzv *rdzv,
                       launch_outcome *outcome, int *again)
{
    char job_id[64];
    *again = 0;
    if (rdzv != NULL) {
        int rc = launch_rdzv_begin(rdzv, restart);
        if (rc != 0) {
            /* A stop signal was published with this machine's end; else publish it. */
            *outcome = LAUNCH_NOT_STARTED;
            return rc == 1 ? launch_rdzv_finish(rdzv, rc, *outcome, again) : rc;
        }
        snprintf(job_id, sizeof(job_id), "%s", launch_rdzv_job_id(rdzv));
    } else if (accel__random_hex(job_id, sizeof(job_id)) != 0) {
        fprintf(stderr, "accel launch: error: no random source for the job id: %s\n",
                strerror(errno));
        *outcome = LAUNCH_NOT_STARTED;
        return 1;
    }
    if (setenv("ACCEL_JOB_ID", job_id, 1) != 0 || set_env_int("ACCEL_RESTART_COUNT", restart) ||
        set_env_int("TORCHELASTIC_RESTART_COUNT", restart) != 0) {
        fprintf(stderr, "accel launch: error: setenv: %s\n", strerror(errno));
        *outcome = LAUNCH_NOT_STARTED;
        return 1;
    }
    launch_config attempt = *lc;
    attempt.append_logs = restart > 0;
    int rc = launch_supervise(&attempt, outcome);
    if (rdzv != NULL) {
        rc = launch_rdzv_finish(rdzv, rc, *outcome, again);
    }
    /* Machine 0 has waited for every machine by now (rank_base 0 is machine 0). */
    if (rdzv == NULL || rc != 0 || lc->rank_base == 0) {
        remove_job_shm(job_id);
    }
    return rc;
}

static int run_launch(const cli_verb *verb, int argc, char **argv)
{
    launch_settings s;
    accel__config cfg;
    int r = launch_resolve(verb, argc, argv, &s, &cfg);
    if (r != 0) {
        return r > 0 ? 0 : CLI_EXIT_USAGE;
    }
    int rc = CLI_EXIT_USAGE;
    cpu_set_t *cpusets = NULL;
    launch_rdzv *rdzv = NULL;
    char path[4096];
    /* The program first: a typo in its name must not leave a new log directory behind. */
    if (resolve_program(verb, s.program, path, sizeof(path)) != 0 ||
        check_interpreter(verb, s.program, path) != 0) {
        goto out;
    }
    struct stat ld;
    if (s.log_dir != NULL && s.tee != 0 && s.log_dir[0] == '\0') {
        cli_usage_error(verb, "--log_dir is empty: give a directory");
        goto out;
    }
    if (s.log_dir != NULL && s.tee != 0 &&
        (make_dirs(s.log_dir) != 0 || access(s.log_dir, W_OK) != 0)) {
        cli_usage_error(verb, "log directory '%s' is not writable: %s", s.log_dir, strerror(errno));
        goto out;
    }
    if (s.log_dir != NULL && s.tee != 0 && (stat(s.log_dir, &ld) != 0 || !S_ISDIR(ld.st_mode))) {
        /* mkdir -p accepts an existing file; each log file would then fail on its own. */
        cli_usage_error(verb, "log directory '%s' is not a directory", s.log_dir);
        goto out;
    }
    rc = 1;
    int port = s.port;
    if (s.num_machines > 1 && s.mpirun_hostfile == NULL) {
        if ((rc = launch_rdzv_join(&s, &rdzv)) != 0) {
            goto out;
        }
        port = launch_rdzv_port(rdzv);
        if (s.preflight && (rc = launch_preflight(&s, rdzv)) != 0) {
            int again;
            if (rc == 1) { /* else a stop signal, which was published with this machine's end */
                rc = launch_rdzv_finish(rdzv, 1, LAUNCH_NOT_STARTED, &again);
            }
            goto out;
        }
    } else if (port == 0) {
        if ((port = free_port()) < 0) {
            fprintf(stderr, "accel launch: error: could not find a free port: %s\n",
                    strerror(errno));
            goto out;
        }
        fprintf(stderr, "accel launch: main process port %d\n", port);
    }
    if (set_job_env(&s, &cfg, port) != 0) {
        goto out;
    }
    if (s.mpirun_hostfile != NULL) {
        rc = launch_mpirun(&s, path);
        goto out;
    }
    const int sharers = rdzv != NULL ? launch_rdzv_cpu_sharers(rdzv) : 1;
    if (s.bind_cpus && sharers > 1) {
        /* Split between the machines, each process would share its one CPU with its Gloo
         * thread and the host's network work for it: 2 x 1 on 2 CPUs, gloo's 256 KiB allreduce
         * took 3.8-4.1 ms bound against 2.7-2.9 unbound (docs/performance.md, tenth pass). */
        fprintf(stderr,
                "accel launch: %d machines' launchers on this host share its CPUs: processes not "
                "bound (--cpu_affinity auto binds the processes of a machine that has its CPUs to "
                "itself)\n",
                sharers);
    }
    cpusets = s.bind_cpus && sharers == 1 ? launch_cpu_shares(s.n_procs) : NULL;
    launch_config lc = {
        .n_procs = s.n_procs,
        .path = path,
        .argv = s.program_argv,
        .tee = s.tee,
        .log_dir = s.log_dir,
        .grace_s = s.grace_s,
        .cpusets = cpusets,
        .rank_base = s.machine_rank * s.n_procs,
        .watch = rdzv != NULL ? launch_rdzv_watch(rdzv) : NULL,
    };
    for (int restart = 0;; restart++) {
        launch_outcome outcome;
        int again;
        rc = run_attempt(&lc, restart, rdzv, &outcome, &again);
        /* One machine decides alone; several decided together in launch_rdzv_finish (a job
         * that failed elsewhere restarts here too, one stopped by a signal nowhere). */
        if (rdzv == NULL) {
            again = outcome == LAUNCH_FAILED && restart < s.max_restarts;
        }
        if (!again) {
            if (rc != 0 && s.max_restarts > 0 && restart == s.max_restarts &&
                (outcome == LAUNCH_FAILED || outcome == LAUNCH_SUCCEEDED)) {
                fprintf(stderr,
                        "accel launch: giving up: the job failed %d times (--max_restarts %d)\n",
                        restart + 1, s.max_restarts);
            }
            break;
        }
        if (rdzv != NULL) {
            fprintf(stderr,
                    "accel launch: restarting the job on all %d machines: this machine's %d "
                    "processes (restart %d of %d)\n",
                    s.num_machines, s.n_procs, restart + 1, s.max_restarts);
            continue; /* launch_rdzv_begin pauses, watching for signals and the others */
        }
        fprintf(stderr, "accel launch: restarting all %d processes (restart %d of %d)\n", s.n_procs,
                restart + 1, s.max_restarts);
        /* A stop signal in the pause only sets a flag (released by the supervisor, or at the
         * end); it used to end the launcher silently. */
        launch_stop_catch();
        double whole = (double)(time_t)s.monitor_interval_s;
        struct timespec pause = {(time_t)whole, (long)((s.monitor_interval_s - whole) * 1e9)};
        while (launch_stop_signal() == 0 && nanosleep(&pause, &pause) != 0 && errno == EINTR) {
        }
        const int sig = launch_stop_signal();
        if (sig != 0) {
            fprintf(stderr,
                    "accel launch: interrupted by %s during the pause between restarts: nothing "
                    "was started\n",
                    launch_stop_name(sig));
            rc = 128 + sig;
            break;
        }
    }
out:
    launch_rdzv_free(rdzv);
    free(cpusets);
    accel__config_free(&cfg);
    return rc;
}
