#!/usr/bin/env bash
# make demo's run (the Makefile's demo-run target), scaled down to a tiny model and 16 steps:
# part 1 trains on 2 processes in bf16 with gradient accumulation 2, logs to TensorBoard,
# checkpoints, stops halfway and says where its log and checkpoint are; part 2 resumes from
# the newest checkpoint and finishes, printing the final progress line once.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
SRC=${ACCEL_SOURCE_DIR:?ACCEL_SOURCE_DIR is not set}
DIR=$(mktemp -d /tmp/accel_demo_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
demo=$DIR/demo
args="--layers 2 --width 64 --heads 4 --context 32 --batch 4 --sample 20 --data $SRC/docs"
make -s --no-print-directory -C "$SRC" demo-run BUILD="$BUILD" DEMO_DIR="$demo" DEMO_STEPS=16 \
    DEMO_ARGS="$args" \
    >"$DIR/out" 2>&1 || { cat "$DIR/out"; fail "make demo-run exited with an error"; }
cat "$DIR/out"
sed -n '/^== demo 1\/2/,/^== demo 2\/2/p' "$DIR/out" >"$DIR/part1"
sed -n '/^== demo 2\/2/,$p' "$DIR/out" >"$DIR/part2"
has() { grep -q -- "$2" "$DIR/$1" || fail "$1 lacks '$2'"; }
has part1 "accumulation 2 = .* precision bf16"
has part1 "final step 8 |"
has part1 "trackers (tensorboard) wrote under $demo; view with: tensorboard --logdir $demo"
has part1 "newest checkpoint: $demo/checkpoints/checkpoint_1 "
has part2 "resumed from $demo/checkpoints/checkpoint_1 at step 8"
has part2 "final step 16 |"
has part2 "newest checkpoint: $demo/checkpoints/checkpoint_3 "
[ "$(grep -c 'train: 100% 16/16' "$DIR/part2")" = 1 ] ||
    fail "the final progress line is not printed once"
ls "$demo"/gpt/events.out.tfevents.* >/dev/null 2>&1 ||
    fail "no TensorBoard event file in $demo/gpt"
[ "$(ls "$demo/checkpoints")" = "$(printf 'checkpoint_2\ncheckpoint_3')" ] ||
    fail "checkpoints left: $(ls "$demo/checkpoints")"
echo "PASS: demo: bf16 + accumulation + TensorBoard + checkpoints, then resumed to the end"
