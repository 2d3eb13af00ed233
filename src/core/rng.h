/*
 * accel's random generators, for every module that needs randomness (nn initialisation and
 * dropout, data samplers). One documented algorithm everywhere, so a sequence depends only on
 * its seed: xoshiro256** (Blackman & Vigna) seeded through splitmix64. Not torch's Philox or
 * MT19937: accel does not reproduce torch's random streams, only their roles.
 */
#ifndef ACCEL_CORE_RNG_H
#define ACCEL_CORE_RNG_H

#include <stdint.h>

#include "internal.h"

/* The default seed of an accelerator that was never seeded (torch's default seed). */
#define ACCEL__DEFAULT_SEED 67280421310721ull

/* Seeds g from a 64-bit seed: splitmix64 expands it to the 256-bit state (never all zero). */
void accel__gen_seed(accel__gen *g, uint64_t seed);
/* Next 64 random bits. */
uint64_t accel__gen_next(accel__gen *g);
/* Uniform integer in [0, n) without modulo bias (Lemire's multiply-and-reject); 0 when n == 0. */
uint64_t accel__gen_below(accel__gen *g, uint64_t n);
/* Uniform double in [0, 1) with 53 random bits. */
double accel__gen_uniform(accel__gen *g);
/* Writes a uniformly random permutation of 0..n-1 into out (Fisher-Yates, drawing
 * accel__gen_below(g, i + 1) for i = n-1 down to 1). */
void accel__gen_permutation(accel__gen *g, int64_t *out, int64_t n);
/* The 64-bit seed derived from a (seed, stream) pair, e.g. (data_seed, epoch). */
uint64_t accel__seed_mix(uint64_t seed, uint64_t stream);

/* The accelerator's generator; seeded with ACCEL__DEFAULT_SEED (the same on every process) on
 * first use when accel_set_seed was never called. Borrowed; same thread as acc. */
accel__gen *accel__rng(accel *acc);

#endif /* ACCEL_CORE_RNG_H */
