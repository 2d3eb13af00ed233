/*
 * `accel estimate-memory`: Accelerate's memory table for a model (largest layer, total size,
 * training with Adam, per dtype) and, beyond it, the per-process bytes of accel's training
 * state under ZeRO stages 0-3 on --num_processes processes. The model comes from local files
 * or flags (estimate_model.c); the arithmetic is estimate_calc.c. Prints to stdout only; an
 * unreadable input is an error naming the file and field, with exit status 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli.h"
#include "estimate.h"

static int run_estimate(const cli_verb *verb, int argc, char **argv);

static const cli_group gpt_group = {
    "GPT described by flags",
    "Instead of a file: a GPT in nn_gpt's layout (GPT-2: MLP 4x, biases, learned positions)."};

static const cli_option estimate_options[] = {
    {"dtypes", 0, 1, "float32 float16 bfloat16 int8 int4", "DTYPE...",
     "the dtypes to show, one or several (space- or comma-separated) of float32, float16, "
     "bfloat16, int8, int4",
     NULL, NULL},
    {"num_processes", 0, 1, "1", "N", "processes the ZeRO stages shard the training state over",
     NULL, NULL},
    {"bytes", 0, 0, NULL, NULL, "print exact byte counts instead of KB / MB / GB", NULL, NULL},
    {"n_layer", 0, 1, "12", "N", "transformer blocks", &gpt_group, NULL},
    {"n_embd", 0, 1, "768", "N", "width", &gpt_group, NULL},
    {"n_head", 0, 1, "12", "N", "attention heads", &gpt_group, NULL},
    {"vocab_size", 0, 1, "50257", "N", "vocabulary (GPT-2's is 50257; llm.c pads it to 50304)",
     &gpt_group, NULL},
    {"n_positions", 0, 1, "1024", "N", "context length (rows of the position embedding)",
     &gpt_group, NULL},
    {"tied", 0, 1, "1", "0|1", "lm_head shares the token embedding", &gpt_group, NULL},
    {0},
};

const cli_verb cli_verb_estimate_memory = {
    .name = "estimate-memory",
    .summary = "estimate a model's memory: sizes per dtype and training per ZeRO stage",
    .positional = "[MODEL]",
    .description =
        "MODEL is a local Hugging Face config.json (GPT-2 or Llama-style fields), a .safetensors\n"
        "file (only its header is read), a model.safetensors.index.json (and its shards'\n"
        "headers), or a folder with one of those; without MODEL, a GPT described by the flags\n"
        "below (give at least one). Prints Accelerate's table (largest layer, total size and\n"
        "training with Adam per dtype), then the per-process bytes of weights, gradients and\n"
        "AdamW state when training with accel under ZeRO stages 0-3 on --num_processes\n"
        "processes, with the assumptions behind them. Activations are not counted.",
    .options = estimate_options,
    .run = run_estimate,
};

/* ------------------------------------------------------------------ argument order */

/* Accelerate's parser (argparse) takes options after the model name and several words after
 * --dtypes; ours stops at the first positional. Reorders argv into a copy: options first, the
 * words following --dtypes joined with commas into its value, then "--" and the positionals.
 * Returns the new argc; `out` must hold argc + 2 pointers; `joined` receives the dtype list. */
static int reorder_args(const cli_verb *verb, int argc, char **argv, char **out, char *joined,
                        size_t joined_nbytes)
{
    int n = 0, n_pos = 0;
    char **pos = out + argc + 2; /* the positionals are gathered after the options' room */
    out[n++] = argv[0];
    joined[0] = '\0';
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            while (++i < argc) {
                pos[n_pos++] = argv[i];
            }
            break;
        }
        if (a[0] != '-' || a[1] == '\0') {
            pos[n_pos++] = argv[i];
            continue;
        }
        out[n++] = argv[i];
        const char *name = a + (a[1] == '-' ? 2 : 1);
        if (strchr(name, '=') != NULL) {
            continue;
        }
        /* A value-taking option that ends the line would take the "--" added below as its
         * value ("unknown dtype '--'", "--n_layer ... not '--'"). */
        int takes_value = strcmp(name, "dtypes") == 0;
        for (int k = 0; !takes_value && verb->options[k].name != NULL; k++) {
            const char *o = verb->options[k].name;
            int same = strlen(o) == strlen(name);
            for (size_t j = 0; same && o[j] != '\0'; j++) {
                same = o[j] == name[j] || (o[j] == '_' && name[j] == '-');
            }
            takes_value = same && verb->options[k].takes_value;
        }
        if (takes_value && i + 1 >= argc) {
            cli_usage_error(verb, "option '%s' needs a value", a);
            return -1;
        }
        if (strcmp(name, "dtypes") == 0 && i + 1 < argc) {
            /* Every following word that names a dtype (or the first one whatever it is, so
             * that a wrong name is reported as a bad value). */
            size_t k = 0;
            int first = 1;
            while (i + 1 < argc && (first || cli_mem_dtype_parse(argv[i + 1]) >= 0)) {
                k += (size_t)snprintf(joined + k, joined_nbytes - k, "%s%s", first ? "" : ",",
                                      argv[++i]);
                k = k < joined_nbytes ? k : joined_nbytes - 1;
                first = 0;
            }
            out[n++] = joined;
            continue;
        }
        for (int k = 0; verb->options[k].name != NULL; k++) {
            const char *o = verb->options[k].name;
            int same = strlen(o) == strlen(name);
            for (size_t j = 0; same && o[j] != '\0'; j++) {
                same = o[j] == name[j] || (o[j] == '_' && name[j] == '-');
            }
            if (same && verb->options[k].takes_value && i + 1 < argc) {
                out[n++] = argv[++i];
                break;
            }
        }
    }
    out[n++] = "--";
    for (int k = 0; k < n_pos; k++) {
        out[n++] = pos[k];
    }
    return n;
}

/* ------------------------------------------------------------------ formatting */

/* Accelerate's convert_bytes: the largest unit of 1024 under which the value is >= 1, rounded
 * to two decimals and printed as Python prints a float ("474.7 MB", "1.85 GB", "148.0 MB"). */
static void human(uint64_t nbytes, char *out, size_t n)
{
    static const char *const units[] = {"bytes", "KB", "MB", "GB", "TB", "PB"};
    if (nbytes < 1024) {
        snprintf(out, n, "%llu bytes", (unsigned long long)nbytes);
        return;
    }
    double v = (double)nbytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    char num[64];
    snprintf(num, sizeof(num), "%.2f", v);
    size_t k = strlen(num);
    if (num[k - 1] == '0') { /* "474.70" -> "474.7"; "148.00" -> "148.0" */
        num[--k] = '\0';
    }
    snprintf(out, n, "%s %s", num, units[u]);
}

static void cell_bytes(uint64_t nbytes, int exact, char *out, size_t n)
{
    if (exact) {
        snprintf(out, n, "%llu", (unsigned long long)nbytes);
    } else {
        human(nbytes, out, n);
    }
}

/* 124439808 -> "124,439,808". */
static const char *grouped(uint64_t v, char *out, size_t n)
{
    char digits[32];
    int k = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)v);
    size_t j = 0;
    for (int i = 0; i < k && j + 2 < n; i++) {
        if (i > 0 && (k - i) % 3 == 0) {
            out[j++] = ',';
        }
        out[j++] = digits[i];
    }
    out[j] = '\0';
    return out;
}

/* ------------------------------------------------------------------ tables */

#define MAX_COLS 5
#define CELL 48

typedef struct table {
    const char *title;
    int n_cols, n_rows;
    char cells[1 + CLI_MEM_N_DTYPES][MAX_COLS][CELL]; /* row 0: the headers */
} table;

static void rule(FILE *f, const int *w, int n_cols, const char *l, const char *mid, const char *r,
                 int join)
{
    fputs(l, f);
    for (int c = 0; c < n_cols; c++) {
        for (int i = 0; i < w[c]; i++) {
            fputs("─", f);
        }
        if (c + 1 < n_cols) {
            fputs(join ? mid : "─", f);
        }
    }
    fprintf(f, "%s\n", r);
}

static void centred(FILE *f, const char *s, int width)
{
    int len = (int)strlen(s), left = (width - len) / 2;
    fprintf(f, "%*s%s%*s", left, "", s, width - len - left, "");
}

/* A box-drawn table as Accelerate prints it: a centred title, centred cells, one space of
 * margin in each cell. */
static void print_table(FILE *f, const table *t)
{
    int w[MAX_COLS], total = 0;
    for (int c = 0; c < t->n_cols; c++) {
        w[c] = 0;
        for (int r = 0; r <= t->n_rows; r++) {
            int len = (int)strlen(t->cells[r][c]) + 2;
            w[c] = len > w[c] ? len : w[c];
        }
        total += w[c] + (c > 0);
    }
    int title_len = (int)strlen(t->title) + 2;
    if (title_len > total) {
        w[t->n_cols - 1] += title_len - total;
        total = title_len;
    }
    rule(f, w, t->n_cols, "┌", "─", "┐", 0);
    fputs("│", f);
    centred(f, t->title, total);
    fputs("│\n", f);
    rule(f, w, t->n_cols, "├", "┬", "┤", 1);
    for (int r = 0; r <= t->n_rows; r++) {
        for (int c = 0; c < t->n_cols; c++) {
            fputs("│", f);
            centred(f, t->cells[r][c], w[c]);
        }
        fputs("│\n", f);
        if (r == 0) {
            rule(f, w, t->n_cols, "├", "┼", "┤", 1);
        }
    }
    rule(f, w, t->n_cols, "└", "┴", "┘", 1);
}

/* ------------------------------------------------------------------ the verb */

static int parse_count(const cli_verb *verb, const cli_args *a, const char *name, long max,
                       int64_t *out)
{
    const char *v = cli_value(verb, a, name);
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || x < 1 || x > max) {
        cli_usage_error(verb, "--%s must be an integer in [1, %ld], not '%s'", name, max, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* The --dtypes list (commas or spaces) into rows; -1 after a usage error. */
static int parse_dtypes(const cli_verb *verb, const char *list, int *rows, int *n_rows)
{
    *n_rows = 0;
    const char *p = list;
    while (*p != '\0') {
        size_t n = strcspn(p, ", ");
        if (n > 0) {
            char name[32];
            snprintf(name, sizeof(name), "%.*s", (int)(n < 31 ? n : 31), p);
            int d = n < 31 ? cli_mem_dtype_parse(name) : -1;
            if (d < 0) {
                cli_usage_error(verb,
                                "--dtypes: unknown dtype '%.*s' (choose from float32, float16, "
                                "bfloat16, int8, int4)",
                                (int)n, p);
                return -1;
            }
            int dup = 0;
            for (int i = 0; i < *n_rows; i++) {
                dup |= rows[i] == d;
            }
            if (!dup) {
                rows[(*n_rows)++] = d;
            }
        }
        p += n;
        p += *p != '\0';
    }
    if (*n_rows == 0) {
        cli_usage_error(verb, "--dtypes needs at least one dtype");
        return -1;
    }
    return 0;
}

static void print_assumptions(const cli_mem_model *m, int n_ranks)
{
    char gathered[32];
    printf("Training state per process: weights, gradients and AdamW's two moments, as accel\n"
           "allocates them.\n"
           "- float32 trains in fp32: 16 bytes per parameter (4 weights, 4 gradients, 8 moments).\n"
           "- float16/bfloat16 train with mixed precision: an fp32 master (4 bytes), a 2-byte\n"
           "  compute copy, fp32 gradients (4) and fp32 moments (8): 18 bytes per parameter.\n"
           "- ZeRO stage 1 divides the moments over the %d process%s, and under mixed precision\n"
           "  the fp32 master (the full weights are the compute copy, as DeepSpeed's; during a\n"
           "  pass at most three buckets are widened to fp32, not counted); stage 2 also the\n"
           "  gradients held between backward and the step (while a bucket waits for its\n"
           "  reduce-scatter, and over micro-steps that accumulate without syncing, they are full\n"
           "  size); stage 3 also the fp32 master, plus the full weights of the units gathered\n"
           "  at once (at most three adjacent: %s parameters; 4 bytes each, 6 under mixed\n"
           "  precision).\n"
           "- Not counted: activations, the batch, communication buffers, the padding of the flat\n"
           "  buffers to the shard size, allocator overhead.\n"
           "- int8/int4: Accelerate estimates no training in those dtypes (N/A); neither do we.\n",
           n_ranks, n_ranks > 1 ? "es" : "", grouped(m->gather_numel, gathered, sizeof(gathered)));
}

/* Accelerate's table: per dtype, the largest layer, the total size, training with Adam. */
static void print_accelerate_table(const cli_mem_model *m, const char *name, const int *rows,
                                   int n_rows, int exact)
{
    static table t; /* large: off the stack */
    char title[600];
    snprintf(title, sizeof(title), "Memory Usage for loading `%s`", name);
    t = (table){.title = title, .n_cols = 4, .n_rows = n_rows};
    const char *heads[] = {"dtype", "Largest Layer", "Total Size", "Training using Adam"};
    for (int c = 0; c < 4; c++) {
        snprintf(t.cells[0][c], CELL, "%s", heads[c]);
    }
    for (int r = 0; r < n_rows; r++) {
        cli_mem_dtype d = (cli_mem_dtype)rows[r];
        uint64_t train = cli_mem_accelerate_training(cli_mem_nbytes(m->numel, CLI_MEM_FLOAT32), d);
        snprintf(t.cells[r + 1][0], CELL, "%s", cli_mem_dtype_name(d));
        cell_bytes(cli_mem_nbytes(m->units[m->largest].numel, d), exact, t.cells[r + 1][1], CELL);
        cell_bytes(cli_mem_nbytes(m->numel, d), exact, t.cells[r + 1][2], CELL);
        if (train == 0) {
            snprintf(t.cells[r + 1][3], CELL, "N/A");
        } else {
            cell_bytes(train, exact, t.cells[r + 1][3], CELL);
        }
    }
    print_table(stdout, &t);
}

/* Ours: per dtype, the training state per process under each ZeRO stage. */
static void print_zero_table(const cli_mem_model *m, int n_ranks, const int *rows, int n_rows,
                             int exact)
{
    static table t;
    char title[128];
    snprintf(title, sizeof(title), "Training memory per process, %d process%s", n_ranks,
             n_ranks > 1 ? "es" : "");
    t = (table){.title = title, .n_cols = 5, .n_rows = n_rows};
    snprintf(t.cells[0][0], CELL, "dtype");
    for (int c = 1; c < 5; c++) {
        snprintf(t.cells[0][c], CELL, "ZeRO stage %d", c - 1);
    }
    for (int r = 0; r < n_rows; r++) {
        cli_mem_dtype d = (cli_mem_dtype)rows[r];
        snprintf(t.cells[r + 1][0], CELL, "%s", cli_mem_dtype_name(d));
        for (int s = 0; s < 4; s++) {
            cli_mem_zero z = cli_mem_zero_stage(m, d, s, n_ranks);
            if (z.total == 0) {
                snprintf(t.cells[r + 1][s + 1], CELL, "N/A");
            } else {
                cell_bytes(z.total, exact, t.cells[r + 1][s + 1], CELL);
            }
        }
    }
    print_table(stdout, &t);
}

static int run_estimate(const cli_verb *verb, int argc, char **argv)
{
    char **args = accel__calloc((size_t)(2 * argc + 4), sizeof(char *));
    char joined[256];
    if (args == NULL) {
        fprintf(stderr, "accel estimate-memory: error: out of memory\n");
        return 1;
    }
    int n_args = reorder_args(verb, argc, argv, args, joined, sizeof(joined));
    cli_args a;
    int status = CLI_EXIT_USAGE;
    if (n_args < 0) {
        accel__free(args);
        return status;
    }
    int64_t n_ranks = 1, dims[6];
    int rows[CLI_MEM_N_DTYPES], n_rows = 0;
    static const char *const gpt_flags[] = {"n_layer",    "n_embd",      "n_head",
                                            "vocab_size", "n_positions", "tied"};
    int gpt = 0;
    if (cli_begin(verb, n_args, args, &a, &status)) {
        goto out;
    }
    status = CLI_EXIT_USAGE;
    for (int i = 0; i < 6; i++) {
        gpt |= cli_given(verb, &a, gpt_flags[i]);
    }
    /* The dtypes first: "--dtypes config.json" takes the file as a dtype (argparse's nargs='+'
     * too), and that, not "give a MODEL", is what to say. */
    if (parse_dtypes(verb, cli_value(verb, &a, "dtypes"), rows, &n_rows) != 0) {
        goto out;
    }
    int n_pos = n_args - a.first_positional;
    if (n_pos > 1 || (n_pos == 1 && gpt) || (n_pos == 0 && !gpt)) {
        cli_usage_error(verb, n_pos > 1    ? "give one MODEL"
                              : n_pos == 1 ? "give either MODEL or the GPT flags, not both"
                                           : "give a MODEL (config.json, .safetensors, index or "
                                             "folder) or describe a GPT with --n_layer etc.");
        goto out;
    }
    if (parse_count(verb, &a, "num_processes", 1 << 20, &n_ranks) != 0) {
        goto out;
    }
    for (int i = 0; gpt && i < 5; i++) {
        /* One unit per layer is made: 2^20 layers at most (a few seconds, tens of MB). */
        if (parse_count(verb, &a, gpt_flags[i], i == 0 ? 1L << 20 : 1L << 30, &dims[i]) != 0) {
            goto out;
        }
    }
    const char *tied = cli_value(verb, &a, "tied");
    if (gpt && strcmp(tied, "0") != 0 && strcmp(tied, "1") != 0) {
        cli_usage_error(verb, "--tied must be 0 or 1, not '%s'", tied);
        goto out;
    }

    cli_mem_model m;
    const char *name = n_pos == 1 ? args[a.first_positional] : "GPT";
    int rc = n_pos == 1 ? cli_mem_from_path(&m, name)
                        : cli_mem_from_gpt(&m, &(cli_mem_gpt){dims[0], dims[1], dims[2], dims[3],
                                                              dims[4], tied[0] == '1'});
    if (rc != 0) {
        status = 1;
        goto out;
    }
    int exact = cli_given(verb, &a, "bytes");
    char c1[32], c2[32];
    printf("%s\n%s parameters; largest layer %s (%s parameters)\n\n", m.what,
           grouped(m.numel, c1, sizeof(c1)), m.units[m.largest].name,
           grouped(m.units[m.largest].numel, c2, sizeof(c2)));
    print_accelerate_table(&m, name, rows, n_rows, exact);
    printf("\n");
    print_zero_table(&m, (int)n_ranks, rows, n_rows, exact);
    printf("\n");
    print_assumptions(&m, (int)n_ranks);
    cli_mem_free(&m);
    status = 0;
out:
    accel__free(args);
    return status;
}
