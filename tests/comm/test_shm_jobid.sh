#!/usr/bin/env bash
# Jobs started by hand with the same hand-set ACCEL_JOB_ID at the same moment (they skip the
# store and meet through the segment named after the id). They used to pair up each other's
# processes (process 0 of one job with process 1 of the other) with no error: the name was
# removed once a job's processes had attached, and the other job's process 0 made a new one.
#  1. Two 2-process jobs with one id, started together, 10 times (an id per try): every process
#     finishes accel_init before any computes (--sync-dir), so all four meet the one segment
#     that bears the name. Each job sums its own salt, so a cross-paired process gets a wrong
#     sum. Every time: no process computes, every process fails naming the clash, and the
#     clashed segment keeps its name (so that late processes of the clashing jobs fail on it).
#  2. The same with two 3-process jobs, 3 times.
#  3. A job started once another with its id has set up (the first job's processes wait at the
#     sync point, set up): both stop, naming the clash (the first job's segment kept its name).
#  4. The next job with that id, started afterwards, removes the clashed segment
#     with a warning, runs, and leaves nothing in /dev/shm.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
PROG=$B/tests/progs/allreduce_loop
[ -x "$PROG" ] || { echo "missing $PROG"; exit 1; }
. "$(dirname "$0")/../poll.sh"
tmp=$(mktemp -d)
uid=$(id -u)
prefix=jobid-clash-$$ # not 32 hex digits: ids a user chose
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
    rm -f /dev/shm/accel-"$uid"-"$prefix"*
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.err; do [ -e "$f" ] && { echo "== $f"; cat "$f"; }; done
    exit 1
}

# start NAME RANK N ARGS...: one process of a hand-started job with ACCEL_JOB_ID=$job, in the
# background, killed by a watchdog after 60 s (its status is then 137).
start() {
    local name=$1 r=$2 n=$3
    shift 3
    ACCEL_JOB_ID=$job RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n ACCEL_TIMEOUT=60 \
        timeout -s KILL 60 "$PROG" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
}

# expect_clash WHAT NAME PID: the process NAME (pid PID) of a job with id $job stopped with an
# error naming the clash, having computed nothing (with the other job's processes or alone).
expect_clash() {
    local what=$1 name=$2 rc
    wait "$3"
    rc=$?
    grep -q "wrong result" "$tmp/$name.err" &&
        fail "$what: $name computed with the other job's processes"
    grep -q "allreduces ok" "$tmp/$name.out" && fail "$what: $name computed"
    [ "$rc" -eq 1 ] || fail "$what: $name exited $rc, expected 1 (an error)"
    grep -q "two jobs use the same ACCEL_JOB_ID ($job), and both stop" "$tmp/$name.err" ||
        fail "$what: $name did not name the clash"
}

# clash N TRIES: two N-process jobs with the same id, started together, TRIES times.
clash() {
    local n=$1 tries=$2 t r name i
    for t in $(seq 1 "$tries"); do
        job=$prefix-$n-$t
        seg=/dev/shm/accel-$uid-$job
        rm -rf "$tmp"/*.out "$tmp"/*.err "$tmp/sync"
        mkdir "$tmp/sync"
        pids=()
        local names=()
        for r in $(seq 0 $((n - 1))); do
            for j in a b; do
                local salt=0
                [ "$j" = b ] && salt=10
                start "$j$r" "$r" "$n" --iters 20 --salt "$salt" --sync-dir "$tmp/sync" \
                    --sync-count $((2 * n))
                names+=("$j$r")
            done
        done
        i=0
        for name in "${names[@]}"; do
            expect_clash "$n processes, try $t" "$name" "${pids[$i]}"
            i=$((i + 1))
        done
        [ -e "$seg" ] || fail "$n processes, try $t: the clashed segment $seg lost its name"
        rm -f "$seg"
    done
    echo "two $n-process jobs with one ACCEL_JOB_ID, $tries tries:" \
        "nobody computed, all named the clash"
}

clash 2 10
clash 3 3

# ---- 3. a job started while another with its id is set up ----
job=$prefix-late
seg=/dev/shm/accel-$uid-$job
rm -rf "$tmp"/*.out "$tmp"/*.err "$tmp/sync"
mkdir "$tmp/sync"
pids=()
start a0 0 2 --iters 20 --sync-dir "$tmp/sync" --sync-count 4
start a1 1 2 --iters 20 --sync-dir "$tmp/sync" --sync-count 4
poll 30 n_files_at_least "$tmp/sync" 2 || fail "late: the first job did not set up"
grep -q accel_init "$tmp"/a[01].err && fail "late: the first job failed to set up alone"
start b0 0 2 --iters 20 --salt 10 --sync-dir "$tmp/sync" --sync-count 4
start b1 1 2 --iters 20 --salt 10 --sync-dir "$tmp/sync" --sync-count 4
i=0
for name in a0 a1 b0 b1; do
    expect_clash late "$name" "${pids[$i]}"
    i=$((i + 1))
done
[ -e "$seg" ] || fail "late: the clashed segment $seg lost its name"
echo "a job started while another with its id was set up: both stopped, naming the clash"

# ---- 4. the next job with the id ----
# Processes started before a clash was seen belong to the clashing jobs: start this job at
# least a clock tick (10 ms, the unit of /proc start times) after it.
sleep 0.1
rm -rf "$tmp"/*.out "$tmp"/*.err
pids=()
start r0 0 2 --iters 20
start r1 1 2 --iters 20
for r in 0 1; do
    wait "${pids[$r]}"
    rc=$?
    [ "$rc" -eq 0 ] || fail "rerun: rank $r exited $rc"
    grep -q "20 allreduces ok" "$tmp/r$r.out" || fail "rerun: rank $r did not finish"
done
grep -q "removed $seg, left by two jobs that used the same ACCEL_JOB_ID" "$tmp/r0.err" ||
    fail "rerun: process 0 did not report removing the clashed segment"
ls /dev/shm | grep -q "^accel-$uid-$job" &&
    fail "rerun: $(ls /dev/shm | grep "^accel-$uid-$job") left"
echo "the next job with the id removed the clashed segment, ran, and left nothing"
echo "PASS"
