/*
 * What a machine's launcher publishes at the rendezvous (rdzv.c) and what it says of the job: the
 * check that another machine's record has this machine's job shape, and the backend the
 * processes will pick. Pure functions of the settings and the record: no store, no state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "launch.h"

int launch_check_record(const launch_settings *s, int m, const char *rec, char *token, char *why,
                        size_t cap)
{
    int machines = 0, n_procs = 0, restarts = 0, preflight = 0;
    char host[256] = "?";
    token[0] = '\0';
    if (sscanf(rec, "%d %d %d %d %255s %63s", &machines, &n_procs, &restarts, &preflight, host,
               token) < 4) {
        snprintf(why, cap, "machine %d published a malformed record \"%s\"", m, rec);
        return -1;
    }
    if (machines != s->num_machines || n_procs != s->n_procs) {
        snprintf(why, cap,
                 "machine %d (host %s) was started with --num_machines %d and %d processes per "
                 "machine, this machine (%d) with --num_machines %d and %d: give every machine "
                 "the same --num_processes and --num_machines",
                 m, host, machines, n_procs, s->machine_rank, s->num_machines, s->n_procs);
        return -1;
    }
    if (restarts != s->max_restarts) {
        snprintf(why, cap,
                 "machine %d (host %s) was started with --max_restarts %d, this machine (%d) "
                 "with %d: give every machine the same",
                 m, host, restarts, s->machine_rank, s->max_restarts);
        return -1;
    }
    if (preflight != s->preflight) { /* one would wait for the other's probes in vain */
        snprintf(why, cap,
                 "machine %d (host %s) was started %s --preflight, this machine (%d) %s: give "
                 "every machine the same",
                 m, host, preflight ? "with" : "without", s->machine_rank,
                 s->preflight ? "with" : "without");
        return -1;
    }
    return 0;
}

/* MULTINODE.md: hier when a machine has several processes, gloo else. */
void launch_expected_backend(const launch_settings *s, char *buf, size_t cap)
{
    const char *b = getenv("ACCEL_BACKEND");
    const char *name = b != NULL && b[0] != '\0' ? b : s->n_procs > 1 ? "hier" : "gloo";
    const char *built = accel_backends_built();
    int have = 0;
    for (const char *p = built; (p = strstr(p, name)) != NULL; p += strlen(name)) {
        char after = p[strlen(name)];
        have |= (p == built || p[-1] == ' ') && (after == '\0' || after == ',');
    }
    snprintf(buf, cap, "%s%s%s", name,
             strcmp(name, "hier") == 0 ? " (shm inside a machine, gloo across)" : "",
             have ? "" : " (NOT in this build, which has only: ");
    if (!have) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s)", built);
    }
}
