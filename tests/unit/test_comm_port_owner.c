/*
 * The holder of a taken port, as the store's error names it (src/comm/port_owner.c): its
 * command line is one line whatever its arguments hold. accel__oneline: NULs and control
 * characters (newline, tab, carriage return, escape, DEL) become spaces, each run one space,
 * none at either end; a line too long ends with "...", cut between words (or, in one long word,
 * between UTF-8 characters); an unread rest ("more") is marked too. A real holder, this program
 * re-run with arguments holding newlines and tabs (a `python -c '<script>'`) and longer than the
 * limit: the store's "port taken" error names it on one line, cut between words (it used to
 * quote the newlines raw and cut mid-word at 159 bytes).
 */
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "base/base.h"
#include "comm/store.h"
#include "comm/store_server.h"

static void expect_line(const char *raw, size_t n, int more, size_t cap, const char *want)
{
    char out[256];
    memset(out, 'x', sizeof(out));
    accel__oneline(raw, n, more, out, cap);
    CHECK_MSG(strcmp(out, want) == 0, "\"%s\", want \"%s\" (cap %zu)", out, want, cap);
}

static void formatting(void)
{
    static const char args[] = "python3\0-c\0import os\n\tprint(1)\r\n\x1b[2J\x7f\0";
    expect_line(args, sizeof(args) - 1, 0, 64, "python3 -c import os print(1) [2J");
    expect_line("\n\t a  b\0\0", 9, 0, 64, "a b");
    expect_line("", 0, 0, 64, "");
    expect_line("\0\n", 2, 0, 64, "");
    /* fits exactly; one byte more is cut before the last word */
    expect_line("abc def", 7, 0, 8, "abc def");
    expect_line("abc defg", 8, 0, 8, "abc...");
    expect_line("abcd efgh ijkl", 14, 0, 12, "abcd...");
    /* one long word: cut between characters ("é" is 2 bytes, never split) */
    expect_line("abcdefghij", 10, 0, 8, "abcd...");
    expect_line("ab\xc3\xa9\xc3\xa9\xc3\xa9", 8, 0, 7, "ab...");
    expect_line("abc\xc3\xa9\xc3\xa9\xc3\xa9", 9, 0, 9, "abc\xc3\xa9...");
    /* a rest not read: marked */
    expect_line("abc def", 7, 1, 64, "abc def...");
    /* tiny buffers stay terminated */
    expect_line("abcdef", 6, 0, 3, "..");
    expect_line("abcdef", 6, 0, 1, "");
}

/* The holder: listens on a free port, writes it to fd argv[2], waits until fd argv[3] closes. */
static int hold(char **argv)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    int port = ntohs(sa.sin_port);
    CHECK(write(atoi(argv[2]), &port, sizeof(port)) == (ssize_t)sizeof(port));
    char c;
    while (read(atoi(argv[3]), &c, 1) > 0) {
    }
    return 0;
}

static void real_holder(void)
{
    static const char script[] = "import socket\n\ts = socket.socket()\r\nprint(s)";
    char words[400] = "";
    for (int i = 0; i < 40; i++) {
        snprintf(words + strlen(words), sizeof(words) - strlen(words), "%sword%02d",
                 i > 0 ? " " : "", i);
    }
    int port_pipe[2], hold_pipe[2];
    CHECK(pipe(port_pipe) == 0 && pipe(hold_pipe) == 0);
    char wfd[16], rfd[16];
    snprintf(wfd, sizeof(wfd), "%d", port_pipe[1]);
    snprintf(rfd, sizeof(rfd), "%d", hold_pipe[0]);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(port_pipe[0]);
        close(hold_pipe[1]);
        execl("/proc/self/exe", "holder", "--hold", wfd, rfd, script, words, (char *)NULL);
        _exit(127);
    }
    close(port_pipe[1]);
    close(hold_pipe[0]);
    int port = 0;
    CHECK(read(port_pipe[0], &port, sizeof(port)) == (ssize_t)sizeof(port));
    close(port_pipe[0]);

    char full[1024];
    int n = snprintf(full, sizeof(full),
                     "pid %d, holder --hold %s %s import socket s = socket.socket() print(s) %s",
                     (int)pid, wfd, rfd, words);
    CHECK(n > 0 && (size_t)n < sizeof(full));
    char owner[256];
    accel__port_owner(port, owner, sizeof(owner));
    printf("holder: %s\n", owner);
    /* one line, cut between words and marked, and otherwise the command line */
    size_t len = strlen(owner), head = len - 3;
    CHECK_MSG(strpbrk(owner, "\n\r\t") == NULL, "%s", owner);
    CHECK_MSG(len > 3 && strcmp(owner + head, "...") == 0, "%s", owner);
    CHECK_MSG(strncmp(owner, full, head) == 0 && full[head] == ' ', "%s", owner);
    CHECK_MSG(head > 100 && head - strlen("pid , ") < ACCEL__PORT_OWNER_CMD_NBYTES, "%s", owner);

    /* the store's error quotes it so */
    accel__store_config c = {.addr = "127.0.0.1", .port = port, .serve = 1, .timeout_s = 1};
    accel__store *st = NULL;
    CHECK(accel__store_open(&st, &c) == ACCEL_EIO);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(strstr(msg, owner) != NULL && strchr(msg, '\n') == NULL, "%s", msg);

    close(hold_pipe[1]);
    int ws;
    CHECK(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--hold") == 0) {
        return hold(argv);
    }
    formatting();
    real_holder();
    printf("test_comm_port_owner: ok\n");
    return 0;
}
