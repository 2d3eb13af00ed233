/*
 * Comm v2 on the real backends (self for 1 process, shm for 2-4), on a communicator this test
 * makes itself from the launcher's environment:
 *  1. post / test / wait: several collectives in flight, completed in post order, a blocking
 *     call behind them, equal-count reduce_scatter / allgather, a stream that host backends
 *     ignore;
 *  2. deadlines: a wait that expires gives ETIMEDOUT naming the call and leaves the work to be
 *     waited for again (a held pre-hook everywhere; with 2+ processes a late peer);
 *  3. groups: nothing is launched before the outermost end, waiting inside is ESTATE, blocking
 *     calls inside are ESTATE, a handle freed inside still runs;
 *  4. split: node groups of 2 (color = rank / 2) with collectives inside each, the "leaders"
 *     (even ranks; the others get no child), key order (where symmetric memory of sizes that
 *     differ fails alike on every member and the child goes on), a nested split, names; a
 *     mismatched call inside one group breaks that group on its members only, and the world
 *     goes on;
 *  5. abort from another thread: the aborting rank's thread breaks a communicator while every
 *     rank waits on a collective, every waiter returns with the abort's status and message, and
 *     later calls fail at once.
 *
 * Under mpirun (tests/comm/test_mpi.sh) the same runs on the mpi backend; the collective
 * mismatch check only in debug mode (ACCELERATE_DEBUG_MODE=1), where mpi compares declarations
 * (without it a mismatch on mpi waits until the deadline: tests/mpi/mpi_mismatch.c).
 *
 * ACCEL_TEST_NPROCS: 1 2 3 4
 */
#include <dirent.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm/comm.h"
#include "comm_env.h"

static int rank, n_ranks;

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int mpi; /* started by mpirun: the mpi backend */

static accel__comm *world_new(void)
{
    mpi = under_mpirun();
    accel__comm_config cfg = comm_env_config(NULL);
    rank = cfg.rank;
    n_ranks = cfg.n_ranks;
    cfg.backend = mpi ? "mpi" : n_ranks == 1 ? "self" : "shm";
    if (getenv("ACCEL_TEST_BACKEND") != NULL) { /* tests/comm/test_gloo_collectives.sh */
        cfg.backend = getenv("ACCEL_TEST_BACKEND");
    }
    accel__comm *c;
    CHECK_OK(NULL, accel__comm_new(&c, &cfg));
    return c;
}

static float sum_ranks(int n)
{
    return (float)(n * (n + 1) / 2);
}

/* ---- 1. post / test / wait ---- */

static void post_test_wait(accel__comm *c)
{
    enum { K = 5 };
    static const size_t counts[K] = {1, 1000, 70000, 300000, 5};
    float *buf[K];
    accel_work *w[K];
    for (int k = 0; k < K; k++) {
        buf[k] = malloc(counts[k] * sizeof(float));
        CHECK(buf[k] != NULL);
        for (size_t i = 0; i < counts[k]; i++) {
            buf[k][i] = (float)(rank + 1) * (float)(i % 7 + k);
        }
        accel__coll op =
            ACCEL__COLL(ACCEL__COLL_ALLREDUCE, buf[k], buf[k], counts[k], ACCEL_F32, ACCEL_SUM, 0);
        /* Host backends ignore the stream: any value is accepted and changes nothing. */
        accel__stream *stream = k == 1 ? (accel__stream *)&counts : NULL;
        CHECK_OK(NULL, accel__comm_post(c, &op, stream, &w[k]));
    }
    int one = rank + 1;
    CHECK_OK(NULL, accel__allreduce(c, &one, &one, 1, ACCEL_I32, ACCEL_SUM));
    CHECK(one == (int)sum_ranks(n_ranks));
    for (int k = 0; k < K; k++) {
        accel_status st = ACCEL_EINTERNAL;
        CHECK(accel__work_test(w[k], &st) == 1 &&
              st == ACCEL_OK); /* posted before the blocking call */
        CHECK_OK(NULL, accel__work_wait(w[k], accel__now() - 1)); /* complete: no waiting */
        for (size_t i = 0; i < counts[k]; i++) {
            CHECK(buf[k][i] == sum_ranks(n_ranks) * (float)(i % 7 + k));
        }
        accel__work_free(w[k]);
        free(buf[k]);
    }
    /* Equal per-rank counts: reduce_scatter of 3 per rank, allgather of 3 per rank, in place and
     * out of place. */
    float send[12], recv[12];
    for (int i = 0; i < 3 * n_ranks; i++) {
        send[i] = (float)(rank * 100 + i);
    }
    accel__coll rs =
        ACCEL__COLL(ACCEL__COLL_REDUCE_SCATTER, send, recv, 3, ACCEL_F32, ACCEL_SUM, 0);
    CHECK_OK(NULL, accel__comm_run(c, &rs));
    for (int j = 0; j < 3; j++) {
        CHECK(recv[j] == (float)(100 * (n_ranks * (n_ranks - 1) / 2) + n_ranks * (3 * rank + j)));
    }
    rs.recv = send + 3 * rank; /* in place */
    CHECK_OK(NULL, accel__comm_run(c, &rs));
    CHECK(send[3 * rank] == recv[0] && send[3 * rank + 2] == recv[2]);
    for (int j = 0; j < 3; j++) {
        send[3 * rank + j] = (float)(rank * 10 + j);
    }
    accel__coll ag =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, send + 3 * rank, send, 3, ACCEL_F32, ACCEL_SUM, 0);
    CHECK_OK(NULL, accel__comm_run(c, &ag));
    for (int i = 0; i < 3 * n_ranks; i++) {
        CHECK(send[i] == (float)((i / 3) * 10 + i % 3));
    }
    /* Overlap other than the in-place form (my block at rank * count) is refused, locally. */
    accel__coll bad =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, send + 3 * rank + 1, send, 3, ACCEL_F32, ACCEL_SUM, 0);
    CHECK(accel__comm_run(c, &bad) == ACCEL_EINVAL);
}

/* ---- 2. deadlines ---- */

/* A pre-hook that holds the collective until the test lets it go (at most 10 s). */
static void held(void *arg)
{
    _Atomic int *go = arg;
    for (int i = 0; i < 10000 && !*go; i++) {
        sleep_s(0.001);
    }
}

static void deadlines(accel__comm *c)
{
    float v[8];
    for (int i = 0; i < 8; i++) {
        v[i] = 1.0f;
    }
    _Atomic int go = 0;
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, v, v, 8, ACCEL_F32, ACCEL_SUM, 0);
    op.pre = held;
    op.hook_arg = &go;
    accel_work *w;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    accel_status st = accel__work_wait(w, accel__now() + 0.05);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(st == ACCEL_ETIMEDOUT, "%s: %s", accel_status_name(st), msg);
    CHECK_MSG(strstr(msg, "allreduce(count=8, f32, sum) #") != NULL &&
                  strstr(msg, "on communicator world") != NULL &&
                  strstr(msg, "not complete after") != NULL,
              "%s", msg);
    CHECK(accel__work_test(w, NULL) == 0);
    /* The work is intact: waiting again completes it. */
    go = 1;
    CHECK_OK(NULL, accel__work_wait(w, accel__comm_deadline(c)));
    CHECK(v[7] == (float)n_ranks);
    accel__work_free(w);
    if (n_ranks == 1) {
        return;
    }
    /* A late peer: the others post only after process 0 gave up waiting (they wait for it on
     * another communicator), and the call itself is unharmed. */
    accel__comm *side = NULL;
    CHECK_OK(NULL, accel__comm_split(c, 0, rank, &side));
    op.pre = NULL;
    if (rank == 0) {
        CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
        CHECK(accel__work_wait(w, accel__now() + 0.02) == ACCEL_ETIMEDOUT);
        CHECK(strstr(accel_last_error(NULL), "allreduce(count=8, f32, sum)") != NULL);
        CHECK_OK(NULL, accel__barrier(side));
    } else {
        CHECK_OK(NULL, accel__barrier(side));
        CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    }
    CHECK_OK(NULL, accel__work_wait(w, accel__comm_deadline(c)));
    CHECK(v[0] == (float)(n_ranks * n_ranks));
    accel__work_free(w);
    accel__comm_free(side);
}

/* ---- 3. groups ---- */

static void groups(accel__comm *c)
{
    float a[4] = {1, 1, 1, 1}, b[4], g[16], x = 1.0f;
    for (int i = 0; i < 4; i++) {
        b[i] = (float)(rank * 4 + i);
    }
    g[rank] = (float)rank;
    accel_work *w[4];
    CHECK_OK(NULL, accel__comm_group_begin(c));
    accel__coll ar = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, a, a, 4, ACCEL_F32, ACCEL_SUM, 0);
    accel__coll bc = ACCEL__COLL(ACCEL__COLL_BROADCAST, b, b, 4, ACCEL_F32, ACCEL_SUM, n_ranks - 1);
    accel__coll ag = ACCEL__COLL(ACCEL__COLL_ALLGATHER, g + rank, g, 1, ACCEL_F32, ACCEL_SUM, 0);
    accel__coll lone = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, &x, &x, 1, ACCEL_F32, ACCEL_MAX, 0);
    CHECK_OK(NULL, accel__comm_post(c, &ar, NULL, &w[0]));
    CHECK_OK(NULL, accel__comm_group_begin(c)); /* nested */
    CHECK_OK(NULL, accel__comm_post(c, &bc, NULL, &w[1]));
    CHECK_OK(NULL, accel__comm_post(c, &ag, NULL, &w[2]));
    CHECK_OK(NULL, accel__comm_group_end(c)); /* inner: launches nothing */
    CHECK_OK(NULL, accel__comm_post(c, &lone, NULL, &w[3]));
    accel__work_free(w[3]); /* freed inside the group: it still runs, and is released after */
    CHECK(accel__comm_run(c, &ar) == ACCEL_ESTATE);
    CHECK(strstr(accel_last_error(NULL), "inside a group") != NULL);
    sleep_s(0.02);
    for (int k = 0; k < 3; k++) {
        CHECK(accel__work_test(w[k], NULL) == 0); /* not launched */
    }
    CHECK(accel__work_wait(w[0], accel__comm_deadline(c)) == ACCEL_ESTATE);
    CHECK(strstr(accel_last_error(NULL), "group that has not ended") != NULL);
    CHECK_OK(NULL, accel__comm_group_end(c));
    for (int k = 0; k < 3; k++) {
        CHECK_OK(NULL, accel__work_wait(w[k], accel__comm_deadline(c)));
        accel__work_free(w[k]);
    }
    for (int i = 0; i < 4; i++) {
        CHECK(a[i] == (float)n_ranks && b[i] == (float)((n_ranks - 1) * 4 + i));
    }
    for (int q = 0; q < n_ranks; q++) {
        CHECK(g[q] == (float)q);
    }
    CHECK(accel__comm_group_end(c) == ACCEL_ESTATE);
    CHECK_OK(NULL, accel__barrier(c)); /* the freed one ran before this, in post order */
}

/* ---- 4. split ---- */

/* Nothing of this job is left in /dev/shm once every member has attached: children's segments
 * are named under the job's prefix and unlinked as soon as their last member attached. */
static void check_no_names(void)
{
    const char *job = getenv("ACCEL_JOB_ID");
    DIR *d = job != NULL ? opendir("/dev/shm") : NULL;
    if (d == NULL) {
        return;
    }
    char prefix[256];
    snprintf(prefix, sizeof(prefix), "accel-%u-%s", (unsigned)geteuid(), job);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        CHECK_MSG(strncmp(e->d_name, prefix, strlen(prefix)) != 0, "left in /dev/shm: %s",
                  e->d_name);
    }
    closedir(d);
}

/* Sum of (q + 1) over the members q of [first, first + n). */
static float member_sum(int first, int n)
{
    float s = 0;
    for (int q = first; q < first + n; q++) {
        s += (float)(q + 1);
    }
    return s;
}

static void splits(accel__comm *world)
{
    /* Node groups of 2. */
    accel__comm *node = NULL;
    CHECK_OK(NULL, accel__comm_split(world, rank / 2, rank, &node));
    CHECK(node != NULL);
    const int first = rank / 2 * 2, size = n_ranks - first < 2 ? n_ranks - first : 2;
    CHECK(accel__comm_rank(node) == rank % 2 && accel__comm_n_ranks(node) == size);
    char name[32];
    snprintf(name, sizeof(name), "world/%d", rank / 2);
    CHECK_MSG(strcmp(accel__comm_name(node), name) == 0, "%s", accel__comm_name(node));
    /* Everyone here is on one machine: local ranks are the child's ranks. */
    CHECK(accel__comm_cfg(node)->local_rank == rank % 2 &&
          accel__comm_cfg(node)->local_n_ranks == size);
    /* Leaders: even ranks; odd ranks are in no child. */
    accel__comm *leaders = NULL;
    CHECK_OK(NULL, accel__comm_split(world, rank % 2 == 0 ? 0 : -1, 0, &leaders));
    CHECK((leaders != NULL) == (rank % 2 == 0));
    check_no_names();
    /* Collectives on the three communicators, interleaved. */
    for (int round = 0; round < 3; round++) {
        float v = (float)(rank + 1), w = v, l = v;
        CHECK_OK(NULL, accel__allreduce(node, &v, &v, 1, ACCEL_F32, ACCEL_SUM));
        CHECK(v == member_sum(first, size));
        CHECK_OK(NULL, accel__allreduce(world, &w, &w, 1, ACCEL_F32, ACCEL_SUM));
        CHECK(w == sum_ranks(n_ranks));
        if (leaders != NULL) {
            CHECK_OK(NULL, accel__allreduce(leaders, &l, &l, 1, ACCEL_F32, ACCEL_SUM));
            float want = 0;
            for (int q = 0; q < n_ranks; q += 2) {
                want += (float)(q + 1);
            }
            CHECK(l == want);
        }
    }
    /* Equal-count reduce_scatter and an asynchronous allgather inside the node group. */
    float s[4] = {1, 2, 3, 4}, r[2];
    accel__coll rs = ACCEL__COLL(ACCEL__COLL_REDUCE_SCATTER, s, r, 2, ACCEL_F32, ACCEL_SUM, 0);
    CHECK_OK(NULL, accel__comm_run(node, &rs));
    CHECK(r[0] == (float)size * s[2 * (rank % 2)] && r[1] == (float)size * s[2 * (rank % 2) + 1]);
    int ids[2];
    ids[rank % 2] = rank;
    accel__coll ag =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, ids + rank % 2, ids, 1, ACCEL_I32, ACCEL_SUM, 0);
    accel_work *w;
    CHECK_OK(NULL, accel__comm_post(node, &ag, NULL, &w));
    CHECK_OK(NULL, accel__work_wait(w, accel__comm_deadline(node)));
    accel__work_free(w);
    for (int i = 0; i < size; i++) {
        CHECK(ids[i] == first + i);
    }
    /* Key order: key = -rank reverses the ranks. */
    accel__comm *rev = NULL;
    CHECK_OK(NULL, accel__comm_split(world, 7, -rank, &rev));
    CHECK(accel__comm_rank(rev) == n_ranks - 1 - rank && accel__comm_n_ranks(rev) == n_ranks);
    /* Symmetric memory of sizes that differ (process 0's, the child's last rank) on a child:
     * ACCEL_EINVAL on every member, and the child works on; hier names job-wide processes. */
    if (!mpi && n_ranks > 1) {
        void *p = NULL;
        accel_status st = accel__comm_alloc(rev, rank == 0 ? 4160 : 4096, &p);
        const char *msg = accel_last_error(NULL);
        CHECK_MSG(st == ACCEL_EINVAL && p == NULL && strstr(msg, "same size") != NULL, "%s", msg);
        if (strcmp(accel__comm_backend_name(world), "hier") == 0) {
            CHECK_MSG(strstr(msg, "process 0 for 4160") != NULL, "%s", msg);
        }
        float one = 1.0f;
        CHECK_OK(NULL, accel__allreduce(rev, &one, &one, 1, ACCEL_F32, ACCEL_SUM));
        CHECK(one == (float)n_ranks);
    }
    /* Nested: a child of the node group. */
    accel__comm *nested = NULL;
    CHECK_OK(NULL, accel__comm_split(node, 0, 0, &nested));
    float v = 1.0f;
    CHECK_OK(NULL, accel__allreduce(nested, &v, &v, 1, ACCEL_F32, ACCEL_SUM));
    CHECK(v == (float)size);
    snprintf(name, sizeof(name), "world/%d/0", rank / 2);
    CHECK(strcmp(accel__comm_name(nested), name) == 0);
    accel__comm_free(nested);
    accel__comm_free(rev);
    /* hier splits into grids of machines x local ranks only: {1, 2} (machine 0's second
     * process, machine 1's first) is refused on every process alike, and the parent works on. */
    if (strcmp(accel__comm_backend_name(world), "hier") == 0 && n_ranks == 4 &&
        accel__comm_cfg(world)->local_n_ranks == 2) {
        accel__comm *odd = NULL;
        accel_status st = accel__comm_split(world, rank == 1 || rank == 2 ? 0 : 1, 0, &odd);
        CHECK_MSG(st == ACCEL_EUNSUPPORTED && odd == NULL &&
                      strstr(accel_last_error(NULL), "grids of machines x local ranks"),
                  "%s", accel_last_error(NULL));
    }

    /* A mismatch inside node group 0 breaks that group on its members only. */
    accel__comm *again = NULL; /* for a second mismatch */
    CHECK_OK(NULL, accel__comm_split(world, rank / 2, rank, &again));
    if (size == 2 && (!mpi || accel__comm_cfg(world)->debug)) {
        float m[5] = {0};
        accel_status st = ACCEL_OK;
        if (rank < 2) {
            st = accel__allreduce(node, m, m, rank == 0 ? 4 : 5, ACCEL_F32, ACCEL_SUM);
            CHECK_MSG(st == ACCEL_EINVAL && strstr(accel_last_error(NULL), "collective mismatch"),
                      "%s", accel_last_error(NULL));
            CHECK(accel__barrier(node) == ACCEL_EINVAL); /* broken: fails at once */
        } else {
            CHECK_OK(NULL, accel__allreduce(node, m, m, 5, ACCEL_F32, ACCEL_SUM));
        }
        /* Again on a fresh group, a small call against a large one: on gloo the small one's
         * inputs travel with its declaration, and the large one's buffers must not take them. */
        if (rank < 2) {
            float *big = calloc(1 << 18, sizeof(float));
            CHECK(big != NULL);
            st = accel__allreduce(again, big, big, rank == 0 ? 3 : 1 << 18, ACCEL_F32, ACCEL_SUM);
            CHECK_MSG(st == ACCEL_EINVAL && strstr(accel_last_error(NULL), "collective mismatch"),
                      "%s", accel_last_error(NULL));
            free(big);
        }
    }
    accel__comm_free(again);
    float all = 1.0f;
    CHECK_OK(NULL, accel__allreduce(world, &all, &all, 1, ACCEL_F32, ACCEL_SUM));
    CHECK(all == (float)n_ranks);
    accel__comm_free(node);
    accel__comm_free(leaders);
    CHECK_OK(NULL, accel__barrier(world));
}

/* ---- 5. abort ---- */

typedef struct aborter {
    accel__comm *c;
    _Atomic int done;
} aborter;

static void *abort_later(void *arg)
{
    aborter *a = arg;
    sleep_s(0.1);
    accel__comm_abort(a->c, ACCEL_EPEER, "test abort");
    accel__comm_abort(a->c, ACCEL_EIO, "a second abort changes nothing");
    a->done = 1;
    return NULL;
}

/* The aborting rank's own collective may only start once the abort happened (else the
 * collective could complete everywhere before anyone aborts). */
static void until_aborted(void *arg)
{
    aborter *a = arg;
    for (int i = 0; i < 5000 && !a->done; i++) {
        sleep_s(0.001);
    }
}

static void aborts(accel__comm *world)
{
    accel__comm *c = NULL;
    CHECK_OK(NULL, accel__comm_split(world, 0, rank, &c));
    const int aborting = n_ranks - 1;
    aborter a = {c, 0};
    pthread_t t;
    float v[1000] = {0};
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, v, v, 1000, ACCEL_F32, ACCEL_SUM, 0);
    if (rank == aborting) {
        op.pre = until_aborted;
        op.hook_arg = &a;
        CHECK(pthread_create(&t, NULL, abort_later, &a) == 0);
    }
    accel_work *w;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    double t0 = accel__now();
    accel_status st = accel__work_wait(w, t0 + 30);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(st == ACCEL_EPEER && strstr(msg, "test abort") != NULL, "%s: %s",
              accel_status_name(st), msg);
    CHECK(accel__now() - t0 < 10);
    if (rank == aborting) {
        pthread_join(t, NULL);
        CHECK_MSG(strstr(msg, "aborted by process") != NULL, "%s", msg);
    } else {
        CHECK_MSG(strstr(msg, "aborted the communicator") != NULL, "%s", msg);
    }
    accel__work_free(w);
    /* Later calls fail at once, with the same status. */
    t0 = accel__now();
    CHECK(accel__barrier(c) == ACCEL_EPEER);
    CHECK(accel__comm_post(c, &op, NULL, &w) == ACCEL_EPEER && w == NULL);
    CHECK(accel__now() - t0 < 1);
    accel__comm_free(c);
    /* The world is untouched. */
    float one = 1.0f;
    CHECK_OK(NULL, accel__allreduce(world, &one, &one, 1, ACCEL_F32, ACCEL_SUM));
    CHECK(one == (float)n_ranks);

    /* An abort while the others are idle: their next call on it fails. */
    CHECK_OK(NULL, accel__comm_split(world, 0, rank, &c));
    if (rank == 0) {
        accel__comm_abort(c, ACCEL_ETIMEDOUT, "idle abort");
    }
    CHECK_OK(NULL, accel__barrier(world));
    st = accel__barrier(c);
    CHECK_MSG(st == ACCEL_ETIMEDOUT && strstr(accel_last_error(NULL), "idle abort"), "%s: %s",
              accel_status_name(st), accel_last_error(NULL));
    accel__comm_free(c);
}

int main(void)
{
    accel__comm *world = world_new();
    post_test_wait(world);
    deadlines(world);
    groups(world);
    splits(world);
    aborts(world);
    CHECK_OK(NULL, accel__barrier(world));
    if (rank == 0) {
        printf("test_comm_v2: %d processes (%s): ok\n", n_ranks, accel__comm_backend_name(world));
    }
    accel__comm_free(world);
    return 0;
}
