#!/usr/bin/env bash
# Faults across "machines" (issue 16): a process of the second machine SIGKILLs itself in the
# middle of an allreduce loop (tests/progs/allreduce_loop). Every other process must exit with
# an error within 10 s of the death, saying EPEER and naming the dead process:
#  - gloo, 2 machines x 1 process, process 1 dies (large messages: inside the data exchange);
#  - gloo, 3 machines x 1 process, process 2 dies (5 MiB messages: the pipelined allreduce's
#    schedule, two receives posted at a time);
#  - hier, 2 machines x 2 processes, process 3 dies (4 MiB messages: the pipelined path, with
#    the cross-machine worker busy when the death is seen);
#  - the same with asynchronous allreduces (the failure travels to the waiter);
#  - gloo 3 x 1 and hier 2 x 2 started by hand, machine 1 given an interface that does not
#    exist (ACCEL_SOCKET_IFNAME): every process fails at setup within 10 s (not at the
#    deadline), naming the interface and a process of machine 1. In gloo 3 x 1, process 2,
#    started a moment after the others, reads the failure from process 0's store after process
#    0 has learnt it (process 0 waits for the others to learn it before it returns and its
#    program exits, taking the store along). In hier 2 x 2, a process of machine 1 whose shm
#    level fails (its neighbour's gloo failure aborted it) tells its gloo rendezvous too;
#  - gloo 3 x 1 by hand with process 1 never started: processes 0 and 2 fail at the deadline
#    with ETIMEDOUT saying that process 1 never arrived, and naming the key it did not set.
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
machines_setup # $tmp; skips without gloo

now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# In the background: writes to FILE the time process PID dies (gone, or a zombie not yet
# reaped), polling for at most 30 s. The time limits count from the death, not from the start:
# setting up 4 processes takes seconds of its own on a loaded machine.
watch_death() { # PID FILE
    for _ in $(seq 600); do
        case "$(ps -o stat= -p "$1")" in
        "" | Z*) now >"$2"; return ;;
        esac
        sleep 0.05
    done
}

# On a failure: why, each process's exit status and stderr.
fail_case() { # name message
    echo "FAIL: $1: $2"
    for r in "${!MACHINE_PIDS[@]}"; do
        echo "== process $r (exit ${rcs[$r]:-?}):"
        cat "$tmp/$1/r$r.err"
    done
    exit 1
}

case_kill() { # name M L dead count async
    local name=$1 m=$2 l=$3 dead=$4 count=$5 async=$6
    mkdir -p "$tmp/$name"
    machines_start "$tmp/$name" "$m" "$l" -- "$B/tests/progs/allreduce_loop" --iters 1000000 \
        --count "$count" --die-rank "$dead" --die-after 5 --async "$async"
    watch_death "${MACHINE_PIDS[$dead]}" "$tmp/$name.death" &
    local watcher=$!
    (sleep 30; kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null) >/dev/null 2>&1 &
    local watchdog=$!
    rcs=()
    local ends=()
    for r in $(seq 0 $((m * l - 1))); do
        [ "$r" -eq "$dead" ] && continue
        wait "${MACHINE_PIDS[$r]}"
        rcs[$r]=$?
        ends[$r]=$(now)
    done
    wait "${MACHINE_PIDS[$dead]}" 2>/dev/null
    rcs[$dead]=$?
    wait "$watcher"
    kill "$watchdog" 2>/dev/null
    [ -s "$tmp/$name.death" ] || fail_case "$name" "process $dead did not die within 30 s"
    for r in $(seq 0 $((m * l - 1))); do
        [ "$r" -eq "$dead" ] && continue
        local rc=${rcs[$r]} t err="$tmp/$name/r$r.err"
        # (the watcher polls: it may see the death late)
        t=$(awk -v a="$(cat "$tmp/$name.death")" -v b="${ends[$r]}" \
            'BEGIN { printf "%.2f", (b > a ? b - a : 0) }')
        [ "$rc" -ne 0 ] || fail_case "$name" "process $r exited 0"
        [ "$rc" -ne 137 ] || fail_case "$name" "process $r hung"
        [ "$rc" -ne 3 ] || fail_case "$name" "process $r: the next call did not fail alike"
        awk -v t="$t" 'BEGIN { exit !(t <= 10) }' ||
            fail_case "$name" "process $r took ${t}s after process $dead died"
        grep -q EPEER "$err" || fail_case "$name" "process $r did not say EPEER"
        grep -q "process $dead " "$err" || fail_case "$name" "process $r did not name process $dead"
        echo "$name: process $r failed ${t}s after process $dead died:" \
            "$(grep -o 'EPEER.*' "$err" | cut -c1-160)"
    done
}

case_kill gloo-2x1 2 1 1 262144 0
case_kill gloo-3x1 3 1 2 1310723 0
case_kill hier-2x2 2 2 3 1048576 0
case_kill hier-2x2-async 2 2 3 1048576 1
# case_ifname NAME M L CULPRITS LATE: M machines x L processes started by hand (process 0 serves
# the store), machine 1's given an interface that does not exist: each publishes its setup
# failure, which ends the others' wait. Every process must fail within 10 s (not at the
# deadline) naming the interface and a process of CULPRITS (a grep bracket); process LATE (-1:
# none) starts 0.25 s after the others.
case_ifname() {
    local name=$1 m=$2 l=$3 culprits=$4 late=$5 port start t
    port=$("$B/tests/progs/free_port")
    start=$(now)
    pids=()
    for r in $(seq 0 $((m * l - 1))); do
        local g=$((r / l)) extra=()
        [ "$g" = 1 ] && extra=(ACCEL_SOCKET_IFNAME=nosuch0)
        [ "$r" = "$late" ] && sleep 0.25 # (passes however late, up to 5 s)
        env RANK=$r WORLD_SIZE=$((m * l)) LOCAL_RANK=$((r % l)) LOCAL_WORLD_SIZE=$l \
            GROUP_RANK=$g ACCEL_NUM_MACHINES=$m MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
            ACCEL_TIMEOUT=60 "${extra[@]}" "$B/tests/progs/allreduce_loop" --iters 5 \
            >"$tmp/$name.$r.err" 2>&1 &
        pids+=($!)
    done
    for r in $(seq 0 $((m * l - 1))); do
        wait "${pids[$r]}" && { echo "FAIL: $name: process $r succeeded"; exit 1; }
        grep -q "process $culprits could not connect.*nosuch0" "$tmp/$name.$r.err" || {
            echo "FAIL: $name: process $r did not name process $culprits and nosuch0"
            cat "$tmp/$name.$r.err"
            exit 1
        }
    done
    t=$(elapsed_since "$start")
    awk -v t="$t" 'BEGIN { exit !(t <= 10) }' || { echo "FAIL: $name: took ${t}s"; exit 1; }
    echo "$name: the $((m * l)) processes failed after ${t}s naming machine 1's interface"
}
case_ifname ifname-gloo-3x1 3 1 1 2
case_ifname ifname-hier-2x2 2 2 "[23]" -1
# gloo 3 x 1 by hand, process 1 never started (ACCEL_TIMEOUT=1): processes 0 and 2 fail with
# ETIMEDOUT saying that process 1 never arrived, and the key it never set (process 0 waits for
# its Gloo address, ".../1", process 2 for its host name, ".../rank_1"). Before, they named
# only the key.
port=$("$B/tests/progs/free_port")
pids=()
for r in 0 2; do
    env RANK=$r WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=$r ACCEL_NUM_MACHINES=3 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" ACCEL_TIMEOUT=1 \
        "$B/tests/progs/allreduce_loop" --iters 5 >"$tmp/absent.$r.err" 2>&1 &
    pids[$r]=$!
done
for r in 0 2; do
    wait "${pids[$r]}" && { echo "FAIL: absent: process $r succeeded"; exit 1; }
    grep -q 'ETIMEDOUT: .*process 1 never arrived .*rendezvous timed out after 1 s: .*key "[^"]*/\(rank_\)\?1" ' \
        "$tmp/absent.$r.err" || {
        echo "FAIL: absent: process $r did not time out naming process 1 and its key"
        cat "$tmp/absent.$r.err"
        exit 1
    }
    echo "absent: $(cut -c1-250 "$tmp/absent.$r.err")"
done
echo "test_gloo_faults: ok"
