#!/usr/bin/env bash
# Two "machines" (gloo 2 x 1, also hier 2 x 2) that resolve different mixed precision, the
# classic Accelerate pitfall (docs/configuration.md, "Settings every process must share"):
# accel_init fails on every process, promptly, with the message naming the setting, two
# processes, their values and their sources:
#  - launchers: each machine's `accel launch` reads its own default_config.yaml (HF_HOME per
#    machine), one saying bf16, the other fp16;
#  - by hand: ACCELERATE_MIXED_PRECISION=fp16 exported on machine 1 only (machine 0: default),
#    on gloo 2 x 1 and on hier 2 x 2;
#  - gloo's reduction order differing between the machines (ACCEL_GLOO_RING=0 on machine 1),
#    or not a value, fails as the gloo backend connects (its own check: docs/comm.md);
#  - the same job with the variable on both machines initialises (tests/progs/show_options).
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../comm/machines.sh"
machines_setup # $tmp; skips without gloo
unset ACCELERATE_CONFIG_FILE ACCELERATE_MIXED_PRECISION ACCELERATE_DEBUG_MODE \
    ACCELERATE_GRADIENT_ACCUMULATION_STEPS ACCEL_ZERO_STAGE ACCEL_CONFIG_CHECKED XDG_CACHE_HOME \
    ACCEL_LAUNCH_SOURCES ACCEL_TIMEOUT
export HF_HOME=$tmp/none # no config file of this machine's user takes part
SHOW=$B/tests/progs/show_options
SUFFIX="(every process of a job must resolve the same settings)"

fail() { machines_fail "$tmp/$1" "$1: $2"; } # case message
# Runs its arguments with $ON_MACHINE1 (VAR=VALUE) exported on machine 1 only.
wrap=$tmp/machine1.sh
printf '%s\n' '#!/bin/bash' \
    '[ "$GROUP_RANK" = 1 ] && [ -n "$ON_MACHINE1" ] && export "$ON_MACHINE1"' 'exec "$@"' >"$wrap"
chmod +x "$wrap"

# Every process must fail within 30 s (not hang to the deadline, 60 s)...
expect_failure() { # case
    machines_wait 30 && fail "$1" "the job succeeded"
    grep -q "Killed\|SIGKILL" "$tmp/$1"/*.err && fail "$1" "a process hung"
}
# ... and each of the files must say `want`.
expect_both() { # case file_pattern want
    for f in "$tmp/$1"/$2; do
        grep -qF -- "$3" "$f" || fail "$1" "$f lacks: $3"
    done
}

# ---- launchers, each machine's own default_config.yaml ----
name=launchers
mkdir -p "$tmp/$name"
port=$("$B/tests/progs/free_port")
MACHINE_PIDS=()
MACHINE_DIR=
for m in 0 1; do
    mp=$([ "$m" = 0 ] && echo bf16 || echo fp16)
    mkdir -p "$tmp/hf$m/accelerate"
    printf '%s\n' "compute_environment: LOCAL_MACHINE" "distributed_type: MULTI_CPU" \
        "mixed_precision: $mp" >"$tmp/hf$m/accelerate/default_config.yaml"
    HF_HOME=$tmp/hf$m ACCEL_TIMEOUT=60 "$B/accel" launch --num_machines 2 --machine_rank "$m" \
        --main_process_ip 127.0.0.1 --main_process_port "$port" --num_processes 2 "$SHOW" \
        >"$tmp/$name/m$m.out" 2>"$tmp/$name/m$m.err" &
    MACHINE_PIDS+=($!)
done
expect_failure "$name"
c0=$tmp/hf0/accelerate/default_config.yaml
c1=$tmp/hf1/accelerate/default_config.yaml
DISAGREE="accel_init: processes disagree on mixed_precision:"
expect_both "$name" 'm*.err' "$DISAGREE process 0 has bf16 (accel launch: config file $c0"
expect_both "$name" 'm*.err' "process 1 has fp16 (accel launch: config file $c1"
expect_both "$name" 'm*.err' "(env ACCELERATE_MIXED_PRECISION)) $SUFFIX"
echo "ok: $name"

# by_hand NAME L ON_MACHINE1 WANT: a job of 2 machines x L processes started by hand, with
# ON_MACHINE1 (VAR=VALUE) exported on machine 1 only; every process fails saying WANT.
by_hand() {
    local name=$1
    mkdir -p "$tmp/$name"
    machines_start "$tmp/$name" 2 "$2" ACCEL_TIMEOUT=60 ON_MACHINE1="$3" -- "$wrap" "$SHOW"
    expect_failure "$name"
    expect_both "$name" 'r*.err' "$4"
    echo "ok: $name"
}

# ---- by hand: the variable exported on machine 1 only ----
by_hand env 1 ACCELERATE_MIXED_PRECISION=fp16 "show_options: $DISAGREE process 0 has no \
(default), process 1 has fp16 (env ACCELERATE_MIXED_PRECISION) $SUFFIX"

# ---- hier (2 x 2): machine 1's two processes both differ ----
by_hand hier 2 ACCELERATE_MIXED_PRECISION=fp16 "show_options: $DISAGREE process 0 has no \
(default), process 2 (the first of 2 that differ from process 0) has fp16 (env \
ACCELERATE_MIXED_PRECISION) $SUFFIX"

# ---- gloo's reduction order (ACCEL_GLOO_RING), agreed when the gloo backend connects ----
by_hand ring 1 ACCEL_GLOO_RING=0 "gloo: processes disagree on ACCEL_GLOO_RING: process 0 has \
auto, process 1 has 0 (set it alike on every machine, or nowhere)"
by_hand ring-value 1 ACCEL_GLOO_RING=sometimes \
    "environment variable ACCEL_GLOO_RING=sometimes must be auto, 1 or 0"

# ---- the same variable on both machines: the job runs ----
name=agree
mkdir -p "$tmp/$name"
machines_start "$tmp/$name" 2 1 ACCEL_TIMEOUT=60 ACCELERATE_MIXED_PRECISION=fp16 -- "$SHOW"
machines_wait 30 || fail "$name" "the job failed"
for r in 0 1; do
    grep -q "options: mixed_precision=fp16" "$tmp/$name/r$r.out" || fail "$name" "process $r"
done
echo "ok: $name"
