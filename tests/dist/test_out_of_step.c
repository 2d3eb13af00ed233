/*
 * Processes out of step after a resume (issue 11, item 2): a checkpoint whose loader position
 * was edited on one process only, keeping the file's size ("batches": 2 -> 3 in
 * dl_state_dict_rank1.json), makes that process run one step fewer in the epoch; it then
 * waits for everyone while the others all-reduce gradients. That first diverging collective
 * must fail with "collective mismatch" on every process, and the epoch must never end with
 * status OK on all of them (which trained on garbage before). A load that refuses the edited
 * checkpoint is as good (a check at load time may catch it first); a process whose peer then
 * left sees "exited".
 *
 * ACCEL_TEST_NPROCS: 2
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/data.h"
#include "check.h"

#define ROWS 24
#define D 8

static float xs[ROWS * D];

typedef struct run {
    accel_model *m;
    accel_optimizer *opt;
    accel_loader *dl;
    accel_dataset *ds;
} run;

static void build(accel *acc, run *r)
{
    CHECK_OK(acc, accel_model_new(acc, &r->m));
    CHECK_OK(acc, accel_model_add_param(r->m, "w", 1, (int64_t[]){D}, NULL));
    CHECK_OK(acc, accel_model_alloc(r->m));
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = 0.1;
    CHECK((r->opt = accel_sgd(acc, r->m, &so)) != NULL);
    const char *names[1] = {"x"};
    accel_tensor t = accel_tensor_view(xs, ACCEL_F32, 2, (int64_t[]){ROWS, D});
    CHECK_OK(acc, accel_tensor_dataset_new(&r->ds, 1, names, &t));
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = 2;
    CHECK((r->dl = accel_loader_new(acc, r->ds, &lo)) != NULL);
    CHECK_OK(acc, accel_prepare(acc, r->m, r->opt, r->dl));
}

static void destroy(accel *acc, run *r)
{
    accel_free_memory(acc);
    accel_dataset_free(r->ds);
    memset(r, 0, sizeof(*r));
}

/* One step: the gradient is the batch mean (all-reduced in backward_end). */
static accel_status step(accel *acc, run *r, const accel_batch *b)
{
    const float *x = accel_batch_field(b, "x")->data;
    accel_status st = accel_accumulate(acc, r->m);
    if (st != ACCEL_OK) {
        return st;
    }
    accel_backward_begin(acc);
    float *g = accel_model_param(r->m, 0)->grad;
    for (int64_t i = 0; i < b->rows; i++) {
        for (int k = 0; k < D; k++) {
            g[k] += x[i * D + k] / (float)b->rows;
        }
    }
    if ((st = accel_backward_end(acc)) != ACCEL_OK ||
        (st = accel_optimizer_step(r->opt)) != ACCEL_OK) {
        return st;
    }
    return accel_optimizer_zero_grad(r->opt);
}

/* Replaces the first `from` in path by `to` (same length). */
static void edit(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r+");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    char *p = strstr(buf, from);
    CHECK_MSG(p != NULL && strlen(from) == strlen(to), "no \"%s\" in %s: %s", from, path, buf);
    memcpy(p, to, strlen(to));
    CHECK(fseek(f, 0, SEEK_SET) == 0 && fwrite(buf, 1, n, f) == n && fclose(f) == 0);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int rank = accel_process_index(acc);
    CHECK(accel_num_processes(acc) == 2);
    for (int i = 0; i < ROWS * D; i++) {
        xs[i] = (float)(i % 11) * 0.25f;
    }
    char dir[256], file[320];
    snprintf(dir, sizeof dir, "/tmp/accel_test_out_of_step_%d", (int)getppid());

    /* Two steps, then a checkpoint. */
    run r;
    build(acc, &r);
    accel_batch *b;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(acc, accel_loader_next(r.dl, &b));
        CHECK_OK(acc, step(acc, &r, b));
    }
    CHECK_OK(acc, accel_save_state(acc, dir));
    destroy(acc, &r);
    snprintf(file, sizeof file, "%s/dl_state_dict_rank1.json", dir);
    if (rank == 1) {
        edit(file, "\"batches\": 2", "\"batches\": 3");
    }
    CHECK_OK(acc, accel_wait_for_everyone(acc));

    /* Resume and finish the epoch. */
    build(acc, &r);
    accel_status st = accel_load_state(acc, dir);
    if (st != ACCEL_OK) {
        printf("rank %d: the edited checkpoint was refused at load: %s\n", rank,
               accel_last_error(acc));
        accel_free(acc);
        return 0;
    }
    int steps = 0;
    while ((st = accel_loader_next(r.dl, &b)) == ACCEL_OK && (st = step(acc, &r, b)) == ACCEL_OK) {
        steps++;
    }
    if (st == ACCEL_EOF) {
        st = accel_wait_for_everyone(acc);
    }
    const char *msg = accel_last_error(acc);
    CHECK_MSG(st != ACCEL_OK, "rank %d: the processes went out of step and nobody noticed", rank);
    /* (The second form: the gradient sync's prefix may still garble the message's start.) */
    int mismatch = st == ACCEL_EINVAL && (strstr(msg, "collective mismatch: rank 0 called ") ||
                                          strstr(msg, "rank 1 called barrier() #"));
    int left = st == ACCEL_EPEER && strstr(msg, "exited") != NULL;
    CHECK_MSG(mismatch || left, "rank %d: after %d steps: %s: %s", rank, steps,
              accel_status_name(st), msg);
    printf("rank %d: out of step after %d steps: %s\n", rank, steps, msg);
    destroy(acc, &r);
    if (rank == 0) {
        char cmd[320];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    accel_free(acc);
    return 0;
}
