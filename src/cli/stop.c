/*
 * The launcher's stop signals (SIGINT, SIGTERM, SIGHUP) before its processes run, on several
 * machines: from the rendezvous until the supervisor takes them over (launch_supervise), and
 * again while a restart fetches its job id, they only set a flag. Each place that waits there
 * (the rendezvous, --preflight, the job id) looks at the flag, says what happened, tells the
 * other machines and stops what it started. Invariant: a signal ignored when the launcher
 * started stays ignored, and the old actions come back before any process is started.
 */
#include <signal.h>

#include "launch.h"

static const int stop_signals[3] = {SIGINT, SIGTERM, SIGHUP};
static volatile sig_atomic_t caught_signal; /* 0: none since launch_stop_catch */
static struct sigaction old_actions[3];
static int catching;

static void on_stop_signal(int sig)
{
    caught_signal = sig;
}

void launch_stop_catch(void)
{
    if (catching) {
        return;
    }
    /* Without SA_RESTART: a signal ends a sleep or poll early; the store retries its calls,
     * and the waits here are slices that end on time. */
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    caught_signal = 0;
    for (int i = 0; i < 3; i++) {
        old_actions[i] = (struct sigaction){.sa_handler = SIG_DFL};
        if (sigaction(stop_signals[i], NULL, &old_actions[i]) == 0 &&
            old_actions[i].sa_handler != SIG_IGN) {
            sigaction(stop_signals[i], &sa, NULL);
        }
    }
    catching = 1;
}

void launch_stop_release(void)
{
    if (!catching) {
        return;
    }
    for (int i = 0; i < 3; i++) {
        sigaction(stop_signals[i], &old_actions[i], NULL);
    }
    catching = 0;
}

int launch_stop_signal(void)
{
    return caught_signal;
}

const char *launch_stop_name(int sig)
{
    return sig == SIGINT    ? "SIGINT"
           : sig == SIGTERM ? "SIGTERM"
           : sig == SIGHUP  ? "SIGHUP"
                            : "a signal";
}
