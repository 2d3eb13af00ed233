/*
 * cuda_ckpt: checkpoint throughput from GPU memory (issue 14's benchmark): accel_save_state of
 * a model and its AdamW state in device memory, against the raw floor of the same bytes: one
 * cudaMemcpy to pinned host memory, write() to a file in the same folder, fsync (save_state
 * fsyncs every file too). ratio = raw time / save_state time (target >= 0.9).
 *
 *     build-cuda/bench/cuda_ckpt [--dir DIR] [--layers 6] [--hidden 4096] [--reps 2]
 *
 * The model is --layers square fp32 weights of --hidden (default 100.7 M parameters, 1.2 GB
 * with AdamW's two moments). DIR (default $TMPDIR or /tmp) decides the filesystem; what is
 * written there is removed. The two are alternated --reps times and each keeps its best.
 * Until save_state copies device memory (docs/cuda.md) it fails with ACCEL_EUNSUPPORTED: the
 * row then says "unsupported" and the raw figure is still measured (on the bytes of the
 * weights and both moments). One process. Prints a table, then a summary row for
 * bench/cuda_all.sh. Exits 77 when this process has no GPU.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_bench.h"

/* Total size of the regular files under path (a checkpoint folder is flat, but recurse). */
static size_t tree_bytes(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        return S_ISREG(st.st_mode) ? (size_t)st.st_size : 0;
    }
    size_t sum = 0;
    DIR *d = opendir(path);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            char sub[4096];
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            sum += tree_bytes(sub);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return sum;
}

static void remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                char sub[4096];
                snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
                remove_tree(sub);
            }
        }
        if (d != NULL) {
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* The raw floor: dev -> pinned (one cudaMemcpy), write() it all to `file`, fsync. Seconds. */
static double raw_save(const char *file, const void *dev, void *pinned, size_t nbytes)
{
    double t0 = bench_now();
    CUDA_CHECK(cudaMemcpy(pinned, dev, nbytes, cudaMemcpyDeviceToHost));
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "cuda_ckpt: cannot create %s: %s\n", file, strerror(errno));
        exit(1);
    }
    for (size_t done = 0; done < nbytes;) {
        ssize_t w = write(fd, (const char *)pinned + done, nbytes - done);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            fprintf(stderr, "cuda_ckpt: writing %s: %s\n", file, strerror(errno));
            exit(1);
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        fprintf(stderr, "cuda_ckpt: fsync/close %s: %s\n", file, strerror(errno));
        exit(1);
    }
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    int layers = 6, hidden = 4096, reps = 2;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0) {
            dir = argv[i + 1];
        } else if (strcmp(argv[i], "--layers") == 0) {
            layers = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--hidden") == 0) {
            hidden = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "cuda_ckpt: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (layers < 1 || hidden < 1 || reps < 1) {
        fprintf(stderr, "cuda_ckpt: sizes and --reps must be positive\n");
        return 2;
    }
    accel *acc = bench_cuda_init("cuda_ckpt", NULL);
    if (accel_num_processes(acc) != 1) {
        fprintf(stderr, "cuda_ckpt: runs as one process\n");
        return 2;
    }
    accel_model *m;
    ACCEL_CHECK(accel_model_new(acc, &m));
    for (int l = 0; l < layers; l++) {
        char name[32];
        snprintf(name, sizeof(name), "layers.%d.weight", l);
        const int64_t shape[2] = {hidden, hidden};
        ACCEL_CHECK(accel_model_add_param(m, name, 2, shape, NULL));
    }
    ACCEL_CHECK(accel_model_alloc(m));
    const size_t numel = accel_model_numel(m);
    float *master = accel_cuda_model_master(m);
    ACCEL_CHECK(master ? ACCEL_OK : accel_last_status(acc));
    CUDA_CHECK(cudaMemset(master, 0x3c, numel * sizeof(float))); /* ~0.0115 everywhere */
    accel_adam_options ao = accel_adamw_options_default();
    accel_optimizer *opt = accel_adamw(acc, m, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_prepare(acc, m, opt));
    ACCEL_CHECK(accel_optimizer_step(opt)); /* the moments exist from the first step on */
    CUDA_CHECK(cudaDeviceSynchronize());

    char ckpt[4096], raw[4096];
    snprintf(ckpt, sizeof(ckpt), "%s/accel_cuda_ckpt_%d", dir, (int)getpid());
    snprintf(raw, sizeof(raw), "%s/accel_cuda_ckpt_raw_%d.bin", dir, (int)getpid());

    /* Probe once: the bytes save_state writes, or that it cannot. */
    accel_status st = accel_save_state(acc, ckpt);
    if (st != ACCEL_OK && st != ACCEL_EUNSUPPORTED) {
        fprintf(stderr, "cuda_ckpt: accel_save_state: %s: %s\n", accel_status_name(st),
                accel_last_error(acc));
        return 1;
    }
    const int supported = st == ACCEL_OK;
    char why[512];
    snprintf(why, sizeof(why), "%s", supported ? "" : accel_last_error(acc));
    const size_t nbytes = supported ? tree_bytes(ckpt) : 3 * numel * sizeof(float);
    remove_tree(ckpt);

    void *src = NULL, *pinned = NULL;
    CUDA_CHECK(cudaMalloc(&src, nbytes));
    CUDA_CHECK(cudaMemset(src, 0x3c, nbytes));
    CUDA_CHECK(cudaHostAlloc(&pinned, nbytes, cudaHostAllocDefault));
    double t_raw = 1e30, t_acc = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = raw_save(raw, src, pinned, nbytes);
        t_raw = t < t_raw ? t : t_raw;
        unlink(raw);
        if (supported) {
            double t0 = bench_now();
            ACCEL_CHECK(accel_save_state(acc, ckpt));
            t = bench_now() - t0;
            t_acc = t < t_acc ? t : t_acc;
            remove_tree(ckpt);
        }
    }
    const double gb = (double)nbytes / 1e9;
    accel_print(acc,
                "cuda_ckpt: %s; %.1f M parameters + AdamW moments on the GPU, %.3f GB written to "
                "%s, fsynced, best of %d\n",
                bench_gpu_name(acc), (double)numel / 1e6, gb, dir, reps);
    accel_print(acc, "  raw cudaMemcpy + write  %8.3f s  %7.2f GB/s\n", t_raw, gb / t_raw);
    if (supported) {
        accel_print(acc, "  accel_save_state        %8.3f s  %7.2f GB/s  ratio %.3f\n", t_acc,
                    gb / t_acc, t_raw / t_acc);
        accel_print(acc,
                    "| checkpoint from GPU, save_state vs raw | %.2f GB, fsynced, %s | %.2f vs "
                    "%.2f GB/s, ratio %.3f | >= 0.9 |\n",
                    gb, dir, gb / t_acc, gb / t_raw, t_raw / t_acc);
    } else {
        accel_print(acc, "  accel_save_state        unsupported (%s)\n", why);
        accel_print(acc,
                    "| checkpoint from GPU, save_state vs raw | %.2f GB, fsynced, %s | "
                    "unsupported vs %.2f GB/s | >= 0.9 |\n",
                    gb, dir, gb / t_raw);
    }
    CUDA_CHECK(cudaFree(src));
    CUDA_CHECK(cudaFreeHost(pinned));
    accel_free(acc);
    return 0;
}
