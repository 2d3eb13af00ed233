#!/usr/bin/env bash
# Stopped and departing processes on gloo and hier (tests/comm/test_peer_death.sh does shm):
#  1. A stopped process (SIGSTOP, ACCEL_TIMEOUT=3) on gloo 2 x 1 and hier 2 x 2: every other
#     process fails with ETIMEDOUT within 12 s of the stop, naming it (before, gloo said "a
#     peer, -1"). Process 0 stopped (it serves the store) on gloo 3 x 1 and hier 2 x 2: within
#     7 s of the stop (about 4.8 s; before, recording the failure waited on the stopped store,
#     about 9 s). On hier, process 3 waits on process 1 across, and without the store to share
#     the diagnosis may name it.
#     Process 3 stopped before a broadcast from it, hier 2 x 2: process 1 waits across for it
#     while process 0 waits inside for process 1, alive. Every process must name process 3
#     (before, process 0 named process 1: its shm wait claimed the diagnosis before process 1's
#     gloo wait had run out; now a shm wait in hier on a live, unstopped process first waits
#     for that process's own diagnosis).
#  2. A process that calls exit(7) mid-loop without accel_free, gloo 2 x 1 and hier 2 x 2: the
#     others fail with EPEER naming it, within 10 s.
#  3. ACCEL_TIMEOUT=1e300 ("as long as it takes") on gloo 2 x 1 and hier 2 x 2: the job runs
#     (before, the overflowed milliseconds made Gloo refuse it, "Invalid timeout", and hier's
#     other machine waited forever).
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
machines_setup # $tmp; skips without gloo

fail() { machines_fail "$tmp/$1" "$1: $2"; } # name message

# 1 and 2. A stopped process, a process that exits: run by hand, each survivor timed.
now() { date +%s.%N; }
# A stopped process's limit counts from its stop (seen in /proc), an exiting one's from the start.
state() { awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null; } # pid: R, S, T, Z, ...
# ARGS: more arguments for allreduce_loop.
leave() { # name M L who how(stop|exit) status want limit_s [ENV=VALUE...]
    local name=$1 m=$2 l=$3 who=$4 how=$5 want_st=$6 want=$7 limit=$8
    shift 8
    mkdir -p "$tmp/$name"
    local extra=(--exit-rank "$who" --exit-code 7)
    [ "$how" = stop ] && extra=(--stop-rank "$who")
    local start
    start=$(now)
    machines_start "$tmp/$name" "$m" "$l" "$@" -- "$B/tests/progs/allreduce_loop" \
        --iters 1000000 --count 1000 --die-after 5 "${extra[@]}" ${ARGS:-}
    (sleep 60; kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null) >/dev/null 2>&1 &
    local watchdog=$!
    if [ "$how" = stop ]; then
        local tries=0 s
        while s=$(state "${MACHINE_PIDS[$who]}") && [ "$s" != T ]; do
            [ "$s" != Z ] && [ $((tries += 1)) -lt 1200 ] || fail "$name" "process $who did not stop"
            sleep 0.05
        done
        start=$(now)
    fi
    for r in $(seq 0 $((m * l - 1))); do
        [ "$r" -eq "$who" ] && continue
        wait "${MACHINE_PIDS[$r]}"
        local rc=$? t
        t=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
        local err="$tmp/$name/r$r.err"
        [ "$rc" -ne 0 ] || fail "$name" "process $r exited 0"
        [ "$rc" -ne 137 ] || fail "$name" "process $r hung"
        [ "$rc" -ne 3 ] || fail "$name" "process $r: the next call did not fail alike"
        grep -q "$want_st" "$err" || fail "$name" "process $r did not say $want_st"
        grep -q "$want" "$err" || fail "$name" "process $r did not say \"$want\""
        awk -v t="$t" -v l="$limit" 'BEGIN { exit !(t <= l) }' ||
            fail "$name" "process $r took ${t}s"
        echo "$name: process $r failed after ${t}s: $(grep -o "$want_st.*" "$err" | cut -c1-150)"
    done
    kill -9 "${MACHINE_PIDS[$who]}" 2>/dev/null
    wait "${MACHINE_PIDS[$who]}" 2>/dev/null
    kill "$watchdog" 2>/dev/null
}
# The exits' limits count from the start: setup, 5 iterations, then the failure.
leave stop-gloo-2x1 2 1 1 stop ETIMEDOUT "waiting for process 1 " 12 ACCEL_TIMEOUT=3
leave stop-hier-2x2 2 2 3 stop ETIMEDOUT "process 3 " 12 ACCEL_TIMEOUT=3
ARGS="--bcast-root 3" leave stop-bcast-hier-2x2 2 2 3 stop ETIMEDOUT "waiting for process 3 " 12 \
    ACCEL_TIMEOUT=3
leave stop0-gloo-3x1 3 1 0 stop ETIMEDOUT "waiting for process 0 " 7 ACCEL_TIMEOUT=3
leave stop0-hier-2x2 2 2 0 stop ETIMEDOUT "process [01] " 7 ACCEL_TIMEOUT=3
leave exit-gloo-2x1 2 1 1 exit EPEER "process 1 " 10 ACCEL_TIMEOUT=60
leave exit-hier-2x2 2 2 3 exit EPEER "process 3 \|rank 3 " 10 ACCEL_TIMEOUT=60

# 3. A huge timeout.
for cfg in "gloo 2 1" "hier 2 2"; do
    set -- $cfg
    name=huge-timeout-$1-$2x$3
    mkdir -p "$tmp/$name"
    machines_start "$tmp/$name" "$2" "$3" ACCEL_TIMEOUT=1e300 -- "$B/tests/progs/allreduce_loop" \
        --iters 20 --count 1000
    machines_wait 60 || fail "$name" "a job with ACCEL_TIMEOUT=1e300 failed"
    echo "$name: ok"
done
echo "test_comm_peers: ok"
