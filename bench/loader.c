/*
 * Token-file loader throughput: samples/s with context 1024 and batch 16, shuffled, with 0 and
 * 2 workers, against a bare loop that copies the same windows out of the same mmap into an
 * int32 batch (the ceiling). Ratios are taken within one run. Usage: loader [n_tokens]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "accel/data.h"
#include "core/internal.h"

enum { T = 1024, B = 16 };

int main(int argc, char **argv)
{
    int64_t ntok = argc > 1 ? atoll(argv[1]) : 32 * 1024 * 1024;
    char path[] = "/tmp/accel_bench_loader_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    FILE *f = fdopen(fd, "wb");
    int32_t hdr[256] = {20240520, 1, (int32_t)ntok};
    fwrite(hdr, sizeof(hdr), 1, f);
    uint16_t *buf = malloc(1 << 20);
    for (int64_t done = 0; done < ntok;) {
        int64_t n = ntok - done < (1 << 19) ? ntok - done : (1 << 19);
        for (int64_t i = 0; i < n; i++) {
            buf[i] = (uint16_t)((done + i) * 7919 % 50257);
        }
        fwrite(buf, 2, (size_t)n, f);
        done += n;
    }
    fclose(f);
    free(buf);

    accel *acc;
    if (accel_init(&acc, NULL) != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error(NULL));
        return 1;
    }
    accel_token_dataset_options to = accel_token_dataset_options_default();
    to.path = path;
    to.context = T;
    accel_dataset *ds;
    if (accel_token_dataset_open(&ds, &to) != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error(NULL));
        return 1;
    }
    int64_t windows = ds->len(ds->ctx);

    /* Ceiling: the same shuffled window copies straight out of an mmap of the file. */
    int rfd = open(path, O_RDONLY);
    size_t map_nbytes = 1024 + (size_t)ntok * 2;
    const unsigned char *map = mmap(NULL, map_nbytes, PROT_READ, MAP_PRIVATE, rfd, 0);
    close(rfd);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    const uint16_t *tok = (const uint16_t *)(map + 1024);
    int32_t *in = malloc(sizeof(int32_t) * B * T), *tg = malloc(sizeof(int32_t) * B * T);
    double t0 = accel__now();
    int64_t samples = 0;
    uint64_t x = 88172645463325252ull, sink = 0;
    for (int64_t bidx = 0; bidx < windows / B; bidx++) {
        for (int r = 0; r < B; r++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int64_t w = (int64_t)(x % (uint64_t)windows);
            for (int t = 0; t < T; t++) {
                in[r * T + t] = tok[w * T + t];
                tg[r * T + t] = tok[w * T + t + 1];
            }
        }
        samples += B;
        sink += (uint64_t)in[(bidx * 31) % (B * T)] + (uint64_t)tg[(bidx * 17) % (B * T)];
    }
    double ceiling = (double)samples / (accel__now() - t0);
    printf("bare loop over the mmap (ceiling): %.0f samples/s (%lld windows, checksum %llu)\n",
           ceiling, (long long)windows, (unsigned long long)(sink & 0xff));

    for (int workers = 0; workers <= 2; workers += 2) {
        accel_loader_options o = accel_loader_options_default();
        o.batch_size = B;
        o.shuffle = 1;
        o.drop_last = 1;
        o.num_workers = workers;
        accel_loader *l;
        if (accel_loader_new(acc, ds, &o, &l) != ACCEL_OK) {
            fprintf(stderr, "loader: %s\n", accel_last_error(acc));
            return 1;
        }
        accel_batch *b;
        int64_t n = 0;
        double t1 = accel__now();
        while (accel_loader_next(l, &b) == ACCEL_OK) {
            n += b->rows;
        }
        double rate = (double)n / (accel__now() - t1);
        printf("loader, %d workers: %.0f samples/s (%.2fx of ceiling)\n", workers, rate,
               rate / ceiling);
        accel_loader_free(l);
    }
    free(in);
    free(tg);
    munmap((void *)map, map_nbytes);
    accel_dataset_free(ds);
    accel_free(acc);
    unlink(path);
    return 0;
}
