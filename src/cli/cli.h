/*
 * Internal interface of the `accel` command-line tool (src/cli/). Not installed.
 *
 * Each verb declares its options once, in a table of cli_option; the same table drives the
 * parser (cli_parse) and the generated `accel <verb> --help` text (cli_print_help), so the two
 * cannot drift apart. Verbs are listed in one table in main.c.
 *
 * Exit statuses of the tool: 0 success, 1 runtime failure, 2 usage error (unknown verb or
 * option, bad value, missing program); `accel launch` exits with its failed process's status.
 */
#ifndef ACCEL_CLI_H
#define ACCEL_CLI_H

#include <stdio.h>

#define CLI_EXIT_USAGE 2

/* A heading of --help (Accelerate groups launch's options this way). */
typedef struct cli_group {
    const char *title;       /* "Hardware Selection Arguments" */
    const char *description; /* one line under the title, or NULL */
} cli_group;

/* One option of a verb. `name` is the long name without dashes, spelled with '_' (as
 * Accelerate, `--foo-bar` is accepted too). short_name is 0 when there is no -x form. */
typedef struct cli_option {
    const char *name;
    char short_name;
    int takes_value;     /* 1: `--name V` / `--name=V`; 0: a flag, stored as "1" when given */
    const char *dflt;    /* value when not given (NULL: unset); shown in --help */
    const char *metavar; /* placeholder in --help for a value ("N", "DIR"); NULL = "VALUE" */
    const char *help;
    const cli_group *group; /* heading in --help; options of a group are consecutive; NULL:
                               under "options" */
    /* Key of the Accelerate config file that fills the option when it is not given
     * ("num_processes", "mpirun_config.mpirun_hostfile"; cli_fill_from_config), or NULL. */
    const char *config_key;
} cli_option;

/* A verb: `accel <name> [options] <positional>`. */
typedef struct cli_verb cli_verb;
struct cli_verb {
    const char *name;
    const char *summary;       /* one line for `accel --help` */
    const char *positional;    /* usage text after the options ("[--] PROGRAM [ARGS...]"), or NULL
                                  when the verb takes no positional arguments */
    const char *description;   /* paragraph printed by --help after the usage line; may be NULL */
    const cli_option *options; /* terminated by an entry with name == NULL */
    /* Runs the verb; returns the process exit status. */
    int (*run)(const cli_verb *verb, int argc, char **argv);
};

/* Parsed options of one verb: values[i] belongs to verb->options[i]. */
#define CLI_MAX_OPTIONS 64
typedef struct cli_args {
    const char *values[CLI_MAX_OPTIONS]; /* the given value, else the file's, else dflt */
    int given[CLI_MAX_OPTIONS];          /* 1 when given on the command line */
    int config_line[CLI_MAX_OPTIONS];    /* > 0: the value came from the config file's line */
    const char *config_path;             /* that file (cli_fill_from_config) */
    int first_positional;                /* index in argv of the first positional argument */
    int help;                            /* --help / -h was given */
} cli_args;

/*
 * Parses argv[0..argc) (argv[0] is the verb name) against verb->options. Options stop at the
 * first argument that does not start with '-', or after "--", so that a program's own flags
 * pass through untouched. On a usage error prints "accel <verb>: error: ..." and the usage line
 * to stderr and returns -1; otherwise 0.
 */
int cli_parse(const cli_verb *verb, int argc, char **argv, cli_args *out);

/* The start of every verb: parses argv; returns 1 with the verb's exit status in *status when
 * it is done already (--help printed: 0; usage error printed: CLI_EXIT_USAGE), else 0. */
int cli_begin(const cli_verb *verb, int argc, char **argv, cli_args *a, int *status);

/* Index of the option named `name` in verb->options (asserted to exist). */
int cli_option_index(const cli_verb *verb, const char *name);

/* Value of option `name` (given or default); NULL when unset. */
const char *cli_value(const cli_verb *verb, const cli_args *a, const char *name);
int cli_given(const cli_verb *verb, const cli_args *a, const char *name);

/* Accelerate's precedence: every option with a config_key that was not given on the command
 * line takes the file's value of that key (a scalar that is not null). `root` is the parsed
 * file (base/ytree.h), NULL when there is none; `path` names it in messages. */
struct accel__ynode;
void cli_fill_from_config(const cli_verb *verb, cli_args *a, const struct accel__ynode *root,
                          const char *path);
/* Where option `name`'s value came from, for messages: "--num_processes 2", or "config file
 * F, line 3: num_processes: 2"; "--name (default)" when neither. Returns buf. */
const char *cli_source(const cli_verb *verb, const cli_args *a, const char *name, char *buf,
                       size_t nbytes);

/* Prints the generated help of a verb (usage line, description, option table) to f. */
void cli_print_help(const cli_verb *verb, FILE *f);
/* Prints "usage: accel <verb> [options] ..." to f. */
void cli_print_usage(const cli_verb *verb, FILE *f);
/* Prints "accel <verb>: error: <msg>", the usage line and a --help hint to stderr. */
void cli_usage_error(const cli_verb *verb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* What is wrong with `addr` as the main process's address (--main_process_ip, the config
 * key, `accel config`'s answer): NULL when it can be a host name or an IPv4/IPv6 address, else
 * a static message (empty, "host:port", "[v6]", longer than a host name can be). */
const char *cli_address_problem(const char *addr);

/* Verbs (one file each). */
extern const cli_verb cli_verb_launch;
extern const cli_verb cli_verb_config;
extern const cli_verb cli_verb_test;
extern const cli_verb cli_verb_env;
extern const cli_verb cli_verb_estimate_memory;
extern const cli_verb cli_verb_merge_weights;

#endif /* ACCEL_CLI_H */
