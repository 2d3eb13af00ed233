/*
 * The "jsonl" and "csv" trackers: one record per accel_log call under logging_dir/project_name
 * (metrics.jsonl / metrics.csv), flushed after every record, for scripts and spreadsheets. The
 * run configuration goes to config.json next to them.
 *
 * jsonl: {"step": 3, "time": 1700000000.123, "loss": 2.5, "note": "text"}; a non-finite scalar
 * is null (JSON has no NaN). csv: a header "step,time,<keys in first-seen order>" and one row
 * per call with empty cells for absent keys. A key never seen before widens the table: the file
 * is rewritten (temp + rename) with the longer header and empty cells in older rows, so every
 * row always has the header's width. Both append to existing files; a resumed run
 * (accel_trackers_resume) first rewrites them without the records at steps >= the resumed
 * step, so no step is recorded twice.
 *
 * Faults: a record that cannot be written whole (a full disk) is cut off again, so the records
 * logged once there is room read back cleanly; a file deleted while the run writes is written
 * anew (with its header) instead of vanishing with every later record.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "track_internal.h"

typedef struct text_state {
    accel__track_common common;
    char *path;
    FILE *f;
    long long good; /* bytes of whole records in the file: a failed append is cut back to it */
    int csv;
    char **cols; /* csv: data columns after step,time */
    int n_cols, cap_cols;
    const char **row;     /* csv: formatted cells of the current row, one per column */
    char *cells;          /* storage for numeric cells */
    accel__lockfile lock; /* "<run>/.metrics.<ext>.lock": one job writes the file at a time */
} text_state;

static accel_status io_error(const char *what, const char *path)
{
    return accel_tracker_seterr(ACCEL_EIO, "cannot %s %s: %s", what, path, strerror(errno));
}

static void csv_write_header(text_state *s, FILE *f);

/* Opens the file for appending (creating the run folder again if it is gone) and writes the csv
 * header into an empty file. On failure s->f stays NULL and the next record tries again. */
static accel_status text_open(text_state *s)
{
    accel_status st = accel__mkdirs(s->common.run_dir);
    if (st != ACCEL_OK) {
        return accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
    s->f = fopen(s->path, "a");
    if (s->f == NULL) {
        return io_error("open", s->path);
    }
    if (s->csv && ftello(s->f) == 0) {
        csv_write_header(s, s->f);
        if (fflush(s->f) != 0 || ferror(s->f)) {
            st = io_error("write", s->path);
            /* A header cut short would be taken for the columns: start the file over. */
            s->f = accel__track_reopen_at(s->f, s->path, 0, "a");
            if (s->f != NULL) {
                fclose(s->f);
                s->f = NULL;
            }
            return st;
        }
    }
    s->good = (long long)ftello(s->f);
    return ACCEL_OK;
}

/* After a failed append: the partial record is cut off and the file reopened (see
 * accel__track_reopen_at). Returns st, the failure being reported. */
static accel_status drop_partial(text_state *s, accel_status st)
{
    s->f = accel__track_reopen_at(s->f, s->path, s->good, "a");
    return st;
}

static void free_state(text_state *s)
{
    if (s->f != NULL) {
        fclose(s->f);
    }
    accel__lockfile_release(&s->lock);
    for (int i = 0; i < s->n_cols; i++) {
        accel__free(s->cols[i]);
    }
    accel__free(s->cols);
    accel__free(s->row);
    accel__free(s->cells);
    accel__free(s->path);
    accel__free(s->common.run_dir);
    accel__free(s);
}

/* ---- CSV helpers ---- */

/* Writes one cell, quoted when it holds a separator. A byte outside well-formed UTF-8 is written
 * as the UTF-8 of its Latin-1 reading (as the JSON files escape it): raw, it would make
 * readers that decode UTF-8 (Python's csv with open()) reject the whole file. */
static void csv_field(FILE *f, const char *s)
{
    int quote = strpbrk(s, ",\"\n\r") != NULL;
    if (quote) {
        fputc('"', f);
    }
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"') {
            fputc('"', f);
        }
        if (*p >= 0x80 && accel__utf8_len(p) == 0) {
            fputc(0xc0 | (*p >> 6), f);
            fputc(0x80 | (*p & 0x3f), f);
        } else {
            /* Rows stay one line each (the widening rewrite relies on it). */
            fputc((*p == '\n' || *p == '\r') ? ' ' : *p, f);
        }
    }
    if (quote) {
        fputc('"', f);
    }
}

static int add_col(text_state *s, const char *name)
{
    if (s->n_cols == s->cap_cols) {
        int cap = s->cap_cols ? s->cap_cols * 2 : 16;
        char **c = accel__realloc(s->cols, (size_t)cap * sizeof(*c));
        if (c == NULL) {
            return -1;
        }
        s->cols = c;
        const char **r = accel__realloc(s->row, (size_t)cap * sizeof(*r));
        if (r == NULL) {
            return -1;
        }
        s->row = r;
        char *cells = accel__realloc(s->cells, (size_t)cap * 32);
        if (cells == NULL) {
            return -1;
        }
        s->cells = cells;
        s->cap_cols = cap;
    }
    s->cols[s->n_cols] = accel__strdup(name);
    if (s->cols[s->n_cols] == NULL) {
        return -1;
    }
    s->n_cols++;
    return 0;
}

/* Parses a header line written by csv_write_header back into columns (resume). */
static int parse_header(text_state *s, char *line)
{
    line[strcspn(line, "\r\n")] = '\0';
    int field = 0;
    char *p = line;
    while (*p || field < 2) {
        char buf[512];
        size_t k = 0;
        if (*p == '"') {
            for (p++; *p && !(*p == '"' && p[1] != '"'); p++) {
                if (*p == '"') {
                    p++;
                }
                if (k + 1 < sizeof(buf)) {
                    buf[k++] = *p;
                }
            }
            if (*p == '"') {
                p++;
            }
        } else {
            while (*p && *p != ',' && k + 1 < sizeof(buf)) {
                buf[k++] = *p++;
            }
        }
        buf[k] = '\0';
        if (field >= 2 && add_col(s, buf) != 0) {
            return -1;
        }
        field++;
        if (*p != ',') {
            break;
        }
        p++;
    }
    return 0;
}

static void csv_write_header(text_state *s, FILE *f)
{
    fputs("step,time", f);
    for (int i = 0; i < s->n_cols; i++) {
        fputc(',', f);
        csv_field(f, s->cols[i]);
    }
    fputc('\n', f);
}

/* Rewrites the file with the current (wider) header; old rows get `added` empty cells.
 * *replaced: whether the file on disk has the new header (it may while the reopen failed). */
static accel_status csv_widen(text_state *s, int added, int *replaced)
{
    *replaced = 0;
    if (fclose(s->f) != 0) {
        s->f = NULL;
        return io_error("close", s->path);
    }
    s->f = NULL;
    FILE *in = fopen(s->path, "r");
    if (in == NULL) {
        return io_error("reopen", s->path);
    }
    size_t n = strlen(s->path);
    char *tmp = accel__malloc(n + 8);
    if (tmp == NULL) {
        fclose(in);
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    snprintf(tmp, n + 8, "%s.tmp", s->path);
    FILE *out = fopen(tmp, "w");
    accel_status st = ACCEL_OK;
    if (out == NULL) {
        st = io_error("create", tmp);
        goto done;
    }
    csv_write_header(s, out);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int first = 1;
    while ((len = getline(&line, &cap, in)) > 0) {
        if (first) { /* the old header */
            first = 0;
            continue;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
            line[--len] = '\0';
        }
        fputs(line, out);
        for (int i = 0; i < added; i++) {
            fputc(',', out);
        }
        fputc('\n', out);
    }
    free(line); /* getline allocates with the C library */
    if (fflush(out) != 0 || ferror(out)) {
        st = io_error("write", tmp);
    }
    if (fclose(out) != 0 && st == ACCEL_OK) {
        st = io_error("close", tmp);
    }
    if (st == ACCEL_OK) {
        if (rename(tmp, s->path) != 0) {
            st = io_error("replace", s->path);
        } else {
            *replaced = 1;
        }
    }
    if (st != ACCEL_OK) {
        unlink(tmp); /* a partial copy must not fill what the disk has left */
    }
done:
    fclose(in);
    accel__free(tmp);
    s->f = fopen(s->path, "a");
    if (s->f == NULL && st == ACCEL_OK) {
        st = io_error("reopen", s->path);
    }
    if (s->f != NULL) {
        s->good = (long long)ftello(s->f);
    }
    return st;
}

/* ---- tracker callbacks ---- */

static accel_status text_start(int csv, const accel_tracker_start_info *info, void **state)
{
    text_state *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    s->csv = csv;
    s->common.magic = ACCEL__TRACK_MAGIC;
    s->common.run_dir = accel__path_join(info->logging_dir, info->project_name);
    s->path = s->common.run_dir
                  ? accel__path_join(s->common.run_dir, csv ? "metrics.csv" : "metrics.jsonl")
                  : NULL;
    if (s->path == NULL) {
        free_state(s);
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    accel_status st = accel__mkdirs(s->common.run_dir);
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        free_state(s);
        return st;
    }
    /* Two jobs appending to one file would interleave their records without a word, and a
     * csv rewrite or a resume by one would drop the other's: the second job is refused. */
    char *lock =
        accel__path_join(s->common.run_dir, csv ? ".metrics.csv.lock" : ".metrics.jsonl.lock");
    st = lock ? accel__track_lock(&s->lock, lock, s->path,
                                  ": give each job its own project_name or logging_dir")
              : accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    accel__free(lock);
    if (st != ACCEL_OK) {
        free_state(s);
        return st;
    }
    if (csv) {
        FILE *old = fopen(s->path, "r");
        if (old != NULL) {
            char *line = NULL;
            size_t cap = 0;
            int bad = getline(&line, &cap, old) > 0 && parse_header(s, line) != 0;
            free(line);
            fclose(old);
            if (bad) {
                free_state(s);
                return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
            }
        }
    }
    st = text_open(s);
    if (st != ACCEL_OK) {
        free_state(s);
        return st;
    }
    *state = s;
    return ACCEL_OK;
}

static accel_status jsonl_start(void *user, const accel_tracker_start_info *info, void **state)
{
    (void)user;
    return text_start(0, info, state);
}

static accel_status csv_start(void *user, const accel_tracker_start_info *info, void **state)
{
    (void)user;
    return text_start(1, info, state);
}

static void json_number(FILE *f, const char *tracker, const char *key, double v)
{
    if (isfinite(v)) {
        char num[40];
        accel__track_fmt_double(num, sizeof(num), v);
        fputs(num, f);
    } else {
        accel__track_warn_nonfinite(tracker, key, v);
        fputs("null", f);
    }
}

static accel_status jsonl_log(text_state *s, const accel_value *v, int n, long long step)
{
    FILE *f = s->f;
    if (step >= 0) {
        fprintf(f, "{\"step\": %lld, \"time\": %.3f", step, accel__wall_time());
    } else {
        fprintf(f, "{\"step\": null, \"time\": %.3f", accel__wall_time());
    }
    for (int i = 0; i < n; i++) {
        fputs(", ", f);
        accel__json_string(f, v[i].key);
        fputs(": ", f);
        if (v[i].kind == ACCEL_VALUE_SCALAR) {
            json_number(f, "jsonl", v[i].key, v[i].scalar);
        } else {
            accel__json_string(f, v[i].text);
        }
    }
    fputs("}\n", f);
    if (fflush(f) != 0 || ferror(f)) {
        return drop_partial(s, io_error("write", s->path));
    }
    s->good = (long long)ftello(f);
    return ACCEL_OK;
}

static accel_status csv_log(text_state *s, const accel_value *v, int n, long long step)
{
    int before = s->n_cols;
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int c = 0; c < s->n_cols && !found; c++) {
            found = strcmp(s->cols[c], v[i].key) == 0;
        }
        if (!found && add_col(s, v[i].key) != 0) {
            return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
        }
    }
    if (s->n_cols > before) {
        /* Older rows (even ones with no data columns) gain one empty cell per new column. */
        int replaced;
        accel_status st = csv_widen(s, s->n_cols - before, &replaced);
        if (st != ACCEL_OK && !replaced) {
            /* The file keeps its old header: so must the rows written next, or they would be
             * wider than it. The new columns are added again at their next value. */
            while (s->n_cols > before) {
                accel__free(s->cols[--s->n_cols]);
            }
            return st;
        }
        if (st != ACCEL_OK) {
            return st; /* widened, but not open again: the next record reopens it */
        }
    }
    for (int c = 0; c < s->n_cols; c++) {
        s->row[c] = "";
    }
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < s->n_cols; c++) {
            if (strcmp(s->cols[c], v[i].key) != 0) {
                continue;
            }
            if (v[i].kind == ACCEL_VALUE_TEXT) {
                s->row[c] = v[i].text;
            } else {
                char *cell = s->cells + (size_t)c * 32;
                if (!isfinite(v[i].scalar)) {
                    accel__track_warn_nonfinite("csv", v[i].key, v[i].scalar);
                }
                /* nan / inf: spellings spreadsheets and Python's float() read. */
                accel__track_fmt_double(cell, 32, v[i].scalar);
                s->row[c] = cell;
            }
        }
    }
    FILE *f = s->f;
    if (step >= 0) {
        fprintf(f, "%lld,%.3f", step, accel__wall_time());
    } else {
        fprintf(f, ",%.3f", accel__wall_time());
    }
    for (int c = 0; c < s->n_cols; c++) {
        fputc(',', f);
        csv_field(f, s->row[c]);
    }
    fputc('\n', f);
    if (fflush(f) != 0 || ferror(f)) {
        return drop_partial(s, io_error("write", s->path));
    }
    s->good = (long long)ftello(f);
    return ACCEL_OK;
}

static accel_status text_log(void *state, const accel_value *v, int n, long long step)
{
    text_state *s = state;
    if (s->f != NULL && accel__track_file_gone(s->f, s->path)) {
        /* Writing on into a deleted file would lose every record without a word. */
        accel__log(accel__track_log(), ACCEL__LOG_WARN,
                   "tracker %s: %s was deleted or replaced while the run wrote it; writing a "
                   "new one",
                   s->csv ? "csv" : "jsonl", s->path);
        fclose(s->f);
        s->f = NULL;
    }
    if (s->f == NULL) {
        /* After a failure that left it closed (or the deletion above): try again. */
        ACCEL_TRY(text_open(s));
    }
    return s->csv ? csv_log(s, v, n, step) : jsonl_log(s, v, n, step);
}

/* The step a record line starts with: jsonl `{"step": N, ...`, csv `N,...`. Returns 1 with
 * *step set, 0 for a record without a step (null / empty) or a line not in that form. */
static int record_step(const char *line, int csv, long long *step)
{
    static const char prefix[] = "{\"step\": ";
    if (!csv) {
        if (strncmp(line, prefix, sizeof(prefix) - 1) != 0) {
            return 0;
        }
        line += sizeof(prefix) - 1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(line, &end, 10);
    if (end == line || errno != 0 || (*end != ',' && *end != '}')) {
        return 0;
    }
    *step = v;
    return 1;
}

/* Rewrites the file without the records at steps >= step (and without a last line cut short
 * by the interruption), atomically, then reopens it for appending. */
static accel_status text_resume(void *state, long long step)
{
    text_state *s = state;
    if (s->f != NULL && fclose(s->f) != 0) {
        s->f = NULL;
        return io_error("close", s->path);
    }
    s->f = NULL;
    char *text = NULL;
    size_t n = 0;
    accel_status st = accel__read_file(s->path, &text, &n);
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        goto reopen;
    }
    size_t out = 0, dropped = 0;
    int first = 1;
    for (size_t at = 0; at < n;) {
        char *nl = memchr(text + at, '\n', n - at);
        if (nl == NULL) { /* a partial record: the interrupted run's last write */
            dropped++;
            break;
        }
        size_t len = (size_t)(nl - (text + at)) + 1;
        long long rs;
        int keep = (s->csv && first) || !record_step(text + at, s->csv, &rs) || rs < step;
        first = 0;
        if (keep) {
            memmove(text + out, text + at, len);
            out += len;
        } else {
            dropped++;
        }
        at += len;
    }
    if (dropped > 0) {
        st = accel__write_file_atomic(s->path, text, out);
        if (st != ACCEL_OK) {
            accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        } else {
            accel__log(accel__track_log(), ACCEL__LOG_INFO,
                       "tracker %s: resumed at step %lld: dropped %zu records "
                       "of the interrupted run from %s",
                       s->csv ? "csv" : "jsonl", step, dropped, s->path);
        }
    }
reopen:
    accel__free(text);
    s->f = fopen(s->path, "a");
    if (s->f == NULL && st == ACCEL_OK) {
        st = io_error("reopen", s->path);
    }
    if (s->f != NULL) {
        s->good = (long long)ftello(s->f);
    }
    return st;
}

static accel_status text_config(void *state, const accel_value *v, int n)
{
    text_state *s = state;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    fputs("{", m);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",\n  " : "\n  ", m);
        accel__json_string(m, v[i].key);
        fputs(": ", m);
        if (v[i].kind == ACCEL_VALUE_SCALAR) {
            json_number(m, s->csv ? "csv" : "jsonl", v[i].key, v[i].scalar);
        } else {
            accel__json_string(m, v[i].text);
        }
    }
    fputs("\n}\n", m);
    fclose(m);
    char *path = accel__path_join(s->common.run_dir, "config.json");
    accel_status st = path ? accel__write_file_atomic(path, buf, strlen(buf)) : ACCEL_ENOMEM;
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", path ? accel_last_error(NULL) : "out of memory");
    }
    accel__free(path);
    free(buf); /* open_memstream allocates with the C library */
    return st;
}

static accel_status text_finish(void *state)
{
    text_state *s = state;
    accel_status st = ACCEL_OK;
    if (s->f != NULL && fclose(s->f) != 0) {
        st = io_error("close", s->path);
    }
    s->f = NULL;
    free_state(s);
    return st;
}

const accel_tracker_ops accel__tracker_jsonl = {
    .size = sizeof(accel_tracker_ops),
    .name = "jsonl",
    .requires_logging_directory = 1,
    .start = jsonl_start,
    .store_init_configuration = text_config,
    .log = text_log,
    .finish = text_finish,
    .resume = text_resume,
};

const accel_tracker_ops accel__tracker_csv = {
    .size = sizeof(accel_tracker_ops),
    .name = "csv",
    .requires_logging_directory = 1,
    .start = csv_start,
    .store_init_configuration = text_config,
    .log = text_log,
    .finish = text_finish,
    .resume = text_resume,
};
