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
    int n_procs;      /* processes on this machine (num_processes / num_machines) */
    int num_machines; /* 1: several machines are refused until multi-machine support */
    int machine_rank; /* 0 */
    const char *master_addr; /* main_process_ip, else 127.0.0.1 */
    int port;                /* MASTER_PORT; 0 = pick a free one */
    const char *rdzv_backend; /* multi-machine rendezvous (static by default) */
    int same_network;
    const char *mixed_precision; /* no | fp16 | bf16 | fp8 */
    int cpu, debug;
    int zero_stage;                  /* -1: not set by a flag or the file */
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

typedef struct launch_config {
    int n_procs;
    const char *path; /* resolved executable */
    char **argv;      /* the program's argv (argv[0] as the user typed it), NULL-terminated */
    int tee;          /* LAUNCH_TEE_* bits: streams also written to log_dir */
    const char *log_dir;
    double grace_s; /* SIGTERM -> SIGKILL delay when tearing down */
    /* When not NULL, child r is bound to cpusets[r] before exec (--cpu_affinity). */
    const cpu_set_t *cpusets;
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

/* ---- relay.c ---- */

/* One child output stream (its stdout or its stderr) read by the launcher. */
typedef struct relay_stream relay_stream;

/*
 * Creates a stream reading `fd` (owned: closed at EOF or by relay_free) for rank `rank`.
 * console_fd: where lines go (1 or 2); prefix: prepend "[rank<r>]: " to every line;
 * file_fd: tee file (owned) or -1; keep_tail: remember the last lines for the failure summary.
 * Returns NULL when out of memory.
 */
relay_stream *relay_new(int fd, int rank, int console_fd, int prefix, int file_fd, int keep_tail);
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

/* write(2) of all n bytes, retrying on EINTR and short writes; errors are ignored (the
 * launcher's own output may be a closed pipe). */
void relay_write_all(int fd, const void *buf, size_t n);

#endif /* ACCEL_CLI_LAUNCH_H */
