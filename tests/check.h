/*
 * Minimal test helpers shared by every test program: a failed CHECK prints file:line and the
 * expression and exits 1, so a test is judged by its exit code (77 = skipped).
 */
#ifndef ACCEL_TESTS_CHECK_H
#define ACCEL_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x);                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(x, ...)                                                                          \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #x);                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* An accel call that must succeed; prints status and accel_last_error otherwise. */
#define CHECK_OK(acc, call)                                                                        \
    do {                                                                                           \
        accel_status check_st_ = (call);                                                           \
        if (check_st_ != ACCEL_OK) {                                                               \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,               \
                    accel_status_name(check_st_), accel_last_error(acc));                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A call that must fail with status `want` and exactly the message `text` (accel_last_error of
 * `acc`, NULL: the thread's), so chained messages ("X failed: <cause>") are checked whole. */
#define CHECK_ERR(acc, call, want, text)                                                           \
    do {                                                                                           \
        accel_status check_st_ = (call);                                                           \
        const char *check_msg_ = accel_last_error(acc);                                            \
        if (check_st_ != (want) || strcmp(check_msg_, (text)) != 0) {                              \
            fprintf(stderr, "%s:%d: %s: got %s \"%s\"\n    expected %s \"%s\"\n", __FILE__,        \
                    __LINE__, #call, accel_status_name(check_st_), check_msg_,                     \
                    accel_status_name(want), (text));                                              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double check_a_ = (double)(a), check_b_ = (double)(b);                                     \
        if (!(fabs(check_a_ - check_b_) <= (tol))) {                                               \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s=%.9g %s=%.9g tol=%g\n", __FILE__,        \
                    __LINE__, #a, check_a_, #b, check_b_, (double)(tol));                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The first 16 KiB of the file at path as a string, in a static buffer (valid until the next
 * call). */
static inline char *check_slurp(const char *path)
{
    static char buf[16384];
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The whole file at path, NUL-terminated, in malloc'd memory (free it); *n its size. A file
 * that cannot be read fails the test. */
static inline char *check_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    CHECK(buf != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len);
    buf[len] = '\0';
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* Fails the test unless files a and b hold the same bytes. */
static inline void check_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = check_read_file(a, &na), *y = check_read_file(b, &nb);
    CHECK_MSG(na == nb && memcmp(x, y, na) == 0, "%s differs from %s", b, a);
    free(x);
    free(y);
}

/* A full disk, for this process: files may not grow past limit bytes (RLIMIT_FSIZE; a write
 * past it fails with EFBIG as one on a full file system fails with ENOSPC, and SIGXFSZ is
 * ignored so that it does not end the process); limit 0 lifts it again. */
static inline void check_file_size_limit(long long limit)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_FSIZE, &r) == 0);
    r.rlim_cur = limit > 0 ? (rlim_t)limit : r.rlim_max;
    CHECK(setrlimit(RLIMIT_FSIZE, &r) == 0);
}

/* How many times needle occurs in s, overlapping occurrences included. */
static inline int check_count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
}

/* A pid that no process has: a child that exited and was reaped. */
static inline int check_dead_pid(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        _exit(0);
    }
    CHECK(waitpid(pid, NULL, 0) == pid);
    return (int)pid;
}

/* stderr (where the library's warnings go) captured into a file between begin and end. */
typedef struct check_capture {
    int saved_fd;
    char path[512];
    char text[16384];
} check_capture;

static inline void check_capture_begin(check_capture *c, const char *path)
{
    snprintf(c->path, sizeof(c->path), "%s", path);
    fflush(stderr);
    c->saved_fd = dup(2);
    FILE *f = fopen(c->path, "w");
    CHECK(c->saved_fd >= 0 && f != NULL);
    CHECK(dup2(fileno(f), 2) == 2);
    fclose(f);
}

/* Restores stderr; returns what was written meanwhile (c->text). */
static inline char *check_capture_end(check_capture *c)
{
    fflush(stderr);
    CHECK(dup2(c->saved_fd, 2) == 2);
    close(c->saved_fd);
    FILE *f = fopen(c->path, "r");
    CHECK(f != NULL);
    c->text[fread(c->text, 1, sizeof(c->text) - 1, f)] = '\0';
    fclose(f);
    return c->text;
}

#endif
