/*
 * The front end's native-async path (what nccl will use), through a mock backend with caps
 * NATIVE_ASYNC given to accel__comm_new_with: post launches on the backend at once (or at the
 * group's end, bracketed by the backend's group calls), completion is found by polling test,
 * hooks run on the posting thread (pre) and the thread that sees completion (post); a wait past
 * its deadline is ETIMEDOUT naming the call; accel__comm_abort from another thread reaches the
 * backend once and wakes a waiter; the watchdog of a blocking wait aborts a communicator whose
 * work outlives its timeout; freeing a communicator with work in flight aborts it and leaves
 * the caller's handle valid. One process.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm/comm.h"

typedef struct mock {
    int hang; /* posted work never completes on its own */
    _Atomic int aborted, n_aborts;
    int in_group, n_group_begin, n_group_end, n_posted, posted_in_group;
} mock;

typedef struct mock_req {
    accel__coll op;
    int polls; /* tests until complete; -1: never */
} mock_req;

static mock *last;

static accel_status mock_init(const accel__comm_config *cfg, void **impl)
{
    CHECK(cfg->n_ranks == 1);
    last = calloc(1, sizeof(mock));
    CHECK(last != NULL);
    *impl = last;
    return ACCEL_OK;
}

static accel_status mock_post(void *impl, const accel__coll *op, accel__stream *s, void **req)
{
    (void)s;
    mock *m = impl;
    if (m->aborted) {
        return accel__seterr(NULL, ACCEL_EPEER, "mock: aborted");
    }
    mock_req *r = malloc(sizeof(*r));
    CHECK(r != NULL);
    r->op = *op;
    r->polls = m->hang ? -1 : 3;
    m->n_posted++;
    m->posted_in_group += m->in_group;
    *req = r;
    return ACCEL_OK;
}

static int mock_test(void *impl, void *req, accel_status *st)
{
    mock *m = impl;
    mock_req *r = req;
    if (m->aborted) {
        *st = accel__seterr(NULL, ACCEL_EPEER, "mock: aborted while in flight");
        return 1;
    }
    if (r->polls < 0 || --r->polls > 0) {
        return 0;
    }
    if (r->op.kind == ACCEL__COLL_ALLREDUCE && r->op.send != r->op.recv) {
        memcpy(r->op.recv, r->op.send, r->op.count * accel_dtype_nbytes(r->op.dtype));
    }
    *st = ACCEL_OK;
    return 1;
}

static void mock_req_free(void *impl, void *req)
{
    (void)impl;
    free(req);
}

static accel_status mock_group(void *impl, int begin)
{
    mock *m = impl;
    m->in_group = begin;
    *(begin ? &m->n_group_begin : &m->n_group_end) += 1;
    return ACCEL_OK;
}

static void mock_abort(void *impl, accel_status st, const char *msg)
{
    (void)st;
    (void)msg;
    mock *m = impl;
    m->n_aborts++;
    m->aborted = 1;
}

static void mock_destroy(void *impl)
{
    free(impl);
}

static const accel__comm_ops mock_ops = {.init = mock_init,
                                         .post = mock_post,
                                         .test = mock_test,
                                         .req_free = mock_req_free,
                                         .group = mock_group,
                                         .abort = mock_abort,
                                         .destroy = mock_destroy};
static const accel__comm_backend mock_backend = {"mock", 1, ACCEL__COMM_NATIVE_ASYNC, &mock_ops,
                                                 "a test's native-async backend"};

static accel__comm *comm_new(double timeout_s)
{
    accel__comm_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = "mock";
    cfg.n_ranks = cfg.local_n_ranks = 1;
    cfg.timeout_s = timeout_s;
    cfg.log.rank = -1;
    cfg.log.level = ACCEL__LOG_OFF;
    accel__comm *c;
    CHECK_OK(NULL, accel__comm_new_with(&c, &cfg, &mock_backend));
    return c;
}

static pthread_t pre_thread, post_thread;
static int n_pre, n_post;
static void pre(void *arg)
{
    (void)arg;
    n_pre++;
    pre_thread = pthread_self();
}
static void post(void *arg)
{
    (void)arg;
    n_post++;
    post_thread = pthread_self();
}

typedef struct waiter {
    accel_work *w;
    accel_status st;
    double took;
} waiter;

static void *wait_long(void *arg)
{
    waiter *x = arg;
    double t0 = accel__now();
    x->st = accel__work_wait(x->w, t0 + 30);
    x->took = accel__now() - t0;
    return NULL;
}

int main(void)
{
    accel__comm *c = comm_new(30);
    mock *m = last;
    float send[4] = {1, 2, 3, 4}, recv[4] = {0};
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, send, recv, 4, ACCEL_F32, ACCEL_SUM, 0);
    op.pre = pre;
    op.post = post;

    /* Post and poll: launched at once, complete after a few tests. */
    accel_work *w;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    CHECK(m->n_posted == 1 && n_pre == 1 && pthread_equal(pre_thread, pthread_self()));
    CHECK(accel__work_test(w, NULL) == 0 && n_post == 0);
    CHECK_OK(NULL, accel__work_wait(w, accel__comm_deadline(c)));
    CHECK(recv[3] == 4.0f && n_post == 1 && pthread_equal(post_thread, pthread_self()));
    accel__work_free(w);
    CHECK_OK(NULL, accel__comm_run(c, &op)); /* blocking: post + wait */
    CHECK(m->n_posted == 2 && n_post == 2);

    /* A group: nothing reaches the backend before the end, then all of it inside its bracket. */
    accel_work *g[2];
    CHECK_OK(NULL, accel__comm_group_begin(c));
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &g[0]));
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &g[1]));
    CHECK(m->n_posted == 2 && accel__work_test(g[0], NULL) == 0);
    CHECK_OK(NULL, accel__comm_group_end(c));
    CHECK(m->n_group_begin == 1 && m->n_group_end == 1 && m->posted_in_group == 2);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(NULL, accel__work_wait(g[k], accel__comm_deadline(c)));
        accel__work_free(g[k]);
    }

    /* Deadline: work that does not complete. */
    m->hang = 1;
    op.pre = op.post = NULL;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    CHECK(accel__work_wait(w, accel__now() + 0.05) == ACCEL_ETIMEDOUT);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(strstr(msg, "allreduce(count=4, f32, sum) #5 on communicator world (rank 0 of 1) "
                          "not complete after") != NULL,
              "%s", msg);

    /* Abort from another thread wakes a waiter, reaches the backend once, and later calls fail
     * at once. */
    waiter x = {w, ACCEL_OK, 0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, wait_long, &x) == 0);
    struct timespec nap = {0, 50000000};
    nanosleep(&nap, NULL);
    accel__comm_abort(c, ACCEL_EPEER, "mock abort");
    accel__comm_abort(c, ACCEL_EPEER, "again");
    pthread_join(t, NULL);
    CHECK(x.st == ACCEL_EPEER && x.took < 10 && m->n_aborts == 1);
    accel__work_free(w);
    CHECK(accel__comm_post(c, &op, NULL, &w) == ACCEL_EPEER && w == NULL);
    CHECK_MSG(strstr(accel_last_error(NULL), "communicator world aborted by process 0: mock abort"),
              "%s", accel_last_error(NULL));
    accel__comm_free(c);

    /* The watchdog: a blocking wait on work that outlives the communicator's timeout aborts it. */
    c = comm_new(0.2);
    m = last;
    m->hang = 1;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    double t0 = accel__now();
    CHECK(accel_work_wait(w) == ACCEL_ETIMEDOUT);
    CHECK(accel__now() - t0 >= 0.2 && m->n_aborts == 1);
    CHECK(accel__comm_run(c, &op) == ACCEL_ETIMEDOUT); /* broken */
    accel_work_free(w);
    accel__comm_free(c);

    /* Freed with work in flight: aborted, and the handle outlives the communicator. */
    c = comm_new(0.2);
    last->hang = 1;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    accel__comm_free(c);
    accel_status st = ACCEL_OK;
    CHECK(accel__work_test(w, &st) == 1 && st == ACCEL_EPEER);
    accel__work_free(w);
    printf("test_comm_contract: ok\n");
    return 0;
}
