#!/usr/bin/env bash
# The mpi backend under mpirun (issue 16 item 1), on this one machine:
#  1. the collective suite: tests/comm/test_mpi_collectives.sh;
#  2. comm v2 semantics on mpi (tests/dist/test_comm_v2: post/test/wait, deadlines, groups,
#     split into node groups, abort from another thread) on 1-4 processes;
#  3. a program that initialises MPI itself (MPI_THREAD_MULTIPLE, and plain MPI_Init) keeps
#     working around accel, and accel finalises MPI only when it initialised it;
#  4. a SIGKILLed rank mid-allreduce: every process is gone within 10 s and mpirun names rank 1
#     (Open MPI's runtime ends the job; the survivors never see the death themselves);
#  5. a stopped rank (SIGSTOP) with ACCEL_TIMEOUT=2: the survivors fail with ETIMEDOUT naming the
#     call and the stopped process (a small allreduce: the direct path knows whose message is
#     missing), not a hang, and the job ends within 10 s.
# Skips (77) when mpirun is missing or the build has no mpi backend.
source "$(dirname "$0")/mpi_common.sh"

# 2.
for np in 1 2 3 4; do
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
    count=$((async ? 100000 : 4096)) # the direct path, then the ordered one (src/comm/mpi/)
    start=$(now)
    run "kill$async" 3 60 -- "$B/tests/progs/allreduce_loop" --iters 1000000 --count "$count" \
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
grep -q "rank 0: .*nothing arrived from process 1$" "$tmp/stop.out" ||
    fail "stop: rank 0 did not name process 1 as the one that sent nothing"
echo "stop: the job ended in ${t}s: $(grep -m1 "rank 0: allreduce failed" "$tmp/stop.out")"
echo "test_mpi: ok"
