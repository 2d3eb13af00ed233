#!/usr/bin/env bash
# The checksums of a checkpoint's marker (docs/checkpoint.md) computed independently, with the
# Python xxhash package and the documented definition only (tests/ckpt/checksum.py): files of
# several 16 MiB blocks, a file that ends exactly on a block boundary, and the marker's own
# checksum. A byte flipped afterwards must make the checker fail (it is sharp).
# Skips (77) when xxhash is absent and cannot be installed (offline).
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:-build}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TOOL=$BUILD/tests/progs/state_writer

. "$SRC/tests/pyenv.sh"
accel_need_python 'import xxhash' xxhash || {
    echo "test_checksum_interop: SKIP: python3 with xxhash is not available" \
        "(pip install xxhash failed, probably offline)"
    exit 77
}
[ -x "$TOOL" ] || { echo "test_checksum_interop: $TOOL not built" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

"$TOOL" "$TMP/ckpt"
[ "$(stat -c %s "$TMP/ckpt/custom_checkpoint_0.bin")" -eq $((16 << 20)) ]
python3 "$SRC/tests/ckpt/checksum.py" "$TMP/ckpt"
printf '\001' | dd of="$TMP/ckpt/optimizer.safetensors" bs=1 seek=20000000 conv=notrunc status=none
if python3 "$SRC/tests/ckpt/checksum.py" "$TMP/ckpt" >"$TMP/out"; then
    echo "FAIL: the checker accepted a flipped byte"; exit 1
fi
grep -q "optimizer.safetensors: .* MISMATCH" "$TMP/out"
echo "PASS"
