#!/usr/bin/env bash
# One lease of the lent GPU machine in one call: the checks and figures issues 14 and 15 ask of a
# GPU, most important first, each under its own time limit so that a hang or a failure costs
# only its own share and the rest still runs. Here, after building build-cuda:
#   bash scripts/gpu-pack.sh
# then, through the device tool (carry .gpu; timeout_s 600):
#   bash scripts/gpu-run.sh bash "$PWD/scripts/gpu-session.sh" "$OUT"
# Writes into OUT_DIR (the device tool brings back at most 8 files, two folders down):
#   session.log      everything below, in order
#   gpu_tests.log    ctest -L gpu (nn and GPT tests first, then the rest)
#   peers/summary.md, peers/runs.log
#                    bench/peers/run.sh: GPT-2 124M at B = 32, ours vs PyTorch eager and
#                    torch.compile in one run
#   variants.log     ours with the warp attention kernels, ZeRO stage 3 vs 0, bench/cuda_attn
#   kernels.csv      Nsight Compute's duration of every kernel of one 124M step (where ncu works)
#   cuda_all.md      bench/cuda_all.sh's table (CUDA_ALL=1)
#   racecheck.log    compute-sanitizer's shared-memory race check of the attention test
#                    (RACECHECK=1, where the sanitizer works)
# Environment: B (32), STEPS (10), ROUNDS (1) for the peers; WARP=0 skips the warp-attention
# run; SKIP_NCU=1; CUDA_ALL=1; RACECHECK=1.
set -u
out=${1:?usage: gpu-session.sh OUT_DIR}
mkdir -p "$out/peers"
exec > >(tee -a "$out/session.log") 2>&1
b=${B:-32}
step=(build-cuda/bench/gpt_step --device cuda --preset gpt2-124m --mixed_precision bf16)
stamp() { echo "== $(date -u +%T) $*"; }

stamp "nn and GPT on the GPU: ctest -L gpu -R 'nn_cuda|gpt_cuda'"
(cd build-cuda && timeout -k 5 100 ctest -L gpu -R 'nn_cuda|gpt_cuda' -j3 --output-on-failure) \
    >"$out/gpu_tests.log" 2>&1
echo "   exit $?"; grep -E 'tests passed|Failed|\*\*\*|Not Run' "$out/gpu_tests.log"

stamp "GPT-2 124M, ours vs PyTorch (bench/peers/run.sh)"
ROUNDS=${ROUNDS:-1} STEPS=${STEPS:-10} B=$b LIMIT=150 timeout -k 5 420 \
    bench/peers/run.sh build-cuda "$out/peers" >/dev/null 2>&1
echo "   exit $?"; cat "$out/peers/summary.md" 2>/dev/null
grep -E 'peak|per step|nn |ZeRO|error|rror:' "$out/peers/runs.log" | head -20
if ! grep -q '^tokens_per_s=' "$out/peers/runs.log"; then
    stamp "ours failed at B = $b: with --recompute 1, then B = 8"
    timeout -k 5 90 "${step[@]}" --batch "$b" --recompute 1 --steps 5 2>&1 | tail -15
    timeout -k 5 60 "${step[@]}" --batch 8 --steps 5 2>&1 | tail -15
fi

{
    if [ "${WARP:-1}" != 0 ]; then
        stamp "ours, warp attention kernels (ACCEL_NN_ATTN=warp), B = $b"
        ACCEL_NN_ATTN=warp timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
    fi
    for z in 0 3; do
        stamp "ours, ACCEL_ZERO_STAGE=$z, B = 8"
        ACCEL_ZERO_STAGE=$z timeout -k 5 45 "${step[@]}" --batch 8 --steps 5 2>&1 | tail -8
    done
    stamp "bench/cuda_attn"
    timeout -k 5 45 build-cuda/bench/cuda_attn 2>&1 | tail -25
} >"$out/variants.log" 2>&1
cat "$out/variants.log"

if [ "${SKIP_NCU:-0}" != 1 ] && command -v ncu >/dev/null 2>&1; then
    stamp "ncu: every kernel of one step, B = $b"
    timeout -k 5 90 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --print-units base \
        --csv "${step[@]}" --batch "$b" --steps 1 --warmup 0 >"$out/kernels.csv" 2>"$out/ncu.err"
    echo "   exit $?"; tail -3 "$out/ncu.err"; rm -f "$out/ncu.err"
    awk -F'","' '$0 ~ /gpu__time_duration/ { gsub(/[",]/, "", $NF); n = $5; sub(/\(.*/, "", n)
        t[n] += $NF; c[n]++ } END { for (k in t) printf "%10.3f ms %5d  %s\n", t[k] / 1e6, c[k], k }' \
        "$out/kernels.csv" | sort -rn | head -25
fi
stamp "the other GPU tests"
(cd build-cuda && timeout -k 5 100 ctest -L gpu -E 'nn_cuda|gpt_cuda' -j3 --output-on-failure) \
    >>"$out/gpu_tests.log" 2>&1
echo "   exit $?"; grep -E 'tests passed|Failed|\*\*\*|Not Run|driver allocations' "$out/gpu_tests.log"

if [ "${CUDA_ALL:-0}" = 1 ]; then
    stamp "bench/cuda_all.sh"
    LIMIT=60 timeout -k 5 200 bench/cuda_all.sh build-cuda /tmp/cuda_all >/dev/null 2>&1
    echo "   exit $?"; cp /tmp/cuda_all/summary.md "$out/cuda_all.md" 2>/dev/null && cat "$out/cuda_all.md"
fi
if [ "${RACECHECK:-0}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    stamp "compute-sanitizer --tool racecheck unit/test_nn_cuda_attn"
    timeout -k 5 120 compute-sanitizer --tool racecheck build-cuda/tests/test_nn_cuda_attn \
        >"$out/racecheck.log" 2>&1
    echo "   exit $?"; tail -4 "$out/racecheck.log"
fi
stamp done
