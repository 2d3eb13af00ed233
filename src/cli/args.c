/*
 * Table-driven option parsing and help generation for every verb. The option table of a verb
 * is the single source of truth: the parser accepts exactly the names it lists (no
 * abbreviations, as Accelerate), and --help prints it. Option parsing stops at the first
 * non-option argument or at "--" so a launched program's flags are never taken as ours.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/base.h"
#include "base/ytree.h"

/* Compares an option name from the table with one typed by the user, treating '-' and '_' as
 * the same character (Accelerate accepts --num-processes and --num_processes). `typed` may be
 * followed by "=value": only its first `n` characters are compared. */
static int name_matches(const char *table_name, const char *typed, size_t n)
{
    if (strlen(table_name) != n) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char a = table_name[i] == '-' ? '_' : table_name[i];
        char b = typed[i] == '-' ? '_' : typed[i];
        if (a != b) {
            return 0;
        }
    }
    return 1;
}

static int n_options(const cli_verb *verb)
{
    int n = 0;
    while (verb->options[n].name != NULL) {
        n++;
    }
    ACCEL_ASSERT(n <= CLI_MAX_OPTIONS);
    return n;
}

int cli_option_index(const cli_verb *verb, const char *name)
{
    for (int i = 0; verb->options[i].name != NULL; i++) {
        if (strcmp(verb->options[i].name, name) == 0) {
            return i;
        }
    }
    ACCEL_ASSERT(!"option not in the verb's table");
    return -1;
}

const char *cli_value(const cli_verb *verb, const cli_args *a, const char *name)
{
    return a->values[cli_option_index(verb, name)];
}

int cli_given(const cli_verb *verb, const cli_args *a, const char *name)
{
    return a->given[cli_option_index(verb, name)];
}

void cli_print_usage(const cli_verb *verb, FILE *f)
{
    fprintf(f, "usage: accel %s [options]%s%s\n", verb->name, verb->positional ? " " : "",
            verb->positional ? verb->positional : "");
}

void cli_usage_error(const cli_verb *verb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "accel %s: error: ", verb->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cli_print_usage(verb, stderr);
    fprintf(stderr, "Try 'accel %s --help' for more information.\n", verb->name);
}

/* One row of the option table: the flag in a 32-column gutter (on its own line when longer),
 * the text word-wrapped to HELP_COLUMNS with a hanging indent. */
#define HELP_COLUMNS 100
#define HELP_GUTTER 32
static void print_option_row(FILE *f, const char *flag, const char *text)
{
    int col = fprintf(f, "  %s", flag);
    if (col >= HELP_GUTTER) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", HELP_GUTTER - col, "");
    col = HELP_GUTTER;
    const char *p = text;
    while (*p != '\0') {
        size_t w = strcspn(p, " ");
        if (col > HELP_GUTTER && col + 1 + (int)w > HELP_COLUMNS) {
            fprintf(f, "\n%*s", HELP_GUTTER, "");
            col = HELP_GUTTER;
        } else if (col > HELP_GUTTER) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)w, p);
        col += (int)w;
        p += w;
        while (*p == ' ') {
            p++;
        }
    }
    fputc('\n', f);
}

static void print_option(FILE *f, const cli_option *o)
{
    char flag[96];
    int k = 0;
    if (o->short_name != 0) {
        k = snprintf(flag, sizeof(flag), "-%c, ", o->short_name);
    }
    snprintf(flag + k, sizeof(flag) - (size_t)k, "--%s%s%s", o->name, o->takes_value ? " " : "",
             o->takes_value ? (o->metavar ? o->metavar : "VALUE") : "");
    char text[1024];
    if (o->dflt != NULL) {
        snprintf(text, sizeof(text), "%s (default: %s)", o->help, o->dflt);
    } else {
        snprintf(text, sizeof(text), "%s", o->help);
    }
    print_option_row(f, flag, text);
}

void cli_print_help(const cli_verb *verb, FILE *f)
{
    cli_print_usage(verb, f);
    if (verb->description != NULL) {
        fprintf(f, "\n%s\n", verb->description);
    }
    /* Options without a group first, then each group in the order it first appears. */
    fprintf(f, "\noptions:\n");
    print_option_row(f, "-h, --help", "show this help and exit");
    for (int i = 0; verb->options[i].name != NULL; i++) {
        if (verb->options[i].group == NULL) {
            print_option(f, &verb->options[i]);
        }
    }
    for (int i = 0; verb->options[i].name != NULL; i++) {
        const cli_group *g = verb->options[i].group;
        int first = g != NULL;
        for (int j = 0; first && j < i; j++) {
            first = verb->options[j].group != g;
        }
        if (!first) {
            continue;
        }
        fprintf(f, "\n%s:\n", g->title);
        if (g->description != NULL) {
            fprintf(f, "  %s\n\n", g->description);
        }
        for (int j = i; verb->options[j].name != NULL; j++) {
            if (verb->options[j].group == g) {
                print_option(f, &verb->options[j]);
            }
        }
    }
}

void cli_fill_from_config(const cli_verb *verb, cli_args *a, const accel__ynode *root,
                          const char *path)
{
    a->config_path = path;
    for (int i = 0; root != NULL && verb->options[i].name != NULL; i++) {
        const char *key = verb->options[i].config_key;
        const accel__ynode *v = key ? accel__ynode_path(root, key) : NULL;
        if (a->given[i] || v == NULL || v->kind != ACCEL__Y_SCALAR || accel__yscalar_is_null(v)) {
            continue;
        }
        a->values[i] = v->text;
        a->config_line[i] = v->line;
    }
}

const char *cli_source(const cli_verb *verb, const cli_args *a, const char *name, char *buf,
                       size_t nbytes)
{
    int i = cli_option_index(verb, name);
    const cli_option *o = &verb->options[i];
    const char *v = a->values[i] ? a->values[i] : "";
    if (a->config_line[i] > 0) {
        snprintf(buf, nbytes, "config file %s, line %d: %s: %s", a->config_path, a->config_line[i],
                 o->config_key, v);
    } else if (a->given[i]) {
        snprintf(buf, nbytes, "--%s%s%s", o->name, o->takes_value ? " " : "",
                 o->takes_value ? v : "");
    } else {
        snprintf(buf, nbytes, "--%s %s (default)", o->name, v);
    }
    return buf;
}

/* Handles one "--name[=value]" or "-x" argument at argv[*i]; advances *i past a separate
 * value. Returns 0, or -1 after printing a usage error. */
static int parse_one(const cli_verb *verb, int argc, char **argv, int *i, cli_args *out)
{
    const char *arg = argv[*i];
    const char *inline_value = NULL;
    int idx = -1;

    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
        out->help = 1;
        return 0;
    }
    if (strncmp(arg, "--help=", 7) == 0) { /* not "unknown option '--help'" */
        cli_usage_error(verb, "option '--help' takes no value");
        return -1;
    }
    if (arg[1] == '-') {
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        for (int k = 0; verb->options[k].name != NULL; k++) {
            if (name_matches(verb->options[k].name, name, n)) {
                idx = k;
                break;
            }
        }
        if (idx < 0) {
            cli_usage_error(verb, "unknown option '--%.*s'", (int)n, name);
            return -1;
        }
        inline_value = eq ? eq + 1 : NULL;
    } else {
        /* Short options: exactly "-x", or "-xVALUE" for options taking a value. */
        for (int k = 0; verb->options[k].name != NULL; k++) {
            if (verb->options[k].short_name != 0 && verb->options[k].short_name == arg[1]) {
                idx = k;
                break;
            }
        }
        if (idx < 0 || (arg[2] != '\0' && !verb->options[idx].takes_value)) {
            cli_usage_error(verb, "unknown option '%s'", arg);
            return -1;
        }
        /* "-n2" and "-n=2" (argparse takes both). */
        inline_value = arg[2] == '=' ? arg + 3 : arg[2] != '\0' ? arg + 2 : NULL;
    }

    const cli_option *o = &verb->options[idx];
    if (!o->takes_value) {
        if (inline_value != NULL) {
            cli_usage_error(verb, "option '--%s' takes no value", o->name);
            return -1;
        }
        out->values[idx] = "1";
    } else if (inline_value != NULL) {
        out->values[idx] = inline_value;
    } else {
        if (*i + 1 >= argc) {
            cli_usage_error(verb, "option '--%s' needs a value", o->name);
            return -1;
        }
        *i += 1;
        out->values[idx] = argv[*i];
    }
    out->given[idx] = 1;
    return 0;
}

int cli_parse(const cli_verb *verb, int argc, char **argv, cli_args *out)
{
    memset(out, 0, sizeof(*out));
    int n = n_options(verb);
    for (int k = 0; k < n; k++) {
        out->values[k] = verb->options[k].dflt;
    }
    int i = 1;
    while (i < argc) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            break; /* first positional argument ("-" alone is one, as for cat) */
        }
        if (parse_one(verb, argc, argv, &i, out) != 0) {
            return -1;
        }
        i++;
    }
    out->first_positional = i;
    if (!out->help && verb->positional == NULL && i < argc) {
        cli_usage_error(verb, "unexpected argument '%s'", argv[i]);
        return -1;
    }
    return 0;
}

int cli_begin(const cli_verb *verb, int argc, char **argv, cli_args *a, int *status)
{
    if (cli_parse(verb, argc, argv, a) != 0) {
        *status = CLI_EXIT_USAGE;
        return 1;
    }
    if (a->help) {
        cli_print_help(verb, stdout);
        *status = 0;
        return 1;
    }
    return 0;
}
