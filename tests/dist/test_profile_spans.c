/* ACCEL_TEST_NPROCS: 2
 *
 * The profiler's call sites in a real training step on 2 processes: with a session open around
 * one step of an nn GPT (accel_backward with overlapped bucket all-reduces), save_state,
 * load_state, save_model and load_model, every process's profile_<rank>.json holds a
 * "bucket allreduce" span, the collectives its communication thread ran ("allreduce", category
 * comm, with a positive "count" argument, on a thread other than the main one), and one
 * "save_state", "load_state", "save_model" and "load_model" span each (category ckpt) on the
 * main thread, nested in the order they were called.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "accel/nn.h"
#include "check.h"
#include "small_gpt.h"

#define T 8

typedef struct seen {
    int bucket, comm, save_state, load_state, save_model, load_model;
    json_int_t main_tid, comm_tid;
    double save_state_ts, load_state_ts, save_model_ts, load_model_ts;
} seen;

static void scan(const char *path, seen *s)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK_MSG(root != NULL, "%s: %s (line %d)", path, err.text, err.line);
    json_t *events = json_object_get(root, "traceEvents"), *e;
    CHECK(json_is_array(events));
    size_t i;
    memset(s, 0, sizeof(*s));
    json_array_foreach(events, i, e)
    {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (ph == NULL || strcmp(ph, "X") != 0 || name == NULL || cat == NULL) {
            continue;
        }
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        double ts = json_number_value(json_object_get(e, "ts"));
        if (strcmp(name, "bucket allreduce") == 0) {
            CHECK(strcmp(cat, "comm") == 0);
            s->bucket++;
        } else if (strcmp(name, "allreduce") == 0 && strcmp(cat, "comm") == 0) {
            json_int_t count =
                json_integer_value(json_object_get(json_object_get(e, "args"), "count"));
            CHECK_MSG(count > 0, "%s: allreduce span without a count", path);
            s->comm++;
            s->comm_tid = tid;
        } else if (strcmp(cat, "ckpt") == 0) {
            s->main_tid = tid;
            if (strcmp(name, "save_state") == 0) {
                s->save_state++;
                s->save_state_ts = ts;
            } else if (strcmp(name, "load_state") == 0) {
                s->load_state++;
                s->load_state_ts = ts;
            } else if (strcmp(name, "save_model") == 0) {
                s->save_model++;
                s->save_model_ts = ts;
            } else if (strcmp(name, "load_model") == 0) {
                s->load_model++;
                s->load_model_ts = ts;
            }
        }
    }
    json_decref(root);
}

int main(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    CHECK(n == 2);

    /* One folder for the job: made on process 0, its name broadcast. */
    char dir[64] = "/tmp/accel_profile_spans_XXXXXX";
    if (rank == 0) {
        CHECK(mkdtemp(dir) != NULL);
    }
    CHECK_OK(acc, accel_broadcast(acc, dir, dir, sizeof dir, ACCEL_U8, 0, NULL));
    char ckpt[128], weights[128], trace[128];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(weights, sizeof weights, "%s/weights", dir);

    nn_gpt_config cfg = small_gpt_config(2, 2, 16, T, 32, 1);
    accel_model *model;
    nn_params *params;
    nn_gpt *gpt;
    small_gpt_new(acc, &cfg, 7, &model, &params, &gpt);
    accel_optimizer *opt = accel_adamw(acc, model, NULL);
    CHECK(opt != NULL);
    CHECK_OK(acc, accel_prepare(acc, model, opt));
    nn_ctx *g;
    CHECK_OK(NULL, nn_ctx_new(&g));

    int32_t ids[2 * T], tg[2 * T];
    for (int i = 0; i < 2 * T; i++) {
        ids[i] = (i * 7 + rank * 3) % 32;
        tg[i] = (i * 5 + 1) % 32;
    }
    CHECK_OK(acc, accel_profile_begin(acc, dir));
    nn_tensor *loss;
    CHECK_OK(acc, accel_accumulate(acc, model));
    CHECK_OK(NULL, nn_gpt_forward(g, gpt, ids, tg, 2, T, NULL, &loss));
    CHECK_OK(acc, accel_backward(acc, loss));
    CHECK_OK(acc, accel_optimizer_step(opt));
    CHECK_OK(acc, accel_optimizer_zero_grad(opt));
    CHECK_OK(acc, accel_save_state(acc, ckpt));
    CHECK_OK(acc, accel_load_state(acc, ckpt));
    CHECK_OK(acc, accel_save_model(acc, model, weights, NULL));
    CHECK_OK(acc, accel_load_model(acc, model, weights, 1));
    CHECK_OK(acc, accel_profile_end(acc)); /* writes profile_<rank>.json, then waits for all */

    /* Every process checks every trace (both are written once profile_end returns). */
    for (int r = 0; r < n; r++) {
        seen s;
        snprintf(trace, sizeof trace, "%s/profile_%d.json", dir, r);
        scan(trace, &s);
        CHECK_MSG(s.bucket >= 1, "%s: no bucket allreduce span", trace);
        CHECK_MSG(s.comm >= 1, "%s: no allreduce span from the communication thread", trace);
        CHECK_MSG(s.save_state == 1 && s.load_state == 1 && s.save_model == 1 && s.load_model == 1,
                  "%s: checkpoint spans save_state %d load_state %d save_model %d load_model %d",
                  trace, s.save_state, s.load_state, s.save_model, s.load_model);
        CHECK(s.save_state_ts < s.load_state_ts && s.load_state_ts < s.save_model_ts &&
              s.save_model_ts < s.load_model_ts);
        CHECK_MSG(s.comm_tid != s.main_tid, "%s: collectives recorded on the main thread", trace);
    }

    CHECK_OK(acc, accel_wait_for_everyone(acc)); /* nobody still reads the folder */
    if (rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(params);
    accel_free(acc);
    printf("test_profile_spans: ok (rank %d)\n", rank);
    return 0;
}
