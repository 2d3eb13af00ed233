/*
 * Reads Accelerate's config file with libyaml. JSON configs parse too (JSON is YAML flow
 * syntax). Every key any Accelerate version writes has one policy in `keys` below (the table in
 * docs/configuration.md is the same):
 *   used      accel acts on it; a malformed value is an error;
 *   accepted  nothing for accel to do whatever the value (launcher details of one machine);
 *   ignored   accel does not do what it configures: a note (logged once as a warning) when the
 *             value asks for something, silence for the neutral values Accelerate writes by
 *             default (false, 'no', {}, []), so a stock file stays quiet;
 *   refused   ACCEL_EUNSUPPORTED when the value asks for it, rather than silently running
 *             something else (another device, paradigm, several machines).
 * Keys not in the table (a newer Accelerate, a typo) are noted, never an error: accel reads the
 * default location on its own, so a file written for Python must not stop C programs.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "base/fs.h"
#include "config.h"

/* ---- a top-level value: a scalar, or a mapping / sequence summarised ---- */

enum { VAL_SCALAR, VAL_MAP, VAL_SEQ };
#define MAX_SUB 16

typedef struct cfg_value {
    int kind;
    char text[256]; /* scalar value */
    int n;          /* entries of a mapping / items of a sequence */
    int n_sub;      /* the first MAX_SUB scalar entries of a mapping / items of a sequence */
    char sub_key[MAX_SUB][64], sub_val[MAX_SUB][128];
    int nested; /* a mapping or sequence inside */
} cfg_value;

static int is_null(const char *v)
{
    return v[0] == '\0' || strcmp(v, "null") == 0 || strcmp(v, "~") == 0 || strcmp(v, "None") == 0;
}

/* A scalar that asks for nothing: null, false, no, 0. */
static int neutral_text(const char *v)
{
    return is_null(v) || strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0 ||
           strcmp(v, "0") == 0;
}

/* A value that asks for nothing: a neutral scalar, or a mapping / sequence of them. */
static int neutral(const cfg_value *v)
{
    if (v->kind == VAL_SCALAR) {
        return neutral_text(v->text);
    }
    if (v->nested || v->n > v->n_sub) {
        return 0;
    }
    for (int i = 0; i < v->n_sub; i++) {
        if (!neutral_text(v->sub_val[i])) {
            return 0;
        }
    }
    return 1;
}

/* The value as written, short: "true", "{ipex: true}", "[a, b]". */
static void describe(const cfg_value *v, char *out, size_t cap)
{
    if (v->kind == VAL_SCALAR) {
        snprintf(out, cap, "%.150s", v->text);
        return;
    }
    size_t k = (size_t)snprintf(out, cap, "%c", v->kind == VAL_MAP ? '{' : '[');
    for (int i = 0; i < v->n_sub && k < cap; i++) {
        k += (size_t)snprintf(out + k, cap - k, "%s%.40s%s%.60s", i ? ", " : "",
                              v->kind == VAL_MAP ? v->sub_key[i] : "",
                              v->kind == VAL_MAP ? ": " : "", v->sub_val[i]);
    }
    if (k < cap) {
        snprintf(out + k, cap - k, "%s%c", v->n > v->n_sub || v->nested ? ", ..." : "",
                 v->kind == VAL_MAP ? '}' : ']');
    }
}

/* ---- the keys ---- */

/* Why a GPU setting does not apply, true for this build. A CUDA build runs MULTI_GPU (each
 * process takes GPU LOCAL_RANK, src/core/device_select.c) but picks GPUs itself. */
#if defined(ACCEL_HAVE_CUDA)
#define NO_GPU "accel does not pick GPUs by id; set CUDA_VISIBLE_DEVICES"
#else
#define NO_GPU "this build of accel has no CUDA (configure with -DACCEL_CUDA=ON)"
#endif

typedef accel_status (*key_fn)(accel__config *c, const char *key, const cfg_value *v);

typedef enum { USED, ACCEPTED, IGNORED, REFUSED } key_policy;

typedef struct key_rule {
    const char *name;
    key_policy policy;
    key_fn use;         /* USED: applies the value */
    const char *reason; /* IGNORED / REFUSED: why, for the note or the error */
} key_rule;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
note(accel__config *c, const char *fmt, ...)
{
    if (c->n_notes < ACCEL__CONFIG_MAX_NOTES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->notes[c->n_notes++], sizeof(c->notes[0]), fmt, ap);
        va_end(ap);
    }
}

static accel_status bad(const accel__config *c, const char *key, const cfg_value *v,
                        const char *want)
{
    char val[200];
    describe(v, val, sizeof(val));
    return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: %s: \"%s\" is not %s", c->path, key,
                         val, want);
}

static accel_status refuse(const accel__config *c, const char *key, const cfg_value *v,
                           const char *why)
{
    char val[200];
    describe(v, val, sizeof(val));
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "config file %s: %s: %s is not supported: %s%s",
                         c->path, key, val, why,
                         c->explicit_path ? ""
                                          : " (accel reads this default location on its own; "
                                            "set ACCELERATE_CONFIG_FILE to use another file)");
}

static accel_status get_int(const accel__config *c, const char *key, const cfg_value *v, int *out)
{
    if (v->kind == VAL_SCALAR && is_null(v->text)) {
        return ACCEL_OK;
    }
    char *end;
    errno = 0;
    long x = v->kind == VAL_SCALAR ? strtol(v->text, &end, 10) : 0;
    if (v->kind != VAL_SCALAR || errno != 0 || end == v->text || *end != '\0' || x < -1 ||
        x > 1 << 24) {
        return bad(c, key, v, "an integer");
    }
    *out = (int)x;
    return ACCEL_OK;
}

static accel_status get_bool(const accel__config *c, const char *key, const cfg_value *v, int *out)
{
    if (v->kind == VAL_SCALAR && is_null(v->text)) {
        return ACCEL_OK;
    }
    int b = v->kind == VAL_SCALAR ? accel__parse_bool(v->text) : -1;
    if (b < 0) {
        return bad(c, key, v, "true or false");
    }
    *out = b;
    return ACCEL_OK;
}

static accel_status get_str(const accel__config *c, const char *key, const cfg_value *v, char *out,
                            size_t nbytes)
{
    if (v->kind != VAL_SCALAR || strlen(v->text) >= nbytes) {
        return bad(c, key, v, "a short string");
    }
    strcpy(out, v->text);
    return ACCEL_OK;
}

static accel_status use_distributed_type(accel__config *c, const char *key, const cfg_value *v)
{
    return get_str(c, key, v, c->distributed_type, sizeof(c->distributed_type));
}

static accel_status use_compute_environment(accel__config *c, const char *key, const cfg_value *v)
{
    return get_str(c, key, v, c->compute_environment, sizeof(c->compute_environment));
}

static accel_status use_mixed_precision(accel__config *c, const char *key, const cfg_value *v)
{
    static const char *names[] = {"no", "fp16", "bf16", "fp8"};
    if (v->kind == VAL_SCALAR && is_null(v->text)) {
        return ACCEL_OK;
    }
    for (int i = 0; v->kind == VAL_SCALAR && i < 4; i++) {
        if (strcasecmp(v->text, names[i]) == 0) {
            c->mixed_precision = (accel_precision)i;
            return ACCEL_OK;
        }
    }
    return bad(c, key, v, "one of no, fp16, bf16, fp8");
}

/* Legacy (Accelerate < 0.12): fp16: true means mixed_precision fp16. */
static accel_status use_fp16(accel__config *c, const char *key, const cfg_value *v)
{
    int b = 0;
    ACCEL_TRY(get_bool(c, key, v, &b));
    if (b && c->mixed_precision == ACCEL_PRECISION_UNSET) {
        c->mixed_precision = ACCEL_PRECISION_FP16;
    }
    return ACCEL_OK;
}

static accel_status use_use_cpu(accel__config *c, const char *key, const cfg_value *v)
{
    return get_bool(c, key, v, &c->use_cpu);
}

static accel_status use_debug(accel__config *c, const char *key, const cfg_value *v)
{
    return get_bool(c, key, v, &c->debug);
}

/* Checked against the run's process count by accel__config_warn. */
static accel_status use_num_processes(accel__config *c, const char *key, const cfg_value *v)
{
    return get_int(c, key, v, &c->num_processes);
}

static const char one_machine[] = "accel runs on one machine in this version";

static accel_status use_num_machines(accel__config *c, const char *key, const cfg_value *v)
{
    ACCEL_TRY(get_int(c, key, v, &c->num_machines));
    return c->num_machines > 1 ? refuse(c, key, v, one_machine) : ACCEL_OK;
}

static accel_status use_machine_rank(accel__config *c, const char *key, const cfg_value *v)
{
    ACCEL_TRY(get_int(c, key, v, &c->machine_rank));
    return c->machine_rank > 0 ? refuse(c, key, v, one_machine) : ACCEL_OK;
}

/* "all" (what `accelerate config` writes by default) selects nothing in particular. */
static accel_status use_gpu_ids(accel__config *c, const char *key, const cfg_value *v)
{
    if (!neutral(v) && !(v->kind == VAL_SCALAR && strcasecmp(v->text, "all") == 0)) {
        char val[200];
        describe(v, val, sizeof(val));
        note(c, "config file %s: ignoring %s: %s (%s)", c->path, key, val, NO_GPU);
    }
    return ACCEL_OK;
}

static const char tpu_only[] = "TPU settings (distributed_type XLA), which accel does not run";

/* Every top-level key of ClusterConfig from Accelerate 0.18 to 1.14, the legacy fp16 and
 * dynamo_backend, in docs/configuration.md's order. */
static const key_rule keys[] = {
    {"compute_environment", USED, use_compute_environment, NULL},
    {"distributed_type", USED, use_distributed_type, NULL},
    {"mixed_precision", USED, use_mixed_precision, NULL},
    {"fp16", USED, use_fp16, NULL},
    {"use_cpu", USED, use_use_cpu, NULL},
    {"debug", USED, use_debug, NULL},
    {"num_processes", USED, use_num_processes, NULL},
    {"num_machines", USED, use_num_machines, NULL},
    {"machine_rank", USED, use_machine_rank, NULL},
    {"gpu_ids", USED, use_gpu_ids, NULL},
    {"main_process_ip", ACCEPTED, NULL, NULL},
    {"rdzv_backend", ACCEPTED, NULL, NULL},
    {"same_network", ACCEPTED, NULL, NULL},
    {"main_training_function", ACCEPTED, NULL, NULL},
    {"main_process_port", IGNORED, NULL,
     "accel launch does not read config files yet: pass --main_process_port"},
    {"enable_cpu_affinity", IGNORED, NULL,
     "accel launch binds processes to CPUs itself (--cpu_affinity, auto by default)"},
    {"mpirun_config", IGNORED, NULL,
     "accel launch starts the processes itself (mpirun comes with multi-machine support)"},
    {"ipex_config", IGNORED, NULL, "Intel Extension for PyTorch is a PyTorch add-on"},
    {"dynamo_config", IGNORED, NULL, "torch.compile (dynamo) has no counterpart in C"},
    {"dynamo_backend", IGNORED, NULL, "torch.compile (dynamo) has no counterpart in C"},
    {"fp8_config", IGNORED, NULL, "fp8 training needs a GPU with fp8 support"},
    {"deepspeed_config", IGNORED, NULL, "used with distributed_type DEEPSPEED only"},
    {"fsdp_config", IGNORED, NULL, "used with distributed_type FSDP only"},
    {"megatron_lm_config", IGNORED, NULL, "used with distributed_type MEGATRON_LM only"},
    {"downcast_bf16", IGNORED, NULL, tpu_only},
    {"tpu_name", IGNORED, NULL, tpu_only},
    {"tpu_zone", IGNORED, NULL, tpu_only},
    {"tpu_use_cluster", IGNORED, NULL, tpu_only},
    {"tpu_use_sudo", IGNORED, NULL, tpu_only},
    {"command_file", IGNORED, NULL, tpu_only},
    {"commands", IGNORED, NULL, tpu_only},
    {"tpu_vm", IGNORED, NULL, tpu_only},
    {"tpu_env", IGNORED, NULL, tpu_only},
    {"parallelism_config", REFUSED, NULL,
     "tensor, context and sequence parallelism are not implemented"},
    {"tp_config", REFUSED, NULL, "tensor parallelism is not implemented"},
};

static accel_status apply(accel__config *c, const char *key, const cfg_value *v)
{
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const key_rule *r = &keys[i];
        if (strcmp(key, r->name) != 0) {
            continue;
        }
        if (r->policy == USED) {
            return r->use(c, key, v);
        }
        if (r->policy == ACCEPTED || neutral(v)) {
            return ACCEL_OK;
        }
        if (r->policy == REFUSED) {
            return refuse(c, key, v, r->reason);
        }
        char val[200];
        describe(v, val, sizeof(val));
        note(c, "config file %s: ignoring %s: %s (%s)", c->path, key, val, r->reason);
        return ACCEL_OK;
    }
    note(c,
         "config file %s: ignoring unknown key \"%s\" (not in Accelerate's config up to 1.14: "
         "a newer Accelerate, or a typo?)",
         c->path, key);
    return ACCEL_OK;
}

/* ---- parsing ---- */

/* Skips the rest of a node whose start event (sequence or mapping) was just consumed. */
static int skip_rest(yaml_parser_t *p)
{
    int depth = 1;
    while (depth > 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(p, &ev)) {
            return 0;
        }
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
            depth++;
        } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
    }
    return 1;
}

/* Reads the mapping or sequence whose start event was just consumed into v. Returns 1, 0 on
 * a YAML error, -1 on an alias. */
static int read_collection(yaml_parser_t *p, cfg_value *v)
{
    int is_map = v->kind == VAL_MAP, want_key = 1;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(p, &ev)) {
            return 0;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_MAPPING_END_EVENT || t == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return 1;
        }
        if (t == YAML_SCALAR_EVENT) {
            const char *s = (const char *)ev.data.scalar.value;
            if (is_map && want_key) {
                if (v->n < MAX_SUB) {
                    snprintf(v->sub_key[v->n], sizeof(v->sub_key[0]), "%s", s);
                }
            } else {
                if (v->n < MAX_SUB) {
                    snprintf(v->sub_val[v->n], sizeof(v->sub_val[0]), "%s", s);
                    v->n_sub = v->n + 1;
                }
                v->n++;
            }
            want_key = !want_key || !is_map;
        } else if (t == YAML_MAPPING_START_EVENT || t == YAML_SEQUENCE_START_EVENT) {
            v->nested = 1;
            v->n++;
            want_key = 1;
            if (!skip_rest(p)) {
                yaml_event_delete(&ev);
                return 0;
            }
        } else if (t == YAML_ALIAS_EVENT) {
            yaml_event_delete(&ev);
            return -1;
        }
        yaml_event_delete(&ev);
    }
}

static accel_status yaml_error(const accel__config *c, yaml_parser_t *p)
{
    return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML error at line %zu: %s", c->path,
                         p->problem_mark.line + 1, p->problem ? p->problem : "unknown");
}

static accel_status no_alias(const accel__config *c)
{
    return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML aliases are not allowed",
                         c->path);
}

static accel_status parse(accel__config *c, FILE *f)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "config file %s: out of memory", c->path);
    }
    yaml_parser_set_input_file(&p, f);
    accel_status st = ACCEL_OK;
    char key[128] = "";
    int level = 0, expect_key = 1, done = 0;
    cfg_value v;
    while (!done && st == ACCEL_OK) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            st = yaml_error(c, &p);
            break;
        }
        yaml_event_type_t t = ev.type;
        const char *s = t == YAML_SCALAR_EVENT ? (const char *)ev.data.scalar.value : NULL;
        if (t == YAML_STREAM_END_EVENT || (level == 1 && t == YAML_MAPPING_END_EVENT)) {
            done = 1;
        } else if (t == YAML_ALIAS_EVENT) {
            st = no_alias(c);
        } else if (level == 0 && t == YAML_MAPPING_START_EVENT) {
            level = 1;
        } else if (level == 0 && (t == YAML_SEQUENCE_START_EVENT || t == YAML_SCALAR_EVENT)) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "config file %s: the top level must be a mapping", c->path);
        } else if (level == 1 && expect_key && s != NULL) {
            snprintf(key, sizeof(key), "%s", s);
            expect_key = 0;
        } else if (level == 1 && !expect_key &&
                   (s != NULL || t == YAML_MAPPING_START_EVENT || t == YAML_SEQUENCE_START_EVENT)) {
            memset(&v, 0, sizeof(v));
            if (s != NULL) {
                v.kind = VAL_SCALAR;
                snprintf(v.text, sizeof(v.text), "%s", s);
            } else {
                v.kind = t == YAML_MAPPING_START_EVENT ? VAL_MAP : VAL_SEQ;
                int r = read_collection(&p, &v);
                st = r == 1 ? ACCEL_OK : r == 0 ? yaml_error(c, &p) : no_alias(c);
            }
            st = st == ACCEL_OK ? apply(c, key, &v) : st;
            expect_key = 1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return st;
}

/* The distributed types of Accelerate (0.18 to 1.14) other than NO and MULTI_CPU, and why
 * accel does not run them. */
static const char *const not_run[][2] = {
    {"MULTI_GPU", "this build of accel has no CUDA (configure with -DACCEL_CUDA=ON); use "
                  "MULTI_CPU or NO"},
    {"DEEPSPEED", "DeepSpeed is not implemented"},
    {"FSDP", "FSDP is not implemented"},
    {"MEGATRON_LM", "Megatron-LM is not implemented"},
    {"XLA", "accel runs on CPUs"},
    {"TPU", "accel runs on CPUs"},
    {"MPS", "accel runs on CPUs"},
    {"MULTI_NPU", "accel runs on CPUs"},
    {"MULTI_XPU", "accel runs on CPUs"},
    {"MULTI_MLU", "accel runs on CPUs"},
    {"MULTI_MUSA", "accel runs on CPUs"},
    {"MULTI_SDAA", "accel runs on CPUs"},
    {"MULTI_HPU", "accel runs on CPUs"},
    {"MULTI_NEURON", "accel runs on CPUs"},
};

static accel_status validate(accel__config *c)
{
    cfg_value v = {.kind = VAL_SCALAR};
    if (c->compute_environment[0] == '\0') {
        strcpy(c->compute_environment, "LOCAL_MACHINE");
    }
    snprintf(v.text, sizeof(v.text), "%s", c->compute_environment);
    if (strcmp(c->compute_environment, "AMAZON_SAGEMAKER") == 0) {
        return refuse(c, "compute_environment", &v, "accel runs on the local machine only");
    }
    if (strcmp(c->compute_environment, "LOCAL_MACHINE") != 0) {
        return bad(c, "compute_environment", &v, "LOCAL_MACHINE or AMAZON_SAGEMAKER");
    }
    if (c->distributed_type[0] == '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: distributed_type is required",
                             c->path);
    }
    snprintf(v.text, sizeof(v.text), "%s", c->distributed_type);
#if defined(ACCEL_HAVE_CUDA)
    int gpu_ok = strcmp(c->distributed_type, "MULTI_GPU") == 0;
#else
    int gpu_ok = 0;
#endif
    if (strcmp(c->distributed_type, "NO") == 0 || strcmp(c->distributed_type, "MULTI_CPU") == 0 ||
        gpu_ok) {
        if (strcmp(c->distributed_type, "NO") == 0 && c->num_processes < 0) {
            c->num_processes = 1;
        }
        return ACCEL_OK;
    }
    for (size_t i = 0; i < sizeof(not_run) / sizeof(not_run[0]); i++) {
        if (strcmp(c->distributed_type, not_run[i][0]) == 0) {
            return refuse(c, "distributed_type", &v, not_run[i][1]);
        }
    }
    return bad(c, "distributed_type", &v, "a distributed type of Accelerate (NO, MULTI_CPU, ...)");
}

void accel__config_default_path(char *buf, size_t nbytes)
{
    const char *hf = getenv("HF_HOME");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (hf != NULL && hf[0] != '\0') {
        snprintf(buf, nbytes, "%s/accelerate/default_config.yaml", hf);
    } else if (xdg != NULL && xdg[0] != '\0') {
        snprintf(buf, nbytes, "%s/huggingface/accelerate/default_config.yaml", xdg);
    } else {
        snprintf(buf, nbytes, "%s/.cache/huggingface/accelerate/default_config.yaml",
                 home != NULL ? home : "");
    }
}

accel_status accel__config_load(const char *path, accel__config *out)
{
    accel__config c;
    memset(&c, 0, sizeof(c));
    c.mixed_precision = ACCEL_PRECISION_UNSET;
    c.use_cpu = c.debug = c.num_processes = c.num_machines = c.machine_rank = -1;

    c.explicit_path = 1;
    if (path == NULL) {
        path = getenv("ACCELERATE_CONFIG_FILE");
        if (path == NULL || path[0] == '\0') {
            c.explicit_path = 0;
            accel__config_default_path(c.path, sizeof(c.path));
        }
    }
    if (c.explicit_path) {
        snprintf(c.path, sizeof(c.path), "%s", path);
    }
    /* O_NONBLOCK and fstat: a directory or a FIFO is named as such (it would otherwise be a
     * YAML error, or block the open). */
    int fd = open(c.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0) {
        if (!c.explicit_path && errno == ENOENT) {
            *out = c; /* no default config: everything falls back to defaults */
            return ACCEL_OK;
        }
        return accel__seterr(NULL, c.explicit_path && errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
                             "config file %s: %s", c.path, strerror(errno));
    }
    int is_stat = fstat(fd, &sb) == 0;
    if (!is_stat || !S_ISREG(sb.st_mode)) {
        close(fd);
        return is_stat
                   ? accel__seterr(NULL, ACCEL_EINVAL, "config file %s is %s, not a YAML file",
                                   c.path, accel__file_kind(sb.st_mode))
                   : accel__seterr(NULL, ACCEL_EIO, "config file %s: %s", c.path, strerror(errno));
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        close(fd);
        return accel__seterr(NULL, ACCEL_ENOMEM, "config file %s: %s", c.path, strerror(errno));
    }
    accel_status st = parse(&c, f);
    fclose(f);
    ACCEL_TRY(st);
    ACCEL_TRY(validate(&c));
    c.present = 1;
    *out = c;
    return ACCEL_OK;
}

/* FNV-1a of the lines already logged by this process, so each shows once. */
static pthread_mutex_t warned_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t warned[64];
static int n_warned;

static int first_time(const char *line)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)line; *p; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    pthread_mutex_lock(&warned_lock);
    int seen = 0;
    for (int i = 0; i < n_warned && !seen; i++) {
        seen = warned[i] == h;
    }
    if (!seen && n_warned < 64) {
        warned[n_warned++] = h;
    }
    pthread_mutex_unlock(&warned_lock);
    return !seen;
}

void accel__config_warn(const accel__config *c, int n_processes)
{
    for (int i = 0; i < c->n_notes; i++) {
        if (first_time(c->notes[i])) {
            accel__log(NULL, ACCEL__LOG_WARN, "%s", c->notes[i]);
        }
    }
    /* Only a single process can be a surprise: more come from an explicit --num_processes,
     * which wins over the file in Accelerate too. */
    if (c->present && c->num_processes > 1 && n_processes == 1) {
        char line[1200];
        snprintf(line, sizeof(line),
                 "config file %s: num_processes is %d but this run has 1 process: accel launch "
                 "does not read config files yet (pass --num_processes %d)",
                 c->path, c->num_processes, c->num_processes);
        if (first_time(line)) {
            accel__log(NULL, ACCEL__LOG_WARN, "%s", line);
        }
    }
}
