#!/usr/bin/env bash
# On the lent GPU machine, in the repository root, after scripts/gpu-pack.sh here: makes the packed
# build-cuda/ appear where its CTest files expect it (this checkout's absolute path when packed),
# finds CUDA's and NCCL's libraries, prints the device, then runs COMMAND (default: the GPU tests).
set -uo pipefail
REPO=$PWD
PACKED=$(sed -n 's|^# Build directory: \(.*\)$|\1|p' .gpu/build-cuda/CTestTestfile.cmake)
SRC=${PACKED%/*}
if [ "$SRC" != "$REPO" ]; then mkdir -p "${SRC%/*}" && ln -sfn "$REPO" "$SRC"; fi
ln -sfn "$REPO/.gpu/build-cuda" "$REPO/build-cuda"
dirs=$REPO/.gpu/lib
for lib in libcudart.so.13 libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
    d=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$lib" 2>/dev/null | head -1)
    [ -n "$d" ] && dirs=$dirs:${d%/*} || echo "gpu-run: $lib not found"
done
export LD_LIBRARY_PATH=$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ACCEL_BUILD_DIR=$REPO/build-cuda ACCEL_SOURCE_DIR=$REPO
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [ $# -eq 0 ]; then set -- bash -c 'cd build-cuda && ctest -L gpu --output-on-failure'; fi
"$@"
