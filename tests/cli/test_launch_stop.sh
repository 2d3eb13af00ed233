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
#     b. Machine 1's rank stops itself: machine 0's last line names it ("machine 0: on machine
#        1, rank 1 (pid P) is stopped (SIGSTOP) for ..."), published by machine 1's launcher;
#        only machine 1's launcher used to name it.
#  3. A stop signal after the processes ended, which used to end the launcher silently with the
#     default action; now it says so and exits 128 + the signal:
#     a. one machine, --max_restarts 1 --monitor_interval 60: SIGTERM in the pause between
#        restarts ("interrupted by SIGTERM during the pause between restarts");
#     b. two machines: machine 0's process ended, SIGTERM while machine 0 waits for machine 1
#        to finish: machine 0 says so, and machine 1 stops its process naming machine 0's
#        interrupt (it used to see only the store vanish);
#     c. two machines, --max_restarts 1 --monitor_interval 60, SIGTERM to machine 1 in the
#        pause: machine 1 says so, and machine 0 names it and exits 1 at the end of a pause
#        slice, not starting the restart (it used to start it and name machine 1's launcher
#        "stopped answering" after 60 s + 5 s). Times are printed, not judged.
#  4. A lost launcher, two machines whose processes sleep (so no rank fails first), side by side:
#     a. machine 1's launcher SIGKILLed: machine 0 names it from its closed store connection
#        ("machine 1's launcher is gone (its connection to the rendezvous closed ...)"), at its
#        next tick (about 1 s); it used to name it only after its heartbeat stood still 5 s
#        ("stopped answering"). The time is printed, not judged.
#     b. machine 1's launcher SIGSTOPped keeps its connection: machine 0 still names it from its
#        heartbeat ("stopped answering (no heartbeat for 5 s)"), the fallback.
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
FREE=$B/tests/progs/free_port
AR=("$B/tests/progs/allreduce_loop" --iters 100000000 --count 1000)
[ -x "$ACCEL" ] && [ -x "$FREE" ] && [ -x "${AR[0]}" ] || { echo "missing build outputs"; exit 1; }
source "$(dirname "$0")/launch_common.sh" # has, scratch, fail, bg, finish, now, elapsed, await
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
# two_machines NAME RANK: machines 0 and 1 (bg NAME0, NAME1, both finished), one process each,
# rank RANK stopping itself and the other dying after 3 s.
two_machines() {
    local port m
    port=$("$FREE")
    for m in 0 1; do
        ACCEL_TIMEOUT=2 ACCEL_BACKEND=gloo bg "$1$m" timeout -k 5 60 "$ACCEL" launch \
            --main_process_ip 127.0.0.1 --main_process_port "$port" --num_machines 2 -n 2 \
            --rdzv_conf timeout=20 --machine_rank "$m" "${AR[@]}" --stop-rank "$2" --die-after 3
    done
    finish "${1}0"
    finish "${1}1"
}
two_machines m 0
[ "$rc_m0" = 1 ] && [ "$rc_m1" = 1 ] || fail "2: the launchers exited $rc_m0, $rc_m1"
has "$T/m0.err" "stopping: rank 1 on machine 1" || fail "2: machine 0 did not report rank 1"
p=$(stopped_pid "$T/m0.err" 0)
[ -n "$p" ] || fail "2: machine 0's launcher did not name its stopped rank 0"
alive "$p" && fail "2: the stopped rank (pid $p) outlived its launcher"
echo "ok: two machines: machine 0 names its stopped rank (pid $p) besides rank 1's failure"
# The same, machine 1's rank stopped: rank 0 fails first, and machine 0's last line names
# machine 1's stopped rank, which machine 1's launcher published.
two_machines n 1
[ "$rc_n0" = 1 ] && [ "$rc_n1" = 1 ] || fail "2b: the launchers exited $rc_n0, $rc_n1"
p=$(stopped_pid "$T/n1.err" 1)
[ -n "$p" ] || fail "2b: machine 1's launcher did not name its stopped rank 1"
tail -n 1 "$T/n0.err" | grep -q "^accel launch: machine 0: on machine 1, rank 1 (pid $p) is" \
    || fail "2b: machine 0's last line does not name machine 1's stopped rank 1 (pid $p)"
echo "ok: two machines: machine 0's last line names machine 1's stopped rank (pid $p)"
# ---- 3. a stop signal after the processes ended ----
# The launchers run without `timeout`, which would pass the signal on twice (to its child and
# to its process group), and a second stop signal ends a launcher at once; each case ends by
# itself within about 60 s (sleep 60, --monitor_interval 60) when the launcher does not stop.
# a. one machine, in the pause between restarts
bg p "$ACCEL" launch -n 1 --max_restarts 1 --monitor_interval 60 \
    /bin/sh -c 'exit 3'
await "$T/p.err" "restarting all 1 processes" 30 || fail "3a: no restart line"
kill -TERM "$pid_p"
finish p
[ "$rc_p" = 143 ] || fail "3a: the launcher exited $rc_p, expected 143"
has "$T/p.err" "accel launch: interrupted by SIGTERM during the pause between restarts" ||
    fail "3a: the launcher did not say it was interrupted"
echo "ok: one machine: SIGTERM in the pause between restarts is said, exit 143"

# b. two machines, machine 0 waiting for machine 1 to finish
port=$("$FREE")
K=(--main_process_ip 127.0.0.1 --main_process_port "$port" --num_machines 2 -n 2
    --rdzv_conf timeout=20)
PR=(/bin/sh -c 'if [ "$RANK" = 1 ]; then exec sleep 60; fi')
for m in 0 1; do
    bg "w$m" "$ACCEL" launch "${K[@]}" --machine_rank "$m" "${PR[@]}"
done
await "$T/w0.err" "machine 0: waiting for machine(s) 1 to finish" 30 ||
    fail "3b: machine 0 did not wait"
kill -TERM "$pid_w0"
finish w0
t0=$(now)
finish w1
echo "machine 1 stopped $(elapsed "$t0") s after machine 0 exited"
[ "$rc_w0" = 143 ] || fail "3b: machine 0 exited $rc_w0, expected 143"
has "$T/w0.err" "machine 0: interrupted by SIGTERM during the wait for the other machines" ||
    fail "3b: machine 0 did not say it was interrupted"
[ "$rc_w1" != 0 ] || fail "3b: machine 1 exited 0"
has "$T/w1.err" "machine 1: stopping: machine 0's launcher (host" \
    "$(hostname)) was interrupted by SIGTERM during the wait for the other machines" ||
    fail "3b: machine 1 did not name machine 0's interrupt"
echo "ok: two machines: SIGTERM to machine 0 waiting for machine 1 is said, and named on machine 1"

# c. two machines, machine 1 in the pause between restarts
port=$("$FREE")
K=(--main_process_ip 127.0.0.1 --main_process_port "$port" --num_machines 2 -n 2
    --rdzv_conf timeout=20 --max_restarts 1 --monitor_interval 60)
PR=(/bin/sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 60')
for m in 0 1; do
    bg "r$m" "$ACCEL" launch "${K[@]}" --machine_rank "$m" "${PR[@]}"
done
await "$T/r1.err" "restarting the job on all 2 machines" 30 || fail "3c: machine 1 did not restart"
kill -TERM "$pid_r1"
t0=$(now)
finish r1
finish r0
echo "machine 0 exited $(elapsed "$t0") s after machine 1's SIGTERM"
[ "$rc_r1" = 143 ] || fail "3c: machine 1 exited $rc_r1, expected 143"
has "$T/r1.err" "machine 1: interrupted by SIGTERM during the pause between restarts" ||
    fail "3c: machine 1 did not say it was interrupted"
[ "$rc_r0" = 1 ] || fail "3c: machine 0 exited $rc_r0, expected 1"
has "$T/r0.err" "machine 1's launcher (host $(hostname)) was interrupted by SIGTERM during the" \
    "pause between restarts" || fail "3c: machine 0 did not name machine 1's interrupt"
[ "$(grep -c "rendezvous\|status of the 1 processes" "$T/r0.err")" = 2 ] ||
    fail "3c: machine 0 started the restart"
echo "ok: two machines: SIGTERM to machine 1 in the pause is said, and named on machine 0"
# ---- 4. a lost launcher: killed (its connection closes) and stopped (heartbeat) ----
for v in k s; do
    port=$("$FREE")
    K=(--main_process_ip 127.0.0.1 --main_process_port "$port" --num_machines 2 -n 2
        --rdzv_conf timeout=20)
    for m in 0 1; do
        bg "$v$m" "$ACCEL" launch "${K[@]}" --machine_rank "$m" sleep 60
    done
done
for v in k s; do
    await "$T/${v}1.err" "rendezvous: machine 1 of 2" 30 ||
        fail "4$v: machine 1 did not meet machine 0"
done
kill -KILL "$pid_k1"
kill -STOP "$pid_s1"
t0=$(now)
finish k1 2>/dev/null # (no "Killed" line from bash)
finish k0
echo "a killed launcher was named in $(elapsed "$t0") s"
finish s0
kill -KILL "$pid_s1" # a stopped process takes SIGKILL; its rank dies with it
finish s1 2>/dev/null
[ "$rc_k0" = 1 ] || fail "4a: machine 0 exited $rc_k0, expected 1"
has "$T/k0.err" "machine 0: stopping: machine 1's launcher is gone (its connection to the" \
    "rendezvous closed: killed, or its machine lost)" ||
    fail "4a: machine 0 did not name machine 1's lost connection"
[ "$rc_s0" = 1 ] || fail "4b: machine 0 exited $rc_s0, expected 1"
has "$T/s0.err" "machine 0: stopping: machine 1's launcher stopped answering (no heartbeat" ||
    fail "4b: machine 0 did not name machine 1's stopped launcher"
echo "ok: a killed launcher is named from its closed connection, a stopped one from its heartbeat"
echo "PASS"
