#!/usr/bin/env bash
# Fuzzes the readers of untrusted files (safetensors, config YAML, token files) with libFuzzer
# under AddressSanitizer + UndefinedBehaviorSanitizer. On demand, never part of `make test`.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60; needs clang)
# Crashing inputs are left as build-fuzz/crash-* with the sanitizer report on the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -g -O1"
CC=clang cmake -S . -B build-fuzz -DACCEL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS="$san -fsanitize=fuzzer-no-link" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target accel_static >/dev/null
# The library's own dependencies as its accel.pc lists them (MPI, Gloo and OpenMP when the
# build found them; a fixed list here went stale when they, and xxhash, were added).
libs="$(pkg-config --libs yaml-0.1 jansson openblas libxxhash) \
    $(sed -n 's/^Libs.private: //p' build-fuzz/accel.pc) -fopenmp"
# Seeds: valid files of each kind, so mutations start past the first header check.
mkdir -p build-fuzz/corpus_safetensors build-fuzz/corpus_inputs
python3 - <<'PY'
import json, struct
hdr = {"__metadata__": {"format": "pt"},
       "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
       "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
       "s": {"dtype": "I64", "shape": [], "data_offsets": [22, 30]}}
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
open("build-fuzz/corpus_safetensors/seed.safetensors", "wb").write(
    struct.pack("<Q", len(h)) + h + bytes(range(30)))
open("build-fuzz/corpus_inputs/seed_config", "wb").write(
    b"\x00compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
    b"mixed_precision: bf16\nnum_processes: 2\nuse_cpu: true\nfsdp_config: {}\n")
head = struct.pack("<256i", 20240520, 1, 40, *([0] * 253))
open("build-fuzz/corpus_inputs/seed_llmc", "wb").write(b"\x01" + head + struct.pack("<40H", *range(40)))
open("build-fuzz/corpus_inputs/seed_raw", "wb").write(b"\x06" + struct.pack("<40H", *range(40)))
open("build-fuzz/corpus_inputs/seed_marker", "wb").write(b"\x03" + json.dumps(
    {"accel_state": {"custom": 0, "gradients": False, "iteration": 0, "loaders": 0, "models": 1,
                     "num_processes": 1, "optimizers": 0, "scaler": False, "schedulers": 0},
     "checksum": "xxh3-64/16MiB", "format": "accel-checkpoint", "marker_xxh3": "0" * 16,
     "files": {"s.safetensors": {"nbytes": 88, "xxh3": "0123456789abcdef"}}, "version": 2},
    indent=2, sort_keys=True).encode())
open("build-fuzz/corpus_inputs/seed_index", "wb").write(b"\x04" + json.dumps(
    {"metadata": {"total_size": 16}, "weight_map": {"w": "s.safetensors"}}, indent=2).encode())
PY
for t in safetensors inputs; do
    # shellcheck disable=SC2086
    clang -std=c11 -D_GNU_SOURCE $san -fsanitize=fuzzer -Iinclude -Isrc \
        "tests/fuzz/fuzz_$t.c" build-fuzz/libaccel.a $libs -o "build-fuzz/fuzz_$t"
    echo "== fuzz_$t for ${secs}s"
    (cd build-fuzz && "./fuzz_$t" -max_total_time="$secs" -max_len=4096 -timeout=10 \
        "corpus_$t" 2>&1 | grep -E "DONE|ERROR|SUMMARY|crash-" || true)
done
