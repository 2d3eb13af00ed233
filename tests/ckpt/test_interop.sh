#!/usr/bin/env bash
# safetensors interop with the reference Python package: our files load with
# safetensors.numpy.load_file (values, metadata, byte-identical to the reference writer), and
# files written by Python load here with the same names, dtypes, shapes, bytes and metadata.
# Skips (77) when numpy/safetensors are absent and cannot be installed (offline).
set -euo pipefail
BUILD=${ACCEL_BUILD_DIR:-build}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TOOL=$BUILD/tests/progs/st_tool
PY=$SRC/tests/ckpt/interop.py

. "$SRC/tests/pyenv.sh"
accel_need_python 'import numpy, safetensors' numpy safetensors || exit 77
[ -x "$TOOL" ] || { echo "test_interop: $TOOL not built" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# accel -> Python
"$TOOL" write "$TMP/all.safetensors" "$TMP/np.safetensors"
python3 "$PY" check-ours "$TMP/all.safetensors" "$TMP/np.safetensors"
# Both sides describe our file identically.
"$TOOL" dump "$TMP/all.safetensors" > "$TMP/c_all.txt"
python3 "$PY" dump "$TMP/all.safetensors" > "$TMP/py_all.txt"
diff -u "$TMP/py_all.txt" "$TMP/c_all.txt"

# Python -> accel
python3 "$PY" write "$TMP/py.safetensors"
"$TOOL" dump "$TMP/py.safetensors" > "$TMP/c_py.txt"
python3 "$PY" dump "$TMP/py.safetensors" > "$TMP/py_py.txt"
diff -u "$TMP/py_py.txt" "$TMP/c_py.txt"
grep -q '^step I64 \[\] ' "$TMP/c_py.txt"
grep -q '^nothing F32 \[0,4\] ' "$TMP/c_py.txt"
grep -q '^meta source=python é$' "$TMP/c_py.txt"
grep -q '^token_ids U32 \[3\] ' "$TMP/c_py.txt"
grep -q '^offsets U64 \[2\] ' "$TMP/c_py.txt"
grep -q '^phase C64 \[2\] ' "$TMP/c_py.txt"
[ "$(grep -c -v '^meta' "$TMP/c_py.txt")" -eq 15 ]
echo "test_interop: ok"
