/*
 * accel__parallel_for (parallel.h). Invariant: every index runs exactly once (one atomic
 * counter hands them out) and every thread started is joined before returning.
 */
#include "parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

typedef struct loop {
    void (*fn)(void *ctx, size_t i);
    void *ctx;
    size_t n;
    atomic_size_t next;
} loop;

static void *worker(void *arg)
{
    loop *l = arg;
    for (size_t i; (i = atomic_fetch_add(&l->next, 1)) < l->n;) {
        l->fn(l->ctx, i);
    }
    return NULL;
}

void accel__parallel_for(size_t n, size_t nbytes, void (*fn)(void *ctx, size_t i), void *ctx)
{
    loop l = {fn, ctx, n, 0};
    pthread_t tid[7];
    int n_threads = 0;
    cpu_set_t cpus;
    int want = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    want = want < 8 ? want : 8;
    want = (size_t)want < n ? want : (int)n;
    while (nbytes > ((size_t)32 << 20) && n_threads + 1 < want &&
           pthread_create(&tid[n_threads], NULL, worker, &l) == 0) {
        n_threads++;
    }
    worker(&l);
    for (int t = 0; t < n_threads; t++) {
        pthread_join(tid[t], NULL);
    }
}
