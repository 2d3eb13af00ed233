#!/usr/bin/env bash
# Sharded save_state (docs/checkpoint.md, "Sharded checkpoints") through tests/progs/shard_probe,
# an object sharded over the processes as ZeRO shards a model (odd parameter sizes, buckets of
# one to a few parameters):
#  1. saved sharded by 3 processes, it loads on 1, 2, 3 and 4 processes, whole (stage 0) and
#     sharded, every element where it belongs; saved whole by 2, it loads sharded on 3;
#     merge-weights of the shards equals merge-weights of a whole save of the same weights
#     (and tests/ckpt/test_zero_ckpt.sh compares it with accel_save_model);
#  2. a shard file missing from the folder fails the load naming it (the pieces' tiling is
#     checked by tests/unit/test_ckpt_reshard.c and the shard-file checks by test_ckpt_shard.c);
#  3. SIGKILL during sharded saves (2 processes, automatic naming, total_limit 2), 20 trials at
#     random moments: the newest complete checkpoint always loads (on 1 or 3 processes, in
#     turn), its weights are those of the generation it records, and it is never older than
#     the last save reported before the kill; at least one kill must have cut a save (its
#     staging folder left behind), or the test proved nothing.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
PROG=$B/tests/progs/shard_probe
[ -x "$ACCEL" ] && [ -x "$PROG" ] || { echo "missing $ACCEL or $PROG"; exit 1; }
T=$(mktemp -d)
lpid=
cleanup() {
    [ -n "$lpid" ] && kill -9 "$lpid" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
run() { "$ACCEL" launch --num_processes "$@" 2>"$T/err"; }
expect_gen() { # NP STAGE DIR GEN
    out=$(run "$1" "$PROG" load "$3" "$2") ||
        { cat "$T/err"; fail "load of $3 on $1 processes, stage $2"; }
    echo "$out" | grep -q "generation $4\$" || fail "load on $1 processes, stage $2: $out"
}

# 1. Any number of processes, either layout.
run 3 "$PROG" save "$T/s3" 1 7 || { cat "$T/err"; fail "sharded save on 3 processes"; }
[ -f "$T/s3/model.index.json" ] && [ -f "$T/s3/model.shard-2-of-3.safetensors" ] &&
    [ ! -e "$T/s3/model.safetensors" ] || fail "the sharded folder: $(ls "$T/s3")"
for np in 1 2 3 4; do
    for st in 0 1; do expect_gen $np $st "$T/s3" 7; done
done
run 2 "$PROG" save "$T/w2" 0 9 || { cat "$T/err"; fail "whole save on 2 processes"; }
[ -f "$T/w2/model.safetensors" ] && [ ! -e "$T/w2/model.index.json" ] || fail "the whole folder"
expect_gen 3 1 "$T/w2" 9

# merge-weights: the sharded and the whole save of the same weights give the same bytes; the
# flags' refusals; --remove_checkpoint_dir removes only after writing, never around the output.
run 2 "$PROG" save "$T/w7" 0 7 || { cat "$T/err"; fail "whole save of generation 7"; }
"$ACCEL" merge-weights "$T/s3" "$T/m_sharded" >/dev/null || fail "merge-weights of the shards"
"$ACCEL" merge-weights --max_shard_size 10GB "$T/w7" "$T/m_whole" >/dev/null ||
    fail "merge-weights whole"
cmp "$T/m_sharded/model.safetensors" "$T/m_whole/model.safetensors" || fail "merged bytes differ"
"$ACCEL" merge-weights "$T/s3" "$T/m_split" --max_shard_size 200 >/dev/null || fail "split merge"
[ -f "$T/m_split/model.safetensors.index.json" ] || fail "no index in $(ls "$T/m_split")"
"$ACCEL" merge-weights --unsafe_serialization "$T/s3" "$T/x" 2>"$T/err" &&
    fail "--unsafe_serialization"
grep -q "pytorch_model.bin, a torch pickle" "$T/err" || fail "unsafe: $(cat "$T/err")"
"$ACCEL" merge-weights "$T/s3" "$T/s3/inside" --remove_checkpoint_dir 2>"$T/err" &&
    fail "output inside"
[ -d "$T/s3" ] && [ ! -e "$T/s3/inside" ] || fail "a refused merge touched the checkpoint"
cp -r "$T/s3" "$T/s3copy"
"$ACCEL" merge-weights "$T/s3copy" "$T/m_removed" --remove_checkpoint_dir >/dev/null ||
    fail "remove"
[ ! -e "$T/s3copy" ] && cmp "$T/m_removed/model.safetensors" "$T/m_whole/model.safetensors" ||
    fail "--remove_checkpoint_dir"
"$ACCEL" merge-weights "$T/nothing" "$T/x" 2>"$T/err" && fail "a missing checkpoint merged"
grep -q "does not exist" "$T/err" || fail "missing: $(cat "$T/err")"

# 2. Damage is named.
cp -r "$T/s3" "$T/gone"
rm "$T/gone/model.shard-1-of-3.safetensors"
run 2 "$PROG" load "$T/gone" 1 && fail "a missing shard loaded"
grep -q "model.shard-1-of-3.safetensors" "$T/err" || fail "missing shard: $(cat "$T/err")"

# 3. SIGKILL during sharded saves.
P=$T/project
last=0
mid=0 # kills that left a save half-written (its staging folder)
seed=${ACCEL_TEST_SEED:-$RANDOM}
echo "test_sharded_state: seed $seed (ACCEL_TEST_SEED=$seed reruns it)"
RANDOM=$seed
for trial in $(seq 1 20); do
    : >"$T/loop" # emptied here: the background job's own redirection may come after the grep
    "$ACCEL" launch --num_processes 2 "$PROG" loop "$P" 1 >"$T/loop" 2>"$T/loop_err" &
    lpid=$!
    # At least one new save (a loaded machine may take seconds to start), then a random
    # moment (0 to 49 ms) in the saving loop.
    for _ in $(seq 1 6000); do
        [ "$(grep -c 'saved [0-9]' "$T/loop")" -ge 1 ] && break
        kill -0 "$lpid" 2>/dev/null || { cat "$T/loop_err"; fail "trial $trial: the saver died"; }
        sleep 0.01
    done
    sleep "0.0$((RANDOM % 5))$((RANDOM % 10))"
    kill -9 "$lpid"
    wait "$lpid" 2>/dev/null
    lpid=
    ls -d "$P"/checkpoints/.checkpoint_*.partial >/dev/null 2>&1 && mid=$((mid + 1))
    reported=$(sed -n 's/.*saved \([0-9]*\)$/\1/p' "$T/loop" | tail -1)
    [ -n "$reported" ] || { cat "$T/loop" "$T/loop_err"; fail "trial $trial: no save reported"; }
    np=$((trial % 2 == 0 ? 3 : 1))
    out=$("$ACCEL" launch --num_processes $np "$PROG" newest "$P" 1 2>"$T/err") ||
        { cat "$T/err"; fail "trial $trial: the newest checkpoint does not load (seed $seed)"; }
    gen=$(echo "$out" | sed -n 's/.*generation \([0-9]*\)$/\1/p' | head -1)
    [ -n "$gen" ] && [ "$gen" -ge "$reported" ] && [ "$gen" -ge "$last" ] ||
        fail "trial $trial: loaded generation '$gen', reported $reported, before $last (seed $seed)"
    last=$gen
done
# Saves are most of the loop's time, so most kills cut one (a check that the test bites).
[ "$mid" -ge 1 ] || fail "no kill cut a save in progress"
echo "test_sharded_state: ok (20 kills, $mid cut a save in progress; last generation $last)"
