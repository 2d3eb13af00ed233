/*
 * `accel env`: the facts to paste into a bug report (as `accelerate env`): version, OS, CPU
 * and its vector extensions, which communication backends this build contains, in a CUDA build
 * the GPUs with the CUDA driver, runtime and NCCL versions, the config file in use and its
 * content (read with the library's reader, base/config.h), and every
 * environment variable accel reads, straight from the library's table (src/base/env.c), with
 * its current value, default and meaning. Reads only; changes nothing.
 */
#include <gnu/libc-version.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "accel/accel.h"
#if defined(ACCEL_HAVE_CUDA)
#include "accel/cuda.h"
#endif
#include "cli.h"
#include "base/base.h"
#include "base/config.h"
#include "base/cpu.h"

static const cli_option env_options[] = {
    {"config_file", 0, 1, NULL, "FILE",
     "the config file to show (default: $ACCELERATE_CONFIG_FILE, else the default location)",
     NULL, NULL},
    {0},
};

static int run_env(const cli_verb *verb, int argc, char **argv);

const cli_verb cli_verb_env = {
    .name = "env",
    .summary = "print version, system and configuration facts for bug reports",
    .positional = NULL,
    .description = "Prints accel's version, the OS and CPU, the communication backends built in,\n"
                   "the GPUs and CUDA driver, runtime and NCCL versions (CUDA builds), the config\n"
                   "file in use and its content, and every environment variable accel reads with\n"
                   "its current value, default and meaning.",
    .options = env_options,
    .run = run_env,
};

static void cpu_model(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) {
        return;
    }
    char line[512];
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v != NULL) {
                v++;
                while (*v == ' ' || *v == '\t') {
                    v++;
                }
                snprintf(out, n, "%.*s", (int)strcspn(v, "\n"), v);
            }
            break;
        }
    }
    fclose(f);
}

static const char *env_type_name(accel__env_type t)
{
    switch (t) {
    case ACCEL__ENV_INT:
        return "int";
    case ACCEL__ENV_REAL:
        return "real";
    case ACCEL__ENV_BOOL:
        return "bool";
    case ACCEL__ENV_STRING:
        return "string";
    }
    return "?";
}

/* The config file accel_init and accel launch would read, and its content. */
static void print_config(const char *given)
{
    const char *env = getenv("ACCELERATE_CONFIG_FILE");
    const char *why = given != NULL                  ? "--config_file"
                      : env != NULL && env[0] != '\0' ? "ACCELERATE_CONFIG_FILE"
                                                      : "the default location";
    accel__config cfg;
    if (accel__config_load(given, &cfg) != ACCEL_OK) {
        printf("- accel config file (%s): cannot be used: %s\n", why, accel_last_error(NULL));
        return;
    }
    if (!cfg.present) {
        printf("- accel config file: not found (looked at %s, %s)\n", cfg.path, why);
        return;
    }
    printf("- accel config file: %s (%s):\n", cfg.path, why);
    accel__ytree_print(cfg.root, stdout, "    ");
    for (int i = 0; i < cfg.n_notes; i++) {
        printf("  note: %s\n", cfg.notes[i]);
    }
    accel__config_free(&cfg);
}

static int run_env(const cli_verb *verb, int argc, char **argv)
{
    cli_args a;
    int status;
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status;
    }

    printf("\nCopy-and-paste the text below in your GitHub issue\n\n");
    printf("- accel version: %s\n", ACCEL_VERSION_STRING);
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    printf("- accel binary: %.*s\n", k > 0 ? (int)k : 7, k > 0 ? exe : "unknown");
    struct utsname u;
    if (uname(&u) == 0) {
        printf("- Platform: %s %s %s\n", u.sysname, u.release, u.machine);
    }
    printf("- C library: glibc %s\n", gnu_get_libc_version());
    char model[256];
    cpu_model(model, sizeof(model));
    printf("- CPU: %s\n", model);
    printf("- CPU cores: %ld online, %ld configured\n", sysconf(_SC_NPROCESSORS_ONLN),
           sysconf(_SC_NPROCESSORS_CONF));
    /* The features the kernels dispatch on (src/base/cpu.c), so this says what accel uses. */
    printf("- CPU vector extensions used by accel:");
    for (int f = 0; f < ACCEL__CPU_FEATURE_COUNT; f++) {
        printf(" %s %s%s", accel__cpu_feature_name((accel__cpu_feature)f),
               accel__cpu_has((accel__cpu_feature)f) ? "yes" : "no",
               f + 1 < ACCEL__CPU_FEATURE_COUNT ? "," : "\n");
    }
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        printf("- System RAM: %.2f GB\n", (double)si.totalram * si.mem_unit / 1e9);
    }
    printf("- Communication backends: %s\n", accel_backends_built());
#if defined(ACCEL_HAVE_OPENMP)
    printf("- OpenMP: yes\n");
#else
    printf("- OpenMP: no\n");
#endif
#if defined(ACCEL_HAVE_CUDA)
    printf("- CUDA: built in\n");
    char gpu[4096];
    accel_cuda_report(gpu, sizeof(gpu));
    for (char *line = strtok(gpu, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        printf("  - %s\n", line);
    }
#else
    printf("- CUDA: not built in\n");
#endif
    print_config(cli_value(verb, &a, "config_file"));

    printf("\nEnvironment variables read by accel (name, type, current value, default, "
           "meaning):\n");
    printf("  %-40s %-6s %-14s %-10s %s\n", "NAME", "TYPE", "VALUE", "DEFAULT", "MEANING");
    for (const accel__env_var *v = accel__env_table(); v->name != NULL; v++) {
        const char *cur = getenv(v->name);
        printf("  %-40s %-6s %-14s %-10s %s\n", v->name, env_type_name(v->type),
               cur ? cur : "(unset)", v->dflt ? v->dflt : "-", v->doc);
        /* A value the library will refuse is marked here, not only when a program starts. */
        long long i;
        double r;
        int b;
        accel_status st = v->type == ACCEL__ENV_INT    ? accel__env_int(v->name, &i)
                          : v->type == ACCEL__ENV_REAL ? accel__env_real(v->name, &r)
                          : v->type == ACCEL__ENV_BOOL ? accel__env_bool(v->name, &b)
                                                       : ACCEL_OK;
        if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
            printf("    ^ invalid: %s\n", accel_last_error(NULL));
        } else if (strcmp(v->name, "ACCEL_LOG_LEVEL") == 0 && cur != NULL && cur[0] != '\0' &&
                   accel__log_parse_level(cur) < 0) {
            printf("    ^ invalid: environment variable ACCEL_LOG_LEVEL=\"%s\" is not one of "
                   "debug, info, warn, error, off\n",
                   cur);
        }
    }
    return 0;
}
