/*
 * Writes a run through faults, for tests/track/test_track_faults.sh to read back with the real
 * tools: track_faults DIR TRACKER (one of jsonl, csv, tensorboard, mlflow)
 * config: lr=0.0003, the text "mo\ndel\xff" (not UTF-8) under a key not UTF-8 either, nan, inf
 * and 1e300. Steps 0..19 log loss=s, "odd\xfe/key"=s (a key not UTF-8), "a/"=s and "."=s (keys
 * naming folders in MLflow's store), and at steps 10..14 files are capped 7 bytes past the
 * size of the tracker's record file at step 10 (a disk full in the middle of a record: those
 * steps are lost, with warnings), then free again for steps 15..19.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "track_check.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: track_faults DIR TRACKER\n");
        return 2;
    }
    accel_options o = accel_options_default();
    o.project_dir = argv[1];
    o.log_with = argv[2];
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_value cfg[] = {ACCEL_SCALAR("lr", 3e-4), ACCEL_TEXT("model\xff", "mo\ndel\xff"),
                         ACCEL_SCALAR("nan", 0.0 / 0.0), ACCEL_SCALAR("inf", 1.0 / 0.0),
                         ACCEL_SCALAR("big", 1e300)};
    CHECK_OK(acc, accel_init_trackers(acc, "faults", cfg, 5));
    char run[1024], path[1300] = "";
    snprintf(run, sizeof(run), "%s", accel_tracker_run_dir(accel_get_tracker(acc, argv[2])));
    for (int s = 0; s < 20; s++) {
        accel_value v[] = {ACCEL_SCALAR("loss", s), ACCEL_SCALAR("odd\xfe/key", s),
                           ACCEL_SCALAR("a/", s), ACCEL_SCALAR(".", s)};
        if (s == 10) {
            long long size = track_record_file_size(run, argv[2], path, sizeof(path));
            check_file_size_limit(size + 7);
        }
        CHECK_OK(acc, accel_log(acc, v, 4, s));
        if (s == 14) {
            check_file_size_limit(0);
        }
    }
    CHECK_OK(acc, accel_end_training(acc));
    accel_free(acc);
    return 0;
}
