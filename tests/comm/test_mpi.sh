#!/usr/bin/env bash
# The mpi backend under mpirun (issue 16 item 1), on this one machine:
#  1. the collective suite: tests/comm/test_mpi_collectives.sh;
#  2. comm v2 semantics on mpi (tests/dist/test_comm_v2: post/test/wait, deadlines, groups,
#     split into node groups, abort from another thread) on 1-4 processes, and in debug mode
#     (ACCELERATE_DEBUG_MODE=1) on 2 and 4 with its collective mismatch check;
#  3. a program that initialises MPI itself (MPI_THREAD_MULTIPLE, and plain MPI_Init) keeps
#     working around accel, and accel finalises MPI only when it initialised it;
#  4. a SIGKILLed rank mid-allreduce: every process is gone within 10 s of the kill and mpirun
#     names rank 1 (Open MPI's runtime ends the job; the survivors never see the death
#     themselves);
#  5. a stopped rank (SIGSTOP) with ACCEL_TIMEOUT=2: the survivors fail with ETIMEDOUT naming the
#     call and the stopped process (a small allreduce: the direct path knows whose message is
#     missing), not a hang, and the job ends within 10 s of the stop;
#  6. mismatched collectives: in debug mode tests/dist/test_coll_mismatch (ACCEL_EINVAL on every
#     process naming both calls, before any data moves); without it tests/mpi/mpi_mismatch
#     (with ACCEL_TIMEOUT=2, no process returns a wrong result without an error, at least one
#     fails with ETIMEDOUT or EPEER, every one when a count-0 call is involved, and on 2
#     processes a peer at another call is named as such; two calls with different counts whose
#     fingerprints it makes collide (a test hook) fail with ACCEL_EINVAL naming the sizes
#     everywhere; its 12 cases run at once, each on its own accel: 2.5 s a process count
#     instead of 24).
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
for np in 2 4; do
    run "v2_debug_$np" "$np" 300 ACCELERATE_DEBUG_MODE=1 -- "$B/tests/test_comm_v2"
    [ "$rc" -eq 0 ] || fail "comm v2 on mpi in debug mode, $np processes: exit $rc"
    grep -q "$np processes (mpi): ok" "$tmp/v2_debug_$np.out" ||
        fail "comm v2 in debug mode on $np processes: not run on mpi"
    echo "test_comm_v2 in debug mode (the mismatch check included): $np processes (mpi): ok"
done

# 3.
for mode in multiple single none; do
    run "init_$mode" 3 120 -- "$B/tests/mpi/mpi_user_init" "$mode"
    [ "$rc" -eq 0 ] || fail "MPI initialised by ${mode/none/accel}: exit $rc"
    [ "$(grep -c "mpi_user_init $mode: rank . of 3 ok" "$tmp/init_$mode.out")" -eq 3 ] ||
        fail "MPI initialised by ${mode/none/accel}: not every rank passed"
    echo "MPI initialised by ${mode/none/accel} ($mode): ok"
done

# The states of job S's processes (marked by --salt S; not mpirun's), one a line.
job_states() { pgrep -f "^[^ ]*allreduce_loop .*--salt $1( |$)" | xargs -r ps -o stat= -p; }
# In the background: waits until the N processes of job S run, then writes the time one of them
# stops or dies to FILE: the fault, from which the time limits count (mpirun's start takes
# seconds of its own on a loaded machine).
watch_fault() { # S N FILE
    until [ "$(job_states "$1" | grep -c '^[RSD]')" -eq "$2" ]; do sleep 0.1; done
    while [ "$(job_states "$1" | grep -c '^[RSD]')" -eq "$2" ]; do sleep 0.05; done
    now >"$3"
}
# run_watched NAME S ARGS...: run NAME 3 ARGS..., t = seconds from the fault to the job's end.
run_watched() {
    local name=$1 salt=$2
    shift 2
    watch_fault "$salt" 3 "$tmp/$name.fault" &
    local watcher=$!
    run "$name" 3 "$@"
    local end
    end=$(now)
    kill "$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
    [ -s "$tmp/$name.fault" ] || fail "$name: the job ended before its fault was seen"
    t=$(awk -v a="$(cat "$tmp/$name.fault")" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
}

# 4. SIGKILL, blocking and asynchronous allreduces.
for async in 0 1; do
    salt=$$.$async # marks this job's processes
    count=$((async ? 100000 : 4096)) # the direct path, then the ordered one (src/comm/mpi/)
    run_watched "kill$async" "$salt" 60 -- "$B/tests/progs/allreduce_loop" --iters 1000000 \
        --count "$count" --die-rank 1 --die-after 200 --async "$async" --salt "$salt"
    [ "$rc" -ne 0 ] || fail "kill (async $async): mpirun exited 0 after a rank was killed"
    [ "$rc" -ne 124 ] || fail "kill (async $async): the job hung until the test killed it"
    le "$t" 10 || fail "kill (async $async): the job took ${t}s to end (limit 10 s)"
    grep -q "process rank 1 .*signal 9" "$tmp/kill$async.out" ||
        fail "kill (async $async): mpirun did not name rank 1"
    left=$(pgrep -f "allreduce_loop .*--salt $salt" | xargs -r ps -o stat= -p | grep -vc Z)
    [ "$left" -eq 0 ] || fail "kill (async $async): $left processes left running"
    echo "kill (async $async): the job ended in ${t}s:" \
        "$(grep -o "process rank 1 .*(Killed)" "$tmp/kill$async.out")"
done

# 5. SIGSTOP: a stuck peer is a timeout.
run_watched stop $$ 60 ACCEL_TIMEOUT=2 -- "$B/tests/progs/allreduce_loop" --iters 1000000 \
    --count 4096 --stop-rank 1 --die-after 200 --async 1 --salt $$
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "stop: exit $rc"
le "$t" 10 || fail "stop: the job took ${t}s to end (limit 10 s)"
# Ranks 0 and 2 wait on the same deadline: the first to give up exits, and mpirun may end the
# job before the other prints, so either reports (no survivor may see its allreduce succeed).
! grep "wrong result" "$tmp/stop.out" ||
    fail "stop: a survivor's allreduce succeeded with a wrong result"
want="rank [02]: allreduce failed at iteration 200: ETIMEDOUT"
grep -Eq "$want: mpi: allreduce\(count=4096, f32, sum\)" "$tmp/stop.out" ||
    fail "stop: no survivor reported ETIMEDOUT naming the call"
grep -Eq "rank [02]: .*nothing arrived from process 1$" "$tmp/stop.out" ||
    fail "stop: no survivor named process 1 as the one that sent nothing"
echo "stop: the job ended in ${t}s: $(grep -Em1 "rank [02]: allreduce failed" "$tmp/stop.out")"

# 6. Mismatched collectives.
for np in 2 3; do
    run "mismatch_debug_$np" "$np" 120 ACCELERATE_DEBUG_MODE=1 ACCEL_TIMEOUT=30 -- \
        "$B/tests/test_coll_mismatch"
    [ "$rc" -eq 0 ] || fail "mismatch in debug mode, $np processes: exit $rc"
    [ "$(grep -c "mismatches reported" "$tmp/mismatch_debug_$np.out")" -eq "$np" ] ||
        fail "mismatch in debug mode, $np processes: not every process reported"
    echo "mismatch in debug mode, $np processes: ACCEL_EINVAL naming both calls everywhere"
    run "mismatch_$np" "$np" 120 ACCEL_TIMEOUT=2 -- "$B/tests/mpi/mpi_mismatch"
    grep "^mpi_mismatch: [^:]*: [^r]" "$tmp/mismatch_$np.out"
    [ "$rc" -eq 0 ] && grep -q "^mpi_mismatch: ok" "$tmp/mismatch_$np.out" ||
        fail "mismatch without debug mode, $np processes: exit $rc"
done
echo "test_mpi: ok"
