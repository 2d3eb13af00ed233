#!/usr/bin/env bash
# The documented examples, run as a user would: alone and under `accel launch` with 2
# processes. linear_regression and gradient_accumulation_lm exit non-zero when training with
# accumulation does not match the full-batch clone; the script also checks the printed lines.
# mlp must reach a sane accuracy over exactly the 300 evaluation samples; gpt (tiny config,
# a few steps) must lower its loss and, with --log_with jsonl, write metric records, and a run
# interrupted at a checkpoint and resumed must end bit-identical to an uninterrupted one, its
# trackers holding every logged step once.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
EX=$BUILD/examples
ACCEL=$BUILD/accel
DIR=$(mktemp -d /tmp/accel_examples_XXXXXX)
trap 'rm -rf "$DIR"' EXIT

fail() {
    echo "FAIL: $*"
    exit 1
}

# One thread per process, as `accel launch` gives each of 2 processes on 2 cores: the test
# machine is shared and oversubscribed OpenMP threads only slow the runs down.
export OMP_NUM_THREADS=1

# A fixed corpus for the resume check (the default corpus is the live source tree).
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cat "$SRC"/docs/*.md >"$DIR/corpus.txt"

# run NPROCS PROGRAM ARGS...: output (stdout + stderr) in $DIR/out; fails the test on a
# non-zero exit status.
run() {
    local n=$1 rc=0
    shift
    if [ "$n" = 1 ]; then
        "$@" >"$DIR/out" 2>&1 || rc=$?
    else
        "$ACCEL" launch --main_process_port 0 --num_processes "$n" "$@" >"$DIR/out" 2>&1 || rc=$?
    fi
    if [ "$rc" != 0 ]; then
        cat "$DIR/out"
        fail "$* on $n process(es) exited with status $rc"
    fi
}

for n in 1 2; do
    echo "== linear_regression, $n process(es)"
    run "$n" "$EX/linear_regression"
    cat "$DIR/out"
    w1=$(sed -n 's/.*w\/ accumulation, the final model weight is \([0-9.]*\).*/\1/p' "$DIR/out")
    w2=$(sed -n 's/.*w\/o accumulation, the final model weight is \([0-9.]*\).*/\1/p' "$DIR/out")
    [ -n "$w1" ] && [ "$w1" = "$w2" ] || fail "linear_regression: weights '$w1' vs '$w2'"
    [ "$w1" = "2.04000" ] || fail "linear_regression: expected 2.04000 after one step, got $w1"

    echo "== gradient_accumulation_lm, $n process(es)"
    run "$n" "$EX/gradient_accumulation_lm"
    cat "$DIR/out"
    grep -q "they agree" "$DIR/out" || fail "gradient_accumulation_lm: no agreement line"
    [ "$(grep -c "local items in batch" "$DIR/out")" = "$n" ] ||
        fail "gradient_accumulation_lm: expected $n local item counts"
    total=$(sed -n 's/.*total items in batch (all processes): \([0-9]*\).*/\1/p' "$DIR/out")
    # 1 process: 8 samples of 1..8 labels = 36; 2 processes: 16 samples = 136.
    [ "$total" = "$([ "$n" = 1 ] && echo 36 || echo 136)" ] ||
        fail "gradient_accumulation_lm: total items $total"

    echo "== mlp, $n process(es)"
    run "$n" "$EX/mlp" --epochs 8
    tail -n 3 "$DIR/out"
    grep -q "(300 samples)" "$DIR/out" || fail "mlp: evaluation did not cover exactly 300 samples"
    acc=$(sed -n 's/.*final accuracy \([0-9.]*\).*/\1/p' "$DIR/out")
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "mlp: accuracy $acc < 0.9"

    echo "== gpt (tiny, 20 steps, jsonl tracker), $n process(es)"
    rm -rf "$DIR/runs"
    run "$n" "$EX/gpt" --layers 2 --width 64 --heads 4 --context 32 --batch 4 --steps 20 \
        --lr 3e-3 --log_every 5 --sample 0 --log_with jsonl --project_dir "$DIR/runs" \
        --data "$SRC/docs"
    grep "step " "$DIR/out" | grep -v "%|" || true
    first=$(grep -o "| loss [0-9.]*" "$DIR/out" | head -n 1 | awk '{print $3}')
    last=$(grep -o "| loss [0-9.]*" "$DIR/out" | tail -n 1 | awk '{print $3}')
    [ "$(grep -c "step    20/20 |" "$DIR/out")" = 1 ] || fail "gpt: no line for the last step"
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 0 && l < f - 0.3) }' ||
        fail "gpt: loss did not decrease ($first -> $last)"
    grep -q "tok/s" "$DIR/out" && grep -q "grad norm" "$DIR/out" || fail "gpt: log line fields"
    jl="$DIR/runs/gpt/metrics.jsonl"
    [ -s "$jl" ] || fail "gpt: $jl missing or empty"
    # Steps 1, 5, 10, 15, 20, each with the four metrics.
    [ "$(grep -c '"loss"' "$jl")" = 5 ] || fail "gpt: expected 5 records in $jl"
    for key in lr grad_norm tokens_per_s; do
        grep -q "\"$key\"" "$jl" || fail "gpt: no $key in $jl"
    done
    grep -q '"step": *20' "$jl" || fail "gpt: no record for step 20 in $jl"

    # Exact resume: 20 steps straight vs 10 steps with checkpoints, then a fresh process with
    # --resume to 20. Dropout and accumulation on, so the dropout counter, the loader position
    # and the accumulation state all have to come back. The log lines of steps 15 and 20 (less
    # the tok/s field) and the weights fingerprint (FNV-1a of every fp32 master weight) must be
    # identical. The corpus is a snapshot, so edits to the sources between runs do not matter.
    for mp in no bf16; do
        echo "== gpt exact resume, $mp, $n process(es)"
        rm -rf "$DIR/straight" "$DIR/resumed"
        g="--layers 2 --width 64 --heads 4 --context 32 --batch 4 --steps 20 --lr 3e-3 \
           --log_every 5 --sample 0 --dropout 0.1 --accum 2 --mixed_precision $mp \
           --data $DIR/corpus.txt"
        # shellcheck disable=SC2086
        run "$n" "$EX/gpt" $g --project_dir "$DIR/straight"
        grep -v "%|" "$DIR/out" | sed 's/ | [0-9]* tok\/s//' |
            grep -E "step +(15|20)/20 \||fingerprint" \
            >"$DIR/straight.txt"
        # shellcheck disable=SC2086
        run "$n" "$EX/gpt" $g --project_dir "$DIR/resumed" --checkpoint_every 5 --total_limit 2 \
            --stop_at 10
        grep -q "final step 10 |" "$DIR/out" || fail "gpt resume: the first run did not stop at 10"
        # shellcheck disable=SC2086
        run "$n" "$EX/gpt" $g --project_dir "$DIR/resumed" --checkpoint_every 5 --total_limit 2 \
            --resume
        grep -q "resumed from .*checkpoint_1 at step 10" "$DIR/out" ||
            fail "gpt resume: did not resume from checkpoint_1 at step 10"
        grep -v "%|" "$DIR/out" | sed 's/ | [0-9]* tok\/s//' |
            grep -E "step +(15|20)/20 \||fingerprint" \
            >"$DIR/resumed.txt"
        cat "$DIR/resumed.txt"
        [ "$(wc -l <"$DIR/straight.txt")" = 3 ] || fail "gpt resume: expected 3 lines to compare"
        diff "$DIR/straight.txt" "$DIR/resumed.txt" ||
            fail "gpt resume: the resumed run differs from the uninterrupted one"
        # total_limit 2: checkpoints 0..3 were written, the newest two remain.
        [ "$(ls "$DIR/resumed/checkpoints")" = "$(printf 'checkpoint_2\ncheckpoint_3')" ] ||
            fail "gpt resume: checkpoints left: $(ls "$DIR/resumed/checkpoints")"
    done

    # Trackers across a resume: interrupted at step 12, two steps after the last checkpoint,
    # then resumed from step 10. Every logged step is in the jsonl and csv files once.
    echo "== gpt resume with trackers, $n process(es)"
    rm -rf "$DIR/tracked"
    g="--layers 1 --width 32 --heads 2 --context 16 --batch 4 --steps 20 --log_every 3 --sample 0 \
       --data $DIR/corpus.txt --project_dir $DIR/tracked --log_with jsonl,csv --checkpoint_every 5"
    # shellcheck disable=SC2086
    run "$n" "$EX/gpt" $g --stop_at 12
    # shellcheck disable=SC2086
    run "$n" "$EX/gpt" $g --resume
    want="1 3 6 9 12 15 18 20"
    got=$(sed -n 's/^{"step": \([0-9]*\),.*/\1/p' "$DIR/tracked/gpt/metrics.jsonl" | xargs)
    [ "$got" = "$want" ] || fail "gpt resume: jsonl steps '$got', expected '$want'"
    got=$(tail -n +2 "$DIR/tracked/gpt/metrics.csv" | cut -d, -f1 | xargs)
    [ "$got" = "$want" ] || fail "gpt resume: csv steps '$got', expected '$want'"
done
echo "PASS"
