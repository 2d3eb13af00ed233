#!/usr/bin/env bash
# GPT-2 124M training on one GPU, accel against its PyTorch peer, in one call (issue 15):
#   ours      BUILD_DIR/bench/gpt_step --device cuda --preset gpt2-124m --batch B
#             --mixed_precision bf16 --steps STEPS [--recompute 1 where RECOMPUTE=1]
#   eager     bench/peers/torch_gpt2.py --batch B --seq 1024 --steps STEPS --warmup WARMUP
#             --compile 0 (transformers GPT2LMHeadModel + Accelerate bf16)
#   compiled  the same with --compile 1 (torch.compile through Accelerate)
# ROUNDS rounds of the three, alternating (ours, eager, compiled, ours, ...), so a slow phase of
# the machine hits all of them. Each prints `tokens_per_s=X peak_mem_gib=Y step_ms=Z` last;
# the table takes each program's best round (and lists every round) and gives ours / theirs
# for tokens/s (above 1: ours is faster) and for peak memory (below 1: ours needs less).
#
# Usage: bench/peers/run.sh [BUILD_DIR (build-cuda)] [OUT_DIR (bench-results-peers)]
# Environment: B (32) sequences per step, STEPS (20) timed steps, WARMUP (3) untimed torch steps,
# ROUNDS (2), LIMIT (300) seconds per run, PYTHON (python3: needs torch, transformers and
# accelerate), OURS (BUILD_DIR/bench/gpt_step), RECOMPUTE (0; 1: ours recomputes each block's
# activations in backward, for less memory: docs/cuda.md; the torch runs never do), PROFILE (0;
# N: each torch run then profiles one more step and prints its N longest kernels into runs.log).
# Expected on an H100 at B=32: ours and eager 10-30 s a run; compiled 1-2 min the first time
# (inductor compiles; later rounds reuse its cache), so ROUNDS=2 is about 4-5 minutes.
# On the lent machine, after scripts/gpu-pack.sh here:
#   bash scripts/gpu-run.sh bench/peers/run.sh build-cuda $OUT/peers
# Every run's full output is in OUT_DIR/runs.log, the table in OUT_DIR/summary.md (two files:
# the device tool brings back 8 at most).
# The torch rows are skipped, saying why, where PYTHON cannot import torch, transformers and
# accelerate or sees no GPU. Exits 0 when every run that was not skipped succeeded, 1 when one
# failed, timed out or printed no result line, 77 when nothing ran (no GPU).
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build-cuda}
out=${2:-bench-results-peers}
batch=${B:-32}
steps=${STEPS:-20}
warmup=${WARMUP:-3}
rounds=${ROUNDS:-2}
limit=${LIMIT:-300}
profile=${PROFILE:-0}
recompute=${RECOMPUTE:-0}
python=${PYTHON:-python3}
ours=${OURS:-$build/bench/gpt_step}
seq=1024 # gpt_step's gpt2-124m preset
for v in batch steps warmup rounds limit recompute; do
    case ${!v} in
    '' | *[!0-9]*)
        echo "peers: $v must be a whole number (got '${!v}')" >&2
        exit 2
        ;;
    esac
done
if [ "$rounds" -lt 1 ] || [ "$batch" -lt 1 ] || [ "$steps" -lt 1 ]; then
    echo "peers: ROUNDS, B and STEPS must be at least 1" >&2
    exit 2
fi
mkdir -p "$out" && out=$(cd "$out" && pwd) && : >"$out/runs.log" || exit 1
tmp=$(mktemp -d /tmp/peers-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
names=(ours eager compiled)
labels=("accel bench/gpt_step, bf16" "PyTorch eager + Accelerate, bf16"
    "PyTorch torch.compile + Accelerate, bf16")
declare -A tps mem ms runs skip
failed=0 ran=0
# Without ours the PyTorch rows still run: device time is scarce, and they are the baseline.
if [ ! -x "$ours" ]; then
    echo "peers: $ours is missing: build it (cmake -S . -B $build -DACCEL_CUDA=ON &&" \
        "cmake --build $build --target bench_gpt_step), or name it with OURS=" >&2
    skip[ours]="FAILED: $ours is missing"
    failed=1
fi

# The library path for Python. scripts/gpu-run.sh puts the Debian libraries packed for our
# programs (.gpu/lib) and the system's CUDA libraries first on LD_LIBRARY_PATH, where they could
# stand in for the CUDA libraries torch's wheels bring. So a small check runs torch on the GPU
# (a bf16 matmul, causal attention) with, in turn: no LD_LIBRARY_PATH, the one given less
# .gpu/lib, the one given (each different one once). The first that works is used; exit 3 of
# the check means torch works but sees no GPU.
check='import sys, torch, transformers, accelerate
if not torch.cuda.is_available(): sys.exit(3)
a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
print(float((a @ a).float().sum() + o.float().sum()))'
kept=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v '/\.gpu/lib/*$' | paste -sd: -)
pyrun=() why="" nogpu=() tried=" "
for ld in "" "$kept" "${LD_LIBRARY_PATH:-}"; do
    case $tried in *" [$ld] "*) continue ;; esac
    tried="${tried}[$ld] "
    if [ -z "$ld" ]; then
        try=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 "$python")
    else
        try=(env LD_LIBRARY_PATH="$ld" PYTHONUNBUFFERED=1 "$python")
    fi
    rc=0
    msg=$("${try[@]}" -c "$check" 2>&1) || rc=$?
    if [ "$rc" = 0 ]; then
        pyrun=("${try[@]}")
        break
    elif [ "$rc" = 3 ]; then
        [ ${#nogpu[@]} -gt 0 ] || nogpu=("${try[@]}")
    else
        why=$(tail -1 <<<"$msg")
    fi
done
if [ ${#pyrun[@]} -eq 0 ] && [ ${#nogpu[@]} -gt 0 ]; then
    pyrun=("${nogpu[@]}")
    echo "peers: skipping the PyTorch runs: torch in $python sees no GPU"
    skip[eager]="skipped: torch sees no GPU"
elif [ ${#pyrun[@]} -eq 0 ]; then
    pyrun=(env PYTHONUNBUFFERED=1 "$python")
    echo "peers: skipping the PyTorch runs: $python cannot run torch, transformers and" \
        "accelerate on the GPU (${why:-no message})"
    skip[eager]="skipped: no torch/transformers/accelerate on the GPU in $python (${why:0:80})"
else
    echo "peers: PyTorch runs as: ${pyrun[*]}"
fi
if [ -n "${skip[eager]:-}" ]; then
    skip[compiled]=${skip[eager]}
fi

# run NAME ROUND COMMAND...: output to the terminal and OUT_DIR/runs.log; records the
# result line's figures, or why there are none.
run() {
    local name=$1 round=$2 file=$tmp/run.txt rc t0 t1 line where
    shift 2
    where="runs.log: $name, round $round"
    echo "== $name, round $round: $*" | tee -a "$out/runs.log"
    t0=$(date +%s.%N)
    timeout -k 10 "$limit" "$@" >"$file" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    {
        cat "$file"
        awk -v n="$name" -v rc="$rc" -v a="$t0" -v b="$t1" \
            'BEGIN { printf "   (%s: exit %d after %.1f s)\n", n, rc, b - a }'
    } | tee -a "$out/runs.log"
    line=$(sed 's/^\[rank[0-9]*\]: //' "$file" | grep '^tokens_per_s=' | tail -1)
    case $rc in
    0) ;;
    77)
        skip[$name]="skipped: no GPU (exit 77; $where)"
        return
        ;;
    124 | 137)
        failed=1
        skip[$name]="TIMED OUT after $limit s ($where)"
        return
        ;;
    *)
        failed=1
        skip[$name]="FAILED: exit $rc ($where)"
        return
        ;;
    esac
    # tokens_per_s=X peak_mem_gib=Y step_ms=Z, each a number, in this order.
    if ! read -r t m s < <(awk '{
            n = split($0, f, " "); if (n != 3) exit 1
            for (i = 1; i <= 3; i++) { split(f[i], kv, "="); v[i] = kv[2]; k[i] = kv[1]
                if (v[i] !~ /^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/) exit 1 }
            if (k[1] != "tokens_per_s" || k[2] != "peak_mem_gib" || k[3] != "step_ms" || v[1] <= 0)
                exit 1
            print v[1], v[2], v[3] }' <<<"$line"); then
        failed=1
        skip[$name]="FAILED: no valid 'tokens_per_s= peak_mem_gib= step_ms=' line ($where)"
        return
    fi
    ran=$((ran + 1))
    runs[$name]="${runs[$name]:-}${runs[$name]:+ }$t"
    # Keep the best round's figures (highest tokens/s); peak memory is the largest seen.
    if [ -z "${tps[$name]:-}" ] || awk -v a="$t" -v b="${tps[$name]}" 'BEGIN { exit !(a > b) }'; then
        tps[$name]=$t ms[$name]=$s
    fi
    if [ -z "${mem[$name]:-}" ] || awk -v a="$m" -v b="${mem[$name]}" 'BEGIN { exit !(a > b) }'; then
        mem[$name]=$m
    fi
}

recompute_flag=()
[ "$recompute" = 0 ] || recompute_flag=(--recompute "$recompute")
for ((r = 1; r <= rounds; r++)); do
    [ -n "${skip[ours]:-}" ] ||
        run ours "$r" "$ours" --device cuda --preset gpt2-124m --batch "$batch" \
            --mixed_precision bf16 --steps "$steps" "${recompute_flag[@]}"
    for c in 0 1; do
        name=${names[c + 1]}
        [ -n "${skip[$name]:-}" ] ||
            run "$name" "$r" "${pyrun[@]}" "$here/torch_gpt2.py" --device cuda --batch "$batch" \
                --seq "$seq" --steps "$steps" --warmup "$warmup" --compile "$c" --profile "$profile"
    done
done

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    head -1)
versions=$("${pyrun[@]}" -c 'import torch, transformers, accelerate as a
print(f"torch {torch.__version__}, transformers {transformers.__version__}, accelerate {a.__version__}")' \
    2>/dev/null)
{
    echo
    echo "GPU: ${gpu:-none found by nvidia-smi}"
    echo "Python: ${versions:-no torch/transformers/accelerate}"
    echo "accel: ${ACCEL_COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "GPT-2 124M, B=$batch, T=$seq, bf16, $steps timed steps, best of $rounds round(s)"
    echo
    echo "| program | tokens/s (best) | every round | peak GiB | step ms | ours / this, tokens/s | ours / this, peak memory |"
    echo "|---|---|---|---|---|---|---|"
    for i in 0 1 2; do
        n=${names[i]}
        if [ -z "${tps[$n]:-}" ]; then
            echo "| ${labels[i]} | ${skip[$n]:-not run} | - | - | - | - | - |"
            continue
        fi
        awk -v l="${labels[i]}" -v t="${tps[$n]}" -v all="${runs[$n]}" -v m="${mem[$n]}" \
            -v s="${ms[$n]}" -v note="${skip[$n]:-}" -v ot="${tps[ours]:-}" -v om="${mem[ours]:-}" 'BEGIN {
            k = split(all, a, " "); rr = ""
            for (j = 1; j <= k; j++) rr = rr (j > 1 ? ", " : "") sprintf("%.1fk", a[j] / 1000)
            if (note != "") rr = rr "; then " note
            rt = ot == "" ? "-" : sprintf("%.3f", ot / t)
            rm = (om == "" || m <= 0) ? "-" : sprintf("%.3f", om / m)
            printf "| %s | %.1fk | %s | %.2f | %.2f | %s | %s |\n", l, t / 1000, rr, m, s, rt, rm }'
    done
} | tee "$out/summary.md"
if [ "$failed" != 0 ]; then
    exit 1
fi
if [ "$ran" = 0 ]; then
    exit 77
fi
exit 0
