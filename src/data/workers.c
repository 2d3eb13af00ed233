/*
 * Worker threads that build map-style batches ahead of the training loop. Batch k always goes
 * to slot k % n_slots and the consumer takes batches strictly in order, so the sequence the
 * user sees is the plan's, whatever the number of workers or their timing. A worker may start
 * batch j only once the consumer has released batch j - n_slots (it asked for a later one),
 * which bounds the batches in flight to n_slots = num_workers * prefetch_factor.
 */
#include <stdio.h>
#include <string.h>

#include "data_internal.h"

struct accel__workers {
    accel_loader *l;
    int n;
    pthread_t *th;
    int started;            /* threads created */
    accel_sample **samples; /* per worker */
    int64_t *n_samples;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int64_t next_job, n_jobs, released;
    int busy, stop;
};

typedef struct worker_arg {
    accel__workers *w;
    int i;
} worker_arg;

static worker_arg *args_of(accel__workers *w)
{
    return (worker_arg *)(w->th + w->n);
}

static void *worker_main(void *p)
{
    worker_arg *a = p;
    accel__workers *w = a->w;
    accel_loader *l = w->l;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && !(w->next_job < w->n_jobs && w->next_job < w->released + l->n_slots)) {
            pthread_cond_wait(&w->work_cv, &w->mu);
        }
        if (w->stop) {
            break;
        }
        int64_t j = w->next_job++;
        w->busy++;
        pthread_mutex_unlock(&w->mu);

        accel__slot *slot = &l->slots[j % l->n_slots];
        int64_t n = accel__plan_batch_len(&l->plan, j);
        accel_status st = ACCEL_OK;
        if (n > w->n_samples[a->i]) {
            accel_sample *ns = accel__calloc((size_t)n, sizeof(*ns));
            st = ns == NULL ? ACCEL_ENOMEM : accel__samples_init(ns, n);
            if (st == ACCEL_OK) {
                accel__samples_free(w->samples[a->i], w->n_samples[a->i]);
                accel__free(w->samples[a->i]);
                w->samples[a->i] = ns;
                w->n_samples[a->i] = n;
            } else {
                accel__free(ns);
            }
        }
        if (st == ACCEL_OK) {
            accel__loader_build(l, j, w->samples[a->i], slot);
        } else {
            slot->st = ACCEL_ENOMEM;
            snprintf(slot->err, sizeof(slot->err), "loader: out of memory for %lld samples",
                     (long long)n);
        }

        pthread_mutex_lock(&w->mu);
        slot->ready = j;
        w->busy--;
        pthread_cond_broadcast(&w->done_cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

accel_status accel__workers_new(accel_loader *l, accel__workers **out)
{
    int n = l->o.num_workers;
    accel__workers *w = accel__calloc(1, sizeof(*w));
    if (w == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for workers");
    }
    w->l = l;
    w->n = n;
    /* Threads and their arguments in one block. */
    w->th = accel__calloc(1, (size_t)n * (sizeof(pthread_t) + sizeof(worker_arg)) + 16);
    w->samples = accel__calloc((size_t)n, sizeof(*w->samples));
    w->n_samples = accel__calloc((size_t)n, sizeof(*w->n_samples));
    if (w->th == NULL || w->samples == NULL || w->n_samples == NULL) {
        accel__workers_free(w);
        return accel__seterr(NULL, ACCEL_ENOMEM, "loader: out of memory for workers");
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work_cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    for (int i = 0; i < n; i++) {
        worker_arg *a = &args_of(w)[i];
        a->w = w;
        a->i = i;
        if (pthread_create(&w->th[i], NULL, worker_main, a) != 0) {
            accel__workers_free(w);
            return accel__seterr(NULL, ACCEL_ENOMEM, "loader: cannot start worker thread %d", i);
        }
        w->started = i + 1;
    }
    *out = w;
    return ACCEL_OK;
}

void accel__workers_free(accel__workers *w)
{
    if (w == NULL) {
        return;
    }
    if (w->th != NULL && w->samples != NULL && w->n_samples != NULL) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->work_cv);
        pthread_mutex_unlock(&w->mu);
        for (int i = 0; i < w->started; i++) {
            pthread_join(w->th[i], NULL);
        }
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->work_cv);
        pthread_cond_destroy(&w->done_cv);
        for (int i = 0; i < w->n; i++) {
            accel__samples_free(w->samples[i], w->n_samples[i]);
            accel__free(w->samples[i]);
        }
    }
    accel__free(w->th);
    accel__free(w->samples);
    accel__free(w->n_samples);
    accel__free(w);
}

void accel__workers_start(accel__workers *w, int64_t k0, int64_t n)
{
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->l->n_slots; i++) {
        w->l->slots[i].ready = -1;
    }
    w->next_job = k0;
    w->released = k0;
    w->n_jobs = n;
    pthread_cond_broadcast(&w->work_cv);
    pthread_mutex_unlock(&w->mu);
}

accel__slot *accel__workers_get(accel__workers *w, int64_t k)
{
    accel__slot *slot = &w->l->slots[k % w->l->n_slots];
    pthread_mutex_lock(&w->mu);
    if (k > w->released) {
        w->released = k; /* the batch handed out before is no longer in use */
        pthread_cond_broadcast(&w->work_cv);
    }
    while (slot->ready != k) {
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return slot;
}

void accel__workers_stop(accel__workers *w)
{
    pthread_mutex_lock(&w->mu);
    w->n_jobs = w->next_job;
    while (w->busy > 0) {
        pthread_cond_wait(&w->done_cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}
