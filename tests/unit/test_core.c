/* Core: status and dtype tables, option resolution and process-layout parsing from the env,
 * and chained error messages (a message formatted from the previous one). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/internal.h"

static void clear_env(void)
{
    const char *vars[] = {"RANK",
                          "WORLD_SIZE",
                          "LOCAL_RANK",
                          "LOCAL_WORLD_SIZE",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "PMI_RANK",
                          "PMI_SIZE",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_LOCALID",
                          "ACCELERATE_MIXED_PRECISION",
                          "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                          "ACCELERATE_USE_CPU",
                          "ACCELERATE_DEBUG_MODE",
                          "ACCEL_TIMEOUT",
                          "ACCEL_LOG_LEVEL",
                          "ACCEL_BACKEND",
                          "ACCEL_NUM_MACHINES",
                          "GROUP_RANK",
                          NULL};
    for (int i = 0; vars[i]; i++) {
        unsetenv(vars[i]);
    }
    /* No user config file may leak into the test. */
    setenv("HF_HOME", "/nonexistent/accel-test-hf-home", 1);
    unsetenv("ACCELERATE_CONFIG_FILE");
}

/* accel_init must fail with EINVAL and a message containing `needle`. */
static void expect_einval(const char *needle)
{
    accel *acc = NULL;
    accel_status st = accel_init(&acc, NULL);
    CHECK_MSG(st == ACCEL_EINVAL, "got %s", accel_status_name(st));
    CHECK(acc == NULL);
    CHECK_MSG(strstr(accel_last_error(NULL), needle) != NULL, "message \"%s\" lacks \"%s\"",
              accel_last_error(NULL), needle);
}

static void test_tables(void)
{
    CHECK(strcmp(accel_status_name(ACCEL_EPEER), "EPEER") == 0);
    CHECK(strcmp(accel_status_name((accel_status)42), "UNKNOWN") == 0);
    CHECK(accel_status_str(ACCEL_OK)[0] != '\0');
    /* Every dtype of the safetensors format (huggingface/safetensors' Dtype enum). */
    static const char *names[] = {
        "F32",     "F64",         "F16",         "BF16", "F8_E4M3", "F8_E5M2", "I8",  "U8",
        "I16",     "U16",         "I32",         "I64",  "BOOL",    "U32",     "U64", "C64",
        "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",   "F6_E2M3", "F6_E3M2"};
    static const size_t bits[] = {32, 64, 16, 16, 8,  8, 8, 8, 16, 16, 32,
                                  64, 8,  32, 64, 64, 8, 8, 8, 4,  6,  6};
    CHECK(sizeof(names) / sizeof(names[0]) == ACCEL_DTYPE_COUNT);
    for (int i = 0; i < ACCEL_DTYPE_COUNT; i++) {
        accel_dtype dt;
        CHECK(strcmp(accel_dtype_name((accel_dtype)i), names[i]) == 0);
        CHECK(accel_dtype_bits((accel_dtype)i) == bits[i]);
        CHECK(accel_dtype_nbytes((accel_dtype)i) == (bits[i] % 8 ? 0 : bits[i] / 8));
        CHECK(accel_dtype_from_name(names[i], &dt) == ACCEL_OK && dt == (accel_dtype)i);
    }
    accel_dtype dt;
    CHECK(accel_dtype_from_name("f32", &dt) == ACCEL_EINVAL);
    CHECK(accel_dtype_nbytes(ACCEL_DTYPE_COUNT) == 0 && accel_dtype_bits(ACCEL_DTYPE_COUNT) == 0);
    CHECK(accel_dtype_is_float(ACCEL_F8_E8M0) && accel_dtype_is_float(ACCEL_F4));
    CHECK(!accel_dtype_is_float(ACCEL_C64) && !accel_dtype_is_float(ACCEL_U64));
    int64_t shape[2] = {3, 4};
    accel_tensor t = accel_tensor_view(NULL, ACCEL_BF16, 2, shape);
    CHECK(accel_tensor_numel(&t) == 12 && accel_tensor_nbytes(&t) == 24);
    t.dtype = ACCEL_F6_E2M3; /* 12 x 6 bits */
    CHECK(accel_tensor_nbytes(&t) == 9);
}

static void test_single_process(void)
{
    clear_env();
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(accel_num_processes(acc) == 1 && accel_process_index(acc) == 0);
    CHECK(accel_is_main_process(acc) && accel_is_last_process(acc));
    CHECK(accel_distributed_type_of(acc) == ACCEL_DIST_NO && !accel_use_distributed(acc));
    CHECK(strcmp(accel_backend_name(acc), "self") == 0);
    CHECK(accel_gradient_accumulation_steps(acc) == 1);
    CHECK(accel_resolved_options(acc)->timeout_s == 1800);
    const char *s = accel_state_summary(acc);
    CHECK(strcmp(s, "Distributed environment: NO  Backend: self\nNum processes: 1\n"
                    "Process index: 0\nLocal process index: 0\nDevice: cpu\n\n"
                    "Mixed precision type: no\n") == 0);
    CHECK_OK(acc, accel_wait_for_everyone(acc));
    CHECK_OK(acc, accel_main_process_first_begin(acc));
    CHECK_OK(acc, accel_main_process_first_end(acc));
    accel_free(acc);
    /* A NULL handle is ACCEL_EINVAL naming the call, never a crash. */
    CHECK_ERR(NULL, accel_wait_for_everyone(NULL), ACCEL_EINVAL,
              "accel_wait_for_everyone: acc is NULL");
    CHECK_ERR(NULL, accel_main_process_first_begin(NULL), ACCEL_EINVAL,
              "accel_main_process_first_begin: acc is NULL");
    CHECK_ERR(NULL, accel_main_process_first_end(NULL), ACCEL_EINVAL,
              "accel_main_process_first_end: acc is NULL");
    CHECK_ERR(NULL, accel_local_main_process_first_begin(NULL), ACCEL_EINVAL,
              "accel_local_main_process_first_begin: acc is NULL");
    CHECK_ERR(NULL, accel_local_main_process_first_end(NULL), ACCEL_EINVAL,
              "accel_local_main_process_first_end: acc is NULL");
    CHECK_ERR(NULL, accel_on_main_process(NULL, NULL, NULL), ACCEL_EINVAL,
              "accel_on_process: acc is NULL");
    CHECK_ERR(NULL, accel_on_local_main_process(NULL, NULL, NULL), ACCEL_EINVAL,
              "accel_on_local_process: acc is NULL");
    CHECK_ERR(NULL, accel_on_last_process(NULL, NULL, NULL), ACCEL_EINVAL,
              "accel_on_last_process: acc is NULL");
    /* The state queries (no status to fail with) read a NULL handle as no process. */
    CHECK(accel_process_index(NULL) == -1 && accel_local_process_index(NULL) == -1);
    CHECK(accel_num_processes(NULL) == 0 && accel_local_num_processes(NULL) == 0);
    CHECK(!accel_is_main_process(NULL) && !accel_is_local_main_process(NULL) &&
          !accel_is_last_process(NULL) && !accel_use_distributed(NULL));
    CHECK(accel_distributed_type_of(NULL) == ACCEL_DIST_NO);
    CHECK(accel_device_of(NULL).type == ACCEL_DEVICE_CPU);
    CHECK(strcmp(accel_device_name(NULL), "") == 0 && strcmp(accel_backend_name(NULL), "") == 0);
    CHECK(accel_mixed_precision(NULL) == ACCEL_PRECISION_UNSET);
    CHECK(accel_gradient_accumulation_steps(NULL) == 0 && accel_resolved_options(NULL) == NULL);
    accel_print(NULL, "never printed\n");
    CHECK(strcmp(accel_state_summary(NULL), "") == 0);
}

static void test_env_precedence(void)
{
    clear_env();
    setenv("ACCELERATE_MIXED_PRECISION", "bf16", 1);
    setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", 1);
    setenv("ACCEL_TIMEOUT", "12.5", 1);
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_BF16);
    CHECK(accel_gradient_accumulation_steps(acc) == 4);
    CHECK(accel_resolved_options(acc)->timeout_s == 12.5);
    accel_free(acc);

    /* The argument wins over the environment. */
    accel_options o = accel_options_default();
    o.mixed_precision = ACCEL_PRECISION_NO;
    o.gradient_accumulation_steps = 2;
    o.timeout_s = 3;
    CHECK_OK(NULL, accel_init(&acc, &o));
    CHECK(accel_mixed_precision(acc) == ACCEL_PRECISION_NO);
    CHECK(accel_gradient_accumulation_steps(acc) == 2);
    CHECK(accel_resolved_options(acc)->timeout_s == 3);
    accel_free(acc);

    /* ACCELERATE_USE_CPU is OR-ed and boolean-parsed. */
    clear_env();
    setenv("ACCELERATE_USE_CPU", "True", 1);
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(accel_resolved_options(acc)->cpu == 1);
    accel_free(acc);
}

static void test_malformed(void)
{
    clear_env();
    setenv("WORLD_SIZE", "abc", 1);
    expect_einval("WORLD_SIZE=\"abc\"");
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "2", 1);
    expect_einval("RANK=2");
    setenv("RANK", "-1", 1);
    expect_einval("RANK");
    unsetenv("RANK");
    expect_einval("RANK");
    clear_env();
    setenv("ACCELERATE_MIXED_PRECISION", "fp12", 1);
    expect_einval("ACCELERATE_MIXED_PRECISION=\"fp12\"");
    clear_env();
    setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "0", 1);
    expect_einval("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    clear_env();
    setenv("ACCELERATE_USE_CPU", "maybe", 1);
    expect_einval("ACCELERATE_USE_CPU=\"maybe\"");
    clear_env();
    setenv("ACCEL_TIMEOUT", "-5", 1);
    expect_einval("ACCEL_TIMEOUT");
    clear_env();
    setenv("ACCEL_LOG_LEVEL", "loud", 1);
    expect_einval("ACCEL_LOG_LEVEL=\"loud\"");
    clear_env();
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
    expect_einval("OMPI_COMM_WORLD_RANK=\"x1\"");
    clear_env();
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "1", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    expect_einval("LOCAL_RANK=3");
    clear_env();
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = -3;
    accel *acc = NULL;
    CHECK(accel_init(&acc, &o) == ACCEL_EINVAL && acc == NULL);
    CHECK(strstr(accel_last_error(NULL), "gradient_accumulation_steps") != NULL);
}

static void test_launched_one_process(void)
{
    /* accel launch --num_processes 1 sets LOCAL_RANK: Accelerate reports MULTI_CPU. */
    clear_env();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(accel_distributed_type_of(acc) == ACCEL_DIST_MULTI_CPU);
    CHECK(!accel_use_distributed(acc));
    accel_free(acc);
    clear_env();
}

/* accel launch --num_machines M sets ACCEL_NUM_MACHINES and GROUP_RANK: the summary names the
 * machine and what the communicator runs on; a machine rank out of range is refused. (One
 * process stands for the machine here: the self backend needs no peers.) */
static void test_machines_summary(void)
{
    clear_env();
    setenv("ACCEL_NUM_MACHINES", "2", 1);
    setenv("GROUP_RANK", "1", 1);
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    CHECK(strstr(accel_state_summary(acc),
                 "Local process index: 0\nNum machines: 2\nMachine index: 1\nComm: self\n"
                 "Device: cpu\n") != NULL);
    accel_free(acc);
    setenv("GROUP_RANK", "2", 1);
    CHECK_ERR(NULL, accel_init(&acc, NULL), ACCEL_EINVAL,
              "environment variable GROUP_RANK=2 is not below ACCEL_NUM_MACHINES=2");
    clear_env();
}

/* "X failed: %s" with the previous message as argument: the argument is the very buffer being
 * written (the thread's, or the handle's), which must not garble the result. */
static void test_chained_errors(void)
{
    accel__seterr(NULL, ACCEL_EIO, "inner cause %d", 7);
    CHECK_ERR(NULL, accel__seterr(NULL, ACCEL_EPEER, "outer failed: %s", accel_last_error(NULL)),
              ACCEL_EPEER, "outer failed: inner cause 7");
    CHECK_ERR(NULL,
              accel__seterr(NULL, ACCEL_EPEER, "%s; again: %s", accel_last_error(NULL),
                            accel_last_error(NULL)),
              ACCEL_EPEER, "outer failed: inner cause 7; again: outer failed: inner cause 7");
    accel *acc;
    clear_env();
    CHECK_OK(NULL, accel_init(&acc, NULL));
    accel__seterr(acc, ACCEL_EIO, "handle cause");
    CHECK_ERR(acc, accel__seterr(acc, ACCEL_ECORRUPT, "wrapped: %s", accel_last_error(acc)),
              ACCEL_ECORRUPT, "wrapped: handle cause");
    CHECK(strcmp(accel_last_error(NULL), "wrapped: handle cause") == 0);
    CHECK_ERR(acc, accel__seterr(acc, ACCEL_EIO, "twice: %s", accel_last_error(NULL)), ACCEL_EIO,
              "twice: wrapped: handle cause");
    /* adopt copies the thread's message onto the handle. */
    accel__seterr(NULL, ACCEL_ETIMEDOUT, "thread only");
    CHECK_ERR(acc, accel__adopt_thread_error(acc, ACCEL_ETIMEDOUT), ACCEL_ETIMEDOUT, "thread only");
    accel_free(acc);
}

/* A program started with its standard error closed (`2>&-`): accel_init opens it on /dev/null,
 * so no socket or file accel opens takes number 2 and receives its messages. In a child. */
static void test_closed_stderr(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        clear_env();
        close(2);
        accel *acc;
        if (accel_init(&acc, NULL) != ACCEL_OK) {
            _exit(2);
        }
        char target[64] = "";
        ssize_t n = readlink("/proc/self/fd/2", target, sizeof(target) - 1);
        accel_free(acc);
        _exit(n > 0 && strncmp(target, "/dev/null", 9) == 0 ? 0 : 3);
    }
    int ws;
    CHECK(waitpid(pid, &ws, 0) == pid);
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
              "with stderr closed, accel_init left fd 2 %s (child status %d)",
              WIFEXITED(ws) && WEXITSTATUS(ws) == 3 ? "not on /dev/null" : "failing", ws);
}

int main(void)
{
    test_chained_errors();
    test_tables();
    test_single_process();
    test_env_precedence();
    test_malformed();
    test_launched_one_process();
    test_machines_summary();
    test_closed_stderr();
    printf("test_core: ok\n");
    return 0;
}
