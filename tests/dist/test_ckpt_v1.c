/* ACCEL_TEST_NPROCS: 1 2
 *
 * A checkpoint written by version 1 (the pre-v2 accel, commit edb707f: tests/fixtures/ckpt_v1,
 * make_fixture.c there) loads with the current code: same folder layout, file names, tensor
 * names and JSON keys. Objects are built with other weights and another seed, the fixture is
 * loaded, and every value version 1 held when it saved must be back bit for bit: weights,
 * gradients of the open accumulation window, Adam moments, optimizer and scheduler steps,
 * learning rate, loader position, generators, accumulation step, loss scale, the registered
 * object. On 2 processes (as saved) the run then continues to its end and must reach exactly
 * the final weights and loss scale version 1 reached. On 1 process the load is the documented
 * inexact one: weights, optimizer, scheduler, scaler and registered object exact, loader
 * position rescaled, process 0's generators, gradients not loaded.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "check.h"
#include "fixtures/ckpt_v1/run.h"
#include "train/train_internal.h" /* the optimizer's moments */

/* The fixture folder, next to this file's folder in the source tree. */
static void fixture_path(char *out, size_t cap, const char *name)
{
    const char *self = __FILE__, *cut = strstr(self, "dist/test_ckpt_v1.c");
    CHECK_MSG(cut != NULL, "cannot locate the fixture from %s", self);
    snprintf(out, cap, "%.*sfixtures/ckpt_v1/%s", (int)(cut - self), self, name);
}

/* The line of expected_<rank>.txt starting with `key`, its values after the key. */
static const char *expected(const char *text, const char *key)
{
    size_t n = strlen(key);
    for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, n) == 0 && l[n] == ' ') {
            return l + n + 1;
        }
    }
    CHECK_MSG(0, "the fixture's expected values have no \"%s\"", key);
    return NULL;
}

/* Compares n floats of the current run, per parameter in registration order over flat buffer
 * base, with the bit patterns recorded under `key`. */
static void check_buffer(const char *text, const char *key, accel_model *m, const float *base)
{
    const char *v = expected(text, key);
    int k = 0;
    for (int i = 0; i < accel_model_num_params(m); i++) {
        const accel_param *p = accel_model_param(m, i);
        for (size_t e = 0; e < p->numel; e++, k++) {
            char *end;
            uint32_t want = (uint32_t)strtoul(v, &end, 16), got;
            CHECK_MSG(end != v, "%s: value %d missing", key, k);
            v = end;
            memcpy(&got, base + p->offset + e, 4);
            CHECK_MSG(got == want, "%s[%d] (%s[%zu]): %08x, version 1 had %08x", key, k, p->name, e,
                      got, want);
        }
    }
    CHECK(k == FX_NUMEL);
}

static char *read_expected(int rank)
{
    char name[32], path[512];
    snprintf(name, sizeof name, "expected_%d.txt", rank);
    fixture_path(path, sizeof path, name);
    char *text = NULL;
    size_t len = 0;
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "%s", path);
    CHECK(getdelim(&text, &len, '\0', f) > 0);
    fclose(f);
    return text;
}

static double expected_real(const char *text, const char *key)
{
    return strtod(expected(text, key), NULL);
}

int main(void)
{
    accel_options o = fx_options();
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    char dir[512];
    fixture_path(dir, sizeof dir, "checkpoint");
    /* Per-process values from this process's record (process 0's on 1 process: its
     * generators are the ones loaded); what the main process saved from process 0's. */
    char *text = read_expected(n == 2 ? rank : 0), *text0 = read_expected(0);

    fx_run r;
    CHECK_OK(acc, fx_build(acc, &r, 2)); /* other weights, another seed */
    CHECK_OK(acc, accel_load_state(acc, dir));

    check_buffer(text0, "weights", r.m, accel_model_master(r.m));
    check_buffer(text0, "exp_avg", r.m, r.opt->state_a);
    check_buffer(text0, "exp_avg_sq", r.m, r.opt->state_b);
    CHECK(r.opt->n_steps == strtoll(expected(text0, "opt_step"), NULL, 10));
    CHECK(accel_scheduler_get_last_lr(r.sch, 0) == expected_real(text0, "lr"));
    CHECK(accel_scheduler_last_step(r.sch) == strtoll(expected(text0, "sched_step"), NULL, 10));
    CHECK(accel_loss_scale(acc) == expected_real(text0, "scale"));
    uint64_t c_step, c_tag;
    CHECK(sscanf(expected(text0, "counter"), "%" SCNu64 " %" SCNx64, &c_step, &c_tag) == 2);
    CHECK(r.c.step == c_step && r.c.tag == c_tag);

    uint64_t g[ACCEL_RNG_STATE_WORDS], want[ACCEL_RNG_STATE_WORDS];
    CHECK_OK(acc, accel_get_rng_state(acc, g));
    CHECK(sscanf(expected(text, "rng"), "%" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64, &want[0],
                 &want[1], &want[2], &want[3]) == 4);
    CHECK(memcmp(g, want, sizeof g) == 0);
    long long a_step;
    int a_sync;
    CHECK(sscanf(expected(text, "accum"), "%lld %d", &a_step, &a_sync) == 2);
    CHECK(accel_accumulation_step(acc) == a_step && accel_sync_gradients(acc) == a_sync);

    accel_loader_position pos;
    CHECK_OK(acc, accel_loader_get_position(r.dl, &pos));
    long long epoch, batches;
    uint64_t seed, rng[4];
    CHECK(sscanf(expected(text, "loader"),
                 "%lld %lld %" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64, &epoch,
                 &batches, &seed, &rng[0], &rng[1], &rng[2], &rng[3]) == 7);
    /* Rescaled to the same number of samples seen with another number of processes. */
    CHECK_MSG(pos.epoch == epoch && pos.batches == batches * 2 / n && pos.seed == seed &&
                  memcmp(pos.rng, rng, sizeof rng) == 0,
              "loader at epoch %lld batch %lld, version 1 at %lld, %lld", (long long)pos.epoch,
              (long long)pos.batches, epoch, batches);

    if (n == 2) {
        check_buffer(text, "grads", r.m, accel_model_grad(r.m));
        /* The rest of the run, as version 1 ran it. */
        while (r.c.step < FX_TOTAL) {
            CHECK_OK(acc, fx_step(acc, &r));
        }
        check_buffer(text, "final", r.m, accel_model_master(r.m));
        CHECK(accel_loss_scale(acc) == expected_real(text, "final_scale"));
    } else {
        /* Another number of processes: the open window's gradients are not loaded. */
        const float *gr = accel_model_grad(r.m);
        for (size_t i = 0; i < accel_model_numel(r.m); i++) {
            CHECK(gr[i] == 0.0f);
        }
    }
    printf("[rank %d/%d] version-1 checkpoint loaded exactly%s\n", rank, n,
           n == 2 ? ", run continued to version 1's final weights" : "");
    free(text);
    free(text0);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    accel_free(acc);
    accel_dataset_free(r.ds);
    return 0;
}
