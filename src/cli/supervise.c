/*
 * The launcher's supervisor: forks the N processes into one new process group, then runs a
 * single poll() loop over a signalfd (SIGCHLD and every signal whose default action would end
 * the launcher, but its own faults; SIGUSR1/2 are passed on) and the children's pipes, with no
 * sleeps, so a job of short programs costs little more than fork+exec.
 * Invariants: the group is only signalled while one of its processes is still unreaped (so the
 * pgid cannot have been reused); once one process fails or a signal arrives, everyone gets
 * SIGTERM, and SIGKILL after the grace period, and the first failure decides the exit status.
 * No process outlives the launcher: each gets SIGKILL from the kernel when the launcher dies.
 * On several machines a watcher (rdzv.c) runs once a second in the same loop: it publishes a
 * local failure to the other machines and stops the job when one of them failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "launch.h"

typedef struct child {
    pid_t pid;               /* 0 once reaped */
    int status;              /* wait status once reaped */
    int stop_sig;            /* the signal that stopped it (SIGSTOP, SIGTSTP...), 0 if running */
    double stopped_at;       /* when (accel__now) */
    relay_stream *out, *err; /* NULL when the stream is inherited */
} child;

typedef struct job {
    const launch_config *cfg;
    child *kids;
    int n_alive;
    pid_t pgid;
    int first_failed; /* rank whose failure stopped the job, -1 if none */
    int stopping;     /* SIGTERM sent; later deaths are consequences, not causes */
    int killed;       /* SIGKILL sent */
    int interrupted;  /* signal received by the launcher, 0 if none */
    int remote_rc;    /* the watcher stopped the job (another machine failed): exit status */
    struct timespec kill_at;
} job;

/* "SIGALRM", "SIGRTMIN+3" (in buf), else "signal". */
static const char *signal_name(int sig, char buf[24])
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
        {SIGILL, "SIGILL"},       {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
        {SIGBUS, "SIGBUS"},       {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
        {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
        {SIGSTKFLT, "SIGSTKFLT"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
        {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGIO, "SIGIO"},
        {SIGPWR, "SIGPWR"},       {SIGSYS, "SIGSYS"},   {SIGSTOP, "SIGSTOP"},
        {SIGTSTP, "SIGTSTP"},     {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (names[i].sig == sig) {
            return names[i].name;
        }
    }
    if (sig >= SIGRTMIN && sig <= SIGRTMAX) {
        snprintf(buf, 24, "SIGRTMIN+%d", sig - SIGRTMIN);
        return buf;
    }
    return "signal";
}

int launch_exit_status(int wstatus)
{
    if (WIFEXITED(wstatus)) {
        return WEXITSTATUS(wstatus);
    }
    if (WIFSIGNALED(wstatus)) {
        return 128 + WTERMSIG(wstatus);
    }
    return 1;
}

void launch_describe_status(int wstatus, char *buf, size_t n)
{
    if (WIFEXITED(wstatus)) {
        snprintf(buf, n, "exit code %d", WEXITSTATUS(wstatus));
    } else if (WIFSIGNALED(wstatus)) {
        int sig = WTERMSIG(wstatus);
        char name[24];
        snprintf(buf, n, "killed by %s (signal %d)%s", signal_name(sig, name), sig,
                 WCOREDUMP(wstatus) ? ", core dumped" : "");
    } else {
        snprintf(buf, n, "wait status %#x", (unsigned)wstatus);
    }
}

static double seconds_until(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(t->tv_sec - now.tv_sec) + 1e-9 * (double)(t->tv_nsec - now.tv_nsec);
}

/* Sends sig to the whole group (reaching grandchildren) and to any child that left it. */
static void signal_all(job *j, int sig)
{
    if (j->n_alive == 0) {
        return;
    }
    kill(-j->pgid, sig);
    for (int r = 0; r < j->cfg->n_procs; r++) {
        pid_t pid = j->kids[r].pid;
        if (pid > 0 && getpgid(pid) != j->pgid) {
            kill(pid, sig);
        }
    }
}

/* After a teardown, once every rank is reaped: the ranks' own children that outlived them (a
 * worker that ignores the forwarded signal, as a shell's background job ignores SIGINT and
 * SIGQUIT) are the launcher's children now (PR_SET_CHILD_SUBREAPER, launch_supervise), so
 * while one is unreaped the group's id cannot be reused and signalling the group is safe.
 * They had the stop signal with the group; what is left at the end of the grace period gets
 * SIGKILL, as the ranks do. Bounded: a process stuck in the kernel is left after 5 s more. */
static void sweep_orphans(job *j)
{
    struct timespec give_up = j->kill_at;
    give_up.tv_sec += 5;
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (waitid(P_PGID, (id_t)j->pgid, &si, WEXITED | WNOHANG) != 0) {
            return; /* ECHILD: no process of ours is left in the group */
        }
        if (si.si_pid != 0) {
            continue; /* reaped one */
        }
        if (!j->killed && seconds_until(&j->kill_at) <= 0) {
            kill(-j->pgid, SIGKILL);
            j->killed = 1;
        }
        if (seconds_until(&give_up) <= 0) {
            return;
        }
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* Names the job's processes that are stopped (kill -STOP, SIGTSTP) when the job
 * fails: a stopped rank makes its peers time out, and on several machines the first failure
 * is often another machine's rank that waited for it, so without this line nothing here would
 * point at the process that caused it. */
static void say_stopped(const job *j)
{
    const double now = accel__now();
    for (int r = 0; r < j->cfg->n_procs; r++) {
        const child *k = &j->kids[r];
        if (k->pid > 0 && k->stop_sig != 0) {
            char name[24], what[120], msg[160];
            snprintf(what, sizeof(what), "rank %d (pid %d) is stopped (%s) for %.1f s",
                     j->cfg->rank_base + r, (int)k->pid, signal_name(k->stop_sig, name),
                     now - k->stopped_at);
            int n = snprintf(msg, sizeof(msg), "accel launch: %s\n", what);
            relay_write_all(2, msg, n > 0 ? (size_t)n : 0);
            if (j->cfg->watch != NULL && j->cfg->watch->on_stopped != NULL) {
                j->cfg->watch->on_stopped(j->cfg->watch->arg, what); /* machine 0 says it too */
            }
        }
    }
}

/* Starts the teardown: SIGTERM now, SIGKILL at now + grace. */
static void stop_all(job *j, int sig)
{
    if (j->stopping) {
        return;
    }
    j->stopping = 1;
    signal_all(j, sig);
    /* A stopped process (SIGSTOP, a debugger's ^Z) only acts on SIGTERM once continued. */
    signal_all(j, SIGCONT);
    clock_gettime(CLOCK_MONOTONIC, &j->kill_at);
    double g = j->cfg->grace_s;
    j->kill_at.tv_sec += (time_t)g;
    j->kill_at.tv_nsec += (long)((g - (double)(time_t)g) * 1e9);
    if (j->kill_at.tv_nsec >= 1000000000L) {
        j->kill_at.tv_sec++;
        j->kill_at.tv_nsec -= 1000000000L;
    }
    /* After the signals: publishing the line to machine 0 is a store call (up to 5 s when
     * machine 0's launcher is stuck), which must not hold back the job's teardown. */
    say_stopped(j);
}

static void reap(job *j)
{
    for (;;) {
        int st;
        /* Also told when a process stops or continues (say_stopped). */
        pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
        if (pid <= 0) {
            return;
        }
        for (int r = 0; r < j->cfg->n_procs; r++) {
            child *k = &j->kids[r];
            if (k->pid != pid) {
                continue;
            }
            if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
                k->stop_sig = WIFSTOPPED(st) ? WSTOPSIG(st) : 0;
                k->stopped_at = accel__now();
                break;
            }
            /* Everything it wrote is in the pipes now; relay it before any summary. */
            if (k->out) {
                relay_drain(k->out);
            }
            if (k->err) {
                relay_drain(k->err);
            }
            k->pid = 0;
            k->status = st;
            j->n_alive--;
            int failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
            if (failed && !j->stopping) {
                j->first_failed = r;
                if (j->cfg->watch != NULL) {
                    /* The other machines hear of it before our own teardown starts. */
                    j->cfg->watch->on_failure(j->cfg->watch->arg, j->cfg->rank_base + r, st);
                }
                stop_all(j, SIGTERM);
            }
            break;
        }
    }
}

static void on_signal(job *j, int sig)
{
    if (sig == SIGCHLD) {
        reap(j);
        return;
    }
    char name[24];
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        char msg[96];
        int n =
            snprintf(msg, sizeof(msg), "accel launch: received %s, passed on to every process\n",
                     signal_name(sig, name));
        relay_write_all(2, msg, (size_t)n);
        signal_all(j, sig);
        return;
    }
    if (j->interrupted == 0 && !j->stopping) {
        j->interrupted = sig;
        char msg[96];
        int n = snprintf(msg, sizeof(msg), "accel launch: received %s, stopping all processes\n",
                         signal_name(sig, name));
        relay_write_all(2, msg, (size_t)n);
        stop_all(j, sig);
    } else if (!j->killed) {
        /* A second interrupt means "now": do not wait out the grace period. */
        if (j->interrupted == 0) {
            j->interrupted = sig;
        }
        signal_all(j, SIGKILL);
        j->killed = 1;
    }
}

/* The launcher's SIGXFSZ disposition before it ignored the signal, given back to the children. */
static void (*xfsz_before)(int) = SIG_DFL;

/* Child side of fork: never returns. Only async-signal-safe calls until exec. */
static void exec_child(const launch_config *cfg, int rank, pid_t pgid, int out_w, int err_w,
                       const sigset_t *old_mask, pid_t launcher)
{
    /* The ranks die with the launcher, however it dies (kill -9 included): the kernel sends
     * SIGKILL when it exits, and the mark survives exec. If it died before prctl took effect,
     * we have been reparented already and no signal will come: leave now. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) {
        _exit(128 + SIGKILL);
    }
    setpgid(0, pgid);
    if (out_w >= 0) {
        dup2(out_w, 1);
    }
    if (err_w >= 0) {
        dup2(err_w, 2);
    }
    /* Safe here: no lock inside setenv can be held, since the launcher's only other thread
     * (machine 0's store server, rdzv.c) never touches the environment; malloc's locks are
     * reset by glibc's fork. */
    char num[16];
    snprintf(num, sizeof(num), "%d", cfg->rank_base + rank);
    setenv("RANK", num, 1);
    setenv("ROLE_RANK", num, 1); /* torchrun's rank within the role: one role per job */
    snprintf(num, sizeof(num), "%d", rank);
    setenv("LOCAL_RANK", num, 1);
    if (cfg->cpusets != NULL) {
        /* Best effort: a refusal (a cgroup that changed meanwhile) leaves the default placement. */
        (void)sched_setaffinity(0, sizeof(cpu_set_t), &cfg->cpusets[rank]);
    }
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, xfsz_before == SIG_ERR ? SIG_DFL : xfsz_before);
    sigprocmask(SIG_SETMASK, old_mask, NULL);
    execv(cfg->path, cfg->argv);
    char msg[512];
    int e = errno;
    int n =
        snprintf(msg, sizeof(msg), "accel launch: cannot run '%s': %s%s\n", cfg->path, strerror(e),
                 e == ENOEXEC ? " (neither a binary for this machine nor a script whose "
                                "first line is #! and a runnable interpreter, e.g. #!/bin/sh)"
                              : "");
    relay_write_all(2, msg, n > 0 ? (size_t)n : 0);
    _exit(127);
}

/* The pid holding an flock on the file open as fd (from /proc/locks), or 0 when unknown. */
static int flock_holder(int fd)
{
    struct stat sb;
    FILE *f = fstat(fd, &sb) == 0 ? fopen("/proc/locks", "r") : NULL;
    char line[256];
    int pid = 0;
    while (f != NULL && pid == 0 && fgets(line, sizeof(line), f) != NULL) {
        char kind[16];
        int p;
        unsigned maj, min;
        unsigned long ino;
        /* "1: FLOCK  ADVISORY  WRITE 4242 08:02:1234 0 EOF"; waiters' lines have "->" first. */
        if (sscanf(line, "%*d: %15s %*s %*s %d %x:%x:%lu", kind, &p, &maj, &min, &ino) == 5 &&
            strcmp(kind, "FLOCK") == 0 && ino == (unsigned long)sb.st_ino &&
            makedev(maj, min) == sb.st_dev) {
            pid = p;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return pid;
}

/* Opens the tee file of one stream: DIR/rank<r>.stdout or .stderr, mode 0600 (logs may hold
 * secrets the program prints). A name planted in the folder is never followed or truncated:
 * no symbolic link (O_NOFOLLOW), no FIFO or device (O_NONBLOCK, then fstat), no file of
 * another user or with a second hard link; nor is a log another launch is writing (an flock
 * held as long as the file is open: two jobs given the same --log_dir emptied each other's
 * logs and wrote over them); only then is an old log of ours emptied (on a restart, appended
 * to: the failed attempt's output stays). */
static int open_tee(const char *path, int append)
{
    int fd = open(
        path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : 0),
        0600);
    struct stat sb;
    const char *why = fd < 0 ? strerror(errno) : NULL;
    if (fd < 0 && errno == ELOOP) {
        why = "it is a symbolic link (refusing to follow it)";
    } else if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        why = "it is not a regular file";
    } else if (fd >= 0 && (sb.st_uid != geteuid() || sb.st_nlink != 1)) {
        why = sb.st_uid != geteuid() ? "it belongs to another user" : "it has other hard links";
    } else if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        /* (Other flock errors: a file system without locks, where only this check is lost.) */
        static char busy[160]; /* why outlives this block */
        char holder[32] = "";
        int pid = flock_holder(fd);
        if (pid > 0) {
            snprintf(holder, sizeof(holder), ", pid %d", pid);
        }
        snprintf(busy, sizeof(busy),
                 "another job is writing it%s (two launches with the same --log_dir): give each "
                 "job its own --log_dir",
                 holder);
        why = busy;
    } else if (fd >= 0 && ((!append && ftruncate(fd, 0) != 0) || fchmod(fd, 0600) != 0 ||
                           fcntl(fd, F_SETFL, append ? O_APPEND : 0) != 0)) {
        why = strerror(errno);
    }
    if (why != NULL) {
        fprintf(stderr, "accel launch: error: cannot use log file %s: %s\n", path, why);
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

/* Creates the pipe and relay of one stream when it needs capturing. Returns 0 or -1. */
static int make_stream(const launch_config *cfg, int rank, int is_err, relay_stream **out,
                       int *write_end)
{
    int tee_bit = is_err ? LAUNCH_TEE_STDERR : LAUNCH_TEE_STDOUT;
    int tee = cfg->log_dir != NULL && (cfg->tee & tee_bit);
    *out = NULL;
    *write_end = -1;
    if (cfg->n_procs == 1 && cfg->watch == NULL && !tee) {
        return 0; /* inherited: the program writes straight to our stdout/stderr */
    }
    int file_fd = -1;
    char file_name[4096];
    int len = snprintf(file_name, sizeof(file_name), "%s/rank%d.%s", tee ? cfg->log_dir : "",
                       cfg->rank_base + rank, is_err ? "stderr" : "stdout");
    if (tee && (size_t)len >= sizeof(file_name)) {
        /* Cut to fit, the two streams' names could meet in one file. */
        fprintf(stderr, "accel launch: error: cannot use log file %.64s...: %s\n", file_name,
                strerror(ENAMETOOLONG));
        return -1;
    }
    if (tee && (file_fd = open_tee(file_name, cfg->append_logs)) < 0) {
        return -1;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "accel launch: error: pipe: %s\n", strerror(errno));
        close(file_fd);
        return -1;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    /* One machine of several prefixes its single process too: ranks are named globally. */
    int prefix = cfg->n_procs > 1 || cfg->watch != NULL;
    *out =
        relay_new(p[0], cfg->rank_base + rank, is_err ? 2 : 1, prefix, file_fd, file_name, is_err);
    if (*out == NULL) {
        fprintf(stderr, "accel launch: error: out of memory\n");
        close(p[0]);
        close(p[1]);
        if (file_fd >= 0) {
            close(file_fd);
        }
        return -1;
    }
    *write_end = p[1];
    return 0;
}

static void print_summary(job *j)
{
    const launch_config *cfg = j->cfg;
    char what[96];
    const int base = cfg->rank_base;
    if (j->first_failed >= 0) {
        child *k = &j->kids[j->first_failed];
        launch_describe_status(k->status, what, sizeof(what));
        fprintf(stderr, "accel launch: rank %d failed: %s\n", base + j->first_failed, what);
        if (k->err != NULL) {
            fprintf(stderr, "accel launch: last lines of rank %d's stderr:\n",
                    base + j->first_failed);
            if (relay_print_tail(k->err, "    ") == 0) {
                fprintf(stderr, "    (nothing)\n");
            }
        }
    }
    if (cfg->n_procs > 1 || cfg->watch != NULL) {
        fprintf(stderr, "accel launch: status of the %d processes %s:", cfg->n_procs,
                cfg->watch != NULL ? "of this machine" : "of the job");
        for (int r = 0; r < cfg->n_procs; r++) {
            launch_describe_status(j->kids[r].status, what, sizeof(what));
            fprintf(stderr, "%s rank %d %s", r ? ";" : "", base + r, what);
        }
        fputc('\n', stderr);
    }
}

int launch_supervise(const launch_config *cfg, launch_outcome *outcome)
{
    *outcome = LAUNCH_NOT_STARTED;
    job j = {.cfg = cfg, .first_failed = -1};
    int sfd = -1, rc = 1;
    struct pollfd *fds = NULL;
    relay_stream **owner = NULL; /* owner[i]: the stream polled as fds[i] */

    j.kids = accel__calloc((size_t)cfg->n_procs, sizeof(child));
    fds = accel__calloc(1 + 2 * (size_t)cfg->n_procs, sizeof(struct pollfd));
    owner = accel__calloc(1 + 2 * (size_t)cfg->n_procs, sizeof(relay_stream *));
    if (j.kids == NULL || fds == NULL || owner == NULL) {
        fprintf(stderr, "accel launch: error: out of memory\n");
        goto out;
    }

    /* Block the signals we wait for before the first fork so none is lost in between. */
    sigset_t mask, old_mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    /* Every signal whose default action ends the process stops the job as torchrun's SIGTERM
     * does (forwarded, then the teardown and the sweep of the ranks' children, exit 128 +
     * signal, naming it); SIGUSR1/2 (a batch system's "time is nearly up") are passed on, as
     * under mpirun. Unhandled, each of them killed the launcher at once: no summary, and the
     * ranks' own children left running (the ranks die with it by PDEATHSIG). Not caught:
     * SIGKILL and SIGSTOP (they cannot be), the launcher's own faults (SIGSEGV, SIGBUS,
     * SIGFPE, SIGILL, SIGTRAP, SIGSYS: a bug of ours must stay fatal), and SIGPIPE / SIGXFSZ
     * (ignored below: the writes fail instead). The launcher's own abort() stays fatal too:
     * it unblocks SIGABRT before raising it. A signal ignored when we started (nohup's SIGHUP,
     * SIGINT of a background job) stays ignored: the children inherit that, and we do not turn
     * it into a teardown. */
    static const int caught[] = {SIGINT,    SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM,
                                 SIGVTALRM, SIGPROF, SIGXCPU, SIGABRT, SIGIO,   SIGPWR,  SIGSTKFLT};
    const int n_caught = (int)(sizeof(caught) / sizeof(caught[0]));
    for (int i = 0; i < n_caught + (SIGRTMAX - SIGRTMIN + 1); i++) {
        const int sig = i < n_caught ? caught[i] : SIGRTMIN + (i - n_caught);
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_IGN) {
            sigaddset(&mask, sig);
        }
    }
    sigprocmask(SIG_BLOCK, &mask, &old_mask);
    /* On several machines a stop signal only set a flag until now (stop.c): the old actions
     * go back (a child between fork and exec must not take the flag's), and one that came
     * since the rendezvous stops the job before anything starts. */
    launch_stop_release();
    const int early = launch_stop_signal();
    if (early != 0) {
        fprintf(stderr,
                "accel launch: interrupted by %s before the processes started: none was "
                "started\n",
                launch_stop_name(early));
        rc = 128 + early;
        *outcome = LAUNCH_INTERRUPTED;
        goto out_mask;
    }
    sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        fprintf(stderr, "accel launch: error: signalfd: %s\n", strerror(errno));
        goto out_mask;
    }
    /* A closed console must not kill the launcher (and so orphan the job), nor a log file
     * that reaches the file-size limit (ulimit -f): those writes fail with EPIPE / EFBIG
     * instead, and the relay says so (relay.c). */
    signal(SIGPIPE, SIG_IGN);
    xfsz_before = signal(SIGXFSZ, SIG_IGN);

    /* The ranks' orphaned children become ours, so that a teardown reaches them too
     * (sweep_orphans). Best effort: without it they are left as before. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    const pid_t self = getpid(); /* what the children's getppid() must say */
    for (int r = 0; r < cfg->n_procs; r++) {
        child *k = &j.kids[r];
        int out_w = -1, err_w = -1;
        if (make_stream(cfg, r, 0, &k->out, &out_w) != 0 ||
            make_stream(cfg, r, 1, &k->err, &err_w) != 0) {
            if (out_w >= 0) {
                close(out_w);
            }
            stop_all(&j, SIGKILL);
            goto wait_out;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "accel launch: error: fork of rank %d: %s\n", r, strerror(errno));
            stop_all(&j, SIGKILL);
            goto wait_out;
        }
        if (pid == 0) {
            exec_child(cfg, r, j.pgid, out_w, err_w, &old_mask, self);
        }
        if (r == 0) {
            j.pgid = pid;
        }
        /* Also set from the parent so the group exists before we might signal it. */
        setpgid(pid, j.pgid);
        k->pid = pid;
        j.n_alive++;
        if (out_w >= 0) {
            close(out_w);
        }
        if (err_w >= 0) {
            close(err_w);
        }
    }

wait_out:;
    /* The watcher runs once a second (a failure elsewhere is seen within a tick). */
    struct timespec next_tick;
    clock_gettime(CLOCK_MONOTONIC, &next_tick);
    next_tick.tv_sec += 1;
    while (j.n_alive > 0) {
        int nfds = 0;
        fds[nfds++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        for (int r = 0; r < cfg->n_procs; r++) {
            relay_stream *ss[2] = {j.kids[r].out, j.kids[r].err};
            for (int s = 0; s < 2; s++) {
                if (ss[s] != NULL && relay_fd(ss[s]) >= 0) {
                    owner[nfds] = ss[s];
                    fds[nfds++] = (struct pollfd){.fd = relay_fd(ss[s]), .events = POLLIN};
                }
            }
        }
        int timeout_ms = -1;
        if (j.stopping && !j.killed) {
            double left = seconds_until(&j.kill_at);
            timeout_ms = left <= 0 ? 0 : (int)(left * 1000.0) + 1;
        }
        if (cfg->watch != NULL) {
            double left = seconds_until(&next_tick);
            int tick_ms = left <= 0 ? 0 : (int)(left * 1000.0) + 1;
            timeout_ms = timeout_ms < 0 || tick_ms < timeout_ms ? tick_ms : timeout_ms;
        }
        int n = poll(fds, (nfds_t)nfds, timeout_ms);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "accel launch: error: poll: %s\n", strerror(errno));
            stop_all(&j, SIGKILL);
            signal_all(&j, SIGKILL);
            j.killed = 1;
        }
        if (n > 0) {
            /* Pipes first, so the lines a process wrote precede the news of its death. */
            for (int i = 1; i < nfds; i++) {
                if (fds[i].revents != 0) {
                    relay_pump(owner[i]);
                }
            }
            if (fds[0].revents & POLLIN) {
                struct signalfd_siginfo si;
                while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                    on_signal(&j, (int)si.ssi_signo);
                }
            }
        }
        if (cfg->watch != NULL && seconds_until(&next_tick) <= 0) {
            clock_gettime(CLOCK_MONOTONIC, &next_tick);
            next_tick.tv_sec += 1;
            int stop = cfg->watch->tick(cfg->watch->arg);
            if (stop != 0 && !j.stopping) {
                j.remote_rc = stop;
                stop_all(&j, SIGTERM);
            }
        }
        if (j.stopping && !j.killed && j.n_alive > 0 && seconds_until(&j.kill_at) <= 0) {
            signal_all(&j, SIGKILL);
            j.killed = 1;
        }
    }
    if (j.stopping && j.pgid > 0) {
        sweep_orphans(&j);
    }
    /* Whatever is left in the pipes (a stream whose child was reaped is already drained). */
    for (int r = 0; r < cfg->n_procs; r++) {
        if (j.kids[r].out) {
            relay_drain(j.kids[r].out);
        }
        if (j.kids[r].err) {
            relay_drain(j.kids[r].err);
        }
    }
    if (j.first_failed >= 0) {
        rc = launch_exit_status(j.kids[j.first_failed].status);
        *outcome = j.interrupted != 0 ? LAUNCH_INTERRUPTED : LAUNCH_FAILED;
        print_summary(&j);
    } else if (j.remote_rc != 0) {
        rc = j.remote_rc;
        *outcome = LAUNCH_FAILED;
        print_summary(&j);
    } else if (j.interrupted != 0) {
        rc = 128 + j.interrupted;
        *outcome = LAUNCH_INTERRUPTED;
        print_summary(&j);
    } else if (j.stopping) {
        rc = 1; /* could not start every process; the reason was printed */
    } else {
        rc = 0;
        *outcome = LAUNCH_SUCCEEDED;
    }
    close(sfd);
out_mask:
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
out:
    if (j.kids != NULL) {
        for (int r = 0; r < cfg->n_procs; r++) {
            relay_free(j.kids[r].out);
            relay_free(j.kids[r].err);
        }
    }
    accel__free(j.kids);
    accel__free(fds);
    accel__free(owner);
    return rc;
}
