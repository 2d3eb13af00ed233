/*
 * Two jobs and one checkpoint folder: a save_state while another process is saving the same
 * folder (explicit dir, and automatic naming in a shared project_dir) is refused with
 * ACCEL_ESTATE naming the folder and the other process, and the other save completes intact
 * (before the save lock, the second save removed the first one's staging folder and
 * replaced its checkpoint, or their files mixed); then the leftovers of a SIGKILLed save (the
 * staging folder, the lock file): resume does not pick the partial checkpoint, the next save
 * removes them, and nothing stays behind. Last, a checkpoint of another precision in the
 * folder a job resumes from: saved without fp16 it loads under fp16, the other way round it is
 * refused naming the precision; and two saves of model files into one folder at once.
 *
 * The first job is a child process held inside its save by a pre-hook (it reports through
 * one pipe that the staging folder exists and waits on another), so nothing depends on timing.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/atomic.h"
#include "ckpt/stset.h"
#include "core/internal.h"

static char g_dir[256];

typedef struct job {
    accel *acc;
    int64_t value; /* the registered object */
} job;

static accel_status val_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, &((job *)ctx)->value, sizeof(int64_t));
}

static accel_status val_load(void *ctx, const void *data, size_t n)
{
    if (n != sizeof(int64_t)) {
        return ACCEL_ECORRUPT;
    }
    memcpy(&((job *)ctx)->value, data, n);
    return ACCEL_OK;
}

static void job_init(job *j, const char *project, int automatic, int64_t value)
{
    accel_options o = accel_options_default();
    o.project_dir = project;
    o.automatic_checkpoint_naming = automatic;
    o.total_limit = automatic ? 1 : 0;
    CHECK_OK(NULL, accel_init(&j->acc, &o));
    j->value = value;
    CHECK_OK(j->acc, accel_register_for_checkpointing(j->acc, val_save, val_load, j));
}

/* The child's pre-hook: says "in the save" on fds[0] and waits for a byte on fds[1]. */
static accel_status hold(accel *acc, const char *dir, void *ctx)
{
    (void)acc;
    (void)dir;
    const int *fds = ctx;
    char c = 's';
    if (write(fds[0], &c, 1) != 1 || read(fds[1], &c, 1) != 1) {
        return ACCEL_EIO;
    }
    return ACCEL_OK;
}

typedef struct holder {
    pid_t pid;
    int to_parent, from_parent; /* the parent's ends */
} holder;

/* Forks a job that saves `dir` (automatic naming when dir is NULL) with value 111, held in its
 * pre-hook until release(); its exit code is 0 when the save succeeded. Returns once the child
 * is inside the save, its staging folder created. */
static holder start_holder(const char *project, const char *dir)
{
    int up[2], down[2];
    CHECK(pipe(up) == 0 && pipe(down) == 0);
    holder h = {fork(), up[0], down[1]};
    CHECK(h.pid >= 0);
    if (h.pid == 0) {
        close(up[0]);
        close(down[1]);
        int fds[2] = {up[1], down[0]};
        job j;
        job_init(&j, project, dir == NULL, 111);
        CHECK_OK(j.acc, accel_register_save_state_pre_hook(j.acc, hold, fds, NULL));
        accel_status st = accel_save_state(j.acc, dir);
        if (st != ACCEL_OK) {
            fprintf(stderr, "holder: %s\n", accel_last_error(j.acc));
        }
        accel_free(j.acc);
        _exit(st == ACCEL_OK ? 0 : 1);
    }
    close(up[1]);
    close(down[0]);
    char c;
    CHECK(read(h.to_parent, &c, 1) == 1);
    return h;
}

/* Lets the child finish its save; returns its exit code. */
static int release(holder *h)
{
    char c = 'g';
    CHECK(write(h->from_parent, &c, 1) == 1);
    int status;
    CHECK(waitpid(h->pid, &status, 0) == h->pid);
    close(h->to_parent);
    close(h->from_parent);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The refusal names the folder, the holder's pid and what to do. */
static void check_refusal(accel *acc, accel_status st, const char *folder, pid_t pid)
{
    const char *msg = accel_last_error(acc);
    char want[64];
    snprintf(want, sizeof want, "(pid %d on host ", (int)pid);
    CHECK_MSG(st == ACCEL_ESTATE, "%s: %s", accel_status_name(st), msg);
    CHECK_MSG(strncmp(msg, "accel_save_state: checkpoint folder ", 36) == 0 &&
                  strstr(msg, folder) != NULL && strstr(msg, "is being saved by another process") &&
                  strstr(msg, want) != NULL && strstr(msg, "give each job its own") != NULL,
              "%s", msg);
}

static int64_t load_value(const char *project, const char *dir)
{
    job j;
    job_init(&j, project, dir == NULL, -1);
    CHECK_OK(j.acc, accel_load_state(j.acc, dir));
    int64_t v = j.value;
    accel_free(j.acc);
    return v;
}

/* Two jobs, one explicit folder: the second save is refused while the first one runs, and
 * leaves the first one's staging folder alone; afterwards it may replace the folder. */
static void test_same_dir(void)
{
    char project[300], dir[400], partial[400], lock[400];
    snprintf(project, sizeof project, "%s/same", g_dir);
    snprintf(dir, sizeof dir, "%s/ckpt", project);
    snprintf(partial, sizeof partial, "%s/.ckpt.partial", project);
    snprintf(lock, sizeof lock, "%s/.ckpt.lock", project);
    holder h = start_holder(project, dir);
    CHECK(exists(partial));
    job j;
    job_init(&j, project, 0, 222);
    check_refusal(j.acc, accel_save_state(j.acc, dir), dir, h.pid);
    CHECK(exists(partial) && exists(lock)); /* the other job's staging folder is untouched */
    CHECK(release(&h) == 0);
    CHECK(load_value(project, dir) == 111);
    CHECK(!exists(partial) && !exists(lock));
    /* Now nobody saves it: replacing it is the ordinary, documented behaviour. */
    CHECK_OK(j.acc, accel_save_state(j.acc, dir));
    CHECK(load_value(project, dir) == 222);
    CHECK(!exists(lock));
    accel_free(j.acc);
}

/* Two jobs, one project_dir, automatic naming: both want checkpoint_0; the second is refused
 * while the first saves and, once it is there, told that it exists (never replacing it). */
static void test_same_project(void)
{
    char project[300], ckpt0[400], partial[400];
    snprintf(project, sizeof project, "%s/auto", g_dir);
    snprintf(ckpt0, sizeof ckpt0, "%s/checkpoints/checkpoint_0", project);
    snprintf(partial, sizeof partial, "%s/checkpoints/.checkpoint_0.partial", project);
    holder h = start_holder(project, NULL);
    job j;
    job_init(&j, project, 1, 222);
    check_refusal(j.acc, accel_save_state(j.acc, NULL), ckpt0, h.pid);
    CHECK(exists(partial));
    CHECK(release(&h) == 0);
    char want[600];
    snprintf(want, sizeof want,
             "accel_save_state: checkpoint %s already exists (load_state it first, or set "
             "accel_options.iteration past it)",
             ckpt0);
    CHECK_ERR(j.acc, accel_save_state(j.acc, NULL), ACCEL_EINVAL, want);
    CHECK(load_value(project, NULL) == 111);
    accel_free(j.acc);
}

/* A save SIGKILLed halfway leaves its staging folder and lock file: resume finds no
 * checkpoint (never the partial one), and the next save takes the lock the kernel released,
 * removes the leftovers and succeeds. */
static void test_killed_save(void)
{
    char project[300], partial[400], lock[400];
    snprintf(project, sizeof project, "%s/killed", g_dir);
    snprintf(partial, sizeof partial, "%s/checkpoints/.checkpoint_0.partial", project);
    snprintf(lock, sizeof lock, "%s/checkpoints/.checkpoint_0.lock", project);
    holder h = start_holder(project, NULL);
    CHECK(kill(h.pid, SIGKILL) == 0);
    int status;
    CHECK(waitpid(h.pid, &status, 0) == h.pid && WIFSIGNALED(status));
    close(h.to_parent);
    close(h.from_parent);
    CHECK(exists(partial) && exists(lock));
    job j;
    job_init(&j, project, 1, 333);
    CHECK(accel_load_state(j.acc, NULL) == ACCEL_ENOTFOUND);
    CHECK_OK(j.acc, accel_save_state(j.acc, NULL));
    CHECK(!exists(partial) && !exists(lock));
    accel_free(j.acc);
    CHECK(load_value(project, NULL) == 333);
}

/* A job of one precision saved, one of another resumes (another job config in the same
 * project_dir). Saved without fp16, resumed under fp16: the checkpoint loads and the new loss
 * scaler keeps its initial state, as documented (before, every checkpoint was reported damaged:
 * "file scaler.json is not listed"). Saved under fp16, resumed without: ACCEL_EINVAL naming
 * the precision. */
static accel *precision_job(accel_precision prec)
{
    accel_options o = accel_options_default();
    o.mixed_precision = prec;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){64}, NULL));
    accel_optimizer *opt = accel_adamw(acc, m, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    return acc;
}

static void test_other_precision(void)
{
    char no[400], fp16[400];
    snprintf(no, sizeof no, "%s/prec/no", g_dir);
    snprintf(fp16, sizeof fp16, "%s/prec/fp16", g_dir);
    accel *acc = precision_job(ACCEL_PRECISION_NO);
    CHECK_OK(acc, accel_save_state(acc, no));
    accel_free(acc);
    acc = precision_job(ACCEL_PRECISION_FP16);
    CHECK_OK(acc, accel_save_state(acc, fp16));
    CHECK_OK(acc, accel_load_state(acc, no));
    accel_free(acc);
    acc = precision_job(ACCEL_PRECISION_NO);
    char want[600];
    snprintf(want, sizeof want,
             "checkpoint %s: scaler.json holds an fp16 loss scaler but mixed_precision is no now",
             fp16);
    accel_status st = accel_load_state(acc, fp16);
    CHECK_MSG(st == ACCEL_EINVAL && strstr(accel_last_error(acc), want) != NULL, "%s: %s",
              accel_status_name(st), accel_last_error(acc));
    accel_free(acc);
}

/* Two jobs saving model files into one folder at once (accel_save_model, accel_save_sharded,
 * merge-weights): the second is refused while the first writes (before, each one's removal of
 * stale files deleted the other's: a sharded and a single-file save left no model at all). The
 * first save is held open through the internal set API; flock excludes a second open file in
 * the same process too. */
static void test_model_files(void)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/model", g_dir);
    float a[64], b[64];
    for (int i = 0; i < 64; i++) {
        a[i] = (float)i;
        b[i] = -(float)i;
    }
    accel_named_tensor ta[2] = {{"x", accel_tensor_view(a, ACCEL_F32, 1, (int64_t[]){32})},
                                {"y", accel_tensor_view(a + 32, ACCEL_F32, 1, (int64_t[]){32})}};
    accel_named_tensor tb[2] = {{"x", accel_tensor_view(b, ACCEL_F32, 1, (int64_t[]){32})},
                                {"y", accel_tensor_view(b + 32, ACCEL_F32, 1, (int64_t[]){32})}};
    accel__stset *first;
    CHECK_OK(NULL, accel__stset_open(&first, dir, "model", ta, 2, NULL, 0, 128)); /* 2 shards */
    for (size_t i = 0; i < 2; i++) {
        CHECK_OK(NULL, accel__stset_write(first, i, 0, ta[i].tensor.data, 128));
    }
    accel_status st = accel_save_sharded(dir, "model", tb, 2, NULL, 0, 0); /* one file */
    char want[600];
    snprintf(want, sizeof want, "%s: model.safetensors files are being written by another process",
             dir);
    CHECK_MSG(st == ACCEL_ESTATE && strncmp(accel_last_error(NULL), want, strlen(want)) == 0,
              "%s: %s", accel_status_name(st), accel_last_error(NULL));
    CHECK_OK(NULL, accel__stset_commit(first));
    char path[500];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    CHECK(exists(path)); /* the first save is whole */
    snprintf(path, sizeof path, "%s/.model.lock", dir);
    CHECK(!exists(path));
    CHECK_OK(NULL, accel_save_sharded(dir, "model", tb, 2, NULL, 0, 0)); /* now it may replace */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(exists(path));
}

/* Two jobs rotating one checkpoints folder at the same moment (total_limit; both list the same
 * old checkpoints and delete them oldest first): a checkpoint the other job has just deleted
 * is not an error (the rotation used to fail with "cannot rename ... for deletion: No such
 * file or directory" after its own checkpoint was committed, failing a good save). Both start
 * together through a pipe; 40 checkpoints make them meet on almost every one. */
static void test_concurrent_rotation(void)
{
    char base[400];
    snprintf(base, sizeof base, "%s/rotate", g_dir);
    CHECK(mkdir(base, 0700) == 0);
    for (int it = 0; it < 40; it++) {
        char dir[500];
        snprintf(dir, sizeof dir, "%s/checkpoint_%d", base, it);
        accel__stage s;
        CHECK_OK(NULL, accel__stage_init(&s, dir));
        CHECK_OK(NULL, accel__stage_lock(&s));
        CHECK_OK(NULL, accel__stage_create(&s));
        char f[600];
        snprintf(f, sizeof f, "%s/a.bin", s.stage_dir);
        CHECK_OK(NULL, accel__write_file_atomic(f, "x", 1));
        CHECK_OK(NULL, accel__stage_commit(&s, NULL));
        accel__stage_release(&s);
    }
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        CHECK(kids[k] >= 0);
        if (kids[k] == 0) {
            char c;
            close(go[1]);
            if (read(go[0], &c, 1) != 0) {
                _exit(3);
            }
            accel_status st = accel__ckpt_rotate(base, 1);
            if (st != ACCEL_OK) {
                fprintf(stderr, "rotation %d: %s\n", k, accel_last_error(NULL));
            }
            _exit(st == ACCEL_OK ? 0 : 1);
        }
    }
    close(go[0]);
    close(go[1]); /* both read end-of-file at once */
    for (int k = 0; k < 2; k++) {
        int status;
        CHECK(waitpid(kids[k], &status, 0) == kids[k]);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rotation %d failed", k);
    }
    int64_t *its = NULL;
    size_t n = 0;
    CHECK_OK(NULL, accel__ckpt_list(base, &its, &n));
    CHECK(n == 1 && its[0] == 39);
    accel__free(its);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_test_ckpt_clash_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    test_same_dir();
    test_same_project();
    test_killed_save();
    test_other_precision();
    test_model_files();
    test_concurrent_rotation();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    printf("test_ckpt_clash: ok\n");
    return 0;
}
