/*
 * Helper for the dead-peer tests: allreduces in a loop, checking every result, with one rank
 * optionally killing (--die-rank R --die-after K: raise(SIGKILL) after K iterations) or stopping
 * (--stop-rank R, same --die-after) itself. On failure prints the status name and
 * accel_last_error to stderr and exits 1. Run under `accel launch` or with RANK/WORLD_SIZE set.
 *
 * --async 1 issues each allreduce as a work handle and waits on it (the failure then travels from
 * the communication thread to the waiter). After a failure it also checks that the next call
 * fails at once with the same status (the communicator is broken), exiting 3 if not.
 *
 * --symmetric 1 allocates the buffer with accel_alloc_shared, so (with ACCEL_SHM_ZEROCOPY_NBYTES
 * below its size) every allreduce runs zero-copy, reading peers' buffers directly.
 *
 * --exit-rank R (with --die-after K, --exit-code C): that rank calls exit(C) instead, without
 * accel_free. --salt S adds S to every input, so jobs with different salts expect different
 * sums (two jobs that cross-pair get wrong ones). --bcast-root R: each iteration broadcasts
 * process R's buffer instead (hier: the root's local rank receives across, then its machine
 * inside; so a stopped root leaves its machine's other processes waiting across and the other
 * machines' waiting inside on a live process). --sync-dir D --sync-count K: after accel_init,
 * successful or not, create D/<pid> and wait (at most 60 s) until D holds K entries, so that
 * every process of several jobs has finished its setup before any computes.
 *
 *   allreduce_loop [--iters N] [--count N] [--die-rank R] [--stop-rank R] [--die-after K]
 *                  [--exit-rank R] [--exit-code C] [--async 0|1] [--symmetric 0|1]
 *                  [--salt S] [--bcast-root R] [--sync-dir D --sync-count K]
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"

/* Entries in dir (not . and ..). */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        n += e->d_name[0] != '.';
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

static void sync_point(const char *dir, int want)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%ld", dir, (long)getpid());
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
    }
    for (int i = 0; i < 60000 && count_entries(dir) < want; i++) {
        usleep(1000);
    }
}

int main(int argc, char **argv)
{
    long iters = 100, count = 1024, die_after = 10;
    int die_rank = -1, stop_rank = -1, exit_rank = -1, exit_code = 0, async = 0, symmetric = 0;
    int sync_count = 0, bcast_root = -1;
    float salt = 0;
    const char *sync_dir = NULL;
    for (int i = 1; i < argc; i += 2) { /* every flag takes one value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "allreduce_loop: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--iters") == 0) {
            iters = atol(v);
        } else if (strcmp(a, "--count") == 0) {
            count = atol(v);
        } else if (strcmp(a, "--die-rank") == 0) {
            die_rank = atoi(v);
        } else if (strcmp(a, "--stop-rank") == 0) {
            stop_rank = atoi(v);
        } else if (strcmp(a, "--symmetric") == 0) {
            symmetric = atoi(v);
        } else if (strcmp(a, "--async") == 0) {
            async = atoi(v);
        } else if (strcmp(a, "--die-after") == 0) {
            die_after = atol(v);
        } else if (strcmp(a, "--exit-rank") == 0) {
            exit_rank = atoi(v);
        } else if (strcmp(a, "--exit-code") == 0) {
            exit_code = atoi(v);
        } else if (strcmp(a, "--salt") == 0) {
            salt = (float)atof(v);
        } else if (strcmp(a, "--bcast-root") == 0) {
            bcast_root = atoi(v);
        } else if (strcmp(a, "--sync-dir") == 0) {
            sync_dir = v;
        } else if (strcmp(a, "--sync-count") == 0) {
            sync_count = atoi(v);
        } else {
            fprintf(stderr, "allreduce_loop: unknown argument %s\n", a);
            return 2;
        }
    }
    accel *acc;
    accel_status st = accel_init(&acc, NULL);
    if (st != ACCEL_OK) {
        fprintf(stderr, "allreduce_loop: accel_init: %s: %s\n", accel_status_name(st),
                accel_last_error(NULL));
    }
    if (sync_dir != NULL) {
        sync_point(sync_dir, sync_count);
    }
    if (st != ACCEL_OK) {
        return 1;
    }
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    size_t nbytes = (size_t)(count > 0 ? count : 1) * sizeof(float);
    float *buf = NULL;
    if (symmetric) {
        void *p = NULL;
        st = accel_alloc_shared(acc, nbytes, &p);
        if (st != ACCEL_OK) {
            fprintf(stderr, "allreduce_loop: accel_alloc_shared: %s: %s\n", accel_status_name(st),
                    accel_last_error(acc));
            return 1;
        }
        buf = p;
    } else {
        buf = malloc(nbytes);
    }
    if (buf == NULL) {
        return 1;
    }
    for (long it = 0; it < iters; it++) {
        if (it == die_after && rank == die_rank) {
            raise(SIGKILL);
        }
        if (it == die_after && rank == stop_rank) {
            raise(SIGSTOP);
        }
        if (it == die_after && rank == exit_rank) {
            exit(exit_code);
        }
        for (long i = 0; i < count; i++) {
            buf[i] = (float)(rank + 1) + (float)(i % 7) + salt;
        }
        if (bcast_root >= 0) {
            st = accel_broadcast(acc, buf, buf, (size_t)count, ACCEL_F32, bcast_root, NULL);
        } else if (async) {
            accel_work *w = NULL;
            st = accel_allreduce(acc, buf, buf, (size_t)count, ACCEL_F32, ACCEL_SUM, &w);
            if (st == ACCEL_OK) {
                st = accel_work_wait(w); /* the message arrives on this thread */
            }
            accel_work_free(w);
        } else {
            st = accel_allreduce(acc, buf, buf, (size_t)count, ACCEL_F32, ACCEL_SUM, NULL);
        }
        if (st != ACCEL_OK) {
            /* accel_work_wait reports on the thread (accel_last_error(NULL)). */
            fprintf(stderr, "allreduce_loop: rank %d: %s failed at iteration %ld: %s: %s\n", rank,
                    bcast_root >= 0 ? "broadcast" : "allreduce", it, accel_status_name(st),
                    accel_last_error(async ? NULL : acc));
            accel_status again = accel_barrier(acc, NULL);
            if (again != st) {
                fprintf(stderr, "allreduce_loop: rank %d: the next call returned %s, not %s\n",
                        rank, accel_status_name(again), accel_status_name(st));
                return 3;
            }
            if (!symmetric) {
                free(buf);
            }
            accel_free(acc); /* frees a symmetric buffer */
            return 1;
        }
        for (long i = 0; i < count; i++) {
            float want = (float)(n * (n + 1) / 2) + (float)n * ((float)(i % 7) + salt);
            if (bcast_root >= 0) {
                want = (float)(bcast_root + 1) + (float)(i % 7) + salt;
            }
            if (buf[i] != want) {
                fprintf(stderr, "allreduce_loop: rank %d: wrong result at iteration %ld\n", rank,
                        it);
                return 1;
            }
        }
    }
    printf("allreduce_loop: rank %d: %ld allreduces ok\n", rank, iters);
    if (symmetric) {
        accel_free_shared(acc, buf);
    } else {
        free(buf);
    }
    accel_free(acc);
    return 0;
}
