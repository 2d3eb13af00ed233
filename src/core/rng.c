/*
 * The generators accel owns: the per-accelerator generator (nn initialisation, dropout, and the
 * seeds of loaders created without one) and the primitives samplers build on. xoshiro256**
 * seeded by splitmix64, so any state is four 64-bit words that save_state can store and
 * accel_synchronize_rng_states can broadcast. Invariant: a state is never all zero (splitmix64
 * output cannot be four zeros in a row, and accel_set_rng_state rejects it).
 */
#include <string.h>

#include "comm/comm.h"
#include "rng.h"

/* 128-bit products for Lemire's bounded draw (GCC/Clang extension). */
__extension__ typedef unsigned __int128 u128;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void accel__gen_seed(accel__gen *g, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        g->s[i] = splitmix64(&x);
    }
}

uint64_t accel__gen_next(accel__gen *g)
{
    uint64_t *s = g->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t accel__gen_below(accel__gen *g, uint64_t n)
{
    if (n == 0) {
        return 0;
    }
    /* Lemire: the high word of x * n is uniform once the low word clears the biased zone. */
    u128 m = (u128)accel__gen_next(g) * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t threshold = (0 - n) % n;
        while (low < threshold) {
            m = (u128)accel__gen_next(g) * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double accel__gen_uniform(accel__gen *g)
{
    return (double)(accel__gen_next(g) >> 11) * (1.0 / 9007199254740992.0);
}

void accel__gen_permutation(accel__gen *g, int64_t *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = i;
    }
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)accel__gen_below(g, (uint64_t)i + 1);
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

uint64_t accel__seed_mix(uint64_t seed, uint64_t stream)
{
    /* Accelerate's SeedableRandomSampler seeds with seed + epoch; hashing keeps nearby
     * (seed, epoch) pairs from sharing a splitmix64 sequence shifted by one. */
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull);
    return splitmix64(&x);
}

accel__gen *accel__rng(accel *acc)
{
    if (!acc->rng_seeded) {
        accel__gen_seed(&acc->rng, ACCEL__DEFAULT_SEED);
        acc->rng_seeded = 1;
    }
    return &acc->rng;
}

accel_status accel_set_seed(accel *acc, uint64_t seed, int device_specific)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_set_seed: acc is NULL");
    }
    if (device_specific) {
        seed += (uint64_t)acc->rank;
    }
    accel__gen_seed(&acc->rng, seed);
    acc->rng_seeded = 1;
    return ACCEL_OK;
}

accel_status accel_get_rng_state(accel *acc, uint64_t state[ACCEL_RNG_STATE_WORDS])
{
    if (acc == NULL || state == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_get_rng_state: %s is NULL",
                             acc == NULL ? "acc" : "state");
    }
    memcpy(state, accel__rng(acc)->s, sizeof(acc->rng.s));
    return ACCEL_OK;
}

accel_status accel_set_rng_state(accel *acc, const uint64_t state[ACCEL_RNG_STATE_WORDS])
{
    if (acc == NULL || state == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_set_rng_state: %s is NULL",
                             acc == NULL ? "acc" : "state");
    }
    if ((state[0] | state[1] | state[2] | state[3]) == 0) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_set_rng_state: an all-zero state is not a generator state");
    }
    memcpy(acc->rng.s, state, sizeof(acc->rng.s));
    acc->rng_seeded = 1;
    return ACCEL_OK;
}

accel_status accel_synchronize_rng_states(accel *acc)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_synchronize_rng_states: acc is NULL");
    }
    accel__gen *g = accel__rng(acc);
    if (acc->n_ranks <= 1) {
        return ACCEL_OK;
    }
    accel_status st = accel__broadcast(acc->comm, g->s, 4, ACCEL_I64, 0);
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(acc, st);
    }
    return ACCEL_OK;
}
