/* ACCEL_TEST_NPROCS: 1 2
 *
 * save_model / load_model across processes: every process initialises different weights,
 * accel_save_model writes process 0's (sharded) from the main process only, every process
 * loads the folder and ends bit-identical to process 0's initial weights; accel_save of a
 * named set behaves the same, and a failing save is reported on every process; so is a
 * save_state whose dir names no folder on process 0 only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static void init(accel_model *m, int rank)
{
    for (int i = 0; i < accel_model_num_params(m); i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            p->data[k] = (float)rank * 100.0f + (float)i + (float)k * 0.001f;
        }
    }
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int rank = accel_process_index(acc);
    /* Processes started by one launcher share its pid: one folder for all of them. */
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/accel_test_ckpt_dist_%d", (int)getppid());

    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "enc.weight", 2, (int64_t[]){16, 8}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "enc.bias", 1, (int64_t[]){16}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "dec.weight", 2, (int64_t[]){8, 16}, NULL));
    CHECK_OK(acc, accel_model_alloc(m));
    init(m, rank);

    CHECK_OK(acc, accel_save_model(acc, m, dir, "520B")); /* 512, 64, 512 bytes: 3 shards */
    if (rank == 0) {
        char p[400];
        snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", dir);
        CHECK(access(p, F_OK) == 0);
    }
    init(m, rank + 7); /* scribble, then load */
    CHECK_OK(acc, accel_load_model(acc, m, dir, 1));
    for (int i = 0; i < accel_model_num_params(m); i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            CHECK(p->data[k] == (float)i + (float)k * 0.001f); /* process 0's values */
        }
    }

    int32_t v = 40 + rank;
    accel_named_tensor t = {"v", accel_tensor_view(&v, ACCEL_I32, 0, NULL)};
    char p[400];
    snprintf(p, sizeof p, "%s/v.safetensors", dir);
    CHECK_OK(acc, accel_save(acc, &t, 1, NULL, 0, p));
    accel_safetensors *st; /* written before accel_save returned anywhere */
    CHECK_OK(NULL, accel_safetensors_open(&st, p));
    accel_tensor got;
    CHECK_OK(NULL, accel_safetensors_get(st, "v", &got));
    CHECK(*(int32_t *)got.data == 40);
    accel_safetensors_close(st);
    snprintf(p, sizeof p, "%s/no/such/dir/v.safetensors", dir);
    CHECK(accel_save(acc, &t, 1, NULL, 0, p) != ACCEL_OK); /* on every process */

    /* save_state where process 0 is given a dir that names no folder and the others a real
     * one (fault sweep): process 0 refused at once while the others waited for it in the
     * save's first agreement; now every process returns the error, and nothing is left. */
    char sdir[300];
    snprintf(sdir, sizeof sdir, "%s/state", dir);
    accel_status sst = accel_save_state(acc, rank == 0 ? "" : sdir);
    CHECK_MSG(sst == ACCEL_EINVAL, "%s: %s", accel_status_name(sst), accel_last_error(acc));
    CHECK(strstr(accel_last_error(acc), rank == 0 ? "names no folder" : "process 0 failed"));
    CHECK(access(sdir, F_OK) != 0 && access("..partial", F_OK) != 0);

    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    accel_model_free(m);
    accel_free(acc);
    return 0;
}
