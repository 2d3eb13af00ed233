#!/usr/bin/env bash
# The settings check under mpirun (the mpi backend; docs/configuration.md, "Settings every
# process must share"): ACCELERATE_MIXED_PRECISION exported for process 1 only makes
# accel_init fail on both processes, promptly, naming the setting, both values and sources;
# the same variable on both initialises. So does ACCELERATE_DEBUG_MODE for process 1 only (the
# backend's debug exchange starts after the check, else the two would not even meet).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../comm/mpi_common.sh"
unset ACCELERATE_MIXED_PRECISION ACCELERATE_CONFIG_FILE ACCELERATE_DEBUG_MODE ACCEL_LAUNCH_SOURCES
export HF_HOME=$tmp/none # no config file of this machine's user takes part
SHOW=$B/tests/progs/show_options
# Process 1 exports AGREE_VAR's assignment, then runs the program.
wrap=$tmp/wrap.sh
printf '%s\n' '#!/bin/bash' '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && export "$AGREE_VAR"' \
    'exec "$@"' >"$wrap"
chmod +x "$wrap"

run differ 2 30 ACCEL_TIMEOUT=20 AGREE_VAR=ACCELERATE_MIXED_PRECISION=fp16 -- "$wrap" "$SHOW"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "differ: exit status $rc (0: succeeded, 124: hung)"
want="show_options: accel_init: processes disagree on mixed_precision: process 0 has no (default)"
want="$want, process 1 has fp16 (env ACCELERATE_MIXED_PRECISION) (every process of a job must"
want="$want resolve the same settings)"
n=$(grep -cF -- "$want" "$tmp/differ.out")
[ "$n" = 2 ] || fail "differ: $n of 2 processes said: $want"
echo "ok: differ"

run debug 2 30 ACCEL_TIMEOUT=20 AGREE_VAR=ACCELERATE_DEBUG_MODE=1 -- "$wrap" "$SHOW"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "debug: exit status $rc (0: succeeded, 124: hung)"
want="show_options: accel_init: processes disagree on debug: process 0 has"
n=$(grep -cF -- "$want" "$tmp/debug.out")
[ "$n" = 2 ] || fail "debug: $n of 2 processes said: $want"
echo "ok: debug"

run agree 2 30 ACCEL_TIMEOUT=20 ACCELERATE_MIXED_PRECISION=fp16 AGREE_VAR=UNUSED=1 -- \
    "$wrap" "$SHOW"
[ "$rc" -eq 0 ] || fail "agree: exit status $rc"
[ "$(grep -c "options: mixed_precision=fp16" "$tmp/agree.out")" = 2 ] || fail "agree: output"
echo "ok: agree"
