# Sourced by the multi-machine tests: starts a job of M "machines" x L processes on this host.
#
#   machines_launch DIR M L [ENV=VALUE...] -- PROG ARGS...  M launchers, `accel launch
#        --num_machines M --machine_rank m --main_process_ip 127.0.0.1` (machine 0's serves the
#        store); launcher m's output in DIR/m<m>.out and .err; after machines_wait, rank 0's
#        stdout lines (without the "[rank0]: " prefix) in DIR/r0.out
#   machines_start DIR M L [ENV=VALUE...] -- PROG ARGS...   the processes by hand, each with the
#        environment a multi-machine accel launch gives it (RANK, WORLD_SIZE, LOCAL_RANK,
#        LOCAL_WORLD_SIZE, GROUP_RANK, ACCEL_NUM_MACHINES, MASTER_ADDR, MASTER_PORT), process 0
#        serving the store; output in DIR/r<rank>.out and .err (the fault tests time each
#        process)
#   gloo_built                                              (else says why it skips)
#   machines_setup      a test's start: exits 77 without gloo, else makes $tmp, a folder that
#                       an exit trap removes after killing the machines' processes
#   machines_wait LIMIT_S                                   (0 when every process exited 0;
#                                                            kills them all after LIMIT_S)
#   machines_fail DIR MESSAGE                               FAIL: MESSAGE, the last lines of
#                                                            each of DIR's files, exit 1
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
MACHINE_PIDS=()
MACHINE_DIR=

# 0 when this build has the gloo backend (else the tests skip, saying so).
gloo_built() {
    if "$B/accel" env 2>/dev/null | grep -q "Communication backends:.*gloo"; then
        return 0
    fi
    echo "skip: this build has no gloo backend (apt-get install libgloo-dev, then rebuild)"
    return 1
}

machines_setup() {
    gloo_built || exit 77
    tmp=$(mktemp -d)
    trap 'kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
}

machines_start() {
    local dir=$1 m=$2 l=$3
    shift 3
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local port
    port=$("$B/tests/progs/free_port") || return 1
    MACHINE_PIDS=()
    MACHINE_DIR=
    for g in $(seq 0 $((m - 1))); do
        for lr in $(seq 0 $((l - 1))); do
            local r=$((g * l + lr))
            env RANK=$r WORLD_SIZE=$((m * l)) LOCAL_RANK=$lr LOCAL_WORLD_SIZE=$l GROUP_RANK=$g \
                ACCEL_NUM_MACHINES=$m MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${envs[@]}" \
                "$@" >"$dir/r$r.out" 2>"$dir/r$r.err" &
            MACHINE_PIDS+=($!)
        done
    done
}

machines_launch() {
    local dir=$1 m=$2 l=$3
    shift 3
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local port
    port=$("$B/tests/progs/free_port") || return 1
    MACHINE_PIDS=()
    MACHINE_DIR=$dir
    for g in $(seq 0 $((m - 1))); do
        env "${envs[@]}" "$B/accel" launch --num_machines "$m" --machine_rank "$g" \
            --main_process_ip 127.0.0.1 --main_process_port "$port" --num_processes $((m * l)) \
            "$@" >"$dir/m$g.out" 2>"$dir/m$g.err" &
        MACHINE_PIDS+=($!)
    done
}

machines_wait() {
    local limit=$1 rc=0
    (sleep "$limit"; kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null) >/dev/null 2>&1 &
    local watchdog=$!
    for p in "${MACHINE_PIDS[@]}"; do
        wait "$p" || rc=1
    done
    kill "$watchdog" 2>/dev/null
    if [ -n "$MACHINE_DIR" ]; then
        sed -n 's/^\[rank0\]: //p' "$MACHINE_DIR/m0.out" >"$MACHINE_DIR/r0.out"
        MACHINE_DIR=
    fi
    return $rc
}

machines_fail() {
    echo "FAIL: $2"
    for f in "$1"/*; do echo "== $f"; tail -n 20 "$f"; done
    exit 1
}
