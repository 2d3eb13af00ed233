#!/usr/bin/env bash
# The faults tests/dist gives the shm backend, on gloo and hier (tests/comm/test_comm_peers.sh
# has stopped and departing processes):
#  1. tests/dist/test_coll_mismatch (a process calling another collective, count, dtype, op or
#     root than the others, an allocation against a collective, count 0 against 3, then leaving
#     by accel_free and by exit(0) while the others wait) on gloo 2 x 1, 3 x 1 (also with the
#     ring, whose first segments leave before the call check: every process must wait for those
#     its neighbours took or sent, else one frees what the other still uses) and 2 x 2
#     (forced), hier 2 x 2 and 2 x 1 (forced): every process fails in that call with EINVAL
#     naming both calls and the process that deviated (EPEER naming the process that left).
#     Before, hier let counts 1000 and 999 pass unseen (both pad to 1000), and gloo and hier
#     took an allocation for no call.
#  2. tests/dist/test_symmetric on gloo 2 x 1, hier 2 x 2 and 2 x 1 (forced): accel_alloc_shared
#     is a collective there too (sizes that differ: EINVAL on every process, "the same size",
#     and the communicator goes on). Before, hier broke its communicator on sizes that differed
#     (its machine level took them for a call mismatch), so the next collective failed.
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
machines_setup # $tmp; skips without gloo

fail() { machines_fail "$tmp/$1" "$1: $2"; } # name message

# Runs tests/PROG on M machines x L processes; fails the test unless every process succeeds.
job() { # name PROG M L [ENV=VALUE...]
    local name=$1 prog=$2 m=$3 l=$4
    shift 4
    mkdir -p "$tmp/$name"
    machines_launch "$tmp/$name" "$m" "$l" ACCEL_TIMEOUT=30 "$@" -- "$B/tests/$prog"
    machines_wait 120 || fail "$name" "$prog failed"
}

# 1. Mismatches and departures.
mismatch() { # name M L [ENV=VALUE...]
    job "$1" test_coll_mismatch "${@:2}"
    grep -q "mismatches and departures reported" "$tmp/$1/r0.out" ||
        fail "$1" "rank 0 did not finish"
    echo "$1: $(cat "$tmp/$1/r0.out")"
}
mismatch mismatch-gloo-2x1 2 1
mismatch mismatch-gloo-3x1 3 1
mismatch mismatch-gloo-2x1-ring 2 1 ACCEL_GLOO_RING=1
mismatch mismatch-gloo-3x1-ring 3 1 ACCEL_GLOO_RING=1
mismatch mismatch-gloo-2x2 2 2 ACCEL_BACKEND=gloo
mismatch mismatch-hier-2x2 2 2
mismatch mismatch-hier-2x1 2 1 ACCEL_BACKEND=hier

# 2. accel_alloc_shared on gloo and hier.
symmetric() { # name M L [ENV=VALUE...]
    job "$1" test_symmetric "${@:2}"
    echo "$1: $(cat "$tmp/$1/r0.out")"
}
symmetric symmetric-gloo-2x1 2 1
symmetric symmetric-hier-2x2 2 2
symmetric symmetric-hier-2x1 2 1 ACCEL_BACKEND=hier
echo "test_comm_faults: ok"
