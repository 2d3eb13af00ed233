#!/usr/bin/env bash
# The examples' command lines, as a careless or hostile user types them: a bad flag, a value
# that is no number or out of range, flags that contradict each other, a --data that is no
# corpus, an output folder that cannot be written, a --resume of another run. Each must stop
# with a message naming the culprit and a non-zero status (2 for a bad command line), before
# any training, and never hang; under `accel launch -n 2` the job must end the same way. And
# every example's --help lists exactly the flags its option table accepts.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
EX=$BUILD/examples
ACCEL=$BUILD/accel
DIR=$(mktemp -d /tmp/accel_examples_args_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
export OMP_NUM_THREADS=1
n_cases=0

fail() {
    echo "FAIL: $*"
    exit 1
}

# expect STATUS PATTERN PROGRAM ARGS...: PROGRAM ends within 30 s with exit status STATUS and
# its output (stdout + stderr) matches the grep pattern PATTERN.
expect() {
    local want=$1 pattern=$2 rc=0
    shift 2
    timeout -k 5 30 "$@" >"$DIR/out" 2>&1 </dev/null || rc=$?
    n_cases=$((n_cases + 1))
    if [ "$rc" != "$want" ] || ! grep -q -- "$pattern" "$DIR/out"; then
        tail -n 20 "$DIR/out"
        fail "$* exited with $rc (expected $want) or lacks '$pattern'"
    fi
}
launch2=("$ACCEL" launch --main_process_port 0 --num_processes 2)

# ---- --help lists what the option table accepts, no more, no less
for ex in hello linear_regression mlp gradient_accumulation_lm gpt; do
    expect 0 "^usage: $ex" "$EX/$ex" --help
    table=$(grep -oE '\{"--[a-z_]+", ARG_' "$SRC/examples/$ex.c" | grep -oE -- '--[a-z_]+' |
        sort -u | xargs || true)
    listed=$(grep -oE -- '--[a-z_]+' "$DIR/out" | grep -vx -- --help | sort -u | xargs || true)
    [ "$table" = "$listed" ] || fail "$ex --help lists '$listed', its table has '$table'"
done

# ---- the small examples
expect 2 "unknown option '--foo'" "$EX/hello" --foo
expect 2 "^usage: linear_regression" "$EX/linear_regression" --nope
expect 2 "epochs needs a value" "$EX/linear_regression" --epochs
expect 2 "epochs needs a whole number from 1 to 1000000, not '3x'" "$EX/linear_regression" \
    --epochs 3x
expect 2 "epochs needs a whole number" "$EX/linear_regression" --epochs 99999999999
expect 2 "accum needs a whole number" "$EX/linear_regression" --accum -1
expect 2 "batch 3 x --accum 4 must be 8" "$EX/linear_regression" --batch 3
expect 0 "the weights agree" "$EX/linear_regression" --batch 4 --accum 2 --batch 8 --accum 1
expect 2 "unknown option '--foo'" "$EX/mlp" --foo 1 --epochs 1
expect 2 "lr needs a number" "$EX/mlp" --lr inf
expect 2 "lr needs a number" "$EX/mlp" --lr nan
expect 2 "seed needs a whole number >= 0, not 'abc'" "$EX/mlp" --seed abc
expect 2 "batch needs a whole number from 1 to 1500" "$EX/mlp" --batch 2000000000
expect 2 "hidden needs a whole number" "$EX/mlp" --hidden 100000000
expect 2 "accum needs a whole number" "$EX/gradient_accumulation_lm" --accum 0
expect 2 "batch needs a whole number" "$EX/gradient_accumulation_lm" --batch x
expect 2 "more than 32 samples" "$EX/gradient_accumulation_lm" --batch 8 --accum 8
expect 0 "they agree" "$EX/gradient_accumulation_lm" --batch 4 --accum 8

# ---- gpt: the command line
printf '%0300d' 0 >"$DIR/c300.txt" # 18 windows of 16: 4 batches of 4
printf 'too short' >"$DIR/short.txt"
: >"$DIR/a_file"
mkfifo "$DIR/fifo"
mkdir "$DIR/tree" && cp "$DIR/c300.txt" "$DIR/tree/" && ln -s /dev/zero "$DIR/tree/zero"
gpt=("$EX/gpt" --layers 1 --width 16 --heads 2 --context 16 --batch 4 --sample 0 --steps 4
    --log_every 2 --data "$DIR/c300.txt")
expect 2 "steps needs a whole number >= 1, not '5x'" "${gpt[@]}" --steps 5x
expect 2 "steps needs a whole number" "${gpt[@]}" --steps 99999999999
expect 2 "warmup needs a whole number >= 0, not '-5'" "${gpt[@]}" --warmup -5
expect 2 "lr needs a number" "${gpt[@]}" --lr 0
expect 2 "log_with needs a value, not an empty string" "${gpt[@]}" --log_with ""
expect 2 "resume takes no value, and '1' is no option" "${gpt[@]}" --resume 1
expect 2 "stop_at must not exceed --steps" "${gpt[@]}" --stop_at 5
expect 2 "warmup must not exceed --steps" "${gpt[@]}" --warmup 5
expect 2 "width must be a multiple of --heads" "${gpt[@]}" --width 17
expect 2 "mixed_precision must be no, fp16, bf16 or fp8, not fp4" "${gpt[@]}" --mixed_precision fp4
expect 1 "accum 5 is more than the 4 batches" "${gpt[@]}" --accum 5

# ---- gpt: --data that is no corpus
expect 1 "cannot read $DIR/missing: No such file" "${gpt[@]}" --data "$DIR/missing"
expect 1 "needs at least 65 bytes" "${gpt[@]}" --data "$DIR/short.txt"
expect 1 "corpus (0 bytes" "${gpt[@]}" --data "$DIR/a_file"
expect 1 "/dev/zero is neither a regular file nor a folder" "${gpt[@]}" --data /dev/zero
expect 1 "fifo is neither a regular file nor a folder" "${gpt[@]}" --data "$DIR/fifo"
expect 1 "tree/zero is neither a regular file nor a folder" "${gpt[@]}" --data "$DIR/tree"

# ---- gpt: folders it cannot write are named before it trains
expect 1 "save_dir $DIR/a_file/out: cannot create" "${gpt[@]}" --save_dir "$DIR/a_file/out"
grep -q "final step" "$DIR/out" && fail "gpt trained before finding --save_dir unwritable"
expect 1 "project_dir $DIR/a_file/p: cannot create" "${gpt[@]}" --checkpoint_every 2 \
    --project_dir "$DIR/a_file/p"

# ---- gpt: --resume continues only the run that wrote the checkpoint
expect 0 "final step 2 |" "${gpt[@]}" --checkpoint_every 2 --stop_at 2 --project_dir "$DIR/p"
expect 1 "checkpoint's run had --batch 4 --accum 1, this one --batch 2 --accum 1" \
    "${gpt[@]}" --batch 2 --resume --project_dir "$DIR/p"
expect 1 "checkpoint's run had --batch 4 --accum 1, this one --batch 4 --accum 2" \
    "${gpt[@]}" --accum 2 --resume --project_dir "$DIR/p"
expect 0 "resumed from .*checkpoint_0 at step 2" "${gpt[@]}" --resume --project_dir "$DIR/p"
grep -q "final step 4 |" "$DIR/out" || fail "gpt --resume did not finish the run"

# ---- cuda_mlp (a CUDA build only): its command line, as the others'
if [ -x "$EX/cuda_mlp" ]; then
    expect 0 "^usage: cuda_mlp" "$EX/cuda_mlp" --help
    table=$(grep -oE '\{"--[a-z_]+", ARG_' "$SRC/examples/cuda_mlp.cu" | grep -oE -- '--[a-z_]+' |
        sort -u | xargs || true)
    listed=$(grep -oE -- '--[a-z_]+' "$DIR/out" | grep -vx -- --help | sort -u | xargs || true)
    [ "$table" = "$listed" ] || fail "cuda_mlp --help lists '$listed', its table has '$table'"
    expect 2 "steps needs a whole number >= 1, not '5x'" "$EX/cuda_mlp" --steps 5x
    expect 2 "precision must be no or bf16, not fp16" "$EX/cuda_mlp" --precision fp16
    expect 1 "save $DIR/a_file/x: cannot create" "$EX/cuda_mlp" --cpu --save "$DIR/a_file/x"
    grep -q "final loss" "$DIR/out" && fail "cuda_mlp trained before finding --save unwritable"
    expect 0 "saved" "$EX/cuda_mlp" --cpu --steps 3 --save "$DIR/mlp.ckpt"
    expect 0 "no step to take: the checkpoint is at step 3, --steps 3" "$EX/cuda_mlp" --cpu \
        --steps 3 --resume "$DIR/mlp.ckpt"
fi

# ---- the same under accel launch -n 2: the job ends with the status, no process hangs
expect 2 "steps needs a whole number" "${launch2[@]}" "${gpt[@]}" --steps x
expect 2 "unknown option '--foo'" "${launch2[@]}" "$EX/hello" --foo
expect 2 "more than 32 samples" "${launch2[@]}" "$EX/gradient_accumulation_lm" --batch 4 --accum 8
expect 1 "split_batches needs batch_size (1)" "${launch2[@]}" "$EX/linear_regression" \
    --batch 1 --accum 8
expect 1 "needs at least 129 bytes" "${launch2[@]}" "${gpt[@]}" --data "$DIR/short.txt"
expect 1 "save_dir $DIR/a_file/out: cannot create" "${launch2[@]}" "${gpt[@]}" \
    --save_dir "$DIR/a_file/out"
expect 1 "checkpoint's run had --batch 4" "${launch2[@]}" "${gpt[@]}" --batch 2 --resume \
    --project_dir "$DIR/p"
echo "PASS: $n_cases command lines"
