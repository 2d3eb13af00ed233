/*
 * Who holds a TCP port, for the message of a process that cannot listen there (two jobs on one
 * MASTER_PORT, a job started twice). Reads /proc: the listening socket's inode from
 * /proc/net/tcp and tcp6, then the process with that socket among those of this user. Best
 * effort and only on that error path: another user's process, or no /proc, gives "".
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
        /* The command line, its NULs turned into spaces, cut to fit. */
        char path[300], cmd[160] = "";
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        size_t n = f != NULL ? fread(cmd, 1, sizeof(cmd) - 1, f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        while (n > 0 && cmd[n - 1] == '\0') {
            n--;
        }
        for (size_t i = 0; i < n; i++) {
            cmd[i] = cmd[i] == '\0' ? ' ' : cmd[i];
        }
        cmd[n] = '\0';
        snprintf(out, cap, "pid %s, %s", e->d_name, n > 0 ? cmd : "(no command line)");
        break;
    }
    if (proc != NULL) {
        closedir(proc);
    }
}
