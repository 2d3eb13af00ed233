/*
 * What accel_init says about the config file (the reading is base/config.c): its notes, and
 * the launcher keys when no launcher started the program. Invariant: a line is logged at most
 * once per process, so a program that calls accel_init again does not repeat it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/* FNV-1a of the lines already logged by this process. */
static pthread_mutex_t warned_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t warned[64];
static int n_warned;

static int first_time(const char *line)
{
    const uint64_t h = accel__fnv1a_str(line);
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

static void warn_once(const char *line)
{
    if (first_time(line)) {
        accel__log(NULL, ACCEL__LOG_WARN, "%s", line);
    }
}

void accel__config_warn(const accel__config *c, int launched)
{
    const char *checked = NULL;
    if (accel__env_string("ACCEL_CONFIG_CHECKED", &checked) != ACCEL_OK ||
        strcmp(checked, c->path) != 0) {
        for (int i = 0; i < c->n_notes; i++) {
            warn_once(c->notes[i]);
        }
    }
    /* Under a launcher the layout comes from it (accel launch applied the file's keys, or its
     * flags won over them); started directly, the program is one process whatever the file,
     * on the GPUs CUDA_VISIBLE_DEVICES leaves it. */
    if (launched || !c->present) {
        return;
    }
    char line[sizeof(c->path) + 400];
#if defined(ACCEL_HAVE_CUDA)
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (c->gpu_ids != NULL && strcmp(c->gpu_ids, "all") != 0 && cvd == NULL) {
        snprintf(line, sizeof(line),
                 "config file %s: gpu_ids %s is applied by accel launch (CUDA_VISIBLE_DEVICES); "
                 "this program was started directly and may use any GPU",
                 c->path, c->gpu_ids);
        warn_once(line);
    }
#endif
    if (c->num_processes <= 1 && c->num_machines <= 1) {
        return;
    }
    snprintf(line, sizeof(line),
             "config file %s asks for %d process%s%s%.0d%s, but this program was started "
             "directly, as one process: start it with accel launch (which reads the file)",
             c->path, c->num_processes > 0 ? c->num_processes : 1,
             c->num_processes > 1 ? "es" : "", c->num_machines > 1 ? " on " : "",
             c->num_machines > 1 ? c->num_machines : 0, c->num_machines > 1 ? " machines" : "");
    warn_once(line);
}
