/*
 * `accel` entry point: the verb table and top-level flags (--help, --version). Each verb owns
 * its options and its run function (one file per verb); this file only dispatches, so adding
 * a verb is one line in `verbs` plus its file.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "base/fs.h"
#include "cli.h"
#include "launch.h"

static const cli_verb *const verbs[] = {
    &cli_verb_launch,
    &cli_verb_config,
    &cli_verb_test,
    &cli_verb_env,
    &cli_verb_estimate_memory,
    &cli_verb_merge_weights,
};
#define N_VERBS (sizeof(verbs) / sizeof(verbs[0]))

static void print_main_usage(FILE *f)
{
    fprintf(f, "usage: accel [--help] [--version] <command> [options] [args]\n");
}

static void print_main_help(FILE *f)
{
    print_main_usage(f);
    fprintf(f, "\naccel %s: Hugging Face Accelerate for C programs.\n\ncommands:\n",
            ACCEL_VERSION_STRING);
    for (size_t i = 0; i < N_VERBS; i++) {
        fprintf(f, "  %-12s %s\n", verbs[i]->name, verbs[i]->summary);
    }
    fprintf(f, "\noptions:\n  %-12s %s\n  %-12s %s\n", "-h, --help", "show this help and exit",
            "--version", "print the version and exit");
    fprintf(f, "\nRun 'accel <command> --help' for the options of a command.\n");
}

/* The output of a verb that prints a report (env, --help, estimate-memory, ...) may not have
 * reached its file: `accel env > report.txt` on a full disk used to exit 0 with an empty
 * report. Says so and fails, as coreutils do. (`launch` prints only its --help through stdio:
 * it relays the processes' output with write(2), so a job's status is never changed here.) */
static int check_stdout(const char *name, int rc)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) {
        return rc;
    }
    fprintf(stderr, "accel%s%s: error: cannot write the output: %s\n", name ? " " : "",
            name ? name : "", errno != 0 ? strerror(errno) : "write error");
    return rc != 0 ? rc : 1;
}

int main(int argc, char **argv)
{
    accel__keep_std_streams(); /* before any socket, pipe or signalfd takes fd 0-2 */
    if (argc < 2) {
        fprintf(stderr, "accel: error: no command given\n");
        print_main_usage(stderr);
        fprintf(stderr, "Try 'accel --help' for the list of commands.\n");
        return CLI_EXIT_USAGE;
    }
    const char *first = argv[1];
    if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0 || strcmp(first, "help") == 0) {
        print_main_help(stdout);
        return check_stdout(NULL, 0);
    }
    if (strcmp(first, "--version") == 0 || strcmp(first, "-V") == 0) {
        printf("accel %s\n", ACCEL_VERSION_STRING);
        return check_stdout(NULL, 0);
    }
    if (strcmp(first, cli_verb_mpirank.name) == 0) { /* internal, not listed in --help */
        return cli_verb_mpirank.run(&cli_verb_mpirank, argc - 1, argv + 1);
    }
    for (size_t i = 0; i < N_VERBS; i++) {
        if (strcmp(first, verbs[i]->name) == 0) {
            /* The verb sees argv[0] = its own name, as a program would. */
            int rc = verbs[i]->run(verbs[i], argc - 1, argv + 1);
            return check_stdout(verbs[i]->name, rc);
        }
    }
    if (first[0] == '-') {
        fprintf(stderr, "accel: error: unknown option '%s'\n", first);
    } else {
        fprintf(stderr, "accel: error: unknown command '%s'\n", first);
    }
    print_main_usage(stderr);
    fprintf(stderr, "Try 'accel --help' for the list of commands.\n");
    return CLI_EXIT_USAGE;
}
