/*
 * Relays one child's stdout or stderr pipe to the launcher's console, line by line. Every line
 * leaves in a single writev() of "[rank<r>]: " + line + "\n", so lines of different ranks never
 * interleave mid-line and nothing is lost: a line longer than the buffer is cut into
 * buffer-sized lines, each prefixed, and a last line without newline is completed at EOF.
 * Tee files receive the raw bytes unchanged. Stderr streams remember their last lines for the
 * launcher's failure summary.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/base.h"
#include "launch.h"

#define LINE_NBYTES (32 * 1024) /* longest line relayed whole */
#define TAIL_LINES 10
#define TAIL_LINE_NBYTES 512

struct relay_stream {
    int fd, rank, console_fd, prefix, file_fd, keep_tail;
    char prefix_text[32];
    char *file_name; /* the tee file's path, for the message if writing it fails */
    size_t prefix_len;
    char *buf; /* partial line: buf[0..len) holds no '\n' between pumps */
    size_t len;
    /* Ring of the last TAIL_LINES lines (truncated to TAIL_LINE_NBYTES). */
    char (*tail)[TAIL_LINE_NBYTES];
    int tail_next, tail_count;
};

int relay_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

relay_stream *relay_new(int fd, int rank, int console_fd, int prefix, int file_fd,
                        const char *file_name, int keep_tail)
{
    relay_stream *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return NULL;
    }
    s->buf = accel__malloc(LINE_NBYTES);
    if (keep_tail) {
        s->tail = accel__calloc(TAIL_LINES, sizeof(*s->tail));
    }
    if (file_fd >= 0) {
        s->file_name = accel__strdup(file_name != NULL ? file_name : "(log file)");
    }
    if (s->buf == NULL || (keep_tail && s->tail == NULL) || (file_fd >= 0 && !s->file_name)) {
        accel__free(s->buf);
        accel__free(s->tail);
        accel__free(s->file_name);
        accel__free(s);
        return NULL;
    }
    s->fd = fd;
    s->rank = rank;
    s->console_fd = console_fd;
    s->prefix = prefix;
    s->file_fd = file_fd;
    s->keep_tail = keep_tail;
    int k = snprintf(s->prefix_text, sizeof(s->prefix_text), "[rank%d]: ", rank);
    s->prefix_len = (size_t)k;
    return s;
}

void relay_free(relay_stream *s)
{
    if (s == NULL) {
        return;
    }
    if (s->fd >= 0) {
        close(s->fd);
    }
    if (s->file_fd >= 0) {
        close(s->file_fd);
    }
    accel__free(s->buf);
    accel__free(s->tail);
    accel__free(s->file_name);
    accel__free(s);
}

int relay_fd(const relay_stream *s)
{
    return s->fd;
}

static void remember(relay_stream *s, const char *line, size_t n)
{
    if (!s->keep_tail) {
        return;
    }
    char *slot = s->tail[s->tail_next];
    if (n >= TAIL_LINE_NBYTES) {
        memcpy(slot, line, TAIL_LINE_NBYTES - 4);
        memcpy(slot + TAIL_LINE_NBYTES - 4, "...", 4);
    } else {
        memcpy(slot, line, n);
        slot[n] = '\0';
    }
    s->tail_next = (s->tail_next + 1) % TAIL_LINES;
    if (s->tail_count < TAIL_LINES) {
        s->tail_count++;
    }
}

/* Emits one line (without its newline) to the console and the tail. */
static void emit_line(relay_stream *s, const char *line, size_t n)
{
    remember(s, line, n);
    struct iovec iov[3];
    int k = 0;
    if (s->prefix) {
        iov[k++] = (struct iovec){s->prefix_text, s->prefix_len};
    }
    iov[k++] = (struct iovec){(void *)line, n};
    iov[k++] = (struct iovec){"\n", 1};
    size_t total = (s->prefix ? s->prefix_len : 0) + n + 1;
    ssize_t w;
    do {
        w = writev(s->console_fd, iov, k);
    } while (w < 0 && errno == EINTR);
    if (w >= 0 && (size_t)w < total) {
        /* A short write (full pipe with O_NONBLOCK on our side, a signal): finish it in pieces
         * rather than lose the rest of the line. */
        size_t done = (size_t)w;
        for (int i = 0; i < k; i++) {
            if (done >= iov[i].iov_len) {
                done -= iov[i].iov_len;
                continue;
            }
            relay_write_all(s->console_fd, (char *)iov[i].iov_base + done, iov[i].iov_len - done);
            done = 0;
        }
    }
}

/* Relays the complete lines in buf[0..len) and keeps the partial rest. */
static void split_lines(relay_stream *s)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (nl == NULL) {
            break;
        }
        size_t n = (size_t)(nl - (s->buf + start));
        emit_line(s, s->buf + start, n);
        start += n + 1;
    }
    if (start == 0 && s->len == LINE_NBYTES) {
        emit_line(s, s->buf, s->len); /* an overlong line: relay it in pieces */
        s->len = 0;
        return;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void finish(relay_stream *s)
{
    if (s->len > 0) {
        emit_line(s, s->buf, s->len);
        s->len = 0;
    }
    close(s->fd);
    s->fd = -1;
}

/* One read(); returns 1 if data was read, 0 if the pipe is empty now, -1 at EOF/error (the
 * stream is then finished and closed). */
static int read_once(relay_stream *s)
{
    ssize_t k;
    do {
        k = read(s->fd, s->buf + s->len, LINE_NBYTES - s->len);
    } while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return 0;
    }
    if (k <= 0) {
        finish(s);
        return -1;
    }
    if (s->file_fd >= 0) {
        int e = relay_write_all(s->file_fd, s->buf + s->len, (size_t)k);
        if (e != 0) {
            /* A full disk or a file-size limit: said once, and the file is left as it is, the
             * console still gets every line (the file would only miss pieces from here on). */
            char msg[4400];
            int n = snprintf(msg, sizeof(msg),
                             "accel launch: warning: cannot write log file %s: %s; it ends here "
                             "(this stream goes on to the console only)\n",
                             s->file_name, strerror(e));
            relay_write_all(2, msg, n > 0 ? (size_t)n : 0);
            close(s->file_fd);
            s->file_fd = -1;
        }
    }
    if (!s->prefix && !s->keep_tail) {
        /* Nothing line-oriented to do: pass the bytes straight through. */
        relay_write_all(s->console_fd, s->buf + s->len, (size_t)k);
        return 1;
    }
    s->len += (size_t)k;
    split_lines(s);
    return 1;
}

void relay_pump(relay_stream *s)
{
    if (s->fd >= 0) {
        read_once(s);
    }
}

void relay_drain(relay_stream *s)
{
    if (s->fd < 0) {
        return;
    }
    while (read_once(s) > 0) {
    }
    if (s->fd >= 0) {
        finish(s);
    }
}

int relay_print_tail(const relay_stream *s, const char *indent)
{
    if (!s->keep_tail) {
        return 0;
    }
    int first = (s->tail_next - s->tail_count + TAIL_LINES) % TAIL_LINES;
    for (int i = 0; i < s->tail_count; i++) {
        const char *line = s->tail[(first + i) % TAIL_LINES];
        struct iovec iov[3] = {
            {(void *)indent, strlen(indent)}, {(void *)line, strlen(line)}, {"\n", 1}};
        ssize_t w;
        do {
            w = writev(2, iov, 3);
        } while (w < 0 && errno == EINTR);
    }
    return s->tail_count;
}
