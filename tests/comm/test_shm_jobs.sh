#!/usr/bin/env bash
# Jobs of one user started by hand, without accel launch (issue 11, item 1). Without
# ACCEL_JOB_ID the processes meet through the store that process 0 serves on MASTER_PORT and
# agree there on a random nonce naming the job's segment.
#  1. Two jobs of 2 processes on two ports, started together: each computes its own sums
#     (different salts, so a cross-paired job would get wrong ones) and all four exit 0.
#  2. Two jobs on one port, started together (the processes 1 once one process 0 was refused the
#     port), every process finishing accel_init before any computes: none computes. The process
#     0 that could not serve the port names it and says it is in use; the others report the
#     clash (two jobs on one MASTER_ADDR and MASTER_PORT).
#  3. Two jobs on one port, the second's process 0 late: the first job runs, the second's
#     process 1 joins it (the clash stops the first job), and only once the first process 0 has
#     failed does the second's process 0 start (ACCEL_TIMEOUT 60 s, past the watchdog). It must
#     fail at once, the port taken (a process 0 keeps it a few seconds after a clash), naming the
#     clash, where it used to take the freed port and wait its ACCEL_TIMEOUT for a process 1
#     long gone.
#  4. A stale segment: a hand-set ACCEL_JOB_ID reused after its creator was SIGKILLed before
#     anyone joined. The restarted job's process 0 removes it (a warning naming the file and
#     the dead pid) and creates its own; its process 1 waits for that rather than failing on the
#     leftover. The job runs and leaves nothing. (It used to fail on both processes, asking the
#     user to remove the file.)
#  5. A process 1 whose process 0 never comes (ACCEL_TIMEOUT=2): the error says it could not
#     connect to the store within 2 s, the configured timeout (it said 1.99998 s, what was left
#     of it when the store was opened).
#  6. A job of 3 whose process 2 never comes (ACCEL_TIMEOUT=2): processes 0 and 1 fail saying
#     that only 2 of 3 processes attached within 2 s (they said that the store's key
#     "shm/1/done" was not set within 1.99858 s, what was left of the timeout).
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
PROG=$B/tests/progs/allreduce_loop
FREE=$B/tests/progs/free_port
[ -x "$PROG" ] && [ -x "$FREE" ] || { echo "missing $PROG or $FREE"; exit 1; }
. "$(dirname "$0")/../poll.sh"
tmp=$(mktemp -d)
uid=$(id -u)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
    [ -n "${stale:-}" ] && rm -f "$stale"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.err; do echo "== $f"; cat "$f"; done
    exit 1
}

# start NAME RANK N [ENV=VALUE...] -- ARGS...: one process of a hand-started job, in the
# background, killed by a watchdog after 30 s (its status is then 137).
start() {
    local name=$1 r=$2 n=$3
    shift 3
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env -u ACCEL_JOB_ID "${envs[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
        MASTER_ADDR=127.0.0.1 ACCEL_TIMEOUT=60 timeout -s KILL 30 "$PROG" "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
}

# ---- 1. two ports ----
p1=$("$FREE")
p2=$("$FREE")
while [ "$p2" = "$p1" ]; do p2=$("$FREE"); done
pids=()
start a0 0 2 MASTER_PORT=$p1 -- --iters 200 --salt 0
start b0 0 2 MASTER_PORT=$p2 -- --iters 200 --salt 10
start a1 1 2 MASTER_PORT=$p1 -- --iters 200 --salt 0
start b1 1 2 MASTER_PORT=$p2 -- --iters 200 --salt 10
i=0
for name in a0 b0 a1 b1; do
    wait "${pids[$i]}"
    rc=$?
    [ "$rc" -eq 0 ] || fail "two ports: $name exited $rc"
    grep -q "200 allreduces ok" "$tmp/$name.out" || fail "two ports: $name did not finish"
    i=$((i + 1))
done
echo "two jobs on two ports: correct sums, all exit 0"

# ---- 2. one port ----
p=$("$FREE")
mkdir "$tmp/sync"
pids=()
sync=(--sync-dir "$tmp/sync" --sync-count 4)
start c0 0 2 MASTER_PORT=$p -- --iters 200 --salt 0 "${sync[@]}"
start d0 0 2 MASTER_PORT=$p -- --iters 200 --salt 10 "${sync[@]}"
# The processes 1 only once one process 0 has been refused the port: a process 0 that failed on
# the clash closes its store, and a process 0 of the other job that came later still would take
# the port over and wait its ACCEL_TIMEOUT for a process 1 already gone (1 run in about 300).
poll 10 grep -qs "cannot serve on" "$tmp/c0.err" "$tmp/d0.err"
start c1 1 2 MASTER_PORT=$p -- --iters 200 --salt 0 "${sync[@]}"
start d1 1 2 MASTER_PORT=$p -- --iters 200 --salt 10 "${sync[@]}"
i=0
for name in c0 d0 c1 d1; do
    wait "${pids[$i]}"
    rc=$?
    [ "$rc" -eq 1 ] || fail "one port: $name exited $rc, expected 1 (an error)"
    grep -q "allreduces ok" "$tmp/$name.out" && fail "one port: $name computed"
    grep -q "wrong result" "$tmp/$name.err" && fail "one port: $name computed with the other job"
    i=$((i + 1))
done
cat "$tmp"/[cd][01].err | grep -q "cannot serve on 127.0.0.1:$p: Address already in use" ||
    fail "one port: no process 0 reported the port in use"
n_clash=$(cat "$tmp"/[cd][01].err | grep -c "two jobs use the same MASTER_ADDR and MASTER_PORT")
[ "$n_clash" -ge 3 ] || fail "one port: only $n_clash processes named the clash (want 3)"
echo "two jobs on one port: port in use and clash reported, nobody computed"

# ---- 3. one port, the second process 0 late ----
p=$("$FREE")
mkdir "$tmp/sync3"
pids=()
start g0 0 2 MASTER_PORT=$p ACCEL_LOG_LEVEL=info -- --iters 100000000 --sync-dir "$tmp/sync3" \
    --sync-count 2
start g1 1 2 MASTER_PORT=$p -- --iters 100000000 --sync-dir "$tmp/sync3" --sync-count 2
poll 20 n_files_at_least "$tmp/sync3" 2
start h1 1 2 MASTER_PORT=$p -- --iters 10
poll 20 grep -qs "allreduce failed" "$tmp/g0.err" ||
    fail "late process 0: the first job did not fail"
# Its store has its cause from this line on (on the old code the line never comes: the wait
# runs out, and process 0 exits meanwhile).
poll 20 grep -qs "shm: keeping 127.0.0.1:$p taken" "$tmp/g0.err"
start h0 0 2 MASTER_PORT=$p -- --iters 10
i=0
for name in g0 g1 h1 h0; do
    wait "${pids[$i]}"
    rc=$?
    [ "$rc" -eq 1 ] || fail "late process 0: $name exited $rc, expected 1 (an error)"
    i=$((i + 1))
done
grep -q "cannot serve on 127.0.0.1:$p: Address already in use" "$tmp/h0.err" ||
    fail "late process 0: it did not report the port in use"
for name in g0 g1 h1 h0; do
    grep -q "two jobs use the same MASTER_ADDR and MASTER_PORT" "$tmp/$name.err" ||
        fail "late process 0: $name did not name the clash"
done
echo "two jobs on one port, the second process 0 late: it failed at once, naming the clash"

# ---- 4. a stale segment under a reused ACCEL_JOB_ID ----
job=stale$$
stale=/dev/shm/accel-$uid-$job
pids=()
ACCEL_JOB_ID=$job RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 ACCEL_TIMEOUT=60 \
    "$PROG" --iters 10 >"$tmp/s.out" 2>"$tmp/s.err" &
creator=$!
poll 10 test -e "$stale" || fail "stale: the first process 0 never created $stale"
kill -9 "$creator"
wait "$creator" 2>/dev/null
[ -e "$stale" ] || fail "stale: $stale vanished with its creator"
# Process 1 is started first, so that it usually meets the leftover before process 0 replaces it.
start e1 1 2 ACCEL_JOB_ID=$job -- --iters 10
start e0 0 2 ACCEL_JOB_ID=$job -- --iters 10
for r in 0 1; do
    wait "${pids[$((1 - r))]}"
    rc=$?
    [ "$rc" -eq 0 ] || fail "stale: rank $r exited $rc, expected 0"
    grep -q "10 allreduces ok" "$tmp/e$r.out" || fail "stale: rank $r did not finish"
done
grep -q "removed $stale, left by a job that was killed (its creator, pid $creator, is gone)" \
    "$tmp/e0.err" || fail "stale: process 0 did not report removing $stale and its dead creator"
ls /dev/shm | grep -q "^accel-$uid-$job" &&
    fail "stale: $(ls /dev/shm | grep "^accel-$uid-$job") left"
echo "stale segment: the restarted job replaced it (naming it and the dead creator) and ran"

# ---- 5. no process 0 ----
env -u ACCEL_JOB_ID RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$("$FREE")" ACCEL_TIMEOUT=2 timeout -s KILL 30 "$PROG" --iters 1 \
    >"$tmp/n1.out" 2>"$tmp/n1.err"
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 137 ] || fail "no process 0: process 1 exited $rc"
grep -q "ETIMEDOUT.*could not connect within 2 s (" "$tmp/n1.err" ||
    fail "no process 0: process 1 did not name the configured timeout"
echo "no process 0: process 1 could not connect within the configured 2 s, and said so"

# ---- 6. a process that never comes ----
p=$("$FREE")
pids=()
for r in 0 1; do
    env -u ACCEL_JOB_ID RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$p ACCEL_TIMEOUT=2 timeout -s KILL 30 "$PROG" --iters 1 \
        >"$tmp/m$r.out" 2>"$tmp/m$r.err" &
    pids+=($!)
done
for r in 0 1; do
    wait "${pids[$r]}"
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 137 ] || fail "missing process: process $r exited $rc"
    grep -q "only 2 of 3 processes attached to .* within 2 s" "$tmp/m$r.err" ||
        fail "missing process: process $r did not say that only 2 of 3 attached within 2 s"
done
echo "missing process: processes 0 and 1 said only 2 of 3 attached within the configured 2 s"
echo "PASS"
