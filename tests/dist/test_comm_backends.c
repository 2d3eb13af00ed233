/*
 * Backend against backend (ggml's test-backend-ops idea): every collective x dtype x op on a
 * range of counts, in place, out of place and on symmetric memory, computed by the backends and
 * by a reference built here from the scalar reduction kernel over every process's input (each
 * process can generate all of them). With 1 process both self and a 1-process shm run every
 * case; with 2-4 processes shm does (or the backend ACCEL_TEST_BACKEND names: gloo under the
 * multi-machine tests). Results must be bit-identical.
 *
 * Wire dtype: allreduce of F32 through BF16 / F16 must equal the compressed path exactly (each
 * input converted to the wire dtype, reduced there by the scalar kernel, converted back), on the
 * one-shot, two-shot (several chunks) and zero-copy paths, and equal that same path run on the
 * backend itself (convert, 16-bit allreduce, convert back: the reducer before comm v2).
 *
 * Under mpirun (tests/comm/test_mpi_collectives.sh) the same processes run every case on the
 * mpi backend and on shm, each against the reference, and compare the two backends' results
 * directly through a hash of every result byte (out of place and in place: mpi's symmetric
 * memory is plain memory).
 *
 * ACCEL_TEST_COUNTS (a list of counts, default below) replaces the counts of every case (the
 * wire cases take those above 0): the multi-machine tests give the ones at the gloo backend's
 * path boundaries, since every one of its cases costs a few TCP round trips. The first count
 * then runs every collective x dtype x op, the others one dtype of each element size (F32,
 * BF16, U8, I64: what the paths of a backend that only moves bytes tell apart; with
 * ACCEL_TEST_RING set, below, F64 too), with the ops of their count.
 *
 * ACCEL_TEST_NPROCS: 1 2 3 4
 */
#include <string.h>

#include "base/half.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/reduce.h"
#include "comm_env.h"

/* src/comm/shm.h (not included: it is the backend's private header). */
uint64_t accel__shm_zero_copy_calls(void);

static int rank, n_ranks;
static unsigned seed;
static int cases;

/* Counts above this (given through ACCEL_TEST_COUNTS for a backend's pipelined allreduce) run
 * the allreduce only, with SUM, MIN and AVG (wire dtypes: SUM and AVG): the other collectives'
 * paths and ops are covered by the smaller counts, and the reference of every case computed
 * here over all processes' inputs made such a count cost seconds per case. */
#define HUGE_COUNT ((size_t)1 << 20)

/* The counts from ACCEL_TEST_COUNTS (n_counts 0: each kind of case keeps its own list). */
enum { MAX_COUNTS = 16 };
static size_t env_counts[MAX_COUNTS];
static size_t n_counts;
static size_t max_count = 300007; /* the largest count of any case (buffers are sized by it) */

static void read_counts(void)
{
    const char *env = getenv("ACCEL_TEST_COUNTS"), *s = env;
    while (s != NULL) {
        s += strspn(s, " ");
        if (*s == '\0') {
            break;
        }
        char *end;
        const unsigned long long v = strtoull(s, &end, 10);
        CHECK_MSG(end != s && n_counts < MAX_COUNTS && v <= (1u << 24),
                  "ACCEL_TEST_COUNTS=\"%s\": expected at most %d counts of at most 2^24", env,
                  MAX_COUNTS);
        env_counts[n_counts++] = (size_t)v;
        max_count = (size_t)v > max_count ? (size_t)v : max_count;
        s = end;
    }
}

/* FNV-1a over every result byte a backend produced (backend against backend: under mpirun,
 * which sets hashing; a byte at a time, it cost the other runs a tenth of their time). */
static uint64_t result_hash;
static int hashing;
static void hash_bytes(const void *p, size_t nbytes)
{
    if (!hashing) {
        return;
    }
    const unsigned char *b = p;
    for (size_t i = 0; i < nbytes; i++) {
        result_hash = (result_hash ^ b[i]) * 1099511628211ull;
    }
}

static accel__comm *comm_new(const char *backend, const char *job_id)
{
    accel__comm_config cfg = comm_env_config(backend);
    cfg.job_id = job_id;
    accel__comm *c;
    CHECK_OK(NULL, accel__comm_new(&c, &cfg));
    return c;
}

/* The hash of element i of the input whose salt is that of process r in case `seed`. */
static inline uint32_t gen_hash(size_t i, uint32_t salt)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ salt;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return h;
}

static inline uint32_t gen_salt(int r)
{
    return (uint32_t)(r * 40503u + seed * 977u);
}

static inline float gen_float(uint32_t h)
{
    return (float)(h & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* Element i of process r's input in case `seed`, as dtype dt. Floats carry 23 random mantissa
 * bits (so wire rounding matters) and stay small; integers are small. */
static void gen(accel_dtype dt, int r, size_t i, void *out)
{
    uint32_t h = gen_hash(i, gen_salt(r));
    float f = gen_float(h);
    switch (dt) {
    case ACCEL_F32:
        memcpy(out, &f, 4);
        break;
    case ACCEL_F64: {
        double d = (double)f / 3.0;
        memcpy(out, &d, 8);
        break;
    }
    case ACCEL_BF16: {
        uint16_t v = accel__f32_to_bf16(f);
        memcpy(out, &v, 2);
        break;
    }
    case ACCEL_F16: {
        uint16_t v = accel__f32_to_f16(f);
        memcpy(out, &v, 2);
        break;
    }
    case ACCEL_F8_E4M3:
        *(uint8_t *)out = accel__f32_to_f8e4m3(f);
        break;
    case ACCEL_F8_E5M2:
        *(uint8_t *)out = accel__f32_to_f8e5m2(f);
        break;
    case ACCEL_I8:
    case ACCEL_I16:
    case ACCEL_I32:
    case ACCEL_I64: { /* small signed values, stored little-endian in the dtype's width */
        int64_t v = (int64_t)(h % 13) - 6;
        memcpy(out, &v, accel_dtype_nbytes(dt));
        break;
    }
    case ACCEL_U8:
    case ACCEL_U16: {
        uint64_t v = h % 13;
        memcpy(out, &v, accel_dtype_nbytes(dt));
        break;
    }
    case ACCEL_BOOL:
        *(uint8_t *)out = (uint8_t)(h % 3 == 0);
        break;
    default: /* moved, never reduced: any bytes */
        for (size_t b = 0; b < accel_dtype_nbytes(dt); b++) {
            ((uint8_t *)out)[b] = (uint8_t)(h >> (b % 4 * 8)) ^ (uint8_t)b;
        }
        break;
    }
}

static void *xmalloc(size_t nbytes)
{
    void *p = malloc(nbytes > 0 ? nbytes : 1);
    CHECK(p != NULL);
    return p;
}

/* Process r's whole input of `count` elements: gen's values, the common dtypes in a loop of
 * their own (every process makes every process's input for its references, which made gen,
 * element by element through its switch, the most of the comm tests' CPU time). */
static char *input(accel_dtype dt, int r, size_t count)
{
    size_t es = accel_dtype_nbytes(dt);
    char *p = xmalloc(count * es);
    const uint32_t salt = gen_salt(r);
    switch (dt) {
    case ACCEL_F32: {
        float *o = (float *)p;
        for (size_t i = 0; i < count; i++) {
            o[i] = gen_float(gen_hash(i, salt));
        }
        break;
    }
    case ACCEL_BF16:
    case ACCEL_F16: {
        uint16_t *o = (uint16_t *)p;
        for (size_t i = 0; i < count; i++) {
            float f = gen_float(gen_hash(i, salt));
            o[i] = dt == ACCEL_BF16 ? accel__f32_to_bf16(f) : accel__f32_to_f16(f);
        }
        break;
    }
    case ACCEL_I8:
    case ACCEL_I16:
    case ACCEL_I32:
    case ACCEL_I64:
    case ACCEL_U8:
    case ACCEL_U16: { /* gen's small values, which every width holds */
        const int is_signed =
            dt == ACCEL_I8 || dt == ACCEL_I16 || dt == ACCEL_I32 || dt == ACCEL_I64;
        for (size_t i = 0; i < count; i++) {
            uint32_t h = gen_hash(i, salt);
            int64_t v = is_signed ? (int64_t)(h % 13) - 6 : (int64_t)(h % 13);
            if (es == 1) {
                ((int8_t *)p)[i] = (int8_t)v;
            } else if (es == 2) {
                ((int16_t *)p)[i] = (int16_t)v;
            } else if (es == 4) {
                ((int32_t *)p)[i] = (int32_t)v;
            } else {
                ((int64_t *)p)[i] = v;
            }
        }
        break;
    }
    default:
        for (size_t i = 0; i < count; i++) {
            gen(dt, r, i, p + i * es);
        }
        break;
    }
    return p;
}

/* ACCEL_TEST_RING=1: the backend (gloo with ACCEL_GLOO_RING=1, or over a network) reduces an
 * f32 / f64 allreduce or reduce of at least 256 KiB (a reduce_scatter of as much input) in ring
 * order: chunk c (accel__chunk_range) combined from process c + 1 round to process c
 * (docs/comm.md). ACCEL_TEST_RING=0: the same cases (ring_cases:
 * F64 sampled too) held to rank order, as gloo with ACCEL_GLOO_RING=0 computes them. */
static int ring_order, ring_cases;

static int in_ring_order(accel__coll_kind kind, accel_dtype dt, accel_dtype wire, size_t count)
{
    const size_t nbytes = count * accel_dtype_nbytes(dt);
    return ring_order && n_ranks >= 2 && wire == ACCEL_F32 &&
           (dt == ACCEL_F32 || dt == ACCEL_F64) &&
           (kind == ACCEL__COLL_ALLREDUCE || kind == ACCEL__COLL_REDUCE ||
            kind == ACCEL__COLL_REDUCE_SCATTER) &&
           nbytes >= ((size_t)256 << 10);
}

/* The reduction over all processes' inputs of `count` elements (wire: through it), in rank order
 * or (ring) in ring order. */
static char *reference_reduce(accel_dtype dt, accel_dtype wire, accel_reduce_op op, size_t count,
                              int ring)
{
    const void *in[4];
    char *ins[4];
    char *out = xmalloc(count * accel_dtype_nbytes(dt));
    for (int q = 0; q < n_ranks; q++) {
        ins[q] = input(dt, q, count);
        if (wire != ACCEL_F32) { /* compress */
            uint16_t *h = xmalloc(count * 2);
            for (size_t i = 0; i < count; i++) {
                float f;
                memcpy(&f, ins[q] + 4 * i, 4);
                h[i] = wire == ACCEL_BF16 ? accel__f32_to_bf16(f) : accel__f32_to_f16(f);
            }
            free(ins[q]);
            ins[q] = (char *)h;
        }
        in[q] = ins[q];
    }
    if (ring) {
        const size_t es = accel_dtype_nbytes(dt);
        for (int c = 0; c < n_ranks; c++) {
            size_t off = 0, cnt = 0;
            const void *rot[4];
            accel__chunk_range(count, n_ranks, c, &off, &cnt);
            for (int k = 0; k < n_ranks; k++) {
                rot[k] = ins[(c + 1 + k) % n_ranks] + off * es;
            }
            accel__reduce_isa(ACCEL__ISA_SCALAR, dt, op, out + off * es, NULL, rot, n_ranks, cnt,
                              n_ranks);
        }
    } else if (wire == ACCEL_F32) {
        accel__reduce_isa(ACCEL__ISA_SCALAR, dt, op, out, NULL, in, n_ranks, count, n_ranks);
    } else { /* reduce in the wire dtype, decompress */
        uint16_t *h = xmalloc(count * 2);
        accel__reduce_isa(ACCEL__ISA_SCALAR, wire, op, h, NULL, in, n_ranks, count, n_ranks);
        for (size_t i = 0; i < count; i++) {
            float f = wire == ACCEL_BF16 ? accel__bf16_to_f32(h[i]) : accel__f16_to_f32(h[i]);
            memcpy(out + 4 * i, &f, 4);
        }
        free(h);
    }
    for (int q = 0; q < n_ranks; q++) {
        free(ins[q]);
    }
    return out;
}

static void expect(const void *got, const void *want, size_t nbytes, const accel__comm *c,
                   const accel__coll *op, const char *form)
{
    hash_bytes(got, nbytes);
    if (nbytes == 0 || memcmp(got, want, nbytes) == 0) {
        return;
    }
    char call[160];
    accel__coll_str(op, n_ranks, call, sizeof(call));
    size_t i = 0;
    while (((const char *)got)[i] == ((const char *)want)[i]) {
        i++;
    }
    fprintf(stderr, "rank %d: %s on %s (%s), seed %u: byte %zu differs from the reference\n", rank,
            call, accel__comm_backend_name(c), form, seed, i);
    exit(1);
}

enum { OUT_OF_PLACE, IN_PLACE, SYMMETRIC };
/* The last form run (mpirun: not SYMMETRIC, which is plain memory on mpi, as in place is, and
 * which the launcher's runs cover on shm). */
static int last_form = SYMMETRIC;
static const char *const forms[] = {"out of place", "in place", "symmetric, in place"};

/* One case on c in one form; buf (symmetric memory for SYMMETRIC) holds enough for any case. */
static void run_case(accel__comm *c, char *buf, int form, accel__coll_kind kind, accel_dtype dt,
                     accel_reduce_op rop, accel_dtype wire, size_t count, int root)
{
    seed++;
    cases++;
    const size_t es = accel_dtype_nbytes(dt), n = (size_t)n_ranks;
    const int per_rank = kind == ACCEL__COLL_REDUCE_SCATTER || kind == ACCEL__COLL_ALLGATHER ||
                         kind == ACCEL__COLL_GATHER;
    const size_t whole = per_rank ? count * n : count;
    char *scratch = form == SYMMETRIC ? buf : xmalloc(2 * whole * es + 64);
    char *send = scratch, *recv = form == OUT_OF_PLACE ? scratch + whole * es : scratch;
    char *mine = input(dt, rank, kind == ACCEL__COLL_REDUCE_SCATTER ? whole : count);
    accel__coll op = ACCEL__COLL(kind, send, recv, count, dt, rop, root);
    op.wire = wire;
    char *want = NULL;
    switch (kind) {
    case ACCEL__COLL_ALLREDUCE:
    case ACCEL__COLL_REDUCE:
        memcpy(send, mine, count * es);
        want = reference_reduce(dt, wire, rop, count, in_ring_order(kind, dt, wire, count));
        break;
    case ACCEL__COLL_REDUCE_SCATTER:
        memcpy(send, mine, whole * es);
        op.recv = form == OUT_OF_PLACE ? recv : send + (size_t)rank * count * es;
        want = reference_reduce(dt, wire, rop, whole, in_ring_order(kind, dt, wire, whole));
        memmove(want, want + (size_t)rank * count * es, count * es);
        break;
    case ACCEL__COLL_ALLGATHER:
    case ACCEL__COLL_GATHER:
        op.send = form == OUT_OF_PLACE ? send : recv + (size_t)rank * count * es;
        memcpy((char *)op.send, mine, count * es);
        want = xmalloc(whole * es);
        for (int q = 0; q < n_ranks; q++) {
            char *in = input(dt, q, count);
            memcpy(want + (size_t)q * count * es, in, count * es);
            free(in);
        }
        break;
    default: /* broadcast */
        memcpy(send, mine, count * es);
        free(mine);
        mine = input(dt, root, count);
        want = mine;
        mine = NULL;
        break;
    }
    if (kind == ACCEL__COLL_REDUCE || kind == ACCEL__COLL_GATHER) {
        op.recv = rank == root ? op.recv : NULL;
    }
    CHECK_OK(NULL, accel__comm_run(c, &op));
    const int has_result =
        (kind != ACCEL__COLL_REDUCE && kind != ACCEL__COLL_GATHER) || rank == root;
    if (has_result) {
        const size_t got_n = kind == ACCEL__COLL_REDUCE_SCATTER ? count : whole;
        expect(op.recv, want, got_n * es, c, &op, forms[form]);
    }
    free(want);
    free(mine);
    if (form != SYMMETRIC) {
        free(scratch);
    }
}

/* Every whole-byte dtype: the reducible ones with every op, the others (U32, U64, C64, the
 * FNUZ and E8M0 FP8s) moved by the collectives that do not reduce. */
static void matrix(accel__comm *c, char *sym)
{
    static const size_t own[] = {0, 1, 13, 70001};
    const size_t *counts = n_counts > 0 ? env_counts : own;
    const size_t n = n_counts > 0 ? n_counts : sizeof(own) / sizeof(own[0]);
    for (size_t ci = 0; ci < n; ci++) {
        const size_t count = counts[ci];
        for (int kind = ACCEL__COLL_ALLREDUCE; kind <= ACCEL__COLL_GATHER; kind++) {
            if (count > HUGE_COUNT && kind != ACCEL__COLL_ALLREDUCE) {
                continue;
            }
            const int reducing = kind == ACCEL__COLL_ALLREDUCE ||
                                 kind == ACCEL__COLL_REDUCE_SCATTER || kind == ACCEL__COLL_REDUCE;
            for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
                const accel_dtype dt = (accel_dtype)d;
                if (accel_dtype_nbytes(dt) == 0 || (reducing && !accel__reduce_supported(dt))) {
                    continue;
                }
                /* With ACCEL_TEST_RING set, F64 too: the ring's other dtype. */
                const int sample = dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_U8 ||
                                   dt == ACCEL_I64 || (ring_cases && dt == ACCEL_F64);
                if (n_counts > 0 && ci > 0 && !sample) {
                    continue;
                }
                for (int rop = ACCEL_SUM; rop <= (reducing ? ACCEL_PROD : ACCEL_SUM); rop++) {
                    /* Large counts: a few ops only (the small ones cover every pair): SUM and
                     * MIN of every dtype (mpi hands those of integers and BOOL to MPI's own
                     * ops), AVG of F32 and BF16 (and F64 with ACCEL_TEST_RING set). */
                    const int big_avg = rop == ACCEL_AVG && (dt == ACCEL_F32 || dt == ACCEL_BF16 ||
                                                             (ring_cases && dt == ACCEL_F64));
                    if (count > 1000 && rop != ACCEL_SUM && rop != ACCEL_MIN && !big_avg) {
                        continue;
                    }
                    if (dt == ACCEL_BOOL && rop == ACCEL_AVG) {
                        continue; /* refused: not defined for BOOL */
                    }
                    int root = kind >= ACCEL__COLL_BROADCAST ? (int)(seed % (unsigned)n_ranks) : 0;
                    for (int form = OUT_OF_PLACE; form <= last_form; form++) {
                        run_case(c, sym, form, (accel__coll_kind)kind, dt, (accel_reduce_op)rop,
                                 ACCEL_F32, count, root);
                    }
                }
            }
        }
    }
}

/* The wire dtype against the compressed path, computed here and run on the backend. */
static void wire_cases(accel__comm *c, char *sym)
{
    static const size_t own[] = {1, 13, 4099, 70001, 300007};
    static const accel_dtype wires[] = {ACCEL_BF16, ACCEL_F16};
    const size_t *counts = n_counts > 0 ? env_counts : own;
    const size_t n = n_counts > 0 ? n_counts : sizeof(own) / sizeof(own[0]);
    for (size_t ci = 0; ci < n; ci++) {
        if (counts[ci] == 0) {
            continue;
        }
        for (int wi = 0; wi < 2; wi++) {
            for (int rop = ACCEL_SUM; rop <= ACCEL_PROD; rop++) {
                if (counts[ci] > HUGE_COUNT && rop != ACCEL_SUM && rop != ACCEL_AVG) {
                    continue;
                }
                for (int form = OUT_OF_PLACE; form <= last_form; form++) {
                    run_case(c, sym, form, ACCEL__COLL_ALLREDUCE, ACCEL_F32, (accel_reduce_op)rop,
                             wires[wi], counts[ci], 0);
                }
            }
            /* The compressed path on the backend: convert, 16-bit allreduce, convert back. */
            const size_t count = counts[ci];
            seed++;
            float *g = (float *)input(ACCEL_F32, rank, count);
            uint16_t *h = xmalloc(count * 2);
            CHECK_OK(NULL, accel_convert(h, wires[wi], g, ACCEL_F32, count));
            CHECK_OK(NULL, accel__allreduce(c, h, h, count, wires[wi], ACCEL_AVG));
            CHECK_OK(NULL, accel_convert(g, ACCEL_F32, h, wires[wi], count));
            float *w2 = (float *)input(ACCEL_F32, rank, count);
            accel__coll op =
                ACCEL__COLL(ACCEL__COLL_ALLREDUCE, w2, w2, count, ACCEL_F32, ACCEL_AVG, 0);
            op.wire = wires[wi];
            CHECK_OK(NULL, accel__comm_run(c, &op));
            expect(w2, g, count * 4, c, &op, "against the converting path");
            free(g);
            free(h);
            free(w2);
        }
    }
}

/* Everything on c; returns the zero-copy calls it made. */
static uint64_t all_cases(accel__comm *c)
{
    const size_t sym_nbytes = 2 * max_count * 8 * (size_t)n_ranks + 64;
    void *sym = NULL;
    CHECK_OK(NULL, accel__comm_alloc(c, sym_nbytes, &sym));
    uint64_t zc0 = accel__shm_zero_copy_calls();
    matrix(c, sym);
    wire_cases(c, sym);
    uint64_t zc = accel__shm_zero_copy_calls() - zc0;
    CHECK_OK(NULL, accel__comm_dealloc(c, sym));
    return zc;
}

/* Every case on c from the first seed (so that every backend sees the same inputs); the hash of
 * every result byte. Without zero_copy_ok, c must make no zero-copy call. */
static uint64_t hashed_cases(accel__comm *c, int zero_copy_ok)
{
    seed = 0;
    result_hash = 1469598103934665603ull; /* FNV-1a's offset basis */
    const uint64_t zero_copy_calls = all_cases(c);
    CHECK(zero_copy_ok || zero_copy_calls == 0);
    return result_hash;
}

/* mpirun: every case on mpi, then on shm (the seeds restart, so both see the same inputs),
 * each against the reference, and the two backends' results against each other. On 3
 * processes (uneven chunks), mpi once more as if every process were on a machine of its own (the
 * layout says so): the paths meant for networks (a broadcast's scatter), which one machine does
 * not take. */
static int mpi_vs_shm(void)
{
#ifdef ACCEL_HAVE_MPI
    last_form = IN_PLACE;
    hashing = 1;
    accel__comm *mpi = comm_new("mpi", NULL);
    const uint64_t h_mpi = hashed_cases(mpi, 0);
    const int n_cases = cases;
    if (n_ranks == 3) {
        accel__comm_config cfg = comm_env_config("mpi");
        cfg.local_rank = 0;
        cfg.local_n_ranks = 1;
        accel__comm *apart;
        CHECK_OK(NULL, accel__comm_new(&apart, &cfg));
        const uint64_t h_apart = hashed_cases(apart, 0);
        CHECK_MSG(h_apart == h_mpi, "mpi on one machine and as if on %d differ (hash %llx vs %llx)",
                  n_ranks, (unsigned long long)h_mpi, (unsigned long long)h_apart);
        accel__comm_free(apart);
    }
    accel__comm *shm = comm_new("shm", NULL);
    const uint64_t h_shm = hashed_cases(shm, 1);
    CHECK_MSG(h_shm == h_mpi, "mpi and shm results differ (hash %llx vs %llx)",
              (unsigned long long)h_mpi, (unsigned long long)h_shm);
    accel__comm_free(shm);
    accel__comm_free(mpi);
    if (rank == 0) {
        printf("test_comm_backends: mpirun, %d processes: %d cases on mpi%s and on shm, each "
               "bit-identical to the reference and to the other backend\n",
               n_ranks, n_cases, n_ranks == 3 ? " (one machine, and one a process)" : "");
    }
    return 0;
#else
    printf("test_comm_backends: built without MPI: skipped\n");
    return 77;
#endif
}

int main(void)
{
    /* Zero-copy above 64 KiB on symmetric memory: the 70001- and 300007-element cases. */
    setenv("ACCEL_SHM_ZEROCOPY_NBYTES", "65536", 1);
    rank = layout("RANK", "OMPI_COMM_WORLD_RANK", 0);
    n_ranks = layout("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
    read_counts();
    const char *ring = getenv("ACCEL_TEST_RING") != NULL ? getenv("ACCEL_TEST_RING") : "";
    CHECK_MSG(strcmp(ring, "") == 0 || strcmp(ring, "0") == 0 || strcmp(ring, "1") == 0,
              "ACCEL_TEST_RING=\"%s\": expected 1 (ring order), 0 (rank order) or unset", ring);
    ring_order = strcmp(ring, "1") == 0;
    ring_cases = ring[0] != '\0';
    if (under_mpirun()) {
        return mpi_vs_shm();
    }
    /* ACCEL_TEST_BACKEND runs the cases on another backend with several processes (the
     * multi-machine tests: gloo, whose rank-order reductions match shm's bit for bit). */
    const char *backend =
        getenv("ACCEL_TEST_BACKEND") != NULL ? getenv("ACCEL_TEST_BACKEND") : "shm";
    uint64_t zc;
    if (n_ranks == 1) {
        accel__comm *self = comm_new("self", NULL), *shm = comm_new("shm", NULL);
        CHECK(all_cases(self) == 0);
        zc = all_cases(shm);
        accel__comm_free(self);
        accel__comm_free(shm);
    } else {
        /* Symmetric memory is shm's own; elsewhere it is plain memory, as in place is. */
        last_form = strcmp(backend, "shm") == 0 ? SYMMETRIC : IN_PLACE;
        accel__comm *c = comm_new(backend, getenv("ACCEL_JOB_ID"));
        zc = all_cases(c);
        accel__comm_free(c);
    }
    /* The symmetric large cases really took the zero-copy path (shm's alone has one). */
    CHECK_MSG(zc > 0 || strcmp(backend, "shm") != 0, "no zero-copy call");
    if (rank == 0) {
        printf("test_comm_backends: %d processes (%s): %d cases bit-identical to the reference, "
               "%llu zero-copy\n",
               n_ranks, backend, cases, (unsigned long long)zc);
    }
    return 0;
}
