#!/usr/bin/env bash
# Runs every benchmark the way docs/performance.md reports it, one after the other (never in
# parallel: they measure the machine). Usage: scripts/bench-all.sh [BUILD_DIR] [OUT_DIR]
# Each benchmark's output goes to OUT_DIR/<name>.txt and to the terminal.
set -u
build=${1:-build}
out=${2:-bench-results}
mkdir -p "$out"
launch="$build/accel launch"
run() { # name command...
    local name=$1; shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$out/$name.txt"
}
export OMP_NUM_THREADS=1
run launch_overhead   "$build/bench/launch_overhead"
run convert           "$build/bench/convert"
run collectives_np2   $launch --num_processes 2 "$build/bench/collectives"
run ddp_step_np1      $launch --num_processes 1 "$build/bench/ddp_step"
run ddp_step_np2      $launch --num_processes 2 "$build/bench/ddp_step"
run gpt_step_np1      "$build/bench/gpt_step"
run gpt_step_np2      $launch --num_processes 2 "$build/bench/gpt_step"
run loader            "$build/bench/loader"
run mp_np1            "$build/bench/mp"
run mp_np2            $launch --num_processes 2 "$build/bench/mp" --skip-gpt
run ckpt              "$build/bench/ckpt" --dir "$out"
run zero_step_np2     $launch --num_processes 2 "$build/bench/zero_step"
run zero_step_np4     $launch --num_processes 4 "$build/bench/zero_step"
