/*
 * Logging, tracking and profiling across processes: main-process-only lines, every process,
 * in_order (rank order, barrier per turn), trackers started and written only by the main
 * process (blank tracker elsewhere), a progress bar drawn only by the main process, and one
 * profile_<rank>.json per process after accel_profile_end's barrier.
 * ACCEL_TEST_NPROCS: 3
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

int main(void)
{
    const char *job = getenv("ACCEL_JOB_ID");
    char dir[256];
    snprintf(dir, sizeof(dir), "/tmp/accel_test_logging_%s", job ? job : "solo");
    CHECK(mkdir(dir, 0777) == 0 || errno == EEXIST);

    accel_options o = accel_options_default();
    o.project_dir = dir;
    o.log_with = "jsonl";
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);

    /* ---- loggers writing to one shared file, appended ---- */
    char logpath[300];
    snprintf(logpath, sizeof(logpath), "%s/log.txt", dir);
    if (rank == 0) {
        FILE *t = fopen(logpath, "w");
        CHECK(t != NULL);
        fclose(t);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    FILE *f = fopen(logpath, "a");
    CHECK(f != NULL);
    setvbuf(f, NULL, _IOLBF, 0);
    accel_logger *lg = accel_get_logger(acc, "dist");
    CHECK(lg != NULL);
    accel_logger_set_stream(lg, f);

    accel_logger_info(lg, "main only");
    accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_ALL_PROCESSES, "everyone");
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    for (int round = 0; round < 2; round++) {
        /* Later ranks arrive first on purpose: in_order must still print 0, 1, 2. */
        usleep((useconds_t)(n - 1 - rank) * 20000);
        accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "ordered %d", round);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));

    /* ---- trackers: main process only ---- */
    accel_value cfg[] = {ACCEL_SCALAR("world", n)};
    CHECK_OK(acc, accel_init_trackers(acc, "dist", cfg, 1));
    accel_tracker *t = accel_get_tracker(acc, "jsonl");
    CHECK(t != NULL);
    if (rank == 0) {
        CHECK(accel_tracker_run_dir(t) != NULL);
    } else {
        CHECK(strcmp(accel_tracker_name(t), "blank") == 0 && accel_tracker_state(t) == NULL);
    }
    for (int s = 0; s < 4; s++) {
        accel_value v[] = {ACCEL_SCALAR("loss", 1.0 + rank), ACCEL_SCALAR("rank", rank)};
        CHECK_OK(acc, accel_log(acc, v, 2, s));
    }
    CHECK_OK(acc, accel_end_training(acc));

    /* ---- progress bar: drawn by the main process only ---- */
    char progpath[300];
    snprintf(progpath, sizeof(progpath), "%s/progress_%d.txt", dir, rank);
    FILE *pf = fopen(progpath, "w");
    CHECK(pf != NULL);
    accel_progress_options po = accel_progress_options_default();
    po.total = 4;
    po.stream = pf;
    po.tty = 0;
    po.percent_step = 50;
    accel_progress *p;
    CHECK_OK(acc, accel_progress_new(acc, &po, &p));
    for (int s = 0; s < 4; s++) {
        accel_progress_update(p, 1);
    }
    accel_progress_close(p);
    fclose(pf);

    /* ---- profiler: one file per process, all present after the end barrier ---- */
    CHECK_OK(acc, accel_profile_begin(acc, dir));
    accel_profile_push(acc, "work");
    usleep(1000);
    accel_profile_pop(acc);
    CHECK_OK(acc, accel_profile_end(acc));

    CHECK_OK(acc, accel_wait_for_everyone(acc));
    int failed = 0;
    if (rank == 0) {
        const char *s = check_slurp(logpath);
        CHECK_MSG(check_count(s, "main only") == 1 &&
                      strstr(s, "[rank 0/3] dist INFO: main only\n"),
                  "%s", s);
        CHECK_MSG(check_count(s, "everyone") == n, "%s", s);
        for (int r = 0; r < n; r++) {
            char line[64];
            snprintf(line, sizeof(line), "[rank %d/%d] dist INFO: everyone\n", r, n);
            CHECK_MSG(strstr(s, line) != NULL, "%s", s);
        }
        /* The in_order lines: 0,1,2 for round 0, then 0,1,2 for round 1. */
        const char *q = s;
        for (int round = 0; round < 2; round++) {
            for (int r = 0; r < n; r++) {
                char line[64];
                snprintf(line, sizeof(line), "[rank %d/%d] dist INFO: ordered %d\n", r, n, round);
                const char *hit = strstr(q, line);
                CHECK_MSG(hit != NULL, "missing or out of order: %s in\n%s", line, s);
                q = hit + strlen(line);
            }
        }
        char path[400];
        snprintf(path, sizeof(path), "%s/dist/metrics.jsonl", dir);
        s = check_slurp(path);
        CHECK_MSG(check_count(s, "\n") == 4 && check_count(s, "\"rank\": 0") == 4, "%s", s);
        for (int r = 0; r < n; r++) {
            snprintf(path, sizeof(path), "%s/progress_%d.txt", dir, r);
            s = check_slurp(path);
            /* The 100 % line once: the close has nothing newer to print. */
            CHECK_MSG(r == 0 ? check_count(s, "4/4") == 1 : s[0] == '\0', "rank %d: %s", r, s);
            snprintf(path, sizeof(path), "%s/profile_%d.json", dir, r);
            s = check_slurp(path);
            char pid[32];
            snprintf(pid, sizeof(pid), "\"pid\": %d", r);
            CHECK_MSG(strstr(s, "\"work\"") != NULL && strstr(s, pid) != NULL, "%s", s);
        }
        printf("test_logging: ok (%d processes)\n", n);
    }
    fclose(f);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        failed |= system(cmd) != 0;
    }
    accel_free(acc);
    return failed;
}
