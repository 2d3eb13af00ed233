/*
 * Checkpoint I/O benchmark: write+fsync throughput of a safetensors file holding a model's fp32
 * weights plus AdamW's two moments (3 tensors of N floats; N = 100M by default, 1.2 GB) against
 * `dd if=/dev/zero ... conv=fsync` of the same size on the same disk in the same run, then the
 * load time with mmap (open + validation, and touching every page), warm and after evicting the
 * file from the page cache.
 *   usage: bench/ckpt [--params MILLIONS] [--dir DIR] [--state_only 1]   (DIR default ".",
 *          same disk as dd)
 * Prints best-of-3 times and the ratio ours / dd (target >= 0.9).
 * Then the same for accel_save_state of a prepared 100M-parameter model with AdamW (model +
 * optimizer folder, 1.2 GB, staging folder + fsyncs + marker + rename) against dd of the same
 * size, and accel_load_state (validate, verify the checksums, copy into the live buffers)
 * fused (checksums checked while copying) and two-pass (every checksum before any copy) against
 * the same load without checksums (the same files under a version-1 marker) and the checksum
 * pass alone: medians [min-max] of 7 interleaved rounds with the page cache warm and of 3 after
 * evicting the files, the throughput kept with verification (target >= 0.9) in wall and CPU
 * time.
 *   --state_only 1 skips the single-file and dd comparisons of the writes (load_state only).
 */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel/accel.h"
#include "bench.h"
#include "ckpt/state.h"
#include "ckpt/verify.h"
#include "core/internal.h"

/* CPU seconds of this process, all threads (the copies and checksums run on several). */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Opens, validates and reads one byte per 4 KiB page of every tensor. */
static void load(const char *path, double *t_open, double *t_touch, unsigned long long *sum)
{
    double t0 = accel__now();
    accel_safetensors *st;
    if (accel_safetensors_open(&st, path) != ACCEL_OK) {
        fprintf(stderr, "bench/ckpt: %s\n", accel_last_error(NULL));
        exit(1);
    }
    double t1 = accel__now();
    for (size_t i = 0; i < accel_safetensors_count(st); i++) {
        accel_tensor t;
        accel_safetensors_tensor(st, i, &t);
        const volatile unsigned char *p = t.data;
        size_t nb = accel_tensor_nbytes(&t);
        for (size_t k = 0; k < nb; k += 4096) {
            *sum += p[k];
        }
    }
    double t2 = accel__now();
    accel_safetensors_close(st);
    *t_open = t1 - t0;
    *t_touch = t2 - t1;
}

static void evict_tree(const char *dir)
{
    static const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        evict(p);
    }
}

/* save_state / load_state of a prepared model of n fp32 parameters with AdamW. */
/* One of our writers, timed against dd: writes `nbytes` somewhere, 0 on success. */
typedef int (*writer_fn)(void *ctx);

/*
 * The comparison every figure of this benchmark comes from: 3 repetitions, each timing dd with
 * fsync of the same size into `dd_path` and one call of `write`, in alternating order so that
 * neither always meets the other's writeback; prints each repetition and the best rates.
 * `label` names the writer. Returns 0, or 1 when dd or the writer failed.
 */
static int compare_with_dd(const char *label, const char *dd_path, size_t nbytes, writer_fn write,
                           void *ctx)
{
    char cmd[1200];
    size_t mib = (nbytes + (1u << 20) - 1) >> 20;
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s bs=1M count=%zu conv=fsync status=none",
             dd_path, mib);
    double best_ours = 1e30, best_dd = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t_dd = 0, t_ours = 0;
        for (int k = 0; k < 2; k++) {
            int dd_turn = (k == 0) == (rep % 2 == 0);
            unlink(dd_path);
            double t0 = accel__now();
            if (dd_turn) {
                if (system(cmd) != 0) {
                    fprintf(stderr, "bench/ckpt: dd failed\n");
                    return 1;
                }
                t_dd = accel__now() - t0;
            } else {
                if (write(ctx) != 0) {
                    return 1;
                }
                t_ours = accel__now() - t0;
            }
        }
        unlink(dd_path);
        printf("  rep %d: dd %.3f s (%.0f MB/s)  %s %.3f s (%.0f MB/s)\n", rep, t_dd,
               (double)(mib << 20) / t_dd / 1e6, label, t_ours, (double)nbytes / t_ours / 1e6);
        best_dd = t_dd < best_dd ? t_dd : best_dd;
        best_ours = t_ours < best_ours ? t_ours : best_ours;
    }
    double dd_rate = (double)(mib << 20) / best_dd, our_rate = (double)nbytes / best_ours;
    printf("%s: dd %.0f MB/s, accel %.0f MB/s, ratio accel/dd = %.2f\n", label, dd_rate / 1e6,
           our_rate / 1e6, our_rate / dd_rate);
    return 0;
}

typedef struct state_writer {
    accel *acc;
    const char *dir;
} state_writer;

static int write_state(void *ctx)
{
    state_writer *w = ctx;
    if (accel_save_state(w->acc, w->dir) != ACCEL_OK) {
        fprintf(stderr, "bench/ckpt: %s\n", accel_last_error(w->acc));
        return 1;
    }
    return 0;
}

typedef struct st_writer {
    const char *path;
    const accel_named_tensor *ts;
} st_writer;

static int write_safetensors(void *ctx)
{
    st_writer *w = ctx;
    unlink(w->path);
    if (accel_safetensors_write(w->path, w->ts, 3, NULL, 0) != ACCEL_OK) {
        fprintf(stderr, "bench/ckpt: %s\n", accel_last_error(NULL));
        return 1;
    }
    return 0;
}

/* plain_dir: hard links to state_dir's files with its marker rewritten as version 1 (sizes
 * only, no checksums), so the same bytes load without verification. */
static int make_plain_copy(const char *state_dir, const char *plain_dir)
{
    char cmd[1600], marker[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -al %s %s", plain_dir, state_dir, plain_dir);
    snprintf(marker, sizeof marker, "%s/accel_checkpoint.json", plain_dir);
    json_error_t jerr;
    json_t *root = system(cmd) == 0 ? json_load_file(marker, 0, &jerr) : NULL;
    json_t *files = root ? json_object_get(root, "files") : NULL;
    if (files == NULL) {
        fprintf(stderr, "bench/ckpt: cannot make the plain copy %s\n", plain_dir);
        json_decref(root);
        return 1;
    }
    const char *name;
    json_t *v;
    json_object_foreach(files, name, v)
    {
        json_object_set(files, name, json_object_get(v, "nbytes"));
    }
    json_object_set_new(root, "version", json_integer(1));
    json_object_del(root, "checksum");
    json_object_del(root, "marker_xxh3");
    /* A new file, not the hard-linked one: the verified folder's marker stays intact. */
    int rc = unlink(marker) != 0 || json_dump_file(root, marker, JSON_INDENT(2)) != 0;
    json_decref(root);
    if (rc != 0) {
        fprintf(stderr, "bench/ckpt: cannot write %s\n", marker);
    }
    return rc;
}

static int bench_state(const char *dir, size_t n, int no_dd)
{
    accel *acc;
    accel_model *m;
    if (accel_init(&acc, NULL) != ACCEL_OK || accel_model_new(acc, &m) != ACCEL_OK) {
        fprintf(stderr, "bench/ckpt: %s\n", accel_last_error(NULL));
        return 1;
    }
    const int n_params = 10; /* ten 10M-element matrices for the default size */
    for (int i = 0; i < n_params; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d.weight", i);
        int64_t rows = (int64_t)(n / (size_t)n_params / 1000);
        accel_model_add_param(m, name, 2, (int64_t[]){rows, 1000}, NULL);
    }
    accel_optimizer *opt = accel_adamw(acc, m, NULL);
    if (opt == NULL || accel_prepare(acc, m, opt) != ACCEL_OK) {
        fprintf(stderr, "bench/ckpt: %s\n", accel_last_error(acc));
        return 1;
    }
    size_t numel = accel_model_numel(m), nbytes = 3 * numel * sizeof(float);
    float *w = accel_model_master(m);
    for (size_t i = 0; i < numel; i++) {
        w[i] = (float)(i % 1000) * 0.001f;
    }
    char state_dir[512], dd_path[512];
    snprintf(state_dir, sizeof state_dir, "%s/bench_state", dir);
    snprintf(dd_path, sizeof dd_path, "%s/bench_state.dd", dir);
    printf("\nsave_state: %zu parameters + AdamW = %.2f GB to %s (best of 3)\n", numel,
           (double)nbytes / 1e9, state_dir);
    state_writer sw = {acc, state_dir};
    if (no_dd ? write_state(&sw) != 0
              : compare_with_dd("save_state", dd_path, nbytes, write_state, &sw) != 0) {
        return 1;
    }
    /* The same folder without checksums: hard links to the same files (so the same page cache
     * state) under a version-1 marker, which is checked for sizes only. */
    char plain_dir[512];
    snprintf(plain_dir, sizeof plain_dir, "%s/bench_state_plain", dir);
    if (make_plain_copy(state_dir, plain_dir) != 0) {
        return 1;
    }
    /* Warm: 7 rounds after one load of each folder that fills the page cache; evicted: 3
     * rounds, each measurement after evicting. A round times a fused verified load (checksums
     * checked while copying: what a load with nothing to lose does), a two-pass verified load
     * (every checksum before any copy: a load with something to lose), a plain load (the same
     * bytes under a version-1 marker: no checksums) and the checksum pass alone
     * (accel__ckpt_verify), in rotating order, so drift in the machine's load hits all four;
     * throughput kept is judged on the medians, in wall time and in the process's CPU time
     * (all threads, less sensitive to other programs on the machine). */
    const char *dirs[3] = {state_dir, state_dir, plain_dir};
    static const accel__fused_mode modes[3] = {ACCEL__FUSED_ALWAYS, ACCEL__FUSED_NEVER,
                                               ACCEL__FUSED_AUTO};
    static const char *what[4] = {"fused", "two-pass", "plain", "checksum pass"};
    for (int warm = 1; warm >= 0; warm--) {
        int reps = warm ? 7 : 3;
        double t[4][7], c[4][7];
        for (int v = 0; warm && v < 3; v += 2) {
            if (accel_load_state(acc, dirs[v]) != ACCEL_OK) {
                fprintf(stderr, "bench/ckpt: %s\n", accel_last_error(acc));
                return 1;
            }
        }
        for (int r = 0; r < reps; r++) {
            for (int k = 0; k < 4; k++) {
                int v = (r + k) % 4;
                if (!warm) {
                    evict_tree(state_dir); /* the plain folder's files are the same inodes */
                }
                if (v < 3) {
                    accel__ckpt_set_fused_mode(acc, modes[v]);
                }
                double t0 = accel__now(), c0 = cpu_seconds();
                accel_status st = v < 3 ? accel_load_state(acc, dirs[v])
                                        : accel__ckpt_verify(state_dir, 0, 1, NULL);
                if (st != ACCEL_OK) {
                    fprintf(stderr, "bench/ckpt: %s: %s\n", what[v], accel_last_error(acc));
                    return 1;
                }
                t[v][r] = accel__now() - t0;
                c[v][r] = cpu_seconds() - c0;
            }
            printf("  %s rep %d: fused %.3f s (cpu %.3f), two-pass %.3f s (cpu %.3f), plain "
                   "%.3f s (cpu %.3f), checksum pass %.3f s (cpu %.3f)\n",
                   warm ? "warm" : "evicted", r, t[0][r], c[0][r], t[1][r], c[1][r], t[2][r],
                   c[2][r], t[3][r], c[3][r]);
        }
        double med[4], cmed[4], lo[4], hi[4];
        for (int v = 0; v < 4; v++) {
            med[v] = bench_median(t[v], reps); /* sorts */
            lo[v] = t[v][0];
            hi[v] = t[v][reps - 1];
            cmed[v] = bench_median(c[v], reps);
        }
        printf("load_state (%s, %d rounds): plain (version-1 marker, no checksums) median %.3f s "
               "(%.0f MB/s) [%.3f-%.3f]\n",
               warm ? "page cache warm" : "evicted", reps, med[2], (double)nbytes / med[2] / 1e6,
               lo[2], hi[2]);
        for (int v = 0; v < 2; v++) {
            printf("  verified, %s: median %.3f s (%.0f MB/s) [%.3f-%.3f]: throughput kept = "
                   "%.3f [%.3f-%.3f] (target >= 0.9); CPU time kept = %.3f\n",
                   what[v], med[v], (double)nbytes / med[v] / 1e6, lo[v], hi[v], med[2] / med[v],
                   med[2] / hi[v], med[2] / lo[v], cmed[2] / cmed[v]);
        }
        printf("  checksum pass alone%s: median %.3f s (cpu %.3f s)\n",
               warm ? "" : " (it reads the disk)", med[3], cmed[3]);
    }
    accel__ckpt_set_fused_mode(acc, ACCEL__FUSED_AUTO);
    char rm[1100];
    snprintf(rm, sizeof rm, "rm -rf %s %s", state_dir, plain_dir);
    int rc = system(rm);
    accel_free(acc);
    return rc != 0;
}

int main(int argc, char **argv)
{
    double millions = 100;
    const char *dir = ".";
    int state_only = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--params") == 0) {
            millions = atof(argv[i + 1]);
        } else if (strcmp(argv[i], "--dir") == 0) {
            dir = argv[i + 1];
        } else if (strcmp(argv[i], "--state_only") == 0) {
            state_only = atoi(argv[i + 1]);
        }
    }
    size_t n = (size_t)(millions * 1e6);
    if (state_only) {
        return bench_state(dir, n, 1);
    }
    size_t nbytes = 3 * n * sizeof(float);
    float *bufs[3];
    for (int b = 0; b < 3; b++) {
        bufs[b] = malloc(n * sizeof(float));
        if (bufs[b] == NULL) {
            fprintf(stderr, "bench/ckpt: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            bufs[b][i] = (float)(i % 1000) * 0.001f + (float)b; /* real pages, not zero pages */
        }
    }
    accel_named_tensor ts[3] = {
        {"model.weight", accel_tensor_view(bufs[0], ACCEL_F32, 1, (int64_t[]){(int64_t)n})},
        {"optimizer.exp_avg", accel_tensor_view(bufs[1], ACCEL_F32, 1, (int64_t[]){(int64_t)n})},
        {"optimizer.exp_avg_sq", accel_tensor_view(bufs[2], ACCEL_F32, 1, (int64_t[]){(int64_t)n})},
    };
    char st_path[512], dd_path[512];
    snprintf(st_path, sizeof st_path, "%s/bench_ckpt.safetensors", dir);
    snprintf(dd_path, sizeof dd_path, "%s/bench_ckpt.dd", dir);
    printf("checkpoint write: 3 x %zu fp32 = %.2f GB to %s (best of 3, fsync included)\n", n,
           (double)nbytes / 1e9, dir);
    st_writer stw = {st_path, ts};
    if (compare_with_dd("write", dd_path, nbytes, write_safetensors, &stw) != 0) {
        return 1;
    }

    unsigned long long sum = 0;
    double to, tt;
    load(st_path, &to, &tt, &sum);
    printf("load (page cache warm): open+validate %.4f s, touch every page %.3f s (%.0f MB/s)\n",
           to, tt, (double)nbytes / tt / 1e6);
    evict(st_path);
    load(st_path, &to, &tt, &sum);
    printf("load (evicted, POSIX_FADV_DONTNEED): open+validate %.4f s, touch every page %.3f s "
           "(%.0f MB/s)\n",
           to, tt, (double)nbytes / tt / 1e6);
    unlink(st_path);
    for (int b = 0; b < 3; b++) {
        free(bufs[b]);
    }
    if (bench_state(dir, n, 0) != 0) {
        return 1;
    }
    return sum == 42 ? 2 : 0; /* keeps the touches observable */
}
