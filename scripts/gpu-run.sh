#!/usr/bin/env bash
# On the lent GPU machine, in the repository root, after scripts/gpu-pack.sh here: makes the packed
# sources and build appear at the paths they had when packed (the CTest files name them), finds
# CUDA's and NCCL's libraries, prints the device, then runs COMMAND (default: the GPU tests) from
# the packed source tree.
set -uo pipefail
REPO=$PWD
if [ -f .gpu/lib.tar.gz ]; then
    rm -rf .gpu/lib && tar -C .gpu -xzf .gpu/lib.tar.gz || echo "gpu-run: cannot unpack .gpu/lib.tar.gz"
fi
if [ -f .gpu/src/bin.tar.gz ]; then
    tar -C .gpu/src -xzf .gpu/src/bin.tar.gz && rm -f .gpu/src/bin.tar.gz ||
        echo "gpu-run: cannot unpack .gpu/src/bin.tar.gz"
fi
BUILD=$(sed -n 's|^# Build directory: \(.*\)$|\1|p' .gpu/src/build-cuda/CTestTestfile.cmake)
SRC=${BUILD%/*}
if [ "$SRC" = "$REPO" ]; then
    ln -sfn "$REPO/.gpu/src/build-cuda" "$REPO/build-cuda"
else
    mkdir -p "${SRC%/*}" && ln -sfn "$REPO/.gpu/src" "$SRC"
fi
dirs=$REPO/.gpu/lib
for lib in libcudart.so.13 libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
    d=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$lib" 2>/dev/null | head -1)
    [ -n "$d" ] && dirs=$dirs:${d%/*} || echo "gpu-run: $lib not found"
done
export LD_LIBRARY_PATH=$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ACCEL_BUILD_DIR=$SRC/build-cuda ACCEL_SOURCE_DIR=$SRC
[ -f .gpu/COMMIT ] && export ACCEL_COMMIT=$(cat .gpu/COMMIT)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
cd "$SRC" || exit 1
if [ $# -eq 0 ]; then set -- bash -c 'cd build-cuda && ctest -L gpu --output-on-failure'; fi
"$@"
