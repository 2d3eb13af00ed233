/*
 * Terminal and pipe input for `accel config` (prompt.h). Input is read with read(2), one byte
 * at a time, never through stdio, so a menu in raw mode and a line in canonical mode never
 * lose bytes to a buffer. Invariant: raw mode is on only inside menu_run, and is switched off
 * on every way out of it.
 */
#include "prompt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <termios.h>
#include <unistd.h>

#define KEY_UP 1000
#define KEY_DOWN 1001
#define KEY_EOF -1
#define KEY_INTERRUPT 3 /* Ctrl-C in raw mode */

void prompt_init(prompt *p)
{
    p->tty = isatty(0) && isatty(1);
    p->interrupted = 0;
}

static int read_byte(void)
{
    unsigned char c;
    ssize_t k;
    do {
        k = read(0, &c, 1);
    } while (k < 0 && errno == EINTR);
    return k == 1 ? c : KEY_EOF;
}

/* One key of a menu: arrows as KEY_UP / KEY_DOWN, other bytes as they are. */
static int read_key(void)
{
    int c = read_byte();
    if (c != 27) {
        return c;
    }
    int c2 = read_byte();
    if (c2 != '[' && c2 != 'O') {
        return c2;
    }
    int c3 = read_byte();
    return c3 == 'A' ? KEY_UP : c3 == 'B' ? KEY_DOWN : c3 == KEY_EOF ? KEY_EOF : 0;
}

static int ended(prompt *p, const char *question, int c)
{
    if (c == KEY_INTERRUPT) {
        p->interrupted = 1;
        fprintf(stderr, "\naccel config: interrupted\n");
    } else {
        fprintf(stderr, "\naccel config: the input ended before this question was answered: %s\n",
                question);
    }
    return -1;
}

/* A line without its end ('\n' or '\r'); -1 at end of input (or Ctrl-C) before any end. */
static int read_line(char *out, size_t cap, int *last)
{
    size_t n = 0;
    for (;;) {
        int c = read_byte();
        if (c == KEY_EOF || c == KEY_INTERRUPT) {
            *last = c;
            return -1;
        }
        if (c == '\n' || c == '\r') {
            out[n] = '\0';
            return 0;
        }
        if (n + 1 < cap) {
            out[n++] = (char)c;
        }
    }
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) {
        s[--n] = '\0';
    }
    size_t k = strspn(s, " \t");
    memmove(s, s + k, n - k + 1);
}

/* Prints the question and reads one answer line (trimmed); -1 when the input ended, naming
 * `topic` (the question itself, or a menu's title rather than its "enter a number" line). */
static int ask_line(prompt *p, const char *question, const char *topic, char *out, size_t cap)
{
    printf("%s", question);
    fflush(stdout);
    int last = 0;
    if (read_line(out, cap, &last) != 0) {
        return ended(p, topic, last);
    }
    trim(out);
    return 0;
}

int prompt_text(prompt *p, const char *question, const char *dflt, char *out, size_t cap)
{
    for (;;) {
        if (ask_line(p, question, question, out, cap) != 0) {
            return -1;
        }
        if (out[0] != '\0') {
            return 0;
        }
        if (dflt != NULL) {
            snprintf(out, cap, "%s", dflt);
            return 0;
        }
        printf("Please enter a value.\n");
    }
}

int prompt_yes_no(prompt *p, const char *question, int dflt, int *out)
{
    char line[64];
    for (;;) {
        if (ask_line(p, question, question, line, sizeof(line)) != 0) {
            return -1;
        }
        if (line[0] == '\0') {
            *out = dflt;
            return 0;
        }
        if (strcasecmp(line, "yes") == 0 || strcasecmp(line, "y") == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(line, "no") == 0 || strcasecmp(line, "n") == 0) {
            *out = 0;
            return 0;
        }
        printf("Please enter yes or no.\n");
    }
}

int prompt_int(prompt *p, const char *question, long dflt, long lo, long hi, long *out)
{
    char line[64];
    for (;;) {
        if (ask_line(p, question, question, line, sizeof(line)) != 0) {
            return -1;
        }
        if (line[0] == '\0' && dflt >= lo && dflt <= hi) {
            *out = dflt;
            return 0;
        }
        char *end;
        errno = 0;
        long v = strtol(line, &end, 10);
        if (line[0] != '\0' && *end == '\0' && errno == 0 && v >= lo && v <= hi) {
            *out = v;
            return 0;
        }
        printf("Please enter an integer from %ld to %ld.\n", lo, hi);
    }
}

/* ---- menus ---- */

static struct termios saved;

static void draw(const char *const *choices, int n, int pos)
{
    for (int i = 0; i < n; i++) {
        if (i == pos) {
            printf("\r\033[K \xe2\x9e\x94 \033[32m%s\033[0m\r\n", choices[i]); /* ➔ in green */
        } else {
            printf("\r\033[K    %s\r\n", choices[i]);
        }
    }
    fflush(stdout);
}

/* The arrow-key menu: the choices redrawn in place, the one taken left on screen in green. */
static int menu_run(prompt *p, const char *question, const char *const *choices, int n, int dflt,
                    int *out)
{
    /* Raw mode before the question shows, so a key pressed as soon as it appears is the
     * menu's (output processing stays on: "\n" still ends a line). */
    struct termios raw;
    if (tcgetattr(0, &saved) != 0) {
        return ended(p, question, KEY_EOF);
    }
    raw = saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ISIG);
    raw.c_iflag &= ~(tcflag_t)(ICRNL | IXON);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(0, TCSANOW, &raw);
    printf("\n%s\nPlease select a choice using the arrow or number keys, and selecting with "
           "enter\n\033[?25l", /* and hide the cursor */
           question);
    int pos = dflt, key;
    draw(choices, n, pos);
    for (;;) {
        key = read_key();
        if (key == '\r' || key == '\n' || key == KEY_EOF || key == KEY_INTERRUPT) {
            break;
        }
        if (key == KEY_UP && pos > 0) {
            pos--;
        } else if (key == KEY_DOWN && pos + 1 < n) {
            pos++;
        } else if (key >= '0' && key <= '9' && key - '0' < n) {
            pos = key - '0';
        } else {
            continue;
        }
        printf("\033[%dA", n);
        draw(choices, n, pos);
    }
    tcsetattr(0, TCSANOW, &saved);
    /* Replace the hint and the list by the choice taken. */
    printf("\033[%dA", n + 1);
    for (int i = 0; i <= n; i++) {
        printf("\r\033[K\n");
    }
    printf("\033[%dA\033[32m%s\033[0m\n\033[?25h", n + 1, key == '\r' || key == '\n' ? choices[pos] : "");
    fflush(stdout);
    if (key == KEY_EOF || key == KEY_INTERRUPT) {
        return ended(p, question, key);
    }
    *out = pos;
    return 0;
}

/* The same question without a terminal: a numbered list, one line of answer. */
static int list_run(prompt *p, const char *question, const char *const *choices, int n, int dflt,
                    int *out)
{
    printf("\n%s\n", question);
    for (int i = 0; i < n; i++) {
        printf("  [%d] %s\n", i, choices[i]);
    }
    char ask[96], line[256];
    snprintf(ask, sizeof(ask), "Please enter a choice number [%d]: ", dflt);
    for (;;) {
        if (ask_line(p, ask, question, line, sizeof(line)) != 0) {
            return -1;
        }
        if (line[0] == '\0') {
            *out = dflt;
            return 0;
        }
        char *end;
        long v = strtol(line, &end, 10);
        if (*end == '\0' && v >= 0 && v < n) {
            *out = (int)v;
            return 0;
        }
        for (int i = 0; i < n; i++) {
            if (strcasecmp(line, choices[i]) == 0) {
                *out = i;
                return 0;
            }
        }
        printf("Please enter a number from 0 to %d (or the choice's text).\n", n - 1);
    }
}

int prompt_choice(prompt *p, const char *question, const char *const *choices, int n, int dflt,
                  int *out)
{
    return p->tty ? menu_run(p, question, choices, n, dflt, out)
                  : list_run(p, question, choices, n, dflt, out);
}
