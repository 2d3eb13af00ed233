/*
 * The shm backend's sweep of /dev/shm: segments a killed job left behind (its processes died
 * while attaching, so nobody removed the name) are removed by the next job's creator, for every
 * name accel generates: the job's segment, a split's, and the hier backend's segment of one
 * machine ("<key>-n<machine>-w<world>", which the sweep did not know, so such a leftover stayed
 * in /dev/shm forever). Segments whose creator is alive, and names a user chose (ACCEL_JOB_ID),
 * are left alone.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "comm/comm.h"
#include "comm/shm.h"
#include "shm_plant.h"

/* This run's job key: 32 hex digits as accel makes them, with the pid in them, so that runs
 * at the same time do not share names. */
static char key[33];

/* Plants /dev/shm/accel-<euid>-<suffix> as a segment created by `pid`. */
static void plant(const char *suffix, int pid)
{
    char name[256];
    snprintf(name, sizeof(name), "/accel-%u-%s", (unsigned)geteuid(), suffix);
    accel__shm_header *h = plant_header(name);
    h->creator_pid = pid;
    atomic_store(&h->magic, ACCEL__SHM_MAGIC);
    munmap((void *)h, sizeof(*h));
}

static int present(const char *suffix)
{
    char path[256];
    snprintf(path, sizeof(path), "/dev/shm/accel-%u-%s", (unsigned)geteuid(), suffix);
    return access(path, F_OK) == 0;
}

static void gone(const char *suffix)
{
    char name[256];
    snprintf(name, sizeof(name), "/accel-%u-%s", (unsigned)geteuid(), suffix);
    shm_unlink(name);
}

int main(void)
{
    if (access("/dev/shm", W_OK) != 0) {
        printf("test_shm_sweep: skipped (no writable /dev/shm)\n");
        return 77;
    }
    int dead = check_dead_pid(), alive = (int)getpid();
    snprintf(key, sizeof(key), "%08x0123456789abcdef01234567", (unsigned)alive);
    char names[10][128];
    /* Left by killed jobs: removed. */
    snprintf(names[0], sizeof(names[0]), "%s", key);
    snprintf(names[1], sizeof(names[1]), "%s-c%s", key, key);
    snprintf(names[2], sizeof(names[2]), "%s-n1-w0", key);
    snprintf(names[3], sizeof(names[3]), "%s-n12-w3-c%s", key, key);
    snprintf(names[4], sizeof(names[4]), "%s-n0-w0.init-0123456789abcdef", key);
    /* Not names accel makes (a user's ACCEL_JOB_ID, malformed machine parts): kept. */
    snprintf(names[5], sizeof(names[5]), "myjob%08x-n1-w0", (unsigned)alive);
    snprintf(names[6], sizeof(names[6]), "%s-n-w0", key);
    snprintf(names[7], sizeof(names[7]), "%s-n1-x0", key);
    snprintf(names[8], sizeof(names[8]), "%s-n1-w", key);
    /* A live creator's: kept. */
    snprintf(names[9], sizeof(names[9]), "%s-n2-w0", key);
    const char *stale[] = {names[0], names[1], names[2], names[3], names[4]};
    const char *keep_dead[] = {names[5], names[6], names[7], names[8]};
    const char *live = names[9];
    size_t n_stale = sizeof(stale) / sizeof(stale[0]);
    size_t n_keep = sizeof(keep_dead) / sizeof(keep_dead[0]);
    for (size_t i = 0; i < n_stale; i++) {
        plant(stale[i], dead);
    }
    for (size_t i = 0; i < n_keep; i++) {
        plant(keep_dead[i], dead);
    }
    plant(live, alive);

    /* A one-process shm communicator: its creator sweeps before creating its own segment. */
    accel__comm_config cfg = {.backend = "shm",
                              .rank = 0,
                              .n_ranks = 1,
                              .local_rank = 0,
                              .local_n_ranks = 1,
                              .master_addr = "127.0.0.1",
                              .timeout_s = 30};
    accel__comm *c = NULL;
    CHECK_OK(NULL, accel__comm_new(&c, &cfg));
    accel__comm_free(c);

    int bad = 0;
    for (size_t i = 0; i < n_stale; i++) {
        if (present(stale[i])) {
            fprintf(stderr, "test_shm_sweep: leftover %s was not removed\n", stale[i]);
            bad = 1;
        }
        gone(stale[i]);
    }
    for (size_t i = 0; i < n_keep; i++) {
        if (!present(keep_dead[i])) {
            fprintf(stderr, "test_shm_sweep: %s (not a name accel makes) was removed\n",
                    keep_dead[i]);
            bad = 1;
        }
        gone(keep_dead[i]);
    }
    if (!present(live)) {
        fprintf(stderr, "test_shm_sweep: %s (live creator) was removed\n", live);
        bad = 1;
    }
    gone(live);
    CHECK(!bad);
    printf("test_shm_sweep: ok\n");
    return 0;
}
