/* ACCEL_TEST_NPROCS: 2 3
 *
 * The fused verified load across processes (issue 11, item 4; docs/checkpoint.md "Fast
 * verified loads"): before any step or load the live state has nothing to lose, so every
 * process checks the tensor files it loads while copying them. A byte flipped in the weights'
 * last block fails the load on every process (the one that found it names the file, the others
 * that process), every process is marked partly loaded and refuses accel_optimizer_step with
 * ACCEL_ESTATE, and loading the undamaged folder then restores the saved weights bit for bit
 * on every process, after which steps work again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define ROWS 300000 /* 19.2 MB of weights: two 16 MiB checksum blocks */

static void sh(const char *cmd)
{
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
}

static float expected(size_t i)
{
    return 5.0f + (float)(i % 997) * 1e-3f;
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int rank = accel_process_index(acc);
    char root[128], dir[160], bad[160], cmd[1024];
    snprintf(root, sizeof root, "/tmp/accel_test_ckpt_fused_dist_%d", (int)getppid());
    snprintf(dir, sizeof dir, "%s/good", root);
    snprintf(bad, sizeof bad, "%s/bad", root);

    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 2, (int64_t[]){ROWS, 16}, NULL));
    accel_optimizer *opt = accel_sgd(acc, m, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    float *w = accel_model_master(m);
    size_t n = accel_model_numel(m);
    for (size_t i = 0; i < n; i++) {
        w[i] = expected(i);
    }
    CHECK_OK(acc, accel_save_state(acc, dir));
    if (rank == 0) {
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s && cp -r %s %s && sz=$(stat -c %%s %s/model.safetensors) && "
                 "printf '\\001' | dd of=%s/model.safetensors bs=1 seek=$((sz - 3)) "
                 "conv=notrunc status=none",
                 bad, dir, bad, bad, bad);
        sh(cmd);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    for (size_t i = 0; i < n; i++) {
        w[i] = 1.0f; /* the program's own weights: nothing to lose */
    }

    accel_status st = accel_load_state(acc, bad);
    const char *msg = accel_last_error(acc);
    CHECK_MSG(st == ACCEL_ECORRUPT && strstr(msg, "partly loaded") != NULL &&
                  (strstr(msg, "model.safetensors is damaged") != NULL ||
                   strstr(msg, "accel_load_state: process ") != NULL),
              "process %d: %s: %s", rank, accel_status_name(st), msg);
    st = accel_optimizer_step(opt);
    msg = accel_last_error(acc);
    CHECK_MSG(st == ACCEL_ESTATE && strstr(msg, "accel_optimizer_step: refused") != NULL &&
                  strstr(msg, bad) != NULL,
              "process %d: step after a partial load: %s: %s", rank, accel_status_name(st), msg);

    CHECK_OK(acc, accel_load_state(acc, dir));
    for (size_t i = 0; i < n; i++) {
        CHECK_MSG(w[i] == expected(i), "process %d: weight %zu is %g after the valid load", rank, i,
                  (double)w[i]);
    }
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        sh(cmd);
    }
    accel_free(acc);
    return 0;
}
