#!/usr/bin/env bash
# accel launch on several machines (issue 16, item 4), two "machines" on this host: one
# launcher per machine, --num_machines 2 --machine_rank 0/1 --main_process_ip 127.0.0.1.
#  1. 1 and 2 processes per machine: each rank's layout (checked by machine_check), one job id
#     everywhere, every rank once, the summary line on both launchers; then collectives with the
#     default backend (until a backend across machines is built, every rank must report its
#     clear refusal instead: the test says so and does not count them).
#  2. --main_process_port 0: machine 0 picks a port and prints it; machine 1 joins with it.
#  3. Machine 1 never arrives: machine 0 fails after --rdzv_conf timeout=2 naming machine rank 1.
#  4. A taken port (another job's machine 0 holds it); a wrong master address (machine 0: not
#     this host's; machine 1: nobody listening).
#  5. SIGKILL of a rank on machine 1: both launchers exit within 10 s naming that rank; a
#     launcher killed (machine 1's in one job, machine 0's in another, side by side): the
#     other stops within 10 s, naming it. Machine 0's launcher stopped (SIGSTOP): machine 1
#     stops within 10 s, saying so once. A launcher started with its stderr closed still works.
#  6. Usage: num_processes not divisible by num_machines, machines with different
#     --max_restarts; --max_restarts restarts every machine together, and gives up together;
#     torchrun's ROLE_RANK, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE and GROUP_RANK in each rank.
#  7. --preflight: all hops fine; machine 1's endpoint unreachable: both launchers fail, naming it.
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
CHECK=$B/tests/progs/machine_check
FREE=$B/tests/progs/free_port
[ -x "$ACCEL" ] && [ -x "$CHECK" ] && [ -x "$FREE" ] || { echo "missing build outputs"; exit 1; }
source "$(dirname "$0")/launch_common.sh" # has, scratch, fail, bg, finish, now, elapsed
scratch
MN=(--num_machines 2 --main_process_ip 127.0.0.1)

# start NAME MACHINE ARGS...: one launcher in the background, output in $T/NAME.{out,err}.
start() {
    local name=$1 m=$2
    shift 2
    bg "$name" "$ACCEL" launch "${MN[@]}" --machine_rank "$m" "$@"
}

# ---- 1. two machines x 1 and x 2 processes ----
for per in 1 2; do
    n=$((2 * per))
    port=$("$FREE")
    start m1 1 --main_process_port "$port" -n $n "$CHECK"
    start m0 0 --main_process_port "$port" -n $n "$CHECK"
    finish m0
    finish m1
    [ "$rc_m0" = 0 ] && [ "$rc_m1" = 0 ] || fail "$per per machine: launchers exited $rc_m0, $rc_m1"
    r0="ranks 0-$((per - 1))" r1="ranks $per-$((n - 1))"
    [ $per = 1 ] && r0="rank 0" r1="rank 1"
    has "$T/m0.err" "rendezvous: machine 0 of 2 (.*)," \
        "$r0 of $n, backend .*, master 127.0.0.1:$port" ||
        fail "no summary line on machine 0"
    grep -q "rendezvous: machine 1 of 2 (.*), $r1 of $n, backend" "$T/m1.err" ||
        fail "no summary line on machine 1"
    jobs=$(cat "$T"/m0.out "$T"/m1.out |
        sed -n 's/.*JOB=\([0-9a-f]*\) MASTER=127.0.0.1:'"$port"'$/\1/p')
    [ "$(echo "$jobs" | wc -l)" = $n ] || fail "$per per machine: not $n ranks with the job id"
    [ "$(echo "$jobs" | sort -u | wc -l)" = 1 ] || fail "job ids differ: $jobs"
    for r in $(seq 0 $((n - 1))); do
        grep -q "^\[rank$r\]: JOB=" "$T"/m0.out "$T"/m1.out || fail "rank $r did not run"
    done
    ok=$(cat "$T"/m0.out "$T"/m1.out | grep -c "COLLECTIVES-OK")
    refused=$(cat "$T"/m0.out "$T"/m1.out | grep -c "NO-CROSS-MACHINE-BACKEND")
    if [ "$ok" = $n ]; then
        echo "ok: 2 machines x $per: layout," \
            "job id and collectives ($(grep -ho 'backend=.*' "$T"/m0.out | head -1))"
    elif [ "$refused" = $n ]; then
        echo "ok: 2 machines x $per: layout and job id; collectives NOT RUN," \
            "no backend across machines in this build:"
        grep -ho "NO-CROSS-MACHINE-BACKEND.*" "$T"/m0.out | head -1
    else
        fail "$per per machine: $ok ranks did the collectives, $refused were refused, of $n"
    fi
done

# ---- 2. --main_process_port 0 ----
start m0 0 --main_process_port 0 -n 2 "$CHECK"
for _ in $(seq 1 500); do
    port=$(sed -n 's/^accel launch: main process port \([0-9]*\) .*/\1/p' "$T/m0.err")
    [ -n "$port" ] && break
    sleep 0.01
done
[ -n "$port" ] || fail "machine 0 did not print the port it picked"
start m1 1 --main_process_port "$port" -n 2 "$CHECK"
finish m0
finish m1
[ "$rc_m0" = 0 ] && [ "$rc_m1" = 0 ] || fail "port 0: launchers exited $rc_m0, $rc_m1"
grep -q "master 127.0.0.1:$port" "$T/m1.err" || fail "port 0: machine 1 did not join $port"
echo "ok: --main_process_port 0 picked $port, machine 1 joined"

# ---- 3. machine 1 never arrives ----
port=$("$FREE")
t0=$(now)
"$ACCEL" launch "${MN[@]}" --machine_rank 0 --main_process_port "$port" --rdzv_conf timeout=2 \
    -n 2 "$CHECK" >"$T/m0.out" 2>"$T/m0.err"
rc=$?
t=$(elapsed "$t0")
[ "$rc" != 0 ] || fail "machine 0 succeeded without machine 1"
grep -q "timed out after 2 s: machine rank(s) 1 of 2 did not arrive" "$T/m0.err" ||
    fail "machine 0 did not name machine rank 1"
[ "$(echo "$t < 10" | bc)" = 1 ] || fail "machine 0 took $t s to give up (timeout 2 s)"
grep -q "JOB=" "$T/m0.out" && fail "a process started without the rendezvous"
echo "ok: missing machine 1 named after the 2 s timeout ($t s)"

# ---- 4. taken port, wrong master addresses ----
port=$("$FREE")
start hold 0 --main_process_port "$port" --rdzv_conf timeout=30 -n 2 "$CHECK"
for _ in $(seq 1 500); do
    grep -q "waiting\|rendezvous" "$T/hold.err" 2>/dev/null && break
    ss -ltn 2>/dev/null | grep -q ":$port " && break
    sleep 0.01
done
sleep 0.2
"$ACCEL" launch "${MN[@]}" --machine_rank 0 --main_process_port "$port" -n 2 "$CHECK" \
    >"$T/m0.out" 2>"$T/m0.err" && fail "machine 0 started on a taken port"
grep -q "cannot serve the rendezvous on 127.0.0.1:$port: .*Address already in use" "$T/m0.err" ||
    fail "taken port not named"
kill -9 "$pid_hold" 2>/dev/null
{ wait "$pid_hold"; } 2>/dev/null
echo "ok: taken port named"
"$ACCEL" launch --num_machines 2 --main_process_ip 192.0.2.1 --machine_rank 0 \
    --main_process_port "$("$FREE")" -n 2 "$CHECK" >"$T/m0.out" 2>"$T/m0.err" &&
    fail "machine 0 served on an address that is not this host's"
has "$T/m0.err" "cannot serve the rendezvous on" \
    "192.0.2.1:.*machine 0 must run where --main_process_ip" ||
    grep -q "cannot serve the rendezvous on 192.0.2.1" "$T/m0.err" ||
        fail "wrong address of machine 0 not named"
port=$("$FREE")
t0=$(now)
"$ACCEL" launch "${MN[@]}" --machine_rank 1 --main_process_port "$port" --rdzv_conf timeout=2 \
    -n 2 "$CHECK" >"$T/m1.out" 2>"$T/m1.err" && fail "machine 1 ran without machine 0"
t=$(elapsed "$t0")
has "$T/m1.err" "machine 1: no rendezvous with the main process" \
    "(machine 0's launcher) at 127.0.0.1:$port within 2 s" ||
    fail "unreachable master not named"
[ "$(echo "$t < 10" | bc)" = 1 ] || fail "machine 1 took $t s to give up"
echo "ok: wrong master addresses named (machine 0: not this host; machine 1: nobody there, $t s)"

# ---- 5. SIGKILL of a rank on machine 1 ----
port=$("$FREE")
S='echo "PID=$$ RANK=$RANK"; exec sleep 300'
start m1 1 --main_process_port "$port" -n 4 /bin/sh -c "$S"
start m0 0 --main_process_port "$port" -n 4 /bin/sh -c "$S"
for _ in $(seq 1 1000); do
    [ "$(cat "$T/m0.out" "$T/m1.out" | grep -c 'PID=')" = 4 ] && break
    sleep 0.01
done
victim=$(sed -n 's/.*PID=\([0-9]*\) RANK=3$/\1/p' "$T/m1.out")
[ -n "$victim" ] || fail "rank 3 did not start on machine 1"
all=$(cat "$T/m0.out" "$T/m1.out" | sed -n 's/.*PID=\([0-9]*\) .*/\1/p')
t0=$(now)
kill -9 "$victim"
finish m0
finish m1
t=$(elapsed "$t0")
[ "$(echo "$t < 10" | bc)" = 1 ] || fail "the launchers took $t s to exit after the kill"
[ "$rc_m0" != 0 ] && [ "$rc_m1" != 0 ] || fail "launchers exited $rc_m0, $rc_m1 after a kill"
grep -q "accel launch: rank 3 failed: killed by SIGKILL" "$T/m1.err" ||
    fail "machine 1 did not name rank 3"
has "$T/m0.err" "machine 0: stopping: rank 3 on" \
    "machine 1 (host .*) failed: killed by SIGKILL" ||
    fail "machine 0 did not name rank 3"
for p in $all; do
    [ -e "/proc/$p" ] && ! grep -q ') Z' "/proc/$p/stat" 2>/dev/null && fail "process $p survived"
done
echo "ok: SIGKILL of rank 3 on machine 1: both launchers exited in $t s naming it"

# ---- 5b. a launcher killed: the other notices (heartbeat / closed store) within 10 s ----
# Two jobs side by side, killed at the same moment: in job a machine 1's launcher (a1), in job b
# machine 0's (b0). Each survivor must stop within 10 s of the kill, naming the lost launcher.
# ---- 5c. machine 0's launcher hung (SIGSTOP): machine 1 stops within 10 s, saying so once ----
# (Each later tick of its teardown used to add "the connection failed earlier and is unusable".)
# Job c runs beside a and b, its c0 stopped as a1 and b0 are killed: the three waits for a
# heartbeat to be missed overlap (about 6 s each).
pa=$("$FREE")
pb=$("$FREE")
pc=$("$FREE")
while [ "$pb" = "$pa" ]; do pb=$("$FREE"); done
while [ "$pc" = "$pa" ] || [ "$pc" = "$pb" ]; do pc=$("$FREE"); done
start a1 1 --main_process_port "$pa" -n 4 /bin/sh -c "$S"
start a0 0 --main_process_port "$pa" -n 4 /bin/sh -c "$S"
start b1 1 --main_process_port "$pb" -n 4 /bin/sh -c "$S"
start b0 0 --main_process_port "$pb" -n 4 /bin/sh -c "$S"
start c0 0 --main_process_port "$pc" -n 2 /bin/sh -c "$S"
start c1 1 --main_process_port "$pc" -n 2 /bin/sh -c "$S"
for _ in $(seq 1 1000); do
    [ "$(cat "$T"/[abc][01].out | grep -c 'PID=')" = 10 ] && break
    sleep 0.01
done
t0=$(now)
{
    kill -9 "$pid_a1" "$pid_b0"
    kill -STOP "$pid_c0"
    finish a1
    finish b0
    finish a0
    finish b1
} 2>/dev/null
t=$(elapsed "$t0")
[ "$(echo "$t < 10" | bc)" = 1 ] ||
    fail "the other launchers took $t s after a1's and b0's were killed"
[ "$rc_a0" != 0 ] || fail "machine 0 exited 0 after machine 1's launcher was killed"
grep -q "machine 0: stopping: machine 1's launcher is gone (its connection" "$T/a0.err" ||
    fail "machine 0 did not name machine 1"
[ "$rc_b1" != 0 ] || fail "machine 1 exited 0 after machine 0's launcher was killed"
grep -q "machine 1 lost the rendezvous (machine 0's launcher)" "$T/b1.err" ||
    fail "machine 1 did not say machine 0's launcher is gone"
echo "ok: a killed launcher (machine 1's in one job," \
    "machine 0's in another) stops the other machine in $t s"

finish c1 # 5c: t counts from the stop (an upper bound when c1 ended before a0 and b1)
t=$(elapsed "$t0")
{
    kill -9 "$pid_c0"
    finish c0
} 2>/dev/null
[ "$(echo "$t < 10" | bc)" = 1 ] || fail "machine 1 took $t s after machine 0's launcher stopped"
[ "$rc_c1" != 0 ] || fail "machine 1 exited 0 after machine 0's launcher stopped"
[ "$(grep -c "machine 1 lost the rendezvous (machine 0's launcher)" "$T/c1.err")" = 1 ] ||
    fail "machine 1 did not say exactly once that machine 0's launcher is gone"
echo "ok: a hung machine 0 launcher stops machine 1 in $t s, named once"

# ---- 5d. a launcher started with stderr closed (2>&-): its messages went into the store's
# socket, which then got the number 2, and the job failed after 5 s without machine 1's rank ----
pd=$("$FREE")
start d0 0 --main_process_port "$pd" --rdzv_conf timeout=20 -n 2 /bin/sh -c 'echo "RANK=$RANK"'
timeout 30 "$ACCEL" launch "${MN[@]}" --machine_rank 1 --main_process_port "$pd" \
    --rdzv_conf timeout=20 -n 2 /bin/sh -c 'echo "RANK=$RANK"' >"$T/d1.out" 2>&-
rc=$?
finish d0
[ "$rc" = 0 ] && [ "$rc_d0" = 0 ] || fail "stderr closed on machine 1: exit $rc and $rc_d0"
grep -q "RANK=1" "$T/d1.out" || fail "stderr closed on machine 1: its rank did not run"
echo "ok: a launcher with its stderr closed runs the job"

# ---- 6. usage ----
"$ACCEL" launch "${MN[@]}" -n 3 "$CHECK" >"$T/u.out" 2>"$T/u.err"
[ $? = 2 ] && grep -q "3 processes cannot be shared equally by --num_machines 2" "$T/u.err" ||
    fail "-n 3 on 2 machines not refused"
"$ACCEL" launch "${MN[@]}" --machine_rank 1 --main_process_port 0 -n 2 "$CHECK" \
    >"$T/u.out" 2>"$T/u.err"
[ $? = 2 ] &&
    has "$T/u.err" "only machine 0 picks a free port:" \
        "give machine 1 the port machine 0 printed" ||
    fail "--main_process_port 0 on machine 1 not refused"
port=$("$FREE")
start m1 1 --main_process_port "$port" -n 2 --max_restarts 2 "$CHECK"
start m0 0 --main_process_port "$port" -n 2 --max_restarts 1 "$CHECK"
finish m0
finish m1
[ "$rc_m0" = 1 ] &&
    has "$T/m0.err" "machine 1 (host .*) was started" \
        "with --max_restarts 2, this machine (0) with 1" ||
    fail "different --max_restarts not refused"
[ "$rc_m1" = 1 ] &&
    has "$T/m1.err" "machine 0 (host .*) was started" \
        "with --max_restarts 1, this machine (1) with 2" ||
    fail "different --max_restarts not named on machine 1"
echo "ok: usage errors"

# ---- 6b. --max_restarts: every machine restarts together ----
INFO=$B/tests/progs/rank_info
port=$("$FREE")
start m1 1 --main_process_port "$port" -n 4 --max_restarts 2 "$INFO" --fail-rank 3 --fail-until 1
start m0 0 --main_process_port "$port" -n 4 --max_restarts 2 "$INFO" --fail-rank 3 --fail-until 1
finish m0
finish m1
[ "$rc_m0" = 0 ] && [ "$rc_m1" = 0 ] || fail "restart: launchers exited $rc_m0, $rc_m1"
for m in m0 m1; do
    has "$T/$m.err" "restarting the job on all 2 machines:" \
        "this machine's 2 processes (restart 1 of 2)" ||
        fail "restart: $m did not restart"
done
# (In attempt 0 a rank may be stopped before it prints: rank 3 fails at once.)
for r in 0 1 2 3; do
    grep -q "^\[rank$r\]: rank $r ACCEL_RESTART_COUNT=1$" "$T/m0.out" "$T/m1.out" ||
        fail "restart: rank $r did not run again"
done
[ "$(sed -n 's/.*ACCEL_JOB_ID=//p' "$T/m0.out" "$T/m1.out" | sort -u | wc -l)" = 2 ] ||
    fail "restart: not one job id per attempt"
# torchrun's variables on several machines: one role of 4, 2 groups (machines).
for r in 0 1 2 3; do
    for v in "ROLE_RANK=$r" ROLE_WORLD_SIZE=4 GROUP_WORLD_SIZE=2 GROUP_RANK=$((r / 2)); do
        grep -q "^\[rank$r\]: rank $r $v$" "$T/m0.out" "$T/m1.out" || fail "rank $r: no $v"
    done
done
port=$("$FREE")
start m1 1 --main_process_port "$port" -n 4 --max_restarts 1 "$INFO" --fail-rank 2 --fail-until 9
start m0 0 --main_process_port "$port" -n 4 --max_restarts 1 "$INFO" --fail-rank 2 --fail-until 9
finish m0
finish m1
[ "$rc_m0" = 1 ] && [ "$rc_m1" = 1 ] ||
    fail "restart: launchers exited $rc_m0, $rc_m1 after giving up"
for m in m0 m1; do
    grep -q "giving up: the job failed 2 times (--max_restarts 1)" "$T/$m.err" ||
        fail "restart: $m did not give up"
done
echo "ok: --max_restarts restarts every machine together (new job id each time)," \
    "and gives up together"

# ---- 7. --preflight ----
port=$("$FREE")
start m1 1 --preflight --main_process_port "$port" -n 4 "$CHECK"
start m0 0 --preflight --main_process_port "$port" -n 4 "$CHECK"
finish m0
finish m1
[ "$rc_m0" = 0 ] && [ "$rc_m1" = 0 ] || fail "preflight: launchers exited $rc_m0, $rc_m1"
has "$T/m0.err" "preflight: all 4 ranks reached the rendezvous" \
    "at 127.0.0.1:$port and the launchers of all 2 machines" ||
    fail "preflight: no success line"
port=$("$FREE")
ACCEL_TEST_PREFLIGHT_CLOSED=1 start m1 1 --preflight --main_process_port "$port" -n 4 "$CHECK"
start m0 0 --preflight --main_process_port "$port" -n 4 "$CHECK"
finish m0
finish m1
[ "$rc_m0" != 0 ] && [ "$rc_m1" != 0 ] ||
    fail "preflight with a closed endpoint: exited $rc_m0, $rc_m1"
for m in m0 m1; do
    has "$T/$m.err" "preflight failed: rank 0 (machine 0) -> machine" \
        "1's launcher at 127.0.0.1:[0-9]*: Connection refused" ||
        fail "preflight: $m did not name the hop rank 0 -> machine 1"
done
grep -q "JOB=" "$T/m0.out" "$T/m1.out" && fail "the program started after a failed preflight"
echo "ok: --preflight passes, and names the unreachable hop on both machines"
