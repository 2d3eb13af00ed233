#!/usr/bin/env bash
# scripts/overlap.sh LOG BACKGROUND FOREGROUND: runs the shell command BACKGROUND at the lowest
# CPU priority (nice 19; OVERLAP_NICE=N: at nice N), its output in LOG, while FOREGROUND runs as
# usual; exits 0 when both succeeded, else prints the end of LOG (when BACKGROUND failed) and
# exits 1. OVERLAP_SHOW=1 prints the whole of LOG once BACKGROUND ended (after FOREGROUND's
# output, as if it had run second).
#
# make test uses it to compile the sanitizer, CUDA and emulator builds while the main suite
# runs: many of the suite's tests wait (on peers, deadlines, launchers), and on 2 cores the
# compilers fill those gaps instead of running after the suite. At nice 19 they take the CPU
# only when no test wants it, so the tests' own deadlines see the machine they would see alone.
# Then it runs the sanitizer build's unit tests (OVERLAP_NICE=0, OVERLAP_SHOW=1) beside the
# CUDA and emulator builds' tests, whose runs alone leave a core idle for a third of their time.
set -u
[ $# -eq 3 ] || { echo "usage: $0 LOG BACKGROUND FOREGROUND" >&2; exit 2; }
log=$1
level=${OVERLAP_NICE:-19}
set -m # the background command gets its own process group: an interrupt stops all of it
nice -n "$level" bash -c "$2" >"$log" 2>&1 &
bg=$!
set +m
trap 'kill -TERM -- -"$bg" 2>/dev/null; exit 130' INT TERM
echo "overlap: in the background at nice $level, output in $log: $2"
bash -c "$3"
frc=$?
wait "$bg"
brc=$?
if [ -n "${OVERLAP_SHOW:-}" ]; then
    echo "overlap: the output of the background command ($log): $2"
    cat "$log"
elif [ "$brc" != 0 ]; then
    tail -n 60 "$log"
fi
if [ "$brc" != 0 ]; then
    echo "overlap: the background command exited with $brc (whole output: $log): $2"
fi
[ "$frc" = 0 ] && [ "$brc" = 0 ]
