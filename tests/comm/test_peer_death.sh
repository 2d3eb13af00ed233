#!/usr/bin/env bash
# A dead peer is an error, never a hang (issue 2, item 7), tested on the shm backend without the
# launcher: 3 processes of tests/progs/allreduce_loop started by hand.
#  1. rank 1 SIGKILLs itself mid-loop: both survivors exit 1 within 5 s, saying EPEER and naming
#     process 1; nothing of the job is left in /dev/shm.
#     The same with asynchronous allreduces (work handles), and inside zero-copy allreduces on
#     accel_alloc_shared buffers.
#  2. rank 1 SIGSTOPs itself, ACCEL_TIMEOUT=2: survivors report ETIMEDOUT naming process 1 within
#     ~4 s; then the stopped one is killed.
#  3. rank 1 calls exit(7) mid-loop (a normal exit, without accel_free): survivors report EPEER
#     with "rank 1 (pid P) exited (status 7)", not a death.
# ACCEL_TEST_LABELS: waits
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
PROG=$B/tests/progs/allreduce_loop
[ -x "$PROG" ] || { echo "missing $PROG"; exit 1; }
tmp=$(mktemp -d)
uid=$(id -u)
pids=()
watchdog=
cleanup() {
    [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.err; do echo "== $f"; cat "$f"; done
    exit 1
}

now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# start_job JOB N [ENV=VALUE...] -- ARGS...: starts N ranks of allreduce_loop in the background.
start_job() {
    local job=$1 n=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    pids=()
    for r in $(seq 0 $((n - 1))); do
        env "${envs[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
            ACCEL_JOB_ID="$job" "$PROG" "$@" >"$tmp/$job.$r.out" 2>"$tmp/$job.$r.err" &
        pids+=($!)
    done
    # Nothing here may hang the test suite: kill the whole job after 20 s.
    # (Its output goes to /dev/null so a leftover sleep cannot hold the test runner's pipe.)
    (sleep 20; kill -9 "${pids[@]}" 2>/dev/null) >/dev/null 2>&1 &
    watchdog=$!
}

check_survivor() { # job rank status-name limit start
    local job=$1 r=$2 name=$3 limit=$4 start=$5
    wait "${pids[$r]}"
    local rc=$? t
    t=$(elapsed_since "$start")
    [ "$rc" -ne 0 ] || fail "$job: rank $r exited 0 after its peer failed"
    [ "$rc" -ne 137 ] || fail "$job: rank $r hung until the watchdog killed it"
    [ "$rc" -ne 3 ] || fail "$job: rank $r: the call after the failure did not fail the same way"
    le "$t" "$limit" || fail "$job: rank $r took ${t}s to fail (limit ${limit}s)"
    grep -q "$name" "$tmp/$job.$r.err" || fail "$job: rank $r did not report $name"
    grep -q "process 1 (pid ${pids[1]})" "$tmp/$job.$r.err" ||
        fail "$job: rank $r did not name process 1 (pid ${pids[1]})"
    echo "$job: rank $r failed with $name after ${t}s"
}

check_shm_clean() {
    local job=$1
    if ls /dev/shm/accel-"$uid"-"$job"* >/dev/null 2>&1; then
        fail "$job: segment left in /dev/shm: $(ls /dev/shm/accel-"$uid"-"$job"*)"
    fi
}

# 1. SIGKILL.
job=pd$$-kill
start=$(now)
start_job "$job" 3 -- --iters 1000000 --die-rank 1 --die-after 200
check_survivor "$job" 0 EPEER 5 "$start"
check_survivor "$job" 2 EPEER 5 "$start"
wait "${pids[1]}"
[ $? -eq 137 ] || fail "$job: rank 1 was expected to die of SIGKILL"
kill "$watchdog" 2>/dev/null
check_shm_clean "$job"

# 1b. The same with asynchronous allreduces: the failure reaches accel_work_wait.
job=pd$$-async
start=$(now)
start_job "$job" 3 -- --iters 1000000 --die-rank 1 --die-after 200 --async 1
check_survivor "$job" 0 EPEER 5 "$start"
check_survivor "$job" 2 EPEER 5 "$start"
wait "${pids[1]}"
kill "$watchdog" 2>/dev/null
check_shm_clean "$job"

# 1c. The same inside zero-copy allreduces on symmetric buffers (peers read each other's
#     buffers directly; 64 Ki floats, every call zero-copy): EPEER, nothing left in /dev/shm.
job=pd$$-sym
start=$(now)
start_job "$job" 3 ACCEL_SHM_ZEROCOPY_NBYTES=0 -- --iters 1000000 --die-rank 1 --die-after 200 \
    --symmetric 1 --count 65536
check_survivor "$job" 0 EPEER 5 "$start"
check_survivor "$job" 2 EPEER 5 "$start"
wait "${pids[1]}"
[ $? -eq 137 ] || fail "$job: rank 1 was expected to die of SIGKILL"
kill "$watchdog" 2>/dev/null
check_shm_clean "$job"

# 2. SIGSTOP with a 2 s timeout.
job=pd$$-stop
start=$(now)
start_job "$job" 3 ACCEL_TIMEOUT=2 -- --iters 1000000 --stop-rank 1 --die-after 200
check_survivor "$job" 0 ETIMEDOUT 5 "$start"
check_survivor "$job" 2 ETIMEDOUT 5 "$start"
kill -9 "${pids[1]}"
wait "${pids[1]}" 2>/dev/null
kill "$watchdog" 2>/dev/null
check_shm_clean "$job"

# 3. A normal exit with status 7 while the others wait.
job=pd$$-exit
start=$(now)
start_job "$job" 3 -- --iters 1000000 --exit-rank 1 --exit-code 7 --die-after 200
for r in 0 2; do
    wait "${pids[$r]}"
    rc=$?
    [ "$rc" -eq 1 ] || fail "$job: rank $r exited $rc, expected 1"
    grep -q "EPEER: allreduce #[0-9]*: rank 1 (pid ${pids[1]}) exited (status 7)" \
        "$tmp/$job.$r.err" || fail "$job: rank $r did not report rank 1's exit with status 7"
done
wait "${pids[1]}"
[ $? -eq 7 ] || fail "$job: rank 1 was expected to exit 7"
kill "$watchdog" 2>/dev/null
check_shm_clean "$job"
echo "$job: survivors reported the exit with its status after $(elapsed_since "$start")s"

echo "PASS"
