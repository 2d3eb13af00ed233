#!/usr/bin/env bash
# Sharded checkpoints of real ZeRO training (tests/progs/zero_train: a small GPT, AdamW,
# accumulation 2, clipping, a global batch split evenly over the processes, buckets / units
# small enough that pieces cut parameters). An uninterrupted 6-step run on 4 processes at stage
# 0 is the reference. For a stage-3 and a stage-2 run on 4 processes that save at step 3 (one
# shard file per process):
#  - the run is bit-identical to the reference (ZeRO changes no arithmetic), its save_model
#    files at steps 3 and 6 are byte-identical to stage 0's (stage 3: gathered from the shards a
#    round at a time), and merge-weights of its checkpoint gives save_model's file;
#  - resumed on 4 processes at stages 3, 2, 1 and 0: bit-identical to the reference (the
#    process count is unchanged);
#  - resumed on 2 processes at stage 1, 1 process at stage 0 and 3 processes at stage 3: within
#    1e-4 of the reference (relative, max over weights: the same global batch, but the gradient
#    all-reduce groups the processes' partial sums differently and Adam amplifies it; measured
#    2e-6 to 1.1e-5).
# A stage-0 checkpoint resumes on 4 processes at stage 3 bit-identically, a stage-1 checkpoint
# saved by 3 processes resumes on 4 at stage 3 within the same bound, and one saved inside an
# accumulation window resumes exactly (below). A step is 2 micro-steps: "save 6" is after step 3.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
Z=$B/tests/progs/zero_train
[ -x "$ACCEL" ] && [ -x "$Z" ] || { echo "missing $ACCEL or $Z"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
run() { # NP ARGS...
    local np=$1
    shift
    "$ACCEL" launch --num_processes "$np" "$Z" "$@" >"$T/out" 2>&1 ||
        { cat "$T/out"; fail "zero_train $*"; }
}
same() { "$Z" compare "$1" "$2" "$3" || fail "$1 vs $2 (tolerance $3)"; }

run 4 0 6 "$T/ref" model "$T/m0_6" save 6 "$T/c0" "$T/m0_3"
for s in 3 2; do
    run 4 $s 6 "$T/s$s" model "$T/m${s}_6" save 6 "$T/c$s" "$T/m${s}_3"
    [ -f "$T/c$s/model.shard-3-of-4.safetensors" ] && [ -f "$T/c$s/optimizer.index.json" ] &&
        [ ! -e "$T/c$s/model.safetensors" ] || fail "stage $s checkpoint: $(ls "$T/c$s")"
    same "$T/s$s" "$T/ref" 0
    cmp "$T/m0_3/model.safetensors" "$T/m${s}_3/model.safetensors" ||
        fail "stage $s save_model at 3"
    cmp "$T/m0_6/model.safetensors" "$T/m${s}_6/model.safetensors" ||
        fail "stage $s save_model at 6"
    "$ACCEL" merge-weights "$T/c$s" "$T/merged$s" >/dev/null || fail "merge-weights stage $s"
    cmp "$T/merged$s/model.safetensors" "$T/m0_3/model.safetensors" || fail "merge-weights $s"
    for stage in 3 2 1 0; do
        run 4 $stage 6 "$T/r4_$stage" load 6 "$T/c$s"
        same "$T/r4_$stage" "$T/ref" 0
    done
    run 2 1 6 "$T/r2" load 6 "$T/c$s"
    same "$T/r2" "$T/ref" 1e-4
    run 1 0 6 "$T/r1" load 6 "$T/c$s"
    same "$T/r1" "$T/ref" 1e-4
    run 3 3 6 "$T/r3" load 6 "$T/c$s"
    same "$T/r3" "$T/ref" 1e-4
done
run 4 3 6 "$T/r4_from0" load 6 "$T/c0" # a stage-0 checkpoint (whole files) at stage 3
same "$T/r4_from0" "$T/ref" 0
run 3 1 6 "$T/s1_3" save 6 "$T/c1_3" "$T/m1_3"
run 4 3 6 "$T/r4_from3" load 6 "$T/c1_3"
same "$T/r4_from3" "$T/ref" 1e-4
# Saved inside an accumulation window (after the first micro-step of step 4) at stage 3: the
# gradients accumulated so far are part of the checkpoint; resumed on 4 processes at stages 3
# and 0 the run ends bit-identical to the reference.
run 4 3 6 "$T/w3" save 7 "$T/cw" "$T/mw"
[ -f "$T/cw/gradients_rank3.safetensors" ] || fail "no gradients in the window's checkpoint"
for stage in 3 0; do
    run 4 $stage 6 "$T/rw_$stage" load 7 "$T/cw"
    same "$T/rw_$stage" "$T/ref" 0
done
# save_model at stages 3 and 2 with a round per tensor, on a larger GPT: the same bytes as
# stage 0, and the main process's allocations grow by less than a third of the model meanwhile.
for s in 3 2 0; do
    run 4 $s 2 "$T/p$s" peak "$T/mp$s"
    grep -h "allocations grew" "$T/out"
done
cmp "$T/mp3/model.safetensors" "$T/mp0/model.safetensors" || fail "save_model stage 3 (rounds)"
cmp "$T/mp2/model.safetensors" "$T/mp0/model.safetensors" || fail "save_model stage 2 (rounds)"
echo "test_zero_ckpt: ok"
