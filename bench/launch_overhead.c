/*
 * Cost of `accel launch --num_processes 2 /bin/true` end to end, against the floor any
 * launcher pays: forking and exec'ing /bin/true twice and waiting for both, measured in the
 * same run and interleaved with the launches so that machine noise hits both alike.
 *   launch_overhead [PATH_TO_ACCEL] [RUNS]
 * PATH_TO_ACCEL defaults to ../accel next to this binary (build/bench/ -> build/accel).
 * Prints median and p90 wall time in ms and the ratio; the target is a median under 20 ms.
 */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

static pid_t spawn(char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* As spawn, with the child's stdout on /dev/null. */
static pid_t spawn_quiet(char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Waits for pid; returns its exit status (-1 if it did not exit normally). */
static int wait_for(pid_t pid)
{
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
        return -1;
    }
    return WEXITSTATUS(st);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v and returns the q-quantile (nearest rank). */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv)
{
    char accel_path[4096];
    if (argc > 1) {
        snprintf(accel_path, sizeof(accel_path), "%s", argv[1]);
    } else {
        char self[4096];
        ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (k <= 0) {
            fprintf(stderr, "launch_overhead: cannot find myself; pass the path of accel\n");
            return 1;
        }
        self[k] = '\0';
        snprintf(accel_path, sizeof(accel_path), "%s/../accel", dirname(self));
    }
    int runs = argc > 2 ? atoi(argv[2]) : 100;
    if (runs < 1 || access(accel_path, X_OK) != 0) {
        fprintf(stderr, "usage: launch_overhead [PATH_TO_ACCEL] [RUNS>=1] (%s not executable?)\n",
                accel_path);
        return 1;
    }

    char *launch_argv[] = {accel_path, "launch", "--num_processes", "2", "/bin/true", NULL};
    char *true_argv[] = {"/bin/true", NULL};
    char *version_argv[] = {accel_path, "--version", NULL};
    double *t_launch = calloc((size_t)runs, sizeof(double));
    double *t_base = calloc((size_t)runs, sizeof(double));
    double *t_start = calloc((size_t)runs, sizeof(double));
    if (t_launch == NULL || t_base == NULL || t_start == NULL) {
        fprintf(stderr, "launch_overhead: out of memory\n");
        return 1;
    }

    /* Warm the page cache and the dynamic loader's files before timing anything. */
    for (int i = 0; i < 3; i++) {
        if (wait_for(spawn(launch_argv)) != 0) {
            fprintf(stderr, "launch_overhead: '%s launch --num_processes 2 /bin/true' failed\n",
                    accel_path);
            return 1;
        }
        wait_for(spawn(true_argv));
    }
    for (int i = 0; i < runs; i++) {
        double t0 = (accel__now() * 1e3);
        pid_t a = spawn(true_argv), b = spawn(true_argv);
        int ok = wait_for(a) == 0 && wait_for(b) == 0;
        double t1 = (accel__now() * 1e3);
        ok = ok && wait_for(spawn(launch_argv)) == 0;
        double t2 = (accel__now() * 1e3);
        /* The launcher's own start-up (exec of accel, dynamic loading), for reference. */
        double t3 = (accel__now() * 1e3);
        ok = ok && wait_for(spawn_quiet(version_argv)) == 0;
        t_start[i] = (accel__now() * 1e3) - t3;
        if (!ok) {
            fprintf(stderr, "launch_overhead: a run failed\n");
            return 1;
        }
        t_base[i] = t1 - t0;
        t_launch[i] = t2 - t1;
    }

    double base_med = quantile(t_base, runs, 0.5), base_p90 = quantile(t_base, runs, 0.9);
    double launch_med = quantile(t_launch, runs, 0.5), launch_p90 = quantile(t_launch, runs, 0.9);
    printf("launch overhead, %d runs each, interleaved (wall time, ms)\n", runs);
    printf("%-52s %10s %10s\n", "command", "median", "p90");
    printf("%-52s %10.3f %10.3f\n", "baseline: fork+exec+wait /bin/true x2 (concurrent)", base_med,
           base_p90);
    printf("%-52s %10.3f %10.3f\n", "accel launch --num_processes 2 /bin/true", launch_med,
           launch_p90);
    printf("%-52s %10.3f %10.3f\n", "reference: fork+exec+wait accel --version",
           quantile(t_start, runs, 0.5), quantile(t_start, runs, 0.9));
    printf("ratio launch / baseline (median): %.2f\n", launch_med / base_med);
    printf("target median < 20 ms: %s\n", launch_med < 20.0 ? "met" : "NOT met");
    free(t_launch);
    free(t_base);
    free(t_start);
    return 0;
}
