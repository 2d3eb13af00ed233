#!/usr/bin/env bash
# Killing the launcher kills the job (issue 11, item 6). Each process gets SIGKILL from the
# kernel when `accel launch` dies (PR_SET_PDEATHSIG, set between fork and exec).
#  1. A 3-process job busy in all-reduces (printing nothing), once every process has attached
#     to the job's segment: `kill -9` of the launcher leaves no process of the job after 2 s,
#     and nothing of the job in /dev/shm (the segment was unlinked once all had attached).
#  2. The launcher killed while the job is still setting up (process 1 has not joined yet, so
#     process 0's segment still has its name): no process survives; the name is left, since
#     nobody could remove it, and the next job's process 0 removes it (its creator is gone).
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
ACCEL=$B/accel
PROG=$B/tests/progs/allreduce_loop
[ -x "$ACCEL" ] && [ -x "$PROG" ] || { echo "missing $ACCEL or $PROG"; exit 1; }
T=$(mktemp -d)
uid=$(id -u)
lpid=
cleanup() {
    [ -n "$lpid" ] && kill -9 "$lpid" 2>/dev/null
    for p in $(cat "$T"/pids 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    echo "---- launcher stdout:"; cat "$T/out"
    echo "---- launcher stderr:"; cat "$T/err"
    exit 1
}

# A process is alive when /proc has it and it is not a zombie (nobody may reap an orphan in a
# container without an init).
alive() { [ -e "/proc/$1" ] && ! grep -q ') Z' "/proc/$1/stat" 2>/dev/null; }

# launch SCRIPT: starts a 3-process job whose processes print their pid and job id, then run
# SCRIPT (sh), in the background; waits until all three printed.
launch() {
    # Empty the file first: the background launcher truncates it only when it starts, and the
    # previous job's lines must not be counted meanwhile.
    : >"$T/out"
    "$ACCEL" launch -n 3 /bin/sh -c 'echo "PID=$$ JOB=$ACCEL_JOB_ID"; '"$1" >"$T/out" 2>"$T/err" &
    lpid=$!
    for _ in $(seq 1 1000); do
        [ "$(grep -c 'PID=' "$T/out")" -eq 3 ] && break
        sleep 0.01
    done
    [ "$(grep -c 'PID=' "$T/out")" -eq 3 ] || fail "the processes did not start"
    sed -n 's/.*PID=\([0-9]*\) .*/\1/p' "$T/out" >"$T/pids"
    job=$(sed -n 's/.*JOB=\([0-9a-f]*\)$/\1/p' "$T/out" | sort -u)
    [ -n "$job" ] || fail "no job id"
}

# Kills the launcher with SIGKILL and checks that no process of the job is left after 2 s.
kill_launcher() {
    kill -9 "$lpid"
    wait "$lpid" 2>/dev/null
    lpid=
    local left=
    for _ in $(seq 1 200); do
        left=
        for p in $(cat "$T/pids"); do alive "$p" && left="$left $p"; done
        [ -z "$left" ] && break
        sleep 0.01
    done
    [ -z "$left" ] ||
        { ps -o pid,stat,args -p $left; fail "processes$left outlived the launcher by 2 s"; }
}

# ---- 1. steady state ----
launch "exec '$PROG' --iters 100000000 --count 1024"
# Set up when every process maps the (now nameless) segment of the job.
for _ in $(seq 1 1000); do
    n=0
    for p in $(cat "$T/pids"); do
        grep -q "/dev/shm/accel-$uid-$job.* (deleted)$" "/proc/$p/maps" 2>/dev/null && n=$((n + 1))
    done
    [ "$n" -eq 3 ] && break
    sleep 0.01
done
[ "$n" -eq 3 ] || fail "the processes did not all attach to the job's segment"
kill_launcher
ls /dev/shm | grep -q "^accel-$uid-$job" &&
    fail "/dev/shm holds $(ls /dev/shm | grep "^accel-$uid-$job")"
echo "ok: launcher killed in a running job: no process left, /dev/shm clean"

# ---- 2. during setup ----
launch "if [ \"\$RANK\" = 1 ]; then exec sleep 60; fi; exec '$PROG' --iters 10"
seg=/dev/shm/accel-$uid-$job
for _ in $(seq 1 1000); do [ -e "$seg" ] && break; sleep 0.01; done
[ -e "$seg" ] || fail "process 0 did not create $seg"
kill_launcher
[ -e "$seg" ] || echo "note: $seg was already removed (by a concurrent accel launch's sweep)"
timeout -k 5 20 "$ACCEL" launch -n 2 "$PROG" --iters 3 >"$T/out" 2>"$T/err" ||
    fail "the next job failed"
[ -e "$seg" ] && fail "the next job left $seg of the killed one"
echo "ok: launcher killed during setup: no process left, the next job removed $seg"
echo "PASS"
