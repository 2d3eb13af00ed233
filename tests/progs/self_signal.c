/*
 * Launcher test helper: the process whose RANK equals R writes a line to stderr and kills
 * itself with signal SIG; the other ranks sleep (default 30 s) so the launcher must stop them.
 *   self_signal R SIG [SLEEP_SECONDS] [marker...]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: self_signal R SIG [SLEEP_SECONDS]\n");
        return 2;
    }
    int victim = atoi(argv[1]), sig = atoi(argv[2]);
    int seconds = argc > 3 ? atoi(argv[3]) : 30;
    int rank = getenv("RANK") ? atoi(getenv("RANK")) : 0;
    if (rank == victim) {
        fprintf(stderr, "rank %d: about to die by signal %d\n", rank, sig);
        signal(sig, SIG_DFL);
        raise(sig);
        return 1; /* only for signals that do not terminate */
    }
    unsigned left = (unsigned)seconds;
    while (left > 0) {
        left = sleep(left);
    }
    return 0;
}
