/*
 * resume_from_checkpoint (accel_options, ACCELERATE_RESUME_FROM_CHECKPOINT): the first
 * accel_prepare loads the newest valid checkpoint ("latest", skipping a damaged newest one) or
 * a named folder into every prepared and registered object, once; "latest" with nothing saved
 * yet starts from scratch; "latest" without automatic naming, or a missing folder, is an error
 * naming the cause.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char dir[256];

typedef struct job {
    accel *acc;
    accel_model *m;
    accel_optimizer *opt;
    int counter; /* a registered object */
} job;

static accel_status counter_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, ctx, sizeof(int));
}

static accel_status counter_load(void *ctx, const void *data, size_t n)
{
    if (n != sizeof(int)) {
        return ACCEL_ECORRUPT;
    }
    memcpy(ctx, data, n);
    return ACCEL_OK;
}

/* init + model + SGD + registered counter; resume: the option (NULL: the environment). */
static accel_status start(job *j, const char *resume, int auto_naming)
{
    memset(j, 0, sizeof(*j));
    accel_options o = accel_options_default();
    o.project_dir = dir;
    o.automatic_checkpoint_naming = auto_naming;
    o.resume_from_checkpoint = resume;
    accel_status st = accel_init(&j->acc, &o);
    if (st != ACCEL_OK) {
        return st;
    }
    CHECK_OK(j->acc, accel_model_new(j->acc, &j->m));
    CHECK_OK(j->acc, accel_model_add_param(j->m, "w", 1, (int64_t[]){5}, NULL));
    CHECK_OK(j->acc, accel_model_alloc(j->m));
    float *w = accel_model_master(j->m);
    for (int i = 0; i < 5; i++) {
        w[i] = 0.0f;
    }
    CHECK((j->opt = accel_sgd(j->acc, j->m, NULL)) != NULL);
    CHECK_OK(j->acc, accel_register_for_checkpointing(j->acc, counter_save, counter_load,
                                                      &j->counter));
    return accel_prepare(j->acc, j->m, j->opt);
}

/* Marks the state (weights all v, counter v) and saves it (automatic naming). */
static void save(job *j, float v)
{
    float *w = accel_model_master(j->m);
    for (int i = 0; i < 5; i++) {
        w[i] = v;
    }
    j->counter = (int)v;
    CHECK_OK(j->acc, accel_save_state(j->acc, NULL));
}

int main(void)
{
    unsetenv("ACCELERATE_RESUME_FROM_CHECKPOINT");
    unsetenv("ACCELERATE_CONFIG_FILE");
    setenv("HF_HOME", "/nonexistent/accel-test", 1);
    snprintf(dir, sizeof(dir), "/tmp/accel-test-resume-%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    job j;

    /* "latest" needs automatic naming (it looks in project_dir/checkpoints). */
    CHECK(start(&j, "latest", 0) == ACCEL_EINVAL);
    CHECK_MSG(strstr(accel_last_error(NULL), "resume_from_checkpoint=latest needs project_dir "
                                             "and automatic_checkpoint_naming"),
              "%s", accel_last_error(NULL));

    /* Nothing saved yet: a first start. */
    setenv("ACCELERATE_RESUME_FROM_CHECKPOINT", "latest", 1);
    CHECK_OK(NULL, start(&j, NULL, 1));
    CHECK(accel_checkpoint_dir(j.acc) == NULL);
    CHECK(strcmp(accel_resolved_options(j.acc)->resume_from_checkpoint, "latest") == 0);
    save(&j, 1.0f); /* checkpoint_0 */
    save(&j, 2.0f); /* checkpoint_1 */
    accel_free(j.acc);

    /* A restart: prepare loads checkpoint_1 into the model and the registered object, and the
     * next automatic save does not collide. */
    CHECK_OK(NULL, start(&j, NULL, 1));
    CHECK(strstr(accel_checkpoint_dir(j.acc), "checkpoints/checkpoint_1") != NULL);
    CHECK(accel_model_master(j.m)[4] == 2.0f && j.counter == 2);
    CHECK(accel_checkpoint_iteration(j.acc) == 2);
    /* Only the first prepare resumes. */
    accel_model_master(j.m)[0] = 9.0f;
    accel_model *m2;
    CHECK_OK(j.acc, accel_model_new(j.acc, &m2));
    CHECK_OK(j.acc, accel_model_add_param(m2, "v", 1, (int64_t[]){3}, NULL));
    CHECK_OK(j.acc, accel_model_alloc(m2));
    CHECK_OK(j.acc, accel_prepare(j.acc, m2));
    CHECK(accel_model_master(j.m)[0] == 9.0f);
    accel_free(j.acc);
    unsetenv("ACCELERATE_RESUME_FROM_CHECKPOINT");

    /* A damaged newest checkpoint is skipped: checkpoint_0 loads. */
    char path[600];
    snprintf(path, sizeof(path), "%s/checkpoints/checkpoint_1/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, -4, SEEK_END);
    fputs("XXXX", f);
    fclose(f);
    CHECK_OK(NULL, start(&j, "latest", 1));
    CHECK(strstr(accel_checkpoint_dir(j.acc), "checkpoints/checkpoint_0") != NULL);
    CHECK(accel_model_master(j.m)[2] == 1.0f && j.counter == 1);
    accel_free(j.acc);

    /* A named folder (automatic naming not needed), and a missing one. */
    snprintf(path, sizeof(path), "%s/checkpoints/checkpoint_0", dir);
    CHECK_OK(NULL, start(&j, path, 0));
    CHECK(accel_model_master(j.m)[2] == 1.0f);
    accel_free(j.acc);
    snprintf(path, sizeof(path), "%s/nothere", dir);
    CHECK(start(&j, path, 0) == ACCEL_ENOTFOUND);
    CHECK_MSG(strstr(accel_last_error(j.acc), "nothere") != NULL, "%s", accel_last_error(j.acc));
    accel_free(j.acc);

    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("test_ckpt_resume: ok\n");
    return 0;
}
