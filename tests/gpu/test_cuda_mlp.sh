#!/usr/bin/env bash
# examples/cuda_mlp trained on the GPU follows its CPU twin (--cpu: the same program, the same
# arithmetic in host loops), with 1 process and with 2 processes sharing the GPU (gradients
# staged through host memory): every logged loss within a relative 1e-3 of the twin's (the
# runs differ only in summation orders: the all-reduce, the clipping norm), and training
# works (final loss below half the first). The twin itself is checked first, on any machine
# with the CUDA build: it learns, and 2 processes follow 1 within 1e-3. Exits 77 (skipped)
# without the CUDA build or without a GPU.
# In the CUDA emulator build it also runs with a GPU per process (ctest ".../nccl"): the
# 2-process runs then take the nccl backend.
# ACCEL_TEST_LABELS: nccl
set -euo pipefail
source "$(dirname "$0")/cuda_mlp_lib.sh"
ARGS=(--steps 200 --log_every 20)

learns() {
    awk 'NR == 1 { first = $2 } { last = $2 } END { exit !(last < first / 2) }' "$DIR/$1" ||
        fail "$1 does not learn: $(head -1 "$DIR/$1") ... $(tail -1 "$DIR/$1")"
}

echo "== the CPU twin, 1 and 2 processes"
run cpu1 1 --cpu || { cat "$DIR/cpu1.out"; fail "cuda_mlp --cpu exited with $?"; }
run cpu2 2 --cpu || { cat "$DIR/cpu2.out"; fail "cuda_mlp --cpu on 2 processes failed"; }
learns cpu1
compare cpu1 cpu2 1e-3 || fail "the CPU twin differs between 1 and 2 processes"

echo "== the GPU"
rc=0
run gpu1 1 || rc=$?
if [ "$rc" = 77 ]; then
    echo "SKIP: $(tail -1 "$DIR/gpu1.out")"
    exit 77
fi
[ "$rc" = 0 ] || { cat "$DIR/gpu1.out"; fail "cuda_mlp exited with $rc"; }
head -1 "$DIR/gpu1.out"
learns gpu1
compare gpu1 cpu1 1e-3 || fail "the GPU run does not follow its CPU twin"
run gpu2 2 || { cat "$DIR/gpu2.out"; fail "cuda_mlp on 2 processes failed"; }
compare gpu2 cpu2 1e-3 || fail "2 processes on the GPU do not follow the CPU twin"
run gpu1fp32 1 --precision no || { cat "$DIR/gpu1fp32.out"; fail "--precision no failed"; }
run cpu1fp32 1 --cpu --precision no || fail "--cpu --precision no failed"
compare gpu1fp32 cpu1fp32 1e-3 || fail "fp32: the GPU run does not follow its CPU twin"
echo "ok"
