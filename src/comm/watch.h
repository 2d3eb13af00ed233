/*
 * The liveness watch (private to the library): for backends that cannot see their peers die or
 * stop (nccl: NCCL's kernels spin waiting for a dead peer, and within a machine NCCL reports
 * nothing), a thread per process that turns a dead peer into ACCEL_EPEER and a stall into
 * ACCEL_ETIMEDOUT, each naming the process, in about a second instead of never.
 *
 * How it sees a death: each process declares its presence in the job's store (store.h) with
 * the text "process R (pid P) on host H"; when its connection ends without a departure (it was
 * killed, crashed, or exited without leaving; its machine vanished: keepalive notices in about
 * 10 s) the server records that text under the job's "lost" key, which every watcher waits
 * for (a get parked at the server, answered as soon as the key is set; one round trip per
 * period, on its own store client). When the store's server goes away
 * (process 0 served it and died), that names process 0.
 * How it sees a stall: members count their operations (posted, done); when some are in flight
 * and neither count moved for the member's timeout, the member is failed with ETIMEDOUT and the
 * processes of this machine that are stopped (SIGSTOP, a debugger) or dead are named (/proc),
 * and so are the processes of any machine whose heartbeat stopped: each watch beats through the
 * store every period (accel__store_beat, on the thread's client; the period is an eighth of
 * the timeout, between 0.1 and 1 s) and the server lists the processes it has not heard for
 * more than half the timeout (at least 3 periods: a beat late by a few periods on a loaded
 * machine is no accusation). A stopped process keeps its TCP connection (the kernel answers
 * keepalive for it), but not its beats. If the store's server itself stops answering, the
 * process serving it (process 0, or machine 0's accel launch) is the one named. Each beat also
 * carries the count of operations this process posted on its oldest member (the world
 * communicator); once a member has waited half the timeout, the beats ask for the processes
 * behind this one, which the stall's message names too (busy elsewhere, hung in a kernel or a
 * syscall, or at another call, while their watch thread still beats).
 *
 * A watch is shared by a communicator and its split children (members): on a death every
 * member fails; on a stall, that member. Cost on the operation path: two relaxed atomic adds.
 * Process 0, when it serves the store, waits at the watch's end (at most the timeout) until
 * every other process has left it, so that it does not take the store away under them, and the
 * others wait until it has closed the store, so that none starts its next communicator (on the
 * same MASTER_PORT) on the old one. A
 * process that forks (without exec) shares its presence connection with the child: its death
 * is then seen when the child's copy closes too.
 */
#ifndef ACCEL_COMM_WATCH_H
#define ACCEL_COMM_WATCH_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/base.h"
#include "store.h"

typedef struct accel__watch accel__watch;

typedef struct accel__watch_config {
    const char *what;    /* the backend, starting messages ("nccl") */
    const char *prefix;  /* the job's keys: <prefix>/lost, <prefix>/who/<r>, <prefix>/left/<r> */
    const char *addr;    /* the store's address (MASTER_ADDR; the port is the client's) */
    int launcher_serves; /* accel launch serves the store (ACCEL_STORE_SERVED), not process 0 */
    int serves;          /* this process serves the store (process 0 without the launcher's) */
    int process, n_processes; /* this process and the job's count (messages' "process R") */
    int local_process, local_n_processes; /* this machine's processes: [process - local, +n) */
    double timeout_s;                     /* a stalled member's limit; also the store's */
    double period_s; /* how often the thread beats and looks at the stalls; 0: timeout / 8 in
                        [0.1, 1] s */
    accel__log_ctx log;
} accel__watch_config;

/* A member (a communicator of the backend, embedded in its state). The backend counts its
 * operations in posted and done (relaxed adds; done <= posted) and gives fail, which the watch
 * calls once, from its thread, to break the member (it must not call the watch). */
typedef struct accel__watch_member {
    _Atomic uint64_t posted, done;
    double timeout_s;
    void (*fail)(void *arg, accel_status st, const char *msg);
    /* Optional: called on the watch's thread (its lock held: quick, no watch calls) before a
     * stall is judged, to count in done the operations that are complete but that nobody has
     * tested yet (a user may post work and wait for it much later: no stall). */
    void (*progress)(void *arg);
    void *arg;
    /* the watch's own */
    uint64_t seen_posted, seen_done;
    double moved_at;
    int failed;
    struct accel__watch_member *next;
} accel__watch_member;

/* Starts the watch of this process, with store: the process's client of the job's store (taken:
 * the watch declares the presence on it, and closes it at its end; for process 0 it may be
 * serving the store). Collective in effect: every process of the job starts one. The watch
 * lives while it has members. On failure store is closed too. */
accel_status accel__watch_start(accel__watch **out, accel__store *store,
                                const accel__watch_config *cfg);
/* Adds m (its fail, arg and timeout_s set; counters zero) to w's members. Any thread. */
void accel__watch_join(accel__watch *w, accel__watch_member *m);
/* Removes m; the last member's leaving ends the watch (a clean departure; process 0 serving the
 * store first waits for the others' departures) and frees w. Called by the thread that owns the
 * communicators (the one that started the watch or joined m), never by fail. */
void accel__watch_leave(accel__watch *w, accel__watch_member *m);

/* Appends to buf (nbytes in all) what is known of the job's processes: this machine's that are
 * dead or stopped ("; process 1 (pid 123) is stopped (SIGSTOP or a debugger)"), any machine's
 * whose heartbeat stopped ("; process 3 (pid 456) on host h: no heartbeat for 2.1 s (stopped
 * or hung?)", as of the last beat, at most a period old), a store that stopped answering, or
 * that none is known. Any thread; for messages of a stall seen elsewhere (the front end's
 * watchdog). */
void accel__watch_suspects(accel__watch *w, char *buf, size_t nbytes);

#endif /* ACCEL_COMM_WATCH_H */
