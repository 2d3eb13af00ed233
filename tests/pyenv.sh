# The Python used by the tests that check accel's files with the real Python tools
# (safetensors, TensorBoard, MLflow). Sourced by those tests:
#
#   accel_need_python 'import numpy, safetensors' numpy safetensors || exit 77
#
# Makes `python3` on PATH a Python that can run the import statement: the system one when it
# already can, else a virtual environment where the packages are installed with pip (Debian's
# python3 refuses system-wide pip installs, PEP 668). The environment lives outside the build
# tree, so it is made once (about 300 MB with every test's packages) and reused by later
# builds, worktrees and `make clean`:
#   ACCEL_PYENV_DIR   its folder (default ${XDG_CACHE_HOME:-~/.cache}/accel/pyenv)
#   ACCEL_NO_PYTHON=1 never use Python: these tests skip, saying so
# Returns 1 after printing "SKIP: <why>" when Python cannot be used; the caller exits 77.
#
# Run as a script (`bash tests/pyenv.sh notice`, from make test), it prints one line saying
# where the environment will be made, when it does not exist yet, or that these tests skip.

accel_pyenv_dir() {
    if [ -n "${ACCEL_PYENV_DIR:-}" ]; then
        echo "$ACCEL_PYENV_DIR"
    elif [ -n "${XDG_CACHE_HOME:-}" ] || [ -n "${HOME:-}" ]; then
        echo "${XDG_CACHE_HOME:-$HOME/.cache}/accel/pyenv"
    else
        echo "${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}/pyenv"
    fi
}

accel_no_python() {
    case "${ACCEL_NO_PYTHON:-}" in "" | 0 | no | false) return 1 ;; *) return 0 ;; esac
}

accel_need_python() {
    local stmt=$1
    shift
    if accel_no_python; then
        echo "SKIP: ACCEL_NO_PYTHON=$ACCEL_NO_PYTHON: not checking with Python ($stmt)"
        return 1
    fi
    python3 -c "$stmt" 2>/dev/null && return 0
    local venv
    venv=$(accel_pyenv_dir)
    mkdir -p "$(dirname "$venv")" || { echo "SKIP: cannot create $(dirname "$venv")"; return 1; }
    # One test at a time makes or extends the environment (ctest runs tests in parallel).
    (
        flock 9
        if [ ! -x "$venv/bin/python3" ]; then
            echo "pyenv: creating a Python virtual environment in $venv for the interop tests" \
                "(reused later; ACCEL_PYENV_DIR moves it, ACCEL_NO_PYTHON=1 skips these tests)"
            python3 -m venv "$venv" >/dev/null 2>&1 || { rm -rf "$venv"; exit 1; }
        fi
        if ! "$venv/bin/python3" -c "$stmt" 2>/dev/null && [ $# -gt 0 ]; then
            echo "pyenv: pip install $* into $venv"
            "$venv/bin/python3" -m pip install --quiet "$@" >/dev/null 2>&1
        fi
    ) 9>"$venv.lock" || true
    if [ -x "$venv/bin/python3" ] && "$venv/bin/python3" -c "$stmt" 2>/dev/null; then
        export PATH="$venv/bin:$PATH"
        return 0
    fi
    echo "SKIP: python3 cannot run '$stmt' and installing ${*:-nothing} into $venv failed" \
        "(offline, or no venv module?)"
    return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = notice ]; then
    if accel_no_python; then
        echo "ACCEL_NO_PYTHON=$ACCEL_NO_PYTHON:" \
            "the tests that check files with Python tools will skip"
    elif [ ! -x "$(accel_pyenv_dir)/bin/python3" ]; then
        echo "The interop tests may install numpy, safetensors, tensorboard and mlflow (about" \
            "300 MB, once) into $(accel_pyenv_dir); ACCEL_PYENV_DIR moves it, ACCEL_NO_PYTHON=1" \
            "skips those tests"
    fi
fi
