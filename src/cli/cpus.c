/*
 * The CPUs this launcher may use: the shares it binds its processes to (--cpu_affinity auto)
 * and the token by which launchers of one host's "machines" see that they share them (rdzv.c).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "launch.h"

/* Splits the CPUs this launcher may use into n_procs equal, contiguous shares (in CPU id
 * order, so neighbouring ranks get neighbouring cores). Returns NULL when there are fewer CPUs
 * than processes (binding would stack processes) or on allocation failure: no binding. */
cpu_set_t *launch_cpu_shares(long n_procs)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        return NULL;
    }
    int n_cpus = CPU_COUNT(&allowed);
    if (n_procs > n_cpus) {
        return NULL;
    }
    cpu_set_t *sets = calloc((size_t)n_procs, sizeof(cpu_set_t));
    if (sets == NULL) {
        return NULL;
    }
    int share = n_cpus / (int)n_procs, seen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && seen < share * n_procs; cpu++) {
        if (CPU_ISSET(cpu, &allowed)) {
            CPU_SET(cpu, &sets[seen / share]);
            seen++;
        }
    }
    return sets;
}

/*
 * What identifies the CPUs this launcher's processes run on: the kernel's boot id (the same in
 * every network namespace and container of one host, different on another host) and a hash of
 * the launcher's allowed CPU set (two containers of one host with different cpusets do not
 * share). "-" when there is no boot id (not Linux, /proc unreadable): it shares with nobody,
 * as before. Written to token (cap >= 64).
 */
void launch_cpu_token(char *token, size_t cap)
{
    char boot_id[40] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fscanf(f, "%39s", boot_id) != 1) {
            boot_id[0] = '\0';
        }
        fclose(f);
    }
    cpu_set_t allowed;
    if (boot_id[0] == '\0' || sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        snprintf(token, cap, "-");
        return;
    }
    snprintf(token, cap, "%s/%016llx", boot_id,
             (unsigned long long)accel__fnv1a(&allowed, sizeof(allowed)));
}
