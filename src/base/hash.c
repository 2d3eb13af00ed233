/*
 * FNV-1a, 64 bits: the one non-cryptographic hash of the library (hash tables, warn-once sets,
 * digests that processes compare). Unseeded, so every process computes the same value.
 */
#include "base.h"

uint64_t accel__fnv1a(const void *p, size_t nbytes)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < nbytes; i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

uint64_t accel__fnv1a_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    return h;
}
