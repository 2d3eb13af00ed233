#!/usr/bin/env bash
# The collective suite on the mpi backend under mpirun (issue 16 item 1):
# tests/dist/test_comm_backends (every collective x every whole-byte dtype x op x count, out of
# place and in place, and the wire dtypes) on 2, 3 and 4 processes, on mpi and on shm
# in the same processes, each bit-identical to the reference and to the other backend.
# (tests/comm/test_mpi.sh has the rest of the mpi tests.)
# Skips (77) when mpirun is missing or the build has no mpi backend.
source "$(dirname "$0")/mpi_common.sh"

for np in 2 3 4; do
    run "coll$np" "$np" 300 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" -- \
        "$B/tests/test_comm_backends"
    [ "$rc" -eq 0 ] || fail "collective suite on $np processes: exit $rc"
    grep -q "bit-identical to the reference and to the other backend" "$tmp/coll$np.out" ||
        fail "collective suite on $np processes: no summary"
    grep "test_comm_backends" "$tmp/coll$np.out"
done
echo "test_mpi_collectives: ok"
