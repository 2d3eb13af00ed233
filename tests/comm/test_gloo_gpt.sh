#!/usr/bin/env bash
# The GPT example trains to bit-identical weights on 1 machine x 2 processes (shm, under accel
# launch) and on 2 machines x 1 process (gloo, two launchers with --num_machines 2), in fp32
# and in bf16 mixed precision (issue 16).
#
# Which reductions are order-sensitive: floating-point sums and products of three or more
# processes (a + b == b + a exactly, but (a + b) + c != a + (b + c) in general). gloo reduces
# in rank order like shm (all-to-all of blocks, then accel's kernels over the blocks in rank
# order), so the two agree bit for bit whatever the number of processes; the test uses 2
# processes, where even an order-insensitive backend would agree, and 1 BLAS thread per
# process (a multi-threaded matmul may split its sums differently with a different thread
# count). hier is not part of this comparison: it sums a machine's processes first, then the
# machines (deterministic, but a different association; docs/comm.md).
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
S=${ACCEL_SOURCE_DIR:?ACCEL_SOURCE_DIR must point at the source directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
machines_setup # $tmp; skips without gloo
cat "$S"/docs/*.md | head -c 300000 >"$tmp/corpus.txt"
export OMP_NUM_THREADS=1

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*/*.err "$tmp"/*/out; do [ -f "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done
    exit 1
}

for mp in no bf16; do
    args=(--layers 2 --width 64 --heads 4 --context 32 --batch 4 --steps 12 --lr 3e-3
          --log_every 4 --sample 0 --mixed_precision "$mp" --data "$tmp/corpus.txt")
    mkdir -p "$tmp/shm-$mp" "$tmp/gloo-$mp"
    "$B/accel" launch --main_process_port 0 --num_processes 2 "$B/examples/gpt" "${args[@]}" \
        --save_dir "$tmp/shm-$mp/model" >"$tmp/shm-$mp/out" 2>&1 || fail "shm run ($mp)"
    machines_launch "$tmp/gloo-$mp" 2 1 ACCEL_BACKEND=gloo -- "$B/examples/gpt" "${args[@]}" \
        --save_dir "$tmp/gloo-$mp/model"
    machines_wait 250 || fail "gloo run ($mp)"
    a=$(grep fingerprint "$tmp/shm-$mp/out" | sed 's/^\[rank0\]: //')
    b=$(grep fingerprint "$tmp/gloo-$mp/r0.out")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$mp: fingerprints differ: shm '$a', gloo '$b'"
    cmp -s "$tmp/shm-$mp/model/model.safetensors" "$tmp/gloo-$mp/model/model.safetensors" ||
        fail "$mp: model.safetensors differ between shm and gloo"
    echo "$mp: shm (1 x 2) and gloo (2 x 1) give the same weights: $a"
done
echo "test_gloo_gpt: ok"
