#!/usr/bin/env bash
# The GPU benchmarks of issues 14 and 15 in one go (about a minute on an H100), then one table:
#   cuda_step        training step, reducer vs no communication: 1 process, then 2 sharing the GPU
#   cuda_allreduce   accel_allreduce on device buffers through staging, 2 processes, 1-256 MiB
#   cuda_ckpt        accel_save_state from GPU memory vs cudaMemcpy + write of the same bytes
#   cuda_attn        nn's attention kernels at one GPT-2 124M layer: tensor cores vs warp kernels
# Usage: bench/cuda_all.sh [BUILD_DIR (build-cuda)] [OUT_DIR (bench-results-cuda)]
# BUILD_DIR is a build configured with -DACCEL_CUDA=ON (the benchmarks are built first if
# needed), or one packed by scripts/gpu-pack.sh (on the lent machine:
# `bash scripts/gpu-run.sh bench/cuda_all.sh`). Each one's full output is in OUT_DIR/<name>.txt
# (and on the terminal); the table at the end is Markdown, for docs/performance.md. Exits 0
# when every benchmark ran, 77 when none could (no GPU), 1 when one failed or took longer than
# its time limit (LIMIT seconds, 90).
set -u
build=${1:-build-cuda}
out=${2:-bench-results-cuda}
limit=${LIMIT:-90}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# A CUDA build tree (with cmake here): build what runs. A packed one (scripts/gpu-pack.sh, run
# through scripts/gpu-run.sh on the lent machine) has the programs already.
if [ -f "$build/CMakeCache.txt" ] && command -v cmake >/dev/null 2>&1; then
    if ! grep -q '^ACCEL_CUDA:BOOL=ON' "$build/CMakeCache.txt"; then
        echo "cuda_all: $build is not a CUDA build: cmake -S . -B $build -DACCEL_CUDA=ON" >&2
        exit 1
    fi
    cmake --build "$build" -j "$(nproc)" --target accel_cli bench_cuda_step bench_cuda_allreduce \
        bench_cuda_ckpt bench_cuda_attn >"$out/build.txt" 2>&1 || {
        tail -30 "$out/build.txt"
        echo "cuda_all: building the benchmarks failed (log: $out/build.txt)" >&2
        exit 1
    }
fi
for p in accel bench/cuda_step bench/cuda_allreduce bench/cuda_ckpt bench/cuda_attn; do
    if [ ! -x "$build/$p" ]; then
        echo "cuda_all: $build/$p is missing (a CUDA build: cmake -S . -B $build -DACCEL_CUDA=ON)" >&2
        exit 1
    fi
done
export OMP_NUM_THREADS=1
launch=("$build/accel" launch --main_process_port 0 --num_processes)
failed=0 ran=0 skipped=0
rows=()

# run NAME COMMAND...: its output to the terminal and OUT_DIR/NAME.txt; collects its summary row.
run() {
    local name=$1 rc t0 t1
    shift
    echo "== $name: $*"
    t0=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    sed 's/^\[rank[0-9]*\]: //' "$out/$name.txt" | grep -v '^| ' || true
    awk -v n="$name" -v rc="$rc" -v a="$t0" -v b="$t1" \
        'BEGIN { printf "   (%s: exit %d after %.1f s)\n", n, rc, b - a }'
    case $rc in
    0)
        ran=$((ran + 1))
        while IFS= read -r line; do rows+=("$line"); done < <(sed 's/^\[rank[0-9]*\]: //' \
            "$out/$name.txt" | grep '^| ')
        ;;
    77)
        skipped=$((skipped + 1))
        rows+=("| $name | skipped: no GPU | - | - |")
        ;;
    124 | 137)
        failed=1
        rows+=("| $name | TIMED OUT after ${limit} s | - | - |")
        ;;
    *)
        failed=1
        rows+=("| $name | FAILED (exit $rc, see $out/$name.txt) | - | - |")
        ;;
    esac
}

run step_np1 "$build/bench/cuda_step"
run step_np2 "${launch[@]}" 2 "$build/bench/cuda_step"
run allreduce_np2 "${launch[@]}" 2 "$build/bench/cuda_allreduce"
run ckpt "$build/bench/cuda_ckpt" --dir "$out"
run attn "$build/bench/cuda_attn"

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    head -1)
{
    echo
    echo "GPU: ${gpu:-none found by nvidia-smi}"
    "$build/accel" env 2>/dev/null | sed -n 's/^  - \(CUDA runtime\|CUDA driver\|NCCL\): /\1 /p' |
        paste -sd',' - | sed 's/,/, /g'
    echo "accel: ${ACCEL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| benchmark | configuration | figure | target |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
if [ "$failed" != 0 ]; then
    exit 1
fi
if [ "$ran" = 0 ] && [ "$skipped" -gt 0 ]; then
    exit 77
fi
exit 0
