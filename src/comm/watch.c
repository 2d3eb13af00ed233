/*
 * The liveness watch (watch.h): one thread per process beating through its own store client
 * and waiting for the job's "lost" key there, a period at a time (a get parked at the server,
 * answered at once when the key is set: two round trips per period), and looking at the
 * members' operation counts between the waits. The last beat's answer (who is silent) is kept
 * for the messages of stalls.
 *
 * Invariants: members are added, removed and failed under mu, and each is failed at most once;
 * the owner's client (presence) is used only by the owner's thread (start, the last leave); the
 * thread's client (poll) only by the thread, except accel__store_interrupt at the end. A store
 * error the thread sees after the stop request is the stop, not a failure. The beat's answer
 * and store_due are under beat_mu, which is taken inside mu, never around it.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"
#include "watch.h"

typedef struct peer {
    int process;
    _Atomic int pid; /* 0 until known (start is written first) */
    uint64_t start;
    int local; /* same machine (same boot and pid namespace) */
} peer;

struct accel__watch {
    accel__watch_config cfg; /* strings point into the copies below */
    char what[32], prefix[400], addr[256];
    char lost_key[420];
    char host_id[128], hostname[64];
    accel__store *presence, *poll;
    int first_beat_ok; /* the beat accel__watch_start made: the thread polls the store */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    accel__watch_member *members;
    _Atomic int failed; /* a loss was seen: every member failed */
    peer *peers;        /* this machine's other processes, and process 0 */
    int n_peers;
    char beat_name[ACCEL__STORE_BEAT_NAME_MAX + 1]; /* "process R (pid P) on host H" */
    double silent_s;                                /* a process not heard for longer is named */
    pthread_mutex_t beat_mu;
    accel__store_silent silent[ACCEL__STORE_SILENT_MAX]; /* the last beat's answer */
    int n_silent;
    uint64_t beat_count;        /* the count the last beat carried */
    accel__watch_member *world; /* the oldest member (the world communicator): its count beats */
    int slow;         /* the thread's: a member has waited more than silent_s (ask who is behind) */
    double store_due; /* when the answer of the thread's store call in progress was due; 0: none */
};

/* "<boot id>/<pid namespace>": equal for processes whose pids mean the same thing. */
static void host_id(char *buf, size_t nbytes)
{
    char boot[64] = "?", ns[64] = "?";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) != NULL) {
            boot[strcspn(boot, "\n")] = '\0';
        }
        fclose(f);
    }
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 1] = '\0';
    snprintf(buf, nbytes, "%s/%s", boot, ns);
}

static void key_of(const accel__watch *w, char *buf, size_t nbytes, const char *kind, int process)
{
    snprintf(buf, nbytes, "%s/%s/%d", w->prefix, kind, process);
}

/* ---- failing members (the thread) ---- */

static void fail_all(accel__watch *w, accel_status st, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    if (!w->stop && !atomic_exchange(&w->failed, 1)) {
        accel__log(&w->cfg.log, ACCEL__LOG_ERROR, "%s", msg);
        for (accel__watch_member *m = w->members; m != NULL; m = m->next) {
            if (!m->failed) {
                m->failed = 1;
                m->fail(m->arg, st, msg);
            }
        }
    }
    pthread_mutex_unlock(&w->mu);
}

static int stopping(accel__watch *w)
{
    pthread_mutex_lock(&w->mu);
    int stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

/* Who serves the store, for messages: "process 0 (pid 123)" or "machine 0's accel launch". */
static void store_server_name(const accel__watch *w, char *buf, size_t nbytes)
{
    int pid0 = 0;
    for (int i = 0; i < w->n_peers; i++) {
        pid0 = w->peers[i].process == 0 ? atomic_load(&w->peers[i].pid) : pid0;
    }
    if (w->cfg.launcher_serves) {
        snprintf(buf, nbytes, "machine 0's accel launch");
    } else if (pid0 > 0) {
        snprintf(buf, nbytes, "process 0 (pid %d)", pid0);
    } else {
        snprintf(buf, nbytes, "process 0");
    }
}

/* The thread's store call failed with st (the client is broken): the store's server is gone or
 * stopped, which every member learns (or, for another error, the watch stops polling). */
static void store_failed(accel__watch *w, accel_status st)
{
    if (stopping(w)) {
        return;
    }
    if (st == ACCEL_EPEER || st == ACCEL_ETIMEDOUT) {
        char who[96], msg[ACCEL__ERRMSG_NBYTES];
        store_server_name(w, who, sizeof(who));
        snprintf(msg, sizeof(msg),
                 "%s: the job's store at %s, served by %s, %s; process %d cannot continue", w->what,
                 accel__store_name(w->poll), who,
                 st == ACCEL_EPEER ? "closed the connection: its server exited or died, or its "
                                     "machine is unreachable"
                                   : "did not answer in time: its server is stopped or hung",
                 w->cfg.process);
        fail_all(w, st, msg);
    } else {
        accel__log(&w->cfg.log, ACCEL__LOG_WARN,
                   "%s: the liveness watch stops polling the store: %s", w->what,
                   accel_last_error(NULL));
    }
}

static void set_store_due(accel__watch *w, double due)
{
    pthread_mutex_lock(&w->beat_mu);
    w->store_due = due;
    pthread_mutex_unlock(&w->beat_mu);
}

/* Beats, and keeps the answer (who is silent). Returns 0 to go on polling, 1 when the store is
 * no use any more. The answer may take the timeout (a loaded server), as the gets' may. */
static int beat(accel__watch *w)
{
    accel__store_silent silent[ACCEL__STORE_SILENT_MAX];
    int n = 0;
    pthread_mutex_lock(&w->mu);
    uint64_t count = w->world != NULL ? atomic_load(&w->world->posted) : 0;
    pthread_mutex_unlock(&w->mu);
    set_store_due(w, accel__now());
    accel_status st =
        accel__store_beat(w->poll, w->cfg.process, w->beat_name, count, w->slow, w->silent_s,
                          w->cfg.timeout_s, silent, ACCEL__STORE_SILENT_MAX, &n);
    pthread_mutex_lock(&w->beat_mu);
    w->store_due = 0;
    if (st == ACCEL_OK) {
        memcpy(w->silent, silent, (size_t)n * sizeof(silent[0]));
        w->n_silent = n;
        w->beat_count = count;
    }
    pthread_mutex_unlock(&w->beat_mu);
    if (st != ACCEL_OK) {
        store_failed(w, st);
        return 1;
    }
    return 0;
}

/* Waits up to a period for the lost key (the server answers at once when it is set). Returns 0
 * to go on polling, 1 when the store is no use any more. */
static int poll_lost(accel__watch *w)
{
    char value[256], msg[ACCEL__ERRMSG_NBYTES];
    size_t n = 0;
    set_store_due(w, accel__now() + w->cfg.period_s);
    accel_status st =
        accel__store_get(w->poll, w->lost_key, value, sizeof(value) - 1, &n, w->cfg.period_s);
    set_store_due(w, 0);
    if (st == ACCEL_ETIMEDOUT && accel__store_broken(w->poll) == ACCEL_OK) {
        return 0; /* not set within the period: nobody was lost */
    }
    if (st != ACCEL_OK) {
        store_failed(w, st);
    } else if (!stopping(w)) {
        value[n] = '\0';
        snprintf(msg, sizeof(msg),
                 "%s: %s exited or died (its connection to the job's store at %s ended without "
                 "leaving the communicator); process %d cannot continue",
                 w->what, value, accel__store_name(w->poll), w->cfg.process);
        fail_all(w, ACCEL_EPEER, msg);
    }
    return 1;
}

/* Reads the identities of the peers still unknown (published at their start). */
static void fetch_peers(accel__watch *w)
{
    for (int i = 0; i < w->n_peers; i++) {
        peer *p = &w->peers[i];
        if (atomic_load(&p->pid) != 0) {
            continue;
        }
        char key[440], value[256], id[128] = "";
        size_t n = 0;
        key_of(w, key, sizeof(key), "who", p->process);
        if (accel__store_get(w->poll, key, value, sizeof(value) - 1, &n, 0) != ACCEL_OK) {
            continue;
        }
        value[n] = '\0';
        int pid = 0;
        unsigned long long start = 0;
        if (sscanf(value, "%d %llu %127s", &pid, &start, id) == 3 && pid > 0) {
            p->start = start;
            p->local = strcmp(id, w->host_id) == 0;
            atomic_store(&p->pid, pid);
        }
    }
}

/* Counts the members stalled (operations in flight, none completed for the timeout); with
 * act, fails them with a message naming the suspects. Notes in w->slow whether one has waited
 * for more than silent_s (the beats then ask who is behind). */
static int check_stalls(accel__watch *w, int act)
{
    double now = accel__now();
    int stalled = 0;
    w->slow = 0;
    pthread_mutex_lock(&w->mu);
    for (accel__watch_member *m = w->members; m != NULL && !w->stop; m = m->next) {
        if (m->progress != NULL && !m->failed) {
            m->progress(m->arg); /* operations complete but not tested yet are done */
        }
        uint64_t posted = atomic_load_explicit(&m->posted, memory_order_relaxed);
        uint64_t done = atomic_load_explicit(&m->done, memory_order_relaxed);
        if (posted != m->seen_posted || done != m->seen_done) {
            m->seen_posted = posted;
            m->seen_done = done;
            m->moved_at = now;
            continue;
        }
        double waited = done < posted && !m->failed ? now - m->moved_at : 0;
        w->slow |= waited > w->silent_s;
        if (waited > m->timeout_s && !act) {
            stalled++;
        } else if (waited > m->timeout_s) {
            char msg[ACCEL__ERRMSG_NBYTES];
            int len = snprintf(msg, sizeof(msg),
                               "%s: process %d of %d: a collective made no progress for %.3g s "
                               "(a peer is dead, stopped, stuck or at another call)",
                               w->what, w->cfg.process, w->cfg.n_processes, m->timeout_s);
            accel__watch_suspects(w, msg + len, sizeof(msg) - (size_t)len);
            accel__log(&w->cfg.log, ACCEL__LOG_ERROR, "%s", msg);
            m->failed = 1;
            m->fail(m->arg, ACCEL_ETIMEDOUT, msg);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return stalled;
}

static void *watch_main(void *arg)
{
    accel__watch *w = arg;
    int polling = w->first_beat_ok;
    for (;;) {
        if (polling) {
            polling = !beat(w);
        }
        if (polling) {
            fetch_peers(w); /* first: a loss of process 0 names its pid */
        }
        if (polling && !atomic_load(&w->failed)) {
            polling = !poll_lost(w);
        }
        if (check_stalls(w, 0) > 0 && polling) {
            polling = !beat(w); /* the message names who is silent now */
        }
        check_stalls(w, 1);
        pthread_mutex_lock(&w->mu);
        if (!w->stop && !polling) { /* else the get above waited the period */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts); /* the condition variable's default clock */
            long ns = ts.tv_nsec + (long)(w->cfg.period_s * 1e9);
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        int stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop) {
            return NULL;
        }
    }
}

/* ---- the owner's side ---- */

void accel__watch_suspects(accel__watch *w, char *buf, size_t nbytes)
{
    if (w == NULL) {
        return; /* one process: nobody else to name */
    }
    size_t len = strlen(buf);
    int named = 0, known = 0, seen[ACCEL__STORE_SILENT_MAX + 1];
    for (int i = 0; i < w->n_peers && len + 100 < nbytes; i++) {
        const peer *p = &w->peers[i];
        int pid = atomic_load(&p->pid);
        if (pid <= 0 || !p->local) {
            continue;
        }
        known++;
        const char *state = accel__shm_pid_gone(pid, p->start) ? "died"
                            : accel__shm_pid_stopped(pid) ? "is stopped (SIGSTOP or a debugger)"
                                                          : NULL;
        if (state != NULL && named <= ACCEL__STORE_SILENT_MAX) {
            len += (size_t)snprintf(buf + len, nbytes - len, "; process %d (pid %d) %s", p->process,
                                    pid, state);
            seen[named++] = p->process;
        }
    }
    /* The heartbeats: every machine's silent processes, and the store's own silence. */
    int heard = 0;
    pthread_mutex_lock(&w->beat_mu);
    for (int i = 0; i < w->n_silent && len + 100 < nbytes; i++) {
        const accel__store_silent *q = &w->silent[i];
        int dup = q->id == w->cfg.process;
        for (int k = 0; k < named && !dup; k++) {
            dup = seen[k] == q->id; /* /proc said more */
        }
        if (!dup && q->silent_s > w->silent_s) {
            len += (size_t)snprintf(buf + len, nbytes - len,
                                    "; %s: no heartbeat for %.3g s (stopped or hung?)", q->name,
                                    q->silent_s);
            heard++;
        } else if (!dup && q->count < w->beat_count) {
            len += (size_t)snprintf(buf + len, nbytes - len,
                                    "; %s is behind: %llu operations posted on the job's first "
                                    "communicator, %llu here (busy, hung or at another call?)",
                                    q->name, (unsigned long long)q->count,
                                    (unsigned long long)w->beat_count);
            heard++;
        }
    }
    double late = w->store_due > 0 ? accel__now() - w->store_due : 0;
    pthread_mutex_unlock(&w->beat_mu);
    if (late > w->silent_s && len + 100 < nbytes) {
        char who[96];
        store_server_name(w, who, sizeof(who));
        len += (size_t)snprintf(buf + len, nbytes - len,
                                "; the job's store at %s, served by %s, has not answered for "
                                "%.3g s (stopped or hung?)",
                                accel__store_name(w->poll), who, late);
        heard++;
    }
    if (named + heard == 0 && len + 100 < nbytes) {
        snprintf(buf + len, nbytes - len,
                 "; none of the %d other processes known on this machine is dead or stopped, "
                 "and every process beat within %.3g s",
                 known, w->silent_s);
    }
}

void accel__watch_join(accel__watch *w, accel__watch_member *m)
{
    pthread_mutex_lock(&w->mu);
    m->seen_posted = m->seen_done = 0;
    m->moved_at = accel__now();
    m->failed = 0;
    m->next = w->members;
    w->members = m;
    w->world = w->world != NULL ? w->world : m;
    pthread_mutex_unlock(&w->mu);
}

static void watch_free(accel__watch *w)
{
    accel__store_close(w->poll);
    accel__store_close(w->presence);
    accel__free(w->peers);
    pthread_mutex_destroy(&w->beat_mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    accel__free(w);
}

/* Process 0 serving the store: waits until every other process has left (or one is lost, or the
 * timeout passes), so that the store does not go away under them. */
static void wait_departures(accel__watch *w)
{
    int n = w->cfg.n_processes - 1;
    char(*names)[440] = accel__malloc((size_t)n * sizeof(*names) + 1);
    const char **list = accel__malloc((size_t)n * sizeof(*list) + 1);
    if (names == NULL || list == NULL) {
        accel__free(names);
        accel__free(list);
        return;
    }
    for (int i = 0, q = 0; q < w->cfg.n_processes; q++) {
        if (q != w->cfg.process) {
            key_of(w, names[i], sizeof(names[i]), "left", q);
            list[i] = names[i];
            i++;
        }
    }
    double deadline = accel__now() + w->cfg.timeout_s;
    for (int round = 0; !atomic_load(&w->failed) && accel__now() < deadline; round++) {
        accel_status st = accel__store_wait(w->presence, list, (size_t)n, w->cfg.period_s);
        if (st != ACCEL_ETIMEDOUT) {
            break;
        }
        if (round == 4) {
            accel__log(&w->cfg.log, ACCEL__LOG_INFO,
                       "%s: process 0 serves the job's store and waits (at most %g s) for the "
                       "other processes to leave their communicators: %s",
                       w->what, w->cfg.timeout_s, accel_last_error(NULL));
        }
    }
    accel__free(names);
    accel__free(list);
}

void accel__watch_leave(accel__watch *w, accel__watch_member *m)
{
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    for (accel__watch_member **p = &w->members; *p != NULL; p = &(*p)->next) {
        if (*p == m) {
            *p = m->next;
            break;
        }
    }
    if (w->world == m) { /* the next oldest counts */
        w->world = w->members;
        while (w->world != NULL && w->world->next != NULL) {
            w->world = w->world->next;
        }
    }
    int last = w->members == NULL;
    pthread_mutex_unlock(&w->mu);
    if (!last) {
        return;
    }
    if (w->cfg.serves) {
        wait_departures(w);
    } else {
        char key[440];
        key_of(w, key, sizeof(key), "left", w->cfg.process);
        (void)accel__store_set(w->presence, key, "", 0);
    }
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    accel__store_interrupt(w->poll); /* a get waiting on a stopped server */
    pthread_join(w->thread, NULL);
    if (!w->cfg.serves) {
        (void)accel__store_depart(w->presence); /* closing now is no loss */
    }
    if (!w->cfg.serves && !w->cfg.launcher_serves) {
        /* Process 0 closes its store once every process has left: waiting for that (a get of
         * a key nobody sets ends when the server goes) means that no process starts its next
         * communicator, on the same MASTER_PORT, on the old store. */
        char key[440], byte;
        size_t n = 0;
        key_of(w, key, sizeof(key), "closed", w->cfg.process);
        (void)accel__store_get(w->presence, key, &byte, 1, &n, w->cfg.timeout_s);
    }
    watch_free(w);
}

accel_status accel__watch_start(accel__watch **out, accel__store *store,
                                const accel__watch_config *cfg)
{
    *out = NULL;
    accel__watch *w = accel__calloc(1, sizeof(*w));
    if (w == NULL) {
        accel__store_close(store);
        return accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory for the watch", cfg->what);
    }
    w->presence = store;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->beat_mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->cfg = *cfg;
    snprintf(w->what, sizeof(w->what), "%s", cfg->what);
    snprintf(w->prefix, sizeof(w->prefix), "%s", cfg->prefix);
    snprintf(w->addr, sizeof(w->addr), "%s", cfg->addr);
    w->cfg.what = w->what;
    w->cfg.prefix = w->prefix;
    w->cfg.addr = w->addr;
    /* Beats every period; silent for half the timeout (at least 3 periods) is named. */
    double period = cfg->timeout_s / 8;
    period = period < 0.1 ? 0.1 : period > 1 ? 1 : period;
    w->cfg.period_s = cfg->period_s > 0 ? cfg->period_s : period;
    w->silent_s =
        cfg->timeout_s / 2 > 3 * w->cfg.period_s ? cfg->timeout_s / 2 : 3 * w->cfg.period_s;
    snprintf(w->lost_key, sizeof(w->lost_key), "%s/lost", w->prefix);
    host_id(w->host_id, sizeof(w->host_id));
    if (gethostname(w->hostname, sizeof(w->hostname)) != 0) {
        snprintf(w->hostname, sizeof(w->hostname), "?");
    }
    w->hostname[sizeof(w->hostname) - 1] = '\0';

    /* The peers whose pids may be named: this machine's other processes, and process 0. */
    int first = cfg->process - cfg->local_process;
    w->peers = accel__calloc((size_t)cfg->local_n_processes + 1, sizeof(peer));
    if (w->peers == NULL) {
        watch_free(w);
        return accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory for the watch", cfg->what);
    }
    for (int q = first; q < first + cfg->local_n_processes; q++) {
        if (q != cfg->process && q >= 0 && q < cfg->n_processes) {
            w->peers[w->n_peers++].process = q;
        }
    }
    if (cfg->process != 0 && first != 0) {
        w->peers[w->n_peers++].process = 0;
    }

    /* Who this process is, then its presence (process 0 serving the store cannot outlive it:
     * the others see the server go instead). */
    char key[440], value[256];
    int pid = (int)getpid();
    key_of(w, key, sizeof(key), "who", cfg->process);
    int n = snprintf(value, sizeof(value), "%d %llu %s %s", pid,
                     (unsigned long long)accel__shm_pid_start(pid), w->host_id, w->hostname);
    accel_status st = accel__store_set(store, key, value, (size_t)n);
    snprintf(w->beat_name, sizeof(w->beat_name), "process %d (pid %d) on host %s", cfg->process,
             pid, w->hostname);
    if (st == ACCEL_OK && !cfg->serves) {
        st = accel__store_declare(store, w->lost_key, w->beat_name, strlen(w->beat_name));
    }
    accel__store_config pc = {.addr = w->addr,
                              .port = accel__store_port(store),
                              .timeout_s = cfg->timeout_s,
                              .grace_s = cfg->timeout_s};
    if (st == ACCEL_OK) {
        st = accel__store_open(&w->poll, &pc);
    }
    if (st == ACCEL_OK) {
        /* The first beat before this returns: from then on the others' stall messages can name
         * this process, even if it stops before its thread has run (the thread beats again at
         * once: one extra round trip). */
        w->first_beat_ok = !beat(w);
    }
    if (st == ACCEL_OK && pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        st = accel__seterr(NULL, ACCEL_EINTERNAL, "%s: cannot start the watch thread", w->what);
    }
    if (st != ACCEL_OK) {
        watch_free(w); /* no departure: the others learn that this process is gone */
        return st;
    }
    *out = w;
    return ACCEL_OK;
}
