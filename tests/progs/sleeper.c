/*
 * Launcher test helper: prints "ready r<RANK>" and sleeps SECONDS (default 60), so a test can
 * signal the launcher and check that no process survives. Extra arguments are ignored: tests
 * pass a unique marker to find stray processes with pgrep -f. With --ignore-term the process
 * ignores SIGTERM, so only the launcher's SIGKILL escalation can stop it.
 *   sleeper [SECONDS] [--ignore-term] [marker...]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int seconds = argc > 1 && argv[1][0] != '-' ? atoi(argv[1]) : 60;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ignore-term") == 0) {
            signal(SIGTERM, SIG_IGN);
        }
    }
    printf("ready r%s\n", getenv("RANK") ? getenv("RANK") : "?");
    fflush(stdout);
    /* sleep() returns early on a handled signal; loop until the time is really up. */
    unsigned left = (unsigned)seconds;
    while (left > 0) {
        left = sleep(left);
    }
    return 0;
}
