#!/usr/bin/env bash
# The collective suite across "machines" (issue 16): jobs of M machines x L processes on this
# host, started by M launchers (accel launch --num_machines M --machine_rank m
# --main_process_ip 127.0.0.1; tests/comm/machines.sh).
#  - gloo (the default with one process per machine): tests/dist/test_collectives on 2 x 1
#    (every collective x dtype x op, in and out of place, checked against the exact result) and
#    tests/dist/test_comm_backends on 2 x 1, 3 x 1 and 4 x 1 (random inputs, wire dtypes:
#    bit-identical to the rank-order reference that the shm backend is held to, so gloo and
#    shm agree bit for bit);
#  - gloo forced (ACCEL_BACKEND=gloo) on 2 x 2: the same comparison with 4 processes;
#  - the ring (ACCEL_GLOO_RING=1) on 2 x 1, 3 x 1 and 4 x 1, checked against the ring-order
#    reference;
#  - tests/dist/test_comm_v2 on gloo, 2 x 2 (its node groups are the machines): post/test/wait,
#    deadlines, groups, split (node groups, leaders, key order, nesting), a mismatched call
#    that breaks one group only (an error on every member, never Gloo's abort of the process),
#    abort from another thread waking a waiter on every process;
#  - hier (the default with several processes per machine), 2 x 2 and 2 x 1 forced:
#    test_collectives with the floating-point results checked in hier's association (a
#    machine's processes first, then the machines); test_comm_v2 on hier, 2 x 2 (split's
#    children are hier communicators of one process per "machine", in rank order);
#  - started by hand, the store served by another process (ACCEL_STORE_SERVED=1, what the
#    launchers do), job id and restart count set: gloo 2 x 1 and hier 2 x 2 rendezvous as
#    clients only, twice on one store (the second as restart 1), checking every allreduce.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
machines_setup # $tmp; skips without gloo

run() { # name M L [ENV=VALUE...] -- PROG (by hand when $by_hand is set)
    local name=$1 m=$2 l=$3 start=$SECONDS
    shift 3
    mkdir -p "$tmp/$name"
    if [ -n "${by_hand:-}" ]; then
        machines_start "$tmp/$name" "$m" "$l" ACCEL_TIMEOUT=60 "$@"
    else
        machines_launch "$tmp/$name" "$m" "$l" ACCEL_TIMEOUT=60 "$@"
    fi
    machines_wait 250 || machines_fail "$tmp/$name" "$name"
    echo "$name ($((SECONDS - start)) s): $(cat "$tmp/$name/r0.out")"
}

run gloo-2x1-collectives 2 1 -- "$B/tests/test_collectives"
grep -q "(gloo)" "$tmp/gloo-2x1-collectives/r0.out" ||
    { echo "FAIL: 2 x 1 did not pick gloo"; exit 1; }
# test_comm_backends on gloo runs on the counts of gloo's paths only (each case costs a few
# round trips): 1 element, with every collective x dtype x op in and out of place; then, with one
# dtype of each element size, 0 elements, the largest f32 allreduce of the one-shot path (all
# inputs together 64 KiB: ONESHOT_NBYTES in src/comm/gloo/gloo.c), one element more (the block
# path, its split leaving a remainder) and one large count (70001: every dtype size on the
# block path, with a remainder on 2-4 processes); on 2 and 3 processes also one that spans
# several of the pipelined allreduce's 1 MiB segments with a short last one (2621447: 2-10
# segments per chunk by element size on 2, 2-7 on 3, where the schedule keeps two receives
# posted). The fused path (a reduction's chunks in the envelopes, up to 256 KiB a chunk:
# FUSE_CHUNK_NBYTES in src/comm/gloo/gloo_coll.c) at its edges: 65536 (a reduce_scatter's f32
# block exactly 256 KiB; 70001 is one over it in f32, and in it in U8), 65536 n (an allreduce's
# f32 chunks exactly 256 KiB) and one more (its first chunk one element over: the block path).
# 4 x 1 runs 1 element, the fused allreduce of 262144 (chunks of 256 KiB in f32, the block path
# in I64) and a pipelined count (1310723: 2 segments per chunk in f32, 3 in I64; as the last
# counts, with the sampled dtypes only, which halved its time). The shm runs
# (dist/test_comm_backends) keep the full count list.
backends() { # name M L [more counts]
    local n=$(($2 * $3))
    local edge=$((65536 / (4 * n)))
    local counts="1 0 $edge $((edge + 1)) 65536 $((65536 * n)) $((65536 * n + 1)) 70001"
    run "$1" "$2" "$3" ACCEL_TEST_BACKEND=gloo ACCEL_TEST_COUNTS="$counts ${4:-}" -- \
        "$B/tests/test_comm_backends"
}
backends gloo-2x1-backends 2 1 2621447
backends gloo-3x1-backends 3 1 2621447
run gloo-4x1-backends 4 1 ACCEL_TEST_BACKEND=gloo ACCEL_TEST_COUNTS="1 262144 1310723" -- \
    "$B/tests/test_comm_backends"
backends gloo-2x2-backends 2 2
# The ring (ACCEL_GLOO_RING=1: on one host too), checked in ring order (ACCEL_TEST_RING, which
# samples f64 too): the first f32 count (256 KiB) and one less (the fused path, rank order), and
# chunks of several segments with a remainder (1310723 on 3). tests/comm/test_gloo_netns.sh
# runs the ring as it comes over a network (ACCEL_GLOO_RING unset).
run gloo-2x1-ring 2 1 ACCEL_GLOO_RING=1 ACCEL_TEST_RING=1 ACCEL_TEST_BACKEND=gloo \
    ACCEL_LOG_LEVEL=info ACCEL_TEST_COUNTS="65536 65535 1310723" -- "$B/tests/test_comm_backends"
grep -q "f32/f64 reductions from 256 KiB in ring order" "$tmp/gloo-2x1-ring/m0.err" ||
    { echo "FAIL: gloo 2 x 1 with ACCEL_GLOO_RING=1 did not ring"; exit 1; }
run gloo-3x1-ring 3 1 ACCEL_GLOO_RING=1 ACCEL_TEST_RING=1 ACCEL_TEST_BACKEND=gloo \
    ACCEL_TEST_COUNTS="65536 65535 1310723" -- "$B/tests/test_comm_backends"
run gloo-4x1-ring 4 1 ACCEL_GLOO_RING=1 ACCEL_TEST_RING=1 ACCEL_TEST_BACKEND=gloo \
    ACCEL_TEST_COUNTS="1310723" -- "$B/tests/test_comm_backends"
run gloo-2x2-comm-v2 2 2 ACCEL_TEST_BACKEND=gloo -- "$B/tests/test_comm_v2"
run hier-2x2-collectives 2 2 -- "$B/tests/test_collectives"
grep -q "(hier)" "$tmp/hier-2x2-collectives/r0.out" ||
    { echo "FAIL: 2 x 2 did not pick hier"; exit 1; }
run hier-2x1-collectives 2 1 ACCEL_BACKEND=hier -- "$B/tests/test_collectives"
run hier-2x2-comm-v2 2 2 ACCEL_TEST_BACKEND=hier -- "$B/tests/test_comm_v2"
store_port=$("$B/tests/progs/free_port")
"$B/tests/progs/store_serve" "$store_port" >"$tmp/store.out" 2>&1 &
store_pid=$!
trap 'kill -9 "${MACHINE_PIDS[@]}" "$store_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
for i in $(seq 50); do grep -q ready "$tmp/store.out" && break; sleep 0.1; done
by_hand=1
for restart in 0 1; do
    for ml in "2 1" "2 2"; do
        set -- $ml
        run "served-$1x$2-restart$restart" "$1" "$2" ACCEL_STORE_SERVED=1 \
            MASTER_PORT="$store_port" ACCEL_JOB_ID=job$$ ACCEL_RESTART_COUNT=$restart -- \
            "$B/tests/progs/allreduce_loop" \
            --iters 20 --count 300000
    done
done
echo "test_gloo_collectives: ok"
