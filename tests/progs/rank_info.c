/*
 * Launcher test helper: prints the process layout the launcher gave it, one "key=value" line
 * per variable, then exits with --code C when its RANK equals --fail-rank R (else 0). Uses no
 * accel API, so it runs before any communication backend exists. With --fail-until K it fails
 * only while ACCEL_RESTART_COUNT is below K (accel launch --max_restarts). With --leak-shm it
 * creates /dev/shm/accel-<uid>-<ACCEL_JOB_ID>-leak<RANK> and leaves it, as a SIGKILLed shm backend
 * would, for the launcher's teardown to remove.
 *   rank_info [--fail-rank R] [--code C] [--fail-until K] [--leak-shm] [marker...]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *env_or(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

int main(int argc, char **argv)
{
    int fail_rank = -1, code = 1, fail_until = 1 << 30;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--leak-shm") == 0) {
            char path[256];
            snprintf(path, sizeof(path), "/dev/shm/accel-%u-%s-leak%s", (unsigned)getuid(),
                     getenv("ACCEL_JOB_ID") ? getenv("ACCEL_JOB_ID") : "none",
                     getenv("RANK") ? getenv("RANK") : "0");
            int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
            if (fd < 0) {
                perror(path);
                return 1;
            }
            close(fd);
            printf("leaked %s\n", path);
        }
        if (i + 1 >= argc) {
            break;
        }
        if (strcmp(argv[i], "--fail-rank") == 0) {
            fail_rank = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--code") == 0) {
            code = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--fail-until") == 0) {
            fail_until = atoi(argv[++i]);
        }
    }
    static const char *names[] = {"RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "ACCEL_JOB_ID",
                                  "OMP_NUM_THREADS",
                                  "ACCELERATE_MIXED_PRECISION",
                                  "ACCELERATE_USE_CPU",
                                  "ACCELERATE_DEBUG_MODE",
                                  "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                                  "ACCEL_ZERO_STAGE",
                                  "ACCEL_ZERO_SHARD_SIZE",
                                  "CUDA_VISIBLE_DEVICES",
                                  "ACCELERATE_CONFIG_FILE",
                                  "ACCEL_CONFIG_CHECKED",
                                  "ACCEL_RESTART_COUNT",
                                  "TORCHELASTIC_RESTART_COUNT",
                                  "GROUP_RANK",
                                  "ACCEL_NUM_MACHINES",
                                  "ACCEL_STORE_SERVED",
                                  "ROLE_NAME",
                                  "ROLE_RANK",
                                  "ROLE_WORLD_SIZE",
                                  "GROUP_WORLD_SIZE",
                                  "TORCHELASTIC_RUN_ID"};
    const char *rank = env_or("RANK");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        printf("rank %s %s=%s\n", rank, names[i], env_or(names[i]));
    }
    fflush(stdout);
    int restart = getenv("ACCEL_RESTART_COUNT") ? atoi(getenv("ACCEL_RESTART_COUNT")) : 0;
    if (fail_rank >= 0 && getenv("RANK") != NULL && atoi(getenv("RANK")) == fail_rank &&
        restart < fail_until) {
        fprintf(stderr, "rank %d: failing on purpose with exit code %d\n", fail_rank, code);
        fprintf(stderr, "(restart count %d)\n", restart);
        return code;
    }
    return 0;
}
