#!/usr/bin/env bash
# What the launchers of a job on several machines say while they meet (docs/launch.md,
# "Rendezvous"), two or three "machines" on this host, 127.0.0.1:
#  1. A job-shape mismatch (machine 0 -n 2, machine 1 -n 4, both --num_machines 2): BOTH
#     launchers name both shapes (machine 1 used to see only machine 0 stop). A second
#     --machine_rank 1 in a job of 3: all three launchers name the duplicate within seconds
#     (machine 0 and the first machine 1 used to wait for machine 2 until the timeout).
#  2. Machine 0 alone, --rdzv_conf timeout=1: a "waiting for machine(s) 1 of 2" line naming how
#     to start it, then the timeout message; machine 1 alone: "waiting for machine 0's launcher".
#     In a job of 3 whose machine 2 is missing, the line names only machine 2.
#  3. The summary line says "rank 0 of 2" for one process per machine, and brackets an IPv6
#     master ("[::1]:PORT"), as does the --preflight line (skipped without IPv6 on lo).
#  4. SIGTERM to machine 0 waiting alone, SIGINT (SIGHUP where the test starts with SIGINT
#     ignored) to machine 1 waiting in a job of 3: each exits at once (143, 130) saying it was
#     interrupted, nothing started; machine 0 names machine 1's interrupt instead of waiting
#     for the timeout. (Machine 0 alone exits at once, 0 to 0.5 s here; it used to serve one
#     second longer, 1.0 to 1.5 s, for nobody: printed, not judged, a difference too small for a
#     loaded machine.)
#  5. After the rendezvous: SIGTERM to machine 0 during --preflight (machine 1's endpoint never
#     answers, so every probe waits): 143 saying so, no probe left behind, machine 1 names it
#     and exits 1 (its probes gone too); it used to end silently, its probes left for 10 s.
#     SIGKILL to machine 1's launcher during --preflight: its probes die with it, and machine 0
#     names it within seconds (the probes held its store connection for up to 10 s, and
#     machine 0 waited for the timeout).
#     --preflight on machine 0 only: both launchers name the difference at the rendezvous
#     (machine 0 used to wait for machine 1's verdict and machine 1 for the job id until the
#     timeout). A signal while a machine waits for the job id is handled the same way, but that
#     wait is now too short to hit from a test.
#  6. A job of 3 whose machine 1 published its record, then machine 2 arrives:
#     a. machine 1 got SIGTERM and exited just before: machines 0 and 2 fail naming machine 1's
#        interrupt, nothing starts (machine 2, finding every record, used to start its process,
#        and so did machine 0 when no slice of its wait ended in between).
#     b. machine 1's launcher was SIGKILLed: machines 0 and 2 fail naming it ("is gone after it
#        published its record": its store connection closed), nothing starts; both used to start
#        their processes (which wait ACCEL_TIMEOUT for machine 1's ranks) without naming it, then
#        named it only when its heartbeat had stood still ALIVE_S (3 s). The time is printed,
#        judged only against 20 s (it is about 1 s: machine 0's linger).
#  7. After the start (2 machines x 1 process in an all-reduce loop, gloo), machine 1's launcher
#     SIGKILLed: its rank dies with it, rank 0 fails, and machine 0's last line names the lost
#     launcher ("the job failed: machine 1's launcher is gone"; it used to name rank
#     0's failure, the first one published, so no launcher ever said machine 1's was gone).
#     Rank 0 may also still be in its setup when the launcher's loss is noticed: the last line
#     is the same.
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
FREE=$B/tests/progs/free_port
[ -x "$ACCEL" ] && [ -x "$FREE" ] || { echo "missing build outputs"; exit 1; }
source "$(dirname "$0")/launch_common.sh" # has, scratch, fail, bg, finish, now, elapsed, await
scratch
PROG=(/bin/sh -c 'echo "STARTED RANK=$RANK"')

# start NAME MACHINE ARGS...: one launcher in the background, output in $T/NAME.{out,err}.
start() {
    local name=$1 m=$2
    shift 2
    bg "$name" "$ACCEL" launch --main_process_ip 127.0.0.1 --machine_rank "$m" "$@"
}

# ---- 4b, in the background while 1-4a run: SIGINT to machine 1 waiting in a job of 3 ----
# (machine 0's "waiting" line, after half the 10 s timeout, says machine 1 has arrived; SIGINT
# reaches a background job only from a shell with job control: set -m)
pa=$("$FREE")
J3=(--num_machines 3 -n 3 --main_process_port "$pa" --rdzv_conf timeout=10)
start a0 0 "${J3[@]}" "${PROG[@]}"
(
    set -m
    "$ACCEL" launch --main_process_ip 127.0.0.1 --machine_rank 1 "${J3[@]}" "${PROG[@]}" \
        >"$T/a1.out" 2>"$T/a1.err" &
    echo $! >"$T/a1.pid"
    wait $!
    echo $? >"$T/a1.rc"
) &
pid_a1sh=$!
pids="$pids $pid_a1sh"
# A SIGINT ignored when this shell started stays ignored in every child (set -m cannot undo it):
# SIGHUP, the launcher's other interrupt, then stands in.
SIG=INT RC_SIG=130
[ -z "$(trap -p INT)" ] || { SIG=HUP RC_SIG=129; echo "note: SIGINT is ignored here: SIGHUP"; }

# ---- 6, started here, judged at the end (their first "waiting" line comes after 5 s) ----
pe=$("$FREE")
J6E=(--num_machines 3 -n 3 --main_process_port "$pe" --rdzv_conf timeout=20)
start e0 0 "${J6E[@]}" "${PROG[@]}"
start e1 1 "${J6E[@]}" "${PROG[@]}"
pf=$("$FREE")
while [ "$pf" = "$pe" ]; do pf=$("$FREE"); done
J6F=(--num_machines 3 -n 3 --main_process_port "$pf" --rdzv_conf timeout=40)
start f0 0 "${J6F[@]}" "${PROG[@]}"
start f1 1 "${J6F[@]}" "${PROG[@]}"

# ---- 1. job-shape mismatch: each launcher names both shapes ----
port=$("$FREE")
t0=$(now)
start m0 0 --num_machines 2 -n 2 --main_process_port "$port" --rdzv_conf timeout=25 "${PROG[@]}"
start m1 1 --num_machines 2 -n 4 --main_process_port "$port" --rdzv_conf timeout=25 "${PROG[@]}"
finish m0
finish m1
t=$(elapsed "$t0")
[ "$rc_m0" = 1 ] && [ "$rc_m1" = 1 ] || fail "shape mismatch: launchers exited $rc_m0, $rc_m1"
[ "$(echo "$t < 20" | bc)" = 1 ] || fail "shape mismatch: the launchers took $t s"
has "$T/m0.err" "machine 1 (host .*) was started with --num_machines 2 and 2 processes per" \
    "machine, this machine (0) with --num_machines 2 and 1" || fail "machine 0 did not name it"
has "$T/m1.err" "machine 0 (host .*) was started with --num_machines 2 and 1 processes per" \
    "machine, this machine (1) with --num_machines 2 and 2" || fail "machine 1 did not name it"
grep -q STARTED "$T/m0.out" "$T/m1.out" && fail "shape mismatch: a process started"
echo "ok: a job-shape mismatch is named on both machines ($t s)"

# ---- 1b. a second --machine_rank 1 in a job of 3 (machine 2 never comes) ----
port=$("$FREE")
t0=$(now)
J=(--num_machines 3 -n 3 --main_process_port "$port" --rdzv_conf timeout=25)
start d0 0 "${J[@]}" "${PROG[@]}"
start d1 1 "${J[@]}" "${PROG[@]}"
start d1b 1 "${J[@]}" "${PROG[@]}"
finish d0
finish d1
finish d1b
t=$(elapsed "$t0")
[ "$rc_d0" = 1 ] && [ "$rc_d1" = 1 ] && [ "$rc_d1b" = 1 ] ||
    fail "duplicate rank: launchers exited $rc_d0, $rc_d1, $rc_d1b"
[ "$(echo "$t < 20" | bc)" = 1 ] || fail "duplicate rank: the launchers took $t s"
# Either machine 1 may be the second: it says it joined twice; the other one reads the failure
# it published (or, when machine 0 closed the store first, gets it in the store's last word).
has "$T/d0.err" "machine 0: the rendezvous at 127.0.0.1:$port failed:" \
    "machine rank 1 was started twice" || fail "duplicate rank: machine 0 did not name it"
dups=$(cat "$T/d1.err" "$T/d1b.err")
grep -q "machine rank 1 joined the rendezvous at 127.0.0.1:$port twice" <<<"$dups" &&
    grep -q "machine 1: .*rendezvous at .*: machine rank 1 was started twice" <<<"$dups" ||
    fail "duplicate rank: not both machine 1 launchers named it"
echo "ok: a second --machine_rank 1 is named by all three launchers ($t s)"

# ---- 2. the "waiting for" lines, then the timeout ----
port=$("$FREE")
p1=$("$FREE")
while [ "$p1" = "$port" ]; do p1=$("$FREE"); done
start w0 0 --num_machines 2 -n 2 --main_process_port "$port" --rdzv_conf timeout=1 "${PROG[@]}"
start w1 1 --num_machines 2 -n 2 --main_process_port "$p1" --rdzv_conf timeout=1 "${PROG[@]}"
finish w0
finish w1
[ "$rc_w0" = 1 ] && [ "$rc_w1" = 1 ] || fail "alone: launchers exited $rc_w0, $rc_w1"
has "$T/w0.err" "^accel launch: machine 0: waiting for machine(s) 1 of 2 at 127.0.0.1:$port" \
    "(up to 1 s in all; start it with --machine_rank 1 --num_machines 2 --num_processes 2" \
    "--main_process_ip 127.0.0.1 --main_process_port $port)" ||
    fail "machine 0 alone did not say it waits for machine 1"
sed -n 2p "$T/w0.err" | grep -q "timed out after 1 s: machine rank(s) 1 of 2 did not arrive" ||
    fail "machine 0 alone: no timeout message after the waiting line"
has "$T/w1.err" "^accel launch: machine 1: waiting for machine 0's launcher at" \
    "127.0.0.1:$p1 (up to 1 s in all)" || fail "machine 1 alone did not say it waits"
grep -q "no rendezvous with the main process" "$T/w1.err" || fail "machine 1 alone: no timeout"
echo "ok: a launcher alone says whom it waits for, then times out"

# ---- 3. the summary line: one rank per machine, an IPv6 master ----
ip=::1
if ! python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null &&
    ! grep -q '^0\{31\}1 ' /proc/net/if_inet6 2>/dev/null; then
    echo "skip: no IPv6 on lo: the bracketed master is not checked, 127.0.0.1 instead"
    ip=127.0.0.1
fi
port=$("$FREE")
S=(--num_machines 2 -n 2 --main_process_port "$port" --preflight "${PROG[@]}")
"$ACCEL" launch --main_process_ip "$ip" --machine_rank 1 "${S[@]}" >"$T/s1.out" 2>"$T/s1.err" &
pid_s1=$!
pids="$pids $pid_s1"
"$ACCEL" launch --main_process_ip "$ip" --machine_rank 0 "${S[@]}" >"$T/s0.out" 2>"$T/s0.err"
rc_s0=$?
finish s1
[ "$rc_s0" = 0 ] && [ "$rc_s1" = 0 ] || fail "summary: launchers exited $rc_s0, $rc_s1"
master="127.0.0.1:$port"
[ "$ip" = ::1 ] && master="\[::1\]:$port"
for m in 0 1; do
    has "$T/s$m.err" "rendezvous: machine $m of 2 (.*), rank $m of 2, backend .*," \
        "master $master, all 2" || fail "summary line of machine $m"
    grep -q "preflight: all 2 ranks reached the rendezvous at $master and" "$T/s$m.err" ||
        fail "preflight line of machine $m"
done
echo "ok: summary line: \"rank 0 of 2\", master $ip port $port"

# ---- 4a. SIGTERM to machine 0 waiting alone ----
start t0 0 --num_machines 2 -n 2 --main_process_port 0 "${PROG[@]}"
await "$T/t0.err" "main process port" || fail "machine 0 did not start serving"
t0=$(now)
kill -TERM "$pid_t0"
finish t0
t=$(elapsed "$t0")
[ "$rc_t0" = 143 ] || fail "SIGTERM: machine 0 exited $rc_t0"
[ "$(echo "$t < 10" | bc)" = 1 ] || fail "SIGTERM: machine 0 took $t s"
has "$T/t0.err" "machine 0: interrupted by SIGTERM during the rendezvous at 127.0.0.1:[0-9]*:" \
    "nothing was started" || fail "SIGTERM: machine 0 did not say it was interrupted"
grep -q STARTED "$T/t0.out" && fail "SIGTERM: a process started"
echo "ok: SIGTERM to machine 0 waiting alone: exit 143 in $t s, saying so"

# ---- 5. SIGTERM during --preflight, and while fetching the job id ----
# probes NAME: the preflight probes of launcher NAME (its children), once both are forked.
probes() {
    local p k
    eval "p=\$pid_$1"
    for _ in $(seq 1 400); do
        k=$(pgrep -P "$p" | tr '\n' ' ')
        [ "$(wc -w <<<"$k")" = 2 ] && break
        sleep 0.05
    done
    echo "$k"
}
# left MACHINE PIDS...: fails when one of PIDS is still a launcher of that machine (a probe).
left() {
    alive "$@" && fail "preflight: a probe of machine $1 outlived its launcher"
}
# alive MACHINE PIDS...: whether one of PIDS is still a launcher of that machine (a probe).
alive() {
    local m=$1 p
    shift
    for p in "$@"; do
        ps -o args= -p "$p" 2>/dev/null | grep -q -- "--machine_rank $m" && return 0
    done
    return 1
}
port=$("$FREE")
P=(--num_machines 2 -n 4 --main_process_port "$port" --rdzv_conf timeout=20 --preflight)
ACCEL_TEST_PREFLIGHT_CLOSED=drop start p1 1 "${P[@]}" "${PROG[@]}"
start p0 0 "${P[@]}" "${PROG[@]}"
k0=$(probes p0)
k1=$(probes p1)
[ "$(wc -w <<<"$k0 $k1")" = 4 ] || fail "preflight: probes of machine 0: $k0, of machine 1: $k1"
t0=$(now)
kill -TERM "$pid_p0"
finish p0
# shellcheck disable=SC2086
left 0 $k0 # at once: left behind, a probe would wait up to 10 s
finish p1
t=$(elapsed "$t0")
[ "$rc_p0" = 143 ] && [ "$rc_p1" = 1 ] || fail "preflight: launchers exited $rc_p0, $rc_p1"
[ "$(echo "$t < 8" | bc)" = 1 ] || fail "preflight: the launchers took $t s"
has "$T/p0.err" "^accel launch: machine 0: interrupted by SIGTERM during the preflight:" \
    "nothing was started" || fail "preflight: machine 0 did not say it was interrupted"
has "$T/p1.err" "machine 1: the preflight stopped: machine 0's launcher (host .*) was" \
    "interrupted by SIGTERM during the preflight" || fail "preflight: machine 1 did not name it"
# shellcheck disable=SC2086
left 1 $k1
grep -q STARTED "$T/p0.out" "$T/p1.out" && fail "preflight: a process started"
echo "ok: SIGTERM during --preflight: exit 143 saying so, probes stopped, machine 1 names it" \
    "($t s)"

# SIGKILL to machine 1's launcher during --preflight (machine 0's endpoint never answers, so
# every probe waits 10 s on it), machine 0 held (SIGSTOP) meanwhile, so that its exit does not
# end machine 1's probes' hops: those die with their launcher within 5 s; machine 0, resumed,
# names it at once (its probes held no copy of the launcher's store connection). The probes
# used to live on for 10 s holding it, and machine 0 did not read the lost key in the
# preflight: it waited for the timeout (20 s).
port=$("$FREE")
P=(--num_machines 2 -n 4 --main_process_port "$port" --rdzv_conf timeout=20 --preflight)
ACCEL_TEST_PREFLIGHT_CLOSED=drop start k0 0 "${P[@]}" "${PROG[@]}"
start k1 1 "${P[@]}" "${PROG[@]}"
k0=$(probes k0)
k1=$(probes k1)
[ "$(wc -w <<<"$k0 $k1")" = 4 ] || fail "preflight kill: probes of machine 0: $k0, of 1: $k1"
kill -STOP "$pid_k0"
kill -KILL "$pid_k1"
for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    alive 1 $k1 || break
    sleep 0.05
done
# shellcheck disable=SC2086
left 1 $k1
t0=$(now)
kill -CONT "$pid_k0"
finish k0
t=$(elapsed "$t0")
# shellcheck disable=SC2086
left 0 $k0
finish k1
[ "$rc_k0" = 1 ] || fail "preflight kill: machine 0 exited $rc_k0"
[ "$(echo "$t < 8" | bc)" = 1 ] || fail "preflight kill: machine 0 took $t s"
tail -1 "$T/k0.err" | grep -q "machine 0: the preflight stopped: machine 1's launcher is gone" \
    || fail "preflight kill: machine 0's last line does not name machine 1's launcher"
[ "$(grep -c "launcher is gone (its connection to the rendezvous closed" "$T/k0.err")" = 1 ] ||
    fail "preflight kill: machine 0 did not name it exactly once"
grep -q STARTED "$T/k0.out" "$T/k1.out" && fail "preflight kill: a process started"
echo "ok: SIGKILL to machine 1 during --preflight: its probes die with it, machine 0 names it" \
    "in $t s"

port=$("$FREE")
Q=(--num_machines 2 -n 2 --main_process_port "$port" --rdzv_conf timeout=20)
t0=$(now)
start q0 0 "${Q[@]}" --preflight "${PROG[@]}"
start q1 1 "${Q[@]}" "${PROG[@]}"
finish q1
finish q0
t=$(elapsed "$t0")
[ "$rc_q0" = 1 ] && [ "$rc_q1" = 1 ] || fail "--preflight on one machine: exits $rc_q0, $rc_q1"
[ "$(echo "$t < 15" | bc)" = 1 ] || fail "--preflight on one machine: the launchers took $t s"
for m in 0 1; do
    has "$T/q$m.err" "was started with.*--preflight, this machine ($m)" ||
        fail "--preflight on one machine: machine $m did not name it"
done
grep -q STARTED "$T/q0.out" "$T/q1.out" && fail "--preflight on one machine: a process started"
echo "ok: --preflight on one machine only: both launchers name it ($t s)"

# ---- 4b (started first): SIGINT to machine 1 ----
await "$T/a0.err" "waiting for machine(s) 2 of 3 at 127.0.0.1:$pa (up to 10 s in all;" ||
    fail "job of 3: machine 0 did not say it waits for machine 2 only"
pid_a1=$(cat "$T/a1.pid")
pids="$pids $pid_a1"
t0=$(now)
kill -$SIG "$pid_a1"
finish a0
wait "$pid_a1sh"
t=$(elapsed "$t0")
[ "$(cat "$T/a1.rc")" = $RC_SIG ] || fail "SIG$SIG: machine 1 exited $(cat "$T/a1.rc")"
has "$T/a1.err" "machine 1: interrupted by SIG$SIG during the rendezvous at 127.0.0.1:$pa:" \
    "nothing was started" || fail "SIG$SIG: machine 1 did not say it was interrupted"
[ "$rc_a0" = 1 ] || fail "SIG$SIG: machine 0 exited $rc_a0"
has "$T/a0.err" "machine 0: the rendezvous at 127.0.0.1:$pa failed: machine 1's launcher" \
    "(host .*) was interrupted by SIG$SIG" || fail "SIG$SIG: machine 0 did not name machine 1"
grep -q STARTED "$T/a0.out" "$T/a1.out" && fail "SIG$SIG: a process started"
echo "ok: SIG$SIG to machine 1 in the rendezvous: exit $RC_SIG, machine 0 names it ($t s)"

# ---- 6a (started first): SIGTERM to machine 1, then machine 2 arrives ----
await "$T/e0.err" "waiting for machine(s) 2 of 3 at 127.0.0.1:$pe" ||
    fail "6a: machine 0 did not say it waits for machine 2 only"
kill -TERM "$pid_e1"
finish e1 # its interrupt is published when it exits
start e2 2 "${J6E[@]}" "${PROG[@]}"
finish e0
finish e2
[ "$rc_e1" = 143 ] && [ "$rc_e0" = 1 ] && [ "$rc_e2" = 1 ] ||
    fail "6a: launchers exited $rc_e0, $rc_e1, $rc_e2"
has "$T/e0.err" "machine 0: the rendezvous at 127.0.0.1:$pe failed: machine 1's launcher" \
    "(host .*) was interrupted by SIGTERM" || fail "6a: machine 0 did not name machine 1"
# Machine 2 reads the failure itself or, when machine 0 saw it first and closed the store while
# machine 2 was joining, in the store's last word ("… closed it after this failure: …").
has "$T/e2.err" "machine 2: .*rendezvous at 127.0.0.1:$pe.*: machine 1's launcher" \
    "(host .*) was interrupted by SIGTERM" || fail "6a: machine 2 did not name machine 1"
grep -q STARTED "$T/e0.out" "$T/e2.out" && fail "6a: a process started"
echo "ok: SIGTERM to machine 1 just before the last machine arrives: machines 0 and 2 name it"

# ---- 6b (started first): SIGKILL to machine 1's launcher, then machine 2 arrives ----
await "$T/f0.err" "waiting for machine(s) 2 of 3 at 127.0.0.1:$pf" ||
    fail "6b: machine 0 did not say it waits for machine 2 only"
kill -KILL "$pid_f1"
finish f1 2>/dev/null # (no "Killed" line from bash)
t0=$(now)
start f2 2 "${J6F[@]}" "${PROG[@]}"
finish f0
finish f2
t=$(elapsed "$t0")
[ "$rc_f0" = 1 ] && [ "$rc_f2" = 1 ] || fail "6b: machines 0 and 2 exited $rc_f0, $rc_f2"
[ "$(echo "$t < 20" | bc)" = 1 ] || fail "6b: the launchers took $t s"
for m in 0 2; do
    has "$T/f$m.err" "machine $m: the rendezvous at 127.0.0.1:$pf failed: machine 1's launcher" \
        "is gone after it published its record (its connection to the rendezvous closed" ||
        fail "6b: machine $m did not name it"
done
grep -q STARTED "$T/f0.out" "$T/f2.out" && fail "6b: a process started"
echo "ok: machine 1's launcher killed after its record: machines 0 and 2 name it ($t s)"

# ---- 7. machine 1's launcher SIGKILLed while the job runs ----
AR=("$B/tests/progs/allreduce_loop" --iters 100000000 --count 1000)
[ -x "${AR[0]}" ] || fail "${AR[0]} is missing: build first"
port=$("$FREE")
K=(--num_machines 2 -n 2 --main_process_port "$port" --rdzv_conf timeout=20)
ACCEL_TIMEOUT=5 ACCEL_BACKEND=gloo start k0 0 "${K[@]}" "${AR[@]}"
ACCEL_TIMEOUT=5 ACCEL_BACKEND=gloo start k1 1 "${K[@]}" "${AR[@]}"
await "$T/k1.err" "rendezvous: machine 1 of 2" || fail "7: machine 1 did not meet machine 0"
for _ in $(seq 1 400); do
    pgrep -P "$pid_k1" >/dev/null && break
    sleep 0.05
done
sleep 1 # the ranks are past their setup, in the loop
kill -KILL "$pid_k1"
finish k1 2>/dev/null
finish k0
[ "$rc_k0" != 0 ] || fail "7: machine 0 exited 0"
tail -n 1 "$T/k0.err" |
    grep -q "machine 0: the job failed: machine 1's launcher is gone (its connection" ||
    fail "7: machine 0's last line does not name machine 1's launcher"
echo "ok: machine 1's launcher killed while the job runs: machine 0's last line names it"
