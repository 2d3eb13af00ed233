/*
 * Every environment variable accel reads, declared once (NCCL_PARAM style) with its type,
 * default and meaning; `accel env` prints this table. The typed getters refuse names missing
 * from the table, so an undocumented variable cannot creep in, and report malformed values as
 * ACCEL_EINVAL naming the variable and the value.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

static const accel__env_var env_table[] = {
    /* Process layout: torchrun / accel launch names first, then MPI and Slurm fallbacks. */
    {"RANK", ACCEL__ENV_INT, NULL, "global process index (set by accel launch)"},
    {"WORLD_SIZE", ACCEL__ENV_INT, NULL, "number of processes in the job"},
    {"LOCAL_RANK", ACCEL__ENV_INT, NULL, "process index on this machine"},
    {"LOCAL_WORLD_SIZE", ACCEL__ENV_INT, NULL, "number of processes on this machine"},
    {"MASTER_ADDR", ACCEL__ENV_STRING, "127.0.0.1",
     "address of the rendezvous: process 0 serves the job's store there without ACCEL_JOB_ID"},
    {"MASTER_PORT", ACCEL__ENV_INT, "29500",
     "port of the rendezvous (accel launch --main_process_port 0 picks a free one)"},
    {"OMPI_COMM_WORLD_RANK", ACCEL__ENV_INT, NULL, "Open MPI: global rank"},
    {"OMPI_COMM_WORLD_SIZE", ACCEL__ENV_INT, NULL, "Open MPI: number of processes"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", ACCEL__ENV_INT, NULL, "Open MPI: rank on this machine"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", ACCEL__ENV_INT, NULL, "Open MPI: processes on this machine"},
    {"PMI_RANK", ACCEL__ENV_INT, NULL, "MPICH/Intel MPI: global rank"},
    {"PMI_SIZE", ACCEL__ENV_INT, NULL, "MPICH/Intel MPI: number of processes"},
    {"MPI_LOCALRANKID", ACCEL__ENV_INT, NULL, "MPICH/Intel MPI: rank on this machine"},
    {"MPI_LOCALNRANKS", ACCEL__ENV_INT, NULL, "MPICH/Intel MPI: processes on this machine"},
    {"MV2_COMM_WORLD_RANK", ACCEL__ENV_INT, NULL, "MVAPICH2: global rank"},
    {"MV2_COMM_WORLD_SIZE", ACCEL__ENV_INT, NULL, "MVAPICH2: number of processes"},
    {"MV2_COMM_WORLD_LOCAL_RANK", ACCEL__ENV_INT, NULL, "MVAPICH2: rank on this machine"},
    {"MV2_COMM_WORLD_LOCAL_SIZE", ACCEL__ENV_INT, NULL, "MVAPICH2: processes on this machine"},
    {"SLURM_PROCID", ACCEL__ENV_INT, NULL, "Slurm: global rank"},
    {"SLURM_NTASKS", ACCEL__ENV_INT, NULL, "Slurm: number of processes"},
    {"SLURM_LOCALID", ACCEL__ENV_INT, NULL, "Slurm: rank on this machine"},
    {"SLURM_NTASKS_PER_NODE", ACCEL__ENV_INT, NULL, "Slurm: processes per machine"},
    {"CUDA_VISIBLE_DEVICES", ACCEL__ENV_STRING, NULL,
     "CUDA builds: the GPUs a process may use (accel launch --gpu_ids sets it)"},

    /* Accelerate's variables, with Accelerate's meanings. */
    {"ACCELERATE_MIXED_PRECISION", ACCEL__ENV_STRING, "no", "no | fp16 | bf16 | fp8"},
    {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS", ACCEL__ENV_INT, "1",
     "micro-steps per optimizer step; the option, when set, wins (unlike Accelerate)"},
    {"ACCELERATE_USE_CPU", ACCEL__ENV_BOOL, "false", "force the CPU (OR-ed with the option)"},
    {"ACCELERATE_DEBUG_MODE", ACCEL__ENV_BOOL, "false",
     "print the resolved configuration (main process) and also check tensor shapes of "
     "reduce/broadcast across ranks (buffer collectives always are)"},
    {"ACCELERATE_CONFIG_FILE", ACCEL__ENV_STRING, NULL, "path of the YAML config file"},
    {"ACCELERATE_RESUME_FROM_CHECKPOINT", ACCEL__ENV_STRING, NULL,
     "accel_options.resume_from_checkpoint when unset: latest | a checkpoint folder"},

    /* accel's own. */
    {"ACCEL_TIMEOUT", ACCEL__ENV_REAL, "1800", "seconds any collective or rendezvous may wait"},
    {"ACCEL_LOG_LEVEL", ACCEL__ENV_STRING, "warn", "debug | info | warn | error | off"},
    {"ACCEL_BACKEND", ACCEL__ENV_STRING, NULL,
     "force a backend: self | shm | mpi | gloo | hier | nccl"},
    {"ACCEL_SOCKET_IFNAME", ACCEL__ENV_STRING, NULL,
     "gloo, hier: the network interface to listen on, on its address of the family of the "
     "route to MASTER_ADDR, else of the other (unset: GLOO_SOCKET_IFNAME, else that route's)"},
    {"GLOO_SOCKET_IFNAME", ACCEL__ENV_STRING, NULL,
     "gloo, hier: PyTorch's name for ACCEL_SOCKET_IFNAME (which wins when both are set)"},
    {"ACCEL_GLOO_RING", ACCEL__ENV_STRING, "auto",
     "gloo: f32/f64 allreduces and reduces of 256 KiB or more run as a ring (each chunk "
     "combined from the next rank round to its owner: not shm's bits), and "
     "reduce_scatters and allgathers of 256 KiB or more in all; auto: when some process has a "
     "peer on another host, 1: also on one host, 0: never (rank order)"},
    {"ACCEL_ZERO_STAGE", ACCEL__ENV_INT, "0",
     "ZeRO stage (accel_options.zero_stage when unset): 0 (DDP), 1 (optimizer state sharded), "
     "2 (+ gradients), 3 (+ parameters)"},
    {"ACCEL_ZERO_SHARD_SIZE", ACCEL__ENV_STRING, "0",
     "hybrid sharding (accel_options.zero_shard_size when unset): shard the ZeRO state over "
     "groups of this many consecutive processes and replicate across the groups; machine: the "
     "processes of each machine (FSDP's HYBRID_SHARD); 0: every process"},
    {"ACCEL_JOB_ID", ACCEL__ENV_STRING, NULL,
     "the job's secret name for its shared memory (accel launch sets a random one; unset: the "
     "processes agree on one through the store at MASTER_ADDR:MASTER_PORT)"},
    {"ACCEL_CONFIG_CHECKED", ACCEL__ENV_STRING, NULL,
     "set by accel launch: the config file whose warnings it printed (not repeated)"},
    {"ACCEL_LAUNCH_SOURCES", ACCEL__ENV_STRING, NULL,
     "set by accel launch: where each variable it set came from (its flag, the config file or "
     "its default), one \"VAR<tab>source\" line each, for the resolved-settings report"},
    {"ACCEL_RESTART_COUNT", ACCEL__ENV_INT, "0",
     "set by accel launch: restarts of the job so far (--max_restarts); also "
     "TORCHELASTIC_RESTART_COUNT"},
    {"GROUP_RANK", ACCEL__ENV_INT, NULL,
     "the machine rank (torchrun's name; set by accel launch --num_machines M > 1): nodes are "
     "told apart by it, not by host name"},
    {"ACCEL_NUM_MACHINES", ACCEL__ENV_INT, "1",
     "set by accel launch: the number of machines of the job (absent or 1: one machine)"},
    {"ACCEL_STORE_SERVED", ACCEL__ENV_BOOL, "false",
     "set by accel launch on several machines: machine 0's launcher serves the job's store at "
     "MASTER_ADDR:MASTER_PORT; no process serves one, all connect as clients (keys prefixed by "
     "ACCEL_JOB_ID and ACCEL_RESTART_COUNT)"},
    {"ACCEL_TEST_PREFLIGHT_CLOSED", ACCEL__ENV_STRING, NULL,
     "test hook of accel launch --preflight: 1 makes this machine's launcher endpoint "
     "unreachable (refused), drop makes it never answer (each hop to it times out)"},
    {"ACCEL_SIM_GPU", ACCEL__ENV_INT, "0",
     "TESTING AID, never for training: in a build without CUDA, n > 0 (at most 8) makes the "
     "cuda device n simulated GPUs (host memory behind page protection, work deferred until "
     "synchronised; docs/cuda.md, Testing without a GPU); a CUDA build refuses it"},
    {"ACCEL_TEST_FAIL_CHECK", ACCEL__ENV_STRING, NULL,
     "test hook of accel test: the named check fails on purpose"},
    {"ACCEL_TEST_REPORT", ACCEL__ENV_STRING, NULL,
     "set by accel test: the file where its processes name a failed check"},
    {"OMP_NUM_THREADS", ACCEL__ENV_INT, NULL,
     "threads per process (OpenMP, BLAS); accel launch sets max(1, cores / processes) when unset"},
    {"ACCEL_NN_ATTN", ACCEL__ENV_STRING, "auto",
     "nn on CUDA: the attention kernels, auto (tensor cores under bf16 / fp16 autocast where "
     "they apply, forward and backward) | warp (the fp32 warp-per-row kernels always; A/B "
     "timing); read at the first attention forward"},
    {"ACCEL_NN_ATTN_FAST", ACCEL__ENV_INT, "1",
     "nn on CUDA: 0 keeps the tensor-core attention off its register paths (forward: S and P "
     "through shared memory; backward: P and dS through an fp32 shared scratch, expf), for A/B "
     "timing or as a fallback; 1: the register paths wherever the GPU's WMMA fragment layout "
     "allows them (checked at run time); read at the first attention forward"},
    {"ACCEL_NN_BGRAD", ACCEL__ENV_INT, "0",
     "nn on CUDA: how a linear's bias gradient is summed, 0 by a column-sum kernel over dY (a "
     "pass of its own) | 1 by cuBLASLt's BGRADA / BGRADB epilogue in the weight-gradient "
     "product, which reads dY anyway (A/B timing; the column-sum kernel where cuBLASLt has no "
     "such algorithm); read at the first linear backward"},
    {"ACCEL_NN_CE_CHUNK_ROWS", ACCEL__ENV_INT, "0",
     "nn_linear_cross_entropy (the GPT's head and loss): rows of logits per chunk; 0: as many "
     "as keep a chunk's fp32 logits within 256 MiB (tests set a few rows to exercise chunks); "
     "read at the first call"},
    {"ACCEL_NN_DGELU", ACCEL__ENV_STRING, "kernel",
     "nn on CUDA, under bf16 / fp16 autocast: how nn_linear_gelu_linear's backward makes the "
     "hidden gradient and the first bias's, kernel (a plain 2-byte product, then one pass for "
     "GELU's derivative and the bias gradient) | epilogue (cuBLASLt's DGELU_BGRAD epilogue; A/B "
     "timing); read at the first fused MLP backward"},
    {"ACCEL_NN_SHADOW", ACCEL__ENV_INT, "1",
     "nn on CUDA, under bf16 / fp16 autocast: 1 the ops that feed a product (LayerNorm, a "
     "linear's backward) also write its 2-byte operand in the same pass, a GPT block's "
     "LayerNorm outputs are held only in 2 bytes, and a residual add's inputs borrow its "
     "gradient instead of copies | 0 as before: a rounding pass per operand and copies (A/B "
     "timing); read at the first use"},
    {"ACCEL_NN_REWIND", ACCEL__ENV_INT, "1",
     "nn_gpt without recomputation: 1 each block's backward gives back the arena memory it "
     "allocated (its intermediate gradients) once done | 0 as before: every gradient kept to "
     "the step's end (A/B; the results are the same bits); read at the first GPT forward"},
    {"ACCEL_SHM_ONESHOT_NBYTES", ACCEL__ENV_INT, "262144",
     "shm: largest message reduced one-shot; larger ones use reduce-scatter + all-gather"},
    {"ACCEL_SHM_CHUNK_NBYTES", ACCEL__ENV_INT, "1048576",
     "shm: pipeline chunk of the large-message algorithms"},
    {"ACCEL_SHM_SPIN_US", ACCEL__ENV_INT, "50", "shm: microseconds a wait spins before sleeping"},
    {"ACCEL_SHM_NT_NBYTES", ACCEL__ENV_INT, "8388608",
     "shm: messages from this size on are written to the output with streaming stores"},
    {"ACCEL_SHM_ZEROCOPY_NBYTES", ACCEL__ENV_INT, "2097152",
     "shm: in-place messages larger than this in accel_alloc_shared memory skip the copies "
     "(-1: never)"},
    /* Tracking and logging (src/track, src/track/logger.c). */
    {"ACCELERATE_LOG_LEVEL", ACCEL__ENV_STRING, NULL,
     "level of accel_get_logger loggers: debug | info | warning | error (default info)"},
    {"MLFLOW_TRACKING_URI", ACCEL__ENV_STRING, NULL,
     "mlflow tracker: store root (a local path or file: URI; default logging_dir/mlruns)"},
    {"MLFLOW_EXPERIMENT_NAME", ACCEL__ENV_STRING, NULL,
     "mlflow tracker: experiment name (default: the project name)"},
    {"MLFLOW_RUN_ID", ACCEL__ENV_STRING, NULL,
     "mlflow tracker: continue this existing run instead of starting a new one"},
    {"USER", ACCEL__ENV_STRING, NULL, "mlflow tracker: the run's user tag (default unknown)"},
    {NULL, ACCEL__ENV_STRING, NULL, NULL},
};

const accel__env_var *accel__env_table(void)
{
    return env_table;
}

static const char *lookup(const char *name)
{
    int known = 0;
    for (const accel__env_var *v = env_table; v->name != NULL; v++) {
        if (strcmp(v->name, name) == 0) {
            known = 1;
            break;
        }
    }
    ACCEL_ASSERT(known);
    const char *s = getenv(name);
    return (s != NULL && s[0] != '\0') ? s : NULL;
}

accel_status accel__env_int(const char *name, long long *out)
{
    const char *s = lookup(name);
    if (s == NULL) {
        return ACCEL_ENOTFOUND;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    while (isspace((unsigned char)*end)) {
        end++;
    }
    if (errno != 0 || end == s || *end != '\0') {
        return accel__seterr(NULL, ACCEL_EINVAL, "environment variable %s=\"%s\" is not an integer",
                             name, s);
    }
    *out = v;
    return ACCEL_OK;
}

accel_status accel__env_real(const char *name, double *out)
{
    const char *s = lookup(name);
    if (s == NULL) {
        return ACCEL_ENOTFOUND;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    while (isspace((unsigned char)*end)) {
        end++;
    }
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "environment variable %s=\"%s\" is not a number",
                             name, s);
    }
    *out = v;
    return ACCEL_OK;
}

int accel__parse_bool(const char *s)
{
    static const char *yes[] = {"1", "true", "yes", "y", "on", "t"};
    static const char *no[] = {"0", "false", "no", "n", "off", "f"};
    if (s == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            return 1;
        }
        if (strcasecmp(s, no[i]) == 0) {
            return 0;
        }
    }
    return -1;
}

accel_status accel__env_bool(const char *name, int *out)
{
    const char *s = lookup(name);
    if (s == NULL) {
        return ACCEL_ENOTFOUND;
    }
    int b = accel__parse_bool(s);
    if (b < 0) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "environment variable %s=\"%s\" is not a boolean (true/false/1/0)",
                             name, s);
    }
    *out = b;
    return ACCEL_OK;
}

accel_status accel__env_string(const char *name, const char **out)
{
    const char *s = lookup(name);
    if (s == NULL) {
        return ACCEL_ENOTFOUND;
    }
    *out = s;
    return ACCEL_OK;
}
