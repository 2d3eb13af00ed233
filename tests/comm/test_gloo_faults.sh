#!/usr/bin/env bash
# Faults across "machines" (issue 16): a process of the second machine SIGKILLs itself in the
# middle of an allreduce loop (tests/progs/allreduce_loop). Every other process must exit with
# an error within 10 s, saying EPEER and naming the dead process:
#  - gloo, 2 machines x 1 process, process 1 dies (large messages: inside the data exchange);
#  - hier, 2 machines x 2 processes, process 3 dies (4 MiB messages: the pipelined path, with
#    the cross-machine worker busy when the death is seen);
#  - the same with asynchronous allreduces (the failure travels to the waiter);
#  - machine 1 given an interface that does not exist (ACCEL_SOCKET_IFNAME): both processes
#    fail at setup within 10 s, machine 0's too (not at the deadline), naming process 1 and
#    the interface.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
gloo_built || exit 77
tmp=$(mktemp -d)
trap 'kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT

now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

case_kill() { # name M L dead count async
    local name=$1 m=$2 l=$3 dead=$4 count=$5 async=$6
    mkdir -p "$tmp/$name"
    machines_start "$tmp/$name" "$m" "$l" -- "$B/tests/progs/allreduce_loop" --iters 1000000 \
        --count "$count" --die-rank "$dead" --die-after 5 --async "$async"
    local start
    start=$(now)
    (sleep 30; kill -9 "${MACHINE_PIDS[@]}" 2>/dev/null) >/dev/null 2>&1 &
    local watchdog=$!
    for r in $(seq 0 $((m * l - 1))); do
        [ "$r" -eq "$dead" ] && continue
        wait "${MACHINE_PIDS[$r]}"
        local rc=$? t
        t=$(elapsed_since "$start")
        local err="$tmp/$name/r$r.err"
        [ "$rc" -ne 0 ] || { echo "FAIL: $name: process $r exited 0"; cat "$err"; exit 1; }
        [ "$rc" -ne 137 ] || { echo "FAIL: $name: process $r hung"; cat "$err"; exit 1; }
        [ "$rc" -ne 3 ] || { echo "FAIL: $name: process $r: the next call did not fail alike"; exit 1; }
        awk -v t="$t" 'BEGIN { exit !(t <= 10) }' ||
            { echo "FAIL: $name: process $r took ${t}s"; exit 1; }
        grep -q EPEER "$err" || { echo "FAIL: $name: process $r did not say EPEER"; cat "$err"; exit 1; }
        grep -q "process $dead " "$err" ||
            { echo "FAIL: $name: process $r did not name process $dead"; cat "$err"; exit 1; }
        echo "$name: process $r failed after ${t}s: $(grep -o 'EPEER.*' "$err" | cut -c1-160)"
    done
    wait "${MACHINE_PIDS[$dead]}" 2>/dev/null
    kill "$watchdog" 2>/dev/null
}

case_kill gloo-2x1 2 1 1 262144 0
case_kill hier-2x2 2 2 3 1048576 0
case_kill hier-2x2-async 2 2 3 1048576 1
# A wrong interface on machine 1: it publishes its setup failure, which ends machine 0's wait.
port=$("$B/tests/progs/free_port")
start=$(now)
pids=()
for r in 0 1; do
    extra=()
    [ "$r" = 1 ] && extra=(ACCEL_SOCKET_IFNAME=nosuch0)
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$port" ACCEL_TIMEOUT=60 "${extra[@]}" "$B/tests/progs/allreduce_loop" \
        --iters 5 >"$tmp/ifname.$r.err" 2>&1 &
    pids+=($!)
done
for r in 0 1; do
    wait "${pids[$r]}" && { echo "FAIL: ifname: process $r succeeded"; exit 1; }
    grep -q "process 1 could not connect.*nosuch0" "$tmp/ifname.$r.err" ||
        { echo "FAIL: ifname: process $r did not name process 1 and nosuch0"; cat "$tmp/ifname.$r.err"; exit 1; }
done
t=$(elapsed_since "$start")
awk -v t="$t" 'BEGIN { exit !(t <= 10) }' || { echo "FAIL: ifname: took ${t}s"; exit 1; }
echo "ifname: both processes failed after ${t}s naming process 1's interface"
echo "test_gloo_faults: ok"
