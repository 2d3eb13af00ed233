#!/usr/bin/env bash
# What a launcher says when one of its own processes is stopped (kill -STOP), and when a stop
# signal reaches it after its processes ended (docs/launch.md, "Failures"):
#  1. One machine, -n 2, rank 1 stops itself (SIGSTOP) in an all-reduce loop: rank 0 times out
#     (ACCEL_TIMEOUT=2), and the launcher names the stopped rank ("rank 1 (pid P) is stopped
#     (SIGSTOP)") before its "rank 0 failed" line; it used to name only rank 0's failure. The
#     stopped process is gone when the launcher has exited.
#  2. Two machines x 1 process (gloo), machine 0's rank stops itself: machine 1's rank times out
#     and fails first, and machine 0's launcher, which reports that failure, also names its own
#     stopped rank (it used to say only "rank 1 on machine 1 failed"). Nothing is left.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
FREE=$B/tests/progs/free_port
AR=("$B/tests/progs/allreduce_loop" --iters 100000000 --count 1000)
[ -x "$ACCEL" ] && [ -x "$FREE" ] && [ -x "${AR[0]}" ] || { echo "missing build outputs"; exit 1; }
source "$(dirname "$0")/launch_common.sh" # has, scratch, fail, bg, finish, now, elapsed
scratch

# A process is alive when /proc has it and it is not a zombie.
alive() { [ -e "/proc/$1" ] && ! grep -q ') Z' "/proc/$1/stat" 2>/dev/null; }

# stopped_pid FILE RANK: the pid in FILE's "rank RANK (pid P) is stopped (SIGSTOP)" line.
stopped_pid() {
    sed -n "s/^accel launch: rank $2 (pid \([0-9]*\)) is stopped (SIGSTOP) for .*/\1/p" "$1"
}

# ---- 1. one machine ----
ACCEL_TIMEOUT=2 timeout -k 5 60 "$ACCEL" launch -n 2 "${AR[@]}" --stop-rank 1 --die-after 3 \
    >"$T/a.out" 2>"$T/a.err"
rc=$?
[ "$rc" = 1 ] || fail "1: the launcher exited $rc, expected 1"
p=$(stopped_pid "$T/a.err" 1)
[ -n "$p" ] || fail "1: the launcher did not name its stopped rank 1"
# Said before the failure line.
grep -n -e "is stopped (SIGSTOP)" -e "accel launch: rank 0 failed" "$T/a.err" | head -n 1 |
    grep -q "is stopped" || fail "1: the stopped rank is named after the failure line"
alive "$p" && fail "1: the stopped rank (pid $p) outlived its launcher"
echo "ok: one machine: the launcher names its stopped rank (pid $p), which is gone"

# ---- 2. two machines: the first failure is the other machine's rank ----
port=$("$FREE")
K=(--main_process_ip 127.0.0.1 --main_process_port "$port" --num_machines 2 -n 2
    --rdzv_conf timeout=20)
for m in 0 1; do
    ACCEL_TIMEOUT=2 ACCEL_BACKEND=gloo bg "m$m" timeout -k 5 60 "$ACCEL" launch "${K[@]}" \
        --machine_rank "$m" "${AR[@]}" --stop-rank 0 --die-after 3
done
finish m0
finish m1
[ "$rc_m0" = 1 ] && [ "$rc_m1" = 1 ] || fail "2: the launchers exited $rc_m0, $rc_m1"
has "$T/m0.err" "stopping: rank 1 on machine 1" || fail "2: machine 0 did not report rank 1"
p=$(stopped_pid "$T/m0.err" 0)
[ -n "$p" ] || fail "2: machine 0's launcher did not name its stopped rank 0"
alive "$p" && fail "2: the stopped rank (pid $p) outlived its launcher"
echo "ok: two machines: machine 0 names its stopped rank (pid $p) besides rank 1's failure"
echo "PASS"
