/*
 * args.h: the examples' command lines, read from one table of options per program.
 *
 * Each option is "--name VALUE", or a switch without a value. An integer must be a whole
 * decimal number inside the option's range and a real a finite number, so "--steps 5x",
 * "--lr abc" or a count past INT_MAX is an error that names the flag, never a silent 0 or a
 * wrapped number; a string may not be empty. Given twice, the last value wins (as argparse).
 * --help prints the usage on stdout; a bad command line prints what is wrong and the usage's
 * first line on stderr. args_check_dir vets an output folder before the run. Header-only:
 * each example is one .c file plus this.
 */
#ifndef ACCEL_EXAMPLES_ARGS_H
#define ACCEL_EXAMPLES_ARGS_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { ARG_INT, ARG_REAL, ARG_STR, ARG_SWITCH } arg_kind;

typedef struct arg_opt {
    const char *flag; /* "--steps" */
    arg_kind kind;
    void *out;       /* int * (ARG_INT, and ARG_SWITCH: set to 1), double *, const char ** */
    double min, max; /* the accepted values of an ARG_INT or ARG_REAL, both included */
} arg_opt;

#define ARGS_GO_ON (-1) /* args_parse: the command line is good, run the program */

/* Prints "prog: MESSAGE" and the usage's first line to stderr; returns 2, the exit status of
 * a bad command line. For the checks a table cannot express (one flag against another). */
static inline int args_fail(const char *prog, const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    const char *eol = strchr(usage, '\n');
    int first = eol ? (int)(eol - usage) : (int)strlen(usage);
    fprintf(stderr, "\n%.*s%s\n", first, usage,
            eol && eol[1] ? "\n(--help lists the options)" : "");
    return 2;
}

static inline int args_is_switch(const arg_opt *opts, int n_opts, const char *flag)
{
    for (int k = 0; k < n_opts; k++) {
        if (opts[k].kind == ARG_SWITCH && strcmp(flag, opts[k].flag) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Reads argv into the table's variables (those not given keep their values). Returns
 * ARGS_GO_ON, or the program's exit status: 0 after --help, 2 after an error. */
static inline int args_parse(const char *prog, const char *usage, const arg_opt *opts, int n_opts,
                      int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        const arg_opt *o = NULL;
        for (int k = 0; k < n_opts && o == NULL; k++) {
            o = strcmp(argv[i], opts[k].flag) == 0 ? &opts[k] : NULL;
        }
        if (o == NULL && i > 1 && args_is_switch(opts, n_opts, argv[i - 1])) {
            return args_fail(prog, usage, "%s takes no value, and '%s' is no option", argv[i - 1],
                             argv[i]);
        }
        if (o == NULL) {
            return args_fail(prog, usage, "unknown option '%s'", argv[i]);
        }
        if (o->kind == ARG_SWITCH) {
            *(int *)o->out = 1;
            continue;
        }
        if (i + 1 >= argc) {
            return args_fail(prog, usage, "%s needs a value", o->flag);
        }
        const char *text = argv[++i];
        char *end = NULL;
        errno = 0;
        if (o->kind == ARG_STR) {
            if (text[0] == '\0') {
                return args_fail(prog, usage, "%s needs a value, not an empty string", o->flag);
            }
            *(const char **)o->out = text;
        } else if (o->kind == ARG_INT) {
            long v = strtol(text, &end, 10);
            if (end == text || *end != '\0' || errno == ERANGE || v < o->min || v > o->max) {
                if (o->max >= INT_MAX) {
                    return args_fail(prog, usage, "%s needs a whole number >= %.0f, not '%s'",
                                     o->flag, o->min, text);
                }
                return args_fail(prog, usage, "%s needs a whole number from %.0f to %.0f, not '%s'",
                                 o->flag, o->min, o->max, text);
            }
            *(int *)o->out = (int)v;
        } else {
            double v = strtod(text, &end);
            if (end == text || *end != '\0' || !isfinite(v) || v < o->min || v > o->max) {
                return args_fail(prog, usage, "%s needs a number from %g to %g, not '%s'", o->flag,
                                 o->min, o->max, text);
            }
            *(double *)o->out = v;
        }
    }
    return ARGS_GO_ON;
}

/* Makes sure the folder `dir` of option `flag` exists and takes files (mkdir -p, then a probe
 * file), so that a folder a run cannot write is named before it trains, not when its result is
 * to be saved. Returns 0, or -1 after saying why on stderr. */
static inline int args_check_dir(const char *prog, const char *flag, const char *dir)
{
    char path[4096], probe[4096 + 32];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        fprintf(stderr, "%s: %s %s: the path is too long\n", prog, flag, dir);
        return -1;
    }
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char end = *p;
            *p = '\0';
            if (mkdir(path, 0777) != 0 && errno != EEXIST) {
                fprintf(stderr, "%s: %s %s: cannot create %s: %s\n", prog, flag, dir, path,
                        strerror(errno));
                return -1;
            }
            *p = end;
            if (end == '\0') {
                break;
            }
        }
    }
    snprintf(probe, sizeof probe, "%s/.accel_probe_%ld", dir, (long)getpid());
    FILE *f = fopen(probe, "w");
    if (f == NULL) {
        fprintf(stderr, "%s: %s %s: cannot write there: %s\n", prog, flag, dir, strerror(errno));
        return -1;
    }
    fclose(f);
    remove(probe);
    return 0;
}

#endif
