/*
 * Writes a small, known run with the trackers named on the command line so that scripts can
 * check the files with the real tools' readers (tests/track/test_*.sh):
 *   track_write DIR TRACKERS [PROJECT]
 * config: lr=0.0003, model="gpt2", batch_size=8; steps 0..4: train/loss = 2 - 0.25*s,
 * lr = 0.001*(s+1); step 2 also logs text note="hello world".
 */
#include <stdio.h>
#include <string.h>

#include "check.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: track_write DIR TRACKERS [PROJECT]\n");
        return 2;
    }
    accel_options o = accel_options_default();
    o.project_dir = argv[1];
    o.log_with = argv[2];
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4), ACCEL_TEXT("model", "gpt2"),
                         ACCEL_SCALAR("batch_size", 8)};
    CHECK_OK(acc, accel_init_trackers(acc, argc > 3 ? argv[3] : "demo", cfg, 3));
    for (int s = 0; s < 5; s++) {
        accel_value v[] = {ACCEL_SCALAR("train/loss", 2.0 - 0.25 * s),
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
