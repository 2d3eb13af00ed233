#!/usr/bin/env bash
# One lease of the lent GPU machine in one call: the checks and figures issues 14 and 15 ask of a
# GPU, in the order PARTS names them, each under its own time limit so that a hang or a failure
# costs only its own share and the rest still runs. Here, after building build-cuda:
#   bash scripts/gpu-pack.sh
# then, through the device tool (carry .gpu, and .base for the A/B part; timeout_s 600):
#   bash scripts/gpu-run.sh bash "$PWD/scripts/gpu-session.sh" "$OUT"
# PARTS (default "nn peers variants ncu tests"):
#   nn        ctest -L gpu -R 'nn_cuda|gpt_cuda' (the nn ops and the GPT against the CPU)
#   ab        bench/gpt_step (GPT-2 124M, B, bf16) and bench/cuda_attn of this build against
#             those of earlier builds, each a folder in BASES (default .base) holding gpt_step and
#             cuda_attn copied there stripped before a change, alternating, AB_ROUNDS (2) rounds:
#             same machine, same call, so the ratios are the changes' ("bench" is this build)
#   peers     bench/peers/run.sh: ours vs PyTorch eager and torch.compile in one run
#   variants  ours with the warp attention kernels (WARP=0 skips), with cuBLASLt's DGELU_BGRAD
#             epilogue for the MLP's hidden gradient (DGELU=0 skips), with the linears' bias
#             gradients by cuBLASLt's BGRADA / BGRADB epilogue (BGRAD=0 skips), without the
#             attention's register fast path (FAST=0 skips), keeping every block's
#             gradients to the step's end (ACCEL_NN_REWIND=0, for the memory; REWIND=0 skips),
#             with the head's chunks of each row count in CE_CHUNKS (default none), ZeRO stage
#             3 vs 0 at B = 8 (ZERO_STAGES="" skips), bench/cuda_attn
#   ncu       Nsight Compute's duration of every kernel of one step, summed per kernel
#   tests     the other GPU tests (ctest -L gpu -E 'nn_cuda|gpt_cuda')
#   cuda_all  bench/cuda_all.sh's table
#   racecheck compute-sanitizer's shared-memory race check of the attention test
#   diag      where the time goes, in depth: Nsight Compute's full sections of the attention
#             kernels (bench/cuda_attn) and speed-of-light of the head's and LayerNorm's
#             kernels (one step), into diag.log
# Writes into OUT_DIR (the device tool brings back at most 8 files, two folders down):
# session.log (everything, in order), gpu_tests.log, ab.log, peers/summary.md, peers/runs.log,
# variants.log, kernels.csv, cuda_all.md, racecheck.log, diag.log.
# Environment: B (32), STEPS (10), ROUNDS (1) and PROFILE (0: bench/peers/run.sh) for the peers.
set -u
out=${1:?usage: gpu-session.sh OUT_DIR}
mkdir -p "$out/peers"
exec > >(tee -a "$out/session.log") 2>&1
b=${B:-32}
opts=(--device cuda --preset gpt2-124m --mixed_precision bf16)
step=(build-cuda/bench/gpt_step "${opts[@]}")
stamp() { echo "== $(date -u +%T) $*"; }

# gpu_ctest CTEST_ARGS...: the GPU tests ctest selects with them, appended to gpu_tests.log;
# prints the exit status and this run's failures and skips.
gpu_ctest() {
    local log=/tmp/gpu-ctest.log
    (cd build-cuda && timeout -k 5 100 ctest -L gpu "$@" -j3 --output-on-failure) >"$log" 2>&1
    echo "   exit $?"; cat "$log" >>"$out/gpu_tests.log"
    grep -E 'tests passed|Failed|\*\*\*|Not Run' "$log"
}

part_nn() {
    stamp "nn and GPT on the GPU: ctest -L gpu -R 'nn_cuda|gpt_cuda'"
    gpu_ctest -R 'nn_cuda|gpt_cuda'
}

part_ab() {
    local bases=(${BASES:-$PWD/.base}) r d who prog
    for d in "${bases[@]}"; do
        [ -x "$d/gpt_step" ] || { echo "ab: no earlier build in $d: skipped"; return; }
    done
    {
        for ((r = 1; r <= ${AB_ROUNDS:-2}; r++)); do
            for d in "${bases[@]}" build-cuda/bench; do
                who=${d##*/}
                stamp "gpt_step, $who, round $r"
                timeout -k 5 60 "$d/gpt_step" "${opts[@]}" --batch "$b" --steps "${STEPS:-10}" 2>&1 |
                    tail -8
            done
        done
        for d in "${bases[@]}" build-cuda/bench; do
            stamp "cuda_attn, ${d##*/}"
            timeout -k 5 60 "$d/cuda_attn" 2>&1 | tail -7
        done
    } >"$out/ab.log" 2>&1
    cat "$out/ab.log"
}

part_peers() {
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
}

part_variants() {
    {
        if [ "${WARP:-1}" != 0 ]; then
            stamp "ours, warp attention kernels (ACCEL_NN_ATTN=warp), B = $b"
            ACCEL_NN_ATTN=warp timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
        fi
        if [ "${DGELU:-1}" != 0 ]; then
            stamp "ours, the MLP's hidden gradient by cuBLASLt's DGELU_BGRAD (ACCEL_NN_DGELU=epilogue), B = $b"
            ACCEL_NN_DGELU=epilogue timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
        fi
        if [ "${BGRAD:-1}" != 0 ]; then
            stamp "ours, the linears' bias gradients by cuBLASLt's BGRADA / BGRADB epilogue (ACCEL_NN_BGRAD=1), B = $b"
            ACCEL_NN_BGRAD=1 timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
        fi
        if [ "${FAST:-1}" != 0 ]; then
            stamp "ours, attention without the register fast path (ACCEL_NN_ATTN_FAST=0), B = $b"
            ACCEL_NN_ATTN_FAST=0 timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
        fi
        if [ "${REWIND:-1}" != 0 ]; then
            stamp "ours, every block's gradients kept to the step's end (ACCEL_NN_REWIND=0), B = $b"
            ACCEL_NN_REWIND=0 timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
        fi
        for c in ${CE_CHUNKS-}; do
            stamp "ours, the head's chunks of $c rows (ACCEL_NN_CE_CHUNK_ROWS=$c), B = $b"
            ACCEL_NN_CE_CHUNK_ROWS=$c timeout -k 5 45 "${step[@]}" --batch "$b" --steps 5 2>&1 | tail -6
        done
        for z in ${ZERO_STAGES-0 3}; do
            stamp "ours, ACCEL_ZERO_STAGE=$z, B = 8"
            ACCEL_ZERO_STAGE=$z timeout -k 5 45 "${step[@]}" --batch 8 --steps 5 2>&1 | tail -8
        done
        stamp "bench/cuda_attn"
        timeout -k 5 45 build-cuda/bench/cuda_attn 2>&1 | tail -25
    } >"$out/variants.log" 2>&1
    cat "$out/variants.log"
}

part_ncu() {
    command -v ncu >/dev/null 2>&1 || { echo "ncu: not here"; return; }
    stamp "ncu: every kernel of one step, B = $b"
    timeout -k 5 90 ncu --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --print-units base --csv \
        "${step[@]}" --batch "$b" --steps 1 --warmup 0 >"$out/kernels.csv" 2>"$out/ncu.err"
    echo "   exit $?"; tail -3 "$out/ncu.err"; rm -f "$out/ncu.err"
    awk -F'","' '$0 ~ /gpu__time_duration/ { gsub(/[",]/, "", $NF); n = $5; sub(/\(.*/, "", n)
        t[n] += $NF; c[n]++; all += $NF } END { for (k in t) printf "%10.3f ms %5d  %s\n",
        t[k] / 1e6, c[k], k; printf "%10.3f ms in all\n", all / 1e6 }' \
        "$out/kernels.csv" | sort -rn | head -30
}

part_tests() {
    stamp "the other GPU tests"
    gpu_ctest -E 'nn_cuda|gpt_cuda'
}

part_cuda_all() {
    stamp "bench/cuda_all.sh"
    LIMIT=60 timeout -k 5 200 bench/cuda_all.sh build-cuda /tmp/cuda_all >/dev/null 2>&1
    echo "   exit $?"; cp /tmp/cuda_all/summary.md "$out/cuda_all.md" 2>/dev/null && cat "$out/cuda_all.md"
}

part_racecheck() {
    command -v compute-sanitizer >/dev/null 2>&1 || { echo "compute-sanitizer: not here"; return; }
    stamp "compute-sanitizer --tool racecheck unit/test_nn_cuda_attn"
    timeout -k 5 "${RACE_LIMIT:-120}" compute-sanitizer --tool racecheck build-cuda/tests/test_nn_cuda_attn \
        >"$out/racecheck.log" 2>&1
    echo "   exit $?"; tail -4 "$out/racecheck.log"
}

part_diag() {
    command -v ncu >/dev/null 2>&1 || { echo "ncu: not here"; return; }
    stamp "diag: ncu --set full, attention kernels (bench/cuda_attn) -> diag.log"
    {
        timeout -k 5 150 ncu --set full --clock-control none -k 'regex:k_attn_.*_tc' \
            --launch-count 3 build-cuda/bench/cuda_attn 2>&1 | grep -v '^==PROF==' | cut -c1-150
        echo "exit ${PIPESTATUS[0]}"
        timeout -k 5 120 ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
            --clock-control none -k 'regex:k_lce_rows|k_layernorm|k_to_half|k_acc' --launch-count 6 \
            "${step[@]}" --batch "$b" --steps 1 --warmup 0 2>&1 | grep -v '^==PROF==' | cut -c1-150
        echo "exit ${PIPESTATUS[0]}"
    } >"$out/diag.log" 2>&1
    grep -E 'k_attn|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy' \
        "$out/diag.log" | head -40
}

for p in ${PARTS:-nn peers variants ncu tests}; do
    if declare -F "part_$p" >/dev/null; then
        "part_$p"
    else
        echo "gpu-session: no part '$p'"
    fi
done
stamp done
