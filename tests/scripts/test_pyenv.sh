#!/usr/bin/env bash
# tests/pyenv.sh, the Python environment of the interop tests: it lives outside the build tree
# (ACCEL_PYENV_DIR, else XDG_CACHE_HOME or ~/.cache), is made once with a one-line message and
# then reused, and ACCEL_NO_PYTHON=1 makes the interop tests skip with a message, creating
# nothing. `bash tests/pyenv.sh notice` (make test) says where the environment will go.
set -euo pipefail
src=${ACCEL_SOURCE_DIR:?}
tmp=$(mktemp -d /tmp/accel-pyenv-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Each check runs in a fresh shell with only the variables it names.
py() {
    env -i PATH="$PATH" ACCEL_BUILD_DIR="$tmp/build" "$@" bash -c '. "$0"; eval "$1"' \
        "$src/tests/pyenv.sh" "$CODE"
}

CODE='accel_pyenv_dir'
[ "$(py HOME="$tmp/home")" = "$tmp/home/.cache/accel/pyenv" ] ||
    fail "default: $(py HOME="$tmp/home")"
[ "$(py HOME="$tmp/home" XDG_CACHE_HOME="$tmp/xdg")" = "$tmp/xdg/accel/pyenv" ] ||
    fail "XDG_CACHE_HOME"
[ "$(py HOME="$tmp/home" ACCEL_PYENV_DIR="$tmp/mine")" = "$tmp/mine" ] || fail "ACCEL_PYENV_DIR"

# Opted out: a SKIP line, status 1, nothing created; an interop test skips with 77.
CODE='accel_need_python "import sys" && echo USED'
out=$(py ACCEL_NO_PYTHON=1 ACCEL_PYENV_DIR="$tmp/env") &&
    fail "ACCEL_NO_PYTHON=1 still uses Python: $out"
grep -q '^SKIP: ACCEL_NO_PYTHON=1' <<<"$out" || fail "no skip message: $out"
[ ! -e "$tmp/env" ] || fail "ACCEL_NO_PYTHON=1 created $tmp/env"
rc=0
out=$(ACCEL_NO_PYTHON=1 ACCEL_BUILD_DIR="$tmp/build" ACCEL_PYENV_DIR="$tmp/env" \
    bash "$src/tests/track/test_tensorboard.sh" 2>&1) || rc=$?
[ "$rc" -eq 77 ] && grep -q 'SKIP: ACCEL_NO_PYTHON' <<<"$out" ||
    fail "test_tensorboard: rc $rc: $out"

# The notice of make test: where, while the environment does not exist.
CODE='bash "$0" notice'
out=$(py HOME="$tmp/home" ACCEL_PYENV_DIR="$tmp/env")
[ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "into $tmp/env; ACCEL_PYENV_DIR" <<<"$out" ||
    fail "notice: $out"
out=$(py ACCEL_NO_PYTHON=1)
grep -q 'will skip' <<<"$out" || fail "notice with ACCEL_NO_PYTHON=1: $out"

# Made once, with one line, then reused. The statement holds only inside a virtual
# environment, so the system python3 never satisfies it; no package is needed (offline).
python3 -c 'import venv, ensurepip' 2>/dev/null ||
    { echo "SKIP: python3 has no venv/ensurepip"; exit 77; }
CODE='accel_need_python "import sys; assert sys.prefix != sys.base_prefix" && command -v python3'
out=$(py HOME="$tmp/home" ACCEL_PYENV_DIR="$tmp/env")
[ "$(grep -c '^pyenv: creating a Python virtual environment in '"$tmp/env" <<<"$out")" -eq 1 ] ||
    fail "first use: $out"
[ "$(tail -1 <<<"$out")" = "$tmp/env/bin/python3" ] ||
    fail "python3 on PATH is not the environment's: $out"
touch "$tmp/env/marker"
out=$(py HOME="$tmp/home" ACCEL_PYENV_DIR="$tmp/env")
[ "$out" = "$tmp/env/bin/python3" ] && [ -e "$tmp/env/marker" ] ||
    fail "second use did not reuse it: $out"
CODE='bash "$0" notice'
[ -z "$(py ACCEL_PYENV_DIR="$tmp/env")" ] || fail "notice for an existing environment"
echo "PASS: pyenv location, opt-out, notice, made once and reused"
