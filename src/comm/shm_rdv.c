/*
 * The shm backend's rendezvous through the job's store (store.h), for processes started without
 * accel launch (no ACCEL_JOB_ID): process 0 serves the store on MASTER_ADDR:MASTER_PORT and
 * publishes "<process count> <fresh random nonce>"; the nonce names the segment, so its name is
 * new and unguessable for every job. Keys (under "shm/<k>/", k counting this process's
 * rendezvous, so a program that creates several communicators never reads an older one's):
 *   job      process 0: "<n> <nonce>"
 *   rank/<r> counter: the process that gets 1 is rank r; anyone else is a second job's process
 *   clash    "<rank> <pid>" from such a second claimant: process 0's hook aborts the job
 *   created  process 0: "" when the segment exists, else why not
 *   done     "ok" from the last process to attach (which removed the name), or a failure
 * Two jobs started by hand on one port cannot be told apart by anything but that port: the
 * second process 0 cannot serve it (a clear error), and its other processes reach the first
 * job's store, where each rank is claimed twice. The second claimant of a rank cannot know
 * which of the two is the impostor, so it stops the job that has the rank too: both jobs fail
 * with a message naming the address, and neither computes with the other's processes. A process
 * 0 whose setup failed leaves its store serving until it exits (accel__store_abandon): the
 * others still read why. After a clash, process 0 (failing in its setup or later) keeps the port
 * CLASH_LINGER_S more before it closes the store, so that the other job's process 0, if it
 * comes meanwhile, fails at once and cannot take the port over.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "shm.h"
#include "store.h"

/* How long a process 0 that failed because two jobs met at its store (a clash) keeps the port:
 * a process 0 of the other job that comes meanwhile cannot serve there and fails at once,
 * where once the port is free it would take it and wait its ACCEL_TIMEOUT for processes that
 * are gone. Processes started together come within this of each other. */
#define CLASH_LINGER_S 3.0

static _Atomic unsigned n_rendezvous;

/* The key `what` of this rendezvous (the callers' buffers always fit it). */
static void key_of(const accel__shm *s, const char *what, char *out, size_t nbytes)
{
    size_t a = strlen(s->rdv_key), b = strlen(what);
    ACCEL_ASSERT(a + b < nbytes);
    memcpy(out, s->rdv_key, a);
    memcpy(out + a, what, b + 1);
}

static double left_s(double deadline)
{
    double t = deadline - accel__now();
    return t > 0 ? t : 0;
}

/* The store's hook, on the server thread in process 0: a second claimant of a rank. */
static void on_store_set(void *arg, const char *key, const void *value, size_t nbytes)
{
    accel__shm *s = arg;
    size_t plen = strlen(s->rdv_key);
    char v[48];
    int rank, pid;
    if (strncmp(key, s->rdv_key, plen) != 0 || strcmp(key + plen, "clash") != 0 ||
        nbytes >= sizeof(v)) {
        return;
    }
    memcpy(v, value, nbytes);
    v[nbytes] = '\0';
    if (sscanf(v, "%d %d", &rank, &pid) != 2 || rank < 0 || rank >= s->n_ranks) {
        return;
    }
    /* Either the setup sees the clash word after mapping, or we see the mapping (seq_cst). */
    atomic_store_explicit(&s->clash, (uint64_t)(uint32_t)rank << 32 | (uint32_t)pid,
                          memory_order_seq_cst);
    if (atomic_load_explicit(&s->hdr_ready, memory_order_seq_cst)) {
        accel__shm_abort(s, ACCEL__SHM_CLASH, rank, pid);
    }
}

/* A rank claimed twice: report it where process 0's hook sees it, and fail. */
static accel_status clash(accel__shm *s)
{
    char k[64], v[48];
    key_of(s, "clash", k, sizeof(k));
    snprintf(v, sizeof(v), "%d %d", s->rank, (int)getpid());
    /* Best effort, as the other failure records: we fail either way, and a process 0 stopped
     * since it answered the claim costs ACCEL__STORE_RECORD_S, not a store timeout. */
    accel__store_bound(s->store, accel__now() + ACCEL__STORE_RECORD_S);
    accel__store_set(s->store, k, v, strlen(v));
    accel__store_bound(s->store, 0);
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "shm: rank %d of the job at %s was already taken by another process: "
                         "two jobs use the same MASTER_ADDR and MASTER_PORT, and both stop "
                         "(give each job its own MASTER_PORT, or start it with accel launch)",
                         s->rank, s->rdv);
}

accel_status accel__shm_rdv_begin(accel__shm *s, const accel__comm_config *cfg, char *key,
                                  size_t key_nbytes, double deadline)
{
    snprintf(s->rdv_key, sizeof(s->rdv_key), "shm/%u/",
             atomic_fetch_add_explicit(&n_rendezvous, 1, memory_order_relaxed) + 1);
    snprintf(s->rdv, sizeof(s->rdv), "%s:%d", cfg->master_addr, cfg->master_port);
    if (cfg->master_port == 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "shm: MASTER_PORT=0, but processes started without accel launch "
                             "meet at one agreed port: give them all the same MASTER_PORT (or "
                             "the same random ACCEL_JOB_ID)");
    }
    accel__store_config sc = {.addr = cfg->master_addr,
                              .port = cfg->master_port,
                              .serve = cfg->rank == 0,
                              .timeout_s = s->timeout_s,
                              .configured_s = s->timeout_s, /* the loop below passes what is left */
                              .on_set = on_store_set,
                              .hook_arg = s};
    char k[64], v[64];
    key_of(s, "job", k, sizeof(k));
    if (cfg->rank == 0) {
        ACCEL_TRY(accel__store_open(&s->store, &sc));
        ACCEL_TRY(accel__shm_nonce(key, key_nbytes));
        snprintf(v, sizeof(v), "%d %s", s->n_ranks, key);
        return accel__store_set(s->store, k, v, strlen(v));
    }
    size_t n = 0;
    for (;;) {
        sc.timeout_s = left_s(deadline) > 1e-3 ? left_s(deadline) : 1e-3;
        ACCEL_TRY(accel__store_open(&s->store, &sc));
        accel_status st = accel__store_get(s->store, k, v, sizeof(v) - 1, &n, left_s(deadline));
        if (st == ACCEL_OK) {
            break;
        }
        const int answered = st == ACCEL_ETIMEDOUT && accel__store_broken(s->store) == ACCEL_OK;
        accel__store_close(s->store);
        s->store = NULL;
        if (answered) {
            /* The store answers, but its process 0 never began this rendezvous (the store's
             * message would name a key and what was left of the timeout). */
            return accel__seterr(NULL, st,
                                 "shm: process 0 did not begin the job's rendezvous within %g s "
                                 "(the job met at %s; its store answers, but process 0 is stuck "
                                 "before this communicator, creates fewer of them than this "
                                 "process, or the store is another program's)",
                                 s->timeout_s, s->rdv);
        }
        /* A server that went away before answering belonged to this process 0's previous
         * communicator (it freed it meanwhile): the next one comes up on the same port. */
        if (st != ACCEL_EPEER || left_s(deadline) <= 0) {
            return st;
        }
    }
    v[n] = '\0';
    int job_n = 0;
    char nonce[48];
    if (sscanf(v, "%d %40s", &job_n, nonce) != 2 || strlen(nonce) + 1 > key_nbytes) {
        return accel__seterr(NULL, ACCEL_EIO, "shm: malformed job record \"%s\" in the store at %s",
                             v, s->rdv);
    }
    if (job_n != s->n_ranks) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "shm: the job at %s has %d processes, but this process was started "
                             "with %d (another job uses this MASTER_PORT, or WORLD_SIZE differs "
                             "between processes)",
                             s->rdv, job_n, s->n_ranks);
    }
    snprintf(key, key_nbytes, "%s", nonce);
    char rk[64];
    snprintf(rk, sizeof(rk), "rank/%d", s->rank);
    key_of(s, rk, k, sizeof(k));
    int64_t claims = 0;
    ACCEL_TRY(accel__store_add(s->store, k, 1, &claims));
    return claims == 1 ? ACCEL_OK : clash(s);
}

accel_status accel__shm_rdv_created(accel__shm *s, accel_status st, double deadline)
{
    char k[64];
    key_of(s, "created", k, sizeof(k));
    if (s->rank == 0) {
        if (st != ACCEL_OK) {
            return st; /* accel__shm_rdv_fail tells the others */
        }
        return accel__store_set(s->store, k, "", 0);
    }
    char why[ACCEL__ERRMSG_NBYTES];
    size_t n = 0;
    st = accel__store_get(s->store, k, why, sizeof(why) - 1, &n, left_s(deadline));
    if (st == ACCEL_ETIMEDOUT && accel__store_broken(s->store) == ACCEL_OK) {
        return accel__seterr(NULL, st,
                             "shm: process 0 did not create the segment within %g s (the job met "
                             "at %s; its store answers: process 0 is stuck in its setup)",
                             s->timeout_s, s->rdv);
    }
    ACCEL_TRY(st);
    if (n > 0) {
        why[n] = '\0';
        return accel__seterr(NULL, ACCEL_EPEER, "shm: process 0 could not create the segment: %s",
                             why);
    }
    return ACCEL_OK;
}

accel_status accel__shm_rdv_attached(accel__shm *s, int last, double deadline)
{
    char k[64], v[ACCEL__ERRMSG_NBYTES];
    uint64_t c = atomic_load_explicit(&s->clash, memory_order_seq_cst);
    if (c != 0) { /* reported to the hook before this process had mapped the segment */
        accel__shm_abort(s, ACCEL__SHM_CLASH, (int)(c >> 32), (int)(uint32_t)c);
    }
    ACCEL_TRY(accel__shm_check_abort(s));
    key_of(s, "done", k, sizeof(k));
    if (last) {
        ACCEL_TRY(accel__store_set(s->store, k, "ok", 2));
    }
    size_t n = 0;
    accel_status st = accel__store_get(s->store, k, v, sizeof(v) - 1, &n, left_s(deadline));
    if (st == ACCEL_ETIMEDOUT && accel__store_broken(s->store) == ACCEL_OK) {
        /* The store answered: a process never came (the store's message would name a key and
         * what was left of the timeout). */
        return accel__seterr(NULL, st,
                             "shm: only %d of %d processes attached to %s within %g s (the job "
                             "met at %s)",
                             (int)atomic_load(&s->hdr->attached), s->n_ranks, s->name, s->timeout_s,
                             s->rdv);
    }
    ACCEL_TRY(st);
    v[n] = '\0';
    if (strcmp(v, "ok") != 0) {
        return accel__seterr(NULL, ACCEL_EPEER, "shm: setup failed on another process: %s", v);
    }
    return ACCEL_OK;
}

accel_status accel__shm_rdv_fail(accel__shm *s, accel_status st)
{
    if (s->store == NULL) {
        return st;
    }
    /* Values fit the readers' buffers (ACCEL__ERRMSG_NBYTES): long messages are cut. */
    char msg[ACCEL__ERRMSG_NBYTES], v[ACCEL__ERRMSG_NBYTES - 1], k[64];
    size_t n = 0;
    snprintf(msg, sizeof(msg), "%s", accel_last_error(NULL)); /* before the store calls */
    /* Best effort: a stopped process 0 (its store answers nothing) costs this, not a store
     * timeout per request. */
    accel__store_bound(s->store, accel__now() + ACCEL__STORE_RECORD_S);
    key_of(s, "done", k, sizeof(k));
    if (accel__store_get(s->store, k, v, sizeof(v) - 1, &n, 0) == ACCEL_OK &&
        !(n == 2 && memcmp(v, "ok", 2) == 0)) {
        /* Another process failed first: its reason is the cause (ours, e.g. a segment it
         * removed on failing, only a consequence). */
        v[n] = '\0';
        accel__store_bound(s->store, 0);
        return accel__seterr(NULL, ACCEL_EPEER, "shm: setup failed on another process: %s", v);
    }
    if (snprintf(v, sizeof(v), "process %d: %s", s->rank, msg) >= (int)sizeof(v)) {
        v[sizeof(v) - 2] = '.'; /* mark the cut */
    }
    if (s->rank == 0) {
        key_of(s, "created", k, sizeof(k)); /* for those still waiting for the segment */
        accel__store_set(s->store, k, v, strlen(v));
        key_of(s, "done", k, sizeof(k));
    }
    accel__store_set(s->store, k, v, strlen(v));
    /* A clash's close (accel__shm_rdv_close) still records its cause there. */
    accel__store_bound(s->store, 0);
    return accel__seterr(NULL, st, "%s", msg); /* the store calls may have replaced it */
}

void accel__shm_rdv_close(accel__shm *s, int setup_failed)
{
    if (s->store == NULL) {
        return;
    }
    char why[ACCEL__ERRMSG_NBYTES] = "";
    uint64_t w = 0;
    if (setup_failed) {
        snprintf(why, sizeof(why), "%s", accel_last_error(NULL)); /* the setup's failure */
    } else if (s->hdr != NULL) {
        accel__shm_abort_text(s, why, sizeof(why)); /* "" for a job that ends normally */
    }
    if (s->hdr != NULL) {
        w = atomic_load_explicit(&s->hdr->abort_word, memory_order_acquire);
    }
    if (atomic_load_explicit(&s->clash, memory_order_seq_cst) != 0 ||
        (w & 0xff) == ACCEL__SHM_CLASH) {
        double linger_s = s->timeout_s < CLASH_LINGER_S ? s->timeout_s : CLASH_LINGER_S;
        accel__log(&s->log, ACCEL__LOG_INFO,
                   "shm: keeping %s taken for %g s, so that a process of the other job that "
                   "comes meanwhile fails at once",
                   s->rdv, linger_s);
        accel__store_close_failed(s->store, why, linger_s);
    } else if (setup_failed) {
        accel__store_abandon(s->store); /* the others read the failure published there */
    } else {
        accel__store_close_failed(s->store, why, 0);
    }
    s->store = NULL;
}

void accel__shm_rdv_end(accel__shm *s)
{
    if (s->rank != 0) {
        accel__store_close(s->store);
        s->store = NULL;
    }
}
