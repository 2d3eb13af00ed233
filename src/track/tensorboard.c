/*
 * The "tensorboard" tracker: one event file per run under logging_dir/project_name, named
 * events.out.tfevents.<time>.<host>.<pid>.<n> as TensorBoard's writers name them.
 *
 * Records are Event protobufs in TFRecord framing (tfevents.c): first file_version
 * "brain.Event:2", then a SessionLog START event, then one Event per log call whose Summary
 * holds a simple_value per scalar and a text-plugin string tensor per text value; the run
 * configuration goes out as the hparams plugin's experiment and session_start_info summaries
 * (session_end_info at finish) and as hparams.yml. The file is flushed after every record so a
 * crash loses nothing already logged.
 *
 * Resuming uses TensorBoard's own purge rule: a START event at step S that is not the first
 * START of the run makes its reader discard the events already read at steps >= S. So every
 * session opens with a START, at step 0 or at the step accel_trackers_resume gives, and since
 * that step is known only after start, the START (with the hparams summaries queued behind it)
 * is written by the first of log / resume / finish.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "track_internal.h"

/* Protobuf field numbers (tensorflow/core/util/event.proto, framework/summary.proto,
 * tensor.proto, tensor_shape.proto; tensorboard/plugins/hparams/plugin_data.proto, api.proto). */
enum {
    EVENT_WALL_TIME = 1,
    EVENT_STEP = 2,
    EVENT_FILE_VERSION = 3,
    EVENT_SUMMARY = 5,
    EVENT_SESSION_LOG = 7,
    SESSION_LOG_STATUS = 1,
    SESSION_START = 1,
    SUMMARY_VALUE = 1,
    VALUE_TAG = 1,
    VALUE_SIMPLE = 2,
    VALUE_TENSOR = 8,
    VALUE_METADATA = 9,
    META_PLUGIN_DATA = 1,
    PLUGIN_NAME = 1,
    PLUGIN_CONTENT = 2,
    TENSOR_DTYPE = 1,
    TENSOR_SHAPE = 2,
    TENSOR_FLOAT_VAL = 5,
    TENSOR_STRING_VAL = 8,
    SHAPE_DIM = 2,
    DIM_SIZE = 1,
    DT_FLOAT = 1,
    DT_STRING = 7,
    HP_EXPERIMENT = 2,
    HP_SESSION_START = 3,
    HP_SESSION_END = 4,
    EXP_TIME_CREATED = 3,
    EXP_HPARAM_INFOS = 4,
    HPINFO_NAME = 1,
    HPINFO_TYPE = 4,
    HPTYPE_STRING = 1,
    HPTYPE_FLOAT64 = 3,
    START_HPARAMS = 1,
    START_TIME_SECS = 5,
    END_STATUS = 1,
    END_TIME_SECS = 2,
    STATUS_SUCCESS = 1,
    MAPENTRY_KEY = 1,
    MAPENTRY_VALUE = 2,
    PBVALUE_NUMBER = 2,
    PBVALUE_STRING = 3,
};

typedef struct tb_state {
    accel__track_common common; /* first: accel_tracker_run_dir reads it */
    FILE *f;
    char *path;
    long long good; /* bytes of whole records: a failed append is cut back to it */
    int wrote_hparams;
    int session_started;  /* the START event is written */
    accel__pb pending[2]; /* the hparams events waiting for the START */
    int n_pending;
    /* Reused encode buffers: after the first few steps logging allocates nothing. */
    accel__pb event, summary, value, a, b, c;
} tb_state;

static int file_counter;

/* Appends ev (an encoded Event) as one record and flushes. A record cut short by a full disk
 * is cut off the file again: TensorBoard's reader stops at a broken record, so it would hide
 * every event written after it, once the disk has room again. */
static accel_status emit(tb_state *s, const accel__pb *ev)
{
    if (ev->failed) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory encoding an event");
    }
    if (s->f == NULL) {
        s->f = accel__track_reopen_at(NULL, s->path, s->good, "ab");
        if (s->f == NULL) {
            return accel_tracker_seterr(ACCEL_EIO, "cannot reopen %s: %s", s->path,
                                        strerror(errno));
        }
    }
    if (accel__tfrecord_write(s->f, ev->data, ev->len) != 0 || fflush(s->f) != 0) {
        accel_status st =
            accel_tracker_seterr(ACCEL_EIO, "cannot write %s: %s", s->path, strerror(errno));
        s->f = accel__track_reopen_at(s->f, s->path, s->good, "ab");
        return st;
    }
    s->good = (long long)ftello(s->f);
    return ACCEL_OK;
}

/* An event file deleted (or replaced) while the run writes it: a new one is started under the
 * same name with its version record, as TensorFlow's EventsWriter does, instead of writing on
 * into a file nobody can see. */
static accel_status check_file(tb_state *s)
{
    if (s->f == NULL || !accel__track_file_gone(s->f, s->path)) {
        return ACCEL_OK;
    }
    accel__log(accel__track_log(), ACCEL__LOG_WARN,
               "tracker tensorboard: %s was deleted or replaced while the run wrote it; writing "
               "a new one",
               s->path);
    fclose(s->f);
    s->f = NULL;
    accel_status st = accel__mkdirs(s->common.run_dir);
    if (st != ACCEL_OK) {
        return accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
    s->good = -1; /* nothing of the old file to keep */
    accel__pb version = {0};
    accel__pb_double(&version, EVENT_WALL_TIME, accel__wall_time());
    accel__pb_string(&version, EVENT_FILE_VERSION, "brain.Event:2");
    st = emit(s, &version);
    accel__pb_free(&version);
    return st;
}

static void event_head(tb_state *s, double wall, long long step)
{
    accel__pb_reset(&s->event);
    accel__pb_double(&s->event, EVENT_WALL_TIME, wall);
    if (step > 0) {
        accel__pb_varint(&s->event, EVENT_STEP, (uint64_t)step);
    }
}

/* Writes a START at `step` (unless the session has one and `again` is 0), then the queued
 * hparams events. */
static accel_status begin_session(tb_state *s, long long step, int again)
{
    if (s->session_started && !again) {
        return ACCEL_OK;
    }
    accel__pb start = {0};
    accel__pb_varint(&start, SESSION_LOG_STATUS, SESSION_START);
    event_head(s, accel__wall_time(), step);
    accel__pb_message(&s->event, EVENT_SESSION_LOG, &start);
    accel__pb_free(&start);
    ACCEL_TRY(emit(s, &s->event));
    s->session_started = 1;
    for (int i = 0; i < s->n_pending; i++) {
        ACCEL_TRY(emit(s, &s->pending[i]));
    }
    s->n_pending = 0;
    return ACCEL_OK;
}

/* Encodes a summary metadata naming `plugin` with `content` into out. */
static void plugin_metadata(accel__pb *out, accel__pb *tmp, const char *plugin, const void *content,
                            size_t content_nbytes)
{
    accel__pb_reset(tmp);
    accel__pb_string(tmp, PLUGIN_NAME, plugin);
    accel__pb_bytes(tmp, PLUGIN_CONTENT, content, content_nbytes);
    accel__pb_reset(out);
    accel__pb_message(out, META_PLUGIN_DATA, tmp);
}

static accel_status tb_start(void *user, const accel_tracker_start_info *info, void **state)
{
    (void)user;
    tb_state *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    s->common.magic = ACCEL__TRACK_MAGIC;
    s->common.run_dir = accel__path_join(info->logging_dir, info->project_name);
    if (s->common.run_dir == NULL) {
        accel__free(s);
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    accel_status st = accel__mkdirs(s->common.run_dir);
    if (st != ACCEL_OK) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
        goto fail;
    }
    char host[128] = "localhost";
    if (gethostname(host, sizeof(host) - 1) != 0) {
        strcpy(host, "localhost");
    }
    host[sizeof(host) - 1] = '\0';
    char name[320];
    snprintf(name, sizeof(name), "events.out.tfevents.%010lld.%s.%d.%d",
             (long long)info->start_time, host, (int)getpid(),
             __atomic_fetch_add(&file_counter, 1, __ATOMIC_RELAXED));
    s->path = accel__path_join(s->common.run_dir, name);
    if (s->path == NULL) {
        st = accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
        goto fail;
    }
    s->f = fopen(s->path, "wb");
    if (s->f == NULL) {
        st = accel_tracker_seterr(ACCEL_EIO, "cannot create event file %s: %s", s->path,
                                  strerror(errno));
        goto fail;
    }
    event_head(s, info->start_time, 0);
    accel__pb_string(&s->event, EVENT_FILE_VERSION, "brain.Event:2");
    st = emit(s, &s->event);
    if (st != ACCEL_OK) {
        goto fail;
    }
    *state = s;
    return ACCEL_OK;
fail:
    if (s->f != NULL) {
        fclose(s->f);
    }
    accel__free(s->path);
    accel__free(s->common.run_dir);
    accel__pb_free(&s->event);
    accel__free(s);
    return st;
}

/* Adds one Summary.Value for v to s->summary. */
static void add_value(tb_state *s, const accel_value *v)
{
    accel__pb_reset(&s->value);
    accel__pb_string(&s->value, VALUE_TAG, v->key);
    if (v->kind == ACCEL_VALUE_SCALAR) {
        if (!isfinite(v->scalar)) {
            accel__track_warn_nonfinite("tensorboard", v->key, v->scalar);
        }
        accel__pb_float(&s->value, VALUE_SIMPLE, (float)v->scalar);
    } else {
        /* Text: a rank-1 DT_STRING tensor tagged with the text plugin (TextPluginData is an
         * empty message at version 0). */
        accel__pb_reset(&s->b);
        accel__pb_varint(&s->b, DIM_SIZE, 1);
        accel__pb_reset(&s->c);
        accel__pb_message(&s->c, SHAPE_DIM, &s->b);
        accel__pb_reset(&s->a);
        accel__pb_varint(&s->a, TENSOR_DTYPE, DT_STRING);
        accel__pb_message(&s->a, TENSOR_SHAPE, &s->c);
        /* string_val is bytes: the text goes in as given */
        accel__pb_bytes(&s->a, TENSOR_STRING_VAL, v->text, strlen(v->text));
        accel__pb_message(&s->value, VALUE_TENSOR, &s->a);
        plugin_metadata(&s->c, &s->b, "text", "", 0);
        accel__pb_message(&s->value, VALUE_METADATA, &s->c);
    }
    accel__pb_message(&s->summary, SUMMARY_VALUE, &s->value);
}

static accel_status tb_log(void *state, const accel_value *values, int n, long long step)
{
    tb_state *s = state;
    accel__pb_reset(&s->summary);
    for (int i = 0; i < n; i++) {
        add_value(s, &values[i]);
    }
    ACCEL_TRY(check_file(s));
    ACCEL_TRY(begin_session(s, 0, 0));
    event_head(s, accel__wall_time(), step);
    accel__pb_message(&s->event, EVENT_SUMMARY, &s->summary);
    return emit(s, &s->event);
}

static accel_status tb_resume(void *state, long long step)
{
    return begin_session(state, step, 1);
}

/* Writes one hparams-plugin summary event: tag with metadata content `plugin_data` and a
 * scalar float tensor (TensorBoard stores only values that carry a tensor). */
static accel_status emit_hparams(tb_state *s, const char *tag, const accel__pb *plugin_data,
                                 double wall)
{
    accel__pb_reset(&s->value);
    accel__pb_string(&s->value, VALUE_TAG, tag);
    accel__pb_reset(&s->a);
    accel__pb_varint(&s->a, TENSOR_DTYPE, DT_FLOAT);
    accel__pb_bytes(&s->a, TENSOR_SHAPE, "", 0);
    accel__pb_float(&s->a, TENSOR_FLOAT_VAL, 0.0f);
    accel__pb_message(&s->value, VALUE_TENSOR, &s->a);
    plugin_metadata(&s->c, &s->b, "hparams", plugin_data->data, plugin_data->len);
    accel__pb_message(&s->value, VALUE_METADATA, &s->c);
    accel__pb_reset(&s->summary);
    accel__pb_message(&s->summary, SUMMARY_VALUE, &s->value);
    event_head(s, wall, 0);
    accel__pb_message(&s->event, EVENT_SUMMARY, &s->summary);
    if (plugin_data->failed) {
        s->event.failed = 1;
    }
    if (!s->session_started && s->n_pending < 2) { /* queued behind the START */
        accel__pb t = s->pending[s->n_pending];
        s->pending[s->n_pending++] = s->event;
        s->event = t;
        return ACCEL_OK;
    }
    return emit(s, &s->event);
}

/* hparams.yml: one "key": value line per item. Keys and texts are JSON strings, which are YAML
 * double-quoted scalars, so any byte (newline, quote, non-UTF-8) reads back; numbers are
 * spelled as YAML 1.1 readers (PyYAML) take them for floats: .nan / .inf, and an exponent form
 * with a '.' ("1.0e+300": "1e+300" would read back as a string). */
static accel_status write_yaml(tb_state *s, const accel_value *config, int n)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    char *path = accel__path_join(s->common.run_dir, "hparams.yml");
    if (path == NULL || m == NULL) {
        if (m != NULL) {
            fclose(m);
        }
        free(text); /* open_memstream allocates with the C library */
        accel__free(path);
        return accel_tracker_seterr(ACCEL_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        const accel_value *v = &config[i];
        accel__json_string(m, v->key);
        fputs(": ", m);
        if (v->kind == ACCEL_VALUE_SCALAR) {
            char num[48];
            if (isnan(v->scalar)) {
                snprintf(num, sizeof(num), ".nan");
            } else if (isinf(v->scalar)) {
                snprintf(num, sizeof(num), v->scalar > 0 ? ".inf" : "-.inf");
            } else {
                accel__track_fmt_double(num, sizeof(num), v->scalar);
                char *e = strchr(num, 'e');
                if (e != NULL && strchr(num, '.') == NULL) {
                    memmove(e + 2, e, strlen(e) + 1);
                    memcpy(e, ".0", 2);
                }
            }
            fputs(num, m);
        } else {
            accel__json_string(m, v->text);
        }
        fputc('\n', m);
    }
    int bad = fclose(m) != 0;
    accel_status st = bad ? accel_tracker_seterr(ACCEL_ENOMEM, "out of memory")
                          : accel__write_file_atomic(path, text, len);
    if (st != ACCEL_OK && !bad) {
        accel_tracker_seterr(st, "%s", accel_last_error(NULL));
    }
    free(text);
    accel__free(path);
    return st;
}

static accel_status tb_config(void *state, const accel_value *config, int n)
{
    tb_state *s = state;
    double wall = accel__wall_time();
    accel__pb info = {0}, exp = {0}, hp = {0}, entry = {0}, val = {0};

    /* Experiment: one HParamInfo per key so the dashboard lists the columns. */
    for (int i = 0; i < n; i++) {
        accel__pb_reset(&info);
        accel__pb_string(&info, HPINFO_NAME, config[i].key);
        accel__pb_varint(&info, HPINFO_TYPE,
                         config[i].kind == ACCEL_VALUE_SCALAR ? HPTYPE_FLOAT64 : HPTYPE_STRING);
        accel__pb_message(&exp, EXP_HPARAM_INFOS, &info);
    }
    accel__pb_double(&exp, EXP_TIME_CREATED, wall);
    accel__pb_message(&hp, HP_EXPERIMENT, &exp);
    accel_status st = emit_hparams(s, "_hparams_/experiment", &hp, wall);

    /* SessionStartInfo: map<string, google.protobuf.Value> hparams. */
    accel__pb_reset(&exp);
    for (int i = 0; i < n && st == ACCEL_OK; i++) {
        accel__pb_reset(&val);
        if (config[i].kind == ACCEL_VALUE_SCALAR) {
            accel__pb_double(&val, PBVALUE_NUMBER, config[i].scalar);
        } else {
            accel__pb_string(&val, PBVALUE_STRING, config[i].text);
        }
        accel__pb_reset(&entry);
        accel__pb_string(&entry, MAPENTRY_KEY, config[i].key);
        accel__pb_message(&entry, MAPENTRY_VALUE, &val);
        accel__pb_message(&exp, START_HPARAMS, &entry);
    }
    accel__pb_double(&exp, START_TIME_SECS, wall);
    accel__pb_reset(&hp);
    accel__pb_message(&hp, HP_SESSION_START, &exp);
    if (st == ACCEL_OK) {
        st = emit_hparams(s, "_hparams_/session_start_info", &hp, wall);
    }
    accel__pb_free(&info);
    accel__pb_free(&exp);
    accel__pb_free(&hp);
    accel__pb_free(&entry);
    accel__pb_free(&val);
    if (st == ACCEL_OK) {
        s->wrote_hparams = 1;
        st = write_yaml(s, config, n);
    }
    return st;
}

static accel_status tb_finish(void *state)
{
    tb_state *s = state;
    accel_status st = begin_session(s, 0, 0);
    if (st == ACCEL_OK && s->wrote_hparams) {
        accel__pb end = {0}, hp = {0};
        double wall = accel__wall_time();
        accel__pb_varint(&end, END_STATUS, STATUS_SUCCESS);
        accel__pb_double(&end, END_TIME_SECS, wall);
        accel__pb_message(&hp, HP_SESSION_END, &end);
        st = emit_hparams(s, "_hparams_/session_end_info", &hp, wall);
        accel__pb_free(&end);
        accel__pb_free(&hp);
    }
    if (s->f != NULL && fclose(s->f) != 0 && st == ACCEL_OK) {
        st = accel_tracker_seterr(ACCEL_EIO, "cannot close %s: %s", s->path, strerror(errno));
    }
    accel__pb_free(&s->event);
    accel__pb_free(&s->summary);
    accel__pb_free(&s->value);
    accel__pb_free(&s->a);
    accel__pb_free(&s->b);
    accel__pb_free(&s->c);
    accel__pb_free(&s->pending[0]);
    accel__pb_free(&s->pending[1]);
    accel__free(s->path);
    accel__free(s->common.run_dir);
    accel__free(s);
    return st;
}

const accel_tracker_ops accel__tracker_tensorboard = {
    .size = sizeof(accel_tracker_ops),
    .name = "tensorboard",
    .requires_logging_directory = 1,
    .start = tb_start,
    .store_init_configuration = tb_config,
    .log = tb_log,
    .finish = tb_finish,
    .resume = tb_resume,
};
