#!/usr/bin/env bash
# hier's split (docs/comm.md, "Many machines"): tests/dist/test_comm_v2 on 2 machines x 2
# processes with the hier backend. Its splits are grids of machines x local ranks (node
# groups, the leaders, the whole job in reverse key order, a child of a child), which hier
# makes as hier communicators of their own; a split that is not a grid ({1, 2}) is refused on
# every process with ACCEL_EUNSUPPORTED and the parent works on. Hybrid ZeRO sharding relies on
# the first two shapes (tests/ckpt/test_zero_hybrid_machines.sh).
set -u
B=${ACCEL_BUILD_DIR:?ACCEL_BUILD_DIR must point at the build directory}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/machines.sh"
machines_setup # $tmp; skips without gloo
machines_launch "$tmp" 2 2 ACCEL_TIMEOUT=60 ACCEL_TEST_BACKEND=hier -- "$B/tests/test_comm_v2"
if ! machines_wait 250; then
    echo "FAIL: test_comm_v2 on hier 2 x 2"
    for f in "$tmp"/*; do echo "== $f"; tail -n 20 "$f"; done
    exit 1
fi
grep -q "(hier): ok" "$tmp/r0.out" || { echo "FAIL: $(cat "$tmp/r0.out")"; exit 1; }
echo "test_hier_split: ok"
