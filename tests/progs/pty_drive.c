/*
 * Test helper: runs a command on a new pseudo-terminal and drives it like a person at the
 * keyboard (tests/cli/test_config_cmd.sh drives `accel config`'s arrow-key menus with it).
 *   pty_drive SCRIPT -- COMMAND [ARGS...]
 * SCRIPT has one step per line: "expect TEXT" waits (10 s at most) until the output since the
 * previous match contains TEXT; "send TEXT" types TEXT, where <up>, <down>, <enter> and <ctrl-c>
 * are those keys and \n a newline; lines starting with # are comments. Afterwards it waits for
 * the command to exit and prints everything it wrote (escape sequences included) to stdout.
 * Exits with the command's status, or 124 naming the text it waited for in vain.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static char out[1 << 20];
static size_t out_len, matched;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Reads what the command wrote, waiting at most `wait_s`; returns 0 at EOF. */
static int pump(int fd, double wait_s)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(wait_s * 1000)) <= 0) {
        return 1;
    }
    ssize_t k = read(fd, out + out_len, sizeof(out) - 1 - out_len);
    if (k <= 0) {
        return 0; /* EIO once the slave side is closed */
    }
    out_len += (size_t)k;
    out[out_len] = '\0';
    return 1;
}

static int expect(int fd, const char *text)
{
    double end = now() + 10.0;
    for (;;) {
        char *hit = strstr(out + matched, text);
        if (hit != NULL) {
            matched = (size_t)(hit - out) + strlen(text);
            return 0;
        }
        if (now() > end || !pump(fd, 0.1)) {
            if (now() > end || strstr(out + matched, text) == NULL) {
                fwrite(out, 1, out_len, stdout);
                fprintf(stderr, "\npty_drive: timed out waiting for \"%s\"\n", text);
                return -1;
            }
        }
    }
}

static void send_keys(int fd, const char *s)
{
    static const struct {
        const char *name, *bytes;
    } keys[] = {{"<up>", "\033[A"}, {"<down>", "\033[B"}, {"<enter>", "\r"}, {"<ctrl-c>", "\003"},
                {"\\n", "\n"}};
    while (*s != '\0') {
        size_t i = 0, n = sizeof(keys) / sizeof(keys[0]);
        while (i < n && strncmp(s, keys[i].name, strlen(keys[i].name)) != 0) {
            i++;
        }
        const char *b = i < n ? keys[i].bytes : s;
        size_t len = i < n ? strlen(b) : 1;
        if (write(fd, b, len) != (ssize_t)len) {
            perror("pty_drive: write");
        }
        s += i < n ? strlen(keys[i].name) : 1;
    }
}

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: pty_drive SCRIPT -- COMMAND [ARGS...]\n");
        return 2;
    }
    FILE *script = fopen(argv[1], "r");
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (script == NULL || master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
        perror("pty_drive");
        return 2;
    }
    const char *slave_name = ptsname(master);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int slave = open(slave_name, O_RDWR);
        if (slave < 0) {
            _exit(126);
        }
        ioctl(slave, TIOCSCTTY, 0);
        struct winsize ws = {.ws_row = 40, .ws_col = 120};
        ioctl(slave, TIOCSWINSZ, &ws);
        dup2(slave, 0);
        dup2(slave, 1);
        dup2(slave, 2);
        close(slave);
        close(master);
        execvp(argv[3], argv + 3);
        _exit(127);
    }
    char line[1024];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), script) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "expect ", 7) == 0) {
            rc = expect(master, line + 7);
        } else if (strncmp(line, "send ", 5) == 0) {
            send_keys(master, line + 5);
        } else if (line[0] != '#' && line[0] != '\0') {
            fprintf(stderr, "pty_drive: bad script line: %s\n", line);
            rc = -1;
        }
    }
    fclose(script);
    double end = now() + 10.0;
    int status = 0;
    pid_t done = 0;
    while (done == 0 && now() < end) {
        pump(master, 0.05);
        done = waitpid(pid, &status, WNOHANG);
    }
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fprintf(stderr, "pty_drive: the command did not exit\n");
        rc = -1;
    }
    while (pump(master, 0.05) && out_len + 1 < sizeof(out)) {
    }
    if (rc != 0) {
        return 124;
    }
    fwrite(out, 1, out_len, stdout);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
