#!/usr/bin/env bash
# Hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed's hpZ; docs/training.md, "Hybrid sharding"):
# the ZeRO state sharded inside groups of processes, replicated across the groups. Real
# training with tests/progs/zero_train (a small GPT, AdamW, accumulation 2, clipping); the
# reference is an uninterrupted 6-step stage-0 (DDP) run on the same processes.
# One machine, groups forced with ACCEL_ZERO_SHARD_SIZE=2 (shm, 4 processes: groups {0,1}
#     and {2,3}), stages 2 and 3, saving at step 3:
#     - the log says so; the weights of stages 2 and 3 are bit-identical, and match DDP's
#       within 1e-4 (relative, max over weights: a group's reduce-scatter sums 2 processes,
#       the all-reduce across the replicas the two halves, where DDP on shm sums the 4 in rank
#       order, and Adam amplifies it; measured 6.9e-6);
#     - the checkpoint is written by the first replica: shard files 0 and 1 hold the pieces,
#       2 and 3 no tensor; resumed in the same layout the run is bit-identical to the
#       uninterrupted one, resumed on 2 processes at stage 1 (no groups) within 1e-4 of DDP
#       (as tests/ckpt/test_zero_ckpt.sh across process counts);
#     - save_model at steps 3 and 6 writes the same bytes as the weights it ends with
#       (merge-weights of the hybrid checkpoint gives save_model's file).
#     A DDP checkpoint resumes under hybrid stage 3 within 1e-4.
# Two machines: tests/ckpt/test_zero_hybrid_machines.sh.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
Z=$B/tests/progs/zero_train
[ -x "$ACCEL" ] && [ -x "$Z" ] || { echo "missing $ACCEL or $Z"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
fail() {
    echo "FAIL: $*"
    for f in "$T"/out "$T"/*/*.err; do [ -s "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done
    exit 1
}
run() { # NP ARGS... (environment from the caller)
    local np=$1
    shift
    "$ACCEL" launch --num_processes "$np" "$Z" "$@" >"$T/out" 2>&1 || fail "zero_train $*"
}
same() { "$Z" compare "$1" "$2" "$3" || fail "$1 vs $2 (tolerance $3)"; }
# Tensors in a safetensors file: its JSON header's entries with a data_offsets field.
n_tensors() { head -c 65536 "$1" | tr -d '\0' | grep -o '"data_offsets"' | wc -l; }

# ---- 1. one machine, groups of 2 ----
run 4 0 6 "$T/ref" save 6 "$T/c0" "$T/m0_3"
for s in 2 3; do
    ACCEL_ZERO_SHARD_SIZE=2 ACCEL_LOG_LEVEL=info \
        run 4 $s 6 "$T/h$s" model "$T/mh${s}_6" save 6 "$T/ch$s" "$T/mh${s}_3"
    grep -q "ZeRO stage $s sharded over 2 processes (group 1), replicated 2 times" "$T/out" ||
        fail "stage $s: no hybrid sharding in the log"
    same "$T/h$s" "$T/ref" 1e-4
    for r in 0 1; do
        [ "$(n_tensors "$T/ch$s/model.shard-$r-of-4.safetensors")" -gt 0 ] ||
            fail "stage $s: shard $r of the first replica is empty"
    done
    for r in 2 3; do
        for f in model optimizer; do
            [ "$(n_tensors "$T/ch$s/$f.shard-$r-of-4.safetensors")" -eq 0 ] ||
                fail "stage $s: $f shard $r (second replica) holds tensors"
        done
    done
    ACCEL_ZERO_SHARD_SIZE=2 run 4 $s 6 "$T/hr$s" load 6 "$T/ch$s"
    same "$T/hr$s" "$T/h$s" 0
    run 2 1 6 "$T/r2_$s" load 6 "$T/ch$s"
    same "$T/r2_$s" "$T/ref" 1e-4
    "$ACCEL" merge-weights "$T/ch$s" "$T/merged$s" >/dev/null || fail "merge-weights stage $s"
    cmp "$T/merged$s/model.safetensors" "$T/mh${s}_3/model.safetensors" ||
        fail "stage $s: merge-weights differs from save_model"
done
same "$T/h3" "$T/h2" 0
ACCEL_ZERO_SHARD_SIZE=2 run 4 3 6 "$T/h_from0" load 6 "$T/c0"
same "$T/h_from0" "$T/ref" 1e-4
# A group size that does not divide the processes is refused, naming it.
ACCEL_ZERO_SHARD_SIZE=3 "$ACCEL" launch --num_processes 4 "$Z" 2 1 "$T/x" >"$T/out" 2>&1 &&
    fail "ACCEL_ZERO_SHARD_SIZE=3 on 4 processes ran"
grep -q "zero_shard_size=3 does not divide the 4 processes" "$T/out" || fail "no clear refusal"

echo "test_zero_hybrid: ok"
