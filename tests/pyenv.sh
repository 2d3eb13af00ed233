# Sourced by the tests that check accel's files with the real Python tools (safetensors,
# tensorboard, mlflow).
#
#   accel_need_python 'import numpy, safetensors' numpy safetensors || { echo SKIP...; exit 77; }
#
# Makes `python3` on PATH a Python that can run the import statement: the system one when it
# already can, else a virtual environment under $ACCEL_BUILD_DIR/pyenv (made once, shared by
# the tests under a lock, since ctest runs them in parallel) where the packages are installed
# with pip. Debian's own python3 refuses system-wide pip installs (PEP 668), hence the venv.
# Returns 1 when neither works (offline, no venv module): the caller skips with exit 77.
accel_need_python() {
    local stmt=$1
    shift
    python3 -c "$stmt" 2>/dev/null && return 0
    local venv=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}/pyenv
    (
        flock 9
        [ -x "$venv/bin/python3" ] || python3 -m venv "$venv" >/dev/null 2>&1 || exit 1
        "$venv/bin/python3" -c "$stmt" 2>/dev/null ||
            "$venv/bin/python3" -m pip install --quiet "$@" >/dev/null 2>&1
    ) 9>"$ACCEL_BUILD_DIR/pyenv.lock" || true
    [ -x "$venv/bin/python3" ] && "$venv/bin/python3" -c "$stmt" 2>/dev/null || return 1
    export PATH="$venv/bin:$PATH"
}
