#!/usr/bin/env bash
# Sharded save_state (docs/checkpoint.md, "Sharded checkpoints") through tests/progs/shard_probe,
# an object sharded over the processes as ZeRO shards a model (odd parameter sizes, buckets of
# one to a few parameters):
#  1. saved sharded by 3 processes, it loads on 1, 2, 3 and 4 processes, whole (stage 0) and
#     sharded, every element where it belongs; saved whole by 2, it loads sharded on 3;
#  2. a shard file missing from the folder fails the load naming it (the pieces' tiling is
#     checked by tests/unit/test_ckpt_reshard.c and the shard-file checks by test_ckpt_shard.c);
#  3. SIGKILL during sharded saves (2 processes, automatic naming, total_limit 2), 20 trials at
#     random moments: the newest complete checkpoint always loads (on 1 or 3 processes, in
#     turn), its weights are those of the generation it records, and it is never older than
#     the last save reported before the kill.
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
    out=$(run "$1" "$PROG" load "$3" "$2") || { cat "$T/err"; fail "load of $3 on $1 processes, stage $2"; }
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

# 2. Damage is named.
cp -r "$T/s3" "$T/gone"
rm "$T/gone/model.shard-1-of-3.safetensors"
run 2 "$PROG" load "$T/gone" 1 && fail "a missing shard loaded"
grep -q "model.shard-1-of-3.safetensors" "$T/err" || fail "missing shard: $(cat "$T/err")"

# 3. SIGKILL during sharded saves.
P=$T/project
last=0
seed=${ACCEL_TEST_SEED:-$RANDOM}
echo "test_sharded_state: seed $seed (ACCEL_TEST_SEED=$seed reruns it)"
RANDOM=$seed
for trial in $(seq 1 20); do
    "$ACCEL" launch --num_processes 2 "$PROG" loop "$P" 1 >"$T/loop" 2>"$T/loop_err" &
    lpid=$!
    # At least one new save, then a random moment (0 to 40 ms) in the saving loop.
    for _ in $(seq 1 1000); do
        [ "$(grep -c 'saved [0-9]' "$T/loop")" -ge 1 ] && break
        kill -0 "$lpid" 2>/dev/null || { cat "$T/loop_err"; fail "trial $trial: the saver died"; }
        sleep 0.01
    done
    sleep "0.0$((RANDOM % 5))$((RANDOM % 10))"
    kill -9 "$lpid"
    wait "$lpid" 2>/dev/null
    lpid=
    reported=$(sed -n 's/.*saved \([0-9]*\)$/\1/p' "$T/loop" | tail -1)
    [ -n "$reported" ] || fail "trial $trial: no save reported"
    np=$((trial % 2 == 0 ? 3 : 1))
    out=$("$ACCEL" launch --num_processes $np "$PROG" newest "$P" 1 2>"$T/err") ||
        { cat "$T/err"; fail "trial $trial: the newest checkpoint does not load (seed $seed)"; }
    gen=$(echo "$out" | sed -n 's/.*generation \([0-9]*\)$/\1/p' | head -1)
    [ -n "$gen" ] && [ "$gen" -ge "$reported" ] && [ "$gen" -ge "$last" ] ||
        fail "trial $trial: loaded generation '$gen', reported $reported, before $last (seed $seed)"
    last=$gen
done
echo "test_sharded_state: ok (20 kills, last generation $last)"
