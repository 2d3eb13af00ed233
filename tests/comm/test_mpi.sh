#!/usr/bin/env bash
# The mpi backend under mpirun (issue 16 item 1), on this one machine:
#  1. the collective suite (tests/dist/test_comm_backends: every collective x dtype x op x count
#     x out of place / in place / symmetric, and the wire dtypes) on 2, 3 and 4 processes, on mpi
#     and on shm in the same processes, each bit-identical to the reference and to the other;
#  2. comm v2 semantics on mpi (tests/dist/test_comm_v2: post/test/wait, deadlines, groups,
#     split into node groups, abort from another thread) on 1-4 processes;
#  3. a program that initialises MPI itself (MPI_THREAD_MULTIPLE, and plain MPI_Init) keeps
#     working around accel, and accel finalises MPI only when it initialised it;
#  4. a SIGKILLed rank mid-allreduce: every process is gone within 10 s and mpirun names rank 1
#     (Open MPI's runtime ends the job; the survivors never see the death themselves);
#  5. a stopped rank (SIGSTOP) with ACCEL_TIMEOUT=2: the survivors fail with ETIMEDOUT naming the
#     call, not a hang, and the job ends within 10 s.
# Skips (77) when mpirun is missing or the build has no mpi backend.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
"$B/accel" env 2>/dev/null | grep -q "backends:.*mpi" ||
    { echo "SKIP: this build has no mpi backend (configure with -DACCEL_MPI=ON)"; exit 77; }
# Open MPI refuses root unless told (these containers run tests as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Quiet Open MPI's hints about hardware it does not find here.
export OMPI_MCA_btl_base_warn_component_unused=0
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE ACCEL_JOB_ID ACCEL_BACKEND
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.out; do [ -f "$f" ] && { echo "== $f"; tail -40 "$f"; }; done
    exit 1
}
now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# run NAME NP LIMIT [VAR=VALUE...] -- PROG ARGS...: mpirun, output in $tmp/NAME.out, exit status in
# rc (124: still running after LIMIT seconds; mpirun itself exits 128 + signal of a killed rank).
run() {
    local name=$1 np=$2 limit=$3
    shift 3
    local envs=()
    while [ "$1" != "--" ]; do envs+=(-x "$1"); shift; done
    shift
    timeout -k 5 "$limit" mpirun --oversubscribe -np "$np" "${envs[@]}" "$@" \
        >"$tmp/$name.out" 2>&1
    rc=$?
}

# 1 and 2.
for np in ${MPI_TEST_NPS:-2 3 4}; do
    run "coll$np" "$np" 300 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" -- \
        "$B/tests/test_comm_backends"
    [ "$rc" -eq 0 ] || fail "collective suite on $np processes: exit $rc"
    grep -q "bit-identical to the reference and to the other backend" "$tmp/coll$np.out" ||
        fail "collective suite on $np processes: no summary"
    grep "test_comm_backends" "$tmp/coll$np.out"
done
for np in ${MPI_TEST_NPS:-1 2 3 4}; do
    run "v2_$np" "$np" 300 -- "$B/tests/test_comm_v2"
    [ "$rc" -eq 0 ] || fail "comm v2 on mpi, $np processes: exit $rc"
    grep -q "$np processes (mpi): ok" "$tmp/v2_$np.out" ||
        fail "comm v2 on $np processes: not run on mpi"
    grep "test_comm_v2" "$tmp/v2_$np.out"
done

# 3.
for mode in multiple single none; do
    run "init_$mode" 3 120 -- "$B/tests/mpi/mpi_user_init" "$mode"
    [ "$rc" -eq 0 ] || fail "MPI initialised by ${mode/none/accel}: exit $rc"
    [ "$(grep -c "mpi_user_init $mode: rank . of 3 ok" "$tmp/init_$mode.out")" -eq 3 ] ||
        fail "MPI initialised by ${mode/none/accel}: not every rank passed"
    echo "MPI initialised by ${mode/none/accel} ($mode): ok"
done

# 4. SIGKILL, blocking and asynchronous allreduces.
for async in 0 1; do
    salt=$$.$async # marks this job's processes
    start=$(now)
    run "kill$async" 3 60 -- "$B/tests/progs/allreduce_loop" --iters 1000000 --count 4096 \
        --die-rank 1 --die-after 200 --async "$async" --salt "$salt"
    t=$(elapsed_since "$start")
    [ "$rc" -ne 0 ] || fail "kill (async $async): mpirun exited 0 after a rank was killed"
    [ "$rc" -ne 124 ] || fail "kill (async $async): the job hung until the test killed it"
    le "$t" 10 || fail "kill (async $async): the job took ${t}s to end (limit 10 s)"
    grep -q "process rank 1 .*signal 9" "$tmp/kill$async.out" ||
        fail "kill (async $async): mpirun did not name rank 1"
    left=$(pgrep -f "allreduce_loop .*--salt $salt" | xargs -r ps -o stat= -p | grep -vc Z)
    [ "$left" -eq 0 ] || fail "kill (async $async): $left processes left running"
    echo "kill (async $async): the job ended in ${t}s: $(grep -o "process rank 1 .*(Killed)" "$tmp/kill$async.out")"
done

# 5. SIGSTOP: a stuck peer is a timeout.
start=$(now)
run stop 3 60 ACCEL_TIMEOUT=2 -- "$B/tests/progs/allreduce_loop" --iters 1000000 --count 4096 \
    --stop-rank 1 --die-after 200 --async 1
t=$(elapsed_since "$start")
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "stop: exit $rc"
le "$t" 10 || fail "stop: the job took ${t}s to end (limit 10 s)"
grep -q "rank 0: allreduce failed at iteration 200: ETIMEDOUT: mpi: allreduce(count=4096, f32, sum)" \
    "$tmp/stop.out" || fail "stop: rank 0 did not report ETIMEDOUT naming the call"
echo "stop: the job ended in ${t}s: $(grep -m1 "rank 0: allreduce failed" "$tmp/stop.out")"
echo "test_mpi: ok"
