# The killed-rank tests' job control, sourced by tests/examples/test_gpt_peer_death.sh (examples/gpt
# on 3 CPU processes) and tests/gpu/test_cuda_peer_death.sh (examples/cuda_mlp on the GPU):
#
#   PD_READY='^step' PD_READY_S=20 PD_WATCHDOG_S=40   rank 0's step line, its limit, the watchdog
#   . "$(dirname "$0")/../peer_death.sh"
#   pd_start JOB N [VAR=VALUE...] -- PROGRAM ARGS...   N ranks, returns once rank 0 logged a step
#   pd_signal KILL|STOP                                 rank 1 gets it after a random delay
#   pd_survivor JOB R [LIMIT_S]                         rank R exits 1 (within LIMIT_S)
#   pd_end                                              rank 1 and the watchdog are gone
#
# Defines $tmp (removed on exit), $pids, fail MSG (prints the seed, the delay and the tails of the
# ranks' output) and now / elapsed_since. Each rank's stdout and stderr are $tmp/JOB.R.out and
# $tmp/JOB.R.err; SEED=N repeats a run's delays.
: "${PD_READY:?set PD_READY, the regex of the first step line of rank 0}"
: "${PD_READY_S:?set PD_READY_S, how long rank 0 may take to log a step}"
: "${PD_WATCHDOG_S:?set PD_WATCHDOG_S, when a job still running is killed}"
tmp=$(mktemp -d "/tmp/accel_$(basename "$0" .sh)_XXXXXX")
pids=()
watchdog=
pd_cleanup() {
    [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap pd_cleanup EXIT
seed=${SEED:-$RANDOM}
RANDOM=$seed
delay=0

fail() {
    echo "FAIL (seed $seed, delay ${delay}s): $*"
    for f in "$tmp"/*.err "$tmp"/*.out; do [ -f "$f" ] && { echo "== $f"; tail -5 "$f"; }; done
    exit 1
}

now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# pd_start JOB N [VAR=VALUE...] -- PROGRAM ARGS...: N ranks of one machine with launcher
# variables, job id JOB and the extra environment; a watchdog kills them after PD_WATCHDOG_S.
pd_start() {
    local job=$1 n=$2 envs=()
    shift 2
    while [ "$1" != "--" ]; do
        envs+=("$1")
        shift
    done
    shift
    pids=()
    for ((r = 0; r < n; r++)); do
        env "${envs[@]}" RANK=$r WORLD_SIZE="$n" LOCAL_RANK=$r LOCAL_WORLD_SIZE="$n" \
            ACCEL_JOB_ID="$job" "$@" >"$tmp/$job.$r.out" 2>"$tmp/$job.$r.err" &
        pids+=($!)
    done
    (sleep "$PD_WATCHDOG_S"; kill -9 "${pids[@]}" 2>/dev/null) >/dev/null 2>&1 &
    watchdog=$!
    for _ in $(seq $((PD_READY_S * 10))); do
        grep -Eq "$PD_READY" "$tmp/$job.0.out" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "$job: rank 0 logged no step in $PD_READY_S s"
}

# pd_signal SIG: after a random delay in [0, 1) s, rank 1 gets SIG; pd_signalled is the time.
pd_signal() {
    delay=$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", r % 100 / 100 }')
    sleep "$delay"
    pd_signalled=$(now)
    kill -"$1" "${pids[1]}"
}

# pd_survivor JOB R [LIMIT_S]: rank R exits 1, not killed by the watchdog (and within LIMIT_S s
# of the signal when given; pd_took is the time it took).
pd_survivor() {
    local job=$1 r=$2 limit=${3:-} rc=0
    wait "${pids[$r]}" || rc=$?
    pd_took=$(elapsed_since "$pd_signalled")
    [ "$rc" -ne 137 ] || fail "$job: rank $r hung until the watchdog killed it"
    [ "$rc" -eq 1 ] || fail "$job: rank $r exited $rc (expected 1)"
    if [ -n "$limit" ]; then
        awk -v a="$pd_took" -v b="$limit" 'BEGIN { exit !(a <= b) }' ||
            fail "$job: rank $r took ${pd_took}s to exit (limit $limit s)"
    fi
}

# pd_end: rank 1 (killed or stopped) and the watchdog are gone before the next job.
pd_end() {
    kill -9 "${pids[1]}" 2>/dev/null
    wait "${pids[1]}" 2>/dev/null
    kill "$watchdog" 2>/dev/null
}
