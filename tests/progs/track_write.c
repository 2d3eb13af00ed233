/*
 * Writes a small, known run with the trackers named on the command line so that scripts can
 * check the files with the real tools' readers (tests/track/test_*.sh):
 *   track_write DIR TRACKERS [PROJECT [FIRST LAST OFFSET [RESUME]]]
 * config: lr=0.0003, model="gpt2", batch_size=8; steps FIRST..LAST-1 (default 0..4):
 * train/loss = OFFSET + 2 - 0.25*s, lr = 0.001*(s+1); step 2 also logs text note="hello world".
 * With RESUME, the run first calls accel_trackers_resume(RESUME) (a resumed run).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int main(int argc, char **argv)
{
    if (argc < 3 || (argc > 4 && argc < 7) || argc > 8) {
        fprintf(stderr, "usage: track_write DIR TRACKERS [PROJECT [FIRST LAST OFFSET [RESUME]]]\n");
        return 2;
    }
    int first = argc > 4 ? atoi(argv[4]) : 0, last = argc > 4 ? atoi(argv[5]) : 5;
    double offset = argc > 4 ? atof(argv[6]) : 0.0;
    accel_options o = accel_options_default();
    o.project_dir = argv[1];
    o.log_with = argv[2];
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4), ACCEL_TEXT("model", "gpt2"),
                         ACCEL_SCALAR("batch_size", 8)};
    CHECK_OK(acc, accel_init_trackers(acc, argc > 3 ? argv[3] : "demo", cfg, 3));
    if (argc > 7) {
        CHECK_OK(acc, accel_trackers_resume(acc, atoll(argv[7])));
    }
    for (int s = first; s < last; s++) {
        accel_value v[] = {ACCEL_SCALAR("train/loss", offset + 2.0 - 0.25 * s),
                           ACCEL_SCALAR("lr", 0.001 * (s + 1))};
        CHECK_OK(acc, accel_log(acc, v, 2, s));
        if (s == 2) {
            accel_value t[] = {ACCEL_TEXT("note", "hello world")};
            CHECK_OK(acc, accel_log(acc, t, 1, s));
        }
    }
    CHECK_OK(acc, accel_end_training(acc));
    accel_free(acc);
    return 0;
}
