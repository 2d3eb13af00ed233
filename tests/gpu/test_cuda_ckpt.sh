#!/usr/bin/env bash
# Checkpoints of examples/cuda_mlp from GPU memory (--save DIR after the last step, --resume DIR
# after prepare): accel_save_state / accel_load_state copy the weights and AdamW's state through
# pinned buffers and write the same files as a CPU run.
#  - Bit-exact resume: 120 steps straight vs 60, save, resume, 60 more: the same losses at every
#    logged step from 60 on, and the same model.safetensors and optimizer.safetensors at the end.
#    First for the CPU twin (--cpu, on any machine with the CUDA build), then on the GPU; each
#    with 1 process and with 2 (on the GPU: sharing it).
#  - A GPU checkpoint loaded on the CPU and saved again at once is the same files, and a CPU
#    checkpoint loaded on the GPU likewise; trained on from there, each run follows the straight
#    run of the other device within a relative 1e-3 (the two differ only in summation orders).
# Exits 77 (skipped) without the CUDA build or without a GPU (after the CPU part).
# In the CUDA emulator build it also runs with a GPU per process (ctest ".../nccl"): the
# 2-process runs then take the nccl backend.
# ACCEL_TEST_LABELS: nccl
set -euo pipefail
source "$(dirname "$0")/cuda_mlp_lib.sh"
ARGS=(--log_every 10)
FULL=120
HALF=60

# must NAME NPROCS ARGS...: run, and fail the test (with the output) when it fails.
must() {
    local rc=0
    run "$@" || rc=$?
    [ "$rc" = 0 ] || { cat "$DIR/$1.out"; fail "$1 exited with $rc"; }
}

# exact FULL REST: REST's logged losses are FULL's from step $HALF on, character for character.
exact() {
    awk -v h=$HALF '$1 >= h' "$DIR/$1" >"$DIR/$1.tail"
    [ -s "$DIR/$2" ] || fail "$2 logged no losses"
    cmp -s "$DIR/$1.tail" "$DIR/$2" || {
        diff "$DIR/$1.tail" "$DIR/$2" | head -5
        fail "$2 (resumed) does not repeat $1's losses"
    }
    echo "$2 repeats $1 exactly ($(wc -l <"$DIR/$2") logged steps)"
}

# same_files A B: the two checkpoints hold the same weights and optimizer state, byte for byte.
same_files() {
    for f in model.safetensors optimizer.safetensors; do
        cmp -s "$DIR/$1.ckpt/$f" "$DIR/$2.ckpt/$f" || fail "$2.ckpt/$f differs from $1.ckpt/$f"
    done
    echo "$2.ckpt holds the bytes of $1.ckpt"
}

# near A B TOL: B's losses are A's (from step $HALF on) within TOL relative; prints the worst.
near() {
    awk -v h=$HALF '$1 >= h' "$DIR/$1" >"$DIR/$1.tail"
    compare "$1.tail" "$2" "$3" || fail "$2 does not follow $1"
}

# resume_exact PREFIX NPROCS [ARGS...]: straight, half + save, resume to the end.
resume_exact() {
    local p=$1 n=$2
    shift 2
    must "${p}_full" "$n" "$@" --steps $FULL --save "$DIR/${p}_full.ckpt"
    must "${p}_half" "$n" "$@" --steps $HALF --save "$DIR/${p}_half.ckpt"
    must "${p}_rest" "$n" "$@" --steps $FULL --resume "$DIR/${p}_half.ckpt" \
        --save "$DIR/${p}_rest.ckpt"
    grep -q "resumed from $DIR/${p}_half.ckpt at step $HALF" "$DIR/${p}_rest.out" ||
        fail "${p}_rest did not resume at step $HALF"
    exact "${p}_full" "${p}_rest"
    same_files "${p}_full" "${p}_rest"
}

echo "== the CPU twin: bit-exact resume, 1 and 2 processes"
resume_exact cpu 1 --cpu
resume_exact cpu2 2 --cpu

echo "== the GPU"
rc=0
run probe 1 --steps 1 || rc=$?
if [ "$rc" = 77 ]; then
    echo "SKIP: $(tail -1 "$DIR/probe.out")"
    exit 77
fi
[ "$rc" = 0 ] || { cat "$DIR/probe.out"; fail "cuda_mlp exited with $rc"; }
head -1 "$DIR/probe.out"
resume_exact gpu 1

echo "== GPU checkpoint on the CPU and back"
must g2c 1 --cpu --steps $HALF --resume "$DIR/gpu_half.ckpt" --save "$DIR/g2c.ckpt"
same_files gpu_half g2c
must c2g 1 --steps $HALF --resume "$DIR/cpu_half.ckpt" --save "$DIR/c2g.ckpt"
same_files cpu_half c2g
must g2c_rest 1 --cpu --steps $FULL --resume "$DIR/gpu_half.ckpt"
near gpu_full g2c_rest 1e-3
must c2g_rest 1 --steps $FULL --resume "$DIR/cpu_half.ckpt"
near cpu_full c2g_rest 1e-3

echo "== 2 processes sharing the GPU: bit-exact resume"
resume_exact gpu2 2
echo "ok"
