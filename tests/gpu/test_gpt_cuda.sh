#!/usr/bin/env bash
# examples/gpt trained on the GPU (--device cuda: the nn ops, the parameters, the gradients and
# AdamW in GPU memory) follows the same run on the CPU from the same initial weights (same
# seed, corpus and data order), 20 steps of a 2-layer width-64 GPT, every step's loss logged:
#
#   run                      step 1 (|gpu - cpu|)   steps 1-20 (relative)
#   fp32, 1 process          <= 3e-4                <= 2e-3
#   bf16, 1 process          <= 1e-2                <= 2e-2
#   fp32, 2 processes        <= 3e-4                <= 2e-3   (the GPU shared: staged buckets)
#   ZeRO-2 vs DDP, 2 procs   <= 1e-4                <= 1e-4   (the same sums on 2 processes)
#   ZeRO-3 vs DDP, 2 procs   <= 1e-4                <= 1e-4   (units in reserved GPU memory)
#
# Step 1 is the forward of the initial weights (losses are printed with 4 decimals, so 1e-4 of
# it is the print); later steps add the drift of summation orders through AdamW (bf16: and the
# tensor-core attention's, whose products sum in tiles). Then the GPU model saved with
# --save_dir loads on the CPU (tests/progs/gpt_logits, strict names) and on the GPU again
# (--device cuda), and both give the same logits (1e-4 of the largest); where Python has numpy
# and safetensors, tests/ckpt/gpt2_ref.py checks the GPU's logits against its numpy GPT-2 and,
# where torch and transformers import, against GPT2LMHeadModel (else it says so). Last,
# bench/gpt_step --device cuda runs GPT-2 124M's shapes with 2 layers (T 1024, width 768, 12
# heads, vocabulary 50304; batch 4, bf16) and prints its machine-readable line. Exits 77
# (skipped) without the CUDA build or without a GPU; every comparison prints its worst
# difference.
#
# In the CUDA emulator build (ACCEL_CUEMU=1, tests/cuemu) the model sees context 8 and trains
# 10 steps (the comparisons' steps 1-10; every step after the first runs the same kernels), and
# gpt_step small shapes for one step: emulated kernels run on one CPU thread.
#
# The training steps take the fused head and loss (nn_linear_cross_entropy) in chunks of 12
# rows (ACCEL_NN_CE_CHUNK_ROWS, on both devices), so every step runs several chunks and a
# partial last one; gpt_step at the end takes the default chunks (256 MiB of logits).
#
# Activation recomputation (--recompute 1, nn_checkpoint per block) runs the same mechanism on
# the GPU as on the CPU: with dropout 0.1, fp32, the GPU run with recomputation follows the
# GPU run without it (step 1 <= 2e-4, every step <= 1e-3 relative: the same kernels, only
# cuBLASLt may pick another algorithm for other operand alignments) and the CPU run with it
# (the fp32 tolerances above); gpt_step's nn arena peak at GPT-2 124M's shapes is lower with
# it than without.
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
GPT=$BUILD/examples/gpt
LOGITS=$BUILD/tests/progs/gpt_logits
STEP=$BUILD/bench/gpt_step
if [ ! -x "$BUILD/examples/cuda_mlp" ]; then
    echo "SKIP: $BUILD is not a CUDA build (configure with -DACCEL_CUDA=ON)"
    exit 77
fi
for p in "$GPT" "$LOGITS" "$STEP" "$BUILD/accel"; do
    [ -x "$p" ] || { echo "FAIL: $p is not built (the gpu_checks target builds it)"; exit 1; }
done
DIR=$(mktemp -d /tmp/accel_gpt_cuda_XXXXXX)
trap 'rm -rf "$DIR"' EXIT
export OMP_NUM_THREADS=1
fail() {
    echo "FAIL: $*"
    exit 1
}
# A fixed corpus (the examples' sources as of 42410ef, packed with the GPU build too): not the
# live examples, whose edits changed how far 10 steps get and failed the learning check.
cp "$SRC"/tests/fixtures/gpt_corpus.txt "$DIR/corpus.txt"

MODEL=(--layers 2 --width 64 --heads 4 --context 32)
STEPS=20
if [ "${ACCEL_CUEMU:-0}" = 1 ]; then
    # The CUDA emulator build (tests/cuemu) runs kernels on one CPU thread: a quarter of the
    # rows (32: still 3 chunks of 12 rows for the head, the last one partial), half the steps.
    MODEL=(--layers 2 --width 64 --heads 4 --context 8)
    STEPS=10
fi
ARGS=("${MODEL[@]}" --batch 4 --steps "$STEPS" --lr 3e-3 --log_every 1 --sample 0
    --data "$DIR/corpus.txt")

# run NAME NPROCS ARGS...: the losses ("S L" per step) in $DIR/NAME, the output in NAME.out.
run() {
    local name=$1 n=$2 rc=0
    shift 2
    local launch=()
    [ "$n" = 1 ] || launch=("$BUILD/accel" launch --main_process_port 0 --num_processes "$n")
    "${launch[@]}" "$GPT" "${ARGS[@]}" "$@" >"$DIR/$name.out" 2>&1 || rc=$?
    sed -n 's/^.*step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\) |.*$/\1 \2/p' "$DIR/$name.out" \
        >"$DIR/$name"
    if [ "$rc" != 0 ]; then
        cat "$DIR/$name.out"
        fail "$name: examples/gpt $* exited with $rc"
    fi
}

# compare GPU CPU FIRST_ABS REL: step 1 within FIRST_ABS, every step within REL relative.
compare() {
    paste -d' ' "$DIR/$1" "$DIR/$2" |
        awk -v first="$3" -v tol="$4" -v what="$1 vs $2" -v steps="$STEPS" '
        { if ($1 != $3) { print what ": step mismatch: " $0; bad = 1; exit }
          d = $2 - $4; if (d < 0) d = -d; m = $4 < 0 ? -$4 : $4; if (m < 0.1) m = 0.1
          if (d / m > worst) worst = d / m
          if (NR == 1) { d1 = d; if (d > first) { print what ": step 1: " $2 " vs " $4; bad = 1 } }
          if (d > tol * m) { print what ": step " $1 ": " $2 " vs " $4; bad = 1 } n++ }
        END { if (n != steps) { print what ": " n " losses, not " steps; bad = 1 }
              printf "%s: %d steps, step 1 |difference| %.2g (<= %s), ", what, n, d1, first
              printf "worst relative %.3g (<= %s)\n", worst, tol
              exit bad }'
}

learns() {
    awk 'NR == 1 { first = $2 } { last = $2 } END { exit !(last < 0.8 * first) }' "$DIR/$1" ||
        fail "$1 does not learn: $(head -1 "$DIR/$1") ... $(tail -1 "$DIR/$1")"
}

echo "== is there a GPU?"
rc=0
"$GPT" "${ARGS[@]}" --steps 1 --device cuda >"$DIR/probe.out" 2>&1 || rc=$?
if [ "$rc" != 0 ] && grep -q -- "--device cuda: accel runs on" "$DIR/probe.out"; then
    echo "SKIP: $(grep -- "--device cuda" "$DIR/probe.out")"
    exit 77
fi
[ "$rc" = 0 ] || { cat "$DIR/probe.out"; fail "examples/gpt --device cuda exited with $rc"; }
# (set -e: a grep that finds nothing would end the test without a word)
grep -m1 "parameters" "$DIR/probe.out" ||
    { cat "$DIR/probe.out"; fail "examples/gpt --device cuda printed no 'parameters' line"; }

export ACCEL_NN_CE_CHUNK_ROWS=12

echo "== fp32, 1 process"
run cpu_fp32 1 --device cpu --mixed_precision no
run gpu_fp32 1 --device cuda --mixed_precision no --save_dir "$DIR/gpu_model"
learns gpu_fp32
compare gpu_fp32 cpu_fp32 3e-4 2e-3 || fail "fp32: the GPU run does not follow the CPU run"

echo "== bf16, 1 process"
run cpu_bf16 1 --device cpu --mixed_precision bf16
run gpu_bf16 1 --device cuda --mixed_precision bf16
learns gpu_bf16
compare gpu_bf16 cpu_bf16 1e-2 2e-2 || fail "bf16: the GPU run does not follow the CPU run"

echo "== recomputation (--recompute 1), dropout 0.1, fp32"
run gpu_drop 1 --device cuda --mixed_precision no --dropout 0.1
run gpu_drop_rc 1 --device cuda --mixed_precision no --dropout 0.1 --recompute 1
run cpu_drop_rc 1 --device cpu --mixed_precision no --dropout 0.1 --recompute 1
learns gpu_drop_rc
compare gpu_drop_rc gpu_drop 2e-4 1e-3 || fail "recompute: the GPU run with it differs from without"
compare gpu_drop_rc cpu_drop_rc 3e-4 2e-3 ||
    fail "recompute: the GPU run does not follow the CPU run"

echo "== fp32, 2 processes"
run cpu_np2 2 --device cpu --mixed_precision no
run gpu_np2 2 --device cuda --mixed_precision no
compare gpu_np2 cpu_np2 3e-4 2e-3 || fail "2 processes: the GPU run does not follow the CPU run"

echo "== ZeRO-2, fp32, 2 processes"
# The gradients reduce-scattered (staged through the host where the GPU is shared, in place on
# nccl with a GPU each), the optimizer state sharded, the weights all-gathered: on 2 processes
# the same sums as DDP's all-reduce, so the same losses up to their printed 4 decimals.
ACCEL_ZERO_STAGE=2 run gpu_np2_zero2 2 --device cuda --mixed_precision no
compare gpu_np2_zero2 gpu_np2 1e-4 1e-4 || fail "ZeRO-2 on the GPU does not follow DDP"

echo "== ZeRO-3, fp32, 2 processes"
# The units (wte/wpe, each block, ln_f) mapped into reserved GPU memory and gathered before
# use, released (unmapped) after; gradients as at stage 2: the same losses as DDP's.
ACCEL_ZERO_STAGE=3 run gpu_np2_zero3 2 --device cuda --mixed_precision no
compare gpu_np2_zero3 gpu_np2 1e-4 1e-4 || fail "ZeRO-3 on the GPU does not follow DDP"

echo "== the GPU model's model.safetensors"
[ -s "$DIR/gpu_model/model.safetensors" ] || fail "no $DIR/gpu_model/model.safetensors"
for dev in cpu cuda; do
    "$LOGITS" --dir "$DIR/gpu_model" "${MODEL[@]}" --tied 1 --activation gelu_new \
        --tokens "$DIR/corpus.txt" --batch 2 --device "$dev" --out "$DIR/logits_$dev.npy" \
        --ids_out "$DIR/ids.npy" || fail "gpt_logits --device $dev cannot use the GPU's file"
done
if python3 -c 'import numpy' 2>/dev/null; then
    python3 - "$DIR"/logits_{cuda,cpu}.npy <<'EOF' || fail "GPU and CPU logits differ"
import sys
import numpy as np
g, c = np.load(sys.argv[1]), np.load(sys.argv[2])
d = float(np.abs(g - c).max()) / max(1.0, float(np.abs(c).max()))
print(f"logits of the saved model, GPU vs CPU: worst {d:.3g} of the largest (<= 1e-4)")
sys.exit(0 if d <= 1e-4 else 1)
EOF
else
    echo "no numpy: the GPU and CPU logits are not compared"
fi
if python3 -c 'import numpy, safetensors' 2>/dev/null; then
    python3 "$SRC/tests/ckpt/gpt2_ref.py" "$DIR/gpu_model" "$DIR/ids.npy" "$DIR/logits_cuda.npy" ||
        fail "the GPU's logits differ from GPT-2's"
else
    echo "no numpy + safetensors in python3: GPT-2 reference (and transformers) not checked"
fi

SHAPE=(--preset gpt2-124m --layers 2 --batch 4 --steps 2 --warmup 1)
what="GPT-2 124M's shapes (T 1024, width 768, 12 heads, V 50304), 2 layers"
if [ "${ACCEL_CUEMU:-0}" = 1 ]; then
    SHAPE=(--layers 2 --width 64 --heads 4 --context 64 --vocab 512 --batch 2 --steps 1 --warmup 0)
    what="small shapes (the CUDA emulator)"
fi
unset ACCEL_NN_CE_CHUNK_ROWS
echo "== bench/gpt_step --device cuda: $what"
"$STEP" --device cuda "${SHAPE[@]}" \
    --mixed_precision bf16 >"$DIR/step.out" 2>&1 || { cat "$DIR/step.out"; fail "gpt_step"; }
cat "$DIR/step.out"
grep -Eq '^tokens_per_s=[0-9.]+ peak_mem_gib=[0-9.]+ step_ms=[0-9.]+$' "$DIR/step.out" ||
    fail "gpt_step printed no 'tokens_per_s=<x> peak_mem_gib=<y> step_ms=<z>' line"
"$STEP" --device cuda "${SHAPE[@]}" \
    --mixed_precision bf16 --recompute 1 >"$DIR/step_rc.out" 2>&1 ||
    { cat "$DIR/step_rc.out"; fail "gpt_step --recompute 1"; }
# In bytes: at the emulator's small shapes both peaks round to the same GiB.
arena() { sed -n 's/^ *nn arena peak .*(\([0-9]*\) bytes.*/\1/p' "$1"; }
a0=$(arena "$DIR/step.out")
a1=$(arena "$DIR/step_rc.out")
[ -n "$a0" ] && [ -n "$a1" ] || fail "gpt_step printed no 'nn arena peak' line"
echo "nn arena peak: $a0 bytes without recomputation, $a1 bytes with it (--recompute 1)"
awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(b < a) }' ||
    fail "the arena peak with recomputation ($a1 bytes) is not below the one without ($a0 bytes)"
echo "ok"
