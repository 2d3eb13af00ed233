/*
 * For the shm unit tests (test_shm_sweep, test_shm_replace): a segment planted in /dev/shm as a
 * killed job leaves it.
 */
#ifndef ACCEL_TESTS_SHM_PLANT_H
#define ACCEL_TESTS_SHM_PLANT_H

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "comm/shm.h"

/* Creates the segment `name` (shm_open's "/accel-..."; one there before is removed), 4 KiB,
 * with a header of this version and otherwise zero, and returns its header mapped: the caller
 * fills it in, sets magic last and unmaps it (munmap(h, sizeof(*h))). */
static inline accel__shm_header *plant_header(const char *name)
{
    shm_unlink(name);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    CHECK_MSG(fd >= 0, "shm_open %s", name);
    CHECK(fchmod(fd, 0600) == 0 && ftruncate(fd, 4096) == 0);
    accel__shm_header *h = mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(h != MAP_FAILED);
    close(fd);
    h->version = ACCEL__SHM_VERSION;
    return h;
}

#endif /* ACCEL_TESTS_SHM_PLANT_H */
