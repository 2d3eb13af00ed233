/*
 * Launcher test helper: writes N numbered lines to stdout and N to stderr, alternating, each
 * padded to LEN bytes with a checksum-friendly pattern, so a test can verify that every line
 * arrives whole, prefixed and exactly once. With --partial the last stdout line has no
 * trailing newline (the launcher must still relay it).
 *   print_lines N [LEN] [--partial]
 * Line format: "<out|err> r<RANK> i<index> <padding of 'x'>" (padding makes the line LEN long).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void put_line(int fd, const char *kind, const char *rank, int i, int len, int newline)
{
    static char *buf;
    if (buf == NULL && (buf = malloc((size_t)len + 64)) == NULL) {
        exit(3);
    }
    int n = snprintf(buf, 64, "%s r%s i%d ", kind, rank, i);
    while (n < len) {
        buf[n++] = 'x';
    }
    if (newline) {
        buf[n++] = '\n';
    }
    /* One write per line, unbuffered: the launcher sees lines as they are produced. */
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, (size_t)n);
        if (k <= 0) {
            exit(3);
        }
        p += k;
        n -= (int)k;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: print_lines N [LEN] [--partial]\n");
        return 2;
    }
    int n = atoi(argv[1]);
    int len = argc > 2 && argv[2][0] != '-' ? atoi(argv[2]) : 80;
    int partial = argc > 2 && strcmp(argv[argc - 1], "--partial") == 0;
    const char *rank = getenv("RANK") ? getenv("RANK") : "?";
    for (int i = 0; i < n; i++) {
        put_line(1, "out", rank, i, len, !(partial && i == n - 1));
        put_line(2, "err", rank, i, len, 1);
    }
    return 0;
}
