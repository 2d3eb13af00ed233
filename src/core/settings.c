/*
 * The resolved settings of an accelerator: a table of (name, value, source) built once by
 * accel_init, printed on the main process under ACCELERATE_DEBUG_MODE / accel launch --debug,
 * and the values modules read later instead of the environment (track settings).
 * Invariant: every environment read of the library after accel_init goes through a field set
 * here; the table names the source of every value the job runs with.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "settings.h"

struct accel__setting {
    char name[48];
    char value[ACCEL__SOURCE_NBYTES]; /* a path may be long */
    char source[ACCEL__SOURCE_NBYTES];
};

typedef enum field_kind { FLAG, INT, REAL, STRING, PRECISION, DTYPE, SHARD } field_kind;

typedef struct field {
    const char *name;
    size_t offset, nbytes;
    field_kind kind;
} field;

static const field fields[ACCEL__OPT_COUNT] = {
#define ACCEL__OPTION_ROW(f, k)                                                                    \
    {#f, offsetof(accel_options, f), sizeof(((accel_options *)NULL)->f), k},
    ACCEL__OPTION_FIELDS(ACCEL__OPTION_ROW)
#undef ACCEL__OPTION_ROW
};

accel_status accel__settings_new(accel__settings **out)
{
    accel__settings *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    }
    const char *ls;
    if (accel__env_string("ACCEL_LAUNCH_SOURCES", &ls) == ACCEL_OK &&
        (s->launch_sources = accel__strdup(ls)) == NULL) {
        accel__free(s);
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    }
    *out = s;
    return ACCEL_OK;
}

void accel__settings_free(accel__settings *s)
{
    if (s == NULL) {
        return;
    }
    accel__free(s->launch_sources);
    accel__free(s->lines);
    accel__free(s->summary);
    accel__free(s->strings);
    accel__free(s);
}

void accel__settings_src(accel__settings *s, accel__option_id id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->src[id], sizeof(s->src[id]), fmt, ap);
    va_end(ap);
}

const char *accel__settings_env_source(const accel__settings *s, const char *var, char *buf,
                                       size_t nbytes)
{
    /* accel launch lists the variables it set as "VAR\tsource" lines. */
    size_t n = strlen(var);
    for (const char *p = s->launch_sources; p != NULL && *p != '\0';) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > n + 1 && strncmp(p, var, n) == 0 && p[n] == '\t') {
            snprintf(buf, nbytes, "%.*s (env %s)", (int)(len - n - 1), p + n + 1, var);
            return buf;
        }
        p = end ? end + 1 : p + len;
    }
    snprintf(buf, nbytes, "env %s", var);
    return buf;
}

void accel__settings_src_env(accel__settings *s, accel__option_id id, const char *var)
{
    accel__settings_env_source(s, var, s->src[id], sizeof(s->src[id]));
}

accel_status accel__settings_add(accel__settings *s, const char *name, const char *value,
                                 const char *source)
{
    if (s->n_lines == s->cap_lines) {
        int cap = s->cap_lines ? 2 * s->cap_lines : 64;
        accel__setting *l = accel__realloc(s->lines, (size_t)cap * sizeof(*l));
        if (l == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
        }
        s->lines = l;
        s->cap_lines = cap;
    }
    accel__setting *l = &s->lines[s->n_lines++];
    snprintf(l->name, sizeof(l->name), "%s", name);
    snprintf(l->value, sizeof(l->value), "%s", value);
    snprintf(l->source, sizeof(l->source), "%s", source);
    return ACCEL_OK;
}

static const accel__setting *find(const accel__settings *s, const char *name)
{
    for (int i = 0; s != NULL && i < s->n_lines; i++) {
        if (strcmp(s->lines[i].name, name) == 0) {
            return &s->lines[i];
        }
    }
    return NULL;
}

/* 1 when a line already names environment variable `var` as its source. */
static int shown(const accel__settings *s, const char *var)
{
    char tag[96];
    snprintf(tag, sizeof(tag), "env %s", var);
    size_t n = strlen(tag);
    for (int i = 0; i < s->n_lines; i++) {
        const char *p = strstr(s->lines[i].source, tag);
        if (p != NULL && (p[n] == '\0' || p[n] == ')' || p[n] == ',')) {
            return 1;
        }
    }
    return find(s, var) != NULL;
}

/* ---- environment values modules read later ---- */

/* Copies the environment strings the track settings keep: the environment may change after
 * accel_init (setenv), the settings must not. */
static accel_status keep_strings(accel__settings *s, const char *const *in, const char **out, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += in[i] ? strlen(in[i]) + 1 : 0;
    }
    s->strings = accel__malloc(total > 0 ? total : 1);
    if (s->strings == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    }
    char *p = s->strings;
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (in[i] != NULL) {
            size_t len = strlen(in[i]) + 1;
            memcpy(p, in[i], len);
            out[i] = p;
            p += len;
        }
    }
    return ACCEL_OK;
}

/* Named loggers: ACCELERATE_LOG_LEVEL (Accelerate's name) wins over ACCEL_LOG_LEVEL; INFO when
 * neither is set, because C has no logging.basicConfig to lower Python's WARNING default. */
static accel_status read_logger_level(accel__settings *s)
{
    static const char *const vars[] = {"ACCELERATE_LOG_LEVEL", "ACCEL_LOG_LEVEL"};
    char src[ACCEL__SOURCE_NBYTES];
    s->track.logger_level = ACCEL__LOG_INFO; /* the same numbers as accel_log_level */
    snprintf(src, sizeof(src), "default");
    for (int i = 0; i < 2; i++) {
        const char *v;
        if (accel__env_string(vars[i], &v) != ACCEL_OK) {
            continue;
        }
        int lv = accel__log_parse_level(v);
        if (lv >= 0) {
            s->track.logger_level = lv;
            accel__settings_env_source(s, vars[i], src, sizeof(src));
            break;
        }
        accel__log(NULL, ACCEL__LOG_WARN, "%s=\"%s\" is not a log level; using info", vars[i], v);
    }
    static const char *const names[] = {"debug", "info", "warning", "error", "off"};
    return accel__settings_add(s, "logger_level", names[s->track.logger_level], src);
}

accel_status accel__settings_read_env(accel__settings *s)
{
    static const char *const vars[] = {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                                       "MLFLOW_RUN_ID", "USER"};
    const char *in[4], *kept[4];
    for (int i = 0; i < 4; i++) {
        if (accel__env_string(vars[i], &in[i]) != ACCEL_OK) {
            in[i] = NULL;
        }
    }
    ACCEL_TRY(keep_strings(s, in, kept, 4));
    s->track.mlflow_tracking_uri = kept[0];
    s->track.mlflow_experiment_name = kept[1];
    s->track.mlflow_run_id = kept[2];
    s->track.user = kept[3] != NULL ? kept[3] : "unknown";
    return read_logger_level(s);
}

void accel__settings_views(accel__settings *s, const accel_options *o)
{
    s->train = (accel__train_settings){
        .mixed_precision = o->mixed_precision,
        .gradient_accumulation_steps = o->gradient_accumulation_steps,
        .sync_with_dataloader = o->sync_with_dataloader,
        .sync_each_batch = o->sync_each_batch,
        .adjust_scheduler = o->adjust_scheduler,
        .step_scheduler_with_optimizer = o->step_scheduler_with_optimizer,
        .split_batches = o->split_batches,
        .first_bucket_mb = o->first_bucket_mb,
        .bucket_cap_mb = o->bucket_cap_mb,
        .overlap_comm = o->overlap_comm,
        .comm_dtype = o->comm_dtype,
        .init_scale = o->init_scale,
        .growth_factor = o->growth_factor,
        .backoff_factor = o->backoff_factor,
        .growth_interval = o->growth_interval,
        .zero_stage = o->zero_stage,
        .zero_shard_size = o->zero_shard_size,
    };
    s->data.split_batches = o->split_batches;
    s->data.even_batches = o->even_batches;
    s->data.use_seedable_sampler = o->use_seedable_sampler;
    s->data.dispatch_batches = o->dispatch_batches;
    s->ckpt.project_dir = o->project_dir;
    s->ckpt.automatic_checkpoint_naming = o->automatic_checkpoint_naming;
    s->ckpt.total_limit = o->total_limit;
    s->ckpt.iteration = o->iteration;
    s->ckpt.save_on_each_node = o->save_on_each_node;
    s->ckpt.resume_from_checkpoint = o->resume_from_checkpoint;
    s->ckpt.mixed_precision = o->mixed_precision;
    s->track.log_with = o->log_with;
    s->track.logging_dir = o->logging_dir;
}

/* ---- the table ---- */

/* The shortest "%.*g" text that reads back as d: "%g"'s text wherever six digits are exact, and
 * never two different values shown alike (processes compared by accel__settings_agree). */
static void format_real(double d, char *buf, size_t nbytes)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, nbytes, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) {
            return;
        }
    }
}

static void format_value(const accel_options *o, const field *f, char *buf, size_t nbytes)
{
    const char *p = (const char *)o + f->offset;
    int i;
    double d;
    const char *str;
    switch (f->kind) {
    case FLAG:
    case INT:
        memcpy(&i, p, sizeof(i));
        snprintf(buf, nbytes, "%d", i);
        break;
    case REAL:
        memcpy(&d, p, sizeof(d));
        format_real(d, buf, nbytes);
        break;
    case STRING:
        memcpy(&str, p, sizeof(str));
        snprintf(buf, nbytes, "%s", str ? str : "(none)");
        break;
    case PRECISION:
        memcpy(&i, p, sizeof(i));
        snprintf(buf, nbytes, "%s", accel_precision_name((accel_precision)i));
        break;
    case SHARD:
        memcpy(&i, p, sizeof(i));
        if (i == ACCEL_SHARD_MACHINE || i == 0) {
            snprintf(buf, nbytes, "%s", i == 0 ? "0 (every process)" : "machine");
        } else {
            snprintf(buf, nbytes, "%d", i);
        }
        break;
    case DTYPE:
        memcpy(&i, p, sizeof(i));
        snprintf(buf, nbytes, "%s", i < 0 ? "(the gradients' dtype)" : accel_dtype_name(i));
        break;
    }
}

void accel__settings_format(const accel_options *o, accel__option_id id, char *buf, size_t nbytes)
{
    format_value(o, &fields[id], buf, nbytes);
}

const char *accel__settings_field_name(accel__option_id id)
{
    return fields[id].name;
}

static accel_status build_summary(accel__settings *s)
{
    int width = 0;
    size_t total = 64;
    for (int i = 0; i < s->n_lines; i++) {
        int n = (int)strlen(s->lines[i].name);
        width = n > width ? n : width;
        total += strlen(s->lines[i].value) + strlen(s->lines[i].source) + 64;
    }
    s->summary = accel__malloc(total + (size_t)s->n_lines * (size_t)width);
    if (s->summary == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    }
    size_t k = 0;
    for (int i = 0; i < s->n_lines; i++) {
        const accel__setting *l = &s->lines[i];
        k += (size_t)sprintf(s->summary + k, "  %-*s = %s  [%s]\n", width, l->name, l->value,
                             l->source);
    }
    s->summary[k] = '\0';
    return ACCEL_OK;
}

accel_status accel__settings_finish(accel__settings *s, const accel_options *given,
                                    const accel_options *resolved)
{
    /* The option fields first, in accel_options' order, then the lines recorded during
     * resolution (layout, backend, rendezvous, loggers); a recorded line named like a field
     * (backend, config_file: resolved outside accel_options) takes that field's place. */
    accel__setting *extra = s->lines;
    int n_extra = s->n_lines;
    s->lines = NULL;
    s->n_lines = s->cap_lines = 0;
    char *used = accel__calloc((size_t)n_extra + 1, 1);
    accel_status st =
        used != NULL ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    const accel_options dflt = accel_options_default();
    for (int i = 0; i < ACCEL__OPT_COUNT && st == ACCEL_OK; i++) {
        const field *f = &fields[i];
        int j = 0;
        while (j < n_extra && strcmp(extra[j].name, f->name) != 0) {
            j++;
        }
        if (j < n_extra) {
            used[j] = 1;
            st = accel__settings_add(s, f->name, extra[j].value, extra[j].source);
            continue;
        }
        char value[ACCEL__SOURCE_NBYTES];
        format_value(resolved, f, value, sizeof(value));
        const char *src = s->src[i];
        if (src[0] == '\0') {
            int set = memcmp((const char *)given + f->offset, (const char *)&dflt + f->offset,
                             f->nbytes) != 0;
            src = set ? "argument" : "default";
        }
        st = accel__settings_add(s, f->name, value, src);
    }
    for (int j = 0; j < n_extra && st == ACCEL_OK; j++) {
        if (!used[j]) {
            st = accel__settings_add(s, extra[j].name, extra[j].value, extra[j].source);
        }
    }
    accel__free(used);
    accel__free(extra);
    /* Every other variable of the env table that is set: what the job ran with, even where
     * the lines above do not name it (backend knobs, launcher bookkeeping). */
    for (const accel__env_var *v = accel__env_table(); v->name != NULL && st == ACCEL_OK; v++) {
        const char *val;
        if (shown(s, v->name) || strcmp(v->name, "ACCEL_LAUNCH_SOURCES") == 0 ||
            accel__env_string(v->name, &val) != ACCEL_OK) {
            continue;
        }
        /* The job id names the job's shared memory and must stay unguessable: never shown. */
        if (strcmp(v->name, "ACCEL_JOB_ID") == 0) {
            val = "(set, not shown)";
        }
        char src[ACCEL__SOURCE_NBYTES];
        st = accel__settings_add(s, v->name, val,
                                 accel__settings_env_source(s, v->name, src, sizeof(src)));
    }
    return st == ACCEL_OK ? build_summary(s) : st;
}

void accel__settings_print(const accel__settings *s, int n_ranks)
{
    char head[128];
    int n = snprintf(head, sizeof(head),
                     "[rank 0/%d] accel: resolved configuration (value [source]):\n", n_ranks);
    const char *body = s->summary != NULL ? s->summary : "";
    size_t nb = strlen(body);
    char *all = accel__malloc((size_t)n + nb);
    if (all == NULL) {
        return; /* a diagnostic: nothing to report the failure to */
    }
    memcpy(all, head, (size_t)n);
    memcpy(all + n, body, nb);
    for (size_t off = 0, total = (size_t)n + nb; off < total;) {
        ssize_t w = write(2, all + off, total - off);
        if (w <= 0 && errno != EINTR) {
            break;
        }
        off += w > 0 ? (size_t)w : 0;
    }
    accel__free(all);
}

/* ---- public accessors ---- */

const char *accel_settings_summary(const accel *acc)
{
    if (acc == NULL || acc->settings == NULL || acc->settings->summary == NULL) {
        return "";
    }
    return acc->settings->summary;
}

const char *accel_setting_source(const accel *acc, const char *name)
{
    const accel__setting *l = acc != NULL && name != NULL ? find(acc->settings, name) : NULL;
    return l != NULL ? l->source : NULL;
}

const char *accel_setting_value(const accel *acc, const char *name)
{
    const accel__setting *l = acc != NULL && name != NULL ? find(acc->settings, name) : NULL;
    return l != NULL ? l->value : NULL;
}
