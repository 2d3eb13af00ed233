/*
 * Processes of one job that resolve different settings (two machines' config files, a variable
 * exported on one machine only, different arguments): accel_init fails with ACCEL_EINVAL on
 * every process, with the same message naming the setting, process 0 and the first process
 * that differs, and each one's value and source; nobody is left waiting. Settings that may
 * differ per machine (the config file's path, project_dir's path, the cpu flag) and agreeing
 * settings still initialise. Each case sets the environment or the options per rank before
 * accel_init (the last rank, "L", is the one that differs).
 * ACCEL_TEST_NPROCS: 2 3
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static int rank, n_ranks;
static char cfg_path[256];

/* The config file of rank r in case `tag` (the launcher's pid keeps jobs apart). */
static const char *config_name(const char *tag, int r, char *buf, size_t nbytes)
{
    snprintf(buf, nbytes, "/tmp/accel_test_agree_%d_%s_r%d.yaml", (int)getppid(), tag, r);
    return buf;
}

/* This rank's config file: the keys every case needs plus `extra` (YAML lines). */
static const char *write_config(const char *tag, const char *extra)
{
    config_name(tag, rank, cfg_path, sizeof(cfg_path));
    FILE *f = fopen(cfg_path, "w");
    CHECK(f != NULL);
    fprintf(f, "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n%s", extra);
    fclose(f);
    return cfg_path;
}

/* Options every case starts from: a config file of this rank's own (so that no file of the
 * machine's default location takes part). */
static accel_options base_options(const char *tag)
{
    accel_options o = accel_options_default();
    o.config_file = write_config(tag, "");
    return o;
}

/* accel_init must fail with ACCEL_EINVAL and exactly `want` on this process, leave `out`
 * untouched, and the next accel_init must work (nothing of the failed one left behind). */
static void expect_disagree(const char *name, const accel_options *o, const char *want)
{
    accel *acc = (accel *)(void *)&rank; /* a sentinel: a failing accel_init must not write */
    accel_status st = accel_init(&acc, o);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(st == ACCEL_EINVAL && strcmp(msg, want) == 0,
              "%s: process %d: got %s \"%s\"\n    expected ACCEL_EINVAL \"%s\"", name, rank,
              accel_status_name(st), msg, want);
    CHECK_MSG(acc == (accel *)(void *)&rank, "%s: accel_init wrote *out on failure", name);
    remove(cfg_path);
}

static void expect_agree(const char *name, const accel_options *o)
{
    accel *acc = NULL;
    accel_status st = accel_init(&acc, o);
    CHECK_MSG(st == ACCEL_OK, "%s: process %d: %s: %s", name, rank, accel_status_name(st),
              accel_last_error(NULL));
    CHECK_OK(acc, accel_barrier(acc, NULL));
    accel_free(acc);
    remove(cfg_path);
}

#define SUFFIX " (every process of a job must resolve the same settings)"

int main(void)
{
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    CHECK(r != NULL && w != NULL);
    rank = atoi(r);
    n_ranks = atoi(w);
    const int last = n_ranks - 1;
    /* Plain sources ("env VAR"): what accel launch set is not what the cases set. */
    unsetenv("ACCEL_LAUNCH_SOURCES");
    unsetenv("ACCELERATE_MIXED_PRECISION");
    unsetenv("ACCELERATE_CONFIG_FILE");
    char want[1024];

    /* Agreeing settings, with what may differ per machine differing: the config file's path
     * (every rank has its own), project_dir's path, the cpu flag. */
    {
        accel_options o = base_options("ok");
        char dir[64];
        snprintf(dir, sizeof(dir), "/tmp/accel_test_agree_machine%d", rank);
        o.project_dir = dir;
        o.cpu = rank == last ? 1 : -1;
        setenv("ACCELERATE_MIXED_PRECISION", "bf16", 1);
        expect_agree("agreeing", &o);
        unsetenv("ACCELERATE_MIXED_PRECISION");
    }

    /* mixed_precision from the environment, the last process's different. */
    {
        accel_options o = base_options("mp");
        setenv("ACCELERATE_MIXED_PRECISION", rank == last ? "fp16" : "bf16", 1);
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on mixed_precision: process 0 has bf16 (env "
                 "ACCELERATE_MIXED_PRECISION), process %d has fp16 (env "
                 "ACCELERATE_MIXED_PRECISION)" SUFFIX,
                 last);
        expect_disagree("mixed_precision env", &o, want);
        unsetenv("ACCELERATE_MIXED_PRECISION");
    }

    /* mixed_precision from each machine's config file. */
    {
        accel_options o = accel_options_default();
        o.config_file = write_config("mpcfg", rank == last ? "mixed_precision: fp16\n"
                                                           : "mixed_precision: bf16\n");
        char p0[256], pl[256];
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on mixed_precision: process 0 has bf16 (config "
                 "file %s:mixed_precision (line 3)), process %d has fp16 (config file "
                 "%s:mixed_precision (line 3))" SUFFIX,
                 config_name("mpcfg", 0, p0, sizeof(p0)), last,
                 config_name("mpcfg", last, pl, sizeof(pl)));
        expect_disagree("mixed_precision config file", &o, want);
    }

    /* ACCEL_TIMEOUT exported on one machine only: that side would give up first. */
    {
        accel_options o = base_options("timeout");
        if (rank == last) {
            setenv("ACCEL_TIMEOUT", "600", 1);
        }
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on timeout_s: process 0 has 1800 (default), "
                 "process %d has 600 (env ACCEL_TIMEOUT)" SUFFIX,
                 last);
        expect_disagree("timeout env", &o, want);
        unsetenv("ACCEL_TIMEOUT");
    }

    /* Gradient accumulation and ZeRO stage at once: the first is named, the other listed. */
    {
        accel_options o = base_options("accum");
        if (rank == last) {
            setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", 1);
            setenv("ACCEL_ZERO_STAGE", "2", 1);
        }
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on gradient_accumulation_steps: process 0 has 1 "
                 "(default), process %d has 4 (env ACCELERATE_GRADIENT_ACCUMULATION_STEPS) "
                 "(every process of a job must resolve the same settings; they also disagree on "
                 "zero_stage)",
                 last);
        expect_disagree("accumulation and zero env", &o, want);
        unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
        unsetenv("ACCEL_ZERO_STAGE");
    }

    /* Debug mode on one machine only: its extra shape-check collectives would hang. */
    {
        accel_options o = base_options("debug");
        if (rank == last) {
            setenv("ACCELERATE_DEBUG_MODE", "1", 1);
        }
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on debug: process 0 has 0 (default), process %d "
                 "has 1 (env ACCELERATE_DEBUG_MODE)" SUFFIX,
                 last);
        /* The debug process prints the table on rank 0 only: nothing to see from the last. */
        expect_disagree("debug env", &o, want);
        unsetenv("ACCELERATE_DEBUG_MODE");
    }

    /* Arguments: a bucket size that "%g" would show alike (replicas' buckets would differ). */
    {
        accel_options o = base_options("bucket");
        o.bucket_cap_mb = rank == last ? 25.0000001 : 25.0;
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on bucket_cap_mb: process 0 has 25 (argument), "
                 "process %d has 25.0000001 (argument)" SUFFIX,
                 last);
        expect_disagree("bucket argument", &o, want);
    }

    /* An argument on some processes against the default on the others, every process but 0
     * differing (3 processes: "the first of 2"). */
    {
        accel_options o = base_options("even");
        if (rank != 0) {
            o.even_batches = 0;
        }
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on even_batches: process 0 has 1 (default), "
                 "process 1%s has 0 (argument)" SUFFIX,
                 n_ranks > 2 ? " (the first of 2 that differ from process 0)" : "");
        expect_disagree("even_batches argument", &o, want);
    }

    /* comm_dtype, and the fp16 loss scaler's schedule. */
    {
        accel_options o = base_options("wire");
        o.comm_dtype = rank == last ? ACCEL_BF16 : ACCEL_F16;
        o.growth_interval = rank == last ? 100 : 0;
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on comm_dtype: process 0 has F16 (argument), "
                 "process %d has BF16 (argument) (every process of a job must resolve the same "
                 "settings; they also disagree on growth_interval)",
                 last);
        expect_disagree("comm_dtype argument", &o, want);
    }

    /* project_dir set on some processes only: the path may differ, its presence not. */
    {
        accel_options o = base_options("pdir");
        o.project_dir = rank == last ? NULL : "/tmp/accel_test_agree_pdir";
        snprintf(want, sizeof(want),
                 "accel_init: processes disagree on project_dir: process 0 has "
                 "/tmp/accel_test_agree_pdir (argument), process %d has (none) (default) (every "
                 "process of a job must resolve the same settings; the path may differ per "
                 "machine, but it must be set on every process or on none; they also disagree "
                 "on logging_dir)",
                 last);
        expect_disagree("project_dir presence", &o, want);
    }

    /* Everything agrees again: the failed calls left nothing behind. */
    {
        accel_options o = base_options("again");
        expect_agree("agreeing again", &o);
    }
    return 0;
}
