/*
 * Who holds a TCP port, for the message of a process that cannot listen there (two jobs on one
 * MASTER_PORT, a job started twice). Reads /proc: the listening socket's inode from
 * /proc/net/tcp and tcp6, then the process with that socket among those of this user. Best
 * effort and only on that error path: another user's process, or no /proc, gives "". The
 * holder's command line is shown as one line of bounded length, whatever its arguments hold
 * (`python -c '<a script>'`: newlines, tabs).
 */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "store_server.h"

/* The inode of the socket listening on `port` (any address), or 0. */
static unsigned long listening_inode(int port)
{
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    unsigned long found = 0;
    for (size_t t = 0; t < 2 && found == 0; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512];
        if (f == NULL || fgets(line, sizeof(line), f) == NULL) { /* the header line */
            if (f != NULL) {
                fclose(f);
            }
            continue;
        }
        while (found == 0 && fgets(line, sizeof(line), f) != NULL) {
            unsigned lport, state;
            unsigned long inode;
            /* "sl: local:port remote:port st tx:rx tr:when retrnsmt uid timeout inode" */
            if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x %*s %*s %*s %*u %*u %lu",
                       &lport, &state, &inode) == 3 &&
                (int)lport == port && state == 0x0A /* TCP_LISTEN */ && inode != 0) {
                found = inode;
            }
        }
        fclose(f);
    }
    return found;
}

/* Whether process `pid` has the socket `inode` open. */
static int has_socket(const char *pid, unsigned long inode)
{
    char dir[300], want[48];
    snprintf(dir, sizeof(dir), "/proc/%s/fd", pid);
    snprintf(want, sizeof(want), "socket:[%lu]", inode);
    DIR *d = opendir(dir);
    int yes = 0;
    for (struct dirent *e; d != NULL && !yes && (e = readdir(d)) != NULL;) {
        char path[600], target[64];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = '\0';
            yes = strcmp(target, want) == 0;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return yes;
}

/* Appends the bytes "..." to out[0..len) (room bytes at most), cut before the last space when
 * one is in the second half of the line (else before the last whole UTF-8 character), so that
 * the cut is visible and falls between words. Returns the new length. */
static size_t mark_cut(char *out, size_t len, size_t room)
{
    size_t keep = room >= 3 ? room - 3 : 0;
    if (len > keep) {
        size_t at = keep;
        while (at > keep / 2 && out[at] != ' ') {
            at--;
        }
        if (out[at] == ' ') {
            len = at;
        } else {
            len = keep;
            while (len > 0 && ((unsigned char)out[len] & 0xC0) == 0x80) {
                len--; /* out[len], the first byte dropped, continues a character */
            }
        }
    }
    while (len > 0 && out[len - 1] == ' ') {
        len--;
    }
    for (size_t i = 0; i < 3 && len < room; i++) {
        out[len++] = '.';
    }
    return len;
}

void accel__oneline(const char *raw, size_t n, int more, char *out, size_t cap)
{
    if (cap == 0) {
        return;
    }
    const size_t room = cap - 1;
    size_t len = 0;
    int space = 0, cut = more;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (c <= ' ' || c == 0x7f) { /* NUL between arguments, newline, tab, ... */
            space = len > 0;
            continue;
        }
        if (len + (size_t)space + 1 > room) {
            cut = 1;
            break;
        }
        if (space) {
            out[len++] = ' ';
            space = 0;
        }
        out[len++] = (char)c;
    }
    if (cut) {
        len = mark_cut(out, len, room);
    }
    out[len] = '\0';
}

void accel__port_owner(int port, char *out, size_t cap)
{
    if (cap == 0) {
        return;
    }
    out[0] = '\0';
    unsigned long inode = port > 0 ? listening_inode(port) : 0;
    DIR *proc = inode != 0 ? opendir("/proc") : NULL;
    for (struct dirent *e; proc != NULL && (e = readdir(proc)) != NULL;) {
        if (strspn(e->d_name, "0123456789") != strlen(e->d_name) || !has_socket(e->d_name, inode)) {
            continue;
        }
        /* The command line as one line, cut to fit (a read that fills raw is cut too). */
        char path[300], raw[1024], cmd[ACCEL__PORT_OWNER_CMD_NBYTES];
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        size_t n = f != NULL ? fread(raw, 1, sizeof(raw), f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        accel__oneline(raw, n, n == sizeof(raw), cmd, sizeof(cmd));
        snprintf(out, cap, "pid %s, %s", e->d_name, cmd[0] != '\0' ? cmd : "(no command line)");
        break;
    }
    if (proc != NULL) {
        closedir(proc);
    }
}
