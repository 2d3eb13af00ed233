/* ACCEL_TEST_NPROCS: 2 3
 *
 * Sharded checkpoints through staging (ckpt/devio.h), forced on the CPU: under ZeRO stage 1
 * every process writes the master and optimizer pieces it owns, and accel_save_model gathers
 * the pieces to the main process; the pieces of a model on a GPU go through the same staging.
 * accel_save_state and accel_save_model with staging forced (chunks of 40 bytes, so pieces
 * span several) write byte for byte the files of an unstaged save, and accel_load_state
 * through staging restores what was saved (saving again unstaged gives the same files).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/devio.h"

/* Every safetensors and index file of folder a is the same in b; returns how many shard files
 * (".shard-" in the name) there were. */
static int same_dir(const char *a, const char *b)
{
    DIR *d = opendir(a);
    CHECK_MSG(d != NULL, "cannot open %s", a);
    int files = 0, shards = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strstr(e->d_name, ".safetensors") == NULL && strstr(e->d_name, ".index.json") == NULL) {
            continue; /* the marker and the JSON parts are not tensors */
        }
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        check_same_file(pa, pb);
        files++;
        shards += strstr(e->d_name, ".shard-") != NULL;
    }
    closedir(d);
    CHECK_MSG(files > 0, "%s holds no tensor files", a);
    return shards;
}

static void step(accel *acc, accel_model *m, accel_optimizer *opt, int t)
{
    CHECK_OK(acc, accel_accumulate(acc, m));
    float *g = accel_model_grad(m);
    for (size_t i = 0; i < accel_model_numel(m); i++) {
        g[i] = (float)((i * 11 + (size_t)t * 5) % 13) / 6.0f - 1.0f;
    }
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));
}

/* Returns 1 on the main process. */
static int run(int stage, const char *root)
{
    accel_options o = accel_options_default();
    o.zero_stage = stage;
    o.first_bucket_mb = 0.001; /* several buckets / units, so pieces cut parameters */
    o.bucket_cap_mb = 0.002;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int main_proc = accel_is_main_process(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "a.weight", 2, (int64_t[]){41, 23}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "a.bias", 1, (int64_t[]){41}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "b.weight", 2, (int64_t[]){7, 41}, NULL));
    CHECK_OK(acc, accel_model_alloc(m));
    float *w = accel_model_master(m);
    for (size_t i = 0; i < accel_model_numel(m); i++) {
        w[i] = (float)(i % 97) / 50.0f - 1.0f;
    }
    accel_optimizer *opt = accel_adamw(acc, m, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    for (int t = 0; t < 2; t++) {
        step(acc, m, opt, t);
    }

    char plain[300], staged[300], again[300], mplain[300], mstaged[300];
    snprintf(plain, sizeof plain, "%s/s%d_plain", root, stage);
    snprintf(staged, sizeof staged, "%s/s%d_staged", root, stage);
    snprintf(again, sizeof again, "%s/s%d_again", root, stage);
    snprintf(mplain, sizeof mplain, "%s/s%d_model_plain", root, stage);
    snprintf(mstaged, sizeof mstaged, "%s/s%d_model_staged", root, stage);
    CHECK_OK(acc, accel_save_state(acc, plain));
    CHECK_OK(acc, accel_save_model(acc, m, mplain, NULL));
    accel__devio_force_staging(40);
    CHECK_OK(acc, accel_save_state(acc, staged));
    CHECK_OK(acc, accel_save_model(acc, m, mstaged, NULL));
    accel__devio_force_staging(0);
    if (main_proc) {
        CHECK_MSG(same_dir(plain, staged) >= 2, "stage %d: the state is not sharded", stage);
        same_dir(mplain, mstaged);
    }

    /* On from there, then back through staging: the same state as saved. */
    step(acc, m, opt, 7);
    accel__devio_force_staging(40);
    CHECK_OK(acc, accel_load_state(acc, staged));
    accel__devio_force_staging(0);
    CHECK_OK(acc, accel_save_state(acc, again));
    if (main_proc) {
        same_dir(plain, again);
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_free(acc);
    return main_proc;
}

int main(void)
{
    unsetenv("ACCELERATE_RESUME_FROM_CHECKPOINT");
    unsetenv("ACCELERATE_CONFIG_FILE");
    setenv("HF_HOME", "/nonexistent/accel-test", 1);
    /* One folder for all processes: the launcher is their parent. */
    char root[128], cmd[300];
    snprintf(root, sizeof root, "/tmp/accel_test_devio_zero_%d", (int)getppid());
    snprintf(cmd, sizeof cmd, "mkdir -p %s", root);
    CHECK(system(cmd) == 0);
    if (run(1, root)) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        CHECK(system(cmd) == 0);
    }
    printf("test_ckpt_devio_zero: ok\n");
    return 0;
}
