#!/usr/bin/env bash
# A process that dies or stops mid-training on the GPU is named by the other, which exits
# within 10 s (issue 14's tests): 2 processes of examples/cuda_mlp started by hand, sharing the
# GPU (gradients staged through host memory, shm backend) or, with a GPU each (several GPUs;
# the emulator build's "/nccl" run with ACCEL_CUEMU_DEVICES), on the nccl backend, where the
# liveness watch (src/comm/watch.h) must see what NCCL does not. Once rank 0 has logged a step,
# after a random delay, rank 1 is
#  1. SIGKILLed: rank 0 exits 1 within 10 s, its last line saying EPEER and naming
#     "process 1 (pid P)";
#  2. SIGSTOPped (ACCEL_TIMEOUT=2): rank 0 exits 1 within 10 s with ETIMEDOUT naming process 1
#     and its pid.
# Wherever the signal lands (a staged bucket's all-reduce in accel_backward_end, the loss's
# all-reduce), the survivor neither hangs nor crashes. The backend rank 0 logged is the one the
# message comes from ("nccl: ..." on nccl), and it is nccl under ACCEL_CUEMU_DEVICES. Exits 77
# (skipped) without the CUDA build or without a GPU. The delays are printed on failure (SEED=N
# repeats a run).
# ACCEL_TEST_LABELS: nccl
set -u
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
EX=$BUILD/examples/cuda_mlp
if [ ! -x "$EX" ]; then
    echo "SKIP: $EX is not built (configure with -DACCEL_CUDA=ON)"
    exit 77
fi
export OMP_NUM_THREADS=1
PD_READY='step [0-9]* loss' PD_READY_S=30 PD_WATCHDOG_S=60
. "$(dirname "$0")/../peer_death.sh"

rc=0
"$EX" --steps 1 >"$tmp/probe.out" 2>&1 || rc=$?
if [ "$rc" = 77 ]; then
    echo "SKIP: $(tail -1 "$tmp/probe.out")"
    exit 77
fi
[ "$rc" = 0 ] || fail "cuda_mlp --steps 1 exited with $rc"

# start_job JOB [VAR=VALUE...]: 2 ranks of cuda_mlp, returns once rank 0 has logged a step.
start_job() {
    local job=$1
    shift
    pd_start "$job" 2 ACCEL_LOG_LEVEL=info "$@" -- "$EX" --steps 100000000 --log_every 1
}

# check_survivor JOB STATUS: rank 0 exits 1 within 10 s of the signal, with an error line
# (ACCEL_CHECK's "file:line: call: STATUS: message") naming process 1 and its pid.
check_survivor() {
    local job=$1 status=$2 line
    pd_survivor "$job" 0 10
    line=$(grep ": $status: .*process 1 (pid ${pids[1]})" "$tmp/$job.0.err" | tail -1)
    [ -n "$line" ] || fail "$job: rank 0 did not report $status naming process 1 (pid ${pids[1]})"
    backend=$(sed -n 's/.*initialised: .*backend \([a-z]*\).*/\1/p' "$tmp/$job.0.err" | head -1)
    if [ -n "${ACCEL_CUEMU_DEVICES:-}" ] && [ "$backend" != nccl ]; then
        fail "$job: rank 0 ran on backend '$backend', not nccl (a GPU per process)"
    fi
    if [ "$backend" = nccl ] && ! echo "$line" | grep -q ": nccl: "; then
        fail "$job: rank 0's error does not come from the nccl backend"
    fi
    echo "$job ($backend): rank 0 exited after ${pd_took}s: ${line#*: }"
}

# 1. SIGKILL.
job=cpd$$-kill
start_job "$job"
pd_signal KILL
check_survivor "$job" EPEER
pd_end

# 2. SIGSTOP with a 2 s timeout.
job=cpd$$-stop
start_job "$job" ACCEL_TIMEOUT=2
pd_signal STOP
check_survivor "$job" ETIMEDOUT
pd_end
echo "PASS"
