/*
 * XXH3-64 fused with a copy (see hashcopy.h), written from the XXH3 specification (xxhash's
 * doc/xxhash_spec.md, "XXH3 algorithm overview", inputs of more than 240 bytes): eight 64-bit
 * accumulators take every 64-byte stripe with its 8-byte-shifted window of the 192-byte
 * default secret, are scrambled after every 16 stripes, take the last 64 bytes of the input
 * with a fixed window, and are merged into the result. Shorter inputs use libxxhash itself.
 *
 * Invariant: the value returned equals XXH3_64bits(src, n) for every n (tests/unit/
 * test_ckpt_hashcopy.c checks it against libxxhash over sizes, offsets and segment layouts),
 * and every byte of every segment reaches its destination.
 */
#include "ckpt/hashcopy.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret_fromSeed */
#include <xxhash.h>

#include "comm/reduce.h"
#if defined(__x86_64__) && defined(__GNUC__) && !defined(ACCEL_HASHCOPY_PORTABLE)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#define STRIPE 64
#define SECRET_NBYTES 192
#define STRIPES_PER_BLOCK ((SECRET_NBYTES - STRIPE) / 8) /* 16: the secret window moves 8 B */
#define SCRAMBLE_AT (SECRET_NBYTES - STRIPE)             /* the scramble's window */
#define LAST_STRIPE_AT (SECRET_NBYTES - STRIPE - 7)      /* the last stripe's window */
#define MERGE_AT 11                                      /* the merge's window */
#define MIDSIZE_MAX 240                                  /* longer inputs take the stripe loop */
/* Non-temporal stores from this many bytes of one destination on (the copy would evict the
 * caches anyway; glibc's memcpy makes the same choice for large copies). */
#define NT_MIN_NBYTES ((size_t)1 << 20)

#define P32_1 0x9E3779B1u
#define P32_2 0x85EBCA77u
#define P32_3 0xC2B2AE3Du
#define P64_1 0x9E3779B185EBCA87ull
#define P64_2 0xC2B2AE3D27D4EB4Full
#define P64_3 0x165667B19E3779F9ull
#define P64_4 0x85EBCA77C2B2AE63ull
#define P64_5 0x27D4EB2F165667C5ull

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* XXH3 reads little-endian; so does every CPU this builds for */
    return v;
}

/* ---- portable stripes ---- */

static void acc_stripe(uint64_t acc[8], const unsigned char *in, const unsigned char *key)
{
    for (int i = 0; i < 8; i++) {
        uint64_t v = rd64(in + 8 * i), k = v ^ rd64(key + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (k & 0xffffffffu) * (k >> 32);
    }
}

static void scramble(uint64_t acc[8], const unsigned char *key)
{
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= rd64(key + 8 * i);
        acc[i] = a * P32_1;
    }
}

/* Stripes [s, e) of src: accumulated, scrambled after every 16th; with dst, each also stored
 * at dst (dst is stripe s's destination). */
static void stripes_portable(uint64_t acc[8], const unsigned char *src, const unsigned char *secret,
                             size_t s, size_t e, unsigned char *dst)
{
    for (; s < e; s++) {
        const unsigned char *in = src + s * STRIPE;
        acc_stripe(acc, in, secret + 8 * (s % STRIPES_PER_BLOCK));
        if (dst != NULL) {
            memcpy(dst, in, STRIPE);
            dst += STRIPE;
        }
        if (s % STRIPES_PER_BLOCK == STRIPES_PER_BLOCK - 1) {
            scramble(acc, secret + SCRAMBLE_AT);
        }
    }
}

/* ---- AVX2 stripes: the same arithmetic, four accumulators a register ---- */

#ifdef HAVE_AVX2_PATH
/*
 * With nt, the copy uses non-temporal stores, which need 32-byte-aligned destinations: the
 * stores then run `shift` bytes behind the stripes (dst + shift is aligned), each loading its
 * 64 bytes again at src + shift (the same or the next cache lines, just read), and the first
 * `shift` and last 64 - shift bytes are left to the caller (returned in *done_from, *done_to:
 * the destination bytes written here, relative to dst).
 */
__attribute__((target("avx2"))) static void stripes_avx2(uint64_t acc[8], const unsigned char *src,
                                                         const unsigned char *secret, size_t s,
                                                         size_t e, unsigned char *dst, int nt,
                                                         size_t *done_from, size_t *done_to)
{
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    const __m256i p32 = _mm256_set1_epi32((int)P32_1);
    size_t shift = nt ? (32 - ((uintptr_t)dst & 31)) & 31 : 0;
    /* The last stripe's shifted window would pass the run's end: it is the caller's. */
    size_t stores_end = shift ? e - 1 : e;
    unsigned char *out = dst != NULL ? dst + shift : NULL;
    *done_from = shift;
    *done_to = (stores_end - s) * STRIPE + shift;
    for (size_t i = s; i < e; i++) {
        const unsigned char *in = src + i * STRIPE;
        const unsigned char *key = secret + 8 * (i % STRIPES_PER_BLOCK);
        __m256i d0 = _mm256_loadu_si256((const __m256i *)in);
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(in + 32));
        if (out != NULL && i < stores_end) {
            __m256i w0 = shift ? _mm256_loadu_si256((const __m256i *)(in + shift)) : d0;
            __m256i w1 = shift ? _mm256_loadu_si256((const __m256i *)(in + shift + 32)) : d1;
            if (nt) {
                _mm256_stream_si256((__m256i *)out, w0);
                _mm256_stream_si256((__m256i *)(out + 32), w1);
            } else {
                _mm256_storeu_si256((__m256i *)out, w0);
                _mm256_storeu_si256((__m256i *)(out + 32), w1);
            }
            out += STRIPE;
        }
        __m256i k0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)key));
        __m256i k1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(key + 32)));
        /* acc[i] += lo32(k) * hi32(k); acc[i ^ 1] += v (swap the 64-bit halves of each pair) */
        __m256i m0 = _mm256_mul_epu32(k0, _mm256_srli_epi64(k0, 32));
        __m256i m1 = _mm256_mul_epu32(k1, _mm256_srli_epi64(k1, 32));
        a0 = _mm256_add_epi64(a0, _mm256_add_epi64(m0, _mm256_shuffle_epi32(d0, 0x4e)));
        a1 = _mm256_add_epi64(a1, _mm256_add_epi64(m1, _mm256_shuffle_epi32(d1, 0x4e)));
        if (i % STRIPES_PER_BLOCK == STRIPES_PER_BLOCK - 1) {
            const unsigned char *sk = secret + SCRAMBLE_AT;
            __m256i t0 = _mm256_xor_si256(a0, _mm256_srli_epi64(a0, 47));
            __m256i t1 = _mm256_xor_si256(a1, _mm256_srli_epi64(a1, 47));
            t0 = _mm256_xor_si256(t0, _mm256_loadu_si256((const __m256i *)sk));
            t1 = _mm256_xor_si256(t1, _mm256_loadu_si256((const __m256i *)(sk + 32)));
            /* 64-bit times 32-bit constant: low product plus the high half's product << 32 */
            __m256i h0 = _mm256_mul_epu32(_mm256_srli_epi64(t0, 32), p32);
            __m256i h1 = _mm256_mul_epu32(_mm256_srli_epi64(t1, 32), p32);
            a0 = _mm256_add_epi64(_mm256_mul_epu32(t0, p32), _mm256_slli_epi64(h0, 32));
            a1 = _mm256_add_epi64(_mm256_mul_epu32(t1, p32), _mm256_slli_epi64(h1, 32));
        }
    }
    if (nt) {
        _mm_sfence(); /* the streamed stores are ordered before whatever follows */
    }
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}

#endif

/* Stripes [s, e) hashed, and copied to dst (stripe s's destination) when dst is not NULL. */
static void stripes(uint64_t acc[8], const unsigned char *src, const unsigned char *secret,
                    size_t s, size_t e, unsigned char *dst)
{
    if (s >= e) {
        return;
    }
#ifdef HAVE_AVX2_PATH
    if (accel__isa_best() >= ACCEL__ISA_AVX2) { /* the reductions' CPU check */
        int nt = dst != NULL && (e - s) * STRIPE >= NT_MIN_NBYTES;
        size_t from = 0, to = 0;
        stripes_avx2(acc, src, secret, s, e, dst, nt, &from, &to);
        if (dst != NULL) {
            /* What the aligned stores left: the first and last few bytes. */
            memcpy(dst, src + s * STRIPE, from);
            memcpy(dst + to, src + s * STRIPE + to, (e - s) * STRIPE - to);
        }
        return;
    }
#endif
    stripes_portable(acc, src, secret, s, e, dst);
}

/* ---- the whole hash ---- */

__extension__ typedef unsigned __int128 u128; /* GCC and Clang on 64-bit targets */

static uint64_t mul_fold(uint64_t a, uint64_t b)
{
    u128 p = (u128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

uint64_t accel__xxh3_copy(const void *src_v, size_t n, const accel__copy_seg *segs, size_t n_segs)
{
    const unsigned char *src = src_v;
    if (n <= MIDSIZE_MAX) {
        for (size_t i = 0; i < n_segs; i++) {
            memcpy(segs[i].dst, src + segs[i].off, segs[i].nbytes);
        }
        return XXH3_64bits(src, n);
    }
    unsigned char secret[SECRET_NBYTES];
    XXH3_generateSecret_fromSeed(secret, 0); /* seed 0: the default secret itself */
    uint64_t acc[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    /* Stripes [0, last) take the loop; the last 64 bytes (overlapping, even when n is a
     * multiple of 64) are accumulated apart. */
    size_t last = (n - 1) / STRIPE, next = 0;
    for (size_t i = 0; i < n_segs; i++) {
        const accel__copy_seg *g = &segs[i];
        unsigned char *dst = g->dst;
        size_t first = (g->off + STRIPE - 1) / STRIPE, end = (g->off + g->nbytes) / STRIPE;
        end = end < last ? end : last;
        if (first >= end) {
            memcpy(dst, src + g->off, g->nbytes); /* no whole stripe of its own */
            continue;
        }
        stripes(acc, src, secret, next, first, NULL);
        size_t head = first * STRIPE - g->off, tail_at = end * STRIPE;
        stripes(acc, src, secret, first, end, dst + head);
        next = end;
        /* The partial stripes at both ends: copied apart (they are in the cache now). */
        memcpy(dst, src + g->off, head);
        memcpy(dst + (tail_at - g->off), src + tail_at, g->off + g->nbytes - tail_at);
    }
    stripes(acc, src, secret, next, last, NULL);
    acc_stripe(acc, src + n - STRIPE, secret + LAST_STRIPE_AT);
    uint64_t h = (uint64_t)n * P64_1;
    for (int i = 0; i < 4; i++) {
        const unsigned char *k = secret + MERGE_AT + 16 * i;
        h += mul_fold(acc[2 * i] ^ rd64(k), acc[2 * i + 1] ^ rd64(k + 8));
    }
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}
