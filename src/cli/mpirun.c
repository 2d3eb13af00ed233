/*
 * `accel launch --mpirun_hostfile F`: the job runs through mpirun, with Accelerate's command
 * line (`mpirun --hostfile F --npernode N/M -n N --bind-to socket`, or `-f F -ppn N/M -n N` for
 * an MPI that is not Open MPI), and each rank under `accel __mpirank`, a small shim that runs
 * the program as its child. When the program dies abnormally and nobody asked the shim to stop
 * (the MPI runtime tearing the job down does), the shim prints "accel launch: rank R (host H,
 * pid P) failed: ..." and dies the same way; the launcher reads mpirun's stderr through a pipe,
 * relays it unchanged, keeps those lines, and repeats them after mpirun exits, so the rank that
 * died is named even when the runtime kills every other rank at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "launch.h"

#define REPORT_PREFIX "accel launch: rank "
#define MAX_REPORTS 8

/* The first of names found executable in PATH, written to out; -1 when none is. */
static int find_in_path(const char *const *names, int n_names, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    path = path != NULL ? path : "/usr/local/bin:/usr/bin:/bin";
    for (int i = 0; i < n_names; i++) {
        for (const char *p = path;; p++) {
            const char *end = strchr(p, ':');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            int k = snprintf(out, cap, "%.*s%s%s", (int)len, p, len ? "/" : "", names[i]);
            struct stat st;
            if (k > 0 && (size_t)k < cap && stat(out, &st) == 0 && S_ISREG(st.st_mode) &&
                access(out, X_OK) == 0) {
                return 0;
            }
            if (end == NULL) {
                break;
            }
            p = end;
        }
    }
    return -1;
}

int mpirun_find(char *out, size_t cap)
{
    static const char *const apps[] = {"mpirun", "mpiexec"};
    return find_in_path(apps, 2, out, cap);
}

/* Whether `mpi --version` says Open MPI (Accelerate's test). */
static int is_open_mpi(const char *mpi)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        execl(mpi, mpi, "--version", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char buf[4096];
    size_t len = 0;
    ssize_t k;
    while (pid > 0 && len < sizeof(buf) - 1 &&
           ((k = read(p[0], buf + len, sizeof(buf) - 1 - len)) > 0 || (k < 0 && errno == EINTR))) {
        len += k > 0 ? (size_t)k : 0;
    }
    buf[len] = '\0';
    close(p[0]);
    if (pid > 0) {
        waitpid(pid, NULL, 0);
    }
    return strstr(buf, "Open MPI") != NULL;
}

static volatile sig_atomic_t forward_to;  /* the pid a stop signal is passed on to */
static volatile sig_atomic_t stop_signal; /* the signal received, 0 if none */

static void forward(int sig)
{
    stop_signal = sig;
    if (forward_to > 0) {
        kill((pid_t)forward_to, sig);
    }
}

static void install_forwarding(void)
{
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction old;
        /* An ignored signal (nohup) stays ignored, as in the supervisor. */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) {
            sigaction(sigs[i], &sa, NULL);
        }
    }
}

/* The variables the launcher set, passed to remote ranks with Open MPI's -x (mpirun only
 * forwards the environment to the ranks on its own host). */
static const char *const forwarded[] = {"ACCELERATE_MIXED_PRECISION",
                                        "OMP_NUM_THREADS",
                                        "ACCELERATE_USE_CPU",
                                        "ACCELERATE_DEBUG_MODE",
                                        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                                        "ACCEL_ZERO_STAGE",
                                        "ACCEL_ZERO_SHARD_SIZE",
                                        "CUDA_VISIBLE_DEVICES",
                                        "ACCELERATE_CONFIG_FILE",
                                        "ACCEL_CONFIG_CHECKED",
                                        "MASTER_ADDR",
                                        "MASTER_PORT",
                                        "ACCEL_JOB_ID",
                                        "CCL_WORKER_COUNT"};
#define N_FORWARDED (sizeof(forwarded) / sizeof(forwarded[0]))

/* Relays mpirun's stderr (fd) to ours until EOF, keeping the shims' failure lines. */
static void relay_mpirun(int fd, char reports[MAX_REPORTS][512], int *n_reports)
{
    char buf[8192], line[512];
    size_t line_len = 0;
    for (;;) {
        ssize_t k = read(fd, buf, sizeof(buf));
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            break;
        }
        relay_write_all(2, buf, (size_t)k);
        for (ssize_t i = 0; i < k; i++) {
            if (buf[i] != '\n') {
                if (line_len < sizeof(line) - 1) {
                    line[line_len++] = buf[i];
                }
                continue;
            }
            line[line_len] = '\0';
            /* mpirun may prefix forwarded lines ("[1,1]<stderr>:"): search, do not anchor. */
            const char *rep = strstr(line, REPORT_PREFIX);
            if (rep != NULL && *n_reports < MAX_REPORTS) {
                snprintf(reports[(*n_reports)++], 512, "%s", rep + strlen("accel launch: "));
            }
            line_len = 0;
        }
    }
}

int launch_mpirun(const launch_settings *s, const char *program_path)
{
    char mpi[4096], self[4096];
    if (mpirun_find(mpi, sizeof(mpi)) != 0) { /* checked with the options: PATH changed since */
        fprintf(stderr, "accel launch: error: mpirun or mpiexec not found in PATH\n");
        return 1;
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        fprintf(stderr, "accel launch: error: cannot find the accel executable: %s\n",
                strerror(errno));
        return 1;
    }
    self[n] = '\0';
    const int open_mpi = is_open_mpi(mpi);
    const int total = s->n_procs * s->num_machines;
    char per_node[16], total_s[16];
    snprintf(per_node, sizeof(per_node), "%d", s->n_procs);
    snprintf(total_s, sizeof(total_s), "%d", total);

    int argc_prog = 0;
    while (s->program_argv[argc_prog] != NULL) {
        argc_prog++;
    }
    const char **argv = accel__calloc(16 + 2 * N_FORWARDED + (size_t)argc_prog, sizeof(char *));
    if (argv == NULL) {
        fprintf(stderr, "accel launch: error: out of memory\n");
        return 1;
    }
    int a = 0;
    argv[a++] = mpi;
    argv[a++] = open_mpi ? "--hostfile" : "-f";
    argv[a++] = s->mpirun_hostfile;
    argv[a++] = open_mpi ? "--npernode" : "-ppn";
    argv[a++] = per_node;
    argv[a++] = "-n";
    argv[a++] = total_s;
    if (open_mpi) {
        argv[a++] = "--bind-to";
        argv[a++] = "socket";
        for (size_t i = 0; i < N_FORWARDED; i++) {
            if (getenv(forwarded[i]) != NULL) {
                argv[a++] = "-x";
                argv[a++] = forwarded[i];
            }
        }
    }
    argv[a++] = self;
    argv[a++] = cli_verb_mpirank.name;
    argv[a++] = program_path;
    for (int i = 1; i < argc_prog; i++) {
        argv[a++] = s->program_argv[i];
    }
    argv[a] = NULL;

    fprintf(stderr, "accel launch: running %d processes (%d per machine) through %s%s:", total,
            s->n_procs, mpi, open_mpi ? " (Open MPI)" : "");
    for (int i = 0; i < a; i++) {
        fprintf(stderr, " %s", argv[i]);
    }
    fputc('\n', stderr);
    fflush(NULL);

    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "accel launch: error: pipe: %s\n", strerror(errno));
        accel__free(argv);
        return 1;
    }
    const pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* mpirun cleans its job up on SIGTERM: send that if the launcher dies. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != launcher) {
            _exit(128 + SIGTERM);
        }
        dup2(p[1], 2);
        execv(mpi, (char *const *)argv);
        fprintf(stderr, "accel launch: cannot run '%s': %s\n", mpi, strerror(errno));
        _exit(127);
    }
    close(p[1]);
    accel__free(argv);
    if (pid < 0) {
        fprintf(stderr, "accel launch: error: fork: %s\n", strerror(errno));
        close(p[0]);
        return 1;
    }
    forward_to = pid;
    install_forwarding();
    char reports[MAX_REPORTS][512];
    int n_reports = 0;
    relay_mpirun(p[0], reports, &n_reports);
    close(p[0]);
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    forward_to = 0;
    if (WIFEXITED(wst) && WEXITSTATUS(wst) == 0) {
        return 0;
    }
    char what[96];
    launch_describe_status(wst, what, sizeof(what));
    if (n_reports == 0) {
        fprintf(stderr,
                "accel launch: mpirun failed (%s) and no rank reported a failure of its "
                "own: see mpirun's messages above\n",
                what);
    }
    /* The first report is the cause; the later ones are ranks that failed because of it. */
    for (int i = 0; i < n_reports; i++) {
        fprintf(stderr, "accel launch: %s %s\n",
                i == 0 ? "mpirun failed: the first failure:" : "then", reports[i]);
    }
    return launch_exit_status(wst);
}

/* ---- the shim: accel __mpirank PROGRAM ARGS... ---- */

/* The rank MPI gave this process (Open MPI, MPICH / Intel MPI, MVAPICH2, Slurm), or -1. */
static int mpi_rank(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK",
                                        "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = getenv(names[i]);
        if (v != NULL && v[0] != '\0') {
            return atoi(v);
        }
    }
    return -1;
}

static int run_mpirank(const cli_verb *verb, int argc, char **argv)
{
    (void)verb;
    if (argc < 2) {
        fprintf(stderr, "accel __mpirank: usage: accel __mpirank PROGRAM [ARGS...] (started by "
                        "accel launch --mpirun_hostfile)\n");
        return CLI_EXIT_USAGE;
    }
    const pid_t shim = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != shim) {
            _exit(128 + SIGKILL);
        }
        execv(argv[1], argv + 1);
        fprintf(stderr, "accel launch: cannot run '%s': %s\n", argv[1], strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        fprintf(stderr, "accel __mpirank: fork: %s\n", strerror(errno));
        return 1;
    }
    forward_to = pid;
    install_forwarding();
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(wst) && WEXITSTATUS(wst) == 0) {
        return 0;
    }
    /* A stop the runtime asked for is a consequence: only a failure of our own is named. */
    if (stop_signal == 0) {
        char what[96], host[256] = "?";
        gethostname(host, sizeof(host));
        host[sizeof(host) - 1] = '\0';
        launch_describe_status(wst, what, sizeof(what));
        fprintf(stderr, REPORT_PREFIX "%d (host %s, pid %d) failed: %s\n", mpi_rank(), host,
                (int)pid, what);
        fflush(stderr);
    }
    if (WIFSIGNALED(wst)) {
        /* Die the same way, so that mpirun reports the signal too. */
        signal(WTERMSIG(wst), SIG_DFL);
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        raise(WTERMSIG(wst));
    }
    return launch_exit_status(wst);
}

static const cli_option mpirank_options[] = {{0}};

const cli_verb cli_verb_mpirank = {
    .name = "__mpirank",
    .summary = "internal: one rank of accel launch --mpirun_hostfile",
    .positional = "PROGRAM [ARGS...]",
    .options = mpirank_options,
    .run = run_mpirank,
};
