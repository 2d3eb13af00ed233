/* ACCEL_TEST_LABELS: gpu sim
 *
 * Reserved address ranges of the device seam (device.h, src/device/range.c) on the CPU, the
 * simulated GPU and, where one opens (a GPU, or the CUDA emulator build), CUDA:
 *  1. the granularity (a page on the CPU, 64 KiB simulated, 2 MiB on CUDA);
 *  2. map / unmap of byte ranges count per granule: neighbours sharing an edge granule keep it
 *     while either is mapped, `mapped` and `peak` follow, reset_peak restarts the peak;
 *  3. data written into mapped memory reads back (copies), across granule boundaries;
 *  4. bad input: past the end, unmapping what is not mapped (EINVAL, nothing changes);
 *  5. on the CPU, a read of an unmapped granule faults (a child process dies of SIGSEGV); on
 *     the simulated GPU, so does queued work that runs after its memory was unmapped;
 *  6. the backend's calls: a byte range of many granules is three allocations (its two edge
 *     granules and the run between), a neighbour sharing an edge granule adds none for it and
 *     keeps it (with its bytes) when the first goes, each allocation goes back in one call;
 *     in the emulator build the emulator's driver counts agree, and a map whose second
 *     cuMemCreate fails (an emulator hook) says so and gives back what it had made.
 * The CPU and the simulation are checked in every build; a CUDA build without a GPU then exits
 * 77 (its GPU part skipped).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "device/sim.h"

static void check_device(accel__device *d, int is_cpu)
{
    size_t g = 0;
    CHECK_OK(NULL, accel__dev_range_granularity(d, &g));
    CHECK_MSG(g >= 4096 && (g & (g - 1)) == 0, "%s: granularity %zu", accel__device_name(d), g);
    accel__dev_range *r;
    CHECK_OK(NULL, accel__dev_range_reserve(d, 4 * g + 1, &r)); /* rounded up: 5 granules */
    char *base = accel__dev_range_base(r);
    CHECK(base != NULL && accel__dev_range_mapped(r) == 0);

    /* Unit a: [g/2, g/2 + g) covers granules 0-1; unit b: [3g/2 + 8, 5g/2) covers 1-2. */
    size_t a_off = g / 2, a_len = g, b_off = 3 * g / 2 + 8, b_len = g - 8;
    CHECK_OK(NULL, accel__dev_range_map(r, a_off, a_len));
    CHECK(accel__dev_range_mapped(r) == 2 * g);
    CHECK_OK(NULL, accel__dev_range_map(r, b_off, b_len));
    CHECK(accel__dev_range_mapped(r) == 3 * g && accel__dev_range_peak(r) == 3 * g);
    CHECK(accel__dev_range_is_mapped(r, 0) && accel__dev_range_is_mapped(r, 2 * g) &&
          !accel__dev_range_is_mapped(r, 3 * g));

    /* Data across the granule boundary of a and into b. */
    size_t n = a_len + b_len + 8; /* a, the 8 bytes between, b: [g/2, 5g/2) */
    unsigned char *w = malloc(n), *back = malloc(n);
    CHECK(w != NULL && back != NULL);
    for (size_t k = 0; k < n; k++) {
        w[k] = (unsigned char)(k * 31 + 7);
    }
    CHECK_OK(NULL, accel__dev_copy(d, base + a_off, w, n,
                                   is_cpu ? ACCEL__COPY_H2H : ACCEL__COPY_H2D, NULL));
    memset(back, 0, n);
    CHECK_OK(NULL, accel__dev_copy(d, back, base + a_off, n,
                                   is_cpu ? ACCEL__COPY_H2H : ACCEL__COPY_D2H, NULL));
    CHECK(memcmp(w, back, n) == 0);

    /* a goes: granule 0 with it, granule 1 stays for b (and keeps b's bytes). */
    CHECK_OK(NULL, accel__dev_range_unmap(r, a_off, a_len));
    CHECK(accel__dev_range_mapped(r) == 2 * g && !accel__dev_range_is_mapped(r, 0) &&
          accel__dev_range_is_mapped(r, g));
    memset(back, 0, n);
    CHECK_OK(NULL, accel__dev_copy(d, back, base + b_off, b_len,
                                   is_cpu ? ACCEL__COPY_H2H : ACCEL__COPY_D2H, NULL));
    CHECK(memcmp(w + (b_off - a_off), back, b_len) == 0);

    /* Bad input changes nothing. */
    CHECK(accel__dev_range_unmap(r, a_off, a_len) == ACCEL_EINVAL); /* granule 0 not mapped */
    CHECK_MSG(strstr(accel_last_error(NULL), "not mapped"), "%s", accel_last_error(NULL));
    CHECK(accel__dev_range_map(r, 4 * g, 2 * g) == ACCEL_EINVAL);
    CHECK_MSG(strstr(accel_last_error(NULL), "past the end"), "%s", accel_last_error(NULL));
    CHECK(accel__dev_range_mapped(r) == 2 * g);

    accel__dev_range_reset_peak(r);
    CHECK(accel__dev_range_peak(r) == 2 * g);
    CHECK_OK(NULL, accel__dev_range_unmap(r, b_off, b_len));
    CHECK(accel__dev_range_mapped(r) == 0 && accel__dev_range_peak(r) == 2 * g);

    if (is_cpu) {
        /* Unmapped memory is not readable: the read kills a child. */
        fflush(NULL);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            signal(SIGSEGV, SIG_DFL);
            volatile char c = base[g];
            _exit(c == 42 ? 3 : 0);
        }
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
                  "a read of an unmapped granule did not fault (status %#x)", status);
    }
    accel__dev_range_release(r);
    accel__dev_range_release(NULL);
    free(w);
    free(back);
}

/* The emulator's count of calls of a driver entry point (tests/cuemu/vmm.c), in the CUDA
 * emulator build only. */
size_t cuemu_vmm_calls(const char *entry) __attribute__((weak));
void cuemu_vmm_fail_create(int n) __attribute__((weak));
size_t cuemu_vmm_mapped_bytes(void) __attribute__((weak));

/* The range's backend calls are `maps` and `unmaps` (and, in the emulator, the driver's). */
static void expect_calls(const accel__dev_range *r, size_t maps, size_t unmaps, size_t emu0[2])
{
    size_t m, u;
    accel__dev_range_calls(r, &m, &u);
    CHECK_MSG(m == maps && u == unmaps, "%zu map and %zu unmap calls, expected %zu and %zu", m, u,
              maps, unmaps);
    if (emu0 != NULL && cuemu_vmm_calls != NULL) {
        CHECK(cuemu_vmm_calls("cuMemCreate") - emu0[0] == maps &&
              cuemu_vmm_calls("cuMemMap") - emu0[0] == maps &&
              cuemu_vmm_calls("cuMemSetAccess") - emu0[0] == maps &&
              cuemu_vmm_calls("cuMemUnmap") - emu0[1] == unmaps &&
              cuemu_vmm_calls("cuMemRelease") - emu0[1] == unmaps);
    }
}

/* Item 6: allocations per run of granules that come and go together. */
static void check_coalescing(accel__device *d, int is_cpu, int is_cuda)
{
    size_t g = 0, emu0[2] = {0, 0};
    CHECK_OK(NULL, accel__dev_range_granularity(d, &g));
    if (is_cuda && cuemu_vmm_calls != NULL) {
        emu0[0] = cuemu_vmm_calls("cuMemCreate");
        emu0[1] = cuemu_vmm_calls("cuMemUnmap");
    }
    accel__dev_range *r;
    CHECK_OK(NULL, accel__dev_range_reserve(d, 12 * g, &r));
    char *base = accel__dev_range_base(r);
    /* a: [g/2, 10g + g/2) covers granule 0 in part, 1-9 whole, 10 in part. */
    CHECK_OK(NULL, accel__dev_range_map(r, g / 2, 10 * g));
    expect_calls(r, 3, 0, is_cuda ? emu0 : NULL);
    CHECK(accel__dev_range_mapped(r) == 11 * g);
    /* b: [10g + g/2, 11g + g/2) shares granule 10 and adds 11. */
    CHECK_OK(NULL, accel__dev_range_map(r, 10 * g + g / 2, g));
    expect_calls(r, 4, 0, is_cuda ? emu0 : NULL);
    unsigned char w[64], back[64];
    for (int k = 0; k < 64; k++) {
        w[k] = (unsigned char)(k * 7 + 1);
    }
    char *b_at = base + 11 * g - 32; /* across b's granule boundary, in the shared granule */
    CHECK_OK(NULL,
             accel__dev_copy(d, b_at, w, 64, is_cpu ? ACCEL__COPY_H2H : ACCEL__COPY_H2D, NULL));
    /* a goes: granule 0 and the run 1-9, two calls; granule 10 stays for b, with b's bytes. */
    CHECK_OK(NULL, accel__dev_range_unmap(r, g / 2, 10 * g));
    expect_calls(r, 4, 2, is_cuda ? emu0 : NULL);
    CHECK(accel__dev_range_mapped(r) == 2 * g && accel__dev_range_is_mapped(r, 10 * g) &&
          !accel__dev_range_is_mapped(r, 9 * g) && !accel__dev_range_is_mapped(r, 0));
    memset(back, 0, sizeof(back));
    CHECK_OK(NULL,
             accel__dev_copy(d, back, b_at, 64, is_cpu ? ACCEL__COPY_H2H : ACCEL__COPY_D2H, NULL));
    CHECK(memcmp(w, back, 64) == 0);
    CHECK_OK(NULL, accel__dev_range_unmap(r, 10 * g + g / 2, g));
    expect_calls(r, 4, 4, is_cuda ? emu0 : NULL);
    /* The whole range, granule-aligned: one allocation, one unmap. */
    CHECK_OK(NULL, accel__dev_range_map(r, 0, 12 * g));
    CHECK_OK(NULL, accel__dev_range_unmap(r, 0, 12 * g));
    expect_calls(r, 5, 5, is_cuda ? emu0 : NULL);
    CHECK(accel__dev_range_mapped(r) == 0 && accel__dev_range_peak(r) == 12 * g);
    if (is_cuda && cuemu_vmm_fail_create != NULL) {
        /* The emulator's second cuMemCreate fails: the map says so, naming the call, and gives
         * back the allocation it had made (nothing changes). */
        size_t creates = cuemu_vmm_calls("cuMemCreate"), unmaps = cuemu_vmm_calls("cuMemUnmap");
        cuemu_vmm_fail_create(2);
        CHECK(accel__dev_range_map(r, g / 2, 10 * g) == ACCEL_ENOMEM);
        CHECK_MSG(strstr(accel_last_error(NULL), "cuMemCreate") &&
                      strstr(accel_last_error(NULL), "out of memory"),
                  "%s", accel_last_error(NULL));
        expect_calls(r, 6, 6, NULL);
        CHECK(cuemu_vmm_calls("cuMemCreate") == creates + 2 &&
              cuemu_vmm_calls("cuMemUnmap") == unmaps + 1);
        CHECK(accel__dev_range_mapped(r) == 0 && !accel__dev_range_is_mapped(r, 0) &&
              cuemu_vmm_mapped_bytes() == 0);
        CHECK_OK(NULL, accel__dev_range_map(r, g / 2, 10 * g)); /* and works again */
        CHECK_OK(NULL, accel__dev_range_unmap(r, g / 2, 10 * g));
        expect_calls(r, 9, 9, NULL);
    }
    accel__dev_range_release(r);
}

/* A host "kernel" reading the first byte of its argument. */
static void read_byte(void *arg)
{
    volatile char *p = arg;
    (void)p[0];
}

/* The simulated GPU: work queued before an unmap that reads the unmapped memory crashes when
 * it runs (on a GPU: an illegal address), with the simulation's message. */
static void check_sim_unmap_race(accel__device *sim)
{
    size_t g;
    CHECK_OK(NULL, accel__dev_range_granularity(sim, &g));
    accel__dev_range *r;
    CHECK_OK(NULL, accel__dev_range_reserve(sim, g, &r));
    CHECK_OK(NULL, accel__dev_range_map(r, 0, g));
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        CHECK_OK(NULL, accel__sim_launch(sim, NULL, read_byte, accel__dev_range_base(r)));
        CHECK_OK(NULL, accel__dev_range_unmap(r, 0, g)); /* no sync first: the bug */
        (void)accel__stream_sync(sim, NULL);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    /* Killed by the fault, or (under AddressSanitizer, whose handler the simulation's chains
     * to) ended by the sanitizer's report. */
    CHECK_MSG((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
                  (WIFEXITED(status) && WEXITSTATUS(status) != 0),
              "queued work reading an unmapped granule did not fault (status %#x)", status);
    accel__dev_range_release(r);
}

int main(void)
{
    accel__device *cpu, *sim, *gpu;
    CHECK_OK(NULL, accel__device_open(&cpu, (accel_device){ACCEL_DEVICE_CPU, 0}));
    check_device(cpu, 1);
    check_coalescing(cpu, 1, 0);
    accel__device_sim_enable(1);
    CHECK_OK(NULL, accel__device_sim_open(&sim, 0));
    check_device(sim, 0);
    check_coalescing(sim, 0, 0);
    check_sim_unmap_race(sim);
    accel__device_sim_enable(0);
#ifdef ACCEL_HAVE_CUDA
    if (accel__device_open(&gpu, (accel_device){ACCEL_DEVICE_CUDA, 0}) != ACCEL_OK) {
        printf("test_device_range: CPU and simulated GPU ok; skipped on CUDA: %s\n",
               accel_last_error(NULL));
        return 77;
    }
    check_device(gpu, 0); /* a GPU, or the CUDA emulator */
    check_coalescing(gpu, 0, 1);
    char about[300];
    accel__device_describe(gpu, about, sizeof(about));
    printf("test_device_range: checked on %s too\n", about);
#else
    (void)gpu;
#endif
    printf("test_device_range: ok\n");
    return 0;
}
