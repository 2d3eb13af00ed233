/*
 * Sweeping /dev/shm: what killed jobs left there. A job's segment loses its name once every
 * rank attached (with a user's ACCEL_JOB_ID, once the first rank leaves), so only a job killed
 * before that leaves one; the next job's creator removes this user's leftovers whose names accel
 * generated (32 hex digits: nobody else chose them) and whose creator is gone. A leftover under
 * a user's ACCEL_JOB_ID is replaced by the next job with that id instead (shm_setup.c).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "shm.h"

#define SHM_DIR "/dev/shm"

/* Whether a name's job key is one accel made (32 hex digits: accel launch's ACCEL_JOB_ID or a
 * store nonce), possibly the hier backend's segment of one machine ("-n<machine>-w<world>"),
 * possibly a split's ("-c" and 32 more) and possibly with a creator's ".init-" suffix: names
 * nobody else chose. (Without the hier form, a machine's segment that a job killed during
 * setup left behind was never removed by anyone.) */
int accel__shm_generated(const char *key)
{
    const char *hex = "0123456789abcdef", *dec = "0123456789";
    if (strspn(key, hex) != 32) {
        return 0;
    }
    key += 32;
    if (strncmp(key, "-n", 2) == 0) {
        size_t node = strspn(key + 2, dec);
        if (node == 0 || strncmp(key + 2 + node, "-w", 2) != 0) {
            return 0;
        }
        size_t world = strspn(key + 4 + node, dec);
        if (world == 0) {
            return 0;
        }
        key += 4 + node + world;
    }
    if (strncmp(key, "-c", 2) == 0) {
        if (strspn(key + 2, hex) != 32) {
            return 0;
        }
        key += 34;
    }
    return *key == '\0' ||
           (strncmp(key, ".init-", 6) == 0 && strspn(key + 6, hex) == 16 && key[22] == '\0');
}

/* Removes this user's segments in /dev/shm that a killed job left behind (its processes died
 * while attaching, before the name could go): only names accel generated, only private files of
 * this euid with a valid header whose creator is gone. A name from a user's own ACCEL_JOB_ID is
 * left alone: the next job with that id replaces it. */
void accel__shm_sweep(const accel__shm *s)
{
    DIR *d = opendir(SHM_DIR);
    if (d == NULL) {
        return;
    }
    char prefix[32];
    size_t plen = (size_t)snprintf(prefix, sizeof(prefix), "accel-%u-", (unsigned)geteuid());
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, plen) != 0 || !accel__shm_generated(e->d_name + plen)) {
            continue;
        }
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (fd < 0) {
            continue;
        }
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
            (st.st_mode & 07777) == 0600 && (size_t)st.st_size >= sizeof(accel__shm_header)) {
            const accel__shm_header *h = mmap(NULL, sizeof(*h), PROT_READ, MAP_SHARED, fd, 0);
            if (h != MAP_FAILED) {
                int pid = h->creator_pid;
                if (atomic_load_explicit(&h->magic, memory_order_acquire) == ACCEL__SHM_MAGIC &&
                    h->version == ACCEL__SHM_VERSION &&
                    accel__shm_pid_gone(pid, h->creator_start) &&
                    unlinkat(dirfd(d), e->d_name, 0) == 0) {
                    accel__log(&s->log, ACCEL__LOG_WARN,
                               "shm: removed " SHM_DIR "/%s, left by a killed job (its creator, "
                               "pid %d, is gone)",
                               e->d_name, pid);
                }
                munmap((void *)h, sizeof(*h));
            }
        }
        close(fd);
    }
    closedir(d);
}
