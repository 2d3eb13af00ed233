/*
 * Reads Accelerate's config file with libyaml. Only the top-level mapping matters to accel;
 * nested sections (fsdp_config, deepspeed_config, ...) are recognised and skipped, and a file
 * that asks for a paradigm accel does not implement is refused rather than silently run as
 * plain data parallelism. JSON configs parse too (JSON is YAML flow syntax).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "base/fs.h"
#include "config.h"

/* Top-level keys of Accelerate's ClusterConfig (plus the legacy fp16 / dynamo_backend). */
static const char *const known_keys[] = {"compute_environment",
                                         "distributed_type",
                                         "mixed_precision",
                                         "use_cpu",
                                         "debug",
                                         "num_processes",
                                         "machine_rank",
                                         "num_machines",
                                         "gpu_ids",
                                         "main_process_ip",
                                         "main_process_port",
                                         "rdzv_backend",
                                         "same_network",
                                         "main_training_function",
                                         "enable_cpu_affinity",
                                         "fp8_config",
                                         "deepspeed_config",
                                         "fsdp_config",
                                         "parallelism_config",
                                         "megatron_lm_config",
                                         "mpirun_config",
                                         "dynamo_config",
                                         "downcast_bf16",
                                         "tpu_name",
                                         "tpu_zone",
                                         "tpu_use_cluster",
                                         "tpu_use_sudo",
                                         "command_file",
                                         "commands",
                                         "tpu_vm",
                                         "tpu_env",
                                         "fp16",
                                         "dynamo_backend",
                                         NULL};

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

static int is_known(const char *key)
{
    for (int i = 0; known_keys[i] != NULL; i++) {
        if (strcmp(key, known_keys[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static int is_null(const char *v)
{
    return v[0] == '\0' || strcmp(v, "null") == 0 || strcmp(v, "~") == 0 || strcmp(v, "None") == 0;
}

static accel_status bad(const accel__config *c, const char *key, const char *val, const char *want)
{
    return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: %s: \"%s\" is not %s", c->path, key,
                         val, want);
}

static accel_status set_int(accel__config *c, const char *key, const char *val, int *out)
{
    if (is_null(val)) {
        return ACCEL_OK;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || v < -1 || v > 1 << 24) {
        return bad(c, key, val, "an integer");
    }
    *out = (int)v;
    return ACCEL_OK;
}

static accel_status set_bool(accel__config *c, const char *key, const char *val, int *out)
{
    if (is_null(val)) {
        return ACCEL_OK;
    }
    int b = accel__parse_bool(val);
    if (b < 0) {
        return bad(c, key, val, "true or false");
    }
    *out = b;
    return ACCEL_OK;
}

static accel_status set_str(accel__config *c, const char *key, const char *val, char *out,
                            size_t nbytes)
{
    if (strlen(val) >= nbytes) {
        return bad(c, key, val, "a value of reasonable length");
    }
    strcpy(out, val);
    return ACCEL_OK;
}

static accel_status apply(accel__config *c, const char *key, const char *val)
{
    if (strcmp(key, "distributed_type") == 0) {
        return set_str(c, key, val, c->distributed_type, sizeof(c->distributed_type));
    }
    if (strcmp(key, "compute_environment") == 0) {
        return set_str(c, key, val, c->compute_environment, sizeof(c->compute_environment));
    }
    if (strcmp(key, "mixed_precision") == 0) {
        static const char *names[] = {"no", "fp16", "bf16", "fp8"};
        if (is_null(val)) {
            return ACCEL_OK;
        }
        for (int i = 0; i < 4; i++) {
            if (strcasecmp(val, names[i]) == 0) {
                c->mixed_precision = (accel_precision)i;
                return ACCEL_OK;
            }
        }
        return bad(c, key, val, "one of no, fp16, bf16, fp8");
    }
    if (strcmp(key, "fp16") == 0) { /* legacy: fp16: true means mixed_precision fp16 */
        int b = 0;
        ACCEL_TRY(set_bool(c, key, val, &b));
        if (b && c->mixed_precision == ACCEL_PRECISION_UNSET) {
            c->mixed_precision = ACCEL_PRECISION_FP16;
        }
        return ACCEL_OK;
    }
    if (strcmp(key, "use_cpu") == 0) {
        return set_bool(c, key, val, &c->use_cpu);
    }
    if (strcmp(key, "debug") == 0) {
        return set_bool(c, key, val, &c->debug);
    }
    if (strcmp(key, "num_processes") == 0) {
        return set_int(c, key, val, &c->num_processes);
    }
    if (strcmp(key, "num_machines") == 0) {
        return set_int(c, key, val, &c->num_machines);
    }
    if (strcmp(key, "machine_rank") == 0) {
        return set_int(c, key, val, &c->machine_rank);
    }
    if (strcmp(key, "main_process_port") == 0) {
        return set_int(c, key, val, &c->main_process_port);
    }
    if (strcmp(key, "main_process_ip") == 0) {
        return is_null(val) ? ACCEL_OK
                            : set_str(c, key, val, c->main_process_ip, sizeof(c->main_process_ip));
    }
    return ACCEL_OK; /* known keys accel has no use for */
}

/* Skips the node that starts with `ev` (a scalar, or a whole sequence/mapping). */
static int skip_node(yaml_parser_t *p, yaml_event_t *ev)
{
    int depth = 0;
    for (;;) {
        if (ev->type == YAML_SEQUENCE_START_EVENT || ev->type == YAML_MAPPING_START_EVENT) {
            depth++;
        } else if (ev->type == YAML_SEQUENCE_END_EVENT || ev->type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(ev);
        if (depth <= 0) {
            return 1;
        }
        if (!yaml_parser_parse(p, ev)) {
            return 0;
        }
    }
}

static accel_status parse(accel__config *c, FILE *f)
{
    yaml_parser_t p;
    yaml_event_t ev;
    accel_status st = ACCEL_OK;
    char key[128];
    int level = 0, expect_key = 1, done = 0;

    if (!yaml_parser_initialize(&p)) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "config file %s: out of memory", c->path);
    }
    yaml_parser_set_input_file(&p, f);
    while (!done && st == ACCEL_OK) {
        if (!yaml_parser_parse(&p, &ev)) {
            st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML error at line %zu: %s",
                               c->path, p.problem_mark.line + 1, p.problem ? p.problem : "unknown");
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = 1;
            yaml_event_delete(&ev);
            break;
        case YAML_MAPPING_START_EVENT:
            if (level == 0) {
                level = 1;
                yaml_event_delete(&ev);
            } else if (!skip_node(&p, &ev)) { /* a nested section: value of the last key */
                st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML error in %s", c->path,
                                   key);
            } else {
                expect_key = 1;
            }
            break;
        case YAML_SEQUENCE_START_EVENT:
            if (level == 0) {
                st = accel__seterr(NULL, ACCEL_EINVAL,
                                   "config file %s: the top level must be a mapping", c->path);
                yaml_event_delete(&ev);
            } else if (!skip_node(&p, &ev)) {
                st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML error in %s", c->path,
                                   key);
            } else {
                expect_key = 1;
            }
            break;
        case YAML_SCALAR_EVENT: {
            const char *s = (const char *)ev.data.scalar.value;
            if (level == 0) {
                st = accel__seterr(NULL, ACCEL_EINVAL,
                                   "config file %s: the top level must be a mapping", c->path);
            } else if (expect_key) {
                if (!is_known(s)) {
                    st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s: unknown key \"%s\"",
                                       c->path, s);
                } else {
                    snprintf(key, sizeof(key), "%s", s);
                    expect_key = 0;
                }
            } else {
                st = apply(c, key, s);
                expect_key = 1;
            }
            yaml_event_delete(&ev);
            break;
        }
        case YAML_ALIAS_EVENT:
            st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML aliases are not allowed",
                               c->path);
            yaml_event_delete(&ev);
            break;
        default:
            yaml_event_delete(&ev);
            break;
        }
    }
    yaml_parser_delete(&p);
    return st;
}

static accel_status validate(accel__config *c)
{
    if (c->compute_environment[0] == '\0') {
        strcpy(c->compute_environment, "LOCAL_MACHINE");
    }
    if (strcmp(c->compute_environment, "LOCAL_MACHINE") != 0) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "config file %s: compute_environment %s is not supported (only "
                             "LOCAL_MACHINE)",
                             c->path, c->compute_environment);
    }
    if (c->distributed_type[0] == '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: distributed_type is required",
                             c->path);
    }
    static const char *const ok[] = {"NO", "MULTI_CPU", "MULTI_GPU", NULL};
    for (int i = 0; ok[i] != NULL; i++) {
        if (strcmp(c->distributed_type, ok[i]) == 0) {
            if (strcmp(ok[i], "NO") == 0 && c->num_processes < 0) {
                c->num_processes = 1;
            }
            return ACCEL_OK;
        }
    }
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                         "config file %s: distributed_type %s is not supported by accel (NO, "
                         "MULTI_CPU, MULTI_GPU)",
                         c->path, c->distributed_type);
}

accel_status accel__config_load(const char *path, accel__config *out)
{
    accel__config c;
    memset(&c, 0, sizeof(c));
    c.mixed_precision = ACCEL_PRECISION_UNSET;
    c.use_cpu = c.debug = c.num_processes = c.num_machines = c.machine_rank = -1;
    c.main_process_port = -1;

    int explicit_path = 1;
    if (path == NULL) {
        path = getenv("ACCELERATE_CONFIG_FILE");
        if (path == NULL || path[0] == '\0') {
            explicit_path = 0;
            accel__config_default_path(c.path, sizeof(c.path));
        }
    }
    if (explicit_path) {
        snprintf(c.path, sizeof(c.path), "%s", path);
    }
    /* O_NONBLOCK and fstat: a directory or a FIFO is named as such (it would otherwise be a
     * YAML error, or block the open). */
    int fd = open(c.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0) {
        if (!explicit_path && errno == ENOENT) {
            *out = c; /* no default config: everything falls back to defaults */
            return ACCEL_OK;
        }
        return accel__seterr(NULL, explicit_path && errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
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
