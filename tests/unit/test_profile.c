/*
 * The profiler timeline: user ranges (nested), accel's internal ranges recorded from a second
 * thread the way the communication thread records each bucket's all-reduce, and spans timed
 * elsewhere; the written profile_0.json parses as a Chrome trace with the expected "X" events,
 * pid = rank, one tid per thread, consistent ts/dur; ranges outside a session are dropped, and
 * the off state is a single flag of the accelerator's recorder.
 */
#include <jansson.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/profile.h"

#define N_BUCKETS 5

static accel *g_acc;

static void *comm_thread(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "accel-comm");
    for (int b = 0; b < N_BUCKETS; b++) {
        /* Alternate: through the handle, and through the recorder alone as the communication
         * thread records. */
        if (b % 2) {
            accel__prof_begin_arg(g_acc, "allreduce", ACCEL__PROF_COMM, "bucket", b);
            usleep(200);
            accel__prof_end(g_acc);
        } else {
            accel__trace_begin(g_acc->trace, "allreduce", ACCEL__PROF_COMM, "bucket", b);
            usleep(200);
            accel__trace_end(g_acc->trace);
        }
    }
    return NULL;
}

int main(void)
{
    char dir[] = "/tmp/accel_profile_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(NULL, accel_init(&g_acc, NULL));
    accel *acc = g_acc;

    /* Off: nothing is recorded, and ending without a session is a state error. */
    CHECK(!accel__trace_on(acc->trace) && !accel_profile_active(acc));
    accel__prof_begin(acc, "before", ACCEL__PROF_NN);
    accel_profile_push(acc, "ignored");
    accel_profile_pop(acc);
    CHECK(accel_profile_end(acc) == ACCEL_ESTATE);

    CHECK_OK(acc, accel_profile_begin(acc, dir));
    CHECK(accel__trace_on(acc->trace) && accel_profile_active(acc));
    CHECK(accel_profile_begin(acc, dir) == ACCEL_ESTATE);
    accel__prof_end(acc); /* closes "before", begun outside the session: dropped */

    pthread_t th;
    accel_profile_push(acc, "step");
    accel__prof_begin(acc, "forward", ACCEL__PROF_NN);
    usleep(300);
    accel__prof_end(acc);
    accel__prof_begin(acc, "backward", ACCEL__PROF_NN);
    CHECK(pthread_create(&th, NULL, comm_thread, NULL) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    accel__prof_end(acc);
    double t0 = accel__now();
    accel__prof_span(acc, "data wait", ACCEL__PROF_DATA, t0 - 0.001, t0, NULL, 0);
    accel_profile_push(acc, "name with \"quotes\"");
    accel_profile_pop(acc);
    accel_profile_pop(acc);               /* step */
    accel_profile_push(acc, "left open"); /* never popped before the end: dropped */
    CHECK_OK(acc, accel_profile_end(acc));
    accel_profile_pop(acc);
    CHECK(!accel__trace_on(acc->trace));

    char path[256];
    snprintf(path, sizeof(path), "%s/profile_0.json", dir);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK_MSG(root != NULL, "%s: %s (line %d)", path, err.text, err.line);
    json_t *events = json_object_get(root, "traceEvents");
    CHECK(json_is_array(events));
    int buckets[N_BUCKETS] = {0}, n_x = 0, saw_thread_name = 0;
    double step_ts = -1, step_end = -1, fwd_ts = -1, bwd_ts = -1, bwd_end = -1;
    json_int_t main_tid = -1, comm_tid = -1;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        CHECK(ph != NULL && name != NULL);
        CHECK(json_integer_value(json_object_get(e, "pid")) == 0);
        if (strcmp(ph, "M") == 0) {
            if (strcmp(name, "thread_name") == 0) {
                const char *tn =
                    json_string_value(json_object_get(json_object_get(e, "args"), "name"));
                saw_thread_name += tn != NULL && strcmp(tn, "accel-comm") == 0;
            }
            continue;
        }
        CHECK(strcmp(ph, "X") == 0);
        n_x++;
        double ts = json_number_value(json_object_get(e, "ts"));
        double dur = json_number_value(json_object_get(e, "dur"));
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        CHECK(ts > 0 && dur >= 0 && tid > 0 && cat != NULL);
        CHECK(strcmp(name, "before") != 0 && strcmp(name, "ignored") != 0);
        CHECK(strcmp(name, "left open") != 0);
        if (strcmp(name, "allreduce") == 0) {
            CHECK(strcmp(cat, "comm") == 0);
            json_int_t b =
                json_integer_value(json_object_get(json_object_get(e, "args"), "bucket"));
            CHECK(b >= 0 && b < N_BUCKETS);
            buckets[b]++;
            CHECK(dur >= 150);
            comm_tid = tid;
        } else if (strcmp(name, "step") == 0) {
            CHECK(strcmp(cat, "user") == 0);
            step_ts = ts;
            step_end = ts + dur;
            main_tid = tid;
        } else if (strcmp(name, "forward") == 0) {
            fwd_ts = ts;
            CHECK(dur >= 250 && strcmp(cat, "nn") == 0);
        } else if (strcmp(name, "backward") == 0) {
            bwd_ts = ts;
            bwd_end = ts + dur;
        } else if (strcmp(name, "data wait") == 0) {
            CHECK(dur > 900 && dur < 1100 && strcmp(cat, "data") == 0);
        } else {
            CHECK_MSG(strcmp(name, "name with \"quotes\"") == 0, "%s", name);
        }
    }
    CHECK(n_x == N_BUCKETS + 5);
    for (int b = 0; b < N_BUCKETS; b++) {
        CHECK(buckets[b] == 1);
    }
    CHECK(main_tid > 0 && comm_tid > 0 && main_tid != comm_tid);
    CHECK(saw_thread_name == 1);
    /* Nesting: forward and backward inside step; backward contains the all-reduces' time. */
    CHECK(step_ts <= fwd_ts && fwd_ts < bwd_ts && bwd_end <= step_end);
    json_decref(root);

    /* A second session rewrites the file with only its own events. */
    CHECK_OK(acc, accel_profile_begin(acc, dir));
    accel_profile_push(acc, "second");
    accel_profile_pop(acc);
    CHECK_OK(acc, accel_profile_end(acc));
    root = json_load_file(path, 0, &err);
    CHECK(root != NULL);
    int n_second = 0;
    json_array_foreach(json_object_get(root, "traceEvents"), i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        CHECK(strcmp(name, "step") != 0);
        n_second += strcmp(name, "second") == 0;
    }
    CHECK(n_second == 1);
    json_decref(root);

    /* An unwritable folder is an error at begin. */
    char bad[300];
    snprintf(bad, sizeof(bad), "%s/profile_0.json/sub", dir);
    CHECK(accel_profile_begin(acc, bad) == ACCEL_EIO);
    CHECK(strstr(accel_last_error(acc), "profile_0.json") != NULL);

    /* A session still open at accel_free is written. */
    CHECK_OK(acc, accel_profile_begin(acc, dir));
    accel_profile_push(acc, "at free");
    accel_profile_pop(acc);
    CHECK(unlink(path) == 0);
    accel_free(acc);
    CHECK(access(path, F_OK) == 0);

    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("test_profile: ok\n");
    return 0;
}
