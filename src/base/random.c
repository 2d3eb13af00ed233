/*
 * Values nobody may guess (job ids, nonces, shared-memory names): straight from the kernel's
 * random source, never from the seeded generators of src/core/rng.c, whose streams are
 * reproducible by design.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/random.h>

#include "base.h"

int accel__os_random(void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int accel__random_hex(char *out, size_t nbytes)
{
    unsigned char r[16];
    if (nbytes < 2 * sizeof(r) + 1 || accel__os_random(r, sizeof(r)) != 0) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(r); i++) {
        snprintf(out + 2 * i, 3, "%02x", r[i]);
    }
    return 0;
}
