/*
 * Internal interface between the pieces of `accel launch`: its options and their resolution
 * with the config file (launch_opts.c), the verb (launch.c: program lookup, environment,
 * restarts, exit status), the supervisor (supervise.c: fork/exec, event loop, teardown,
 * failure summary) and the output relay (relay.c: children's pipes to the console with rank
 * prefixes, --tee files, stderr tails).
 */
#ifndef ACCEL_CLI_LAUNCH_H
#define ACCEL_CLI_LAUNCH_H

#include <sched.h>
#include <stddef.h>

#include "base/config.h"
#include "cli.h"

/* ---- launch_opts.c ---- */

/* The option table of accel launch (Accelerate's names, groups and config keys). */
extern const cli_option launch_options[];

/* What accel launch runs: its flags, else the config file's keys, else the defaults. */
typedef struct launch_settings {
    int n_procs;              /* processes on this machine (num_processes / num_machines) */
    int num_machines;         /* machines of the job (1: everything stays on this one) */
    int machine_rank;         /* 0 .. num_machines-1 */
    const char *master_addr;  /* main_process_ip, else 127.0.0.1 */
    int port;                 /* MASTER_PORT; 0 = pick a free one */
    const char *rdzv_backend; /* static (default) or c10d: both meet at the launchers' store */
    const char *role;         /* --role: ROLE_NAME of the processes ("default") */
    double rdzv_timeout_s;    /* --rdzv_conf timeout=S (join_timeout=S): wait for the machines */
    int same_network;
    int preflight;               /* --preflight: check every hop before starting the program */
    const char *mpirun_hostfile; /* run the job through mpirun with this hostfile */
    const char *mpirun_ccl;      /* CCL_WORKER_COUNT under mpirun, NULL when not given */
    const char *mixed_precision; /* no | fp16 | bf16 | fp8 */
    int cpu, debug;
    int zero_stage;                  /* -1: not set by a flag or the file */
    const char *zero_shard_size;     /* --fsdp_sharding_strategy: "machine" (HYBRID_*) or "0" */
    int gradient_accumulation_steps; /* 0: not set */
    const char *gpu_ids;             /* NULL: all */
    long threads;                    /* OMP_NUM_THREADS for every process */
    int tee;
    const char *log_dir;
    double grace_s;
    int bind_cpus; /* --cpu_affinity auto */
    int max_restarts;
    double monitor_interval_s;
    const char *program; /* argv[first_positional] */
    char **program_argv;
    /* ACCEL_LAUNCH_SOURCES: "VAR\tsource\n" for each variable set from a flag, the config
     * file or a default, so that accel_init can name the real source of what it reads. */
    char sources[4096];
} launch_settings;

/*
 * Parses accel launch's command line and reads the config file (--config_file, else
 * ACCELERATE_CONFIG_FILE, else the default locations) into *s; the file fills every option
 * not given (Accelerate's precedence). Prints the file's notes as warnings. Returns 0; 1 when
 * --help was printed; -1 after printing an error (usage, bad file, something not supported).
 * On 0, *cfg holds the file (cfg->present 0 when none); release it with accel__config_free.
 */
int launch_resolve(const cli_verb *verb, int argc, char **argv, launch_settings *s,
                   accel__config *cfg);

/* --tee bits (torchrun's meaning: 1 stdout, 2 stderr, 3 both). */
#define LAUNCH_TEE_STDOUT 1
#define LAUNCH_TEE_STDERR 2

/* A watcher of the other machines (rdzv.c), called by the supervisor. */
typedef struct launch_watch {
    /* Called about once a second while processes run: 0 to go on; else the job must stop (the
     * watcher printed why) and the value is the launcher's exit status. */
    int (*tick)(void *arg);
    /* Called once, when the first local process fails (rank: global), before the teardown. */
    void (*on_failure)(void *arg, int rank, int wstatus);
    /* Called as the teardown starts, once per local process that is stopped then, with the
     * text this launcher prints of it ("rank 1 (pid 42) is stopped (SIGSTOP) for 2.0 s"). */
    void (*on_stopped)(void *arg, const char *what);
    void *arg;
} launch_watch;

typedef struct launch_config {
    int n_procs;
    int rank_base;    /* RANK of local process r is rank_base + r (machine_rank * n_procs) */
    const char *path; /* resolved executable */
    char **argv;      /* the program's argv (argv[0] as the user typed it), NULL-terminated */
    int tee;          /* LAUNCH_TEE_* bits: streams also written to log_dir */
    const char *log_dir;
    double grace_s; /* SIGTERM -> SIGKILL delay when tearing down */
    /* When not NULL, child r is bound to cpusets[r] before exec (--cpu_affinity). */
    const cpu_set_t *cpusets;
    const launch_watch *watch; /* NULL on one machine */
    int append_logs; /* a restart: the log files are appended to, so earlier attempts' output
                      * (the failure that caused the restart) is kept */
} launch_config;

/* How a supervised attempt ended. */
typedef enum launch_outcome {
    LAUNCH_SUCCEEDED,   /* every process exited 0 */
    LAUNCH_FAILED,      /* a process failed (a restart may help) */
    LAUNCH_INTERRUPTED, /* a signal to the launcher stopped the job */
    LAUNCH_NOT_STARTED, /* the launcher could not start every process (reason printed) */
} launch_outcome;

/*
 * Starts cfg->n_procs copies of the program (RANK / LOCAL_RANK set per child, the rest of the
 * environment inherited from the caller, which has set the job-wide variables), relays their
 * output, and waits for all of them. Returns the launcher's exit status: 0 when all succeeded,
 * else the status of the first process that failed (exit code, or 128 + signal), or 128 + the
 * signal that interrupted the launcher; *outcome says which. Prints the failure summary.
 */
int launch_supervise(const launch_config *cfg, launch_outcome *outcome);

/* Describes a wait status: "exit code 3", "killed by SIGKILL (signal 9)". */
void launch_describe_status(int wstatus, char *buf, size_t n);
/* 128 + signal, or the exit code, of a wait status. */
int launch_exit_status(int wstatus);

/* ---- rdzv_record.c ---- */

/* Checks that machine m's rendezvous record rec was started with the same job shape as this
 * machine (s); its CPU token ("" when the record has none) goes to token (cap 64). 0, or -1
 * with why (cap bytes) naming the difference and both machines. */
int launch_check_record(const launch_settings *s, int m, const char *rec, char *token, char *why,
                        size_t cap);
/* The backend the processes will pick by default (MULTINODE.md), or ACCEL_BACKEND, into buf
 * (cap bytes) for the summary line; marked when this build lacks it (the processes will then
 * refuse to start). */
void launch_expected_backend(const launch_settings *s, char *buf, size_t cap);

/* ---- rdzv.c: the launchers of several machines ---- */

typedef struct launch_rdzv launch_rdzv;
struct accel__store;

/*
 * Meets the other machines' launchers at s->master_addr:s->port (machine 0 serves the store
 * there, port 0 picking a free one), waiting at most s->rdzv_timeout_s for all of them (saying
 * after a few seconds which ones it waits for), and prints the one-line rendezvous summary.
 * Returns 0 with *out, or the exit status after printing why: 1 (the missing machine ranks, a
 * taken port, an unreachable master, a mismatched job shape, a failure another launcher
 * published), 128 + the signal for SIGINT, SIGTERM or SIGHUP received while waiting. On 0 the
 * stop signals stay caught (stop.c) until the supervisor takes them over.
 */
int launch_rdzv_join(const launch_settings *s, launch_rdzv **out);
const char *launch_rdzv_job_id(const launch_rdzv *r); /* machine 0's random job id */
int launch_rdzv_port(const launch_rdzv *r);           /* the store's real port */
struct accel__store *launch_rdzv_store(launch_rdzv *r);
/* The supervisor's watcher: heartbeats, the job's first failure, lost launchers. */
const launch_watch *launch_rdzv_watch(const launch_rdzv *r);
/* cpus.c: the CPUs this launcher may use split into n_procs equal, contiguous shares (in CPU
 * id order, so neighbouring ranks get neighbouring cores), to free(); NULL when there are fewer
 * CPUs than processes (binding would stack them) or on allocation failure: no binding. */
cpu_set_t *launch_cpu_shares(long n_procs);
/* cpus.c: what identifies the CPUs this launcher's processes run on (boot id and allowed CPU
 * set; "-" when unknown), for the rendezvous record; cap >= 64. */
void launch_cpu_token(char *token, size_t cap);

/* How many machines' launchers (this one included) run on this host with the same allowed CPUs:
 * several machines emulated on one host, in network namespaces or on 127.0.0.1. 1: alone. */
int launch_rdzv_cpu_sharers(const launch_rdzv *r);
/* Starts attempt `attempt` (0, then the restart count): machine 0 makes its job id, the others
 * fetch it. Returns 0, or the exit status after printing why: 128 + a stop signal (published,
 * see launch_rdzv_check), else 1. */
int launch_rdzv_begin(launch_rdzv *r, int attempt);
/* Between the rendezvous and the processes' start (during: "the preflight"): 0, or the exit
 * status after saying why this launcher stops: 128 + a stop signal caught (launch_stop_signal;
 * published for the others with this machine's end, bounded to a second, and machine 0 then
 * serves a second longer for the machines that joined), or 1 for a failure another launcher
 * published or, on machine 0, another machine's launcher gone (its store connection closed:
 * published and named at once). Nothing more is to be done with r then but
 * launch_rdzv_free, after a signal. */
int launch_rdzv_check(launch_rdzv *r, const char *during);
/* After this machine's processes ended (rc, outcome from launch_supervise): publishes it;
 * machine 0 then keeps serving until every machine finished or is gone (with --max_restarts
 * every machine waits). Returns the launcher's exit status (a failure elsewhere when its own
 * processes succeeded, where it waited); *again: 1 when every machine starts the job again. */
int launch_rdzv_finish(launch_rdzv *r, int rc, launch_outcome outcome, int *again);
void launch_rdzv_free(launch_rdzv *r);

/* ---- stop.c: SIGINT, SIGTERM and SIGHUP before the processes run (several machines) ---- */

/* From here on the stop signals only set a flag (launch_stop_signal); one ignored now stays
 * ignored. The flag is cleared; nothing happens while they are already caught. */
void launch_stop_catch(void);
/* Puts back the actions launch_stop_catch found (also in a forked child before it does
 * anything else); the flag stays. The supervisor calls it once it has blocked them. */
void launch_stop_release(void);
/* The stop signal caught since launch_stop_catch, 0 if none. */
int launch_stop_signal(void);
/* "SIGINT", "SIGTERM", "SIGHUP". */
const char *launch_stop_name(int sig);

/* ---- preflight.c ---- */

/* --preflight: every local rank (a forked child) connects to the store and to every machine's
 * launcher; all launchers wait for all results. Returns 0, or 1 after naming each failing hop
 * ("rank 3 (machine 1) -> machine 0's launcher at A:P: connection refused") or a failure
 * another launcher published, or 128 + a stop signal (launch_rdzv_check); the probes are
 * gone on return. */
int launch_preflight(const launch_settings *s, launch_rdzv *r);

/* ---- mpirun.c ---- */

/* --mpirun_hostfile: runs the job through mpirun, each rank under `accel __mpirank` (which
 * names the rank that died); returns the exit status. */
int launch_mpirun(const launch_settings *s, const char *program_path);
/* mpirun's (else mpiexec's) path in PATH, written to out; -1 when neither is there. */
int mpirun_find(char *out, size_t cap);
/* The hidden verb `accel __mpirank PROGRAM ARGS...` that mpirun starts for each rank. */
extern const cli_verb cli_verb_mpirank;

/* ---- relay.c ---- */

/* One child output stream (its stdout or its stderr) read by the launcher. */
typedef struct relay_stream relay_stream;

/*
 * Creates a stream reading `fd` (owned: closed at EOF or by relay_free) for rank `rank`.
 * console_fd: where lines go (1 or 2); prefix: prepend "[rank<r>]: " to every line;
 * file_fd: tee file (owned) or -1, file_name its path (copied; named once on stderr if a write
 * to it fails, e.g. a full disk: the output then goes on to the console only); keep_tail:
 * remember the last lines for the failure summary. Returns NULL when out of memory.
 */
relay_stream *relay_new(int fd, int rank, int console_fd, int prefix, int file_fd,
                        const char *file_name, int keep_tail);
void relay_free(relay_stream *s);
/* The pipe's fd, or -1 once closed. */
int relay_fd(const relay_stream *s);
/* Reads what is available without blocking and relays complete lines. At EOF flushes the
 * partial last line (with a newline added) and closes the fd. */
void relay_pump(relay_stream *s);
/* Reads until EOF or until the pipe is empty (a grandchild may hold it open), then flushes
 * the partial line and closes: used once the child has exited. */
void relay_drain(relay_stream *s);
/* Writes the remembered last lines of the stream to fd 2, each indented. Returns the number
 * of lines written. */
int relay_print_tail(const relay_stream *s, const char *indent);

/* write(2) of all n bytes, retrying on EINTR and short writes. Returns 0, or the errno of
 * the write that failed (callers writing to the launcher's own output ignore it: that may be
 * a closed pipe). */
int relay_write_all(int fd, const void *buf, size_t n);

#endif /* ACCEL_CLI_LAUNCH_H */
