/*
 * Which device a process computes on (src/core/device_select.c):
 *  1. The rule with fake GPU counts: the CPU when forced or without GPUs, else GPU local_rank,
 *     round-robin when processes outnumber GPUs; NO / MULTI_CPU / MULTI_GPU accordingly.
 *  2. This machine, through accel_init: with cpu = 1 or ACCELERATE_USE_CPU, and (without a
 *     usable GPU, or a build without CUDA) by default, everything is as it always was: device
 *     cpu, the summary without a GPU line, models in host memory with float * views. With a
 *     GPU, the default is cuda:LOCAL_RANK and the summary names the GPU.
 *  3. accel_model_set_device: a model kept on the CPU, refused once allocated, a GPU that
 *     cannot be opened refused naming why.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "device/device.h"

static void test_rule(void)
{
    static const struct {
        int force_cpu, n_gpus, local_rank;
        accel_device_type type;
        int index;
    } cases[] = {
        {0, 0, 0, ACCEL_DEVICE_CPU, 0},                                  /* no GPU */
        {0, 0, 3, ACCEL_DEVICE_CPU, 0},  {1, 8, 3, ACCEL_DEVICE_CPU, 0}, /* forced */
        {0, 8, 3, ACCEL_DEVICE_CUDA, 3}, {0, 8, 0, ACCEL_DEVICE_CUDA, 0},
        {0, 1, 1, ACCEL_DEVICE_CUDA, 0}, /* two processes share one GPU */
        {0, 2, 5, ACCEL_DEVICE_CUDA, 1}, /* six share two, round-robin */
        {0, 2, 4, ACCEL_DEVICE_CUDA, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        accel_device d =
            accel__choose_device(cases[i].force_cpu, cases[i].n_gpus, cases[i].local_rank);
        CHECK_MSG(d.type == cases[i].type && d.index == cases[i].index, "case %zu: %d:%d", i,
                  (int)d.type, d.index);
    }
    accel_device cpu = {ACCEL_DEVICE_CPU, 0}, gpu = {ACCEL_DEVICE_CUDA, 1};
    CHECK(accel__choose_dist_type(cpu, 0) == ACCEL_DIST_NO);
    CHECK(accel__choose_dist_type(gpu, 0) == ACCEL_DIST_NO);
    CHECK(accel__choose_dist_type(cpu, 1) == ACCEL_DIST_MULTI_CPU);
    CHECK(accel__choose_dist_type(gpu, 1) == ACCEL_DIST_MULTI_GPU);
}

static int machine_has_gpu(void)
{
    int n = 0;
    return accel__device_count(ACCEL_DEVICE_CUDA, &n) == ACCEL_OK && n > 0;
}

/* A model of two parameters on acc, allocated. */
static accel_model *small_model(accel *acc)
{
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 2, (int64_t[]){3, 4}, NULL));
    CHECK_OK(acc, accel_model_add_param(m, "b", 1, (int64_t[]){3}, NULL));
    CHECK_OK(acc, accel_model_alloc(m));
    return m;
}

static void expect_cpu(accel *acc)
{
    CHECK(accel_device_of(acc).type == ACCEL_DEVICE_CPU && accel_device_of(acc).index == 0);
    CHECK(strcmp(accel_device_name(acc), "cpu") == 0);
    CHECK(accel_distributed_type_of(acc) == ACCEL_DIST_NO); /* not launched */
    const char *s = accel_state_summary(acc);
    CHECK_MSG(strstr(s, "Device: cpu\n\nMixed precision type:") != NULL && !strstr(s, "GPU:"), "%s",
              s);
    accel_model *m = small_model(acc);
    const accel_param *p = accel_model_param(m, 0);
    CHECK(p->data_view.device.type == ACCEL_DEVICE_CPU && p->data != NULL && p->grad != NULL);
    CHECK(accel_model_master(m) != NULL);
    accel_model_free(m);
}

static void test_init(void)
{
    unsetenv("ACCELERATE_USE_CPU");
    accel_options o = accel_options_default();
    o.cpu = 1;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    expect_cpu(acc);
    accel_free(acc);

    setenv("ACCELERATE_USE_CPU", "1", 1);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    expect_cpu(acc);
    accel_free(acc);
    unsetenv("ACCELERATE_USE_CPU");

    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK_MSG(accel_last_error(NULL)[0] == '\0', "the GPU probe left its message behind: %s",
              accel_last_error(NULL));
    if (!machine_has_gpu()) {
        expect_cpu(acc); /* exactly as a build without CUDA */
    } else {
        CHECK(accel_device_of(acc).type == ACCEL_DEVICE_CUDA && accel_device_of(acc).index == 0);
        CHECK(strcmp(accel_device_name(acc), "cuda:0") == 0);
        const char *s = accel_state_summary(acc);
        CHECK_MSG(strstr(s, "Device: cuda:0\nGPU: ") && strstr(s, "driver ") &&
                      strstr(s, "runtime ") && strstr(s, "NCCL "),
                  "%s", s);
        accel_model *m = small_model(acc);
        const accel_param *p = accel_model_param(m, 0);
        CHECK(p->data_view.device.type == ACCEL_DEVICE_CUDA && p->data == NULL && p->grad == NULL);
        CHECK(p->data_view.data != NULL && p->grad_view.data != NULL);
        CHECK(accel_model_master(m) == NULL && accel_last_status(acc) == ACCEL_ESTATE);
        accel_model_free(m);
    }
    accel_free(acc);
}

static void test_model_device(void)
{
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 0}));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){5}, NULL));
    if (!machine_has_gpu()) {
        CHECK(accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CUDA, 0}) ==
              ACCEL_EUNSUPPORTED);
        const char *e = accel_last_error(acc);
        CHECK_MSG(strstr(e, "accel_model_set_device: device cuda:0: ") &&
                      (strstr(e, "without CUDA") || strstr(e, "no CUDA device")),
                  "%s", e);
    }
    CHECK(accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 2}) == ACCEL_EINVAL);
    CHECK_OK(acc, accel_model_alloc(m));
    const accel_param *p = accel_model_param(m, 0);
    CHECK(p->data != NULL && p->data_view.device.type == ACCEL_DEVICE_CPU);
    CHECK_ERR(acc, accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 0}), ACCEL_ESTATE,
              "accel_model_set_device: the model is already allocated (on cpu)");
    accel_free(acc);
}

int main(void)
{
    test_rule();
    test_init();
    test_model_device();
    printf("test_device_select: ok\n");
    return 0;
}
