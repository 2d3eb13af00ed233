#!/usr/bin/env bash
# A process stopped on ANOTHER machine is named by its missing heartbeat (issue 14): two
# "machines" on this host (two accel launch, --num_machines 2 --main_process_ip 127.0.0.1), 2
# processes each of examples/cuda_mlp on the nccl backend, a GPU per process, ACCEL_TIMEOUT=2.
# Once process 0 has logged a step, process 3 (machine 1) gets SIGSTOP. Its TCP connections
# stay up (the kernel answers for it) and machine 0 cannot see it in /proc (the launcher says
# it is on another machine), so only the heartbeats through the job's store can name it:
# machine 0 must stop within 15 s of the signal with an error of the nccl backend naming
# "process 3 (pid P) on host H: no heartbeat for" (ETIMEDOUT, or EPEER where a peer's abort for
# the stall reached it first), and name no live process; both launchers end.
# Runs in the CUDA emulator build's "/nccl" variant (ACCEL_CUEMU_DEVICES: emulated GPUs private
# to each process); elsewhere it exits 77: two "machines" on one host share its GPUs, which
# NCCL refuses.
# ACCEL_TEST_LABELS: nccl
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR is not set}
EX=$B/examples/cuda_mlp
FREE=$B/tests/progs/free_port
if [ ! -x "$EX" ]; then
    echo "SKIP: $EX is not built (configure with -DACCEL_CUDA=ON)"
    exit 77
fi
if [ -z "${ACCEL_CUEMU_DEVICES:-}" ]; then
    echo "SKIP: two machines on one host would share its GPUs (runs in the emulator build's /nccl)"
    exit 77
fi
T=$(mktemp -d /tmp/accel_stop_machines_XXXXXX)
pids=
victim=
cleanup() {
    [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$T"/*.out "$T"/*.err; do [ -s "$f" ] && { echo "---- $f"; tail -15 "$f"; }; done
    exit 1
}
now() { date +%s.%N; }

port=$("$FREE")
export OMP_NUM_THREADS=1 ACCEL_TIMEOUT=2 ACCEL_LOG_LEVEL=info
for m in 1 0; do
    "$ACCEL_BUILD_DIR/accel" launch --num_machines 2 --main_process_ip 127.0.0.1 \
        --main_process_port "$port" --machine_rank $m -n 4 \
        "$EX" --steps 100000000 --log_every 1 >"$T/m$m.out" 2>"$T/m$m.err" &
    eval "pid_m$m=$!"
    pids="$pids $!"
done
(sleep 90; kill -9 $pids 2>/dev/null) >/dev/null 2>&1 &
pids="$pids $!"
disown $!
for _ in $(seq 600); do
    grep -q "step [0-9]* loss" "$T/m0.out" 2>/dev/null && break
    sleep 0.1
done
grep -q "step [0-9]* loss" "$T/m0.out" || fail "process 0 logged no step in 60 s"
grep -q "backend nccl" "$T/m0.err" "$T/m0.out" || fail "process 0 did not run on nccl"
# Process 3: the child of machine 1's launcher whose RANK is 3.
for p in $(pgrep -P "$pid_m1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx RANK=3 && victim=$p
done
[ -n "$victim" ] || fail "no process with RANK=3 under machine 1's launcher"
sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", r % 100 / 100 }')"
t0=$(now)
kill -STOP "$victim"
wait "$pid_m0"
rc0=$?
took=$(echo "$(now) - $t0" | bc)
[ "$rc0" != 0 ] && [ "$rc0" != 137 ] || fail "machine 0's launcher exited $rc0"
[ "$(echo "$took < 15" | bc)" = 1 ] || fail "machine 0 took $took s to stop"
line=$(grep -hE ": (ETIMEDOUT|EPEER): .*process 3 \(pid $victim\) on host [^:]*: no heartbeat for" \
    "$T/m0.err" "$T/m0.out" | head -1)
[ -n "$line" ] || fail "no error naming process 3 (pid $victim) by its heartbeat on machine 0"
echo "$line" | grep -q "nccl: " || fail "the error does not come from the nccl backend: $line"
if echo "$line" | grep -Eq "process [012] \(pid [0-9]+\) on host [^:]*: no heartbeat"; then
    fail "a live process was named: $line"
fi
wait "$pid_m1"
echo "machine 0 stopped after ${took}s: ${line#*: }"
echo "PASS"
