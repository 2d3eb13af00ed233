/*
 * A segment left under a user's ACCEL_JOB_ID by a killed job is replaced by the next job with
 * that id, even when the process that had started removing its name died before finishing (its
 * header names that remover): the new process 0 takes the removal over instead of waiting for a
 * dead process until the timeout (it used to fail with "could not be replaced within 10 s"), the
 * two processes set up, and nothing is left once they free their communicators.
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

/* One process of the 2-process job with ACCEL_JOB_ID `id`: sets up and frees. */
static accel_status member(const char *id, int rank)
{
    accel__comm_config cfg = {.backend = "shm",
                              .rank = rank,
                              .n_ranks = 2,
                              .local_rank = rank,
                              .local_n_ranks = 2,
                              .job_id = id,
                              .master_addr = "127.0.0.1",
                              .timeout_s = 10};
    accel__comm *c = NULL;
    accel_status st = accel__comm_new(&c, &cfg);
    if (st != ACCEL_OK) {
        fprintf(stderr, "test_shm_replace: rank %d: %s\n", rank, accel_last_error(NULL));
    }
    accel__comm_free(c);
    return st;
}

int main(void)
{
    if (access("/dev/shm", W_OK) != 0) {
        printf("test_shm_replace: skipped (no writable /dev/shm)\n");
        return 77;
    }
    char id[64], name[128], path[160];
    snprintf(id, sizeof(id), "replace%d", (int)getpid()); /* a user's id: not 32 hex digits */
    snprintf(name, sizeof(name), "/accel-%u-%s", (unsigned)geteuid(), id);
    snprintf(path, sizeof(path), "/dev/shm%s", name);

    /* The leftover: this job's header, its creator gone, its removal begun by a dead process. */
    accel__shm_header *h = plant_header(name);
    h->n_ranks = 2;
    h->job_hash = accel__fnv1a_str(id); /* what shm_setup.c hashes a job's id with */
    h->creator_pid = check_dead_pid();
    atomic_store(&h->unlinked, check_dead_pid());
    atomic_store(&h->magic, ACCEL__SHM_MAGIC);
    munmap((void *)h, sizeof(*h));
    struct stat before;
    CHECK(stat(path, &before) == 0);

    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        _exit(member(id, 1) == ACCEL_OK ? 0 : 1);
    }
    accel_status st = member(id, 0);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    struct stat after;
    int left = stat(path, &after) == 0;
    shm_unlink(name);
    CHECK_MSG(st == ACCEL_OK, "process 0 did not replace the leftover");
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process 1 failed");
    CHECK_MSG(!left, "%s left after both processes freed their communicators", path);
    printf("test_shm_replace: ok\n");
    return 0;
}
