#!/usr/bin/env bash
# accel launch --mpirun_hostfile (issue 16, item 4): the job runs through mpirun with a
# localhost hostfile, as `accelerate launch` does for MULTI_CPU.
#  1. The command line is Accelerate's (--hostfile F --npernode N/M -n N --bind-to socket for
#     Open MPI) and a 2-process job of all-reduces succeeds (the ranks take their layout from
#     mpirun's variables).
#  2. The config file's mpirun_config.mpirun_hostfile does the same without the flag (and
#     without mpirun in PATH the error names that key's line).
#  3. A rank that kills itself (SIGKILL) mid-job: the runtime kills the rest, and the launcher
#     still names the rank that died first, exiting non-zero.
# Skips (77) without mpirun. As root, Open MPI needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), set here.
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
PROG=$B/tests/progs/allreduce_loop
[ -x "$ACCEL" ] && [ -x "$PROG" ] || { echo "missing $ACCEL or $PROG"; exit 1; }
command -v mpirun >/dev/null ||
    { echo "SKIP: mpirun not installed (apt-get install openmpi-bin)"; exit 77; }
mpirun --version 2>&1 | grep -q "Open MPI" ||
    { echo "SKIP: this test expects Open MPI's mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Two ranks need two slots whatever the core count; --bind-to socket needs no more ranks than
# cores, so the job has 2 processes (this machine may have only 2 cores).
source "$(dirname "$0")/launch_common.sh" # has (its fail is replaced below)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    echo "---- stdout:"; cat "$T/out"
    echo "---- stderr:"; cat "$T/err"
    exit 1
}
echo "localhost slots=2" >"$T/hosts"

# ---- 1. the flag ----
timeout 120 "$ACCEL" launch --mpirun_hostfile "$T/hosts" -n 2 "$PROG" --iters 20 --count 64 \
    >"$T/out" 2>"$T/err" || fail "the job failed"
has "$T/err" "through .*mpirun (Open MPI): .*mpirun --hostfile $T/hosts" \
    "--npernode 2 -n 2 --bind-to socket .* __mpirank $PROG --iters 20" ||
    fail "not Accelerate's mpirun command line"
[ "$(grep -c "20 allreduces ok" "$T/out" "$T/err" | awk -F: '{s+=$2} END {print s}')" = 2 ] ||
    fail "not both ranks did their all-reduces"
echo "ok: --mpirun_hostfile runs the job through mpirun"

# ---- 2. the config file ----
cat >"$T/cfg.yaml" <<EOF
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_processes: 2
num_machines: 1
use_cpu: true
mpirun_config:
  mpirun_hostfile: $T/hosts
EOF
timeout 120 "$ACCEL" launch --config_file "$T/cfg.yaml" "$PROG" --iters 5 --count 8 \
    >"$T/out" 2>"$T/err" || fail "the job of the config file failed"
grep -q "mpirun --hostfile $T/hosts --npernode 2 -n 2" "$T/err" ||
    fail "the config's hostfile was not used"
echo "ok: mpirun_config.mpirun_hostfile from the config file"
# ... and without mpirun in PATH the error names the config file's line, not the flag
PATH=/nonexistent "$ACCEL" launch --config_file "$T/cfg.yaml" "$PROG" >"$T/out" 2>"$T/err"
rc=$?
[ $rc = 2 ] || fail "exit status $rc without mpirun in PATH (want 2)"
has "$T/err" "config file $T/cfg.yaml, line 7:" \
    "mpirun_config.mpirun_hostfile: .*mpirun or mpiexec not found in PATH" ||
    fail "the missing mpirun not blamed on the config file's line"
echo "ok: no mpirun in PATH names the config key"

# ---- 3. a rank dies ----
timeout 120 "$ACCEL" launch --mpirun_hostfile "$T/hosts" -n 2 "$PROG" --iters 100000000 \
    --count 64 --die-rank 1 --die-after 20 >"$T/out" 2>"$T/err"
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || fail "exit status $rc after a rank died"
has "$T/err" "accel launch: mpirun failed: the first failure:" \
    "rank 1 (host .*, pid [0-9]*) failed: killed by SIGKILL (signal 9)" ||
    fail "the launcher did not name rank 1"
echo "ok: a rank killed under mpirun is named (exit status $rc)"
