/* ACCEL_TEST_NPROCS: 2 3
 *
 * Checkpoint verification across processes (issue 11, item 4): every process checks its share
 * of the checksums and all agree before anything is applied, so a flipped byte in a file only
 * one process reads (another process's random_states / dl_state file) fails the load on every
 * process, naming the file; and the processes must resume at the same place: a checkpoint whose
 * per-process files are each well-formed but disagree (process 1's loader one epoch ahead,
 * written with a version-1 marker that has no checksum to catch the edit) is ACCEL_ECORRUPT on
 * every process, naming both positions. The same folder, undamaged, loads.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/data.h"
#include "check.h"

static float xs[24 * 2];

static void sh(const char *cmd)
{
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
}

/* Version-1 marker of dir (sizes from disk, no checksums). Process 0 only. */
static void make_v1(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/accel_checkpoint.json", dir);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e), *files = json_object();
    CHECK(j != NULL);
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(j, "files"), name, v)
    {
        char f[700];
        struct stat sb;
        snprintf(f, sizeof f, "%s/%s", dir, name);
        CHECK(stat(f, &sb) == 0);
        json_object_set_new(files, name, json_integer(sb.st_size));
    }
    json_object_set_new(j, "files", files);
    json_object_set_new(j, "version", json_integer(1));
    json_object_del(j, "checksum");
    json_object_del(j, "marker_xxh3");
    CHECK(json_dump_file(j, p, JSON_INDENT(2)) == 0);
    json_decref(j);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    char root[128], dir[160], copy[160], cmd[2048];
    snprintf(root, sizeof root, "/tmp/accel_test_ckpt_verify_dist_%d", (int)getppid());
    snprintf(dir, sizeof dir, "%s/good", root);
    snprintf(copy, sizeof copy, "%s/copy", root);

    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 2, (int64_t[]){8, 8}, NULL));
    accel_optimizer *opt = accel_sgd(acc, m, NULL);
    CHECK(opt != NULL);
    const char *names[1] = {"x"};
    accel_tensor t = accel_tensor_view(xs, ACCEL_F32, 2, (int64_t[]){24, 2});
    accel_dataset *ds;
    CHECK_OK(acc, accel_tensor_dataset_new(&ds, 1, names, &t));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 2;
    accel_loader *dl;
    CHECK_OK(acc, accel_loader_new(acc, ds, &lo, &dl));
    CHECK_OK(acc, accel_prepare(acc, m, opt, dl));
    accel_batch *b;
    CHECK_OK(acc, accel_loader_next(dl, &b));
    CHECK_OK(acc, accel_save_state(acc, dir));
    CHECK_OK(acc, accel_load_state(acc, dir));

    /* A flipped byte in the last process's own file: every process fails, naming it. */
    char victim[64];
    snprintf(victim, sizeof victim, "dl_state_dict_rank%d.json", n - 1);
    if (rank == 0) {
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s && cp -r %s %s && printf '\\001' | dd of=%s/%s bs=1 seek=5 "
                 "conv=notrunc status=none",
                 copy, dir, copy, copy, victim);
        sh(cmd);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_status st = accel_load_state(acc, copy);
    CHECK_MSG(st == ACCEL_ECORRUPT, "%s: %s", accel_status_name(st), accel_last_error(acc));
    /* The process that found it names the file; the others name that process. */
    CHECK_MSG(strstr(accel_last_error(acc), victim) != NULL ||
                  strstr(accel_last_error(acc), "accel_load_state: process ") != NULL,
              "%s", accel_last_error(acc));
    CHECK_OK(acc, accel_wait_for_everyone(acc));

    /* Process 1 one epoch ahead, in a folder whose marker has no checksums. */
    if (rank == 0) {
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s && cp -r %s %s && sed -i 's/\"epoch\": 0/\"epoch\": 1/' "
                 "%s/dl_state_dict_rank1.json",
                 copy, dir, copy, copy);
        sh(cmd);
        make_v1(copy);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    snprintf(cmd, sizeof cmd,
             "accel_load_state: checkpoint %s is inconsistent: loader 0 of process 1 resumes at "
             "epoch 1, batch 1, process 0's at epoch 0, batch 1 (dl_state_dict_rank<process>.json)",
             copy);
    CHECK_ERR(acc, accel_load_state(acc, copy), ACCEL_ECORRUPT, cmd);
    /* Unedited, the version-1 folder loads. */
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", copy, dir, copy);
        sh(cmd);
        make_v1(copy);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    CHECK_OK(acc, accel_load_state(acc, copy));
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    if (rank == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        sh(cmd);
    }
    accel_free(acc);
    accel_dataset_free(ds);
    return 0;
}
