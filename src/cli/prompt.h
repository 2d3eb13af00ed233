/*
 * The questions of `accel config` (prompt.c), answered in a terminal or from a pipe. In a
 * terminal (stdin and stdout both TTYs) a choice is a menu moved with the arrow or number keys
 * and taken with Enter, as Accelerate's; otherwise each question is a numbered list answered by
 * one line of stdin (a number, the choice's text, or an empty line for the default), so a
 * script can drive it. Fields are one line either way. Every function returns 0 with the
 * answer, or -1 when the input ended or was interrupted (Ctrl-C) before the answer, after
 * printing why to stderr; the terminal is always restored.
 */
#ifndef ACCEL_CLI_PROMPT_H
#define ACCEL_CLI_PROMPT_H

#include <stddef.h>

typedef struct prompt {
    int tty;         /* menus with arrow keys */
    int interrupted; /* Ctrl-C was typed (exit 130) */
} prompt;

/* Decides the mode from stdin and stdout. */
void prompt_init(prompt *p);

/* One of n choices; *out is its index (dflt when Enter / an empty line is given at once). */
int prompt_choice(prompt *p, const char *question, const char *const *choices, int n, int dflt,
                  int *out);
/* A line of text; an empty answer gives dflt (when dflt is NULL an answer is required). */
int prompt_text(prompt *p, const char *question, const char *dflt, char *out, size_t cap);
/* yes / no (y / n, any case); empty gives dflt. */
int prompt_yes_no(prompt *p, const char *question, int dflt, int *out);
/* An integer in [lo, hi]; empty gives dflt (dflt outside [lo, hi]: an answer is required). */
int prompt_int(prompt *p, const char *question, long dflt, long lo, long hi, long *out);

#endif /* ACCEL_CLI_PROMPT_H */
