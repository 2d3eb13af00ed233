/*
 * The progress bar in both modes with a fake clock: plain lines at every percent step and at
 * every interval, the final line, rate / elapsed / remaining and caller fields; in-place
 * redraws with '\r' and a bar on a terminal; an unknown total.
 */
#include <string.h>

#include "check.h"
#include "core/profile.h"

static double fake_now;
static double fake_clock(void)
{
    return fake_now;
}

static char buf[16384];
static const char *contents(FILE *f)
{
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    return buf;
}

int main(void)
{
    accel__progress_set_clock(fake_clock);
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));

    /* Plain mode: a line at 25/50/75/100 % (interval long); the closing line would repeat
     * the 100 % one, so it is not printed. */
    FILE *f = tmpfile();
    accel_progress_options o = accel_progress_options_default();
    o.total = 100;
    o.desc = "train";
    o.stream = f;
    o.tty = 0;
    o.percent_step = 25;
    o.interval_s = 1000;
    fake_now = 100.0;
    accel_progress *p;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    for (int i = 0; i < 100; i++) {
        fake_now += 0.2; /* 5 it/s */
        accel_progress_set_field(p, "loss", 2.5);
        accel_progress_set_field(p, "lr", 3e-4);
        accel_progress_update(p, 1);
    }
    accel_progress_close(p);
    const char *s = contents(f);
    CHECK_MSG(check_count(s, "\n") == 4 && strchr(s, '\r') == NULL, "%s", s);
    CHECK_MSG(strstr(s, "train:  25% 25/100 [00:05<00:15, 5.00it/s, loss=2.5, lr=0.0003]\n") !=
                  NULL,
              "%s", s);
    CHECK(strstr(s, "train:  75% 75/100 [00:15<00:05, 5.00it/s, loss=2.5, lr=0.0003]\n") != NULL);
    CHECK(check_count(s, "train: 100% 100/100 [00:20<00:00, 5.00it/s, loss=2.5, lr=0.0003]\n") ==
          1);
    fclose(f);

    /* A field set after the last line (gpt.c's final loss): the close shows it, once. Closed
     * with nothing printed yet (no percent step, no interval): the close prints the line. */
    f = tmpfile();
    o.stream = f;
    fake_now = 0;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    for (int i = 0; i < 100; i++) {
        fake_now += 0.2;
        accel_progress_update(p, 1);
    }
    accel_progress_set_field(p, "loss", 1.5);
    accel_progress_close(p);
    s = contents(f);
    CHECK_MSG(check_count(s, "100/100") == 2 &&
                  strstr(s, "100/100 [00:20<00:00, 5.00it/s, loss=1.5]\n"),
              "%s", s);
    fclose(f);
    f = tmpfile();
    o.stream = f;
    o.percent_step = 0;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    accel_progress_update(p, 3);
    accel_progress_close(p);
    s = contents(f);
    CHECK_MSG(check_count(s, "\n") == 1 && strstr(s, " 3/100 "), "%s", s);
    fclose(f);
    o.percent_step = 25;

    /* A resumed run (initial = 40 of 100): the count continues at 40, the percent marks before
     * it are not repeated, and rate and remaining time count only this run's steps. */
    f = tmpfile();
    o.stream = f;
    o.initial = 40;
    fake_now = 0;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    CHECK(p != NULL);
    for (int i = 0; i < 60; i++) {
        fake_now += 0.5; /* 2 it/s */
        accel_progress_update(p, 1);
    }
    accel_progress_close(p);
    s = contents(f);
    CHECK_MSG(strstr(s, " 25/100") == NULL &&
                  strstr(s, "train:  50% 50/100 [00:05<00:25, 2.00it/s") != NULL,
              "%s", s);
    CHECK_MSG(strstr(s, "train: 100% 100/100 [00:30<00:00, 2.00it/s") != NULL, "%s", s);
    fclose(f);
    o.initial = 101; /* past the total */
    CHECK(accel_progress_new(acc, &o, &(accel_progress *){NULL}) == ACCEL_EINVAL);
    o.initial = 0;

    /* Plain mode by time: every 10 s whatever the percentage; slow rates read s/it. */
    f = tmpfile();
    o.stream = f;
    o.percent_step = 0;
    o.interval_s = 10;
    o.total = 10;
    fake_now = 0;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    for (int i = 0; i < 10; i++) {
        fake_now += 4; /* 0.25 it/s */
        accel_progress_update(p, 1);
    }
    accel_progress_close(p);
    s = contents(f);
    /* Lines at t=12 (3 done), 24, 36 and the close at 40. */
    CHECK_MSG(check_count(s, "\n") == 4, "%s", s);
    CHECK_MSG(strstr(s, "train:  30% 3/10 [00:12<00:28, 4.00s/it]\n") != NULL, "%s", s);
    fclose(f);

    /* Terminal mode: redrawn in place with a bar; the close ends the line. */
    f = tmpfile();
    o = accel_progress_options_default();
    o.total = 4;
    o.stream = f;
    o.tty = 1;
    o.width = 8;
    fake_now = 0;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    for (int i = 0; i < 4; i++) {
        fake_now += 1;
        accel_progress_update(p, 1);
    }
    accel_progress_close(p);
    s = contents(f);
    CHECK_MSG(check_count(s, "\r") == 5 && check_count(s, "\n") == 1 && s[strlen(s) - 1] == '\n',
              "%s", s);
    CHECK_MSG(strstr(s, "\r 25%|##      | 1/4 [00:01<00:03, 1.00it/s]") != NULL, "%s", s);
    CHECK(strstr(s, "\r100%|########| 4/4 [00:04<00:00, 1.00it/s]\n") != NULL);
    fclose(f);

    /* Unknown total. */
    f = tmpfile();
    o = accel_progress_options_default();
    o.stream = f;
    o.tty = 0;
    o.interval_s = 1;
    fake_now = 0;
    CHECK_OK(acc, accel_progress_new(acc, &o, &p));
    fake_now = 2;
    accel_progress_update(p, 7);
    accel_progress_close(p);
    s = contents(f);
    CHECK_MSG(strstr(s, "7it [00:02, 3.50it/s]\n") != NULL, "%s", s);
    fclose(f);

    /* Bad options; NULL handles are no-ops. */
    o = accel_progress_options_default();
    o.total = -1;
    CHECK(accel_progress_new(acc, &o, &(accel_progress *){NULL}) == ACCEL_EINVAL);
    accel_progress_update(NULL, 1);
    accel_progress_set_field(NULL, "x", 1);
    accel_progress_close(NULL);

    accel_free(acc);
    accel__progress_set_clock(NULL);
    printf("test_progress: ok\n");
    return 0;
}
