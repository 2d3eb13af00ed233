#!/usr/bin/env bash
# Packs what the lent GPU machine needs to run the CUDA build's GPU tests and benchmarks into .gpu/
# of the checkout the device tool sends (git-ignored; name it in the tool's `carry`):
#   .gpu/src/            this source tree's tests/, bench/, scripts/ and examples/ (the shell
#                        tests and drivers read them), so a build of another worktree runs too;
#   .gpu/src/build-cuda/ the CUDA build's test programs, examples, benchmarks and CLI, stripped,
#                        with its CTest files (the programs in .gpu/src/bin.tar.gz, which
#                        gpu-run.sh unpacks);
#   .gpu/lib.tar.gz      the Debian shared libraries they load that a CUDA image may lack (CUDA's
#                        own libraries are found there), unpacked into .gpu/lib/ by gpu-run.sh.
# Usage: scripts/gpu-pack.sh [BUILD_DIR (build-cuda)] [DEST_CHECKOUT (this one)]. Then, on that
# machine: `bash scripts/gpu-run.sh [COMMAND...]`.
set -euo pipefail
SRC=$(pwd)
BUILD=$(cd "${1:-build-cuda}" && pwd)
OUT=$(cd "${2:-.}" && pwd)/.gpu
rm -rf "$OUT" && mkdir -p "$OUT/src/build-cuda" "$OUT/lib"
git ls-files tests bench scripts examples | tar -cf - -T - | tar -xf - -C "$OUT/src"
# The commit the build is of (the device machine's copy of .git may be older): gpu-run.sh
# exports it as ACCEL_COMMIT for the benchmarks' tables.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include || echo '+changes')" \
    >"$OUT/COMMIT"
cd "$BUILD"
# Everything ctest -L gpu runs, plus CUDA programs in examples/ and bench/ and the CLI.
progs=(accel libexec/accel/test_worker)
progs+=($(ctest -N -V -L gpu | sed -n 's/^[0-9]*: Test command: //p' | tr -d '"' | tr ' ' '\n' |
    grep "^$PWD/" | sed "s|^$PWD/||" | grep -v '\.sh$' | sort -u))
# The C programs that run on the GPU too (tests/gpu/test_gpt_cuda.sh, bench/peers).
progs+=(examples/gpt bench/gpt_step tests/progs/gpt_logits)
for f in examples/cuda_* bench/cuda_* tests/test_*cuda* tests/progs/*cuda*; do
    [ -f "$f" ] && [ -x "$f" ] && progs+=("$f")
done
for f in $(printf '%s\n' "${progs[@]}" | sort -u); do
    [ -f "$f" ] || continue
    mkdir -p "$OUT/src/build-cuda/$(dirname "$f")"
    strip -o "$OUT/src/build-cuda/$f" "$f"
done
find . -name CTestTestfile.cmake -exec cp --parents {} "$OUT/src/build-cuda/" \;
cd "$SRC"
for f in $(find "$OUT/src/build-cuda" -type f -perm -u+x); do ldd "$f"; done |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libnccl|libcublas|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
# The device tool sends at most 64 MiB (the checkout and what `carry` names); the libraries are
# most of the pack (OpenBLAS alone is about 35 MiB), so they travel gzipped (a third of the
# size) and scripts/gpu-run.sh unpacks them there.
tar -C "$OUT" -czf "$OUT/lib.tar.gz" lib && rm -rf "$OUT/lib"
# The programs compressed too (each links libaccel statically: about 4 MiB stripped, a third
# of that compressed), so that the pack stays under the device tool's limit.
(cd "$OUT/src" && find build-cuda -type f -perm -u+x -print0 | tar --null -czf bin.tar.gz -T - &&
    find build-cuda -type f -perm -u+x -delete)
pack=$(du -sk "$OUT" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "gpu-pack: $OUT is $((pack / 1024)) MiB; with this checkout's tracked files $(((pack + tree) / 1024)) MiB of the device tool's 64"
if [ $((pack + tree)) -gt $((60 * 1024)) ]; then
    echo "gpu-pack: WARNING: near or over the 64 MiB the device tool sends" >&2
fi
