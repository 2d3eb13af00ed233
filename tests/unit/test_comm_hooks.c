/*
 * Hooks attached to one collective (accel__coll.pre / post, what the public uneven
 * reduce_scatter / allgather use to copy out of their padding): `pre` runs right before the data
 * moves and `post` right after, on the thread that executes the collective: the caller's for a
 * blocking call with nothing queued, the communication thread for a queued one (off the training
 * thread). A collective refused by validation runs no hook. On the one-process backend.
 */
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"

typedef struct probe {
    float *send, *recv;
    int n_pre, n_post;
    float seen_by_post; /* recv[0] when post ran */
    pthread_t pre_thread, post_thread;
} probe;

static void pre(void *arg)
{
    probe *p = arg;
    p->n_pre++;
    p->pre_thread = pthread_self();
    p->send[0] = 42.0f; /* written before the data moves: the collective carries it */
}

static void post(void *arg)
{
    probe *p = arg;
    p->n_post++;
    p->post_thread = pthread_self();
    p->seen_by_post = p->recv[0];
}

int main(void)
{
    accel__comm_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = "self";
    cfg.n_ranks = cfg.local_n_ranks = 1;
    cfg.job_id = "test_comm_hooks";
    cfg.timeout_s = 30;
    cfg.log.rank = -1;
    accel__comm *c;
    CHECK_OK(NULL, accel__comm_new(&c, &cfg));
    float send[4] = {0}, recv[4] = {0};
    probe p = {send, recv, 0, 0, 0.0f, pthread_self(), pthread_self()};
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLREDUCE, send, recv, 4, ACCEL_F32, ACCEL_SUM, 0);
    op.pre = pre;
    op.post = post;
    op.hook_arg = &p;

    /* Blocking with nothing queued: inline, on this thread, pre -> data -> post. */
    CHECK_OK(NULL, accel__comm_run(c, &op));
    CHECK(p.n_pre == 1 && p.n_post == 1 && p.seen_by_post == 42.0f && recv[0] == 42.0f);
    CHECK(pthread_equal(p.pre_thread, pthread_self()) &&
          pthread_equal(p.post_thread, pthread_self()));

    /* Queued: on the communication thread, done before the wait returns. */
    send[0] = 0;
    recv[0] = 0;
    accel_work *w;
    CHECK_OK(NULL, accel__comm_post(c, &op, NULL, &w));
    CHECK_OK(NULL, accel_work_wait(w));
    accel_work_free(w);
    CHECK(p.n_pre == 2 && p.n_post == 2 && p.seen_by_post == 42.0f);
    CHECK(!pthread_equal(p.pre_thread, pthread_self()));
    CHECK(pthread_equal(p.pre_thread, p.post_thread));

    /* Refused by validation: no hook runs. */
    accel__coll bad = op;
    bad.send = NULL;
    CHECK(accel__comm_run(c, &bad) == ACCEL_EINVAL);
    CHECK(p.n_pre == 2 && p.n_post == 2);

    /* No hooks is the plain call. */
    send[0] = 7.0f;
    op.pre = op.post = NULL;
    CHECK_OK(NULL, accel__comm_run(c, &op));
    CHECK(recv[0] == 7.0f && p.n_pre == 2);
    accel__comm_free(c);
    return 0;
}
