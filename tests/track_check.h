/*
 * Test helpers for the trackers' files (tests/unit/test_track.c, tests/progs/track_faults.c).
 */
#ifndef ACCEL_TESTS_TRACK_CHECK_H
#define ACCEL_TESTS_TRACK_CHECK_H

#include <dirent.h>
#include <sys/stat.h>

#include "check.h"

/* The size of the file tracker (jsonl, csv, tensorboard or mlflow) appends a "loss" record to,
 * in its run folder run, named into path (n bytes). */
static inline long long track_record_file_size(const char *run, const char *tracker, char *path,
                                               size_t n)
{
    path[0] = '\0';
    if (strcmp(tracker, "tensorboard") == 0) {
        DIR *d = opendir(run);
        CHECK(d != NULL);
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
                snprintf(path, n, "%s/%s", run, e->d_name);
            }
        }
        closedir(d);
    } else {
        snprintf(path, n, "%s/%s", run,
                 strcmp(tracker, "mlflow") == 0 ? "metrics/loss"
                 : strcmp(tracker, "csv") == 0  ? "metrics.csv"
                                                : "metrics.jsonl");
    }
    struct stat sb;
    CHECK_MSG(stat(path, &sb) == 0, "%s", path);
    return (long long)sb.st_size;
}

#endif /* ACCEL_TESTS_TRACK_CHECK_H */
